//! Lint finds what a single render would miss: names in branches the sample values do not take,
//! role-specific failures, unused declarations, and format problems, each located.

mod common;

use crd_types::{BootplateConfigSpec, Role};
use render::{CompiledTemplate, Position, Severity, lint};
use serde_json::json;

const OBJECT: &str = "ClusterBootstrapTemplate lint-test";

fn lint_yaml(yaml: &str) -> Vec<render::Problem> {
    let spec = common::spec_yaml(&format!("os: {{name: test}}\n{yaml}"));
    lint(OBJECT, &spec, None)
}

#[test]
fn the_golden_fixture_is_clean() {
    let problems = lint(OBJECT, &common::spec("parts.yaml"), None);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn names_in_untaken_branches_are_checked_statically() {
    let problems = lint_yaml(
        "format: script\nvariables: [{name: used}]\ntemplate: |\n  #!/bin/sh\n  {{#if (eq machine.role \"nope\")}}\n    echo {{values.undeclared}} {{values.used}}\n  {{/if}}\n  {{#unless machine}}{{clustr.name}}{{/unless}}\n  {{#each cluster.network.pods}}{{this}} {{@root.values.other}}{{/each}}\n",
    );
    let messages: Vec<(String, Option<Position>)> = problems
        .iter()
        .map(|p| (p.message.clone(), p.position))
        .collect();
    assert_eq!(
        messages,
        [
            (
                "`values.undeclared` is not declared in spec.variables".to_owned(),
                Some(Position { line: 3, column: 8 })
            ),
            (
                "unknown name `clustr` (the render context has cluster, machine, join, certs, values, files, preCommands, postCommands)".to_owned(),
                Some(Position { line: 5, column: 20 })
            ),
            (
                "`values.other` is not declared in spec.variables".to_owned(),
                Some(Position { line: 6, column: 40 })
            ),
            // The sample render takes the loop and finds it too.
            (
                "undefined variable `@root.values.other`".to_owned(),
                Some(Position { line: 6, column: 40 })
            ),
        ],
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .all(|p| p.field == "spec.template" && p.severity == Severity::Error)
    );
}

#[test]
fn unused_declarations_are_warnings() {
    let problems = lint_yaml(
        "format: script\nvariables: [{name: used}, {name: unused, default: 1}]\ntemplate: \"#!/bin/sh\\n{{values.used}}\"\n",
    );
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].severity, Severity::Warning);
    assert_eq!(problems[0].field, "spec.variables[1]");
    assert!(problems[0].message.contains("`unused`"));
}

#[test]
fn role_specific_failures_name_the_role() {
    let problems = lint_yaml(
        "format: cloud-config\nparts:\n  - name: p\n    files:\n      - path: /etc/ca.key\n        content: \"{{certs.ca.key}}\"\n      - path: /etc/token\n        content: \"\\n{{join.token}}\"\n",
    );
    let found: Vec<(Option<Role>, &str, Option<Position>)> = problems
        .iter()
        .map(|p| (p.role, p.field.as_str(), p.position))
        .collect();
    assert_eq!(
        found,
        [
            (
                Some(Role::Init),
                "spec.parts[0].files[1].content",
                Some(Position { line: 2, column: 1 })
            ),
            (
                Some(Role::Worker),
                "spec.parts[0].files[0].content",
                Some(Position { line: 1, column: 1 })
            ),
        ],
        "{problems:#?}"
    );
    assert!(problems[0].message.contains("`join.token`"));
}

#[test]
fn compile_problems_are_returned_all_at_once() {
    let problems = lint_yaml(
        "format: script\npartials:\n  a: \"{{#if}}\"\n  b: \"{{> c}}\"\ntemplate: \"#!/bin/sh\"\n",
    );
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.partials.a", "spec.partials.b"],
        "{problems:#?}"
    );
    assert!(problems.iter().all(|p| p.position.is_some()));
}

#[test]
fn format_problems_show_for_every_role_once() {
    let problems = lint_yaml("format: cloud-config\ntemplate: \"runcmd: []\"\n");
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].role, None);
    assert!(problems[0].message.contains("#cloud-config"));
}

#[test]
fn sample_values_and_given_configs() {
    let yaml = "format: script\nvariables:\n  - name: id\n    required: true\n    schema: {pattern: '^id-[0-9]{6}$'}\ntemplate: \"#!/bin/sh\\n{{values.id}} {{values.nope}}\"\n";
    let problems = lint_yaml(yaml);
    // No sample can be made: a warning, and the render-time error is not found...
    assert_eq!(
        problems
            .iter()
            .filter(|p| p.severity == Severity::Warning)
            .count(),
        1
    );
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("`id` has no default"))
    );
    // ...but the static check still reports the undeclared name.
    assert!(problems.iter().any(|p| p.message.contains("`values.nope`")));

    let spec = common::spec_yaml(&format!(
        "os: {{name: test}}\n{}",
        yaml.replace(" {{values.nope}}", "")
    ));
    let config = BootplateConfigSpec {
        variables: [("id".to_owned(), json!("id-123456"))].into(),
        ..Default::default()
    };
    assert!(lint(OBJECT, &spec, Some(&config)).is_empty());
    let compiled = CompiledTemplate::compile(OBJECT, &spec).unwrap();
    assert_eq!(compiled.lint().len(), 1, "the compiled lint has no config");
}
