//! What every reconcile shares: the client, the caches, the settings.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crd_types::BootplateConfig;
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};

use crate::core::outcome::Note;
use crate::core::skip::Record;
use crate::generator::Generators;
use crate::k8s::boot_report::Reports as BootReports;
use crate::k8s::certs::CaHashes;
use crate::k8s::events::Publisher;
use crate::k8s::stores::Stores;
use crate::k8s::templates::CompiledCache;
use crate::k8s::workload::WorkloadClients;
use crate::metrics::Metrics;
use crate::reconcile::memory::{ByConfig, Told};

/// Settings from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace (all when `None`).
    pub namespace: Option<String>,
    /// Reconcile only objects whose `cluster.x-k8s.io/watch-filter` label has this value.
    pub watch_filter: Option<String>,
    /// Reconcile only configs matching this label selector (one shard of them).
    pub shard_selector: Option<String>,
    /// Lifetime of a bootstrap token; refreshed while the Machine has not joined, rotated for
    /// a MachinePool.
    pub bootstrap_token_ttl: Duration,
    /// Timeout for requests to workload clusters.
    pub workload_timeout: Duration,
    /// How often a cluster's boot reports are read, and the least time between two progress
    /// reports of a machine.
    pub boot_report_interval: Duration,
    /// How long a provisioned machine may stay silent before `BootNotStarted`.
    pub boot_not_started_after: Duration,
    /// How many configs are reconciled at once.
    pub concurrency: u16,
    /// How many Normal Events are published (Warnings are not limited).
    pub event_pace: crate::core::pace::EventPace,
    /// This controller's build (a digest of its executable), part of every render's inputs.
    pub build: String,
    /// The client certificate generator calls present (`--generator-client-cert-dir`).
    pub generator_client_cert: Option<crate::generator::client::ClientCert>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: None,
            watch_filter: None,
            shard_selector: None,
            bootstrap_token_ttl: Duration::from_secs(15 * 60),
            workload_timeout: Duration::from_secs(10),
            boot_report_interval: Duration::from_secs(10),
            boot_not_started_after: Duration::from_secs(10 * 60),
            concurrency: 16,
            event_pace: Default::default(),
            build: String::new(),
            generator_client_cert: None,
        }
    }
}

/// The caches the watches prune when the objects they hold are deleted.
#[derive(Clone, Default)]
pub(crate) struct Caches {
    /// Compiled templates, one per template.
    pub compiled: Arc<CompiledCache>,
    /// Clients of workload clusters, one per Cluster.
    pub workloads: Arc<WorkloadClients>,
    /// CA certificate hashes, one per Cluster.
    pub ca_hashes: Arc<CaHashes>,
    /// Generator clients, one per BootstrapGenerator.
    pub generators: Arc<Generators>,
    /// Boot reports, one listing per workload cluster.
    pub boot_reports: Arc<BootReports>,
    /// Each workload cluster's shared report grant and policy, and whether it enforces it.
    pub footprint: Arc<crate::k8s::footprint::Shared>,
}

impl Caches {
    /// Empty caches; generator calls present the client certificate of `settings`.
    pub(crate) fn new(settings: &Settings) -> Caches {
        let generators = Generators::with_client_cert(settings.generator_client_cert.clone());
        Caches {
            generators: Arc::new(generators),
            ..Caches::default()
        }
    }
}

/// How metrics and logs name a config: `<namespace>/<name>`.
pub(crate) fn config_key(config: &BootplateConfig) -> String {
    format!(
        "{}/{}",
        config.namespace().unwrap_or_default(),
        config.name_any()
    )
}

/// What a config is told about once per change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    /// Its network input is ignored (`NetworkIgnored`).
    Network,
    /// Its machine's boot phase (`BootFailed`, `Booted`, ...).
    Boot,
}

