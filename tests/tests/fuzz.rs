//! Fuzz targets run by the normal `cargo test` (proptest; nightly `cargo fuzz` is not available):
//!
//! - `decode_*`: arbitrary JSON and YAML decoded as the four bootplate kinds never panics, and
//!   whatever decodes round-trips: encoding it and decoding again gives the same object, and
//!   encoding that gives the same JSON (no field lost, renamed or defaulted differently), in
//!   JSON and in YAML.
//! - `yaml_alias_bombs_stay_bounded`: YAML whose aliases repeat lists into up to 10^16 nodes,
//!   in a raw cloud-config's output and in an input file, is refused by its node limit and
//!   never hangs.
//! - `webhook_validation_*`: the admission webhook's checks (`bootplate::webhook::validate`:
//!   `template`, `config`, `config_update`) never panic and return in bounded time on
//!   arbitrary template and config specs, and every denial names its field.
//!
//! Template text through compile, lint and render has its own suite in
//! `render/tests/fuzz.rs`; these targets stress the object structure around it instead.
//!
//! Each target runs `PROPTEST_CASES` cases (default 256); with `BOOTPLATE_FUZZ_SECONDS=N` it
//! repeats with fresh seeds until N seconds have passed (docs/fuzzing.md).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bootplate::webhook::validate;
use crd_types::{
    BootplateConfig, BootplateConfigSpec, BootplateConfigStatus, BootplateConfigTemplate,
    BootplateConfigTemplateResource, BootplateConfigTemplateSpec, BootstrapTemplate,
    BootstrapTemplateStatus, ClusterBootstrapTemplate, ClusterBootstrapTemplateSpec, Compression,
    ConfigFile, ConfigInitialization, DropIn, FileEncoding, FileSource, ItemSchema,
    ObjectMetaTemplate, OsInfo, OutputFormat, Part, Role, SecretKeyRef, TemplateFile, TemplateKind,
    TemplateRef, TemplateSpec, Unit, ValueType, VariableDecl, VariableSchema,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::ObjectMeta;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Runs `test` on `PROPTEST_CASES` (default 256) values of `strategy`, then again with fresh
/// seeds until `BOOTPLATE_FUZZ_SECONDS` have passed, if set. A failure panics with the
/// shrunk input.
fn fuzz<S>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let number = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = number("PROPTEST_CASES").unwrap_or(256) as u32;
    let deadline =
        Instant::now() + Duration::from_secs(number("BOOTPLATE_FUZZ_SECONDS").unwrap_or(0));
    let mut total = 0u64;
    loop {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("{name}: {e}");
        }
        total += u64::from(cases);
        if Instant::now() >= deadline {
            break;
        }
    }
    eprintln!("{name}: {total} cases, nothing found");
}

// --- Generators -------------------------------------------------------------------------------

/// Words that matter to the types and the checks: names, enum values, references, paths.
const WORDS: &[&str] = &[
    "a",
    "b",
    "install",
    "configure",
    "team-a",
    "team-b",
    "team-b/x",
    "",
    " ",
    "kubelet.service",
    "10-x.conf",
    "/etc/x",
    "etc/x",
    "/etc/../x",
    "0644",
    "0999",
    "root:root",
    "BootstrapTemplate",
    "ClusterBootstrapTemplate",
    "cloud-config",
    "ignition",
    "script",
    "mime-multipart",
    "gzip",
    "none",
    "init",
    "worker",
    "control-plane-join",
    "plain",
    "base64",
    "gzip+base64",
    "string",
    "integer",
    "array",
    "^[a-z]+$",
    "(",
    "aGVsbG8K",
    "é\u{0}\u{202e}",
    "2026-01-01T00:00:00Z",
    "True",
];

/// Template text: mostly short handlebars, with the names templates read.
const TEXT: &[&str] = &[
    "{{values.a}}",
    "{{values.b}}",
    "{{machine.name}}",
    "{{join.token}}",
    "{{certs.ca.key}}",
    "{{> p}}",
    "{{> q}}",
    "{{#each values.a}}{{this}}{{/each}}",
    "{{#if join}}",
    "{{/if}}",
    "{{shell_quote values.b}}",
    "{{",
    "}}",
    "#!/bin/sh\n",
    "#cloud-config\n",
    "\n",
    "x",
];

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(WORDS).prop_map(str::to_owned),
        1 => ".{0,8}",
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(TEXT).prop_map(str::to_owned),
            1 => word(),
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        word().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(word(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn one_of<T: Clone + Debug + 'static>(values: Vec<T>) -> impl Strategy<Value = T> {
    prop::sample::select(values)
}

fn value_type() -> impl Strategy<Value = ValueType> {
    one_of(vec![
        ValueType::String,
        ValueType::Integer,
        ValueType::Number,
        ValueType::Boolean,
        ValueType::Array,
        ValueType::Object,
    ])
}

fn encoding() -> impl Strategy<Value = Option<FileEncoding>> {
    prop::option::of(one_of(vec![
        FileEncoding::Plain,
        FileEncoding::Base64,
        FileEncoding::GzipBase64,
    ]))
}

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<i32>().prop_map(f64::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
    ]
}

