//! Reconciles `BootplateConfig`s: renders the referenced template for the owner Machine into
//! the data Secret, following the Cluster API bootstrap provider contract.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crd_types::capi::{Cluster, has_paused_annotation};
use crd_types::conditions::{self, reason};
use crd_types::{BootplateConfig, BootplateConfigSpec, BootplateConfigStatus, Role};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use render::{JoinInfo, RenderContext};
use tracing::{debug, info, warn};

use crate::context::Context;
use crate::data_secret::{self, Provenance};
use crate::error::{Error, Result, is_not_found};
use crate::metrics::ConfigState;
use crate::status::{self, Desired};
use crate::token::{self, TokenAction};
use crate::{certs, labels, role, templates};

/// How long to wait before looking again at a config that waits for something no watch
/// reports (for example, a Secret in a workload cluster).
const WAIT_REQUEUE: Duration = Duration::from_secs(30);
/// How long before retrying a config with a problem someone has to fix; watches on the
/// config and its template usually trigger earlier.
const FAILED_REQUEUE: Duration = Duration::from_secs(300);

/// What a successful reconcile did.
struct Rendered {
    role: Role,
    revision: String,
    /// The Machine has not joined yet and holds a bootstrap token that needs refreshing.
    token_in_use: bool,
    /// What to remember once the status is written (a full render whose inputs have a
    /// digest); `None` otherwise.
    record: Option<Record>,
    /// The config was found unchanged since the last render and nothing was done.
    unchanged: bool,
}

/// What the last full render of a config did, kept in memory by config UID. A reconcile whose
/// inputs digest is the same, whose token has more than half its lifetime left and whose data
/// Secret still has the resourceVersion seen after the write does nothing, and sends no
/// request: that is the reconcile the controller's own status and Secret writes trigger, and
/// the periodic one while the token is young. Anything else (a changed config, Machine,
/// Cluster, template or certificate Secret; a token to refresh; a touched data Secret) takes
/// the full path, which reads and compares. After a restart, the data Secret's hint
/// annotations stand in for this record.
#[derive(Clone, Debug)]
pub struct Record {
    inputs: String,
    token_expires: Option<Timestamp>,
    secret_digest: String,
    secret_version: Option<String>,
}

/// A digest of what a render depends on besides the bootstrap token: this controller's
/// version, the config's UID and generation (its spec), the template revision, the role, what
/// the template sees of the Machine and the Cluster (their render context, so their status
/// updates do not count), and the resourceVersions of the certificate Secrets the role reads.
/// `None` when one of those Secrets is not watched (not labelled with its cluster's name) or
/// the config has `contentFrom` files, whose Secrets are not watched either: such configs
/// always take the full path.
fn inputs_digest(
    ctx: &Context,
    config: &BootplateConfig,
    machine: &crd_types::capi::Machine,
    cluster: &Cluster,
    role: Role,
    revision: &str,
) -> Option<String> {
    use sha2::Digest;
    if config.spec.files.iter().any(|f| f.content_from.is_some()) {
        return None;
    }
    let namespace = config.namespace().unwrap_or_default();
    let secret_versions = certs::secret_names(&cluster.name_any(), role)
        .iter()
        .map(|name| ctx.stores.secret_version(&namespace, name))
        .collect::<Option<Vec<String>>>()?;
    let seen = RenderContext::new(cluster, machine, role, None, None);
    let json = serde_json::to_vec(&(
        env!("CARGO_PKG_VERSION"),
        config.uid(),
        config.metadata.generation,
        revision,
        role.as_str(),
        seen,
        secret_versions,
    ))
    .ok()?;
    Some(hex::encode(sha2::Sha256::digest(json)))
}

/// What is known of a config's last render: from memory, or after a restart from the hints on
/// its data Secret.
struct LastRender {
    /// From this process's memory (else from the hints).
    remembered: bool,
    inputs: Option<String>,
    token_expires: Option<Timestamp>,
    secret_version: Option<String>,
}

