//! Fetch delivery (docs/boot-channel.md, "Fetch delivery") across the same boundary as the boot
//! report, in the boot report's environment (see `boot_report.rs`, which calls [`check`]): a
//! worker whose config sets `delivery: Fetch` gets a stub; its sealed render waits in the
//! workload cluster for its token alone, and goes with the token once the machine joined.
//!
//! - the data Secret holds a stub of at most 3072 bytes; the payload Secret
//!   `kube-system/bootplate-fetch-<config UID>` holds ciphertext, not the token;
//! - the machine's token reads the payload (200); another machine's token gets 403 on it and on
//!   the machine's report;
//! - the stub, run by bash with the real curl and openssl against the real workload apiserver,
//!   checks `kube-public/cluster-info` as `kubeadm join` discovery does (the token's signature
//!   of its `kubeconfig`, put there as the bootstrap signer does; a CA whose key has the hash),
//!   fetches, checks and decrypts the payload; the payload run (paths moved, as the boot report
//!   tests run user-data) reports its failed `join` part: `BootFailed` on the config;
//! - while it runs, no program it starts has the token or a key in its arguments
//!   (`/proc/PID/cmdline`, readable by every user): every program on the PATH records them;
//! - servers in the middle never get the token (issue 48): one holding no key of the cluster
//!   CA that serves the real CA beside its own (either order), its own alone, or the real
//!   `cluster-info` unchanged; one whose certificate the cluster CA signed but that cannot sign
//!   `cluster-info` for the token (no signature, another secret's);
//! - a token of the right ID but another secret fails the signature check and says so;
//! - once the Machine joined, the payload's Secret, Role and RoleBinding are gone;
//! - another machine whose token expired after the signer signed for it: its stub stops with
//!   the 401 message, it never reports, and once provisioned long enough its config shows
//!   `BootNotStarted`.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use crd_types::capi::Machine;
use crd_types::{BootplateConfig, Delivery};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use sha2::{Digest, Sha256};
use testenv::capi_env::{Env, NS, WAIT, cluster_template};
use testenv::pki::{Leaf, TestCa};
use testenv::{eventually, fixtures, machine_script};

/// Machine `name` of cluster `c1` whose config fetches its render from template `boot`.
pub(super) async fn create_machine(env: &Env, name: &str) {
    let machine = fixtures::machine(NS, name, "c1", false, name);
    let machine = Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut config = fixtures::owned_config(&machine, cluster_template("boot"));
    config.spec.delivery = Some(Delivery::Fetch);
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// What `kubeadm init` publishes for discovery: `kube-public/cluster-info` with the CA, readable
/// by anyone.
async fn publish_cluster_info(env: &Env, ca: &TestCa) {
    let data = base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem);
    let kubeconfig = format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {data}\n    server: https://127.0.0.1:{}\n  name: \"\"\nkind: Config\n",
        env.workload.port()
    );
    let objects = [
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": kubeconfig}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "cluster-info-reader", "namespace": "kube-public"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["cluster-info"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "cluster-info-reader", "namespace": "kube-public"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                "name": "cluster-info-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                "name": "system:anonymous"}]}),
    ];
    let client = env.workload_client.clone();
    let post = PostParams::default();
    let [config_map, role, binding] = objects;
    (Api::<ConfigMap>::namespaced(client.clone(), "kube-public"))
        .create(&post, &serde_json::from_value(config_map).unwrap())
        .await
        .unwrap();
    (Api::<Role>::namespaced(client.clone(), "kube-public"))
        .create(&post, &serde_json::from_value(role).unwrap())
        .await
        .unwrap();
    (Api::<RoleBinding>::namespaced(client, "kube-public"))
        .create(&post, &serde_json::from_value(binding).unwrap())
        .await
        .unwrap();
}

/// HMAC-SHA256 (RFC 2104) of `data` under a `key` of at most 64 bytes: written here apart
/// from the stub's.
fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| block.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(data)
        .finalize();
    let outer = Sha256::new().chain_update(pad(0x5c)).chain_update(inner);
    outer.finalize().into()
}