fn variable() -> impl Strategy<Value = VariableDecl> {
    let schema = (
        prop::option::of(value_type()),
        prop::option::of(prop::collection::vec(json_value(), 0..3)),
        prop::option::of(word()),
        (prop::option::of(number()), prop::option::of(number())),
        (prop::option::of(0u64..40), prop::option::of(any::<u64>())),
        prop::option::of(value_type()),
    )
        .prop_map(
            |(type_, enum_, pattern, (minimum, maximum), (min_length, max_length), items)| {
                VariableSchema {
                    type_,
                    enum_,
                    pattern,
                    minimum,
                    maximum,
                    min_length,
                    max_length,
                    items: items.map(|type_| ItemSchema { type_ }),
                }
            },
        );
    (
        one_of(vec!["a", "b", "c", "a-b", "9x", ""]),
        prop::option::of(word()),
        any::<bool>(),
        prop::option::of(json_value()),
        prop::option::of(schema),
    )
        .prop_map(
            |(name, description, required, default, schema)| VariableDecl {
                name: name.to_owned(),
                description,
                required,
                default,
                schema,
            },
        )
}

fn part() -> impl Strategy<Value = Part> {
    let file = (
        text(),
        prop::option::of(word()),
        prop::option::of(word()),
        text(),
        encoding(),
    )
        .prop_map(
            |(path, permissions, owner, content, encoding)| TemplateFile {
                path,
                permissions,
                owner,
                content,
                encoding,
            },
        );
    let unit = (
        word(),
        prop::option::of(any::<bool>()),
        prop::option::of(text()),
        prop::collection::vec(
            (word(), text()).prop_map(|(name, content)| DropIn { name, content }),
            0..2,
        ),
    )
        .prop_map(|(name, enable, content, drop_ins)| Unit {
            name,
            enable,
            content,
            drop_ins,
        });
    (
        one_of(vec!["install", "configure", ""]),
        prop::collection::vec(one_of(Role::ALL.to_vec()), 0..3),
        prop::collection::vec(file, 0..3),
        prop::collection::vec(unit, 0..2),
        prop::collection::vec(text(), 0..3),
    )
        .prop_map(|(name, roles, files, units, commands)| Part {
            name: name.to_owned(),
            roles,
            files,
            units,
            commands,
            generator: None,
            update: Default::default(),
        })
}

fn template_spec() -> impl Strategy<Value = TemplateSpec> {
    (
        (word(), prop::option::of(word())),
        one_of(vec![
            OutputFormat::CloudConfig,
            OutputFormat::Ignition,
            OutputFormat::Script,
            OutputFormat::MimeMultipart,
        ]),
        prop::collection::vec(variable(), 0..4),
        prop::collection::btree_map(one_of(vec!["p", "q", "bad name"]), text(), 0..3),
        prop::option::of(text()),
        prop::collection::vec(part(), 0..3),
        prop::option::of(one_of(vec![Compression::None, Compression::Gzip])),
        prop::option::of(prop_oneof![0u64..2048, any::<u64>()]),
    )
        .prop_map(
            |((name, version), format, variables, partials, template, parts, compression, max)| {
                TemplateSpec {
                    os: OsInfo { name, version },
                    format,
                    variables,
                    partials: partials
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                    template,
                    parts,
                    compression,
                    max_output_bytes: max,
                    boot_reports: None,
                    delivery: None,
                    network: None,
                    update_policy: None,
                }
            },
        )
}

fn template_ref() -> impl Strategy<Value = TemplateRef> {
    (
        one_of(vec![
            TemplateKind::BootstrapTemplate,
            TemplateKind::ClusterBootstrapTemplate,
        ]),
        word(),
        prop::option::of(word()),
    )
        .prop_map(|(kind, name, namespace)| TemplateRef {
            kind,
            name,
            namespace,
        })
}

