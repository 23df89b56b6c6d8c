//! What every reconcile shares: the client, the caches, the settings.

use std::time::Duration;

use crd_types::capi::{Cluster, Machine};
use crd_types::{BootplateConfig, BootstrapTemplate, ClusterBootstrapTemplate};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::certs::CaHashes;
use crate::config_controller::Record;
use crate::events::Publisher;
use crate::memory::ByConfig;
use crate::templates::CompiledCache;
use crate::workload::WorkloadClients;

/// Settings from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace (all when `None`).
    pub namespace: Option<String>,
    /// Reconcile only objects whose `cluster.x-k8s.io/watch-filter` label has this value.
    pub watch_filter: Option<String>,
    /// Lifetime of a bootstrap token; refreshed while the Machine has not joined.
    pub bootstrap_token_ttl: Duration,
    /// Timeout for requests to workload clusters.
    pub workload_timeout: Duration,
    /// How many configs are reconciled at once.
    pub concurrency: u16,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: None,
            watch_filter: None,
            bootstrap_token_ttl: Duration::from_secs(15 * 60),
            workload_timeout: Duration::from_secs(10),
            concurrency: 16,
        }
    }
}

/// Read-only caches kept up to date by watches.
#[derive(Clone)]
pub struct Stores {
    /// Configs.
    pub configs: Store<BootplateConfig>,
    /// Machines.
    pub machines: Store<Machine>,
    /// Clusters.
    pub clusters: Store<Cluster>,
    /// Namespaced templates.
    pub templates: Store<BootstrapTemplate>,
    /// Cluster-scoped templates.
    pub cluster_templates: Store<ClusterBootstrapTemplate>,
    /// Metadata only (no data, no managedFields) of the Secrets labelled
    /// `cluster.x-k8s.io/cluster-name`: CAPI's `<cluster>-ca` and `<cluster>-kubeconfig` and
    /// the data Secrets. Their resourceVersions tell when a cached CA hash, workload client or
    /// data Secret comparison is still good, without reading the Secret.
    pub secrets: Store<PartialObjectMeta<Secret>>,
}

impl Stores {
    /// Waits until the stores of related objects hold their initial listing. Only one task may
    /// wait here: a store's readiness wakes a single waiter, so reconciles wait on
    /// [`Context::synced`] instead, which this feeds. The configs store is left out: the
    /// controller itself holds every reconcile until it is ready, and is its one waiter.
    pub async fn wait_until_ready(&self) {
        // A dropped writer means the controller is shutting down; nothing to wait for then.
        let _ = self.machines.wait_until_ready().await;
        let _ = self.clusters.wait_until_ready().await;
        let _ = self.templates.wait_until_ready().await;
        let _ = self.cluster_templates.wait_until_ready().await;
        let _ = self.secrets.wait_until_ready().await;
    }

    /// The resourceVersion of Secret `name` in `namespace`, when it is labelled with its
    /// cluster's name (so watched); `None` otherwise, and then callers read it.
    pub fn secret_version(&self, namespace: &str, name: &str) -> Option<String> {
        self.secrets
            .get(&ObjectRef::new(name).within(namespace))
            .and_then(|s| s.metadata.resource_version.clone())
    }

    /// The cached metadata of Secret `name` in `namespace` (labelled ones only).
    pub fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<std::sync::Arc<PartialObjectMeta<Secret>>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The Machine `name` in `namespace`.
    pub fn machine(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Machine>> {
        self.machines.get(&ObjectRef::new(name).within(namespace))
    }

    /// The Machine in `namespace` whose bootstrap configRef names the BootplateConfig `config`:
    /// CAPI adopts a config (ownerReference, cluster-name label) only while the Cluster is not
    /// paused, so this is how an unadopted config finds its Cluster.
    pub fn machine_referencing(
        &self,
        namespace: &str,
        config: &str,
    ) -> Option<std::sync::Arc<Machine>> {
        self.machines.state().into_iter().find(|m| {
            m.metadata.namespace.as_deref() == Some(namespace)
                && m.spec.bootstrap.config_ref.as_ref().is_some_and(|r| {
                    r.kind == "BootplateConfig"
                        && r.api_group == "bootstrap.bootplate.dev"
                        && r.name == config
                })
        })
    }

    /// The Cluster `name` in `namespace`.
    pub fn cluster(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Cluster>> {
        self.clusters.get(&ObjectRef::new(name).within(namespace))
    }
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
    pub compiled: CompiledCache,
    /// Clients of workload clusters, one per kubeconfig Secret version.
    pub workloads: WorkloadClients,
    /// CA certificate hashes, one per `<cluster>-ca` Secret version.
    pub ca_hashes: CaHashes,
    /// What the last render of each config (by UID) did, to skip the work when nothing
    /// changed since (see `config_controller`).
    pub rendered: std::sync::Mutex<ByConfig<Record>>,
    /// Configs (by UID) of joined Machines whose bootstrap tokens this process deleted, so
    /// the reconciles that Machine updates trigger do not look for them again.
    pub tokens_deleted: std::sync::Mutex<ByConfig<()>>,
    /// Consecutive failed reconciles per config (by UID), for the retry delay.
    pub failures: crate::retry::Failures,
    /// Publishes Kubernetes events.
    pub recorder: Publisher,
    /// Prometheus metrics.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
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
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Self {
        let recorder = Publisher::new(
            client.clone(),
            "bootplate",
            std::env::var("POD_NAME").ok(),
            metrics.clone(),
        );
        let (mark_synced, synced) = tokio::sync::watch::channel(false);
        Context {
            client,
            settings,
            stores,
            compiled: CompiledCache::default(),
            workloads: WorkloadClients::default(),
            ca_hashes: CaHashes::default(),
            rendered: Default::default(),
            tokens_deleted: Default::default(),
            failures: Default::default(),
            recorder,
            metrics,
            synced,
            mark_synced,
        }
    }

    /// The UIDs of the configs cached now (to prune what is remembered of deleted ones).
    pub fn live_configs(&self) -> std::collections::HashSet<String> {
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
