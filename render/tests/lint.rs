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
        "format: script\nvariables: [{name: used}]\ntemplate: |\n  #!/bin/sh\n  {{#if (eq machine.role \"nope\")}}\n    echo {{values.undeclared}} {{shell_quote values.used}}\n  {{/if}}\n  {{#unless machine}}{{clustr.name}}{{/unless}}\n  {{#each cluster.network.pods}}{{this}} {{@root.values.other}}{{/each}}\n",
    );
    let messages: Vec<(String, Option<Position>)> = problems
        .iter()
        .map(|p| (p.message.clone(), p.position))
        .collect();
    assert_eq!(
        messages,
        [
            (
                "`values.undeclared` is not declared in spec.variables (known: `used`)".to_owned(),
                Some(Position { line: 3, column: 8 })
            ),
            (
                "unknown name `clustr`; did you mean `cluster`?".to_owned(),
                Some(Position {
                    line: 5,
                    column: 20
                })
            ),
            (
                "`values.other` is not declared in spec.variables (known: `used`)".to_owned(),
                Some(Position {
                    line: 6,
                    column: 40
                })
            ),
            // The sample render takes the loop and fails on the same name at the same place:
            // said once (it was a second error, "undefined variable `@root.values.other`").
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
fn strict_lint_renders_every_machine_shape_the_contract_allows() {
    // Each template renders for the sample machine; each fails for one shape of Machine the
    // sample does not show. Before, all of them linted clean (and failed on such machines).
    // (A MachinePool instance is rendered too; templates see it as a worker without a failure
    // domain.)
    let cases = [
        (
            "{{kubernetes_minor machine.version}}",
            "a Machine without spec.version",
        ),
        (
            "{{#unless machine.failureDomain}}{{fail \\\"no failure domain\\\"}}{{/unless}}",
            "a Machine without a failure domain",
        ),
        (
            "{{#if (starts_with cluster.controlPlaneEndpoint.address \\\"[\\\")}}{{fail \\\"IPv6\\\"}}{{/if}}",
            "an IPv6 control-plane endpoint",
        ),
    ];
    for (body, shape) in cases {
        let problems = lint_yaml(&format!(
            "format: script\ntemplate: \"#!/bin/sh\\necho {body}\\n\"\n"
        ));
        assert!(
            problems.iter().any(|p| p.message.contains(shape)),
            "{body}: {problems:#?}"
        );
        for p in &problems {
            assert_eq!(p.code, "machine-shape", "{body}: {p:#?}");
            assert_eq!(p.severity, Severity::Warning, "{body}");
        }
    }
    // Guarded, the version helper renders for every shape.
    let guarded = lint_yaml(
        "format: script\ntemplate: \"#!/bin/sh\\necho {{#if machine.version}}{{kubernetes_minor machine.version}}{{/if}}\\n\"\n",
    );
    assert!(guarded.is_empty(), "{guarded:#?}");
}

#[test]
fn unused_declarations_are_warnings() {
    let problems = lint_yaml(
        "format: script\nvariables: [{name: used}, {name: unused, default: 1}]\ntemplate: \"#!/bin/sh\\n{{shell_quote values.used}}\"\n",
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
            // The whole-template analysis knows which roles lack `certs` and `join`...
            (
                None,
                "spec.parts[0].files[0].content",
                Some(Position { line: 1, column: 1 })
            ),
            (
                None,
                "spec.parts[0].files[1].content",
                Some(Position { line: 2, column: 1 })
            ),
            // ...and the sample renders for those roles, which fail at the same places, add
            // nothing (they were two more errors, one per role).
        ],
        "{problems:#?}"
    );
    assert!(
        problems[0]
            .message
            .contains("`certs.ca.key` is absent for role worker")
    );
    assert!(
        problems[1]
            .message
            .contains("`join.token` is absent for the init machine")
    );
    // Guarded, or in a part for the roles that have them: clean.
    let guarded = lint_yaml(
        "format: cloud-config\nparts:\n  - name: p\n    roles: [init, control-plane-join]\n    files:\n      - path: /etc/ca.key\n        content: \"{{certs.ca.key}}\"\n      - path: /etc/token\n        content: \"{{#if join}}{{join.token}}{{/if}}\"\n",
    );
    assert!(guarded.is_empty(), "{guarded:#?}");
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
    // Before, no sample fitted this pattern and every render was skipped with a warning; the
    // value is now generated from the pattern, so the render runs (a `fail` shows its value).
    let yaml = "format: script\nvariables:\n  - name: id\n    required: true\n    schema: {pattern: '^id-[0-9]{6}$'}\ntemplate: \"#!/bin/sh\\n{{values.id}} {{values.nope}}\"\n";
    let failed = lint_yaml(&yaml.replace(" {{values.nope}}", " {{fail values.id}}"));
    assert!(
        failed.iter().any(|p| p.message.contains("id-")),
        "{failed:#?}"
    );
    let problems = lint_yaml(yaml);
    assert!(
        problems
            .iter()
            .any(|p| p.message.starts_with("`values.nope` is not declared"))
    );
    assert!(problems.iter().all(|p| p.severity == Severity::Error));

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
    assert!(compiled.lint().is_empty(), "{:#?}", compiled.lint());

    // A schema no value fits is an error, not a skipped check.
    let problems = lint_yaml(
        "format: script\nvariables:\n  - name: id\n    required: true\n    schema: {pattern: '^[a-z]{9}$', maxLength: 3}\ntemplate: \"#!/bin/sh\\n{{values.id}}\"\n",
    );
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].severity, Severity::Error);
    assert_eq!(problems[0].field, "spec.variables[0].schema");
}

