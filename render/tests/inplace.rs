//! The in-place rule on real renders: a change is in place exactly when every difference in the
//! rendered output lies in `InPlace` parts, and the payload holds those parts only.

use crd_types::{BootplateConfigSpec, Role, TemplateSpec};
use render::generator::Generated;
use render::{CompiledTemplate, PartsRender, UpdatePlan, sample_context};

const TEMPLATE: &str = r#"
os: { name: linux }
format: cloud-config
variables:
  - { name: mirror, default: "https://mirror.example" }
  - { name: runtime, default: "2.0" }
parts:
  - name: install
    commands: ["install-runtime {{shell_quote values.runtime}}"]
  - name: configure
    update: InPlace
    files:
      - path: /etc/containerd/mirror.toml
        content: "endpoint = \"{{values.mirror}}\"\n"
        permissions: "0600"
        owner: root:root
      - path: /etc/motd
        encoding: base64
        content: aGVsbG8K
    units:
      - name: containerd.service
        dropIns: [{ name: 10-mirror.conf, content: "[Service]\nEnvironment=M={{values.mirror}}\n" }]
    commands: ["reload-mirror"]
  - name: extras
    update: InPlace
    files: [{ path: /etc/extras, content: "x\n" }]
"#;

fn template(yaml: &str) -> TemplateSpec {
    serde_yaml::from_str(yaml).unwrap()
}

fn config(yaml: &str) -> BootplateConfigSpec {
    let mut value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
    value["templateRef"] =
        serde_yaml::from_str("{kind: ClusterBootstrapTemplate, name: t}").unwrap();
    serde_yaml::from_value(value).unwrap()
}

fn parts(spec: &TemplateSpec, config: &BootplateConfigSpec) -> PartsRender {
    CompiledTemplate::compile("ClusterBootstrapTemplate t", spec)
        .unwrap()
        .render_parts(config, &sample_context(Role::Worker), &Generated::new())
        .unwrap()
        .expect("a template with parts")
}

fn plan(old: (&str, &str), new: (&str, &str)) -> UpdatePlan {
    let before = parts(&template(old.0), &config(old.1));
    let after = parts(&template(new.0), &config(new.1));
    after.update_from(&before)
}

#[test]
fn a_variable_only_an_in_place_part_reads_changes_in_place() {
    let plan = plan(
        (TEMPLATE, "{}"),
        (TEMPLATE, "variables: { mirror: https://other.example }"),
    );
    assert_eq!(
        plan,
        UpdatePlan::InPlace {
            parts: vec!["configure".into()]
        }
    );
}

#[test]
fn a_variable_a_rollout_part_reads_rolls_out_naming_the_part() {
    let plan = plan(
        (TEMPLATE, "{}"),
        (TEMPLATE, "variables: { runtime: \"2.1\" }"),
    );
    assert_eq!(
        plan,
        UpdatePlan::Rollout {
            reason: "part `install` changed and is not `update: InPlace`".into()
        }
    );
}

