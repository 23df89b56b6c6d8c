//! The handlebars side: compiling every template text of a spec once, checking the parsed
//! trees (partial references, recursion, nesting depth), and rendering one text with a size
//! budget.
//!
//! Every text is registered under its field path (`spec.parts[1].commands[0]`), so a handlebars
//! error already carries the field; partials are registered under their own name, which partial
//! names cannot collide with (they may not contain `.` or `[`).
//!
//! Stack safety: pest, which handlebars parses with, probes the stack and fails with "stack
//! limit reached" instead of overflowing. The parsed tree is then measured with an explicit
//! stack; a tree deeper than [`MAX_DEPTH`] (counting blocks, `else if` chains, subexpressions and
//! partial includes) is rejected and torn down iteratively, so neither rendering nor dropping it
//! can recurse deeply.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use handlebars::template::{DecoratorTemplate, Parameter, Template, TemplateElement};
use handlebars::{
    Context, Handlebars, RenderContext, RenderErrorReason, Renderable, TemplateError,
};

use crate::error::{Position, Problem, truncate};
use crate::helpers;
use crate::limit::{Budget, HelperOutput, LimitedOutput};
use crate::tree::{Analysis, analyze, charge_steps, dismantle};

/// Deepest allowed nesting of blocks, `else if` branches, subexpressions and partial includes,
/// all counted together along one path. Real templates nest a handful of levels; a render frame
/// costs a few KiB of stack in a debug build, so 64 levels stay far below a 2 MiB thread stack.
pub const MAX_DEPTH: usize = 64;

/// handlebars computes each parsed element's line and column by scanning the text from its
/// start, so compiling takes time proportional to (number of `{{`) × (text length). A text may
/// cost at most this much (64 KiB with 1024 mustaches, about 0.2 s in a release build); a big
/// text can be split into partials, which are compiled separately.
pub const MAX_TEXT_COST: u64 = 1 << 26;
/// The cost all texts of one template may add up to.
pub const MAX_TEMPLATE_COST: u64 = 1 << 28;

/// The registry name (and field) of a raw template's text.
const RAW_TEMPLATE: &str = "spec.template";

/// Most partial inclusions one text may expand to (counting inclusions inside included
/// partials, but not loop iterations). Each inclusion copies the render context, so a template
/// whose partials include each other ten times over, five levels deep, would spend seconds
/// producing nothing.
pub const MAX_PARTIAL_EXPANSIONS: u64 = 10_000;

/// A text field of the spec: literal text (no `{{`) skips handlebars, everything else is a
/// registered template named by its field path.
#[derive(Clone, Debug)]
pub(crate) enum Text {
    Literal(String),
    Template(String),
}

/// All texts of one spec, compiled.
pub(crate) struct Engine {
    registry: Handlebars<'static>,
    /// Field path of every registered text (key: registry name).
    fields: BTreeMap<String, String>,
    analyses: BTreeMap<String, Analysis>,
    partial_names: BTreeSet<String>,
    /// What each registered text renders with besides its compiled template.
    prepared: BTreeMap<String, Prepared>,
    /// Compile cost spent so far (see [`MAX_TEXT_COST`]).
    cost: u64,
    /// A text calls `cloud_init_jinja`: escaping stays on in every text, so that the values
    /// written after that call are Jinja-escaped (see `jinja.rs`).
    jinja: bool,
}

impl Engine {
    pub(crate) fn new() -> Self {
        let mut registry = Handlebars::new();
        registry.set_strict_mode(true);
        // User-data is YAML, JSON and shell, never HTML: escaping stays off, except in
        // systemd unit texts, where the "escape" only checks each value (`unit_value`).
        registry.register_escape_fn(unit_value);
        helpers::register(&mut registry);
        Engine {
            registry,
            fields: BTreeMap::new(),
            analyses: BTreeMap::new(),
            partial_names: BTreeSet::new(),
            prepared: BTreeMap::new(),
            cost: 0,
            jinja: false,
        }
    }

    /// Compiles a partial of `spec.partials`.
    pub(crate) fn add_partial(&mut self, name: &str, text: &str, problems: &mut Vec<Problem>) {
        let field = format!("spec.partials.{name}");
        self.partial_names.insert(name.to_owned());
        self.compile(name, &field, text, problems);
    }