fn config_spec() -> impl Strategy<Value = BootplateConfigSpec> {
    let file = (
        word(),
        prop::option::of(word()),
        prop::option::of(word()),
        prop::option::of(word()),
        prop::option::of((word(), word(), prop::option::of(word())).prop_map(
            |(name, key, namespace)| FileSource {
                secret: SecretKeyRef {
                    name,
                    key,
                    namespace,
                },
            },
        )),
        encoding(),
    )
        .prop_map(
            |(path, permissions, owner, content, content_from, encoding)| ConfigFile {
                path,
                permissions,
                owner,
                content,
                content_from,
                encoding,
            },
        );
    (
        template_ref(),
        prop::collection::btree_map(one_of(vec!["a", "b", "c", "x"]), json_value(), 0..3),
        prop::collection::vec(word(), 0..2),
        prop::collection::vec(file, 0..3),
        prop::collection::vec(word(), 0..2),
        prop::collection::vec(word(), 0..2),
        prop::option::of(prop_oneof![0u64..4096, any::<u64>()]),
    )
        .prop_map(
            |(template_ref, variables, skip_parts, files, pre, post, max)| BootplateConfigSpec {
                template_ref,
                variables: variables
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
                skip_parts,
                files,
                pre_commands: pre,
                post_commands: post,
                max_output_bytes: max,
                network: None,
                delivery: None,
            },
        )
}

fn condition() -> impl Strategy<Value = Condition> {
    (
        word(),
        word(),
        word(),
        word(),
        0i64..4_000_000_000,
        prop::option::of(any::<i64>()),
    )
        .prop_map(
            |(type_, status, reason, message, seconds, observed_generation)| Condition {
                type_,
                status,
                reason,
                message,
                last_transition_time: Time(
                    k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap(),
                ),
                observed_generation,
            },
        )
}

fn config_status() -> impl Strategy<Value = Option<BootplateConfigStatus>> {
    prop::option::of(
        (
            any::<bool>(),
            prop::option::of(word()),
            prop::option::of(any::<bool>()),
            prop::option::of(any::<i64>()),
            (prop::option::of(word()), prop::option::of(word())),
            prop::collection::vec(condition(), 0..3),
        )
            .prop_map(
                |(ready, data_secret_name, created, generation, (revision, role), conditions)| {
                    BootplateConfigStatus {
                        ready,
                        data_secret_name,
                        data_secret_version: None,
                        initialization: created.map(|data_secret_created| ConfigInitialization {
                            data_secret_created,
                        }),
                        observed_generation: generation,
                        template_revision: revision,
                        role,
                        in_place: None,
                        boot: None,
                        conditions,
                    }
                },
            ),
    )
}

fn meta() -> impl Strategy<Value = ObjectMeta> {
    (
        word(),
        prop::option::of(word()),
        prop::option::of(prop::collection::btree_map(word(), word(), 0..3)),
    )
        .prop_map(|(name, namespace, labels)| ObjectMeta {
            name: Some(name),
            namespace,
            labels,
            ..Default::default()
        })
}

fn template_status() -> impl Strategy<Value = Option<BootstrapTemplateStatus>> {
    prop::option::of(
        (
            prop::option::of(word()),
            prop::collection::vec(condition(), 0..2),
        )
            .prop_map(|(revision, conditions)| BootstrapTemplateStatus {
                observed_generation: None,
                revision,
                conditions,
            }),
    )
}

/// A valid object of one of the four kinds, as JSON.
fn object() -> impl Strategy<Value = Value> {
    prop_oneof![
        (meta(), template_spec(), template_status()).prop_map(|(metadata, spec, status)| {
            to_json(&BootstrapTemplate {
                metadata,
                spec,
                status,
            })
        }),
        (meta(), template_spec(), template_status()).prop_map(|(metadata, spec, status)| {
            to_json(&ClusterBootstrapTemplate {
                metadata,
                spec: ClusterBootstrapTemplateSpec(spec),
                status,
            })
        }),
        (meta(), config_spec(), config_status()).prop_map(|(metadata, spec, status)| {
            to_json(&BootplateConfig {
                metadata,
                spec,
                status,
            })
        }),
        (
            meta(),
            config_spec(),
            prop::option::of(prop::collection::btree_map(word(), word(), 0..2))
        )
            .prop_map(
                |(metadata, spec, labels)| to_json(&BootplateConfigTemplate {
                    metadata,
                    spec: BootplateConfigTemplateSpec {
                        template: BootplateConfigTemplateResource {
                            metadata: labels.map(|labels| ObjectMetaTemplate {
                                labels,
                                annotations: BTreeMap::new(),
                            }),
                            spec,
                        },
                        update_policy: None,
                    },
                })
            ),
    ]
}

