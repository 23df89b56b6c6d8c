//! Hostile values: quotes, a newline followed by a YAML key, handlebars syntax and non-ASCII
//! text must come out as inert data, byte for byte. The scripts are run for real in a throw-away
//! directory; the cloud-configs are parsed by PyYAML (cloud-init's reader) and serde_yaml.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use crd_types::{BootplateConfigSpec, Role};
use render::{CompiledTemplate, sample_context};
use serde_json::{Value, json};

const HOSTILE: &[&str] = &[
    "'; rm -rf / #",
    "\"; rm -rf / #",
    "value\ninjected: true",
    "value\n- injected\nruncmd: [reboot]",
    "{{values.other}} {{> nope}} {{#if}}",
    "$(touch pwned) `touch pwned` ${HOME}",
    "Grüße, 日本語, emoji 🚀, bidi \u{202e}, nbsp \u{a0}",
    "trailing backslash \\",
    "tab\tcarriage\rreturn",
    "line separator \u{2028} next line \u{85}",
    "  leading and trailing spaces  ",
    "yes",
    "- not a list",
    "",
];

fn config(value: &str) -> BootplateConfigSpec {
    BootplateConfigSpec {
        variables: BTreeMap::from([
            ("v".to_owned(), json!(value)),
            ("other".to_owned(), json!("SHOULD-NOT-APPEAR")),
        ]),
        ..Default::default()
    }
}

const VARIABLES: &str = r#"
variables:
  - name: v
    schema: {type: string}
  - name: other
  - name: dir
"#;

