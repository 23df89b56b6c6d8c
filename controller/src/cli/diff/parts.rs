//! What `bootplate diff` shows of two renders: each part that differs as a unified diff of its
//! files, units and commands written out as text, with secrets masked, and for a change that
//! applies in place what bootplate-agent will do on the node.
//!
//! Nothing secret is printed: both renders use stand-ins (a sample token, sample certificates),
//! but a template or a config may still write a key or a token of its own, so every PEM block
//! becomes its type and a digest (a changed key shows as a changed digest) and every string
//! shaped like a bootstrap token becomes `<bootstrap token>`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use crd_types::UpdateStrategy;
use crd_types::payload::{NodePayload, PayloadFile, PayloadPart, PayloadUnit};
use render::{PartsRender, Renders};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// How many unchanged lines a hunk shows around a change.
const CONTEXT_LINES: usize = 3;

/// One part (or other piece of the render) whose content differs.
#[derive(Clone, Debug, Serialize)]
pub struct PartDiff {
    /// The part's name; `(config)` for the config's own files and commands, `(raw template)`
    /// for a raw `spec.template`'s own output, `(output)` for a raw template's whole output.
    pub part: String,
    /// `InPlace` or `Rollout` (in the new render, else the old); none for what is not a part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update: Option<&'static str>,
    /// `changed`, `added` or `removed`.
    pub change: &'static str,
    /// The unified diff of the part written out as text, secrets masked.
    pub diff: String,
}

/// The pieces of two renders that differ, in the new render's order.
pub fn differences(old: &Renders, new: &Renders) -> Vec<PartDiff> {
    match (old, new) {
        (Renders::Parts(old), Renders::Parts(new)) => part_differences(old, new),
        (Renders::Whole(old), Renders::Whole(new)) => piece(
            "(output)",
            None,
            Some(&bytes_text(old)),
            Some(&bytes_text(new)),
        )
        .into_iter()
        .collect(),
        // `render::compare` renders both sides the same way (parts only when both have them).
        _ => Vec::new(),
    }
}

fn part_differences(old: &PartsRender, new: &PartsRender) -> Vec<PartDiff> {
    let mut found = Vec::new();
    if old.format != new.format {
        let (o, n) = (old.format.to_string(), new.format.to_string());
        found.extend(piece("(format)", None, Some(&o), Some(&n)));
    }
    let raw = |r: &PartsRender| r.raw.as_deref().map(mask);
    found.extend(piece(
        "(raw template)",
        None,
        raw(old).as_deref(),
        raw(new).as_deref(),
    ));
    let config = |r: &PartsRender| part_text(&r.config);
    found.extend(piece(
        "(config)",
        None,
        Some(&config(old)),
        Some(&config(new)),
    ));
    let mut names: Vec<&str> = new.parts.iter().map(|p| p.content.name.as_str()).collect();
    for p in &old.parts {
        if !names.contains(&p.content.name.as_str()) {
            names.push(&p.content.name);
        }
    }
    for name in names {
        let text = |r: &PartsRender| {
            let part = r.parts.iter().find(|p| p.content.name == name)?;
            let text = part_text(&part.content);
            (!text.is_empty()).then_some((text, part.update))
        };
        let (before, after) = (text(old), text(new));
        let update = after.as_ref().or(before.as_ref()).map(|(_, u)| match u {
            UpdateStrategy::InPlace => "InPlace",
            _ => "Rollout",
        });
        let (before, after) = (before.map(|b| b.0), after.map(|a| a.0));
        found.extend(piece(name, update, before.as_deref(), after.as_deref()));
    }
    found
}

/// The diff of one piece, when its two texts differ (`None`: the piece is absent there).
fn piece(
    name: &str,
    update: Option<&'static str>,
    old: Option<&str>,
    new: Option<&str>,
) -> Option<PartDiff> {
    if old == new {
        return None;
    }
    let change = match (old, new) {
        (None, _) => "added",
        (_, None) => "removed",
        _ => "changed",
    };
    let (old, new) = (old.unwrap_or(""), new.unwrap_or(""));
    let diff = similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(CONTEXT_LINES)
        .header("old", "new")
        .to_string();
    Some(PartDiff {
        part: name.to_owned(),
        update,
        change,
        diff,
    })
}

/// A part written out as text, one block per file, unit and command; empty when it renders
/// nothing.
pub fn part_text(part: &PayloadPart) -> String {
    let mut out = String::new();
    for f in &part.files {
        out.push_str(&format!(
            "file {} (mode {}, owner {})\n",
            f.path,
            or_default(&f.permissions),
            or_default(&f.owner)
        ));
        out.push_str(&indented(&bytes_text(&f.content)));
    }
    for u in &part.units {
        let enable = if u.enable { ", enabled" } else { "" };
        out.push_str(&format!("unit {}{enable}\n", u.name));
        if let Some(content) = &u.content {
            out.push_str(&indented(&mask(content)));
        }
        for d in &u.drop_ins {
            out.push_str(&format!("unit {} drop-in {}\n", u.name, d.name));
            out.push_str(&indented(&mask(&d.content)));
        }
    }
    for (i, c) in part.commands.iter().enumerate() {
        out.push_str(&format!("command {i}\n"));
        out.push_str(&indented(&mask(c)));
    }
    out
}

