//! Applying a payload to a node: files written atomically with their mode and owner, unit files
//! and drop-ins, `daemon-reload` when any changed, restarts for the units that changed only,
//! removal of what an earlier payload wrote and this one no longer has, and the commands once
//! per payload revision. No Kubernetes client: the payload comes in, a report or an error that
//! names the part and the step comes out.
//!
//! What the agent wrote is remembered in a state file under the root, so a later payload can
//! remove it and drift (a file changed by hand) is put back on the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crd_types::payload::{NodePayload, PayloadPart};
use serde::{Deserialize, Serialize};

use crate::owner::Owners;

/// Where the agent keeps what it applied, under the root.
pub const STATE_PATH: &str = "/var/lib/bootplate-agent/state.json";
const UNIT_DIR: &str = "/etc/systemd/system";

/// How the agent reaches the node.
#[derive(Clone, Debug)]
pub struct Node {
    /// The directory the node's paths are under: `/` on a node, a directory in tests.
    pub root: PathBuf,
    /// The program run as `systemctl` (tests pass a stub that records its arguments).
    pub systemctl: OsString,
    /// The shell that runs commands (`sh -c COMMAND`).
    pub shell: OsString,
}

/// A step that failed: the part it belongs to, what was being done, and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("part `{part}`: {step}: {message}")]
pub struct ApplyError {
    /// The part's name (`-` for the removal of what no part holds any more).
    pub part: String,
    /// The step, for example `write /etc/containerd/config.toml` or `command 2`.
    pub step: String,
    /// The cause.
    pub message: String,
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

/// What the agent applied before (the state file).
#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct State {
    /// Managed path → the part that wrote it.
    files: BTreeMap<String, String>,
    /// Units the agent wrote or enabled.
    units: BTreeSet<String>,
    /// The revision whose commands completed.
    commands_revision: Option<String>,
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
    /// The node's path `path` (absolute) under the root.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Applies `payload`: see the module doc. Stops at the first failing step; what was written
    /// before it stays (each file whole, old or new) and is remembered for the next pass.
    pub fn apply(&self, payload: &NodePayload) -> Result<Applied, ApplyError> {
        let mut state = self.load_state()?;
        let revision = payload.revision();
        let result = self.apply_with(payload, &revision, &mut state);
        self.save_state(&state)?;
        result
    }

    fn apply_with(
        &self,
        payload: &NodePayload,
        revision: &str,
        state: &mut State,
    ) -> Result<Applied, ApplyError> {
        let owners = Owners::read(&self.root);
        let desired = desired_files(payload)?;
        let mut applied = Applied {
            revision: revision.to_owned(),
            ..Applied::default()
        };
        // Units whose own files changed, and parts whose plain files changed.
        let mut changed_units = BTreeSet::new();
        let mut changed_parts = BTreeSet::new();
        for file in &desired {
            let fail = |message: String| ApplyError {
                part: file.part.to_owned(),
                step: format!("write {}", file.path),
                message,
            };
            let (uid, gid) = owners.resolve(file.owner).map_err(fail)?;
            let written = write_if_different(&self.path(&file.path), file, uid, gid)
                .map_err(|e| fail(e.to_string()))?;
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
            &desired,
            &wanted_units,
            state,
            &mut applied,
            &mut changed_units,
        )?;
        if !changed_units.is_empty() {
            self.systemctl(first_part(payload), &["daemon-reload"])?;
        }
        for part in &payload.parts {
            for unit in part.units.iter().filter(|u| u.enable) {
                let restart =
                    changed_units.contains(&unit.name) || changed_parts.contains(&part.name);
                if !state.units.contains(&unit.name) || changed_units.contains(&unit.name) {
                    self.systemctl(&part.name, &["enable", &unit.name])?;
                }
                state.units.insert(unit.name.clone());
                if restart {
                    self.systemctl(&part.name, &["restart", &unit.name])?;
                    applied.restarted.push(unit.name.clone());
                }
            }
        }
        if state.commands_revision.as_deref() != Some(revision) {
            for part in &payload.parts {
                self.run_commands(part)?;
            }
            state.commands_revision = Some(revision.to_owned());
            applied.commands_ran = true;
        }
        Ok(applied)
    }

