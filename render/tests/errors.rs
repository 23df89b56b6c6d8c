//! Every error names the template object and the field, the variable or helper involved, and,
//! for template text, the line and column; none repeats a secret value.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crd_types::conditions::reason;
use crd_types::{BootplateConfigSpec, ConfigFile, Role};
use render::{CompiledTemplate, Origin, RenderError, sample_context};
use serde_json::json;

const OBJECT: &str = "BootstrapTemplate team-a/ubuntu";

fn spec(yaml: &str) -> crd_types::TemplateSpec {
    let format = if yaml.contains("format:") {
        ""
    } else {
        "format: cloud-config\n"
    };
    common::spec_yaml(&format!("os: {{name: test}}\n{format}{yaml}"))
}

fn compile_err(yaml: &str) -> RenderError {
    let spec = spec(yaml);
    match CompiledTemplate::compile(OBJECT, &spec) {
        Ok(_) => panic!("expected a compile error for:\n{yaml}"),
        Err(e) => e,
    }
}

fn compile(yaml: &str) -> CompiledTemplate {
    let spec = spec(yaml);
    CompiledTemplate::compile(OBJECT, &spec).unwrap_or_else(|e| panic!("{e}"))
}

fn render_err(yaml: &str, config: &BootplateConfigSpec, role: Role) -> RenderError {
    match compile(yaml).render(config, &sample_context(role)) {
        Ok(_) => panic!("expected a render error for:\n{yaml}"),
        Err(e) => e,
    }
}

fn vars(v: serde_json::Value) -> BootplateConfigSpec {
    BootplateConfigSpec {
        variables: serde_json::from_value(v).unwrap(),
        ..Default::default()
    }
}

#[track_caller]
fn assert_mentions(e: &RenderError, parts: &[&str]) {
    let message = e.to_string();
    assert!(
        message.starts_with(OBJECT),
        "does not name the object: {message}"
    );
    for part in parts {
        assert!(
            message.contains(part),
            "{message:?} does not mention {part:?}"
        );
    }
}

#[test]
fn syntax_error_names_field_line_and_column() {
    let e = compile_err(
        "parts:\n  - name: a\n  - name: b\n    commands:\n      - echo ok\n      - \"echo\\n  {{#if values.x}}\"\n",
    );
    assert_eq!(e.reason(), reason::TEMPLATE_INVALID);
    assert_mentions(
        &e,
        &[
            "spec.parts[1].commands[1]",
            "line 2, column",
            "syntax error",
        ],
    );
    let p = &e.problems()[0];
    assert_eq!(p.position.unwrap().line, 2);
}

#[test]
fn undefined_variable_names_variable_field_line_and_column() {
    let yaml = "format: script\ntemplate: \"#!/bin/sh\\necho ok\\necho {{values.nope}}\\n\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Worker);
    assert_eq!(e.reason(), reason::RENDER_FAILED);
    assert_mentions(
        &e,
        &[
            "spec.template",
            "line 3, column 6",
            "undefined variable `values.nope`",
        ],
    );

    let e = render_err(
        "parts:\n  - name: p\n    files:\n      - path: /etc/x\n        content: \"a\\n  {{machine.nmae}}\"\n",
        &vars(json!({})),
        Role::Worker,
    );
    assert_mentions(
        &e,
        &[
            "spec.parts[0].files[0].content",
            "line 2, column 3",
            "`machine.nmae`",
        ],
    );
}

#[test]
fn undefined_variable_in_a_partial_names_the_partial_and_the_includer() {
    let yaml = "partials:\n  p: \"x\\n{{cluster.nope}}\"\nformat: script\ntemplate: \"#!/bin/sh\\n{{> p}}\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Worker);
    assert_mentions(
        &e,
        &[
            "spec.partials.p",
            "line 2, column 1",
            "`cluster.nope`",
            "included from spec.template",
        ],
    );
}

#[test]
fn join_and_certs_hint_at_roles() {
    let yaml = "format: script\ntemplate: \"#!/bin/sh\\n{{join.token}}\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Init);
    assert_mentions(&e, &["`join.token`", "absent for role init"]);
    let yaml = "format: script\ntemplate: \"#!/bin/sh\\n{{certs.ca.key}}\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Worker);
    assert_mentions(&e, &["`certs.ca.key`", "control-plane roles"]);
}