#[test]
fn a_template_edit_that_renders_the_same_bytes_changes_nothing() {
    // The spec (and its revision) differs; the render does not.
    let edited = TEMPLATE.replace(r#"\"{{values.mirror}}\""#, r#"\"https://mirror.example\""#);
    assert_ne!(template(&edited).revision(), template(TEMPLATE).revision());
    assert_eq!(
        plan((TEMPLATE, "{}"), (&edited, "{}")),
        UpdatePlan::Unchanged
    );
}

#[test]
fn the_configs_own_files_and_commands_roll_out() {
    let plan_files = plan(
        (TEMPLATE, "{}"),
        (TEMPLATE, "files: [{ path: /etc/own, content: a }]"),
    );
    assert!(matches!(plan_files, UpdatePlan::Rollout { reason } if reason.contains("own files")));
    let plan_commands = plan((TEMPLATE, "{}"), (TEMPLATE, "postCommands: [date]"));
    assert!(matches!(plan_commands, UpdatePlan::Rollout { .. }));
}

#[test]
fn skipping_an_in_place_part_is_in_place_and_skipping_a_rollout_part_rolls_out() {
    assert_eq!(
        plan((TEMPLATE, "{}"), (TEMPLATE, "skipParts: [extras]")),
        UpdatePlan::InPlace {
            parts: vec!["extras".into()]
        }
    );
    assert_eq!(
        plan((TEMPLATE, "{}"), (TEMPLATE, "skipParts: [install]")),
        UpdatePlan::Rollout {
            reason: "part `install` was removed and is not `update: InPlace`".into()
        }
    );
}

#[test]
fn a_part_must_be_in_place_before_and_after_the_change() {
    // `install` becomes InPlace in the same change that alters it: the booted machine's
    // `install` was never the agent's to manage.
    let new = TEMPLATE
        .replace(
            "  - name: install\n",
            "  - name: install\n    update: InPlace\n",
        )
        .replace("install-runtime", "install-runtime --fast");
    let plan = plan((TEMPLATE, "{}"), (&new, "{}"));
    assert!(matches!(plan, UpdatePlan::Rollout { reason } if reason.contains("`install`")));
}

#[test]
fn a_format_change_rolls_out() {
    let new = TEMPLATE.replace("format: cloud-config", "format: script");
    assert!(matches!(
        plan((TEMPLATE, "{}"), (&new, "{}")),
        UpdatePlan::Rollout { reason } if reason.contains("format")
    ));
}

#[test]
fn the_payload_holds_the_in_place_parts_decoded_without_files_the_config_replaces() {
    let render = parts(
        &template(TEMPLATE),
        &config("files: [{ path: /etc/extras, content: mine }]"),
    );
    let payload = render.payload();
    let names: Vec<&str> = payload.parts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["configure", "extras"]);
    let configure = &payload.parts[0];
    assert_eq!(configure.files[0].path, "/etc/containerd/mirror.toml");
    assert_eq!(
        configure.files[0].content,
        b"endpoint = \"https://mirror.example\"\n"
    );
    assert_eq!(configure.files[0].permissions, "0600");
    assert_eq!(configure.files[1].content, b"hello\n", "base64 is decoded");
    assert_eq!(configure.units[0].name, "containerd.service");
    assert_eq!(
        configure.units[0].drop_ins[0].content,
        "[Service]\nEnvironment=M=https://mirror.example\n"
    );
    assert_eq!(configure.commands, ["reload-mirror"]);
    assert!(
        payload.parts[1].files.is_empty(),
        "the config's /etc/extras replaces the part's: not the agent's file"
    );
}

#[test]
fn a_raw_template_has_no_parts() {
    let raw = template("os: { name: linux }\nformat: script\ntemplate: \"#!/bin/sh\\ntrue\\n\"\n");
    let compiled = CompiledTemplate::compile("ClusterBootstrapTemplate raw", &raw).unwrap();
    let split = compiled
        .render_parts(
            &config("{}"),
            &sample_context(Role::Worker),
            &Generated::new(),
        )
        .unwrap();
    assert!(split.is_none());
}

