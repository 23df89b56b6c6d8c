//! A test-only MachinePool infrastructure provider: `DevMachinePool` plays an autoscaling group
//! (a VM scale set). Like a real one it reads the pool's data Secret whenever it starts an
//! instance, so an instance started late boots from whatever the Secret holds then; each
//! instance's kubelet joins with the token in its user-data, authenticating to the real workload
//! apiserver, and registers its Node with the instance's provider ID.
//!
//! Deleting a DevMachinePool terminates its instances: its finalizer holds it until the cloud
//! deleted their Nodes, as a cloud's node lifecycle controller deletes the Nodes of instances
//! that are gone (Cluster API deletes only the Nodes a pool no longer lists).
//!
//! It writes only its own kind (its `spec.providerIDList`, its status) and Nodes. It follows the
//! infrastructure MachinePool contract Cluster API v1.14 reads: `status.ready` (and
//! `status.initialization.provisioned`), `spec.providerIDList`, `status.replicas`. It reports no
//! `status.infrastructureMachineKind`, so Cluster API makes no Machines for the instances.
//!
//! What every instance saw at boot is recorded in `status.instances` ([`Instance`]) for the
//! scenarios to check: the token it got, whether that token's Secret existed and when it
//! expired, and whom the workload apiserver took the token for.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::boot::{self, join_token};
use super::cloud::{self, CloudConfig, INFRA_GROUP, capi_resource};

/// How often an instance whose join was refused is started again (from the Secret as it is
/// then), as an autoscaling group replaces an instance that failed its health check.
const BOOT_ATTEMPTS: u32 = 3;
/// The finalizer that holds a deleted DevMachinePool until its instances are terminated.
const FINALIZER: &str = "infrastructure.test.bootplate.dev/instances";

/// What one instance of a pool saw when it booted, as the cloud records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The instance's name (also its Node's).
    pub name: String,
    /// Its provider ID, listed in the DevMachinePool's `spec.providerIDList`.
    pub provider_id: String,
    /// When it booted (RFC 3339).
    pub booted_at: String,
    /// The ID of the join token in the user-data it booted from.
    pub token_id: String,
    /// The `expiration` of that token's Secret in the workload cluster at boot; `None` when no
    /// such Secret existed.
    pub token_expiration: Option<String>,
    /// The user the workload apiserver authenticated the token as (`system:bootstrap:<id>`);
    /// `None` when it refused the token.
    pub authenticated_as: Option<String>,
    /// How many starts it took.
    pub attempts: u32,
}

/// The instances a DevMachinePool's status records.
pub fn instances(pool: &DynamicObject) -> Vec<Instance> {
    serde_json::from_value(pool.data["status"]["instances"].clone()).unwrap_or_default()
}

/// One pass over every DevMachinePool: starts one instance where the MachinePool wants more
/// (one per pass: instances of a real group boot one after another, not in one instant) and
/// forgets the last ones where it wants fewer.
pub(super) async fn scale_pools(config: &CloudConfig) -> anyhow::Result<()> {
    let all = cloud::api_all(&config.management, INFRA_GROUP, "DevMachinePool");
    for pool in all.list(&ListParams::default()).await? {
        if pool.metadata.deletion_timestamp.is_none() {
            scale_pool(config, &pool).await?;
        } else {
            terminate(config, &pool).await?;
        }
    }
    Ok(())
}

