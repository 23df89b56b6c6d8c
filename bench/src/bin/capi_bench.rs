//! bootplate side by side with the kubeadm bootstrap provider (CABPK) on the same real Cluster
//! API, not a test: run by hand, see docs/benchmarks.md.
//!
//! One management and one workload apiserver (audited), Cluster API's manager, the test
//! infrastructure provider and control-plane stand-in of the real-Cluster-API tier. Each run
//! gets a fresh namespace with `--machines / --per-deployment` Clusters whose control plane is
//! initialized, then starts one bootstrap provider alone and creates one MachineDeployment of
//! `--per-deployment` workers per Cluster: with a `KubeadmConfigTemplate` for CABPK (run with
//! its Deployment's defaults, and once more with bootplate's concurrency) and with a
//! `BootplateConfigTemplate` for bootplate (the shipped `kubeadm-ubuntu-2404` template, a
//! kubeadm join cloud-config). Measured per run:
//!
//! - time from the MachineDeployments' creation until every Machine names its bootstrap data
//!   Secret (`spec.bootstrap.dataSecretName`, set by Cluster API once the provider is done);
//! - the provider's CPU seconds and peak RSS (`/proc`);
//! - its API requests per machine, from both apiservers' audit logs: in the management cluster
//!   by its ServiceAccount; in the workload cluster by the `<cluster>-kubeconfig` user and the
//!   provider's user agent (Cluster API's manager uses the same kubeconfig);
//! - restart: SIGTERM, start again over the ready machines, the requests in the next
//!   `RESTART_WINDOW` after it is ready; among the writes, the bootstrap token extensions that
//!   were due (half the token's lifetime or less left, by its expiry at the stop) and those the
//!   restart brought forward (should be none).
//!
//! The order of the providers is reversed every other round.
//!
//! ```text
//! cargo build --release -p bootplate -p bootplate-bench
//! set -a; . <(tests/scripts/build-tools.sh); set +a
//! target/release/capi-bench --machines 1000 --rounds 2
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bootplate_bench::measure::{
    Requests, TokenUpdates, cpu_seconds, file_len, load_average, per, rss_kib,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use testenv::capi::kubeadm_bootstrap::{self, KubeadmBootstrap};
use testenv::capi::objects::{self, KUBERNETES_VERSION};
use testenv::capi::{CapiEnv, Options, Process, cloud};
use testenv::controller::ControllerProcess;

/// The shipped template bootplate's machines use.
const TEMPLATE_FILE: &str = "templates/kubeadm-ubuntu-2404.yaml";
const TEMPLATE_NAME: &str = "kubeadm-ubuntu-2404";
/// The same template with its boot reports turned off, for `--providers bootplate-noreports`.
const NO_REPORTS_TEMPLATE: &str = "kubeadm-ubuntu-2404-no-reports";
/// The same template with `delivery: Fetch`, for `--providers bootplate-fetch`.
const FETCH_TEMPLATE: &str = "kubeadm-ubuntu-2404-fetch";
/// How long a provider settles after the last Machine got its data, before its requests are
/// counted (the reconciles its own writes trigger count too).
const SETTLE: Duration = Duration::from_secs(10);
/// How long the restart waits for the Machines to join.
const JOIN_LIMIT: Duration = Duration::from_secs(900);
/// How long requests are counted after a restarted provider is ready.
const RESTART_WINDOW: Duration = Duration::from_secs(20);
/// The bootstrap token lifetime of both providers unless `--token-ttl-seconds` says otherwise:
/// bootplate's default `--bootstrap-token-ttl`, and the flag in CABPK's Deployment.
const TOKEN_TTL: SignedDuration = SignedDuration::from_mins(15);
/// The user the `<cluster>-kubeconfig` Secrets of the control-plane stand-in authenticate as.
const WORKLOAD_USER: &str = "kubernetes-admin";

struct Args {
    machines: usize,
    per_deployment: usize,
    rounds: usize,
    /// The number of the first round: an odd one starts with the reversed order.
    first_round: usize,
    concurrency: usize,
    skip_restart: bool,
    /// The providers run in each round, in the order of the first.
    variants: Vec<Variant>,
    /// bootplate's `--bootstrap-token-ttl`, in seconds, when not its default: shorter than a
    /// run, tokens are extended during it, and the restart's extensions can be told apart.
    token_ttl_seconds: Option<u64>,
}

fn args() -> anyhow::Result<Args> {
    let mut parsed = Args {
        machines: 1000,
        per_deployment: 50,
        rounds: 2,
        first_round: 0,
        concurrency: 16,
        skip_restart: false,
        variants: Variant::ALL.to_vec(),
        token_ttl_seconds: None,
    };
    let usage = "usage: capi-bench [--machines N] [--per-deployment N] [--rounds N] [--first-round N] \
                 [--concurrency N] [--skip-restart] [--providers cabpk,cabpkc,bootplate,bootplate-noreports,bootplate-fetch] \
                 [--token-ttl-seconds N]\n\
                 --providers: which to run (default cabpk,cabpkc,bootplate): cabpk is CABPK with its \
                 defaults, cabpkc CABPK with bootplate's --concurrency, bootplate-noreports bootplate \
                 with the template's boot reports turned off, bootplate-fetch bootplate with the \
                 template's delivery: Fetch\n\
                 --token-ttl-seconds: bootplate's --bootstrap-token-ttl (default 900; CABPK keeps 15m)";
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--machines" => parsed.machines = value()?.parse()?,
            "--per-deployment" => parsed.per_deployment = value()?.parse()?,
            "--rounds" => parsed.rounds = value()?.parse()?,
            "--first-round" => parsed.first_round = value()?.parse()?,
            "--concurrency" => parsed.concurrency = value()?.parse()?,
            "--skip-restart" => parsed.skip_restart = true,
            "--token-ttl-seconds" => parsed.token_ttl_seconds = Some(value()?.parse()?),
            "--providers" => {
                parsed.variants = value()?
                    .split(',')
                    .map(|name| {
                        Variant::KNOWN
                            .into_iter()
                            .find(|v| v.short() == name)
                            .with_context(|| format!("unknown provider {name:?}: {usage}"))
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            "-h" | "--help" => {
                println!("{usage}");
                std::process::exit(0);
            }
            _ => bail!("{usage}"),
        }
    }
    if parsed.machines == 0
        || parsed.per_deployment == 0
        || parsed.rounds == 0
        || parsed.variants.is_empty()
    {
        bail!("--machines, --per-deployment, --rounds and --providers must be more than zero");
    }
    if !parsed.machines.is_multiple_of(parsed.per_deployment) {
        bail!("--machines must be a multiple of --per-deployment");
    }
    Ok(parsed)
}

/// The providers compared.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    /// CABPK with its Deployment's defaults.
    CabpkDefaults,
    /// CABPK with `--kubeadmconfig-concurrency` set to bootplate's concurrency.
    CabpkConcurrency,
    Bootplate,
    /// bootplate with the template's boot reports turned off (`bootReports: Disabled`): what
    /// the reports cost is the difference to `Bootplate`.
    BootplateNoReports,
    /// bootplate with the template's `delivery: Fetch`: what fetching costs is the difference
    /// to `Bootplate`.
    BootplateFetch,
}

impl Variant {
    const ALL: [Variant; 3] = [
        Variant::CabpkDefaults,
        Variant::CabpkConcurrency,
        Variant::Bootplate,
    ];
    /// Every variant `--providers` knows (the default is `ALL`).
    const KNOWN: [Variant; 5] = [
        Variant::CabpkDefaults,
        Variant::CabpkConcurrency,
        Variant::Bootplate,
        Variant::BootplateNoReports,
        Variant::BootplateFetch,
    ];

    fn is_bootplate(self) -> bool {
        matches!(
            self,
            Variant::Bootplate | Variant::BootplateNoReports | Variant::BootplateFetch
        )
    }

    /// The ClusterBootstrapTemplate a bootplate variant's machines use.
    fn template(self) -> &'static str {
        match self {
            Variant::BootplateNoReports => NO_REPORTS_TEMPLATE,
            Variant::BootplateFetch => FETCH_TEMPLATE,
            _ => TEMPLATE_NAME,
        }
    }

    fn label(self, concurrency: usize) -> String {
        match self {
            Variant::CabpkDefaults => "CABPK (defaults)".into(),
            Variant::CabpkConcurrency => format!("CABPK (concurrency {concurrency})"),
            Variant::Bootplate => format!("bootplate (concurrency {concurrency})"),
            Variant::BootplateNoReports => {
                format!("bootplate (concurrency {concurrency}, boot reports off)")
            }
            Variant::BootplateFetch => {
                format!("bootplate (concurrency {concurrency}, delivery: Fetch)")
            }
        }
    }

    fn short(self) -> &'static str {
        match self {
            Variant::CabpkDefaults => "cabpk",
            Variant::CabpkConcurrency => "cabpkc",
            Variant::Bootplate => "bootplate",
            Variant::BootplateNoReports => "bootplate-noreports",
            Variant::BootplateFetch => "bootplate-fetch",
        }
    }
}

