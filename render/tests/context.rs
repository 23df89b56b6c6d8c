//! What templates see: role guards work in strict mode, and raw templates can place the
//! config's files and commands themselves.

mod common;

use crd_types::{BootplateConfigSpec, ConfigFile, Role};
use render::{CompiledTemplate, sample_context};

fn render(yaml: &str, config: &BootplateConfigSpec, role: Role) -> String {
    let spec = common::spec_yaml(&format!("os: {{name: test}}\n{yaml}"));
    let t =
        CompiledTemplate::compile("BootstrapTemplate t/t", &spec).unwrap_or_else(|e| panic!("{e}"));
    let r = t
        .render(config, &sample_context(role))
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8(r.data).unwrap()
}

#[test]
fn role_guards_work_in_strict_mode() {
    let yaml = "format: script\ntemplate: \"#!/bin/sh\\n{{machine.role}}{{#if join}} join={{join.apiServerEndpoint}}{{/if}}{{#if certs}} certs{{/if}}\"\n";
    let config = BootplateConfigSpec::default();
    assert_eq!(render(yaml, &config, Role::Init), "#!/bin/sh\ninit certs");
    assert_eq!(
        render(yaml, &config, Role::ControlPlaneJoin),
        "#!/bin/sh\ncontrol-plane-join join=sample-cluster.example.invalid:6443 certs"
    );
    assert_eq!(
        render(yaml, &config, Role::Worker),
        "#!/bin/sh\nworker join=sample-cluster.example.invalid:6443"
    );
}

#[test]
fn raw_templates_place_config_files_and_commands() {
    let yaml = r#"format: cloud-config
template: |
  #cloud-config
  write_files:
  {{#each files}}
    - path: {{yaml_quote path}}
      permissions: {{yaml_quote permissions}}
      owner: {{yaml_quote owner}}
      encoding: {{yaml_quote encoding}}
      content: {{yaml_quote content}}
  {{/each}}
  runcmd:
  {{#each preCommands}}
    - {{yaml_quote this}}
  {{/each}}
    - kubeadm join
  {{#each postCommands}}
    - {{yaml_quote this}}
  {{/each}}
"#;
    let config = BootplateConfigSpec {
        files: vec![ConfigFile {
            path: "/etc/a".into(),
            content: Some("x: 1\n".into()),
            ..Default::default()
        }],
        pre_commands: vec!["echo pre".into()],
        post_commands: vec!["echo post".into()],
        ..Default::default()
    };
    let out = render(yaml, &config, Role::Worker);
    let doc: serde_json::Value = serde_yaml::from_str(&out).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({
            "write_files": [{"path": "/etc/a", "permissions": "0644", "owner": "root:root", "encoding": "plain", "content": "x: 1\n"}],
            "runcmd": ["echo pre", "kubeadm join", "echo post"],
        })
    );
}

#[test]
fn a_command_that_renders_to_white_space_is_left_out() {
    let yaml = r#"format: script
variables:
  - { name: agent, default: false, schema: { type: boolean } }
parts:
  - name: base
    commands: ["echo base"]
  - name: opt-in
    commands:
      - |
        {{#if values.agent}}
        echo agent
        {{/if}}
"#;
    let off = render(yaml, &BootplateConfigSpec::default(), Role::Worker);
    let without_part = render(
        yaml,
        &BootplateConfigSpec {
            skip_parts: vec!["opt-in".into()],
            ..Default::default()
        },
        Role::Worker,
    );
    assert_eq!(off, without_part, "an empty command leaves no trace");
    assert!(!off.contains("agent"), "{off}");
    let on = render(
        yaml,
        &BootplateConfigSpec {
            variables: serde_json::from_str(r#"{"agent": true}"#).unwrap(),
            ..Default::default()
        },
        Role::Worker,
    );
    assert!(
        on.contains("echo base\n") && on.contains("echo agent\n"),
        "{on}"
    );
}
