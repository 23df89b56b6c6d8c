//! A whole control plane from bootplate's renders (issue 31): the real `kubeadm init` of a
//! shipped Debian-family template's `init` render, on a node of its own (testenv::node: its own
//! network namespace and address, real cloud-init, containerd with the control-plane images
//! tests/scripts/build-images.sh built, the real kubelet), brings etcd, the apiserver, the
//! controller-manager and the scheduler up as static Pods from those local images.
//!
//! Renders use `bootplate render` with a CA the test made (`--ca-cert`, `--ca-key`): the same
//! engine and certificate code the controller uses. Needs root, the boot proof's Debian root
//! (tests/boot/build-root.sh) and tests/scripts/install-tools.sh's tools.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde_json::json;
use testenv::controller::RenderObjects;
use testenv::node::{Node, NodeSpec};
use testenv::pki::TestCa;
use testenv::{images, joins, tls_probe};

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
fn variables(pause: &str) -> serde_json::Value {
    let mut variables = joins::sandbox_variables();
    variables["imageRepository"] = json!(REPOSITORY);
    variables["sandboxImage"] = json!(pause);
    variables["kubeadmIgnorePreflightErrors"]
        .as_array_mut()
        .expect("a list")
        .extend([json!("Swap"), json!("Mem"), json!("NumCPU")]);
    variables
}

/// `bootplate render` of [`TEMPLATE`] for control-plane Machine `machine` (role `role`) of
/// Cluster `workload` whose endpoint is `endpoint`, with `ca`'s files in `dir`.
fn render(
    dir: &Path,
    machine: &str,
    role: &str,
    endpoint: Ipv4Addr,
    version: &str,
    pause: &str,
) -> Vec<u8> {
    let endpoint = endpoint.to_string();
    let files = RenderObjects {
        namespace: "control-plane",
        endpoint: (&endpoint, PORT),
        service_cidr: "10.96.0.0/16",
        machine,
        version,
        control_plane: true,
        config_spec: json!({
            "templateRef": {"kind": "ClusterBootstrapTemplate", "name": "kubeadm-debian-12"},
            "variables": variables(pause),
        }),
    }
    .write(dir);
    let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    let args: [&OsStr; 6] = [
        "--role".as_ref(),
        role.as_ref(),
        "--ca-cert".as_ref(),
        cert.as_os_str(),
        "--ca-key".as_ref(),
        key.as_os_str(),
    ];
    testenv::controller::render(
        &repo().join(TEMPLATE),
        &files.machine,
        &files.cluster,
        &files.config,
        &args,
    )
}

/// The control-plane images in [`REPOSITORY`], and the sandbox image's reference.
fn control_plane_images() -> (Vec<PathBuf>, String) {
    let archives = images::archives_in(Some(REPOSITORY), &images::KUBEADM_IMAGES)
        .expect("the control-plane images");
    let pause = testenv::pod_cluster::images::reference_of(&archives["pause"]).unwrap();
    (archives.into_values().collect(), pause)
}

/// The `init` render alone: the real `kubeadm init` on its node brings the control plane up
/// from the local images; the apiserver serves a certificate of the cluster CA bootplate holds
/// (the one it rendered from) for the node's address, and `kubectl get nodes` with kubeadm's
/// admin.conf lists the node.
#[tokio::test(flavor = "multi_thread")]
async fn kubeadm_init_from_the_init_render_runs_a_control_plane() {
    let version = joins::kube_version().unwrap();
    let (archives, pause) = control_plane_images();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("kubernetes");
    std::fs::write(dir.path().join("ca.crt"), &ca.cert_pem).unwrap();
    std::fs::write(dir.path().join("ca.key"), &ca.key_pem).unwrap();

    let mut node = Node::new().expect("a node");
    let user_data = render(dir.path(), "cp-0", "init", node.address(), &version, &pause);
    node.boot(&NodeSpec {
        name: "control-plane-init",
        user_data: &user_data,
        role: "init",
        version: &version,
        os: "debian",
        images: &archives,
    })
    .expect("the init node boots");
    let report = node.report().unwrap();
    assert_eq!(
        report["ok"],
        true,
        "the boot proof of the init render: {}\n{}",
        report["failures"],
        node.kubeadm_log()
    );
    tls_probe::handshake_at(node.address(), PORT, &ca.cert_pem)
        .await
        .unwrap_or_else(|e| panic!("the apiserver's serving certificate: {e:#}"));
    let nodes = node
        .kubectl(&["get", "nodes", "-o", "name"])
        .expect("kubectl");
    let listed = String::from_utf8_lossy(&nodes.stdout);
    assert!(
        nodes.status.success() && listed.lines().any(|l| l == "node/cp-0"),
        "kubectl get nodes: {listed}{}",
        String::from_utf8_lossy(&nodes.stderr)
    );
}
