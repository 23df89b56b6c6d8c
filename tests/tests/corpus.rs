//! The bad-input corpus (`tests/corpus/bad-input.yaml`, which describes its format): every case
//! through the real controller in one environment, asserting the config's `Ready=False` reason
//! and that the message names the culprit, while the controller stays up and keeps rendering
//! good configs. The engine-level cases run again offline through `render`, and every case's
//! verdict from the admission webhook's validation is checked too: the corpus records which bad
//! inputs are stopped at `kubectl apply` and which only the controller can see (missing Secrets
//! and keys, broken Clusters).
//!
//! A 5 MiB template is not in the YAML: it is built here, refused by the apiserver (its request
//! limit is 3 MiB, etcd's 1.5 MiB), and `bootplate lint` names the problem offline.
//!
//! Without Cluster API's manager: the test plays it (`testenv::capi_env`: owner references, a
//! Cluster's status) because many cases are states Cluster API would refuse or never produce (a
//! Cluster reported initialized without an endpoint, a Machine of a Cluster that does not
//! exist, CA Secrets of garbage): they are written straight, so bootplate's own guard is what
//! is tested, not Cluster API's webhooks.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use crd_types::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use crd_types::conditions::reason;
use crd_types::{
    BootplateConfig, BootplateConfigSpec, BootstrapTemplate, ClusterBootstrapTemplate, Role,
    TemplateKind, TemplateRef, TemplateSpec,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use testenv::capi_env::{Env, NS, WAIT, env};
use testenv::fixtures;

const CORPUS: &str = include_str!("../corpus/bad-input.yaml");
/// The namespace whose objects team-a must never reach.
const OTHER_NS: &str = "team-b";
/// Reasons the render engine alone decides: such cases also run offline.
const ENGINE_REASONS: [&str; 4] = [
    reason::TEMPLATE_INVALID,
    reason::RENDER_FAILED,
    reason::INVALID_VARIABLES,
    reason::OUTPUT_TOO_LARGE,
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Corpus {
    clusters: Vec<ClusterFixture>,
    secrets: Vec<SecretFixture>,
    templates: Vec<TemplateFixture>,
    cases: Vec<Case>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "kebab-case")]
enum CertContent {
    Valid,
    Garbage,
    NoCrt,
    Binary,
    Mismatched,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "kebab-case")]
