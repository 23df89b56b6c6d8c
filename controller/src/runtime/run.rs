//! `bootplate run`: the watches, the stores they fill, and the controllers over them.

use std::future::Future;
use std::sync::Arc;

use crd_types::capi::{CLUSTER_NAME_LABEL, Cluster, Machine, MachinePool, WATCH_FILTER_LABEL};
use crd_types::{
    BootplateConfig, BootstrapGenerator, BootstrapTemplate, ClusterBootstrapTemplate, TemplateKind,
};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{error, info, warn};

use crate::core::cached_secret::CachedSecret;
use crate::core::shard;
use crate::k8s::stores::Stores;
use crate::k8s::templates::{CompiledCache, display_of};
use crate::metrics::Metrics;
use crate::reconcile::boot;
use crate::reconcile::context::{Caches, Context, Settings};
use crate::reconcile::deleted::{self, DeletedConfig};
use crate::reconcile::{config as config_controller, template as template_controller};
use crate::runtime::http::Readiness;
use crate::runtime::leader::LeaderElection;
use crate::runtime::triggers::{Deletions, NoSharedBackoff, settled};
use crate::runtime::trim::{self, strip};

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
pub async fn main(args: crate::runtime::flags::RunArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    crate::runtime::logging::init(args.log_format, args.log_level.as_deref())?;
    // One crypto provider for every TLS connection (management and workload clusters).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = management_client(&args).await?;
    if let Some(selector) = &args.shard_selector {
        check_selector(&client, args.namespace.as_deref(), selector).await?;
    }
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    let (metrics_addr, health_addr) = (args.metrics_addr, args.health_addr);
    crate::runtime::http::serve(
        metrics_addr,
        health_addr,
        metrics.clone(),
        readiness.clone(),
    )
    .await?;
    if let Some(addr) = args.webhook_addr {
        crate::webhook::serve(addr, &args.webhook_cert_dir, client.clone()).await?;
    }
    if let Some(addr) = args.extension_addr {
        let cert_dir = args
            .extension_cert_dir
            .as_ref()
            .unwrap_or(&args.webhook_cert_dir);
        let callers = crate::webhook::tls::ClientAuth::CertificateFrom(
            (args.extension_client_ca.clone()).expect("checked by RunArgs::validate"),
        );
        crate::extension::serve(addr, cert_dir, callers, client.clone(), metrics.clone()).await?;
    }
    let mut settings = args.settings();
    if let Some(dir) = &args.generator_client_cert_dir {
        let cert = crate::webhook::tls::ReloadingCert::watch(dir)
            .map_err(|e| anyhow::anyhow!("--generator-client-cert-dir {}: {e}", dir.display()))?;
        settings.generator_client_cert = Some(cert);
    }
    let stopped = stop_signal();
    // Hashing the executable takes a moment: a standby is ready meanwhile.
    let build = tokio::task::spawn_blocking(build_id);
    let running = Running {
        client,
        settings,
        build,
        metrics,
        readiness,
    };
    if !args.leader_elect {
        running.metrics.set_leader(true);
        return running.start(stopped()).await;
    }
    lead(&args, running, stopped).await
}

/// What the controllers run with.
struct Running {
    client: Client,
    settings: Settings,
    /// The build digest, being computed (see [`build_id`]).
    build: tokio::task::JoinHandle<String>,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

impl Running {
    /// Runs the controllers, once the build digest is known, until `shutdown`.
    async fn start(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let settings = with_build(self.settings, self.build).await;
        run(
            self.client,
            settings,
            self.metrics,
            self.readiness,
            shutdown,
        )
        .await
    }
}

async fn management_client(args: &crate::runtime::flags::RunArgs) -> anyhow::Result<Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// Has the apiserver check `--shard-selector` with a list of at most one config: a selector
/// it refuses fails the start with its reason, where the watch would retry it forever.
async fn check_selector(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
) -> anyhow::Result<()> {
    let params = kube::api::ListParams::default().labels(selector).limit(1);
    match api::<BootplateConfig>(client, namespace)
        .list_metadata(&params)
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 400 => {
            anyhow::bail!(
                "--shard-selector {selector:?} is not a valid label selector: {}",
                status.message
            )
        }
        Err(e) => Err(anyhow::Error::new(e).context("listing configs with --shard-selector")),
        Ok(_) => Ok(()),
    }
}

