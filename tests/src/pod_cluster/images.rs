//! The image archives the pod cluster imports, from `tests/scripts/build-images.sh` (through
//! [`crate::images::archives`]; it returns at once when its archives are cached), each with the reference
//! it carries (the OCI index's `org.opencontainers.image.ref.name`), which is what a manifest
//! names and what the cluster's containerd lists after the import.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// One archive and the reference it carries.
#[derive(Clone, Debug)]
pub struct Image {
    pub archive: PathBuf,
    pub reference: String,
}

/// The images by the script's name for them (`pause`, `probe`, `bootplate`, ...).
#[derive(Clone, Debug)]
pub struct Images {
    pub by_name: BTreeMap<String, Image>,
}

impl Images {
    /// The image named `name` by the script.
    pub fn get(&self, name: &str) -> anyhow::Result<&Image> {
        self.by_name
            .get(name)
            .with_context(|| format!("build-images.sh printed no {name}= line"))
    }

    /// The sandbox image's reference (containerd's `sandbox_image`).
    pub fn pause(&self) -> anyhow::Result<&str> {
        Ok(&self.get("pause")?.reference)
    }

    /// Every archive, to import.
    pub fn archives(&self) -> Vec<PathBuf> {
        self.by_name.values().map(|i| i.archive.clone()).collect()
    }
}

/// The images `names` (built or taken from the cache by [`crate::images::archives`]), each with
/// the reference its archive carries; once per process for the same names.
pub fn built(names: &[&str]) -> anyhow::Result<Images> {
    static BUILT: OnceLock<std::sync::Mutex<BTreeMap<String, Images>>> = OnceLock::new();
    let key = names.join(" ");
    let cache = BUILT.get_or_init(Default::default);
    if let Some(images) = cache.lock().expect("not poisoned").get(&key) {
        return Ok(images.clone());
    }
    let mut by_name = BTreeMap::new();
    for (name, archive) in crate::images::archives(names)? {
        let reference = reference_of(&archive)?;
        by_name.insert(name, Image { archive, reference });
    }
    let images = Images { by_name };
    cache
        .lock()
        .expect("not poisoned")
        .insert(key, images.clone());
    Ok(images)
}

/// The reference an OCI archive's index names its (one) manifest with.
pub fn reference_of(archive: &Path) -> anyhow::Result<String> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("index.json")
        .output()
        .context("running tar")?;
    if !out.status.success() {
        bail!("{} has no index.json", archive.display());
    }
    reference_in_index(&out.stdout)
        .with_context(|| format!("no image reference in {}", archive.display()))
}

fn reference_in_index(index: &[u8]) -> Option<String> {
    let index: serde_json::Value = serde_json::from_slice(index).ok()?;
    let manifests = index["manifests"].as_array()?;
    let [manifest] = manifests.as_slice() else {
        return None;
    };
    manifest["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_comes_from_the_single_manifest() {
        let cases: [(&str, Option<&str>); 4] = [
            (
                r#"{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"registry.k8s.io/pause:3.10.2"}}]}"#,
                Some("registry.k8s.io/pause:3.10.2"),
            ),
            (r#"{"manifests":[{"annotations":{}}]}"#, None),
            (r#"{"manifests":[{},{}]}"#, None),
            ("not json", None),
        ];
        for (index, expected) in cases {
            assert_eq!(
                reference_in_index(index.as_bytes()).as_deref(),
                expected,
                "{index}"
            );
        }
    }
}
