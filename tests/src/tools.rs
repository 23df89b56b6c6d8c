//! The real peers the tests run against, built from their Go modules by
//! `tests/scripts/build-tools.sh`: kube-apiserver, kube-controller-manager, kube-scheduler,
//! kube-proxy, kubeadm, the kubelet, kubectl, etcd, the Cluster API manager, clusterctl and the
//! kubeadm bootstrap provider's manager, the manager of the oldest Cluster API release
//! bootplate supports ([`CapiRelease`]), distribution's container registry, crictl and Ignition
//! v0.35.0 (the boot proof's Ignition for spec 2.x configs).
//!
//! A tool's path comes from its `BOOTPLATE_*` variable (the README's test command exports them);
//! otherwise the script runs once per test process and its `NAME=PATH` lines are used (it exits
//! at once when the binaries are cached). A missing tool fails the test with the script's
//! output: integration tests never skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// The tools `build-tools.sh` builds, with the variable that overrides each.
const TOOLS: [(&str, &str); 17] = [
    ("kube-apiserver", "BOOTPLATE_KUBE_APISERVER"),
    (
        "kube-controller-manager",
        "BOOTPLATE_KUBE_CONTROLLER_MANAGER",
    ),
    ("kube-scheduler", "BOOTPLATE_KUBE_SCHEDULER"),
    ("kube-proxy", "BOOTPLATE_KUBE_PROXY"),
    ("kubectl", "BOOTPLATE_KUBECTL"),
    ("kubeadm", "BOOTPLATE_KUBEADM"),
    ("kubelet", "BOOTPLATE_KUBELET"),
    ("etcd", "BOOTPLATE_ETCD"),
    // etcdctl, etcd's own client (tests/tests/control_plane.rs: `etcdctl member list`).
    ("etcdctl", "BOOTPLATE_ETCDCTL"),
    ("capi-manager", "BOOTPLATE_CAPI_MANAGER"),
    ("clusterctl", "BOOTPLATE_CLUSTERCTL"),
    ("cabpk-manager", "BOOTPLATE_CABPK_MANAGER"),
    ("capi-manager-oldest", "BOOTPLATE_CAPI_MANAGER_OLDEST"),
    // distribution's container registry (tests/tests/network.rs).
    ("registry", "BOOTPLATE_REGISTRY"),
    // crictl, the CRI client that pulls through containerd's CRI plugin (tests/tests/network.rs).
    ("crictl", "BOOTPLATE_CRICTL"),
    // Ignition v0.35.0, the boot proof's Ignition for configs of spec 2.x (tests/boot/run.sh).
    ("ignition-spec2", "BOOTPLATE_IGNITION_SPEC2"),
    // cert-manager's static install manifest, rendered from its module's chart.
    ("cert-manager-manifest", "BOOTPLATE_CERT_MANAGER_MANIFEST"),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// The `NAME=PATH` lines of `build-tools.sh`, run at most once per process.
fn built() -> anyhow::Result<&'static BTreeMap<String, PathBuf>> {
    static BUILT: OnceLock<Result<BTreeMap<String, PathBuf>, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let script = repo_root().join("tests/scripts/build-tools.sh");
            let out = Command::new(&script)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} failed:\n{}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(parse_tool_lines(&String::from_utf8_lossy(&out.stdout)))
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Parses `NAME=PATH` lines; other lines are ignored.
fn parse_tool_lines(text: &str) -> BTreeMap<String, PathBuf> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, path)| (name.trim().to_owned(), PathBuf::from(path.trim())))
        .collect()
}

/// The path of tool `name` (one of those `build-tools.sh` builds).
pub fn path(name: &str) -> anyhow::Result<PathBuf> {
    let (_, variable) = TOOLS
        .iter()
        .find(|(tool, _)| *tool == name)
        .with_context(|| format!("{name} is not a tool build-tools.sh builds"))?;
    let path = match std::env::var_os(variable) {
        Some(path) => PathBuf::from(path),
        None => built()?
            .get(name)
            .cloned()
            .with_context(|| format!("build-tools.sh printed no {name}= line"))?,
    };
    if !path.is_file() {
        bail!(
            "{name} not found at {} (from {variable} or tests/scripts/build-tools.sh); \
             run tests/scripts/build-tools.sh (tests/scripts/ci.sh does)",
            path.display()
        );
    }
    Ok(path)
}

/// A Cluster API release the tests run against, each built from its own Go module by
/// `build-tools.sh`: the current one (`tests/tools/capi`, every real-Cluster-API scenario) and
/// the oldest one bootplate supports (`tests/tools/capi-oldest`, scenarios a and b again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapiRelease {
    #[default]
    Current,
    Oldest,
}

impl CapiRelease {
    /// The name of its manager among the tools.
    pub fn manager(self) -> &'static str {
        match self {
            CapiRelease::Current => "capi-manager",
            CapiRelease::Oldest => "capi-manager-oldest",
        }
    }

    /// The tools module (under `tests/tools`) that pins it.
    fn tools_module(self) -> &'static str {
        match self {
            CapiRelease::Current => "capi",
            CapiRelease::Oldest => "capi-oldest",
        }
    }

    /// The directory of its `sigs.k8s.io/cluster-api` module: `BOOTPLATE_CAPI_SOURCE` for the
    /// current release, else asked of `go list` in its tools module.
    pub fn source(self) -> anyhow::Result<PathBuf> {
        static CURRENT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        static OLDEST: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        match self {
            CapiRelease::Current => match std::env::var_os("BOOTPLATE_CAPI_SOURCE") {
                Some(dir) => Ok(PathBuf::from(dir)),
                None => module_dir(&CURRENT, self.tools_module(), "sigs.k8s.io/cluster-api"),
            },
            CapiRelease::Oldest => {
                module_dir(&OLDEST, self.tools_module(), "sigs.k8s.io/cluster-api")
            }
        }
    }

    /// The directory of the manifests its manager ships with (CRDs, RBAC, webhooks):
    /// `core/config` since v1.14, `config` at the module's root before.
    pub fn config_dir(self) -> anyhow::Result<PathBuf> {
        let source = self.source()?;
        let core = source.join("core/config");
        Ok(if core.is_dir() {
            core
        } else {
            source.join("config")
        })
    }
}

