//! Strict reading of bootplate objects: every field of a document is checked against the
//! schema of its kind's CRD, the same schema the apiserver's strict field validation uses, so
//! the offline commands and the webhook refuse what `kubectl apply` refuses: unknown fields
//! (with the known name a typo was probably meant to be), values of the wrong type, values
//! outside an `enum`, missing required fields, a wrong `apiVersion` or an unknown `kind`.
//!
//! serde alone stops at the first unknown field and cannot say where it is; this walk reports
//! every problem, each with the path of its field (`spec.parts[0].files[1].permission`).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

use crate::{GROUP, VERSION};

/// bootplate's five kinds.
pub const KINDS: [&str; 5] = [
    "BootstrapTemplate",
    "ClusterBootstrapTemplate",
    "BootplateConfig",
    "BootplateConfigTemplate",
    "BootstrapGenerator",
];

/// The fields of `metadata` (ObjectMeta) a manifest may carry.
const METADATA_FIELDS: [&str; 15] = [
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "ownerReferences",
    "finalizers",
    "managedFields",
    "selfLink",
];

/// One field that does not fit its kind's schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldProblem {
    /// The field's path, for example `spec.parts[0].files[1].permission`.
    pub path: String,
    /// The problem is the field's name (an unknown field), not its value: point at the key.
    pub at_key: bool,
    /// What is wrong, in a sentence.
    pub message: String,
}

impl std::fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

static SCHEMAS: LazyLock<BTreeMap<String, JSONSchemaProps>> = LazyLock::new(|| {
    crate::crds::all()
        .into_iter()
        .filter_map(|crd: CustomResourceDefinition| {
            let kind = crd.spec.names.kind.clone();
            let version = crd.spec.versions.into_iter().find(|v| v.name == VERSION)?;
            Some((kind, version.schema?.open_api_v3_schema?))
        })
        .collect()
});

/// The known name closest to `name`, when one is close enough to be a typo of it: the same
/// but for case, or at most a third of its letters apart (at least one), counting a swap of
/// two neighbours as one.
pub fn did_you_mean<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let allowed = (name.chars().count() / 3).max(1);
    known
        .into_iter()
        .filter(|k| *k != name)
        .map(|k| {
            let distance = if k.eq_ignore_ascii_case(name) {
                0
            } else {
                strsim::damerau_levenshtein(name, k)
            };
            (distance, k)
        })
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// ", did you mean `x`?" when a known name is close to `name`, else the list of known names.
pub fn hint<'a>(name: &str, known: impl IntoIterator<Item = &'a str> + Clone) -> String {
    match did_you_mean(name, known.clone()) {
        Some(k) => format!("; did you mean `{k}`?"),
        None => {
            let mut list: Vec<&str> = known.into_iter().collect();
            if list.is_empty() {
                return String::new();
            }
            list.sort_unstable();
            let shown: Vec<String> = list.iter().take(12).map(|k| format!("`{k}`")).collect();
            let more = if list.len() > 12 { ", …" } else { "" };
            format!(" (known: {}{more})", shown.join(", "))
        }
    }
}

/// The kind of a document when it is one of bootplate's and its `apiVersion` is the served
/// one; otherwise the problem with `apiVersion` or `kind`.
pub fn kind_of(document: &Value) -> Result<&'static str, FieldProblem> {
    let problem = |path: &str, message: String| FieldProblem {
        path: path.to_owned(),
        at_key: false,
        message,
    };
    let kind = match document.get("kind") {
        Some(Value::String(k)) => k.as_str(),
        Some(_) => return Err(problem("kind", "must be a string".to_owned())),
        None => {
            return Err(problem(
                "kind",
                format!(
                    "the document has no kind (bootplate's kinds are {})",
                    KINDS.join(", ")
                ),
            ));
        }
    };
    let Some(known) = KINDS.iter().find(|k| **k == kind) else {
        return Err(problem(
            "kind",
            format!(
                "unknown kind `{}`{}",
                truncate(kind),
                hint(kind, KINDS.iter().copied())
            ),
        ));
    };
    let expected = format!("{GROUP}/{VERSION}");
    match document.get("apiVersion") {
        Some(Value::String(v)) if *v == expected => Ok(known),
        Some(Value::String(v)) => Err(problem(
            "apiVersion",
            format!("`{}` does not serve {kind}: use `{expected}`", truncate(v)),
        )),
        _ => Err(problem(
            "apiVersion",
            format!("missing: {kind} needs `apiVersion: {expected}`"),
        )),
    }
}

