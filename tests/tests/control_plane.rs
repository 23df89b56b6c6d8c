//! A whole control plane from bootplate's renders (issue 31): the real `kubeadm init` of a
//! shipped Debian-family template's `init` render, on a node of its own (testenv::node: its own
//! network namespace and address, real cloud-init, containerd with the control-plane images
//! tests/scripts/build-images.sh built, the real kubelet), brings etcd, the apiserver, the
//! controller-manager and the scheduler up as static Pods from those local images; the real
//! `kubeadm join` of two `control-plane-join` renders, each on a node beside it, adds an etcd
//! member and an apiserver each, and two `worker` renders join as workers. Every node reaches
//! the cluster through the control-plane endpoint (testenv::endpoint, in front of the
//! apiservers as a load balancer would be).
//!
//! Renders use `bootplate render --pki-dir` with the Cluster's certificates made by bootplate's
//! own code (`bootplate::pki`, what the controller stores in the Cluster's Secrets), so both
//! renders share them as the controller's do; the token is one the test issues, as the
//! controller does, in the new cluster. etcd's members are what the real `etcdctl member list`
//! says. Needs root, the boot proof's Debian root
//! (tests/boot/build-root.sh) and tests/scripts/install-tools.sh's tools.

use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use testenv::controller::RenderObjects;
use testenv::endpoint::Endpoint;
use testenv::node::{Node, NodeSpec};
use testenv::{images, joins, tls_probe, tools};

/// The shipped template the control plane is rendered from.
const TEMPLATE: &str = "templates/kubeadm-debian-12.yaml";

/// The repository the images are named in (the template's `imageRepository` variable): one
/// nothing can be pulled from, so every image must come from the node's containerd.
const REPOSITORY: &str = "bootplate.invalid/k8s";

/// The apiserver's port on the control-plane endpoint.
const PORT: u16 = 6443;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The template's variables on these nodes: the sandbox's (joins::sandbox_variables), the
/// local images' repository and sandbox image, and the preflight checks a chroot without
/// systemd fails (swap is the host's, and so are the kernel modules).
fn variables(pause: &str) -> Value {
    let mut variables = joins::sandbox_variables();
    variables["imageRepository"] = json!(REPOSITORY);
    variables["sandboxImage"] = json!(pause);
    variables["kubeadmIgnorePreflightErrors"]
        .as_array_mut()
        .expect("a list")
        .extend([json!("Swap"), json!("Mem"), json!("NumCPU")]);
    variables
}

/// What every render and boot of the test shares: the Cluster's certificates, the endpoint,
/// the Kubernetes version, the images (and the sandbox image among them) and the join token.
struct Shared {
    dir: PathBuf,
    endpoint: Ipv4Addr,
    version: String,
    archives: Vec<PathBuf>,
    pause: String,
    token: String,
}

impl Shared {
    /// `bootplate render` of [`TEMPLATE`] for Machine `machine` (role `role`), the Cluster's
    /// certificates from `pki/` in [`Shared::dir`].
    fn render(&self, machine: &str, role: &str) -> Vec<u8> {
        let endpoint = self.endpoint.to_string();
        let dir = self.dir.join(machine);
        std::fs::create_dir_all(&dir).unwrap();
        let files = RenderObjects {
            namespace: "control-plane",
            endpoint: (&endpoint, PORT),
            service_cidr: "10.96.0.0/16",
            machine,
            version: &self.version,
            control_plane: role != "worker",
            config_spec: json!({
                "templateRef": {"kind": "ClusterBootstrapTemplate", "name": "kubeadm-debian-12"},
                "variables": variables(&self.pause),
            }),
        }
        .write(&dir);
        let pki = self.dir.join("pki");
        let args: [&OsStr; 6] = [
            "--role".as_ref(),
            role.as_ref(),
            "--pki-dir".as_ref(),
            pki.as_os_str(),
            "--token".as_ref(),
            self.token.as_ref(),
        ];
        files.render(&repo().join(TEMPLATE), &args)
    }

