//! Controller scale benchmark against real apiservers (one management, one workload), not a
//! test: run by hand, see docs/benchmarks.md.
//!
//! Creates N worker Machines with their configs, one Cluster per `--per-cluster` machines, with
//! what CAPI leaves for them (infrastructure provisioned, control plane initialized, the
//! `<cluster>-ca` and `<cluster>-kubeconfig` Secrets labelled with the cluster name), then:
//!
//! 1. floor: a plain client performs the writes no implementation can avoid (per config: the
//!    bootstrap token Secret in the workload cluster, the data Secret, the status patch), with
//!    the controller's concurrency and identity, on a second set of N configs; its data Secrets
//!    hold a worker's user-data as the controller renders it in the same run (with the boot
//!    reporter when reports are on);
//! 2. controller: starts `bootplate run` and times it from process start until the benchmark's
//!    own watch has seen every config ready; peak RSS is the process's VmHWM; its API requests
//!    are counted from both apiservers' audit logs (by user: the controller impersonates its
//!    ServiceAccount in the management cluster, and is `bootplate-bench-workload` by its static
//!    token in the workload cluster), after it has gone quiet;
//! 3. restart: SIGTERM, start again over the ready configs: time to `/readyz` OK, time until
//!    every config was reconciled again, and the writes made meanwhile (should be none).
//!
//! ```text
//! cargo build --release -p bootplate -p bootplate-bench
//! target/release/scale-bench --machines 1000
//! ```

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bootplate_bench::measure::{Requests, cpu_seconds, file_len, per, rss_kib};
use crd_types::capi::{CLUSTER_NAME_LABEL, Cluster};
use crd_types::{
    BootReports, BootplateConfig, BootplateConfigSpec, ClusterBootstrapTemplate,
    ClusterBootstrapTemplateSpec, TemplateKind, TemplateRef, TemplateSpec,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use testenv::controller::ControllerProcess;
use testenv::{ApiServer, fixtures};

const TEMPLATE: &str = include_str!("../../../render/benches/kubeadm.yaml");
/// The namespace the controller reconciles (`--namespace`).
const BENCH_NS: &str = "bench";
/// The namespace of the floor's configs, which the controller does not watch.
const FLOOR_NS: &str = "floor";
/// The controller's user in the workload clusters (its kubeconfig Secret holds this user's
/// static token, `testenv::BENCH_WORKLOAD_TOKEN`).
const WORKLOAD_USER: &str = "bootplate-bench-workload";
/// The token line of a test apiserver's admin kubeconfig.
const ADMIN_TOKEN_LINE: &str = "token: bootplate-test-admin-token";
/// How long the controller must make no reconcile for the run to count as settled.
const QUIET: Duration = Duration::from_secs(5);

struct Args {
    machines: usize,
    per_cluster: usize,
    concurrency: usize,
    skip_floor: bool,
    skip_restart: bool,
    controller_args: Vec<String>,
    /// Whether the template's machines report their boot (`--boot-reports off` turns it off).
    boot_reports: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut parsed = Args {
        machines: 1000,
        per_cluster: 50,
        concurrency: 16,
        skip_floor: false,
        skip_restart: false,
        controller_args: Vec::new(),
        boot_reports: true,
    };
    let usage = "usage: scale-bench [--machines N] [--per-cluster N] [--concurrency N] \
                 [--controller-arg ARG]... [--skip-floor] [--skip-restart] [--boot-reports on|off]\n\n\
                 Times `bootplate run` (the binary built beside this one) making N worker configs ready \
                 (default 1000, clusters of --per-cluster, default 50) against real apiservers, \
                 beside a floor client doing only the unavoidable writes (--skip-floor leaves it \
                 out), then restarts it over the ready configs (--skip-restart leaves that out). \
                 --controller-arg passes one argument to `bootplate run`. --boot-reports off publishes \
                 the template with `bootReports: Disabled` (default on, as the template ships). \
                 See docs/benchmarks.md.";
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--machines" => parsed.machines = value()?.parse()?,
            "--per-cluster" => parsed.per_cluster = value()?.parse()?,
            "--concurrency" => parsed.concurrency = value()?.parse()?,
            "--controller-arg" => parsed.controller_args.push(value()?),
            "--skip-floor" => parsed.skip_floor = true,
            "--skip-restart" => parsed.skip_restart = true,
            "--boot-reports" => {
                parsed.boot_reports = match value()?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => bail!("--boot-reports takes on or off, not {other:?}\n{usage}"),
                }
            }
            "-h" | "--help" => {
                println!("{usage}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {flag:?}\n{usage}"),
        }
    }
    if parsed.per_cluster == 0 || parsed.machines == 0 {
        bail!("--machines and --per-cluster must be more than zero");
    }
    Ok(parsed)
}