fn to_json<T: Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("every object encodes")
}

/// One change to a JSON document: at the path chosen by `steps`, replace the value, drop a key,
/// or add a key.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(Vec<usize>, Value),
    Remove(Vec<usize>),
    Insert(Vec<usize>, String, Value),
}

/// Field names of the four kinds, so added keys often hit real fields.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "template",
    "templateRef",
    "variables",
    "parts",
    "files",
    "partials",
    "format",
    "os",
    "schema",
    "default",
    "type",
    "enum",
    "items",
    "contentFrom",
    "secret",
    "namespace",
    "maxOutputBytes",
    "compression",
    "roles",
    "units",
    "dropIns",
    "conditions",
    "ready",
    "lastTransitionTime",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    let path = prop::collection::vec(any::<usize>(), 0..6);
    prop_oneof![
        (path.clone(), json_value()).prop_map(|(p, v)| Mutation::Replace(p, v)),
        path.clone().prop_map(Mutation::Remove),
        (path, prop::sample::select(KEYS), json_value()).prop_map(|(p, k, v)| Mutation::Insert(
            p,
            k.to_owned(),
            v
        )),
    ]
}

/// The value at the path `steps` picks (each step picks a child modulo the child count; the
/// walk stops at a leaf).
fn walk<'a>(mut value: &'a mut Value, steps: &[usize]) -> &'a mut Value {
    for step in steps {
        let len = match &*value {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if len == 0 {
            break;
        }
        value = match value {
            Value::Object(m) => m.values_mut().nth(step % len).unwrap(),
            Value::Array(a) => &mut a[step % len],
            _ => unreachable!(),
        };
    }
    value
}

fn apply(mut document: Value, mutations: &[Mutation]) -> Value {
    for m in mutations {
        match m {
            Mutation::Replace(path, v) => *walk(&mut document, path) = v.clone(),
            Mutation::Remove(path) => match walk(&mut document, path) {
                Value::Object(map) if !map.is_empty() => {
                    let key = map.keys().next().cloned().unwrap();
                    map.remove(&key);
                }
                Value::Array(items) if !items.is_empty() => {
                    items.pop();
                }
                _ => {}
            },
            Mutation::Insert(path, key, v) => {
                if let Value::Object(map) = walk(&mut document, path) {
                    map.insert(key.clone(), v.clone());
                }
            }
        }
    }
    document
}

// --- Decoding ----------------------------------------------------------------------------------

/// A decodable type and what a round trip must keep: everything it holds. (The kinds, derived
/// by kube, have no `PartialEq`; their parts do.)
trait Decoded: DeserializeOwned + Serialize + Debug {
    fn same(&self, other: &Self) -> bool;
}

macro_rules! decoded_by_parts {
    ($($kind:ty => $($part:ident),+;)+) => {$(
        impl Decoded for $kind {
            fn same(&self, other: &Self) -> bool {
                $(self.$part == other.$part)&&+
            }
        }
    )+};
}

decoded_by_parts! {
    BootstrapTemplate => metadata, spec, status;
    ClusterBootstrapTemplate => metadata, spec, status;
    BootplateConfig => metadata, spec, status;
    BootplateConfigTemplate => metadata, spec;
}

