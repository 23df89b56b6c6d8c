//! Real joins: a workload control plane that real kubeadm and kubelet join with the token and CA
//! hash bootplate rendered, and the boot proof's real mode that runs them (`tests/boot/run.sh
//! --real-kube`).
//!
//! The control plane is what `kubeadm init` leaves behind, minus the static pods: an apiserver
//! ([`crate::ApiServer::start_for_joins`]) serving with the cluster CA, taking client
//! certificates it signed and bootstrap tokens, authorizing with Node and RBAC; a
//! kube-controller-manager that signs kubelet CSRs with the CA key and runs the bootstrap signer
//! (which signs `cluster-info` for each token) and the CSR approver; and the `kubeadm-config`,
//! `kubelet-config`, `cluster-info` ConfigMaps and bootstrap RBAC, made by the real `kubeadm init
//! phase upload-config all` and `kubeadm init phase bootstrap-token`.
//!
//! Unlike a kubeadm control plane it runs no token cleaner (which deletes expired tokens): a
//! token that goes is one bootplate deleted, which the scenarios that count deletions rely on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::Value;

use crate::capi::Process;
use crate::pki::TestCa;
use crate::{ApiServer, tools};

/// The kube-apiserver flags of a cluster machines join (on top of [`ApiServer`]'s own).
pub const APISERVER_FLAGS: [&str; 2] = [
    "--enable-bootstrap-token-auth",
    "--authorization-mode=Node,RBAC",
];

/// The group kubeadm's bootstrap RBAC lets post and auto-approve node CSRs; bootplate's tokens
/// carry it in `auth-extra-groups`.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers:kubeadm:default-node-token";

