//! bootplate in the real-Cluster-API tier: its admission webhook (and, for in-place updates,
//! its runtime extension) registered with the management cluster on loopback ports, and the
//! `bootplate run` process serving them.
//!
//! A port is picked free and bound by bootplate a moment later; another process may take it in
//! between, and a port that bootplate held before a restart may be taken while it is down. So
//! bootplate counts as serving only once a TLS handshake on each port verifies a certificate of
//! the webhook's CA (a bare TCP connect would also pass on another process's port), and when
//! bootplate cannot bind a port the configuration is pointed at a new one and it starts again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::{ExtensionClient, install, kubectl_apply};
use crate::controller::ControllerProcess;
use crate::pki::TestCa;
use crate::{ApiServer, tls_probe};

/// How many times bootplate is started when a port it was given is taken.
const STARTS: usize = 5;
/// How long bootplate may take to serve its ports once `/healthz` answers.
const SERVE_WAIT: Duration = Duration::from_secs(30);
/// The annotation naming the Secret Cluster API reads the extension's CA from.
const INJECT_CA: &str = "runtime.cluster.x-k8s.io/inject-ca-from-secret";

/// The ports the management cluster's configurations point at and the certificate bootplate
/// serves on them.
pub struct Serving {
    webhook_port: u16,
    /// Set when bootplate also serves Cluster API's in-place update hooks.
    extension_port: Option<u16>,
    /// The client certificate Cluster API presents to the extension, and its CA.
    extension_client: Option<ExtensionClient>,
    cert_dir: PathBuf,
    ca_pem: String,
}

impl Serving {
    /// Registers bootplate's webhook (`deploy/webhook`) and, with `extension_client` (the
    /// certificate Cluster API presents), its runtime extension (`deploy/extension`) with
    /// `server`, on free loopback ports, with a new CA whose serving certificate goes to a
    /// directory of `server`'s.
    pub fn install(
        server: &ApiServer,
        extension_client: Option<ExtensionClient>,
    ) -> anyhow::Result<Serving> {
        let extension = extension_client.is_some();
        let ca = TestCa::new("bootplate-webhook-ca");
        let cert_dir = server.dir().join("bootplate-webhook-certs");
        ca.write_serving(&cert_dir)?;
        let mut serving = Serving {
            webhook_port: 0,
            extension_port: None,
            extension_client,
            cert_dir,
            ca_pem: ca.cert_pem,
        };
        serving.move_webhook(server)?;
        if extension {
            serving.move_extension(server)?;
        }
        Ok(serving)
    }

    /// The port the webhook configuration points at.
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// The `bootplate run` flags that serve these ports.
    fn args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--webhook-addr=127.0.0.1:{}", self.webhook_port),
            format!("--webhook-cert-dir={}", self.cert_dir.display()),
        ];
        args.extend((self.extension_port).map(|port| format!("--extension-addr=127.0.0.1:{port}")));
        args.extend(
            (self.extension_client.as_ref())
                .map(|client| format!("--extension-client-ca={}", client.ca_file.display())),
        );
        args
    }

    /// Points the webhook configuration at a new free port.
    fn move_webhook(&mut self, server: &ApiServer) -> anyhow::Result<()> {
        self.webhook_port = crate::free_port()?;
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/webhook/validating_webhook.yaml");
        let mut config: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
        install::for_loopback(&mut config, self.webhook_port, &self.ca_pem)?;
        kubectl_apply(server, &serde_yaml::to_string(&config)?)
    }

    /// Points the ExtensionConfig of `deploy/extension` at a new free port instead of its
    /// Service. Its CA comes the way it does in a cluster: Cluster API reads `ca.crt` from the
    /// Secret its annotation names (cert-manager's, in a cluster; here the webhook's test CA,
    /// which the extension serves with by default).
    fn move_extension(&mut self, server: &ApiServer) -> anyhow::Result<()> {
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
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {"ca.crt": self.ca_pem},
        });
        let namespace =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
        config["spec"]["clientConfig"] =
            serde_yaml::to_value(json!({"url": format!("https://127.0.0.1:{port}")}))?;
        for object in [namespace, secret] {
            kubectl_apply(server, &serde_yaml::to_string(&object)?)?;
        }
        kubectl_apply(server, &serde_yaml::to_string(&config)?)?;
        self.extension_port = Some(port);
        Ok(())
    }

    /// Whether both ports complete a TLS handshake with a certificate of the webhook's CA.
    async fn handshakes(&self) -> anyhow::Result<()> {
        tls_probe::handshake(self.webhook_port, &self.ca_pem)
            .await
            .context("bootplate's webhook")?;
        if let Some(port) = self.extension_port {
            tls_probe::handshake(port, &self.ca_pem)
                .await
                .context("bootplate's runtime extension")?;
        }
        Ok(())
    }
}

/// What became of one start of bootplate.
enum Started {
    Serving(ControllerProcess),
    /// It exited; what it logged meanwhile.
    Exited(String),
}

/// Starts `bootplate run` as `kubeconfig`'s user with `extra` flags, logging to `log` in
/// `server`'s directory, and returns it once it serves `serving`'s ports. A port bootplate
/// cannot bind is replaced by a new one, the configuration pointing at it updated.
pub async fn start(
    server: &ApiServer,
    kubeconfig: &Path,
    serving: &mut Serving,
    extra: &[String],
    log: &str,
) -> anyhow::Result<ControllerProcess> {
    let log = server.dir().join(log);
    for _ in 0..STARTS {
        let logged = match start_once(kubeconfig, serving, extra, &log).await? {
            Started::Serving(process) => return Ok(process),
            Started::Exited(logged) => logged,
        };
        if logged.contains("cannot listen on --webhook-addr") {
            serving.move_webhook(server)?;
        } else if logged.contains("cannot listen on --extension-addr") {
            serving.move_extension(server)?;
        } else if !logged.contains("cannot listen on") {
            bail!("bootplate exited before serving its webhook; it logged:\n{logged}");
        }
    }
    bail!("bootplate found no free ports in {STARTS} starts")
}

/// One start: bootplate once it serves, or what it logged before it exited.
async fn start_once(
    kubeconfig: &Path,
    serving: &Serving,
    extra: &[String],
    log: &Path,
) -> anyhow::Result<Started> {
    let logged_before = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0) as usize;
    let args: Vec<String> = serving
        .args()
        .into_iter()
        .chain(extra.iter().cloned())
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut process = match ControllerProcess::start_or_exited(kubeconfig, log, &args).await? {
        Ok(process) => process,
        Err(logged) => return Ok(Started::Exited(logged)),
    };
    let deadline = Instant::now() + SERVE_WAIT;
    loop {
        let handshakes = serving.handshakes().await;
        // Checked after the handshake: a process that has exited serves nothing, whatever
        // answered on its ports.
        if !process.is_running() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Ok(Started::Exited(
                text.get(logged_before..).unwrap_or_default().to_owned(),
            ));
        }
        match handshakes {
            Ok(()) => return Ok(Started::Serving(process)),
            Err(e) if Instant::now() > deadline => {
                bail!(
                    "{e:#} after {SERVE_WAIT:?}; bootplate's log:\n{}",
                    process.log()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