#[test]
fn every_branch_partial_and_loop_is_checked_with_did_you_mean() {
    // Before, these lint clean: the sample machine has no proxy and runs v1.31, so neither
    // branch was rendered, and the partial is only included inside them.
    let problems = lint_yaml(
        "format: script\nvariables: [{name: httpProxy, schema: {type: string, pattern: '^http://.*$'}}]\npartials:\n  files: \"{{#each files}}{{shell_quote this.pth}}{{/each}}\"\ntemplate: |\n  #!/bin/sh\n  {{#if values.httpProxy}}\n  export HTTP_PROXY={{shel_quote values.httpProxy}}\n  {{/if}}\n  {{#if (version_at_least machine.version \"v1.99\")}}\n  echo {{shell_quote machine.versoin}} {{shell_quote values.httpProxy \"x\"}}\n  {{> files}}\n  {{/if}}\n",
    );
    let found: Vec<(&str, Option<Position>, &str, &str)> = problems
        .iter()
        .map(|p| (p.field.as_str(), p.position, p.code, p.message.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (
                "spec.partials.files",
                Some(Position {
                    line: 1,
                    column: 16
                }),
                "unknown-name",
                "`this` has no field `pth`; did you mean `path`?"
            ),
            (
                "spec.template",
                Some(Position {
                    line: 3,
                    column: 19
                }),
                "unknown-helper",
                "unknown helper `shel_quote`; did you mean `shell_quote`?"
            ),
            (
                "spec.template",
                Some(Position { line: 6, column: 6 }),
                "unknown-name",
                "`machine.versoin`: `machine` has no field `versoin`; did you mean `version`?"
            ),
            (
                "spec.template",
                Some(Position {
                    line: 6,
                    column: 38
                }),
                "helper-arity",
                "helper `shell_quote` takes 1 parameter: shell_quote VALUE"
            ),
        ],
        "{problems:#?}"
    );
}

#[test]
fn unit_files_of_parts_are_read_as_systemd_reads_them() {
    // Before, a unit line systemd ignores (here a setting without `=`) linted clean.
    let problems = lint_yaml(
        "format: cloud-config\nparts:\n  - name: p\n    units:\n      - name: a.service\n        content: \"[Service]\\nExecStart /bin/true\\n\"\n",
    );
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].field, "spec.parts");
    assert_eq!(
        problems[0].message,
        "not a valid systemd unit file: unit a.service: line 2: neither `[Section]`, `Key=Value` nor a comment (systemd ignores it)"
    );
}

