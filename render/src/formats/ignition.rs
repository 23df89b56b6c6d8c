//! `ignition`: an Ignition spec 3.3 config. Files become `storage.files` with data URLs, units
//! `systemd.units` (with drop-ins), and the commands a script that a oneshot unit runs once,
//! after the network is up, on the first boot.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use crd_types::FileEncoding;
use serde::Serialize;

use super::{Meta, report, script};
use crate::body::Body;
use crate::files::{File, Unit};

/// Where the commands script is written, and the marker it leaves so it runs only once.
const SCRIPT_PATH: &str = "/etc/bootplate/bootstrap.sh";
const DONE_MARKER: &str = "/etc/bootplate/bootstrap.done";
const SCRIPT_UNIT: &str = "bootplate-bootstrap.service";

#[derive(Serialize)]
struct Config {
    ignition: Ignition,
    storage: Storage,
    systemd: Systemd,
}

#[derive(Serialize)]
struct Ignition {
    version: &'static str,
}

#[derive(Serialize)]
struct Storage {
    files: Vec<IgnFile>,
}

#[derive(Serialize)]
struct IgnFile {
    path: String,
    mode: u32,
    overwrite: bool,
    user: Name,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<Name>,
    contents: Contents,
}

#[derive(Serialize)]
struct Name {
    name: String,
}

#[derive(Serialize)]
struct Contents {
    source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    compression: Option<&'static str>,
}

#[derive(Serialize)]
struct Systemd {
    units: Vec<IgnUnit>,
}

#[derive(Serialize)]
struct IgnUnit {
    name: String,
    enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    contents: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    dropins: Vec<DropIn>,
}

#[derive(Serialize)]
struct DropIn {
    name: String,
    contents: String,
}

/// The Ignition JSON of `body`.
pub(super) fn write(meta: &Meta<'_>, body: &Body) -> String {
    let reporter = meta.report.map(report::files).into_iter().flatten();
    let mut files: Vec<IgnFile> = reporter
        .chain(body.files.iter().cloned())
        .filter(|f| f.path != SCRIPT_PATH)
        .map(|f| file(&f))
        .collect();
    let script = commands_script(meta, body);
    // A fetch stub's script goes gzipped: it must fit in its limit (fetch::STUB_LIMIT).
    let (content, encoding) = if meta.stub {
        let gzipped = crate::helpers::gzip(script.as_bytes());
        (BASE64.encode(gzipped), FileEncoding::GzipBase64)
    } else {
        (script, FileEncoding::Plain)
    };
    files.push(file(&File {
        path: SCRIPT_PATH.to_owned(),
        permissions: "0700".to_owned(),
        owner: "root:root".to_owned(),
        content,
        encoding,
    }));
    let mut units: Vec<IgnUnit> = body
        .units
        .iter()
        .filter(|u| u.name != SCRIPT_UNIT)
        .map(unit)
        .collect();
    units.push(IgnUnit {
        name: SCRIPT_UNIT.to_owned(),
        enabled: true,
        contents: Some(script_unit()),
        dropins: Vec::new(),
    });
    let config = Config {
        ignition: Ignition { version: "3.3.0" },
        storage: Storage { files },
        systemd: Systemd { units },
    };
    // Plain structs of strings, numbers and booleans always serialize. A stub is compact.
    let mut json = if meta.stub {
        serde_json::to_string(&config)
    } else {
        serde_json::to_string_pretty(&config)
    }
    .expect("an Ignition config serializes");
    json.push('\n');
    json
}

/// The commands script: the bootplate header, the commands, the sentinel, the done marker.
/// Ignition declares the units natively; the `enable` of units with only drop-ins stays among
/// the steps: `enabled` presets a unit at first boot only if its file exists then, and such a
/// unit may come from a package the commands install.
fn commands_script(meta: &Meta<'_>, body: &Body) -> String {
    let mut out = script::header(meta);
    let mut commands = report::lay_out(report::steps(body, true), meta.report, false, !meta.stub);
    commands.push(format!("touch {DONE_MARKER}"));
    script::commands(&mut out, &commands);
    out
}

fn script_unit() -> String {
    format!(
        "[Unit]\n\
         Description=bootplate bootstrap commands (run once)\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         ConditionPathExists=!{DONE_MARKER}\n\
         \n\
         [Service]\n\
         Type=oneshot\n\
         RemainAfterExit=yes\n\
         ExecStart={SCRIPT_PATH}\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

fn unit(u: &Unit) -> IgnUnit {
    IgnUnit {
        name: u.name.clone(),
        enabled: u.enable,
        contents: u.content.clone(),
        dropins: (u.drop_ins.iter())
            .map(|(name, contents)| DropIn {
                name: name.clone(),
                contents: contents.clone(),
            })
            .collect(),
    }
}

/// A `storage.files` entry of `f`, as JSON (for a raw body's output).
pub(super) fn file_json(f: &File) -> serde_json::Value {
    serde_json::to_value(file(f)).expect("an Ignition file serializes")
}

/// A `systemd.units` entry of `u`, as JSON (for a raw body's output).
pub(super) fn unit_json(u: &Unit) -> serde_json::Value {
    serde_json::to_value(unit(u)).expect("an Ignition unit serializes")
}

fn file(f: &File) -> IgnFile {
    let (user, group) = match f.owner.split_once(':') {
        Some((u, g)) => (u.to_owned(), Some(Name { name: g.to_owned() })),
        None => (f.owner.clone(), None),
    };
    let contents = match f.encoding {
        FileEncoding::Plain => Contents {
            source: data_url(f.content.as_bytes()),
            compression: None,
        },
        FileEncoding::Base64 => Contents {
            source: format!("data:;base64,{}", compact(&f.content)),
            compression: None,
        },
        FileEncoding::GzipBase64 => Contents {
            source: format!("data:;base64,{}", compact(&f.content)),
            compression: Some("gzip"),
        },
    };
    IgnFile {
        path: f.path.clone(),
        // Checked octal digits.
        mode: u32::from_str_radix(&f.permissions, 8).unwrap_or(0o644),
        overwrite: true,
        user: Name { name: user },
        group,
        contents,
    }
}

/// Base64 in a data URL has no line breaks.
fn compact(b64: &str) -> String {
    b64.split_ascii_whitespace().collect()
}

/// The shorter of a percent-encoded (readable) and a base64 data URL.
fn data_url(data: &[u8]) -> String {
    let mut percent = String::from("data:,");
    for &b in data {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            percent.push(b as char);
        } else {
            percent.push_str(&format!("%{b:02X}"));
        }
    }
    let base64 = format!("data:;base64,{}", BASE64.encode(data));
    if base64.len() < percent.len() {
        base64
    } else {
        percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls() {
        assert_eq!(data_url(b"a b\n"), "data:,a%20b%0A");
        assert_eq!(data_url("é".as_bytes()), "data:,%C3%A9");
        let binary = [0u8; 30];
        assert!(data_url(&binary).starts_with("data:;base64,"));
    }
}
