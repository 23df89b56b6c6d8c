//! Template helpers for safe output. `docs/templates.md` documents each with an example; the
//! tests below check those examples.
//!
//! Every helper returns a value (not just text), so helpers compose as subexpressions:
//! `{{shell_quote (default values.proxy "")}}`. In strict mode a helper parameter that names a
//! missing variable is an error naming it; only `default` accepts a missing first parameter,
//! since supplying a fallback for it is its purpose.
//!
//! Handlebars already provides `eq`, `ne`, `gt`, `gte`, `lt`, `lte`, `and`, `or`, `not`, `len`,
//! `if`, `unless`, `each`, `with` and `lookup`; they are not redefined here.

use std::borrow::Cow;
use std::cell::Cell;
use std::io::Write;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use handlebars::{
    Context, Handlebars, Helper, HelperDef, PathAndJson, RenderContext, RenderError,
    RenderErrorReason, ScopedJson,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::limit::DoesNotFit;

type HelperFn = fn(&[&Value]) -> Result<Value, HelperError>;

/// Why a helper gave no result.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HelperError {
    /// Its parameters are not what it takes.
    #[error("{0}")]
    Invalid(String),
    /// Its result would not fit in the output left: the render fails with its size error.
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    /// The value cannot be written where the helper writes it (the config's doing, so the
    /// engine reports it on the config's variables).
    #[error("{0}")]
    Value(String),
    /// The template refused the config's variables with `fail`.
    #[error("{0}")]
    Refused(String),
    /// The render's work budget is spent.
    #[error(
        "loops, partials and helper results together exceed the work limit of one render ({MAX_WORK} units: one per template element rendered in a loop or partial, one per {WORK_BYTES} bytes a helper builds)"
    )]
    TooMuchWork,
}

/// Bytes a helper may build per unit of work: a helper called in a loop over a large value
/// spends the work budget, so one render cannot copy more than `MAX_WORK × WORK_BYTES` bytes
/// (200 MiB, a fraction of a second) however small each result is next to the output left.
pub const WORK_BYTES: u64 = 4096;

/// Checks a helper's result of `size` bytes before the helper builds it: it must fit in the
/// output left (else the render fails with its size error), and it costs work.
fn fits(size: u64) -> Result<(), HelperError> {
    crate::limit::reserve(size)?;
    let cost = size / WORK_BYTES;
    let left = WORK_LEFT.get();
    if left < cost {
        return Err(HelperError::TooMuchWork);
    }
    WORK_LEFT.set(left - cost);
    Ok(())
}

/// A helper taking positional parameters.
struct Simple {
    name: &'static str,
    usage: &'static str,
    arity: usize,
    /// Whether the first parameter may name a missing variable (only `default`).
    first_may_be_missing: bool,
    f: HelperFn,
}

impl HelperDef for Simple {
    fn call_inner<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        _: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
    ) -> Result<ScopedJson<'rc>, RenderError> {
        let params: &Vec<PathAndJson<'rc>> = h.params();
        if params.len() != self.arity || !h.hash().is_empty() {
            return Err(RenderErrorReason::Other(format!(
                "helper `{}` takes {} parameter{}: {}",
                self.name,
                self.arity,
                if self.arity == 1 { "" } else { "s" },
                self.usage
            ))
            .into());
        }
        let mut values = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            if p.is_value_missing() && !(i == 0 && self.first_may_be_missing) {
                return Err(RenderErrorReason::MissingVariable(p.relative_path().cloned()).into());
            }
            values.push(p.value());
        }
        (self.f)(&values).map(ScopedJson::Derived).map_err(|e| {
            // Name the variable the value came from: the message never shows the value.
            let on = match params.first().and_then(|p| p.relative_path()) {
                Some(path) => format!(" on `{}`", crate::error::truncate(path, 100)),
                None => String::new(),
            };
            let message = format!("helper `{}`{on}: {e}", self.name);
            if let HelperError::Value(_) = e {
                REFUSAL.set(Some(message.clone()));
            }
            RenderErrorReason::Other(message).into()
        })
    }
}

/// `yaml_quote_jinja`: as a subexpression its result is a value like any other (escaped where
/// another helper writes it); written by itself with AS_JINJA true, it is the one value of a
/// Jinja output the escape function lets through.
struct QuoteJinja(Simple);

impl HelperDef for QuoteJinja {
    fn call_inner<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        r: &'reg Handlebars<'reg>,
        ctx: &'rc Context,
        rc: &mut RenderContext<'reg, 'rc>,
    ) -> Result<ScopedJson<'rc>, RenderError> {
        self.0.call_inner(h, r, ctx, rc)
    }

    fn call<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        r: &'reg Handlebars<'reg>,
        ctx: &'rc Context,
        rc: &mut RenderContext<'reg, 'rc>,
        out: &mut dyn handlebars::Output,
    ) -> handlebars::HelperResult {
        let as_jinja = h.param(1).map(PathAndJson::value) == Some(&Value::Bool(true));
        // Simple's call: its value (an error when the output is not Jinja), then escaped.
        crate::jinja::arm(as_jinja);
        let written = self.0.call(h, r, ctx, rc, out);
        crate::jinja::arm(false);
        written
    }
}

/// How much work (template elements rendered inside loops and partials, see
/// `engine::charge_steps`) one render may do: enough for loops over thousands of items, small
/// enough that a render finishes in well under a second.
pub const MAX_WORK: u64 = 50_000;

/// The helper the engine puts at the start of every loop body and partial.
pub(crate) const STEP_HELPER: &str = "__bootplate_step";

thread_local! {
    /// Work left in the render running on this thread. A render never yields the thread, so a
    /// thread-local is exactly one render's budget.
    static WORK_LEFT: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// Gives the render on this thread a fresh work budget until dropped.
pub(crate) struct WorkBudget(u64);

impl WorkBudget {
    pub(crate) fn start() -> Self {
        WorkBudget(WORK_LEFT.replace(MAX_WORK))
    }
}

/// The work left in the render on this thread, to put back with [`set_work_left`] before
/// rendering a text again.
pub(crate) fn work_left() -> u64 {
    WORK_LEFT.get()
}

pub(crate) fn set_work_left(left: u64) {
    WORK_LEFT.set(left);
}

impl Drop for WorkBudget {
    fn drop(&mut self) {
        WORK_LEFT.set(self.0);
    }
}

/// `{{__bootplate_step N}}`: charges N units of work, fails once the budget is spent.
struct Step;

impl HelperDef for Step {
    fn call_inner<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        _: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
    ) -> Result<ScopedJson<'rc>, RenderError> {
        let cost = h.param(0).and_then(|p| p.value().as_u64()).unwrap_or(1);
        let left = WORK_LEFT.get();
        if left < cost {
            return Err(RenderErrorReason::Other(format!(
                "loops and partials render more than {MAX_WORK} template elements in one render, the limit (loop over shorter lists, or nest fewer loops)"
            ))
            .into());
        }
        WORK_LEFT.set(left - cost);
        Ok(ScopedJson::Derived(Value::String(String::new())))
    }
}