/// Free text in a systemd unit, a drop-in or a file under systemd's directories is flagged like
/// free text in shell: unquoted, or quoted for the shell (whose quotes keep line breaks); the
/// systemd quoting helpers and constrained variables are not.
#[test]
fn free_text_in_units_must_be_systemd_quoted() {
    let problems = lint_yaml(
        r#"format: script
variables:
  - {name: v, schema: {type: string}}
  - {name: p, schema: {type: string, pattern: '^[a-z]+$'}}
parts:
  - name: p
    units:
      - name: a.service
        content: "[Service]\nExecStart=/bin/echo {{values.v}} {{shell_quote values.v}} {{systemd_quote values.v}} {{values.p}}\n"
        dropIns: [{name: x.conf, content: "[Service]\nEnvironment=V={{systemd_env_quote values.v}} W={{values.v}}\n"}]
    files:
      - {path: /etc/systemd/system/b.service.d/y.conf, content: "[Service]\nEnvironment=V={{values.v}}\n"}
      - {path: /etc/other.conf, content: "{{values.v}}\n"}
"#,
    );
    let unquoted: Vec<(String, usize)> = problems
        .iter()
        .filter(|p| p.code == "unquoted")
        .inspect(|p| assert!(p.message.contains("a systemd unit"), "{}", p.message))
        .map(|p| (p.field.clone(), p.position.map_or(0, |p| p.column)))
        .collect();
    assert_eq!(
        unquoted,
        [
            ("spec.parts[0].files[0].content".to_owned(), 15),
            ("spec.parts[0].units[0].content".to_owned(), 21),
            ("spec.parts[0].units[0].content".to_owned(), 34),
            ("spec.parts[0].units[0].dropIns[0].content".to_owned(), 48),
        ],
        "{problems:#?}"
    );
}

/// The cases issue 35 listed where lint's message did not point at the culprit, each reported
/// once, at its place, in words that fit. (field, line, column, what the message says) per
/// problem.
/// A problem expected: its field, line and column in the field, and what its message says.
type Expected = (&'static str, usize, usize, &'static str);

#[test]
fn messages_point_at_the_culprit_once() {
    let big = "x".repeat(1500);
    let too_large = format!(
        "format: script\nmaxOutputBytes: 2000\nvariables: [{{name: v, default: '{}'}}]\nparts:\n  - name: p\n    files:\n      - {{path: /etc/small, content: small}}\n      - {{path: /etc/big, content: {big}}}\n    commands: ['echo {{{{shell_quote values.v}}}}']\n",
        "y".repeat(600)
    );
    let cases: [(&str, &[Expected]); 5] = [
        // Over its size limit: at the text that writes the most (it was at `spec`, the
        // template's first line), naming the largest and the way out.
        (
            &too_large,
            &[(
                "spec.parts[0].files[1].content",
                0,
                0,
                "the texts that write the most: spec.parts[0].files[1].content (1500 bytes), spec.parts[0].commands[0] (607 bytes), spec.parts[0].files[0].content (5 bytes); `compression: gzip`",
            )],
        ),
        // A raw Ignition template's wrong field: at the field's line (the second file's
        // `mode`), not at the text's first line.
        (
            "format: ignition\ntemplate: |\n  {\n    \"ignition\": {\"version\": \"3.4.0\"},\n    \"storage\": {\"files\": [\n      {\"path\": \"/etc/a\", \"mode\": 420},\n      {\"path\": \"/etc/x\", \"mode\": \"420\"}\n    ]}\n  }\n",
            &[(
                "spec.template",
                5,
                24,
                "`storage.files[1].mode` must be an integer",
            )],
        ),
        // `each` over a declared variable whose sample value is text: it was "undefined
        // variable `values.hosts` (declare it in spec.variables)", of a declared variable.
        (
            "format: script\nvariables: [{name: hosts, required: true}]\ntemplate: |\n  #!/bin/sh\n  {{#each values.hosts}}echo {{shell_quote this}}{{/each}}\n",
            &[(
                "spec.template",
                2,
                1,
                "`each` needs a list or a map, and `values.hosts` is text here",
            )],
        ),
        // `each` over text the analysis knows is text: once, not a second render error.
        (
            "format: script\nvariables: [{name: names, default: a, schema: {type: string, pattern: '^[a-z]+$'}}]\ntemplate: |\n  #!/bin/sh\n  {{#each values.names}}echo {{shell_quote this}}{{/each}}\n",
            &[(
                "spec.template",
                2,
                1,
                "`each` needs a list or a map, and this is text",
            )],
        ),
        // An undeclared variable: once, by the analysis.
        (
            "format: script\ntemplate: |\n  #!/bin/sh\n  echo {{shell_quote values.nope}}\n",
            &[(
                "spec.template",
                2,
                6,
                "`values.nope` is not declared in spec.variables",
            )],
        ),
    ];
    for (yaml, expected) in cases {
        let problems = lint_yaml(yaml);
        let found: Vec<(&str, usize, usize)> = problems
            .iter()
            .map(|p| {
                let at = p.position.unwrap_or(Position { line: 0, column: 0 });
                (p.field.as_str(), at.line, at.column)
            })
            .collect();
        let wanted: Vec<(&str, usize, usize)> =
            expected.iter().map(|(f, l, c, _)| (*f, *l, *c)).collect();
        assert_eq!(found, wanted, "{yaml}: {problems:#?}");
        for (p, (_, _, _, says)) in problems.iter().zip(expected) {
            assert!(p.message.contains(says), "{yaml}: {p:#?}");
            assert!(!p.message.contains("declare it"), "{yaml}: {p:#?}");
        }
    }
}