#[test]
fn helper_errors_name_the_helper_and_position() {
    let yaml = "format: script\ntemplate: \"#!/bin/sh\\n  {{indent 2 cluster.network.pods}}\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Worker);
    assert_mentions(
        &e,
        &["spec.template", "line 2, column 3", "helper `indent`"],
    );
    let yaml = "format: script\ntemplate: \"#!/bin/sh\\n{{nosuch cluster.name}}\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Worker);
    assert_mentions(&e, &["line 2, column 1", "unknown helper `nosuch`"]);
    let yaml = "format: script\ntemplate: \"#!/bin/sh\\n{{shell_quote values.nope}}\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Worker);
    assert_mentions(
        &e,
        &["undefined variable `values.nope`", "line 2, column 1"],
    );
}

#[test]
fn missing_partial_is_a_compile_error_with_position() {
    let e = compile_err(
        "partials:\n  a: x\ntemplate: \"#!/bin/sh\\n\\n   {{> nope}}\"\nformat: script\n",
    );
    assert_mentions(
        &e,
        &[
            "spec.template",
            "line 3, column 4",
            "partial `nope` is not defined",
            "defined: a",
        ],
    );
}

#[test]
fn partial_recursion_is_reported_not_overflowed() {
    let e = compile_err("partials:\n  a: \"{{> a}}\"\ntemplate: \"{{> a}}\"\nformat: script\n");
    assert_mentions(
        &e,
        &[
            "spec.partials.a",
            "partial recursion: a → a",
            "line 1, column 1",
        ],
    );
    let e = compile_err(
        "partials:\n  a: \"x {{> b}}\"\n  b: \"{{#if cluster}}\\n{{> c}}{{/if}}\"\n  c: \"{{> a}}\"\ntemplate: \"{{> a}}\"\nformat: script\n",
    );
    assert_mentions(&e, &["partial recursion: a → b → c → a", "spec.partials.c"]);
    // Recursion through a partial block's body, too.
    let e = compile_err(
        "partials:\n  a: \"{{#> b}}{{> a}}{{/b}}\"\n  b: \"{{> @partial-block}}\"\ntemplate: \"{{> a}}\"\nformat: script\n",
    );
    assert_mentions(&e, &["partial recursion: a → a"]);
}

#[test]
fn nesting_beyond_the_limit_is_rejected_without_overflow() {
    // 1 000 nested blocks stay under the compile-cost limit, so they are parsed (pest guards
    // its own stack), measured without recursion and torn down without recursion, on this
    // test's 2 MiB thread stack.
    let very_deep = format!(
        "{}x{}",
        "{{#if cluster}}".repeat(1000),
        "{{/if}}".repeat(1000)
    );
    let e = compile_err(&format!("format: script\ntemplate: \"{very_deep}\"\n"));
    assert_mentions(&e, &["spec.template"]);
    let deep = format!(
        "{}x{}",
        "{{#if cluster}}".repeat(100),
        "{{/if}}".repeat(100)
    );
    let e = compile_err(&format!("format: script\ntemplate: \"{deep}\"\n"));
    assert_mentions(
        &e,
        &["spec.template", "nested 100 levels deep", "limit is 64"],
    );

    // An else-if chain of 1 500 branches is a 1 500-deep tree (torn down without recursion).
    let mut chain = String::from("{{#if cluster}}");
    for _ in 0..1_500 {
        chain.push_str("{{else if cluster}}");
    }
    chain.push_str("{{/if}}");
    let e = compile_err(&format!("format: script\ntemplate: \"{chain}\"\n"));
    assert_mentions(&e, &["nested 1501 levels deep"]);

    // Depth through partials: p0 includes p1 inside two blocks, ... p39.
    let mut yaml = String::from("format: script\ntemplate: \"{{> p0}}\"\npartials:\n");
    for i in 0..40 {
        yaml.push_str(&format!(
            "  p{i}: \"{{{{#if cluster}}}}{{{{> p{}}}}}{{{{/if}}}}\"\n",
            i + 1
        ));
    }
    yaml.push_str("  p40: x\n");
    let e = compile_err(&yaml);
    assert_mentions(&e, &["counting the partials it includes", "limit is 64"]);
}

