//! A node's in-place payload (its Secret, Role and RoleBinding in the workload cluster) against
//! a reused node name: clouds name nodes after their private addresses, so the next Node called
//! `ip-10-0-0-7` may belong to another Machine, and RBAC grants the payload to
//! `system:node:<name>`, by name. The payload may hold a control-plane machine's keys and is
//! applied as root.
//!
//! (a) The controller (`bootplate run` under deploy/rbac, against a real management and workload
//! apiserver) deletes a config's payload objects once the config is deleted, and only that
//! config's. (b) bootplate-agent, with the identity of a Node re-created under the same name
//! (a new UID), refuses the old payload before the workload cluster's garbage collector removes
//! it, and can no longer read it after (the objects name the old Node as their owner).
//!
//! This module plays Cluster API's Machine controller and the kubelet (`testenv::capi_env`:
//! owner references, an initialized Cluster, a nodeRef set when the test's Node exists): (b)
//! needs a Node deleted and re-created under the same name with a new UID at a moment the test
//! chooses, between the payload's publication and the agent's read, which neither Cluster API
//! nor the test cloud produces on demand.

use std::time::Duration;

use crd_types::payload::{
    NODE_KEY, NodeBinding, NodePayload, PayloadFile, PayloadPart, secret_name,
};
use crd_types::{BootplateConfig, ClusterBootstrapTemplate};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use testenv::agent::NodeDisk;
use testenv::capi_env::{self, NS, WAIT, cluster_template};
use testenv::pki::TestCa;
use testenv::{ApiServer, eventually};

const FILE: &str = "/etc/bootplate-demo.conf";

/// A template whose one part is updated in place.
async fn publish_in_place_template(client: &Client) {
    let template: ClusterBootstrapTemplate = serde_json::from_value(json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "ClusterBootstrapTemplate",
        "metadata": {"name": "inplace"},
        "spec": {
            "os": {"name": "linux"},
            "format": "cloud-config",
            "parts": [{
                "name": "configure",
                "update": "InPlace",
                "files": [{"path": FILE, "content": "machine {{machine.name}}\n"}],
            }],
        },
    }))
    .unwrap();
    Api::<ClusterBootstrapTemplate>::all(client.clone())
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

async fn create_node(client: &Client, name: &str, provider_id: &str) -> Node {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"providerID": provider_id},
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
}

/// Whether node `node`'s payload Secret, Role and RoleBinding exist, in that order.
async fn payload_objects(workload: &Client, node: &str) -> [bool; 3] {
    let name = secret_name(node);
    let secret = Api::<Secret>::namespaced(workload.clone(), "kube-system")
        .get_opt(&name)
        .await
        .unwrap();
    let role = Api::<Role>::namespaced(workload.clone(), "kube-system")
        .get_opt(&name)
        .await
        .unwrap();
    let binding = Api::<RoleBinding>::namespaced(workload.clone(), "kube-system")
        .get_opt(&name)
        .await
        .unwrap();
    [secret.is_some(), role.is_some(), binding.is_some()]
}

/// The binding recorded in node `node`'s payload Secret.
async fn recorded_binding(workload: &Client, node: &str) -> NodeBinding {
    let secret = Api::<Secret>::namespaced(workload.clone(), "kube-system")
        .get(&secret_name(node))
        .await
        .unwrap();
    let data = secret.data.unwrap_or_default();
    NodeBinding::read(
        &secret_name(node),
        data.get(NODE_KEY).map(|b| b.0.as_slice()),
    )
    .unwrap()
}