    /// Renders Machine `machine` (role `role`), boots `node` with it (the run is named after
    /// the Machine) and asserts the boot proof.
    fn boot(&self, node: &mut Node, machine: &str, role: &str) {
        let user_data = self.render(machine, role);
        node.boot(&NodeSpec {
            name: machine,
            user_data: &user_data,
            role,
            version: &self.version,
            os: "debian",
            images: &self.archives,
        })
        .unwrap_or_else(|e| panic!("{machine}'s node boots: {e:#}"));
        let report = node.report().unwrap();
        assert_eq!(
            report["ok"],
            true,
            "the boot proof of {machine}'s {role} render: {}\n{}",
            report["failures"],
            node.kubeadm_log()
        );
    }
}

/// The Cluster's certificates as bootplate generates them for a Cluster without them (cluster,
/// etcd and front-proxy CAs, the service-account key pair), in `dir` laid out as kubeadm's
/// /etc/kubernetes/pki (what `bootplate render --pki-dir` reads).
fn cluster_pki(dir: &Path) {
    use bootplate::pki;
    std::fs::create_dir_all(dir.join("etcd")).unwrap();
    let pairs = [
        (pki::generate_ca("kubernetes").unwrap(), "ca.crt", "ca.key"),
        (
            pki::generate_ca("etcd-ca").unwrap(),
            "etcd/ca.crt",
            "etcd/ca.key",
        ),
        (
            pki::generate_ca("front-proxy-ca").unwrap(),
            "front-proxy-ca.crt",
            "front-proxy-ca.key",
        ),
        (
            pki::generate_service_account_key().unwrap(),
            "sa.pub",
            "sa.key",
        ),
    ];
    for (pair, cert, key) in pairs {
        std::fs::write(dir.join(cert), pair.cert).unwrap();
        std::fs::write(dir.join(key), pair.key).unwrap();
    }
}

/// The control-plane images in [`REPOSITORY`], and the sandbox image's reference.
fn control_plane_images() -> (Vec<PathBuf>, String) {
    let archives = images::archives_in(Some(REPOSITORY), &images::KUBEADM_IMAGES)
        .expect("the control-plane images");
    let pause = testenv::pod_cluster::images::reference_of(&archives["pause"]).unwrap();
    (archives.into_values().collect(), pause)
}

/// Issues the join token in the new cluster (kube-system/bootstrap-token-ID, in kubeadm's node
/// group), as the controller does through the `<cluster>-kubeconfig` Secret.
fn issue_token(node: &Node, token: &str) {
    let (id, secret) = token.split_once('.').unwrap();
    let object = joins::token_secret(id, secret, Duration::from_secs(900), false);
    let file = node.dir().join("bootstrap-token.yaml");
    std::fs::write(&file, serde_yaml::to_string(&object).unwrap()).unwrap();
    let out = node
        .kubectl(&["apply", "-f", file.to_str().unwrap()])
        .unwrap();
    assert!(
        out.status.success(),
        "creating the bootstrap token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names of etcd's members: `etcdctl member list` against the etcd at `node`, with the
/// etcd client certificate kubeadm made there.
fn etcd_members(node: &Node) -> Vec<String> {
    let pki = node.dir().join("etc-kubernetes/pki/etcd");
    let endpoint = format!("https://{}:2379", node.address());
    let out = Command::new(tools::path("etcdctl").expect("etcdctl"))
        .arg(format!("--endpoints={endpoint}"))
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("healthcheck-client.crt"))
        .arg("--key")
        .arg(pki.join("healthcheck-client.key"))
        .args([
            "--command-timeout=10s",
            "member",
            "list",
            "--write-out=json",
        ])
        .output()
        .expect("etcdctl runs");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "etcdctl member list at {endpoint}: {body}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("etcdctl member list at {endpoint}: {e}: {body}"));
    let mut names: Vec<String> = list["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members in {body}"))
        .iter()
        .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names
}

