//! Output formats: writers that lay a structured [`Body`] out as cloud-config, Ignition, a
//! shell script or a MIME archive, and the checks a raw `template` body's output must pass.
//!
//! Common to the writers: files first, then systemd units (written under
//! `/etc/systemd/system`, then `daemon-reload` and `enable`; Ignition declares them natively),
//! then the commands (config pre-commands, part commands, config post-commands), then `enable`
//! for the enabled units the template gives only drop-ins (their unit file comes with the image
//! or a package the commands install), and last the Cluster API bootstrap sentinel
//! `/run/cluster-api/bootstrap-success.complete`, which some infrastructure providers wait for.

mod cloud_config;
mod ignition;
mod merge;
mod mime;
mod report;
mod script;
mod shape;
mod windows;

use crd_types::{FileEncoding, OutputFormat, Role};

use crate::body::Body;
use crate::context::BootReport;
use crate::files::File;
use crate::yaml::{YamlError, YamlLimit};

pub(crate) use merge::merge_raw;
pub(crate) use report::{FILES_PART, UNITS_PART};

/// Who rendered what, for the comment at the top of the output, and where the machine reports
/// its boot (no reporter when `None`).
pub(crate) struct Meta<'a> {
    pub(crate) object: &'a str,
    pub(crate) revision: &'a str,
    pub(crate) role: Role,
    pub(crate) report: Option<&'a BootReport>,
    /// A fetch stub (see [`crate::fetch`]): a short comment, and as small as the format allows.
    pub(crate) stub: bool,
}

impl Meta<'_> {
    fn comment(&self) -> String {
        if self.stub {
            return format!(
                "# bootplate fetch stub ({}), docs/boot-channel.md\n",
                self.role
            );
        }
        format!(
            "# Rendered by bootplate from {} (revision {}) for role {}.\n",
            self.object.replace(['\n', '\r'], " "),
            self.revision,
            self.role
        )
    }
}

/// The Cluster API bootstrap sentinel, written last.
const SENTINEL: [&str; 2] = [
    "mkdir -p /run/cluster-api",
    "echo success > /run/cluster-api/bootstrap-success.complete",
];

/// The Cluster API bootstrap sentinel on Windows, written last (PowerShell).
const SENTINEL_WINDOWS: [&str; 2] = [
    r"New-Item -ItemType Directory -Force -Path 'C:\run\cluster-api' | Out-Null",
    r"Set-Content -Path 'C:\run\cluster-api\bootstrap-success.complete' -Value 'success'",
];

const SYSTEMD_DIR: &str = "/etc/systemd/system";

/// Lays `body` out in `format`.
pub(crate) fn write(format: OutputFormat, meta: &Meta<'_>, body: &Body) -> String {
    match format {
        OutputFormat::CloudConfig => cloud_config::write(meta, body),
        OutputFormat::Ignition => ignition::write(meta, body),
        OutputFormat::Script => script::write(meta, body),
        OutputFormat::MimeMultipart => mime::write(meta, body),
        OutputFormat::WindowsCloudConfig => windows::write_cloud_config(meta, body),
        OutputFormat::Powershell => windows::write_powershell(meta, body),
        OutputFormat::PowershellAws => windows::write_powershell_aws(meta, body),
    }
}

/// About the size of `body` laid out in a format, to allocate the output once: the texts and
/// some room for the keys, quotes and the generated lines around them.
fn size_estimate(body: &Body) -> usize {
    let files: usize = body
        .files
        .iter()
        .map(|f| f.path.len() + f.content.len() + 64)
        .sum();
    let units: usize = body
        .units
        .iter()
        .map(|u| {
            let drop_ins: usize = u.drop_ins.iter().map(|(n, c)| n.len() + c.len() + 96).sum();
            u.content.as_ref().map_or(0, |c| c.len() + 96) + drop_ins + 64
        })
        .sum();
    let commands: usize = body.commands.iter().map(|c| c.len() + 8).sum();
    files + units + commands + 512
}

