//! Machines for the "as it ships" scenarios: Cluster API and bootplate run in the pod cluster's
//! Pods, the test cloud ([`crate::capi::cloud`]) stays a process of the test. The pod cluster is
//! also the workload cluster its Machines join: its apiserver takes the join tokens bootplate
//! makes there (bootstrap-token authentication), the cloud checks each machine's user-data
//! against it and its CA before it registers a Node, and Cluster API, in its Pod, watches those
//! Nodes through the node's address. No extra apiserver starts.
//!
//! The Nodes the cloud registers are records, cordoned so that the scheduler never places a Pod
//! on one. A [`RenderWatch`] records every data Secret value and every join token the workload
//! cluster ever held, so a scenario can tell that each Machine got its data exactly once.
//!
//! After a `clusterctl move` to a second pod cluster, the Machines still join the first: the
//! target's fleet ([`Fleet::start_beside`]) plays the cloud of the target's Machines against it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use super::PodCluster;
use super::config::APISERVER_PORT;
use crate::capi::cloud::{self, Cloud, CloudConfig};
use crate::capi::{NS, objects};

/// The test cloud against a pod cluster, and the watch of what bootplate's Pods wrote.
pub struct Fleet {
    _cloud: Cloud,
    /// Admin client of the management cluster (the workload cluster too, unless the fleet is
    /// the target of a `clusterctl move`: [`Fleet::start_beside`]).
    pub client: Client,
    /// Admin client of the workload cluster, where the join tokens are made and the Nodes
    /// registered.
    pub workload: Client,
    /// What bootplate wrote, since the fleet started.
    pub renders: RenderWatch,
}

impl Fleet {
    /// The cloud of `cluster`, which is also the workload cluster its Machines join.
    pub async fn start(cluster: &PodCluster) -> anyhow::Result<Fleet> {
        Self::start_beside(cluster, cluster).await
    }

    /// The cloud of management cluster `management` whose Machines join `workload`: the target
    /// of a `clusterctl move` from `workload` takes the moved Machines' DevMachines over (they
    /// booted before: the cloud reports them provisioned) and boots the new ones. Installs the
    /// test providers' kinds (with the ClusterRole that aggregates them into Cluster API's),
    /// makes [`NS`] and starts the cloud and the watch (of `management`'s data Secrets and of
    /// `workload`'s join tokens).
    pub async fn start_beside(
        management: &PodCluster,
        workload: &PodCluster,
    ) -> anyhow::Result<Fleet> {
        let client = management.client().await?;
        let workload_client = workload.client().await?;
        crate::install_crds(&client, &cloud::crds()).await?;
        let role: ClusterRole = serde_json::from_value(cloud::capi_aggregated_role())?;
        Api::<ClusterRole>::all(client.clone())
            .create(&Default::default(), &role)
            .await
            .context("the test providers' aggregated ClusterRole")?;
        crate::fixtures::namespace(&client, NS).await?;
        let renders = RenderWatch::start(&client, &workload_client);
        let cloud = Cloud::start(CloudConfig {
            management: client.clone(),
            workload: workload_client.clone(),
            workload_host: workload.layout().node_ip.to_string(),
            workload_port: APISERVER_PORT,
            cluster_ca: workload.cluster_ca().clone(),
            real_kubelets: false,
            cordon_nodes: true,
            hosts: None,
        });
        Ok(Fleet {
            _cloud: cloud,
            client,
            workload: workload_client,
            renders,
        })
    }

    /// Applies `object` (JSON) of `resource` in [`NS`].
    pub async fn apply(
        &self,
        resource: &kube::api::ApiResource,
        object: serde_json::Value,
    ) -> anyhow::Result<()> {
        cloud::apply(&self.client, resource, Some(NS), &object).await?;
        Ok(())
    }