/// The version of the built kubeadm and kubelet (`kubeadm version -o short`), e.g. `v1.37.2`.
pub fn kube_version() -> anyhow::Result<String> {
    static VERSION: OnceLock<Result<String, String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let kubeadm = tools::path("kubeadm").map_err(|e| format!("{e:#}"))?;
            let out = Command::new(kubeadm)
                .args(["version", "-o", "short"])
                .output()
                .map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .clone()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The workload cluster's garbage collector (kube-controller-manager with that one controller)
/// for `apiserver`, stopped on drop: bootplate deletes a joined machine's token, the collector
/// what the token owns.
pub fn garbage_collector(apiserver: &ApiServer) -> anyhow::Result<Process> {
    let kubeconfig = apiserver.kubeconfig_path()?;
    Process::spawn(
        "kube-controller-manager",
        Command::new(tools::path("kube-controller-manager")?)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--controllers=garbagecollector")
            .arg("--leader-elect=false")
            .arg("--use-service-account-credentials=false")
            .arg("--bind-address=127.0.0.1")
            .arg("--secure-port=0"),
        &apiserver.dir().join("garbage-collector.log"),
    )
}

/// The control-plane side of real joins for one apiserver, stopped on drop.
pub struct JoinServices {
    _controller_manager: Process,
    admin_kubeconfig: PathBuf,
}

impl JoinServices {
    /// Starts kube-controller-manager for `apiserver` (started with
    /// [`ApiServer::start_for_joins`] and the cluster CA `ca`) and lets the real kubeadm upload
    /// the cluster's configuration and bootstrap RBAC. kubeadm's own default token is deleted:
    /// the only tokens are the ones a test or bootplate makes.
    pub async fn start(apiserver: &ApiServer, ca: &TestCa) -> anyhow::Result<JoinServices> {
        let dir = apiserver.dir().join("joins");
        std::fs::create_dir_all(&dir)?;
        let (ca_crt, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
        std::fs::write(&ca_crt, &ca.cert_pem)?;
        std::fs::write(&ca_key, &ca.key_pem)?;
        let admin_kubeconfig = apiserver.kubeconfig_path()?;
        let controller_manager = Process::spawn(
            "kube-controller-manager",
            Command::new(tools::path("kube-controller-manager")?)
                .arg(format!("--kubeconfig={}", admin_kubeconfig.display()))
                // The garbage collector too: what bootplate makes for a machine is owned by its
                // token and goes with it, never deleted by request.
                .arg("--controllers=csrapproving,csrsigning,bootstrapsigner,garbagecollector")
                .arg(format!("--cluster-signing-cert-file={}", ca_crt.display()))
                .arg(format!("--cluster-signing-key-file={}", ca_key.display()))
                .arg("--leader-elect=false")
                .arg("--use-service-account-credentials=false")
                .arg("--bind-address=127.0.0.1")
                .arg("--secure-port=0"),
            &dir.join("kube-controller-manager.log"),
        )?;
        let services = JoinServices {
            _controller_manager: controller_manager,
            admin_kubeconfig,
        };
        let config = dir.join("kubeadm-init.yaml");
        std::fs::write(&config, init_configuration(apiserver.port())?)?;
        let config = config.to_string_lossy().to_string();
        services.kubeadm_ok(&["init", "phase", "upload-config", "all", "--config", &config])?;
        services.kubeadm_ok(&[
            "init",
            "phase",
            "bootstrap-token",
            "--config",
            &config,
            "--skip-token-print",
        ])?;
        let secrets: Api<Secret> = Api::namespaced(apiserver.client().await?, "kube-system");
        secrets
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().fields("type=bootstrap.kubernetes.io/token"),
            )
            .await
            .context("deleting kubeadm's default token")?;
        Ok(services)
    }

    /// Runs the real kubeadm against the cluster (`--kubeconfig` the admin's).
    pub fn kubeadm(&self, args: &[&str]) -> anyhow::Result<Output> {
        Ok(Command::new(tools::path("kubeadm")?)
            .args(args)
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .output()?)
    }

    fn kubeadm_ok(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = self.kubeadm(args)?;
        if !out.status.success() {
            bail!(
                "kubeadm {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

/// What `kubeadm init` would have been given on the first control-plane machine: the cluster
/// at the built version behind `127.0.0.1:port`, its services where the apiserver has them.
fn init_configuration(port: u16) -> anyhow::Result<String> {
    Ok(format!(
        "apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
nodeRegistration:
  criSocket: unix:///var/run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: workload
kubernetesVersion: {version}
controlPlaneEndpoint: 127.0.0.1:{port}
networking:
  serviceSubnet: 10.0.0.0/24
  podSubnet: 192.168.0.0/16
",
        version = kube_version()?
    ))
}

/// A bootstrap-token Secret as a token issuer writes it: `ttl` from now (negative: expired),
/// usable for authentication and signing, in kubeadm's node group. For the failure drills and
/// the control-plane roles; bootplate's own tokens come from the controller.
pub fn token_secret(id: &str, secret: &str, ttl: Duration, expired: bool) -> Secret {
    let now = k8s_openapi::jiff::Timestamp::now();
    let span = k8s_openapi::jiff::SignedDuration::try_from(ttl).expect("a short duration");
    let expiration = if expired { now - span } else { now + span };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": secret,
            "expiration": expiration.to_string(),
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": BOOTSTRAPPERS,
        },
    }))
    .expect("a valid Secret")
}

/// What a real boot (`tests/boot/run.sh --real-kube`) of one user-data did.
pub struct Boot {
    /// run.sh's exit status: 0 proven, 1 the proof failed, 2 it could not run.
    pub status: Option<i32>,
    /// Each failure as `boot-proof: LABEL: FAILED: STEP: MESSAGE`.
    pub stderr: String,
    /// The report (tests/boot/lib/check.py).
    pub report: Value,
    /// The run's directory (logs, `run/bootplate/kubeadm.log`, the kubelet's log).
    pub dir: PathBuf,
}

impl Boot {
    /// The real kubeadm's output.
    pub fn kubeadm_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("run/bootplate/kubeadm.log")).unwrap_or_default()
    }

    /// The Node the kubelet registered, from its log.
    pub fn registered_node(&self) -> Option<&str> {
        self.report["kubelet"]["registered"].as_str()
    }

    /// The status of the real `kubeadm join` or `kubeadm init`.
    pub fn kubeadm_status(&self, subcommand: &str) -> Option<i64> {
        self.report["kubeadm"]
            .as_array()?
            .iter()
            .find(|r| r["subcommand"] == subcommand && r["real"] == true)
            .and_then(|r| r["status"].as_i64())
    }

    /// Everything a person reads when a boot did not go as expected.
    pub fn explain(&self) -> String {
        format!(
            "run.sh exit {:?}, run in {}\n{}\n--- kubeadm ---\n{}",
            self.status,
            self.dir.display(),
            self.stderr,
            self.kubeadm_log()
        )
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// Where real boots keep their runs: under the target directory, for the post-mortem.
pub fn runs_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("real-joins")
}

