//! Reconciles `BootplateConfig`s: renders the referenced template for the owner Machine into
//! the data Secret, following the Cluster API bootstrap provider contract.
//!
//! A reconcile gathers the facts (caches first, the apiserver when it must), asks the core
//! what they mean, and acts: the render path is in `render`, the clean-up once the Machine
//! joined in `joined`; this module reports the result in the status, an Event and the metrics.

use std::sync::Arc;
use std::time::Instant;

use crd_types::{BootplateConfig, BootplateConfigStatus, Role};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, warn};

use super::boot;
use super::context::{Context, Topic, config_key};
use super::joined::{self, Joined};
use super::render::{self, Rendered, Subject};
use crate::core::blocked::Blocked;
use crate::core::boot::View;
use crate::core::gate::{self, Owner, Path};
use crate::core::network;
use crate::core::outcome::{self, ConfigState};
use crate::core::status::{self, ConfigId, ReadyFacts};
use crate::core::token;
use crate::error::{Error, Result};

/// Reconciles one config.
pub(crate) async fn reconcile(config: Arc<BootplateConfig>, ctx: Arc<Context>) -> Result<Action> {
    ctx.synced().await;
    let started = Instant::now();
    let key = config_key(&config);
    if config.meta().deletion_timestamp.is_some() {
        // The data Secret goes with its owner; the token expires by its TTL.
        ctx.metrics.config_deleted(&key);
        if let Some(uid) = config.uid() {
            ctx.forget_config(&uid);
        }
        return Ok(Action::await_change());
    }
    let created = config.meta().creation_timestamp.as_ref().map(|t| t.0);
    let result = reconcile_config(&config, &ctx).await;
    if let (Ok(_), Some(uid)) = (&result, config.uid()) {
        ctx.failures.succeeded(&uid);
    }
    let label = match &result {
        Ok((_, state)) => {
            ctx.metrics.config_state(&key, *state, created);
            state.as_str()
        }
        Err(_) => "error",
    };
    ctx.metrics.reconciled("config", label, started.elapsed());
    // One line per reconcile, naming the object version it saw: tests wait for it before
    // checking that nothing happened, and operators can follow one config through the log.
    let version = config.resource_version().unwrap_or_default();
    debug!(config = %key, resource_version = %version, result = label, "config reconciled");
    result.map(|(action, _)| action)
}

/// Transient errors: retry with a delay that doubles per consecutive failure.
pub(crate) fn error_policy(
    config: Arc<BootplateConfig>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let retry_in = match config.uid() {
        Some(uid) => ctx.failures.failed(&uid, || ctx.live_configs()),
        None => super::retry::FIRST,
    };
    warn!(config = %config_key(&config), %error, ?retry_in, "reconcile failed; retrying");
    Action::requeue(retry_in)
}

/// Where a config's reconcile ended.
enum Done {
    Rendered(Rendered),
    Joined(Joined),
}

async fn reconcile_config(
    config: &BootplateConfig,
    ctx: &Context,
) -> Result<(Action, ConfigState)> {
    let previous = config.status.clone().unwrap_or_default();
    match next_step(config, ctx, &previous).await {
        Ok(Done::Rendered(done)) => report_rendered(ctx, config, &previous, done).await,
        Ok(Done::Joined(joined)) => report_joined(ctx, config, &previous, joined).await,
        Err(Error::Blocked(why)) => report_blocked(ctx, config, &previous, why).await,
        Err(e) => Err(e),
    }
}