/// A function giving futures that resolve on SIGTERM or SIGINT (any number of them).
fn stop_signal() -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    move || {
        let mut rx = stop_rx.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|stop| *stop).await;
        })
    }
}

/// Stands by until this replica leads, then runs the controllers while it holds the Lease. A
/// replica that loses the Lease stops at once: dropping the controllers cancels every running
/// reconcile at its next request, where draining them would let this replica write while
/// another leads. On SIGTERM it drains, still renewing, then releases the Lease.
async fn lead(
    args: &crate::runtime::flags::RunArgs,
    running: Running,
    stopped: impl Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
) -> anyhow::Result<()> {
    let identity = std::env::var("POD_NAME")
        .unwrap_or_else(|_| format!("{}-{}", hostname(), std::process::id()));
    let (namespace, lease) = (&args.leader_elect_namespace, args.lease_name());
    info!(lease = %lease, namespace = %namespace, "standing for leader");
    let election = LeaderElection::new(
        running.client.clone(),
        namespace,
        &lease,
        identity,
        args.leader_timing(),
    );
    // A standby is ready: it serves its purpose by waiting.
    running.readiness.set(true);
    let acquired = tokio::select! {
        acquired = election.acquire() => acquired,
        _ = stopped() => {
            info!("stopped while standing by");
            return Ok(());
        }
    };
    let metrics = running.metrics.clone();
    running.readiness.set(false);
    metrics.set_leader(true);
    let controllers = running.start(stopped());
    let result = tokio::select! {
        result = controllers => result,
        _ = election.hold(acquired) => {
            metrics.set_leader(false);
            error!("lost the leader lease: stopping at once");
            anyhow::bail!("lost the leader lease; exiting so a fresh process can stand by");
        }
    };
    metrics.set_leader(false);
    election.release().await;
    result
}

/// `settings` with the build digest once it is computed.
async fn with_build(settings: Settings, build: tokio::task::JoinHandle<String>) -> Settings {
    let build = build
        .await
        .unwrap_or_else(|_| format!("unread-{}", rand::random::<u64>()));
    Settings { build, ..settings }
}

/// A digest of this executable. It is part of every render's inputs: a rebuilt image (say,
/// with a render fix) renders every config again, where a version number that did not change
/// would let it skip them. When the executable cannot be read, a value of this process alone
/// has every config rendered after each start: slower, never wrong.
fn build_id() -> String {
    let digest = std::env::current_exe().and_then(|path| file_digest(&path));
    digest.unwrap_or_else(|e| {
        warn!(error = %e, "cannot read the executable; every config is rendered again");
        format!("unread-{}", rand::random::<u64>())
    })
}

/// The SHA-256 of a file, read in small pieces: an executable with debug information can be
/// a hundred megabytes, which must not become the process's peak memory.
fn file_digest(path: &std::path::Path) -> std::io::Result<String> {
    use sha2::Digest;
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0; 64 * 1024];
    loop {
        match file.read(&mut buffer)? {
            0 => return Ok(hex::encode(hasher.finalize())),
            read => hasher.update(&buffer[..read]),
        }
    }
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

/// The trigger streams of the config controller, from the watches that fill the stores.
struct Triggers {
    configs: BoxStream<'static, Result<BootplateConfig, watcher::Error>>,
    data_secrets: BoxStream<'static, Result<CachedSecret, watcher::Error>>,
    machines: BoxStream<'static, Result<Machine, watcher::Error>>,
    machine_pools: BoxStream<'static, Result<MachinePool, watcher::Error>>,
    clusters: BoxStream<'static, Result<Cluster, watcher::Error>>,
    templates: BoxStream<'static, Result<BootstrapTemplate, watcher::Error>>,
    cluster_templates: BoxStream<'static, Result<ClusterBootstrapTemplate, watcher::Error>>,
    generators: BoxStream<'static, Result<BootstrapGenerator, watcher::Error>>,
}