#[test]
fn huge_texts_are_rejected_quickly() {
    // 5 MiB of nested blocks, and a long else-if chain: compiling either would take minutes
    // (handlebars' compile time grows with size × mustaches) or overflow the stack.
    let huge = "{{#if cluster}}".repeat(5 << 20 >> 4);
    let mut chain = String::from("{{#if cluster}}");
    for _ in 0..100_000 {
        chain.push_str("{{else if cluster}}");
    }
    for text in [huge, chain] {
        let spec = render_spec(&text);
        let start = Instant::now();
        let e = CompiledTemplate::compile(OBJECT, &spec)
            .err()
            .expect("rejected");
        // Unoptimised test builds spend ~0.5 s hashing 5 MiB for the revision alone.
        let bound = Duration::from_secs(if cfg!(debug_assertions) { 3 } else { 1 });
        assert!(start.elapsed() < bound, "took {:?}", start.elapsed());
        assert_mentions(
            &e,
            &[
                "spec.template",
                "too large to compile",
                "move parts of it into partials",
            ],
        );
    }
    // Many medium texts add up.
    let medium = format!("{}{}", "{{cluster.name}}".repeat(1000), " ".repeat(48_000));
    let mut spec = render_spec("x");
    for i in 0..10 {
        spec.partials.insert(format!("p{i}"), medium.clone());
    }
    let e = CompiledTemplate::compile(OBJECT, &spec)
        .err()
        .expect("rejected");
    assert_mentions(&e, &["together the template's texts exceed"]);
}

fn render_spec(template: &str) -> crd_types::TemplateSpec {
    crd_types::TemplateSpec {
        format: crd_types::OutputFormat::Script,
        template: Some(template.to_owned()),
        ..Default::default()
    }
}

#[test]
fn exponential_partial_inclusion_is_rejected() {
    // Five partials, each including the next ten times: 111 111 inclusions producing nothing.
    let mut yaml = String::from("format: script\ntemplate: \"#!/bin/sh\\n{{> p0}}\"\npartials:\n");
    for i in 0..5 {
        yaml.push_str(&format!(
            "  p{i}: \"{}\"\n",
            format!("{{{{> p{}}}}}", i + 1).repeat(10)
        ));
    }
    yaml.push_str("  p5: \"\"\n");
    let e = compile_err(&yaml);
    assert_mentions(&e, &["includes partials", "limit is 10000"]);
    let template = e
        .problems()
        .into_iter()
        .find(|p| p.field == "spec.template")
        .unwrap();
    assert!(
        template.message.contains("includes partials 111111 times"),
        "{template:?}"
    );
}

#[test]
fn deep_subexpressions_are_rejected_without_overflow() {
    let deep = format!(
        "{{{{upper {}cluster.name{}}}}}",
        "(upper ".repeat(5000),
        ")".repeat(5000)
    );
    let e = compile_err(&format!("format: script\ntemplate: \"{deep}\"\n"));
    assert_mentions(&e, &["spec.template"]);
}

#[test]
fn unsupported_constructs_are_named() {
    let e = compile_err(
        "format: script\ntemplate: \"{{#*inline \\\"x\\\"}}{{> x}}{{/inline}}{{> x}}\"\n",
    );
    assert_mentions(
        &e,
        &["inline partials are not supported", "line 1, column 1"],
    );
    let e = compile_err("format: script\ntemplate: \"{{> (lookup cluster \\\"name\\\")}}\"\n");
    assert_mentions(&e, &["dynamic partial names are not supported"]);
}

