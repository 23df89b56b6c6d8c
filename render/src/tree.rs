//! Walks over parsed handlebars trees, all with explicit stacks (a tree can be thousands of
//! levels deep before it is rejected): what a text reads and includes, how deep it nests; the
//! hidden work charges for loops and partials; and a drop that does not recurse.

use handlebars::template::{Parameter, Template, TemplateElement, TemplateMapping};

use crate::error::Position;

/// A `{{> name}}` in a template text.
#[derive(Clone, Debug)]
pub(crate) struct PartialRef {
    pub(crate) name: String,
    pub(crate) position: Option<Position>,
    /// Nesting depth at the reference.
    pub(crate) depth: usize,
}

/// What the walk over one parsed text found.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    pub(crate) depth: usize,
    pub(crate) partials: Vec<PartialRef>,
}

fn position(mapping: &[TemplateMapping], index: usize) -> Option<Position> {
    mapping.get(index).map(|m| Position {
        line: m.0,
        column: m.1,
    })
}

/// Walks a parsed template with an explicit stack: nesting depth, partial references, the
/// paths it reads, and constructs bootplate does not support (decorators and inline partials,
/// which would make partial recursion invisible to the static check; dynamic partial names).
pub(crate) fn analyze(
    template: &Template,
    out: &mut Analysis,
    found: &mut Vec<(Option<Position>, String)>,
) {
    enum Item<'a> {
        Template(&'a Template, usize, bool),
        Param(&'a Parameter, usize, bool, Option<Position>),
    }
    let mut stack = vec![Item::Template(template, 0, false)];
    while let Some(item) = stack.pop() {
        match item {
            Item::Param(param, depth, scoped, pos) => {
                out.depth = out.depth.max(depth);
                if let Parameter::Subexpression(sub) = param
                    && let TemplateElement::Expression(h) = sub.element.as_ref()
                {
                    for p in h.params.iter().chain(h.hash.values()) {
                        stack.push(Item::Param(p, depth + 1, scoped, pos));
                    }
                    stack.push(Item::Param(&h.name, depth + 1, scoped, pos));
                }
            }
            Item::Template(t, depth, scoped) => {
                out.depth = out.depth.max(depth);
                for (i, element) in t.elements.iter().enumerate() {
                    let pos = position(&t.mapping, i);
                    match element {
                        TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => {
                            for p in h.params.iter().chain(h.hash.values()) {
                                stack.push(Item::Param(p, depth + 1, scoped, pos));
                            }
                            stack.push(Item::Param(&h.name, depth, scoped, pos));
                        }
                        TemplateElement::HelperBlock(h) => {
                            for p in h.params.iter().chain(h.hash.values()) {
                                stack.push(Item::Param(p, depth + 1, scoped, pos));
                            }
                            let name = match &h.name {
                                Parameter::Name(n) => n.as_str(),
                                _ => "",
                            };
                            let inner = scoped || matches!(name, "each" | "with");
                            if let Some(body) = &h.template {
                                stack.push(Item::Template(body, depth + 1, inner));
                            }
                            if let Some(inverse) = &h.inverse {
                                stack.push(Item::Template(inverse, depth + 1, scoped));
                            }
                        }
                        TemplateElement::PartialExpression(d) | TemplateElement::PartialBlock(d) => {
                            let name = match &d.name {
                                Parameter::Name(n) => Some(n.clone()),
                                Parameter::Path(p) => Some(path_raw(p)),
                                _ => None,
                            };
                            match name {
                                Some(name) => out.partials.push(PartialRef {
                                    name,
                                    position: pos,
                                    depth,
                                }),
                                None => found.push((
                                    pos,
                                    "dynamic partial names are not supported: name the partial, as in {{> install}}".to_owned(),
                                )),
                            }
                            for p in d.params.iter().chain(d.hash.values()) {
                                stack.push(Item::Param(p, depth + 1, scoped, pos));
                            }
                            if let Some(body) = &d.template {
                                stack.push(Item::Template(body, depth + 1, scoped));
                            }
                        }
                        TemplateElement::DecoratorExpression(_)
                        | TemplateElement::DecoratorBlock(_) => found.push((
                            pos,
                            "decorators and inline partials are not supported: put partials in spec.partials".to_owned(),
                        )),
                        _ => {}
                    }
                }
            }
        }
    }
}

fn path_raw(path: &handlebars::Path) -> String {
    match path {
        handlebars::Path::Relative((_, raw)) => raw.clone(),
        handlebars::Path::Local((_, _, raw)) => raw.clone(),
    }
}

/// Makes loops and partials pay for their work. A loop body or partial prints nothing when its
/// content is only conditions, so the output limit cannot bound, say, three nested `each` over a
/// long list. Every `each` body and every partial therefore starts with an invisible call of the
/// `__bootplate_step` helper, charging the body's size in elements against the render's work
/// budget ([`crate::helpers::MAX_WORK`]).
///
/// The same walk turns every `{{{x}}}` into `{{x}}`. Escaping is off in every text but a
/// systemd unit's, where the escape function checks each value (see `engine.rs`); handlebars
/// would skip that check for `{{{x}}}`, and turn escaping back on after it in any text.
pub(crate) fn charge_steps(template: &mut Template, is_partial: bool) {
    if is_partial {
        let position = template.mapping.first().cloned();
        insert_step(template, position);
    }
    let mut stack: Vec<&mut Template> = vec![template];
    while let Some(t) = stack.pop() {
        let Template {
            elements, mapping, ..
        } = t;
        for (i, element) in elements.iter_mut().enumerate() {
            match element {
                TemplateElement::HelperBlock(h) => {
                    let is_each = matches!(&h.name, Parameter::Name(n) if n == "each");
                    if let Some(body) = h.template.as_mut() {
                        if is_each {
                            insert_step(body, mapping.get(i).cloned());
                        }
                        stack.push(body);
                    }
                    if let Some(inverse) = h.inverse.as_mut() {
                        stack.push(inverse);
                    }
                }
                TemplateElement::PartialBlock(d) => {
                    if let Some(body) = d.template.as_mut() {
                        stack.push(body);
                    }
                }
                TemplateElement::HtmlExpression(_) => {
                    let placeholder = TemplateElement::Comment(String::new());
                    if let TemplateElement::HtmlExpression(h) =
                        std::mem::replace(element, placeholder)
                    {
                        *element = TemplateElement::Expression(h);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Puts `{{__bootplate_step N}}` first in `body`, N being the number of elements in it, at
/// `position` (the loop's) for error messages.
fn insert_step(body: &mut Template, position: Option<TemplateMapping>) {
    let weight = count_elements(body).max(1) as u64;
    let Ok(mut step) =
        Template::compile(&format!("{{{{{} {weight}}}}}", crate::helpers::STEP_HELPER))
    else {
        return;
    };
    let (Some(element), Some(own)) = (step.elements.pop(), step.mapping.pop()) else {
        return;
    };
    body.elements.insert(0, element);
    // Template::render looks positions up by element index: keep the two lists aligned.
    if body.mapping.len() + 1 == body.elements.len() {
        body.mapping.insert(0, position.unwrap_or(own));
    }
}

/// Elements in a template, nested blocks included (bounded: the template is at most
/// [`crate::MAX_DEPTH`] deep and its text at most [`crate::MAX_TEXT_COST`]).
fn count_elements(template: &Template) -> usize {
    let mut count = 0;
    let mut stack = vec![template];
    while let Some(t) = stack.pop() {
        count += t.elements.len();
        for element in &t.elements {
            match element {
                TemplateElement::HelperBlock(h) => {
                    stack.extend(h.template.iter());
                    stack.extend(h.inverse.iter());
                }
                TemplateElement::PartialBlock(d) => stack.extend(d.template.iter()),
                _ => {}
            }
        }
    }
    count
}

/// Drops a parsed template without recursion: an `else if` chain of 100 000 branches is a
/// 100 000-deep tree, and the compiler-generated drop would recurse once per level.
pub(crate) fn dismantle(template: Template) {
    let mut elements: Vec<TemplateElement> = template.elements;
    let mut params: Vec<Parameter> = Vec::new();
    loop {
        if let Some(param) = params.pop() {
            if let Parameter::Subexpression(sub) = param {
                elements.push(*sub.element);
            }
            continue;
        }
        let Some(element) = elements.pop() else { break };
        match element {
            TemplateElement::Expression(mut h)
            | TemplateElement::HtmlExpression(mut h)
            | TemplateElement::HelperBlock(mut h) => {
                params.append(&mut h.params);
                params.extend(h.hash.drain().map(|(_, v)| v));
                params.push(std::mem::replace(
                    &mut h.name,
                    Parameter::Name(String::new()),
                ));
                for t in [h.template.take(), h.inverse.take()].into_iter().flatten() {
                    elements.extend(t.elements);
                }
            }
            TemplateElement::PartialExpression(mut d)
            | TemplateElement::PartialBlock(mut d)
            | TemplateElement::DecoratorExpression(mut d)
            | TemplateElement::DecoratorBlock(mut d) => {
                params.append(&mut d.params);
                params.extend(d.hash.drain().map(|(_, v)| v));
                if let Some(t) = d.template.take() {
                    elements.extend(t.elements);
                }
            }
            _ => {}
        }
    }
}
