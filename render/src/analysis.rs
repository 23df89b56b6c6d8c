//! Whole-template analysis: every compiled text is walked through every branch, loop body and
//! included partial, whatever a sample machine would take, and each name is checked against the
//! render context's schema: helper names and their number of parameters, paths (`cluster.*`,
//! `machine.*`, `join.*` not for `init`, `certs.*` only for control-plane roles, `values.*`
//! declared, loop items of `files`, lists and maps), each with "did you mean". The same walk
//! finds free text written unquoted into shell, YAML or JSON (see [`Output`]).

use std::collections::BTreeSet;

use crd_types::strict::hint;
use crd_types::{Role, ValueType};
use handlebars::template::{
    BlockParam, DecoratorTemplate, HelperTemplate, Parameter, Template, TemplateElement,
};

use crate::engine::Engine;
use crate::error::{Position, Problem};
use crate::values::Declarations;

/// What a name holds, as far as the analysis knows.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Ty {
    /// Not known (a `lookup`, a partial's named parameters): nothing below it is checked.
    Any,
    /// Any value a user writes (a variable without a schema, or an object or list item of
    /// no declared type): nothing below it is checked, and it is free text when written out.
    Free,
    /// Text; `free` when a user writes it without constraints (a variable with neither
    /// `pattern` nor `enum`, a name or label of a Machine or Cluster).
    Text {
        free: bool,
    },
    Number,
    Bool,
    List(Box<Ty>),
    /// A map with any keys (labels).
    Dict(Box<Ty>),
    /// A map with known fields only.
    Object(Vec<(String, Ty)>),
}

const FREE: Ty = Ty::Text { free: true };
const FIXED: Ty = Ty::Text { free: false };

fn object(fields: Vec<(&str, Ty)>) -> Ty {
    Ty::Object(fields.into_iter().map(|(k, t)| (k.to_owned(), t)).collect())
}

/// The render context's schema (see `context.rs` and `CompiledTemplate::context`).
pub(crate) fn context_type(declarations: &Declarations) -> Ty {
    let pair = || object(vec![("cert", FIXED), ("key", FIXED)]);
    let labels = || Ty::Dict(Box::new(FREE));
    let values = declarations
        .list
        .iter()
        .map(|d| (d.decl.name.clone(), variable_type(d.decl.schema.as_ref())))
        .collect();
    object(vec![
        (
            "cluster",
            object(vec![
                ("name", FREE),
                ("namespace", FREE),
                (
                    "controlPlaneEndpoint",
                    object(vec![
                        ("host", FIXED),
                        ("port", Ty::Number),
                        ("address", FIXED),
                    ]),
                ),
                (
                    "network",
                    object(vec![
                        ("pods", Ty::List(Box::new(FIXED))),
                        ("services", Ty::List(Box::new(FIXED))),
                        ("serviceDomain", FIXED),
                    ]),
                ),
                ("labels", labels()),
            ]),
        ),
        (
            "machine",
            object(vec![
                ("name", FREE),
                ("namespace", FREE),
                ("version", FIXED),
                ("failureDomain", FREE),
                ("labels", labels()),
                ("role", FIXED),
            ]),
        ),
        (
            "join",
            object(vec![
                ("token", FIXED),
                ("apiServerEndpoint", FIXED),
                ("caCertHashes", Ty::List(Box::new(FIXED))),
            ]),
        ),
        (
            "certs",
            object(vec![
                ("ca", pair()),
                ("etcd", pair()),
                ("frontProxy", pair()),
                ("serviceAccount", pair()),
            ]),
        ),
        ("values", Ty::Object(values)),
        (
            "files",
            Ty::List(Box::new(object(vec![
                ("path", FREE),
                ("permissions", FIXED),
                ("owner", FREE),
                ("content", FREE),
                ("encoding", FIXED),
            ]))),
        ),
        ("preCommands", Ty::List(Box::new(FIXED))),
        ("postCommands", Ty::List(Box::new(FIXED))),
        ("network", network_type()),
    ])
}