/// Both clusters, clients, and what the controller needs.
struct Bench {
    management: ApiServer,
    workload: ApiServer,
    admin: Client,
    /// The controller's identity in the management cluster (kubeconfig file).
    controller_kubeconfig: std::path::PathBuf,
    /// The kubeconfig the `<cluster>-kubeconfig` Secrets hold.
    workload_kubeconfig: String,
    controller_user: String,
    args: Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    bootplate_bench::start();
    let started = Instant::now();
    let (management, workload) =
        tokio::join!(ApiServer::start_audited(), ApiServer::start_audited());
    let (management, workload) = (management?, workload?);
    let admin = management.client().await?;
    testenv::install_bootplate_crds(&admin).await?;
    testenv::install_capi_crds(&admin).await?;
    for ns in [BENCH_NS, FLOOR_NS] {
        fixtures::namespace(&admin, ns).await?;
    }
    let controller_kubeconfig = testenv::rbac::install(&management).await?;
    let (sa_ns, sa_name) = testenv::rbac::SERVICE_ACCOUNT;
    let workload_kubeconfig = workload.kubeconfig_yaml().replace(
        ADMIN_TOKEN_LINE,
        &format!("token: {}", testenv::BENCH_WORKLOAD_TOKEN),
    );
    anyhow::ensure!(
        workload_kubeconfig.contains(testenv::BENCH_WORKLOAD_TOKEN),
        "the workload kubeconfig has no admin token line to replace"
    );
    let bench = Bench {
        controller_user: format!("system:serviceaccount:{sa_ns}:{sa_name}"),
        management,
        workload,
        admin,
        controller_kubeconfig,
        workload_kubeconfig,
        args,
    };
    eprintln!("apiservers up in {:.1?}", started.elapsed());
    bench.run().await
}

impl Bench {
    async fn run(&self) -> anyhow::Result<()> {
        let n = self.args.machines;
        let clusters = n.div_ceil(self.args.per_cluster);
        println!(
            "scale: {n} worker machines and configs, {clusters} clusters ({} machines each), concurrency {}",
            self.args.per_cluster, self.args.concurrency
        );
        let mut template: TemplateSpec = serde_yaml::from_str(TEMPLATE)?;
        if !self.args.boot_reports {
            template.boot_reports = Some(BootReports::Disabled);
        }
        let revision = template.revision();
        Api::<ClusterBootstrapTemplate>::all(self.admin.clone())
            .create(
                &PostParams::default(),
                &ClusterBootstrapTemplate::new("kubeadm", ClusterBootstrapTemplateSpec(template)),
            )
            .await?;
        let created = Instant::now();
        self.create_clusters(clusters).await?;
        self.create_machines(n, clusters).await?;
        let floor_configs = if self.args.skip_floor {
            Vec::new()
        } else {
            self.create_floor_configs(n).await?
        };
        println!(
            "fixtures created in {:.1?} (the controller is not running yet)",
            created.elapsed()
        );

        let floor = if self.args.skip_floor {
            None
        } else {
            Some(self.floor(&floor_configs, &revision).await?)
        };
        let controller = self.controller_phase(n).await?;
        self.print_user_data_size().await?;
        if let Some(floor) = floor {
            println!(
                "RESULT N={n} time: controller {:.2} s, floor {:.2} s, ratio controller/floor {:.2}",
                controller.seconds,
                floor,
                controller.seconds / floor
            );
        }
        Ok(())
    }