impl Decoded for TemplateSpec {
    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

impl Decoded for BootplateConfigSpec {
    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

/// Decodes `document` as `T`; what decodes must round-trip through JSON and YAML.
fn round_trips<T: Decoded>(kind: &str, document: &Value) -> Result<(), TestCaseError> {
    let Ok(decoded) = serde_json::from_value::<T>(document.clone()) else {
        return Ok(());
    };
    let encoded = to_json(&decoded);
    let again: T = serde_json::from_value(encoded.clone())
        .map_err(|e| TestCaseError::fail(format!("{kind}: its own JSON does not decode: {e}")))?;
    prop_assert!(
        again.same(&decoded),
        "{}: JSON round trip changed the object:\n{:?}\n{:?}",
        kind,
        decoded,
        again
    );
    prop_assert_eq!(
        to_json(&again),
        encoded,
        "{}: JSON encoding is not stable",
        kind
    );
    let yaml = serde_yaml::to_string(&decoded)
        .map_err(|e| TestCaseError::fail(format!("{kind}: cannot encode as YAML: {e}")))?;
    let from_yaml: T = serde_yaml::from_str(&yaml).map_err(|e| {
        TestCaseError::fail(format!("{kind}: its own YAML does not decode: {e}\n{yaml}"))
    })?;
    prop_assert!(
        from_yaml.same(&decoded),
        "{}: YAML round trip changed it:\n{}\n{:?}\n{:?}",
        kind,
        yaml,
        decoded,
        from_yaml
    );
    Ok(())
}

fn decode_as_every_kind(document: &Value) -> Result<(), TestCaseError> {
    round_trips::<BootstrapTemplate>("BootstrapTemplate", document)?;
    round_trips::<ClusterBootstrapTemplate>("ClusterBootstrapTemplate", document)?;
    round_trips::<BootplateConfig>("BootplateConfig", document)?;
    round_trips::<BootplateConfigTemplate>("BootplateConfigTemplate", document)?;
    // The spec types alone, as the webhook and the CLI decode them.
    for part in [&document["spec"], &document["spec"]["template"]["spec"]] {
        round_trips::<TemplateSpec>("TemplateSpec", part)?;
        round_trips::<BootplateConfigSpec>("BootplateConfigSpec", part)?;
    }
    Ok(())
}

#[test]
fn decode_valid_objects_round_trip() {
    fuzz("decode_valid_objects_round_trip", object(), |document| {
        decode_as_every_kind(&document)?;
        // Each valid object decodes as at least its own kind.
        let decodes = [
            serde_json::from_value::<BootstrapTemplate>(document.clone()).is_ok(),
            serde_json::from_value::<BootplateConfig>(document.clone()).is_ok(),
            serde_json::from_value::<BootplateConfigTemplate>(document.clone()).is_ok(),
        ];
        prop_assert!(
            decodes.contains(&true),
            "a valid object does not decode: {}",
            document
        );
        Ok(())
    });
}

#[test]
fn decode_mutated_objects_never_panics() {
    fuzz(
        "decode_mutated_objects_never_panics",
        (object(), prop::collection::vec(mutation(), 1..6)),
        |(document, mutations)| decode_as_every_kind(&apply(document, &mutations)),
    );
}

/// YAML text: a valid object written as YAML, then edited line by line: lines dropped or
/// duplicated, and pieces of objects, YAML syntax (anchors, merge keys, tags, flow and block
/// collections, multi-line scalars, documents) and noise inserted.
fn yaml_text() -> impl Strategy<Value = String> {
    const PIECES: &[&str] = &[
        "apiVersion: bootstrap.bootplate.dev/v1alpha1\n",
        "kind: BootplateConfig\n",
        "metadata: {name: x, namespace: team-a}\n",
        "spec:\n",
        "  templateRef: {kind: ClusterBootstrapTemplate, name: x}\n",
        "  os: {name: linux}\n",
        "  format: script\n",
        "  template: |\n    #!/bin/sh\n    {{values.a}}\n",
        "  variables:\n",
        "  - {name: a, default: 1, schema: {type: integer, minimum: 1.5e3}}\n",
        "    a: &anchor [1, 2, {b: c}]\n",
        "    b: *anchor\n",
        "  <<: *anchor\n",
        "  files:\n  - path: /etc/x\n    contentFrom: {secret: {name: s, key: k}}\n",
        "  parts:\n  - name: install\n    commands: [\"true\"]\n",
        "  maxOutputBytes: 18446744073709551615\n",
        "  maxOutputBytes: -1\n",
        "  maxOutputBytes: 1e400\n",
        "!!binary aGVsbG8=\n",
        "? complex key\n: value\n",
        "---\n",
        "...\n",
        "- \n",
        "{",
        "}",
        "[",
        "]",
        "\"\\u0000\\ud800\"",
        "~\n",
        ".nan\n",
        "\t",
        "  ",
        "\n",
        "#comment\n",
    ];
    let piece = prop_oneof![
        4 => prop::sample::select(PIECES).prop_map(str::to_owned),
        1 => ".{0,6}",
    ];
    let edit = (any::<usize>(), 0u8..4, piece);
    (object(), prop::collection::vec(edit, 0..6)).prop_map(|(object, edits)| {
        let yaml = serde_yaml::to_string(&object).expect("an object encodes as YAML");
        let mut lines: Vec<String> = yaml.lines().map(|l| format!("{l}\n")).collect();
        for (at, what, piece) in edits {
            let at = at % (lines.len() + 1);
            match what {
                0 if at < lines.len() => drop(lines.remove(at)),
                1 if at < lines.len() => lines.insert(at, lines[at].clone()),
                _ => lines.insert(at, piece),
            }
        }
        lines.concat()
    })
}

fn yaml_round_trips<T: Decoded>(kind: &str, text: &str) -> Result<(), TestCaseError> {
    if let Ok(decoded) = serde_yaml::from_str::<T>(text) {
        round_trips::<T>(kind, &to_json(&decoded))?;
    }
    Ok(())
}

#[test]
fn decode_arbitrary_yaml_never_panics() {
    fuzz("decode_arbitrary_yaml_never_panics", yaml_text(), |text| {
        yaml_round_trips::<BootstrapTemplate>("BootstrapTemplate", &text)?;
        yaml_round_trips::<ClusterBootstrapTemplate>("ClusterBootstrapTemplate", &text)?;
        yaml_round_trips::<BootplateConfig>("BootplateConfig", &text)?;
        yaml_round_trips::<BootplateConfigTemplate>("BootplateConfigTemplate", &text)?;
        // JSON text too: the same bytes, as an AdmissionReview body would carry them.
        let _ = serde_json::from_str::<BootplateConfig>(&text);
        let _ = serde_json::from_str::<BootstrapTemplate>(&text);
        Ok(())
    });
}

// --- The webhook's validation ------------------------------------------------------------------

/// Longest one validation call may take (each runs at most a compile and three sample renders;
/// the margin is for a loaded 2-core machine). This catches hangs and runaway work, not
/// slowness: the engine's own time limits are in render/tests/fuzz.rs.
const PER_CALL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
struct Admission {
    template: TemplateSpec,
    config: BootplateConfigSpec,
    namespace: String,
    old: BootplateConfig,
    new: BootplateConfig,
}

fn admission() -> impl Strategy<Value = Admission> {
    (
        template_spec(),
        config_spec(),
        one_of(vec!["team-a", "team-b", ""]),
        (config_spec(), config_status()),
        (config_spec(), config_status()),
    )
        .prop_map(|(template, config, namespace, old, new)| Admission {
            template,
            config,
            namespace: namespace.to_owned(),
            old: BootplateConfig {
                metadata: ObjectMeta::default(),
                spec: old.0,
                status: old.1,
            },
            new: BootplateConfig {
                metadata: ObjectMeta::default(),
                spec: new.0,
                status: new.1,
            },
        })
}

/// Runs every check on a fresh thread; a call over [`PER_CALL`] or a hang fails the case.
fn validate_all(input: Admission) -> Result<(), TestCaseError> {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || -> Result<(), String> {
        let display = "BootstrapTemplate team-a/fuzz";
        let timed = |what: &str, start: Instant, problems: &[String]| {
            if start.elapsed() > PER_CALL {
                return Err(format!("{what} took {:?}", start.elapsed()));
            }
            match problems.iter().find(|p| p.trim().is_empty()) {
                Some(_) => Err(format!("{what} returned an empty problem")),
                None => Ok(()),
            }
        };
        let start = Instant::now();
        let problems = validate::template(display, &input.template);
        timed("validate::template", start, &problems)?;
        for (field, template) in [
            ("spec", Some((display, &input.template))),
            ("spec.template.spec", None),
        ] {
            let start = Instant::now();
            let problems = validate::config(field, &input.namespace, &input.config, template);
            timed("validate::config", start, &problems)?;
            if let Some(p) = problems.iter().find(|p| !p.starts_with(field)) {
                return Err(format!("a denial that does not start with {field}: {p}"));
            }
        }
        let start = Instant::now();
        let template = Some((display, &input.template));
        let problems = validate::config_update(&input.old, &input.new, template, template);
        timed("validate::config_update", start, &problems)?;
        let written = input
            .old
            .status
            .as_ref()
            .is_some_and(|s| s.ready || s.data_secret_name.is_some());
        // A config not yet written, or an update that leaves the spec alone, is always
        // admitted; otherwise the renders decide, and a refusal says why, at `spec`.
        if (!written || input.old.spec == input.new.spec) && !problems.is_empty() {
            return Err(format!(
                "config_update refused an update it must admit (written={written}): {problems:?}"
            ));
        }
        if let Some(p) = problems.iter().find(|p| !p.starts_with("spec: ")) {
            return Err(format!("config_update: a denial not at spec: {p}"));
        }
        let _ = tx.send(());
        Ok(())
    });
    match rx.recv_timeout(PER_CALL * 10) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => return Err(TestCaseError::fail("validation hung")),
    }
    match worker.join() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(TestCaseError::fail(message)),
        Err(_) => Err(TestCaseError::fail("validation panicked")),
    }
}

