//! Real joins without Cluster API (testenv::joins): what the real kubeadm says of bootplate's
//! output where no container image is needed. The control-plane roles: `kubeadm init phase
//! certs all` and `kubeconfig all` build a control plane's certificates and kubeconfigs on the
//! CA, etcd CA, front-proxy CA and service-account keys bootplate wrote (and refuse a broken
//! one); `kubeadm join phase control-plane-prepare certs` does the same for a joining control
//! plane, after a real discovery. And the failure drills: a join with a wrong CA hash, an expired
//! token, a deleted token or a configuration API the kubeadm does not read fails with kubeadm's
//! own message, and no Node registers. The worker joins of every template, through Cluster API,
//! are scenario i of tests/tests/capi.rs.
//!
//! Renders use `bootplate render` with the cluster's CA and a token a test wrote (`--token`,
//! `--ca-cert`, `--ca-key`): the same engine and certificate code the controller uses.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use testenv::ApiServer;
use testenv::controller::RenderObjects;
use testenv::joins::{self, JoinServices};
use testenv::pki::TestCa;

/// The template the role and drill tests render (a cloud-config one: its files are read back).
const TEMPLATE: &str = "templates/kubeadm-ubuntu-2404.yaml";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A workload cluster machines join, with the CA it serves with and where its test files go.
struct Cluster {
    _services: JoinServices,
    apiserver: ApiServer,
    ca: TestCa,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        let ca = TestCa::new("kubernetes");
        let apiserver = ApiServer::start_for_joins(&ca).await.unwrap();
        let services = JoinServices::start(&apiserver, &ca).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), &ca.cert_pem).unwrap();
        std::fs::write(dir.path().join("ca.key"), &ca.key_pem).unwrap();
        Cluster {
            _services: services,
            apiserver,
            ca,
            dir,
        }
    }

    /// Writes a bootstrap token (`<id>.0123456789abcdef`) into the cluster, expired or not.
    async fn token(&self, id: &str, expired: bool) -> String {
        let secret = joins::token_secret(id, "0123456789abcdef", Duration::from_secs(900), expired);
        let api: Api<Secret> =
            Api::namespaced(self.apiserver.client().await.unwrap(), "kube-system");
        api.create(&PostParams::default(), &secret).await.unwrap();
        format!("{id}.0123456789abcdef")
    }

    async fn delete_token(&self, id: &str) {
        let api: Api<Secret> =
            Api::namespaced(self.apiserver.client().await.unwrap(), "kube-system");
        api.delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
            .await
            .unwrap();
    }

    async fn node_exists(&self, name: &str) -> bool {
        let nodes: Api<Node> = Api::all(self.apiserver.client().await.unwrap());
        nodes.get_opt(name).await.unwrap().is_some()
    }

    /// `bootplate render` of [`TEMPLATE`] for `machine` (a Machine at `version`, labelled
    /// control-plane unless `role` is worker) of this cluster, with the sandbox's variables,
    /// `token` and this cluster's CA (or `ca`, a CA's `(cert, key)` files).
    fn render(
        &self,
        machine: &str,
        role: &str,
        version: &str,
        token: &str,
        ca: Option<(&Path, &Path)>,
    ) -> Vec<u8> {
        let d = self.dir.path();
        let port = self.apiserver.port();
        let files = RenderObjects {
            namespace: "joins",
            endpoint: ("127.0.0.1", port),
            service_cidr: "10.0.0.0/24",
            machine,
            version,
            control_plane: role != "worker",
            config_spec: json!({
                "templateRef": {"kind": "ClusterBootstrapTemplate", "name": "kubeadm-ubuntu-2404"},
                "variables": joins::sandbox_variables(),
            }),
        }
        .write(d);
        let (own_cert, own_key) = (d.join("ca.crt"), d.join("ca.key"));
        let (cert, key) = ca.unwrap_or((&own_cert, &own_key));
        let args: [&OsStr; 8] = [
            "--role".as_ref(),
            role.as_ref(),
            "--token".as_ref(),
            token.as_ref(),
            "--ca-cert".as_ref(),
            cert.as_os_str(),
            "--ca-key".as_ref(),
            key.as_os_str(),
        ];
        files.render(&repo().join(TEMPLATE), &args)
    }
}