    /// Compiles the text of `field`.
    pub(crate) fn add(&mut self, field: &str, text: &str, problems: &mut Vec<Problem>) -> Text {
        if !text.contains("{{") {
            return Text::Literal(text.to_owned());
        }
        self.compile(field, field, text, problems);
        Text::Template(field.to_owned())
    }

    fn compile(&mut self, name: &str, field: &str, text: &str, problems: &mut Vec<Problem>) {
        self.fields.insert(name.to_owned(), field.to_owned());
        self.jinja |= text.contains("cloud_init_jinja");
        let mustaches = text.matches("{{").count() as u64;
        let cost = mustaches.saturating_mul(text.len() as u64);
        self.cost = self.cost.saturating_add(cost);
        if cost > MAX_TEXT_COST || self.cost > MAX_TEMPLATE_COST {
            let what = if cost > MAX_TEXT_COST {
                format!(
                    "too large to compile: {} bytes with {mustaches} `{{{{`, and bytes × `{{{{` may be at most {MAX_TEXT_COST}",
                    text.len()
                )
            } else {
                format!(
                    "too large to compile: together the template's texts exceed {MAX_TEMPLATE_COST} bytes × `{{{{`"
                )
            };
            problems.push(Problem::template(
                field,
                format!("{what} (compile time grows with both; move parts of it into partials)"),
            ));
            return;
        }
        let template = match Template::compile_with_name(text, name.to_owned()) {
            Ok(t) => t,
            Err(e) => {
                problems.push(syntax_problem(field, text, &e));
                return;
            }
        };
        let mut analysis = Analysis::default();
        let mut found = Vec::new();
        analyze(&template, &mut analysis, &mut found);
        if analysis.depth > MAX_DEPTH {
            problems.push(Problem::template(
                field,
                format!(
                    "nested {} levels deep (blocks, `else if` branches and subexpressions); the limit is {MAX_DEPTH}",
                    analysis.depth
                ),
            ));
            dismantle(template);
            return;
        }
        problems.extend(
            found
                .into_iter()
                .map(|(position, message)| Problem::template(field, message).at(position)),
        );
        self.analyses.insert(name.to_owned(), analysis);
        let mut template = template;
        charge_steps(&mut template, field.starts_with("spec.partials."));
        self.registry.register_template(name, template);
        let prepared = Prepared {
            inlined: None,
            capacity: text.len(),
        };
        self.prepared.insert(name.to_owned(), prepared);
    }

    /// After all texts are added: every partial reference must name a partial of
    /// `spec.partials`, partials must not recurse (directly or through others), and the nesting
    /// through partial includes must stay within [`MAX_DEPTH`].
    pub(crate) fn check_partials(&self, problems: &mut Vec<Problem>) {
        for (name, analysis) in &self.analyses {
            for r in &analysis.partials {
                if r.name != "@partial-block" && !self.partial_names.contains(&r.name) {
                    problems.push(
                        Problem::template(
                            &self.fields[name],
                            format!(
                                "partial `{}` is not defined in spec.partials{}",
                                r.name,
                                known(&self.partial_names)
                            ),
                        )
                        .at(r.position),
                    );
                }
            }
        }
        let depths = match self.partial_depths() {
            Ok(depths) => depths,
            Err(problem) => {
                problems.push(problem);
                return;
            }
        };
        for (name, analysis) in &self.analyses {
            let (depth, expansions) = self.effective(analysis, &depths);
            if expansions > MAX_PARTIAL_EXPANSIONS {
                problems.push(Problem::template(
                    &self.fields[name],
                    format!(
                        "includes partials {expansions} times counting the partials they include; the limit is {MAX_PARTIAL_EXPANSIONS}"
                    ),
                ));
            }
            if depth > MAX_DEPTH {
                problems.push(Problem::template(
                    &self.fields[name],
                    format!(
                        "nested {depth} levels deep counting the partials it includes; the limit is {MAX_DEPTH}"
                    ),
                ));
            }
        }
    }

    /// The nesting depth of a text counting the partials it includes, and how many partial
    /// inclusions rendering it takes (without loops).
    fn effective(
        &self,
        analysis: &Analysis,
        partials: &BTreeMap<&str, (usize, u64)>,
    ) -> (usize, u64) {
        let mut depth = analysis.depth;
        let mut expansions = 0u64;
        for r in &analysis.partials {
            if let Some((d, e)) = partials.get(r.name.as_str()) {
                depth = depth.max(r.depth + 1 + d);
                expansions = expansions.saturating_add(1).saturating_add(*e);
            }
        }
        (depth, expansions)
    }