#[test]
fn variable_errors_name_the_variable_and_not_the_value() {
    let yaml = "variables:\n  - name: token\n    required: true\n    schema: {type: string, pattern: '^[a-z]+$'}\nformat: script\ntemplate: \"#!/bin/sh\\n{{values.token}}\"\n";
    let e = render_err(yaml, &vars(json!({})), Role::Worker);
    assert_eq!(e.reason(), reason::INVALID_VARIABLES);
    assert_mentions(&e, &["variable `token`", "required"]);
    let e = render_err(yaml, &vars(json!({"token": "S3CRET-VALUE"})), Role::Worker);
    assert_mentions(&e, &["variable `token`", "must match the pattern"]);
    assert!(!e.to_string().contains("S3CRET"), "{e}");
    let e = render_err(yaml, &vars(json!({"token": 5})), Role::Worker);
    assert_mentions(&e, &["must be a string, got an integer"]);
    let e = render_err(
        yaml,
        &vars(json!({"token": "abc", "tokn": 1})),
        Role::Worker,
    );
    assert_mentions(
        &e,
        &["variable `tokn`", "does not declare it", "declared: token"],
    );
}

#[test]
fn bad_declarations_name_the_field() {
    let e = compile_err(
        "variables:\n  - name: port\n    default: http\n    schema: {type: integer}\nformat: script\ntemplate: \"#!/bin/sh\"\n",
    );
    assert_eq!(e.reason(), reason::TEMPLATE_INVALID);
    assert_mentions(
        &e,
        &["spec.variables[0].default", "`port`", "must be an integer"],
    );
}

#[test]
fn body_shape_errors() {
    // Parts beside a raw template are `update: InPlace` ones, added to its output.
    let e = compile_err("format: cloud-config\ntemplate: x\nparts: [{name: a}]\n");
    assert_mentions(&e, &["spec.parts[0].update", "InPlace"]);
    let e = compile_err("format: script\n");
    assert_mentions(&e, &["no body"]);
    let e = compile_err("format: script\ntemplate: x\npartials:\n  a.b: x\n");
    assert_mentions(&e, &["spec.partials.a.b", "partial name"]);
    let e = compile_err(
        "parts:\n  - name: a\n    files: [{path: /x, permissions: '999', content: ''}]\n    units: [{name: 'bad name'}, {name: a.service, dropIns: [{name: x.txt, content: ''}]}]\n  - name: a\n",
    );
    let fields: Vec<String> = e.problems().into_iter().map(|p| p.field).collect();
    assert_eq!(
        fields,
        [
            "spec.parts[0].files[0].permissions",
            "spec.parts[0].units[0].name",
            "spec.parts[0].units[1].dropIns[0].name",
            "spec.parts[1].name"
        ]
    );
    assert_mentions(&e, &["(and 3 more problems)"]);
}

#[test]
fn rendered_paths_and_contents_are_checked() {
    let yaml = "variables: [{name: p}]\nparts:\n  - name: a\n    files:\n      - path: \"{{values.p}}\"\n        content: x\n      - path: /etc/b\n        encoding: base64\n        content: \"not base64!\"\n";
    let e = render_err(yaml, &vars(json!({"p": "etc/relative"})), Role::Worker);
    assert_mentions(&e, &["spec.parts[0].files[0].path", "absolute"]);
    let e = render_err(yaml, &vars(json!({"p": "/etc/a"})), Role::Worker);
    assert_mentions(&e, &["spec.parts[0].files[1].content", "not valid base64"]);
}