/// `network` (see `network::context`). URLs may hold `$`, `&` and `;` (a URL allows them), and
/// PEM and file texts are multi-line: free text. Hosts, CIDRs, names, digests and paths are
/// checked to a narrow alphabet, and the proxy's lines are built from proxy URLs of scheme,
/// host and port and checked `noProxy` entries only: fixed.
fn network_type() -> Ty {
    let list = |t: Ty| Ty::List(Box::new(t));
    let file = || {
        object(vec![
            ("path", FIXED),
            ("permissions", FIXED),
            ("content", FREE),
        ])
    };
    let source = || object(vec![("url", FREE), ("sha256", FIXED)]);
    let artifacts = crd_types::network::ARTIFACTS
        .iter()
        .map(|a| (a.as_str().replace('-', "_"), source()))
        .collect();
    object(vec![
        (
            "registryMirrors",
            list(object(vec![
                ("registry", FIXED),
                ("directory", FIXED),
                ("hostsToml", FREE),
                ("files", list(file())),
            ])),
        ),
        (
            "proxy",
            object(vec![
                ("enabled", Ty::Bool),
                ("http", FIXED),
                ("https", FIXED),
                ("noProxy", list(FIXED)),
                ("noProxyList", FIXED),
                ("environment", FIXED),
                ("systemdEnvironment", FIXED),
            ]),
        ),
        (
            "caBundles",
            list(object(vec![
                ("name", FIXED),
                ("fileName", FIXED),
                ("pem", FREE),
            ])),
        ),
        ("caBundle", FREE),
        ("ntpServers", list(FIXED)),
        ("imageRepository", FIXED),
        (
            "artifacts",
            list(object(vec![
                ("name", FIXED),
                ("url", FREE),
                ("sha256", FIXED),
            ])),
        ),
        ("artifact", Ty::Object(artifacts)),
    ])
}

fn variable_type(schema: Option<&crd_types::VariableSchema>) -> Ty {
    let Some(schema) = schema else {
        return Ty::Free;
    };
    let constrained = schema.pattern.is_some() || schema.enum_.is_some();
    let scalar = |t: ValueType| match t {
        ValueType::String => Ty::Text { free: !constrained },
        ValueType::Integer | ValueType::Number => Ty::Number,
        ValueType::Boolean => Ty::Bool,
        ValueType::Array => Ty::List(Box::new(Ty::Free)),
        ValueType::Object => Ty::Free,
    };
    match schema.type_ {
        Some(ValueType::Array) => Ty::List(Box::new(
            schema.items.as_ref().map_or(Ty::Free, |i| scalar(i.type_)),
        )),
        Some(t) => scalar(t),
        None if schema.pattern.is_some() => FIXED,
        None if schema.enum_.is_some() => Ty::Any,
        None => Ty::Free,
    }
}

/// What a text's output is read as, for the quoting analysis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    /// A shell command or script.
    Shell,
    /// A PowerShell command or script (the Windows formats).
    PowerShell,
    /// A YAML document (cloud-config, kubeadm configuration).
    Yaml,
    /// A JSON document (Ignition).
    Json,
    /// A systemd unit, drop-in or other file systemd reads: one setting per line.
    Unit,
    /// Anything else (plain files): not checked.
    Other,
}

impl Output {
    fn describe(self) -> &'static str {
        match self {
            Output::Shell => "a shell command",
            Output::PowerShell => "a PowerShell command",
            Output::Yaml => "a YAML document",
            Output::Json => "a JSON document",
            Output::Unit => "a systemd unit",
            Output::Other => "the output",
        }
    }

    fn quoting_helper(self) -> &'static str {
        match self {
            Output::Shell => "shell_quote",
            Output::PowerShell => "ps_quote",
            Output::Yaml => "yaml_quote",
            Output::Unit => "systemd_quote",
            _ => "json",
        }
    }
}

