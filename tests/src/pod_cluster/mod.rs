//! A management cluster that runs Pods, as a platform team's is: etcd, kube-apiserver (with
//! service-account keys, so Pods get tokens), kube-controller-manager (every default controller:
//! service accounts and their tokens, the garbage collector, Deployments, node IPAM),
//! kube-scheduler, kube-proxy (nftables mode), one kubelet registered as a Node, its own
//! containerd with runc, and the bridge + host-local CNI plugins. Images come from OCI archives
//! imported into that containerd (`ctr images import`): no registry is involved.
//!
//! Everything runs in the cluster's own network namespace ([`config::Layout`]): the apiserver
//! listens on the node's address, which is also the `kubernetes` Service's endpoint, and the
//! host reaches the apiserver, the pod CIDR and the Service CIDR through a veth pair. Each
//! cluster holds one of [`config::SLOTS`] slots, with its own namespace, addresses, cgroup and
//! directory, so two run side by side (a `clusterctl move` needs two); the Pods of one reach the
//! other's node and Pods through the host ([`config::PEER_RANGES`]). Dropping the cluster
//! ends its processes and containers and removes its mounts, namespace (with the veth pair, the
//! pod bridge and kube-proxy's tables), routes, cgroups and files ([`host::sweep`]).
//!
//! It needs root (namespaces, cgroups, mounts), as the boot proof's real joins do
//! (`tests/boot/run.sh --real-kube`, whose kubelet settings for these machines it shares:
//! the cgroupfs driver and cgroup v1 allowed).

pub mod clusterctl;
pub mod config;
pub mod fleet;
pub mod host;
pub mod images;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::capi::Process;
use crate::pki::TestCa;
use crate::tools;
use config::{Dirs, KubeconfigUser, Layout};

/// The admin's bearer token (a static token file: the tests' own identity).
const ADMIN_TOKEN: &str = "bootplate-pod-cluster-admin";

/// How long the whole cluster may take to start (its start is about a minute on a loaded host).
const START_TIMEOUT: Duration = Duration::from_secs(240);

/// One running cluster; stopped and swept on drop.
pub struct PodCluster {
    slot: host::Slot,
    dirs: Dirs,
    /// In start order; stopped in reverse.
    processes: Vec<Process>,
    _dir: tempfile::TempDir,
    admin_kubeconfig: PathBuf,
    /// The cluster's CA, written at boot.
    ca: Option<TestCa>,
    /// The kernel settings its kubelet changes, put back when the last holder ends.
    tunables: Option<host::Tunables>,
}