enum KubeconfigContent {
    Workload,
    Nowhere,
    Unresolvable,
    WrongToken,
    Garbage,
    Binary,
    NoValue,
    AliasBomb,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFixture {
    name: String,
    ca: Option<CertContent>,
    etcd: Option<CertContent>,
    proxy: Option<CertContent>,
    sa: Option<CertContent>,
    kubeconfig: Option<KubeconfigContent>,
    #[serde(default = "yes")]
    endpoint: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretFixture {
    name: String,
    namespace: String,
    data: BTreeMap<String, ByteString>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateFixture {
    kind: TemplateKind,
    name: String,
    spec: Value,
}

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "kebab-case")]
enum Owner {
    #[default]
    Machine,
    None,
    Missing,
}

fn ok_cluster() -> String {
    "ok".into()
}

fn cluster_kind() -> TemplateKind {
    TemplateKind::ClusterBootstrapTemplate
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Case {
    name: String,
    about: String,
    /// Raw JSON: some cases hold specs the CRD schema (and so the Rust type) refuses.
    template: Option<Value>,
    #[serde(default = "cluster_kind")]
    template_kind: TemplateKind,
    template_ref: Option<TemplateRef>,
    #[serde(default)]
    config: serde_json::Map<String, Value>,
    #[serde(default = "ok_cluster")]
    cluster: String,
    #[serde(default)]
    control_plane: bool,
    #[serde(default)]
    owner: Owner,
    reason: Option<String>,
    #[serde(default)]
    message: Vec<String>,
    refused: Option<Vec<String>>,
    webhook: Option<Vec<String>>,
    /// The template renders for the checks' sample Machine and fails only for this case's
    /// Machine: the config reports the failure, the template stays Valid for every other one.
    #[serde(default)]
    renders_for_others: bool,
}

impl Case {
    fn template_ref(&self) -> TemplateRef {
        self.template_ref.clone().unwrap_or_else(|| {
            if self.template.is_some() {
                TemplateRef {
                    kind: self.template_kind,
                    name: self.name.clone(),
                    namespace: None,
                }
            } else {
                TemplateRef {
                    kind: TemplateKind::ClusterBootstrapTemplate,
                    name: "good".into(),
                    namespace: None,
                }
            }
        })
    }

    /// The config's spec as JSON (templateRef filled in).
    fn config_json(&self) -> Value {
        let mut spec = self.config.clone();
        spec.insert(
            "templateRef".into(),
            serde_json::to_value(self.template_ref()).unwrap(),
        );
        Value::Object(spec)
    }

    fn config_spec(&self) -> BootplateConfigSpec {
        serde_json::from_value(self.config_json())
            .unwrap_or_else(|e| panic!("case {}: config: {e}", self.name))
    }

    fn role(&self) -> Role {
        if self.control_plane {
            Role::ControlPlaneJoin
        } else {
            Role::Worker
        }
    }

    fn reads_secrets(&self) -> bool {
        self.config_spec()
            .files
            .iter()
            .any(|f| f.content_from.is_some())
    }
}

fn corpus() -> Corpus {
    let corpus: Corpus = serde_yaml::from_str(CORPUS).expect("tests/corpus/bad-input.yaml parses");
    let mut names = std::collections::BTreeSet::new();
    for case in &corpus.cases {
        assert!(
            names.insert(case.name.clone()),
            "case {} appears twice",
            case.name
        );
        assert!(!case.about.is_empty(), "case {} says what it is", case.name);
        assert!(
            case.reason.is_some() != case.refused.is_some(),
            "case {}: exactly one of reason and refused",
            case.name
        );
        assert!(
            case.refused.is_some() || !case.message.is_empty(),
            "case {}: the message fragments naming the culprit",
            case.name
        );
    }
    corpus
}

/// How messages name a template (as the controller and the webhook do).
fn display(kind: TemplateKind, name: &str) -> String {
    match kind {
        TemplateKind::BootstrapTemplate => format!("{kind} {NS}/{name}"),
        TemplateKind::ClusterBootstrapTemplate => format!("{kind} {name}"),
    }
}

/// The template spec a case's reference resolves to in team-a, when the corpus has it.
fn resolve<'a>(
    corpus: &'a Corpus,
    case: &'a Case,
    template_ref: &TemplateRef,
) -> Option<(String, TemplateSpec)> {
    if template_ref.namespace.as_deref().is_some_and(|ns| ns != NS) {
        return None;
    }
    let spec = match &case.template {
        Some(spec) if case.template_ref.is_none() => Some(spec),
        _ => corpus
            .templates
            .iter()
            .find(|t| t.kind == template_ref.kind && t.name == template_ref.name)
            .map(|t| &t.spec),
    }?;
    let spec: TemplateSpec = serde_json::from_value(spec.clone()).ok()?;
    Some((display(template_ref.kind, &template_ref.name), spec))
}

/// Why `message` does not name the culprit (a fragment it lacks), if it does not.
fn lacks(case: &Case, what: &str, message: &str, fragments: &[String]) -> Option<String> {
    let missing: Vec<&String> = fragments
        .iter()
        .filter(|f| !message.contains(f.as_str()))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "case {} ({}): the {what} lacks {missing:?}:\n    {message}",
            case.name, case.about
        )
    })
}

