//! Applying a payload to a node: files written atomically with their mode and owner, unit files
//! and drop-ins, `daemon-reload` when any changed, restarts for the units that changed only,
//! removal of what an earlier payload wrote and this one no longer has, and the commands once
//! per payload revision. No Kubernetes client: the payload comes in, a report or an error that
//! names the part and the step comes out.
//!
//! What the agent wrote is remembered in a state file under the root, so a later payload can
//! remove it and drift (a file changed by hand) is put back on the next pass. With no state
//! file yet (the first payload comes with the machine's first in-place update), what the
//! user-data wrote for the `InPlace` parts at boot (`BootedManifest`) stands for it. So is what is
//! still owed: a `daemon-reload` or restart that failed is tried again on the next pass even
//! though no file changes any more, and the commands' progress through a revision (`progress`)
//! keeps a failing part's back-off across passes and restarts.
//!
//! Every path is opened through `safe_fs` (no link followed, only root-owned directories), and
//! every program through `program` (a timeout, a redacted report).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use crd_types::payload::{BootedManifest, NodePayload, PayloadPart, UNIT_DIR};
use serde::{Deserialize, Serialize};

use crate::owner::Owners;
use crate::progress::{CommandProgress, Next};
use crate::safe_fs::{FileSpec, Root};

/// Where the agent keeps what it applied, under the root.
pub const STATE_PATH: &str = "/var/lib/bootplate-agent/state.json";
/// The longest state file, `/etc/passwd` or `/etc/group` the agent reads.
const READ_LIMIT: u64 = 16 << 20;
/// How long a command or systemctl call may run unless told otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How the agent reaches the node.
#[derive(Clone, Debug)]
pub struct Node {
    /// The directory the node's paths are under: `/` on a node, a directory in tests.
    pub root: PathBuf,
    /// The program run as `systemctl` (tests pass a stub that records its arguments).
    pub systemctl: OsString,
    /// The shell that runs commands (`sh -c COMMAND`).
    pub shell: OsString,
    /// How long one command or systemctl call may run before its process group is killed.
    pub command_timeout: Duration,
}

/// A step that failed: the part it belongs to, what was being done, and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("part `{part}`: {step}: {message}")]
pub struct ApplyError {
    /// The part's name (`-` for the removal of what no part holds any more).
    pub part: String,
    /// The step, for example `write /etc/containerd/config.toml` or `command 2`.
    pub step: String,
    /// The cause (a program's output appears only as a short redacted tail).
    pub message: String,
}

impl ApplyError {
    fn new(part: &str, step: impl Into<String>, message: impl ToString) -> ApplyError {
        ApplyError {
            part: part.to_owned(),
            step: step.into(),
            message: message.to_string(),
        }
    }
}

/// What one pass changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The payload revision now applied.
    pub revision: String,
    /// Paths written (new or different content, mode or owner).
    pub written: Vec<String>,
    /// Paths removed.
    pub removed: Vec<String>,
    /// Units restarted.
    pub restarted: Vec<String>,
    /// Whether the commands ran (once per revision).
    pub commands_ran: bool,
}

/// What the agent applied before, and what it still owes (the state file).
#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct State {
    /// Managed path → the part that wrote it.
    files: BTreeMap<String, String>,
    /// Units the agent wrote or enabled.
    units: BTreeSet<String>,
    /// The revision whose commands completed.
    commands_revision: Option<String>,
    /// A `daemon-reload` is owed (a unit file changed and the reload has not succeeded yet).
    #[serde(default)]
    pending_reload: bool,
    /// Units whose restart is owed.
    #[serde(default)]
    pending_restarts: BTreeSet<String>,
    /// How far the commands of a revision that has not completed got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    commands: Option<CommandProgress>,
}

impl State {
    /// A node the agent has not applied anything on, whose user-data wrote and enabled what
    /// `booted` names.
    fn booted(booted: &BootedManifest) -> Result<State, ApplyError> {
        for (path, part) in &booted.files {
            check_path(path).map_err(|message| {
                ApplyError::new(part, format!("remember {}", path.escape_debug()), message)
            })?;
        }
        Ok(State {
            files: booted.files.clone(),
            units: booted.units.clone(),
            ..State::default()
        })
    }
}

/// A file the payload wants, with the part it belongs to and, for unit files and drop-ins,
/// the unit.
struct Desired<'a> {
    part: &'a str,
    unit: Option<&'a str>,
    path: String,
    mode: u32,
    owner: &'a str,
    content: &'a [u8],
}

