//! The shapes of the documents a raw body renders, as their consumers read them: the Ignition
//! 3.x config (every key of the spec's types; an unknown key or a wrong type makes Ignition
//! refuse the whole config), the cloud-config modules bootplate's users write (write_files,
//! runcmd, bootcmd, users, packages, mounts, ntp, …: a wrong type makes cloud-init skip the
//! module), and systemd unit files (a line that is neither a section, a setting nor a comment
//! is ignored by systemd, so what it meant to set is silently missing).

use crd_types::strict::type_name;
use serde_json::Value;

/// The shape a value must have.
pub(super) enum Shape {
    Any,
    Str,
    Int,
    Bool,
    List(&'static Shape),
    /// A map with these keys only.
    Map(&'static [(&'static str, Shape)]),
    /// A map with any keys, each value of this shape.
    Dict(&'static Shape),
    /// One of these shapes.
    OneOf(&'static [Shape]),
}

use Shape::*;

const STRINGS: Shape = List(&Str);

const RESOURCE: Shape = Map(&[
    ("source", Str),
    ("compression", Str),
    ("httpHeaders", List(&Map(&[("name", Str), ("value", Str)]))),
    ("verification", Map(&[("hash", Str)])),
]);

const NODE_USER: Shape = Map(&[("id", Int), ("name", Str)]);

const UNIT: Shape = Map(&[
    ("name", Str),
    ("enabled", Bool),
    ("mask", Bool),
    ("contents", Str),
    ("dropins", List(&Map(&[("name", Str), ("contents", Str)]))),
]);

/// The Ignition config, spec 3.0 to 3.5.
pub(super) const IGNITION: Shape = Map(&[
    (
        "ignition",
        Map(&[
            ("version", Str),
            (
                "config",
                Map(&[("merge", List(&RESOURCE)), ("replace", RESOURCE)]),
            ),
            (
                "timeouts",
                Map(&[("httpResponseHeaders", Int), ("httpTotal", Int)]),
            ),
            (
                "security",
                Map(&[("tls", Map(&[("certificateAuthorities", List(&RESOURCE))]))]),
            ),
            (
                "proxy",
                Map(&[
                    ("httpProxy", Str),
                    ("httpsProxy", Str),
                    ("noProxy", STRINGS),
                ]),
            ),
        ]),
    ),
    (
        "storage",
        Map(&[
            (
                "disks",
                List(&Map(&[
                    ("device", Str),
                    ("wipeTable", Bool),
                    (
                        "partitions",
                        List(&Map(&[
                            ("label", Str),
                            ("number", Int),
                            ("sizeMiB", Int),
                            ("startMiB", Int),
                            ("typeGuid", Str),
                            ("guid", Str),
                            ("wipePartitionEntry", Bool),
                            ("shouldExist", Bool),
                            ("resize", Bool),
                        ])),
                    ),
                ])),
            ),
            (
                "raid",
                List(&Map(&[
                    ("name", Str),
                    ("level", Str),
                    ("devices", STRINGS),
                    ("spares", Int),
                    ("options", STRINGS),
                ])),
            ),
            (
                "filesystems",
                List(&Map(&[
                    ("device", Str),
                    ("format", Str),
                    ("wipeFilesystem", Bool),
                    ("label", Str),
                    ("uuid", Str),
                    ("options", STRINGS),
                    ("path", Str),
                    ("mountOptions", STRINGS),
                ])),
            ),
            (
                "files",
                List(&Map(&[
                    ("path", Str),
                    ("overwrite", Bool),
                    ("contents", RESOURCE),
                    ("append", List(&RESOURCE)),
                    ("mode", Int),
                    ("user", NODE_USER),
                    ("group", NODE_USER),
                ])),
            ),
            (
                "directories",
                List(&Map(&[
                    ("path", Str),
                    ("overwrite", Bool),
                    ("mode", Int),
                    ("user", NODE_USER),
                    ("group", NODE_USER),
                ])),
            ),
            (
                "links",
                List(&Map(&[
                    ("path", Str),
                    ("overwrite", Bool),
                    ("target", Str),
                    ("hard", Bool),
                    ("user", NODE_USER),
                    ("group", NODE_USER),
                ])),
            ),
            (
                "luks",
                List(&Map(&[
                    ("name", Str),
                    ("device", Str),
                    ("keyFile", RESOURCE),
                    ("label", Str),
                    ("uuid", Str),
                    ("options", STRINGS),
                    ("wipeVolume", Bool),
                    ("clevis", Any),
                    ("discard", Bool),
                    ("openOptions", STRINGS),
                ])),
            ),
        ]),
    ),
    ("systemd", Map(&[("units", List(&UNIT))])),
    (
        "passwd",
        Map(&[
            (
                "users",
                List(&Map(&[
                    ("name", Str),
                    ("passwordHash", Str),
                    ("sshAuthorizedKeys", STRINGS),
                    ("uid", Int),
                    ("gecos", Str),
                    ("homeDir", Str),
                    ("noCreateHome", Bool),
                    ("primaryGroup", Str),
                    ("groups", STRINGS),
                    ("noUserGroup", Bool),
                    ("noLogInit", Bool),
                    ("shell", Str),
                    ("system", Bool),
                    ("shouldExist", Bool),
                ])),
            ),
            (
                "groups",
                List(&Map(&[
                    ("name", Str),
                    ("gid", Int),
                    ("passwordHash", Str),
                    ("system", Bool),
                    ("shouldExist", Bool),
                ])),
            ),
        ]),
    ),
    (
        "kernelArguments",
        Map(&[("shouldExist", STRINGS), ("shouldNotExist", STRINGS)]),
    ),
]);

const COMMAND: Shape = OneOf(&[Str, STRINGS]);

/// The cloud-config modules checked, each with its shape; other top-level keys are cloud-init's
/// many other modules and are left alone.
pub(super) const CLOUD_CONFIG_MODULES: &[(&str, Shape)] = &[
    (
        "write_files",
        List(&Map(&[
            ("path", Str),
            ("content", Str),
            ("source", Any),
            ("encoding", Str),
            ("owner", Str),
            ("permissions", Str),
            ("append", Bool),
            ("defer", Bool),
        ])),
    ),
    ("runcmd", List(&COMMAND)),
    ("bootcmd", List(&COMMAND)),
    ("packages", List(&OneOf(&[Str, STRINGS]))),
    ("package_update", Bool),
    ("package_upgrade", Bool),
    ("package_reboot_if_required", Bool),
    ("users", List(&OneOf(&[Str, Dict(&Any)]))),
    (
        "groups",
        OneOf(&[List(&OneOf(&[Str, Dict(&Any)])), Dict(&Any)]),
    ),
    ("mounts", List(&List(&OneOf(&[Str, Int])))),
    (
        "ntp",
        Map(&[
            ("enabled", Bool),
            ("servers", STRINGS),
            ("pools", STRINGS),
            ("peers", STRINGS),
            ("allow", STRINGS),
            ("ntp_client", Str),
            ("config", Dict(&Any)),
        ]),
    ),
    ("ssh_authorized_keys", STRINGS),
    ("hostname", Str),
    ("fqdn", Str),
    ("prefer_fqdn_over_hostname", Bool),
    ("preserve_hostname", Bool),
    ("manage_etc_hosts", OneOf(&[Bool, Str])),
    ("timezone", Str),
    ("disable_root", Bool),
    ("ssh_pwauth", OneOf(&[Bool, Str])),
    ("final_message", Str),
    ("apt", Dict(&Any)),
    ("yum_repos", Dict(&Dict(&Any))),
    ("power_state", Dict(&Any)),
];

fn expected(shape: &Shape) -> String {
    match shape {
        Any => "anything".to_owned(),
        Str => "a string".to_owned(),
        Int => "an integer".to_owned(),
        Bool => "a boolean (true or false)".to_owned(),
        List(_) => "a list".to_owned(),
        Map(_) | Dict(_) => "a map".to_owned(),
        OneOf(shapes) => shapes.iter().map(expected).collect::<Vec<_>>().join(" or "),
    }
}

fn fits(shape: &Shape, v: &Value) -> bool {
    match shape {
        Any => true,
        Str => v.is_string(),
        Int => v.is_i64() || v.is_u64(),
        Bool => v.is_boolean(),
        List(_) => v.is_array(),
        Map(_) | Dict(_) => v.is_object(),
        OneOf(shapes) => shapes.iter().any(|s| fits(s, v)),
    }
}

/// The first place `value` (at `path`) departs from `shape`; `nullable`: null stands for an
/// absent value (Ignition's optional fields).
pub(super) fn check(
    shape: &Shape,
    value: &Value,
    path: &str,
    nullable: bool,
) -> Result<(), String> {
    if nullable && value.is_null() {
        return Ok(());
    }
    if !fits(shape, value) {
        return Err(format!(
            "`{path}` must be {}, got {}",
            expected(shape),
            type_name(value)
        ));
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (shape, value) {
        (List(item), Value::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                check(item, v, &format!("{path}[{i}]"), nullable)?;
            }
        }
        (Map(fields), Value::Object(map)) => {
            for (key, v) in map {
                match fields.iter().find(|(k, _)| k == key) {
                    Some((_, s)) => check(s, v, &join(key), nullable)?,
                    None => {
                        return Err(format!(
                            "`{}` is not a key its reader knows{}",
                            join(key),
                            crd_types::strict::hint(key, fields.iter().map(|(k, _)| *k))
                        ));
                    }
                }
            }
        }
        (Dict(item), Value::Object(map)) => {
            for (key, v) in map {
                check(item, v, &join(key), nullable)?;
            }
        }
        (OneOf(shapes), v) => {
            let first = shapes.iter().find(|s| fits(s, v)).expect("fits one");
            check(first, v, path, nullable)?;
        }
        _ => {}
    }
    Ok(())
}

/// A systemd unit file or drop-in, checked line by line as systemd reads it: sections,
/// `Key=Value` settings (a trailing `\` continues a line), comments (`#`, `;`), blank lines.
pub(super) fn check_unit(text: &str) -> Result<(), String> {
    let mut in_section = false;
    let mut continued = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        let was_continued = std::mem::replace(&mut continued, trimmed.ends_with('\\'));
        if was_continued || trimmed.is_empty() || trimmed.starts_with(['#', ';']) {
            continue;
        }
        if trimmed.starts_with('[') {
            if !trimmed.ends_with(']') || trimmed.len() < 3 {
                return Err(format!("line {}: a section header is `[Name]`", i + 1));
            }
            in_section = true;
            continue;
        }
        let Some((key, _)) = trimmed.split_once('=') else {
            return Err(format!(
                "line {}: neither `[Section]`, `Key=Value` nor a comment (systemd ignores it)",
                i + 1
            ));
        };
        if !in_section {
            return Err(format!(
                "line {}: a setting before the first `[Section]`",
                i + 1
            ));
        }
        let key = key.trim();
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(format!(
                "line {}: `{}` is not a setting name",
                i + 1,
                crate::error::truncate(key, 64)
            ));
        }
    }
    Ok(())
}

