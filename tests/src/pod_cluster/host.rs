//! What a cluster changes on the host, made and taken back: the slot lock, the network
//! namespace with its veth pair and routes, the cgroup the kubelet's pods and the runtime live
//! in, the mounts under the cluster's directory, and the kernel settings the kubelet sets.
//!
//! Everything is named after the slot ([`Layout`]), and a slot is held by an exclusive lock on
//! `/run/lock/bootplate-pod-cluster-N.lock`, which the kernel releases when the holder dies: a
//! slot taken is first swept of what a killed holder left behind.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::config::{Layout, PEER_RANGES, SLOTS};

/// Runs `program args`, failing with its output.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How long [`Slot::take`] waits for a slot when all are held: longer than any tier holds one.
const SLOT_WAIT: Duration = Duration::from_secs(20 * 60);

/// A held slot: its lock file stays locked while this lives, and holds the path of the
/// cluster's directory, so that whoever takes the slot after a holder that died can sweep it.
pub struct Slot {
    pub layout: Layout,
    lock: File,
}

impl Slot {
    /// The first free slot, swept of any leftovers of a holder that died. When every slot is
    /// held (tiers run side by side, each holding some), waits for one to be released, up to
    /// [`SLOT_WAIT`].
    pub fn take() -> anyhow::Result<Slot> {
        let deadline = Instant::now() + SLOT_WAIT;
        loop {
            if let Some(slot) = Self::try_take()? {
                return Ok(slot);
            }
            if Instant::now() > deadline {
                bail!(
                    "all {SLOTS} pod-cluster slots stayed taken on this machine for {} s",
                    SLOT_WAIT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The first free slot, or `None` when all are held.
    fn try_take() -> anyhow::Result<Option<Slot>> {
        for n in 0..SLOTS {
            let mut file = open_lock(&slot_lock(n))?;
            if file.try_lock().is_ok() {
                let layout = Layout::new(n);
                let previous = read_recorded_dir(&mut file);
                sweep(&layout, previous.as_deref());
                if let Some(dir) = previous {
                    let _ = std::fs::remove_dir_all(dir);
                }
                file.set_len(0)?;
                return Ok(Some(Slot { layout, lock: file }));
            }
        }
        Ok(None)
    }

    /// Waits for slot `n`'s lock and holds it without sweeping the slot: while it lives, no one
    /// else makes anything of that slot, so a check that a dropped holder left nothing behind
    /// cannot see the next holder's namespace instead.
    pub fn hold(n: u8) -> anyhow::Result<File> {
        let path = slot_lock(n);
        let file = open_lock(&path)?;
        file.lock().with_context(|| format!("locking {path}"))?;
        Ok(file)
    }

    /// Records the cluster's directory in the lock file.
    pub fn record_dir(&mut self, dir: &Path) -> anyhow::Result<()> {
        use std::io::{Seek, Write};
        self.lock.set_len(0)?;
        self.lock.rewind()?;
        self.lock
            .write_all(dir.as_os_str().as_encoded_bytes())
            .context("recording the cluster's directory")
    }

    /// Forgets the directory (it was swept).
    pub fn clear_dir(&mut self) {
        let _ = self.lock.set_len(0);
    }
}

/// The directory a previous holder recorded: only a pod cluster's own (a name this module
/// gives), never any other path a stale or foreign file may hold.
fn read_recorded_dir(file: &mut File) -> Option<PathBuf> {
    use std::io::Read;
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text).ok()?;
    let dir = PathBuf::from(text.trim());
    let name = dir.file_name()?.to_str()?;
    (dir.is_absolute() && name.starts_with("bootplate-pods-") && !text.contains(".."))
        .then_some(dir)
}

/// The network namespace of a cluster: `lo` up, forwarding on, a veth pair to the host with the
/// node's address inside and the host's outside, and host routes to the pod and Service CIDRs
/// through the node (so the tests reach pods and Services from the host, as a node would). The
/// namespace has no default route (nothing in the cluster reaches past the host), only one to
/// the Service CIDR and ones to the other slots' links and pods ([`PEER_RANGES`]) through the
/// host, which forwards what arrives on its veth end (that interface only: the host's own
/// `ip_forward` stays as it is).
pub fn make_network(layout: &Layout) -> anyhow::Result<()> {
    let ns = layout.netns.as_str();
    run("ip", &["netns", "add", ns])?;
    run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
    run(
        "ip",
        &[
            "link",
            "add",
            &layout.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            &layout.node_veth,
            "netns",
            ns,
        ],
    )?;
    let host_addr = format!("{}/30", layout.host_ip);
    let node_addr = format!("{}/30", layout.node_ip);
    run("ip", &["addr", "add", &host_addr, "dev", &layout.host_veth])?;
    run("ip", &["link", "set", &layout.host_veth, "up"])?;
    run(
        "ip",
        &[
            "-n",
            ns,
            "addr",
            "add",
            &node_addr,
            "dev",
            &layout.node_veth,
        ],
    )?;
    run("ip", &["-n", ns, "link", "set", &layout.node_veth, "up"])?;
    let node_ip = layout.node_ip.to_string();
    for cidr in [&layout.pod_cidr, &layout.service_cidr] {
        run("ip", &["route", "add", cidr, "via", &node_ip])?;
    }
    // The node's own clients of Services (the apiserver calling a webhook) need a route to the
    // Service CIDR before kube-proxy's rules rewrite the address: through the veth, as a node's
    // default route would take it (nothing answers there for a Service without endpoints).
    run(
        "ip",
        &[
            "-n",
            ns,
            "route",
            "add",
            &layout.service_cidr,
            "dev",
            &layout.node_veth,
        ],
    )?;
    let host_ip = layout.host_ip.to_string();
    for range in PEER_RANGES {
        run("ip", &["-n", ns, "route", "add", range, "via", &host_ip])?;
    }
    let forwarding = format!("net.ipv4.conf.{}.forwarding=1", layout.host_veth);
    run("sysctl", &["-qw", &forwarding])?;
    in_netns(layout, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    Ok(())
}

/// Runs a command inside the cluster's network namespace (and only that namespace: the mount
/// namespace, with the cgroup hierarchies, stays the host's).
pub fn in_netns(layout: &Layout, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let net = format!("--net=/run/netns/{}", layout.netns);
    let mut all = vec![net.as_str(), "--", program];
    all.extend_from_slice(args);
    run("nsenter", &all)
}

/// The cgroup hierarchies mounted under `/sys/fs/cgroup` (one per v1 controller set, and the
/// v2 one), read from the mount table.
pub fn hierarchies() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut out: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (point, kind) = (fields.get(1)?, fields.get(2)?);
            (point.starts_with("/sys/fs/cgroup") && (*kind == "cgroup" || *kind == "cgroup2"))
                .then(|| PathBuf::from(point))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Creates the cluster's cgroup in every hierarchy (the kubelet's `cgroupRoot` must exist);
/// a new cpuset cgroup gets its parent's CPUs and memory nodes, or nothing can join it.
pub fn make_cgroups(layout: &Layout) -> anyhow::Result<()> {
    for h in hierarchies() {
        let dir = h.join(&layout.cgroup);
        std::fs::create_dir_all(dir.join("runtime"))
            .with_context(|| format!("creating {}", dir.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(h.join(file)) {
                for d in [dir.clone(), dir.join("runtime")] {
                    std::fs::write(d.join(file), value.trim())
                        .with_context(|| format!("writing {}", d.join(file).display()))?;
                }
            }
        }
    }
    Ok(())
}

/// Moves process `pid` (a component of the cluster) into the cluster's `runtime` cgroup in every
/// hierarchy, so that it, and the runtime's shims, are found and ended with the cluster.
pub fn join_cgroups(layout: &Layout, pid: u32) -> anyhow::Result<()> {
    for h in hierarchies() {
        let procs = h.join(&layout.cgroup).join("runtime/cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("writing {}", procs.display()))?;
    }
    Ok(())
}

/// The cgroup directories of the cluster in every hierarchy, deepest first.
fn cgroup_dirs(layout: &Layout) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(dir.to_owned());
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        let root = h.join(&layout.cgroup);
        if root.is_dir() {
            walk(&root, &mut out);
        }
    }
    out
}

/// SIGKILLs every process in the cluster's cgroups (the runtime, its shims, every container)
/// until none is left, then removes the cgroups.
fn end_cgroups(layout: &Layout) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<String> = cgroup_dirs(layout)
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| s.lines().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        let _ = Command::new("kill").arg("-9").args(&pids).output();
        std::thread::sleep(Duration::from_millis(100));
    }
    for dir in cgroup_dirs(layout) {
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Unmounts (lazily, deepest first) everything mounted under `dir`: pod volumes, container
/// root filesystems, pod network namespaces.
fn unmount_under(dir: &Path) {
    let prefix = format!("{}/", dir.display());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").args(["-l", &p]).output();
    }
}

/// Removes the kubelet's links in `/var/log/containers` (a fixed host path) that point into
/// `logs`, the cluster's pod log directory.
fn remove_log_links(logs: &Path) {
    let Ok(entries) = std::fs::read_dir("/var/log/containers") else {
        return;
    };
    for e in entries.flatten() {
        if std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(logs)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The host path where containerd 1.6 puts the socket of the shim of task `id` in `namespace`
/// for the containerd at `address`: a fixed directory, whatever the configured state directory
/// (a shim killed with its cluster leaves it behind).
pub fn shim_socket(address: &Path, namespace: &str, id: &str) -> PathBuf {
    use sha2::Digest as _;
    let key = address.join(namespace).join(id);
    let digest = sha2::Sha256::digest(key.as_os_str().as_encoded_bytes());
    Path::new("/run/containerd/s").join(hex::encode(digest))
}

/// What the runtime leaves in fixed host directories for each task the cluster's containerd
/// (under `dir`) ran, found or not: the shim's socket, and the CNI plugins' cached results
/// (libcni keeps them in `/var/lib/cni/results`, named by network, sandbox and interface).
pub fn runtime_leftovers(dir: &Path) -> Vec<PathBuf> {
    let address = dir.join("containerd/containerd.sock");
    let tasks = dir.join("containerd/state/io.containerd.runtime.v2.task/k8s.io");
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return Vec::new();
    };
    let results = Path::new("/var/lib/cni/results");
    entries
        .flatten()
        .flat_map(|e| {
            let id = e.file_name().to_string_lossy().into_owned();
            [
                shim_socket(&address, "k8s.io", &id),
                results.join(format!("{}-{id}-eth0", super::config::NETWORK)),
                results.join(format!("cni-loopback-{id}-lo")),
            ]
        })
        .collect()
}

/// Takes back what a cluster of `layout` made: its processes (through its cgroups), mounts
/// and runtime leftovers of `dir` (when known: shim sockets, cached CNI results), the network namespace (and with it the veth pair, the pod bridge,
/// kube-proxy's nftables tables and the host routes through the veth) and the cgroups.
pub fn sweep(layout: &Layout, dir: Option<&Path>) {
    end_cgroups(layout);
    if let Some(dir) = dir {
        unmount_under(dir);
        for leftover in runtime_leftovers(dir) {
            let _ = std::fs::remove_file(leftover);
        }
        remove_log_links(&dir.join("pod-logs"));
    }
    let _ = Command::new("ip")
        .args(["netns", "delete", &layout.netns])
        .output();
    let _ = Command::new("ip")
        .args(["link", "delete", &layout.host_veth])
        .output();
}

/// The kernel settings the kubelet sets at start (`protectKernelDefaults: false`), in the order
/// `tests/boot/run.sh` saves them: pod clusters and the boot proof's real runs (other tiers,
/// running beside this one) save and restore them together.
const TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
const TUNABLES_LOCK: &str = "/run/lock/bootplate-tunables.lock";
const TUNABLES_STATE_LOCK: &str = "/run/lock/bootplate-tunables.lock.state";
const TUNABLES_SAVED: &str = "/run/lock/bootplate-tunables.saved";

/// A holder of the kernel settings, run.sh's protocol across processes: every holder has
/// [`TUNABLES_LOCK`] shared; the first saves the settings (one value a line) when none are
/// saved, and on drop the last holder (whose shared lock becomes exclusive) puts them back.
pub struct Tunables {
    lock: File,
}

/// The lock file of slot `n`.
fn slot_lock(n: u8) -> String {
    format!("/run/lock/bootplate-pod-cluster-{n}.lock")
}

/// Opens (creating) a lock file under `/run/lock`.
fn open_lock(path: &str) -> anyhow::Result<File> {
    crate::lock_file::open(std::path::Path::new(path))
}

impl Tunables {
    /// Holds the settings, saving them if no holder has.
    pub fn hold() -> anyhow::Result<Tunables> {
        let lock = open_lock(TUNABLES_LOCK)?;
        lock.lock_shared()
            .with_context(|| format!("locking {TUNABLES_LOCK}"))?;
        let state = open_lock(TUNABLES_STATE_LOCK)?;
        state.lock()?;
        let saved = std::fs::metadata(TUNABLES_SAVED).is_ok_and(|m| m.len() > 0);
        if !saved {
            let values: Vec<String> = TUNABLES
                .iter()
                .map(|t| std::fs::read_to_string(format!("/proc/sys/{t}")))
                .collect::<Result<_, _>>()
                .context("reading the kernel settings the kubelet sets")?;
            let fresh = format!("{TUNABLES_SAVED}.{}", std::process::id());
            std::fs::write(&fresh, values.concat())?;
            std::fs::rename(&fresh, TUNABLES_SAVED)?;
        }
        Ok(Tunables { lock })
    }
}

impl Drop for Tunables {
    fn drop(&mut self) {
        let Ok(state) = open_lock(TUNABLES_STATE_LOCK) else {
            return;
        };
        if state.lock().is_err() || self.lock.try_lock().is_err() {
            return;
        }
        let Ok(saved) = std::fs::read_to_string(TUNABLES_SAVED) else {
            return;
        };
        for (t, value) in TUNABLES.iter().zip(saved.lines()) {
            let _ = std::fs::write(format!("/proc/sys/{t}"), value);
        }
        let _ = std::fs::remove_file(TUNABLES_SAVED);
    }
}