/// Helpers whose result cannot break out of the syntax it is written into (`shell_quote` but
/// in a systemd unit, where the line breaks it keeps start a new setting; the PowerShell ones
/// in PowerShell only, and only they there: see [`POSIX_QUOTING`]).
const QUOTING: [&str; 13] = [
    "shell_quote",
    "ps_quote",
    "ps_here",
    "systemd_quote",
    "systemd_env_quote",
    "yaml_quote",
    "yaml_quote_jinja",
    "json",
    "base64",
    "gzip_base64",
    "sha256",
    "url_encode",
    "octal",
];

/// Quoting helpers whose result PowerShell reads differently: in its double-quoted strings
/// (`json`, `yaml_quote`, `systemd_quote`) `$` and backticks expand, and a POSIX-quoted
/// `'it'\''s'` ends its single-quoted string at the backslash.
const POSIX_QUOTING: [&str; 5] = [
    "shell_quote",
    "systemd_quote",
    "systemd_env_quote",
    "yaml_quote",
    "json",
];

/// The handlebars built-ins bootplate keeps: name, smallest and largest number of parameters.
const BUILTINS: [(&str, usize, usize); 15] = [
    ("if", 1, 1),
    ("unless", 1, 1),
    ("each", 1, 1),
    ("with", 1, 1),
    ("lookup", 2, 2),
    ("eq", 2, 2),
    ("ne", 2, 2),
    ("gt", 2, 2),
    ("gte", 2, 2),
    ("lt", 2, 2),
    ("lte", 2, 2),
    ("and", 2, usize::MAX),
    ("or", 2, usize::MAX),
    ("not", 1, 1),
    ("len", 1, 1),
];

fn helper_names() -> impl Iterator<Item = &'static str> + Clone {
    BUILTINS
        .iter()
        .map(|b| b.0)
        .chain(crate::helpers::HELPERS.iter().map(|h| h.0))
}

fn is_helper(name: &str) -> bool {
    helper_names().any(|h| h == name)
}

/// Checks a call of helper `name` with `params` positional and `hash` named parameters.
fn check_helper(name: &str, params: usize, hash: usize, block: bool) -> Result<(), String> {
    let block_only = ["if", "unless", "each", "with"];
    if let Some((_, min, max)) = BUILTINS.iter().find(|b| b.0 == name) {
        if block_only.contains(&name) != block {
            return Err(if block {
                format!("`{name}` is not a block helper: write {{{{{name} …}}}}")
            } else {
                format!("`{name}` is a block helper: write {{{{#{name} …}}}}…{{{{/{name}}}}}")
            });
        }
        if params < *min || params > *max || hash > 0 {
            let count = if min == max {
                format!("{min}")
            } else {
                format!("at least {min}")
            };
            return Err(format!(
                "helper `{name}` takes {count} parameter{}, got {params}{}",
                if *min == 1 && min == max { "" } else { "s" },
                if hash > 0 { " and named ones" } else { "" }
            ));
        }
        return Ok(());
    }
    if let Some((_, usage, arity, _)) = crate::helpers::HELPERS.iter().find(|h| h.0 == name) {
        if block {
            return Err(format!(
                "`{name}` is not a block helper: write {{{{{usage}}}}}"
            ));
        }
        if params != *arity || hash > 0 {
            return Err(format!(
                "helper `{name}` takes {arity} parameter{}: {usage}",
                if *arity == 1 { "" } else { "s" }
            ));
        }
        return Ok(());
    }
    Err(format!(
        "unknown helper `{name}`{}",
        hint(name, helper_names())
    ))
}

/// One text to analyse: its registry name, the field it is reported at, the roles it renders
/// for, and what its output is read as.
pub(crate) struct Entry<'a> {
    pub(crate) name: &'a str,
    pub(crate) field: &'a str,
    pub(crate) roles: &'a [Role],
    pub(crate) output: Output,
}

/// What the analysis found: problems (errors; unquoted free text as warnings), and which
/// variables are read.
#[derive(Default)]
pub(crate) struct Findings {
    pub(crate) problems: Vec<Problem>,
    pub(crate) read: BTreeSet<String>,
    /// `values` itself is read (`{{json values}}`): every variable counts as read.
    pub(crate) whole_values: bool,
    /// The fields of `network` read (`network.proxy.http` reads `proxy`); `*` when `network`
    /// itself is read (then every field counts as read).
    pub(crate) network_read: BTreeSet<String>,
}