fn compile(body: &str) -> CompiledTemplate {
    let spec = common::spec_yaml(&format!("os: {{name: test}}\n{VARIABLES}{body}"));
    CompiledTemplate::compile("BootstrapTemplate test/hostile", &spec)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn run_bash(script: &[u8], dir: &std::path::Path) {
    let path = dir.join("user-data.sh");
    std::fs::write(&path, script).unwrap();
    let out = Command::new("bash")
        .arg(&path)
        .current_dir(dir)
        .output()
        .expect("bash is required by this test");
    assert!(
        out.status.success(),
        "script failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(script)
    );
}

/// shell_quote in a raw script: the value reaches the command as one argument, unchanged.
#[test]
fn shell_quoted_values_arrive_byte_for_byte() {
    let t = compile(
        "format: script\ntemplate: |\n  #!/bin/bash\n  set -euo pipefail\n  printf '%s' {{shell_quote values.v}} > value\n  printf '%s\\n' {{shell_quote (default values.v \"-\")}} > words\n",
    );
    for value in HOSTILE {
        let dir = tempfile::tempdir().unwrap();
        let rendered = t
            .render(&config(value), &sample_context(Role::Worker))
            .unwrap();
        run_bash(&rendered.data, dir.path());
        let got = std::fs::read(dir.path().join("value")).unwrap();
        assert_eq!(got, value.as_bytes(), "value {value:?}");
        assert!(
            !dir.path().join("pwned").exists(),
            "command substitution ran"
        );
        let words = std::fs::read_to_string(dir.path().join("words")).unwrap();
        assert_eq!(
            words.lines().count(),
            value.lines().count().max(1),
            "{value:?} split into words"
        );
    }
}

/// The structured script writer: a value in a file's content (heredoc) and in a command
/// argument (shell_quote) is written as data. The sentinel path is moved into the temp dir so
/// the test can run unprivileged.
#[test]
fn structured_script_writes_hostile_content_exactly() {
    let uid = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    let gid = String::from_utf8(Command::new("id").arg("-g").output().unwrap().stdout).unwrap();
    let owner = format!("{}:{}", uid.trim(), gid.trim());
    let t = compile(&format!(
        r#"format: script
parts:
  - name: p
    files:
      - path: "{{{{values.dir}}}}/file"
        owner: "{owner}"
        content: "{{{{values.v}}}}"
      - path: "{{{{values.dir}}}}/file-nl"
        owner: "{owner}"
        permissions: "0600"
        content: "{{{{values.v}}}}\nBOOTPLATE_EOF\n"
    commands:
      - printf '%s' {{{{shell_quote values.v}}}} > {{{{shell_quote values.dir}}}}/arg
"#
    ));
    for value in HOSTILE {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_string_lossy().to_string();
        let mut cfg = config(value);
        cfg.variables.insert("dir".to_owned(), json!(d));
        let rendered = t.render(&cfg, &sample_context(Role::Worker)).unwrap();
        let script = String::from_utf8(rendered.data)
            .unwrap()
            .replace("/run/cluster-api", &format!("{d}/run"));
        run_bash(script.as_bytes(), dir.path());
        assert_eq!(
            std::fs::read(dir.path().join("file")).unwrap(),
            value.as_bytes(),
            "{value:?}"
        );
        assert_eq!(
            std::fs::read(dir.path().join("file-nl")).unwrap(),
            format!("{value}\nBOOTPLATE_EOF\n").as_bytes()
        );
        assert_eq!(
            std::fs::read(dir.path().join("arg")).unwrap(),
            value.as_bytes()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("file-nl"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

fn parse_both(yaml: &[u8]) -> Value {
    let py = common::pyyaml_to_json(yaml);
    let rs: Value = serde_yaml::from_slice(yaml).expect("serde_yaml parses it");
    assert_eq!(
        py,
        rs,
        "PyYAML and serde_yaml disagree:\n{}",
        String::from_utf8_lossy(yaml)
    );
    py
}

/// yaml_quote in a raw cloud-config: no key is injected, the value reads back unchanged.
#[test]
fn yaml_quoted_values_cannot_inject_keys() {
    let t = compile(
        "format: cloud-config\ntemplate: |\n  #cloud-config\n  write_files:\n    - path: /etc/hostile\n      content: {{yaml_quote values.v}}\n  runcmd:\n    - [echo, {{yaml_quote values.v}}]\n    - {{json values.v}}\n",
    );
    for value in HOSTILE {
        let rendered = t
            .render(&config(value), &sample_context(Role::Worker))
            .unwrap();
        let doc = parse_both(&rendered.data);
        let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["runcmd", "write_files"], "{value:?}");
        assert_eq!(doc["write_files"][0]["content"], json!(value));
        assert_eq!(doc["runcmd"][0], json!(["echo", value]));
        assert_eq!(doc["runcmd"][1], json!(value), "json output read as YAML");
        assert_eq!(doc["write_files"].as_array().unwrap().len(), 1);
    }
}

/// The cloud-config writer quotes whatever a structured template puts in content, paths and
/// commands (here deliberately without any quoting helper).
#[test]
fn structured_cloud_config_keeps_values_inert() {
    let t = compile(
        r#"format: cloud-config
parts:
  - name: p
    files:
      - path: /etc/hostile
        content: "{{values.v}}"
      - path: /etc/hostile-nl
        content: "{{values.v}}\n"
    commands:
      - "{{values.v}}"
"#,
    );
    for value in HOSTILE {
        let rendered = t
            .render(&config(value), &sample_context(Role::Worker))
            .unwrap();
        let doc = parse_both(&rendered.data);
        let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["runcmd", "write_files"], "{value:?}");
        let files = doc["write_files"].as_array().unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0]["content"], json!(value));
        assert_eq!(files[1]["content"], json!(format!("{value}\n")));
        // A command that renders to white space only is dropped (nothing to run).
        let commands = doc["runcmd"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            commands.contains(&json!(value)),
            !value.trim().is_empty(),
            "{value:?}"
        );
        let path = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(path.path(), &rendered.data).unwrap();
        common::check_cloud_config(path.path());
    }
}

/// Handlebars syntax inside a value is never evaluated.
#[test]
fn template_syntax_in_values_is_not_evaluated() {
    let t = compile("format: script\ntemplate: \"#!/bin/sh\\n{{values.v}}\"\n");
    let rendered = t
        .render(&config("{{values.other}}"), &sample_context(Role::Worker))
        .unwrap();
    assert_eq!(rendered.data, b"#!/bin/sh\n{{values.other}}");
}

/// Ignition: the JSON writer keeps every value as a string, and the config validates.
#[test]
fn ignition_keeps_values_inert() {
    let t = compile(
        r#"format: ignition
parts:
  - name: p
    files:
      - path: /etc/hostile
        content: "{{values.v}}"
    commands:
      - echo {{shell_quote values.v}}
"#,
    );
    for value in HOSTILE {
        let rendered = t
            .render(&config(value), &sample_context(Role::Worker))
            .unwrap();
        let doc: Value = serde_json::from_slice(&rendered.data).unwrap();
        let source = doc["storage"]["files"][0]["contents"]["source"]
            .as_str()
            .unwrap();
        assert_eq!(decode_data_url(source), value.as_bytes(), "{value:?}");
        let path = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(path.path(), &rendered.data).unwrap();
        common::check_ignition(path.path());
    }
}

fn decode_data_url(url: &str) -> Vec<u8> {
    use base64::Engine as _;
    if let Some(b64) = url.strip_prefix("data:;base64,") {
        return base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
    }
    let data = url.strip_prefix("data:,").unwrap().as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        if data[i] == b'%' {
            out.push(
                u8::from_str_radix(std::str::from_utf8(&data[i + 1..i + 3]).unwrap(), 16).unwrap(),
            );
            i += 3;
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

/// Values in systemd units: with `systemd_quote` (command lines) and `systemd_env_quote`
/// (`Environment=`), every hostile value without a control character gives a unit that
/// systemd's own parser (`systemd-analyze verify`) accepts; a value with a line break or another
/// control character, or one ending with a backslash, fails the render on the config's
/// variables whether the template quotes it or not (it would start a new setting such as
/// `ExecStartPre=`), and the message never shows it.
#[test]
fn values_cannot_add_settings_to_units() {
    let quoted = "[Service]\nType=oneshot\nEnvironment=V={{systemd_env_quote values.v}}\nExecStart=/bin/echo {{systemd_quote values.v}}\n";
    let raw = "[Service]\nType=oneshot\nEnvironment=V={{values.v}}\nExecStart=/bin/true\n";
    for (what, content, unit_field) in [
        ("quoted", quoted, "spec.parts[0].units[0].content"),
        ("raw", raw, "spec.parts[0].units[0].dropIns[0].content"),
    ] {
        let body = if what == "raw" {
            format!(
                "    units:\n      - name: demo.service\n        dropIns:\n          - name: 10-v.conf\n            content: {content:?}\n"
            )
        } else {
            format!("    units:\n      - name: demo.service\n        content: {content:?}\n")
        };
        let t = compile(&format!(
            "format: script\nparts:\n  - name: p\n    update: InPlace\n{body}"
        ));
        for value in HOSTILE.iter().chain(&[
            "ExecStartPre=/bin/touch /tmp/pwned",
            "a\nExecStartPre=/bin/touch /tmp/pwned",
        ]) {
            let breaks =
                value.chars().any(char::is_control) || (what == "raw" && value.ends_with('\\'));
            let result = t.render_parts(
                &config(value),
                &sample_context(Role::Worker),
                &Default::default(),
            );
            if breaks {
                let err = result.expect_err(value).to_string();
                assert!(
                    err.contains("spec.variables") && err.contains(unit_field),
                    "{what} {value:?}: {err}"
                );
                assert!(!err.contains("pwned"), "the message shows no value: {err}");
                let named = err.contains("helper `systemd_") && err.contains("on `values.v`");
                assert_eq!(named, what == "quoted", "{what}: {err}");
                continue;
            }
            let parts = result
                .unwrap_or_else(|e| panic!("{what} {value:?}: {e}"))
                .unwrap();
            let unit = &parts.parts[0].content.units[0];
            let text = unit
                .content
                .clone()
                .unwrap_or_else(|| unit.drop_ins[0].content.clone());
            if what == "quoted" {
                verify_unit(&text, value);
            }
        }
    }
}

/// `systemd-analyze verify` accepts `text` as a service with no complaint.
fn verify_unit(text: &str, value: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.service");
    std::fs::write(&path, text).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze is required by this test");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("demo.service"),
        "{value:?}: systemd-analyze verify:\n{stderr}\n{text}"
    );
}

/// A raw cloud-config that anchors a list of `items` and aliases it `aliases` times: items ×
/// aliases nodes once a YAML reader follows the aliases, from a few KB of output.
fn alias_bomb(items: usize, aliases: usize) -> String {
    format!(
        "  x-items: &a [{}]\n  x-bomb: [{}]\n",
        vec!["x"; items].join(","),
        vec!["*a"; aliases].join(",")
    )
}

/// A raw template whose output expands past the YAML limit is refused with a render error that
/// names the field and the limit, measured in the time of the limit, whatever the expansion:
/// alone, beside parts (their files are merged into the expansion) and behind a branch only
/// one Machine takes (lint's sample machine does not: that Machine's render is refused).
#[test]
fn alias_bombs_in_a_raw_cloud_config_are_refused() {
    let bomb = alias_bomb(1000, 1000);
    let part =
        "parts:\n  - name: p\n    update: InPlace\n    files: [{path: /etc/p, content: p}]\n";
    let cases = [
        (String::new(), String::new(), "worker-1"),
        (String::new(), part.to_owned(), "worker-1"),
        (
            "  {{#if (eq machine.name \"victim\")}}\n".to_owned(),
            String::new(),
            "victim",
        ),
    ];
    for (branch, parts, machine) in cases {
        let end = if branch.is_empty() { "" } else { "  {{/if}}\n" };
        let t = compile(&format!(
            "format: cloud-config\n{parts}template: |\n  #cloud-config\n  runcmd: [a]\n{branch}{bomb}{end}"
        ));
        let mut ctx = sample_context(Role::Worker);
        ctx.machine.name = machine.to_owned();
        let start = std::time::Instant::now();
        let e = t.render(&config("v"), &ctx).unwrap_err().to_string();
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        for fragment in [
            "spec.template",
            "grows past 100000 nodes",
            "aliases",
            "line 3, column",
        ] {
            assert!(e.contains(fragment), "{fragment:?} not in {e}");
        }
    }
}
