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

type HelperFn = fn(&[&Value]) -> Result<Value, String>;

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
        (self.f)(&values)
            .map(ScopedJson::Derived)
            .map_err(|message| {
                RenderErrorReason::Other(format!("helper `{}`: {message}", self.name)).into()
            })
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
pub(crate) const HELPERS: [(&str, &str, usize, HelperFn); 14] = [
    ("shell_quote", "shell_quote VALUE", 1, shell_quote),
    ("yaml_quote", "yaml_quote VALUE", 1, yaml_quote),
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
];

/// Registers bootplate's helpers and removes `log` (it writes template data to the
/// controller's log, where a token or key must never go).
pub(crate) fn register(registry: &mut Handlebars<'static>) {
    registry.unregister_helper("log");
    registry.register_helper(STEP_HELPER, Box::new(Step));
    for (name, usage, arity, f) in HELPERS {
        registry.register_helper(
            name,
            Box::new(Simple {
                name,
                usage,
                arity,
                first_may_be_missing: name == "default",
                f,
            }),
        );
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

/// A scalar as text: strings as they are, numbers and booleans as written, null as empty.
fn text(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Ok(String::new()),
        other => Err(format!(
            "expects text, got {} (use `json` or `join`)",
            type_name(other)
        )),
    }
}

/// POSIX shell single quoting: `it's` → `'it'\''s'`. Inside single quotes the shell interprets
/// nothing, so the only character to handle is the quote itself. A list becomes its items,
/// each quoted, separated by spaces (one shell word per item).
fn shell_quote(args: &[&Value]) -> Result<Value, String> {
    let out = match args[0] {
        Value::Array(items) => items
            .iter()
            .map(|v| text(v).map(|s| quote(&s)))
            .collect::<Result<Vec<_>, _>>()?
            .join(" "),
        v => quote(&text(v)?),
    };
    Ok(Value::String(out))
}

/// POSIX single quoting of one word (also used by the format writers).
pub(crate) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A YAML double-quoted scalar that PyYAML (cloud-init) and YAML 1.2 parsers read back as the
/// same string: backslash, quote, and every character YAML treats as a line break or does not
/// allow raw (C0/C1 controls, DEL, U+2028/U+2029, BOM, U+FFFE/U+FFFF) are escaped.
fn yaml_quote(args: &[&Value]) -> Result<Value, String> {
    let quoted = match args[0] {
        Value::Array(_) | Value::Object(_) => {
            return Err(format!(
                "expects text, got {} (use `json` for lists and maps)",
                type_name(args[0])
            ));
        }
        Value::String(s) => yaml_double_quoted(s),
        v => yaml_double_quoted(&text(v)?),
    };
    Ok(Value::String(quoted))
}

/// The double-quoted YAML scalar of `s`.
pub(crate) fn yaml_double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_yaml_double_quoted(&mut out, s);
    out
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
        copied = if push_yaml_escape(out, c) {
            at + c.len_utf8()
        } else {
            at
        };
        at += c.len_utf8();
    }
    out.push_str(&s[copied..]);
    out.push('"');
}

/// Appends the escape of `c` inside a YAML double-quoted scalar: backslash, quote, and every
/// character YAML treats as a line break or does not allow raw (C0/C1 controls, DEL,
/// U+2028/U+2029, BOM, U+FFFE/U+FFFF). False, appending nothing, for any other character.
fn push_yaml_escape(out: &mut String, c: char) -> bool {
    use std::fmt::Write as _;
    let n = c as u32;
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        '\u{2028}' => out.push_str("\\L"),
        '\u{2029}' => out.push_str("\\P"),
        '\u{85}' => out.push_str("\\N"),
        _ if n < 0x20 || (0x7f..=0x9f).contains(&n) => {
            let _ = write!(out, "\\x{n:02x}");
        }
        '\u{feff}' | '\u{fffe}' | '\u{ffff}' => {
            let _ = write!(out, "\\u{n:04x}");
        }
        _ => return false,
    }
    true
}

