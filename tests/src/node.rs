//! A node of a whole control plane: one Machine's host, running its rendered user-data with
//! real cloud-init, the real kubeadm and kubelet, and containerd, held running for the test.
//!
//! It is the boot proof's real mode (`tests/boot/run.sh --real-kube`: a fresh overlay of the
//! cached Debian root, the user-data through real cloud-init, services started as processes)
//! with three additions (`--netns`, `--image`, `--hold`): the machine has its own network
//! namespace and address, taken as a pod-cluster slot is ([`host::Slot`],
//! [`host::make_network`]), with a default route through the host (kubeadm picks its advertise
//! address from it); the control-plane images are in its containerd before the user-data runs,
//! as on a pre-baked image; and it keeps running after its check until dropped.
//!
//! Nodes run side by side: each has its slot's cgroup as the root of its own cgroup namespace
//! (run.sh `--cgroup`: its kubelet's `kubepods` is under it on the host, [`Node::cgroup_root`]),
//! its own root and so its own `/var/lib/kubelet`, `/var/lib/containerd`, `/etc/kubernetes` and
//! `/run`. The user-data is what any machine gets: nothing in it is about the sandbox's cgroups.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::pod_cluster::host::{self, Slot};
use crate::{joins, tools};

/// How long a node's user-data may take (the run's own limit is a little longer).
const BOOT_TIMEOUT: Duration = Duration::from_secs(420);

/// What one node runs: its rendered user-data and how the boot proof labels it.
pub struct NodeSpec<'a> {
    /// The run's name (its directory under [`joins::runs_dir`]).
    pub name: &'a str,
    pub user_data: &'a [u8],
    /// The Machine's role (`init`, `control-plane-join`, `worker`).
    pub role: &'a str,
    pub version: &'a str,
    /// The template's `spec.os.name`.
    pub os: &'a str,
    /// OCI archives in the node's containerd before the user-data runs.
    pub images: &'a [PathBuf],
    /// The node's pod network (run.sh `--cni-subnet`), when it has one.
    pub cni_subnet: Option<&'a str>,
}

/// A running node; released, its processes ended and its namespace removed, on drop.
pub struct Node {
    slot: Slot,
    /// run.sh, once booted.
    run: Option<Child>,
    dir: PathBuf,
}

impl Node {
    /// Takes a slot for the node and makes its network (its address is then known, for the
    /// render); [`Node::boot`] runs it.
    pub fn new() -> anyhow::Result<Node> {
        let slot = Slot::take()?;
        let layout = &slot.layout;
        host::make_network(layout)?;
        host::make_cgroups(layout)?;
        let via = layout.host_ip.to_string();
        host::run(
            "ip",
            &["-n", &layout.netns, "route", "add", "default", "via", &via],
        )?;
        Ok(Node {
            slot,
            run: None,
            dir: PathBuf::new(),
        })
    }

    /// Runs `spec` on the node and waits until its user-data ran and its check is done (the
    /// report is then [`Node::report`]); fails with the boot proof's output when the run ends
    /// before.
    pub fn boot(&mut self, spec: &NodeSpec) -> anyhow::Result<()> {
        self.dir = joins::runs_dir().join(spec.name);
        // A previous run's `holding` must not pass for this one's.
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .with_context(|| format!("removing {}", self.dir.display()))?;
        }
        let input = joins::runs_dir().join(format!("{}.user-data", spec.name));
        std::fs::create_dir_all(joins::runs_dir())?;
        std::fs::write(&input, spec.user_data)?;
        let mut command = Command::new(repo_root().join("tests/boot/run.sh"));
        command
            .arg("--user-data")
            .arg(&input)
            .arg("--out")
            .arg(&self.dir)
            .args(["--label", spec.name, "--role", spec.role])
            .args(["--kubernetes-version", spec.version, "--os", spec.os])
            .arg("--real-kube")
            .arg(joins::real_kube_dir()?)
            .args(["--netns", &self.slot.layout.netns, "--hold"])
            .args(["--cgroup", &self.slot.layout.cgroup])
            .env(
                "BOOTPLATE_BOOT_TIMEOUT",
                (BOOT_TIMEOUT.as_secs() + 120).to_string(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Its own process group: dropping the node ends run.sh and what it started.
            .process_group(0);
        if let Some(subnet) = spec.cni_subnet {
            command.args(["--cni-subnet", subnet]);
        }
        for image in spec.images {
            command.arg("--image").arg(image);
        }
        self.run = Some(command.spawn().context("running tests/boot/run.sh")?);
        self.wait_until_holding()
    }

    fn wait_until_holding(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let dir = self.dir.clone();
        let run = self.run.as_mut().expect("booted");
        while !dir.join("holding").exists() {
            if let Some(status) = run.try_wait()? {
                let mut stderr = String::new();
                if let Some(mut pipe) = run.stderr.take() {
                    use std::io::Read;
                    let _ = pipe.read_to_string(&mut stderr);
                }
                bail!(
                    "the node's run ended ({status}) before its check; see {}:\n{stderr}\n{}",
                    dir.display(),
                    kubeadm_log(&dir)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the node's user-data did not finish within {} s; see {}\n{}",
                    BOOT_TIMEOUT.as_secs(),
                    dir.display(),
                    kubeadm_log(&dir)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(())
    }

    /// The node's address on its network (its kubelet's and apiserver's).
    pub fn address(&self) -> Ipv4Addr {
        self.slot.layout.node_ip
    }

    /// The host cgroup that is the root of the node's cgroup namespace (everything the node
    /// runs is in it, and found and ended there on drop, even after this process was killed).
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.slot.layout.cgroup)
    }

    /// Whether the node's kubelet keeps its pods under the node's cgroup root (`kubepods`
    /// there, in the hierarchies it uses), not the host's.
    pub fn pods_in_own_cgroup(&self) -> bool {
        host::hierarchies()
            .iter()
            .any(|h| h.join(&self.slot.layout.cgroup).join("kubepods").is_dir())
    }

    /// The boot proof's report of the run (tests/boot/lib/check.py).
    pub fn report(&self) -> anyhow::Result<Value> {
        let path = self.dir.join("report.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// The real kubeadm's output.
    pub fn kubeadm_log(&self) -> String {
        kubeadm_log(&self.dir)
    }

    /// The run's directory (logs; `etc-kubernetes`, the node's /etc/kubernetes when it held).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The built kubectl with the node's `/etc/kubernetes/admin.conf` (written by `kubeadm
    /// init`), as an operator on that machine runs it.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<Output> {
        let admin = self.dir.join("etc-kubernetes/admin.conf");
        if !admin.is_file() {
            bail!("the node has no admin.conf ({})", admin.display());
        }
        Ok(Command::new(tools::path("kubectl")?)
            .arg("--kubeconfig")
            .arg(admin)
            .args(args)
            .output()?)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(run) = self.run.as_mut() {
            let _ = std::fs::write(self.dir.join("release"), "");
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline && matches!(run.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(200));
            }
            if let Ok(None) = run.try_wait() {
                let group = format!("-{}", run.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).output();
                let _ = run.wait();
            }
        }
        host::sweep(&self.slot.layout, None);
    }
}

/// The real kubeadm's output in run directory `dir`.
fn kubeadm_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("run/bootplate/kubeadm.log")).unwrap_or_default()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}