/// Panics listing every failure, so one run shows all of them.
fn report(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The engine-level cases, offline: the same reason and message fragments from `render` alone.
/// The sample context of the case's role, for its Machine (named after the case, as the
/// controller's is: a template may branch on it).
fn case_context(case: &Case) -> render::RenderContext {
    let mut context = render::sample_context(case.role());
    context.machine.name = case.name.clone();
    context
}

#[test]
fn engine_level_cases_fail_the_same_way_offline() {
    let corpus = corpus();
    let mut ran = 0;
    let mut failures = Vec::new();
    for case in &corpus.cases {
        let Some(expected) = case.reason.as_deref() else {
            continue;
        };
        if !ENGINE_REASONS.contains(&expected)
            || case.owner != Owner::Machine
            || case.cluster != "ok"
            || case.reads_secrets()
        {
            continue;
        }
        let template_ref = case.template_ref();
        let (display, spec) = resolve(&corpus, case, &template_ref)
            .unwrap_or_else(|| panic!("case {}: its template is in the corpus", case.name));
        let error = match render::CompiledTemplate::compile(&display, &spec) {
            Err(e) => e,
            Ok(compiled) => compiled
                .render(&case.config_spec(), &case_context(case))
                .err()
                .unwrap_or_else(|| panic!("case {}: the engine renders it", case.name)),
        };
        if error.reason() != expected {
            failures.push(format!(
                "case {}: reason {} instead of {expected}: {error}",
                case.name,
                error.reason()
            ));
        }
        failures.extend(lacks(
            case,
            "engine's error",
            &error.to_string(),
            &case.message,
        ));
        ran += 1;
    }
    report(failures);
    assert!(ran >= 30, "only {ran} engine-level cases");
}

/// What the admission webhook says about each case: denied naming the culprit where the case
/// lists `webhook` fragments, admitted where it does not (the controller is then the only check).
#[test]
fn webhook_validation_verdict_of_every_case() {
    use bootplate::webhook::validate;
    let corpus = corpus();
    let mut failures = Vec::new();
    for case in corpus.cases.iter().filter(|c| c.refused.is_none()) {
        let mut problems = Vec::new();
        if let Some(spec) = &case.template {
            let spec: TemplateSpec = serde_json::from_value(spec.clone()).unwrap();
            problems.extend(validate::template(
                &display(case.template_kind, &case.name),
                &spec,
            ));
        }
        let template_ref = case.template_ref();
        // The webhook reads the referenced template only by name, in the config's namespace.
        let template = if template_ref.name.contains('/') {
            None
        } else {
            resolve(&corpus, case, &template_ref)
        };
        problems.extend(validate::config(
            "spec",
            NS,
            &case.config_spec(),
            template.as_ref().map(|(d, s)| (d.as_str(), s)),
        ));
        let denial = problems.join("; ");
        match &case.webhook {
            Some(_) if problems.is_empty() => failures.push(format!(
                "case {} ({}): the webhook admits it",
                case.name, case.about
            )),
            Some(fragments) => failures.extend(lacks(case, "webhook's denial", &denial, fragments)),
            None if !problems.is_empty() => failures.push(format!(
                "case {} ({}): the webhook denies it (add `webhook` to the case): {denial}",
                case.name, case.about
            )),
            None => {}
        }
    }
    report(failures);
}

/// A 5 MiB template: realistic script lines, each with a mustache.
fn five_mib_template() -> String {
    let line =
        "echo {{shell_quote machine.name}} configuring step of the node, padding padding padding\n";
    let mut text = String::from("#!/bin/sh\n");
    while text.len() < 5 << 20 {
        text.push_str(line);
    }
    text
}

/// `bootplate lint` on the 5 MiB template: the engine refuses to compile it and says why and
/// where. (The apiserver never stores it: see the controller test.)
#[test]
fn five_mib_template_is_refused_by_lint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.yaml");
    let template = json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "ClusterBootstrapTemplate",
        "metadata": {"name": "huge"},
        "spec": {"os": {"name": "linux"}, "format": "script", "template": five_mib_template()},
    });
    std::fs::write(&path, serde_yaml::to_string(&template).unwrap()).unwrap();
    let started = Instant::now();
    let out = Command::new(testenv::controller::binary().unwrap())
        .args(["lint", "--format", "short"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "lint fails: {stdout}");
    assert!(
        stdout.contains("error: spec.template: too large to compile"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with(&format!("{}:", path.display())),
        "{stdout}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "lint gives up quickly: {:?}",
        started.elapsed()
    );
}

fn resource<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

fn api(client: &Client, ar: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

/// Creates a template from raw JSON (the CRD schema, not the Rust type, decides).
async fn create_template(
    client: &Client,
    kind: TemplateKind,
    name: &str,
    spec: &Value,
) -> Result<(), kube::Error> {
    let (ar, namespace) = match kind {
        TemplateKind::BootstrapTemplate => (resource::<BootstrapTemplate>(), Some(NS)),
        TemplateKind::ClusterBootstrapTemplate => (resource::<ClusterBootstrapTemplate>(), None),
    };
    let mut object = DynamicObject::new(name, &ar).data(json!({"spec": spec}));
    object.metadata.namespace = namespace.map(str::to_owned);
    // As `kubectl apply` sends it: unknown fields are refused, not dropped with a warning.
    let params = kube::api::PatchParams::apply("bootplate-corpus").validation_strict();
    api(client, &ar, namespace)
        .patch(name, &params, &kube::api::Patch::Apply(&object))
        .await
        .map(drop)
}

async fn create_secret(client: &Client, namespace: &str, name: &str, data: Vec<(&str, Vec<u8>)>) {
    let secret = Secret {
        metadata: fixtures::meta(Some(namespace), name),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v)))
                .collect(),
        ),
        type_: Some("cluster.x-k8s.io/secret".into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("Secret {namespace}/{name}: {e}"));
}