/// Every field of `document` (a whole object of one of [`KINDS`]) that does not fit its
/// kind's schema; `apiVersion` and `kind` are checked first (see [`kind_of`]).
pub fn check(document: &Value) -> Vec<FieldProblem> {
    let kind = match kind_of(document) {
        Ok(kind) => kind,
        Err(problem) => return vec![problem],
    };
    let mut problems = Vec::new();
    let Value::Object(map) = document else {
        unreachable!("a document with a kind is a map")
    };
    if let Some(metadata) = map.get("metadata") {
        match metadata {
            Value::Object(fields) => {
                for key in fields.keys() {
                    if !METADATA_FIELDS.contains(&key.as_str()) {
                        problems.push(unknown("metadata", key, METADATA_FIELDS.iter().copied()));
                    }
                }
            }
            other => problems.push(FieldProblem {
                path: "metadata".to_owned(),
                at_key: false,
                message: format!("must be a map, got {}", type_name(other)),
            }),
        }
    }
    let schema = &SCHEMAS[kind];
    // kube's schemas describe spec and status; apiVersion, kind and metadata are checked above.
    let mut rest = map.clone();
    for checked in ["apiVersion", "kind", "metadata"] {
        rest.remove(checked);
    }
    walk(schema, &Value::Object(rest), String::new(), &mut problems);
    problems
}