fn last_render(ctx: &Context, config: &BootplateConfig) -> Option<LastRender> {
    let uid = config.uid()?;
    if let Some(record) = ctx.rendered.lock().expect("lock").get(&uid) {
        return Some(LastRender {
            remembered: true,
            inputs: Some(record.inputs.clone()),
            token_expires: record.token_expires,
            secret_version: record.secret_version.clone(),
        });
    }
    let namespace = config.namespace().unwrap_or_default();
    let secret = ctx.stores.secret(&namespace, &config.name_any())?;
    let hint = |key: &str| secret.metadata.annotations.as_ref()?.get(key).cloned();
    Some(LastRender {
        remembered: false,
        inputs: hint(labels::INPUTS),
        token_expires: hint(labels::TOKEN_EXPIRES).and_then(|t| t.parse().ok()),
        secret_version: secret.metadata.resource_version.clone(),
    })
}

/// The last render's result when nothing it depended on changed (see [`Record`]). Without a
/// record in memory (after a restart), the data Secret's hints stand in for one, but only for
/// a config whose status says that Secret was written: a Secret written just before a crash
/// still needs the status that follows it.
fn unchanged(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    inputs: Option<&String>,
    role: Role,
    revision: &str,
) -> Option<Rendered> {
    let inputs = inputs?;
    let last = last_render(ctx, config)?;
    if !last.remembered && !previous.ready {
        return None;
    }
    if last.inputs.as_ref() != Some(inputs) {
        return None;
    }
    if role != Role::Init {
        let ttl = SignedDuration::try_from(ctx.settings.bootstrap_token_ttl).ok()?;
        if token::past_half_life(last.token_expires?, Timestamp::now(), ttl) {
            return None;
        }
    }
    let namespace = config.namespace().unwrap_or_default();
    if ctx.stores.secret_version(&namespace, &config.name_any()) != last.secret_version {
        return None;
    }
    Some(Rendered {
        role,
        revision: revision.to_owned(),
        token_in_use: role != Role::Init,
        record: None,
        unchanged: true,
    })
}

/// How metrics and logs name a config: `<namespace>/<name>`.
pub fn key(config: &BootplateConfig) -> String {
    format!(
        "{}/{}",
        config.namespace().unwrap_or_default(),
        config.name_any()
    )
}

/// Reconciles one config.
pub async fn reconcile(config: Arc<BootplateConfig>, ctx: Arc<Context>) -> Result<Action> {
    ctx.synced().await;
    let started = Instant::now();
    let key = key(&config);
    if config.meta().deletion_timestamp.is_some() {
        // The data Secret goes with its owner; the token expires by its TTL.
        ctx.metrics.config_deleted(&key);
        if let Some(uid) = config.uid() {
            ctx.rendered.lock().expect("lock").remove(&uid);
            ctx.tokens_deleted.lock().expect("lock").remove(&uid);
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
            match state {
                ConfigState::Ready => "ready",
                ConfigState::Waiting => "waiting",
                ConfigState::Failed => "failed",
            }
        }
        Err(_) => "error",
    };
    ctx.metrics.reconciled("config", label, started.elapsed());
    result.map(|(action, _)| action)
}

async fn reconcile_config(
    config: &BootplateConfig,
    ctx: &Context,
) -> Result<(Action, ConfigState)> {
    let api: Api<BootplateConfig> =
        Api::namespaced(ctx.client.clone(), &config.namespace().unwrap_or_default());
    let previous = config.status.clone().unwrap_or_default();
    match render_config(config, ctx, &previous).await {
        Ok(done) => {
            match &done.record {
                // Unchanged since a render whose ready status was written: a cache that does
                // not show it yet is behind (ready never goes back), and its watch event is on
                // the way. Writing again would only repeat that write.
                None if done.unchanged && !previous.ready => {}
                _ => {
                    let desired = ready_status(config, &previous, &done);
                    status::apply(&api, config, config.status.as_ref(), &desired).await?;
                }
            }
            if let (Some(record), Some(uid)) = (done.record.clone(), config.uid()) {
                remember(ctx, uid, record);
            }
            let action = if done.token_in_use {
                // Check the token again well before it expires.
                Action::requeue(ctx.settings.bootstrap_token_ttl / 3)
            } else {
                Action::await_change()
            };
            Ok((action, ConfigState::Ready))
        }
        Err(Error::Blocked {
            reason,
            message,
            waiting,
        }) => {
            let desired = blocked_status(config, &previous, reason, &message);
            let changed = status::apply(&api, config, config.status.as_ref(), &desired).await?;
            if changed && condition_changed(&previous, reason, &message) {
                let type_ = if waiting {
                    EventType::Normal
                } else {
                    EventType::Warning
                };
                let note = message.clone();
                publish(ctx, config, type_, reason, "Reconcile", note);
            }
            if reason == reason::BOOTSTRAP_TOKEN_ERROR {
                ctx.metrics.token("error");
            }
            if waiting {
                debug!(reason, %message, "config waiting");
                Ok((Action::requeue(WAIT_REQUEUE), ConfigState::Waiting))
            } else {
                warn!(reason, %message, "config failed");
                // contentFrom Secrets are not watched (they carry no label to select them by),
                // and the usual fix, creating the Secret, is often just late: look again soon.
                let retry = if reason == reason::FILE_SOURCE_ERROR {
                    WAIT_REQUEUE
                } else {
                    FAILED_REQUEUE
                };
                Ok((Action::requeue(retry), ConfigState::Failed))
            }
        }
        Err(e) => Err(e),
    }
}

