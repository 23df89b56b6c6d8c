//! What a platform team writes to install providers that are not in clusterctl's built-in list,
//! or that it mirrors: local repositories laid out as clusterctl reads them
//! (`{base}/{type-prefix}{name}/{version}/{components file}` beside `metadata.yaml`), and a
//! clusterctl configuration whose `providers:` point at them and whose `images:` name the
//! images the cluster holds. clusterctl runs with its own configuration home (nothing of the
//! machine's `~/.config/cluster-api`) and no version check (no network).
//!
//! Cluster API's components are built from its module the way its release builds them
//! (`kubectl kustomize core/config/default`, then the release's pull policy, `IfNotPresent`);
//! bootplate's are a release's output read in place ([`released`]), or `deploy/`'s as shipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, bail};

use crate::tools;

/// One provider in a local repository.
pub struct Provider {
    /// clusterctl's name for it (`cluster-api`, `bootplate`).
    pub name: String,
    /// clusterctl's provider type (`CoreProvider`, `BootstrapProvider`).
    pub kind: &'static str,
    pub version: String,
    /// The components file's name (`core-components.yaml`, `bootstrap-components.yaml`).
    pub components_file: &'static str,
    pub components: String,
    pub metadata: String,
    /// A components file already laid out in a local repository (a release's output): the
    /// configuration points at it and nothing is copied (`components` and `metadata` unused).
    pub published: Option<PathBuf>,
}

impl Provider {
    /// The directory clusterctl wants: the provider's label, which prefixes the type's short
    /// name to every provider but the core one.
    fn label(&self) -> String {
        let prefix = match self.kind {
            "CoreProvider" => "",
            "BootstrapProvider" => "bootstrap-",
            "ControlPlaneProvider" => "control-plane-",
            "InfrastructureProvider" => "infrastructure-",
            _ => "",
        };
        format!("{prefix}{}", self.name)
    }
}

/// An image override of clusterctl's `images:` (by provider label, or `all`).
pub struct ImageOverride {
    pub component: String,
    pub repository: String,
    pub tag: String,
}

/// A written set of local repositories and the clusterctl configuration naming them.
pub struct Repositories {
    pub root: PathBuf,
    pub config: PathBuf,
}

/// cert-manager as clusterctl installs it: its static install manifest, at a version.
pub struct CertManager {
    pub manifest: PathBuf,
    pub version: String,
}

/// Writes `providers` under `root` and a configuration that points at them, with `images`, and
/// with `cert_manager` as the cert-manager clusterctl installs.
pub fn write(
    root: &Path,
    providers: &[Provider],
    images: &[ImageOverride],
    cert_manager: Option<&CertManager>,
) -> anyhow::Result<Repositories> {
    let mut config = String::from("providers:\n");
    for p in providers {
        let components = match &p.published {
            Some(published) => published.clone(),
            None => lay_out(root, p)?,
        };
        config.push_str(&format!(
            "- name: {}\n  type: {}\n  url: file://{}\n",
            p.name,
            p.kind,
            components.display()
        ));
    }
    if !images.is_empty() {
        config.push_str("images:\n");
        for i in images {
            config.push_str(&format!(
                "  {}:\n    repository: {}\n    tag: {}\n",
                i.component, i.repository, i.tag
            ));
        }
    }
    if let Some(cm) = cert_manager {
        // A local cert-manager URL obeys the providers' layout too: {base}/cert-manager/{version}/.
        let dir = root.join("repository/cert-manager").join(&cm.version);
        std::fs::create_dir_all(&dir)?;
        let manifest = dir.join("cert-manager.yaml");
        std::fs::copy(&cm.manifest, &manifest)
            .with_context(|| format!("copying {}", cm.manifest.display()))?;
        config.push_str(&format!(
            "cert-manager:\n  url: file://{}\n  version: {}\n",
            manifest.display(),
            cm.version
        ));
    }
    let path = root.join("clusterctl.yaml");
    std::fs::write(&path, config)?;
    Ok(Repositories {
        root: root.to_owned(),
        config: path,
    })
}

/// Writes `provider`'s components and metadata under `root` as clusterctl reads a local
/// repository; returns the components' path.
fn lay_out(root: &Path, provider: &Provider) -> anyhow::Result<PathBuf> {
    let dir = root
        .join("repository")
        .join(provider.label())
        .join(&provider.version);
    std::fs::create_dir_all(&dir)?;
    let components = dir.join(provider.components_file);
    std::fs::write(&components, &provider.components)?;
    std::fs::write(dir.join("metadata.yaml"), &provider.metadata)?;
    Ok(components)
}