    /// The effective depth and expansion count of every compiled partial, or the first
    /// recursion found. Iterative (explicit stack): a chain of thousands of partials cannot
    /// overflow the stack here.
    fn partial_depths(&self) -> Result<BTreeMap<&str, (usize, u64)>, Problem> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done,
        }
        let mut marks: BTreeMap<&str, Mark> = BTreeMap::new();
        let mut depths: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
        for start in self.partial_names.iter() {
            if marks.contains_key(start.as_str()) || !self.analyses.contains_key(start) {
                continue;
            }
            // (partial, index of the next reference to follow)
            let mut path: Vec<(&str, usize)> = vec![(start.as_str(), 0)];
            marks.insert(start, Mark::Open);
            while let Some((name, next)) = path.last().copied() {
                let refs = &self.analyses[name].partials;
                if let Some(r) = refs.get(next) {
                    path.last_mut().expect("non-empty").1 += 1;
                    let target = r.name.as_str();
                    if !self.analyses.contains_key(target) {
                        continue; // undefined or broken partial: reported elsewhere
                    }
                    match marks.get(target) {
                        Some(Mark::Done) => {}
                        Some(Mark::Open) => {
                            let from = path.iter().position(|(n, _)| *n == target).unwrap_or(0);
                            let mut cycle: Vec<&str> =
                                path[from..].iter().map(|(n, _)| *n).collect();
                            cycle.push(target);
                            return Err(Problem::template(
                                &self.fields[name],
                                format!(
                                    "partial recursion: {} (partials may not include themselves, directly or through other partials)",
                                    cycle.join(" → ")
                                ),
                            )
                            .at(r.position));
                        }
                        None => {
                            marks.insert(target, Mark::Open);
                            path.push((target, 0));
                        }
                    }
                } else {
                    let effective = self.effective(&self.analyses[name], &depths);
                    depths.insert(name, effective);
                    marks.insert(name, Mark::Done);
                    path.pop();
                }
            }
        }
        Ok(depths)
    }

    /// The compiled template registered as `name` (a field path, or a partial's name).
    pub(crate) fn template(&self, name: &str) -> Option<&Template> {
        self.registry.get_template(name)
    }

    /// Every compiled text that is not a partial: registry name and field.
    pub(crate) fn texts(&self) -> impl Iterator<Item = (&str, &str)> {
        self.fields
            .iter()
            .filter(|(name, _)| !self.partial_names.contains(*name))
            .map(|(name, field)| (name.as_str(), field.as_str()))
    }

    /// The names of the partials some text includes.
    pub(crate) fn uses_of_partials(&self) -> Vec<String> {
        self.analyses
            .values()
            .flat_map(|a| a.partials.iter().map(|r| r.name.clone()))
            .collect()
    }

    /// The names of the partials of `spec.partials` that compiled.
    pub(crate) fn partial_names(&self) -> impl Iterator<Item = &str> {
        self.partial_names
            .iter()
            .filter(|n| self.analyses.contains_key(*n))
            .map(String::as_str)
    }

    /// Registers, for every text that includes partials, a copy with the partials' elements in
    /// place of the includes handlebars would otherwise expand at each render (copying the
    /// whole render context for each one). Only includes that cannot tell the difference are
    /// inlined: a plain `{{> name}}` (no parameters, no hash, no block, no indentation) outside
    /// any block that changes the context or adds block parameters, including at most
    /// [`MAX_INLINED`] partials in all. Call after [`Engine::check_partials`] found no problem
    /// (no recursion).
    pub(crate) fn inline_partials(&mut self) {
        let partials: BTreeMap<String, Template> = self
            .partial_names()
            .filter_map(|n| Some((n.to_owned(), self.registry.get_template(n)?.clone())))
            .collect();
        let texts: Vec<String> = self.texts().map(|(name, _)| name.to_owned()).collect();
        for name in texts {
            let Some(template) = self.registry.get_template(&name) else {
                continue;
            };
            let mut inlined = template.clone();
            let mut budget = MAX_INLINED;
            if inline(&mut inlined, &partials, &mut budget)
                && budget < MAX_INLINED
                && let Some(prepared) = self.prepared.get_mut(&name)
            {
                prepared.inlined = Some(inlined);
            }
        }
    }

    /// Whether `name` renders from an inlined copy.
    #[cfg(test)]
    fn is_inlined(&self, name: &str) -> bool {
        self.prepared.get(name).is_some_and(|p| p.inlined.is_some())
    }

    /// [`Engine::render`] for the text of a systemd unit, drop-in or other file systemd reads:
    /// a value written into it must not break a line (it would start a new setting, such as
    /// `ExecStartPre=`), nor end with a backslash (which joins the next line to it).
    pub(crate) fn render_unit(
        &self,
        text: &Text,
        ctx: &Context,
        budget: &mut Budget,
    ) -> Result<String, FieldError> {
        let _unit = UnitText::start();
        self.render(text, ctx, budget)
    }

    /// Renders `text` against `ctx`, taking the bytes from `budget`.
    pub(crate) fn render(
        &self,
        text: &Text,
        ctx: &Context,
        budget: &mut Budget,
    ) -> Result<String, FieldError> {
        match text {
            Text::Literal(s) => {
                if budget.take(s.len()) {
                    Ok(s.clone())
                } else {
                    Err(FieldError::TooLarge)
                }
            }
            Text::Template(name) => {
                let prepared = self.prepared.get(name);
                let capacity = prepared.map_or(0, |p| p.capacity);
                let Some(inlined) = prepared.and_then(|p| p.inlined.as_ref()) else {
                    return self.render_registered(name, ctx, budget, capacity);
                };
                // A failure is rendered again without inlining, from the same budgets: its
                // error then names the partial's field, line and column.
                let (saved, work) = (budget.clone(), crate::helpers::work_left());
                match self.render_template(name, inlined, ctx, budget, capacity) {
                    Ok(out) => Ok(out),
                    Err(_) => {
                        *budget = saved;
                        crate::helpers::set_work_left(work);
                        self.render_registered(name, ctx, budget, capacity)
                    }
                }
            }
        }
    }

    fn render_registered(
        &self,
        name: &str,
        ctx: &Context,
        budget: &mut Budget,
        capacity: usize,
    ) -> Result<String, FieldError> {
        match self.registry.get_template(name) {
            Some(template) => self.render_template(name, template, ctx, budget, capacity),
            None => {
                let e = RenderErrorReason::TemplateNotFound(name.to_owned()).into();
                Err(FieldError::Failed(self.render_problem(name, &e)))
            }
        }
    }

    /// Renders `template` (the text registered as `name`, or its inlined copy) into a buffer of
    /// `capacity` bytes, as the registry would, but with escaping turned off: the escape
    /// function is the identity ([`handlebars::no_escape`]), and with escaping on handlebars
    /// copies every value it writes to pass it through.
    fn render_template(
        &self,
        name: &str,
        template: &Template,
        ctx: &Context,
        budget: &mut Budget,
        capacity: usize,
    ) -> Result<String, FieldError> {
        let helpers = HelperOutput::start(budget);
        let unit = UNIT_TEXT.get();
        UNIT_VALUE_BROKEN.set(false);
        crate::helpers::take_refusal();
        let mut out = LimitedOutput::new(budget, capacity);
        let mut rc = RenderContext::new(template.name.as_ref());
        rc.set_disable_escape(!unit && !self.jinja);
        crate::jinja::start();
        let result = template.render(&self.registry, ctx, &mut rc, &mut out);
        let jinja = crate::jinja::finish();
        let buf = out.buf;
        match result {
            Ok(()) if jinja && (name != RAW_TEMPLATE || !buf.starts_with(crate::jinja::HEADER)) => {
                Err(FieldError::Failed(
                    Problem::template(
                        self.fields.get(name).map_or(name, String::as_str),
                        "`{{cloud_init_jinja}}` writes the first line of a raw spec.template (cloud-init reads `## template: jinja` there only): write it before anything else",
                    )
                    .with_reason(crd_types::conditions::reason::RENDER_FAILED),
                ))
            }
            Ok(()) if unit && UNIT_VALUE_BROKEN.take() => {
                Err(FieldError::Failed(unit_value_problem(name, &self.fields)))
            }
            Ok(()) => Ok(buf),
            Err(_) if budget.exceeded() => Err(FieldError::TooLarge),
            Err(_) if let Some(size) = helpers.refused() => {
                budget.refuse(size);
                Err(FieldError::TooLarge)
            }
            Err(e) if let Some(message) = crate::helpers::take_refusal() => {
                Err(FieldError::Failed(self.refusal_problem(name, &e, message)))
            }
            Err(e) => {
                let mut problem = self.render_problem(name, &e);
                if let Some(message) = not_iterable(e.reason(), ctx) {
                    let said = render_message(e.reason());
                    problem.message = problem.message.replacen(&said, &message, 1);
                }
                Err(FieldError::Failed(problem))
            }
        }
    }

    /// The problem of a `fail` in the template: the config's variables are refused, in the
    /// template's words, with where the template refuses them.
    fn refusal_problem(&self, top: &str, e: &handlebars::RenderError, message: String) -> Problem {
        let at = self.render_problem(top, e);
        let position = at.position.map_or(String::new(), |p| format!(", {p}"));
        Problem::config(
            "spec.variables",
            format!(
                "{message} (refused by the template at {}{position})",
                at.field
            ),
        )
        .with_reason(crd_types::conditions::reason::INVALID_VARIABLES)
    }

    fn render_problem(&self, top: &str, e: &handlebars::RenderError) -> Problem {
        let inner = e.template_name.as_deref().unwrap_or(top);
        let field = self.fields.get(inner).map_or(top, String::as_str);
        let position = match (e.line_no, e.column_no) {
            (Some(line), Some(column)) => Some(Position { line, column }),
            _ => None,
        };
        let mut message = render_message(e.reason());
        if field != top {
            message.push_str(&format!(" (included from {top})"));
        }
        Problem::template(field, message)
            .at(position)
            .with_reason(crd_types::conditions::reason::RENDER_FAILED)
    }
}

