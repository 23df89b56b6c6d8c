//! Declared variables: checking the declarations once at compile time, and building `values`
//! (defaults overridden by the config's variables) for each render.

use std::collections::BTreeMap;

use crd_types::{ValueType, VariableDecl, VariableSchema};
use regex::Regex;
use serde_json::{Map, Value};

use crate::error::{Problem, RenderError};

/// Compiled `pattern`s are capped so a hostile pattern cannot take much memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// One checked declaration.
#[derive(Debug)]
pub(crate) struct Declaration {
    pub(crate) decl: VariableDecl,
    pattern: Option<Regex>,
}

/// The template's variable declarations, checked.
#[derive(Debug, Default)]
pub(crate) struct Declarations {
    pub(crate) list: Vec<Declaration>,
    /// Every declared variable with its default (null without one): each render's `values`
    /// starts as a copy of it, which is cheaper than inserting the variables one by one.
    defaults: Map<String, Value>,
}

impl Declarations {
    /// Checks names (valid, unique), patterns (compile) and defaults (satisfy the schema).
    pub(crate) fn compile(decls: &[VariableDecl], problems: &mut Vec<Problem>) -> Self {
        let mut list: Vec<Declaration> = Vec::with_capacity(decls.len());
        for (i, decl) in decls.iter().enumerate() {
            let field = format!("spec.variables[{i}]");
            if !valid_name(&decl.name) {
                problems.push(Problem::template(
                    format!("{field}.name"),
                    format!(
                        "`{}` is not a valid variable name (letters, digits and `_`, starting with a letter)",
                        crate::error::truncate(&decl.name, 64)
                    ),
                ));
                continue;
            }
            if list.iter().any(|d| d.decl.name == decl.name) {
                problems.push(Problem::template(
                    format!("{field}.name"),
                    format!("variable `{}` is declared twice", decl.name),
                ));
                continue;
            }
            let pattern = match decl.schema.as_ref().and_then(|s| s.pattern.as_deref()) {
                None => None,
                Some(p) => match regex::RegexBuilder::new(p)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .build()
                {
                    Ok(re) => Some(re),
                    Err(e) => {
                        problems.push(Problem::template(
                            format!("{field}.schema.pattern"),
                            format!(
                                "variable `{}`: invalid regular expression: {}",
                                decl.name,
                                crate::error::truncate(&e.to_string(), 200)
                            ),
                        ));
                        continue;
                    }
                },
            };
            let declaration = Declaration {
                decl: decl.clone(),
                pattern,
            };
            if let Some(default) = &decl.default
                && let Err(message) = declaration.check(default)
            {
                problems.push(Problem::template(
                    format!("{field}.default"),
                    format!(
                        "the default of variable `{}` does not fit its schema: {message}",
                        decl.name
                    ),
                ));
            }
            list.push(declaration);
        }
        let defaults = list
            .iter()
            .map(|d| {
                let default = d.decl.default.clone().unwrap_or(Value::Null);
                (d.decl.name.clone(), default)
            })
            .collect();
        Declarations { list, defaults }
    }

    /// `values` for one render: every declared variable, from the config, else its default,
    /// else null (so templates can test it with `{{#if values.x}}`). A config variable that is
    /// explicitly null counts as unset.
    pub(crate) fn values(
        &self,
        object: &str,
        config: &BTreeMap<String, Value>,
    ) -> Result<Map<String, Value>, RenderError> {
        for name in config.keys() {
            if !self.defaults.contains_key(name) {
                return Err(RenderError::InvalidVariable {
                    object: object.to_owned(),
                    variable: crate::error::truncate(name, 64),
                    message: format!("the template does not declare it{}", self.known()),
                });
            }
        }
        let mut values = self.defaults.clone();
        for d in &self.list {
            match config.get(&d.decl.name).filter(|v| !v.is_null()) {
                Some(v) => {
                    d.check(v).map_err(|message| RenderError::InvalidVariable {
                        object: object.to_owned(),
                        variable: d.decl.name.clone(),
                        message,
                    })?;
                    if let Some(slot) = values.get_mut(&d.decl.name) {
                        *slot = v.clone();
                    }
                }
                None if d.decl.required => {
                    return Err(RenderError::InvalidVariable {
                        object: object.to_owned(),
                        variable: d.decl.name.clone(),
                        message: "required, but the config does not set it".to_owned(),
                    });
                }
                None => {}
            }
        }
        Ok(values)
    }

