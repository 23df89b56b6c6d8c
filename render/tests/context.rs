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