thread_local! {
    /// The text rendering on this thread is a systemd unit's (see [`Engine::render_unit`]).
    static UNIT_TEXT: Cell<bool> = const { Cell::new(false) };
    /// A value written into the unit text rendering on this thread breaks its line.
    static UNIT_VALUE_BROKEN: Cell<bool> = const { Cell::new(false) };
}

/// Marks the texts rendered on this thread as a unit's until dropped.
struct UnitText(bool);

impl UnitText {
    fn start() -> Self {
        UnitText(UNIT_TEXT.replace(true))
    }
}

impl Drop for UnitText {
    fn drop(&mut self) {
        UNIT_TEXT.set(self.0);
    }
}

/// The escape function: handlebars calls it on every value a template writes out (`{{x}}`,
/// a helper's result), and only while escaping is on, that is in a unit text or in a template
/// that calls `cloud_init_jinja`. In a unit text it notes a value systemd would read as more
/// than one setting, for the engine to refuse the render (an escape function cannot fail the
/// render itself); after `{{cloud_init_jinja}}` it Jinja-escapes the value. Otherwise it
/// changes nothing.
fn unit_value(value: &str) -> String {
    if UNIT_TEXT.get()
        && (value.chars().any(crate::helpers::unit_breaking) || value.ends_with('\\'))
    {
        UNIT_VALUE_BROKEN.set(true);
    }
    crate::jinja::escape_value(value).into_owned()
}

