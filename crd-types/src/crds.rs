//! The CustomResourceDefinitions of every bootplate kind, as a cluster admin installs them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{
    BootplateConfig, BootplateConfigTemplate, BootstrapGenerator, BootstrapTemplate,
    ClusterBootstrapTemplate,
};

/// The CAPI contract labels: the versions of the CAPI contract each served version satisfies.
pub const CONTRACT_LABELS: [(&str, &str); 2] = [
    ("cluster.x-k8s.io/v1beta1", "v1alpha1"),
    ("cluster.x-k8s.io/v1beta2", "v1alpha1"),
];

/// The label that makes `clusterctl move` take every object of a kind along with the clusters
/// of its namespace. Templates are not part of any Cluster's ownership chain, yet the configs
/// that reference them render nothing without them.
pub const CLUSTERCTL_MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// All five CRDs, each labelled with the CAPI contract versions; the two template kinds and
/// generators (which templates name) also with [`CLUSTERCTL_MOVE_LABEL`] (configs and config
/// templates move as part of their Cluster: CAPI owns them through Machines and
/// MachineDeployments).
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        BootstrapTemplate::crd(),
        ClusterBootstrapTemplate::crd(),
        BootplateConfig::crd(),
        BootplateConfigTemplate::crd(),
        BootstrapGenerator::crd(),
    ];
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        for (key, value) in CONTRACT_LABELS {
            labels.insert(key.to_owned(), value.to_owned());
        }
        let kind = &crd.spec.names.kind;
        if kind.ends_with("BootstrapTemplate") || kind == "BootstrapGenerator" {
            labels.insert(CLUSTERCTL_MOVE_LABEL.to_owned(), String::new());
        }
    }
    crds
}

/// File name of each CRD under `deploy/crds/`: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::schema::{FormatFix, format_fix};

    /// Every `format` keyword under `schema`, with the JSON path of its schema and its type. A
    /// property named `format` is a schema (an object), the keyword a string: only the keyword
    /// is collected.
    fn formats(schema: &Value, path: &str, out: &mut Vec<(String, Option<String>, String)>) {
        match schema {
            Value::Object(map) => {
                if let Some(Value::String(format)) = map.get("format") {
                    let schema_type = map.get("type").and_then(Value::as_str).map(str::to_owned);
                    out.push((path.to_owned(), schema_type, format.clone()));
                }
                for (key, value) in map {
                    formats(value, &format!("{path}.{key}"), out);
                }
            }
            Value::Array(items) => {
                for (i, value) in items.iter().enumerate() {
                    formats(value, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_crd_schema_uses_only_formats_the_apiserver_knows() {
        let mut seen = 0;
        for crd in super::all() {
            for version in &crd.spec.versions {
                let schema = version
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref());
                let schema = serde_json::to_value(schema).expect("a schema serializes");
                let mut found = Vec::new();
                formats(&schema, "", &mut found);
                for (path, schema_type, format) in &found {
                    assert_eq!(
                        format_fix(schema_type.as_deref(), format),
                        FormatFix::Keep,
                        "{} {}: format {format:?} at {path}",
                        crd.spec.names.kind,
                        version.name
                    );
                }
                seen += found.len();
            }
        }
        // The walk finds the formats that must stay (date-time, int64): it can see a bad one.
        assert!(seen > 10, "only {seen} formats found");
    }
}