/// Creates Machine `name` (a worker) with its config, waits until it is ready, then gives it
/// a Node of that name, marks the config as Cluster API does when it updates the machine in
/// place (the payload is published only then) and waits until the controller published the
/// Node's payload.
async fn joined_with_payload(env: &capi_env::Env, name: &str) -> Node {
    env.machine("c1", name, false, cluster_template("inplace"))
        .await;
    env.wait_ready(name).await;
    let node = create_node(&env.workload_client, name, &format!("test:///{name}")).await;
    env.set_node_ref(name).await;
    let mark = json!({"metadata": {"annotations": {
        crd_types::capi::UPDATE_IN_PROGRESS_ANNOTATION: "",
    }}});
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .unwrap();
    eventually(
        &format!("the payload of {name} published"),
        WAIT,
        || async {
            let config = env.config(name).await;
            let status = config.status?.in_place?;
            status.published_revision.map(|_| ())
        },
    )
    .await;
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_configs_node_payload_role_and_binding_are_deleted_and_no_other() {
    let env = capi_env::env().await;
    publish_in_place_template(&env.client).await;
    env.initialized_cluster("c1").await;
    let _controller = env.controller(&[]).await;
    let gone = joined_with_payload(&env, "ip-10-0-0-7").await;
    let kept = joined_with_payload(&env, "ip-10-0-0-8").await;
    let workload = &env.workload_client;
    assert_eq!(payload_objects(workload, "ip-10-0-0-7").await, [true; 3]);
    let bound = recorded_binding(workload, "ip-10-0-0-7").await;
    assert_eq!(
        (bound.uid.as_str(), bound.provider_id.as_deref()),
        (gone.uid().unwrap().as_str(), Some("test:///ip-10-0-0-7")),
        "the payload records the Node it is for"
    );

    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .delete("ip-10-0-0-7", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the deleted config's payload Secret, Role and RoleBinding gone",
        WAIT,
        || async { (payload_objects(workload, "ip-10-0-0-7").await == [false; 3]).then_some(()) },
    )
    .await;
    assert_eq!(
        payload_objects(workload, "ip-10-0-0-8").await,
        [true; 3],
        "another config's payload stays"
    );
    assert_eq!(
        recorded_binding(workload, "ip-10-0-0-8").await.uid,
        kept.uid().unwrap()
    );
}

fn payload() -> NodePayload {
    NodePayload {
        parts: vec![PayloadPart {
            name: "configure".into(),
            files: vec![PayloadFile {
                path: FILE.into(),
                permissions: "0600".into(),
                owner: "root:root".into(),
                content: b"control-plane key material\n".to_vec(),
            }],
            commands: vec!["touch \"$BOOTPLATE_ROOT/ran\"".into()],
            ..Default::default()
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_recreated_under_the_same_name_neither_applies_nor_reads_the_old_payload() {
    let ca = TestCa::new("workload-ca");
    let apiserver = ApiServer::start_for_joins(&ca).await.unwrap();
    let admin = apiserver.client().await.unwrap();
    let name = "ip-10-0-0-7";
    create_node(&admin, name, "test:///i-old").await;
    testenv::agent::publish(&admin, name, "old-config-uid", &payload())
        .await
        .unwrap();

    // The Node is deleted and another machine registers under the same name.
    Api::<Node>::all(admin.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let new = create_node(&admin, name, "test:///i-new").await;
    let disk = NodeDisk::new().unwrap();
    let agent = agent::watch::Agent {
        identity: testenv::agent::node_client(apiserver.port(), &ca, name)
            .await
            .unwrap()
            .into(),
        node_name: name.into(),
        node: disk.node(),
    };
    let pass = agent.pass().await.unwrap();
    let agent::watch::Pass::Failed(message) = pass else {
        panic!("the new Node applied the old Node's payload: {pass:?}");
    };
    assert!(
        message.contains("uid") && message.contains(&new.uid().unwrap()),
        "{message}"
    );
    assert!(
        !disk.path(FILE).exists(),
        "the old payload's file was written"
    );
    assert!(!disk.path("/ran").exists(), "the old payload's command ran");

    // The workload cluster's garbage collector removes what the old Node owned: the new Node
    // cannot even read it any more.
    let _collector = testenv::capi::garbage_collector::start(&apiserver, &admin)
        .await
        .unwrap();
    eventually(
        "the old Node's payload objects collected",
        Duration::from_secs(120),
        || async { (payload_objects(&admin, name).await == [false; 3]).then_some(()) },
    )
    .await;
    assert_eq!(agent.pass().await.unwrap(), agent::watch::Pass::NoPayload);

    // Published for the new Node, the payload applies.
    testenv::agent::publish(&admin, name, "new-config-uid", &payload())
        .await
        .unwrap();
    let pass = agent.pass().await.unwrap();
    assert!(matches!(pass, agent::watch::Pass::Applied(_)), "{pass:?}");
    assert_eq!(
        std::fs::read(disk.path(FILE)).unwrap(),
        b"control-plane key material\n"
    );
}