#[derive(Clone)]
struct Frame {
    this: Ty,
    /// Block parameters (`as |item index|`).
    params: Vec<(String, Ty)>,
    in_loop: bool,
}

#[derive(Clone, Copy, Default)]
struct Guards {
    certs: bool,
    join: bool,
}

struct Walk<'a> {
    engine: &'a Engine,
    root: &'a Ty,
    roles: &'a [Role],
    output: Output,
    findings: &'a mut Findings,
    /// Partials already walked with the same scope, so a partial included a thousand times
    /// is walked once.
    seen: &'a mut BTreeSet<String>,
}

/// Walks every text in `entries`.
pub(crate) fn analyze(engine: &Engine, declarations: &Declarations, entries: &[Entry]) -> Findings {
    let root = context_type(declarations);
    let mut findings = Findings::default();
    let mut seen = BTreeSet::new();
    for entry in entries {
        let Some(template) = engine.template(entry.name) else {
            continue;
        };
        let mut walk = Walk {
            engine,
            root: &root,
            roles: entry.roles,
            output: entry.output,
            findings: &mut findings,
            seen: &mut seen,
        };
        let mut frames = vec![Frame {
            this: root.clone(),
            params: Vec::new(),
            in_loop: false,
        }];
        walk.template(template, entry.field, &mut frames, Guards::default());
    }
    findings.problems.sort_by(|a, b| {
        (&a.field, a.position, &a.message).cmp(&(&b.field, b.position, &b.message))
    });
    findings.problems.dedup();
    findings
}

fn position(t: &Template, index: usize) -> Option<Position> {
    t.mapping.get(index).map(|m| Position {
        line: m.0,
        column: m.1,
    })
}

/// The name a helper, partial or block parameter is written as.
fn name_of(p: &Parameter) -> Option<&str> {
    match p {
        Parameter::Name(n) => Some(n),
        Parameter::Path(p) => Some(path_raw(p)),
        _ => None,
    }
}

fn path_raw(path: &handlebars::Path) -> &str {
    match path {
        handlebars::Path::Relative((_, raw)) => raw,
        handlebars::Path::Local((_, _, raw)) => raw,
    }
}

/// Whether a condition reads `root` (`certs`, `join`, `machine.role`) anywhere.
fn mentions(param: &Parameter, root: &str) -> bool {
    match param {
        Parameter::Path(p) => {
            let raw = path_raw(p).trim_start_matches("@root.");
            raw == root
                || raw.starts_with(&format!("{root}."))
                || raw.starts_with(&format!("{root}/"))
        }
        Parameter::Subexpression(sub) => match sub.element.as_ref() {
            TemplateElement::Expression(h) => h.params.iter().any(|p| mentions(p, root)),
            _ => false,
        },
        _ => false,
    }
}

