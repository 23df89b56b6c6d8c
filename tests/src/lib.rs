//! Test environment: a real etcd + kube-apiserver on loopback, one pair per [`ApiServer`].
//!
//! kube-apiserver and etcd are built from their Go modules by `tests/scripts/build-tools.sh`
//! (the README's test command runs it); [`tools`] finds them. A missing binary fails the test
//! with a message saying how to build it: integration tests never skip silently.

pub mod agent;
pub mod boot_compare;
pub mod capi;
pub mod capi_env;
pub mod clusterctl_repo;
pub mod configs;
pub mod controller;
pub mod endpoint;
pub mod events;
pub mod fixtures;
pub mod generator;
pub mod images;
pub mod joins;
pub mod lock_file;
pub mod machine_script;
pub mod mirror;
pub mod node;
pub mod pki;
pub mod pod_cluster;
pub mod ports;
pub mod rbac;
pub mod release;
pub mod tls_probe;
pub mod tools;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

const ADMIN_TOKEN: &str = "bootplate-test-admin-token";
/// A second static token of every test apiserver: user `bootplate-bench-workload`, in
/// `system:masters`. The scale benchmark gives it to the controller for the workload cluster, so
/// the audit log tells the controller's requests from the benchmark's own (bootplate refuses
/// kubeconfigs that impersonate).
pub const BENCH_WORKLOAD_TOKEN: &str = "bootplate-bench-workload-token";

/// One etcd + kube-apiserver pair, stopped (SIGKILL) and its data removed on drop, also when
/// the test panics.
pub struct ApiServer {
    etcd: Child,
    apiserver: Child,
    /// How the apiserver was started, to start it again over the same etcd.
    launch: Launch,
    dir: tempfile::TempDir,
    port: u16,
    kubeconfig_yaml: String,
}

/// The kube-apiserver command line of one test cluster.
struct Launch {
    binary: PathBuf,
    etcd_url: String,
    extra: Vec<String>,
    /// The CA that verifies the serving certificate.
    ca_path: PathBuf,
}

/// Path of the kube-apiserver binary (see [`tools`]).
pub fn apiserver_binary() -> anyhow::Result<PathBuf> {
    tools::path("kube-apiserver")
}

