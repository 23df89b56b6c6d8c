//! The `bootplate` binary as a child process, the way it runs in a cluster.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// Path of the `bootplate` binary built alongside the tests (`target/<profile>/bootplate`), or
/// `BOOTPLATE_BIN`.
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("BOOTPLATE_BIN") {
        return Ok(PathBuf::from(path));
    }
    workspace_binary("bootplate")
}

/// Path of the workspace binary `name` built alongside the tests (`target/<profile>/<name>`).
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    // Test executables live in target/<profile>/deps, the binary one level up; other binaries
    // (the scale benchmark) live beside it.
    let exe = std::env::current_exe()?;
    let exe_dir = exe.parent().context("executable has no directory")?;
    let profile_dir = if exe_dir.ends_with("deps") {
        exe_dir
            .parent()
            .context("test executable has no target directory")?
    } else {
        exe_dir
    };
    let path = profile_dir.join(name);
    if !path.is_file() {
        bail!(
            "{} not found; build it first (`cargo build --workspace`; `cargo test --workspace` does)",
            path.display()
        );
    }
    Ok(path)
}

/// The objects `bootplate render` reads for one Machine of Cluster `workload`: what the tests that
/// render without an apiserver vary, the rest as every one of them writes it.
pub struct RenderObjects<'a> {
    pub namespace: &'a str,
    /// The Cluster's `controlPlaneEndpoint` (host, port).
    pub endpoint: (&'a str, u16),
    pub service_cidr: &'a str,
    pub machine: &'a str,
    /// The Machine's `spec.version`.
    pub version: &'a str,
    /// Whether the Machine carries Cluster API's control-plane label.
    pub control_plane: bool,
    /// The BootplateConfig's `spec`.
    pub config_spec: serde_json::Value,
}

/// The files [`RenderObjects::write`] wrote, as [`render`] takes them.
pub struct RenderFiles {
    pub cluster: PathBuf,
    pub machine: PathBuf,
    pub config: PathBuf,
}

impl RenderFiles {
    /// [`render`] of `template` for these files, with `args` (role, token, certificates).
    pub fn render(&self, template: &Path, args: &[&std::ffi::OsStr]) -> Vec<u8> {
        render(template, &self.machine, &self.cluster, &self.config, args)
    }
}

impl RenderObjects<'_> {
    /// Writes the Cluster, the Machine and its BootplateConfig as YAML files into `dir`.
    pub fn write(&self, dir: &Path) -> RenderFiles {
        let write = |name: &str, value: serde_json::Value| {
            let path = dir.join(name);
            std::fs::write(&path, serde_yaml::to_string(&value).unwrap()).unwrap();
            path
        };
        let (host, port) = self.endpoint;
        let cluster = write(
            "cluster.yaml",
            serde_json::json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "workload", "namespace": self.namespace},
                "spec": {
                    "controlPlaneEndpoint": {"host": host, "port": port},
                    "clusterNetwork": {"services": {"cidrBlocks": [self.service_cidr]},
                                       "pods": {"cidrBlocks": ["192.168.0.0/16"]}},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                          "kind": "DockerCluster", "name": "workload"},
                },
            }),
        );
        let mut labels = serde_json::json!({"cluster.x-k8s.io/cluster-name": "workload"});
        if self.control_plane {
            labels["cluster.x-k8s.io/control-plane"] = serde_json::json!("");
        }
        let machine = self.machine;
        let machine_file = write(
            &format!("{machine}.yaml"),
            serde_json::json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": machine, "namespace": self.namespace, "labels": labels},
                "spec": {
                    "clusterName": "workload", "version": self.version,
                    "bootstrap": {"configRef": {"apiGroup": "bootstrap.bootplate.dev",
                                                "kind": "BootplateConfig", "name": machine}},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                          "kind": "DockerMachine", "name": machine},
                },
            }),
        );
        let config = write(
            "config.yaml",
            serde_json::json!({
                "apiVersion": "bootstrap.bootplate.dev/v1alpha1", "kind": "BootplateConfig",
                "metadata": {"name": machine, "namespace": self.namespace},
                "spec": self.config_spec,
            }),
        );
        RenderFiles {
            cluster,
            machine: machine_file,
            config,
        }
    }
}

