//! The clean-up once a config's Machine joined: its bootstrap token has served its purpose and
//! is deleted; the init lock, if this machine held it, is released. The data Secret stays as it
//! is. A failure here is logged, counted and retried, and never makes the config unready.
//!
//! Before the token goes, the machine's boot report is read a last time: a Node registers
//! during `kubeadm join`, before the boot's last steps and the report of its end (written
//! with the token), so a report that says the boot still runs holds the token back for a
//! short grace (`core::boot::LAST_REPORT_GRACE`).

use std::time::Duration;

use crd_types::BootplateConfig;
use crd_types::Role;
use crd_types::capi::{Cluster, Machine};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tracing::info;

use super::boot::{Looked, Subject};
use super::context::Context;
use crate::core::boot as core_boot;
use crate::core::footprint::Stage;
use crate::core::role;
use crate::core::token::{self, AfterJoin};
use crate::error::{Error, Result};
use crate::k8s::{footprint, init_lock};

/// What the clean-up found and did.
pub(crate) struct Joined {
    /// The role the config rendered.
    pub role: Role,
    /// The template revision rendered.
    pub revision: String,
    /// The last failure, when some clean-up is left for later.
    pub failure: Option<Error>,
    /// The in-place step (see `super::inplace`), when the template has `InPlace` parts.
    pub in_place: Option<super::inplace::InPlace>,
    /// The last look at the machine's boot report, before its token goes (boxed: rare, and
    /// larger than the rest).
    pub boot: Option<Box<(Subject, Looked)>>,
    /// How soon to look again while the token waits for the machine's last report.
    pub wait: Option<Duration>,
}

/// Cleans up after config `config` of a joined Machine of `cluster`.
pub(crate) async fn clean_up(
    ctx: &Context,
    config: &BootplateConfig,
    machine: &Machine,
    cluster: &Cluster,
    role: Role,
    revision: String,
) -> Joined {
    let uid = config.uid().unwrap_or_default();
    let mut failure = None;
    if role::release_init_lock(role, cluster.control_plane_initialized())
        && !ctx.lock_released(&uid)
    {
        match init_lock::release(&ctx.client, cluster).await {
            Ok(()) => ctx.mark_lock_released(&uid),
            Err(e) => failure = Some(e),
        }
    }
    let after = AfterJoin {
        role,
        deleted: ctx.tokens_deleted(&uid),
        known_expiry: super::render::last_render(ctx, config).and_then(|l| l.token_expires),
    };
    let (mut boot, mut wait) = (None, None);
    if token::may_be_live(after, Timestamp::now()) {
        let subject = super::render::joined_boot_subject(ctx, config, machine, cluster, role);
        if let Some(subject) = subject
            && let Some(looked) = super::boot::last_look(ctx, config, &subject).await
        {
            wait = core_boot::wait_for_last_report(&looked.view, ctx.joined_for(&uid));
            boot = Some(Box::new((subject, looked)));
        }
        if wait.is_none()
            && let Err(e) = delete_tokens(ctx, config, cluster, &uid).await
        {
            ctx.metrics.token("error");
            failure = Some(e);
        }
    }
    Joined {
        role,
        revision,
        failure,
        in_place: None,
        boot,
        wait,
    }
}

/// Deletes the config's tokens in the workload cluster: what was made for its machine (report,
/// grants, sealed render) goes with them through the garbage collector (`k8s::footprint`).
async fn delete_tokens(
    ctx: &Context,
    config: &BootplateConfig,
    cluster: &Cluster,
    uid: &str,
) -> Result<()> {
    let namespace = config.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let workload = ctx.workload_client(&namespace, &cluster_name).await?;
    let deleted = footprint::tear_down(&workload, uid, Stage::Joined)
        .await
        .map_err(|e| super::render::naming_workload(e, &namespace, &cluster_name))?;
    for _ in 0..deleted {
        ctx.metrics.token("deleted");
    }
    if deleted > 0 {
        info!(
            tokens = deleted,
            "bootstrap tokens deleted: the Machine has joined"
        );
    }
    ctx.mark_tokens_deleted(uid);
    Ok(())
}