/// A root holding the files a cloud-config `user_data` writes (`write_files`), for `kubeadm
/// --rootfs` (kubeadm chroots into it and finds them where the machine would).
fn root_with_files(user_data: &[u8], dir: &Path) -> PathBuf {
    let text = String::from_utf8(user_data.to_vec()).unwrap();
    let config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let root = dir.join("root");
    for file in config["write_files"].as_sequence().unwrap() {
        let path = root.join(file["path"].as_str().unwrap().trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        assert!(file["encoding"].is_null(), "plain files only: {file:?}");
        std::fs::write(&path, file["content"].as_str().unwrap()).unwrap();
    }
    root
}

fn kubeadm_in(root: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(testenv::tools::path("kubeadm").unwrap())
        .args(args)
        .arg(format!("--rootfs={}", root.display()))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `init`: kubeadm builds the control plane's certificates and kubeconfigs on the CAs and the
/// service-account key pair bootplate wrote (it says it uses them, and signs with them), and
/// refuses a CA whose key is not its certificate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_init_phases_build_on_bootplates_certificates() {
    let cluster = Cluster::start().await;
    let version = joins::kube_version().unwrap();
    let user_data = cluster.render("cp-0", "init", &version, "abcdef.0123456789abcdef", None);
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_files(&user_data, dir.path());
    let config = "/run/kubeadm/kubeadm.yaml";

    let (ok, out) = kubeadm_in(
        &root,
        &["init", "phase", "certs", "all", "--config", config],
    );
    assert!(ok, "kubeadm init phase certs all:\n{out}");
    for ca in ["ca", "front-proxy-ca", "etcd/ca"] {
        assert!(
            out.contains(&format!("Using existing {ca} certificate authority")),
            "kubeadm generated {ca} instead of using bootplate's:\n{out}"
        );
    }
    assert!(out.contains("Using the existing \"sa\" key"), "{out}");
    let (ok, out) = kubeadm_in(
        &root,
        &["init", "phase", "kubeconfig", "all", "--config", config],
    );
    assert!(ok, "kubeadm init phase kubeconfig all:\n{out}");
    // The apiserver certificate kubeadm issued chains to the CA bootplate wrote.
    let pki = root.join("etc/kubernetes/pki");
    let verify = Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(pki.join("ca.crt"))
        .arg(pki.join("apiserver.crt"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
    assert!(root.join("etc/kubernetes/admin.conf").is_file());

    // A broken CA: the key is another CA's.
    let broken = tempfile::tempdir().unwrap();
    let root = root_with_files(&user_data, broken.path());
    let pki = root.join("etc/kubernetes/pki");
    std::fs::copy(pki.join("front-proxy-ca.key"), pki.join("ca.key")).unwrap();
    let (ok, out) = kubeadm_in(
        &root,
        &["init", "phase", "certs", "all", "--config", config],
    );
    println!("kubeadm init phase certs all, CA key not the CA's:\n{out}");
    assert!(
        !ok,
        "kubeadm accepted a CA key that is not its certificate's"
    );
    assert!(out.contains("doesn't match parent's PublicKey"), "{out}");
    let (ok, out) = kubeadm_in(
        &root,
        &["init", "phase", "kubeconfig", "all", "--config", config],
    );
    println!("kubeadm init phase kubeconfig all, CA key not the CA's:\n{out}");
    assert!(
        !ok && out.contains("doesn't match parent's PublicKey"),
        "{out}"
    );
}

/// `control-plane-join`: after a real discovery (the token and CA hash bootplate rendered),
/// kubeadm prepares the joining control plane's certificates on the CAs bootplate wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_control_plane_join_prepares_its_certificates_from_bootplates() {
    let cluster = Cluster::start().await;
    let version = joins::kube_version().unwrap();
    let token = cluster.token("cpjoin", false).await;
    let user_data = cluster.render("cp-1", "control-plane-join", &version, &token, None);
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_files(&user_data, dir.path());
    let (ok, out) = kubeadm_in(
        &root,
        &[
            "join",
            "phase",
            "control-plane-prepare",
            "certs",
            "--config",
            "/run/kubeadm/kubeadm-join-config.yaml",
        ],
    );
    assert!(ok, "kubeadm join phase control-plane-prepare certs:\n{out}");
    // Every certificate kubeadm issued chains to the CA bootplate wrote for it.
    let pki = root.join("etc/kubernetes/pki");
    for (ca, cert) in [
        ("ca.crt", "apiserver.crt"),
        ("ca.crt", "apiserver-kubelet-client.crt"),
        ("front-proxy-ca.crt", "front-proxy-client.crt"),
        ("etcd/ca.crt", "etcd/server.crt"),
        ("etcd/ca.crt", "apiserver-etcd-client.crt"),
    ] {
        let verify = Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(pki.join(ca))
            .arg(pki.join(cert))
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "{cert} against {ca}: {verify:?}\n{out}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(pki.join("ca.crt")).unwrap(),
        cluster.ca.cert_pem,
        "the cluster's CA, as bootplate wrote it"
    );
}

/// kubeadm waits five minutes for a token's signature in `cluster-info` (a token may be
/// created after the machine boots). The drills of tokens that never get one shorten that wait
/// in the rendered JoinConfiguration (`timeouts.discovery`), so they end in seconds.
fn with_short_discovery(user_data: &[u8]) -> Vec<u8> {
    let text = String::from_utf8(user_data.to_vec()).unwrap();
    let shortened = text.replacen(
        "    kind: JoinConfiguration\n",
        "    kind: JoinConfiguration\n    timeouts:\n      discovery: 10s\n",
        1,
    );
    assert_ne!(shortened, text, "a JoinConfiguration in the user-data");
    shortened.into_bytes()
}

/// The failure drills: each join fails with the real kubeadm's own message (printed, and in the
/// boot proof's failure), writes no sentinel, and registers no Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_refuses_a_wrong_ca_hash_a_dead_token_and_an_unknown_configuration_api() {
    let cluster = Cluster::start().await;
    let version = joins::kube_version().unwrap();
    let other_ca = TestCa::new("kubernetes");
    let other = tempfile::tempdir().unwrap();
    let (other_cert, other_key) = (other.path().join("ca.crt"), other.path().join("ca.key"));
    std::fs::write(&other_cert, &other_ca.cert_pem).unwrap();
    std::fs::write(&other_key, &other_ca.key_pem).unwrap();

    let good = cluster.token("drills", false).await;
    let expired = cluster.token("expird", true).await;
    let deleted = cluster.token("delete", false).await;
    cluster.delete_token("delete").await;
    let drills: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "wrong-ca-hash",
            cluster.render(
                "wrong-ca-hash",
                "worker",
                &version,
                &good,
                Some((&other_cert, &other_key)),
            ),
            "cluster CA found in cluster-info ConfigMap is invalid",
        ),
        (
            "expired-token",
            with_short_discovery(&cluster.render(
                "expired-token",
                "worker",
                &version,
                &expired,
                None,
            )),
            "could not find a JWS signature in the cluster-info ConfigMap for token ID \"expird\"",
        ),
        (
            "deleted-token",
            with_short_discovery(&cluster.render(
                "deleted-token",
                "worker",
                &version,
                &deleted,
                None,
            )),
            "could not find a JWS signature in the cluster-info ConfigMap for token ID \"delete\"",
        ),
        (
            // A Machine at 1.30 renders kubeadm.k8s.io/v1beta3, which this kubeadm no longer
            // reads: an image whose kubeadm is not the Machine's version.
            "old-configuration-api",
            cluster.render("old-configuration-api", "worker", "v1.30.4", &good, None),
            "kubeadm.k8s.io/v1beta3",
        ),
    ];
    for (name, user_data, message) in drills {
        let boot = tokio::task::spawn_blocking(move || {
            joins::boot(&user_data, &format!("drill-{name}"), "worker", "", "ubuntu")
        })
        .await
        .unwrap()
        .unwrap();
        println!("--- drill {name}: the boot proof says:\n{}", boot.stderr);
        assert_eq!(boot.status, Some(1), "{name}: {}", boot.explain());
        assert!(
            matches!(boot.kubeadm_status("join"), Some(s) if s != 0),
            "{name}: {}",
            boot.explain()
        );
        assert!(
            boot.stderr.contains(message) && boot.kubeadm_log().contains(message),
            "{name}: kubeadm's message `{message}` is not in the output: {}",
            boot.explain()
        );
        assert_eq!(boot.report["sentinel"], json!(false), "{name}");
        assert!(
            !cluster.node_exists(name).await,
            "{name}: a Node registered"
        );
    }
}
