//! Cluster API as its own release installs it, on a test management apiserver: the manifests of
//! `core/config/default` (`config/default` before v1.14) in the module the manager was built from (`kubectl kustomize`), with
//! what needs a cluster network rewritten for loopback. The CRDs' conversion webhook and the
//! admission webhooks point at the manager's webhook port on 127.0.0.1 with the test CA as
//! their `caBundle`; the Deployment, Service and cert-manager objects are left out (the manager
//! runs as a process, its certificate comes from [`crate::pki`]). Every object gets the label
//! `clusterctl init` gives the components it installs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use base64::Engine as _;
use serde_yaml::Value;

use crate::tools::{self, CapiRelease};

/// The namespace and ServiceAccount the manifests give the manager.
pub const NAMESPACE: &str = "capi-system";
pub const SERVICE_ACCOUNT: &str = "capi-manager";
/// The namespace and ServiceAccount the kubeadm bootstrap provider's manifests give its manager.
pub const KUBEADM_BOOTSTRAP_NAMESPACE: &str = "capi-kubeadm-bootstrap-system";
pub const KUBEADM_BOOTSTRAP_SERVICE_ACCOUNT: &str = "capi-kubeadm-bootstrap-manager";

/// Kinds the release ships that a manager running as a process does not need.
const LEFT_OUT: [&str; 4] = ["Deployment", "Service", "Certificate", "Issuer"];

/// The manifests of `release` (`default` in its [`CapiRelease::config_dir`]), rewritten so the
/// apiserver reaches the manager's webhooks on `https://127.0.0.1:<webhook_port>` trusting
/// `ca_pem`. Multi-document YAML.
pub fn manifests(release: CapiRelease, webhook_port: u16, ca_pem: &str) -> anyhow::Result<String> {
    manifests_of(&release.config_dir()?.join("default"), webhook_port, ca_pem)
}

/// [`manifests`] of the kubeadm bootstrap provider (`bootstrap/kubeadm/config/default` of the
/// same module): its CRDs, RBAC (the role aggregated into Cluster API's among it) and webhooks.
pub fn kubeadm_bootstrap_manifests(webhook_port: u16, ca_pem: &str) -> anyhow::Result<String> {
    let config = tools::capi_source()?.join("bootstrap/kubeadm/config/default");
    manifests_of(&config, webhook_port, ca_pem)
}

fn manifests_of(config: &Path, webhook_port: u16, ca_pem: &str) -> anyhow::Result<String> {
    let built = kustomize(config)?;
    let mut out = String::new();
    for document in serde_yaml::Deserializer::from_str(&built) {
        let mut object = serde::Deserialize::deserialize(document)?;
        if matches!(object, Value::Null) {
            continue;
        }
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        if LEFT_OUT.contains(&kind.as_str()) {
            continue;
        }
        super::clusterctl::label(&mut object);
        for_loopback(&mut object, webhook_port, ca_pem)?;
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&object)?);
    }
    Ok(out)
}

/// Rewrites an object whose webhooks the apiserver calls through a Service (a CRD's
/// conversion, a webhook configuration) to call `https://127.0.0.1:<port>` trusting `ca_pem`,
/// and drops cert-manager's CA injection annotation; other objects are left as they are.
pub fn for_loopback(object: &mut Value, port: u16, ca_pem: &str) -> anyhow::Result<()> {
    if let Some(annotations) = object["metadata"]["annotations"].as_mapping_mut() {
        annotations.remove("cert-manager.io/inject-ca-from");
    }
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let base_url = format!("https://127.0.0.1:{port}");
    match object["kind"].as_str().unwrap_or_default() {
        "CustomResourceDefinition" => point_conversion(object, &base_url, &ca_bundle),
        "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => {
            point_webhooks(object, &base_url, &ca_bundle)?
        }
        _ => {}
    }
    Ok(())
}

pub(crate) fn kustomize(dir: &Path) -> anyhow::Result<String> {
    // A tier starts many environments from the same few directories (a module's config in the
    // read-only module cache, the deploy tree of this checkout): each is built once per test
    // process, not once per environment (a second of CPU each, on a machine the tiers share).
    static BUILT: std::sync::Mutex<BTreeMap<PathBuf, String>> =
        std::sync::Mutex::new(BTreeMap::new());
    if let Some(built) = BUILT.lock().expect("not poisoned").get(dir) {
        return Ok(built.clone());
    }
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .context("running kubectl kustomize")?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let built = String::from_utf8(out.stdout)?;
    BUILT
        .lock()
        .expect("not poisoned")
        .insert(dir.to_owned(), built.clone());
    Ok(built)
}

/// A CRD whose conversion is a webhook calls the manager's `/convert` on loopback.
fn point_conversion(crd: &mut Value, base_url: &str, ca_bundle: &str) {
    let conversion = &mut crd["spec"]["conversion"];
    if conversion["strategy"].as_str() != Some("Webhook") {
        return;
    }
    let client_config = &mut conversion["webhook"]["clientConfig"];
    *client_config = serde_yaml::to_value(serde_json::json!({
        "url": format!("{base_url}/convert"),
        "caBundle": ca_bundle,
    }))
    .expect("a JSON value converts");
}

/// Each webhook of a configuration calls the same path on loopback instead of the Service.
fn point_webhooks(config: &mut Value, base_url: &str, ca_bundle: &str) -> anyhow::Result<()> {
    let Some(webhooks) = config["webhooks"].as_sequence_mut() else {
        return Ok(());
    };
    for webhook in webhooks {
        let path = webhook["clientConfig"]["service"]["path"]
            .as_str()
            .context("a webhook without a service path")?
            .to_owned();
        webhook["clientConfig"] = serde_yaml::to_value(serde_json::json!({
            "url": format!("{base_url}{path}"),
            "caBundle": ca_bundle,
        }))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_service_becomes_a_loopback_url_with_the_ca() {
        let mut config: Value = serde_yaml::from_str(
            "webhooks:\n- name: a\n  clientConfig:\n    service: {name: s, namespace: n, path: /validate-x}\n",
        )
        .unwrap();
        point_webhooks(&mut config, "https://127.0.0.1:9", "Q0E=").unwrap();
        let client_config = &config["webhooks"][0]["clientConfig"];
        assert_eq!(
            client_config["url"].as_str(),
            Some("https://127.0.0.1:9/validate-x")
        );
        assert_eq!(client_config["caBundle"].as_str(), Some("Q0E="));
        assert!(client_config["service"].is_null());
    }

    #[test]
    fn only_webhook_conversion_is_rewritten() {
        let mut none: Value = serde_yaml::from_str("spec: {conversion: {strategy: None}}").unwrap();
        point_conversion(&mut none, "https://127.0.0.1:9", "Q0E=");
        assert!(none["spec"]["conversion"]["webhook"].is_null());
        let mut webhook: Value = serde_yaml::from_str(
            "spec: {conversion: {strategy: Webhook, webhook: {clientConfig: {service: {name: s}}}}}",
        )
        .unwrap();
        point_conversion(&mut webhook, "https://127.0.0.1:9", "Q0E=");
        let client_config = &webhook["spec"]["conversion"]["webhook"]["clientConfig"];
        assert_eq!(
            client_config["url"].as_str(),
            Some("https://127.0.0.1:9/convert")
        );
    }
}