/// Starts the watches: the stores reconciles read, and the streams that trigger them.
fn watches(
    client: &Client,
    settings: &Settings,
    metrics: &Arc<Metrics>,
    caches: &Caches,
    deleted_configs: tokio::sync::mpsc::UnboundedSender<DeletedConfig>,
    pools_served: bool,
) -> (Stores, Triggers) {
    let compiled = &caches.compiled;
    let ns = settings.namespace.as_deref();
    let filtered = || match &settings.watch_filter {
        Some(value) => watcher::Config::default().labels(&format!("{WATCH_FILTER_LABEL}={value}")),
        None => watcher::Config::default(),
    };
    let (machines, machine_events) = watch(
        api(client, ns),
        filtered(),
        trim::machine,
        Deletions::Skip,
        |_| {},
    );
    let (machine_pools, machine_pool_events) =
        pool_watch(pools_served.then(|| api(client, ns)), filtered());
    let (clusters, cluster_events) = watch(
        api(client, ns),
        filtered(),
        strip,
        Deletions::Skip,
        forget_cluster(caches),
    );
    let ((templates, template_events), (cluster_templates, cluster_template_events)) =
        watch_templates(client, ns, metrics, compiled);
    let (generators, generator_events) = watch_generators(client, caches);
    let (secrets, data_secrets) = watch_secrets(client, ns);
    let forget_config = forget_config(metrics.clone(), deleted_configs);
    // Configs: those of this shard only; what they read (Machines, Clusters) in full.
    let filter = settings.watch_filter.as_deref();
    let config_scope = match shard::config_selector(
        filter.map(|value| (WATCH_FILTER_LABEL, value)),
        settings.shard_selector.as_deref(),
    ) {
        Some(selector) => watcher::Config::default().labels(&selector),
        None => watcher::Config::default(),
    };
    let (configs, config_events) = watch(
        api(client, ns),
        config_scope,
        strip,
        Deletions::Skip,
        forget_config,
    );
    let stores = Stores {
        configs,
        machines,
        clusters,
        machine_pools,
        templates,
        cluster_templates,
        generators,
        secrets,
    };
    let triggers = Triggers {
        configs: config_events.boxed(),
        data_secrets: data_secrets.boxed(),
        machines: machine_events.boxed(),
        machine_pools: machine_pool_events,
        clusters: cluster_events.boxed(),
        templates: template_events.boxed(),
        cluster_templates: cluster_template_events.boxed(),
        generators: generator_events.boxed(),
    };
    (stores, triggers)
}

/// The watch of Secrets: metadata only, of those labelled with a cluster name (CAPI's
/// certificate and kubeconfig Secrets, and the data Secrets), cached as what is read of them
/// (`trim::secret`); the data Secrets also trigger their config's reconcile.
#[allow(clippy::type_complexity)]
fn watch_secrets(
    client: &Client,
    ns: Option<&str>,
) -> (
    Store<CachedSecret>,
    impl futures::Stream<Item = Result<CachedSecret, watcher::Error>> + Send + 'static,
) {
    let (secrets, events) = watch_as(
        api::<PartialObjectMeta<Secret>>(client, ns),
        watcher::Config::default().labels(CLUSTER_NAME_LABEL),
        trim::secret,
        Deletions::Include,
        |_| {},
    );
    let data_secrets = events.try_filter(|s| std::future::ready(s.is_data_secret()));
    (secrets, data_secrets)
}

/// The watches of both template kinds, every one of them (any config may name any template);
/// a deleted template's compiled form and metrics are dropped.
#[allow(clippy::type_complexity)]
fn watch_templates(
    client: &Client,
    ns: Option<&str>,
    metrics: &Arc<Metrics>,
    compiled: &Arc<CompiledCache>,
) -> (
    (
        Store<BootstrapTemplate>,
        impl futures::Stream<Item = Result<BootstrapTemplate, watcher::Error>> + Send + 'static,
    ),
    (
        Store<ClusterBootstrapTemplate>,
        impl futures::Stream<Item = Result<ClusterBootstrapTemplate, watcher::Error>> + Send + 'static,
    ),
) {
    let namespaced = watch(
        api(client, ns),
        watcher::Config::default(),
        |_| {},
        Deletions::Include,
        forget_template(metrics, compiled),
    );
    let cluster = watch(
        Api::all(client.clone()),
        watcher::Config::default(),
        |_| {},
        Deletions::Include,
        forget_template(metrics, compiled),
    );
    (namespaced, cluster)
}