/// Finds the config's owner and Cluster in the caches and goes the way the core says: a
/// Machine's config renders until the Machine joined, then is frozen; a MachinePool's renders
/// for as long as the pool exists.
async fn next_step(
    config: &BootplateConfig,
    ctx: &Context,
    previous: &BootplateConfigStatus,
) -> Result<Done> {
    let namespace = &config.namespace().unwrap_or_default();
    let name = &config.name_any();
    match gate::owner(config) {
        Some(Owner::Machine(owner)) => {
            let machine = ctx.stores.machine(namespace, &owner);
            let machine = gate::owner_found("Machine", namespace, &owner, machine)?;
            let cluster = cluster_of(
                ctx,
                namespace,
                gate::OwnerName {
                    kind: "Machine",
                    name: &owner,
                },
                &machine.spec.cluster_name,
            )?;
            let secret = ctx.stores.secret(namespace, name);
            let adopt = gate::adoptable(config, &machine, secret.as_deref());
            match gate::path(config, previous, &machine, &cluster, adopt)? {
                Path::Frozen { role, revision } => {
                    let mut joined =
                        joined::clean_up(ctx, config, &machine, &cluster, role, revision).await;
                    match super::inplace::sync(ctx, config, &machine, &cluster, role).await {
                        Ok(in_place) => joined.in_place = in_place,
                        Err(e) => joined.failure = Some(e),
                    }
                    Ok(Done::Joined(joined))
                }
                Path::Render => {
                    render::render(ctx, config, previous, Subject::Machine(&machine), &cluster)
                        .await
                        .map(Done::Rendered)
                }
            }
        }
        Some(Owner::Pool(owner)) => {
            let pool = ctx.stores.machine_pool(namespace, &owner);
            let pool = gate::owner_found("MachinePool", namespace, &owner, pool)?;
            let cluster = cluster_of(
                ctx,
                namespace,
                gate::OwnerName {
                    kind: "MachinePool",
                    name: &owner,
                },
                &pool.spec.cluster_name,
            )?;
            gate::pool_path(config, &cluster)?;
            render::render(ctx, config, previous, Subject::Pool(&pool), &cluster)
                .await
                .map(Done::Rendered)
        }
        None => {
            let cluster = ctx.stores.cluster_of_unadopted(config);
            let cluster = cluster
                .as_ref()
                .map(|c| (c.meta().name.as_deref().unwrap_or_default(), c.is_paused()));
            Err(gate::unadopted(config, cluster).into())
        }
    }
}

/// The Cluster `cluster_name` of `owner`, from the cache.
fn cluster_of(
    ctx: &Context,
    namespace: &str,
    owner: gate::OwnerName<'_>,
    cluster_name: &str,
) -> Result<std::sync::Arc<crd_types::capi::Cluster>> {
    let cluster = ctx.stores.cluster(namespace, cluster_name);
    Ok(gate::cluster_found(
        namespace,
        owner,
        cluster_name,
        cluster,
    )?)
}

async fn report_rendered(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    done: Rendered,
) -> Result<(Action, ConfigState)> {
    let looked = match &done.boot {
        Some(subject) => boot::look(ctx, config, subject).await,
        None => None,
    };
    let network_changed = network::changed(previous, &done.network);
    // A machine that has not reported adds nothing to the status: no write for it while the
    // cache is behind this process's own ready write (see `write_ready_status`).
    let boot_news = looked.as_ref().is_some_and(|l| l.view != View::Unknown);
    if status::write_ready_status(done.unchanged, previous.ready) || boot_news || network_changed {
        let facts = ReadyFacts {
            role: done.role,
            revision: &done.revision,
            secret_version: done.secret_version.as_deref(),
        };
        let now = Timestamp::now();
        let mut desired = status::ready(&config_id(config), previous, &facts, now);
        if let Some(looked) = &looked {
            desired = status::with_boot(desired, previous, &looked.view, now);
        }
        desired = network::with_network(desired, previous, &done.network, now);
        apply_status(ctx, config, &desired).await?;
    }
    let uid = config.uid().unwrap_or_default();
    let note = network::note(previous, &done.network);
    if note.is_none() {
        ctx.forget_told(&uid, Topic::Network);
    }
    // The stored condition can be older than this process's last write: the memory settles it.
    let note = note.filter(|n| ctx.first_telling(&uid, Topic::Network, &n.text));
    if let Some(note) = note {
        let template = crate::k8s::templates::reference(&config.spec.template_ref);
        ctx.metrics.network_ignored(&template);
        warn!(message = %note.text, "network input ignored");
        ctx.publish(config, note);
    }
    if let (Some(subject), Some(looked)) = (&done.boot, &looked) {
        boot::tell(ctx, config, previous, subject, looked);
    }
    if let Some(uid) = config.uid() {
        ctx.generator_failures.succeeded(&uid);
        if let Some(record) = done.record {
            ctx.remember(uid, record);
        }
    }
    let ttl = token::signed_ttl(ctx.settings.bootstrap_token_ttl);
    let token_look = (done.role != Role::Init)
        .then(|| token::next_look(done.token_expires, Timestamp::now(), ttl));
    // A config whose reports could not be read is triggered by the poller once they can.
    let boot_look = match (&done.boot, &looked) {
        (Some(subject), Some(looked)) => boot::next_look(ctx, subject, looked),
        _ => None,
    };
    let action = outcome::ready_requeue(token_look, done.cleanup_failed);
    let action = outcome::sooner(action, boot_look);
    let state = match looked.as_ref().map(|l| &l.view) {
        Some(View::Failed { .. } | View::NotStarted { .. }) => ConfigState::Failed,
        _ => ConfigState::Ready,
    };
    Ok((
        action.map_or_else(Action::await_change, Action::requeue),
        state,
    ))
}