/// The problem of a unit text that a value broke. The value is the config's doing (its
/// variables, or its Machine's and Cluster's names), so the config is refused, at admission
/// too; the message never shows the value.
fn unit_value_problem(name: &str, fields: &BTreeMap<String, String>) -> Problem {
    let field = fields.get(name).map_or(name, String::as_str);
    Problem::config(
        "spec.variables",
        format!(
            "a value written into the systemd unit text {field} contains a line break or another control character, or ends with a backslash: systemd would read what follows as a new setting (quote values in units with systemd_quote, which names the variable, or give the variable a `pattern`)"
        ),
    )
    .with_reason(crd_types::conditions::reason::RENDER_FAILED)
}

/// Most partial includes inlined into one text (see [`Engine::inline_partials`]): past that,
/// copies of partials would cost more memory than the context copies they save time.
const MAX_INLINED: usize = 32;

/// What a registered text renders with besides its compiled template.
struct Prepared {
    /// The copy with plain partial includes inlined (see [`Engine::inline_partials`]).
    inlined: Option<Template>,
    /// The output buffer's first capacity: the text's own length, about what it renders to.
    capacity: usize,
}

/// Replaces the plain partial includes of `template` that are outside context-changing blocks
/// by the partial's elements (themselves inlined), spending one of `budget` per include.
/// False when the budget ran out (the copy is then not used).
fn inline(
    template: &mut Template,
    partials: &BTreeMap<String, Template>,
    budget: &mut usize,
) -> bool {
    let elements = std::mem::take(&mut template.elements);
    let mapping = std::mem::take(&mut template.mapping);
    for (i, mut element) in elements.into_iter().enumerate() {
        let position = mapping.get(i).cloned();
        match &mut element {
            TemplateElement::PartialExpression(d) => {
                if let Some(partial) = plain_include(d, partials) {
                    if *budget == 0 {
                        return false;
                    }
                    *budget -= 1;
                    let mut body = partial.clone();
                    if !inline(&mut body, partials, budget) {
                        return false;
                    }
                    template.elements.extend(body.elements);
                    template.mapping.extend(body.mapping);
                    continue;
                }
            }
            // `if` and `unless` render their bodies in the same context: includes inside
            // them see what they would see outside.
            TemplateElement::HelperBlock(h)
                if matches!(&h.name, Parameter::Name(n) if n == "if" || n == "unless")
                    && h.block_param.is_none() =>
            {
                for body in h.template.iter_mut().chain(h.inverse.iter_mut()) {
                    if !inline(body, partials, budget) {
                        return false;
                    }
                }
            }
            _ => {}
        }
        template.elements.push(element);
        template.mapping.extend(position);
    }
    true
}