/// A free TCP port for a process the test starts (see [`ports`]: outside the ephemeral range
/// and claimed for this test process alone).
pub fn free_port() -> anyhow::Result<u16> {
    ports::claim()
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn spawn_logged(cmd: &mut Command, log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl ApiServer {
    /// Starts etcd and kube-apiserver on free loopback ports with a fresh data directory and
    /// waits until `/readyz` answers.
    pub async fn start() -> anyhow::Result<ApiServer> {
        Self::start_with(false, None, &[]).await
    }

    /// [`ApiServer::start`] for a workload cluster whose CA is `ca`: the serving certificate is
    /// signed by it and client certificates it signed are accepted (the kubeconfig Cluster API
    /// generates from the `<cluster>-ca` Secret authenticates so).
    pub async fn start_with_ca(ca: &pki::TestCa) -> anyhow::Result<ApiServer> {
        // Bootstrap tokens authenticate, as on any cluster kubeadm set up: the test clouds'
        // kubelets prove the tokens they got.
        Self::start_with(false, Some(ca), &["--enable-bootstrap-token-auth"]).await
    }

    /// [`ApiServer::start_with_ca`] for a cluster that machines join with kubeadm: bootstrap
    /// tokens authenticate, and the Node authorizer (before RBAC) serves the kubelets.
    pub async fn start_for_joins(ca: &pki::TestCa) -> anyhow::Result<ApiServer> {
        Self::start_with(false, Some(ca), &joins::APISERVER_FLAGS).await
    }

    /// [`ApiServer::start_for_joins`] with more flags (`--runtime-config=...` to serve less).
    pub async fn start_for_joins_with(
        ca: &pki::TestCa,
        flags: &[&str],
    ) -> anyhow::Result<ApiServer> {
        let all: Vec<&str> = joins::APISERVER_FLAGS
            .iter()
            .chain(flags)
            .copied()
            .collect();
        Self::start_with(false, Some(ca), &all).await
    }

    /// [`ApiServer::start`] with an audit log of every request (metadata level, one JSON line
    /// per request when it completes; watches also when they start) at [`ApiServer::audit_log`]:
    /// the benchmarks count the requests of one user from it.
    pub async fn start_audited() -> anyhow::Result<ApiServer> {
        Self::start_with(true, None, &[]).await
    }

    /// [`ApiServer::start_with_ca`] with [`ApiServer::start_audited`]'s audit log.
    pub async fn start_audited_with_ca(ca: &pki::TestCa) -> anyhow::Result<ApiServer> {
        Self::start_with(true, Some(ca), &["--enable-bootstrap-token-auth"]).await
    }

    async fn start_with(
        audit: bool,
        ca: Option<&pki::TestCa>,
        flags: &[&str],
    ) -> anyhow::Result<ApiServer> {
        let binary = apiserver_binary()?;
        // BOOTPLATE_KEEP_TEST_DIRS=1 keeps the directory (logs of the apiserver and of the
        // processes started beside it) for a look after a failure.
        let dir = tempfile::Builder::new()
            .prefix("bootplate-apiserver-")
            .disable_cleanup(std::env::var_os("BOOTPLATE_KEEP_TEST_DIRS").is_some())
            .tempdir()?;
        let d = dir.path();
        std::fs::create_dir_all(d.join("certs"))?;
        run(Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(d.join("sa.key"))
            .arg("2048")
            .stderr(Stdio::piped()))?;
        run(Command::new("openssl")
            .args(["rsa", "-pubout", "-in"])
            .arg(d.join("sa.key"))
            .arg("-out")
            .arg(d.join("sa.pub"))
            .stderr(Stdio::piped()))?;
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "{ADMIN_TOKEN},admin,admin,system:masters\n\
                 {BENCH_WORKLOAD_TOKEN},bootplate-bench-workload,bootplate-bench-workload,system:masters\n"
            ),
        )?;
        let mut extra: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        // The CA clients verify the serving certificate with: the given one, or the
        // self-signed certificate the apiserver writes to its --cert-dir.
        let ca_path = match ca {
            Some(ca) => {
                let certs = d.join("certs");
                ca.write_serving(&certs)?;
                extra.push(format!(
                    "--tls-cert-file={}",
                    certs.join("tls.crt").display()
                ));
                extra.push(format!(
                    "--tls-private-key-file={}",
                    certs.join("tls.key").display()
                ));
                extra.push(format!(
                    "--client-ca-file={}",
                    certs.join("ca.crt").display()
                ));
                certs.join("ca.crt")
            }
            None => d.join("certs/apiserver.crt"),
        };
        if audit {
            std::fs::write(
                d.join("audit-policy.yaml"),
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
            )?;
            extra.push(format!(
                "--audit-policy-file={}",
                d.join("audit-policy.yaml").display()
            ));
            extra.push(format!(
                "--audit-log-path={}",
                d.join("audit.log").display()
            ));
            extra.push("--audit-log-format=json".to_owned());
            // Never rotate (the default rotates at 100 MB): a benchmark reads from an offset.
            extra.push("--audit-log-maxsize=1000000".to_owned());
        }

        // A port can be taken between picking and binding; retry a few times.
        let mut last_error = None;
        for _ in 0..3 {
            match Self::start_once(&binary, dir.path(), &extra, &ca_path).await {
                Ok((etcd, apiserver, port, etcd_url)) => {
                    let kubeconfig_yaml = kubeconfig_yaml(port, &ca_path)?;
                    return Ok(ApiServer {
                        etcd,
                        apiserver,
                        launch: Launch {
                            binary,
                            etcd_url,
                            extra,
                            ca_path,
                        },
                        dir,
                        port,
                        kubeconfig_yaml,
                    });
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    async fn start_once(
        binary: &Path,
        d: &Path,
        extra: &[String],
        ca_path: &Path,
    ) -> anyhow::Result<(Child, Child, u16, String)> {
        let (etcd_port, peer_port, port) = (free_port()?, free_port()?, free_port()?);
        let etcd_data = d.join(format!("etcd-{etcd_port}"));
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let mut etcd = spawn_logged(
            Command::new(tools::path("etcd")?)
                .arg("--data-dir")
                .arg(&etcd_data)
                .args([
                    "--listen-client-urls",
                    &etcd_url,
                    "--advertise-client-urls",
                    &etcd_url,
                ])
                .args([
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                ])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                ])
                .args([
                    "--initial-cluster",
                    &format!("default=http://127.0.0.1:{peer_port}"),
                ])
                .args(["--log-level", "warn"]),
            &d.join("etcd.log"),
        )?;
        let launch = Launch {
            binary: binary.to_owned(),
            etcd_url,
            extra: extra.to_vec(),
            ca_path: ca_path.to_owned(),
        };
        let mut apiserver = match launch.spawn(d, port) {
            Ok(child) => child,
            Err(e) => {
                let _ = etcd.kill();
                let _ = etcd.wait();
                return Err(e);
            }
        };
        if let Err(e) = wait_until_ready(&mut apiserver, d, port, ca_path).await {
            let _ = etcd.kill();
            let _ = etcd.wait();
            return Err(e.context(format!("etcd log:\n{}", log_tail(&d.join("etcd.log")))));
        }
        Ok((etcd, apiserver, port, launch.etcd_url))
    }

    /// Stops kube-apiserver (SIGKILL) and starts it again on the same port over the same etcd,
    /// as an upgrade or a crash of the control plane would: every client connection and watch
    /// breaks, and the new process starts with an empty watch cache.
    pub async fn restart_apiserver(&mut self) -> anyhow::Result<()> {
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
        self.apiserver = self.launch.spawn(self.dir.path(), self.port)?;
        wait_until_ready(
            &mut self.apiserver,
            self.dir.path(),
            self.port,
            &self.launch.ca_path,
        )
        .await
    }

    /// The apiserver's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A kubeconfig (YAML) with admin rights that verifies the serving certificate.
    pub fn kubeconfig_yaml(&self) -> &str {
        &self.kubeconfig_yaml
    }

    /// Writes the kubeconfig to a file in the data directory and returns its path (for child
    /// processes such as the controller binary or kubectl).
    pub fn kubeconfig_path(&self) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join("kubeconfig");
        std::fs::write(&path, &self.kubeconfig_yaml)?;
        Ok(path)
    }

    /// A client with admin rights.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let kubeconfig = Kubeconfig::from_yaml(&self.kubeconfig_yaml)?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// The audit log of an apiserver started with [`ApiServer::start_audited`].
    pub fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// The process ids of etcd and kube-apiserver, for benchmarks that account CPU time.
    pub fn pids(&self) -> [u32; 2] {
        [self.etcd.id(), self.apiserver.id()]
    }

    /// The data directory (logs: `apiserver.log`, `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Launch {
    fn spawn(&self, d: &Path, port: u16) -> anyhow::Result<Child> {
        // The authorizers are a list flag: given twice, it is refused rather than replaced.
        let authorization = if self
            .extra
            .iter()
            .any(|f| f.starts_with("--authorization-mode"))
        {
            None
        } else {
            Some("--authorization-mode=RBAC")
        };
        spawn_logged(
            Command::new(&self.binary)
                .arg(format!("--etcd-servers={}", self.etcd_url))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", d.join("certs").display()))
                .arg(format!(
                    "--service-account-key-file={}",
                    d.join("sa.pub").display()
                ))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    d.join("sa.key").display()
                ))
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!(
                    "--token-auth-file={}",
                    d.join("tokens.csv").display()
                ))
                .args(authorization)
                .arg("--service-cluster-ip-range=10.0.0.0/24")
                .arg("--advertise-address=127.0.0.1")
                // A current apiserver refuses a loopback address for the `kubernetes` Service's
                // endpoints; nothing here routes to Services.
                .arg("--endpoint-reconciler-type=none")
                .arg("--v=0")
                .args(&self.extra),
            &d.join("apiserver.log"),
        )
    }
}