/// What one run of one provider measured.
struct Run {
    round: usize,
    variant: Variant,
    seconds: f64,
    cpu_at_ready: f64,
    cpu_settled: f64,
    peak_rss_mib: f64,
    requests: Requests,
    restart: Option<Requests>,
    /// The token expiry extensions among the restart's writes, due or brought forward.
    restart_tokens: Option<TokenUpdates>,
    breakdown: Breakdown,
}

/// Where a run's time went: Cluster API creating the Machines, the provider's lag behind it,
/// and the CPU every process used until the last Machine had its data.
struct Breakdown {
    /// Seconds from the MachineDeployments' creation until the watch saw the last Machine.
    last_machine_seen: f64,
    /// Per Machine, seconds from the watch first seeing it to seeing it name its data Secret:
    /// median, 95th percentile, maximum.
    lag: [f64; 3],
    /// CPU seconds until ready: Cluster API's manager, the management apiserver + etcd, the
    /// workload apiserver + etcd, this program (the test infrastructure provider and the
    /// control-plane stand-in run in it).
    cpu: [f64; 4],
}

/// When the benchmark's watch first saw each Machine, and when it first saw it name its data
/// Secret.
#[derive(Default)]
struct Timeline {
    seen: HashMap<String, Instant>,
    done: HashMap<String, Instant>,
}

