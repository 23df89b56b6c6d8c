//! A deleted config's bootstrap token and node payload go with it.
//!
//! Configs carry no finalizer (CAPI deletes a Machine's config and waits for it to be gone),
//! so the token of a Machine deleted before it joined (a scale-down, a MachineHealthCheck
//! remediation, a rollout) would otherwise stay valid in the workload cluster until it expires,
//! and the in-place payload of a joined one (its Secret, Role and RoleBinding, readable by any
//! later Node of the same name) would stay for good. The config watch reports each deletion it
//! sees, also one that a re-list reveals; this task deletes that config's tokens and payload
//! objects. A deletion that happened while no replica was running is not seen: its token
//! expires on its own (`--bootstrap-token-ttl`), and the workload cluster's token cleaner
//! removes it then; its payload objects go with their Node (an ownerReference), and the agent
//! of a later Node of that name refuses the payload (it is bound to the old Node's UID).
//!
//! A config whose labels stop matching `--watch-filter` or `--shard-selector` leaves the watch
//! the same way, though it still exists: another shard owns it now, and its token with it.
//! Before deleting, the task reads the config back (one request per deletion seen) and keeps
//! the tokens and payload of one that is still there with the same UID.

use std::sync::Arc;

use crd_types::BootplateConfig;
use crd_types::capi::CLUSTER_NAME_LABEL;
use kube::{Api, ResourceExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tracing::{info, warn};

use super::context::{Context, config_key};
use crate::core::footprint::Stage;
use crate::core::shard::{Departure, departure};
use crate::k8s::{footprint, node_payload};

/// What is left to know of a deleted config: where its tokens are and which are its.
#[derive(Debug)]
pub(crate) struct DeletedConfig {
    namespace: String,
    name: String,
    cluster: String,
    uid: String,
    key: String,
}

impl DeletedConfig {
    /// The deleted config's token location, when it names its Cluster (CAPI labels every
    /// config it adopts with the cluster's name; an unadopted config never had a token).
    pub(crate) fn of(config: &BootplateConfig) -> Option<DeletedConfig> {
        Some(DeletedConfig {
            namespace: config.namespace()?,
            name: config.name_any(),
            cluster: config.labels().get(CLUSTER_NAME_LABEL)?.clone(),
            uid: config.uid()?,
            key: config_key(config),
        })
    }
}

/// The channel deletions are reported on.
pub(crate) fn channel() -> (
    UnboundedSender<DeletedConfig>,
    UnboundedReceiver<DeletedConfig>,
) {
    tokio::sync::mpsc::unbounded_channel()
}

/// Deletes the tokens and node payload objects of each reported config, until the channel
/// closes. A workload cluster that cannot be reached is logged and left to the token's expiry
/// and the payload's Node.
pub(crate) async fn clean_up_deleted(
    ctx: Arc<Context>,
    mut deleted: UnboundedReceiver<DeletedConfig>,
) {
    while let Some(config) = deleted.recv().await {
        if still_here(&ctx, &config).await {
            info!(config = %config.key, "config left this controller's scope; its token and node payload stay");
            continue;
        }
        let workload = match ctx
            .workload_client(&config.namespace, &config.cluster)
            .await
        {
            Ok(workload) => workload,
            Err(e) => {
                warn!(config = %config.key, error = %e, "cannot reach the workload cluster of a deleted config; its token expires on its own, its node payload goes with its Node");
                continue;
            }
        };
        delete_tokens(&ctx, &config, &workload).await;
        delete_payload(&config, &workload).await;
    }
}

async fn delete_tokens(ctx: &Context, config: &DeletedConfig, workload: &kube::Client) {
    // What was made beside its token goes with it through the garbage collector.
    match footprint::tear_down(workload, &config.uid, Stage::Deleted).await {
        Ok(0) => {}
        Ok(count) => {
            for _ in 0..count {
                ctx.metrics.token("deleted");
            }
            info!(config = %config.key, "bootstrap token deleted: its config is gone");
        }
        Err(e) => warn!(
            config = %config.key,
            error = %e,
            "could not delete the token of a deleted config; it expires on its own"
        ),
    }
}

async fn delete_payload(config: &DeletedConfig, workload: &kube::Client) {
    match node_payload::delete_of_config(workload, &config.uid).await {
        Ok(0) => {}
        Ok(count) => info!(
            config = %config.key,
            objects = count,
            "node payload Secret, Role and RoleBinding deleted: their config is gone"
        ),
        Err(e) => warn!(
            config = %config.key,
            error = %e,
            "could not delete the node payload of a deleted config; it goes with its Node"
        ),
    }
}

/// Whether `config` still exists with the same UID (see the module documentation). When it
/// cannot be read, its token is kept: one kept too long expires on its own, where one deleted
/// under a config that merely moved to another shard would leave its Machine unable to join.
async fn still_here(ctx: &Context, config: &DeletedConfig) -> bool {
    let api = Api::<BootplateConfig>::namespaced(ctx.client.clone(), &config.namespace);
    match api.get_metadata_opt(&config.name).await {
        Ok(current) => {
            let current_uid = current.and_then(|c| c.metadata.uid);
            departure(&config.uid, current_uid.as_deref()) == Departure::LeftScope
        }
        Err(e) => {
            warn!(config = %config.key, error = %e, "cannot tell whether a config gone from the watch was deleted; its token is left to expire");
            true
        }
    }
}
