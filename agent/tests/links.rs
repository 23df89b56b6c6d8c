//! The agent runs as root: nothing a non-root user can put on a node's disk (a link, a file at
//! the name of the agent's temporary file, a directory they own or can write) makes it write,
//! chmod, chown or remove a file the payload does not name. Each test plants one such thing
//! under a directory root, next to a file outside the root that stands for the attacker's
//! target (`/etc/shadow`, say), and checks that the target keeps its content, mode and owner and
//! that the apply fails with a message naming the path.
//!
//! These tests change owners, so they run as root (as CI and the agent do).

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use agent::Node;
use crd_types::payload::{NodePayload, PayloadFile, PayloadPart};

const TARGET_CONTENT: &str = "root:$6$the-hash:19000:0:99999:7:::\n";

/// A root for the node and, beside it, `outside/target` (mode 0640, root's).
struct Scene {
    dir: tempfile::TempDir,
    node: Node,
}

impl Scene {
    fn new() -> Scene {
        let uid = std::fs::metadata("/proc/self").unwrap().uid();
        assert_eq!(uid, 0, "these tests chown files: run them as root");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("target"), TARGET_CONTENT).unwrap();
        std::fs::set_permissions(
            outside.join("target"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        let node = Node {
            // No payload here has units: any systemctl call fails the test.
            systemctl: "false".into(),
            ..Node::at(root)
        };
        Scene { dir, node }
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    fn target(&self) -> PathBuf {
        self.outside().join("target")
    }

    fn path(&self, node_path: &str) -> PathBuf {
        self.node.path(node_path)
    }

    /// The outside file kept its content, mode and owner, and nothing was added beside it.
    fn assert_outside_untouched(&self) {
        let meta = std::fs::symlink_metadata(self.target()).unwrap();
        assert!(meta.is_file());
        assert_eq!(
            std::fs::read_to_string(self.target()).unwrap(),
            TARGET_CONTENT
        );
        assert_eq!(meta.mode() & 0o7777, 0o640, "mode");
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "owner");
        let names: Vec<String> = std::fs::read_dir(self.outside())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["target"], "nothing is written beside it");
    }
}

/// One part with one file, owned by a user (so a chown happens).
fn writes(path: &str, mode: &str, content: &str) -> NodePayload {
    NodePayload {
        parts: vec![PayloadPart {
            name: "configure".into(),
            files: vec![PayloadFile {
                path: path.into(),
                permissions: mode.into(),
                owner: "1000:1000".into(),
                content: content.as_bytes().to_vec(),
            }],
            units: vec![],
            commands: vec![],
        }],
    }
}

fn mkdir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
}

#[test]
fn a_link_at_the_files_path_is_neither_followed_nor_replaced() {
    let s = Scene::new();
    mkdir(&s.path("/etc/containerd"));
    let link = s.path("/etc/containerd/mirror.toml");
    symlink(s.target(), &link).unwrap();
    let err = (s.node)
        .apply(&writes("/etc/containerd/mirror.toml", "0666", "pwned"))
        .unwrap_err();
    assert_eq!(err.part, "configure");
    assert_eq!(err.step, "write /etc/containerd/mirror.toml");
    assert!(
        err.message
            .contains("`/etc/containerd/mirror.toml` is a symbolic link"),
        "{err}"
    );
    s.assert_outside_untouched();
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
}

#[test]
fn a_linked_directory_on_the_path_is_refused() {
    let s = Scene::new();
    symlink(s.outside(), s.path("/etc/containerd")).unwrap();
    let err = (s.node)
        .apply(&writes("/etc/containerd/target", "0666", "pwned"))
        .unwrap_err();
    assert_eq!(err.step, "write /etc/containerd/target");
    assert!(
        err.message.contains("`/etc/containerd` is a symbolic link"),
        "{err}"
    );
    s.assert_outside_untouched();
}

#[test]
fn nothing_is_removed_through_a_linked_directory() {
    let s = Scene::new();
    s.node
        .apply(&writes("/etc/app/target", "0644", "ours"))
        .unwrap();
    // The directory the agent wrote into is swapped for a link to the outside.
    std::fs::remove_dir_all(s.path("/etc/app")).unwrap();
    symlink(s.outside(), s.path("/etc/app")).unwrap();
    let err = s.node.apply(&NodePayload { parts: vec![] }).unwrap_err();
    assert_eq!(err.step, "remove /etc/app/target");
    assert!(
        err.message.contains("`/etc/app` is a symbolic link"),
        "{err}"
    );
    s.assert_outside_untouched();
}

#[test]
fn a_prepared_temporary_file_name_is_never_opened() {
    let s = Scene::new();
    mkdir(&s.path("/etc/containerd"));
    // The temporary names an agent could be expected to use, prepared as links to the target.
    for name in [
        ".mirror.toml.bootplate-tmp",
        ".mirror.toml.tmp",
        "mirror.toml.new",
    ] {
        symlink(s.target(), s.path(&format!("/etc/containerd/{name}"))).unwrap();
    }
    let applied = (s.node)
        .apply(&writes("/etc/containerd/mirror.toml", "0600", "ours"))
        .unwrap();
    assert_eq!(applied.written, ["/etc/containerd/mirror.toml"]);
    s.assert_outside_untouched();
    let written = s.path("/etc/containerd/mirror.toml");
    let meta = std::fs::symlink_metadata(&written).unwrap();
    assert!(meta.is_file());
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "ours");
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
}

#[test]
fn a_directory_others_can_change_is_refused() {
    // (mode, owner uid, gid) of /etc/containerd
    let cases = [
        (0o777, 0, 0),
        (0o1777, 0, 0),
        (0o775, 0, 1000),
        (0o757, 0, 0),
        (0o755, 1000, 0),
    ];
    for (mode, uid, gid) in cases {
        let s = Scene::new();
        let dir = s.path("/etc/containerd");
        mkdir(&dir);
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let err = (s.node)
            .apply(&writes("/etc/containerd/mirror.toml", "0600", "ours"))
            .unwrap_err();
        assert_eq!(err.step, "write /etc/containerd/mirror.toml", "{mode:o}");
        let want = format!(
            "directory `/etc/containerd` can be changed by others than root (owner uid {uid}, \
             group gid {gid}, mode {mode:04o})"
        );
        assert!(err.message.contains(&want), "{err}");
        assert!(!dir.join("mirror.toml").exists(), "{mode:o}: not written");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "no temporary file"
        );
    }
}

#[test]
fn the_state_file_is_not_written_through_a_link() {
    let s = Scene::new();
    mkdir(&s.path("/var/lib"));
    symlink(s.outside(), s.path("/var/lib/bootplate-agent")).unwrap();
    let err = (s.node)
        .apply(&writes("/etc/a.conf", "0644", "x"))
        .unwrap_err();
    assert!(
        err.message
            .contains("`/var/lib/bootplate-agent` is a symbolic link"),
        "{err}"
    );
    s.assert_outside_untouched();
}

#[test]
fn a_setuid_file_keeps_its_mode_and_owner() {
    let s = Scene::new();
    let payload = writes("/usr/local/bin/tool", "4755", "#!/bin/sh\n");
    s.node.apply(&payload).unwrap();
    let meta = std::fs::metadata(s.path("/usr/local/bin/tool")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o4755, "setuid kept");
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    let again = s.node.apply(&payload).unwrap();
    assert!(again.written.is_empty(), "{again:?}");
}
