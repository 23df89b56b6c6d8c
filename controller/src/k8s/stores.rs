//! The watch caches a reconcile reads instead of the apiserver.

use std::sync::Arc;

use crd_types::capi::{Cluster, Machine, MachinePool};
use crd_types::{BootplateConfig, BootstrapGenerator, BootstrapTemplate, ClusterBootstrapTemplate};
use kube::ResourceExt;
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

    /// The Cluster of a config no Machine or MachinePool owns yet (CAPI adopts a config only
    /// while its Cluster is not paused): the one its cluster-name label names, which CAPI sets
    /// on the configs it creates from a template; else the one of the Machine or MachinePool
    /// whose configRef names it, which takes a scan of the cached Machines.
    pub fn cluster_of_unadopted(&self, config: &BootplateConfig) -> Option<Arc<Cluster>> {
        let namespace = config.metadata.namespace.as_deref()?;
        let labelled = config.labels().get(crd_types::capi::CLUSTER_NAME_LABEL);
        labelled
            .and_then(|cluster| self.cluster(namespace, cluster))
            .or_else(|| self.cluster_referencing(namespace, &config.name_any()))
    }

    /// The Cluster of the Machine or MachinePool in `namespace` whose bootstrap configRef names
    /// the BootplateConfig `config`, by name.
    fn cluster_referencing(&self, namespace: &str, config: &str) -> Option<Arc<Cluster>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn filled<K>(objects: Vec<K>) -> Store<K>
    where
        K: kube::Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let (reader, mut writer) = store::<K>();
        for object in objects {
            writer.apply_watcher_event(&Event::Apply(object));
        }
        reader
    }

    fn stores(machines: Vec<Machine>, clusters: Vec<Cluster>) -> Stores {
        Stores {
            configs: filled(vec![]),
            machines: filled(machines),
            clusters: filled(clusters),
            machine_pools: filled(vec![]),
            templates: filled(vec![]),
            cluster_templates: filled(vec![]),
            generators: filled(vec![]),
            secrets: filled(vec![]),
        }
    }

    fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
        serde_json::from_value(value).unwrap()
    }

    fn cluster(name: &str) -> Cluster {
        object(json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {}}))
    }

    fn machine(name: &str, cluster: &str, config: &str) -> Machine {
        object(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterName": cluster, "bootstrap": {"configRef": {
                "apiGroup": crd_types::GROUP, "kind": "BootplateConfig", "name": config}}},
        }))
    }

    fn config(name: &str, cluster_label: Option<&str>) -> BootplateConfig {
        let labels = cluster_label.map(|c| json!({crd_types::capi::CLUSTER_NAME_LABEL: c}));
        object(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"templateRef": {"kind": "BootstrapTemplate", "name": "t"}},
        }))
    }

    fn name_of(cluster: Option<Arc<Cluster>>) -> Option<String> {
        cluster.and_then(|c| c.metadata.name.clone())
    }

    #[test]
    fn an_unadopted_config_finds_its_cluster_by_label_else_by_the_machine_naming_it() {
        let stores = stores(
            vec![machine("m-0", "c2", "w-0"), machine("m-1", "c2", "w-1")],
            vec![cluster("c1"), cluster("c2")],
        );
        // The label CAPI sets wins, without a look at the Machines.
        assert_eq!(
            name_of(stores.cluster_of_unadopted(&config("w-0", Some("c1")))),
            Some("c1".into())
        );
        // Unlabelled, or labelled with a Cluster not cached: the Machine's Cluster.
        for label in [None, Some("gone")] {
            assert_eq!(
                name_of(stores.cluster_of_unadopted(&config("w-1", label))),
                Some("c2".into()),
                "{label:?}"
            );
        }
        // Neither: no Cluster.
        assert_eq!(
            name_of(stores.cluster_of_unadopted(&config("w-9", None))),
            None
        );
    }
}
