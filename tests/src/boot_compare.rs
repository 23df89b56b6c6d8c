//! Two boots of the boot proof compared: what each left on its machine (every file, directory
//! and link the boot wrote, with mode, owner and content, and what it deleted) and the
//! commands the boot proof's stubs recorded, in order. For a kubeadm bootstrap provider render
//! and bootplate's render of the same spec, booted by the same cloud-init or Ignition.
//!
//! Bootstrap tokens (`[a-z0-9]{6}.[a-z0-9]{16}`) are replaced by `<token>` everywhere: each
//! render carries its own Machine's token. What the run itself leaves (cloud-init's instance
//! state and logs, the boot proof's own files) is not compared, see [`RUN_NOISE`], nor the
//! order of the lines of an `authorized_keys` file (cloud-init writes a user's keys from a set).

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde_json::{Value, json};

use crate::joins::Boot;

/// What every boot writes whatever the user-data says (or writes differently for two
/// user-data of the same meaning): cloud-init's copies of the user-data, its instance state,
/// logs and caches; Ignition's record of its run (Ignition 2.x writes one, v0.35.0 none); the
/// boot proof's stubs, records and copies.
pub const RUN_NOISE: [&str; 10] = [
    "/etc/.ignition-result.json",
    "/var/lib/cloud",
    "/var/log",
    "/var/cache",
    "/usr/local/bootplate",
    "/run/bootplate",
    "/run/cloud-init",
    "/var/tmp",
    "/etc/selinux",
    "/root/.cache",
];

/// Paths whose comparison docs/migrating.md relaxes: `(path, what is compared)`.
pub struct Allowed<'a> {
    /// The kubeadm configuration file: its kubeadm documents (parsed) and owner, not its mode
    /// (bootplate 0600, the provider 0640) nor its bytes.
    pub kubeadm_files: &'a [&'a str],
    /// Files whose text differs by design (the placeholder): type, mode and owner only.
    pub any_text: &'a [&'a str],
    /// Scripts compared as their non-empty lines, each without the blanks around it (the
    /// provider's Ignition script has empty lines and a trailing blank where bootplate's has
    /// none), with mode and owner.
    pub script_lines: &'a [&'a str],
    /// Files compared as their set of lines (a systemd preset file: each line names another
    /// unit, so their order means nothing), with mode and owner.
    pub any_order: &'a [&'a str],
    /// Users' SSH keys compared as the keys each user is left with (the report's users), not
    /// as the files holding them: for two Ignition releases that keep them differently.
    pub ssh_keys_as_users: bool,
}

/// The files that hold a user's SSH keys: `~/.ssh/authorized_keys`, `~/.ssh/authorized_keys.d`
/// and what is in it (Ignition 2.x writes `ignition` there; Ignition v0.35.0 writes
/// `coreos-ignition` and merges the directory into `authorized_keys`, as Container Linux's
/// update-ssh-keys did, under the lock file `~/.authorized_keys.d.lock`).
fn holds_ssh_keys(path: &str) -> bool {
    path.ends_with("/.ssh/authorized_keys")
        || path.contains("/.ssh/authorized_keys.d")
        || path.ends_with("/.authorized_keys.d.lock")
}

