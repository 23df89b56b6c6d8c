//! In-place updates against a real workload apiserver (Node and RBAC authorization, as kubeadm
//! sets it up): bootplate publishes each node's payload Secret with the Role and RoleBinding
//! that let only that node read it, and bootplate-agent, with the node's own identity (a client
//! certificate for `system:node:<name>` in `system:nodes`, what a kubelet has), applies it into
//! a directory root with a recording systemctl stub and reports on its Node.
//!
//! The agent runs in-process (`agent::watch::Agent`, the code its binary's loop runs); the
//! Cluster API hooks that drive it in a cluster are not part of this test.

use crd_types::payload::{APPLIED_ANNOTATION, CONDITION_TYPE, NodePayload};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use testenv::agent::{NodeDisk, Workload};

fn payload(mirror: &str, command: &str) -> NodePayload {
    testenv::agent::configure_payload(mirror, command)
}

async fn workload(nodes: &[&str]) -> Workload {
    Workload::start(nodes).await.unwrap()
}

/// Publishes `payload` for Node `node` as bootplate does; returns its revision.
async fn publish(w: &Workload, node: &str, payload: &NodePayload) -> String {
    testenv::agent::publish(&w.admin, node, "config-uid", payload)
        .await
        .unwrap()
}

/// A directory root and a systemctl stub that logs its arguments there.
fn node_dir() -> (NodeDisk, agent::Node) {
    let disk = NodeDisk::new().unwrap();
    let node = disk.node();
    (disk, node)
}

#[tokio::test]
async fn a_node_reads_its_own_payload_and_no_other() {
    let w = workload(&["node-a", "node-b"]).await;
    publish(&w, "node-a", &payload("a", "true")).await;
    publish(&w, "node-b", &payload("b", "true")).await;
    let a = w.node_client("node-a").await.unwrap();
    testenv::agent::assert_reads_only_its_own_payload(a, "node-a", "node-b").await;
}

#[tokio::test]
async fn the_agent_applies_reports_puts_drift_back_and_reports_a_failed_step() {
    let w = workload(&["node-a"]).await;
    let (dir, node) = node_dir();
    let agent = agent::watch::Agent {
        identity: w.node_client("node-a").await.unwrap().into(),
        node_name: "node-a".into(),
        node: node.clone(),
    };
    assert_eq!(agent.pass().await.unwrap(), agent::watch::Pass::NoPayload);

    let first = payload("a", "true");
    let revision = publish(&w, "node-a", &first).await;
    assert_eq!(
        agent.pass().await.unwrap(),
        agent::watch::Pass::Applied(revision.clone())
    );
    let file = node.path("/etc/containerd/mirror.toml");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a");
    let nodes: Api<Node> = Api::all(w.admin.clone());
    let reported = nodes.get("node-a").await.unwrap();
    assert_eq!(
        reported.metadata.annotations.as_ref().unwrap()[APPLIED_ANNOTATION],
        revision
    );
    let condition = |node: &Node| {
        let conditions = node.status.as_ref().unwrap().conditions.as_ref().unwrap();
        let c = conditions
            .iter()
            .find(|c| c.type_ == CONDITION_TYPE)
            .unwrap();
        (c.status.clone(), c.message.clone().unwrap_or_default())
    };
    assert_eq!(condition(&reported).0, "True");

    // Drift: the file edited by hand is put back on the next pass.
    std::fs::write(&file, "edited").unwrap();
    agent.pass().await.unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a");

    // A new payload whose command fails: the Node says which part and step, and the new file
    // is whole.
    let failing = payload("b", "echo no mirror >&2; exit 4");
    let new_revision = publish(&w, "node-a", &failing).await;
    let pass = agent.pass().await.unwrap();
    let agent::watch::Pass::Failed(message) = pass else {
        panic!("the failing command was not reported: {pass:?}");
    };
    assert!(
        message.starts_with(&format!(
            "revision {new_revision} failed: part `configure`: command 0: exit status: 4"
        )),
        "{message}"
    );
    let reported = nodes.get("node-a").await.unwrap();
    assert_eq!(condition(&reported), ("False".to_owned(), message));
    assert_eq!(
        reported.metadata.annotations.as_ref().unwrap()[APPLIED_ANNOTATION],
        revision,
        "the applied revision stays the last one that succeeded"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "b");
    assert_eq!(
        dir.take_systemctl_calls(),
        [
            "enable containerd.service",
            "restart containerd.service",
            "restart containerd.service",
            "restart containerd.service"
        ],
        "enabled once, restarted for each change of its part's file (drift included)"
    );
}