/// The detached JWS the bootstrap signer (kube-controller-manager) writes into `cluster-info`
/// for `token` over `content`: HS256 keyed by the token's secret, `kid` its ID (RFC 7515,
/// appendix F; k8s.io/cluster-bootstrap's `ComputeDetachedSignature`).
fn jws(content: &str, token: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (id, secret) = token.split_once('.').unwrap();
    let header = b64.encode(format!(r#"{{"alg":"HS256","kid":"{id}"}}"#));
    let input = format!("{header}.{}", b64.encode(content));
    let signature = hmac_sha256(secret.as_bytes(), input.as_bytes());
    format!("{header}..{}", b64.encode(signature))
}

/// What the bootstrap signer does for a token that may sign: `cluster-info` gets the token's
/// signature of its `kubeconfig` as `jws-kubeconfig-<token ID>`.
async fn sign_cluster_info(env: &Env, token: &str) {
    let config_maps = Api::<ConfigMap>::namespaced(env.workload_client.clone(), "kube-public");
    let cluster_info = config_maps.get("cluster-info").await.unwrap();
    let kubeconfig = &cluster_info.data.as_ref().unwrap()["kubeconfig"];
    let id = token.split_once('.').unwrap().0;
    let signed = json!({"data": {format!("jws-kubeconfig-{id}"): jws(kubeconfig, token)}});
    config_maps
        .patch(
            "cluster-info",
            &PatchParams::default(),
            &Patch::Merge(&signed),
        )
        .await
        .unwrap();
}

/// The value of `NAME='value'` on the stub's settings line.
fn stub_value(stub: &str, name: &str) -> String {
    let after = stub
        .split(&format!("{name}='"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in the stub:\n{stub}"));
    after.split('\'').next().unwrap().to_owned()
}

/// The value of `NAME=value` (unquoted: the keys' hex) on the stub's settings lines.
fn stub_value_bare(stub: &str, name: &str) -> String {
    let after = stub
        .split(&format!("\n{name}="))
        .nth(1)
        .or_else(|| stub.split(&format!(" {name}=")).nth(1))
        .unwrap_or_else(|| panic!("no {name} in the stub:\n{stub}"));
    after.split([' ', '\n']).next().unwrap().to_owned()
}

/// `GET`s `path` of the workload apiserver as `token`; the HTTP status.
fn get_as(env: &Env, ca: &Path, token: &str, path: &str) -> String {
    let url = format!("https://127.0.0.1:{}{path}", env.workload.port());
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(ca)
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg(url)
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `stub` with the line that runs the decrypted render replaced by one that keeps it as
/// `run/payload.sh` (the test runs it with its paths moved).
fn keeping_the_payload(stub: &str) -> String {
    let run = r#"(cd / && bash "$D/x.sh")"#;
    assert!(stub.contains(run), "{stub}");
    stub.replace(run, r#"cp "$D/x.sh" "$D/../payload.sh""#)
}

/// Runs `stub` (its `/run/` under `root`) with bash: success, and standard error.
fn run_stub(stub: &str, root: &Path) -> (bool, String) {
    run_stub_with(stub, root, &[])
}

/// [`run_stub`] with `env` set for bash.
fn run_stub_with(stub: &str, root: &Path, env: &[(&str, String)]) -> (bool, String) {
    let path = root.join("stub.sh");
    let stub = stub.replace("/run/", &format!("{}/run/", root.display()));
    std::fs::write(&path, stub).unwrap();
    let out = Command::new("timeout")
        .arg("60")
        .arg("bash")
        .arg(&path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}

/// Every program on the PATH, for a stub run: records its name and arguments in
/// `$ARGV_LOG`, then runs the real one from `$REAL_PATH`.
const WRAPPER: &str = r#"#!/bin/sh
n=${0##*/}
printf '%s\n' "$n $*" >>"$ARGV_LOG"
IFS=:
for d in $REAL_PATH; do [ -x "$d/$n" ] && exec "$d/$n" "$@"; done
exit 127
"#;

/// Runs `stub` as [`run_stub`] does with every program on the PATH replaced by [`WRAPPER`]:
/// success, standard error, and every command line a program was started with.
fn run_stub_recording_argv(stub: &str, root: &Path) -> (bool, String, String) {
    let wrap = root.join("wrap");
    std::fs::create_dir_all(&wrap).unwrap();
    let wrapper = root.join("wrapper");
    std::fs::write(&wrapper, WRAPPER).unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let real_path = std::env::var("PATH").unwrap();
    for dir in std::env::split_paths(&real_path) {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let link = wrap.join(entry.file_name());
            if !link.exists() {
                std::os::unix::fs::symlink(&wrapper, link).unwrap();
            }
        }
    }
    let log = root.join("argv");
    let env = [
        ("PATH", format!("{}:{real_path}", wrap.display())),
        ("REAL_PATH", real_path.clone()),
        ("ARGV_LOG", log.to_string_lossy().into_owned()),
    ];
    let (ok, err) = run_stub_with(stub, root, &env);
    (ok, err, std::fs::read_to_string(log).unwrap_or_default())
}

/// The requests a server received: each one's path and `Authorization` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A server the stub is sent to instead of the workload apiserver (`S` rewritten: a DNS or
/// network attacker in the middle). TLS with `leaf`; it answers `cluster-info` with
/// `cluster_info` and anything else, the payload included, with 200 and an empty Secret; it
/// keeps each request's path and `Authorization` header.
struct Impostor {
    url: String,
    seen: Seen,
    task: tokio::task::JoinHandle<()>,
}

impl Impostor {
    async fn start(leaf: &Leaf, cluster_info: &ConfigMap) -> Impostor {
        let certs = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let body = Bytes::from(serde_json::to_vec(cluster_info).unwrap());
        let task = tokio::spawn(serve(listener, acceptor, body, seen.clone()));
        Impostor { url, seen, task }
    }

    /// The requests it received that carried an `Authorization` header, or asked for more
    /// than `cluster-info`.
    fn given_a_credential(&self) -> Vec<(String, Option<String>)> {
        let seen = self.seen.lock().unwrap();
        let beyond_discovery = |path: &str| !path.ends_with("/configmaps/cluster-info");
        (seen.iter())
            .filter(|(path, auth)| auth.is_some() || beyond_discovery(path))
            .cloned()
            .collect()
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    cluster_info: Bytes,
    seen: Seen,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let (acceptor, cluster_info, seen) = (acceptor.clone(), cluster_info.clone(), seen.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let path = request.uri().path().to_owned();
                let auth = request.headers().get("authorization");
                let auth = auth.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                seen.lock().unwrap().push((path.clone(), auth));
                let body = if path.ends_with("/configmaps/cluster-info") {
                    cluster_info.clone()
                } else {
                    Bytes::from_static(br#"{"kind":"Secret","data":{}}"#)
                };
                let response = hyper::Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(body));
                async move { response }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// `cluster-info` with its `kubeconfig`'s CA bundle replaced by `bundle` (PEM), its
/// signature for `id` set to `signature` (none: removed).
fn forged(real: &ConfigMap, bundle: &str, id: &str, signature: Option<String>) -> ConfigMap {
    let mut forged = real.clone();
    let data = forged.data.as_mut().unwrap();
    let kubeconfig = data["kubeconfig"].clone();
    let (real_data, _) = (kubeconfig.split("certificate-authority-data: ").nth(1))
        .and_then(|rest| rest.split_once('\n'))
        .unwrap();
    let ours = base64::engine::general_purpose::STANDARD.encode(bundle);
    data.insert("kubeconfig".into(), kubeconfig.replace(real_data, &ours));
    let key = format!("jws-kubeconfig-{id}");
    match signature {
        Some(signature) => data.insert(key, signature),
        None => data.remove(&key),
    };
    forged
}

/// Issue 48, item 3: the real stub, sent to servers in the middle, never gives them the token.
/// `real` is the workload cluster's `cluster-info` (signed for `token`), `ca` its CA.
async fn impostors_get_no_token(stub: &str, real: &ConfigMap, ca: &TestCa, token: &str) {
    // Its own name: a CA named as the cluster's makes OpenSSL pick the cluster's as the issuer
    // and fail, which would hide what the bundle trusts.
    let own = TestCa::new("impostor");
    let real_ca = ca.cert_pem.clone();
    let id = token.split_once('.').unwrap().0;
    let signed = real.data.as_ref().unwrap()[&format!("jws-kubeconfig-{id}")].clone();
    let both = forged(
        real,
        &format!("{real_ca}{}", own.cert_pem),
        id,
        Some(signed.clone()),
    );
    let resigned = jws(&both.data.as_ref().unwrap()["kubeconfig"], token);
    let (own_leaf, real_leaf) = (own.serving(), ca.serving());
    let cases = [
        ("the real CA + its own", &own_leaf, both.clone()),
        (
            "its own CA + the real",
            &own_leaf,
            forged(
                real,
                &format!("{}{real_ca}", own.cert_pem),
                id,
                Some(signed.clone()),
            ),
        ),
        (
            "its own CA alone",
            &own_leaf,
            forged(real, &own.cert_pem, id, Some(signed.clone())),
        ),
        ("the real cluster-info unchanged", &own_leaf, real.clone()),
        // One that knew the token's secret: the pinned CA alone stops it.
        (
            "the real CA + its own, signed",
            &own_leaf,
            forged(
                real,
                &format!("{real_ca}{}", own.cert_pem),
                id,
                Some(resigned),
            ),
        ),
        // A server with a certificate of the cluster CA that is not the cluster.
        ("no signature", &real_leaf, forged(real, &real_ca, id, None)),
        (
            "another secret's signature",
            &real_leaf,
            forged(
                real,
                &real_ca,
                id,
                Some(jws(
                    &real.data.as_ref().unwrap()["kubeconfig"],
                    &format!("{id}.0000000000000000"),
                )),
            ),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (what, leaf, cluster_info) in cases {
        let impostor = Impostor::start(leaf, &cluster_info).await;
        let server = stub_value(stub, "S");
        let sent = stub.replace(&format!("S='{server}'"), &format!("S='{}'", impostor.url));
        let (ok, err) = tokio::task::spawn_blocking({
            let (sent, root) = (keeping_the_payload(&sent), dir.path().to_owned());
            move || run_stub(&sent, &root)
        })
        .await
        .unwrap();
        assert_eq!(
            impostor.given_a_credential(),
            vec![],
            "{what}: the impostor got a credential; the stub said: {err}"
        );
        assert!(!ok, "{what}: the stub went on");
        assert!(err.contains("bootplate fetch: "), "{what}: {err}");
        assert!(
            !impostor.seen.lock().unwrap().is_empty(),
            "{what}: never asked"
        );
    }
}

/// The checks of the module's doc, for machine `name` (made by [`create_machine`]); `ca_file`
/// is the workload CA, `other_token` another machine's token.
pub(super) async fn check(env: &Env, ca: &TestCa, ca_file: &Path, other_token: &str, name: &str) {
    let config = env.wait_ready(name).await;
    let uid = config.uid().unwrap();
    let stub = env.user_data(name).await;
    assert!(
        stub.len() <= 3072,
        "a stub of {} bytes:\n{stub}",
        stub.len()
    );
    let (token, object) = (stub_value(&stub, "T"), stub_value(&stub, "N"));
    assert_eq!(object, format!("bootplate-fetch-{uid}"));
    let secrets = Api::<Secret>::namespaced(env.workload_client.clone(), "kube-system");
    let payload = secrets.get(&object).await.unwrap();
    let sealed = &payload.data.as_ref().unwrap()["payload"].0;
    let secret_half = token.split_once('.').unwrap().1.as_bytes();
    assert!(!sealed.windows(secret_half.len()).any(|w| w == secret_half));

    // RBAC: the machine's own token reads its payload; another machine's gets 403 on its
    // payload and on its report.
    let payload_path = format!("/api/v1/namespaces/kube-system/secrets/{object}");
    let report_path = format!("/api/v1/namespaces/kube-system/configmaps/bootplate-boot-{uid}");
    assert_eq!(get_as(env, ca_file, &token, &payload_path), "200");
    assert_eq!(get_as(env, ca_file, other_token, &payload_path), "403");
    assert_eq!(get_as(env, ca_file, other_token, &report_path), "403");

    // The stub, for real against the workload apiserver, up to running its payload: the test
    // keeps the decrypted payload and runs it with its paths moved.
    publish_cluster_info(env, ca).await;
    sign_cluster_info(env, &token).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (ok, err, argv) = run_stub_recording_argv(&keeping_the_payload(&stub), root);
    assert!(ok, "the stub failed: {err}");
    // Issue 48, item 4: no secret on a command line.
    let ran = |program: &str| argv.lines().any(|l| l.starts_with(program));
    assert!(ran("curl ") && ran("openssl "), "{argv}");
    let secret = token.split_once('.').unwrap().1;
    let keys = [stub_value_bare(&stub, "K"), stub_value_bare(&stub, "M")];
    for value in [secret, &hex::encode(secret), &keys[0], &keys[1]] {
        assert!(!argv.contains(value), "a secret on a command line:\n{argv}");
    }
    let payload = std::fs::read_to_string(root.join("run/payload.sh")).unwrap();
    assert!(payload.contains(&token) && payload.starts_with("#!/bin/bash\n"));
    assert_eq!(
        machine_script::run_script(&payload, root),
        Some(machine_script::FAILING_STATUS)
    );
    let message = env.wait_reason(name, "BootFailed").await;
    assert!(message.contains("part `join`, command 0"), "{message}");

    // A token of that ID with another secret: the signature of cluster-info is not its.
    let refused = stub.replace(&token, &format!("{}.0000000000000000", &token[..6]));
    let (ok, err) = run_stub(&keeping_the_payload(&refused), root);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "cluster-info fails the signature check of token {}",
            &token[..6]
        )),
        "{err}"
    );

    // Servers in the middle, the real cluster-info in hand.
    let real = Api::<ConfigMap>::namespaced(env.workload_client.clone(), "kube-public")
        .get("cluster-info")
        .await
        .unwrap();
    impostors_get_no_token(&stub, &real, ca, &token).await;

    // The Machine joins: the payload's objects go with its token.
    env.set_node_ref(name).await;
    let roles = Api::<Role>::namespaced(env.workload_client.clone(), "kube-system");
    let bindings = Api::<RoleBinding>::namespaced(env.workload_client.clone(), "kube-system");
    eventually("the payload deleted after the join", WAIT, || async {
        let left = (
            secrets.get_opt(&object).await.unwrap(),
            roles.get_opt(&object).await.unwrap(),
            bindings.get_opt(&object).await.unwrap(),
        );
        matches!(left, (None, None, None)).then_some(())
    })
    .await;
}

/// Machine `name` (made by [`create_machine`], after [`check`] published `cluster-info`) whose
/// token expired before it booted, after the signer signed `cluster-info` for it: the stub
/// stops with the 401 message and the config shows `BootNotStarted` (the stub never got to the
/// render and its reporter).
pub(super) async fn check_expired(env: &Env, name: &str) {
    env.wait_ready(name).await;
    let stub = env.user_data(name).await;
    let token = stub_value(&stub, "T");
    sign_cluster_info(env, &token).await;
    let id = token.split_once('.').unwrap().0;
    let expired = json!({"stringData": {"expiration": "2001-01-01T00:00:00Z"}});
    Api::<Secret>::namespaced(env.workload_client.clone(), "kube-system")
        .patch(
            &format!("bootstrap-token-{id}"),
            &PatchParams::default(),
            &Patch::Merge(&expired),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Were the token accepted, the render is kept, not run on this machine.
    let (ok, err) = run_stub(&keeping_the_payload(&stub), dir.path());
    assert!(!ok);
    assert!(
        err.contains("refused the bootstrap token (401): it expired or was deleted"),
        "{err}"
    );
    super::boot_report::provisioned_long_ago(env, name).await;
    let message = env.wait_reason(name, "BootNotStarted").await;
    assert!(
        message.contains(&format!("Machine {name} has not reported its boot")),
        "{message}"
    );
}
