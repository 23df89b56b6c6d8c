//! Generator parts end to end in the engine: the calls a render needs, the requests, a served
//! template answering them (the reference generator), and the answers written out in the
//! calling template's format.

use std::sync::Arc;

use crd_types::{
    BootplateConfigSpec, GeneratorSecrets, OsInfo, OutputFormat, Part, PartGenerator, Role,
    TemplateFile, TemplateSpec, VariableDecl,
};
use render::generator::{self, Generated, Status};
use render::{CompiledTemplate, sample_context};
use serde_json::json;

fn calling_template(format: OutputFormat) -> CompiledTemplate {
    let spec = TemplateSpec {
        os: OsInfo {
            name: "ubuntu".into(),
            version: None,
        },
        format,
        variables: vec![VariableDecl {
            name: "site".into(),
            default: Some(json!("fra")),
            ..Default::default()
        }],
        parts: vec![
            Part {
                name: "base".into(),
                commands: vec!["echo base".into()],
                ..Default::default()
            },
            Part {
                name: "network".into(),
                roles: vec![Role::Worker],
                commands: vec!["echo before-generated".into()],
                generator: Some(PartGenerator {
                    name: "cmdb".into(),
                    parameters: json!({"profile": "static"}).as_object().cloned().unwrap(),
                }),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    CompiledTemplate::compile("ClusterBootstrapTemplate calling", &spec).unwrap()
}

fn served_template() -> CompiledTemplate {
    let spec = TemplateSpec {
        os: OsInfo {
            name: "any".into(),
            version: None,
        },
        format: OutputFormat::CloudConfig,
        variables: vec![
            VariableDecl {
                name: "site".into(),
                required: true,
                ..Default::default()
            },
            VariableDecl {
                name: "profile".into(),
                required: true,
                ..Default::default()
            },
        ],
        parts: vec![Part {
            name: "netplan".into(),
            files: vec![TemplateFile {
                path: "/etc/netplan/60-{{values.profile}}.yaml".into(),
                content:
                    "# {{machine.name}} at {{values.site}}\n# {{{{raw}}}}{{literal}}{{{{/raw}}}}\n"
                        .into(),
                permissions: Some("0600".into()),
                ..Default::default()
            }],
            commands: vec!["netplan apply".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    CompiledTemplate::compile("generator template", &spec).unwrap()
}

#[test]
fn a_served_template_answers_a_calling_templates_request_and_the_answer_is_written_out() {
    let calling = calling_template(OutputFormat::CloudConfig);
    let config = BootplateConfigSpec::default();
    let ctx = sample_context(Role::Worker);
    let calls = calling.generator_calls(&config, Role::Worker);
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (
            calls[0].part.as_str(),
            calls[0].field.as_str(),
            calls[0].generator.as_str()
        ),
        ("network", "spec.parts[1].generator", "cmdb")
    );
    assert!(
        calling.generator_calls(&config, Role::Init).is_empty(),
        "the part is for workers only"
    );
    let request = calling
        .generator_request(&calls[0], &config, &ctx, GeneratorSecrets::default())
        .unwrap();
    assert_eq!(request.context.values["site"], "fra");
    assert_eq!(request.parameters["profile"], "static");
    assert_eq!(request.template.part, "network");

    // Over the wire and back, as `bootplate generator serve` does.
    let wire: generator::Request =
        serde_json::from_slice(&serde_json::to_vec(&request).unwrap()).unwrap();
    let response = served_template().generate(&wire);
    assert_eq!(response.status, Status::Success, "{:?}", response.message);
    let body = serde_json::to_vec(&response).unwrap();
    let part = generator::parse_response(&body, 1 << 20).unwrap();

    let generated = Generated::from([("network".to_owned(), Arc::new(part))]);
    let rendered = calling.render_generated(&config, &ctx, &generated).unwrap();
    let yaml: serde_yaml::Value =
        serde_yaml::from_slice(rendered.data.strip_prefix(b"#cloud-config\n").unwrap()).unwrap();
    let file = &yaml["write_files"][0];
    assert_eq!(file["path"], "/etc/netplan/60-static.yaml");
    assert_eq!(file["permissions"], "0600");
    let machine = &ctx.machine.name;
    assert_eq!(
        file["content"].as_str().unwrap(),
        format!("# {machine} at fra\n# {{{{literal}}}}\n"),
        "generated content is written as it came, never rendered again"
    );
    let runcmd: Vec<&str> = yaml["runcmd"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    let position = |c: &str| runcmd.iter().position(|r| r.contains(c)).unwrap();
    assert!(position("echo base") < position("echo before-generated"));
    assert!(position("echo before-generated") < position("netplan apply"));
}

#[test]
fn the_controller_path_needs_every_response_and_lint_renders_without() {
    let calling = calling_template(OutputFormat::Script);
    let config = BootplateConfigSpec::default();
    let ctx = sample_context(Role::Worker);
    let e = calling
        .render_generated(&config, &ctx, &Generated::new())
        .unwrap_err();
    assert_eq!(e.reason(), "GeneratorFailed");
    assert!(
        e.to_string().contains("spec.parts[1].generator")
            && e.to_string().contains("BootstrapGenerator cmdb"),
        "{e}"
    );
    let offline = calling.render(&config, &ctx).unwrap();
    assert!(
        String::from_utf8(offline.data)
            .unwrap()
            .contains("echo before-generated")
    );
    let skipped = BootplateConfigSpec {
        skip_parts: vec!["network".into()],
        ..Default::default()
    };
    assert!(calling.generator_calls(&skipped, Role::Worker).is_empty());
}

#[test]
fn a_served_template_reading_a_token_it_was_not_given_answers_failure() {
    let mut spec = TemplateSpec {
        os: OsInfo {
            name: "any".into(),
            version: None,
        },
        parts: vec![Part {
            name: "join".into(),
            commands: vec!["kubeadm join --token {{join.token}}".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    let served = CompiledTemplate::compile("token template", &spec).unwrap();
    let calling = calling_template(OutputFormat::CloudConfig);
    let config = BootplateConfigSpec::default();
    let ctx = sample_context(Role::Worker);
    let call = &calling.generator_calls(&config, Role::Worker)[0];
    let mut request = calling
        .generator_request(call, &config, &ctx, GeneratorSecrets::default())
        .unwrap();
    // The calling template's parameter is not one the served template declares.
    request.parameters.clear();
    let response = served.generate(&request);
    assert_eq!(response.status, Status::Failure);
    let message = response.message.unwrap();
    assert!(message.contains("join.token"), "{message}");

    let granted = GeneratorSecrets {
        join_token: true,
        certificates: false,
    };
    let mut request = calling
        .generator_request(call, &config, &ctx, granted)
        .unwrap();
    request.parameters.clear();
    let response = served.generate(&request);
    assert_eq!(response.status, Status::Success, "{:?}", response.message);
    assert_eq!(
        response.commands,
        [format!("kubeadm join --token {}", ctx.join.unwrap().token)]
    );

    spec.parts.clear();
    spec.template = Some("#!/bin/sh\n".into());
    let raw = CompiledTemplate::compile("raw template", &spec).unwrap();
    assert_eq!(raw.generate(&request).status, Status::Failure);
}
