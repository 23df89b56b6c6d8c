//! `clusterctl move` between two test management clusters.
//!
//! `clusterctl init` cannot run here (it installs cert-manager and waits for provider
//! Deployments, and these clusters have no nodes), so the environment records what init would:
//! the `clusterctl.cluster.x-k8s.io` label on every provider component and one `Provider`
//! inventory entry per provider, with the inventory CRD from the Cluster API module. Everything
//! `clusterctl move` then does (discovery, pausing, the object graph, creation on the target,
//! deletion on the source) is clusterctl's own.

use std::process::{Command, Output};

use anyhow::Context;
use serde_json::json;

use crate::{ApiServer, tools};

/// The label `clusterctl init` puts on every component it installs; `move` discovers the kinds
/// to move by it.
pub const LABEL: &str = "clusterctl.cluster.x-k8s.io";

/// The providers of a test management cluster: (inventory name, provider name, type,
/// namespace, version).
const PROVIDERS: [(&str, &str, &str, &str, &str); 4] = [
    (
        "cluster-api",
        "cluster-api",
        "CoreProvider",
        "capi-system",
        "v1.14.2",
    ),
    (
        "bootstrap-bootplate",
        "bootplate",
        "BootstrapProvider",
        "bootplate-system",
        "v0.1.0",
    ),
    (
        "infrastructure-dev",
        "dev",
        "InfrastructureProvider",
        "dev-system",
        "v0.1.0",
    ),
    (
        "control-plane-dev",
        "dev",
        "ControlPlaneProvider",
        "dev-system",
        "v0.1.0",
    ),
];

/// The inventory CRD of the Cluster API module, as YAML.
pub fn inventory_crd() -> anyhow::Result<String> {
    let crd_path = tools::capi_source()?.join("cmd/clusterctl/config/manifest/clusterctl-api.yaml");
    std::fs::read_to_string(&crd_path).with_context(|| format!("reading {}", crd_path.display()))
}

/// The inventory entries `clusterctl init` would have written (and the test providers'
/// namespace), as YAML; the providers' namespaces other than that one must exist.
pub fn inventory_entries() -> anyhow::Result<String> {
    let mut out = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: dev-system}\n");
    for (name, provider, type_, namespace, version) in PROVIDERS {
        let entry = json!({
            "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
            "kind": "Provider",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {LABEL: "", "cluster.x-k8s.io/provider": name},
            },
            "providerName": provider,
            "type": type_,
            "version": version,
        });
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&entry)?);
    }
    Ok(out)
}

/// Adds the clusterctl component label to an object (YAML value) as `clusterctl init` does.
pub fn label(object: &mut serde_yaml::Value) {
    let metadata = &mut object["metadata"];
    if metadata["labels"].is_null() {
        metadata["labels"] = serde_yaml::Value::Mapping(Default::default());
    }
    metadata["labels"][LABEL] = serde_yaml::Value::String(String::new());
}

/// `clusterctl move --namespace <namespace>` from `from` to `to`; its output is returned to
/// the test, which asserts on the objects afterwards.
pub fn move_namespace(from: &ApiServer, to: &ApiServer, namespace: &str) -> anyhow::Result<Output> {
    let home = from.dir().join("clusterctl-home");
    std::fs::create_dir_all(&home)?;
    Command::new(tools::path("clusterctl")?)
        .arg("move")
        .arg("--kubeconfig")
        .arg(from.kubeconfig_path()?)
        .arg("--to-kubeconfig")
        .arg(to.kubeconfig_path()?)
        .args(["--namespace", namespace, "-v", "2"])
        .env("HOME", &home)
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .output()
        .context("running clusterctl move")
}