/// Units as plain files, for the formats without native units.
fn unit_files(body: &Body) -> Vec<File> {
    let file = |path: String, content: &str| File {
        path,
        permissions: "0644".to_owned(),
        owner: "root:root".to_owned(),
        content: content.to_owned(),
        encoding: FileEncoding::Plain,
    };
    let mut files = Vec::new();
    for u in &body.units {
        if let Some(content) = &u.content {
            files.push(file(format!("{SYSTEMD_DIR}/{}", u.name), content));
        }
        for (name, content) in &u.drop_ins {
            files.push(file(format!("{SYSTEMD_DIR}/{}.d/{name}", u.name), content));
        }
    }
    files
}

/// `daemon-reload` and one `systemctl enable` per enabled unit whose file the template writes
/// (units are enabled, not started: the commands start what they need, as kubeadm does with the
/// kubelet).
fn unit_commands(body: &Body) -> Vec<String> {
    if body.units.is_empty() {
        return Vec::new();
    }
    let mut commands = vec!["systemctl daemon-reload".to_owned()];
    commands.extend(enable_commands(body, true));
    commands
}

/// `systemctl enable` for the enabled units whose file the template writes (`written`) or, for
/// `!written`, those it only adds drop-ins to. Such a unit's file comes with the image or with a
/// package the commands install, so it is enabled after the commands: enabling it before would
/// fail on a machine where the install has not run yet, as `systemctl enable` does for a unit
/// file that does not exist.
fn enable_commands(body: &Body, written: bool) -> impl Iterator<Item = String> + '_ {
    body.units
        .iter()
        .filter(move |u| u.enable && u.content.is_some() == written)
        .map(|u| format!("systemctl enable {}", crate::helpers::quote(&u.name)))
}

/// Everything run after the files are in place: units, commands, the units the commands
/// install, the sentinel (not in a fetch stub: the render it runs writes it); with a reporter,
/// each step announced to it.
fn all_commands(body: &Body, report: Option<&BootReport>, sentinel: bool) -> Vec<String> {
    report::lay_out(report::steps(body, false), report, false, sentinel)
}

/// The body's files, unit files and, with a reporter, the reporter's files (first: the
/// commands source the library).
fn files_to_write(body: &Body, report: Option<&BootReport>) -> Vec<File> {
    let mut files: Vec<File> = report.map(report::files).into_iter().flatten().collect();
    files.extend(body.files.iter().cloned());
    files.extend(unit_files(body));
    files
}

/// Checks the unit files and drop-ins of a structured body as systemd reads them; Err names the
/// unit (and drop-in) and the line.
pub(crate) fn check_units(body: &Body) -> Result<(), String> {
    for u in &body.units {
        if let Some(content) = &u.content {
            shape::check_unit(content).map_err(|e| format!("unit {}: {e}", u.name))?;
        }
        for (name, content) in &u.drop_ins {
            shape::check_unit(content)
                .map_err(|e| format!("drop-in {name} of unit {}: {e}", u.name))?;
        }
    }
    Ok(())
}