/// A deleted DevMachinePool's instances are terminated: their Nodes go, then the finalizer.
async fn terminate(config: &CloudConfig, pool: &DynamicObject) -> anyhow::Result<()> {
    if !pool.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let nodes: Api<Node> = Api::all(config.workload.clone());
    for instance in instances(pool) {
        match nodes.delete(&instance.name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    set_finalizers(config, pool, |f| f != FINALIZER).await
}

/// Keeps the finalizers of `pool` that `keep` accepts, and ours when `keep` accepts it.
async fn set_finalizers(
    config: &CloudConfig,
    pool: &DynamicObject,
    keep: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let mut finalizers: Vec<String> = pool
        .finalizers()
        .iter()
        .filter(|f| keep(f))
        .cloned()
        .collect();
    if keep(FINALIZER) && !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_owned());
    }
    let api = scale_sets(config, pool);
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": pool.resource_version(),
    }});
    api.patch(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

async fn scale_pool(config: &CloudConfig, pool: &DynamicObject) -> anyhow::Result<()> {
    let Some(owner) = cloud::owner(pool, "MachinePool") else {
        return Ok(());
    };
    if !pool.finalizers().iter().any(|f| f == FINALIZER) {
        return set_finalizers(config, pool, |_| true).await;
    }
    let namespace = pool.namespace().unwrap_or_default();
    let machine_pools: Api<DynamicObject> = Api::namespaced_with(
        config.management.clone(),
        &namespace,
        &capi_resource("MachinePool", "machinepools"),
    );
    let Some(machine_pool) = machine_pools.get_opt(&owner.name).await? else {
        return Ok(());
    };
    // The scale set exists once its launch configuration (the user-data) does.
    let Some(data_secret) =
        machine_pool.data["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"].as_str()
    else {
        return Ok(());
    };
    let wanted = machine_pool.data["spec"]["replicas"].as_u64().unwrap_or(0) as usize;
    let mut instances = instances(pool);
    let started = pool.data["status"]["started"].as_u64().unwrap_or(0);
    let mut started_now = 0;
    if instances.len() < wanted {
        let name = format!("{}-{started}", pool.name_any());
        if let Some(instance) = boot(config, &namespace, data_secret, &name).await? {
            instances.push(instance);
            started_now = 1;
        }
    }
    instances.truncate(wanted);
    let already = pool.data["status"]["ready"] == json!(true) && started_now == 0;
    if already && instances == self::instances(pool) {
        return Ok(());
    }
    report(config, pool, &instances, started + started_now).await
}

/// The DevMachinePools of `pool`'s namespace.
fn scale_sets(config: &CloudConfig, pool: &DynamicObject) -> Api<DynamicObject> {
    let namespace = pool.namespace().unwrap_or_default();
    cloud::api(
        &config.management,
        &namespace,
        INFRA_GROUP,
        "DevMachinePool",
    )
}

/// Writes the DevMachinePool's provider IDs and status.
async fn report(
    config: &CloudConfig,
    pool: &DynamicObject,
    instances: &[Instance],
    started: u64,
) -> anyhow::Result<()> {
    let api = scale_sets(config, pool);
    let provider_ids: Vec<&str> = instances.iter().map(|i| i.provider_id.as_str()).collect();
    api.patch(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"providerIDList": provider_ids}})),
    )
    .await?;
    cloud::patch_status(
        &api,
        &pool.name_any(),
        json!({
            "ready": true,
            "initialization": {"provisioned": true},
            "replicas": instances.len(),
            "started": started,
            "instances": instances,
        }),
    )
    .await
}

/// Boots instance `name` from data Secret `data_secret`: reads its user-data, looks at the
/// join token's Secret in the workload cluster, and joins, which here means authenticating
/// with the token and registering the Node. An instance whose token is refused starts again
/// from the Secret as it is then, [`BOOT_ATTEMPTS`] times; its record says what the last start
/// saw. `None` when the Secret holds no user-data.
async fn boot(
    config: &CloudConfig,
    namespace: &str,
    data_secret: &str,
    name: &str,
) -> anyhow::Result<Option<Instance>> {
    let secrets: Api<Secret> = Api::namespaced(config.management.clone(), namespace);
    let tokens: Api<Secret> = Api::namespaced(config.workload.clone(), "kube-system");
    for attempt in 1..=BOOT_ATTEMPTS {
        let booted_at = k8s_openapi::jiff::Timestamp::now().to_string();
        let user_data = secrets
            .get_opt(data_secret)
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get("value").map(|v| v.0.clone()));
        let Some(user_data) = user_data.filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let token = join_token(&String::from_utf8(user_data)?)
            .with_context(|| format!("no join token in the user-data of Secret {data_secret}"))?;
        let token_id = token
            .split_once('.')
            .map(|(id, _)| id.to_owned())
            .unwrap_or_default();
        let token_expiration = tokens
            .get_opt(&format!("bootstrap-token-{token_id}"))
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get("expiration").map(|v| v.0.clone()))
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let authenticated_as = boot::authenticate(config, &token).await;
        if authenticated_as.is_none() && attempt < BOOT_ATTEMPTS {
            // The apiserver's token cache may not hold a token created a moment ago.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let provider_id = format!("dev-pool:///{namespace}/{name}");
        if authenticated_as.is_some() {
            let nodes: Api<Node> = Api::all(config.workload.clone());
            cloud::register_node(&nodes, name, &provider_id, config.cordon_nodes).await?;
        }
        return Ok(Some(Instance {
            name: name.to_owned(),
            provider_id,
            booted_at,
            token_id,
            token_expiration,
            authenticated_as,
            attempts: attempt,
        }));
    }
    unreachable!("the last attempt returns")
}