/// Waits until the apiserver on `port` answers `/readyz`; kills it after 90 s without.
async fn wait_until_ready(
    apiserver: &mut Child,
    d: &Path,
    port: u16,
    ca_path: &Path,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = apiserver.try_wait()? {
            bail!(
                "kube-apiserver exited ({status}) before becoming ready:\n{}",
                log_tail(&d.join("apiserver.log"))
            );
        }
        if is_ready(port, ca_path).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = apiserver.kill();
            let _ = apiserver.wait();
            bail!(
                "kube-apiserver not ready after 90 s:\n{}",
                log_tail(&d.join("apiserver.log"))
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn kubeconfig_yaml(port: u16, ca_path: &Path) -> anyhow::Result<String> {
    use base64::Engine as _;
    let ca = std::fs::read(ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(ca);
    Ok(format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority-data: {ca_b64}
users:
- name: admin
  user:
    token: {ADMIN_TOKEN}
contexts:
- name: test
  context:
    cluster: test
    user: admin
current-context: test
"
    ))
}

/// Whether the apiserver on `port` answers `/readyz` with `ok`, through a client that verifies
/// its certificate with the CA at `crt` (the self-signed one is written when the apiserver
/// starts).
async fn is_ready(port: u16, crt: &Path) -> bool {
    if !crt.is_file() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        return false;
    }
    let Ok(yaml) = kubeconfig_yaml(port, crt) else {
        return false;
    };
    let Ok(kubeconfig) = Kubeconfig::from_yaml(&yaml) else {
        return false;
    };
    let Ok(config) =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await
    else {
        return false;
    };
    let Ok(client) = Client::try_from(config) else {
        return false;
    };
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("a valid request");
    matches!(client.request_text(request).await.as_deref(), Ok("ok"))
}

/// `kubectl --kubeconfig <kubeconfig> apply <args> -f -` with `yaml` on stdin, as a user runs it.
pub fn kubectl_apply(kubeconfig: &Path, args: &[&str], yaml: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("apply")
        .args(args)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(yaml.as_bytes())
        .expect("kubectl reads its input");
    child.wait_with_output().expect("kubectl finishes")
}

/// Applies CRDs with server-side apply and waits until each is Established.
pub async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("bootplate-tests").force();
    for crd in crds {
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        wait_established(&api, name).await?;
    }
    Ok(())
}