/// bootplate's helpers: name, usage, number of parameters, function.
pub(crate) const HELPERS: [(&str, &str, usize, HelperFn); 28] = [
    ("shell_quote", "shell_quote VALUE", 1, shell_quote),
    ("ps_quote", "ps_quote VALUE", 1, ps_quote),
    ("ps_here", "ps_here TEXT", 1, ps_here),
    ("systemd_quote", "systemd_quote VALUE", 1, systemd_quote),
    (
        "systemd_env_quote",
        "systemd_env_quote VALUE",
        1,
        systemd_env_quote,
    ),
    ("yaml_quote", "yaml_quote VALUE", 1, yaml_quote),
    (
        "yaml_quote_jinja",
        "yaml_quote_jinja VALUE AS_JINJA",
        2,
        yaml_quote_jinja,
    ),
    ("cloud_init_jinja", "cloud_init_jinja", 0, cloud_init_jinja),
    ("json", "json VALUE", 1, json),
    ("base64", "base64 TEXT", 1, base64),
    ("gzip_base64", "gzip_base64 TEXT", 1, gzip_base64),
    ("indent", "indent N TEXT", 2, indent),
    ("nindent", "nindent N TEXT", 2, nindent),
    ("default", "default VALUE FALLBACK", 2, default),
    ("join", "join LIST SEPARATOR", 2, join),
    ("sha256", "sha256 TEXT", 1, sha256),
    ("upper", "upper TEXT", 1, upper),
    ("lower", "lower TEXT", 1, lower),
    ("trim", "trim TEXT", 1, trim),
    (
        "version_at_least",
        "version_at_least VERSION MINIMUM",
        2,
        version_at_least,
    ),
    (
        "kubernetes_minor",
        "kubernetes_minor VERSION",
        1,
        kubernetes_minor,
    ),
    ("starts_with", "starts_with TEXT PREFIX", 2, starts_with),
    ("split", "split TEXT SEPARATOR", 2, split),
    ("url_encode", "url_encode TEXT", 1, url_encode),
    ("octal", "octal TEXT", 1, octal),
    ("concat", "concat TEXT TEXT", 2, concat),
    ("contains", "contains LIST ITEM", 2, contains),
    ("fail", "fail MESSAGE", 1, fail),
];

/// Registers bootplate's helpers and removes `log` (it writes template data to the
/// controller's log, where a token or key must never go).
pub(crate) fn register(registry: &mut Handlebars<'static>) {
    registry.unregister_helper("log");
    registry.register_helper(STEP_HELPER, Box::new(Step));
    for (name, usage, arity, f) in HELPERS {
        let simple = Simple {
            name,
            usage,
            arity,
            first_may_be_missing: name == "default",
            f,
        };
        if name == "yaml_quote_jinja" {
            registry.register_helper(name, Box::new(QuoteJinja(simple)));
        } else {
            registry.register_helper(name, Box::new(simple));
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

/// A scalar as text: strings as they are (borrowed, not copied: a helper's argument may be
/// megabytes), numbers and booleans as written, null as empty.
fn text(v: &Value) -> Result<Cow<'_, str>, HelperError> {
    match v {
        Value::String(s) => Ok(Cow::Borrowed(s)),
        Value::Number(n) => Ok(Cow::Owned(n.to_string())),
        Value::Bool(b) => Ok(Cow::Borrowed(if *b { "true" } else { "false" })),
        Value::Null => Ok(Cow::Borrowed("")),
        other => Err(HelperError::Invalid(format!(
            "expects text, got {} (use `json` or `join`)",
            type_name(other)
        ))),
    }
}

/// The items of a list as text, each checked, without copying them.
fn texts(items: &[Value]) -> Result<Vec<Cow<'_, str>>, HelperError> {
    items.iter().map(text).collect()
}

/// The length of `words` joined by `separator`.
fn joined_len<S: AsRef<str>>(words: &[S], separator: usize) -> u64 {
    let words_len = words.iter().map(|w| w.as_ref().len() as u64).sum::<u64>();
    let separators = (words.len() as u64).saturating_sub(1);
    words_len.saturating_add(separators.saturating_mul(separator as u64))
}

/// POSIX shell single quoting: `it's` → `'it'\''s'`. Inside single quotes the shell interprets
/// nothing, so the only character to handle is the quote itself. A list becomes its items,
/// each quoted, separated by spaces (one shell word per item).
fn shell_quote(args: &[&Value]) -> Result<Value, HelperError> {
    let words = match args[0] {
        Value::Array(items) => texts(items)?,
        v => vec![text(v)?],
    };
    let quoted = words.iter().map(|w| quoted_len(w)).sum::<u64>();
    let size = quoted.saturating_add((words.len() as u64).saturating_sub(1));
    fits(size)?;
    let mut out = String::with_capacity(size as usize);
    for (i, word) in words.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        push_quoted(&mut out, word);
    }
    Ok(Value::String(out))
}

/// PowerShell single quoting: `it's` → `'it''s'` (the typographic single quotes, which
/// PowerShell reads as quotes too, are doubled the same way). Inside single quotes PowerShell
/// expands nothing. A list becomes its items, each quoted, separated by commas (one array).
fn ps_quote(args: &[&Value]) -> Result<Value, HelperError> {
    let words = match args[0] {
        Value::Array(items) => texts(items)?,
        v => vec![text(v)?],
    };
    let quoted = words
        .iter()
        .map(|w| crate::powershell::quoted_len(w) as u64)
        .sum::<u64>();
    fits(quoted.saturating_add((words.len() as u64).saturating_mul(2)))?;
    let quoted: Vec<String> = words.iter().map(|w| crate::powershell::quote(w)).collect();
    Ok(Value::String(quoted.join(", ")))
}

/// A PowerShell verbatim here-string of TEXT (`@'`, the text on the lines after it, `'@`):
/// multi-line text that reads back unchanged. A text that would end the here-string early (a
/// line starting with `'@`) or that holds a CR becomes an expression decoding it from base64.
fn ps_here(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    fits((t.len() as u64).saturating_mul(4) / 3 + 80)?;
    Ok(Value::String(crate::powershell::here_string(&t)))
}

/// POSIX single quoting of one word (also used by the format writers).
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(quoted_len(s) as usize);
    push_quoted(&mut out, s);
    out
}

/// The length of [`quote`]'s result: each `'` becomes four bytes, and two quotes surround it.
fn quoted_len(s: &str) -> u64 {
    let quotes = s.bytes().filter(|b| *b == b'\'').count() as u64;
    s.len() as u64 + 2 + 3 * quotes
}