/// Transient errors: retry with a short delay.
pub fn error_policy(config: Arc<BootplateConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    let retry_in = match config.uid() {
        Some(uid) => ctx.failures.failed(&uid, || ctx.live_configs()),
        None => crate::retry::FIRST,
    };
    warn!(config = %key(&config), %error, ?retry_in, "reconcile failed; retrying");
    Action::requeue(retry_in)
}

fn condition_changed(previous: &BootplateConfigStatus, reason: &str, message: &str) -> bool {
    !previous
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY && c.reason == reason && c.message == message)
}

/// The owner Machine's name, from the ownerReference CAPI's Machine controller adds.
fn owner_machine(config: &BootplateConfig) -> Option<String> {
    config
        .owner_references()
        .iter()
        .find(|r| r.kind == "Machine" && r.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|r| r.name.clone())
}

/// A config that no Machine owns yet may still belong to a paused Cluster: CAPI adopts configs
/// only while their Cluster is not paused, so without this a paused Cluster's configs would say
/// "waiting for a Machine" instead of "paused". The Cluster is found through the Machine whose
/// configRef names this config.
fn refuse_if_paused(config: &BootplateConfig, ctx: &Context, namespace: &str) -> Result<()> {
    let cluster_name = ctx
        .stores
        .machine_referencing(namespace, &config.name_any())
        .map(|m| m.spec.cluster_name.clone());
    let paused_cluster = cluster_name
        .as_deref()
        .and_then(|name| ctx.stores.cluster(namespace, name))
        .is_some_and(|c| c.is_paused());
    if paused_cluster || has_paused_annotation(config.meta()) {
        return Err(Error::waiting(
            reason::PAUSED,
            format!(
                "reconciliation is paused (Cluster {} spec.paused or the cluster.x-k8s.io/paused annotation)",
                cluster_name.as_deref().unwrap_or("of this config")
            ),
        ));
    }
    Ok(())
}