/// Whether a file written to `path` is a systemd unit or drop-in.
pub(super) fn is_unit_path(path: &str) -> bool {
    let in_systemd = [
        "/etc/systemd/system/",
        "/usr/lib/systemd/system/",
        "/lib/systemd/system/",
    ]
    .iter()
    .any(|dir| path.starts_with(dir));
    let unit = [
        ".service", ".socket", ".timer", ".path", ".mount", ".target",
    ]
    .iter()
    .any(|suffix| path.ends_with(suffix));
    let drop_in = path.ends_with(".conf") && path.contains(".d/");
    in_systemd && (unit || drop_in)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ignition_keys_and_types() {
        let ok = json!({"ignition": {"version": "3.4.0"}, "systemd": {"units": [{"name": "a.service", "enabled": true, "contents": null}]}});
        assert!(check(&IGNITION, &ok, "", true).is_ok());
        let bad = json!({"ignition": {"version": "3.4.0"}, "systemd": {"units": [{"name": "a.service", "enabled": "yes"}]}});
        assert_eq!(
            check(&IGNITION, &bad, "", true).unwrap_err(),
            "`systemd.units[0].enabled` must be a boolean (true or false), got a string"
        );
        let typo = json!({"storage": {"files": [{"path": "/a", "permissions": 420}]}});
        assert_eq!(
            check(&IGNITION, &typo, "", true).unwrap_err(),
            "`storage.files[0].permissions` is not a key its reader knows (known: `append`, `contents`, `group`, `mode`, `overwrite`, `path`, `user`)"
        );
    }

    #[test]
    fn units() {
        assert!(
            check_unit("# c\n[Unit]\nDescription=x\n\n[Service]\nExecStart=/bin/a \\\n  --b\n")
                .is_ok()
        );
        assert!(
            check_unit("Description=x\n")
                .unwrap_err()
                .contains("before the first")
        );
        assert!(
            check_unit("[Service]\nExecStart /bin/a\n")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(is_unit_path(
            "/etc/systemd/system/kubelet.service.d/10-a.conf"
        ));
        assert!(!is_unit_path("/etc/containerd/config.toml"));
    }
}
