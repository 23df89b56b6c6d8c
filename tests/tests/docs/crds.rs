//! The CRDs as a user applies them, on the real kube-apiserver: no warning at all.
//!
//! Each CRD is created with `dryRun=All` (so `bootplate crds` and `deploy/crds` can both be
//! created on one fresh apiserver: the apiserver warns about a format only on the create that
//! introduces it) and the `Warning` headers of the answer are collected. A CRD with a seeded
//! `uint64` format must draw a warning through the same code, so the check can see one.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::{Value, json};
use testenv::ApiServer;

const CRDS_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions?dryRun=All";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

/// The YAML documents of `text` as JSON values (empty documents left out).
fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

/// `bootplate crds`, as a cluster admin pipes it to `kubectl apply -f -`.
fn printed_crds() -> Vec<Value> {
    let out = Command::new(testenv::controller::binary().expect("the bootplate binary"))
        .arg("crds")
        .output()
        .expect("bootplate crds runs");
    assert!(out.status.success(), "bootplate crds failed: {out:?}");
    documents(&String::from_utf8(out.stdout).expect("UTF-8 YAML"))
}

/// Every file of deploy/crds but its kustomization, by file name.
fn deployed_crds() -> Vec<(String, Value)> {
    let dir = repo().join("deploy/crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/crds")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| !path.ends_with("kustomization.yml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("a CRD file");
        let name = format!(
            "deploy/crds/{}",
            path.file_name().unwrap().to_string_lossy()
        );
        crds.extend(documents(&text).into_iter().map(|crd| (name.clone(), crd)));
    }
    crds
}

/// Creates `crd` (dry run) and returns the apiserver's warnings; panics when it refuses it.
async fn create_warnings(client: &kube::Client, source: &str, crd: &Value) -> Vec<String> {
    let name = crd["metadata"]["name"].as_str().unwrap_or("<no name>");
    let request = http::Request::post(CRDS_PATH)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(crd).unwrap()))
        .unwrap();
    let response = client.send(request).await.expect("the apiserver answers");
    let status = response.status();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|value| {
            format!(
                "{source} {name}: {}",
                value.to_str().unwrap_or("<not text>")
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .unwrap_or_default();
    assert!(
        status.is_success(),
        "{source}: the apiserver refused CRD {name}: {status} {}",
        String::from_utf8_lossy(&body)
    );
    warnings
}

/// A copy of `crd` with an integer property of format `uint64` in its spec.
fn with_unknown_format(crd: &Value) -> Value {
    let mut crd = crd.clone();
    let spec = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    spec["properties"]["seededCount"] = json!({"type": "integer", "format": "uint64"});
    crd
}

#[tokio::test]
async fn crds_apply_to_the_real_apiserver_without_a_warning() {
    let server = ApiServer::start().await.expect("apiserver");
    let client = server.client().await.expect("client");
    let printed = printed_crds();
    assert_eq!(printed.len(), 5, "bootplate crds prints the five CRDs");

    let seeded = create_warnings(&client, "seeded", &with_unknown_format(&printed[0])).await;
    assert!(
        seeded
            .iter()
            .any(|w| w.contains(r#"unrecognized format \"uint64\""#)),
        "a uint64 format draws a warning this test can see: {seeded:?}"
    );

    let mut warnings = Vec::new();
    for crd in &printed {
        warnings.extend(create_warnings(&client, "bootplate crds", crd).await);
    }
    let deployed = deployed_crds();
    assert_eq!(deployed.len(), 5, "deploy/crds holds the five CRDs");
    for (file, crd) in &deployed {
        warnings.extend(create_warnings(&client, file, crd).await);
    }
    assert!(
        warnings.is_empty(),
        "the apiserver warned:\n{}",
        warnings.join("\n")
    );

    // The command a platform team runs, for real this time.
    let kubeconfig = server.kubeconfig_path().expect("kubeconfig");
    let out = Command::new(std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into()))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "--warnings-as-errors", "-k"])
        .arg(repo().join("deploy/crds"))
        .output()
        .expect("kubectl runs (tests/scripts/install-tools.sh installs it)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "kubectl apply -k deploy/crds: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
