//! The real peers the tests run against, built from their Go modules by
//! `tests/scripts/build-tools.sh`: kube-apiserver, kube-controller-manager, kube-scheduler,
//! kube-proxy, kubeadm, the kubelet, kubectl, etcd, the Cluster API manager, clusterctl and the
//! kubeadm bootstrap provider's manager.
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
const TOOLS: [(&str, &str); 11] = [
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
    ("capi-manager", "BOOTPLATE_CAPI_MANAGER"),
    ("clusterctl", "BOOTPLATE_CLUSTERCTL"),
    ("cabpk-manager", "BOOTPLATE_CABPK_MANAGER"),
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

/// The directory of the Cluster API module the tools were built from (its `core/config` holds
/// the CRDs, RBAC and webhook manifests the manager ships with): `BOOTPLATE_CAPI_SOURCE`, or
/// asked of `go list` in `tests/tools/capi`.
pub fn capi_source() -> anyhow::Result<PathBuf> {
    static SOURCE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    if let Some(dir) = std::env::var_os("BOOTPLATE_CAPI_SOURCE") {
        return Ok(PathBuf::from(dir));
    }
    module_dir(&SOURCE, "sigs.k8s.io/cluster-api")
}

/// The directory of Cluster API's API module (`sigs.k8s.io/cluster-api/api`, a module of its own),
/// in the version the tools were built with: the types, labels and annotations.
pub fn capi_api_source() -> anyhow::Result<PathBuf> {
    static SOURCE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    module_dir(&SOURCE, "sigs.k8s.io/cluster-api/api")
}

/// `go list -m` of `module` in `tests/tools/capi`, with the tools' module cache, once.
fn module_dir(
    cell: &'static OnceLock<Result<PathBuf, String>>,
    module: &str,
) -> anyhow::Result<PathBuf> {
    cell.get_or_init(|| {
        let cache = std::env::var_os("BOOTPLATE_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/bootplate")))
            .ok_or("neither BOOTPLATE_CACHE nor HOME is set")?;
        let out = Command::new("go")
            .args(["list", "-m", "-f", "{{.Dir}}", module])
            .current_dir(repo_root().join("tests/tools/capi"))
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
}