/// The version of `release` (`v1.14.2`), read from its module directory's name (`...@v1.14.2`).
pub fn capi_version(release: CapiRelease) -> anyhow::Result<String> {
    let source = release.source()?;
    let name = source.file_name().unwrap_or_default().to_string_lossy();
    let (_, version) = name
        .rsplit_once('@')
        .with_context(|| format!("no version in {}", source.display()))?;
    Ok(version.to_owned())
}

/// The directory of the current Cluster API module the tools were built from (its
/// `core/config` holds the CRDs, RBAC and webhook manifests the manager ships with):
/// [`CapiRelease::source`] of [`CapiRelease::Current`].
pub fn capi_source() -> anyhow::Result<PathBuf> {
    CapiRelease::Current.source()
}

/// The directory of Cluster API's API module (`sigs.k8s.io/cluster-api/api`, a module of its own),
/// in the version the tools were built with: the types, labels and annotations.
pub fn capi_api_source() -> anyhow::Result<PathBuf> {
    static SOURCE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    module_dir(&SOURCE, "capi", "sigs.k8s.io/cluster-api/api")
}

/// `go list -m` of `module` in `tests/tools/<tools_module>`, with the tools' module cache, once.
fn module_dir(
    cell: &'static OnceLock<Result<PathBuf, String>>,
    tools_module: &str,
    module: &str,
) -> anyhow::Result<PathBuf> {
    cell.get_or_init(|| {
        let cache = std::env::var_os("BOOTPLATE_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/bootplate")))
            .ok_or("neither BOOTPLATE_CACHE nor HOME is set")?;
        let out = Command::new("go")
            .args(["list", "-m", "-f", "{{.Dir}}", module])
            .current_dir(repo_root().join("tests/tools").join(tools_module))
            .env("GOMODCACHE", cache.join("go/mod"))
            .env("GOFLAGS", "-mod=readonly")
            .env("GOTOOLCHAIN", "local")
            .output()
            .map_err(|e| format!("cannot run go list: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "go list {module} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
    .map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_lines_are_parsed_by_name() {
        let tools = parse_tool_lines("kube-apiserver=/c/bin/kas\nnoise\netcd=/c/bin/etcd\n");
        assert_eq!(tools["kube-apiserver"], PathBuf::from("/c/bin/kas"));
        assert_eq!(tools["etcd"], PathBuf::from("/c/bin/etcd"));
        assert_eq!(tools.len(), 2);
    }

    /// tests/scripts/source-mtimes.py, which decides what cargo rebuilds in a warm run: a file
    /// whose content the last run had gets that run's time back; a changed one, one whose
    /// content returns after another, and one not clean in the work tree get a newer time.
    #[test]
    fn ci_source_times_return_only_for_content_the_last_run_had() {
        use std::time::{Duration, SystemTime};
        let repo = tempfile::tempdir().unwrap();
        let record = repo.path().join("record.tsv");
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .current_dir(repo.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {out:?}");
        };
        let write = |name: &str, text: &str| std::fs::write(repo.path().join(name), text).unwrap();
        let run = || {
            let script = repo_root().join("tests/scripts/source-mtimes.py");
            let out = std::process::Command::new(script)
                .arg(&record)
                .current_dir(repo.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        };
        let mtime = |name: &str| {
            std::fs::metadata(repo.path().join(name))
                .unwrap()
                .modified()
                .unwrap()
        };
        // A later clone: every file newer than anything built before.
        let recloned = || {
            let later = SystemTime::now() + Duration::from_secs(3600);
            for name in ["kept", "changed"] {
                let file = std::fs::File::options()
                    .write(true)
                    .open(repo.path().join(name))
                    .unwrap();
                file.set_modified(later).unwrap();
            }
        };
        git(&["init", "-q"]);
        write("kept", "same\n");
        write("changed", "first\n");
        git(&["add", "kept", "changed"]);
        git(&["commit", "-qm", "one"]);
        run();
        let (kept, first) = (mtime("kept"), mtime("changed"));

        write("changed", "second\n");
        git(&["commit", "-qam", "two"]);
        recloned();
        let before = SystemTime::now();
        run();
        assert_eq!(mtime("kept"), kept, "an unchanged file lost its time");
        assert!(
            mtime("changed") >= before,
            "a changed file kept an old time"
        );
        assert!(mtime("changed") < before + Duration::from_secs(600));

        write("changed", "first\n");
        git(&["commit", "-qam", "three"]);
        let before = SystemTime::now();
        run();
        assert_ne!(
            mtime("changed"),
            first,
            "content that came back got its first time"
        );
        assert!(mtime("changed") >= before);

        write("kept", "edited, not committed\n");
        let before = SystemTime::now();
        run();
        assert!(mtime("kept") >= before, "a file not clean kept an old time");
    }
}
