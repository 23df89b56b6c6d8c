//! bootplate's configs and data Secrets, read as typed objects: what every tier waits for and
//! reads, whoever plays Cluster API ([`crate::capi_env::Env`] and [`crate::capi::CapiEnv`] call
//! these with their client, namespace and patience).

use std::time::Duration;

use crd_types::BootplateConfig;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::controller::ControllerProcess;
use crate::eventually;

/// The BootplateConfig `namespace/name` (which must exist).
pub async fn config(client: &Client, namespace: &str, name: &str) -> BootplateConfig {
    Api::<BootplateConfig>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap()
}

/// The Secret `namespace/name`, if it exists.
pub async fn secret(client: &Client, namespace: &str, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
}

/// The user-data (key `value`) of the data Secret `namespace/name`, which must exist.
pub async fn user_data(client: &Client, namespace: &str, name: &str) -> String {
    let secret = secret(client, namespace, name).await.expect("data secret");
    String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap()
}

/// Waits up to `wait` until config `namespace/name` is ready; returns it.
pub async fn wait_ready(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Duration,
) -> BootplateConfig {
    eventually(&format!("config {name} ready"), wait, || async {
        let config = config(client, namespace, name).await;
        config
            .status
            .as_ref()
            .is_some_and(|s| s.ready)
            .then_some(config)
    })
    .await
}

/// Waits up to `wait` until config `namespace/name`'s Ready condition has `reason`; returns
/// the condition's message.
pub async fn wait_reason(
    client: &Client,
    namespace: &str,
    (name, reason): (&str, &str),
    wait: Duration,
) -> String {
    let what = format!("config {name} with Ready reason {reason}");
    eventually(&what, wait, || async {
        let conditions = config(client, namespace, name).await.status?.conditions;
        conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.reason == reason)
            .map(|c| c.message)
    })
    .await
}

/// Returns once `controller` has reconciled config `namespace/name` as it is now (a no-op
/// annotation update triggers that reconcile): what it would do about the state so far, it has
/// done. Checks that something did not happen come after this, never after a fixed sleep.
pub async fn settled(
    client: &Client,
    controller: &ControllerProcess,
    namespace: &str,
    name: &str,
    wait: Duration,
) {
    let patch = serde_json::json!({"metadata": {"annotations": {
        "test.bootplate.dev/nudge": format!("{:?}", std::time::Instant::now()),
    }}});
    let nudged = Api::<BootplateConfig>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let version: u64 = nudged.resource_version().unwrap().parse().unwrap();
    eventually(
        &format!("config {name} reconciled at {version}"),
        wait,
        || async {
            controller
                .reconciled(namespace, name, version)
                .then_some(())
        },
    )
    .await;
}
