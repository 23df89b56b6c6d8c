//! bootplate as a clusterctl user declares it: a local provider repository laid out as clusterctl
//! reads one (`<base>/bootstrap-bootplate/<version>/bootstrap-components.yaml` and
//! `metadata.yaml`), a `clusterctl.yaml` whose `providers:` entry points at it, and the real
//! clusterctl (`tests/scripts/build-tools.sh`) run with that configuration only.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::Context;

use crate::tools;

/// clusterctl's label of the provider: its type and name (`Provider.ManifestLabel()`), the
/// directory of its local repository.
pub const PROVIDER_LABEL: &str = "bootstrap-bootplate";

/// A clusterctl configuration in a directory of its own, which is also clusterctl's home (so it
/// reads no user's configuration and writes nowhere else).
pub struct ClusterctlConfig {
    dir: PathBuf,
}

impl ClusterctlConfig {
    /// Writes `clusterctl.yaml` into `dir`: the provider `bootplate` at `components` (a file in
    /// a local repository) and the given extra YAML (e.g. an `images:` section).
    pub fn write(dir: &Path, components: &Path, extra: &str) -> anyhow::Result<ClusterctlConfig> {
        let config = format!(
            "providers:\n- name: bootplate\n  type: BootstrapProvider\n  url: {}\n{extra}",
            components.display()
        );
        std::fs::write(dir.join("clusterctl.yaml"), config)?;
        Ok(ClusterctlConfig {
            dir: dir.to_owned(),
        })
    }

    /// Runs the real clusterctl with this configuration (no version check: nothing here reaches
    /// the internet).
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        Command::new(tools::path("clusterctl")?)
            .args(args)
            .arg("--config")
            .arg(self.dir.join("clusterctl.yaml"))
            .env("HOME", &self.dir)
            .env("XDG_CONFIG_HOME", self.dir.join(".config"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .output()
            .context("running clusterctl")
    }
}

/// Lays out a local repository under `base` for `version` from the two files a release
/// publishes; returns the components' path in it.
pub fn local_repository(
    base: &Path,
    version: &str,
    components: &Path,
    metadata: &Path,
) -> anyhow::Result<PathBuf> {
    let dir = base.join(PROVIDER_LABEL).join(version);
    std::fs::create_dir_all(&dir)?;
    let target = dir.join("bootstrap-components.yaml");
    std::fs::copy(components, &target)
        .with_context(|| format!("copying {}", components.display()))?;
    std::fs::copy(metadata, dir.join("metadata.yaml"))
        .with_context(|| format!("copying {}", metadata.display()))?;
    Ok(target)
}
