//! cloud-init runs the string entries of `runcmd` as one `sh` script; the first failing
//! command must end it, so the success sentinel at the end is never written after a failure.

use crd_types::{BootplateConfigSpec, OsInfo, OutputFormat, Part, Role, TemplateSpec};
use render::{CompiledTemplate, sample_context};

/// The script cloud-init builds from `runcmd` (cc_runcmd: `#!/bin/sh` then one line per
/// string entry), with the sentinel's directory moved into `dir` so it can run here.
fn runcmd_script(commands: &[&str], dir: &std::path::Path) -> String {
    let spec = TemplateSpec {
        os: OsInfo {
            name: "linux".into(),
            version: None,
        },
        format: OutputFormat::CloudConfig,
        parts: vec![Part {
            name: "main".into(),
            commands: commands.iter().map(|c| (*c).to_owned()).collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let compiled = CompiledTemplate::compile("ClusterBootstrapTemplate runcmd", &spec).unwrap();
    let rendered = compiled
        .render(
            &BootplateConfigSpec::default(),
            &sample_context(Role::Worker),
        )
        .unwrap();
    let yaml: serde_yaml::Value = serde_yaml::from_slice(&rendered.data).unwrap();
    let mut script = String::from("#!/bin/sh\n");
    for entry in yaml["runcmd"].as_sequence().unwrap() {
        let line = entry
            .as_str()
            .unwrap()
            .replace("/run/cluster-api", &dir.display().to_string());
        script.push_str(&line);
        script.push('\n');
    }
    script
}

fn run(script: &str) -> std::process::ExitStatus {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .status()
        .unwrap()
}

#[test]
fn a_failing_command_stops_runcmd_before_the_sentinel() {
    let dir = tempfile::tempdir().unwrap();
    let after = dir.path().join("after");
    let script = runcmd_script(
        &["false", &format!("touch {}", after.display())],
        dir.path(),
    );
    assert!(!run(&script).success());
    assert!(!after.exists(), "a command after the failing one ran");
    assert!(
        !dir.path().join("bootstrap-success.complete").exists(),
        "the sentinel claims success"
    );

    let ok = tempfile::tempdir().unwrap();
    let after = ok.path().join("after");
    let script = runcmd_script(&["true", &format!("touch {}", after.display())], ok.path());
    assert!(run(&script).success());
    assert!(after.exists());
    assert!(
        ok.path().join("bootstrap-success.complete").exists(),
        "the sentinel follows success"
    );
}