impl Node {
    /// A node at `root` with the system's `systemctl` and `sh` and the default timeout.
    pub fn at(root: impl Into<PathBuf>) -> Node {
        Node {
            root: root.into(),
            systemctl: "systemctl".into(),
            shell: "sh".into(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
        }
    }

    /// The node's path `path` (absolute) under the root.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Applies `payload` now: see `apply_at`.
    pub fn apply(&self, payload: &NodePayload) -> Result<Applied, ApplyError> {
        self.apply_at(payload, SystemTime::now())
    }

    /// Applies `payload` at `now` (the clock of the commands' back-off): see the module doc.
    /// Stops at the first failing step; what was written before it stays (each file whole, old
    /// or new) and is remembered for the next pass, with what is still owed.
    pub fn apply_at(&self, payload: &NodePayload, now: SystemTime) -> Result<Applied, ApplyError> {
        self.apply_after_boot_at(payload, None, now)
    }

    /// [`Node::apply_at`] on a node whose user-data wrote `booted` for its `InPlace` parts:
    /// when the agent has applied nothing here yet (no state file), what `booted` names is
    /// taken as applied by an earlier payload, so what left the parts since is removed.
    pub fn apply_after_boot_at(
        &self,
        payload: &NodePayload,
        booted: Option<&BootedManifest>,
        now: SystemTime,
    ) -> Result<Applied, ApplyError> {
        let root = Root::open(&self.root).map_err(|e| ApplyError::new("-", "open /", e))?;
        let mut state = load_state(&root, booted)?;
        let revision = payload.revision();
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let result = self.apply_with(&root, payload, &revision, &mut state, now);
        save_state(&root, &state)?;
        result
    }

    fn apply_with(
        &self,
        root: &Root,
        payload: &NodePayload,
        revision: &str,
        state: &mut State,
        now: u64,
    ) -> Result<Applied, ApplyError> {
        let owners = read_owners(root)?;
        let desired = desired_files(payload)?;
        let mut applied = Applied {
            revision: revision.to_owned(),
            ..Applied::default()
        };
        // Units whose own files changed, and parts whose plain files changed.
        let mut changed_units = BTreeSet::new();
        let mut changed_parts = BTreeSet::new();
        for file in &desired {
            let fail = |message: String| {
                ApplyError::new(file.part, format!("write {}", file.path), message)
            };
            let (uid, gid) = owners.resolve(file.owner).map_err(fail)?;
            let spec = FileSpec {
                content: file.content,
                mode: file.mode,
                uid,
                gid,
            };
            let written =
                (root.write_if_different(&file.path, spec)).map_err(|e| fail(e.to_string()))?;
            state.files.insert(file.path.clone(), file.part.to_owned());
            if written {
                applied.written.push(file.path.clone());
                match file.unit {
                    Some(unit) => changed_units.insert(unit.to_owned()),
                    None => changed_parts.insert(file.part.to_owned()),
                };
            }
        }
        let wanted_units: BTreeSet<&str> = payload
            .parts
            .iter()
            .flat_map(|p| p.units.iter().map(|u| u.name.as_str()))
            .collect();
        self.remove_stale(
            root,
            &desired,
            &wanted_units,
            state,
            &mut applied,
            &mut changed_units,
        )?;
        owe_reload_and_restarts(payload, state, &changed_units, &changed_parts);
        self.reload_enable_restart(payload, state, &changed_units, &mut applied)?;
        if state.commands_revision.as_deref() != Some(revision) {
            let mut progress = CommandProgress::for_revision(state.commands.take(), revision);
            let ran = self.run_parts_commands(payload, &mut progress, now);
            state.commands = Some(progress);
            ran?;
            state.commands = None;
            state.commands_revision = Some(revision.to_owned());
            applied.commands_ran = true;
        }
        Ok(applied)
    }

    /// Pays what is owed: `daemon-reload`, then for each enabled unit `enable` when it is new
    /// or changed and `restart` when one is owed. Each debt is cleared only once its call
    /// succeeded, so a failed one is tried again on the next pass.
    fn reload_enable_restart(
        &self,
        payload: &NodePayload,
        state: &mut State,
        changed_units: &BTreeSet<String>,
        applied: &mut Applied,
    ) -> Result<(), ApplyError> {
        if state.pending_reload {
            self.systemctl(first_part(payload), &["daemon-reload"])?;
            state.pending_reload = false;
        }
        for part in &payload.parts {
            for unit in part.units.iter().filter(|u| u.enable) {
                if !state.units.contains(&unit.name) || changed_units.contains(&unit.name) {
                    self.systemctl(&part.name, &["enable", &unit.name])?;
                }
                state.units.insert(unit.name.clone());
                if state.pending_restarts.contains(&unit.name) {
                    self.systemctl(&part.name, &["restart", &unit.name])?;
                    state.pending_restarts.remove(&unit.name);
                    applied.restarted.push(unit.name.clone());
                }
            }
        }
        Ok(())
    }

    /// Runs the commands of each part not yet done for this revision, in order; a part that
    /// failed waits out its back-off (`progress`), and stops the parts after it.
    fn run_parts_commands(
        &self,
        payload: &NodePayload,
        progress: &mut CommandProgress,
        now: u64,
    ) -> Result<(), ApplyError> {
        for part in &payload.parts {
            match progress.next(&part.name, now) {
                Next::Done => continue,
                Next::Wait(failing) => {
                    return Err(ApplyError::new(&part.name, &failing.step, &failing.message));
                }
                Next::Run => {}
            }
            match self.run_commands(part) {
                Ok(()) => progress.succeeded(&part.name),
                Err(e) => {
                    let failing = progress.failed(&part.name, &e.step, &e.message, now);
                    return Err(ApplyError::new(&part.name, &failing.step, &failing.message));
                }
            }
        }
        Ok(())
    }

    /// Removes what the state holds and the payload no longer has; a unit no longer wanted is
    /// stopped and disabled first.
    fn remove_stale(
        &self,
        root: &Root,
        desired: &[Desired],
        wanted_units: &BTreeSet<&str>,
        state: &mut State,
        applied: &mut Applied,
        changed_units: &mut BTreeSet<String>,
    ) -> Result<(), ApplyError> {
        let gone_units: Vec<String> = (state.units.iter())
            .filter(|u| !wanted_units.contains(u.as_str()))
            .cloned()
            .collect();
        for unit in &gone_units {
            self.systemctl("-", &["disable", "--now", unit])?;
            state.units.remove(unit);
            changed_units.insert(unit.clone());
        }
        let stale: Vec<(String, String)> = (state.files.iter())
            .filter(|(path, _)| !desired.iter().any(|d| &d.path == *path))
            .map(|(path, part)| (path.clone(), part.clone()))
            .collect();
        for (path, part) in stale {
            let removed = (root.remove(&path))
                .map_err(|e| ApplyError::new(&part, format!("remove {path}"), e))?;
            if removed {
                applied.removed.push(path.clone());
            }
            if let Some(unit) = unit_of(&path) {
                changed_units.insert(unit.to_owned());
            }
            state.files.remove(&path);
        }
        // A unit whose drop-in went away but which is still wanted restarts; one that is gone
        // only needed the daemon-reload.
        Ok(())
    }

    fn systemctl(&self, part: &str, args: &[&str]) -> Result<(), ApplyError> {
        let step = format!("systemctl {}", args.join(" "));
        let mut command = Command::new(&self.systemctl);
        command.args(args);
        crate::program::run(&mut command, self.command_timeout)
            .map_err(|e| ApplyError::new(part, step, e))
    }

    fn run_commands(&self, part: &PayloadPart) -> Result<(), ApplyError> {
        for (i, command) in part.commands.iter().enumerate() {
            let mut shell = Command::new(&self.shell);
            shell
                .arg("-c")
                .arg(command)
                .current_dir(&self.root)
                .env("BOOTPLATE_ROOT", &self.root);
            crate::program::run(&mut shell, self.command_timeout)
                .map_err(|e| ApplyError::new(&part.name, format!("command {i}"), e))?;
        }
        Ok(())
    }
}

/// Records what the changes of this pass owe: a `daemon-reload` when a unit file or drop-in
/// changed or went away, a restart of each enabled unit whose own files or whose part's files
/// changed. What was owed before and is still wanted stays owed.
fn owe_reload_and_restarts(
    payload: &NodePayload,
    state: &mut State,
    changed_units: &BTreeSet<String>,
    changed_parts: &BTreeSet<String>,
) {
    state.pending_reload |= !changed_units.is_empty();
    let mut enabled = BTreeSet::new();
    for part in &payload.parts {
        for unit in part.units.iter().filter(|u| u.enable) {
            enabled.insert(unit.name.clone());
            if changed_units.contains(&unit.name) || changed_parts.contains(&part.name) {
                state.pending_restarts.insert(unit.name.clone());
            }
        }
    }
    // A unit that left the payload was stopped; restarting it is no longer owed.
    state.pending_restarts.retain(|u| enabled.contains(u));
}

/// The state file, or, when there is none yet, what the user-data wrote at boot.
fn load_state(root: &Root, booted: Option<&BootedManifest>) -> Result<State, ApplyError> {
    let fail = |message: String| ApplyError::new("-", format!("read {STATE_PATH}"), message);
    match root.read(STATE_PATH, READ_LIMIT) {
        Ok(Some(bytes)) => serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string())),
        Ok(None) => match booted {
            Some(booted) => State::booted(booted),
            None => Ok(State::default()),
        },
        Err(e) => Err(fail(e.to_string())),
    }
}