/// The partial a `{{> name}}` without parameters, hash, block or indentation includes.
fn plain_include<'a>(
    d: &DecoratorTemplate,
    partials: &'a BTreeMap<String, Template>,
) -> Option<&'a Template> {
    let Parameter::Name(name) = &d.name else {
        return None;
    };
    let plain = d.params.is_empty()
        && d.hash.is_empty()
        && d.template.is_none()
        && d.indent.as_deref().is_none_or(str::is_empty);
    plain.then(|| partials.get(name)).flatten()
}

/// Why rendering one text failed.
pub(crate) enum FieldError {
    /// The size budget ran out.
    TooLarge,
    /// Anything else, located.
    Failed(Problem),
}

fn known(names: &BTreeSet<String>) -> String {
    if names.is_empty() {
        " (there are none)".to_owned()
    } else {
        let list: Vec<&str> = names.iter().map(String::as_str).collect();
        format!(" (defined: {})", list.join(", "))
    }
}

/// A syntax error in plain words. Unbalanced blocks are found by pairing the block tags
/// ourselves, so the error points at the `{{#if}}` that is never closed rather than at the end
/// of the text, where the parser gives up; other errors keep the parser's position, without
/// its grammar's list of expected rules.
fn syntax_problem(field: &str, text: &str, e: &TemplateError) -> Problem {
    if let Some((position, message)) = unbalanced_block(text) {
        return Problem::template(field, format!("syntax error: {message}"))
            .at(Some(position))
            .with_code("syntax");
    }
    let reason = e.reason().to_string();
    let reason = if reason.contains("expected ") && reason.contains("invalid handlebars syntax") {
        "this is not a handlebars expression the parser understands (check the braces, quotes and parentheses)".to_owned()
    } else {
        truncate(&reason, 200)
    };
    let position = e.pos().map(|(line, column)| Position { line, column });
    Problem::template(field, format!("syntax error: {reason}"))
        .at(position)
        .with_code("syntax")
}

