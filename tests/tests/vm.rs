//! Real VMs: a rendered user-data boots a Debian machine under qemu (TCG) from a NoCloud seed
//! disk, with the image's own kernel, systemd and cloud-init, and what it did is read from the
//! disk afterwards (tests/vm/: build-image.sh builds and caches the image, boot.sh boots it).
//! Unlike the boot proof, nothing is a stand-in: systemd runs the units the user-data
//! enables, `hostnamectl` and `useradd` are the image's own. Needs root and
//! tests/scripts/install-tools.sh's qemu, cloud-localds and e2fsprogs' debugfs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cached image (tests/vm/build-image.sh builds it on first use).
fn image() -> PathBuf {
    let out = Command::new(repo().join("tests/vm/build-image.sh"))
        .output()
        .expect("running tests/vm/build-image.sh");
    assert!(
        out.status.success(),
        "tests/vm/build-image.sh (needs root and tests/scripts/install-tools.sh's tools):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Where VM boots keep their disks and consoles: under the target directory, for the
/// post-mortem (each boot replaces its own directory).
fn runs_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("vm")
}

/// Boots `user_data` (tests/vm/boot.sh) as the machine `hostname`; the run's directory.
fn boot(image: &Path, user_data: &[u8], hostname: &str) -> PathBuf {
    let dir = runs_dir().join(hostname);
    std::fs::create_dir_all(runs_dir()).unwrap();
    let input = runs_dir().join(format!("{hostname}.user-data"));
    std::fs::write(&input, user_data).unwrap();
    let out = Command::new(repo().join("tests/vm/boot.sh"))
        .arg("--image")
        .arg(image)
        .arg("--user-data")
        .arg(&input)
        .arg("--out")
        .arg(&dir)
        .args(["--hostname", hostname])
        .output()
        .expect("running tests/vm/boot.sh");
    assert!(
        out.status.success(),
        "the VM boot of {hostname} (console: {}/console.log):\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A file of the powered-off machine's disk (`debugfs -R cat`), or None when it is not there.
fn read_disk(disk: &Path, path: &str) -> Option<String> {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("cat {path}"))
        .arg(disk)
        .output()
        .expect("running debugfs (e2fsprogs)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "debugfs cat {path}: {stderr}");
    (!stderr.contains("File not found")).then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// plain-linux, rendered for a worker Machine, boots to "cloud-init finished": its script set
/// the host name to the Machine's name, made the user with sudo and SSH keys and the service
/// the variables ask for (enabled in systemd's tree), cloud-init recorded no error, and the
/// Cluster API sentinel was written (copied from /run by the image before it powered off).
#[test]
fn plain_linux_boots_in_a_vm() {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("config.yaml");
    std::fs::write(
        &config,
        r#"apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: proof-worker-v1-31-2, namespace: boot-proof}
spec:
  templateRef: {kind: ClusterBootstrapTemplate, name: plain-linux}
  variables:
    users:
      - name: alice
        sudo: true
        sshAuthorizedKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIVmAliceKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA alice@vm"]
    serviceName: vm-web
    serviceCommand: [/usr/bin/python3, -m, http.server, "8080"]
    serviceUser: www-vm
"#,
    )
    .unwrap();
    let fixtures = repo().join("tests/boot/fixtures");
    let out = Command::new(testenv::controller::binary().unwrap())
        .arg("render")
        .arg("--template")
        .arg(repo().join("templates/plain-linux.yaml"))
        .arg("--machine")
        .arg(fixtures.join("machine-worker-v1.31.2.yaml"))
        .arg("--cluster")
        .arg(fixtures.join("cluster.yaml"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bootplate render: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The seed's local-hostname differs from the Machine's name: the script must set it.
    let dir = boot(&image(), &out.stdout, "vm-plain");
    let disk = dir.join("disk.raw");
    let read = |path: &str| read_disk(&disk, path).unwrap_or_else(|| panic!("{path} is missing"));

    let result: serde_json::Value =
        serde_json::from_str(&read("/var/lib/cloud/data/result.json")).unwrap();
    assert_eq!(result["v1"]["errors"], serde_json::json!([]), "{result}");
    assert_eq!(
        read("/var/lib/bootplate-vm/run/cluster-api/bootstrap-success.complete"),
        "success\n"
    );
    assert_eq!(read("/etc/hostname").trim(), "proof-worker-v1-31-2");
    assert!(read("/etc/passwd").contains("\nalice:"));
    assert!(
        read("/home/alice/.ssh/authorized_keys").contains("AAAAIVmAliceKey"),
        "alice's key"
    );
    assert_eq!(
        read("/etc/sudoers.d/90-bootplate-alice"),
        "alice ALL=(ALL) NOPASSWD:ALL\n"
    );
    assert!(read("/etc/passwd").contains("\nwww-vm:"));
    let unit = read("/etc/systemd/system/vm-web.service");
    assert!(unit.contains("User=www-vm"), "{unit}");
    assert!(
        read_disk(
            &disk,
            "/etc/systemd/system/multi-user.target.wants/vm-web.service"
        )
        .is_some(),
        "vm-web.service is not enabled"
    );
}