/// The state file, mode 0600, owned as the root directory is (root on a node).
fn save_state(root: &Root, state: &State) -> Result<(), ApplyError> {
    let fail = |message: String| ApplyError::new("-", format!("write {STATE_PATH}"), message);
    let json = serde_json::to_vec_pretty(state).expect("the state always serializes");
    let (uid, gid) = root.owner().map_err(|e| fail(e.to_string()))?;
    let spec = FileSpec {
        content: &json,
        mode: 0o600,
        uid,
        gid,
    };
    (root.write_if_different(STATE_PATH, spec))
        .map(|_| ())
        .map_err(|e| fail(e.to_string()))
}

/// The node's users and groups, read without following links (a missing file counts as empty).
fn read_owners(root: &Root) -> Result<Owners, ApplyError> {
    let read = |path: &str| match root.read(path, READ_LIMIT) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned()),
        Err(e) => Err(ApplyError::new("-", format!("read {path}"), e)),
    };
    Ok(Owners::parse(&read("/etc/passwd")?, &read("/etc/group")?))
}

fn first_part(payload: &NodePayload) -> &str {
    payload.parts.first().map_or("-", |p| p.name.as_str())
}

/// Every file the payload wants, unit files and drop-ins included, in part order.
fn desired_files<'a>(payload: &'a NodePayload) -> Result<Vec<Desired<'a>>, ApplyError> {
    let mut out: Vec<Desired> = Vec::new();
    for part in &payload.parts {
        for f in &part.files {
            let mode = u32::from_str_radix(&f.permissions, 8).map_err(|_| ApplyError {
                part: part.name.clone(),
                step: format!("write {}", f.path),
                message: format!("permissions {:?} are not octal", f.permissions),
            })?;
            out.push(Desired {
                part: &part.name,
                unit: None,
                path: f.path.clone(),
                mode,
                owner: &f.owner,
                content: &f.content,
            });
        }
        for u in &part.units {
            let unit_file = |path: String, content: &'a str| Desired {
                part: &part.name,
                unit: Some(&u.name),
                path,
                mode: 0o644,
                owner: "root:root",
                content: content.as_bytes(),
            };
            if let Some(content) = &u.content {
                out.push(unit_file(u.file_path(), content));
            }
            for d in &u.drop_ins {
                out.push(unit_file(u.drop_in_path(&d.name), &d.content));
            }
        }
    }
    for d in &out {
        check_path(&d.path).map_err(|message| ApplyError {
            part: d.part.to_owned(),
            step: format!("write {}", d.path.escape_debug()),
            message: message.to_owned(),
        })?;
    }
    // A later file with the same path wins, as in the user-data.
    let mut seen = BTreeSet::new();
    let mut deduped: Vec<Desired> = out
        .into_iter()
        .rev()
        .filter(|d| seen.insert(d.path.clone()))
        .collect();
    deduped.reverse();
    Ok(deduped)
}