#[test]
fn webhook_validation_never_panics() {
    fuzz("webhook_validation_never_panics", admission(), validate_all);
}

// --- Issue 28: helpers with huge arguments, gzip contents -------------------------------------

/// A helper call whose result grows with a long list and a long separator, at the top of the
/// text or hidden in a condition.
fn huge_helper_call() -> impl Strategy<Value = (String, usize, usize, usize)> {
    let calls = vec![
        "{{join values.l values.s}}",
        "{{#if (join values.l values.s)}}x{{/if}}",
        "{{shell_quote (join values.l values.s)}}",
        "{{json values.l}}",
        "{{indent 256 (join values.l values.s)}}",
        "{{nindent 200 (join values.l \"\\n\")}}",
        "{{yaml_quote (join values.l values.s)}}",
        "{{systemd_quote (join values.l values.s)}}",
        "{{base64 (join values.l values.s)}}",
        "{{gzip_base64 (join values.l values.s)}}",
        "{{upper (default (join values.l values.s) \"\")}}",
        "{{#each values.l}}{{#if (trim (join @root.values.l @root.values.s))}}{{/if}}{{/each}}",
    ];
    (
        one_of(calls.into_iter().map(str::to_owned).collect()),
        0usize..2_000,
        0usize..20_000,
        1usize..64,
    )
}

