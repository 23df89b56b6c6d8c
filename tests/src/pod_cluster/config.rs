//! The addresses and configuration files of one management cluster that runs Pods, as pure
//! functions of its slot and directory (no process, no Kubernetes client), so that two clusters
//! side by side provably get distinct names and ranges (the table test below).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// How many clusters and nodes can run at once on one machine (each holds one slot's lock):
/// enough for the tiers that run side by side (a whole control plane holds six).
pub const SLOTS: u8 = 16;

/// The CNI network's name (libcni names its cached results after it).
pub const NETWORK: &str = "bootplate-pods";

/// The kube-apiserver's port inside the cluster's network namespace (the same in every slot:
/// each namespace has its own ports).
pub const APISERVER_PORT: u16 = 6443;

/// The ranges every slot's link (10.213.N.0/30) and pods (10.214.N.0/24) come from. Each
/// cluster routes them through the host, which forwards between the clusters' veth ends: the
/// Pods of one cluster reach the apiserver (node address) of another, as a management cluster
/// reaches the workload clusters it manages (after a `clusterctl move`, the target's Cluster
/// API reaches the workload cluster the source's did). The cluster's own link and pod CIDR are
/// more specific routes and stay inside it.
pub const PEER_RANGES: [&str; 2] = ["10.213.0.0/16", "10.214.0.0/16"];

/// Names and address ranges of the cluster in slot `n` (`0..SLOTS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub slot: u8,
    /// The network namespace everything of the cluster runs in (`/run/netns/NAME`).
    pub netns: String,
    /// The host's end of the veth pair into the namespace.
    pub host_veth: String,
    /// The namespace's end of the veth pair (renamed `eth0` inside is not needed).
    pub node_veth: String,
    /// The host's address on its veth end (a /30 shared with the node).
    pub host_ip: Ipv4Addr,
    /// The node's address: the kubelet's node IP, the apiserver's advertise address (the
    /// `kubernetes` Service's endpoint) and where the host reaches the apiserver.
    pub node_ip: Ipv4Addr,
    /// The Node's pod CIDR (a /24: kube-controller-manager allocates exactly it to the one Node).
    pub pod_cidr: String,
    /// The bridge CNI's gateway on the pod bridge, the first address of the pod CIDR.
    pub pod_gateway: Ipv4Addr,
    /// The Service CIDR (a /24).
    pub service_cidr: String,
    /// The `kubernetes` Service's ClusterIP, the first address of the Service CIDR.
    pub kubernetes_service_ip: Ipv4Addr,
    /// The cgroup (under each hierarchy) the kubelet's pods and the runtime live in.
    pub cgroup: String,
    /// The Node's name.
    pub node_name: String,
}

impl Layout {
    /// The layout of slot `slot`. Ranges come from 10.213-10.215.x: the link, the pods and the
    /// Services of each slot are distinct, so the host can route to each cluster's pods and
    /// Services at once.
    pub fn new(slot: u8) -> Layout {
        assert!(slot < SLOTS, "slot {slot} out of 0..{SLOTS}");
        Layout {
            slot,
            netns: format!("bootplate-pc{slot}"),
            host_veth: format!("bppc{slot}h"),
            node_veth: format!("bppc{slot}n"),
            host_ip: Ipv4Addr::new(10, 213, slot, 1),
            node_ip: Ipv4Addr::new(10, 213, slot, 2),
            pod_cidr: format!("10.214.{slot}.0/24"),
            pod_gateway: Ipv4Addr::new(10, 214, slot, 1),
            service_cidr: format!("10.215.{slot}.0/24"),
            kubernetes_service_ip: Ipv4Addr::new(10, 215, slot, 1),
            cgroup: format!("bootplate-pc{slot}"),
            node_name: format!("bootplate-pc{slot}"),
        }
    }

    /// The apiserver's URL, the same from the host and from inside the namespace.
    pub fn server_url(&self) -> String {
        format!("https://{}:{APISERVER_PORT}", self.node_ip)
    }

    /// The names the apiserver's serving certificate holds: how the host, the cluster's own
    /// components and in-cluster clients (through the `kubernetes` Service) reach it.
    pub fn apiserver_names(&self) -> Vec<String> {
        vec![
            self.node_ip.to_string(),
            self.kubernetes_service_ip.to_string(),
            "127.0.0.1".into(),
            "localhost".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
        ]
    }
}

/// Where the cluster keeps its files, all under one directory removed on drop.
#[derive(Clone, Debug)]
pub struct Dirs {
    pub root: PathBuf,
}

impl Dirs {
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
    pub fn containerd_socket(&self) -> PathBuf {
        self.path("containerd/containerd.sock")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.path("cni/net.d")
    }
    pub fn pod_logs(&self) -> PathBuf {
        self.path("pod-logs")
    }
}

/// containerd's configuration: its own root, state, sockets and runc root under `dirs`; the CRI
/// plugin with the Debian CNI plugins, its own CNI configuration directory and `pause` as the
/// sandbox image; pod network namespaces mounted under its state directory (not the host's
/// `/run/netns`), so that everything it mounts is under `dirs`; no OOM score below its own.
pub fn containerd_toml(dirs: &Dirs, pause_image: &str) -> String {
    let d = |rel: &str| dirs.path(rel).display().to_string();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # These machines withhold CAP_SYS_RESOURCE even from root: no process may lower its OOM score
  # below its parent's, so the sandbox's -998 would fail every Pod; keep containers at or
  # above the runtime's score instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
"#,
        root = d("containerd/root"),
        state = d("containerd/state"),
        socket = dirs.containerd_socket().display(),
        opt = d("containerd/opt"),
        cni = dirs.cni_conf_dir().display(),
        runc = d("containerd/runc"),
    )
}