fn unknown<'a>(
    parent: &str,
    key: &str,
    known: impl IntoIterator<Item = &'a str> + Clone,
) -> FieldProblem {
    FieldProblem {
        path: join(parent, key),
        at_key: true,
        message: format!("unknown field `{}`{}", truncate(key), hint(key, known)),
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 64 {
        format!("{}…", s.chars().take(64).collect::<String>())
    } else {
        s.to_owned()
    }
}

/// `a string`, `a list`, … for messages about a value of the wrong type.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn fits_type(expected: &str, v: &Value) -> bool {
    match expected {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

fn expected_name(expected: &str) -> &str {
    match expected {
        "object" => "a map",
        "array" => "a list",
        "string" => "a string",
        "integer" => "an integer",
        "number" => "a number",
        "boolean" => "a boolean (true or false)",
        other => other,
    }
}

/// Checks `value` at `path` against `schema` with an explicit stack (a hostile document may
/// nest deeply).
fn walk(schema: &JSONSchemaProps, value: &Value, path: String, out: &mut Vec<FieldProblem>) {
    let mut stack = vec![(schema, value, path)];
    while let Some((schema, value, path)) = stack.pop() {
        if value.is_null() && schema.nullable == Some(true) {
            continue;
        }
        if schema.x_kubernetes_preserve_unknown_fields == Some(true) && schema.properties.is_none()
        {
            continue;
        }
        if let Some(expected) = schema.type_.as_deref()
            && !fits_type(expected, value)
        {
            out.push(FieldProblem {
                path,
                at_key: false,
                message: format!(
                    "must be {}, got {}",
                    expected_name(expected),
                    type_name(value)
                ),
            });
            continue;
        }
        if let Some(allowed) = &schema.enum_
            && !allowed.iter().any(|a| a.0 == *value)
        {
            let names: Vec<String> = allowed
                .iter()
                .map(|a| match &a.0 {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            let given = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let hint = match did_you_mean(&given, names.iter().map(String::as_str)) {
                Some(k) => format!("; did you mean `{k}`?"),
                None => String::new(),
            };
            out.push(FieldProblem {
                path,
                at_key: false,
                message: format!(
                    "`{}` is not one of {}{hint}",
                    truncate(&given),
                    names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
            continue;
        }
        match value {
            Value::Object(map) => {
                if let Some(properties) = &schema.properties {
                    for (key, item) in map {
                        match properties.get(key) {
                            Some(s) => stack.push((s, item, join(&path, key))),
                            None => {
                                out.push(unknown(&path, key, properties.keys().map(String::as_str)))
                            }
                        }
                    }
                    for required in schema.required.iter().flatten() {
                        if !map.contains_key(required) {
                            out.push(FieldProblem {
                                path: join(&path, required),
                                at_key: false,
                                message: format!(
                                    "missing: `{required}` is required{}",
                                    if path.is_empty() {
                                        String::new()
                                    } else {
                                        format!(" in {path}")
                                    }
                                ),
                            });
                        }
                    }
                } else if let Some(JSONSchemaPropsOrBool::Schema(s)) = &schema.additional_properties
                {
                    for (key, item) in map {
                        stack.push((s, item, join(&path, key)));
                    }
                }
            }
            Value::Array(items) => {
                if let Some(JSONSchemaPropsOrArray::Schema(s)) = &schema.items {
                    for (i, item) in items.iter().enumerate().rev() {
                        stack.push((s, item, format!("{path}[{i}]")));
                    }
                }
            }
            _ => {}
        }
    }
    // The stack visits fields in reverse; report them as they are written.
    out.sort_by_key(|p| natural(&p.path));
}

/// Orders `a[10]` after `a[9]`.
fn natural(path: &str) -> Vec<(String, usize)> {
    path.split(['.', '['])
        .map(|s| match s.strip_suffix(']').and_then(|n| n.parse().ok()) {
            Some(n) => (String::new(), n),
            None => (s.to_owned(), 0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn template(spec: Value) -> Value {
        json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
            "kind": "BootstrapTemplate",
            "metadata": {"name": "t", "namespace": "a"},
            "spec": spec,
        })
    }

    #[test]
    fn a_misspelled_field_names_the_path_and_the_field_meant() {
        let problems = check(&template(json!({
            "os": {"name": "x"},
            "format": "cloud-config",
            "parts": [{"name": "p", "files": [{"path": "/k", "content": "k", "permission": "0600"}]}],
        })));
        assert_eq!(
            problems,
            [FieldProblem {
                path: "spec.parts[0].files[0].permission".into(),
                at_key: true,
                message: "unknown field `permission`; did you mean `permissions`?".into(),
            }]
        );
    }

    #[test]
    fn types_enums_and_required_fields() {
        let problems = check(&template(json!({
            "os": {},
            "format": "cloud-confg",
            "parts": [{"name": "p", "units": [{"name": "a.service", "enable": "yes"}]}],
            "maxOutputBytes": "big",
        })));
        let shown: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            shown,
            [
                "spec.format: `cloud-confg` is not one of `cloud-config`, `ignition`, `script`, `mime-multipart`, `windows-cloud-config`, `powershell`, `powershell-aws`; did you mean `cloud-config`?",
                "spec.maxOutputBytes: must be an integer, got a string",
                "spec.os.name: missing: `name` is required in spec.os",
                "spec.parts[0].units[0].enable: must be a boolean (true or false), got a string",
            ]
        );
    }

    #[test]
    fn kind_and_api_version() {
        let mut doc =
            template(json!({"os": {"name": "x"}, "format": "script", "template": "#!/bin/sh\n"}));
        assert!(check(&doc).is_empty());
        doc["kind"] = json!("BootstrapTemplat");
        assert_eq!(
            check(&doc)[0].to_string(),
            "kind: unknown kind `BootstrapTemplat`; did you mean `BootstrapTemplate`?"
        );
        doc["kind"] = json!("BootstrapTemplate");
        doc["apiVersion"] = json!("bootstrap.bootplate.dev/v1beta1");
        assert_eq!(
            check(&doc)[0].to_string(),
            "apiVersion: `bootstrap.bootplate.dev/v1beta1` does not serve BootstrapTemplate: use `bootstrap.bootplate.dev/v1alpha1`"
        );
        doc["apiVersion"] = json!("bootstrap.bootplate.dev/v1alpha1");
        doc["metadata"]["lables"] = json!({});
        assert_eq!(
            check(&doc)[0].to_string(),
            "metadata.lables: unknown field `lables`; did you mean `labels`?"
        );
    }

    #[test]
    fn free_form_fields_stay_free() {
        let doc = json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
            "kind": "BootplateConfig",
            "metadata": {"name": "c"},
            "spec": {
                "templateRef": {"kind": "BootstrapTemplate", "name": "t"},
                "variables": {"anything": {"nested": [1, "x"]}},
            },
        });
        assert!(check(&doc).is_empty(), "{:?}", check(&doc));
    }

    #[test]
    fn suggestions_are_close_or_absent() {
        let known = ["permissions", "path", "owner", "content"];
        assert_eq!(did_you_mean("permision", known), Some("permissions"));
        assert_eq!(did_you_mean("Path", known), Some("path"));
        assert_eq!(did_you_mean("mode", known), None);
        assert_eq!(
            hint("mode", known),
            " (known: `content`, `owner`, `path`, `permissions`)"
        );
    }
}