impl PodCluster {
    /// Starts a cluster in a free slot with the image archives `images` imported into its
    /// containerd; `pause_image` (the name one of them carries) is the sandbox image.
    pub async fn start(images: &[PathBuf], pause_image: &str) -> anyhow::Result<PodCluster> {
        let started = Instant::now();
        let slot = host::Slot::take()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("bootplate-pods-{}-", slot.layout.slot))
            .disable_cleanup(std::env::var_os("BOOTPLATE_KEEP_TEST_DIRS").is_some())
            .tempdir()?;
        let dirs = Dirs {
            root: dir.path().to_owned(),
        };
        let admin_kubeconfig = dirs.path("admin.kubeconfig");
        let mut slot = slot;
        slot.record_dir(&dirs.root)?;
        let mut cluster = PodCluster {
            slot,
            dirs,
            processes: Vec::new(),
            _dir: dir,
            admin_kubeconfig,
            ca: None,
            tunables: None,
        };
        cluster.tunables = Some(host::Tunables::hold()?);
        cluster.boot(images, pause_image).await?;
        eprintln!(
            "pod cluster {} ready in {:.1} s ({})",
            cluster.layout().slot,
            started.elapsed().as_secs_f64(),
            cluster.dirs.root.display()
        );
        Ok(cluster)
    }

    async fn boot(&mut self, images: &[PathBuf], pause_image: &str) -> anyhow::Result<()> {
        let layout = self.layout().clone();
        host::make_network(&layout)?;
        host::make_cgroups(&layout)?;
        let pki = self.write_files(pause_image)?;
        self.ca = Some(pki.authority.clone());
        self.start_control_plane(&pki)?;
        let client = self.wait_for_apiserver().await?;
        self.start_runtime()?;
        for image in images {
            self.import_image(image)?;
        }
        self.start_node_components(&pki)?;
        self.wait_until_ready(&client).await
    }

    /// The cluster's CA: it signed the apiserver's serving certificate and the kubelet's, and
    /// the apiserver takes client certificates it signed. As a workload cluster's CA (the
    /// `<cluster>-ca` pair) it lets this cluster be the workload cluster of its own Machines.
    pub fn cluster_ca(&self) -> &TestCa {
        self.ca
            .as_ref()
            .expect("the CA is written before the cluster starts")
    }

    /// The cluster's names and addresses.
    pub fn layout(&self) -> &Layout {
        &self.slot.layout
    }

    /// The cluster's directory (every log: `NAME.log`).
    pub fn dir(&self) -> &Path {
        &self.dirs.root
    }

    /// An admin kubeconfig (bearer token) that reaches the apiserver from the host.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A client with admin rights.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.admin_kubeconfig)?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// The built kubectl with the admin kubeconfig, as a user runs it.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<Output> {
        Ok(Command::new(tools::path("kubectl")?)
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .output()?)
    }

    /// Imports an OCI image archive into the cluster's containerd (the `k8s.io` namespace the
    /// kubelet's images live in).
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        let socket = self.dirs.containerd_socket().display().to_string();
        let archive = archive.display().to_string();
        host::run(
            "ctr",
            &[
                "--address",
                &socket,
                "-n",
                "k8s.io",
                "images",
                "import",
                &archive,
            ],
        )
        .map(drop)
    }

    /// Imports an OCI image archive whose image is named `name:TAG` also as `name@DIGEST` (its
    /// manifest digest), as a node operator does for components that pin an image by digest:
    /// `ctr images import --base-name NAME --digests` (the kubelet looks a digest reference up
    /// by that name).
    pub fn import_pinned(&self, archive: &Path, name: &str) -> anyhow::Result<()> {
        let socket = self.dirs.containerd_socket().display().to_string();
        let archive = archive.display().to_string();
        let import = [
            "images",
            "import",
            "--base-name",
            name,
            "--digests",
            &archive,
        ];
        let mut args = vec!["--address", &socket, "-n", "k8s.io"];
        args.extend(import);
        host::run("ctr", &args).map(drop)
    }

    /// The names of the images the cluster's containerd holds.
    pub fn images(&self) -> anyhow::Result<Vec<String>> {
        let socket = self.dirs.containerd_socket().display().to_string();
        let out = host::run(
            "ctr",
            &["--address", &socket, "-n", "k8s.io", "images", "ls", "-q"],
        )?;
        Ok(out.lines().map(str::to_owned).collect())
    }

    /// Writes the PKI, kubeconfigs and configuration files; returns the PKI's paths.
    fn write_files(&self, pause_image: &str) -> anyhow::Result<Pki> {
        let layout = self.layout();
        let d = &self.dirs;
        for sub in [
            "pki",
            "etcd",
            "kubelet",
            "cni/net.d",
            "pod-logs",
            "containerd",
        ] {
            std::fs::create_dir_all(d.path(sub))?;
        }
        let pki = Pki::write(&d.path("pki"), layout)?;
        let server = layout.server_url();
        let admin =
            config::kubeconfig(&server, &pki.ca, &KubeconfigUser::Token(ADMIN_TOKEN.into()));
        std::fs::write(&self.admin_kubeconfig, admin)?;
        let kubelet = config::kubeconfig(
            &server,
            &pki.ca,
            &KubeconfigUser::Certificate {
                cert: pki.dir.join("kubelet.crt"),
                key: pki.dir.join("kubelet.key"),
            },
        );
        std::fs::write(d.path("kubelet.kubeconfig"), kubelet)?;
        std::fs::write(
            d.path("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin,system:masters\n"),
        )?;
        std::fs::write(
            d.path("containerd/config.toml"),
            config::containerd_toml(d, pause_image),
        )?;
        std::fs::write(
            d.cni_conf_dir().join("10-bootplate.conflist"),
            config::cni_conflist(layout, d),
        )?;
        std::fs::write(
            d.path("kubelet.yaml"),
            config::kubelet_yaml(layout, d, &pki.ca),
        )?;
        std::fs::write(
            d.path("kube-proxy.yaml"),
            config::kube_proxy_yaml(layout, &self.admin_kubeconfig),
        )?;
        Ok(pki)
    }

    /// Starts `program` inside the cluster's network namespace, logging to `NAME.log`.
    fn spawn(
        &mut self,
        name: &'static str,
        program: &Path,
        args: &[String],
    ) -> anyhow::Result<u32> {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/run/netns/{}", self.layout().netns))
            .arg("--")
            .arg(program)
            .args(args);
        let log = self.dirs.path(&format!("{name}.log"));
        let process = Process::spawn(name, &mut command, &log)?;
        let pid = process.pid();
        self.processes.push(process);
        // In the cluster's cgroup, a sweep ends it even when this process was killed before its
        // drop (a test binary's timeout), as it ends the containers.
        host::join_cgroups(self.layout(), pid)?;
        Ok(pid)
    }

    fn start_control_plane(&mut self, pki: &Pki) -> anyhow::Result<()> {
        let etcd_args = [
            format!("--data-dir={}", self.dirs.path("etcd").display()),
            "--listen-client-urls=http://127.0.0.1:2379".into(),
            "--advertise-client-urls=http://127.0.0.1:2379".into(),
            "--listen-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-cluster=default=http://127.0.0.1:2380".into(),
            "--log-level=warn".into(),
        ];
        self.spawn("etcd", &tools::path("etcd")?, &etcd_args)?;
        let args = apiserver_args(self.layout(), pki, &self.dirs);
        self.spawn("kube-apiserver", &tools::path("kube-apiserver")?, &args)?;
        Ok(())
    }

    async fn wait_for_apiserver(&mut self) -> anyhow::Result<Client> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(client) = self.client().await {
                let request = http::Request::get("/readyz").body(Vec::new())?;
                if matches!(client.request_text(request).await.as_deref(), Ok("ok")) {
                    return Ok(client);
                }
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("kube-apiserver not ready in {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// containerd, in the cluster's `runtime` cgroup (as every component, [`Self::spawn`]) before
    /// anything asks it for a container, so its shims are found there when the cluster goes.
    fn start_runtime(&mut self) -> anyhow::Result<()> {
        let config = self.dirs.path("containerd/config.toml");
        self.spawn(
            "containerd",
            Path::new("/usr/bin/containerd"),
            &[format!("--config={}", config.display())],
        )?;
        let socket = self.dirs.containerd_socket();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("containerd made no socket at {} in 30 s", socket.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn start_node_components(&mut self, pki: &Pki) -> anyhow::Result<()> {
        let layout = self.layout().clone();
        let kcm = controller_manager_args(&layout, pki, &self.admin_kubeconfig);
        self.spawn(
            "kube-controller-manager",
            &tools::path("kube-controller-manager")?,
            &kcm,
        )?;
        let scheduler = [
            format!("--kubeconfig={}", self.admin_kubeconfig.display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
        ];
        self.spawn(
            "kube-scheduler",
            &tools::path("kube-scheduler")?,
            &scheduler,
        )?;
        let kubelet = [
            format!("--config={}", self.dirs.path("kubelet.yaml").display()),
            format!(
                "--kubeconfig={}",
                self.dirs.path("kubelet.kubeconfig").display()
            ),
            format!("--root-dir={}", self.dirs.path("kubelet").display()),
            format!("--cert-dir={}", self.dirs.path("kubelet/pki").display()),
            format!("--hostname-override={}", layout.node_name),
            format!("--node-ip={}", layout.node_ip),
        ];
        self.spawn("kubelet", &tools::path("kubelet")?, &kubelet)?;
        let proxy = [format!(
            "--config={}",
            self.dirs.path("kube-proxy.yaml").display()
        )];
        self.spawn("kube-proxy", &tools::path("kube-proxy")?, &proxy)?;
        Ok(())
    }

    /// Waits until the Node is Ready with its pod CIDR and the `default` ServiceAccount exists
    /// (the service-account controller made it: Pods can be admitted).
    async fn wait_until_ready(&mut self, client: &Client) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let node = nodes.get_opt(&self.layout().node_name).await.ok().flatten();
            let ready = node.as_ref().is_some_and(node_is_ready);
            let cidr = node
                .as_ref()
                .and_then(|n| n.spec.as_ref()?.pod_cidr.clone());
            let account = accounts.get_opt("default").await.ok().flatten();
            if ready
                && cidr.as_deref() == Some(self.layout().pod_cidr.as_str())
                && account.is_some()
            {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "the cluster is not ready in {START_TIMEOUT:?} (node ready {ready}, pod CIDR {cidr:?}, default account {}); logs in {}",
                    account.is_some(),
                    self.dirs.root.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Fails, with the end of its log, when a component has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.processes {
            if p.has_exited() {
                bail!("{} exited:\n{}", p.name(), p.log_tail(30));
            }
        }
        Ok(())
    }
}

impl Drop for PodCluster {
    fn drop(&mut self) {
        // The node's components first (nothing restarts a container then), then the control
        // plane; the runtime's shims and containers go with the cluster's cgroups.
        while let Some(process) = self.processes.pop() {
            drop(process);
        }
        host::sweep(self.layout(), Some(&self.dirs.root));
        drop(self.tunables.take());
        self.slot.clear_dir();
    }
}

fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The cluster's certificates and keys, written under one directory.
struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    authority: TestCa,
}

impl Pki {
    fn write(dir: &Path, layout: &Layout) -> anyhow::Result<Pki> {
        let ca = TestCa::new("bootplate-pods-ca");
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).with_context(|| format!("writing {name}"))
        };
        write("ca.crt", &ca.cert_pem)?;
        write("ca.key", &ca.key_pem)?;
        let names = layout.apiserver_names();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let serving = ca.serving_for(&names);
        write("apiserver.crt", &serving.cert_pem)?;
        write("apiserver.key", &serving.key_pem)?;
        let kubelet = ca.client(&format!("system:node:{}", layout.node_name), "system:nodes");
        write("kubelet.crt", &kubelet.cert_pem)?;
        write("kubelet.key", &kubelet.key_pem)?;
        let to_kubelet = ca.client("kube-apiserver-kubelet-client", "system:masters");
        write("apiserver-kubelet-client.crt", &to_kubelet.cert_pem)?;
        write("apiserver-kubelet-client.key", &to_kubelet.key_pem)?;
        // The service-account signing key (ECDSA P-256, ES256 tokens) and its public half.
        let sa = rcgen::KeyPair::generate()?;
        write("sa.key", &sa.serialize_pem())?;
        write("sa.pub", &sa.public_key_pem())?;
        Ok(Pki {
            dir: dir.to_owned(),
            ca: dir.join("ca.crt"),
            authority: ca,
        })
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

fn apiserver_args(layout: &Layout, pki: &Pki, dirs: &Dirs) -> Vec<String> {
    vec![
        "--etcd-servers=http://127.0.0.1:2379".into(),
        "--bind-address=0.0.0.0".into(),
        format!("--secure-port={}", config::APISERVER_PORT),
        format!("--advertise-address={}", layout.node_ip),
        format!("--service-cluster-ip-range={}", layout.service_cidr),
        format!("--tls-cert-file={}", pki.file("apiserver.crt")),
        format!("--tls-private-key-file={}", pki.file("apiserver.key")),
        format!("--client-ca-file={}", pki.file("ca.crt")),
        format!(
            "--kubelet-client-certificate={}",
            pki.file("apiserver-kubelet-client.crt")
        ),
        format!(
            "--kubelet-client-key={}",
            pki.file("apiserver-kubelet-client.key")
        ),
        format!("--service-account-key-file={}", pki.file("sa.pub")),
        format!("--service-account-signing-key-file={}", pki.file("sa.key")),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--token-auth-file={}", dirs.path("tokens.csv").display()),
        // The join tokens bootplate makes for the Machines of a Cluster whose workload cluster
        // is this one (the pod cluster scenarios): the test cloud joins with them.
        "--enable-bootstrap-token-auth=true".into(),
        "--authorization-mode=Node,RBAC".into(),
        // The kubelet by the Node's address: its name resolves nowhere.
        "--kubelet-preferred-address-types=InternalIP".into(),
        "--v=0".into(),
    ]
}

fn controller_manager_args(layout: &Layout, pki: &Pki, kubeconfig: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--service-account-private-key-file={}", pki.file("sa.key")),
        format!("--root-ca-file={}", pki.file("ca.crt")),
        format!("--cluster-signing-cert-file={}", pki.file("ca.crt")),
        format!("--cluster-signing-key-file={}", pki.file("ca.key")),
        "--use-service-account-credentials=true".into(),
        "--allocate-node-cidrs=true".into(),
        format!("--cluster-cidr={}", layout.pod_cidr),
        "--node-cidr-mask-size=24".into(),
        format!("--service-cluster-ip-range={}", layout.service_cidr),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
    ]
}