    /// A Cluster `name` whose control plane the stand-in provider manages, and a
    /// MachineDeployment `name-md` of `replicas` workers rendered from the shipped
    /// ClusterBootstrapTemplate `template`.
    pub async fn cluster_with_workers(
        &self,
        name: &str,
        template: &str,
        replicas: u32,
    ) -> anyhow::Result<()> {
        let version = objects::KUBERNETES_VERSION;
        crate::capi::apply_provider_cluster(&self.client, name, version, None).await?;
        let md = format!("{name}-md");
        self.apply(
            &objects::bootplate_resource("BootplateConfigTemplate", "bootplateconfigtemplates"),
            objects::bootplate_config_template(&md, template),
        )
        .await?;
        self.apply(
            &objects::dev_machine_template_resource(),
            objects::dev_machine_template(&md, "small"),
        )
        .await?;
        self.apply(
            &objects::machine_deployment_resource(),
            objects::machine_deployment(&md, name, replicas, &md, &md, version),
        )
        .await
    }
}

/// What the watch saw: every value each data Secret in [`NS`] held (by a digest), and every
/// join token the workload cluster held.
#[derive(Clone, Debug, Default)]
pub struct Renders {
    /// Data Secret name → the digests of the user-data values it held.
    pub values: BTreeMap<String, BTreeSet<String>>,
    /// Every join token ID seen (created, whether or not deleted since).
    pub token_ids: BTreeSet<String>,
    /// Why a watch stopped; `None` while both run.
    pub failure: Option<String>,
}

impl Renders {
    /// The data Secrets that held more than one user-data: rendered more than once.
    pub fn rendered_twice(&self) -> Vec<&String> {
        let twice = self.values.iter().filter(|(_, v)| v.len() > 1);
        twice.map(|(name, _)| name).collect()
    }
}

/// The watches of data Secrets and join tokens; stopped on drop.
pub struct RenderWatch {
    seen: Arc<Mutex<Renders>>,
    tasks: Vec<JoinHandle<()>>,
}

impl RenderWatch {
    /// Watches the data Secrets of `management` and the join tokens of `workload`.
    fn start(management: &Client, workload: &Client) -> RenderWatch {
        let seen = Arc::new(Mutex::new(Renders::default()));
        let data = Api::<Secret>::namespaced(management.clone(), NS);
        let tokens = Api::<Secret>::namespaced(workload.clone(), "kube-system");
        let data_config = watcher::Config::default().fields("type=cluster.x-k8s.io/secret");
        let token_config = watcher::Config::default().fields("type=bootstrap.kubernetes.io/token");
        let tasks = [(data, data_config, true), (tokens, token_config, false)]
            .into_iter()
            .map(|(api, config, data)| {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut events = watcher(api, config).boxed();
                    while let Some(event) = events.next().await {
                        match event {
                            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                                record(&mut seen.lock().unwrap(), &s, data)
                            }
                            Ok(_) => {}
                            Err(e) => {
                                seen.lock().unwrap().failure = Some(format!("a watch failed: {e}"));
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        RenderWatch { seen, tasks }
    }

    /// What the watches saw so far (a failed watch fails the caller: a write it did not see
    /// must not pass for one that did not happen).
    pub fn seen(&self) -> Renders {
        let seen = self.seen.lock().unwrap().clone();
        assert_eq!(seen.failure, None, "the render watch stopped");
        seen
    }
}

fn record(seen: &mut Renders, secret: &Secret, data: bool) {
    use sha2::Digest as _;
    let name = secret.name_any();
    if !data {
        let id = name.strip_prefix("bootstrap-token-").unwrap_or(&name);
        seen.token_ids.insert(id.to_owned());
        return;
    }
    // The `<cluster>-ca` and `<cluster>-kubeconfig` Secrets are of the same type; a data
    // Secret is the one with a `format` key.
    let Some(data) = secret.data.as_ref().filter(|d| d.contains_key("format")) else {
        return;
    };
    let value = data
        .get("value")
        .map(|v| v.0.as_slice())
        .unwrap_or_default();
    let digest = hex::encode(sha2::Sha256::digest(value));
    seen.values.entry(name).or_default().insert(digest);
}

impl Drop for RenderWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
