//! The real Cluster API tier: a management apiserver running Cluster API's own manager (built
//! from its Go module, installed from its own manifests, serving its webhooks and conversions),
//! kube-controller-manager's garbage collector, bootplate with the RBAC of `deploy/` and its
//! admission webhook, and a workload apiserver whose CA is the cluster's. Test code plays only
//! the cloud, the kubelets and a control-plane provider stand-in ([`cloud`]).
//!
//! No test writes a Cluster API object's status, clones a config or sets an owner reference:
//! Cluster API does all of that here.

pub mod boot;
pub mod boot_check;
pub mod bootplate;
pub mod cloud;
pub mod clusterctl;
pub mod garbage_collector;
pub mod hosts;
pub mod install;
pub mod kubeadm_bootstrap;
pub mod objects;
pub mod pool;
pub mod token_watch;
pub mod user_data;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client};
use serde_json::json;

use crate::controller::{ControllerProcess, http_get};
use crate::pki::TestCa;
use crate::{ApiServer, fixtures, tools};

/// The namespace the scenarios' clusters live in.
pub const NS: &str = "fleet";
/// How long a scenario's step waits for Cluster API and bootplate together.
pub const WAIT: Duration = Duration::from_secs(180);

/// A child process killed on drop; its log is printed when the test panics.
pub struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    pub(crate) fn spawn(
        name: &'static str,
        command: &mut Command,
        log: &Path,
    ) -> anyhow::Result<Process> {
        let file = std::fs::File::create(log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Process {
            name,
            child,
            log: log.to_owned(),
        })
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process with SIGTERM, as a Pod's container is stopped, and waits for it.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let status = Command::new("kill")
            .arg(self.child.id().to_string())
            .status()?;
        if !status.success() {
            bail!("kill {} failed", self.child.id());
        }
        Ok(self.child.wait()?)
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        self.exited()
    }

    /// The name it was started under.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // The data directory goes with the test; keep the whole log for the post-mortem.
            let kept = std::env::temp_dir().join("bootplate-failed-logs");
            let copy = kept.join(format!("{}-{}.log", self.child.id(), self.name));
            if std::fs::create_dir_all(&kept).is_ok() && std::fs::copy(&self.log, &copy).is_ok() {
                eprintln!("full {} log kept at {}", self.name, copy.display());
            }
            eprintln!(
                "--- last lines of the {} log ---\n{}",
                self.name,
                self.log_tail(15)
            );
        }
    }
}

/// Everything a real-Cluster-API scenario runs against.
pub struct CapiEnv {
    /// The cloud, the kubelets and the control-plane stand-in (dropped first).
    _cloud: cloud::Cloud,
    /// bootplate, as its Deployment runs it.
    pub bootplate: ControllerProcess,
    /// Cluster API's manager.
    pub capi: Process,
    _garbage_collector: Process,
    /// The management cluster.
    pub management: ApiServer,
    /// The workload cluster every scenario's Cluster points at (shared by the management
    /// clusters of a `clusterctl move`).
    pub workload: Arc<ApiServer>,
    /// Admin client of the management cluster.
    pub client: Client,
    /// Admin client of the workload cluster.
    pub workload_client: Client,
    /// The workload cluster's CA (the `<cluster>-ca` pair).
    pub cluster_ca: TestCa,
    /// With [`Options::real_joins`]: what real kubeadm and kubelets join the workload cluster
    /// through (dropped before the workload apiserver).
    pub joins: Option<crate::joins::JoinServices>,
    bootplate_kubeconfig: PathBuf,
    /// Where bootplate serves its webhook (and extension), kept across restarts.
    bootplate_serving: bootplate::Serving,
}

/// How a scenario's environment starts.
#[derive(Default)]
pub struct Options {
    /// Extra `bootplate run` arguments.
    pub bootplate_args: Vec<String>,
    /// Machines join the workload cluster with the real kubeadm and kubelet
    /// ([`crate::joins`]): the workload cluster takes bootstrap tokens and signs kubelet
    /// certificates, and the cloud leaves registering Nodes to the kubelets (it only gives each
    /// Node its provider ID, as a cloud controller manager does).
    pub real_joins: bool,
    /// Both apiservers keep an audit log ([`ApiServer::start_audited`]): the benchmarks count
    /// each provider's requests from it.
    pub audited: bool,
    /// Cluster API runs with its `InPlaceUpdates` feature gate and an ExtensionConfig
    /// (`deploy/extension`) pointing at bootplate's `--extension-addr`; the workload cluster
    /// authorizes with Node and RBAC, so a node's own identity can be used (bootplate-agent).
    pub in_place_updates: bool,
    /// The Cluster API release whose manager, CRDs and manifests run (the current one unless
    /// a scenario runs against the oldest supported release too).
    pub release: crate::tools::CapiRelease,
    /// Machines boot on real hosts that run their user-data ([`hosts`]), which make the
    /// workload cluster (the scenario points its Cluster at their endpoint).
    pub hosts: Option<Arc<hosts::Hosts>>,
    /// The workload cluster's CA, when the scenario made it first (for the health check of the
    /// endpoint its hosts' apiservers go behind); a new one otherwise.
    pub cluster_ca: Option<TestCa>,
}