/// Compact JSON of any value. Characters that are valid in JSON strings but break YAML readers
/// (DEL, C1 controls, U+2028/U+2029) are escaped too, so `json` output can be embedded in
/// cloud-config as a flow value.
fn json(args: &[&Value]) -> Result<Value, String> {
    let raw = serde_json::to_string(args[0]).map_err(|e| e.to_string())?;
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let n = c as u32;
        if (0x7f..=0x9f).contains(&n) || n == 0x2028 || n == 0x2029 || n == 0xfeff {
            out.push_str(&format!("\\u{n:04x}"));
        } else {
            out.push(c);
        }
    }
    Ok(Value::String(out))
}

fn base64(args: &[&Value]) -> Result<Value, String> {
    Ok(Value::String(BASE64.encode(text(args[0])?)))
}

/// gzip (no file name, time 0: the same input always gives the same output) then base64.
fn gzip_base64(args: &[&Value]) -> Result<Value, String> {
    let data = gzip(text(args[0])?.as_bytes());
    Ok(Value::String(BASE64.encode(data)))
}

/// Deterministic gzip, shared with output compression.
pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    encoder.write_all(data).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

fn width(v: &Value) -> Result<usize, String> {
    match v.as_u64() {
        Some(n) if n <= 256 => Ok(n as usize),
        _ => Err(format!(
            "the width must be a whole number from 0 to 256, got {}",
            type_name(v)
        )),
    }
}

/// Prefixes every non-empty line with N spaces (empty lines stay empty, so no trailing
/// whitespace appears).
fn indent(args: &[&Value]) -> Result<Value, String> {
    let pad = " ".repeat(width(args[0])?);
    let s = text(args[1])?;
    let mut out = String::with_capacity(s.len());
    for line in s.split_inclusive('\n') {
        if line != "\n" && line != "\r\n" {
            out.push_str(&pad);
        }
        out.push_str(line);
    }
    Ok(Value::String(out))
}

/// A newline, then `indent`: for `key:{{nindent 4 values.block}}`.
fn nindent(args: &[&Value]) -> Result<Value, String> {
    let Value::String(indented) = indent(args)? else {
        unreachable!("indent returns a string")
    };
    Ok(Value::String(format!("\n{indented}")))
}

/// The value, or the fallback when the value is missing, null or empty text.
fn default(args: &[&Value]) -> Result<Value, String> {
    let unset = matches!(args[0], Value::Null) || args[0].as_str() == Some("");
    Ok(if unset { args[1] } else { args[0] }.clone())
}

fn join(args: &[&Value]) -> Result<Value, String> {
    let separator = match args[1] {
        Value::String(s) => s.as_str(),
        other => {
            return Err(format!(
                "the separator must be text, got {}",
                type_name(other)
            ));
        }
    };
    match args[0] {
        Value::Array(items) => Ok(Value::String(
            items
                .iter()
                .map(text)
                .collect::<Result<Vec<_>, _>>()?
                .join(separator),
        )),
        Value::Null => Ok(Value::String(String::new())),
        other => Err(format!("expects a list, got {}", type_name(other))),
    }
}

fn sha256(args: &[&Value]) -> Result<Value, String> {
    Ok(Value::String(hex::encode(Sha256::digest(text(args[0])?))))
}

fn upper(args: &[&Value]) -> Result<Value, String> {
    Ok(Value::String(text(args[0])?.to_uppercase()))
}

fn lower(args: &[&Value]) -> Result<Value, String> {
    Ok(Value::String(text(args[0])?.to_lowercase()))
}

fn trim(args: &[&Value]) -> Result<Value, String> {
    Ok(Value::String(text(args[0])?.trim().to_owned()))
}

/// Whether VERSION is MINIMUM or later, comparing MAJOR.MINOR.PATCH as numbers (text
/// comparison puts v1.100 before v1.31 and v1.9 after it).
fn version_at_least(args: &[&Value]) -> Result<Value, String> {
    let parse = |v: &Value| {
        let t = text(v)?;
        version_numbers(&t)
            .ok_or_else(|| format!("{t:?} is not a version like v1.31.2 (or 1.31, v1.31.0-rc.1)"))
    };
    Ok(Value::Bool(parse(args[0])? >= parse(args[1])?))
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
        assert_eq!(ok("{{yaml_quote s}}", v.clone()), r#""it's""#);
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

    #[test]
    fn log_is_not_available() {
        let err = render("{{log \"x\"}}", json!({})).unwrap_err();
        assert!(err.contains("log"), "{err}");
    }
}
