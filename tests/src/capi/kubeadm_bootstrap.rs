//! The kubeadm bootstrap provider (CABPK), the provider bootplate is compared with: installed
//! from the manifests of its Go module (`bootstrap/kubeadm/config/default`, rewritten for
//! loopback as [`super::install`] rewrites Cluster API's) and run as a process, built from the
//! same module as Cluster API's manager, as its ServiceAccount.

use std::path::PathBuf;
use std::process::Command;

use super::cloud::CONTROL_PLANE_GROUP;
use super::{CapiEnv, Process, install, kubectl_apply, wait_crds_established, wait_manager_ready};
use crate::pki::TestCa;
use crate::tools;

/// The feature gates the provider's Deployment sets by default (`config/manager/manager.yaml`).
pub const DEFAULT_FEATURE_GATES: &str = "MachinePool=true,KubeadmBootstrapFormatIgnition=false,\
     PriorityQueue=true,ReconcilerRateLimiting=true";

/// The user the provider's requests to the management cluster are made as.
pub fn user() -> String {
    format!(
        "system:serviceaccount:{}:{}",
        install::KUBEADM_BOOTSTRAP_NAMESPACE,
        install::KUBEADM_BOOTSTRAP_SERVICE_ACCOUNT
    )
}

/// The provider installed in a management cluster: what its manager needs to run.
pub struct KubeadmBootstrap {
    kubeconfig: PathBuf,
    webhook_port: u16,
    cert_dir: PathBuf,
}

impl KubeadmBootstrap {
    /// Installs the provider's CRDs, RBAC and webhook configurations into `env`'s management
    /// cluster. Its webhooks answer only while [`KubeadmBootstrap::start`]'s process runs.
    pub async fn install(env: &CapiEnv) -> anyhow::Result<KubeadmBootstrap> {
        let webhook_port = crate::free_port()?;
        let ca = TestCa::new("kubeadm-bootstrap-webhook-ca");
        let cert_dir = env.management.dir().join("kubeadm-bootstrap-webhook-certs");
        ca.write_serving(&cert_dir)?;
        kubectl_apply(
            &env.management,
            &install::kubeadm_bootstrap_manifests(webhook_port, &ca.cert_pem)?,
        )?;
        wait_crds_established(&env.client).await?;
        kubectl_apply(&env.management, &control_plane_reader()?)?;
        let kubeconfig = crate::rbac::impersonating_kubeconfig(
            &env.management,
            install::KUBEADM_BOOTSTRAP_NAMESPACE,
            install::KUBEADM_BOOTSTRAP_SERVICE_ACCOUNT,
            "kubeadm-bootstrap-kubeconfig",
        )?;
        Ok(KubeadmBootstrap {
            kubeconfig,
            webhook_port,
            cert_dir,
        })
    }

    /// Starts the provider's manager with the Deployment's defaults (leader election off: one
    /// process) and `extra` flags, logging to `log` in the management cluster's directory.
    /// Returns once it is ready and its webhooks listen.
    pub async fn start(
        &self,
        env: &CapiEnv,
        extra: &[String],
        log: &str,
    ) -> anyhow::Result<Process> {
        let (health, diagnostics) = (crate::free_port()?, crate::free_port()?);
        let process = Process::spawn(
            "kubeadm-bootstrap-manager",
            Command::new(tools::path("cabpk-manager")?)
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .arg(format!("--webhook-port={}", self.webhook_port))
                .arg(format!("--webhook-cert-dir={}", self.cert_dir.display()))
                .arg(format!("--health-addr=127.0.0.1:{health}"))
                .arg(format!("--diagnostics-address=127.0.0.1:{diagnostics}"))
                .arg("--insecure-diagnostics=true")
                .arg("--leader-elect=false")
                .arg(format!("--feature-gates={DEFAULT_FEATURE_GATES}"))
                .arg("--bootstrap-token-ttl=15m")
                .args(extra)
                .env("POD_NAMESPACE", install::KUBEADM_BOOTSTRAP_NAMESPACE)
                .env("POD_NAME", "kubeadm-bootstrap-manager"),
            &env.management.dir().join(log),
        )?;
        wait_manager_ready(
            process,
            health,
            (self.webhook_port, &self.cert_dir),
            "the kubeadm bootstrap provider",
        )
        .await
    }
}

/// The provider reads a worker's control-plane object for its version; its role names only
/// KubeadmControlPlane, whose part the control-plane stand-in plays here, so the stand-in's
/// kinds are granted the same way (read only).
fn control_plane_reader() -> anyhow::Result<String> {
    let name = "kubeadm-bootstrap-reads-test-control-planes";
    let objects = serde_json::json!([
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{
                "apiGroups": [CONTROL_PLANE_GROUP],
                "resources": ["*"],
                "verbs": ["get", "list", "watch"],
            }],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{
                "kind": "ServiceAccount",
                "name": install::KUBEADM_BOOTSTRAP_SERVICE_ACCOUNT,
                "namespace": install::KUBEADM_BOOTSTRAP_NAMESPACE,
            }],
        },
    ]);
    let mut yaml = String::new();
    for object in objects.as_array().into_iter().flatten() {
        yaml.push_str("---\n");
        yaml.push_str(&serde_yaml::to_string(object)?);
    }
    Ok(yaml)
}
