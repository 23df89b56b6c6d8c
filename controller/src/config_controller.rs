//! Reconciles `BootplateConfig`s: renders the referenced template for the owner Machine into
//! the data Secret, following the Cluster API bootstrap provider contract.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crd_types::capi::{Cluster, has_paused_annotation};
use crd_types::conditions::{self, reason};
use crd_types::{BootplateConfig, BootplateConfigSpec, BootplateConfigStatus, Role};
use k8s_openapi::api::core::v1::Secret;
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
use crate::{certs, role, templates};

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
}

/// Reconciles one config.
pub async fn reconcile(config: Arc<BootplateConfig>, ctx: Arc<Context>) -> Result<Action> {
    ctx.synced().await;
    let started = Instant::now();
    let key = format!(
        "{}/{}",
        config.namespace().unwrap_or_default(),
        config.name_any()
    );
    if config.meta().deletion_timestamp.is_some() {
        // The data Secret goes with its owner; the token expires by its TTL.
        ctx.metrics.config_deleted(&key);
        return Ok(Action::await_change());
    }
    let created = config.meta().creation_timestamp.as_ref().map(|t| t.0);
    let result = reconcile_config(&config, &ctx).await;
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
            let desired = ready_status(config, &previous, &done);
            status::apply(&api, config, config.status.as_ref(), &desired).await?;
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
                publish(ctx, config, type_, reason, "Reconcile", note).await;
            }
            if reason == reason::BOOTSTRAP_TOKEN_ERROR {
                ctx.metrics.token("error");
            }
            if waiting {
                debug!(reason, %message, "config waiting");
                Ok((Action::requeue(WAIT_REQUEUE), ConfigState::Waiting))
            } else {
                warn!(reason, %message, "config failed");
                Ok((Action::requeue(FAILED_REQUEUE), ConfigState::Failed))
            }
        }
        Err(e) => Err(e),
    }
}

/// Transient errors: retry with a short delay.
pub fn error_policy(config: Arc<BootplateConfig>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(config = %format!("{}/{}", config.namespace().unwrap_or_default(), config.name_any()), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
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

async fn render_config(
    config: &BootplateConfig,
    ctx: &Context,
    previous: &BootplateConfigStatus,
) -> Result<Rendered> {
    let namespace = config.namespace().unwrap_or_default();
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
        if let Some(uid) = config.uid() {
            let workload = ctx
                .workloads
                .client(
                    &ctx.client,
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
            }
        }
        let recorded = previous
            .role
            .as_deref()
            .and_then(|r| r.parse().ok())
            .unwrap_or(Role::Worker);
        return Ok(Rendered {
            role: recorded,
            revision: previous.template_revision.clone().unwrap_or_default(),
            token_in_use: false,
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
            let reference = format!(
                "{}/{}",
                config.spec.template_ref.kind, config.spec.template_ref.name
            );
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

    let (certs, join) = credentials(ctx, config, &cluster, role, endpoint.address()).await?;
    debug!("credentials gathered");
    let spec = resolve_files(ctx, config).await?;
    let context = RenderContext::new(&cluster, &machine, role, join, certs);
    let render_started = Instant::now();
    let rendered = template.compiled.render(&spec, &context).map_err(|e| {
        ctx.metrics.render_failed(&template.reference, e.reason());
        Error::failed(e.reason(), e.to_string())
    })?;
    ctx.metrics
        .rendered(&template.reference, render_started.elapsed());

    let desired = data_secret::build(
        config,
        &rendered,
        &Provenance {
            cluster: cluster_name,
            template: &template.reference,
            revision: template.compiled.revision(),
            role,
        },
    );
    let current = data_secret::get(&ctx.client, config).await?;
    if !current
        .as_ref()
        .is_some_and(|c| data_secret::is_current(c, &desired))
    {
        data_secret::write(&ctx.client, &desired).await?;
        ctx.metrics.secret_written();
        info!(role = %role, template = %template.display, revision = template.compiled.revision(), "data secret written");
        let note = format!(
            "rendered {} (revision {}) for role {role} into Secret {}",
            template.display,
            template.compiled.revision(),
            config.name_any()
        );
        publish(ctx, config, EventType::Normal, "Rendered", "Render", note).await;
    }
    Ok(Rendered {
        role,
        revision: template.compiled.revision().to_owned(),
        token_in_use: role != Role::Init,
    })
}

/// Certificates (control-plane roles) and join data (joining roles).
async fn credentials(
    ctx: &Context,
    config: &BootplateConfig,
    cluster: &Cluster,
    role: Role,
    api_server_endpoint: String,
) -> Result<(Option<render::Certificates>, Option<JoinInfo>)> {
    let certs = match role {
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
    };
    if role == Role::Init {
        return Ok((certs, None));
    }
    let ca_hash = match &certs {
        Some(certs) => crate::pki::ca_cert_hash(&certs.ca.cert).map_err(|e| {
            Error::failed(
                reason::CERTIFICATES_ERROR,
                format!("the cluster CA is not a certificate: {e}"),
            )
        })?,
        None => certs::ca_hash(&ctx.client, cluster).await?,
    };
    let namespace = config.namespace().unwrap_or_default();
    let workload = ctx
        .workloads
        .client(
            &ctx.client,
            &namespace,
            &cluster.name_any(),
            ctx.settings.workload_timeout,
        )
        .await?;
    let uid = config.uid().unwrap_or_default();
    let key = format!("{namespace}/{}", config.name_any());
    let (token, action) = token::ensure(&workload, &uid, &key, ctx.settings.bootstrap_token_ttl)
        .await
        .map_err(|e| naming_workload(e, &namespace, &cluster.name_any()))?;
    match action {
        TokenAction::Created => ctx.metrics.token("created"),
        TokenAction::Refreshed => ctx.metrics.token("refreshed"),
        TokenAction::Reused => {}
    }
    match action {
        TokenAction::Created => {
            info!(token_id = %token.id, "bootstrap token created");
            let note = format!(
                "bootstrap token {} created in the workload cluster",
                token.id
            );
            publish(
                ctx,
                config,
                EventType::Normal,
                "TokenCreated",
                "CreateToken",
                note,
            )
            .await;
        }
        TokenAction::Refreshed => info!(token_id = %token.id, "bootstrap token refreshed"),
        TokenAction::Reused => {}
    }
    let join = JoinInfo {
        token: token.expose(),
        api_server_endpoint,
        ca_cert_hashes: vec![ca_hash],
    };
    Ok((certs, Some(join)))
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
        if let Some(other) = source
            .secret
            .namespace
            .as_deref()
            .filter(|ns| *ns != namespace)
        {
            return Err(Error::failed(
                reason::INVALID_REFERENCE,
                format!(
                    "{field}.namespace: a config in namespace {namespace} may not read Secret {other}/{name}; only Secrets of its own namespace are read"
                ),
            ));
        }
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

async fn publish(
    ctx: &Context,
    config: &BootplateConfig,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    crate::events::publish(&ctx.recorder, config, type_, reason, action, note).await;
}
