//! `scripts/release.sh` as a release manager runs it, and its output as a platform team reads it:
//! the image archive, the digest the components pin, and the clusterctl local repository
//! (`bootstrap-bootplate/VERSION/`). The release tier checks the output; the pod cluster's
//! `clusterctl init` installs bootplate from it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, bail};

use crate::clusterctl_repo::PROVIDER_LABEL;

/// The workspace's version as a release names it (`v0.1.0`).
pub fn version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

/// Runs `scripts/release.sh VERSION OUT` (with the cargo that builds the tests).
pub fn run(version: &str, out: &Path) -> anyhow::Result<Output> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/release.sh");
    Command::new(script)
        .arg(version)
        .arg(out)
        .env("CARGO", env!("CARGO"))
        .output()
        .context("running scripts/release.sh")
}

/// A release of the workspace's version, written into a directory.
#[derive(Clone, Debug)]
pub struct Release {
    pub out: PathBuf,
    pub version: String,
}

impl Release {
    /// Writes the workspace's release into `out` (emptied first).
    pub fn make(out: &Path) -> anyhow::Result<Release> {
        let _ = std::fs::remove_dir_all(out);
        let version = version();
        let made = run(&version, out)?;
        if !made.status.success() {
            bail!(
                "scripts/release.sh failed: {}",
                String::from_utf8_lossy(&made.stderr)
            );
        }
        Ok(Release {
            out: out.to_owned(),
            version,
        })
    }

    /// The image archive (`ghcr.io/bootplate/bootplate:VERSION` inside).
    pub fn archive(&self) -> PathBuf {
        let name = format!("bootplate-image-{}.oci.tar", self.version);
        self.out.join(name)
    }

    /// The manifest digest the release publishes for its image (`sha256:...`).
    pub fn digest(&self) -> anyhow::Result<String> {
        let path = self
            .out
            .join(format!("bootplate-image-{}.digest", self.version));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(text.trim().to_owned())
    }

    /// The clusterctl local repository's directory of this version.
    pub fn repository(&self) -> PathBuf {
        self.out.join(PROVIDER_LABEL).join(&self.version)
    }

    /// The clusterctl components, the image pinned by digest.
    pub fn components(&self) -> PathBuf {
        self.repository().join("bootstrap-components.yaml")
    }
}