/// Checks a raw `template` body's output against the declared format. The message describes
/// what is wrong without quoting the output (it may hold a token).
pub(crate) fn check_raw(format: OutputFormat, text: &str) -> Result<(), String> {
    match format {
        OutputFormat::CloudConfig => {
            // cloud-init reads `## template: jinja` on the first line only, and the Jinja it
            // renders must then start with `#cloud-config`.
            let body = text.strip_prefix(crate::jinja::HEADER).unwrap_or(text);
            let first = body.lines().next().unwrap_or("");
            if first.trim_end() != "#cloud-config" {
                return Err(
                    "the output is not a cloud-config: its first line must be `#cloud-config` (after `## template: jinja`, its second)"
                        .to_owned(),
                );
            }
            match crate::yaml::from_str(text, YamlLimit::document(text)) {
                Ok(serde_yaml::Value::Null) => Ok(()),
                Ok(document @ serde_yaml::Value::Mapping(_)) => check_cloud_config(&document),
                Ok(_) => Err(
                    "the output is not a cloud-config: the YAML document is not a map".to_owned(),
                ),
                Err(e) => Err(yaml_error(&e)),
            }
        }
        OutputFormat::Ignition => {
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                format!(
                    "the output is not valid JSON (output line {}, column {}): {}",
                    e.line(),
                    e.column(),
                    json_error_kind(&e)
                )
            })?;
            let version = value
                .get("ignition")
                .and_then(|i| i.get("version"))
                .and_then(|v| v.as_str())
                .unwrap_or("");
            let mut parts = version.splitn(3, '.');
            let ok = parts.next() == Some("3")
                && parts
                    .next()
                    .is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()))
                && parts
                    .next()
                    .is_some_and(|p| p.chars().next().is_some_and(|c| c.is_ascii_digit()));
            if ok {
                shape::check(&shape::IGNITION, &value, "", true)
                    .map_err(|e| format!("the output is not a valid Ignition 3.x config: {e}"))?;
                for (i, unit) in value
                    .pointer("/systemd/units")
                    .and_then(|u| u.as_array())
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let texts = unit.get("contents").into_iter().chain(
                        unit.get("dropins")
                            .and_then(|d| d.as_array())
                            .into_iter()
                            .flatten()
                            .filter_map(|d| d.get("contents")),
                    );
                    for text in texts.filter_map(|t| t.as_str()) {
                        shape::check_unit(text).map_err(|e| {
                            format!("systemd.units[{i}] of the Ignition config is not a valid unit file: {e}")
                        })?;
                    }
                }
                Ok(())
            } else {
                Err(
                    "the output is not an Ignition 3.x config: `ignition.version` must be 3.x.y"
                        .to_owned(),
                )
            }
        }
        OutputFormat::Script => {
            if text.starts_with("#!") {
                Ok(())
            } else {
                Err("the output is not a script: its first line must be a `#!` line".to_owned())
            }
        }
        OutputFormat::MimeMultipart => mime::check(text),
        OutputFormat::WindowsCloudConfig => check_windows_cloud_config(text),
        OutputFormat::Powershell => {
            let first = text.lines().next().unwrap_or("").trim_end();
            if first != "#ps1_sysnative" && first != "#ps1" {
                return Err(
                    "the output is not a powershell script: its first line must be `#ps1_sysnative` (how cloudbase-init knows a PowerShell script)"
                        .to_owned(),
                );
            }
            check_powershell(text, 0)
        }
        OutputFormat::PowershellAws => {
            windows::check_tags(format, text)?;
            let inner = text.strip_prefix("<powershell>").unwrap_or(text);
            let inner = inner
                .trim_end()
                .strip_suffix("</powershell>")
                .unwrap_or(inner);
            check_powershell(inner, 0)
        }
    }
}

/// The cloud-config directives cloudbase-init 1.1.9 runs (its cloud-config plugins); it logs
/// any other as "not supported" and goes on without it.
pub const CLOUDBASE_INIT_DIRECTIVES: [&str; 9] = [
    "write_files",
    "set_timezone",
    "timezone",
    "set_hostname",
    "hostname",
    "ntp",
    "groups",
    "users",
    "runcmd",
];

/// A raw `windows-cloud-config` output: `#cloud-config`, a YAML map, only directives
/// cloudbase-init runs.
fn check_windows_cloud_config(text: &str) -> Result<(), String> {
    if text.lines().next().unwrap_or("").trim_end() != "#cloud-config" {
        return Err(
            "the output is not a cloud-config: its first line must be `#cloud-config`".to_owned(),
        );
    }
    let document: serde_yaml::Value =
        crate::yaml::from_str(text, YamlLimit::document(text)).map_err(|e| yaml_error(&e))?;
    let Some(map) = document.as_mapping() else {
        return match document {
            serde_yaml::Value::Null => Ok(()),
            _ => Err("the output is not a cloud-config: the YAML document is not a map".to_owned()),
        };
    };
    for key in map.keys() {
        let name = key.as_str().unwrap_or("");
        if !CLOUDBASE_INIT_DIRECTIVES.contains(&name) {
            return Err(format!(
                "cloudbase-init does not run the cloud-config directive `{}` (it logs \"not supported\" and skips it); it runs {}",
                crate::error::truncate(name, 40),
                CLOUDBASE_INIT_DIRECTIVES.join(", ")
            ));
        }
    }
    Ok(())
}