fn push_quoted(out: &mut String, s: &str) {
    out.push('\'');
    for (i, piece) in s.split('\'').enumerate() {
        if i > 0 {
            out.push_str(r"'\''");
        }
        out.push_str(piece);
    }
    out.push('\'');
}

/// One double-quoted word of a systemd command line (`ExecStart=` and the other `Exec*=`
/// settings, systemd.service(5)): `\` and `"` are escaped C-style, `%` is written `%%` (no
/// specifier expands) and `$` is written `$$` (no environment variable expands). A unit file
/// is read line by line, so a line break would start a new setting: text with a line break or
/// any other control character is refused, not escaped.
fn systemd_quote(args: &[&Value]) -> Result<Value, HelperError> {
    systemd_quoted(args[0], Dollar::Doubled)
}

/// [`systemd_quote`] for settings where `$` is not special (`Environment=`, systemd.exec(5)):
/// `$` stays as it is.
fn systemd_env_quote(args: &[&Value]) -> Result<Value, HelperError> {
    systemd_quoted(args[0], Dollar::Kept)
}

/// Whether a systemd setting expands `$VAR` (then a literal `$` is written `$$`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dollar {
    Doubled,
    Kept,
}

fn systemd_quoted(value: &Value, dollar: Dollar) -> Result<Value, HelperError> {
    if let Value::Array(_) | Value::Object(_) = value {
        return Err(HelperError::Invalid(format!(
            "expects text, got {} (quote each item)",
            type_name(value)
        )));
    }
    let t = text(value)?;
    if let Some(c) = t.chars().find(|c| unit_breaking(*c)) {
        return Err(HelperError::Value(format!(
            "the value contains {} (U+{:04X}): a systemd unit file cannot hold it in a setting, and a line break would start a new one",
            if c == '\n' || c == '\r' {
                "a line break"
            } else {
                "a control character"
            },
            c as u32
        )));
    }
    let escaped =
        |c: char| matches!(c, '\\' | '"' | '%') || (c == '$' && dollar == Dollar::Doubled);
    let extra = t.chars().filter(|c| escaped(*c)).count() as u64;
    let size = (t.len() as u64 + 2).saturating_add(extra);
    fits(size)?;
    let mut out = String::with_capacity(size as usize);
    out.push('"');
    for c in t.chars() {
        match c {
            '\\' | '"' => out.push('\\'),
            '%' => out.push('%'),
            '$' if dollar == Dollar::Doubled => out.push('$'),
            _ => {}
        }
        out.push(c);
    }
    out.push('"');
    Ok(Value::String(out))
}

/// A character a systemd unit file cannot carry inside a setting's value: C0 and C1 controls
/// (line breaks among them) and DEL.
pub(crate) fn unit_breaking(c: char) -> bool {
    c.is_control()
}

/// A YAML double-quoted scalar that PyYAML (cloud-init) and YAML 1.2 parsers read back as the
/// same string: backslash, quote, and every character YAML treats as a line break or does not
/// allow raw (C0/C1 controls, DEL, U+2028/U+2029, BOM, U+FFFE/U+FFFF) are escaped.
fn yaml_quote(args: &[&Value]) -> Result<Value, HelperError> {
    if let Value::Array(_) | Value::Object(_) = args[0] {
        return Err(HelperError::Invalid(format!(
            "expects text, got {} (use `json` for lists and maps)",
            type_name(args[0])
        )));
    }
    let t = text(args[0])?;
    fits(yaml_double_quoted_len(&t))?;
    Ok(Value::String(yaml_double_quoted(&t)))
}

/// `yaml_quote`, and with AS_JINJA true the result is left for cloud-init's Jinja (the one value
/// a `{{cloud_init_jinja}}` output does not escape): the template decides where a value may be
/// Jinja, never the value.
fn yaml_quote_jinja(args: &[&Value]) -> Result<Value, HelperError> {
    let as_jinja = match args[1] {
        Value::Bool(b) => *b,
        other => {
            return Err(HelperError::Invalid(format!(
                "AS_JINJA is true or false, got {}",
                type_name(other)
            )));
        }
    };
    if as_jinja && !crate::jinja::is_on() {
        return Err(HelperError::Invalid(
            "writes a value for cloud-init's Jinja, but the output is not Jinja: write {{cloud_init_jinja}} first"
                .to_owned(),
        ));
    }
    if !as_jinja {
        return yaml_quote(&args[..1]);
    }
    match args[0] {
        Value::String(text) => jinja_yaml_quoted(text).map(Value::String),
        _ => yaml_quote(&args[..1]),
    }
}

/// A YAML scalar holding `text` as cloud-init's Jinja must read it: Jinja runs on the raw text
/// before YAML is parsed, so the expression must stand in the output byte for byte, with no
/// escape that YAML would undo afterwards (a double-quoted `\"` breaks the expression). Single
/// quotes when the text has none, else double quotes when it has neither `"` nor `\`.
fn jinja_yaml_quoted(text: &str) -> Result<String, HelperError> {
    if text.chars().any(char::is_control) {
        return Err(HelperError::Invalid(
            "a value for cloud-init's Jinja holds a control character (a line break or a tab)"
                .to_owned(),
        ));
    }
    if !text.contains('\'') {
        return Ok(format!("'{text}'"));
    }
    if !text.contains('"') && !text.contains('\\') {
        return Ok(format!("\"{text}\""));
    }
    Err(HelperError::Invalid(
        "a value for cloud-init's Jinja holds both quote characters (or ' and a backslash): YAML cannot quote it without escapes that would reach Jinja"
            .to_owned(),
    ))
}

/// The line `## template: jinja`: cloud-init renders the rest of the output as Jinja, and every
/// value written after it is escaped (see `jinja.rs`).
fn cloud_init_jinja(_: &[&Value]) -> Result<Value, HelperError> {
    Ok(Value::String(crate::jinja::turn_on()))
}

/// Whether LIST has an item equal to ITEM.
fn contains(args: &[&Value]) -> Result<Value, HelperError> {
    match args[0] {
        Value::Array(items) => Ok(Value::Bool(items.contains(args[1]))),
        other => Err(HelperError::Invalid(format!(
            "expects a list, got {}",
            type_name(other)
        ))),
    }
}

/// The double-quoted YAML scalar of `s`.
pub(crate) fn yaml_double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_yaml_double_quoted(&mut out, s);
    out
}

/// The length of [`yaml_double_quoted`]'s result.
fn yaml_double_quoted_len(s: &str) -> u64 {
    let escaped = s
        .chars()
        .map(|c| yaml_escape(c).map_or(c.len_utf8(), |e| e.len()) as u64)
        .sum::<u64>();
    escaped + 2
}