#[test]
fn an_unset_update_keeps_the_template_revision() {
    // Templates published before `update` existed keep their revision (no spurious re-render).
    let spec = template(TEMPLATE);
    let json = serde_json::to_string(&spec.parts[0]).unwrap();
    assert!(!json.contains("update"), "{json}");
    assert!(
        serde_json::to_string(&spec.parts[1])
            .unwrap()
            .contains(r#""update":"InPlace""#)
    );
}

#[test]
fn an_opt_in_part_that_renders_nothing_is_no_part() {
    // A part whose only command is inside `{{#if}}` renders nothing while the variable is off:
    // adding it to a template changes no machine; turning it on is a change of that part.
    let with_agent = TEMPLATE.replace(
        "variables:\n",
        "variables:\n  - { name: agent, default: false, schema: { type: boolean } }\n",
    ) + "  - name: agent\n    commands: [\"{{#if values.agent}}install-agent{{/if}}\"]\n";
    assert_eq!(
        plan((TEMPLATE, "{}"), (&with_agent, "{}")),
        UpdatePlan::Unchanged
    );
    assert_eq!(
        plan(
            (&with_agent, "{}"),
            (&with_agent, "variables: { agent: true }")
        ),
        UpdatePlan::Rollout {
            reason: "part `agent` was added and is not `update: InPlace`".into()
        }
    );
}

/// A Rollout part whose content comes from a generator, and an InPlace part.
const GENERATED: &str = r#"
os: { name: linux }
format: cloud-config
variables:
  - { name: site, default: fra }
  - { name: mirror, default: "https://mirror.example" }
parts:
  - name: network
    generator: { name: cmdb, parameters: { profile: static } }
  - name: configure
    update: InPlace
    files: [{ path: /etc/mirror, content: "{{values.mirror}}\n" }]
"#;

/// [`plan`] as a comparison makes it, without calling generators: their parts get the
/// stand-ins of `CompiledTemplate::comparison_stand_ins`.
fn plan_with_generators(old: (&str, &str), new: (&str, &str)) -> UpdatePlan {
    let render = |(template_yaml, config_yaml): (&str, &str)| {
        let compiled =
            CompiledTemplate::compile("ClusterBootstrapTemplate t", &template(template_yaml))
                .unwrap();
        let (config, ctx) = (config(config_yaml), sample_context(Role::Worker));
        let generated = compiled.comparison_stand_ins(&config, &ctx);
        compiled
            .render_parts(&config, &ctx, &generated)
            .unwrap()
            .expect("a template with parts")
    };
    render(new).update_from(&render(old))
}

/// A comparison: what changes, old and new (template, config), the plan expected.
type Case<'a> = (&'a str, (&'a str, &'a str), (&'a str, &'a str), UpdatePlan);

#[test]
fn a_generated_part_changes_when_the_request_its_generator_would_get_changes() {
    let rollout = UpdatePlan::Rollout {
        reason: "part `network` changed and is not `update: InPlace`".into(),
    };
    let edited = GENERATED.replace("{{values.mirror}}\\n", "fixed\\n");
    let reparametrised = GENERATED.replace("profile: static", "profile: dhcp");
    // (what, old (template, config), new (template, config), plan)
    let cases: [Case; 5] = [
        (
            "nothing changed",
            (GENERATED, "{}"),
            (GENERATED, "{}"),
            UpdatePlan::Unchanged,
        ),
        (
            "a value the generator is sent",
            (GENERATED, "{}"),
            (GENERATED, "variables: { site: ams }"),
            rollout.clone(),
        ),
        (
            "the generator's parameters",
            (GENERATED, "{}"),
            (&reparametrised, "{}"),
            rollout.clone(),
        ),
        (
            // Every value goes to the generator, so its answer may change too: unknown
            // without calling it, hence a rollout.
            "a value an InPlace part reads, also sent to the generator",
            (GENERATED, "{}"),
            (GENERATED, "variables: { mirror: https://other.example }"),
            rollout,
        ),
        (
            // The template's revision changes, the generator's request otherwise does not.
            "an edit of another part",
            (GENERATED, "{}"),
            (&edited, "{}"),
            UpdatePlan::InPlace {
                parts: vec!["configure".into()],
            },
        ),
    ];
    for (what, old, new, expected) in cases {
        assert_eq!(plan_with_generators(old, new), expected, "{what}");
    }
}

