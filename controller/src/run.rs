//! `bootplate run`: the watches, the stores they fill, and the controllers over them.

use std::future::Future;
use std::sync::Arc;

use crd_types::capi::{CLUSTER_NAME_LABEL, Cluster, Machine, WATCH_FILTER_LABEL};
use crd_types::{BootplateConfig, BootstrapTemplate, ClusterBootstrapTemplate, TemplateKind};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{info, warn};

use crate::context::{Context, Settings, Stores};
use crate::http::Readiness;
use crate::leader::LeaderElection;
use crate::metrics::Metrics;
use crate::triggers::{Deletions, NoSharedBackoff, settled};
use crate::{config_controller, deleted_configs, labels, template_controller};

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// `bootplate run`: sets up logging, the client and the operations endpoints, waits for
/// leadership when asked to, then runs until SIGTERM or SIGINT (or leadership is lost).
pub async fn main(args: crate::flags::RunArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    crate::logging::init(args.log_format, args.log_level.as_deref())?;
    // One crypto provider for every TLS connection (management and workload clusters).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let client = Client::try_from(config)?;
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    crate::http::serve(
        args.metrics_addr,
        args.health_addr,
        metrics.clone(),
        readiness.clone(),
    )
    .await?;
    if let Some(addr) = args.webhook_addr {
        crate::webhook::serve(addr, &args.webhook_cert_dir, client.clone()).await?;
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    if !args.leader_elect {
        metrics.set_leader(true);
        return run(client, args.settings(), metrics, readiness, stopped()).await;
    }
    let identity = std::env::var("POD_NAME")
        .unwrap_or_else(|_| format!("{}-{}", hostname(), std::process::id()));
    let election = Arc::new(LeaderElection::new(
        client.clone(),
        &args.leader_elect_namespace,
        &args.leader_elect_lease_name,
        identity,
        args.leader_timing(),
    ));
    // A standby is ready: it serves its purpose by waiting.
    readiness.set(true);
    tokio::select! {
        _ = election.acquire() => {}
        _ = stopped() => {
            info!("stopped while standing by");
            return Ok(());
        }
    }
    readiness.set(false);
    metrics.set_leader(true);
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = election.clone();
    let renewals = tokio::spawn(async move {
        holder.hold().await;
        let _ = lost_tx.send(());
    });
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lost_flag = lost.clone();
    let stop = stopped();
    let until = async move {
        tokio::select! {
            _ = stop => {}
            _ = lost_rx => lost_flag.store(true, std::sync::atomic::Ordering::SeqCst),
        }
    };
    let result = run(client, args.settings(), metrics.clone(), readiness, until).await;
    renewals.abort();
    metrics.set_leader(false);
    if lost.load(std::sync::atomic::Ordering::SeqCst) {
        anyhow::bail!("lost the leader lease; exiting so a fresh process can stand by");
    }
    election.release().await;
    result
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "bootplate".into())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
    }
}

