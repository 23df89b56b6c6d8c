//! Anything in the cluster can reach bootplate's ports. Two boundaries, against the real
//! `bootplate run` and a real kube-apiserver (audited, to see which Secrets bootplate reads):
//!
//! - The Runtime SDK extension answers Cluster API only: a caller without a client certificate
//!   from `--extension-client-ca` (none at all, or one from another CA) gets no answer and makes
//!   bootplate read nothing, while Cluster API's certificate gets the hook answered (and the
//!   Secret read, which shows the audit check can see such a read).
//! - Slow clients: connections that never finish the TLS handshake or never send their
//!   headers are closed after the timeout on every port, a real client is answered meanwhile,
//!   and above the connection cap a new connection is closed at once while the process stays
//!   healthy and serves again once the slow ones are gone.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use testenv::controller::{ControllerProcess, answers};
use testenv::pki::{Leaf, TestCa};
use testenv::{ApiServer, fixtures};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TENANT: &str = "tenant-b";
const SECRET: &str = "db-password";
/// The server's handshake and header-read timeout (`server::Limits::default`), and a margin.
const SLOW_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(5);
/// Connections one listener holds (`server::Limits::default`).
const CONNECTION_CAP: usize = 256;

/// The bootplate under test: its extension and webhook ports, the CAs behind them.
struct Served {
    process: ControllerProcess,
    extension: u16,
    webhook: u16,
    serving_ca: TestCa,
    capi_client: Leaf,
}

/// Starts `bootplate run` with the webhook and the extension, the extension trusting a fresh
/// client CA that signed the returned `capi_client` certificate.
async fn start(server: &ApiServer) -> Served {
    let serving_ca = TestCa::new("bootplate-serving-ca");
    let cert_dir = server.dir().join("serving");
    serving_ca.write_serving(&cert_dir).unwrap();
    let client_ca = TestCa::new("capi-client-ca");
    let capi_client = client_ca.client("capi-manager", "cluster-api");
    let client_ca_file = server.dir().join("extension-client-ca.crt");
    std::fs::write(&client_ca_file, &client_ca.cert_pem).unwrap();
    let (extension, webhook) = (testenv::free_port().unwrap(), testenv::free_port().unwrap());
    let args = [
        format!("--extension-addr=127.0.0.1:{extension}"),
        format!("--extension-client-ca={}", client_ca_file.display()),
        format!("--webhook-addr=127.0.0.1:{webhook}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = server.kubeconfig_path().unwrap();
    let process = ControllerProcess::start(&kubeconfig, &server.dir().join("bootplate.log"), &args)
        .await
        .unwrap();
    for port in [extension, webhook] {
        testenv::eventually(
            "the HTTPS ports to listen",
            Duration::from_secs(30),
            || async {
                TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await;
    }
    Served {
        process,
        extension,
        webhook,
        serving_ca,
        capi_client,
    }
}

fn tls_config(ca_pem: &str, client: Option<&Leaf>) -> rustls::ClientConfig {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match client {
        None => builder.with_no_client_auth(),
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
    }
}

/// POSTs `body` to `path` over TLS and returns the whole response, or why there is none (the
/// handshake failed, or the server closed the connection without answering).
async fn post(
    port: u16,
    config: rustls::ClientConfig,
    path: &str,
    body: &Value,
) -> Result<String, String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = (connector.connect(name, stream).await).map_err(|e| format!("handshake: {e}"))?;
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // TLS 1.3: the server checks the client's certificate after the client thinks the
    // handshake is done, so a refusal shows on the write or the read.
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut response)).await;
    match read {
        Err(_) => Err("no answer within 20 s".into()),
        Ok(Err(e)) if response.is_empty() => Err(format!("read: {e}")),
        _ if response.is_empty() => Err("closed without an answer".into()),
        _ => Ok(String::from_utf8_lossy(&response).into_owned()),
    }
}

/// A tenant's namespace with a Cluster, a template with an in-place part, and a Secret that a
/// config's file takes its content from.
async fn tenant_objects(client: &kube::Client) {
    testenv::install_bootplate_crds(client).await.unwrap();
    testenv::install_capi_crds(client).await.unwrap();
    fixtures::namespace(client, TENANT).await.unwrap();
    let pp = PostParams::default();
    Api::namespaced(client.clone(), TENANT)
        .create(&pp, &fixtures::cluster(TENANT, "prod"))
        .await
        .unwrap();
    let template: crd_types::BootstrapTemplate = serde_json::from_value(json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "BootstrapTemplate",
        "metadata": {"name": "inplace", "namespace": TENANT},
        "spec": {
            "os": {"name": "linux"},
            "format": "cloud-config",
            "parts": [{"name": "configure", "update": "InPlace", "commands": ["echo configure"]}],
        },
    }))
    .unwrap();
    Api::namespaced(client.clone(), TENANT)
        .create(&pp, &template)
        .await
        .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": SECRET, "namespace": TENANT},
        "stringData": {"password": "hunter2", "old": "hunter1"},
    }))
    .unwrap();
    Api::namespaced(client.clone(), TENANT)
        .create(&pp, &secret)
        .await
        .unwrap();
}

