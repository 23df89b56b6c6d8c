//! `docs/reference.md`: every field of the four kinds, written from their CRD schemas (the ones
//! the apiserver enforces and `kubectl explain` shows), so the page cannot drift from the API.

use std::fmt::Write;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};

/// The reference page, in Markdown.
pub fn markdown() -> String {
    let mut out = String::from(
        "# API reference\n\n\
         <!-- Generated from the CRD schemas by crd-types/src/reference.rs; a test keeps it\n\
         current. Regenerate with: BOOTPLATE_BLESS=1 cargo test -p bootplate-crd-types --test reference -->\n\n\
         Every field of bootplate's kinds (API group `bootstrap.bootplate.dev`, version `v1alpha1`).\n\
         Fields are written as paths: `spec.parts[].files[].path` is `path` in each item of `files`\n\
         in each item of `parts`. Unknown fields are refused, by the apiserver and by `bootplate lint`.\n",
    );
    for crd in crate::crds::all() {
        let names = &crd.spec.names;
        let _ = write!(
            out,
            "\n## {}\n\n{} Scope: {}; short name{}: {}; plural: `{}`.\n\n",
            names.kind,
            crd.spec
                .versions
                .first()
                .and_then(|v| v.schema.as_ref())
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| s.description.clone())
                .unwrap_or_default(),
            crd.spec.scope.to_lowercase(),
            if names.short_names.as_ref().is_some_and(|s| s.len() > 1) {
                "s"
            } else {
                ""
            },
            names
                .short_names
                .iter()
                .flatten()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", "),
            names.plural,
        );
        out.push_str("| Field | Type | Default | Description |\n| --- | --- | --- | --- |\n");
        let Some(schema) = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == crate::VERSION)
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
        else {
            continue;
        };
        if let Some(spec) = schema.properties.as_ref().and_then(|p| p.get("spec")) {
            fields(spec, "spec", true, &mut out);
        }
        if let Some(status) = schema.properties.as_ref().and_then(|p| p.get("status")) {
            fields(status, "status", false, &mut out);
        }
    }
    out
}

/// One row per field below `schema` (at `path`), depth first, in the schema's (sorted) order.
fn fields(schema: &JSONSchemaProps, path: &str, required: bool, out: &mut String) {
    let _ = writeln!(
        out,
        "| `{path}`{} | {} | {} | {} |",
        if required { " (required)" } else { "" },
        type_of(schema),
        schema
            .default
            .as_ref()
            .map(|d| format!("`{}`", d.0))
            .unwrap_or_default(),
        cell(schema.description.as_deref().unwrap_or("")),
    );
    let required: Vec<&str> = schema
        .required
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    for (name, child) in schema.properties.iter().flatten() {
        fields(
            child,
            &format!("{path}.{name}"),
            required.contains(&name.as_str()),
            out,
        );
    }
    if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items
        && (item.properties.is_some())
    {
        let required: Vec<&str> = item.required.iter().flatten().map(String::as_str).collect();
        for (name, child) in item.properties.iter().flatten() {
            fields(
                child,
                &format!("{path}[].{name}"),
                required.contains(&name.as_str()),
                out,
            );
        }
    }
}

fn type_of(schema: &JSONSchemaProps) -> String {
    let mut t = match (
        schema.type_.as_deref(),
        &schema.items,
        &schema.additional_properties,
    ) {
        (Some("array"), Some(JSONSchemaPropsOrArray::Schema(item)), _) => {
            format!(
                "list of {}",
                plural(item.type_.as_deref().unwrap_or("value"))
            )
        }
        (Some("object"), _, Some(JSONSchemaPropsOrBool::Schema(value))) => format!(
            "map of {}",
            plural(value.type_.as_deref().unwrap_or("value"))
        ),
        (Some(t), _, _) => t.to_owned(),
        (None, _, _) => "any".to_owned(),
    };
    if let Some(values) = &schema.enum_ {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("`{}`", v.0.as_str().map_or(v.0.to_string(), str::to_owned)))
            .collect();
        let _ = write!(t, ": one of {}", values.join(", "));
    }
    if let Some(pattern) = &schema.pattern {
        let _ = write!(t, ", matching `{}`", pattern.replace('|', "\\|"));
    }
    match (schema.minimum, schema.maximum) {
        (Some(min), Some(max)) => {
            let _ = write!(t, ", {min} to {max}");
        }
        (Some(min), None) => {
            let _ = write!(t, ", at least {min}");
        }
        (None, Some(max)) => {
            let _ = write!(t, ", at most {max}");
        }
        _ => {}
    }
    if let Some(min) = schema.min_length {
        let _ = write!(t, ", at least {min} characters");
    }
    t
}

fn plural(t: &str) -> String {
    match t {
        "object" => "objects".to_owned(),
        "string" => "strings".to_owned(),
        "integer" => "integers".to_owned(),
        "boolean" => "booleans".to_owned(),
        other => format!("{other}s"),
    }
}

/// A description as one table cell.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}