/// Every helper is bounded before it builds its result: whatever the list and separator, a
/// render ends within the time limit, with output under the limit or a typed error.
#[test]
fn helpers_with_huge_arguments_stay_bounded() {
    fuzz(
        "helpers_with_huge_arguments_stay_bounded",
        huge_helper_call(),
        |(call, items, separator, item)| {
            let spec: TemplateSpec = serde_json::from_value(serde_json::json!({
                "os": {"name": "linux"},
                "format": "script",
                "variables": [{"name": "l", "default": []}, {"name": "s", "default": ","}],
                "template": format!("#!/bin/sh\n{call}\n"),
            }))
            .unwrap();
            let config = BootplateConfigSpec {
                variables: BTreeMap::from([
                    (
                        "l".to_owned(),
                        serde_json::json!(vec!["i".repeat(item); items]),
                    ),
                    ("s".to_owned(), serde_json::json!("s".repeat(separator))),
                ]),
                ..Default::default()
            };
            let result = within("helpers", move || {
                let compiled = render::CompiledTemplate::compile("t", &spec).unwrap();
                compiled.render(&config, &render::sample_context(Role::Worker))
            })?;
            match result {
                Ok(rendered) => prop_assert!(rendered.data.len() <= 1 << 20),
                Err(e) => prop_assert!(
                    matches!(
                        e.reason(),
                        "OutputTooLarge" | "RenderFailed" | "InvalidVariables"
                    ),
                    "{e}"
                ),
            }
            Ok(())
        },
    );
}

/// Files decoded for in-place parts (payload, update hooks, webhook updates): a gzip member
/// that expands past the limit, or any other content, gives a typed error or decoded files
/// within 16 times the limit, in bounded time.
#[test]
fn gzip_contents_decode_within_the_limit() {
    use base64::Engine as _;
    use std::io::Write as _;
    let bomb = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![0u8; 4 << 20]).unwrap();
        gz.finish().unwrap()
    };
    let strategy = (
        prop::collection::vec(any::<u8>(), 0..64),
        any::<bool>(),
        1u64..(1 << 16),
    );
    fuzz(
        "gzip_contents_decode_within_the_limit",
        strategy,
        |(noise, use_bomb, limit)| {
            let mut data = if use_bomb {
                bomb.clone()
            } else {
                noise.clone()
            };
            // A bomb, sometimes cut short (a truncated gzip stream).
            if use_bomb && noise.first().is_some_and(|b| b % 2 == 1) {
                data.truncate(10 + usize::from(noise[0]) * 16);
            }
            let content = base64::engine::general_purpose::STANDARD.encode(&data);
            let spec: TemplateSpec = serde_json::from_value(serde_json::json!({
                "os": {"name": "linux"}, "format": "cloud-config",
                "parts": [{"name": "p", "update": "InPlace", "commands": ["true"]}],
            }))
            .unwrap();
            let config: BootplateConfigSpec = serde_json::from_value(serde_json::json!({
                "templateRef": {"kind": "ClusterBootstrapTemplate", "name": "t"},
                "maxOutputBytes": limit,
                "files": [{"path": "/etc/x", "encoding": "gzip+base64", "content": content}],
            }))
            .unwrap();
            let result = within("gzip", move || {
                let compiled = render::CompiledTemplate::compile("t", &spec).unwrap();
                let ctx = render::sample_context(Role::Worker);
                compiled.render_parts(&config, &ctx, &Default::default())
            })?;
            match result {
                Ok(Some(parts)) => {
                    let decoded: usize = parts.config.files.iter().map(|f| f.content.len()).sum();
                    prop_assert!(decoded as u64 <= limit * 16, "{decoded} bytes");
                }
                Ok(None) => prop_assert!(false, "a template with parts"),
                Err(e) => prop_assert!(
                    matches!(e.reason(), "OutputTooLarge" | "RenderFailed"),
                    "{e}"
                ),
            }
            Ok(())
        },
    );
}

