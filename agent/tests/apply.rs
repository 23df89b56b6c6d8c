//! The agent's apply logic on a directory root, with a recording stub for systemctl (a real
//! systemd cannot be driven from a test; the stub records exactly what the agent asks of it)
//! and the real `sh` for commands.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use agent::Node;
use crd_types::payload::{NodePayload, PayloadDropIn, PayloadFile, PayloadPart, PayloadUnit};

struct Fixture {
    dir: tempfile::TempDir,
    node: Node,
}

impl Fixture {
    /// A root with a systemctl stub that logs its arguments and fails for `fail_on` ones (until
    /// `fail_on` is called again).
    fn new(fail_on: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let stub = dir.path().join("systemctl");
        let log = dir.path().join("systemctl.log");
        let fail = dir.path().join("fail-on");
        std::fs::write(&fail, fail_on).unwrap();
        std::fs::write(
            &stub,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\n[ \"$*\" = \"$(cat '{}')\" ] && {{ echo 'unit failed' >&2; exit 1; }}\nexit 0\n",
                log.display(),
                fail.display()
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
            command_timeout: Duration::from_secs(60),
        };
        Fixture { dir, node }
    }

    /// From now on the systemctl stub fails for `args` only (`""`: never).
    fn fail_on(&self, args: &str) {
        std::fs::write(self.dir.path().join("fail-on"), args).unwrap();
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

/// The systemctl calls that apply `payload` on a fresh node.
const FIRST_APPLY_CALLS: [&str; 5] = [
    "daemon-reload",
    "enable containerd.service",
    "restart containerd.service",
    "enable sysctl-apply.service",
    "restart sysctl-apply.service",
];

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
    assert_eq!(f.calls(), FIRST_APPLY_CALLS);
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

/// A node whose user-data wrote `booted` and whose agent has applied nothing: the files as the
/// agent would write them, and no state file.
fn booted_node(booted: &NodePayload) -> Fixture {
    let f = Fixture::new("");
    f.node.apply(booted).unwrap();
    std::fs::remove_file(f.node.path(agent::apply::STATE_PATH)).unwrap();
    std::fs::remove_file(f.node.root.join("commands.log")).unwrap();
    f.calls();
    f
}

#[test]
fn the_first_payload_after_the_boot_removes_what_left_the_parts_since() {
    let booted = payload("a", "x");
    let mut first = payload("a", "x");
    first.parts.pop();
    let f = booted_node(&booted);
    let applied = (f.node)
        .apply_after_boot_at(&first, Some(&booted.manifest()), SystemTime::now())
        .unwrap();
    assert_eq!(
        applied.removed,
        [
            "/etc/sysctl.d/90-k8s.conf",
            "/etc/systemd/system/sysctl-apply.service"
        ]
    );
    assert!(applied.written.is_empty(), "{:?}", applied.written);
    assert_eq!(
        f.calls(),
        ["disable --now sysctl-apply.service", "daemon-reload"],
        "what the boot enabled is not enabled again, nor restarted"
    );
    assert_eq!(command_runs(&f), 1, "a new revision's commands run once");
    // The record counts only while the agent has applied nothing: the state file rules after.
    let again = (f.node)
        .apply_after_boot_at(&first, Some(&booted.manifest()), SystemTime::now())
        .unwrap();
    assert!(again.removed.is_empty() && again.written.is_empty());

    // Without the record, what the boot wrote is not the agent's to remove.
    let f = booted_node(&booted);
    let applied = (f.node)
        .apply_after_boot_at(&first, None, SystemTime::now())
        .unwrap();
    assert!(applied.removed.is_empty());
    assert!(f.exists("/etc/sysctl.d/90-k8s.conf"));
}

#[test]
fn a_record_of_the_boot_naming_a_path_out_of_the_root_is_refused() {
    let mut booted = payload("a", "x").manifest();
    booted
        .files
        .insert("/etc/../../outside".into(), "mirror".into());
    let f = Fixture::new("");
    let error = (f.node)
        .apply_after_boot_at(&payload("a", "x"), Some(&booted), SystemTime::now())
        .unwrap_err();
    assert_eq!(error.part, "mirror");
    assert!(error.step.contains("outside"), "{error}");
    assert!(!f.exists("/etc/containerd/mirror.toml"), "nothing applied");
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

fn runs_of(f: &Fixture, log: &str) -> usize {
    std::fs::read_to_string(f.node.root.join(log))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_failing_part_alone_is_tried_again_after_a_growing_back_off() {
    let f = Fixture::new("");
    let mut failing = payload("a", "x");
    failing.parts[1].commands = vec![
        "echo run >> \"$BOOTPLATE_ROOT/sysctl.log\"".into(),
        "echo broken >&2; exit 3".into(),
    ];
    let t0 = SystemTime::now();
    let at = |seconds| t0 + Duration::from_secs(seconds);
    let err = f.node.apply_at(&failing, t0).unwrap_err();
    assert_eq!(err.part, "sysctl");
    assert_eq!(err.step, "command 1");
    assert_eq!(
        err.message,
        "exit status: 3: broken (attempt 1; next attempt in 30s)"
    );
    assert_eq!(
        err.to_string(),
        format!("part `sysctl`: command 1: {}", err.message)
    );
    // The files were written whole before the commands.
    assert_eq!(f.read("/etc/sysctl.d/90-k8s.conf"), "x");
    assert_eq!((command_runs(&f), runs_of(&f, "sysctl.log")), (1, 1));

    // Within the back-off nothing runs, and the same failure is reported.
    assert_eq!(f.node.apply_at(&failing, at(29)).unwrap_err(), err);
    assert_eq!((command_runs(&f), runs_of(&f, "sysctl.log")), (1, 1));

    // After it, only the failing part runs again (the mirror part completed this revision),
    // and the next wait is twice as long.
    let second = f.node.apply_at(&failing, at(30)).unwrap_err();
    assert_eq!(
        second.message,
        "exit status: 3: broken (attempt 2; next attempt in 1m)"
    );
    assert_eq!((command_runs(&f), runs_of(&f, "sysctl.log")), (1, 2));
    assert!(f.node.apply_at(&failing, at(89)).is_err());
    assert_eq!(runs_of(&f, "sysctl.log"), 2);

    // Fixed by a new revision: it starts over, every part runs once, and then never again.
    let mut fixed = failing.clone();
    fixed.parts[1].commands.pop();
    let applied = f.node.apply_at(&fixed, at(90)).unwrap();
    assert!(applied.commands_ran);
    assert_eq!((command_runs(&f), runs_of(&f, "sysctl.log")), (2, 3));
    assert!(!f.node.apply_at(&fixed, at(91)).unwrap().commands_ran);
    assert_eq!((command_runs(&f), runs_of(&f, "sysctl.log")), (2, 3));
}

#[test]
fn a_failed_restart_is_owed_until_it_succeeds() {
    let f = Fixture::new("restart sysctl-apply.service");
    let err = f.node.apply(&payload("a", "x")).unwrap_err();
    assert_eq!(err.step, "systemctl restart sysctl-apply.service");
    f.calls();
    // The files are unchanged now, yet the restart is still owed: tried again, still failing.
    let err = f.node.apply(&payload("a", "x")).unwrap_err();
    assert_eq!(err.step, "systemctl restart sysctl-apply.service");
    assert_eq!(f.calls(), ["restart sysctl-apply.service"]);
    assert_eq!(command_runs(&f), 0, "the commands wait for the restart");

    f.fail_on("");
    let applied = f.node.apply(&payload("a", "x")).unwrap();
    assert_eq!(f.calls(), ["restart sysctl-apply.service"]);
    assert_eq!(applied.restarted, ["sysctl-apply.service"]);
    assert!(applied.commands_ran);
    // Paid: nothing is owed any more.
    f.node.apply(&payload("a", "x")).unwrap();
    assert_eq!(f.calls(), Vec::<String>::new());
}

#[test]
fn a_failed_daemon_reload_is_owed_with_the_restarts_behind_it() {
    let f = Fixture::new("daemon-reload");
    let err = f.node.apply(&payload("a", "x")).unwrap_err();
    assert_eq!(err.step, "systemctl daemon-reload");
    f.calls();
    f.fail_on("");
    let applied = f.node.apply(&payload("a", "x")).unwrap();
    assert_eq!(f.calls(), FIRST_APPLY_CALLS);
    assert_eq!(applied.restarted.len(), 2);
}

#[test]
fn a_hanging_command_is_killed_with_its_process_group_and_reported() {
    let mut f = Fixture::new("");
    f.node.command_timeout = Duration::from_secs(1);
    let mut hanging = payload("a", "x");
    hanging.parts[1].commands =
        vec!["sleep 600 & echo $! > \"$BOOTPLATE_ROOT/background.pid\"; sleep 600".into()];
    let node = f.node.clone();
    let (sender, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(node.apply(&hanging)));
    let err = (result.recv_timeout(Duration::from_secs(30)))
        .expect("the agent still waits for the command after 30 s")
        .unwrap_err();
    assert_eq!(
        (err.part.as_str(), err.step.as_str()),
        ("sysctl", "command 0")
    );
    assert_eq!(
        err.message,
        "timed out after 1s: its process group was killed (attempt 1; next attempt in 30s)"
    );
    let pid = f.read("/background.pid").trim().to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(&pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the command's background process {pid} survived"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` runs (a zombie does not: it only waits to be reaped).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[test]
fn a_failing_commands_output_is_reported_as_a_short_redacted_tail() {
    let f = Fixture::new("");
    let mut leaky = payload("a", "x");
    leaky.parts[1].commands = vec![
        "echo 'reading /etc/kubernetes/admin.conf' >&2; \
         echo 'join with abcdef.0123456789abcdef: password=hunter2 refused' >&2; exit 2"
            .into(),
    ];
    let err = f.node.apply(&leaky).unwrap_err();
    assert_eq!(
        err.message,
        "exit status: 2: join with [redacted]: password=[redacted] refused \
         (attempt 1; next attempt in 30s)"
    );
    for secret in ["abcdef", "0123456789abcdef", "hunter2", "admin.conf"] {
        assert!(!err.to_string().contains(secret), "{secret}: {err}");
    }
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