impl Timeline {
    fn breakdown(&self, started: Instant, cpu: [f64; 4]) -> Breakdown {
        let last_machine_seen = self
            .seen
            .values()
            .map(|at| at.duration_since(started).as_secs_f64())
            .fold(0.0, f64::max);
        let mut lags: Vec<f64> = self
            .done
            .iter()
            .filter_map(|(name, done)| {
                Some(done.duration_since(*self.seen.get(name)?).as_secs_f64())
            })
            .collect();
        lags.sort_by(f64::total_cmp);
        let at = |q: f64| {
            lags.get(((lags.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        Breakdown {
            last_machine_seen,
            lag: [at(0.5), at(0.95), at(1.0)],
            cpu,
        }
    }
}

/// A running provider: bootplate (the environment's process) or CABPK's manager.
enum Provider {
    Bootplate,
    Cabpk(Process),
}

impl Provider {
    fn pid(&self, env: &CapiEnv) -> u32 {
        match self {
            Provider::Bootplate => env.bootplate.pid(),
            Provider::Cabpk(process) => process.pid(),
        }
    }

    /// SIGTERM, as Kubernetes stops a Pod.
    fn stop(&mut self, env: &mut CapiEnv) -> anyhow::Result<()> {
        match self {
            Provider::Bootplate => env.bootplate.terminate().map(drop),
            Provider::Cabpk(process) => process.terminate().map(drop),
        }
    }
}

struct Bench {
    env: CapiEnv,
    cabpk: KubeadmBootstrap,
    args: Args,
    bootplate_user: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    bootplate_bench::start();
    let started = Instant::now();
    let mut env = CapiEnv::start(Options {
        audited: true,
        ..Default::default()
    })
    .await?;
    let template: Value = serde_yaml::from_str(&std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(TEMPLATE_FILE),
    )?)?;
    let mut no_reports = template.clone();
    no_reports["metadata"]["name"] = NO_REPORTS_TEMPLATE.into();
    no_reports["spec"]["bootReports"] = "Disabled".into();
    let mut fetch = template.clone();
    fetch["metadata"]["name"] = FETCH_TEMPLATE.into();
    fetch["spec"]["delivery"] = "Fetch".into();
    for template in [&template, &no_reports, &fetch] {
        cloud::apply(
            &env.client,
            &objects::bootplate_resource("ClusterBootstrapTemplate", "clusterbootstraptemplates"),
            None,
            template,
        )
        .await?;
    }
    // Each provider runs alone: bootplate only for its runs (its webhook has just checked the
    // template).
    env.bootplate.kill();
    let cabpk = KubeadmBootstrap::install(&env).await?;
    let (sa_ns, sa_name) = testenv::rbac::SERVICE_ACCOUNT;
    eprintln!(
        "management cluster with Cluster API and both providers installed in {:.1?}",
        started.elapsed()
    );
    let mut bench = Bench {
        env,
        cabpk,
        args,
        bootplate_user: format!("system:serviceaccount:{sa_ns}:{sa_name}"),
    };
    let mut runs = Vec::new();
    for round in 0..bench.args.rounds {
        let mut order = bench.args.variants.clone();
        if (round + bench.args.first_round) % 2 == 1 {
            order.reverse();
        }
        for variant in order {
            let run = bench.run(round, variant).await?;
            runs.push(run);
        }
    }
    bench.print_table(&runs);
    Ok(())
}

impl Bench {
    async fn run(&mut self, round: usize, variant: Variant) -> anyhow::Result<Run> {
        let n = self.args.machines;
        let round = round + self.args.first_round;
        let ns = format!("r{round}-{}", variant.short());
        println!(
            "== round {round}: {} in namespace {ns}; load average {}",
            variant.label(self.args.concurrency),
            load_average()
        );
        let clusters = self.create_clusters(&ns).await?;
        let concurrency = self.args.concurrency.to_string();
        let log = format!("{ns}.log");
        let mut provider = self
            .start_provider(variant, &ns, &concurrency, &log)
            .await?;
        // After the provider: its webhook checks its template.
        self.create_templates(&ns, variant).await?;
        let pid = provider.pid(&self.env);

        let (ready_tx, mut ready_rx) = tokio::sync::watch::channel(0usize);
        let timeline = Arc::new(Mutex::new(Timeline::default()));
        let watch = tokio::spawn(count_bootstrapped(
            Api::namespaced_with(self.env.client.clone(), &ns, &objects::machine_resource()),
            ready_tx,
            timeline.clone(),
        ));
        let audit = self.audit_offsets();
        let cpu_before = cpu_seconds(pid);
        let others_before = self.others_cpu();
        let started = Instant::now();
        self.create_deployments(&ns, &clusters, variant).await?;
        tokio::time::timeout(
            Duration::from_secs(3600),
            ready_rx.wait_for(|ready| *ready >= n),
        )
        .await
        .context("not every Machine got its bootstrap data within an hour")??;
        let seconds = started.elapsed().as_secs_f64();
        watch.abort();
        let cpu_at_ready = cpu_seconds(pid) - cpu_before;
        let others = self.others_cpu();
        let breakdown = timeline.lock().expect("timeline").breakdown(
            started,
            std::array::from_fn(|i| others[i] - others_before[i]),
        );
        tokio::time::sleep(SETTLE).await;
        let cpu_settled = cpu_seconds(pid) - cpu_before;
        let peak_rss_mib = rss_kib(pid, "VmHWM") / 1024.0;
        let requests = self.requests_since(audit, variant)?;
        println!(
            "{n} machines with bootstrap data {seconds:.2} s after the MachineDeployments' creation; \
             provider CPU {cpu_at_ready:.1} s until then, {cpu_settled:.1} s after settling; peak RSS {peak_rss_mib:.1} MiB"
        );
        requests.print("run", n);
        println!(
            "last Machine seen {:.1} s after the MachineDeployments' creation; data Secret after its Machine: median {:.2} s, p95 {:.2} s, max {:.2} s; \
             CPU s until ready: Cluster API {:.1}, management apiserver + etcd {:.1}, workload apiserver + etcd {:.1}, test provider (this program) {:.1}",
            breakdown.last_machine_seen,
            breakdown.lag[0],
            breakdown.lag[1],
            breakdown.lag[2],
            breakdown.cpu[0],
            breakdown.cpu[1],
            breakdown.cpu[2],
            breakdown.cpu[3],
        );

        let (restart, restart_tokens) = if self.args.skip_restart {
            provider.stop(&mut self.env)?;
            (None, None)
        } else {
            self.wait_joined(&ns, n).await;
            provider.stop(&mut self.env)?;
            let audit = self.audit_offsets();
            let expiries = self.token_expiries().await?;
            let restarted = Instant::now();
            let mut provider = self
                .start_provider(variant, &ns, &concurrency, &format!("{ns}-restart.log"))
                .await?;
            let ready = restarted.elapsed().as_secs_f64();
            tokio::time::sleep(RESTART_WINDOW).await;
            let requests = self.requests_since(audit, variant)?;
            let tokens = self.token_updates_since(audit[1], variant, &expiries)?;
            provider.stop(&mut self.env)?;
            println!(
                "restart: ready {ready:.2} s after start; requests in the {RESTART_WINDOW:?} after:"
            );
            requests.print("restart", n);
            println!(
                "restart: token expiry extensions {} due anyway (half the lifetime or less left), {} brought forward",
                tokens.due, tokens.early
            );
            (Some(requests), Some(tokens))
        };
        Ok(Run {
            round,
            variant,
            seconds,
            cpu_at_ready,
            cpu_settled,
            peak_rss_mib,
            requests,
            restart,
            restart_tokens,
            breakdown,
        })
    }

    /// Waits (at most [`JOIN_LIMIT`]) until every Machine of `ns` has joined, as Cluster API
    /// reports it (`status.nodeRef`), then [`SETTLE`] more for the provider to finish with
    /// them (bootplate deletes a joined machine's token). The restart is measured over ready
    /// machines that have joined, as in a cluster whose rollout is over; a machine that never
    /// joins keeps its token in use, and extending it falls due whether or not the provider
    /// restarts.
    async fn wait_joined(&self, ns: &str, n: usize) {
        let machines =
            Api::namespaced_with(self.env.client.clone(), ns, &objects::machine_resource());
        let started = Instant::now();
        let (joined_tx, mut joined_rx) = tokio::sync::watch::channel(0usize);
        let watch = tokio::spawn(count_joined(machines, joined_tx));
        let all = tokio::time::timeout(JOIN_LIMIT, joined_rx.wait_for(|joined| *joined >= n))
            .await
            .is_ok();
        watch.abort();
        let joined = *joined_rx.borrow();
        let seconds = started.elapsed().as_secs_f64();
        if all {
            println!("every Machine joined; waited {seconds:.1} s for the last");
        } else {
            println!("{joined} of {n} Machines joined within {JOIN_LIMIT:?}; restarting anyway");
        }
        tokio::time::sleep(SETTLE).await;
    }

    /// CPU seconds so far of Cluster API's manager, each apiserver with its etcd, and this
    /// program.
    fn others_cpu(&self) -> [f64; 4] {
        let sum = |pids: [u32; 2]| pids.into_iter().map(cpu_seconds).sum::<f64>();
        [
            cpu_seconds(self.env.capi.pid()),
            sum(self.env.management.pids()),
            sum(self.env.workload.pids()),
            cpu_seconds(std::process::id()),
        ]
    }

    /// Starts `variant` for the run in namespace `ns`. bootplate watches only that namespace: a
    /// fresh process over every namespace would also clean up after the earlier runs' joined
    /// machines (it does not know their tokens are gone), and count those requests as this
    /// run's. CABPK watches every namespace, as its Deployment does.
    async fn start_provider(
        &mut self,
        variant: Variant,
        ns: &str,
        concurrency: &str,
        log: &str,
    ) -> anyhow::Result<Provider> {
        Ok(match variant {
            Variant::Bootplate | Variant::BootplateNoReports | Variant::BootplateFetch => {
                let mut args = [
                    "--concurrency",
                    concurrency,
                    "--log-level",
                    "info",
                    "--namespace",
                    ns,
                ]
                .map(String::from)
                .to_vec();
                if let Some(seconds) = self.args.token_ttl_seconds {
                    args.extend(["--bootstrap-token-ttl".into(), format!("{seconds}s")]);
                }
                self.env.restart_bootplate(&args, log).await?;
                wait_ready(&self.env.bootplate).await?;
                Provider::Bootplate
            }
            Variant::CabpkDefaults => Provider::Cabpk(self.cabpk.start(&self.env, &[], log).await?),
            Variant::CabpkConcurrency => Provider::Cabpk(
                self.cabpk
                    .start(
                        &self.env,
                        &[format!("--kubeadmconfig-concurrency={concurrency}")],
                        log,
                    )
                    .await?,
            ),
        })
    }

    /// The run's Clusters, each with its DevCluster and DevControlPlane; returns their names
    /// once the control-plane stand-in has initialized every one.
    async fn create_clusters(&self, ns: &str) -> anyhow::Result<Vec<String>> {
        testenv::fixtures::namespace(&self.env.client, ns).await?;
        let names: Vec<String> = (0..self.args.machines / self.args.per_deployment)
            .map(|i| format!("c{i}"))
            .collect();
        futures::stream::iter(&names)
            .map(|name| async move {
                let plane = format!("{name}-cp");
                for (resource, object) in [
                    (objects::dev_cluster_resource(), objects::dev_cluster(name)),
                    (
                        objects::dev_control_plane_resource(),
                        objects::dev_control_plane(&plane, KUBERNETES_VERSION),
                    ),
                    (
                        objects::cluster_resource(),
                        objects::cluster(name, Some(&plane), false),
                    ),
                ] {
                    self.apply(ns, &resource, object).await?;
                }
                anyhow::Ok(())
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        let clusters: Api<DynamicObject> =
            Api::namespaced_with(self.env.client.clone(), ns, &objects::cluster_resource());
        let secrets: Api<Secret> = Api::namespaced(self.env.client.clone(), ns);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let initialized = clusters
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|c| {
                    c.data["status"]["initialization"]["controlPlaneInitialized"] == json!(true)
                })
                .count();
            let kubeconfigs = secrets
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|s| s.name_any().ends_with("-kubeconfig"))
                .count();
            if initialized == names.len() && kubeconfigs == names.len() {
                return Ok(names);
            }
            if Instant::now() > deadline {
                bail!(
                    "{initialized} of {} clusters initialized in 10 minutes",
                    names.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn create_templates(&self, ns: &str, variant: Variant) -> anyhow::Result<()> {
        self.apply(
            ns,
            &objects::dev_machine_template_resource(),
            objects::dev_machine_template("workers", "small"),
        )
        .await?;
        let (resource, object) = if variant.is_bootplate() {
            (
                objects::bootplate_resource("BootplateConfigTemplate", "bootplateconfigtemplates"),
                objects::bootplate_config_template("workers", variant.template()),
            )
        } else {
            (
                kubeadm_config_template_resource(),
                json!({
                    "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
                    "kind": "KubeadmConfigTemplate",
                    "metadata": {"name": "workers"},
                    "spec": {"template": {"spec": {"joinConfiguration": {"nodeRegistration": {
                        "kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}],
                    }}}}},
                }),
            )
        };
        self.apply(ns, &resource, object).await?;
        Ok(())
    }

    async fn create_deployments(
        &self,
        ns: &str,
        clusters: &[String],
        variant: Variant,
    ) -> anyhow::Result<()> {
        futures::stream::iter(clusters)
            .map(|cluster| async move {
                let mut deployment = objects::machine_deployment(
                    &format!("{cluster}-md"),
                    cluster,
                    self.args.per_deployment as u32,
                    "workers",
                    "workers",
                    KUBERNETES_VERSION,
                );
                if !variant.is_bootplate() {
                    deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"] = json!({
                        "apiGroup": "bootstrap.cluster.x-k8s.io",
                        "kind": "KubeadmConfigTemplate",
                        "name": "workers",
                    });
                }
                self.apply(ns, &objects::machine_deployment_resource(), deployment)
                    .await
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn apply(
        &self,
        ns: &str,
        resource: &ApiResource,
        mut object: Value,
    ) -> anyhow::Result<()> {
        object["metadata"]["namespace"] = json!(ns);
        // Webhooks of a manager under load can refuse a moment; a user's apply would retry.
        let mut tries = 0;
        loop {
            match cloud::apply(&self.env.client, resource, Some(ns), &object).await {
                Ok(_) => return Ok(()),
                Err(e) if tries < 20 => {
                    tries += 1;
                    eprintln!("retrying: {e:#}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn audit_offsets(&self) -> [u64; 2] {
        [
            file_len(&self.env.management.audit_log()),
            file_len(&self.env.workload.audit_log()),
        ]
    }

    /// The expiry of every bootstrap token in the workload cluster now, by Secret name.
    async fn token_expiries(&self) -> anyhow::Result<BTreeMap<String, Timestamp>> {
        let tokens = Api::<Secret>::namespaced(self.env.workload_client.clone(), "kube-system")
            .list(&ListParams::default().fields("type=bootstrap.kubernetes.io/token"))
            .await?;
        Ok(tokens
            .items
            .into_iter()
            .filter_map(|secret| {
                let expiration = secret.data.as_ref()?.get("expiration")?;
                let expires = std::str::from_utf8(&expiration.0).ok()?.parse().ok()?;
                Some((secret.name_any(), expires))
            })
            .collect())
    }

    /// The provider's token expiry extensions in the workload cluster since `offset`, judged
    /// against the tokens' `expiries` when the old process stopped.
    fn token_updates_since(
        &self,
        offset: u64,
        variant: Variant,
        expiries: &BTreeMap<String, Timestamp>,
    ) -> anyhow::Result<TokenUpdates> {
        let mut tokens = TokenUpdates::default();
        let (_, ours) = self.provider_filter(variant);
        tokens.add_from(
            &self.env.workload.audit_log(),
            offset,
            |e| Requests::user(e) == Some(WORKLOAD_USER) && ours(e),
            expiries,
            self.token_ttl(variant),
        )?;
        Ok(tokens)
    }

    /// The lifetime of the tokens `variant` makes.
    fn token_ttl(&self, variant: Variant) -> SignedDuration {
        match (variant, self.args.token_ttl_seconds) {
            (
                Variant::Bootplate | Variant::BootplateNoReports | Variant::BootplateFetch,
                Some(seconds),
            ) => SignedDuration::from_secs(i64::try_from(seconds).unwrap_or(i64::MAX)),
            _ => TOKEN_TTL,
        }
    }

    /// The provider's user in the management cluster, and whether a workload cluster request
    /// (an audit event) is the provider's: Cluster API's manager uses the same kubeconfig there,
    /// and its user agents (and CABPK's) name "cluster-api", bootplate's client sends none.
    fn provider_filter(&self, variant: Variant) -> (String, impl Fn(&Value) -> bool + use<>) {
        let user = if variant.is_bootplate() {
            self.bootplate_user.clone()
        } else {
            kubeadm_bootstrap::user()
        };
        let ours = move |e: &Value| {
            let agent = e["userAgent"].as_str().unwrap_or("");
            if variant.is_bootplate() {
                !agent.contains("cluster-api")
            } else {
                agent.contains("kubeadm-bootstrap")
            }
        };
        (user, ours)
    }

    /// The provider's requests since `offsets`: in the management cluster by its user, in the
    /// workload cluster by the kubeconfig Secrets' user and the provider's user agent.
    fn requests_since(&self, offsets: [u64; 2], variant: Variant) -> anyhow::Result<Requests> {
        // The audit backend writes as requests complete; let the last ones land.
        std::thread::sleep(Duration::from_millis(500));
        let (user, ours) = self.provider_filter(variant);
        let mut requests = Requests::default();
        requests.add_from(
            "management",
            &self.env.management.audit_log(),
            offsets[0],
            |e| Requests::user(e) == Some(user.as_str()),
        )?;
        requests.add_from(
            "workload",
            &self.env.workload.audit_log(),
            offsets[1],
            |e| Requests::user(e) == Some(WORKLOAD_USER) && ours(e),
        )?;
        Ok(requests)
    }

    fn print_table(&self, runs: &[Run]) {
        let n = self.args.machines;
        println!(
            "\nRESULT N={n} machines in {} MachineDeployments of {} ({} rounds, order reversed every other round)",
            n / self.args.per_deployment,
            self.args.per_deployment,
            self.args.rounds
        );
        println!(
            "| provider | round | time to every data Secret | CPU s (to ready / settled) | peak RSS | requests per machine (writes) | restart: writes (reads); token extensions |"
        );
        println!("|---|---|---|---|---|---|---|");
        for run in runs {
            let restart = match (&run.restart, &run.restart_tokens) {
                (Some(r), Some(t)) => format!(
                    "{} ({}); token extensions: {} due, {} brought forward",
                    r.writes(),
                    r.reads(),
                    t.due,
                    t.early
                ),
                _ => "not run".to_owned(),
            };
            println!(
                "| {} | {} | {:.2} s | {:.1} / {:.1} | {:.1} MiB | {:.2} ({:.2}) | {restart} |",
                run.variant.label(self.args.concurrency),
                run.round,
                run.seconds,
                run.cpu_at_ready,
                run.cpu_settled,
                run.peak_rss_mib,
                per(run.requests.total() as f64, n as f64),
                per(run.requests.writes() as f64, n as f64),
            );
        }
        println!(
            "\nwhere the time went (Machines: the watch's first sight of the last one; lag: data Secret after its Machine; CPU s until ready):"
        );
        println!(
            "| provider | round | time | last Machine seen | lag median / p95 / max | CPU: Cluster API | management apiserver + etcd | workload apiserver + etcd | test provider |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for run in runs {
            let b = &run.breakdown;
            println!(
                "| {} | {} | {:.1} s | {:.1} s | {:.2} / {:.2} / {:.2} s | {:.1} | {:.1} | {:.1} | {:.1} |",
                run.variant.label(self.args.concurrency),
                run.round,
                run.seconds,
                b.last_machine_seen,
                b.lag[0],
                b.lag[1],
                b.lag[2],
                b.cpu[0],
                b.cpu[1],
                b.cpu[2],
                b.cpu[3],
            );
        }
        let median = |variant: Variant, f: &dyn Fn(&Run) -> f64| {
            let mut values: Vec<f64> = runs
                .iter()
                .filter(|r| r.variant == variant)
                .map(f)
                .collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        println!(
            "\nratios bootplate / CABPK (medians over the rounds; targets: time <= 0.67, CPU <= 0.5, RSS <= 0.5, requests <= 1):"
        );
        let ran = |variant: Variant| runs.iter().any(|r| r.variant == variant);
        for cabpk in [Variant::CabpkDefaults, Variant::CabpkConcurrency] {
            if !ran(Variant::Bootplate) || !ran(cabpk) {
                continue;
            }
            let ratio = |f: &dyn Fn(&Run) -> f64| median(Variant::Bootplate, f) / median(cabpk, f);
            println!(
                "  against {}: time {:.2}, CPU (settled) {:.2}, peak RSS {:.2}, requests per machine {:.2}",
                cabpk.label(self.args.concurrency),
                ratio(&|r| r.seconds),
                ratio(&|r| r.cpu_settled),
                ratio(&|r| r.peak_rss_mib),
                ratio(&|r| r.requests.total() as f64),
            );
        }
        let per_machine = |variant: Variant, f: &dyn Fn(&Requests) -> u64| {
            median(variant, &|r| f(&r.requests) as f64) / self.args.machines as f64
        };
        let extra = |with: Variant, without: Variant, f: &dyn Fn(&Requests) -> u64| {
            per_machine(with, f) - per_machine(without, f)
        };
        let (on, off, fetch) = (
            Variant::Bootplate,
            Variant::BootplateNoReports,
            Variant::BootplateFetch,
        );
        if ran(on) && ran(off) {
            println!(
                "\nboot reports: {:.2} more requests per machine with them on ({:.2} writes), \
                 {:.2} against {:.2} (medians over the rounds)",
                extra(on, off, &|r| r.total()),
                extra(on, off, &|r| r.writes()),
                per_machine(on, &|r| r.total()),
                per_machine(off, &|r| r.total()),
            );
        }
        if ran(on) && ran(fetch) {
            println!(
                "\ndelivery: Fetch: {:.2} more requests per machine than inline ({:.2} writes), \
                 {:.2} against {:.2} (medians over the rounds)",
                extra(fetch, on, &|r| r.total()),
                extra(fetch, on, &|r| r.writes()),
                per_machine(fetch, &|r| r.total()),
                per_machine(on, &|r| r.total()),
            );
        }
    }
}

/// Waits until a (re)started bootplate answers `/readyz`.
async fn wait_ready(bootplate: &ControllerProcess) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while bootplate.readyz() != Some(200) {
        if Instant::now() > deadline {
            bail!("bootplate not ready after 2 minutes:\n{}", bootplate.log());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Sends the number of Machines that name their bootstrap data Secret, as a watch sees them.
async fn count_bootstrapped(
    machines: Api<DynamicObject>,
    ready: tokio::sync::watch::Sender<usize>,
    timeline: Arc<Mutex<Timeline>>,
) {
    let stream = watcher(machines, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let objects = match event {
            Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => vec![m],
            _ => continue,
        };
        let now = Instant::now();
        let mut timeline = timeline.lock().expect("timeline");
        for machine in objects {
            let name = machine.name_any();
            timeline.seen.entry(name.clone()).or_insert(now);
            if machine.data["spec"]["bootstrap"]["dataSecretName"].is_string() {
                timeline.done.entry(name).or_insert(now);
            }
        }
        let _ = ready.send(timeline.done.len());
    }
}

/// Sends the number of Machines that have joined (`status.nodeRef`), as a watch sees them.
async fn count_joined(machines: Api<DynamicObject>, joined: tokio::sync::watch::Sender<usize>) {
    let stream = watcher(machines, watcher::Config::default());
    futures::pin_mut!(stream);
    let mut names = std::collections::HashSet::new();
    while let Some(event) = stream.next().await {
        if let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = event
            && m.data["status"]["nodeRef"].is_object()
        {
            names.insert(m.name_any());
            let _ = joined.send(names.len());
        }
    }
}

fn kubeadm_config_template_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "bootstrap.cluster.x-k8s.io",
            "v1beta2",
            "KubeadmConfigTemplate",
        ),
        "kubeadmconfigtemplates",
    )
}