impl Repositories {
    /// Runs the built clusterctl with this configuration (and `kubeconfig` when given).
    pub fn clusterctl(&self, kubeconfig: Option<&Path>, args: &[&str]) -> anyhow::Result<Output> {
        let home = self.root.join("home");
        std::fs::create_dir_all(&home)?;
        let mut command = Command::new(tools::path("clusterctl")?);
        command
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("XDG_CONFIG_HOME", &home)
            .env("HOME", &home)
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true");
        if let Some(kubeconfig) = kubeconfig {
            command.arg("--kubeconfig").arg(kubeconfig);
        }
        Ok(command.output()?)
    }

    /// [`Repositories::clusterctl`] that must succeed: its standard output; a failure panics
    /// with both outputs.
    pub fn clusterctl_ok(&self, kubeconfig: Option<&Path>, args: &[&str]) -> String {
        let out = self.clusterctl(kubeconfig, args).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "clusterctl {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

/// Cluster API's core provider as its release publishes it, built from the module the tools
/// were built from.
pub fn capi_core() -> anyhow::Result<Provider> {
    let source = tools::capi_source()?;
    let out = Command::new(tools::path("kubectl")?)
        .arg("kustomize")
        .arg(source.join("core/config/default"))
        .output()
        .context("running kubectl kustomize")?;
    if !out.status.success() {
        bail!(
            "kustomize of Cluster API's core/config/default failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let components = release_pull_policy(&String::from_utf8_lossy(&out.stdout));
    let metadata = std::fs::read_to_string(source.join("metadata.yaml"))?;
    let version = source
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split_once('@'))
        .map(|(_, v)| v.to_owned())
        .context("the Cluster API module's directory names no version")?;
    Ok(Provider {
        name: "cluster-api".into(),
        kind: "CoreProvider",
        version,
        components_file: "core-components.yaml",
        components,
        metadata,
        published: None,
    })
}

/// What Cluster API's release does to its manifests' pull policy (`set-manifest-pull-policy
/// PULL_POLICY=IfNotPresent`): the development manifests say `Always`.
fn release_pull_policy(components: &str) -> String {
    components.replace("imagePullPolicy: Always", "imagePullPolicy: IfNotPresent")
}

/// bootplate's provider from a release's output (`scripts/release.sh`): clusterctl reads its
/// local repository in place, the image pinned by digest.
pub fn released(release: &crate::release::Release) -> Provider {
    Provider {
        name: "bootplate".into(),
        kind: "BootstrapProvider",
        version: release.version.clone(),
        components_file: "bootstrap-components.yaml",
        components: String::new(),
        metadata: String::new(),
        published: Some(release.components()),
    }
}

/// bootplate's provider as shipped in `deploy/`, at the version its manifests name.
pub fn bootplate() -> anyhow::Result<Provider> {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    Ok(Provider {
        name: "bootplate".into(),
        kind: "BootstrapProvider",
        version: format!("v{}", env!("CARGO_PKG_VERSION")),
        components_file: "bootstrap-components.yaml",
        components: std::fs::read_to_string(deploy.join("bootstrap-components.yaml"))?,
        metadata: std::fs::read_to_string(deploy.join("metadata.yaml"))?,
        published: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_are_laid_out_by_provider_label_and_version() {
        let root = tempfile::tempdir().unwrap();
        let provider = |name: &str, kind: &'static str| Provider {
            name: name.into(),
            kind,
            version: "v1.2.3".into(),
            components_file: "c.yaml",
            components: "kind: List\n".into(),
            metadata: "kind: Metadata\n".into(),
            published: None,
        };
        let repos = write(
            root.path(),
            &[
                provider("cluster-api", "CoreProvider"),
                provider("bootplate", "BootstrapProvider"),
            ],
            &[ImageOverride {
                component: "cluster-api".into(),
                repository: "registry.k8s.io/cluster-api".into(),
                tag: "v1.2.3".into(),
            }],
            None,
        )
        .unwrap();
        for dir in ["cluster-api", "bootstrap-bootplate"] {
            let d = root.path().join("repository").join(dir).join("v1.2.3");
            assert!(d.join("c.yaml").is_file() && d.join("metadata.yaml").is_file());
        }
        let config = std::fs::read_to_string(repos.config).unwrap();
        assert!(config.contains("- name: bootplate\n  type: BootstrapProvider\n  url: file://"));
        assert!(config.contains("images:\n  cluster-api:\n    repository: registry.k8s.io/cluster-api\n    tag: v1.2.3\n"));
    }

    #[test]
    fn the_release_pull_policy_replaces_always_only() {
        let cases = [
            ("imagePullPolicy: Always", "imagePullPolicy: IfNotPresent"),
            ("imagePullPolicy: Never", "imagePullPolicy: Never"),
            ("image: x", "image: x"),
        ];
        for (input, expected) in cases {
            assert_eq!(release_pull_policy(input), expected);
        }
    }
}
