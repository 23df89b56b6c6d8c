//! Shared by the render integration tests: fixtures, and the real consumers of user-data
//! (cloud-init, ignition-validate, shellcheck, bash). A missing tool fails the test: install them
//! with tests/scripts/install-tools.sh.
#![allow(dead_code)] // each test crate uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

use crd_types::{BootplateConfigSpec, TemplateSpec};

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn spec(name: &str) -> TemplateSpec {
    let text = std::fs::read_to_string(fixture_path(name)).expect("fixture readable");
    serde_yaml::from_str(&text).expect("fixture is a TemplateSpec")
}

pub fn config(name: &str) -> BootplateConfigSpec {
    let text = std::fs::read_to_string(fixture_path(name)).expect("fixture readable");
    serde_yaml::from_str(&text).expect("fixture is a BootplateConfigSpec")
}

/// Parses a spec written inline in a test.
pub fn spec_yaml(yaml: &str) -> TemplateSpec {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("bad test spec: {e}\n{yaml}"))
}

/// Runs a tool; panics (failing the test) when it is not installed or exits non-zero.
pub fn run_tool(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap_or_else(|e| {
        panic!("{program} is required by this test but cannot run ({e}); install it with tests/scripts/install-tools.sh")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\n{text}",
        output.status
    );
    text
}

pub fn check_cloud_config(path: &Path) {
    run_tool(
        "cloud-init",
        &["schema", "--config-file", &path.to_string_lossy()],
    );
}

pub fn check_ignition(path: &Path) {
    run_tool("ignition-validate", &[&path.to_string_lossy()]);
}

pub fn check_script(path: &Path) {
    run_tool("bash", &["-n", &path.to_string_lossy()]);
    run_tool("shellcheck", &["--shell=bash", &path.to_string_lossy()]);
}

/// Splits a MIME archive with Python's email package (what cloud-init uses) into its parts
/// and checks each with its tool. Returns the parts' content types.
pub fn check_mime(path: &Path) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = r#"
import email, sys
msg = email.message_from_bytes(open(sys.argv[1], 'rb').read())
assert msg.is_multipart(), 'not multipart'
n = 0
for part in msg.walk():
    if part.is_multipart():
        continue
    n += 1
    ext = {'text/cloud-config': 'yaml', 'text/x-shellscript': 'sh'}[part.get_content_type()]
    open('%s/part%d.%s' % (sys.argv[2], n, ext), 'wb').write(part.get_payload(decode=True))
    print(part.get_content_type())
"#;
    let out = run_tool(
        "python3",
        &[
            "-c",
            script,
            &path.to_string_lossy(),
            &dir.path().to_string_lossy(),
        ],
    );
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .expect("parts written")
        .map(|e| e.expect("entry").path())
        .collect();
    parts.sort();
    for part in &parts {
        match part.extension().and_then(|e| e.to_str()) {
            Some("yaml") => check_cloud_config(part),
            Some("sh") => check_script(part),
            _ => unreachable!(),
        }
    }
    out.lines().map(str::to_owned).collect()
}

/// Parses YAML with PyYAML, cloud-init's reader, and returns it as JSON.
pub fn pyyaml_to_json(yaml: &[u8]) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("doc.yaml");
    std::fs::write(&path, yaml).expect("write");
    let out = run_tool(
        "python3",
        &[
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1], 'rb'))))",
            &path.to_string_lossy(),
        ],
    );
    serde_json::from_str(&out).expect("python printed JSON")
}