async fn render_config(
    config: &BootplateConfig,
    ctx: &Context,
    previous: &BootplateConfigStatus,
) -> Result<Rendered> {
    let namespace = config.namespace().unwrap_or_default();
    if owner_machine(config).is_none() {
        refuse_if_paused(config, ctx, &namespace)?;
    }
    let machine_name = owner_machine(config).ok_or_else(|| {
        Error::waiting(
            reason::WAITING_FOR_MACHINE,
            "waiting for a Machine to own this config (CAPI's Machine controller adds the ownerReference)",
        )
    })?;
    let machine = ctx
        .stores
        .machine(&namespace, &machine_name)
        .ok_or_else(|| {
            Error::waiting(
                reason::WAITING_FOR_MACHINE,
                format!("owner Machine {namespace}/{machine_name} not found"),
            )
        })?;
    let cluster_name = &machine.spec.cluster_name;
    let cluster = ctx.stores.cluster(&namespace, cluster_name).ok_or_else(|| {
        Error::waiting(
            reason::CLUSTER_NOT_FOUND,
            format!("Cluster {namespace}/{cluster_name} (spec.clusterName of Machine {machine_name}) not found"),
        )
    })?;
    if cluster.is_paused() || has_paused_annotation(config.meta()) {
        return Err(Error::waiting(
            reason::PAUSED,
            format!(
                "reconciliation is paused (Cluster {cluster_name} spec.paused or the cluster.x-k8s.io/paused annotation)"
            ),
        ));
    }

    let data_secret_written = previous.ready;
    if data_secret_written && machine.has_node() {
        // Bootstrapped: the Secret stays as it is, whatever happens to the template; the
        // token has served its purpose.
        if let Some(uid) = config.uid().filter(|_| token_may_be_live(ctx, config)) {
            let workload = ctx
                .workloads
                .client(
                    &ctx.client,
                    &ctx.stores,
                    &namespace,
                    cluster_name,
                    ctx.settings.workload_timeout,
                )
                .await;
            if let Ok(workload) = workload {
                let deleted = token::delete(&workload, &uid)
                    .await
                    .map_err(|e| naming_workload(e, &namespace, cluster_name))?;
                for _ in 0..deleted {
                    ctx.metrics.token("deleted");
                    info!("bootstrap token deleted: the Machine has joined");
                }
                ctx.tokens_deleted
                    .lock()
                    .expect("lock")
                    .insert(uid, (), || ctx.live_configs());
            }
        }
        let recorded = previous
            .role
            .as_deref()
            .and_then(|r| r.parse().ok())
            .unwrap_or(Role::Worker);
        // CAPI can set the init Machine's nodeRef before the Cluster reports its control plane
        // initialized; the Cluster's update brings this config back here, where the lock goes.
        if recorded == Role::Init && cluster.control_plane_initialized() {
            role::release_init_lock(&ctx.client, &cluster).await?;
        }
        return Ok(Rendered {
            role: recorded,
            revision: previous.template_revision.clone().unwrap_or_default(),
            token_in_use: false,
            record: None,
            unchanged: false,
        });
    }

    if !cluster.infrastructure_provisioned() {
        return Err(Error::waiting(
            reason::WAITING_FOR_INFRASTRUCTURE,
            format!("waiting for the infrastructure of Cluster {cluster_name} to be provisioned"),
        ));
    }
    let template = templates::resolve(&ctx.stores, &ctx.compiled, config).inspect_err(|e| {
        if e.reason() == reason::TEMPLATE_INVALID {
            let reference = templates::reference(&config.spec.template_ref);
            ctx.metrics.render_failed(&reference, e.reason());
        }
    })?;
    let recorded = if data_secret_written {
        previous.role.as_deref().and_then(|r| r.parse().ok())
    } else {
        None
    };
    let role = role::decide(&ctx.client, &ctx.stores, &cluster, &machine, recorded).await?;
    debug!(%role, template = %template.display, "role decided");
    if role == Role::Init && cluster.control_plane_initialized() {
        role::release_init_lock(&ctx.client, &cluster).await?;
    }
    let endpoint = render::ClusterInfo::from_cluster(&cluster).control_plane_endpoint;
    if endpoint.host.is_empty() {
        return Err(Error::waiting(
            reason::WAITING_FOR_INFRASTRUCTURE,
            format!("waiting for spec.controlPlaneEndpoint of Cluster {cluster_name}"),
        ));
    }

    let revision = template.compiled.revision();
    let inputs = inputs_digest(ctx, config, &machine, &cluster, role, revision);
    if let Some(done) = unchanged(ctx, config, previous, inputs.as_ref(), role, revision) {
        debug!(%role, "unchanged since the last render");
        return Ok(done);
    }

    let certs = control_plane_certs(ctx, &cluster, role).await?;
    let spec = resolve_files(ctx, config).await?;
    // `trial`: a render whose output is thrown away; its failure counts, its time does not
    // (the duration histogram counts one render per user-data produced).
    let render = |join: Option<JoinInfo>, trial: bool| {
        let context = RenderContext::new(&cluster, &machine, role, join, certs.clone());
        let started = Instant::now();
        let rendered = template.compiled.render(&spec, &context).map_err(|e| {
            ctx.metrics.render_failed(&template.reference, e.reason());
            Error::failed(e.reason(), e.to_string())
        })?;
        if !trial {
            ctx.metrics.rendered(&template.reference, started.elapsed());
        }
        Ok::<_, Error>(rendered)
    };
    let (rendered, token_expires, created_token) = if role == Role::Init {
        (render(None, false)?, None, None)
    } else {
        let ca_hash = ca_hash(ctx, &cluster, certs.as_ref()).await?;
        let join = |token: &token::Token| JoinInfo {
            token: token.expose(),
            api_server_endpoint: endpoint.address(),
            ca_cert_hashes: vec![ca_hash.clone()],
        };
        // A trial render with a stand-in of the same length first: a config whose template,
        // variables or size fail gets an error, and no token in the workload cluster.
        render(Some(join(&token::Token::placeholder())), true)?;
        let (token, expires, created) = bootstrap_token(ctx, config, &cluster).await?;
        let created = created.then(|| token.id.clone());
        (render(Some(join(&token)), false)?, Some(expires), created)
    };
    debug!("rendered");

    let desired = data_secret::build(
        config,
        &rendered,
        &Provenance {
            cluster: cluster_name,
            template: &template.reference,
            revision: template.compiled.revision(),
            role,
            inputs: inputs.as_deref(),
            token_expires,
        },
    );
    let digest = data_secret::digest(&desired);
    let (written, secret_version) = write_data_secret(ctx, config, &desired, &digest).await?;
    // One Event per render, which also tells of a token this render created: a rollout of
    // thousands of machines records one Event each, not two.
    let token_note = created_token
        .as_ref()
        .map(|id| format!("bootstrap token {id} created in the workload cluster"));
    if written {
        ctx.metrics.secret_written();
        info!(role = %role, template = %template.display, revision = template.compiled.revision(), "data secret written");
        let mut note = format!(
            "rendered {} (revision {}) for role {role} into Secret {}",
            template.display,
            template.compiled.revision(),
            config.name_any()
        );
        if let Some(token_note) = token_note {
            note = format!("{note}; {token_note}");
        }
        publish(ctx, config, EventType::Normal, "Rendered", "Render", note);
    } else if let Some(note) = token_note {
        publish(
            ctx,
            config,
            EventType::Normal,
            "TokenCreated",
            "CreateToken",
            note,
        );
    }
    Ok(Rendered {
        role,
        revision: template.compiled.revision().to_owned(),
        token_in_use: role != Role::Init,
        record: inputs.map(|inputs| Record {
            inputs,
            token_expires,
            secret_digest: digest,
            secret_version,
        }),
        unchanged: false,
    })
}