/// Runs the controllers until `shutdown` resolves, then lets running reconciles finish.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let ns = settings.namespace.as_deref();
    let filtered = |base: watcher::Config| match &settings.watch_filter {
        Some(value) => base.labels(&format!("{WATCH_FILTER_LABEL}={value}")),
        None => base,
    };

    let (machines, machine_events) = watch(
        api::<Machine>(&client, ns),
        filtered(watcher::Config::default()),
        strip,
        Deletions::Skip,
        |_| {},
    );
    let (clusters, cluster_events) = watch(
        api::<Cluster>(&client, ns),
        filtered(watcher::Config::default()),
        strip,
        Deletions::Skip,
        |_| {},
    );
    let (templates, template_events) = watch(
        api::<BootstrapTemplate>(&client, ns),
        watcher::Config::default(),
        |_| {},
        Deletions::Include,
        forget_template(metrics.clone()),
    );
    let (cluster_templates, cluster_template_events) = watch(
        Api::<ClusterBootstrapTemplate>::all(client.clone()),
        watcher::Config::default(),
        |_| {},
        Deletions::Include,
        forget_template(metrics.clone()),
    );

    // Secrets: metadata only, of those labelled with a cluster name (CAPI's certificate and
    // kubeconfig Secrets, and the data Secrets, which also trigger their config's reconcile).
    let (secrets, secret_events) = watch(
        api::<PartialObjectMeta<Secret>>(&client, ns),
        watcher::Config::default().labels(CLUSTER_NAME_LABEL),
        |s| s.metadata.managed_fields = None,
        Deletions::Include,
        |_| {},
    );
    let data_secret_events = secret_events
        .try_filter(|s| std::future::ready(s.labels().contains_key(labels::DATA_SECRET)));

    let (deleted_tx, deleted_rx) = deleted_configs::channel();
    let (configs, config_events) = watch(
        api::<BootplateConfig>(&client, ns),
        filtered(watcher::Config::default()),
        strip,
        Deletions::Skip,
        forget_config(metrics.clone(), deleted_tx),
    );
    let config_controller = Controller::for_stream(config_events, configs.clone());
    let stores = Stores {
        configs: configs.clone(),
        machines,
        clusters,
        templates,
        cluster_templates,
        secrets,
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        settings.clone(),
        stores,
        metrics,
    ));
    tokio::spawn(deleted_configs::delete_tokens(ctx.clone(), deleted_rx));
    let synced = ctx.clone();
    tokio::spawn(async move {
        synced.watch_stores().await;
        readiness.set(true);
        info!("caches synced");
    });

    let (configs_by_cluster, configs_by_template, configs_by_cluster_template) =
        (configs.clone(), configs.clone(), configs.clone());
    let config_controller = config_controller
        .owns_stream(data_secret_events)
        .watches_stream(machine_events, machine_to_config)
        .watches_stream(cluster_events, move |cluster: Cluster| {
            configs_of_cluster(&configs_by_cluster, &cluster)
        })
        .watches_stream(template_events, move |template: BootstrapTemplate| {
            configs_of_template(
                &configs_by_template,
                TemplateKind::BootstrapTemplate,
                template.namespace(),
                &template.name_any(),
            )
        })
        .watches_stream(
            cluster_template_events,
            move |template: ClusterBootstrapTemplate| {
                configs_of_template(
                    &configs_by_cluster_template,
                    TemplateKind::ClusterBootstrapTemplate,
                    None,
                    &template.name_any(),
                )
            },
        )
        .trigger_backoff(NoSharedBackoff)
        .with_config(controller::Config::default().concurrency(settings.concurrency));

    let (shutdown_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let signal = |tx: &tokio::sync::broadcast::Sender<()>| {
        let mut rx = tx.subscribe();
        async move {
            let _ = rx.recv().await;
        }
    };
    let configs_done = config_controller
        .graceful_shutdown_on(signal(&shutdown_tx))
        .run(
            config_controller::reconcile,
            config_controller::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    // The template controllers keep stores of their own: they run apart from the config
    // controller, whose trigger streams each have one consumer.
    let templates_done = controller_of(api::<BootstrapTemplate>(&client, ns))
        .graceful_shutdown_on(signal(&shutdown_tx))
        .run(
            template_controller::reconcile_namespaced,
            template_controller::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let cluster_templates_done =
        controller_of(Api::<ClusterBootstrapTemplate>::all(client.clone()))
            .graceful_shutdown_on(signal(&shutdown_tx))
            .run(
                template_controller::reconcile_cluster,
                template_controller::error_policy,
                ctx.clone(),
            )
            .for_each(|_| async {});

    let tx = shutdown_tx.clone();
    tokio::spawn(async move {
        shutdown.await;
        info!("shutting down: finishing running reconciles");
        let _ = tx.send(());
    });
    info!(namespace = ?settings.namespace, watch_filter = ?settings.watch_filter, "controllers started");
    tokio::join!(configs_done, templates_done, cluster_templates_done);
    // The Events of the last reconciles, briefly: a stopping leader should not hold up its
    // successor for best-effort Events.
    let undelivered = ctx.recorder.flush(EVENT_FLUSH).await;
    if undelivered > 0 {
        warn!(undelivered, "stopping with Events not yet published");
    }
    Ok(())
}

/// How long a stopping controller waits for its queued Events.
const EVENT_FLUSH: std::time::Duration = std::time::Duration::from_secs(3);

/// What a kind needs to be watched into a store.
trait Cached:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Cached for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// A controller over every object of `api`, triggered as `triggers::settled` explains.
fn controller_of<K: Cached>(api: Api<K>) -> Controller<K> {
    let (store, events) = watch(
        api,
        watcher::Config::default(),
        |_| {},
        Deletions::Skip,
        |_| {},
    );
    Controller::for_stream(events, store).trigger_backoff(NoSharedBackoff)
}

/// A watch of `api`: the store it fills (objects passed through `trim` first, to drop what is
/// never read) and the objects to trigger reconciles on (see `triggers::settled`). The watch
/// backs off on its own errors.
fn watch<K: Cached>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    deletions: Deletions,
    deleted: impl Fn(&K) + Send + 'static,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) {
    let (store, writer) = reflector::store::<K>();
    let events = watcher(api, config)
        .default_backoff()
        .modify(trim)
        .reflect(writer);
    (store.clone(), settled(events, store, deletions, deleted))
}

/// Drops what the controller never reads from a cached object: its managedFields (often the
/// larger part of an object) and kubectl's last-applied-configuration copy of it.
fn strip<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// A Machine's config, from `spec.bootstrap.configRef`.
fn machine_to_config(machine: Machine) -> Option<ObjectRef<BootplateConfig>> {
    let config_ref = machine.spec.bootstrap.config_ref.as_ref()?;
    (config_ref.kind == "BootplateConfig" && config_ref.api_group == crd_types::GROUP)
        .then(|| ObjectRef::new(&config_ref.name).within(&machine.namespace().unwrap_or_default()))
}

/// The configs of a Cluster's machines, by the cluster-name label CAPI puts on configs, or,
/// for configs without it, through their owner Machine's clusterName.
fn configs_of_cluster(
    configs: &Store<BootplateConfig>,
    cluster: &Cluster,
) -> Vec<ObjectRef<BootplateConfig>> {
    let namespace = cluster.namespace();
    let name = cluster.name_any();
    configs
        .state()
        .iter()
        .filter(|c| c.namespace() == namespace)
        .filter(|c| {
            c.labels()
                .get(CLUSTER_NAME_LABEL)
                .is_none_or(|n| *n == name)
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Drops a deleted template from the validity gauge: templates carry no finalizer, so their
/// reconciler never sees them go.
fn forget_template<K>(metrics: Arc<Metrics>) -> impl Fn(&K) + Send + 'static
where
    K: kube::Resource<DynamicType = ()>,
{
    move |template| metrics.template_validity(&template_controller::metrics_key(template), None)
}

/// Drops a deleted config from the per-state gauges and the oldest-waiting age (configs carry
/// no finalizer either, and one deleted while waiting would otherwise age and alert forever),
/// and hands it to the task that deletes its tokens.
fn forget_config(
    metrics: Arc<Metrics>,
    deleted: tokio::sync::mpsc::UnboundedSender<deleted_configs::DeletedConfig>,
) -> impl Fn(&BootplateConfig) + Send + 'static {
    move |config| {
        metrics.config_deleted(&config_controller::key(config));
        if let Some(config) = deleted_configs::DeletedConfig::of(config) {
            // The receiver lives as long as the controllers; a send fails only at shutdown.
            let _ = deleted.send(config);
        }
    }
}

/// The configs referencing a template.
fn configs_of_template(
    configs: &Store<BootplateConfig>,
    kind: TemplateKind,
    namespace: Option<String>,
    name: &str,
) -> Vec<ObjectRef<BootplateConfig>> {
    configs
        .state()
        .iter()
        .filter(|c| c.spec.template_ref.kind == kind && c.spec.template_ref.name == name)
        .filter(|c| namespace.is_none() || c.namespace() == namespace)
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}