    /// The size of the user-data the controller wrote for the first config, beside the floor's.
    async fn print_user_data_size(&self) -> anyhow::Result<()> {
        let secrets: Api<Secret> = Api::namespaced(self.admin.clone(), BENCH_NS);
        let (_, name) = machine_names(0, 1);
        let secret = secrets.get(&name).await?;
        let value = secret.data.as_ref().and_then(|d| d.get("value"));
        let bytes = value.map_or(0, |v| v.0.len());
        println!("controller: {bytes} bytes of user-data in the data Secret of {name}");
        Ok(())
    }

    async fn create_clusters(&self, clusters: usize) -> anyhow::Result<()> {
        let ca = bootplate::pki::generate_ca("kubernetes")?;
        let secrets: Api<Secret> = Api::namespaced(self.admin.clone(), BENCH_NS);
        let cluster_api: Api<Cluster> = Api::namespaced(self.admin.clone(), BENCH_NS);
        futures::stream::iter(0..clusters)
            .map(|i| {
                let (secrets, cluster_api, ca) = (&secrets, &cluster_api, &ca);
                async move {
                    let name = format!("c{i}");
                    cluster_api
                        .create(&PostParams::default(), &fixtures::cluster(BENCH_NS, &name))
                        .await?;
                    let status = json!({
                        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                        "status": {
                            "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
                            "conditions": [{"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized",
                                "message": "control plane initialized", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                        },
                    });
                    cluster_api
                        .patch_status(
                            &name,
                            &PatchParams::apply("capi-cluster-controller").force(),
                            &Patch::Apply(&status),
                        )
                        .await?;
                    // As CAPI writes them: labelled with the cluster's name.
                    for (suffix, data) in [
                        ("ca", BTreeMap::from([("tls.crt", ca.cert.clone()), ("tls.key", ca.key.clone())])),
                        ("kubeconfig", BTreeMap::from([("value", self.workload_kubeconfig.clone())])),
                    ] {
                        let secret = Secret {
                            metadata: ObjectMeta {
                                name: Some(format!("{name}-{suffix}")),
                                labels: Some(BTreeMap::from([(CLUSTER_NAME_LABEL.to_owned(), name.clone())])),
                                ..Default::default()
                            },
                            string_data: Some(data.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()),
                            type_: Some("cluster.x-k8s.io/secret".into()),
                            ..Default::default()
                        };
                        secrets.create(&PostParams::default(), &secret).await?;
                    }
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn create_machines(&self, n: usize, clusters: usize) -> anyhow::Result<()> {
        let machines: Api<crd_types::capi::Machine> = Api::namespaced(self.admin.clone(), BENCH_NS);
        let configs: Api<BootplateConfig> = Api::namespaced(self.admin.clone(), BENCH_NS);
        futures::stream::iter(0..n)
            .map(|i| {
                let (machines, configs) = (&machines, &configs);
                async move {
                    let (cluster, name) = machine_names(i, clusters);
                    let machine = machines
                        .create(
                            &PostParams::default(),
                            &fixtures::machine(BENCH_NS, &name, &cluster, false, &name),
                        )
                        .await?;
                    configs
                        .create(
                            &PostParams::default(),
                            &fixtures::owned_config(&machine, template_ref()),
                        )
                        .await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn create_floor_configs(&self, n: usize) -> anyhow::Result<Vec<BootplateConfig>> {
        let configs: Api<BootplateConfig> = Api::namespaced(self.admin.clone(), FLOOR_NS);
        futures::stream::iter(0..n)
            .map(|i| {
                let configs = &configs;
                async move {
                    let mut config = BootplateConfig::new(
                        &format!("f{i}"),
                        BootplateConfigSpec {
                            template_ref: template_ref(),
                            ..Default::default()
                        },
                    );
                    config.metadata.namespace = Some(FLOOR_NS.into());
                    Ok::<_, anyhow::Error>(configs.create(&PostParams::default(), &config).await?)
                }
            })
            .buffer_unordered(32)
            .try_collect()
            .await
    }

    /// The floor: per config, the three writes any implementation makes, with the controller's
    /// identities and concurrency. Returns the seconds it took.
    async fn floor(&self, configs: &[BootplateConfig], revision: &str) -> anyhow::Result<f64> {
        let management = client_from_file(&self.controller_kubeconfig).await?;
        let workload = client_from_yaml(&self.workload_kubeconfig).await?;
        let user_data = floor_user_data(self.args.boot_reports)?;
        println!("floor: {} bytes of user-data per config", user_data.len());
        let tokens: Api<Secret> = Api::namespaced(workload, "kube-system");
        let secrets: Api<Secret> = Api::namespaced(management.clone(), FLOOR_NS);
        let status: Api<BootplateConfig> = Api::namespaced(management, FLOOR_NS);
        let cpu = self.servers_cpu();
        let own_cpu = cpu_seconds(std::process::id());
        let started = Instant::now();
        futures::stream::iter(configs)
            .map(|config| {
                let (tokens, secrets, status, user_data) = (&tokens, &secrets, &status, &user_data);
                async move { floor_one(config, tokens, secrets, status, user_data, revision).await }
            })
            .buffer_unordered(self.args.concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "floor: {} configs x 3 writes in {seconds:.2} s ({:.0} configs/s)",
            configs.len(),
            configs.len() as f64 / seconds
        );
        let [management, workload] = self.servers_cpu_since(cpu);
        println!(
            "floor: CPU seconds: management {management}, workload {workload}, the floor client (this benchmark) {:.1}",
            cpu_seconds(std::process::id()) - own_cpu
        );
        Ok(seconds)
    }

    async fn start_controller(&self, log: &str) -> anyhow::Result<ControllerProcess> {
        let concurrency = self.args.concurrency.to_string();
        let mut extra = vec![
            "--namespace",
            BENCH_NS,
            "--concurrency",
            &concurrency,
            "--log-level",
            "info",
        ];
        extra.extend(self.args.controller_args.iter().map(String::as_str));
        ControllerProcess::start(
            &self.controller_kubeconfig,
            &self.management.dir().join(log),
            &extra,
        )
        .await
    }

    async fn controller_phase(&self, n: usize) -> anyhow::Result<ControllerRun> {
        let configs: Api<BootplateConfig> = Api::namespaced(self.admin.clone(), BENCH_NS);
        let (ready_tx, mut ready_rx) = tokio::sync::watch::channel(0usize);
        let (listed_tx, listed_rx) = tokio::sync::oneshot::channel::<()>();
        let watch = tokio::spawn(async move {
            let mut ready = HashSet::new();
            let mut listed = Some(listed_tx);
            let mut events = std::pin::pin!(watcher(configs, watcher::Config::default()));
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))
                        if c.status.as_ref().is_some_and(|s| s.ready) =>
                    {
                        ready.insert(c.name_any());
                        let _ = ready_tx.send(ready.len());
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed.take() {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
        });
        listed_rx.await.context("the benchmark's watch ended")?;
        let audit = self.audit_offsets()?;
        let cpu = self.servers_cpu();
        let own_cpu = cpu_seconds(std::process::id());
        let started = Instant::now();
        let mut controller = self.start_controller("controller.log").await?;
        let pid = controller.pid();
        let deadline = Duration::from_secs(3600);
        tokio::time::timeout(deadline, ready_rx.wait_for(|ready| *ready >= n))
            .await
            .context("not every config became ready within an hour")??;
        let seconds = started.elapsed().as_secs_f64();
        watch.abort();
        let rss_at_ready = rss_kib(pid, "VmRSS");
        let [management, workload] = self.servers_cpu_since(cpu);
        println!(
            "controller: {n} configs ready {seconds:.2} s after process start ({:.0} configs/s)",
            n as f64 / seconds
        );
        println!(
            "controller: CPU seconds until ready: controller {:.1}, management {management}, workload {workload}, the readiness watch (this benchmark) {:.1}",
            cpu_seconds(pid),
            cpu_seconds(std::process::id()) - own_cpu
        );
        let settled = wait_quiet(&controller, n).await;
        println!(
            "controller: settled (no reconcile for {QUIET:?}) {:.1} s after start",
            started.elapsed().as_secs_f64()
        );
        let hwm = rss_kib(pid, "VmHWM");
        println!(
            "controller: peak RSS (VmHWM) {:.1} MiB; RSS when all were ready {:.1} MiB; reconciles {settled}",
            hwm / 1024.0,
            rss_at_ready / 1024.0
        );
        let requests = self.requests_since(&audit)?;
        requests.print("controller", n);
        println!(
            "RESULT N={n} requests per config {:.2} (writes {:.2})",
            per(requests.total() as f64, n as f64),
            per(requests.writes() as f64, n as f64)
        );

        if !self.args.skip_restart {
            let status = controller.terminate()?;
            println!("controller: stopped by SIGTERM ({status})");
            self.restart_phase(n).await?;
        }
        Ok(ControllerRun { seconds })
    }

    async fn restart_phase(&self, n: usize) -> anyhow::Result<()> {
        let audit = self.audit_offsets()?;
        let started = Instant::now();
        let controller = self.start_controller("controller-restart.log").await?;
        let pid = controller.pid();
        while controller.readyz() != Some(200) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let readyz = started.elapsed().as_secs_f64();
        let reconciled_all = loop {
            if controller.config_reconciles() >= n as u64 {
                break started.elapsed().as_secs_f64();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        wait_quiet(&controller, n).await;
        println!(
            "restart: /readyz OK {readyz:.2} s after process start; all {n} configs reconciled again after {reconciled_all:.2} s; peak RSS {:.1} MiB",
            rss_kib(pid, "VmHWM") / 1024.0
        );
        let requests = self.requests_since(&audit)?;
        requests.print("restart", n);
        self.keep_logs();
        println!(
            "RESULT N={n} restart: readyz {readyz:.2} s, writes {} (reads {}, watches {})",
            requests.writes(),
            requests.reads(),
            requests.watches()
        );
        Ok(())
    }

    /// Copies the controller's logs to $SCALE_BENCH_LOGS (default /tmp/scale-bench-logs): the
    /// apiservers' directories go when the benchmark ends.
    fn keep_logs(&self) {
        let dir =
            std::env::var("SCALE_BENCH_LOGS").unwrap_or_else(|_| "/tmp/scale-bench-logs".into());
        let _ = std::fs::create_dir_all(&dir);
        for log in ["controller.log", "controller-restart.log"] {
            let _ = std::fs::copy(self.management.dir().join(log), Path::new(&dir).join(log));
        }
    }

    /// CPU seconds used so far by each cluster's apiserver and etcd: [management, workload].
    fn servers_cpu(&self) -> [ServerCpu; 2] {
        [&self.management, &self.workload].map(|server| {
            let [etcd, apiserver] = server.pids().map(cpu_seconds);
            ServerCpu { etcd, apiserver }
        })
    }

    fn servers_cpu_since(&self, before: [ServerCpu; 2]) -> [ServerCpu; 2] {
        let now = self.servers_cpu();
        [0, 1].map(|i| ServerCpu {
            etcd: now[i].etcd - before[i].etcd,
            apiserver: now[i].apiserver - before[i].apiserver,
        })
    }

    fn audit_offsets(&self) -> anyhow::Result<[u64; 2]> {
        Ok([
            file_len(&self.management.audit_log()),
            file_len(&self.workload.audit_log()),
        ])
    }

    /// The controller's requests since `offsets`, from both audit logs.
    fn requests_since(&self, offsets: &[u64; 2]) -> anyhow::Result<Requests> {
        // The audit backend writes as requests complete; let the last ones land.
        std::thread::sleep(Duration::from_millis(500));
        let mut requests = Requests::default();
        requests.add_from(
            "management",
            &self.management.audit_log(),
            offsets[0],
            |e| Requests::user(e) == Some(self.controller_user.as_str()),
        )?;
        requests.add_from("workload", &self.workload.audit_log(), offsets[1], |e| {
            Requests::user(e) == Some(WORKLOAD_USER)
        })?;
        Ok(requests)
    }
}

struct ControllerRun {
    seconds: f64,
}

fn template_ref() -> TemplateRef {
    TemplateRef {
        kind: TemplateKind::ClusterBootstrapTemplate,
        name: "kubeadm".into(),
        namespace: None,
    }
}

/// The bytes of one worker's user-data as the controller renders them in this run, which the
/// floor writes for every config: with boot reports on, the reporter, its CA and the machine's
/// report target are part of them (about 7.9 KB of the 11.6 KB since d46c6ff, 9.6 of 13.3
/// before it).
fn floor_user_data(boot_reports: bool) -> anyhow::Result<Vec<u8>> {
    let spec: TemplateSpec = serde_yaml::from_str(TEMPLATE)?;
    let compiled = render::CompiledTemplate::compile("ClusterBootstrapTemplate kubeadm", &spec)?;
    let mut context = render::sample_context(crd_types::Role::Worker);
    if boot_reports {
        // The values the controller puts there, of the same lengths: a config's and a
        // Cluster's UID, the cluster's CA, its endpoint, a token.
        let (config_uid, cluster_uid) = (uuid_shaped(1), uuid_shaped(2));
        let token = bootplate::core::token::Token::generate();
        let endpoint = (fixtures::cluster(BENCH_NS, "c0")
            .spec
            .control_plane_endpoint)
            .map(|e| format!("{}:{}", e.host, e.port))
            .context("the fixture Cluster has no control plane endpoint")?;
        context.boot_report = Some(render::context::BootReport {
            server: format!("https://{endpoint}"),
            ca_pem: bootplate::pki::generate_ca("kubernetes")?.cert,
            namespace: bootplate::core::token::NAMESPACE.into(),
            name: bootplate::k8s::boot_report::name(&config_uid),
            metadata: bootplate::k8s::boot_report::machine_metadata(
                &config_uid,
                &cluster_uid,
                &token,
            ),
            token: token.expose(),
            secrets: Vec::new(),
            min_interval_seconds: 10,
        });
    }
    let rendered = compiled.render(&BootplateConfigSpec::default(), &context)?;
    Ok(rendered.data)
}

/// The Cluster and the name of machine `i` (its config and data Secret share the name): the
/// machines are spread over `clusters` in turn.
fn machine_names(i: usize, clusters: usize) -> (String, String) {
    let cluster = format!("c{}", i % clusters);
    let name = format!("{cluster}-w{i}");
    (cluster, name)
}

/// CPU seconds of one cluster's kube-apiserver and etcd.
#[derive(Clone, Copy)]
struct ServerCpu {
    etcd: f64,
    apiserver: f64,
}

impl std::fmt::Display for ServerCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (etcd, apiserver) = (self.etcd, self.apiserver);
        write!(
            f,
            "apiserver+etcd {:.1} ({apiserver:.1} + {etcd:.1})",
            apiserver + etcd
        )
    }
}

/// A UID-shaped text (36 characters).
fn uuid_shaped(n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-000000000000")
}

async fn floor_one(
    config: &BootplateConfig,
    tokens: &Api<Secret>,
    secrets: &Api<Secret>,
    status: &Api<BootplateConfig>,
    user_data: &[u8],
    revision: &str,
) -> anyhow::Result<()> {
    let name = config.name_any();
    let uid = config.uid().unwrap_or_default();
    create_floor_token(tokens, &uid).await?;
    let data_secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": name, "namespace": FLOOR_NS,
            "labels": {CLUSTER_NAME_LABEL: "floor", bootplate::labels::DATA_SECRET: name},
            "annotations": {bootplate::labels::TEMPLATE_REVISION: revision},
            "ownerReferences": [config.controller_owner_ref(&())],
        },
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": ByteString(user_data.to_vec()), "format": ByteString(b"cloud-config".to_vec())},
    });
    let apply = PatchParams::apply("bootplate").force();
    secrets
        .patch(&name, &apply, &Patch::Apply(&data_secret))
        .await?;
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": "floor",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": config.metadata.generation})
    };
    let patch = json!({
        "apiVersion": BootplateConfig::api_version(&()), "kind": "BootplateConfig",
        "status": {
            "ready": true, "dataSecretName": name, "initialization": {"dataSecretCreated": true},
            "observedGeneration": config.metadata.generation, "templateRevision": revision, "role": "worker",
            "conditions": [condition("Ready", "True", "DataSecretCreated"),
                condition("DataSecretAvailable", "True", "DataSecretCreated"),
                condition("Paused", "False", "NotPaused")],
        },
    });
    status
        .patch_status(&name, &apply, &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// Creates a random token for config `uid`, as the controller would: another ID when the one
/// drawn is taken (20 000 random IDs of 6 characters collide about once in ten runs).
async fn create_floor_token(tokens: &Api<Secret>, uid: &str) -> anyhow::Result<()> {
    let mut attempts = 0;
    loop {
        let token = bootplate::core::token::Token::generate();
        let exposed = token.expose();
        let token_secret = exposed.split_once('.').map_or("", |(_, s)| s);
        let token_data: BTreeMap<String, ByteString> = [
            ("token-id", token.id.as_str()),
            ("token-secret", token_secret),
            ("expiration", "2099-01-01T00:00:00Z"),
            ("usage-bootstrap-signing", "true"),
            ("usage-bootstrap-authentication", "true"),
            ("auth-extra-groups", bootplate::core::token::GROUP),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(format!("bootstrap-token-{}", token.id)),
                labels: Some(BTreeMap::from([(
                    bootplate::labels::TOKEN_CONFIG_UID.to_owned(),
                    uid.to_owned(),
                )])),
                ..Default::default()
            },
            type_: Some(bootplate::core::token::SECRET_TYPE.into()),
            data: Some(token_data),
            ..Default::default()
        };
        match tokens.create(&PostParams::default(), &secret).await {
            Err(kube::Error::Api(e)) if e.code == 409 && attempts < 5 => attempts += 1,
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(()),
        }
    }
}

async fn client_from_file(path: &Path) -> anyhow::Result<Client> {
    client_from_yaml(&std::fs::read_to_string(path)?).await
}

async fn client_from_yaml(yaml: &str) -> anyhow::Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}

/// The Events the controller has queued and not yet published (they trail the reconciles).
fn events_queued(controller: &ControllerProcess) -> u64 {
    controller
        .metric("bootplate_events_queued")
        .map_or(u64::MAX, |v| v as u64)
}

/// Waits until the controller has reconciled at least `n` configs, then made no reconcile for
/// [`QUIET`] and published every Event it queued; returns its reconcile count.
async fn wait_quiet(controller: &ControllerProcess, n: usize) -> u64 {
    let mut last = controller.config_reconciles();
    let mut since = Instant::now();
    let give_up = Instant::now() + Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = controller.config_reconciles();
        if now != last {
            last = now;
            since = Instant::now();
        } else if last >= n as u64 && since.elapsed() >= QUIET && events_queued(controller) == 0 {
            return last;
        }
        if Instant::now() > give_up {
            eprintln!("the controller never went quiet; counting anyway");
            return last;
        }
    }
}