/// The watch of BootstrapGenerators; a deleted one's client is dropped.
fn watch_generators(
    client: &Client,
    caches: &Caches,
) -> (
    Store<BootstrapGenerator>,
    impl futures::Stream<Item = Result<BootstrapGenerator, watcher::Error>> + Send + 'static,
) {
    let generators = caches.generators.clone();
    let forget = move |g: &BootstrapGenerator| generators.forget(&g.name_any());
    let config = watcher::Config::default();
    watch(
        Api::all(client.clone()),
        config,
        strip,
        Deletions::Include,
        forget,
    )
}

/// The config controller: a config is reconciled when it, its data Secret, its Machine or
/// MachinePool, its Cluster, its template or a generator its template names changes.
fn config_controller(
    triggers: Triggers,
    boot_reports_changed: impl futures::Stream<Item = ObjectRef<BootplateConfig>> + Send + 'static,
    stores: &Stores,
    concurrency: u16,
) -> Controller<BootplateConfig> {
    let configs = stores.configs.clone();
    let (by_cluster, by_template, by_cluster_template) =
        (configs.clone(), configs.clone(), configs.clone());
    let by_generator = stores.clone();
    Controller::for_stream(triggers.configs, configs)
        .reconcile_on(data_secret_changes(triggers.data_secrets))
        .watches_stream(triggers.machines, machine_to_config)
        .watches_stream(triggers.machine_pools, pool_to_config)
        .watches_stream(triggers.clusters, move |cluster: Cluster| {
            configs_of_cluster(&by_cluster, &cluster)
        })
        .watches_stream(triggers.templates, move |template: BootstrapTemplate| {
            let (namespace, name) = (template.namespace(), template.name_any());
            configs_of_template(
                &by_template,
                TemplateKind::BootstrapTemplate,
                namespace,
                &name,
            )
        })
        .watches_stream(
            triggers.cluster_templates,
            move |template: ClusterBootstrapTemplate| {
                let kind = TemplateKind::ClusterBootstrapTemplate;
                configs_of_template(&by_cluster_template, kind, None, &template.name_any())
            },
        )
        .watches_stream(triggers.generators, move |generator: BootstrapGenerator| {
            configs_of_generator(&by_generator, &generator.name_any())
        })
        .reconcile_on(boot_reports_changed)
        .trigger_backoff(NoSharedBackoff)
        .with_config(controller::Config::default().concurrency(concurrency))
}