/// What this process remembers of one config between reconciles. A restart forgets it all:
/// each field is a shortcut that the objects in the clusters can answer again.
#[derive(Debug, Default)]
pub struct ConfigMemory {
    /// What its last render did, to skip the work when nothing changed since (`core::skip`).
    rendered: Option<Record>,
    /// What it was last told, by topic: a reconcile can read a status older than the previous
    /// reconcile's write (the cache lags the apiserver), and must not tell the same again.
    told: Told<Topic>,
    /// Since when its Machine has been seen joined with its tokens not yet deleted (a token
    /// waits for the machine's last boot report at most a grace after that).
    joined_since: Option<Instant>,
    /// This process deleted its tokens after the join: the reconciles that Machine updates
    /// trigger do not look for them again.
    tokens_deleted: bool,
    /// It released its Cluster's init lock.
    lock_released: bool,
    /// The init lock records its `init` data as handed out.
    init_handed_out: bool,
}

/// Shared state of the reconcilers.
pub struct Context {
    /// Client of the management cluster.
    pub client: Client,
    /// Settings.
    pub settings: Settings,
    /// Watched objects.
    pub stores: Stores,
    /// Compiled templates, one per template revision.
    pub compiled: Arc<CompiledCache>,
    /// Clients of workload clusters, one per kubeconfig Secret version.
    pub workloads: Arc<WorkloadClients>,
    /// CA certificate hashes, one per `<cluster>-ca` Secret version.
    pub ca_hashes: Arc<CaHashes>,
    /// Generator clients and the answers of each config's latest calls.
    pub generators: Arc<Generators>,
    /// Each workload cluster's boot reports as last listed.
    pub boot_reports: Arc<BootReports>,
    /// Each workload cluster's shared report grant and policy.
    pub footprint: Arc<crate::k8s::footprint::Shared>,
    /// What this process remembers of each config (by UID) between reconciles, one record a
    /// config, dropped with it. Boxed: the map's table has room for up to twice its entries,
    /// and at 20 000 configs a table of whole records was 6 MB, a table of pointers 1 MB.
    memory: Mutex<ByConfig<Box<ConfigMemory>>>,
    /// Consecutive failed reconciles per config (by UID), for the retry delay.
    pub failures: crate::reconcile::retry::Failures,
    /// Consecutive `GeneratorFailed` results per config (by UID), for the retry delay.
    pub generator_failures: crate::reconcile::retry::Failures,
    /// Publishes Kubernetes events.
    pub recorder: Publisher,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Becomes true once every store holds its initial listing (any number of waiters).
    synced: tokio::sync::watch::Receiver<bool>,
    mark_synced: tokio::sync::watch::Sender<bool>,
}

impl Context {
    /// A context for `client` with empty caches.
    pub fn new(
        client: Client,
        settings: Settings,
        stores: Stores,
        metrics: Arc<Metrics>,
        caches: Caches,
    ) -> Self {
        let recorder = Publisher::new(
            client.clone(),
            "bootplate",
            std::env::var("POD_NAME").ok(),
            settings.event_pace,
            metrics.clone(),
        );
        let (mark_synced, synced) = tokio::sync::watch::channel(false);
        Context {
            client,
            settings,
            stores,
            compiled: caches.compiled,
            workloads: caches.workloads,
            ca_hashes: caches.ca_hashes,
            generators: caches.generators,
            boot_reports: caches.boot_reports,
            footprint: caches.footprint,
            memory: Default::default(),
            failures: Default::default(),
            generator_failures: Default::default(),
            recorder,
            metrics,
            synced,
            mark_synced,
        }
    }

    /// Publishes the Event `note` about `config`.
    pub fn publish(&self, config: &BootplateConfig, note: Note) {
        let type_ = if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let (reason, action) = (note.reason, note.action);
        crate::k8s::events::publish(&self.recorder, config, type_, reason, action, note.text);
    }