/// Waits until CRD `name` is Established (30 s at most).
pub async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let crd = api.get(name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRD {name} not Established after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Parses a multi-document YAML file of CRDs.
pub fn crds_from_yaml(text: &str) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    use serde::Deserialize;
    let mut crds = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        crds.push(serde_yaml::from_value(value)?);
    }
    Ok(crds)
}

/// The Cluster API CRDs bootplate reads (Cluster and Machine), as the Cluster API module the
/// tools were built from ships them (`core/config/crd/bases`, see [`tools::capi_source`]): the
/// one source of Cluster API's schema for every tier, the same release as the manager the
/// real-Cluster-API tier runs.
pub fn capi_crds() -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let dir = tools::CapiRelease::Current.config_dir()?.join("crd/bases");
    let mut crds = Vec::new();
    for file in [
        "cluster.x-k8s.io_clusters.yaml",
        "cluster.x-k8s.io_machines.yaml",
    ] {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading Cluster API's CRD {}", path.display()))?;
        crds.extend(crds_from_yaml(&text)?);
    }
    Ok(crds)
}

/// Installs [`capi_crds`] and waits until they are Established.
pub async fn install_capi_crds(client: &Client) -> anyhow::Result<()> {
    install_crds(client, &capi_crds()?).await
}

/// Installs bootplate's own CRDs.
pub async fn install_bootplate_crds(client: &Client) -> anyhow::Result<()> {
    install_crds(client, &crd_types::crds::all()).await
}

/// Polls `check` every 200 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
