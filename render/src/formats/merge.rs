//! A raw `template` body's output with what its parts add (docs/in-place.md): their files,
//! units and commands merged into the document the raw body wrote, in the format's own terms.
//! cloud-config: the files appended to `write_files`, the commands (each in a subshell that
//! stops the script when it fails) run first in `runcmd`; the document is written again after
//! its leading comments, every string double-quoted or a literal block (YAML 1.1 and 1.2 read
//! it alike). Ignition: the files appended
//! to `storage.files`, the units to `systemd.units`, the commands a script that a oneshot unit
//! runs once, before the body's own units.

use serde_json::{Value, json};

use super::{enable_commands, files_to_write, ignition, unit_commands};
use crate::body::Body;
use crate::files::File;
use crate::helpers::push_yaml_double_quoted;
use crate::yaml::YamlLimit;
use crd_types::{FileEncoding, OutputFormat};

/// Where the parts' commands go in Ignition output, the marker that they ran and their unit.
const SCRIPT_PATH: &str = "/etc/bootplate/parts.sh";
const DONE_MARKER: &str = "/etc/bootplate/parts.done";
const SCRIPT_UNIT: &str = "bootplate-parts.service";

/// `raw` with `body` merged in; `raw` unchanged when `body` adds nothing.
pub(crate) fn merge_raw(format: OutputFormat, raw: String, body: &Body) -> Result<String, String> {
    if body.files.is_empty() && body.units.is_empty() && body.commands.is_empty() {
        return Ok(raw);
    }
    match format {
        OutputFormat::CloudConfig => cloud_config(&raw, body),
        OutputFormat::Ignition => ignition(&raw, body),
        other => Err(format!(
            "parts beside a raw spec.template cannot be added to {other} output"
        )),
    }
}

/// Every command of `body` in order: units reloaded and enabled, the parts' commands, the units
/// they install enabled.
fn commands(body: &Body) -> Vec<String> {
    let mut commands = unit_commands(body);
    commands.extend(body.commands.iter().cloned());
    commands.extend(enable_commands(body, false));
    commands
}

fn cloud_config(raw: &str, body: &Body) -> Result<String, String> {
    // Bounded: the document is written out again, every alias expanded.
    let mut doc: serde_yaml::Value =
        crate::yaml::from_str(raw, YamlLimit::document(raw)).map_err(|e| super::yaml_error(&e))?;
    let map = doc
        .as_mapping_mut()
        .ok_or("the raw cloud-config is not a mapping")?;
    // In a Jinja user-data, what the parts add is text for cloud-init to write as it is.
    let jinja = raw.starts_with(crate::jinja::HEADER);
    let literal = |s: &str| {
        if jinja {
            crate::jinja::escape(s).into_owned()
        } else {
            s.to_owned()
        }
    };
    let files = list(map, "write_files")?;
    files.extend(
        files_to_write(body, None)
            .iter()
            .map(|f| yaml_file(f, literal)),
    );
    let runcmd = list(map, "runcmd")?;
    let added = commands(body)
        .into_iter()
        .map(|c| literal(&format!("(\n{}\n) || exit $?", c.trim_end())).into());
    let own = std::mem::take(runcmd);
    runcmd.extend(added.chain(own));
    // The raw body's leading comment lines (`#cloud-config` and what it says of itself).
    let mut out: String = (raw.lines())
        .take_while(|l| l.starts_with('#'))
        .flat_map(|l| [l, "\n"])
        .collect();
    emit(&mut out, &doc, 0, false)?;
    Ok(out)
}

/// The list under `key` in the raw cloud-config, made empty when it is missing.
fn list<'a>(
    map: &'a mut serde_yaml::Mapping,
    key: &str,
) -> Result<&'a mut Vec<serde_yaml::Value>, String> {
    (map.entry(key.into()))
        .or_insert_with(|| serde_yaml::Value::Sequence(Vec::new()))
        .as_sequence_mut()
        .ok_or_else(|| format!("the raw cloud-config's {key} is not a list"))
}

fn yaml_file(f: &File, literal: impl Fn(&str) -> String) -> serde_yaml::Value {
    let mut m = serde_yaml::Mapping::new();
    m.insert("path".into(), literal(&f.path).into());
    m.insert("owner".into(), literal(&f.owner).into());
    m.insert("permissions".into(), f.permissions.clone().into());
    match f.encoding {
        FileEncoding::Plain => {}
        FileEncoding::Base64 => drop(m.insert("encoding".into(), "b64".into())),
        FileEncoding::GzipBase64 => drop(m.insert("encoding".into(), "gz+b64".into())),
    }
    m.insert("content".into(), literal(&f.content).into());
    serde_yaml::Value::Mapping(m)
}