async fn report_joined(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    joined: Joined,
) -> Result<(Action, ConfigState)> {
    ctx.boot_reports
        .stop_waiting(&config.uid().unwrap_or_default());
    let facts = ReadyFacts {
        role: joined.role,
        revision: &joined.revision,
        secret_version: previous.data_secret_version.as_deref(),
    };
    let now = Timestamp::now();
    let mut desired = status::ready(&config_id(config), previous, &facts, now);
    // Only an end the last look found is shown: a failure after the join is told (Event and
    // metric) but does not make a joined machine's config unready.
    if let Some((_, looked)) = joined
        .boot
        .as_deref()
        .filter(|(_, l)| l.view == View::Booted)
    {
        desired = status::with_boot(desired, previous, &looked.view, now);
    }
    let mut updating = false;
    if let Some(in_place) = joined.in_place {
        updating = in_place.updating;
        desired = status::with_in_place(desired, in_place.status, in_place.condition, now);
        if let Some((note, result)) = in_place.step {
            ctx.metrics.inplace_update(result);
            ctx.publish(config, note);
        }
    }
    let since = updating.then(|| crate::core::inplace::updating_since(previous).unwrap_or(now));
    ctx.metrics.inplace_updating(&config_key(config), since);
    apply_status(ctx, config, &desired).await?;
    if let Some((subject, looked)) = joined.boot.as_deref() {
        boot::tell(ctx, config, previous, subject, looked);
    }
    let (state, retry) = outcome::joined(joined.failure.is_some());
    let retry = outcome::sooner(retry, joined.wait);
    if let Some(error) = &joined.failure {
        warn!(%error, ?retry, "clean-up or in-place step after join failed; the config stays ready");
    }
    // While Cluster API updates the machine in place, the node's report is looked at often.
    let retry = outcome::sooner(retry, updating.then_some(crate::core::inplace::POLL));
    let action = retry.map_or_else(Action::await_change, Action::requeue);
    Ok((action, state))
}

async fn report_blocked(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    why: Blocked,
) -> Result<(Action, ConfigState)> {
    let desired = status::blocked(&config_id(config), previous, &why, Timestamp::now());
    let written = apply_status(ctx, config, &desired).await?;
    let changed = status::ready_condition_changed(previous, &why);
    if let Some(note) = outcome::blocked_note(&why, written, changed) {
        ctx.publish(config, note);
    }
    if why.reason == crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR {
        ctx.metrics.token("error");
    }
    let generator_retry = match config.uid() {
        Some(uid) if why.reason == crd_types::conditions::reason::GENERATOR_FAILED => {
            ctx.generator_failures.failed(&uid, || ctx.live_configs())
        }
        _ => super::retry::FIRST,
    };
    let (state, retry) = outcome::blocked(&why, generator_retry);
    match state {
        ConfigState::Waiting => {
            debug!(reason = why.reason, message = %why.message, "config waiting")
        }
        _ => warn!(reason = why.reason, message = %why.message, "config failed"),
    }
    Ok((Action::requeue(retry), state))
}

fn config_id(config: &BootplateConfig) -> ConfigId<'_> {
    ConfigId {
        name: config.meta().name.as_deref().unwrap_or_default(),
        generation: config.metadata.generation,
    }
}

/// Writes `desired` unless the config already has it; returns whether it wrote.
async fn apply_status(
    ctx: &Context,
    config: &BootplateConfig,
    desired: &BootplateConfigStatus,
) -> Result<bool> {
    let api: Api<BootplateConfig> =
        Api::namespaced(ctx.client.clone(), &config.namespace().unwrap_or_default());
    crate::k8s::status::apply(&api, config, config.status.as_ref(), desired).await
}
