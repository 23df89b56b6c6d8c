//! The files and systemd units a part writes, and the checks every one of them passes,
//! whether a template's part or a generator's answer wrote it. Below both [`crate::body`]
//! (which assembles a render's output from them) and [`crate::generator`] (which checks a
//! generator's answer into them), so neither needs the other's internals.

use crd_types::FileEncoding;

use crate::error::{Origin, Problem};

/// A file to write, rendered.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct File {
    pub(crate) path: String,
    /// Octal, always four digits (`0644`).
    pub(crate) permissions: String,
    pub(crate) owner: String,
    /// The content, in `encoding`.
    pub(crate) content: String,
    pub(crate) encoding: FileEncoding,
}

/// A systemd unit, rendered.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Unit {
    pub(crate) name: String,
    pub(crate) enable: bool,
    pub(crate) content: Option<String>,
    pub(crate) drop_ins: Vec<(String, String)>,
}

/// Whether systemd reads the file at `path` as a unit file: units, drop-ins and systemd's own
/// configuration, in the directories systemd loads them from.
pub(crate) fn is_systemd_path(path: &str) -> bool {
    const DIRS: [&str; 5] = [
        "/etc/systemd/",
        "/run/systemd/",
        "/usr/lib/systemd/",
        "/lib/systemd/",
        "/usr/local/lib/systemd/",
    ];
    DIRS.iter().any(|dir| path.starts_with(dir))
}

/// A systemd unit's file name: a stem and one of the unit kinds bootplate writes.
pub(crate) fn valid_unit_name(name: &str) -> bool {
    let Some((stem, kind)) = name.rsplit_once('.') else {
        return false;
    };
    matches!(
        kind,
        "service" | "socket" | "timer" | "path" | "mount" | "target"
    ) && !stem.is_empty()
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":_.@-".contains(c))
}

/// A drop-in's file name: a stem and `.conf`.
pub(crate) fn valid_drop_in_name(name: &str) -> bool {
    name.strip_suffix(".conf").is_some_and(|stem| {
        !stem.is_empty()
            && stem
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.@-".contains(c))
    })
}

/// A problem at `field` of the template or of the config, by `origin`.
pub(crate) fn problem(origin: Origin, field: String, message: impl Into<String>) -> Problem {
    match origin {
        Origin::Template => Problem::template(field, message),
        Origin::Config => Problem::config(field, message),
    }
}

/// `0644`-style permissions, normalised to four digits.
pub(crate) fn permissions(
    given: Option<&str>,
    origin: Origin,
    field: &str,
    problems: &mut Vec<Problem>,
) -> String {
    let p = given.unwrap_or("0644");
    let ok = (3..=4).contains(&p.len()) && p.chars().all(|c| ('0'..='7').contains(&c));
    if !ok {
        problems.push(problem(
            origin,
            format!("{field}.permissions"),
            "permissions are three or four octal digits, for example \"0644\"",
        ));
    }
    format!("{p:0>4}")
}

/// `user` or `user:group`, default `root:root`.
pub(crate) fn owner(
    given: Option<&str>,
    origin: Origin,
    field: &str,
    problems: &mut Vec<Problem>,
) -> String {
    let o = given.unwrap_or("root:root");
    let name_ok = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    };
    let ok = match o.split_once(':') {
        Some((u, g)) => name_ok(u) && name_ok(g),
        None => name_ok(o),
    };
    if !ok {
        problems.push(problem(
            origin,
            format!("{field}.owner"),
            "owner is `user` or `user:group` (letters, digits and `_.-`)",
        ));
    }
    o.to_owned()
}

/// A path must be absolute and clean: the formats write it into YAML, JSON and shell, and
/// Ignition rejects relative or unnormalised paths. For the Windows formats (`windows`) it is
/// a Windows path: a drive, `:\`, then names separated by `\`.
pub(crate) fn check_path(path: &str, windows: bool) -> Result<(), &'static str> {
    if windows {
        return check_windows_path(path);
    }
    if !path.starts_with('/') || path.len() < 2 {
        return Err("the path must be absolute, as in /etc/example.conf");
    }
    if path.ends_with('/') {
        return Err("the path must name a file, not end in /");
    }
    if path.chars().any(|c| c.is_control()) {
        return Err("the path must not contain control characters (newline, tab, NUL)");
    }
    if path[1..]
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err("the path must be normalised (no empty, `.` or `..` segments)");
    }
    Ok(())
}

fn check_windows_path(path: &str) -> Result<(), &'static str> {
    let mut chars = path.chars();
    let drive = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !drive || !path[1..].starts_with(":\\") || path.len() < 4 {
        return Err(
            "the path must be an absolute Windows path, as in C:\\k\\kubeadm-join-config.yaml",
        );
    }
    if path.ends_with('\\') {
        return Err("the path must name a file, not end in \\");
    }
    if path
        .chars()
        .any(|c| c.is_control() || "/<>\"|?*".contains(c))
        || path[2..].contains(':')
    {
        return Err(
            "the path must not contain control characters or any of / < > : \" | ? * after the drive",
        );
    }
    if path[3..]
        .split('\\')
        .any(|seg| seg.is_empty() || seg == "." || seg == ".." || seg.ends_with([' ', '.']))
    {
        return Err(
            "the path must be normalised (no empty, `.` or `..` names, none ending in a dot or space)",
        );
    }
    Ok(())
}

/// Checks that encoded content decodes, so a broken file fails the render, not the boot.
pub(crate) fn check_content(content: &str, encoding: FileEncoding) -> Result<(), &'static str> {
    use base64::Engine as _;
    let decode = || {
        base64::engine::general_purpose::STANDARD
            .decode(content.split_ascii_whitespace().collect::<String>())
            .map_err(|_| "the content is not valid base64")
    };
    match encoding {
        FileEncoding::Plain => Ok(()),
        FileEncoding::Base64 => decode().map(|_| ()),
        FileEncoding::GzipBase64 => {
            if decode()?.starts_with(&[0x1f, 0x8b]) {
                Ok(())
            } else {
                Err("the content is base64 but not gzip data")
            }
        }
    }
}