/// The CNI network: a bridge (`bp0`, inside the cluster's namespace) with the pod gateway,
/// host-local addresses from the pod CIDR (its state under `dirs`, not `/var/lib/cni`), hairpin
/// so a pod reaches itself through a Service. No masquerade: a pod's address is routed as it is,
/// in its cluster and, through the host, in the other clusters ([`PEER_RANGES`]).
pub fn cni_conflist(layout: &Layout, dirs: &Dirs) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "0.4.0",
        "name": NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": "bp0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": layout.pod_cidr, "gateway": layout.pod_gateway.to_string()}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": dirs.path("cni/ipam"),
            },
        }],
    }))
    .expect("JSON")
}

/// The kubelet's configuration: cgroupfs under the cluster's own cgroup root (so two kubelets
/// never share `kubepods`), cgroup v1 allowed (these machines have it), the runtime through the
/// cluster's own containerd socket, pod logs under `dirs`; no image garbage collection and
/// near-zero eviction thresholds, since the imported images cannot be pulled again.
pub fn kubelet_yaml(layout: &Layout, dirs: &Dirs, ca: &Path) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {logs}
clusterDomain: cluster.local
resolvConf: \"\"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}}
serializeImagePulls: false
",
        node_ip = layout.node_ip,
        ca = ca.display(),
        cgroup = layout.cgroup,
        socket = dirs.containerd_socket().display(),
        logs = dirs.pod_logs().display(),
    )
}

/// kube-proxy's configuration: nftables mode (its rules live in the cluster's namespace, so two
/// clusters' tables never meet), masquerade of all Service traffic (the bridge carries no
/// br_netfilter hook the proxy could rely on for pod-to-pod replies), and the host's conntrack
/// limits left as they are (they are not per namespace).
pub fn kube_proxy_yaml(layout: &Layout, kubeconfig: &Path) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
mode: nftables
hostnameOverride: {node}
bindAddress: 0.0.0.0
clusterCIDR: {pods}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nftables: {{masqueradeAll: true}}
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
",
        kubeconfig = kubeconfig.display(),
        node = layout.node_name,
        pods = layout.pod_cidr,
    )
}

/// A kubeconfig for `server`, verifying it with the CA at `ca`, with either a bearer token or a
/// client certificate and key (files).
pub fn kubeconfig(server: &str, ca: &Path, user: &KubeconfigUser) -> String {
    let user = match user {
        KubeconfigUser::Token(token) => format!("token: {token}"),
        KubeconfigUser::Certificate { cert, key } => format!(
            "client-certificate: {}\n    client-key: {}",
            cert.display(),
            key.display()
        ),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: pods
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: user
  user:
    {user}
contexts:
- name: pods
  context: {{cluster: pods, user: user}}
current-context: pods
",
        ca = ca.display()
    )
}

/// Who a kubeconfig authenticates as.
pub enum KubeconfigUser {
    Token(String),
    Certificate { cert: PathBuf, key: PathBuf },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_slots_share_no_name_range_or_cgroup() {
        let layouts: Vec<Layout> = (0..SLOTS).map(Layout::new).collect();
        type Field = fn(&Layout) -> String;
        let fields: [(&str, Field); 8] = [
            ("netns", |l| l.netns.clone()),
            ("host veth", |l| l.host_veth.clone()),
            ("node veth", |l| l.node_veth.clone()),
            ("node ip", |l| l.node_ip.to_string()),
            ("pod cidr", |l| l.pod_cidr.clone()),
            ("service cidr", |l| l.service_cidr.clone()),
            ("cgroup", |l| l.cgroup.clone()),
            ("node name", |l| l.node_name.clone()),
        ];
        for (what, field) in fields {
            let mut values: Vec<String> = layouts.iter().map(field).collect();
            values.sort();
            values.dedup();
            assert_eq!(values.len(), layouts.len(), "{what} repeats across slots");
        }
        for l in &layouts {
            // Linux interface names are at most 15 bytes.
            assert!(l.host_veth.len() <= 15 && l.node_veth.len() <= 15, "{l:?}");
            assert!(l.pod_cidr.starts_with(&format!("10.214.{}.", l.slot)));
            // The link and the pods are in the peer ranges, the Services not (a Service is
            // its own cluster's).
            assert!(l.node_ip.to_string().starts_with("10.213."));
            assert!(PEER_RANGES.iter().all(|r| !r.starts_with("10.215.")));
        }
    }

    #[test]
    fn the_serving_certificate_covers_every_way_to_the_apiserver() {
        let l = Layout::new(3);
        let names = l.apiserver_names();
        for expected in ["10.213.3.2", "10.215.3.1", "kubernetes.default.svc"] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing");
        }
        assert_eq!(l.server_url(), "https://10.213.3.2:6443");
    }

    #[test]
    fn containerd_keeps_every_path_under_its_directory() {
        let dirs = Dirs {
            root: PathBuf::from("/t/pc1"),
        };
        let toml = containerd_toml(&dirs, "registry.k8s.io/pause:3.10");
        for line in toml.lines().filter(|l| l.contains("= \"/")) {
            let value = line.split('"').nth(1).expect("a quoted path");
            assert!(
                value.starts_with("/t/pc1/") || value == "/usr/lib/cni",
                "{line} is outside the cluster's directory"
            );
        }
        assert!(toml.contains("sandbox_image = \"registry.k8s.io/pause:3.10\""));
        assert!(toml.contains("netns_mounts_under_state_dir = true"));
    }
}