/// bootplate renders only clean absolute paths and unit names; the agent checks again, so no
/// payload can write outside the root or beside the unit directory.
fn check_path(path: &str) -> Result<(), &'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("the path is not absolute");
    };
    if rest
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
        || path.contains('\0')
    {
        return Err("the path is not normalised (empty, `.` or `..` segments, or NUL)");
    }
    Ok(())
}

/// The unit a managed path belongs to: `/etc/systemd/system/<unit>` or `<unit>.d/<drop-in>`.
fn unit_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(UNIT_DIR)?.strip_prefix('/')?;
    match rest.split_once('/') {
        Some((dir, _)) => dir.strip_suffix(".d"),
        None => Some(rest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_paths_map_to_their_unit() {
        assert_eq!(unit_of("/etc/systemd/system/a.service"), Some("a.service"));
        assert_eq!(
            unit_of("/etc/systemd/system/a.service.d/10-x.conf"),
            Some("a.service")
        );
        assert_eq!(unit_of("/etc/a.conf"), None);
    }

    #[test]
    fn paths_outside_the_root_are_refused() {
        assert!(check_path("/etc/a.conf").is_ok());
        for bad in ["etc/a", "/etc/../../a", "/etc//a", "/", "/a/./b", "/a\0b"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_unit_name_cannot_climb_out_of_the_unit_directory() {
        let payload = NodePayload {
            parts: vec![PayloadPart {
                name: "p".into(),
                units: vec![crd_types::payload::PayloadUnit {
                    name: "../../../etc/shadow".into(),
                    enable: false,
                    content: Some("x".into()),
                    drop_ins: vec![],
                }],
                ..Default::default()
            }],
        };
        let err = desired_files(&payload).err().expect("refused");
        assert_eq!(err.part, "p");
        assert!(err.message.contains("not normalised"), "{err}");
    }
}