/// Writes the data Secret unless it already holds `desired`; returns whether it wrote, and the
/// Secret's resourceVersion now. The metadata store spares reads: a Secret it does not hold
/// on a config this process never rendered (the first render) is written without reading, and
/// one whose resourceVersion is the one this controller wrote or checked for the same digest
/// is left alone without reading. A config this process rendered before is read first when the
/// store does not show its Secret: the store may not have seen that write yet (a reconcile
/// that the write itself triggered), and rewriting would only repeat it.
async fn write_data_secret(
    ctx: &Context,
    config: &BootplateConfig,
    desired: &Secret,
    digest: &str,
) -> Result<(bool, Option<String>)> {
    let namespace = config.namespace().unwrap_or_default();
    let stored = ctx.stores.secret_version(&namespace, &config.name_any());
    let (rendered_before, known) = config.uid().map_or((false, None), |uid| {
        let records = ctx.rendered.lock().expect("lock");
        let record = records.get(&uid);
        let known = record
            .filter(|r| r.secret_digest == digest)
            .and_then(|r| r.secret_version.clone());
        (record.is_some(), known)
    });
    if stored.is_some() && known == stored {
        return Ok((false, stored));
    }
    if stored.is_some() || rendered_before {
        let current = data_secret::get(&ctx.client, config).await?;
        if let Some(current) = current.filter(|c| data_secret::is_current(c, desired)) {
            return Ok((false, current.resource_version()));
        }
    }
    Ok((true, data_secret::write(&ctx.client, desired).await?))
}

/// Whether `config` shows no trace of an earlier render: not ready, and no data Secret in the
/// (synced) metadata store. Then its token, if any, can only be one whose creation was
/// interrupted, and `token::ensure` looks it up by its derived name instead of listing.
fn first_render(ctx: &Context, config: &BootplateConfig) -> bool {
    let namespace = config.namespace().unwrap_or_default();
    !config.status.as_ref().is_some_and(|s| s.ready)
        && ctx
            .stores
            .secret_version(&namespace, &config.name_any())
            .is_none()
}

