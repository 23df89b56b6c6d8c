//! The node agent's side of the node boundary, against a real workload apiserver (Node and RBAC
//! authorization, as kubeadm sets one up), with the agent in-process and the node's own
//! identity: what a failed step puts on the Node (which anyone who can read Nodes sees), that a
//! failed restart keeps the Node not-Applied until the restart succeeds, and that a rotated
//! kubelet client certificate is used once the old one expires.
//!
//! What the agent does on the node's disk as root (links, directories others can change,
//! temporary files, setuid modes, time-outs, back-off) is tested without a cluster in
//! `agent/tests/links.rs` and `agent/tests/apply.rs`.

use std::time::{Duration, SystemTime};

use agent::identity::Identity;
use agent::watch::{Agent, Pass};
use crd_types::payload::{APPLIED_ANNOTATION, CONDITION_TYPE, NodePayload};
use k8s_openapi::api::core::v1::Node;
use testenv::agent::{NodeDisk, Workload};

fn payload(command: &str) -> NodePayload {
    testenv::agent::configure_payload("mirror", command)
}

/// The Node's `BootplateApplied` condition (status, reason, message) and applied revision.
async fn reported(w: &Workload, node: &str) -> ((String, String, String), Option<String>) {
    let node = kube::Api::<Node>::all(w.admin.clone())
        .get(node)
        .await
        .unwrap();
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    let c = (conditions.into_iter())
        .find(|c| c.type_ == CONDITION_TYPE)
        .expect("the agent reported a condition");
    let annotation = (node.metadata.annotations).and_then(|mut a| a.remove(APPLIED_ANNOTATION));
    (
        (
            c.status,
            c.reason.unwrap_or_default(),
            c.message.unwrap_or_default(),
        ),
        annotation,
    )
}

async fn agent_for(w: &Workload, node: &str, disk: &NodeDisk) -> Agent {
    Agent {
        identity: w.node_client(node).await.unwrap().into(),
        node_name: node.into(),
        node: disk.node(),
    }
}

#[tokio::test]
async fn what_a_failing_command_prints_reaches_the_node_only_as_a_redacted_tail() {
    let w = Workload::start(&["node-a"]).await.unwrap();
    let disk = NodeDisk::new().unwrap();
    let agent = agent_for(&w, "node-a", &disk).await;
    let leaky = payload(
        "cat /etc/hostname >&2; \
         echo 'kubeadm join --token abcdef.0123456789abcdef --password=hunter2 failed' >&2; exit 2",
    );
    let revision = testenv::agent::publish(&w.admin, "node-a", "config-uid", &leaky)
        .await
        .unwrap();
    let Pass::Failed(message) = agent.pass().await.unwrap() else {
        panic!("the failing command was not reported");
    };
    let ((status, reason, on_node), _) = reported(&w, "node-a").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "ApplyFailed"));
    assert_eq!(on_node, message);
    assert_eq!(
        on_node,
        format!(
            "revision {revision} failed: part `configure`: command 0: exit status: 2: \
             kubeadm join --token [redacted] --password=[redacted] failed \
             (attempt 1; next attempt in 30s)"
        )
    );
    for secret in ["abcdef.0123456789abcdef", "0123456789abcdef", "hunter2"] {
        assert!(
            !on_node.contains(secret),
            "{secret} reached the Node: {on_node}"
        );
    }
}

#[tokio::test]
async fn a_failed_restart_keeps_the_node_not_applied_until_it_succeeds() {
    let w = Workload::start(&["node-a"]).await.unwrap();
    let disk = NodeDisk::new().unwrap();
    disk.fail_systemctl_on("restart containerd.service")
        .unwrap();
    let agent = agent_for(&w, "node-a", &disk).await;
    let revision = testenv::agent::publish(&w.admin, "node-a", "config-uid", &payload("true"))
        .await
        .unwrap();
    let want_failure = format!(
        "revision {revision} failed: part `configure`: systemctl restart containerd.service: \
         exit status: 1: unit failed"
    );
    assert_eq!(
        agent.pass().await.unwrap(),
        Pass::Failed(want_failure.clone())
    );
    assert_eq!(
        disk.take_systemctl_calls(),
        ["enable containerd.service", "restart containerd.service"]
    );
    // The file is in place now and unchanged on the next pass; the restart is still owed.
    assert_eq!(
        agent.pass().await.unwrap(),
        Pass::Failed(want_failure.clone())
    );
    assert_eq!(disk.take_systemctl_calls(), ["restart containerd.service"]);
    let ((status, _, message), applied) = reported(&w, "node-a").await;
    assert_eq!((status.as_str(), message), ("False", want_failure));
    assert_eq!(applied, None, "no revision is reported applied");

    disk.fail_systemctl_on("").unwrap();
    assert_eq!(agent.pass().await.unwrap(), Pass::Applied(revision.clone()));
    assert_eq!(disk.take_systemctl_calls(), ["restart containerd.service"]);
    let ((status, reason, _), applied) = reported(&w, "node-a").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Applied"));
    assert_eq!(applied, Some(revision));
}

/// Writes a kubeconfig at `dir/kubelet.conf` that names its client certificate and key by
/// path, as a kubelet's does, and that pair (`leaf`) at those paths.
fn write_kubelet_conf(dir: &std::path::Path, w: &Workload, leaf: &testenv::pki::Leaf) {
    use base64::Engine as _;
    // Replaced as the kubelet replaces its certificate: a new file renamed over the old one.
    for (name, pem) in [
        ("client.crt", &leaf.cert_pem),
        ("client.key", &leaf.key_pem),
    ] {
        std::fs::write(dir.join(format!("{name}.new")), pem).unwrap();
        std::fs::rename(dir.join(format!("{name}.new")), dir.join(name)).unwrap();
    }
    let ca = base64::engine::general_purpose::STANDARD.encode(&w.ca.cert_pem);
    let conf = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: w\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority-data: {ca}\nusers:\n- name: n\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: c\n  context: {{cluster: w, user: n}}\ncurrent-context: c\n",
        w.apiserver.port(),
        dir.join("client.crt").display(),
        dir.join("client.key").display(),
    );
    std::fs::write(dir.join("kubelet.conf"), conf).unwrap();
}

#[tokio::test]
async fn a_rotated_client_certificate_is_used_once_the_old_one_expires() {
    let w = Workload::start(&["node-a"]).await.unwrap();
    let disk = NodeDisk::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let revision = testenv::agent::publish(&w.admin, "node-a", "config-uid", &payload("true"))
        .await
        .unwrap();
    let expires = SystemTime::now() + Duration::from_secs(15);
    let first = (w.ca).client_expiring("system:node:node-a", "system:nodes", Some(expires));
    write_kubelet_conf(dir.path(), &w, &first);
    let agent = Agent {
        identity: Identity::kubeconfig(dir.path().join("kubelet.conf")),
        node_name: "node-a".into(),
        node: disk.node(),
    };
    assert_eq!(agent.pass().await.unwrap(), Pass::Applied(revision.clone()));

    // The kubelet rotates its certificate; the old one then expires.
    let rotated = (w.ca).client("system:node:node-a", "system:nodes");
    write_kubelet_conf(dir.path(), &w, &rotated);
    let wait = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_secs(2)).await;
    let pass = agent.pass().await;
    assert_eq!(
        pass.as_ref().map_err(ToString::to_string),
        Ok(&Pass::Applied(revision)),
        "the pass after the old certificate expired"
    );
}
