//! Fetch delivery (docs/boot-channel.md, "Fetch delivery") across the same boundary as the boot
//! report, in the boot report's environment (see `boot_report.rs`, which calls [`check`]): a
//! worker whose config sets `delivery: Fetch` gets a stub; its sealed render waits in the
//! workload cluster for its token alone, and goes with the token once the machine joined.
//!
//! - the data Secret holds a stub of at most 2048 bytes; the payload Secret
//!   `kube-system/bootplate-fetch-<config UID>` holds ciphertext, not the token;
//! - the machine's token reads the payload (200); another machine's token gets 403 on it and on
//!   the machine's report;
//! - the stub, run by bash with the real curl and openssl against the real workload apiserver,
//!   checks the CA of `kube-public/cluster-info` against its hash, fetches, checks and decrypts
//!   the payload; the payload run (paths moved, as the boot report tests run user-data) reports
//!   its failed `join` part: `BootFailed` on the config;
//! - a refused token (401 from the apiserver) stops the stub with a clear message;
//! - once the Machine joined, the payload's Secret, Role and RoleBinding are gone;
//! - another machine whose token expired: its stub stops with the 401 message, it never
//!   reports, and once provisioned long enough its config shows `BootNotStarted`.

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use crd_types::capi::Machine;
use crd_types::{BootplateConfig, Delivery};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use testenv::capi_env::{Env, NS, WAIT, cluster_template};
use testenv::pki::TestCa;
use testenv::{eventually, fixtures, machine_script};

/// Machine `name` of cluster `c1` whose config fetches its render from template `boot`.
pub(super) async fn create_machine(env: &Env, name: &str) {
    let machine = fixtures::machine(NS, name, "c1", false, name);
    let machine = Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut config = fixtures::owned_config(&machine, cluster_template("boot"));
    config.spec.delivery = Some(Delivery::Fetch);
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// What `kubeadm init` publishes for discovery: `kube-public/cluster-info` with the CA, readable
/// by anyone.
async fn publish_cluster_info(env: &Env, ca: &TestCa) {
    let data = base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem);
    let kubeconfig = format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {data}\n    server: https://127.0.0.1:{}\n  name: \"\"\nkind: Config\n",
        env.workload.port()
    );
    let objects = [
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": kubeconfig}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "cluster-info-reader", "namespace": "kube-public"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["cluster-info"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "cluster-info-reader", "namespace": "kube-public"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                "name": "cluster-info-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                "name": "system:anonymous"}]}),
    ];
    let client = env.workload_client.clone();
    let post = PostParams::default();
    let [config_map, role, binding] = objects;
    (Api::<ConfigMap>::namespaced(client.clone(), "kube-public"))
        .create(&post, &serde_json::from_value(config_map).unwrap())
        .await
        .unwrap();
    (Api::<Role>::namespaced(client.clone(), "kube-public"))
        .create(&post, &serde_json::from_value(role).unwrap())
        .await
        .unwrap();
    (Api::<RoleBinding>::namespaced(client, "kube-public"))
        .create(&post, &serde_json::from_value(binding).unwrap())
        .await
        .unwrap();
}