/// A directory holding `kubeadm` and `kubelet` (links to the built ones), for `--real-kube`.
pub fn real_kube_dir() -> anyhow::Result<PathBuf> {
    let dir = runs_dir().join("bin");
    std::fs::create_dir_all(&dir)?;
    for name in ["kubeadm", "kubelet"] {
        // Made beside and renamed over: tiers running side by side share the directory, and
        // none may see the link missing.
        let link = dir.join(name);
        let fresh = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&fresh);
        std::os::unix::fs::symlink(tools::path(name)?, &fresh)
            .with_context(|| format!("linking {}", fresh.display()))?;
        std::fs::rename(&fresh, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(dir)
}

/// Runs `user_data` through the boot proof with the real kubeadm and kubelet (`case` names the
/// run's directory under [`runs_dir`]). Runs one at a time per machine (run.sh takes a lock).
pub fn boot(
    user_data: &[u8],
    case: &str,
    role: &str,
    version: &str,
    os: &str,
) -> anyhow::Result<Boot> {
    static KUBE_DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let kube = KUBE_DIR
        .get_or_init(|| real_kube_dir().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let run = BootRun {
        dir: runs_dir(),
        case,
        role,
        version,
        os,
    };
    run.boot(user_data, Some(&kube))
}

/// One boot of the boot proof: the run goes to `dir/case`, its input to `dir/case.user-data`.
pub struct BootRun<'a> {
    pub dir: PathBuf,
    pub case: &'a str,
    pub role: &'a str,
    pub version: &'a str,
    pub os: &'a str,
}

impl BootRun<'_> {
    /// Runs `user_data` through `tests/boot/run.sh`: with the stubs for kubeadm and the
    /// kubelet, or with the real ones in `real` (`--real-kube`).
    pub fn boot(&self, user_data: &[u8], real: Option<&Path>) -> anyhow::Result<Boot> {
        let case = self.case;
        let dir = self.dir.join(case);
        let input = self.dir.join(format!("{case}.user-data"));
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(&input, user_data)?;
        let mut command = Command::new(workspace().join("tests/boot/run.sh"));
        command
            .arg("--user-data")
            .arg(&input)
            .arg("--out")
            .arg(&dir)
            .args(["--label", case, "--role", self.role])
            .args(["--kubernetes-version", self.version, "--os", self.os])
            .env("BOOTPLATE_BOOT_TIMEOUT", "300");
        if let Some(real) = real {
            command.arg("--real-kube").arg(real);
        }
        if ignition_spec(user_data).is_some_and(|v| v.starts_with("2.")) {
            // Ignition 2.x refuses spec 2 configs: run.sh runs Ignition v0.35.0 on them.
            command.env("BOOTPLATE_IGNITION_SPEC2", tools::path("ignition-spec2")?);
        }
        let out = command.output().context("running tests/boot/run.sh")?;
        booted(out, case, dir)
    }
}

/// The spec version of an Ignition config (`ignition.version`); None for any other user-data.
fn ignition_spec(user_data: &[u8]) -> Option<String> {
    let config: Value = serde_json::from_slice(user_data).ok()?;
    Some(config["ignition"]["version"].as_str()?.to_owned())
}

fn booted(out: Output, case: &str, dir: PathBuf) -> anyhow::Result<Boot> {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if out.status.code() == Some(2) {
        bail!(
            "the boot proof could not run (it needs root and tests/scripts/install-tools.sh's tools):\n{stderr}"
        );
    }
    let report = std::fs::read_to_string(dir.join("report.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .with_context(|| format!("{case}: no report.json in {}:\n{stderr}", dir.display()))?;
    Ok(Boot {
        status: out.status.code(),
        stderr,
        report,
        dir,
    })
}

/// The variables the shipped kubeadm templates need on the boot proof's machines, all of them
/// documented template variables: the host has cgroup v1 and no systemd managing cgroups
/// (`cgroupDriver: cgroupfs`, `allowCgroupV1`, and kubeadm's SystemVerification check, which
/// refuses cgroup v1 unless ignored); the run shares the host's network namespace, whose IPv4
/// forwarding the stubbed `sysctl` leaves as it is (kubeadm's ip_forward check); and its host
/// name is the sandbox's, not a cloud's, so the node is named after the Machine on every image
/// (Amazon Linux's template names it after the host by default, as EC2 wants).
pub fn sandbox_variables() -> Value {
    serde_json::json!({
        "nodeNameFromHostname": false,
        "cgroupDriver": "cgroupfs",
        "allowCgroupV1": true,
        "kubeadmIgnorePreflightErrors": [
            "SystemVerification",
            "FileContent--proc-sys-net-ipv4-ip_forward",
        ],
    })
}

/// The Kubernetes minor before `version`'s, as `v1.MINOR.0` (`v1.37.2` gives `v1.36.0`): the
/// oldest the built kubeadm joins with (one minor of skew), with the same configuration API.
pub fn previous_minor(version: &str) -> String {
    let minor: u32 = version
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("a version like v1.37.2");
    format!("v1.{}.0", minor - 1)
}

/// A shipped kubeadm template: its file, name and `spec.os.name`.
pub struct ShippedTemplate {
    pub file: PathBuf,
    pub name: String,
    pub os: String,
}

/// Every shipped template of the catalogue that runs kubeadm (`templates/kubeadm-*.yaml`), by
/// name. Not `kubeadm-compat`: its variables are a KubeadmConfigSpec's (what `bootplate import`
/// writes), not the catalogue's, and tests/tests/kubeadm_compat.rs proves it against the kubeadm
/// bootstrap provider instead.
pub fn kubeadm_templates() -> Vec<ShippedTemplate> {
    let mut out: Vec<ShippedTemplate> = std::fs::read_dir(workspace().join("templates"))
        .expect("templates/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("kubeadm-"))
                && p.file_stem()
                    .is_some_and(|n| !n.to_string_lossy().starts_with("kubeadm-compat"))
        })
        .map(|file| {
            let object: Value =
                serde_yaml::from_str(&std::fs::read_to_string(&file).expect("a template"))
                    .expect("template YAML");
            ShippedTemplate {
                name: object["metadata"]["name"]
                    .as_str()
                    .expect("a name")
                    .to_owned(),
                os: object["spec"]["os"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                file,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