/// The first PowerShell syntax error of `script`, at its output line (`offset` lines before
/// it in the output).
fn check_powershell(script: &str, offset: usize) -> Result<(), String> {
    match crate::powershell::syntax_errors(script, 1).first() {
        None => Ok(()),
        Some(e) => Err(format!(
            "the output is not valid PowerShell (output line {}, column {}): {}",
            e.line + offset,
            e.column,
            if e.message.starts_with("PowerShell cannot parse `") {
                "PowerShell cannot parse it".to_owned()
            } else {
                e.message.clone()
            }
        )),
    }
}

/// Checks a structured body's output as its reader will take it (the Windows formats; the
/// others are right by construction). The message quotes no output.
pub(crate) fn check_written(format: OutputFormat, text: &str) -> Result<(), String> {
    windows::check_tags(format, text)
}

/// The cloud-config modules bootplate's users write, with the types cloud-init reads them as,
/// and every unit file `write_files` writes.
fn check_cloud_config(document: &serde_yaml::Value) -> Result<(), String> {
    let value: serde_json::Value = serde_json::to_value(document)
        .map_err(|e| format!("the output is not a cloud-config: {e}"))?;
    let Some(map) = value.as_object() else {
        return Ok(());
    };
    for (module, shape) in shape::CLOUD_CONFIG_MODULES {
        if let Some(v) = map.get(*module) {
            shape::check(shape, v, module, false).map_err(|e| {
                format!("the output is not a valid cloud-config (cloud-init skips the module): {e}")
            })?;
        }
    }
    for (i, file) in map
        .get("write_files")
        .and_then(|f| f.as_array())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = file.get("path").and_then(|p| p.as_str()).unwrap_or("");
        let plain = file.get("encoding").is_none_or(|e| e == "text/plain");
        if let (true, true, Some(content)) = (
            shape::is_unit_path(path),
            plain,
            file.get("content").and_then(|c| c.as_str()),
        ) {
            shape::check_unit(content).map_err(|e| {
                format!("write_files[{i}] ({path}) is not a valid systemd unit file: {e}")
            })?;
        }
    }
    Ok(())
}

/// Why a raw cloud-config's output cannot be read, at its output line and column. serde_yaml's
/// messages name positions and expectations, never document content; only the part before
/// " at line" is kept (the position is given apart). An expansion past the limit names no
/// field either: a key of the output may hold a rendered value.
pub(super) fn yaml_error(e: &YamlError) -> String {
    match e {
        YamlError::TooLarge(t) => format!("the output is not a usable cloud-config: {t}"),
        YamlError::Syntax(e) => {
            let s = e.to_string();
            format!(
                "the output is not valid YAML{}: {}",
                e.location()
                    .map(|l| format!(" (output line {}, column {})", l.line(), l.column()))
                    .unwrap_or_default(),
                crate::error::truncate(s.split(" at line").next().unwrap_or(&s), 200)
            )
        }
    }
}

