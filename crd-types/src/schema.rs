//! The `format` keywords of the CRD schemas, limited to the ones the Kubernetes apiserver knows.
//!
//! schemars names an integer's Rust width (`uint64`, `uint32`, `uint8`, ...); the apiserver
//! knows only `int32` and `int64` for integers, `float` and `double` for numbers and a fixed list
//! for strings, and answers every create of a CRD that uses another with a warning that
//! `kubectl apply` prints (`unrecognized format "uint64"`). The spec and status types carry
//! [`kubernetes_formats`] as a schemars transform, so every schema the CRDs are generated from
//! holds only known formats; `crds::all`'s tests check every CRD.

use schemars::Schema;
use schemars::transform::{RecursiveTransform, Transform};
use serde_json::Value;

/// The string formats the apiserver validates (`k8s.io/apiextensions-apiserver`, the formats of
/// Kubernetes 1.0 plus the two names added in 1.34), compared with `-` removed as it does.
const STRING_FORMATS: [&str; 26] = [
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "k8s-short-name",
    "k8s-long-name",
];

/// What becomes of one schema's `format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatFix {
    /// The apiserver knows it.
    Keep,
    /// The known format that holds every value of the unknown one.
    Replace(&'static str),
    /// No known format fits: the schema has none (its `minimum`/`maximum` still bound it).
    Drop,
}

/// The fix for `format` on a schema of JSON type `schema_type` (`None` when the schema names no
/// single type, which the apiserver checks as a string).
pub fn format_fix(schema_type: Option<&str>, format: &str) -> FormatFix {
    match schema_type {
        Some("integer") => match format {
            "int32" | "int64" => FormatFix::Keep,
            // Every value of these fits in an int32.
            "int8" | "int16" | "uint8" | "uint16" => FormatFix::Replace("int32"),
            // uint32 needs 64 bits; uint64 values above i64::MAX cannot be stored by the
            // apiserver at all (it decodes integers as int64), so int64 loses nothing it keeps.
            "uint32" | "uint64" | "uint" | "int" | "uint128" | "int128" => {
                FormatFix::Replace("int64")
            }
            _ => FormatFix::Drop,
        },
        Some("number") => match format {
            "float" | "double" => FormatFix::Keep,
            _ => FormatFix::Drop,
        },
        Some("string") | None => {
            if is_known_string_format(format) {
                FormatFix::Keep
            } else {
                FormatFix::Drop
            }
        }
        // The apiserver knows no format for booleans, objects or arrays.
        Some(_) => FormatFix::Drop,
    }
}

fn is_known_string_format(format: &str) -> bool {
    let normalized = format.replace('-', "");
    STRING_FORMATS
        .iter()
        .any(|known| known.replace('-', "") == normalized)
}

/// Applies [`format_fix`] to `schema` and every schema under it. Used as
/// `#[schemars(transform = crate::schema::kubernetes_formats)]` on the spec and status types.
pub fn kubernetes_formats(schema: &mut Schema) {
    RecursiveTransform(fix_own_format).transform(schema);
}

fn fix_own_format(schema: &mut Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let Some(format) = object.get("format").and_then(Value::as_str) else {
        return;
    };
    match format_fix(schema_type(object.get("type")), format) {
        FormatFix::Keep => {}
        FormatFix::Replace(known) => {
            object.insert("format".to_owned(), Value::from(known));
        }
        FormatFix::Drop => {
            object.remove("format");
        }
    }
}

/// The one JSON type a schema names. schemars writes an `Option` as `["integer", "null"]`
/// (kube turns that into `nullable: true` after this transform ran), so `null` is left out.
fn schema_type(value: Option<&Value>) -> Option<&str> {
    match value? {
        Value::String(name) => Some(name),
        Value::Array(names) => {
            let mut types = names
                .iter()
                .filter_map(Value::as_str)
                .filter(|n| *n != "null");
            let first = types.next();
            if types.next().is_some() { None } else { first }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_becomes_one_the_apiserver_knows() {
        let cases: &[(Option<&str>, &str, FormatFix)] = &[
            (Some("integer"), "int32", FormatFix::Keep),
            (Some("integer"), "int64", FormatFix::Keep),
            (Some("integer"), "uint8", FormatFix::Replace("int32")),
            (Some("integer"), "int16", FormatFix::Replace("int32")),
            (Some("integer"), "uint16", FormatFix::Replace("int32")),
            (Some("integer"), "uint32", FormatFix::Replace("int64")),
            (Some("integer"), "uint64", FormatFix::Replace("int64")),
            (Some("integer"), "uint", FormatFix::Replace("int64")),
            (Some("integer"), "double", FormatFix::Drop),
            (Some("number"), "double", FormatFix::Keep),
            (Some("number"), "float", FormatFix::Keep),
            (Some("number"), "int64", FormatFix::Drop),
            (Some("string"), "date-time", FormatFix::Keep),
            (Some("string"), "datetime", FormatFix::Keep),
            (Some("string"), "k8s-short-name", FormatFix::Keep),
            (Some("string"), "byte", FormatFix::Keep),
            (Some("string"), "int-or-string", FormatFix::Drop),
            (Some("string"), "uint64", FormatFix::Drop),
            (None, "uuid", FormatFix::Keep),
            (None, "uint64", FormatFix::Drop),
            (Some("boolean"), "int32", FormatFix::Drop),
            (Some("object"), "date-time", FormatFix::Drop),
        ];
        for (schema_type, format, want) in cases {
            assert_eq!(
                format_fix(*schema_type, format),
                *want,
                "type {schema_type:?}, format {format}"
            );
        }
    }

    #[test]
    fn the_transform_reaches_nested_schemas_and_keeps_the_bounds() {
        let mut schema = schemars::json_schema!({
            "type": "object",
            "properties": {
                "bytes": { "type": "integer", "format": "uint64", "minimum": 0 },
                "maybe": { "type": ["integer", "null"], "format": "uint32" },
                "items": {
                    "type": "array",
                    "items": { "type": "integer", "format": "uint8", "minimum": 0, "maximum": 255 }
                },
                "when": { "type": "string", "format": "date-time" },
                "odd": { "type": "string", "format": "semver" }
            }
        });
        kubernetes_formats(&mut schema);
        assert_eq!(
            schema,
            schemars::json_schema!({
                "type": "object",
                "properties": {
                    "bytes": { "type": "integer", "format": "int64", "minimum": 0 },
                    "maybe": { "type": ["integer", "null"], "format": "int64" },
                    "items": {
                        "type": "array",
                        "items": { "type": "integer", "format": "int32", "minimum": 0, "maximum": 255 }
                    },
                    "when": { "type": "string", "format": "date-time" },
                    "odd": { "type": "string" }
                }
            })
        );
    }
}