/// Appends the double-quoted YAML scalar of `s` to `out` (the cloud-config writer quotes
/// straight into its output). Runs of characters that need no escape are copied whole: most
/// values are plain ASCII, and copying them byte by byte was a tenth of a render.
pub(crate) fn push_yaml_double_quoted(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let (mut at, mut copied) = (0, 0);
    while at < bytes.len() {
        let b = bytes[at];
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            at += 1;
            continue;
        }
        let c = s[at..].chars().next().expect("at a character boundary");
        out.push_str(&s[copied..at]);
        copied = match yaml_escape(c) {
            Some(escape) => {
                escape.push(out);
                at + c.len_utf8()
            }
            None => at,
        };
        at += c.len_utf8();
    }
    out.push_str(&s[copied..]);
    out.push('"');
}

/// How one character is written inside a YAML double-quoted scalar when it cannot be written
/// as it is.
enum YamlEscape {
    /// A fixed escape (`\n`, `\"`, ...).
    Named(&'static str),
    /// `\xNN`.
    Byte(u32),
    /// `\uNNNN`.
    Unit(u32),
}

impl YamlEscape {
    fn len(&self) -> usize {
        match self {
            YamlEscape::Named(text) => text.len(),
            YamlEscape::Byte(_) => 4,
            YamlEscape::Unit(_) => 6,
        }
    }

    fn push(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            YamlEscape::Named(text) => out.write_str(text),
            YamlEscape::Byte(n) => write!(out, "\\x{n:02x}"),
            YamlEscape::Unit(n) => write!(out, "\\u{n:04x}"),
        };
    }
}

/// The escape of `c` inside a YAML double-quoted scalar: backslash, quote, and every character
/// YAML treats as a line break or does not allow raw (C0/C1 controls, DEL, U+2028/U+2029, BOM,
/// U+FFFE/U+FFFF). None for any other character.
fn yaml_escape(c: char) -> Option<YamlEscape> {
    let n = c as u32;
    Some(match c {
        '"' => YamlEscape::Named("\\\""),
        '\\' => YamlEscape::Named("\\\\"),
        '\n' => YamlEscape::Named("\\n"),
        '\t' => YamlEscape::Named("\\t"),
        '\r' => YamlEscape::Named("\\r"),
        '\u{2028}' => YamlEscape::Named("\\L"),
        '\u{2029}' => YamlEscape::Named("\\P"),
        '\u{85}' => YamlEscape::Named("\\N"),
        _ if n < 0x20 || (0x7f..=0x9f).contains(&n) => YamlEscape::Byte(n),
        '\u{feff}' | '\u{fffe}' | '\u{ffff}' => YamlEscape::Unit(n),
        _ => return None,
    })
}

/// Compact JSON of any value. Characters that are valid in JSON strings but break YAML readers
/// (DEL, C1 controls, U+2028/U+2029, BOM) are escaped too, so `json` output can be embedded in
/// cloud-config as a flow value. Serialized twice: once to count the bytes, once to write
/// them, so a value too large for the output is refused before it is built.
fn json(args: &[&Value]) -> Result<Value, HelperError> {
    let mut count = ByteCount(0);
    write_json(&mut count, args[0])?;
    fits(count.0)?;
    let mut out = Vec::with_capacity(count.0 as usize);
    write_json(&mut out, args[0])?;
    String::from_utf8(out)
        .map(Value::String)
        .map_err(|e| HelperError::Invalid(e.to_string()))
}

fn write_json<W: Write>(writer: W, value: &Value) -> Result<(), HelperError> {
    use serde::Serialize as _;
    let mut serializer = serde_json::Serializer::with_formatter(writer, YamlSafeJson);
    value
        .serialize(&mut serializer)
        .map_err(|e| HelperError::Invalid(e.to_string()))
}

/// serde_json's compact output, with the characters YAML readers would change inside a string
/// written as `\uNNNN`.
struct YamlSafeJson;

impl serde_json::ser::Formatter for YamlSafeJson {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let yaml_hostile = |c: char| {
            let n = c as u32;
            (0x7f..=0x9f).contains(&n) || n == 0x2028 || n == 0x2029 || n == 0xfeff
        };
        let mut rest = fragment;
        while let Some(at) = rest.find(yaml_hostile) {
            let c = rest[at..]
                .chars()
                .next()
                .expect("found at a character boundary");
            writer.write_all(&rest.as_bytes()[..at])?;
            write!(writer, "\\u{:04x}", c as u32)?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }
}

/// A writer that only counts what is written to it.
struct ByteCount(u64);

impl Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn base64_len(bytes: u64) -> u64 {
    bytes.div_ceil(3).saturating_mul(4)
}

fn base64(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    fits(base64_len(t.len() as u64))?;
    Ok(Value::String(BASE64.encode(t.as_bytes())))
}

/// gzip (no file name, time 0: the same input always gives the same output) then base64. The
/// compressed size is known only once compressed, so compression stops as soon as its base64
/// would no longer fit in the output left.
fn gzip_base64(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    // base64 turns each 3 bytes into 4: this many compressed bytes still fit.
    let room = crate::limit::output_left() / 4 * 3;
    let capped = CappedVec {
        bytes: Vec::new(),
        cap: usize::try_from(room).unwrap_or(usize::MAX),
    };
    let data = match gzip_into(t.as_bytes(), capped) {
        Ok(capped) => capped.bytes,
        // One byte more than fits: `fits` refuses it as the output's size error.
        Err(e) => {
            fits(base64_len(room + 1))?;
            return Err(HelperError::Invalid(format!("gzip: {e}")));
        }
    };
    fits(base64_len(data.len() as u64))?;
    Ok(Value::String(BASE64.encode(data)))
}

/// A `Vec` that refuses to grow past `cap` bytes.
struct CappedVec {
    bytes: Vec<u8>,
    cap: usize,
}