impl Walk<'_> {
    fn problem(&mut self, field: &str, position: Option<Position>, message: String) {
        let code = if message.starts_with("unknown helper") {
            "unknown-helper"
        } else if message.starts_with("helper `") || message.contains("block helper") {
            "helper-arity"
        } else if message.contains(" is absent for ") {
            "role-absent"
        } else {
            "unknown-name"
        };
        self.findings.problems.push(
            Problem::template(field, message)
                .at(position)
                .with_code(code),
        );
    }

    fn template(&mut self, t: &Template, field: &str, frames: &mut Vec<Frame>, guards: Guards) {
        for (i, element) in t.elements.iter().enumerate() {
            let pos = position(t, i);
            match element {
                TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => {
                    if matches!(&h.name, Parameter::Name(n) if n == crate::helpers::STEP_HELPER) {
                        continue;
                    }
                    let ty = self.expression(h, field, pos, frames, guards);
                    self.check_quoting(h, &ty, field, pos);
                }
                TemplateElement::HelperBlock(h) => self.block(h, field, pos, frames, guards),
                TemplateElement::PartialExpression(d) | TemplateElement::PartialBlock(d) => {
                    self.partial(d, field, pos, frames, guards)
                }
                _ => {}
            }
        }
    }

    /// An expression (`{{x}}`, `{{helper a b}}`, a subexpression): checks it and returns the
    /// type of its value.
    fn expression(
        &mut self,
        h: &HelperTemplate,
        field: &str,
        pos: Option<Position>,
        frames: &[Frame],
        guards: Guards,
    ) -> Ty {
        let name = match &h.name {
            Parameter::Name(n) => Some(n.as_str()),
            Parameter::Path(p) if h.params.is_empty() && h.hash.is_empty() => {
                let raw = path_raw(p);
                if is_helper(raw) {
                    Some(raw)
                } else {
                    return self.path(raw, field, pos, frames, guards, false);
                }
            }
            Parameter::Path(p) => Some(path_raw(p)),
            _ => None,
        };
        let Some(name) = name else { return Ty::Any };
        if h.params.is_empty() && h.hash.is_empty() && !is_helper(name) {
            return self.path(name, field, pos, frames, guards, false);
        }
        if let Err(message) = check_helper(name, h.params.len(), h.hash.len(), false) {
            self.problem(field, pos, message);
        }
        let types: Vec<Ty> = h
            .params
            .iter()
            .chain(h.hash.values())
            .map(|p| self.param(p, field, pos, frames, guards, name == "default"))
            .collect();
        match name {
            "eq" | "ne" | "gt" | "gte" | "lt" | "lte" | "and" | "or" | "not" => Ty::Bool,
            "version_at_least" | "starts_with" => Ty::Bool,
            "len" => Ty::Number,
            // Digits and a dot, or the render fails.
            "kubernetes_minor" => FIXED,
            "lookup" => Ty::Any,
            "shell_quote" if self.output == Output::Unit => free_if_any(&types),
            n if self.output == Output::PowerShell && POSIX_QUOTING.contains(&n) => {
                free_if_any(&types)
            }
            "ps_quote" | "ps_here" if self.output != Output::PowerShell => free_if_any(&types),
            n if QUOTING.contains(&n) => FIXED,
            "upper" | "lower" | "trim" | "indent" | "nindent" | "join" => free_if_any(&types),
            "default" => types.first().cloned().unwrap_or(Ty::Any),
            _ => Ty::Any,
        }
    }

    fn param(
        &mut self,
        p: &Parameter,
        field: &str,
        pos: Option<Position>,
        frames: &[Frame],
        guards: Guards,
        tested: bool,
    ) -> Ty {
        match p {
            Parameter::Path(path) => self.path(path_raw(path), field, pos, frames, guards, tested),
            Parameter::Subexpression(sub) => match sub.element.as_ref() {
                TemplateElement::Expression(h) => self.expression(h, field, pos, frames, guards),
                _ => Ty::Any,
            },
            Parameter::Literal(v) => match v {
                serde_json::Value::String(_) => FIXED,
                serde_json::Value::Number(_) => Ty::Number,
                serde_json::Value::Bool(_) => Ty::Bool,
                _ => Ty::Any,
            },
            Parameter::Name(n) => self.path(n, field, pos, frames, guards, tested),
            _ => Ty::Any,
        }
    }

    fn block(
        &mut self,
        h: &HelperTemplate,
        field: &str,
        pos: Option<Position>,
        frames: &mut Vec<Frame>,
        guards: Guards,
    ) {
        let name = name_of(&h.name).unwrap_or("");
        if let Err(message) = check_helper(name, h.params.len(), h.hash.len(), true) {
            self.problem(field, pos, message);
        }
        let tested = matches!(name, "if" | "unless" | "with");
        let types: Vec<Ty> = h
            .params
            .iter()
            .map(|p| self.param(p, field, pos, frames, guards, tested))
            .collect();
        let mut inner = guards;
        if tested || name == "each" {
            for p in &h.params {
                inner.certs |= mentions(p, "certs") || mentions(p, "machine.role");
                inner.join |= mentions(p, "join") || mentions(p, "machine.role");
            }
        }
        let target = types.first().cloned().unwrap_or(Ty::Any);
        if let Some(body) = &h.template {
            match name {
                "each" => {
                    let (item, index) = match &target {
                        Ty::List(item) => ((**item).clone(), Ty::Number),
                        Ty::Dict(item) => ((**item).clone(), FIXED),
                        Ty::Object(_) => (Ty::Any, FIXED),
                        Ty::Any => (Ty::Any, Ty::Any),
                        Ty::Free => (Ty::Free, Ty::Any),
                        other => {
                            self.problem(
                                field,
                                pos,
                                format!(
                                    "`each` needs a list or a map, and this is {}",
                                    describe(other)
                                ),
                            );
                            (Ty::Any, Ty::Any)
                        }
                    };
                    frames.push(Frame {
                        this: item.clone(),
                        params: block_params(h.block_param.as_ref(), item, index),
                        in_loop: true,
                    });
                    self.template(body, field, frames, inner);
                    frames.pop();
                }
                "with" => {
                    frames.push(Frame {
                        this: target.clone(),
                        params: block_params(h.block_param.as_ref(), target, Ty::Any),
                        in_loop: false,
                    });
                    self.template(body, field, frames, inner);
                    frames.pop();
                }
                _ => self.template(body, field, frames, inner),
            }
        }
        if let Some(inverse) = &h.inverse {
            self.template(inverse, field, frames, inner);
        }
    }

    fn partial(
        &mut self,
        d: &DecoratorTemplate,
        field: &str,
        pos: Option<Position>,
        frames: &mut Vec<Frame>,
        guards: Guards,
    ) {
        let Some(name) = name_of(&d.name) else {
            return;
        };
        let context = d
            .params
            .first()
            .map(|p| self.param(p, field, pos, frames, guards, false));
        for p in d.hash.values() {
            self.param(p, field, pos, frames, guards, false);
        }
        if let Some(body) = &d.template {
            self.template(body, field, frames, guards);
        }
        let Some(template) = self.engine.template(name) else {
            return; // undefined partials are reported by the compiler
        };
        // A partial sees the includer's scope, or the given context; named parameters add
        // fields the analysis does not track.
        let mut inner: Vec<Frame> = match (context, d.hash.is_empty()) {
            (Some(this), true) => vec![Frame {
                this,
                params: Vec::new(),
                in_loop: false,
            }],
            (None, true) => frames.clone(),
            _ => vec![Frame {
                this: Ty::Any,
                params: Vec::new(),
                in_loop: true,
            }],
        };
        let key = format!(
            "{name}|{:?}|{:?}|{}|{}|{:?}",
            inner.iter().map(|f| &f.this).collect::<Vec<_>>(),
            self.roles,
            guards.certs,
            guards.join,
            self.output
        );
        if !self.seen.insert(key) {
            return;
        }
        let partial_field = format!("spec.partials.{name}");
        self.template(template, &partial_field, &mut inner, guards);
    }

    /// Resolves `raw` in the current scope, reporting unknown names; `tested`: the path is a
    /// condition (`if`, `unless`, `with`, `default`'s first parameter), so a name that a role
    /// lacks is what it tests for.
    fn path(
        &mut self,
        raw: &str,
        field: &str,
        pos: Option<Position>,
        frames: &[Frame],
        guards: Guards,
        tested: bool,
    ) -> Ty {
        if raw.starts_with('@') && !raw.starts_with("@root") {
            if !frames.last().is_some_and(|f| f.in_loop) && frames.len() == 1 {
                self.problem(
                    field,
                    pos,
                    format!("`{raw}` is only defined inside {{{{#each}}}}"),
                );
            }
            return Ty::Any;
        }
        let mut rest = raw;
        let mut level = 0;
        while let Some(r) = rest.strip_prefix("../") {
            level += 1;
            rest = r;
        }
        let (rooted, rest) = match rest.strip_prefix("@root") {
            Some(r) => (true, r.trim_start_matches(['.', '/'])),
            None => (false, rest),
        };
        let segments = segments(rest);
        let frame_index = frames.len().saturating_sub(1 + level);
        let (start, shown_prefix) = if rooted {
            (self.root.clone(), String::new())
        } else if let Some(first) = segments.first()
            && let Some(t) = frames
                .iter()
                .rev()
                .find_map(|f| f.params.iter().find(|(n, _)| n == first).map(|(_, t)| t))
        {
            let t = t.clone();
            return self.descend(false, t, &segments[1..], first.clone(), field, pos);
        } else {
            (frames[frame_index].this.clone(), String::new())
        };
        let at_root = rooted || (frame_index == 0 && start == *self.root);
        if at_root && let Some(first) = segments.first() {
            match first.as_str() {
                "certs" if !tested && !guards.certs && self.roles.contains(&Role::Worker) => {
                    self.problem(
                        field,
                        pos,
                        format!(
                            "`{raw}` is absent for role worker (certificates go to control-plane roles only); guard it with {{{{#if certs}}}} or put it in a part with roles [init, control-plane-join]"
                        ),
                    );
                    return Ty::Any;
                }
                "join" if !tested && !guards.join && self.roles.contains(&Role::Init) => {
                    self.problem(
                        field,
                        pos,
                        format!(
                            "`{raw}` is absent for the init machine (it creates the cluster, it joins nothing); guard it with {{{{#if join}}}} or put it in a part with roles [control-plane-join, worker]"
                        ),
                    );
                    return Ty::Any;
                }
                "values" => match segments.get(1) {
                    Some(name) => {
                        self.findings.read.insert(name.clone());
                    }
                    None => self.findings.whole_values = true,
                },
                "network" => {
                    let field = segments.get(1).map_or("*", String::as_str);
                    self.findings.network_read.insert(field.to_owned());
                }
                _ => {}
            }
        }
        self.descend(at_root, start, &segments, shown_prefix, field, pos)
    }

    fn descend(
        &mut self,
        at_root: bool,
        mut ty: Ty,
        segments: &[String],
        mut shown: String,
        field: &str,
        pos: Option<Position>,
    ) -> Ty {
        for segment in segments {
            let parent = shown.clone();
            if !shown.is_empty() {
                shown.push('.');
            }
            shown.push_str(segment);
            ty = match ty {
                Ty::Any => return Ty::Any,
                Ty::Free => return Ty::Free,
                Ty::Dict(item) => *item,
                Ty::List(item) if segment.parse::<usize>().is_ok() => *item,
                Ty::Object(fields) => match fields.iter().find(|(k, _)| k == segment) {
                    Some((_, t)) => t.clone(),
                    None => {
                        let known = fields.iter().map(|(k, _)| k.as_str());
                        let message = if parent == "values" {
                            format!(
                                "`values.{}` is not declared in spec.variables{}",
                                crate::error::truncate(segment, 64),
                                hint(segment, known)
                            )
                        } else if parent.is_empty() && !at_root {
                            format!(
                                "`this` has no field `{}`{}",
                                crate::error::truncate(segment, 64),
                                hint(segment, known)
                            )
                        } else if parent.is_empty() {
                            format!(
                                "unknown name `{}`{}",
                                crate::error::truncate(segment, 64),
                                hint(segment, known)
                            )
                        } else {
                            format!(
                                "`{}`: `{parent}` has no field `{}`{}",
                                crate::error::truncate(&shown, 128),
                                crate::error::truncate(segment, 64),
                                hint(segment, known)
                            )
                        };
                        self.problem(field, pos, message);
                        return Ty::Any;
                    }
                },
                other => {
                    self.problem(
                        field,
                        pos,
                        format!(
                            "`{parent}` is {}: it has no field `{}`",
                            describe(&other),
                            crate::error::truncate(segment, 64)
                        ),
                    );
                    return Ty::Any;
                }
            };
        }
        ty
    }

    /// Free text written as it is into shell, YAML or JSON can end the quoted string it is in
    /// and write syntax of its own (`"; touch /tmp/x; echo "`, a newline and `controlPlane: {}`).
    fn check_quoting(&mut self, h: &HelperTemplate, ty: &Ty, field: &str, pos: Option<Position>) {
        if self.output == Output::Other || !matches!(ty, Ty::Text { free: true } | Ty::Free) {
            return;
        }
        let shown = match &h.name {
            Parameter::Path(p) if h.params.is_empty() => path_raw(p).to_owned(),
            Parameter::Name(n) if h.params.is_empty() => n.clone(),
            Parameter::Name(n) => format!("({n} …)"),
            _ => "the value".to_owned(),
        };
        let helper = self.output.quoting_helper();
        self.findings.problems.push(
            Problem::template(
                field,
                format!(
                    "`{shown}` is free text written unquoted into {}: a value with quotes, `;` or a newline changes what it does; write {{{{{helper} {shown}}}}} (or give the variable a `pattern` or `enum`)",
                    self.output.describe()
                ),
            )
            .at(pos)
            .warning()
            .with_code("unquoted"),
        );
    }
}