/// The first block tag that is not closed, or closed by the wrong tag, and what is wrong.
fn unbalanced_block(text: &str) -> Option<(Position, String)> {
    let mut open: Vec<(String, Position)> = Vec::new();
    let mut rest = text;
    let mut consumed = 0;
    let at = |offset: usize| {
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Position { line, column }
    };
    while let Some(start) = rest.find("{{") {
        let offset = consumed + start;
        let tag = &rest[start + 2..];
        let (skip, close) = if tag.starts_with("!--") {
            (start + 2, "--}}")
        } else {
            (start + 2, "}}")
        };
        let Some(end) = rest[skip..].find(close) else {
            return None; // an unclosed mustache: the parser's message says it
        };
        let inner = rest[start + 2..skip + end].trim_start_matches(['~', ' ']);
        let name = |s: &str| {
            s.trim_start_matches(['~', ' '])
                .split(|c: char| c.is_whitespace() || c == '}' || c == '~')
                .next()
                .unwrap_or("")
                .to_owned()
        };
        if escaped(text, offset) || inner.starts_with('!') {
        } else if let Some(block) = inner.strip_prefix('#').or_else(|| inner.strip_prefix('^')) {
            let block = block.trim_start_matches(['>', '*']);
            if !block.trim().is_empty() {
                open.push((name(block), at(offset)));
            }
        } else if let Some(closing) = inner.strip_prefix('/') {
            let closing = name(closing);
            match open.pop() {
                Some((opened, position)) if opened != closing => {
                    return Some((
                        position,
                        format!(
                            "`{{{{#{opened}}}}}` is closed by `{{{{/{closing}}}}}` (line {}, column {} of this text); close it with `{{{{/{opened}}}}}`",
                            at(offset).line,
                            at(offset).column
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    return Some((
                        at(offset),
                        format!("`{{{{/{closing}}}}}` closes a block that was never opened"),
                    ));
                }
            }
        }
        consumed += skip + end + close.len();
        rest = &text[consumed..];
    }
    open.pop().map(|(name, position)| {
        (
            position,
            format!(
                "`{{{{#{name}}}}}` is never closed: add `{{{{/{name}}}}}` where the block ends"
            ),
        )
    })
}

/// Whether the `{{` at `offset` is escaped with a backslash (printed as it is).
fn escaped(text: &str, offset: usize) -> bool {
    text[..offset].ends_with('\\')
}

/// `{{#each}}` over a value that is there but is neither a list nor a map: handlebars (in
/// strict mode) reports it as a missing variable, and our message would then say to declare a
/// variable that is declared. The value's kind is named instead (never the value itself: it
/// may come from a Secret). Paths relative to a block's item are left to the usual message.
fn not_iterable(reason: &RenderErrorReason, ctx: &Context) -> Option<String> {
    let RenderErrorReason::MissingVariable(Some(path)) = reason else {
        return None;
    };
    let from_root = path
        .strip_prefix("@root.")
        .or_else(|| path.strip_prefix("@root/"))
        .unwrap_or(path);
    if from_root.starts_with(['@', '.']) || from_root.split(['.', '/']).next() == Some("this") {
        return None;
    }
    let value = from_root
        .split(['.', '/'])
        .try_fold(ctx.data(), |value, key| match value {
            serde_json::Value::Object(map) => map.get(key),
            serde_json::Value::Array(list) => key.parse().ok().and_then(|i: usize| list.get(i)),
            _ => None,
        })?;
    let what = match value {
        serde_json::Value::String(_) => "text",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "true or false",
        serde_json::Value::Null => "null",
        serde_json::Value::Array(_) | serde_json::Value::Object(_) => return None,
    };
    Some(format!(
        "`each` needs a list or a map, and `{}` is {what} here (a variable to loop over needs `schema: {{type: array}}` or `{{type: object}}`)",
        truncate(from_root, 100)
    ))
}

fn render_message(reason: &RenderErrorReason) -> String {
    match reason {
        RenderErrorReason::MissingVariable(Some(path)) => {
            let hint = match path.split(['.', '/']).next() {
                Some("join") => " (`join` is absent for role init: guard it with {{#if join}})",
                Some("certs") => {
                    " (`certs` exist only for control-plane roles: guard it with {{#if certs}})"
                }
                Some("values") => " (declare it in spec.variables)",
                _ => "",
            };
            format!("undefined variable `{}`{hint}", truncate(path, 100))
        }
        RenderErrorReason::MissingVariable(None) => "undefined variable".to_owned(),
        RenderErrorReason::HelperNotFound(name) => {
            format!("unknown helper `{}`", truncate(name, 100))
        }
        RenderErrorReason::PartialNotFound(name) => {
            format!("partial `{}` is not defined", truncate(name, 100))
        }
        RenderErrorReason::ParamNotFoundForIndex(helper, index) => {
            format!("helper `{helper}` needs a parameter {}", index + 1)
        }
        RenderErrorReason::Other(message) => truncate(message, 300),
        other => truncate(&other.to_string(), 300),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine with `partials` and one text, compiled and inlined.
    fn engine(partials: &[(&str, &str)], text: &str) -> Engine {
        let mut engine = Engine::new();
        let mut problems = Vec::new();
        for (name, body) in partials {
            engine.add_partial(name, body, &mut problems);
        }
        engine.add("spec.template", text, &mut problems);
        engine.check_partials(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        engine.inline_partials();
        engine
    }

    fn render(engine: &Engine, data: serde_json::Value) -> Result<String, FieldError> {
        let _work = crate::helpers::WorkBudget::start();
        let text = Text::Template("spec.template".into());
        engine.render(
            &text,
            &Context::wraps(data).unwrap(),
            &mut Budget::new(1 << 20),
        )
    }

    /// After `{{cloud_init_jinja}}` every value is Jinja-escaped, in partials and loops too, but
    /// the one `yaml_quote_jinja … true` writes; before it (and without it) nothing is.
    #[test]
    fn cloud_init_jinja_escapes_every_value_but_the_ones_the_template_asks_for() {
        let partials = [("p", "p: {{yaml_quote v}}\n")];
        let text = "{{#if on}}{{cloud_init_jinja}}{{/if}}#cloud-config\nn: {{yaml_quote_jinja v on}}\n{{> p}}{{#each l}}- {{this}}\n{{/each}}{{#if (yaml_quote_jinja v on)}}x: {{yaml_quote v}}{{/if}}\n";
        let jinja = engine(&partials, text);
        let data = |on: bool| serde_json::json!({"on": on, "v": "{{ ds.x }}", "l": ["{% a"]});
        let e = r#""{{ '{' }}{ ds.x }}""#;
        let expected = format!(
            "## template: jinja\n#cloud-config\nn: '{{{{ ds.x }}}}'\np: {e}\n- {{{{ '{{' }}}}% a\nx: {e}\n"
        );
        // (A subexpression's result is written by another helper: escaped.)
        assert_eq!(render(&jinja, data(true)).ok().unwrap(), expected);
        let plain =
            "#cloud-config\nn: \"{{ ds.x }}\"\np: \"{{ ds.x }}\"\n- {% a\nx: \"{{ ds.x }}\"\n";
        assert_eq!(render(&jinja, data(false)).ok().unwrap(), plain);
        // Anywhere but first, the header would be text cloud-init does not read.
        let late = engine(&[], "#cloud-config\n{{cloud_init_jinja}}");
        let Err(FieldError::Failed(problem)) = render(&late, serde_json::json!({})) else {
            panic!("a late header renders");
        };
        assert!(
            problem.message.contains("first line"),
            "{}",
            problem.message
        );
        // A value asked for as Jinja in an output that is not Jinja.
        let bare = engine(&[], "#cloud-config\nn: {{yaml_quote_jinja v true}}\n");
        assert!(render(&bare, data(false)).is_err());
    }

    #[test]
    fn plain_includes_are_inlined_with_the_bytes_handlebars_renders() {
        let partials = [("outer", "o={{a}}\n{{> inner}}"), ("inner", "i={{a}}\n")];
        let text = "x\n{{> outer}}\n{{#if a}}{{> inner}}{{else}}none{{/if}}\n{{#each l}}{{> inner}}{{/each}}";
        let engine = engine(&partials, text);
        assert!(engine.is_inlined("spec.template"));
        let data = serde_json::json!({"a": 1, "l": [{"a": 2}, {"a": 3}]});
        let out = render(&engine, data.clone()).ok().unwrap();
        // The same text without inlining, as handlebars expands the includes.
        let mut budget = Budget::new(1 << 20);
        let _work = crate::helpers::WorkBudget::start();
        let expanded = engine
            .render_registered(
                "spec.template",
                &Context::wraps(data).unwrap(),
                &mut budget,
                0,
            )
            .ok()
            .unwrap();
        assert_eq!(out, expanded);
        assert_eq!(out, "x\no=1\ni=1\ni=1\n\ni=2\ni=3\n");
    }

    #[test]
    fn includes_with_parameters_or_in_loops_are_left_to_handlebars() {
        let inlined = |text: &str| engine(&[("p", "{{a}}")], text).is_inlined("spec.template");
        assert!(!inlined("{{> p a=1}}"));
        assert!(!inlined("{{> p this}}"));
        assert!(!inlined("{{#each l}}{{> p}}{{/each}}"));
        assert!(!inlined("{{#with w}}{{> p}}{{/with}}"));
        assert!(inlined("{{#unless b}}{{> p}}{{/unless}}"));
    }

    #[test]
    fn an_error_in_an_inlined_partial_names_the_partial() {
        let engine = engine(&[("p", "line\n{{missing}}")], "top\n{{> p}}");
        let Err(FieldError::Failed(problem)) = render(&engine, serde_json::json!({})) else {
            panic!("the render fails");
        };
        assert_eq!(problem.field, "spec.partials.p");
        assert!(
            problem.message.contains("undefined variable `missing`"),
            "{}",
            problem.message
        );
        assert!(
            problem.message.contains("(included from spec.template)"),
            "{}",
            problem.message
        );
        let position = problem.position.expect("a position");
        assert_eq!((position.line, position.column), (2, 1));
    }
}