impl Write for CappedVec {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.cap {
            return Err(std::io::Error::other("over the size limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Deterministic gzip, shared with output compression.
pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    // Writing to a Vec cannot fail.
    gzip_into(data, Vec::new()).expect("gzip into memory")
}

fn gzip_into<W: Write>(data: &[u8], writer: W) -> std::io::Result<W> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(writer, flate2::Compression::default());
    encoder.write_all(data)?;
    encoder.finish()
}

fn width(v: &Value) -> Result<usize, HelperError> {
    match v.as_u64() {
        Some(n) if n <= 256 => Ok(n as usize),
        _ => Err(HelperError::Invalid(format!(
            "the width must be a whole number from 0 to 256, got {}",
            type_name(v)
        ))),
    }
}

/// Prefixes every non-empty line with N spaces (empty lines stay empty, so no trailing
/// whitespace appears).
fn indent(args: &[&Value]) -> Result<Value, HelperError> {
    indented(args, "")
}

/// A newline, then `indent`: for `key:{{nindent 4 values.block}}`.
fn nindent(args: &[&Value]) -> Result<Value, HelperError> {
    indented(args, "\n")
}

/// `prefix`, then the text of `args[1]` indented by `args[0]` spaces.
fn indented(args: &[&Value], prefix: &str) -> Result<Value, HelperError> {
    let width = width(args[0])?;
    let s = text(args[1])?;
    let padded = |line: &str| line != "\n" && line != "\r\n";
    let lines = s.split_inclusive('\n').filter(|l| padded(l)).count() as u64;
    let size = (prefix.len() as u64 + s.len() as u64).saturating_add(lines * width as u64);
    fits(size)?;
    let mut out = String::with_capacity(size as usize);
    out.push_str(prefix);
    for line in s.split_inclusive('\n') {
        if padded(line) {
            out.extend(std::iter::repeat_n(' ', width));
        }
        out.push_str(line);
    }
    Ok(Value::String(out))
}

/// The value, or the fallback when the value is missing, null or empty text.
fn default(args: &[&Value]) -> Result<Value, HelperError> {
    let unset = matches!(args[0], Value::Null) || args[0].as_str() == Some("");
    let chosen = if unset { args[1] } else { args[0] };
    // The copy costs about the value's size: a text's length, a list's or map's JSON.
    let size = match chosen {
        Value::String(s) => s.len() as u64,
        other => {
            let mut count = ByteCount(0);
            write_json(&mut count, other)?;
            count.0
        }
    };
    fits(size)?;
    Ok(chosen.clone())
}

fn join(args: &[&Value]) -> Result<Value, HelperError> {
    let separator = match args[1] {
        Value::String(s) => s.as_str(),
        other => {
            return Err(HelperError::Invalid(format!(
                "the separator must be text, got {}",
                type_name(other)
            )));
        }
    };
    let items = match args[0] {
        Value::Array(items) => texts(items)?,
        Value::Null => Vec::new(),
        other => {
            return Err(HelperError::Invalid(format!(
                "expects a list, got {}",
                type_name(other)
            )));
        }
    };
    let size = joined_len(&items, separator.len());
    fits(size)?;
    let mut out = String::with_capacity(size as usize);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        out.push_str(item);
    }
    Ok(Value::String(out))
}

fn sha256(args: &[&Value]) -> Result<Value, HelperError> {
    let digest = Sha256::digest(text(args[0])?.as_bytes());
    fits(2 * digest.len() as u64)?;
    Ok(Value::String(hex::encode(digest)))
}

fn upper(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    // Upper case may be longer than the text (`ß` → `SS`).
    fits(
        t.chars()
            .flat_map(char::to_uppercase)
            .map(|c| c.len_utf8() as u64)
            .sum(),
    )?;
    Ok(Value::String(t.to_uppercase()))
}

fn lower(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    fits(
        t.chars()
            .flat_map(char::to_lowercase)
            .map(|c| c.len_utf8() as u64)
            .sum(),
    )?;
    Ok(Value::String(t.to_lowercase()))
}

fn trim(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    let trimmed = t.trim();
    fits(trimmed.len() as u64)?;
    Ok(Value::String(trimmed.to_owned()))
}

fn starts_with(args: &[&Value]) -> Result<Value, HelperError> {
    Ok(Value::Bool(text(args[0])?.starts_with(&*text(args[1])?)))
}

/// The pieces of a text between its separators (`root:wheel` → `[root, wheel]`).
fn split(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    let separator = text(args[1])?;
    if separator.is_empty() {
        return Err(HelperError::Invalid("the separator is empty".to_owned()));
    }
    fits(t.len() as u64)?;
    Ok(Value::Array(
        t.split(&*separator)
            .map(|p| Value::String(p.to_owned()))
            .collect(),
    ))
}

/// Percent-encoding of every byte but `A-Z a-z 0-9 - . _ ~ /`: the data of a `data:,` URL
/// (Ignition's file contents). Unlike base64, encoded pieces concatenate to the encoding of
/// the whole, so a template can build one file from literal text and values.
fn url_encode(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    let keep = |b: u8| b.is_ascii_alphanumeric() || b"-._~/".contains(&b);
    fits(t.bytes().map(|b| if keep(b) { 1 } else { 3 }).sum())?;
    let mut out = String::with_capacity(t.len());
    for b in t.bytes() {
        if keep(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(Value::String(out))
}

/// Two texts as one (`{{json (concat "data:;base64," content)}}`).
fn concat(args: &[&Value]) -> Result<Value, HelperError> {
    let (a, b) = (text(args[0])?, text(args[1])?);
    fits(a.len() as u64 + b.len() as u64)?;
    Ok(Value::String(format!("{a}{b}")))
}

/// The number octal digits stand for: a file mode as Ignition's JSON takes it (`0644` → 420).
fn octal(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    match u32::from_str_radix(&t, 8) {
        Ok(n) if !t.is_empty() && t.len() <= 8 && t.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(Value::from(n))
        }
        _ => Err(HelperError::Invalid(
            "expects one to eight octal digits, for example 0644".to_owned(),
        )),
    }
}

/// Refuses the render: the template found the config's variables unusable together (a check
/// a variable's own schema cannot express, such as "an http:// URL needs a digest"). The
/// message is the template's own words; the engine reports it as the config's problem.
fn fail(args: &[&Value]) -> Result<Value, HelperError> {
    let message = text(args[0])?;
    let message = crate::error::truncate(message.trim(), 300);
    REFUSAL.set(Some(message.clone()));
    Err(HelperError::Refused(message))
}

thread_local! {
    /// Why the render on this thread stopped on the config's values: the message of a `fail`,
    /// or of a helper that cannot write a value.
    static REFUSAL: Cell<Option<String>> = const { Cell::new(None) };
}

/// Takes the message of a `fail` (or of a helper refusing a value) that stopped the render on
/// this thread, if one did.
pub(crate) fn take_refusal() -> Option<String> {
    REFUSAL.take()
}

/// Whether VERSION is MINIMUM or later, comparing MAJOR.MINOR.PATCH as numbers (text
/// comparison puts v1.100 before v1.31 and v1.9 after it).
fn version_at_least(args: &[&Value]) -> Result<Value, HelperError> {
    let parse = |v: &Value| {
        let t = text(v)?;
        version_numbers(&t).ok_or_else(|| {
            HelperError::Invalid(format!(
                "{:?} is not a version like v1.31.2 (or 1.31, v1.31.0-rc.1)",
                crate::error::truncate(&t, 64)
            ))
        })
    };
    Ok(Value::Bool(parse(args[0])? >= parse(args[1])?))
}

/// The `MAJOR.MINOR` of a Kubernetes version (`v1.31.2` → `1.31`), the series package
/// repositories are named by (`pkgs.k8s.io/core:/stable:/v1.31/deb/`), so templates need not
/// cut versions apart in shell. The same versions as `version_at_least` are accepted; anything
/// else, an empty version included (a Machine without `spec.version`), is an error.
fn kubernetes_minor(args: &[&Value]) -> Result<Value, HelperError> {
    let t = text(args[0])?;
    let [major, minor, _] = version_numbers(&t).ok_or_else(|| {
        HelperError::Invalid(format!(
            "{:?} is not a version like v1.31.2 (guard a version that may be absent with {{{{#if machine.version}}}})",
            crate::error::truncate(&t, 64)
        ))
    })?;
    Ok(Value::String(format!("{major}.{minor}")))
}

/// `v1.31.2` → `[1, 31, 2]`. The `v` is optional, a missing minor or patch is 0, and a
/// pre-release or build suffix (`-rc.1`, `+build.5`) is ignored: a release candidate counts as
/// the release it leads to, which is what choosing a configuration format by version needs.
fn version_numbers(version: &str) -> Option<[u64; 3]> {
    let version = version.strip_prefix(['v', 'V']).unwrap_or(version);
    let core = version.split(['-', '+']).next()?;
    let mut numbers = [0; 3];
    for (index, part) in core.split('.').enumerate() {
        if index == numbers.len() || part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        numbers[index] = part.parse().ok()?;
    }
    Some(numbers)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn render(template: &str, data: Value) -> Result<String, String> {
        let mut r = Handlebars::new();
        r.set_strict_mode(true);
        r.register_escape_fn(handlebars::no_escape);
        register(&mut r);
        r.render_template(template, &data)
            .map_err(|e| e.to_string())
    }

    fn ok(template: &str, data: Value) -> String {
        render(template, data).unwrap()
    }

    // Each example below is the one in docs/templates.md.
    #[test]
    fn documented_examples() {
        let v = json!({
            "s": "it's",
            "args": ["a b", "c"],
            "list": ["a", "b"],
            "text": "line1\nline2",
            "obj": {"a": [1, true]},
            "empty": "",
            "name": "  Node-1 ",
        });
        assert_eq!(ok("{{shell_quote s}}", v.clone()), r"'it'\''s'");
        assert_eq!(ok("{{shell_quote args}}", v.clone()), "'a b' 'c'");
        assert_eq!(ok("{{ps_quote s}}", v.clone()), "'it''s'");
        assert_eq!(ok("{{ps_quote args}}", v.clone()), "'a b', 'c'");
        assert_eq!(ok("{{ps_here text}}", v.clone()), "@'\nline1\nline2\n'@");
        assert_eq!(ok("{{yaml_quote s}}", v.clone()), r#""it's""#);
        assert_eq!(
            ok("--name {{systemd_quote s}}", json!({"s": "50% \"a\""})),
            r#"--name "50%% \"a\"""#
        );
        assert_eq!(
            ok(
                "Environment={{systemd_env_quote s}}",
                json!({"s": "PASS=a$b"})
            ),
            r#"Environment="PASS=a$b""#
        );
        assert_eq!(ok("{{yaml_quote text}}", v.clone()), r#""line1\nline2""#);
        assert_eq!(ok("{{json obj}}", v.clone()), r#"{"a":[1,true]}"#);
        assert_eq!(ok("{{base64 s}}", v.clone()), "aXQncw==");
        assert_eq!(ok("{{indent 2 text}}", v.clone()), "  line1\n  line2");
        assert_eq!(
            ok("k:{{nindent 2 text}}", v.clone()),
            "k:\n  line1\n  line2"
        );
        assert_eq!(ok("{{default empty \"x\"}}", v.clone()), "x");
        assert_eq!(ok("{{default nothing \"x\"}}", v.clone()), "x");
        assert_eq!(ok("{{default s \"x\"}}", v.clone()), "it's");
        assert_eq!(ok("{{join list \",\"}}", v.clone()), "a,b");
        assert_eq!(
            ok("{{sha256 s}}", v.clone()),
            hex::encode(Sha256::digest("it's"))
        );
        assert_eq!(ok("{{upper name}}", v.clone()), "  NODE-1 ");
        assert_eq!(ok("{{lower name}}", v.clone()), "  node-1 ");
        assert_eq!(ok("{{trim name}}", v.clone()), "Node-1");
        assert_eq!(
            ok("{{shell_quote (upper (trim name))}}", v.clone()),
            "'NODE-1'"
        );
        assert_eq!(
            ok("{{#if (and (eq s \"it's\") (not empty))}}yes{{/if}}", v),
            "yes"
        );
        assert_eq!(
            ok(
                "{{#if (version_at_least v \"v1.31\")}}v1beta4{{else}}v1beta3{{/if}}",
                json!({"v": "v1.30.4"})
            ),
            "v1beta3"
        );
        assert_eq!(
            ok("{{lookup (split \"core:wheel\" \":\") 1}}", json!({})),
            "wheel"
        );
        assert_eq!(
            ok("{{json (split \"root\" \":\")}}", json!({})),
            r#"["root"]"#
        );
        assert_eq!(
            ok("\"source\": \"data:,{{url_encode \"a b\"}}%0A\"", json!({})),
            r#""source": "data:,a%20b%0A""#
        );
        assert_eq!(
            ok("{{url_encode s}}", json!({"s": "é\"%/x"})),
            "%C3%A9%22%25/x"
        );
        assert_eq!(
            ok(
                "{{json (concat \"data:;base64,\" s)}}",
                json!({"s": "YQ=="})
            ),
            r#""data:;base64,YQ==""#
        );
        assert_eq!(
            ok("\"mode\": {{octal \"0644\"}}", json!({})),
            r#""mode": 420"#
        );
        assert_eq!(ok("{{octal \"4755\"}}", json!({})), "2541");
        for bad in ["\"0648\"", "\"\"", "\"-1\"", "\"+7\""] {
            assert!(
                render(&format!("{{{{octal {bad}}}}}"), json!({})).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn versions_compare_as_numbers() {
        let at_least = |version: &str, minimum: &str| {
            ok(
                "{{version_at_least v m}}",
                json!({"v": version, "m": minimum}),
            )
        };
        for (version, minimum, expected) in [
            ("v1.31.2", "v1.31", "true"),
            ("v1.31.0", "v1.31.0", "true"),
            ("v1.30.14", "v1.31", "false"),
            ("v1.100.0", "v1.31", "true"),
            ("v1.9.11", "v1.31", "false"),
            ("1.31.2", "v1.31", "true"),
            ("v1.31.0-rc.1", "v1.31", "true"),
            ("v1.31.0+k3s1", "v1.31.1", "false"),
            ("v2", "v1.99.99", "true"),
        ] {
            assert_eq!(
                at_least(version, minimum),
                expected,
                "{version} >= {minimum}"
            );
        }
        for bad in ["", "latest", "v1..2", "v1.31.2.4", "v1.31.x", "vv1.31"] {
            let err = render("{{version_at_least v \"v1.31\"}}", json!({"v": bad})).unwrap_err();
            assert!(
                err.contains("helper `version_at_least`") && err.contains("is not a version"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn kubernetes_minor_is_the_release_series() {
        let minor = |v: &str| render("{{kubernetes_minor v}}", json!({"v": v}));
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("v1.31.2", Ok("1.31")),
            ("1.30.0", Ok("1.30")),
            ("v1.32.0-rc.1", Ok("1.32")),
            ("v1.100.3+build.5", Ok("1.100")),
            ("v2", Ok("2.0")),
            ("", Err("guard a version that may be absent")),
            ("latest", Err("is not a version")),
        ];
        for (version, expected) in cases {
            match (minor(version), expected) {
                (Ok(got), Ok(want)) => assert_eq!(&got, want, "{version}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{version}: {got}"),
                (got, want) => panic!("{version}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn gzip_base64_round_trips_and_is_deterministic() {
        let out = ok("{{gzip_base64 s}}", json!({"s": "hello hello hello"}));
        assert_eq!(
            out,
            ok("{{gzip_base64 s}}", json!({"s": "hello hello hello"}))
        );
        let bytes = BASE64.decode(out).unwrap();
        let mut plain = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut plain)
            .unwrap();
        assert_eq!(plain, "hello hello hello");
    }

    #[test]
    fn missing_parameter_names_the_variable() {
        let err = render("{{shell_quote values.nope}}", json!({"values": {}})).unwrap_err();
        assert!(err.contains("values.nope"), "{err}");
        let err = render("{{join values.nope \",\"}}", json!({"values": {}})).unwrap_err();
        assert!(err.contains("values.nope"), "{err}");
    }

    #[test]
    fn wrong_types_and_arity_are_errors_naming_the_helper() {
        let err = render("{{yaml_quote l}}", json!({"l": [1]})).unwrap_err();
        assert!(
            err.contains("helper `yaml_quote`") && err.contains("a list"),
            "{err}"
        );
        let err = render("{{indent \"x\" t}}", json!({"t": "a"})).unwrap_err();
        assert!(
            err.contains("helper `indent`") && err.contains("width"),
            "{err}"
        );
        let err = render("{{indent 2}}", json!({})).unwrap_err();
        assert!(err.contains("indent N TEXT"), "{err}");
        let err = render("{{join l 1}}", json!({"l": []})).unwrap_err();
        assert!(err.contains("separator"), "{err}");
    }

    #[test]
    fn yaml_quote_escapes_what_yaml_readers_would_change() {
        let out = ok(
            "{{yaml_quote s}}",
            json!({"s": "a\"b\\c\u{7f}\u{85}\u{2028}\u{feff}\u{1}é"}),
        );
        assert_eq!(out, r#""a\"b\\c\x7f\N\L\ufeff\x01é""#);
        let back: String = serde_yaml::from_str(&out).unwrap();
        assert_eq!(back, "a\"b\\c\u{7f}\u{85}\u{2028}\u{feff}\u{1}é");
    }

    #[test]
    fn quoting_appends_and_copies_plain_runs_whole() {
        let mut out = String::from("k: ");
        push_yaml_double_quoted(&mut out, "ünï \"q\" ok\u{2029}end");
        assert_eq!(out, r#"k: "ünï \"q\" ok\Pend""#);
        let back: std::collections::BTreeMap<String, String> = serde_yaml::from_str(&out).unwrap();
        assert_eq!(back["k"], "ünï \"q\" ok\u{2029}end");
        assert_eq!(yaml_double_quoted(""), r#""""#);
    }

    #[test]
    fn json_escapes_yaml_hostile_characters() {
        let out = ok("{{json s}}", json!({"s": "\u{2028}\u{80}"}));
        assert_eq!(out, r#""\u2028\u0080""#);
        let back: String = serde_json::from_str(&out).unwrap();
        assert_eq!(back, "\u{2028}\u{80}");
    }

    #[test]
    fn indent_leaves_empty_lines_empty() {
        assert_eq!(
            ok("{{indent 3 t}}", json!({"t": "a\n\nb\n"})),
            "   a\n\n   b\n"
        );
    }

    #[test]
    fn docs_templates_md_documents_every_helper() {
        let docs = include_str!("../../docs/templates.md");
        let table: Vec<&str> = docs.lines().filter(|l| l.starts_with("| `")).collect();
        for (name, usage, ..) in HELPERS {
            assert!(
                table.iter().any(|l| l.contains(&format!("`{usage}`"))),
                "docs/templates.md has no row for `{usage}` ({name})"
            );
        }
        for builtin in ["eq", "and", "not", "len", "lookup", "each", "with"] {
            assert!(
                table.iter().any(|l| l.contains(&format!("`{builtin}"))),
                "{builtin}"
            );
        }
        for topic in [
            "`--strict`",
            "`--format json`",
            "**Exit status.**",
            "`unknown-field`",
        ] {
            assert!(docs.contains(topic), "{topic}");
        }
    }

    /// Renders as the engine does: with `left` bytes of output left and a fresh work budget.
    /// Returns the output, or the error and the size a helper refused.
    fn render_with_left(
        template: &str,
        data: Value,
        left: u64,
    ) -> Result<String, (String, Option<u64>)> {
        let budget = crate::limit::Budget::new(left);
        let helpers = crate::limit::HelperOutput::start(&budget);
        let _work = WorkBudget::start();
        render(template, data).map_err(|e| (e, helpers.refused()))
    }

    /// Each helper that builds text, with an argument and the exact size of its result.
    fn sized_cases() -> Vec<(&'static str, Value, usize)> {
        let line = "ab'c\"%$\\ é\n".repeat(50);
        let words: Vec<String> = (0..40).map(|i| format!("w{i}'x")).collect();
        vec![
            ("{{shell_quote v}}", json!({"v": line}), 0),
            ("{{shell_quote v}}", json!({"v": words}), 0),
            (
                "{{yaml_quote v}}",
                json!({"v": format!("{line}\u{2028}\u{85}\u{1}\u{feff}")}),
                0,
            ),
            (
                "{{json v}}",
                json!({"v": {"k\u{2028}": [line.clone(), 1, null, "\u{7f}"]}}),
                0,
            ),
            ("{{base64 v}}", json!({"v": line}), 0),
            ("{{indent 7 v}}", json!({"v": line}), 0),
            ("{{nindent 3 v}}", json!({"v": format!("\n\n{line}")}), 0),
            ("{{default v \"x\"}}", json!({"v": line}), 0),
            ("{{join v \"--\"}}", json!({"v": words}), 0),
            ("{{join v \", \"}}", json!({"v": [1, true, null, "a"]}), 0),
            ("{{sha256 v}}", json!({"v": line}), 0),
            ("{{upper v}}", json!({"v": format!("{line}ßŉ")}), 0),
            ("{{lower v}}", json!({"v": format!("{line}Σİẞ")}), 0),
            ("{{trim v}}", json!({"v": format!("  {line}  ")}), 0),
            (
                "{{systemd_quote v}}",
                json!({"v": "50% \"a\" $HOME \\ é"}),
                0,
            ),
            (
                "{{systemd_env_quote v}}",
                json!({"v": "50% \"a\" $HOME \\ é"}),
                0,
            ),
        ]
        .into_iter()
        .map(|(template, data, _)| {
            let size = ok(template, data.clone()).len();
            (template, data, size)
        })
        .collect()
    }

    // The size each helper computes before building its result is exact: with exactly that
    // much output left it renders; with one byte less it is refused with that size, which
    // the engine reports as the render's size error.
    #[test]
    fn every_helper_charges_its_exact_size_before_building() {
        for (template, data, size) in sized_cases() {
            let out = render_with_left(template, data.clone(), size as u64);
            assert_eq!(
                out.map(|o| o.len()),
                Ok(size),
                "{template} with {size} left"
            );
            let (err, refused) = render_with_left(template, data, size as u64 - 1).unwrap_err();
            assert_eq!(refused, Some(size as u64), "{template}: {err}");
            assert!(err.contains("bytes of output left"), "{template}: {err}");
        }
    }

    #[test]
    fn gzip_stops_once_its_base64_cannot_fit() {
        let data = json!({"v": (0..5000).map(|i| i.to_string()).collect::<String>()});
        let size = ok("{{gzip_base64 v}}", data.clone()).len() as u64;
        assert!(render_with_left("{{gzip_base64 v}}", data.clone(), size).is_ok());
        let (err, refused) = render_with_left("{{gzip_base64 v}}", data, size - 4).unwrap_err();
        assert!(refused.is_some_and(|r| r > size - 4), "{err}");
    }

    // A helper result a thousand times its arguments' size is refused from its computed size,
    // before a byte of it is allocated (render/tests/helper_budget.rs measures the
    // allocations).
    #[test]
    fn huge_results_are_refused_not_built() {
        let list: Vec<&str> = vec!["a"; 100_000];
        let sep = "s".repeat(100_000);
        for (template, data) in [
            ("{{join l s}}", json!({"l": list, "s": sep})),
            ("{{indent 256 t}}", json!({"t": "\n.".repeat(100_000)})),
            ("{{nindent 256 t}}", json!({"t": "\n.".repeat(100_000)})),
            ("{{shell_quote t}}", json!({"t": "'".repeat(1_000_000)})),
            (
                "{{#if (join l s)}}hidden{{/if}}",
                json!({"l": list, "s": sep}),
            ),
        ] {
            let (err, refused) = render_with_left(template, data, 1 << 20).unwrap_err();
            assert!(refused.is_some_and(|r| r > 1 << 20), "{template}: {err}");
        }
    }

    // Helper results spend the work budget: a loop that copies a large value on every pass
    // ends with the work error long before it has copied gigabytes.
    #[test]
    fn helper_results_in_a_loop_spend_the_work_budget() {
        let data = json!({"l": vec![0; 5000], "t": "x".repeat(400_000)});
        let (err, refused) = render_with_left(
            "{{#each l}}{{#if (trim @root.t)}}{{/if}}{{/each}}",
            data,
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(refused, None, "{err}");
        assert!(err.contains("work limit"), "{err}");
    }

    #[test]
    fn systemd_quote_refuses_control_characters_naming_the_variable() {
        for value in [
            "a\nExecStartPre=/bin/touch /tmp/pwned",
            "a\rb",
            "tab\there",
            "\u{85}",
        ] {
            for helper in ["systemd_quote", "systemd_env_quote"] {
                let template = format!("{{{{{helper} values.proxy}}}}");
                let err = render(&template, json!({"values": {"proxy": value}})).unwrap_err();
                assert!(
                    err.contains(&format!("helper `{helper}` on `values.proxy`")),
                    "{err}"
                );
                assert!(
                    err.contains("control character") || err.contains("line break"),
                    "{err}"
                );
                assert!(!err.contains("pwned"), "the message shows no value: {err}");
            }
        }
    }

    #[test]
    fn systemd_quote_escapes_what_systemd_would_expand() {
        for (value, exec, env) in [
            ("plain", r#""plain""#, r#""plain""#),
            ("", r#""""#, r#""""#),
            ("50% %n", r#""50%% %%n""#, r#""50%% %%n""#),
            (
                r#"say "hi" \o/"#,
                r#""say \"hi\" \\o/""#,
                r#""say \"hi\" \\o/""#,
            ),
            ("$HOME ${X}", r#""$$HOME $${X}""#, r#""$HOME ${X}""#),
            (
                "it's; rm -rf /",
                r#""it's; rm -rf /""#,
                r#""it's; rm -rf /""#,
            ),
        ] {
            let data = json!({"v": value});
            assert_eq!(ok("{{systemd_quote v}}", data.clone()), exec, "{value}");
            assert_eq!(ok("{{systemd_env_quote v}}", data), env, "{value}");
        }
        let err = render("{{systemd_quote v}}", json!({"v": ["a"]})).unwrap_err();
        assert!(err.contains("a list"), "{err}");
    }

    #[test]
    fn log_is_not_available() {
        let err = render("{{log \"x\"}}", json!({})).unwrap_err();
        assert!(err.contains("log"), "{err}");
    }
}

#[cfg(test)]
mod jinja_quote_tests {
    use super::jinja_yaml_quoted;

    /// Each Jinja value stands in the output byte for byte, in the quotes YAML then reads it
    /// with; what no quoting can carry verbatim is refused.
    #[test]
    fn jinja_values_are_quoted_without_escapes() {
        let cases: [(&str, Option<&str>); 5] = [
            (
                "{{ ds.meta_data.local_hostname }}",
                Some("'{{ ds.meta_data.local_hostname }}'"),
            ),
            (
                r#"{{ ds.meta_data["local_hostname"] }}"#,
                Some(r#"'{{ ds.meta_data["local_hostname"] }}'"#),
            ),
            (
                "{{ ds.meta_data['local_hostname'] }}",
                Some(r#""{{ ds.meta_data['local_hostname'] }}""#),
            ),
            (r#"{{ v['a'] ~ "b" }}"#, None),
            ("{{ a }}\n{{ b }}", None),
        ];
        for (text, expected) in cases {
            assert_eq!(jinja_yaml_quoted(text).ok().as_deref(), expected, "{text}");
        }
    }
}