/// Remembers a config's last render.
fn remember(ctx: &Context, uid: String, record: Record) {
    ctx.rendered
        .lock()
        .expect("lock")
        .insert(uid, record, || ctx.live_configs());
}

/// Whether a joined Machine's config may still have a live bootstrap token to delete: this
/// process has not deleted its tokens yet, and the expiry known from the last render (memory,
/// or the data Secret's hint after a restart) is not past. A hint can be stale by one refresh,
/// so a token refreshed just before a restart may be left to expire by itself, within one TTL,
/// as the token cleaner does for every token.
fn token_may_be_live(ctx: &Context, config: &BootplateConfig) -> bool {
    let Some(uid) = config.uid() else {
        return false;
    };
    let init = config.status.as_ref().and_then(|s| s.role.as_deref()) == Some(Role::Init.as_str());
    if init || ctx.tokens_deleted.lock().expect("lock").contains(&uid) {
        return false;
    }
    match last_render(ctx, config).and_then(|last| last.token_expires) {
        Some(expires) => expires > Timestamp::now(),
        None => true,
    }
}

/// The cluster's certificates for the control-plane roles; `None` for workers.
async fn control_plane_certs(
    ctx: &Context,
    cluster: &Cluster,
    role: Role,
) -> Result<Option<render::Certificates>> {
    Ok(match role {
        // The init machine of a Cluster without a control-plane provider generates the
        // missing ones.
        Role::Init => Some(
            certs::control_plane(
                &ctx.client,
                cluster,
                cluster.spec.control_plane_ref.is_none(),
            )
            .await?,
        ),
        Role::ControlPlaneJoin => Some(certs::control_plane(&ctx.client, cluster, false).await?),
        Role::Worker => None,
    })
}

/// The `sha256:` hash of the cluster CA a joining machine pins.
async fn ca_hash(
    ctx: &Context,
    cluster: &Cluster,
    certs: Option<&render::Certificates>,
) -> Result<String> {
    match certs {
        Some(certs) => crate::pki::ca_cert_hash(&certs.ca.cert).map_err(|e| {
            Error::failed(
                reason::CERTIFICATES_ERROR,
                format!("the cluster CA is not a certificate: {e}"),
            )
        }),
        None => certs::ca_hash(&ctx.client, &ctx.stores, &ctx.ca_hashes, cluster).await,
    }
}

/// The config's bootstrap token in the workload cluster (see [`token::ensure`]), when it
/// expires, and whether it was just created (counted and logged here; the Event follows the
/// render).
async fn bootstrap_token(
    ctx: &Context,
    config: &BootplateConfig,
    cluster: &Cluster,
) -> Result<(token::Token, Timestamp, bool)> {
    let namespace = config.namespace().unwrap_or_default();
    let workload = ctx
        .workloads
        .client(
            &ctx.client,
            &ctx.stores,
            &namespace,
            &cluster.name_any(),
            ctx.settings.workload_timeout,
        )
        .await?;
    let uid = config.uid().unwrap_or_default();
    let key = format!("{namespace}/{}", config.name_any());
    let first = first_render(ctx, config);
    let (token, action, expires) = token::ensure(
        &workload,
        &uid,
        &key,
        ctx.settings.bootstrap_token_ttl,
        first,
    )
    .await
    .map_err(|e| naming_workload(e, &namespace, &cluster.name_any()))?;
    match action {
        TokenAction::Created => {
            ctx.metrics.token("created");
            info!(token_id = %token.id, "bootstrap token created");
        }
        TokenAction::Refreshed => {
            ctx.metrics.token("refreshed");
            info!(token_id = %token.id, "bootstrap token refreshed");
        }
        TokenAction::Reused => {}
    }
    Ok((token, expires, action == TokenAction::Created))
}

/// A token error names the workload cluster and the Secret its kubeconfig came from: the API
/// error alone ("client error (Connect)", "Unauthorized") does not say which cluster it was.
fn naming_workload(error: Error, namespace: &str, cluster: &str) -> Error {
    match error {
        Error::Blocked {
            reason,
            message,
            waiting,
        } => Error::Blocked {
            reason,
            message: format!(
                "Cluster {namespace}/{cluster} (kubeconfig from Secret {namespace}/{cluster}-kubeconfig): {message}"
            ),
            waiting,
        },
        other => other,
    }
}

