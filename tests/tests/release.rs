//! `scripts/release.sh`, run as a release manager runs it, and its output read as a platform team
//! mirroring it would: the checksums verify and cover every file, no more, the image archive's
//! manifest digest is the one the components pin and the digest file names, the binaries are
//! static, the metadata maps the version's series to a contract, and the real clusterctl installs
//! from the output as a local repository (`generate provider --describe`, with an `images:` mirror
//! override that keeps the digest). Needs cargo, kubectl, umoci, skopeo and clusterctl.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;
use testenv::clusterctl_repo::{ClusterctlConfig, PROVIDER_LABEL};
use testenv::release::Release;

fn version() -> String {
    testenv::release::version()
}

fn release(version: &str, out: &Path) -> Output {
    testenv::release::run(version, out).expect("scripts/release.sh runs")
}

/// The release of this workspace's version, made once per test process into cargo's scratch
/// directory for integration tests (replaced by the next run, so nothing piles up).
fn released() -> &'static Path {
    static OUT: OnceLock<PathBuf> = OnceLock::new();
    OUT.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("release");
        Release::make(&out).unwrap_or_else(|e| panic!("{e:#}"));
        out
    })
}

fn run_ok(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The manifest digest of the image in an OCI archive, read from the archive's own index.
fn manifest_digest(archive: &Path) -> String {
    let index = run_ok(
        Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg("index.json"),
    );
    let index: Value = serde_json::from_str(&index).expect("index.json");
    let manifests = index["manifests"].as_array().expect("manifests");
    assert_eq!(manifests.len(), 1, "one image in the archive: {index}");
    manifests[0]["digest"]
        .as_str()
        .expect("a digest")
        .to_owned()
}

/// The files under `dir`, as paths relative to it with `/` between their parts.
fn files_under(dir: &Path) -> std::collections::BTreeSet<String> {
    let mut files = std::collections::BTreeSet::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("a release directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("under the release");
                files.insert(relative.to_string_lossy().into_owned());
            }
        }
    }
    files
}

/// Whether an ELF file asks for a program interpreter (the dynamic loader): PT_INTERP among its
/// program headers (64-bit little-endian, as every target here is).
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (offset, size, count) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| u32::from_le_bytes(elf[offset + i * size..][..4].try_into().unwrap()) == 3)
}

#[test]
fn release_output_verifies_and_pins_the_image_it_ships() {
    let out = released();
    let version = version();
    run_ok(
        Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(out),
    );
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).expect("SHA256SUMS");
    let summed: std::collections::BTreeSet<String> = sums
        .lines()
        .map(|line| match line.split_once("  ") {
            Some((_, file)) => file.to_owned(),
            None => panic!("a SHA256SUMS line without a file: {line}"),
        })
        .collect();
    let mut shipped = files_under(out);
    shipped.remove("SHA256SUMS");
    assert_eq!(
        summed, shipped,
        "SHA256SUMS names every file of the release, no other"
    );
    let repository = format!("{PROVIDER_LABEL}/{version}");
    for file in [
        format!("bootplate-image-{version}.oci.tar"),
        format!("bootplate-image-{version}.digest"),
        format!("{repository}/bootstrap-components.yaml"),
        format!("{repository}/metadata.yaml"),
    ] {
        assert!(
            sums.lines()
                .any(|line| line.ends_with(&format!("  {file}"))),
            "{file} in:\n{sums}"
        );
    }

    let archive = out.join(format!("bootplate-image-{version}.oci.tar"));
    let digest = manifest_digest(&archive);
    let published = std::fs::read_to_string(out.join(format!("bootplate-image-{version}.digest")))
        .expect("the digest file");
    assert_eq!(published.trim(), digest);
    let tag = run_ok(
        Command::new("tar")
            .arg("-xOf")
            .arg(&archive)
            .arg("index.json"),
    );
    assert!(
        tag.contains(&format!("\"ghcr.io/bootplate/bootplate:{version}\"")),
        "{tag}"
    );

    let components =
        std::fs::read_to_string(out.join(&repository).join("bootstrap-components.yaml"))
            .expect("the components");
    let images: Vec<&str> = components
        .lines()
        .filter_map(|line| line.trim().strip_prefix("image: "))
        .collect();
    assert_eq!(images, [format!("ghcr.io/bootplate/bootplate@{digest}")]);

    let metadata: Value = serde_yaml::from_str(
        &std::fs::read_to_string(out.join(&repository).join("metadata.yaml")).expect("metadata"),
    )
    .expect("metadata YAML");
    let series: Vec<u64> = version[1..]
        .split('.')
        .take(2)
        .map(|n| n.parse().unwrap())
        .collect();
    let entry = metadata["releaseSeries"]
        .as_array()
        .expect("releaseSeries")
        .iter()
        .find(|s| s["major"] == series[0] && s["minor"] == series[1])
        .unwrap_or_else(|| panic!("metadata.yaml has the series of {version}: {metadata}"));
    assert_eq!(entry["contract"], "v1beta2");

    for binary in ["bootplate", "bootplate-agent"] {
        let path = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{binary}-linux-"))
            })
            .unwrap_or_else(|| panic!("no {binary}-linux-ARCH in the release"));
        let elf = std::fs::read(&path).expect("the binary");
        assert!(!has_interpreter(&elf), "{} is static", path.display());
        let help = run_ok(Command::new(&path).arg("--help"));
        assert!(help.contains("Usage:"), "{help}");
    }
}

#[test]
fn clusterctl_reads_the_release_as_a_local_repository_and_mirrors_its_image() {
    let out = released();
    let version = version();
    let digest = manifest_digest(&out.join(format!("bootplate-image-{version}.oci.tar")));
    let home = tempfile::tempdir().expect("temporary directory");
    let components = out
        .join(PROVIDER_LABEL)
        .join(&version)
        .join("bootstrap-components.yaml");
    let mirror = "mirror.example.internal/platform";
    let config = ClusterctlConfig::write(
        home.path(),
        &components,
        &format!("images:\n  {PROVIDER_LABEL}:\n    repository: {mirror}\n"),
    )
    .expect("clusterctl.yaml");
    let described = config
        .run(&[
            "generate",
            "provider",
            "--bootstrap",
            "bootplate",
            "--describe",
        ])
        .expect("clusterctl runs");
    let said = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.status.success(),
        "clusterctl failed: {}",
        String::from_utf8_lossy(&described.stderr)
    );
    assert!(
        said.contains(&format!("Version:            {version}")),
        "{said}"
    );
    assert!(
        said.contains(&format!("  - {mirror}/bootplate@{digest}\n")),
        "{said}"
    );
}

#[test]
fn release_refuses_a_version_the_workspace_is_not() {
    let out = tempfile::tempdir().expect("temporary directory");
    for (version, says) in [
        ("v99.0.0", "is not the workspace's version"),
        ("0.1.0", "is not v<major>.<minor>.<patch>"),
    ] {
        let refused = release(version, out.path());
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && stderr.contains(says),
            "{version}: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read_dir(out.path()).unwrap().count(),
        0,
        "nothing written"
    );
}