/// The value of `NAME='value'` on the stub's settings line.
fn stub_value(stub: &str, name: &str) -> String {
    let after = stub
        .split(&format!("{name}='"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in the stub:\n{stub}"));
    after.split('\'').next().unwrap().to_owned()
}

/// `GET`s `path` of the workload apiserver as `token`; the HTTP status.
fn get_as(env: &Env, ca: &Path, token: &str, path: &str) -> String {
    let url = format!("https://127.0.0.1:{}{path}", env.workload.port());
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(ca)
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg(url)
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `stub` with the line that runs the decrypted render replaced by one that keeps it as
/// `run/payload.sh` (the test runs it with its paths moved).
fn keeping_the_payload(stub: &str) -> String {
    let run = r#"(cd / && bash "$D/x.sh")"#;
    assert!(stub.contains(run), "{stub}");
    stub.replace(run, r#"cp "$D/x.sh" "$D/../payload.sh""#)
}

/// Runs `stub` (its `/run/` under `root`) with bash: success, and standard error.
fn run_stub(stub: &str, root: &Path) -> (bool, String) {
    let path = root.join("stub.sh");
    let stub = stub.replace("/run/", &format!("{}/run/", root.display()));
    std::fs::write(&path, stub).unwrap();
    let out = Command::new("timeout")
        .arg("60")
        .arg("bash")
        .arg(&path)
        .output()
        .expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}

/// The checks of the module's doc, for machine `name` (made by [`create_machine`]); `ca_file`
/// is the workload CA, `other_token` another machine's token.
pub(super) async fn check(env: &Env, ca: &TestCa, ca_file: &Path, other_token: &str, name: &str) {
    let config = env.wait_ready(name).await;
    let uid = config.uid().unwrap();
    let stub = env.user_data(name).await;
    assert!(
        stub.len() <= 2048,
        "a stub of {} bytes:\n{stub}",
        stub.len()
    );
    let (token, object) = (stub_value(&stub, "T"), stub_value(&stub, "N"));
    assert_eq!(object, format!("bootplate-fetch-{uid}"));
    let secrets = Api::<Secret>::namespaced(env.workload_client.clone(), "kube-system");
    let payload = secrets.get(&object).await.unwrap();
    let sealed = &payload.data.as_ref().unwrap()["payload"].0;
    let secret_half = token.split_once('.').unwrap().1.as_bytes();
    assert!(!sealed.windows(secret_half.len()).any(|w| w == secret_half));

    // RBAC: the machine's own token reads its payload; another machine's gets 403 on its
    // payload and on its report.
    let payload_path = format!("/api/v1/namespaces/kube-system/secrets/{object}");
    let report_path = format!("/api/v1/namespaces/kube-system/configmaps/bootplate-boot-{uid}");
    assert_eq!(get_as(env, ca_file, &token, &payload_path), "200");
    assert_eq!(get_as(env, ca_file, other_token, &payload_path), "403");
    assert_eq!(get_as(env, ca_file, other_token, &report_path), "403");

    // The stub, for real against the workload apiserver, up to running its payload: the test
    // keeps the decrypted payload and runs it with its paths moved.
    publish_cluster_info(env, ca).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (ok, err) = run_stub(&keeping_the_payload(&stub), root);
    assert!(ok, "the stub failed: {err}");
    let payload = std::fs::read_to_string(root.join("run/payload.sh")).unwrap();
    assert!(payload.contains(&token) && payload.starts_with("#!/bin/bash\n"));
    assert_eq!(
        machine_script::run_script(&payload, root),
        Some(machine_script::FAILING_STATUS)
    );
    let message = env.wait_reason(name, "BootFailed").await;
    assert!(message.contains("part `join`, command 0"), "{message}");

    // A token the apiserver refuses: the stub stops and says why.
    let refused = stub.replace(&token, &format!("{}.0000000000000000", &token[..6]));
    let (ok, err) = run_stub(&keeping_the_payload(&refused), root);
    assert!(!ok);
    assert!(
        err.contains("refused the bootstrap token (401): it expired or was deleted"),
        "{err}"
    );

    // The Machine joins: the payload's objects go with its token.
    env.set_node_ref(name).await;
    let roles = Api::<Role>::namespaced(env.workload_client.clone(), "kube-system");
    let bindings = Api::<RoleBinding>::namespaced(env.workload_client.clone(), "kube-system");
    eventually("the payload deleted after the join", WAIT, || async {
        let left = (
            secrets.get_opt(&object).await.unwrap(),
            roles.get_opt(&object).await.unwrap(),
            bindings.get_opt(&object).await.unwrap(),
        );
        matches!(left, (None, None, None)).then_some(())
    })
    .await;
}

/// Machine `name` (made by [`create_machine`], after [`check`] published `cluster-info`) whose
/// token expired before it booted: the stub stops with the 401 message and the config shows
/// `BootNotStarted` (the stub never got to the render and its reporter).
pub(super) async fn check_expired(env: &Env, name: &str) {
    env.wait_ready(name).await;
    let stub = env.user_data(name).await;
    let token = stub_value(&stub, "T");
    let id = token.split_once('.').unwrap().0;
    let expired = json!({"stringData": {"expiration": "2001-01-01T00:00:00Z"}});
    Api::<Secret>::namespaced(env.workload_client.clone(), "kube-system")
        .patch(
            &format!("bootstrap-token-{id}"),
            &PatchParams::default(),
            &Patch::Merge(&expired),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Were the token accepted, the render is kept, not run on this machine.
    let (ok, err) = run_stub(&keeping_the_payload(&stub), dir.path());
    assert!(!ok);
    assert!(
        err.contains("refused the bootstrap token (401): it expired or was deleted"),
        "{err}"
    );
    super::boot_report::provisioned_long_ago(env, name).await;
    let message = env.wait_reason(name, "BootNotStarted").await;
    assert!(
        message.contains(&format!("Machine {name} has not reported its boot")),
        "{message}"
    );
}