/// Runs the controllers until `shutdown` resolves, then lets running reconciles finish.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let caches = Caches::new(&settings);
    let (deleted_tx, deleted_rx) = deleted::channel();
    let pools = machine_pools_served(&client).await?;
    let (stores, triggers) = watches(&client, &settings, &metrics, &caches, deleted_tx, pools);
    let (report_changed_tx, report_changed_rx) = futures::channel::mpsc::unbounded();
    let controller = config_controller(triggers, report_changed_rx, &stores, settings.concurrency);
    let ctx = Arc::new(Context::new(
        client.clone(),
        settings.clone(),
        stores,
        metrics,
        caches,
    ));
    tokio::spawn(deleted::clean_up_deleted(ctx.clone(), deleted_rx));
    let poller = tokio::spawn(boot::poll(ctx.clone(), report_changed_tx));
    tokio::spawn(ready_once_synced(ctx.clone(), readiness));
    let (shutdown_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let signal = |tx: &tokio::sync::broadcast::Sender<()>| {
        let mut rx = tx.subscribe();
        async move {
            let _ = rx.recv().await;
        }
    };
    let configs_done = controller
        .graceful_shutdown_on(signal(&shutdown_tx))
        .run(
            config_controller::reconcile,
            config_controller::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    // The template controllers keep stores of their own: they run apart from the config
    // controller, whose trigger streams each have one consumer.
    let ns = settings.namespace.as_deref();
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
    tokio::spawn(async move {
        shutdown.await;
        info!("shutting down: finishing running reconciles");
        let _ = shutdown_tx.send(());
    });
    info!(
        namespace = ?settings.namespace,
        watch_filter = ?settings.watch_filter,
        shard_selector = ?settings.shard_selector,
        "controllers started"
    );
    tokio::join!(configs_done, templates_done, cluster_templates_done);
    poller.abort();
    // The Events of the last reconciles, briefly: a stopping leader should not hold up its
    // successor for best-effort Events.
    let undelivered = ctx.recorder.flush(EVENT_FLUSH).await;
    if undelivered > 0 {
        warn!(undelivered, "stopping with Events not yet published");
    }
    Ok(())
}

/// Marks the process ready once every store has its first list.
async fn ready_once_synced(ctx: Arc<Context>, readiness: Arc<Readiness>) {
    ctx.watch_stores().await;
    readiness.set(true);
    info!("caches synced");
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
    mut trim: impl FnMut(&mut K) + Send + 'static,
    deletions: Deletions,
    deleted: impl Fn(&K) + Send + 'static,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) {
    let trimmed = move |mut object: K| {
        trim(&mut object);
        object
    };
    watch_as(api, config, trimmed, deletions, deleted)
}

/// [`watch`] of objects of kind `A`, cached and triggering as what `convert` makes of each
/// (a type that holds only what is read).
fn watch_as<A: Cached, K>(
    api: Api<A>,
    config: watcher::Config,
    mut convert: impl FnMut(A) -> K + Send + 'static,
    deletions: Deletions,
    deleted: impl Fn(&K) + Send + 'static,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let events = watcher(api, config)
        .default_backoff()
        .map_ok(move |event| trim::map_event(event, &mut convert))
        .reflect(writer);
    (store.clone(), settled(events, store, deletions, deleted))
}

/// A Machine's config, from `spec.bootstrap.configRef`.
fn machine_to_config(machine: Machine) -> Option<ObjectRef<BootplateConfig>> {
    config_named(&machine.spec.bootstrap, machine.namespace())
}

/// A MachinePool's config, from `spec.template.spec.bootstrap.configRef`.
fn pool_to_config(pool: MachinePool) -> Option<ObjectRef<BootplateConfig>> {
    config_named(&pool.spec.template.spec.bootstrap, pool.namespace())
}

/// The BootplateConfig a bootstrap reference names, in `namespace`.
fn config_named(
    bootstrap: &crd_types::capi::MachineBootstrap,
    namespace: Option<String>,
) -> Option<ObjectRef<BootplateConfig>> {
    let config_ref = bootstrap.config_ref.as_ref()?;
    (config_ref.kind == "BootplateConfig" && config_ref.api_group == crd_types::GROUP)
        .then(|| ObjectRef::new(&config_ref.name).within(&namespace.unwrap_or_default()))
}

/// Whether the management cluster serves `cluster.x-k8s.io/v1beta2` MachinePools (Cluster API
/// installs the kind with its core components; a cluster without it gets no MachinePool watch,
/// whose listing would never complete). Looked up once at start: a MachinePool kind installed
/// later is watched after a restart.
async fn machine_pools_served(client: &Client) -> anyhow::Result<bool> {
    let served = match client
        .list_api_group_resources(&MachinePool::api_version(&()))
        .await
    {
        Ok(list) => list
            .resources
            .iter()
            .any(|r| r.name == MachinePool::plural(&())),
        Err(kube::Error::Api(status)) if status.code == 404 => false,
        Err(e) => return Err(anyhow::Error::new(e).context("discovering cluster.x-k8s.io/v1beta2")),
    };
    if !served {
        warn!(
            "the management cluster serves no cluster.x-k8s.io/v1beta2 MachinePools: configs owned by MachinePools are not rendered until bootplate restarts with them served"
        );
    }
    Ok(served)
}

/// The MachinePool watch; without `pools` (the kind is not served), a store that holds nothing
/// and is ready at once, and no triggers.
fn pool_watch(
    pools: Option<Api<MachinePool>>,
    config: watcher::Config,
) -> (
    Store<MachinePool>,
    BoxStream<'static, Result<MachinePool, watcher::Error>>,
) {
    if let Some(pools) = pools {
        let (store, events) = watch(pools, config, strip, Deletions::Skip, |_| {});
        return (store, events.boxed());
    }
    let (store, mut writer) = reflector::store::<MachinePool>();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (store, futures::stream::empty().boxed())
}

/// The configs whose data Secret changed, by the Secret's data Secret label (the cache keeps
/// no ownerReferences, `trim::secret`). The watch retries on its own; its errors are logged.
fn data_secret_changes(
    data_secrets: BoxStream<'static, Result<CachedSecret, watcher::Error>>,
) -> impl futures::Stream<Item = ObjectRef<BootplateConfig>> + Send + 'static {
    data_secrets.filter_map(|changed| {
        let config = match changed {
            Ok(secret) => data_secret_to_config(&secret),
            Err(e) => {
                warn!(error = %e, "watch of data Secrets failed; retrying");
                None
            }
        };
        std::future::ready(config)
    })
}

