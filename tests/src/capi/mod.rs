//! The real Cluster API tier: a management apiserver running Cluster API's own manager (built
//! from its Go module, installed from its own manifests, serving its webhooks and conversions),
//! kube-controller-manager's garbage collector, bootplate with the RBAC of `deploy/` and its
//! admission webhook, and a workload apiserver whose CA is the cluster's. Test code plays only
//! the cloud, the kubelets and a control-plane provider stand-in ([`cloud`]).
//!
//! No test writes a Cluster API object's status, clones a config or sets an owner reference:
//! Cluster API does all of that here.

pub mod boot;
pub mod cloud;
pub mod clusterctl;
pub mod install;
pub mod kubeadm_bootstrap;
pub mod objects;
pub mod pool;
pub mod token_watch;

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
    bootplate_webhook: (u16, PathBuf),
    /// `--extension-addr` with [`Options::in_place_updates`] (kept across restarts).
    extension_args: Vec<String>,
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
}

impl CapiEnv {
    /// Starts both apiservers, the garbage collector, Cluster API, bootplate and the cloud.
    pub async fn start(options: Options) -> anyhow::Result<CapiEnv> {
        let cluster_ca = TestCa::new("kubernetes");
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
        let garbage_collector = start_garbage_collector(&management)?;
        let capi = install_and_start_capi(&management, &client, options.in_place_updates).await?;
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
        let bootplate_webhook = install_bootplate_webhook(&management)?;
        let extension_args = if options.in_place_updates {
            install_bootplate_extension(&management, &bootplate_webhook.1)?
        } else {
            Vec::new()
        };
        let args: Vec<String> = (extension_args.iter())
            .chain(&options.bootplate_args)
            .cloned()
            .collect();
        let bootplate = start_bootplate(
            &management,
            &bootplate_kubeconfig,
            &bootplate_webhook,
            &args,
            "bootplate.log",
        )
        .await?;
        let cloud = cloud::Cloud::start(cloud::CloudConfig {
            management: client.clone(),
            workload: workload_client.clone(),
            workload_port: workload.port(),
            cluster_ca: cluster_ca.clone(),
            real_kubelets: options.real_joins,
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
            bootplate_webhook,
            extension_args,
        })
    }

