//! The agent's apply logic on a directory root, with a recording stub for systemctl (a real
//! systemd cannot be driven from a test; the stub records exactly what the agent asks of it)
//! and the real `sh` for commands.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use agent::Node;
use crd_types::payload::{NodePayload, PayloadDropIn, PayloadFile, PayloadPart, PayloadUnit};

struct Fixture {
    dir: tempfile::TempDir,
    node: Node,
}

impl Fixture {
    /// A root with a systemctl stub that logs its arguments and fails for `fail_on` ones.
    fn new(fail_on: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let stub = dir.path().join("systemctl");
        let log = dir.path().join("systemctl.log");
        std::fs::write(
            &stub,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\n[ \"$*\" = '{fail_on}' ] && {{ echo 'unit failed' >&2; exit 1; }}\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let node = Node {
            root,
            systemctl: stub.into(),
            shell: "sh".into(),
        };
        Fixture { dir, node }
    }

    /// The systemctl calls since the last look.
    fn calls(&self) -> Vec<String> {
        let log = self.dir.path().join("systemctl.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        text.lines().map(str::to_owned).collect()
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.node.path(path)).unwrap()
    }

    fn exists(&self, path: &str) -> bool {
        self.node.path(path).exists()
    }
}

fn file(path: &str, mode: &str, content: &str) -> PayloadFile {
    PayloadFile {
        path: path.into(),
        permissions: mode.into(),
        owner: "root:root".into(),
        content: content.as_bytes().to_vec(),
    }
}

fn unit(name: &str, content: Option<&str>, drop_in: Option<&str>) -> PayloadUnit {
    PayloadUnit {
        name: name.into(),
        enable: true,
        content: content.map(Into::into),
        drop_ins: drop_in
            .map(|c| PayloadDropIn {
                name: "10-bootplate.conf".into(),
                content: c.into(),
            })
            .into_iter()
            .collect(),
    }
}

/// Two parts: `mirror` (a file and containerd's drop-in, a command that counts its runs) and
/// `sysctl` (a file and its own unit).
fn payload(mirror: &str, sysctl: &str) -> NodePayload {
    NodePayload {
        parts: vec![
            PayloadPart {
                name: "mirror".into(),
                files: vec![file("/etc/containerd/mirror.toml", "0600", mirror)],
                units: vec![unit(
                    "containerd.service",
                    None,
                    Some("[Service]\nEnvironment=A=1\n"),
                )],
                commands: vec!["echo run >> \"$BOOTPLATE_ROOT/commands.log\"".into()],
            },
            PayloadPart {
                name: "sysctl".into(),
                files: vec![file("/etc/sysctl.d/90-k8s.conf", "0644", sysctl)],
                units: vec![unit(
                    "sysctl-apply.service",
                    Some("[Service]\nType=oneshot\nExecStart=/sbin/sysctl --system\n"),
                    None,
                )],
                commands: vec![],
            },
        ],
    }
}

fn command_runs(f: &Fixture) -> usize {
    std::fs::read_to_string(f.node.root.join("commands.log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(temp_files(&path));
        } else if path.to_string_lossy().ends_with(".bootplate-tmp") {
            out.push(path);
        }
    }
    out
}

#[test]
fn first_apply_writes_files_units_and_runs_commands_once() {
    let f = Fixture::new("");
    let applied = f.node.apply(&payload("a", "x")).unwrap();
    assert_eq!(f.read("/etc/containerd/mirror.toml"), "a");
    let meta = std::fs::metadata(f.node.path("/etc/containerd/mirror.toml")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    if running_as_root() {
        assert_eq!((meta.uid(), meta.gid()), (0, 0));
    }
    assert_eq!(
        f.read("/etc/systemd/system/containerd.service.d/10-bootplate.conf"),
        "[Service]\nEnvironment=A=1\n"
    );
    assert!(
        f.read("/etc/systemd/system/sysctl-apply.service")
            .contains("oneshot")
    );
    assert_eq!(
        f.calls(),
        [
            "daemon-reload",
            "enable containerd.service",
            "restart containerd.service",
            "enable sysctl-apply.service",
            "restart sysctl-apply.service",
        ]
    );
    assert!(applied.commands_ran);
    assert_eq!(command_runs(&f), 1);

    // The same payload again: nothing written, no systemctl call, commands not run again.
    let again = f.node.apply(&payload("a", "x")).unwrap();
    assert!(again.written.is_empty() && again.restarted.is_empty() && !again.commands_ran);
    assert_eq!(f.calls(), Vec::<String>::new());
    assert_eq!(command_runs(&f), 1);
}

#[test]
fn only_the_changed_parts_unit_restarts() {
    let f = Fixture::new("");
    f.node.apply(&payload("a", "x")).unwrap();
    f.calls();
    let applied = f.node.apply(&payload("a", "y")).unwrap();
    assert_eq!(applied.written, ["/etc/sysctl.d/90-k8s.conf"]);
    assert_eq!(f.calls(), ["restart sysctl-apply.service"]);
    assert_eq!(applied.restarted, ["sysctl-apply.service"]);
    assert!(
        applied.commands_ran,
        "a new revision runs the commands again"
    );
    assert_eq!(command_runs(&f), 2);
}

#[test]
fn a_changed_drop_in_reloads_and_restarts_its_unit_only() {
    let f = Fixture::new("");
    f.node.apply(&payload("a", "x")).unwrap();
    f.calls();
    let mut changed = payload("a", "x");
    changed.parts[0].units[0].drop_ins[0].content = "[Service]\nEnvironment=A=2\n".into();
    f.node.apply(&changed).unwrap();
    assert_eq!(
        f.calls(),
        [
            "daemon-reload",
            "enable containerd.service",
            "restart containerd.service"
        ]
    );
}

#[test]
fn what_leaves_the_payload_leaves_the_node() {
    let f = Fixture::new("");
    f.node.apply(&payload("a", "x")).unwrap();
    f.calls();
    let mut smaller = payload("a", "x");
    smaller.parts.pop();
    let applied = f.node.apply(&smaller).unwrap();
    assert!(!f.exists("/etc/sysctl.d/90-k8s.conf"));
    assert!(!f.exists("/etc/systemd/system/sysctl-apply.service"));
    assert_eq!(
        applied.removed,
        [
            "/etc/sysctl.d/90-k8s.conf",
            "/etc/systemd/system/sysctl-apply.service"
        ]
    );
    assert_eq!(
        f.calls(),
        ["disable --now sysctl-apply.service", "daemon-reload"]
    );
    assert!(
        f.exists("/etc/containerd/mirror.toml"),
        "the other part stays"
    );
}

#[test]
fn drift_is_put_back() {
    let f = Fixture::new("");
    f.node.apply(&payload("a", "x")).unwrap();
    f.calls();
    let path = f.node.path("/etc/containerd/mirror.toml");
    std::fs::write(&path, "edited by hand").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let applied = f.node.apply(&payload("a", "x")).unwrap();
    assert_eq!(f.read("/etc/containerd/mirror.toml"), "a");
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(applied.written, ["/etc/containerd/mirror.toml"]);
    assert_eq!(f.calls(), ["restart containerd.service"]);
    assert!(
        !applied.commands_ran,
        "same revision: commands do not run again"
    );
}

#[test]
fn a_failing_command_names_its_part_and_step_and_runs_again_next_pass() {
    let f = Fixture::new("");
    let mut failing = payload("a", "x");
    failing.parts[1].commands = vec!["true".into(), "echo broken >&2; exit 3".into()];
    let err = f.node.apply(&failing).unwrap_err();
    assert_eq!(err.part, "sysctl");
    assert_eq!(err.step, "command 1");
    assert!(
        err.message.contains("exit status: 3") && err.message.contains("broken"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!("part `sysctl`: command 1: {}", err.message)
    );
    // The files were written whole before the commands; the commands are not marked done.
    assert_eq!(f.read("/etc/sysctl.d/90-k8s.conf"), "x");
    assert!(f.node.apply(&failing).is_err());
    assert_eq!(
        command_runs(&f),
        2,
        "the mirror part's command ran in both passes"
    );
}

#[test]
fn a_failing_systemctl_names_its_part_and_step() {
    let f = Fixture::new("restart sysctl-apply.service");
    let err = f.node.apply(&payload("a", "x")).unwrap_err();
    assert_eq!(err.part, "sysctl");
    assert_eq!(err.step, "systemctl restart sysctl-apply.service");
    assert!(err.message.contains("unit failed"), "{err}");
}

#[test]
fn a_failed_write_leaves_the_old_file_or_none_and_no_temporary_file() {
    let f = Fixture::new("");
    // The sysctl file's place is taken by a non-empty directory: the rename fails.
    let blocked = f.node.path("/etc/sysctl.d/90-k8s.conf");
    std::fs::create_dir_all(blocked.join("inside")).unwrap();
    let err = f.node.apply(&payload("a", "x")).unwrap_err();
    assert_eq!(err.part, "sysctl");
    assert_eq!(err.step, "write /etc/sysctl.d/90-k8s.conf");
    assert!(
        blocked.join("inside").is_dir(),
        "the directory is untouched"
    );
    assert_eq!(
        f.read("/etc/containerd/mirror.toml"),
        "a",
        "earlier files are whole"
    );
    assert_eq!(temp_files(&f.node.root), Vec::<PathBuf>::new());
    // Nothing restarted and no commands: the pass stopped at the write.
    assert_eq!(f.calls(), Vec::<String>::new());
    assert_eq!(command_runs(&f), 0);
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}
