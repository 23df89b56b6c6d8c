//! Container images without a registry: the OCI image archives `tests/scripts/build-images.sh`
//! builds (pause, bootplate, Cluster API's manager, cert-manager's three, the control plane
//! kubeadm runs: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
//! CoreDNS), and a throw-away
//! containerd (the host's, from Debian) that imports them and runs them with runc.
//!
//! An archive's path comes from the script's `NAME=ARCHIVE` lines (it exits at once when the
//! archives are cached by their inputs' digest). A missing tool fails the test with the script's
//! output: integration tests never skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::capi::Process;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// Builds (or finds cached) the images `names` and returns each one's archive.
pub fn archives(names: &[&str]) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    archives_in(None, names)
}

/// The images kubeadm names (`kubeadm config images list`) for its `imageRepository`: what
/// `kubeadm init` runs as static Pods and add-ons, and the sandbox.
pub const KUBEADM_IMAGES: [&str; 7] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "coredns",
    "pause",
    "etcd",
];

/// As [`archives`], the images kubeadm names named in `repository` (kubeadm's
/// `--image-repository`; `None`: its default, registry.k8s.io).
pub fn archives_in(
    repository: Option<&str>,
    names: &[&str],
) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let script = repo_root().join("tests/scripts/build-images.sh");
    let mut command = Command::new(&script);
    if let Some(repository) = repository {
        command.args(["--image-repository", repository]);
    }
    let out = command
        .args(names)
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let built: BTreeMap<String, PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, path)| (name.to_owned(), PathBuf::from(path)))
        .collect();
    if let Some(missing) = names.iter().find(|name| !built.contains_key(**name)) {
        bail!("{} printed no {missing}= line", script.display());
    }
    Ok(built)
}

/// The archive of image `name` (see [`archives`]).
pub fn archive(name: &str) -> anyhow::Result<PathBuf> {
    let mut built = archives(&[name])?;
    Ok(built.remove(name).expect("archives checks every name"))
}

/// A containerd of its own (root, state and socket in a temporary directory, no CRI plugin),
/// stopped on drop. Containers it runs use the host's runc and overlayfs.
pub struct Containerd {
    process: Process,
    dir: tempfile::TempDir,
}

/// The namespace every image and container of a [`Containerd`] lives in (the kubelet's).
pub const NAMESPACE: &str = "k8s.io";

impl Containerd {
    /// Starts containerd and waits until it answers.
    pub fn start() -> anyhow::Result<Containerd> {
        let dir = tempfile::Builder::new().prefix("ctrd").tempdir()?;
        let config = dir.path().join("config.toml");
        std::fs::write(&config, config_toml(dir.path()))?;
        let process = Process::spawn(
            "containerd",
            Command::new("containerd").arg("--config").arg(&config),
            &dir.path().join("containerd.log"),
        )?;
        let containerd = Containerd { process, dir };
        containerd.wait_until_serving()?;
        Ok(containerd)
    }

    fn wait_until_serving(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.ctr(&["version"]) {
                Ok(out) if out.status.success() => return Ok(()),
                _ if Instant::now() > deadline => bail!(
                    "containerd did not answer within 20 s:\n{}",
                    self.process.log_tail(20)
                ),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The socket its clients (ctr, a kubelet) connect to.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// A `ctr` command against this containerd, in [`NAMESPACE`] (to spawn, e.g. a foreground
    /// `ctr run`, which exits with its task's exit code).
    pub fn ctr_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ctr");
        command
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", NAMESPACE])
            .args(args);
        command
    }

    /// Runs `ctr` against this containerd, in [`NAMESPACE`].
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.ctr_command(args).output().context("running ctr")
    }

    /// Runs `ctr`, failing with its output unless it exits 0; returns its stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.ctr(args)?;
        if !out.status.success() {
            bail!(
                "ctr {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Imports an OCI image archive as `ctr images import` does for a user; prints nothing of
    /// use, the image is then known by the name in the archive.
    pub fn import(&self, archive: &Path) -> anyhow::Result<()> {
        self.ctr_ok(&["images", "import", &archive.to_string_lossy()])
            .map(drop)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Containers run with --rm are gone; stop the daemon, then drop what it mounted.
        let _ = self.process.terminate();
        let root = self.dir.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        for target in mounts
            .lines()
            .filter_map(|line| line.split(' ').nth(1))
            .filter(|target| target.starts_with(&root))
        {
            let _ = Command::new("umount").args(["-l", target]).status();
        }
    }
}

/// containerd's configuration: everything under `dir`, and no CRI plugin (nothing here is a
/// kubelet; it would only add seconds of start-up).
fn config_toml(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "version = 2\n\
         root = \"{dir}/root\"\n\
         state = \"{dir}/state\"\n\
         disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
         [grpc]\n  address = \"{dir}/containerd.sock\"\n"
    )
}