impl CapiEnv {
    /// Starts both apiservers, the garbage collector, Cluster API, bootplate and the cloud.
    pub async fn start(options: Options) -> anyhow::Result<CapiEnv> {
        let cluster_ca = (options.cluster_ca.clone()).unwrap_or_else(|| TestCa::new("kubernetes"));
        if options.in_place_updates {
            let workload = Arc::new(ApiServer::start_for_joins(&cluster_ca).await?);
            return Self::start_managing(options, workload, cluster_ca).await;
        }
        if options.real_joins {
            let workload = Arc::new(ApiServer::start_for_joins(&cluster_ca).await?);
            let joins = crate::joins::JoinServices::start(&workload, &cluster_ca).await?;
            let mut env = Self::start_managing(options, workload, cluster_ca).await?;
            env.joins = Some(joins);
            return Ok(env);
        }
        let workload = if options.audited {
            ApiServer::start_audited_with_ca(&cluster_ca).await?
        } else {
            ApiServer::start_with_ca(&cluster_ca).await?
        };
        Self::start_managing(options, Arc::new(workload), cluster_ca).await
    }

    /// A second management cluster for the same workload cluster: the target of a
    /// `clusterctl move` from `source`.
    pub async fn start_beside(source: &CapiEnv, options: Options) -> anyhow::Result<CapiEnv> {
        Self::start_managing(options, source.workload.clone(), source.cluster_ca.clone()).await
    }

    async fn start_managing(
        options: Options,
        workload: Arc<ApiServer>,
        cluster_ca: TestCa,
    ) -> anyhow::Result<CapiEnv> {
        let management = if options.audited {
            ApiServer::start_audited().await?
        } else {
            ApiServer::start().await?
        };
        let client = management.client().await?;
        let workload_client = workload.client().await?;
        let garbage_collector = garbage_collector::start(&management, &client).await?;
        let extension_client = if options.in_place_updates {
            Some(ExtensionClient::write(
                &management.dir().join("extension-client"),
            )?)
        } else {
            None
        };
        let capi = install_and_start_capi(
            &management,
            &client,
            extension_client.as_ref(),
            options.release,
        )
        .await?;
        crate::install_crds(&client, &bootplate_crds()).await?;
        crate::install_crds(&client, &cloud::crds()).await?;
        kubectl_apply(
            &management,
            &serde_yaml::to_string(&cloud::capi_aggregated_role())?,
        )?;
        kubectl_apply(&management, &clusterctl::inventory_crd()?)?;
        fixtures::namespace(&client, NS).await?;
        let bootplate_kubeconfig = crate::rbac::install(&management).await?;
        wait_crds_established(&client).await?;
        kubectl_apply(&management, &clusterctl::inventory_entries()?)?;
        let mut bootplate_serving = bootplate::Serving::install(&management, extension_client)?;
        let bootplate = bootplate::start(
            &management,
            &bootplate_kubeconfig,
            &mut bootplate_serving,
            &options.bootplate_args,
            "bootplate.log",
        )
        .await?;
        let cloud = cloud::Cloud::start(cloud::CloudConfig {
            management: client.clone(),
            workload: workload_client.clone(),
            workload_host: "127.0.0.1".into(),
            workload_port: workload.port(),
            cluster_ca: cluster_ca.clone(),
            real_kubelets: options.real_joins,
            cordon_nodes: false,
            hosts: options.hosts.clone(),
        });
        Ok(CapiEnv {
            _cloud: cloud,
            bootplate,
            capi,
            _garbage_collector: garbage_collector,
            management,
            workload,
            client,
            workload_client,
            cluster_ca,
            joins: None,
            bootplate_kubeconfig,
            bootplate_serving,
        })
    }