    /// A client of the workload cluster `cluster` in `namespace`.
    pub async fn workload_client(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> crate::error::Result<Client> {
        let timeout = self.settings.workload_timeout;
        self.workloads
            .client(&self.client, &self.stores, namespace, cluster, timeout)
            .await
    }

    /// What config `uid`'s memory answers to `read` (a default memory when there is none).
    fn recall<R>(&self, uid: &str, read: impl FnOnce(&ConfigMemory) -> R) -> R {
        match self.memory.lock().expect("lock").get(uid) {
            Some(memory) => read(memory),
            None => read(&ConfigMemory::default()),
        }
    }

    /// Changes config `uid`'s memory with `change` (pruned of configs gone when it grows).
    fn note<R>(&self, uid: &str, change: impl FnOnce(&mut ConfigMemory) -> R) -> R {
        let mut memory = self.memory.lock().expect("lock");
        memory.update(uid, |m| change(m), || self.live_configs())
    }

    /// Remembers a config's last render.
    pub fn remember(&self, uid: String, record: Record) {
        self.note(&uid, |m| m.rendered = Some(record));
    }

    /// What config `uid`'s last render in this process was, through `read`.
    pub(crate) fn last_rendered<R>(&self, uid: &str, read: impl FnOnce(Option<&Record>) -> R) -> R {
        self.recall(uid, |m| read(m.rendered.as_ref()))
    }

    /// Whether this process deleted the tokens of config `uid` after its Machine joined.
    pub fn tokens_deleted(&self, uid: &str) -> bool {
        self.recall(uid, |m| m.tokens_deleted)
    }

    /// Notes that the tokens of config `uid` are deleted (and forgets when its Machine was seen
    /// joined: that wait is over).
    pub fn mark_tokens_deleted(&self, uid: &str) {
        self.note(uid, |m| {
            m.tokens_deleted = true;
            m.joined_since = None;
        });
    }

    /// Whether config `uid` released its Cluster's init lock.
    pub fn lock_released(&self, uid: &str) -> bool {
        self.recall(uid, |m| m.lock_released)
    }

    /// Notes that config `uid` released its Cluster's init lock.
    pub fn mark_lock_released(&self, uid: &str) {
        self.note(uid, |m| m.lock_released = true);
    }

    /// Whether the init lock already records that config `uid` was handed its `init` data.
    pub fn init_handed_out(&self, uid: &str) -> bool {
        self.recall(uid, |m| m.init_handed_out)
    }

    /// Notes that the init lock records config `uid`'s `init` data as handed out.
    pub fn mark_init_handed_out(&self, uid: &str) {
        self.note(uid, |m| m.init_handed_out = true);
    }

    /// Whether config `uid` was not yet told `text` about `topic` (and notes that it now is):
    /// the Events and counts that go once per change ask this after their status check.
    pub fn first_telling(&self, uid: &str, topic: Topic, text: &str) -> bool {
        self.note(uid, |m| m.told.first(topic, text))
    }

    /// Forgets what config `uid` was told about `topic` (what it was told no longer holds, so
    /// the same told again is news).
    pub fn forget_told(&self, uid: &str, topic: Topic) {
        self.note(uid, |m| m.told.forget(topic));
    }

    /// How long ago this process first saw config `uid`'s Machine joined, its token not yet
    /// deleted (zero the first time).
    pub(crate) fn joined_for(&self, uid: &str) -> Duration {
        self.note(uid, |m| match m.joined_since {
            Some(since) => since.elapsed(),
            None => {
                m.joined_since = Some(Instant::now());
                Duration::ZERO
            }
        })
    }

    /// Forgets everything remembered of config `uid` (it is being deleted).
    pub fn forget_config(&self, uid: &str) {
        self.memory.lock().expect("lock").remove(uid);
        self.failures.succeeded(uid);
        self.generator_failures.succeeded(uid);
        self.generators.forget_config(uid);
        self.boot_reports.stop_waiting(uid);
    }

    /// The UIDs of the configs cached now (to prune what is remembered of deleted ones).
    pub fn live_configs(&self) -> HashSet<String> {
        use kube::ResourceExt;
        self.stores
            .configs
            .state()
            .iter()
            .filter_map(|c| c.uid())
            .collect()
    }

    /// Waits until the stores hold their initial listing, so a reconcile never mistakes a
    /// cache still filling for a missing object.
    pub async fn synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the sender is gone: the process is shutting down.
        let _ = synced.wait_for(|ready| *ready).await;
    }

    /// Waits for the stores (the one waiter on them) and then releases every reconcile waiting
    /// in [`Context::synced`].
    pub async fn watch_stores(&self) {
        self.stores.wait_until_ready().await;
        let _ = self.mark_synced.send(true);
    }
}