/// Writes `v` as block YAML at `indent`; `inline` when the line is already started (a list
/// item's dash). Strings are double-quoted or literal blocks (as the structured writer's).
fn emit(
    out: &mut String,
    v: &serde_yaml::Value,
    indent: usize,
    inline: bool,
) -> Result<(), String> {
    use serde_yaml::Value as Y;
    let pad = " ".repeat(indent);
    match v {
        Y::Mapping(m) if !m.is_empty() => {
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 || !inline {
                    out.push_str(&pad);
                }
                emit_key(out, k)?;
                match v {
                    Y::Mapping(m) if !m.is_empty() => {
                        out.push('\n');
                        emit(out, v, indent + 2, false)?;
                    }
                    Y::Sequence(s) if !s.is_empty() => {
                        out.push('\n');
                        emit(out, v, indent + 2, false)?;
                    }
                    _ => {
                        out.push(' ');
                        emit_scalar(out, v, indent + 2)?;
                    }
                }
            }
        }
        Y::Sequence(s) if !s.is_empty() => {
            for (i, item) in s.iter().enumerate() {
                if i > 0 || !inline {
                    out.push_str(&pad);
                }
                out.push_str("- ");
                emit(out, item, indent + 2, true)?;
            }
        }
        _ => emit_scalar(out, v, indent)?,
    }
    Ok(())
}

/// A mapping key and its colon: plain when it is a name no YAML reader takes for anything but
/// a string, double-quoted otherwise.
fn emit_key(out: &mut String, k: &serde_yaml::Value) -> Result<(), String> {
    let key = k
        .as_str()
        .ok_or("the raw cloud-config has a key that is not a string")?;
    let plain = key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !matches!(
            key.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
        );
    if plain {
        out.push_str(key);
    } else {
        push_yaml_double_quoted(out, key);
    }
    out.push(':');
    Ok(())
}

/// A scalar (or an empty collection) and the line's end; strings as the structured writer
/// writes them, literal blocks indented by `indent`.
fn emit_scalar(out: &mut String, v: &serde_yaml::Value, indent: usize) -> Result<(), String> {
    use serde_yaml::Value as Y;
    match v {
        Y::Null => out.push_str("null"),
        Y::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Y::Number(n) => out.push_str(&n.to_string()),
        Y::String(s) => {
            super::cloud_config::scalar(out, s, indent);
            return Ok(());
        }
        Y::Mapping(_) => out.push_str("{}"),
        Y::Sequence(_) => out.push_str("[]"),
        Y::Tagged(_) => return Err("the raw cloud-config holds a YAML tag".to_owned()),
    }
    out.push('\n');
    Ok(())
}

fn ignition(raw: &str, body: &Body) -> Result<String, String> {
    let mut doc: Value = serde_json::from_str(raw)
        .map_err(|e| format!("the raw Ignition config does not parse as JSON: {e}"))?;
    let object = doc
        .as_object_mut()
        .ok_or("the raw Ignition config is not an object")?;
    let own_units: Vec<String> = (object.get("systemd"))
        .and_then(|s| s.get("units"))
        .and_then(Value::as_array)
        .map(|units| {
            (units.iter())
                .filter_map(|u| u.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let mut files: Vec<Value> = body.files.iter().map(ignition::file_json).collect();
    let mut units: Vec<Value> = body.units.iter().map(ignition::unit_json).collect();
    let commands = commands(body);
    if !commands.is_empty() {
        let mut script = String::from("#!/bin/bash\nset -euo pipefail\n");
        for c in &commands {
            script.push_str(c.trim_end());
            script.push('\n');
        }
        script.push_str(&format!("touch {DONE_MARKER}\n"));
        files.push(ignition::file_json(&File {
            path: SCRIPT_PATH.to_owned(),
            permissions: "0700".to_owned(),
            owner: "root:root".to_owned(),
            content: script,
            encoding: FileEncoding::Plain,
        }));
        units.push(
            json!({"name": SCRIPT_UNIT, "enabled": true, "contents": script_unit(&own_units)}),
        );
    }
    append(object, "storage", "files", files)?;
    append(object, "systemd", "units", units)?;
    let mut json = serde_json::to_string_pretty(&doc).expect("JSON serializes");
    json.push('\n');
    Ok(json)
}

/// Appends `items` to `object.section.list`, creating what is missing.
fn append(
    object: &mut serde_json::Map<String, Value>,
    section: &str,
    list: &str,
    items: Vec<Value>,
) -> Result<(), String> {
    if items.is_empty() {
        return Ok(());
    }
    let section_value = object.entry(section).or_insert_with(|| json!({}));
    let entries = (section_value.as_object_mut())
        .ok_or_else(|| format!("the raw Ignition config's {section} is not an object"))?
        .entry(list)
        .or_insert_with(|| json!([]));
    entries
        .as_array_mut()
        .ok_or_else(|| format!("the raw Ignition config's {section}.{list} is not a list"))?
        .extend(items);
    Ok(())
}

/// The oneshot unit of the parts' commands: once, after the network is up and before the raw
/// body's own units.
fn script_unit(before: &[String]) -> String {
    let before = if before.is_empty() {
        String::new()
    } else {
        format!("Before={}\n", before.join(" "))
    };
    format!(
        "[Unit]\nDescription=bootplate parts added to the raw template (run once)\n\
         Wants=network-online.target\nAfter=network-online.target\n{before}\
         ConditionPathExists=!{DONE_MARKER}\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n\
         ExecStart={SCRIPT_PATH}\n\n[Install]\nWantedBy=multi-user.target\n"
    )
}