    /// Stops bootplate (SIGKILL) and starts it again with `args`, logging to `log`. A webhook or
    /// extension port taken while it was down is replaced (see [`bootplate`]).
    pub async fn restart_bootplate(&mut self, args: &[String], log: &str) -> anyhow::Result<()> {
        self.bootplate.kill();
        self.bootplate = bootplate::start(
            &self.management,
            &self.bootplate_kubeconfig,
            &mut self.bootplate_serving,
            args,
            log,
        )
        .await?;
        Ok(())
    }

    /// The port bootplate's admission webhook is served on (it changes when a restart finds it
    /// taken).
    pub fn webhook_port(&self) -> u16 {
        self.bootplate_serving.webhook_port()
    }

    /// A dynamic API for a Cluster API kind in [`NS`].
    pub fn capi(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &cloud::capi_resource(kind, plural))
    }

    /// A dynamic API for a bootplate kind in [`NS`].
    pub fn bootplate(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            NS,
            &objects::bootplate_resource(kind, plural),
        )
    }

    /// A dynamic API for `resource` in [`NS`].
    pub fn dynamic(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, resource)
    }

    /// The BootplateConfigs in [`NS`].
    pub fn configs(&self) -> Api<DynamicObject> {
        self.bootplate("BootplateConfig", "bootplateconfigs")
    }

    /// The Cluster API objects of `kind` in [`NS`] that belong to `cluster`.
    pub async fn capi_list(&self, kind: &str, plural: &str, cluster: &str) -> Vec<DynamicObject> {
        let selector = format!("cluster.x-k8s.io/cluster-name={cluster}");
        self.capi(kind, plural)
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("listing")
            .items
    }

    /// The BootplateConfig `name` in [`NS`].
    pub async fn config(&self, name: &str) -> crd_types::BootplateConfig {
        crate::configs::config(&self.client, NS, name).await
    }

    /// The data Secret `name` in [`NS`], if bootplate wrote it.
    pub async fn data_secret(&self, name: &str) -> Option<Secret> {
        crate::configs::secret(&self.client, NS, name).await
    }

    /// The Ready condition of config `name` (which must have one).
    pub async fn ready_condition(
        &self,
        name: &str,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        let status = self.config(name).await.status.expect("a config status");
        let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready");
        ready.unwrap_or_else(|| panic!("config {name} has no Ready condition"))
    }

    /// The user-data in the data Secret of config `name` (which must exist).
    pub async fn user_data(&self, name: &str) -> String {
        crate::configs::user_data(&self.client, NS, name).await
    }

    /// Waits until config `name`'s Ready condition has `why` as its reason; its message. The
    /// config's owner is then its Machine, set by Cluster API's Machine controller (bootplate
    /// renders for no config without one).
    pub async fn wait_reason(&self, name: &str, why: &str) -> String {
        let message = crate::configs::wait_reason(&self.client, NS, (name, why), WAIT).await;
        self.assert_owned_by_its_machine(name).await;
        message
    }

    /// Waits until config `name` is ready; its user-data. Its owner is its Machine, set by
    /// Cluster API.
    pub async fn wait_user_data(&self, name: &str) -> String {
        crate::configs::wait_ready(&self.client, NS, name, WAIT).await;
        self.assert_owned_by_its_machine(name).await;
        self.user_data(name).await
    }

    async fn assert_owned_by_its_machine(&self, name: &str) {
        use kube::ResourceExt;
        let owners = self.config(name).await.owner_references().to_vec();
        assert!(
            owners.iter().any(|o| o.kind == "Machine" && o.name == name),
            "{name}: owned by its Machine: {owners:?}"
        );
    }

    /// Returns once bootplate has reconciled config `name` as it is now
    /// ([`crate::configs::settled`]).
    pub async fn settled(&self, name: &str) {
        crate::configs::settled(&self.client, &self.bootplate, NS, name, WAIT).await
    }

    /// The bootstrap-token Secrets in the workload cluster.
    pub async fn tokens(&self) -> Vec<Secret> {
        let api: Api<Secret> = Api::namespaced(self.workload_client.clone(), "kube-system");
        api.list(&ListParams::default().fields("type=bootstrap.kubernetes.io/token"))
            .await
            .expect("listing tokens")
            .items
    }

    /// Creates the cluster's `<cluster>-ca` Secret with the workload cluster's CA, as a user
    /// who brings their own CA does when no control-plane provider manages the cluster.
    pub async fn bring_cluster_ca(&self, cluster: &str) -> anyhow::Result<()> {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {
                "name": format!("{cluster}-ca"),
                "namespace": NS,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster},
            },
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"tls.crt": self.cluster_ca.cert_pem, "tls.key": self.cluster_ca.key_pem},
        }))?;
        Api::<Secret>::namespaced(self.client.clone(), NS)
            .create(&Default::default(), &secret)
            .await?;
        Ok(())
    }

    /// A Cluster on a DevCluster whose control plane the stand-in provider manages at
    /// `version` (it brings the cluster CA and reports the control plane initialized). With
    /// `endpoint`, the Cluster names it, as a user does for a load balancer the machines reach;
    /// Cluster API keeps it. Without, Cluster API takes the DevCluster's (the cloud's).
    pub async fn provider_cluster(
        &self,
        name: &str,
        version: &str,
        endpoint: Option<(&str, u16)>,
    ) -> anyhow::Result<()> {
        apply_provider_cluster(&self.client, name, version, endpoint).await
    }

    /// Waits until Cluster API reports `cluster`'s control plane initialized
    /// (`status.initialization.controlPlaneInitialized`): from then on a control-plane Machine
    /// joins (`control-plane-join`) rather than starting the cluster (`init`).
    pub async fn wait_control_plane_initialized(&self, cluster: &str) {
        let clusters = self.capi("Cluster", "clusters");
        let what = format!("Cluster {cluster}'s control plane initialized");
        crate::eventually(&what, WAIT, || async {
            let object = clusters.get(cluster).await.ok()?;
            let initialized = &object.data["status"]["initialization"]["controlPlaneInitialized"];
            (initialized == &json!(true)).then_some(())
        })
        .await;
    }

    /// A worker Machine `name` of `cluster` at `version` on a DevMachine of the same name,
    /// bootstrapped by the BootplateConfig of the same name (created apart).
    pub async fn worker_machine(
        &self,
        name: &str,
        cluster: &str,
        version: &str,
    ) -> anyhow::Result<()> {
        self.apply(&objects::dev_machine_resource(), objects::dev_machine(name))
            .await?;
        self.apply(
            &objects::machine_resource(),
            objects::worker_machine(name, cluster, version),
        )
        .await?;
        Ok(())
    }

    /// A BootplateConfig `name` with `spec`, and a Machine of `cluster` (a control-plane one
    /// with `control_plane`) on a DevMachine of the same name, as an app team writes them;
    /// Cluster API's Machine controller makes the Machine the config's owner. When the
    /// apiserver refuses the config, that is the error and nothing else is created.
    pub async fn bootplate_machine(
        &self,
        (cluster, name): (&str, &str),
        control_plane: bool,
        spec: crd_types::BootplateConfigSpec,
    ) -> anyhow::Result<()> {
        let mut config = crd_types::BootplateConfig::new(name, spec);
        config.metadata.namespace = Some(NS.to_owned());
        Api::<crd_types::BootplateConfig>::namespaced(self.client.clone(), NS)
            .create(&Default::default(), &config)
            .await?;
        if control_plane {
            self.control_plane_machine(name, cluster).await
        } else {
            let version = objects::KUBERNETES_VERSION;
            self.worker_machine(name, cluster, version).await
        }
    }

    /// A control-plane Machine `name` of `cluster` on a DevMachine of the same name,
    /// bootstrapped by the BootplateConfig of the same name (created apart).
    pub async fn control_plane_machine(&self, name: &str, cluster: &str) -> anyhow::Result<()> {
        self.apply(&objects::dev_machine_resource(), objects::dev_machine(name))
            .await?;
        self.apply(
            &objects::machine_resource(),
            objects::control_plane_machine(name, cluster),
        )
        .await?;
        Ok(())
    }

    /// What a person debugging a failed scenario looks at first: each Machine's phase and
    /// conditions that are not True, each config's conditions, and Cluster API's last errors.
    pub async fn describe(&self) -> String {
        let mut out = String::new();
        let kinds = [
            ("Cluster", "clusters"),
            ("MachineDeployment", "machinedeployments"),
            ("MachineSet", "machinesets"),
            ("Machine", "machines"),
            ("MachinePool", "machinepools"),
        ];
        for (kind, plural) in kinds {
            for object in self
                .capi(kind, plural)
                .list(&ListParams::default())
                .await
                .into_iter()
                .flat_map(|l| l.items)
            {
                out.push_str(&describe_object(kind, &object));
            }
        }
        for object in self
            .configs()
            .list(&ListParams::default())
            .await
            .into_iter()
            .flat_map(|l| l.items)
        {
            out.push_str(&describe_object("BootplateConfig", &object));
        }
        let errors: Vec<String> = self
            .capi
            .log_tail(2000)
            .lines()
            .filter(|l| l.starts_with('E'))
            .map(|l| l.chars().take(400).collect())
            .collect();
        out.push_str("Cluster API errors (last 15):\n");
        out.push_str(&errors[errors.len().saturating_sub(15)..].join("\n"));
        out
    }

    /// Publishes the ClusterBootstrapTemplate of the repository file `file` (for example
    /// `templates/kubeadm-ubuntu-2404.yaml`), as a platform team does.
    pub async fn publish_shipped_template(&self, file: &str) -> anyhow::Result<()> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(file);
        let template: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
        let resource =
            objects::bootplate_resource("ClusterBootstrapTemplate", "clusterbootstraptemplates");
        cloud::apply(&self.client, &resource, None, &template).await?;
        Ok(())
    }

    /// Applies `object` (JSON) of `resource` in [`NS`].
    pub async fn apply(
        &self,
        resource: &ApiResource,
        object: serde_json::Value,
    ) -> anyhow::Result<DynamicObject> {
        cloud::apply(&self.client, resource, Some(NS), &object).await
    }
}

