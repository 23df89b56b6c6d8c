//! Fuzz-style property tests, run by the normal `cargo test`: arbitrary template text (biased
//! towards handlebars syntax), partials and values go through compile, lint and render for every
//! role. Whatever the input, the engine must return (Ok or a typed error): no panic, no stack
//! overflow (that would abort this test process), and no call may take more than a second.

mod common;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use crd_types::{
    BootplateConfigSpec, OutputFormat, Part, Role, TemplateFile, TemplateSpec, VariableDecl,
};
use proptest::prelude::*;
use render::{CompiledTemplate, RenderError, lint, sample_context};
use serde_json::Value;

const FRAGMENTS: &[&str] = &[
    "{{",
    "}}",
    "{{{",
    "}}}",
    "{{{{raw}}}}",
    "{{{{/raw}}}}",
    "{{#if ",
    "{{#each ",
    "{{#with ",
    "{{#unless ",
    "{{/if}}",
    "{{/each}}",
    "{{/with}}",
    "{{/unless}}",
    "{{else}}",
    "{{else if ",
    "{{^}}",
    "{{> a}}",
    "{{> b}}",
    "{{> c}}",
    "{{#> a}}",
    "{{/a}}",
    "{{> @partial-block}}",
    "{{!-- ",
    " --}}",
    "{{! x }}",
    "{{~",
    "~}}",
    "\\{{",
    "(",
    ")",
    "[",
    "]",
    "\"",
    "'",
    "=",
    " as |x i|",
    "values.a",
    "values.b",
    "values",
    "@root.",
    "../",
    "this",
    "@index",
    "cluster.name",
    "machine.role",
    "join.token",
    "certs.ca.key",
    "files",
    "shell_quote ",
    "yaml_quote ",
    "json ",
    "base64 ",
    "gzip_base64 ",
    "indent 2 ",
    "nindent 4 ",
    "default ",
    "join ",
    "sha256 ",
    "upper ",
    "lower ",
    "trim ",
    "eq ",
    "and ",
    "not ",
    "lookup ",
    "len ",
    "1",
    "-1",
    "true",
    "null",
    "\n",
    " ",
    "#cloud-config\n",
    "#!/bin/sh\n",
    "{\"ignition\":{\"version\":\"3.3.0\"}}",
    "é",
    "\u{2028}",
];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(FRAGMENTS).prop_map(str::to_owned),
            1 => ".{0,6}",
        ],
        0..48,
    )
    .prop_map(|parts| parts.concat())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(FRAGMENTS).prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-c]", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn format() -> impl Strategy<Value = OutputFormat> {
    prop::sample::select(vec![
        OutputFormat::CloudConfig,
        OutputFormat::Ignition,
        OutputFormat::Script,
        OutputFormat::MimeMultipart,
    ])
}

#[derive(Debug, Clone)]
struct Input {
    spec: TemplateSpec,
    config: BootplateConfigSpec,
}

fn input() -> impl Strategy<Value = Input> {
    (
        format(),
        any::<bool>(),
        text(),
        prop::collection::vec(text(), 0..3),
        prop::collection::btree_map(prop::sample::select(vec!["a", "b", "c"]), text(), 0..3),
        json_value(),
        json_value(),
    )
        .prop_map(|(format, raw, body, commands, partials, a, b)| {
            let mut spec = TemplateSpec {
                format,
                variables: ["a", "b"]
                    .iter()
                    .map(|n| VariableDecl {
                        name: (*n).to_owned(),
                        ..Default::default()
                    })
                    .collect(),
                partials: partials
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
                ..Default::default()
            };
            if raw {
                spec.template = Some(body);
            } else {
                spec.parts = vec![Part {
                    name: "p".to_owned(),
                    files: vec![TemplateFile {
                        path: "/etc/{{values.a}}".to_owned(),
                        content: body,
                        ..Default::default()
                    }],
                    commands,
                    ..Default::default()
                }];
            }
            let config = BootplateConfigSpec {
                variables: BTreeMap::from([("a".to_owned(), a), ("b".to_owned(), b)]),
                ..Default::default()
            };
            Input { spec, config }
        })
}