/// `bootplate render --template TEMPLATE --machine M --cluster C --config F ARGS...` (role,
/// token, CA and the like in `args`): the user-data. Panics with bootplate's message when the
/// render fails.
pub fn render(
    template: &Path,
    machine: &Path,
    cluster: &Path,
    config: &Path,
    args: &[&std::ffi::OsStr],
) -> Vec<u8> {
    let out = Command::new(binary().unwrap())
        .arg("render")
        .arg("--template")
        .arg(template)
        .arg("--machine")
        .arg(machine)
        .arg("--cluster")
        .arg(cluster)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bootplate render: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A running `bootplate run`, killed on drop. Its log goes to a file.
pub struct ControllerProcess {
    child: Option<Child>,
    log: PathBuf,
    metrics_port: u16,
    health_port: u16,
    pid_at_start: u32,
}

/// A plain HTTP/1.0 GET on loopback: status code and body, or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Whether `GET path` on loopback `port` answers at all. The blocking probe runs on the
/// blocking pool, so a test on a single-threaded runtime keeps driving its other futures.
pub async fn answers(port: u16, path: &'static str) -> bool {
    tokio::task::spawn_blocking(move || http_get(port, path).is_some())
        .await
        .unwrap_or(false)
}

impl ControllerProcess {
    /// Starts `bootplate run --kubeconfig <kubeconfig> <extra>` with its metrics and health
    /// endpoints on free loopback ports, logging to `log`, and waits until `/healthz` answers.
    /// Its ports are claimed for this test process ([`crate::ports`]), so no other test hands
    /// them out; a process outside the suite could still bind one first, so a process that
    /// cannot listen is started again on other ports.
    pub async fn start(kubeconfig: &Path, log: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        match Self::start_or_exited(kubeconfig, log, extra).await? {
            Ok(process) => Ok(process),
            Err(_) => bail!(
                "bootplate run did not come up; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            ),
        }
    }

    /// [`ControllerProcess::start`], but a process that exits before `/healthz` answers for
    /// another reason than its metrics or health port (one of `extra`'s ports taken, a bad
    /// flag) is not an error: `Err` holds what it logged, for the caller to act on.
    pub async fn start_or_exited(
        kubeconfig: &Path,
        log: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Result<Self, String>> {
        for _ in 0..5 {
            let logged_before = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
            if let Some(process) = Self::start_once(kubeconfig, log, extra).await? {
                return Ok(Ok(process));
            }
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let logged = text.get(logged_before as usize..).unwrap_or_default();
            let own_port_taken = ["--metrics-addr", "--health-addr"]
                .iter()
                .any(|flag| logged.contains(&format!("cannot listen on {flag}")));
            if !own_port_taken {
                return Ok(Err(logged.to_owned()));
            }
        }
        bail!("bootplate run found no free port in five tries")
    }

    /// One start; `None` when the process exited before `/healthz` answered.
    async fn start_once(
        kubeconfig: &Path,
        log: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Option<Self>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let (metrics_port, health_port) = (crate::free_port()?, crate::free_port()?);
        let child = Command::new(binary()?)
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
            .arg(format!("--health-addr=127.0.0.1:{health_port}"))
            .args(extra)
            .env(
                "RUST_LOG",
                "info,bootplate=debug,kube_client=debug,kube_runtime=debug",
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting bootplate run")?;
        let pid_at_start = child.id();
        let mut process = ControllerProcess {
            child: Some(child),
            log: log.to_owned(),
            metrics_port,
            health_port,
            pid_at_start,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !answers(health_port, "/healthz").await {
            if !process.is_running() {
                process.child = None;
                return Ok(None);
            }
            if std::time::Instant::now() > deadline {
                bail!("bootplate run did not come up; its log:\n{}", process.log());
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(Some(process))
    }

    /// The port serving `/healthz` and `/readyz`.
    pub fn health_port(&self) -> u16 {
        self.health_port
    }

    /// `GET` on the metrics port.
    pub fn metrics(&self) -> Option<String> {
        http_get(self.metrics_port, "/metrics").map(|(_, body)| body)
    }

    /// The value of the metric series `series` (a name, with its labels if it has any), when
    /// the metrics can be read and hold it.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics()?.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    /// How many config reconciles the process has finished, from its metrics (0 when they
    /// cannot be read).
    pub fn config_reconciles(&self) -> u64 {
        self.metrics()
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.starts_with("bootplate_reconciles_total{") && l.contains("controller=\"config\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Whether the process logged a reconcile of config `namespace/name` that saw the config at
    /// resourceVersion `version` or later (etcd's resourceVersions are increasing integers).
    pub fn reconciled(&self, namespace: &str, name: &str, version: u64) -> bool {
        let config = format!("config={namespace}/{name} ");
        self.log().lines().any(|line| {
            line.contains("config reconciled")
                && line.contains(&config)
                && line
                    .split_once("resource_version=")
                    .and_then(|(_, rest)| rest.split_whitespace().next()?.parse::<u64>().ok())
                    .is_some_and(|seen| seen >= version)
        })
    }

    /// Whether the process logged a line with `message` about config `namespace/name`.
    pub fn logged_about(&self, message: &str, namespace: &str, name: &str) -> bool {
        let config = format!("config={namespace}/{name}");
        self.log()
            .lines()
            .any(|line| line.contains(message) && line.split_whitespace().any(|w| w == config))
    }

    /// The status code of `/readyz`.
    pub fn readyz(&self) -> Option<u16> {
        http_get(self.health_port, "/readyz").map(|(status, _)| status)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// SIGKILL: the process gets no chance to clean up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the process to exit; returns its exit status.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("not running")?;
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()?;
        if !status.success() {
            bail!("kill -TERM failed");
        }
        Ok(child.wait()?)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
        // A failing test shows what the controller said; its data directory is gone after.
        if std::thread::panicking() {
            let log = self.log();
            // Keep the whole log past the data directory's removal.
            let kept = std::env::temp_dir().join("bootplate-failed-logs");
            if std::fs::create_dir_all(&kept).is_ok() {
                let name = format!(
                    "{}-{}",
                    self.pid_at_start,
                    self.log
                        .file_name()
                        .and_then(|n| n.to_str())
                        .unwrap_or("log")
                );
                let _ = std::fs::write(kept.join(&name), &log);
                eprintln!("full controller log kept at {}", kept.join(name).display());
            }
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- last lines of the controller log {} ---\n{}",
                self.log.display(),
                lines[lines.len().saturating_sub(80)..].join("\n")
            );
        }
    }
}