/// A `CanUpdateMachine` request for a config of the tenant whose file moves from the Secret's
/// key `old` to `password`: answering it means reading the Secret, and the answer (Unchanged
/// or Rollout) would tell whether the two keys hold the same content.
fn can_update_machine_request() -> Value {
    let machine = fixtures::machine(TENANT, "prod-md-0-abc", "prod", false, "prod-md-0-abc");
    let config = |key: &str| {
        json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
            "kind": "BootplateConfig",
            "metadata": {"name": "prod-md-0-abc", "namespace": TENANT},
            "spec": {
                "templateRef": {"kind": "BootstrapTemplate", "name": "inplace"},
                "files": [{"path": "/etc/db/password", "contentFrom": {"secret": {"name": SECRET, "key": key}}}],
            },
        })
    };
    let machine = serde_json::to_value(&machine).unwrap();
    json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "CanUpdateMachineRequest",
        "current": {"machine": machine, "bootstrapConfig": config("old")},
        "desired": {"machine": machine, "bootstrapConfig": config("password")},
    })
}

/// How many times the audit log shows the tenant's Secret read.
fn secret_reads(audit_log: &Path) -> usize {
    let text = std::fs::read_to_string(audit_log).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| {
            let object = &event["objectRef"];
            object["resource"] == "secrets"
                && object["namespace"] == TENANT
                && object["name"] == SECRET
                && event["verb"] != "create"
        })
        .count()
}

const HOOK: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine";

#[tokio::test]
async fn the_extension_answers_cluster_api_only_and_reads_no_secret_for_anyone_else() {
    let server = ApiServer::start_audited().await.unwrap();
    let client = server.client().await.unwrap();
    tenant_objects(&client).await;
    let served = start(&server).await;
    let request = can_update_machine_request();
    let audit = server.audit_log();

    // Anyone in the cluster: no client certificate, or one from a CA of its own making.
    let own_ca = TestCa::new("capi-client-ca");
    let forged = own_ca.client("capi-manager", "cluster-api");
    for (who, config) in [
        (
            "no certificate",
            tls_config(&served.serving_ca.cert_pem, None),
        ),
        (
            "a certificate from another CA",
            tls_config(&served.serving_ca.cert_pem, Some(&forged)),
        ),
    ] {
        let answered = post(served.extension, config, HOOK, &request).await;
        assert!(
            answered.is_err(),
            "a caller with {who} got an answer: {answered:?}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        secret_reads(&audit),
        0,
        "bootplate read the tenant's Secret for an unauthenticated caller"
    );
    assert_eq!(hooks_served(&served.process), 0.0, "no hook ran");

    // Cluster API, with its client certificate: answered, and the Secret is read for it.
    let capi = tls_config(&served.serving_ca.cert_pem, Some(&served.capi_client));
    let answer = post(served.extension, capi, HOOK, &request).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("CanUpdateMachineResponse"), "{answer}");
    assert_eq!(hooks_served(&served.process), 1.0);
    testenv::eventually(
        "the audit log to show the Secret read for Cluster API",
        Duration::from_secs(10),
        || async { (secret_reads(&audit) > 0).then_some(()) },
    )
    .await;
}

/// The hook calls the extension answered, over every hook and answer.
fn hooks_served(process: &ControllerProcess) -> f64 {
    let metrics = process.metrics().expect("the metrics endpoint answers");
    (metrics.lines())
        .filter(|l| l.starts_with("bootplate_extension_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Whether the server closes `stream` within `within`: a read returns end of file or an error.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        // Bytes (an alert or a 408) are fine as long as the close follows.
        Ok(Ok(_)) => {
            (tokio::time::timeout(within, stream.read_to_end(&mut Vec::new())).await).is_ok()
        }
        Err(_) => false,
    }
}

/// `count` connections to `port` that send nothing at all.
async fn silent_connections(port: u16, count: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(count);
    for _ in 0..count {
        streams.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    streams
}

/// A real client's request on the webhook port: a path it does not serve is answered 404.
async fn webhook_answers(served: &Served) -> bool {
    let config = tls_config(&served.serving_ca.cert_pem, None);
    let answered = post(served.webhook, config, "/nowhere", &json!({})).await;
    answered.is_ok_and(|a| a.starts_with("HTTP/1.1 404"))
}

#[tokio::test]
async fn slow_clients_are_closed_after_the_timeout_and_the_cap_holds() {
    let server = ApiServer::start().await.unwrap();
    let served = start(&server).await;
    let health = served.process.health_port();

    // A TLS handshake never started (webhook, extension), headers never sent (health): all
    // closed once the timeout passes, while a real client is answered.
    let started = Instant::now();
    let mut slow = Vec::new();
    for port in [served.webhook, served.extension, health] {
        slow.extend(silent_connections(port, 20).await);
    }
    assert!(
        webhook_answers(&served).await,
        "a real client is answered meanwhile"
    );
    for stream in &mut slow {
        let left = (SLOW_CLIENT_TIMEOUT + MARGIN).saturating_sub(started.elapsed());
        assert!(
            closed_within(stream, left).await,
            "a silent connection stayed open past {:?}",
            SLOW_CLIENT_TIMEOUT + MARGIN
        );
    }
    drop(slow);

    // The cap: the webhook port holds CONNECTION_CAP silent connections; one more is closed at
    // once, the process stays healthy, and the port serves again once the silent ones are gone.
    let held = silent_connections(served.webhook, CONNECTION_CAP).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut over = TcpStream::connect(("127.0.0.1", served.webhook))
        .await
        .unwrap();
    assert!(
        closed_within(&mut over, Duration::from_secs(2)).await,
        "connection {} was kept",
        CONNECTION_CAP + 1
    );
    assert!(
        answers(health, "/healthz").await,
        "the process stays healthy"
    );
    let mut held = held;
    assert!(
        !closed_within(&mut held[0], Duration::from_millis(200)).await,
        "the connections under the cap are held until their timeout"
    );
    testenv::eventually(
        "the webhook to serve once the silent connections time out",
        SLOW_CLIENT_TIMEOUT + MARGIN,
        || async { webhook_answers(&served).await.then_some(()) },
    )
    .await;
}