    /// Stops bootplate (SIGKILL) and starts it again with the same flags, logging to `log`.
    pub async fn restart_bootplate(&mut self, args: &[String], log: &str) -> anyhow::Result<()> {
        self.bootplate.kill();
        let args: Vec<String> = (self.extension_args.iter()).chain(args).cloned().collect();
        self.bootplate = start_bootplate(
            &self.management,
            &self.bootplate_kubeconfig,
            &self.bootplate_webhook,
            &args,
            log,
        )
        .await?;
        Ok(())
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

    /// Applies `object` (JSON) of `resource` in [`NS`].
    pub async fn apply(
        &self,
        resource: &ApiResource,
        object: serde_json::Value,
    ) -> anyhow::Result<DynamicObject> {
        cloud::apply(&self.client, resource, Some(NS), &object).await
    }
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

/// kube-controller-manager with the two controllers a management cluster's objects rely on: the
/// garbage collector (what ownerReferences say is orphaned goes; bootplate's data Secrets rely
/// on it) and ClusterRole aggregation (Cluster API's role is the union of the roles labelled
/// `cluster.x-k8s.io/aggregate-to-manager`, bootplate's among them).
fn start_garbage_collector(server: &ApiServer) -> anyhow::Result<Process> {
    let port = crate::free_port()?;
    Process::spawn(
        "kube-controller-manager",
        Command::new(tools::path("kube-controller-manager")?)
            .arg(format!(
                "--kubeconfig={}",
                server.kubeconfig_path()?.display()
            ))
            .arg("--controllers=garbagecollector,clusterrole-aggregation")
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg(format!(
                "--cert-dir={}",
                server.dir().join("kcm-certs").display()
            )),
        &server.dir().join("kube-controller-manager.log"),
    )
}

/// Installs Cluster API from its module's manifests and starts its manager, as the
/// ServiceAccount those manifests bind, with the feature gates the scenarios use. Returns once
/// its webhooks answer.
async fn install_and_start_capi(
    server: &ApiServer,
    client: &Client,
    in_place_updates: bool,
) -> anyhow::Result<Process> {
    let gates = if in_place_updates {
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
        &install::manifests(webhook_port, &webhook_ca.cert_pem)?,
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
        Command::new(tools::path("capi-manager")?)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--webhook-port={webhook_port}"))
            .arg(format!("--webhook-cert-dir={}", cert_dir.display()))
            .arg(format!("--health-addr=127.0.0.1:{health}"))
            .arg(format!("--diagnostics-address=127.0.0.1:{diagnostics}"))
            .arg("--insecure-diagnostics=true")
            .arg("--leader-elect=false")
            .arg(gates)
            .arg("--sync-period=1m")
            .env("POD_NAMESPACE", install::NAMESPACE)
            .env("POD_NAME", "capi-manager"),
        &server.dir().join("capi-manager.log"),
    )?;
    wait_manager_ready(process, health, webhook_port, "the Cluster API manager").await
}

/// Returns `process`, a controller-runtime manager, once its `/readyz` on `health` is OK and
/// its webhooks listen on `webhook_port`; fails with its log when it exits or takes 90 s.
async fn wait_manager_ready(
    mut process: Process,
    health: u16,
    webhook_port: u16,
    what: &str,
) -> anyhow::Result<Process> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = http_get(health, "/readyz").is_some_and(|(status, _)| status == 200);
        if ready && std::net::TcpStream::connect(("127.0.0.1", webhook_port)).is_ok() {
            return Ok(process);
        }
        if process.exited() || Instant::now() > deadline {
            bail!("{what} did not become ready:\n{}", process.log_tail(40));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
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

/// bootplate's webhook configuration from `deploy/webhook`, pointed at a loopback port with a
/// test CA. Returns the port and the certificate directory to serve it from.
fn install_bootplate_webhook(server: &ApiServer) -> anyhow::Result<(u16, PathBuf)> {
    let port = crate::free_port()?;
    let ca = TestCa::new("bootplate-webhook-ca");
    let cert_dir = server.dir().join("bootplate-webhook-certs");
    ca.write_serving(&cert_dir)?;
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/webhook/validating_webhook.yaml");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    install::for_loopback(&mut config, port, &ca.cert_pem)?;
    kubectl_apply(server, &serde_yaml::to_string(&config)?)?;
    Ok((port, cert_dir))
}

/// The ExtensionConfig of `deploy/extension`, pointed at bootplate's extension on a loopback
/// port instead of its Service. Its CA comes the way it does in a cluster: Cluster API reads
/// `ca.crt` from the Secret its annotation names (cert-manager's, in a cluster; here the
/// webhook's test CA from `cert_dir`, which the extension serves with by default). Returns the
/// `bootplate run` arguments serving it.
fn install_bootplate_extension(server: &ApiServer, cert_dir: &Path) -> anyhow::Result<Vec<String>> {
    const INJECT_CA: &str = "runtime.cluster.x-k8s.io/inject-ca-from-secret";
    let port = crate::free_port()?;
    let built =
        install::kustomize(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/extension"))?;
    let mut config = serde_yaml::Deserializer::from_str(&built)
        .map(<serde_yaml::Value as serde::Deserialize>::deserialize)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .find(|o| o["kind"] == "ExtensionConfig")
        .context("deploy/extension has no ExtensionConfig")?;
    let secret = config["metadata"]["annotations"][INJECT_CA]
        .as_str()
        .with_context(|| format!("the ExtensionConfig has no {INJECT_CA} annotation"))?;
    let (namespace, name) = secret
        .split_once('/')
        .with_context(|| format!("{INJECT_CA} is not <namespace>/<name>: {secret}"))?;
    let ca_pem = std::fs::read_to_string(cert_dir.join("ca.crt"))?;
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {"ca.crt": ca_pem},
    });
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    config["spec"]["clientConfig"] =
        serde_yaml::to_value(json!({"url": format!("https://127.0.0.1:{port}")}))?;
    for object in [namespace, secret] {
        kubectl_apply(server, &serde_yaml::to_string(&object)?)?;
    }
    kubectl_apply(server, &serde_yaml::to_string(&config)?)?;
    Ok(vec![format!("--extension-addr=127.0.0.1:{port}")])
}

async fn start_bootplate(
    server: &ApiServer,
    kubeconfig: &Path,
    (webhook_port, cert_dir): &(u16, PathBuf),
    extra: &[String],
    log: &str,
) -> anyhow::Result<ControllerProcess> {
    let mut args = vec![
        format!("--webhook-addr=127.0.0.1:{webhook_port}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
    ];
    args.extend(extra.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = ControllerProcess::start(kubeconfig, &server.dir().join(log), &args).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", *webhook_port))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("bootplate's webhook does not listen:\n{}", process.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(process)
}