fn or_default(s: &str) -> &str {
    if s.is_empty() { "default" } else { s }
}

fn indented(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// Bytes as text, masked: UTF-8 as it is, anything else as its size and digest.
fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => mask(text),
        Err(_) => format!("<{} bytes of binary data, {}>", bytes.len(), digest(bytes)),
    }
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", &hex::encode(Sha256::digest(bytes))[..12])
}

static PEM: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"(?s)-----BEGIN ([A-Z0-9 ]+)-----.*?-----END [A-Z0-9 ]+-----")
        .expect("a valid pattern")
});

/// `text` with every PEM block replaced by its type and a digest of the block, and every
/// bootstrap token by `<bootstrap token>`.
pub fn mask(text: &str) -> String {
    let pem = PEM.replace_all(text, |c: &regex::Captures<'_>| {
        format!("<{} {}>", c[1].to_lowercase(), digest(c[0].as_bytes()))
    });
    bootplate::core::redact_tokens(&pem, "<bootstrap token>")
}

/// What bootplate-agent does on a node that goes from the payload of `old` to that of `new`
/// (docs/in-place.md, "bootplate-agent"): the files it writes and removes, the units it
/// restarts, and the parts whose commands run (every part's, once per new payload revision).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct AgentActions {
    pub write: Vec<String>,
    pub remove: Vec<String>,
    pub restart: Vec<String>,
    #[serde(rename = "runCommandsOf")]
    pub run_commands_of: Vec<String>,
}

impl AgentActions {
    pub fn between(old: &PartsRender, new: &PartsRender) -> AgentActions {
        let (old, new) = (old.payload(), new.payload());
        let (old_paths, new_paths) = (paths(&old), paths(&new));
        let write: Vec<String> = (new_paths.iter())
            .filter(|(path, what)| old_paths.get(*path) != Some(what))
            .map(|(path, _)| path.clone())
            .collect();
        let remove = (old_paths.keys())
            .filter(|p| !new_paths.contains_key(*p))
            .cloned()
            .collect();
        let written: BTreeSet<&String> = write.iter().collect();
        let mut restart = Vec::new();
        for part in &new.parts {
            let part_files = part.files.iter().any(|f| written.contains(&f.path));
            for unit in part.units.iter().filter(|u| u.enable) {
                let own = unit_paths(unit).iter().any(|(p, _)| written.contains(p));
                if own || part_files {
                    restart.push(unit.name.clone());
                }
            }
        }
        let run_commands_of = (new.parts.iter())
            .filter(|p| !p.commands.is_empty())
            .map(|p| p.name.clone())
            .collect();
        AgentActions {
            write,
            remove,
            restart,
            run_commands_of,
        }
    }
}

/// Every path a payload writes, with what it writes there.
fn paths(payload: &NodePayload) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for part in &payload.parts {
        for f in &part.files {
            out.insert(f.path.clone(), file_key(f));
        }
        for u in &part.units {
            out.extend(unit_paths(u));
        }
    }
    out
}

fn file_key(f: &PayloadFile) -> String {
    format!("{} {} {}", f.permissions, f.owner, digest(&f.content))
}

/// A unit's file and drop-ins, where the agent writes them.
fn unit_paths(u: &PayloadUnit) -> Vec<(String, String)> {
    let dir = "/etc/systemd/system";
    let mut out: Vec<(String, String)> = (u.content.iter())
        .map(|c| (format!("{dir}/{}", u.name), digest(c.as_bytes())))
        .collect();
    out.extend(u.drop_ins.iter().map(|d| {
        let path = format!("{dir}/{}.d/{}", u.name, d.name);
        (path, digest(d.content.as_bytes()))
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_tokens_are_masked_and_a_changed_key_shows_as_a_changed_digest() {
        let key = |body: &str| {
            format!("a\n-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\nb\n")
        };
        let (one, two) = (mask(&key("MIIEsecret1")), mask(&key("MIIEsecret2")));
        for masked in [&one, &two] {
            assert!(!masked.contains("MIIE"), "{masked}");
            assert!(masked.contains("<private key sha256:"), "{masked}");
        }
        assert_ne!(one, two);
        let joined = mask("kubeadm join --token abcdef.0123456789abcdef x");
        assert_eq!(joined, "kubeadm join --token <bootstrap token> x");
        assert_eq!(
            bytes_text(&[0xff, 0x00]),
            format!("<2 bytes of binary data, {}>", digest(&[0xff, 0x00]))
        );
    }
}