/// The condition of `type_` in `object`'s status, if it has one.
pub fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a serde_json::Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// What [`CapiEnv::provider_cluster`] applies, through `client`: a Cluster `name` in [`NS`] on a
/// DevCluster, its control plane managed by the stand-in provider at `version`, naming
/// `endpoint` when given.
pub async fn apply_provider_cluster(
    client: &Client,
    name: &str,
    version: &str,
    endpoint: Option<(&str, u16)>,
) -> anyhow::Result<()> {
    let plane = objects::dev_control_plane(name, version);
    cloud::apply(
        client,
        &objects::dev_control_plane_resource(),
        Some(NS),
        &plane,
    )
    .await?;
    let infra = objects::dev_cluster(name);
    cloud::apply(client, &objects::dev_cluster_resource(), Some(NS), &infra).await?;
    let mut cluster = objects::cluster(name, Some(name), false);
    if let Some((host, port)) = endpoint {
        cluster["spec"]["controlPlaneEndpoint"] = json!({"host": host, "port": port});
    }
    cloud::apply(client, &objects::cluster_resource(), Some(NS), &cluster).await?;
    Ok(())
}

/// bootplate's CRDs as `clusterctl init` installs them: with the clusterctl component label.
fn bootplate_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    let mut crds = crd_types::crds::all();
    for crd in &mut crds {
        crd.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(clusterctl::LABEL.to_owned(), String::new());
    }
    crds
}