fn cert_secret(content: CertContent) -> Vec<(&'static str, Vec<u8>)> {
    let pair = bootplate::pki::generate_ca("kubernetes").unwrap();
    match content {
        CertContent::Valid => vec![
            ("tls.crt", pair.cert.into_bytes()),
            ("tls.key", pair.key.into_bytes()),
        ],
        CertContent::Garbage => vec![
            ("tls.crt", b"this is not a certificate".to_vec()),
            ("tls.key", b"nor is this a key".to_vec()),
        ],
        CertContent::NoCrt => vec![("tls.key", pair.key.into_bytes())],
        CertContent::Binary => vec![
            ("tls.crt", vec![0xff, 0xfe, 0x00, 0x30, 0x82]),
            ("tls.key", pair.key.into_bytes()),
        ],
        CertContent::Mismatched => {
            let other = bootplate::pki::generate_ca("kubernetes").unwrap();
            vec![
                ("tls.crt", pair.cert.into_bytes()),
                ("tls.key", other.key.into_bytes()),
            ]
        }
    }
}

fn kubeconfig_secret(env: &Env, content: KubeconfigContent) -> Vec<(&'static str, Vec<u8>)> {
    let workload = env.workload.kubeconfig_yaml();
    let server = format!("https://127.0.0.1:{}", env.workload.port());
    let value = match content {
        KubeconfigContent::Workload => workload.to_owned(),
        // Port 1 is privileged and nothing listens there: the connection is refused.
        KubeconfigContent::Nowhere => workload.replace(&server, "https://127.0.0.1:1"),
        KubeconfigContent::Unresolvable => {
            workload.replace(&server, "https://workload.nowhere.invalid:6443")
        }
        KubeconfigContent::WrongToken => {
            let fixed = workload
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("token: ") {
                        "    token: not-the-right-token"
                    } else {
                        l
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            assert_ne!(fixed, workload, "the kubeconfig has a token line");
            fixed
        }
        KubeconfigContent::Garbage => "clusters: [this is: not {a kubeconfig".to_owned(),
        KubeconfigContent::AliasBomb => format!(
            "{}\nx-items: &a [{}]\nx-bomb: [{}]\n",
            workload.trim_end(),
            vec!["x"; 1000].join(","),
            vec!["*a"; 200].join(",")
        ),
        KubeconfigContent::Binary => return vec![("value", vec![0xc3, 0x28, 0xff, 0x00])],
        KubeconfigContent::NoValue => return vec![("kubeconfig", workload.as_bytes().to_vec())],
    };
    vec![("value", value.into_bytes())]
}

async fn create_cluster(env: &Env, fixture: &ClusterFixture) {
    let mut cluster = fixtures::cluster(NS, &fixture.name);
    if !fixture.endpoint {
        cluster.spec.control_plane_endpoint = None;
    }
    Api::<Cluster>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    env.set_cluster_status(&fixture.name, true, true).await;
    for (suffix, content) in [
        ("ca", fixture.ca),
        ("etcd", fixture.etcd),
        ("proxy", fixture.proxy),
        ("sa", fixture.sa),
    ] {
        if let Some(content) = content {
            let name = format!("{}-{suffix}", fixture.name);
            create_secret(&env.client, NS, &name, cert_secret(content)).await;
        }
    }
    if let Some(content) = fixture.kubeconfig {
        let name = format!("{}-kubeconfig", fixture.name);
        create_secret(&env.client, NS, &name, kubeconfig_secret(env, content)).await;
    }
}

/// Creates the case's Machine (unless it has none) and config; Err when the apiserver refuses.
async fn create_case(env: &Env, case: &Case) -> Result<(), kube::Error> {
    let mut owner = None;
    match case.owner {
        Owner::Machine => {
            let machine = fixtures::machine(
                NS,
                &case.name,
                &case.cluster,
                case.control_plane,
                &case.name,
            );
            let machine = Api::<Machine>::namespaced(env.client.clone(), NS)
                .create(&PostParams::default(), &machine)
                .await
                .unwrap();
            let mut reference = machine.controller_owner_ref(&()).unwrap();
            reference.controller = Some(true);
            owner = Some(reference);
        }
        Owner::Missing => {
            owner = Some(OwnerReference {
                api_version: Machine::api_version(&()).into_owned(),
                kind: "Machine".into(),
                name: format!("{}-gone", case.name),
                uid: "00000000-0000-0000-0000-000000000000".into(),
                controller: Some(true),
                block_owner_deletion: None,
            });
        }
        Owner::None => {}
    }
    let ar = resource::<BootplateConfig>();
    let mut config = DynamicObject::new(&case.name, &ar)
        .within(NS)
        .data(json!({"spec": case.config_json()}));
    config.metadata.labels = Some(BTreeMap::from([(
        CLUSTER_NAME_LABEL.to_owned(),
        case.cluster.clone(),
    )]));
    config.metadata.owner_references = owner.map(|o| vec![o]);
    api(&env.client, &ar, Some(NS))
        .create(&PostParams::default(), &config)
        .await
        .map(drop)
}

/// The `Ready` condition of every config: name → (status, reason, message).
async fn ready_conditions(env: &Env) -> BTreeMap<String, (String, String, String)> {
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| {
            let name = c.name_any();
            let ready = c
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            Some((name, (ready.status, ready.reason, ready.message)))
        })
        .collect()
}