/// YAML whose aliases repeat: a list of `items` anchored as `l0`, then `levels` lists of
/// `aliases` aliases of the one before (items × aliases^levels nodes once expanded).
fn alias_bomb_lines(items: usize, aliases: usize, levels: usize) -> String {
    let mut text = format!("l0: &l0 [{}]\n", vec!["x"; items].join(","));
    for level in 1..=levels {
        let refs = vec![format!("*l{}", level - 1); aliases].join(",");
        text.push_str(&format!("l{level}: &l{level} [{refs}]\n"));
    }
    text
}

/// Alias bombs of every shape, wherever bootplate reads YAML: a raw cloud-config template's
/// output (alone, beside an in-place part whose files are merged into it, behind a branch the
/// render takes) and an input file of the offline commands. Each read ends within the time
/// limit, with what was parsed or a refusal naming the limit; never the expansion.
#[test]
fn yaml_alias_bombs_stay_bounded() {
    let strategy = (1usize..3_000, 1usize..3_000, 0usize..4, 0usize..4);
    fuzz(
        "yaml_alias_bombs_stay_bounded",
        strategy,
        |(items, aliases, levels, shape)| {
            let lines = alias_bomb_lines(items, aliases, levels);
            if shape == 3 {
                let result = within("file", move || {
                    render::yaml::documents(&lines, render::yaml::YamlLimit::file(&lines))
                        .map(|d| d.map(|_| ()))
                        .collect::<Result<Vec<()>, _>>()
                        .map_err(|e| e.to_string())
                })?;
                if let Err(e) = result {
                    prop_assert!(e.contains("grows past"), "{e}");
                }
                return Ok(());
            }
            let body: String = lines.lines().map(|l| format!("{l}\n")).collect();
            let (parts, body) = match shape {
                0 => (serde_json::json!([]), body),
                1 => (
                    serde_json::json!([{"name": "p", "update": "InPlace", "files": [{"path": "/etc/p", "content": "p"}]}]),
                    body,
                ),
                _ => (
                    serde_json::json!([]),
                    format!("{{{{#if machine.name}}}}\n{body}{{{{/if}}}}\n"),
                ),
            };
            let spec: TemplateSpec = serde_json::from_value(serde_json::json!({
                "os": {"name": "linux"},
                "format": "cloud-config",
                "parts": parts,
                "template": format!("#cloud-config\n{body}"),
            }))
            .unwrap();
            let result = within("render", move || {
                let compiled = render::CompiledTemplate::compile("t", &spec).unwrap();
                compiled.render(
                    &BootplateConfigSpec::default(),
                    &render::sample_context(Role::Worker),
                )
            })?;
            if let Err(e) = result {
                prop_assert!(
                    e.reason() == "RenderFailed" && e.to_string().contains("grows past"),
                    "{e}"
                );
            }
            Ok(())
        },
    );
}

/// How long one read or render of `within` may take before the case counts as a hang. It
/// catches work that is not bounded (an expansion of up to 10^16 nodes never ends), not
/// slowness: the bound itself is checked by the refusal naming its limit. A bounded read of a
/// million nodes takes about a second in a debug build on an idle machine, and took over 5 s
/// with the other tiers on both cores, so the margin is wide.
const HANG: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread and fails the case when it takes longer than [`HANG`].
fn within<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TestCaseError> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HANG)
        .map_err(|_| TestCaseError::fail(format!("{what}: no answer within {} s", HANG.as_secs())))
}