fn describe_object(kind: &str, object: &DynamicObject) -> String {
    use kube::ResourceExt;
    let status = &object.data["status"];
    let not_true: Vec<String> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] != "True")
        .map(|c| {
            format!(
                "{}={} {} {}",
                c["type"], c["status"], c["reason"], c["message"]
            )
        })
        .collect();
    format!(
        "{kind} {} phase={} owners={:?}\n    {}\n",
        object.name_any(),
        status["phase"],
        object
            .owner_references()
            .iter()
            .map(|o| &o.name)
            .collect::<Vec<_>>(),
        not_true.join("\n    ")
    )
}

fn kubectl_apply(server: &ApiServer, yaml: &str) -> anyhow::Result<()> {
    let out = crate::kubectl_apply(
        &server.kubeconfig_path()?,
        &["--server-side", "--force-conflicts"],
        yaml,
    );
    if !out.status.success() {
        bail!(
            "kubectl apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Installs Cluster API from its module's manifests and starts its manager, as the
/// ServiceAccount those manifests bind, with the feature gates the scenarios use. Returns once
/// its webhooks answer.
/// The client certificate Cluster API's Runtime SDK client presents to bootplate's extension
/// (its manager's `--runtime-extension-client-cert-file` and `-key-file`), and the CA that
/// signed it, which bootplate trusts with `--extension-client-ca`.
pub struct ExtensionClient {
    /// The CA certificate (PEM file).
    pub ca_file: PathBuf,
    /// Cluster API's client certificate (PEM file).
    pub cert_file: PathBuf,
    /// Its key (PEM file).
    pub key_file: PathBuf,
}

impl ExtensionClient {
    /// A new CA and a client certificate from it, written to `dir`.
    pub fn write(dir: &Path) -> anyhow::Result<ExtensionClient> {
        let ca = TestCa::new("bootplate-extension-client-ca");
        let leaf = ca.client("capi-manager", "cluster-api");
        std::fs::create_dir_all(dir)?;
        let client = ExtensionClient {
            ca_file: dir.join("ca.crt"),
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
        };
        std::fs::write(&client.ca_file, &ca.cert_pem)?;
        std::fs::write(&client.cert_file, &leaf.cert_pem)?;
        std::fs::write(&client.key_file, &leaf.key_pem)?;
        Ok(client)
    }
}

async fn install_and_start_capi(
    server: &ApiServer,
    client: &Client,
    extension_client: Option<&ExtensionClient>,
    release: crate::tools::CapiRelease,
) -> anyhow::Result<Process> {
    let gates = if extension_client.is_some() {
        "--feature-gates=MachinePool=true,ClusterTopology=true,RuntimeSDK=true,InPlaceUpdates=true"
    } else {
        "--feature-gates=MachinePool=true,ClusterTopology=true,RuntimeSDK=true"
    };
    let webhook_port = crate::free_port()?;
    let webhook_ca = TestCa::new("capi-webhook-ca");
    let cert_dir = server.dir().join("capi-webhook-certs");
    webhook_ca.write_serving(&cert_dir)?;
    kubectl_apply(
        server,
        &install::manifests(release, webhook_port, &webhook_ca.cert_pem)?,
    )?;
    wait_crds_established(client).await?;
    let kubeconfig = crate::rbac::impersonating_kubeconfig(
        server,
        install::NAMESPACE,
        install::SERVICE_ACCOUNT,
        "capi-manager-kubeconfig",
    )?;
    let (health, diagnostics) = (crate::free_port()?, crate::free_port()?);
    let process = Process::spawn(
        "capi-manager",
        Command::new(tools::path(release.manager())?)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--webhook-port={webhook_port}"))
            .arg(format!("--webhook-cert-dir={}", cert_dir.display()))
            .arg(format!("--health-addr=127.0.0.1:{health}"))
            .arg(format!("--diagnostics-address=127.0.0.1:{diagnostics}"))
            .arg("--insecure-diagnostics=true")
            .arg("--leader-elect=false")
            .arg(gates)
            .args(extension_client.iter().flat_map(|c| {
                [
                    format!(
                        "--runtime-extension-client-cert-file={}",
                        c.cert_file.display()
                    ),
                    format!(
                        "--runtime-extension-client-key-file={}",
                        c.key_file.display()
                    ),
                ]
            }))
            .arg("--sync-period=1m")
            .env("POD_NAMESPACE", install::NAMESPACE)
            .env("POD_NAME", "capi-manager"),
        &server.dir().join("capi-manager.log"),
    )?;
    wait_manager_ready(
        process,
        health,
        (webhook_port, &cert_dir),
        "the Cluster API manager",
    )
    .await
}

/// Returns `process`, a controller-runtime manager, once its `/readyz` on `health` is OK and
/// its webhooks on `webhook_port` complete a TLS handshake with a certificate of the CA in
/// `cert_dir` (`ca.crt`): a port that merely accepts may be another process's. Fails with its
/// log when it exits or takes 90 s.
async fn wait_manager_ready(
    mut process: Process,
    health: u16,
    (webhook_port, cert_dir): (u16, &Path),
    what: &str,
) -> anyhow::Result<Process> {
    let ca_pem = std::fs::read_to_string(cert_dir.join("ca.crt"))?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = http_get(health, "/readyz").is_some_and(|(status, _)| status == 200);
        let serving = crate::tls_probe::handshake(webhook_port, &ca_pem).await;
        if process.exited() {
            bail!("{what} exited:\n{}", process.log_tail(40));
        }
        match serving {
            Ok(()) if ready => return Ok(process),
            Err(e) if Instant::now() > deadline => {
                bail!(
                    "{what} did not become ready: {e:#}\n{}",
                    process.log_tail(40)
                )
            }
            _ if Instant::now() > deadline => {
                bail!("{what}'s /readyz is not OK:\n{}", process.log_tail(40))
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until every installed CRD is Established.
async fn wait_crds_established(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in api.list(&ListParams::default()).await? {
        crate::wait_established(&api, &crd.metadata.name.unwrap_or_default()).await?;
    }
    Ok(())
}