/// The config a data Secret belongs to, by its data Secret label.
fn data_secret_to_config(secret: &CachedSecret) -> Option<ObjectRef<BootplateConfig>> {
    let namespace = secret.metadata.namespace.as_deref()?;
    let config = secret.data_secret_of.as_deref()?;
    Some(ObjectRef::new(config).within(namespace))
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

/// Drops the workload client, CA, boot reports and shared objects' state of a deleted Cluster.
fn forget_cluster(caches: &Caches) -> impl Fn(&Cluster) + Send + 'static {
    let caches = caches.clone();
    move |cluster| {
        let (namespace, name) = (cluster.namespace().unwrap_or_default(), cluster.name_any());
        caches.workloads.forget(&namespace, &name);
        caches.ca_hashes.forget(&namespace, &name);
        caches.boot_reports.forget(&namespace, &name);
        caches.footprint.forget(&namespace, &name);
    }
}

/// Drops a deleted template from the validity gauge and its compiled form from the cache:
/// templates carry no finalizer, so their reconciler never sees them go.
fn forget_template<K>(
    metrics: &Arc<Metrics>,
    compiled: &Arc<CompiledCache>,
) -> impl Fn(&K) + Send + 'static
where
    K: kube::Resource<DynamicType = ()>,
{
    let (metrics, compiled) = (metrics.clone(), compiled.clone());
    move |template| {
        metrics.template_validity(&template_controller::metrics_key(template), None);
        compiled.remove(&display_of(template));
    }
}

/// Drops a deleted config from the per-state gauges and the oldest-waiting age (configs carry
/// no finalizer either, and one deleted while waiting would otherwise age and alert forever),
/// and hands it to the task that deletes its tokens and node payload.
fn forget_config(
    metrics: Arc<Metrics>,
    deleted: tokio::sync::mpsc::UnboundedSender<DeletedConfig>,
) -> impl Fn(&BootplateConfig) + Send + 'static {
    move |config| {
        metrics.config_deleted(&crate::reconcile::context::config_key(config));
        if let Some(config) = DeletedConfig::of(config) {
            // The receiver lives as long as the controllers; a send fails only at shutdown.
            let _ = deleted.send(config);
        }
    }
}

/// The configs whose template has a part naming generator `name`.
fn configs_of_generator(stores: &Stores, name: &str) -> Vec<ObjectRef<BootplateConfig>> {
    let names_it = |spec: &crd_types::TemplateSpec| {
        spec.parts
            .iter()
            .any(|p| p.generator.as_ref().is_some_and(|g| g.name == name))
    };
    let mut configs = Vec::new();
    for template in stores.templates.state() {
        if names_it(&template.spec) {
            let kind = TemplateKind::BootstrapTemplate;
            let found = configs_of_template(
                &stores.configs,
                kind,
                template.namespace(),
                &template.name_any(),
            );
            configs.extend(found);
        }
    }
    for template in stores.cluster_templates.state() {
        if names_it(&template.spec) {
            let kind = TemplateKind::ClusterBootstrapTemplate;
            configs.extend(configs_of_template(
                &stores.configs,
                kind,
                None,
                &template.name_any(),
            ));
        }
    }
    configs
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_digest_is_the_sha256_of_its_bytes() {
        use sha2::Digest;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exe");
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            file_digest(&path).unwrap(),
            hex::encode(sha2::Sha256::digest(&bytes))
        );
    }
}