#[tokio::test]
async fn every_bad_input_gets_its_reason_and_the_controller_keeps_serving() {
    let corpus = corpus();
    let env = env().await;
    fixtures::namespace(&env.client, OTHER_NS).await.unwrap();
    // Short workload timeouts keep the unreachable-cluster cases quick.
    let mut controller = env.controller(&["--workload-timeout=3s"]).await;

    for fixture in &corpus.clusters {
        create_cluster(&env, fixture).await;
    }
    for secret in &corpus.secrets {
        let data = secret
            .data
            .iter()
            .map(|(k, v)| (k.as_str(), v.0.clone()))
            .collect();
        create_secret(&env.client, &secret.namespace, &secret.name, data).await;
    }
    for template in &corpus.templates {
        create_template(&env.client, template.kind, &template.name, &template.spec)
            .await
            .unwrap_or_else(|e| panic!("template {}: {e}", template.name));
    }
    // A good config before the bad ones ...
    env.machine(
        "ok",
        "good-before",
        false,
        testenv::capi_env::cluster_template("good"),
    )
    .await;
    env.wait_ready("good-before").await;

    // ... then every bad input at once.
    let mut expected = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &corpus.cases {
        let mut refused = None;
        if let Some(spec) = &case.template
            && let Err(e) = create_template(&env.client, case.template_kind, &case.name, spec).await
        {
            refused = Some(e.to_string());
        }
        if refused.is_none()
            && let Err(e) = create_case(&env, case).await
        {
            refused = Some(e.to_string());
        }
        match (&case.refused, refused) {
            (Some(fragments), Some(error)) => {
                failures.extend(lacks(case, "apiserver's refusal", &error, fragments))
            }
            (Some(_), None) => panic!("case {}: the apiserver accepted it", case.name),
            (None, Some(error)) => panic!("case {}: the apiserver refused it: {error}", case.name),
            (None, None) => {
                expected.insert(case.name.clone(), case);
            }
        }
    }
    // The 5 MiB template: the apiserver refuses the request before anything is stored.
    let huge =
        json!({"os": {"name": "linux"}, "format": "script", "template": five_mib_template()});
    let error = create_template(
        &env.client,
        TemplateKind::ClusterBootstrapTemplate,
        "huge",
        &huge,
    )
    .await
    .expect_err("a 5 MiB template is refused");
    assert!(
        matches!(&error, kube::Error::Api(s) if s.code == 413),
        "413 Request Entity Too Large: {error}"
    );

    // Every case reaches its reason; the report names every case that did not.
    let deadline = Instant::now() + WAIT * 2;
    let conditions = loop {
        let conditions = ready_conditions(&env).await;
        let wrong: Vec<String> = expected
            .iter()
            .filter(|(name, case)| {
                conditions.get(*name).is_none_or(|(status, reason, _)| {
                    status != "False" || Some(reason) != case.reason.as_ref()
                })
            })
            .map(|(name, case)| {
                format!(
                    "{name}: expected {:?}, have {:?}",
                    case.reason,
                    conditions.get(name)
                )
            })
            .collect();
        if wrong.is_empty() {
            break conditions;
        }
        if Instant::now() > deadline {
            panic!(
                "{} of {} cases did not reach their reason:\n{}",
                wrong.len(),
                expected.len(),
                wrong.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Tokens are made after a trial render: no failing config holds one.
    let token_owners: BTreeSet<String> = env
        .tokens()
        .await
        .iter()
        .filter_map(|t| {
            t.labels()
                .get("bootstrap.bootplate.dev/config-uid")
                .cloned()
        })
        .collect();
    for (name, case) in &expected {
        let (_, _, message) = &conditions[name];
        let uid = env.config(name).await.uid().unwrap();
        if token_owners.contains(&uid) {
            failures.push(format!("case {name}: a bootstrap token was created"));
        }
        failures.extend(lacks(
            case,
            "Ready condition's message",
            message,
            &case.message,
        ));
        // A config that never rendered has no data Secret.
        if env.secret(name).await.is_some() {
            failures.push(format!("case {name}: a data Secret was written"));
        }
    }
    // Templates broken in themselves are also reported on the template.
    for case in expected.values().filter(|c| {
        c.template.is_some()
            && [
                reason::TEMPLATE_INVALID,
                reason::RENDER_FAILED,
                reason::OUTPUT_TOO_LARGE,
            ]
            .contains(&c.reason.as_deref().unwrap())
    }) {
        let (status, why, message) = template_valid(&env.client, case).await;
        let expected = if case.renders_for_others {
            ("True", "Valid")
        } else {
            ("False", "Invalid")
        };
        if (status.as_str(), why.as_str()) != expected {
            failures.push(format!(
                "case {}: template Valid is {status} ({why}): {message}",
                case.name
            ));
        }
    }
    report(failures);

    // The controller is still up, serves its endpoints, and renders a config created after all
    // the bad ones.
    assert!(controller.is_running(), "the controller is still running");
    assert_eq!(controller.readyz(), Some(200));
    env.machine(
        "ok",
        "good-after",
        false,
        testenv::capi_env::cluster_template("good"),
    )
    .await;
    env.wait_ready("good-after").await;
    // ... and so does one whose file comes from a Secret of its own namespace.
    let with_file: Case = serde_yaml::from_str(
        "{name: good-with-file, about: a good config with a contentFrom file, \
          templateRef: {kind: ClusterBootstrapTemplate, name: parts}, \
          config: {files: [{path: /etc/motd, contentFrom: {secret: {name: files, key: motd}}}]}, \
          reason: DataSecretCreated, message: [good-with-file]}",
    )
    .unwrap();
    create_case(&env, &with_file).await.unwrap();
    env.wait_ready("good-with-file").await;
    assert!(env.user_data("good-with-file").await.contains("hello"));
    assert!(controller.is_running(), "the controller is still running");
    let log = controller.log();
    assert!(!log.contains("panicked"), "the controller panicked:\n{log}");
    // Nothing of team-b's Secret reached a team-a object or the log.
    assert!(!log.contains("secret-in-b"));
}

/// The `Valid` condition of a case's own template: (status, reason, message).
async fn template_valid(client: &Client, case: &Case) -> (String, String, String) {
    let name = case.name.clone();
    testenv::eventually(&format!("template {name} checked"), WAIT, || async {
        let conditions = match case.template_kind {
            TemplateKind::BootstrapTemplate => {
                Api::<BootstrapTemplate>::namespaced(client.clone(), NS)
                    .get(&name)
                    .await
                    .ok()?
                    .status?
                    .conditions
            }
            TemplateKind::ClusterBootstrapTemplate => {
                Api::<ClusterBootstrapTemplate>::all(client.clone())
                    .get(&name)
                    .await
                    .ok()?
                    .status?
                    .conditions
            }
        };
        conditions
            .into_iter()
            .find(|c| c.type_ == "Valid")
            .map(|c| (c.status, c.reason, c.message))
    })
    .await
}
