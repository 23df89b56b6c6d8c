//! A deleted config's bootstrap token goes with it.
//!
//! Configs carry no finalizer (CAPI deletes a Machine's config and waits for it to be gone),
//! so the token of a Machine deleted before it joined (a scale-down, a MachineHealthCheck
//! remediation, a rollout) would otherwise stay valid in the workload cluster until it expires.
//! The config watch reports each deletion it sees, also one that a re-list reveals; this task
//! deletes that config's tokens. A deletion that happened while no replica was running is not
//! seen: its token expires on its own (`--bootstrap-token-ttl`), and the workload cluster's
//! token cleaner removes it then.

use std::sync::Arc;

use crd_types::BootplateConfig;
use crd_types::capi::CLUSTER_NAME_LABEL;
use kube::ResourceExt;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tracing::{info, warn};

use crate::context::Context;
use crate::token;

/// What is left to know of a deleted config: where its tokens are and which are its.
#[derive(Debug)]
pub struct DeletedConfig {
    namespace: String,
    cluster: String,
    uid: String,
    key: String,
}

impl DeletedConfig {
    /// The deleted config's token location, when it names its Cluster (CAPI labels every
    /// config it adopts with the cluster's name; an unadopted config never had a token).
    pub fn of(config: &BootplateConfig) -> Option<DeletedConfig> {
        Some(DeletedConfig {
            namespace: config.namespace()?,
            cluster: config.labels().get(CLUSTER_NAME_LABEL)?.clone(),
            uid: config.uid()?,
            key: crate::config_controller::key(config),
        })
    }
}

/// The channel deletions are reported on.
pub fn channel() -> (
    UnboundedSender<DeletedConfig>,
    UnboundedReceiver<DeletedConfig>,
) {
    tokio::sync::mpsc::unbounded_channel()
}

/// Deletes the tokens of each reported config, until the channel closes. A workload cluster
/// that cannot be reached is logged and left to the token's expiry.
pub async fn delete_tokens(ctx: Arc<Context>, mut deleted: UnboundedReceiver<DeletedConfig>) {
    while let Some(config) = deleted.recv().await {
        let workload = ctx
            .workloads
            .client(
                &ctx.client,
                &ctx.stores,
                &config.namespace,
                &config.cluster,
                ctx.settings.workload_timeout,
            )
            .await;
        let result = match workload {
            Ok(workload) => token::delete(&workload, &config.uid).await,
            Err(e) => Err(e),
        };
        match result {
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
}