    fn known(&self) -> String {
        if self.list.is_empty() {
            " (it declares no variables)".to_owned()
        } else {
            let names: Vec<&str> = self.list.iter().map(|d| d.decl.name.as_str()).collect();
            format!(" (declared: {})", names.join(", "))
        }
    }

    /// Values for lint's sample renders: each required variable without a default gets a
    /// value that fits its schema. Err names a variable no value could be made for.
    pub(crate) fn sample_variables(&self) -> Result<BTreeMap<String, Value>, String> {
        let mut out = BTreeMap::new();
        for d in &self.list {
            if !d.decl.required || d.decl.default.is_some() {
                continue;
            }
            let value = sample_candidates(d.decl.schema.as_ref())
                .into_iter()
                .find(|v| d.check(v).is_ok())
                .ok_or_else(|| d.decl.name.clone())?;
            out.insert(d.decl.name.clone(), value);
        }
        Ok(out)
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Strings generated from `pattern` (rand_regex walks the regex's syntax tree, so any pattern
/// the regex crate accepts yields matching text), from a fixed seed so lint is repeatable. A
/// pattern only requires a match somewhere; the generated text is the match alone.
fn pattern_samples(pattern: &str) -> Vec<String> {
    use rand::{RngExt, SeedableRng};
    const MAX_REPEAT: u32 = 8;
    const SAMPLES: usize = 64;
    let Ok(hir) = regex_syntax::Parser::new().parse(pattern) else {
        return Vec::new();
    };
    let Ok(generator) = rand_regex::Regex::with_hir(without_anchors(hir), MAX_REPEAT) else {
        return Vec::new();
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x626f_6f74);
    (0..SAMPLES).map(|_| rng.sample(&generator)).collect()
}

/// `hir` with its anchors and word boundaries taken out (rand_regex generates no text for
/// them): the generated text is one whole match, so `^` and `$` hold anyway, and a text that
/// misses a word boundary fails the schema check and is not used.
fn without_anchors(hir: regex_syntax::hir::Hir) -> regex_syntax::hir::Hir {
    use regex_syntax::hir::{Capture, Hir, HirKind, Repetition};
    match hir.into_kind() {
        HirKind::Look(_) => Hir::empty(),
        HirKind::Concat(items) => Hir::concat(items.into_iter().map(without_anchors).collect()),
        HirKind::Alternation(items) => {
            Hir::alternation(items.into_iter().map(without_anchors).collect())
        }
        HirKind::Repetition(r) => Hir::repetition(Repetition {
            sub: Box::new(without_anchors(*r.sub)),
            ..r
        }),
        HirKind::Capture(c) => Hir::capture(Capture {
            sub: Box::new(without_anchors(*c.sub)),
            ..c
        }),
        HirKind::Empty => Hir::empty(),
        HirKind::Literal(l) => Hir::literal(l.0),
        HirKind::Class(c) => Hir::class(c),
    }
}

fn sample_candidates(schema: Option<&VariableSchema>) -> Vec<Value> {
    let Some(schema) = schema else {
        return vec![Value::String("sample".to_owned())];
    };
    if let Some(first) = schema.enum_.as_ref().and_then(|e| e.first()) {
        return vec![first.clone()];
    }
    match schema.type_.unwrap_or(ValueType::String) {
        ValueType::String => {
            let mut v: Vec<Value> = [
                "sample",
                "sample.example.invalid",
                "10.0.0.10",
                "10.0.0.0/16",
                "v1.31.0",
                "1.31.0",
                "1",
                "a",
                "",
            ]
            .iter()
            .map(|s| Value::String((*s).to_owned()))
            .collect();
            if let Some(n) = schema.min_length {
                v.push(Value::String("x".repeat(n.min(4096) as usize)));
            }
            if let Some(pattern) = &schema.pattern {
                v.extend(pattern_samples(pattern).into_iter().map(Value::String));
            }
            v
        }
        ValueType::Integer | ValueType::Number => {
            let mut v = vec![Value::from(1)];
            if let Some(min) = schema.minimum {
                v.push(Value::from(min.ceil() as i64));
            }
            if let Some(max) = schema.maximum {
                v.push(Value::from(max.floor() as i64));
            }
            v
        }
        ValueType::Boolean => vec![Value::Bool(true)],
        ValueType::Array => vec![Value::Array(Vec::new())],
        ValueType::Object => vec![Value::Object(Map::new())],
    }
}

impl Declaration {
    /// Checks a value against the declared schema. The message never repeats the value.
    fn check(&self, value: &Value) -> Result<(), String> {
        let Some(schema) = &self.decl.schema else {
            return Ok(());
        };
        if let Some(t) = schema.type_
            && !t.matches(value)
        {
            return Err(format!("must be {}, got {}", article(t), kind(value)));
        }
        if let Some(allowed) = &schema.enum_
            && !allowed.contains(value)
        {
            let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
            return Err(format!(
                "must be one of {}",
                crate::error::truncate(&list.join(", "), 300)
            ));
        }
        if let Value::String(s) = value {
            let len = s.chars().count() as u64;
            if let Some(min) = schema.min_length
                && len < min
            {
                return Err(format!("must be at least {min} characters long"));
            }
            if let Some(max) = schema.max_length
                && len > max
            {
                return Err(format!("must be at most {max} characters long"));
            }
            if let Some(re) = &self.pattern
                && !re.is_match(s)
            {
                return Err(format!(
                    "must match the pattern `{}`",
                    crate::error::truncate(re.as_str(), 200)
                ));
            }
        }
        if let Some(n) = value.as_f64() {
            if let Some(min) = schema.minimum
                && n < min
            {
                return Err(format!("must be at least {min}"));
            }
            if let Some(max) = schema.maximum
                && n > max
            {
                return Err(format!("must be at most {max}"));
            }
        }
        if let (Some(items), Value::Array(list)) = (&schema.items, value)
            && let Some((i, item)) = list
                .iter()
                .enumerate()
                .find(|(_, v)| !items.type_.matches(v))
        {
            return Err(format!(
                "each item must be {}, but item {} is {}",
                article(items.type_),
                i + 1,
                kind(item)
            ));
        }
        Ok(())
    }
}

fn article(t: ValueType) -> &'static str {
    match t {
        ValueType::String => "a string",
        ValueType::Integer => "an integer",
        ValueType::Number => "a number",
        ValueType::Boolean => "a boolean",
        ValueType::Array => "an array",
        ValueType::Object => "an object",
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn decl(yaml: &str) -> VariableDecl {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn compile(decls: &[VariableDecl]) -> (Declarations, Vec<Problem>) {
        let mut problems = Vec::new();
        let d = Declarations::compile(decls, &mut problems);
        (d, problems)
    }

    fn err(d: &Declarations, vars: Value) -> String {
        let vars: BTreeMap<String, Value> = serde_json::from_value(vars).unwrap();
        d.values("BootstrapTemplate ns/t", &vars)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults_are_overridden_by_config_and_optional_ones_are_null() {
        let (d, p) = compile(&[
            decl("{name: a, default: 1}"),
            decl("{name: b, default: x}"),
            decl("{name: c}"),
        ]);
        assert!(p.is_empty());
        let vars = BTreeMap::from([("b".to_owned(), json!("y"))]);
        let values = d.values("o", &vars).unwrap();
        assert_eq!(Value::Object(values), json!({"a": 1, "b": "y", "c": null}));
    }

    #[test]
    fn errors_name_object_and_variable_but_not_the_value() {
        let (d, _) = compile(&[
            decl("{name: port, schema: {type: integer, minimum: 1, maximum: 65535}}"),
            decl("{name: mode, schema: {enum: [a, b]}}"),
            decl("{name: host, required: true, schema: {pattern: '^[a-z.]+$', maxLength: 10}}"),
            decl("{name: list, schema: {type: array, items: {type: string}}}"),
        ]);
        let host = json!({"host": "ok"});
        let with = |extra: Value| {
            let mut v = host.clone();
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        let e = err(&d, json!({}));
        assert!(
            e.contains("BootstrapTemplate ns/t") && e.contains("`host`") && e.contains("required"),
            "{e}"
        );
        let e = err(&d, with(json!({"port": "secret-80"})));
        assert!(
            e.contains("`port`") && e.contains("must be an integer, got a string"),
            "{e}"
        );
        assert!(!e.contains("secret-80"), "{e}");
        let e = err(&d, with(json!({"port": 70000})));
        assert!(e.contains("at most 65535"), "{e}");
        let e = err(&d, with(json!({"mode": "c"})));
        assert!(
            e.contains("`mode`") && e.contains(r#"one of "a", "b""#),
            "{e}"
        );
        let e = err(&d, json!({"host": "UPPER"}));
        assert!(e.contains("pattern") && !e.contains("UPPER"), "{e}");
        let e = err(&d, json!({"host": "aaaaaaaaaaaa"}));
        assert!(e.contains("at most 10 characters"), "{e}");
        let e = err(&d, with(json!({"list": ["a", 2]})));
        assert!(e.contains("item 2 is an integer"), "{e}");
        let e = err(&d, with(json!({"typo": 1})));
        assert!(
            e.contains("`typo`")
                && e.contains("does not declare")
                && e.contains("port, mode, host, list"),
            "{e}"
        );
    }

    #[test]
    fn bad_declarations_are_compile_problems_naming_the_field() {
        let (_, p) = compile(&[
            decl("{name: 1bad}"),
            decl("{name: a}"),
            decl("{name: a}"),
            decl("{name: r, schema: {pattern: '('}}"),
            decl("{name: d, default: 5, schema: {type: string}}"),
        ]);
        let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.variables[0].name",
                "spec.variables[2].name",
                "spec.variables[3].schema.pattern",
                "spec.variables[4].default"
            ]
        );
        assert!(p[3].message.contains("`d`") && p[3].message.contains("must be a string"));
    }

    #[test]
    fn samples_fit_the_schema_or_name_the_variable() {
        let (d, _) = compile(&[
            decl("{name: ip, required: true, schema: {pattern: '^\\d+\\.\\d+\\.\\d+\\.\\d+$'}}"),
            decl("{name: n, required: true, schema: {type: integer, minimum: 3}}"),
        ]);
        let s = d.sample_variables().unwrap();
        assert_eq!(s["ip"], json!("10.0.0.10"));
        assert_eq!(s["n"], json!(3));
        // Values for a pattern come from the pattern itself.
        let (d, _) = compile(&[decl(
            "{name: z, required: true, schema: {pattern: '^zz-[0-9]{9}$'}}",
        )]);
        let z = d.sample_variables().unwrap()["z"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(z.len() == 12 && z.starts_with("zz-"), "{z}");
        let (d, _) = compile(&[decl(
            "{name: z, required: true, schema: {pattern: '^[a-z]{9}$', maxLength: 5}}",
        )]);
        assert_eq!(d.sample_variables().unwrap_err(), "z");
    }
}