/// Text, free when any of the values it is made of is.
fn free_if_any(types: &[Ty]) -> Ty {
    let free = types.iter().any(|t| match t {
        Ty::Text { free } => *free,
        Ty::Free => true,
        Ty::List(item) => matches!(**item, Ty::Text { free: true } | Ty::Free),
        _ => false,
    });
    Ty::Text { free }
}

fn block_params(param: Option<&BlockParam>, item: Ty, index: Ty) -> Vec<(String, Ty)> {
    let name = |p: &Parameter| name_of(p).map(str::to_owned);
    match param {
        Some(BlockParam::Single(p)) => name(p).map(|n| vec![(n, item)]).unwrap_or_default(),
        Some(BlockParam::Pair((a, b))) => [name(a).map(|n| (n, item)), name(b).map(|n| (n, index))]
            .into_iter()
            .flatten()
            .collect(),
        _ => Vec::new(),
    }
}

fn describe(ty: &Ty) -> &'static str {
    match ty {
        Ty::Any | Ty::Free => "a value",
        Ty::Text { .. } => "text",
        Ty::Number => "a number",
        Ty::Bool => "a boolean",
        Ty::List(_) => "a list",
        Ty::Dict(_) | Ty::Object(_) => "a map",
    }
}

/// `this.a.[b c]/d` → `a`, `b c`, `d`.
pub(crate) fn segments(path: &str) -> Vec<String> {
    let path = path
        .strip_prefix("this.")
        .or_else(|| path.strip_prefix("this/"))
        .or_else(|| path.strip_prefix("./"))
        .unwrap_or(path);
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_brackets = false;
    for c in path.chars() {
        match c {
            '[' if !in_brackets => in_brackets = true,
            ']' if in_brackets => in_brackets = false,
            '.' | '/' if !in_brackets => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    if out.first().is_some_and(|s| s == "this" || s == ".") {
        out.remove(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments() {
        assert_eq!(segments("values.a"), ["values", "a"]);
        assert_eq!(segments("this.values/[a b].c"), ["values", "a b", "c"]);
        assert_eq!(segments("this"), Vec::<String>::new());
    }

    #[test]
    fn helper_arity_and_names() {
        assert!(check_helper("shell_quote", 1, 0, false).is_ok());
        assert_eq!(
            check_helper("shell_quote", 2, 0, false).unwrap_err(),
            "helper `shell_quote` takes 1 parameter: shell_quote VALUE"
        );
        assert_eq!(
            check_helper("shel_quote", 1, 0, false).unwrap_err(),
            "unknown helper `shel_quote`; did you mean `shell_quote`?"
        );
        assert!(check_helper("and", 3, 0, false).is_ok());
        assert!(check_helper("if", 1, 0, false).is_err());
        assert!(check_helper("log", 1, 0, false).is_err());
    }
}