/// The users the boot left (the report's: name, uid, home, shell) with the set of their
/// authorized SSH keys, from whichever file holds them.
pub fn users(boot: &Boot) -> Value {
    let users: Vec<Value> = boot.report["users"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|u| {
            let keys: std::collections::BTreeSet<&str> = u["authorizedKeys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(str::trim))
                .collect();
            json!([u["name"], u["uid"], u["home"], u["shell"], keys])
        })
        .collect();
    json!(users)
}

/// `text` with every bootstrap token replaced by `<token>`.
pub fn without_tokens(text: &str) -> String {
    let bytes = text.as_bytes();
    let token_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let is_token = i + 23 <= bytes.len()
            && (i == 0 || !token_char(bytes[i - 1]))
            && bytes[i..i + 6].iter().all(|b| token_char(*b))
            && bytes[i + 6] == b'.'
            && bytes[i + 7..i + 23].iter().all(|b| token_char(*b))
            && (i + 23 == bytes.len() || !token_char(bytes[i + 23]));
        if is_token {
            out.push_str("<token>");
            i += 23;
        } else {
            let c = text[i..].chars().next().expect("a character");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `text` without the line cloud-init stamps the files it makes with (`# Created by cloud-init
/// v. 22.4.2 on <date>`): the time of the boot.
pub fn without_stamps(text: &str) -> String {
    text.split_inclusive('\n')
        .filter(|l| !l.starts_with("# Created by cloud-init v. "))
        .collect()
}

/// What one boot wrote: the overlay's upper layer (the root's changes) and the copy of /run,
/// path → `[kind, mode, uid:gid, content]`, without [`RUN_NOISE`].
pub fn written(boot: &Boot) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    walk(&boot.dir.join("upper"), "", &mut out);
    walk(&boot.dir.join("run"), "/run", &mut out);
    out
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Value>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        if RUN_NOISE
            .iter()
            .any(|n| path == *n || path.starts_with(&format!("{n}/")))
        {
            continue;
        }
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        let mode = format!("{:04o}", meta.mode() & 0o7777);
        let owner = format!("{}:{}", meta.uid(), meta.gid());
        let kind = meta.file_type();
        let value = if kind.is_dir() {
            walk(&entry.path(), &path, out);
            json!(["directory", mode, owner])
        } else if kind.is_symlink() {
            let target = std::fs::read_link(entry.path()).unwrap_or_default();
            json!(["link", target.to_string_lossy()])
        } else if kind.is_char_device() && meta.rdev() == 0 {
            // An overlay whiteout: the boot deleted what the image had there.
            json!(["deleted"])
        } else {
            let content = std::fs::read(entry.path()).unwrap_or_default();
            let mut text = without_tokens(&without_stamps(&String::from_utf8_lossy(&content)));
            if path.ends_with("/.ssh/authorized_keys") {
                // cloud-init writes a user's keys from a set: in no fixed order.
                let mut keys: Vec<&str> = text.lines().collect();
                keys.sort_unstable();
                text = keys.join("\n");
            }
            json!(["file", mode, owner, text])
        };
        out.insert(path, value);
    }
}

/// The stub calls of a boot, `program arg...` with tokens replaced, in order.
pub fn commands(boot: &Boot) -> Vec<String> {
    boot.report["stubCalls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let mut words = vec![c["program"].as_str().unwrap_or_default().to_owned()];
            words.extend(
                c["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| a.as_str().unwrap_or_default().to_owned()),
            );
            without_tokens(&words.join(" "))
        })
        .collect()
}

/// The differences between the provider's boot (`theirs`) and bootplate's (`ours`), one line
/// each; empty when they left the same machine behind and ran the same commands in order.
pub fn differences(
    theirs: &Boot,
    ours: &Boot,
    allowed: &Allowed,
    kubeadm_documents: impl Fn(&str) -> Value,
) -> Vec<String> {
    let relax = |path: &str, value: &Value| -> Value {
        let mut value = value.clone();
        if allowed.kubeadm_files.contains(&path) && value[0] == "file" {
            value = json!([
                "kubeadm file",
                value[2],
                kubeadm_documents(value[3].as_str().unwrap())
            ]);
        } else if allowed.any_text.contains(&path) && value[0] == "file" {
            value[3] = json!("<any text>");
        } else if allowed.script_lines.contains(&path) && value[0] == "file" {
            let text = value[3].as_str().unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            value[3] = json!(lines);
        } else if allowed.any_order.contains(&path) && value[0] == "file" {
            let text = value[3].as_str().unwrap_or_default();
            let lines: std::collections::BTreeSet<&str> = text.lines().collect();
            value[3] = json!(lines);
        }
        value
    };
    let (a, b) = (written(theirs), written(ours));
    let mut out = Vec::new();
    for path in a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|p| !(allowed.ssh_keys_as_users && holds_ssh_keys(p)))
    {
        let (x, y) = (a.get(path), b.get(path));
        let (x, y) = (x.map(|v| relax(path, v)), y.map(|v| relax(path, v)));
        if x != y {
            out.push(format!(
                "{path}:\n    kubeadm provider: {}\n    bootplate:        {}",
                x.map_or("(not written)".into(), |v| v.to_string()),
                y.map_or("(not written)".into(), |v| v.to_string()),
            ));
        }
    }
    let (a, b) = (commands(theirs), commands(ours));
    if a != b {
        out.push(format!(
            "the commands run (stub calls, in order):\n    kubeadm provider: {a:?}\n    bootplate:        {b:?}"
        ));
    }
    let (a, b) = (users(theirs), users(ours));
    if a != b {
        out.push(format!(
            "the users (name, uid, home, shell, SSH keys):\n    kubeadm provider: {a}\n    bootplate:        {b}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::without_tokens;

    #[test]
    fn tokens_are_replaced_and_nothing_else() {
        assert_eq!(
            without_tokens("token: abcdef.0123456789abcdef\nx"),
            "token: <token>\nx"
        );
        assert_eq!(
            without_tokens("--token=abcdef.0123456789abcdef"),
            "--token=<token>"
        );
        // Not a token: a longer word, an upper-case letter.
        assert_eq!(
            without_tokens("xabcdef.0123456789abcdef"),
            "xabcdef.0123456789abcdef"
        );
        assert_eq!(
            without_tokens("Abcdef.0123456789abcdef é"),
            "Abcdef.0123456789abcdef é"
        );
    }
}
