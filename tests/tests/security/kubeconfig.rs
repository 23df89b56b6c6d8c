//! A tenant's `<cluster>-kubeconfig` Secret. An app team writes it in its own namespace, and the
//! controller builds a workload client from it with the controller's own process and files. Each
//! form that could run a command in the controller, read one of its files or send credentials in
//! the clear is refused: the configs of that Cluster say which field, an Event and the token
//! error metric count it, no connection reaches the server the kubeconfig names (a listener that
//! records every connection stands there) and an `exec` command never runs. The control: the
//! accepted shape pointed at the same listener does connect, so "no connection" can fail.
//!
//! This module plays Cluster API's Cluster and Machine controllers (Cluster status, the CA
//! Secret, owner references; `testenv::capi_env`): what is under test is a Secret the tenant
//! writes, and CAPI's behaviour has no part in how the controller reads it.

use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crd_types::capi::Cluster;
use crd_types::conditions::reason;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use testenv::capi_env::{Env, NS, WAIT, cluster_template, env, publish_cluster_template};
use testenv::{eventually, fixtures};

/// Counts the connections made to it.
struct Listener {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Listener {
    fn start() -> Listener {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut stream = stream;
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(200)));
                let _ = stream.read(&mut [0u8; 512]);
            }
        });
        Listener { port, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A kubeconfig whose cluster entry gets `cluster` and user entry gets `user` (lines indented
/// for their entries), with the given server.
fn kubeconfig(server: &str, ca_data: &str, cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: tenant
  cluster:
    server: {server}
    certificate-authority-data: {ca_data}
{cluster}
users:
- name: tenant
  user:
{user}
contexts:
- name: tenant
  context: {{cluster: tenant, user: tenant}}
current-context: tenant
"
    )
}

/// A Cluster as CAPI leaves it once its control plane is up, whose kubeconfig Secret holds
/// `value`, and one worker Machine with its config.
async fn cluster_with_kubeconfig(env: &Env, name: &str, value: String) {
    Api::<Cluster>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &fixtures::cluster(NS, name))
        .await
        .unwrap();
    let secret = fixtures::cluster_secret(NS, name, "kubeconfig", [("value", value)]);
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    env.set_cluster_status(name, true, true).await;
    env.cluster_ca(name).await;
    env.machine(name, &format!("{name}-w"), false, cluster_template("probe"))
        .await;
}

/// The CA data of the workload kubeconfig the environment wrote (any valid PEM would do).
fn ca_data(env: &Env) -> String {
    env.workload
        .kubeconfig_yaml()
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .expect("the workload kubeconfig has inline CA data")
        .to_owned()
}

#[tokio::test]
async fn a_tenant_kubeconfig_cannot_run_commands_read_files_or_leak_credentials() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    let listener = Listener::start();
    let https = format!("https://127.0.0.1:{}", listener.port);
    let http = format!("http://127.0.0.1:{}", listener.port);
    let scratch = tempfile::tempdir().unwrap();
    let ran = scratch.path().join("exec-ran");
    let stolen = scratch.path().join("controller-file");
    std::fs::write(&stolen, "a-file-only-the-controller-may-read").unwrap();
    let ca = ca_data(&env);
    let token = "    token: tenant-token";
    let exec = format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, 'touch {}; echo {{}}']\n      interactiveMode: Never",
        ran.display()
    );
    let token_file = format!("    tokenFile: {}", stolen.display());
    let ca_file = format!("    certificate-authority: {}", stolen.display());
    let cert_file = format!(
        "    client-certificate: {0}\n    client-key: {0}",
        stolen.display()
    );
    let provider = "    auth-provider:\n      name: oidc\n      config: {idp-issuer-url: 'https://127.0.0.1:1'}";
    let refused: Vec<(&str, String, &str)> = vec![
        (
            "exec",
            kubeconfig(&https, &ca, "", &exec),
            "`exec` is refused",
        ),
        (
            "token-file",
            kubeconfig(&https, &ca, "", &token_file),
            "`tokenFile` is refused",
        ),
        (
            "auth-provider",
            kubeconfig(&https, &ca, "", provider),
            "`auth-provider` is refused",
        ),
        (
            "plain-http",
            kubeconfig(&http, &ca, "", token),
            "is not an https URL",
        ),
        (
            "basic-auth",
            kubeconfig(&https, &ca, "", "    username: admin\n    password: secret"),
            "`username` is refused",
        ),
        (
            "skip-verify",
            kubeconfig(&https, &ca, "    insecure-skip-tls-verify: true", token),
            "`insecure-skip-tls-verify` is refused",
        ),
        (
            "ca-file",
            kubeconfig(&https, &ca, &ca_file, token),
            "`certificate-authority` (a file path)",
        ),
        (
            "cert-file",
            kubeconfig(&https, &ca, "", &cert_file),
            "client-certificate (a file path)",
        ),
    ];
    let controller = env.controller(&[]).await;
    for (name, value, _) in &refused {
        cluster_with_kubeconfig(&env, &format!("k-{name}"), value.clone()).await;
    }
    for (name, _, field) in &refused {
        let config = format!("k-{name}-w");
        let message = env
            .wait_reason(&config, reason::BOOTSTRAP_TOKEN_ERROR)
            .await;
        let secret = format!("Secret {NS}/k-{name}-kubeconfig");
        assert!(
            message.contains(&secret) && message.contains(field),
            "{name}: {message}"
        );
        assert!(
            !message.contains("secret") && !message.contains("tenant-token"),
            "{message}"
        );
        env.settled(&controller, &config).await;
    }
    assert_eq!(
        listener.connections(),
        0,
        "a refused kubeconfig made a connection"
    );
    assert!(
        !ran.exists(),
        "the tenant's exec command ran in the controller"
    );
    let errors = controller.metric(r#"bootplate_bootstrap_tokens_total{action="error"}"#);
    assert!(errors.unwrap_or(0.0) >= refused.len() as f64, "{errors:?}");
    let noted = testenv::events::wait_for(
        &env.client,
        Some(NS),
        "k-exec-w",
        "a warning Event naming the refused field",
        |e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("`exec` is refused"))
        },
    )
    .await
    .type_;
    assert_eq!(noted.as_deref(), Some("Warning"));

    // The control: the accepted shape, pointed at the same listener, does reach it (and fails
    // there, the listener speaks no TLS), so the zero above is a measurement.
    cluster_with_kubeconfig(&env, "k-accepted", kubeconfig(&https, &ca, "", token)).await;
    env.wait_reason("k-accepted-w", reason::BOOTSTRAP_TOKEN_ERROR)
        .await;
    eventually("the accepted kubeconfig connects", WAIT, || async {
        (listener.connections() > 0).then_some(())
    })
    .await;
    // And every other config of the namespace is served: the environment's own kubeconfig.
    env.initialized_cluster("k-good").await;
    env.machine("k-good", "k-good-w", false, cluster_template("probe"))
        .await;
    env.wait_ready("k-good-w").await;
}