/// The Nodes `kubectl get nodes` lists through `node`'s admin.conf (the control-plane endpoint).
fn listed_nodes(node: &Node) -> Vec<String> {
    let out = node
        .kubectl(&["get", "nodes", "-o", "name"])
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl get nodes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("node/").to_owned())
        .collect();
    names.sort();
    names
}

/// The Machines of the cluster, in the order they boot: the init Machine, the control-plane
/// joins, then the workers.
const MACHINES: [(&str, &str); 5] = [
    ("cp-0", "init"),
    ("cp-1", "control-plane-join"),
    ("cp-2", "control-plane-join"),
    ("worker-0", "worker"),
    ("worker-1", "worker"),
];

/// Asserts that the apiserver at `ip` (or the endpoint in front of them) serves a certificate
/// for `ip` of the cluster CA `ca`.
async fn serves_cluster_certificate(ip: Ipv4Addr, ca: &str, what: &str) {
    tls_probe::handshake_at(ip, PORT, ca)
        .await
        .unwrap_or_else(|e| panic!("{what} at {ip}: the serving certificate: {e:#}"));
}

/// A whole control plane and its workers from bootplate's renders, each on a node of its own:
/// the real `kubeadm init` of the `init` render brings the control plane up from the local
/// images; the real `kubeadm join` of two `control-plane-join` renders (one after the other, as
/// etcd adds one learner at a time) adds an etcd member and an apiserver each; the two workers
/// join at once. Every apiserver, and the endpoint in front of them, serves a certificate of the
/// cluster CA bootplate holds; etcd lists three members; `kubectl get nodes` lists five Nodes.
#[tokio::test(flavor = "multi_thread")]
async fn three_control_plane_machines_and_two_workers_from_bootplates_renders() {
    let (archives, pause) = control_plane_images();
    let dir = tempfile::tempdir().unwrap();
    cluster_pki(&dir.path().join("pki"));
    let ca = std::fs::read_to_string(dir.path().join("pki/ca.crt")).unwrap();
    let endpoint = Endpoint::start(PORT, &ca).expect("the control-plane endpoint");
    let mut nodes: Vec<Node> = MACHINES
        .iter()
        .map(|(machine, _)| Node::new().unwrap_or_else(|e| panic!("{machine}'s node: {e:#}")))
        .collect();
    for node in &nodes[..3] {
        endpoint.add_backend(SocketAddr::from((node.address(), PORT)));
    }
    let shared = Shared {
        dir: dir.path().to_owned(),
        endpoint: endpoint.address(),
        version: joins::kube_version().unwrap(),
        archives,
        pause,
        token: bootplate::core::token::Token::generate().expose(),
    };
    let (control_plane, workers) = nodes.split_at_mut(3);
    for (i, node) in control_plane.iter_mut().enumerate() {
        let (machine, role) = MACHINES[i];
        shared.boot(node, machine, role);
        serves_cluster_certificate(node.address(), &ca, machine).await;
        if role == "init" {
            serves_cluster_certificate(endpoint.address(), &ca, "the endpoint").await;
            issue_token(node, &shared.token);
        }
    }
    std::thread::scope(|scope| {
        for (node, (machine, role)) in workers.iter_mut().zip(&MACHINES[3..]) {
            let shared = &shared;
            scope.spawn(move || shared.boot(node, machine, role));
        }
    });
    for node in &nodes {
        assert!(
            node.pods_in_own_cgroup(),
            "the kubelet at {} keeps its pods under {}",
            node.address(),
            node.cgroup_root()
        );
    }
    assert_eq!(
        etcd_members(&nodes[0]),
        ["cp-0", "cp-1", "cp-2"],
        "etcd's members"
    );
    let mut all: Vec<&str> = MACHINES.iter().map(|(machine, _)| *machine).collect();
    all.sort();
    assert_eq!(listed_nodes(&nodes[0]), all, "kubectl get nodes");
}