// The Windows formats.

/// Everything lint says of `spec`, as `code field`.
fn linted(spec: &crd_types::TemplateSpec) -> Vec<String> {
    lint(OBJECT, spec, None)
        .iter()
        .map(|p| format!("{} {}", p.code, p.field))
        .collect()
}

/// In PowerShell, only the PowerShell helpers quote; outside it, they do not.
#[test]
fn posix_quoting_in_powershell_is_unquoted_and_ps_quote_is_not() {
    let command = |text: &str| {
        common::spec_yaml(&format!(
            "os: {{name: windows}}\nformat: powershell\nbootReports: Disabled\nvariables: [{{name: x, default: a}}]\nparts:\n- name: p\n  commands:\n  - {}\n",
            serde_json::to_string(text).unwrap()
        ))
    };
    for unquoted in [
        "Write-Output {{shell_quote values.x}}",
        "Write-Output {{json values.x}}",
        "Write-Output '{{values.x}}'",
    ] {
        assert_eq!(
            linted(&command(unquoted)),
            ["unquoted spec.parts[0].commands[0]"],
            "{unquoted}"
        );
    }
    for quoted in [
        "Write-Output {{ps_quote values.x}}",
        "$t = {{ps_here values.x}}",
    ] {
        assert_eq!(linted(&command(quoted)), Vec::<String>::new(), "{quoted}");
    }
    // ps_quote in a POSIX shell command does not quote for it.
    let script = common::spec_yaml(
        "os: {name: linux}\nformat: script\nvariables: [{name: x, default: a}]\nparts:\n- name: p\n  commands:\n  - echo {{ps_quote values.x}}\n",
    );
    assert_eq!(linted(&script), ["unquoted spec.parts[0].commands[0]"]);
}

/// Units, boot reports, fetch delivery, in-place parts and Linux paths are refused for the
/// Windows formats, each at its field.
#[test]
fn what_windows_cannot_carry_is_refused_at_its_field() {
    let s = common::spec_yaml(concat!(
        "os: {name: windows}\nformat: windows-cloud-config\ndelivery: Fetch\nparts:\n",
        "- name: p\n  update: InPlace\n  units: [{name: a.service, content: \"[Service]\"}]\n",
        "  files: [{path: /etc/a.conf, content: x}]\n",
    ));
    let found = linted(&s);
    for field in [
        "spec.bootReports",
        "spec.delivery",
        "spec.parts[0].update",
        "spec.parts[0].units",
    ] {
        assert!(
            found.contains(&format!("template-invalid {field}")),
            "{field}: {found:?}"
        );
    }
    let paths = common::spec_yaml(
        "os: {name: windows}\nformat: powershell\nbootReports: Disabled\nparts:\n- name: p\n  files: [{path: /etc/a.conf, content: x}]\n",
    );
    let problems = lint(OBJECT, &paths, None);
    assert!(
        problems
            .iter()
            .any(|p| p.field == "spec.parts[0].files[0].path"
                && p.message.contains("absolute Windows path")),
        "{problems:?}"
    );
}