fn json_error_kind(e: &serde_json::Error) -> String {
    let s = e.to_string();
    crate::error::truncate(s.split(" at line").next().unwrap_or(&s), 200)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::Unit;

    #[test]
    fn units_with_only_drop_ins_are_enabled_after_the_commands() {
        let unit = |name: &str, enable, content: Option<&str>| Unit {
            name: name.to_owned(),
            enable,
            content: content.map(str::to_owned),
            drop_ins: vec![("10-x.conf".to_owned(), "[Service]\n".to_owned())],
        };
        let body = Body {
            files: Vec::new(),
            units: vec![
                unit(
                    "written.service",
                    true,
                    Some("[Service]\nExecStart=/bin/true\n"),
                ),
                unit("packaged.service", true, None),
                unit("quiet.service", false, None),
            ],
            commands: vec!["apt-get install -y packaged".to_owned()],
            command_parts: vec![("p".to_owned(), 1)],
        };
        assert_eq!(
            all_commands(&body, None, true),
            [
                "systemctl daemon-reload",
                "systemctl enable 'written.service'",
                "apt-get install -y packaged",
                "systemctl enable 'packaged.service'",
                SENTINEL[0],
                SENTINEL[1],
            ]
        );
        // Ignition presets the written unit natively; the script enables the packaged one.
        let ignition = write(
            OutputFormat::Ignition,
            &Meta {
                object: "t",
                revision: "r",
                role: Role::Worker,
                report: None,
                stub: false,
            },
            &body,
        );
        let config: serde_json::Value = serde_json::from_str(&ignition).unwrap();
        let script = config["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/etc/bootplate/bootstrap.sh")
            .unwrap()["contents"]["source"]
            .as_str()
            .unwrap();
        let script = percent_decode(script.strip_prefix("data:,").unwrap());
        let install = script.find("apt-get install -y packaged").unwrap();
        let enable = script.find("systemctl enable 'packaged.service'").unwrap();
        assert!(install < enable, "{script}");
        assert!(!script.contains("written.service"), "{script}");
        let written = &config["systemd"]["units"][0];
        assert_eq!(
            (written["name"].as_str(), written["enabled"].as_bool()),
            (Some("written.service"), Some(true))
        );
    }

    fn percent_decode(text: &str) -> String {
        let mut bytes = Vec::new();
        let mut rest = text.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'%' {
                let hex = std::str::from_utf8(&tail[..2]).unwrap();
                bytes.push(u8::from_str_radix(hex, 16).unwrap());
                rest = &tail[2..];
            } else {
                bytes.push(b);
                rest = tail;
            }
        }
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn raw_checks() {
        let cc = OutputFormat::CloudConfig;
        assert!(check_raw(cc, "#cloud-config\nruncmd: [a]\n").is_ok());
        assert!(check_raw(cc, "#cloud-config\n").is_ok());
        assert!(check_raw(cc, "## template: jinja\n#cloud-config\nruncmd: [a]\n").is_ok());
        assert!(check_raw(cc, "#cloud-config\n## template: jinja\n").is_ok());
        assert!(check_raw(cc, "## template: jinja\nruncmd: [a]\n").is_err());
        assert!(
            check_raw(cc, "runcmd: [a]\n")
                .unwrap_err()
                .contains("#cloud-config")
        );
        let e = check_raw(cc, "#cloud-config\na: [\n").unwrap_err();
        assert!(e.contains("not valid YAML (output line"), "{e}");
        assert!(
            check_raw(cc, "#cloud-config\n- a\n")
                .unwrap_err()
                .contains("not a map")
        );
        let ig = OutputFormat::Ignition;
        assert!(check_raw(ig, r#"{"ignition":{"version":"3.3.0"}}"#).is_ok());
        assert!(check_raw(ig, r#"{"ignition":{"version":"3.4.0-experimental"}}"#).is_ok());
        assert!(
            check_raw(ig, r#"{"ignition":{"version":"2.3.0"}}"#)
                .unwrap_err()
                .contains("3.x")
        );
        assert!(check_raw(ig, r#"{"ignition":{}}"#).is_err());
        assert!(check_raw(ig, "{").unwrap_err().contains("not valid JSON"));
        assert!(check_raw(OutputFormat::Script, "#!/bin/sh\n").is_ok());
        // As their consumers read them: cloud-init skips `packages: curl`, Ignition refuses
        // `"enabled": "yes"`.
        let e = check_raw(cc, "#cloud-config\npackages: curl\n").unwrap_err();
        assert!(e.contains("`packages` must be a list, got a string"), "{e}");
        let e = check_raw(
            ig,
            r#"{"ignition":{"version":"3.4.0"},"systemd":{"units":[{"name":"a.service","enabled":"yes"}]}}"#,
        )
        .unwrap_err();
        assert!(
            e.contains("`systemd.units[0].enabled` must be a boolean"),
            "{e}"
        );
        let e = check_raw(
            cc,
            "#cloud-config\nwrite_files:\n- path: /etc/systemd/system/a.service\n  content: |\n    ExecStart=/bin/a\n",
        )
        .unwrap_err();
        assert!(e.contains("before the first `[Section]`"), "{e}");
        assert!(check_raw(OutputFormat::Script, "echo\n").is_err());
    }
}