/// Longest one engine call (a compile, a lint, or one render) may take, in CPU time of its
/// thread: wall-clock time would also count the other processes of a busy machine.
const PER_CALL: Duration = Duration::from_secs(1);

/// The CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid pointer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs compile, lint and a render for every role on a fresh thread (default 2 MiB stack).
/// Each call must finish within [`PER_CALL`]; a watchdog fails the case if the whole input
/// hangs (the thread is then left behind, and the test fails).
fn exercise(input: Input) -> Result<(), TestCaseError> {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || -> Result<(), String> {
        let timed = |what: &str, start: Duration| {
            let took = thread_cpu_time() - start;
            if took > PER_CALL {
                Err(format!("{what} took {took:?}"))
            } else {
                Ok(())
            }
        };
        let start = thread_cpu_time();
        let _ = lint("BootstrapTemplate fuzz/t", &input.spec, Some(&input.config));
        timed("lint (compile and three sample renders)", start)?;
        let start = thread_cpu_time();
        let compiled = CompiledTemplate::compile("BootstrapTemplate fuzz/t", &input.spec);
        timed("compile", start)?;
        if let Ok(t) = compiled {
            for role in Role::ALL {
                let start = thread_cpu_time();
                match t.render(&input.config, &sample_context(role)) {
                    Ok(r) => assert!(r.data.len() as u64 <= render::SECRET_LIMIT_BYTES),
                    Err(e) => check_error(&e),
                }
                timed("render", start)?;
            }
        }
        let _ = tx.send(());
        Ok(())
    });
    // The watchdog counts wall-clock time, generously: it is there for hangs, not slowness.
    match rx.recv_timeout(PER_CALL * 30) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(TestCaseError::fail("an input hung"));
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {}
    }
    match worker.join() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(slow)) => Err(TestCaseError::fail(slow)),
        Err(_) => Err(TestCaseError::fail("the engine panicked")),
    }
}

/// Errors are well-formed: they name the object and never quote the sample token.
fn check_error(e: &RenderError) {
    let message = e.to_string();
    assert!(
        message.starts_with("BootstrapTemplate fuzz/t: "),
        "{message}"
    );
    assert!(!message.contains(render::SAMPLE_TOKEN), "{message}");
    assert!(!e.problems().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_templates_and_values_never_crash_or_hang(input in input()) {
        exercise(input)?;
    }
}

/// Inputs the generator is unlikely to hit, run through the same harness.
#[test]
fn known_nasty_inputs() {
    let nasty = [
        "{{#each values.a}}{{#each ../values.a}}{{#each ../../values.a}}x{{/each}}{{/each}}{{/each}}",
        &"{{#if values.a}}".repeat(2000),
        &format!(
            "{{{{json {}values.a{}}}}}",
            "[".repeat(3000),
            "]".repeat(3000)
        ),
        &"(".repeat(10_000),
        "{{> a}}",
        "{{#> a}}{{> @partial-block}}{{/a}}",
        "{{lookup values \"a\"}}{{len values.a}}{{lookup . \"values\"}}",
        "{{{{raw}}}}{{#if}}{{{{/raw}}}}",
    ];
    for body in nasty {
        let spec = TemplateSpec {
            format: OutputFormat::Script,
            template: Some(body.to_owned()),
            partials: [(
                "a".to_owned(),
                "{{> @partial-block}}{{values.a}}".to_owned(),
            )]
            .into(),
            variables: vec![VariableDecl {
                name: "a".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let config = BootplateConfigSpec {
            variables: [("a".to_owned(), serde_json::json!(vec![1; 100]))].into(),
            ..Default::default()
        };
        exercise(Input { spec, config }).unwrap_or_else(|e| panic!("{body:.60}: {e}"));
    }
}