    /// Removes what the state holds and the payload no longer has; a unit no longer wanted is
    /// stopped and disabled first.
    fn remove_stale(
        &self,
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
            match std::fs::remove_file(self.path(&path)) {
                Ok(()) => applied.removed.push(path.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ApplyError {
                        part,
                        step: format!("remove {path}"),
                        message: e.to_string(),
                    });
                }
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
        let output = Command::new(&self.systemctl)
            .args(args)
            .output()
            .map_err(|e| ApplyError {
                part: part.to_owned(),
                step: step.clone(),
                message: format!("cannot run {}: {e}", self.systemctl.to_string_lossy()),
            })?;
        check_output(part, step, &output)
    }

    fn run_commands(&self, part: &PayloadPart) -> Result<(), ApplyError> {
        for (i, command) in part.commands.iter().enumerate() {
            let step = format!("command {i}");
            let output = Command::new(&self.shell)
                .arg("-c")
                .arg(command)
                .current_dir(&self.root)
                .env("BOOTPLATE_ROOT", &self.root)
                .output()
                .map_err(|e| ApplyError {
                    part: part.name.clone(),
                    step: step.clone(),
                    message: format!("cannot run {}: {e}", self.shell.to_string_lossy()),
                })?;
            check_output(&part.name, step, &output)?;
        }
        Ok(())
    }

    fn load_state(&self) -> Result<State, ApplyError> {
        let fail = |message: String| ApplyError {
            part: "-".into(),
            step: format!("read {STATE_PATH}"),
            message,
        };
        match std::fs::read(self.path(STATE_PATH)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(fail(e.to_string())),
        }
    }

    fn save_state(&self, state: &State) -> Result<(), ApplyError> {
        let json = serde_json::to_vec_pretty(state).expect("the state always serializes");
        let path = self.path(STATE_PATH);
        let (uid, gid) = (current_ids(&self.root)).unwrap_or((0, 0));
        let file = Desired {
            part: "-",
            unit: None,
            path: STATE_PATH.into(),
            mode: 0o600,
            owner: "",
            content: &json,
        };
        write_if_different(&path, &file, uid, gid)
            .map(|_| ())
            .map_err(|e| ApplyError {
                part: "-".into(),
                step: format!("write {STATE_PATH}"),
                message: e.to_string(),
            })
    }
}

/// The owner the root directory has: the state file gets it (root on a node).
fn current_ids(root: &Path) -> Option<(u32, u32)> {
    std::fs::metadata(root).ok().map(|m| (m.uid(), m.gid()))
}

fn check_output(part: &str, step: String, output: &std::process::Output) -> Result<(), ApplyError> {
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: String = stderr
        .trim()
        .chars()
        .rev()
        .take(300)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(ApplyError {
        part: part.to_owned(),
        step,
        message: format!("{}: {tail}", output.status),
    })
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
                out.push(unit_file(format!("{UNIT_DIR}/{}", u.name), content));
            }
            for d in &u.drop_ins {
                out.push(unit_file(
                    format!("{UNIT_DIR}/{}.d/{}", u.name, d.name),
                    &d.content,
                ));
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

/// Writes `file` at `target` unless it already has the content, mode and owner: into a
/// temporary file in the same directory, synced, then renamed over the target, so a reader (or
/// a crash) sees the old file or the new one, never a part. Returns whether it wrote.
fn write_if_different(target: &Path, file: &Desired, uid: u32, gid: u32) -> std::io::Result<bool> {
    if let Ok(meta) = std::fs::symlink_metadata(target)
        && meta.is_file()
        && meta.mode() & 0o7777 == file.mode
        && meta.uid() == uid
        && meta.gid() == gid
        && std::fs::read(target)? == file.content
    {
        return Ok(false);
    }
    let dir = target.parent().expect("a node path has a parent");
    std::fs::create_dir_all(dir)?;
    let name = target.file_name().expect("a node path names a file");
    let mut temp_name = OsString::from(".");
    temp_name.push(name);
    temp_name.push(".bootplate-tmp");
    let temp = dir.join(temp_name);
    let written = (|| {
        let mut out = std::fs::File::create(&temp)?;
        out.write_all(file.content)?;
        out.set_permissions(std::fs::Permissions::from_mode(file.mode))?;
        let meta = out.metadata()?;
        if meta.uid() != uid || meta.gid() != gid {
            std::os::unix::fs::fchown(&out, Some(uid), Some(gid))?;
        }
        out.sync_all()?;
        std::fs::rename(&temp, target)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map(|()| true)
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