/// A shipped template (`templates/NAME.yaml`) and its spec.
fn shipped(name: &str) -> TemplateSpec {
    let path = format!("{}/../templates/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let object: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    serde_yaml::from_value(object["spec"].clone()).unwrap()
}

/// A config with the network input: CA bundles by name (each the sample CA), one mirror of
/// registry.k8s.io at `mirror`, kubeadm's imageRepository and one variable of the template.
fn network_config(bundles: &[&str], mirror: &str, repository: &str, pull: &str) -> String {
    let ca = serde_json::to_string(render::network::SAMPLE_CA_PEM).unwrap();
    let bundles: Vec<String> = (bundles.iter())
        .map(|name| format!("{{name: {name}, inline: {ca}}}"))
        .collect();
    format!(
        "variables: {{imagePullPolicy: {pull}}}\nnetwork:\n  caBundles: [{}]\n  \
         registryMirrors: [{{registry: registry.k8s.io, endpoints: [{{url: \"{mirror}\"}}]}}]\n  \
         imageRepository: {repository}\n",
        bundles.join(", ")
    )
}

/// The kubeadm-compat templates keep the provider's raw body and carry the network input in a
/// part `network` (`update: InPlace`): a CA rollover or a new mirror endpoint is applied in
/// place; a kubeadm field (a variable, or imageRepository in init's ClusterConfiguration) is
/// in the raw body and rolls out.
#[test]
fn a_compat_templates_network_changes_in_place_and_its_kubeadm_fields_roll_out() {
    let base = network_config(
        &["corp"],
        "https://m1.example",
        "m1.example/k8s",
        "IfNotPresent",
    );
    let changes = [
        (
            network_config(
                &["corp", "next"],
                "https://m1.example",
                "m1.example/k8s",
                "IfNotPresent",
            ),
            true,
        ),
        (
            network_config(
                &["corp"],
                "https://m2.example",
                "m1.example/k8s",
                "IfNotPresent",
            ),
            true,
        ),
        (
            network_config(&["corp"], "https://m1.example", "m1.example/k8s", "Always"),
            false,
        ),
        (
            network_config(
                &["corp"],
                "https://m1.example",
                "m2.example/k8s",
                "IfNotPresent",
            ),
            false,
        ),
    ];
    for name in ["kubeadm-compat", "kubeadm-compat-ignition"] {
        let spec = shipped(name);
        let compiled = CompiledTemplate::compile(name, &spec).unwrap();
        let split = |config: &str| {
            (compiled.render_parts(
                &self::config(config),
                &sample_context(Role::Init),
                &Generated::new(),
            ))
            .unwrap()
            .expect("a raw body with parts")
        };
        let before = split(&base);
        for (i, (config, in_place)) in changes.iter().enumerate() {
            let plan = split(config).update_from(&before);
            if *in_place {
                let expected = UpdatePlan::InPlace {
                    parts: vec!["network".into()],
                };
                assert_eq!(plan, expected, "{name}: change {i}");
            } else {
                let UpdatePlan::Rollout { reason } = &plan else {
                    panic!("{name}: change {i}: {plan:?}");
                };
                assert!(
                    reason.contains("raw spec.template"),
                    "{name}: change {i}: {reason}"
                );
            }
        }
        // Without the input the part renders nothing: the output is the raw body's alone.
        let bare = split("{}");
        assert!(
            bare.payload()
                .parts
                .iter()
                .all(|p| p.files.is_empty() && p.commands.is_empty())
        );
    }
}

/// Parts beside a raw body must be `update: InPlace` (they add to the raw output, which rolls
/// out as a whole) and only cloud-config and ignition output can take them.
#[test]
fn parts_beside_a_raw_template_must_be_in_place() {
    let rollout = template(
        "os: { name: linux }\nformat: cloud-config\ntemplate: \"#cloud-config\\n{}\\n\"\n\
         parts: [{ name: extra, commands: [\"true\"] }]\n",
    );
    let e = CompiledTemplate::compile("t", &rollout)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("spec.parts[0].update") && e.contains("InPlace"),
        "{e}"
    );
    let script = template(
        "os: { name: linux }\nformat: script\ntemplate: \"#!/bin/sh\\ntrue\\n\"\n\
         parts: [{ name: extra, update: InPlace, commands: [\"true\"] }]\n",
    );
    let e = CompiledTemplate::compile("t", &script)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("not to script"), "{e}");
}