/// The config spec with every `contentFrom` replaced by the content of the Secret key it names,
/// read from the config's own namespace only.
async fn resolve_files(ctx: &Context, config: &BootplateConfig) -> Result<BootplateConfigSpec> {
    let mut spec = config.spec.clone();
    for (index, file) in spec.files.iter().enumerate() {
        crate::templates::check_one_content_source(&format!("spec.files[{index}]"), file)?;
    }
    if spec.files.iter().all(|f| f.content_from.is_none()) {
        return Ok(spec);
    }
    let namespace = config.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    for (index, file) in spec.files.iter_mut().enumerate() {
        let Some(source) = file.content_from.take() else {
            continue;
        };
        let field = format!("spec.files[{index}].contentFrom.secret");
        let (name, key) = (&source.secret.name, &source.secret.key);
        crate::templates::check_secret_namespace(&field, &source.secret, &namespace)?;
        let secret = match secrets.get(name).await {
            Ok(secret) => secret,
            Err(e) if is_not_found(&e) => {
                return Err(Error::failed(
                    reason::FILE_SOURCE_ERROR,
                    format!("{field}: Secret {namespace}/{name} not found"),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| {
                Error::failed(
                    reason::FILE_SOURCE_ERROR,
                    format!("{field}: Secret {namespace}/{name} has no key {key:?}"),
                )
            })?;
        let text = String::from_utf8(bytes.0.clone()).map_err(|_| {
            Error::failed(
                reason::FILE_SOURCE_ERROR,
                format!("{field}: key {key:?} of Secret {namespace}/{name} is not valid UTF-8 (use base64 content instead)"),
            )
        })?;
        file.content = Some(text);
    }
    Ok(spec)
}

fn ready_status(
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    done: &Rendered,
) -> BootplateConfigStatus {
    let message = format!(
        "Secret {} holds the user-data (role {})",
        config.name_any(),
        done.role
    );
    BootplateConfigStatus {
        ready: true,
        data_secret_name: Some(config.name_any()),
        initialization: Some(crd_types::ConfigInitialization {
            data_secret_created: true,
        }),
        observed_generation: config.metadata.generation,
        template_revision: Some(done.revision.clone()),
        role: Some(done.role.as_str().to_owned()),
        conditions: status::conditions(
            &previous.conditions,
            vec![
                Desired {
                    type_: conditions::READY,
                    status: true,
                    reason: reason::DATA_SECRET_CREATED,
                    message: message.clone(),
                },
                Desired {
                    type_: conditions::DATA_SECRET_AVAILABLE,
                    status: true,
                    reason: reason::DATA_SECRET_CREATED,
                    message,
                },
                Desired {
                    type_: conditions::PAUSED,
                    status: false,
                    reason: reason::NOT_PAUSED,
                    message: "not paused".into(),
                },
            ],
            config.metadata.generation,
        ),
    }
}

fn blocked_status(
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    why: &'static str,
    message: &str,
) -> BootplateConfigStatus {
    let paused = why == reason::PAUSED;
    // Once written, the data Secret stays available: CAPI's ready flag never goes back.
    let available = if previous.ready {
        Desired {
            type_: conditions::DATA_SECRET_AVAILABLE,
            status: true,
            reason: reason::DATA_SECRET_CREATED,
            message: format!("Secret {} holds the user-data", config.name_any()),
        }
    } else {
        Desired {
            type_: conditions::DATA_SECRET_AVAILABLE,
            status: false,
            reason: why,
            message: message.to_owned(),
        }
    };
    BootplateConfigStatus {
        observed_generation: config.metadata.generation,
        conditions: status::conditions(
            &previous.conditions,
            vec![
                Desired {
                    type_: conditions::READY,
                    status: false,
                    reason: why,
                    message: message.to_owned(),
                },
                available,
                Desired {
                    type_: conditions::PAUSED,
                    status: paused,
                    reason: if paused {
                        reason::PAUSED
                    } else {
                        reason::NOT_PAUSED
                    },
                    message: if paused {
                        message.to_owned()
                    } else {
                        "not paused".into()
                    },
                },
            ],
            config.metadata.generation,
        ),
        ..previous.clone()
    }
}

fn publish(
    ctx: &Context,
    config: &BootplateConfig,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    crate::events::publish(&ctx.recorder, config, type_, reason, action, note);
}
