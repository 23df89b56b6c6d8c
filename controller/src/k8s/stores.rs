//! The watch caches a reconcile reads instead of the apiserver.

use std::sync::Arc;

use crd_types::capi::{Cluster, Machine, MachinePool};
use crd_types::{BootplateConfig, BootstrapGenerator, BootstrapTemplate, ClusterBootstrapTemplate};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::core::cached_secret::CachedSecret;

/// Read-only caches kept up to date by watches.
#[derive(Clone)]
pub struct Stores {
    /// Configs.
    pub configs: Store<BootplateConfig>,
    /// Machines.
    pub machines: Store<Machine>,
    /// Clusters.
    pub clusters: Store<Cluster>,
    /// MachinePools (empty when the management cluster does not serve them).
    pub machine_pools: Store<MachinePool>,
    /// Namespaced templates.
    pub templates: Store<BootstrapTemplate>,
    /// Cluster-scoped templates.
    pub cluster_templates: Store<ClusterBootstrapTemplate>,
    /// Generators (cluster-scoped).
    pub generators: Store<BootstrapGenerator>,
    /// What is read of the Secrets labelled `cluster.x-k8s.io/cluster-name` (CAPI's
    /// `<cluster>-ca` and `<cluster>-kubeconfig` and the data Secrets), never their data. Their
    /// resourceVersions tell when a cached CA hash, workload client or data Secret comparison
    /// is still good, without reading the Secret.
    pub secrets: Store<CachedSecret>,
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
        let _ = self.machine_pools.wait_until_ready().await;
        let _ = self.templates.wait_until_ready().await;
        let _ = self.cluster_templates.wait_until_ready().await;
        let _ = self.generators.wait_until_ready().await;
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
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<CachedSecret>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The Machine `name` in `namespace`.
    pub fn machine(&self, namespace: &str, name: &str) -> Option<Arc<Machine>> {
        self.machines.get(&ObjectRef::new(name).within(namespace))
    }

    /// The MachinePool `name` in `namespace`.
    pub fn machine_pool(&self, namespace: &str, name: &str) -> Option<Arc<MachinePool>> {
        self.machine_pools
            .get(&ObjectRef::new(name).within(namespace))
    }

    /// The Cluster of the Machine or MachinePool in `namespace` whose bootstrap configRef names
    /// the BootplateConfig `config`, by name: CAPI adopts a config (ownerReference,
    /// cluster-name label) only while the Cluster is not paused, so this is how an unadopted
    /// config finds its Cluster.
    pub fn cluster_referencing(&self, namespace: &str, config: &str) -> Option<Arc<Cluster>> {
        let names_config = |config_ref: Option<&crd_types::capi::ContractReference>| {
            config_ref.is_some_and(|r| {
                r.kind == "BootplateConfig" && r.api_group == crd_types::GROUP && r.name == config
            })
        };
        let in_namespace =
            |meta: &kube::api::ObjectMeta| meta.namespace.as_deref() == Some(namespace);
        let machine = self.machines.state().into_iter().find(|m| {
            in_namespace(&m.metadata) && names_config(m.spec.bootstrap.config_ref.as_ref())
        });
        let cluster_name = match machine {
            Some(machine) => machine.spec.cluster_name.clone(),
            None => self
                .machine_pools
                .state()
                .into_iter()
                .find(|p| {
                    in_namespace(&p.metadata)
                        && names_config(p.spec.template.spec.bootstrap.config_ref.as_ref())
                })?
                .spec
                .cluster_name
                .clone(),
        };
        self.cluster(namespace, &cluster_name)
    }

    /// The generator `name`.
    pub fn generator(&self, name: &str) -> Option<Arc<BootstrapGenerator>> {
        self.generators.get(&ObjectRef::new(name))
    }

    /// The Cluster `name` in `namespace`.
    pub fn cluster(&self, namespace: &str, name: &str) -> Option<Arc<Cluster>> {
        self.clusters.get(&ObjectRef::new(name).within(namespace))
    }
}