#[test]
fn config_errors_name_the_config_field() {
    let yaml = "parts: [{name: install}, {name: configure}]\n";
    let config = BootplateConfigSpec {
        skip_parts: vec!["instal".into()],
        ..Default::default()
    };
    let e = render_err(yaml, &config, Role::Worker);
    assert_mentions(
        &e,
        &[
            "the config's spec.skipParts[0]",
            "no part named `instal`",
            "install, configure",
        ],
    );
    let problem = &e.problems()[0];
    assert_eq!(problem.origin, Origin::Config);

    let config = BootplateConfigSpec {
        files: vec![ConfigFile {
            path: "/etc/from-secret".into(),
            content_from: Some(Default::default()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = render_err(
        "format: script\ntemplate: \"#!/bin/sh\"\n",
        &BootplateConfigSpec {
            skip_parts: vec!["install".into()],
            ..Default::default()
        },
        Role::Worker,
    );
    assert_mentions(&e, &["the config's spec.skipParts[0]", "no parts to skip"]);

    let e = render_err(yaml, &config, Role::Worker);
    assert_eq!(e.reason(), reason::FILE_SOURCE_ERROR);
    assert_mentions(&e, &["the config's spec.files[0].content", "contentFrom"]);

    let config = BootplateConfigSpec {
        files: vec![ConfigFile {
            path: "relative".into(),
            content: Some("x".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = render_err(yaml, &config, Role::Worker);
    assert_mentions(&e, &["the config's spec.files[0].path", "absolute"]);
}

#[test]
fn raw_output_is_checked_against_the_format() {
    let cases = [
        (
            "cloud-config",
            "runcmd: [a]",
            "first line must be `#cloud-config`",
        ),
        (
            "cloud-config",
            "#cloud-config\\nruncmd: [",
            "not valid YAML (output line",
        ),
        (
            "ignition",
            "{\\\"ignition\\\": {\\\"version\\\": \\\"2.2.0\\\"}}",
            "ignition.version",
        ),
        ("ignition", "{{join.token}}", "not valid JSON"),
        ("script", "echo {{join.token}}", "`#!` line"),
        (
            "mime-multipart",
            "Content-Type: text/plain\\n\\nx",
            "not multipart",
        ),
    ];
    for (format, body, expected) in cases {
        let yaml = format!("format: {format}\ntemplate: \"{body}\"\n");
        let e = render_err(&yaml, &vars(json!({})), Role::Worker);
        assert_eq!(e.reason(), reason::RENDER_FAILED);
        assert_mentions(&e, &["spec.template", expected]);
        // The output held the token: the message must not.
        assert!(!e.to_string().contains(render::SAMPLE_TOKEN), "{e}");
    }
}

#[test]
fn output_over_the_limit_names_both_sizes_and_stops_early() {
    // A 100 KiB value written 100 times by partials: 10 MiB if rendered in full.
    let yaml = "variables: [{name: big}]\nformat: script\ntemplate: \"#!/bin/sh\\n{{> p}}\"\npartials:\n  p: \"{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}\"\n  q: \"{{values.big}}{{values.big}}{{values.big}}{{values.big}}{{values.big}}{{values.big}}{{values.big}}{{values.big}}{{values.big}}{{values.big}}\"\n";
    let t = compile(yaml);
    let start = Instant::now();
    let e = t
        .render(
            &vars(json!({"big": "x".repeat(100 << 10)})),
            &sample_context(Role::Worker),
        )
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(e.reason(), reason::OUTPUT_TOO_LARGE);
    assert_mentions(
        &e,
        &[
            "at least 1048577 bytes",
            "limit of 1048576 bytes",
            "the 1 MiB Secret limit",
        ],
    );

    let small = "maxOutputBytes: 100\nformat: script\ntemplate: \"#!/bin/sh\\n{{cluster.name}}\"\n";
    let ok = compile(small).render(&vars(json!({})), &sample_context(Role::Worker));
    assert!(ok.is_ok());
    let config = BootplateConfigSpec {
        max_output_bytes: Some(10),
        ..Default::default()
    };
    let e = render_err(small, &config, Role::Worker);
    assert_mentions(
        &e,
        &["limit of 10 bytes", "the config's spec.maxOutputBytes"],
    );
    let e = render_err(
        "maxOutputBytes: 300\nparts: [{name: a, commands: [echo hi]}]\nformat: ignition\n",
        &vars(json!({})),
        Role::Worker,
    );
    assert_mentions(
        &e,
        &[
            "the output is ",
            "more than the limit of 300 bytes",
            "the template's spec.maxOutputBytes",
        ],
    );
    assert!(
        !e.to_string().contains("at least"),
        "the whole output was measured: {e}"
    );
}

#[test]
fn gzip_compresses_and_the_limit_applies_to_compressed_bytes() {
    // 20 000 bytes of text compress far below a 2 000 byte limit.
    let yaml = "compression: gzip\nmaxOutputBytes: 2000\nformat: script\ntemplate: \"#!/bin/sh\\n{{> p}}\"\npartials:\n  p: \"{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}{{> q}}\"\n  q: \"{{> r}}{{> r}}{{> r}}{{> r}}{{> r}}{{> r}}{{> r}}{{> r}}{{> r}}{{> r}}\"\n  r: \"echo aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\\n\"\n";
    let rendered = compile(yaml)
        .render(&vars(json!({})), &sample_context(Role::Worker))
        .unwrap();
    assert!(rendered.data.len() < 2000);
    assert_eq!(&rendered.data[..2], &[0x1f, 0x8b], "gzip magic");
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(&rendered.data[..]),
        &mut text,
    )
    .unwrap();
    assert!(text.starts_with("#!/bin/sh\necho aaa") && text.len() > 20_000);
    assert_eq!(rendered.secret_format(), "cloud-config");

    // Uncompressed text beyond 16 times the limit stops early.
    let e = render_err(
        &yaml.replace("2000", "1000"),
        &vars(json!({})),
        Role::Worker,
    );
    assert_mentions(
        &e,
        &[
            "at least 16001 bytes",
            "16 times the template's spec.maxOutputBytes, for the uncompressed output",
        ],
    );
}

#[test]
fn rendered_debug_output_never_shows_the_data() {
    let t = compile("format: script\ntemplate: \"#!/bin/sh\\n{{join.token}}\"\n");
    let r = t
        .render(&vars(json!({})), &sample_context(Role::Worker))
        .unwrap();
    assert!(String::from_utf8_lossy(&r.data).contains(render::SAMPLE_TOKEN));
    assert!(!format!("{r:?}").contains(render::SAMPLE_TOKEN));
}

#[test]
fn optional_variables_without_default_are_null_and_testable() {
    let t = compile(
        "variables: [{name: proxy}]\nformat: script\ntemplate: \"#!/bin/sh\\n{{#if values.proxy}}p={{values.proxy}}{{else}}none{{/if}} {{default values.proxy \\\"d\\\"}}\"\n",
    );
    let r = t
        .render(&vars(json!({})), &sample_context(Role::Worker))
        .unwrap();
    assert_eq!(r.data, b"#!/bin/sh\nnone d");
    let r = t
        .render(&vars(json!({"proxy": "x"})), &sample_context(Role::Worker))
        .unwrap();
    assert_eq!(r.data, b"#!/bin/sh\np=x x");
    let empty: BTreeMap<String, serde_json::Value> =
        BTreeMap::from([("proxy".into(), json!(null))]);
    let r = t
        .render(
            &BootplateConfigSpec {
                variables: empty,
                ..Default::default()
            },
            &sample_context(Role::Worker),
        )
        .unwrap();
    assert_eq!(
        r.data, b"#!/bin/sh\nnone d",
        "an explicit null counts as unset"
    );
}

#[test]
fn loops_that_do_too_much_work_stop_with_a_located_error() {
    let yaml = "variables: [{name: list}]\nformat: script\ntemplate: \"#!/bin/sh\\n{{#each values.list}}\\n  {{#each @root.values.list}}{{#if false}}x{{/if}}{{/each}}{{/each}}\"\n";
    let t = compile(yaml);
    // 300 × 300 iterations printing nothing: the output limit cannot stop this.
    let start = Instant::now();
    let e = t
        .render(
            &vars(json!({"list": vec![1; 300]})),
            &sample_context(Role::Worker),
        )
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(e.reason(), reason::RENDER_FAILED);
    assert_mentions(
        &e,
        &[
            "spec.template",
            "line 3, column 3",
            "more than 50000 template elements",
        ],
    );
    // A loop over a thousand items is fine, and the budget is per render.
    let list = json!({"list": vec![1; 1000]});
    let single = compile(
        "variables: [{name: list}]\nformat: script\ntemplate: \"#!/bin/sh\\n{{#each values.list}}{{this}}{{/each}}\"\n",
    );
    for _ in 0..3 {
        let r = single
            .render(&vars(list.clone()), &sample_context(Role::Worker))
            .unwrap();
        assert_eq!(r.data.len(), "#!/bin/sh\n".len() + 1000);
    }
}
