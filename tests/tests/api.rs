//! The CRDs against a real kube-apiserver: they install, round-trip every field, serve status
//! with server-side apply, reject ill-typed objects, and show their descriptions and columns.

use std::process::Command;

use crd_types::capi::{Cluster, Machine};
use crd_types::{
    BootplateConfig, BootplateConfigTemplate, BootstrapGenerator, BootstrapTemplate,
    ClusterBootstrapTemplate,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Client, Resource};
use serde_json::{Value, json};
use testenv::{ApiServer, fixtures};

const NS: &str = "roundtrip";

async fn setup() -> (ApiServer, Client) {
    let server = ApiServer::start()
        .await
        .expect("the real kube-apiserver starts");
    let client = server.client().await.expect("client");
    testenv::install_bootplate_crds(&client)
        .await
        .expect("bootplate CRDs install");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap(),
        )
        .await
        .expect("namespace");
    (server, client)
}

/// Creates `object`, reads it back untyped, and checks the stored spec equals what was sent.
async fn round_trip<K>(client: &Client, api: Api<K>, object: &K, namespaced: bool) -> Value
where
    K: Resource<DynamicType = ()>
        + serde::Serialize
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let sent = serde_json::to_value(object).unwrap();
    api.create(&PostParams::default(), object)
        .await
        .expect("create");
    let gvk = GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &K::kind(&()));
    let resource = ApiResource::from_gvk_with_plural(&gvk, &K::plural(&()));
    let raw: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(client.clone(), NS, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let name = object.meta().name.clone().unwrap();
    let stored = raw.get(&name).await.expect("get");
    let differences = json_differences("spec", &sent["spec"], &stored.data["spec"]);
    assert!(
        differences.is_empty(),
        "{} {name}: the apiserver pruned or changed spec fields: {differences:#?}",
        K::kind(&())
    );
    stored.data
}

async fn status_apply<K>(
    client: &Client,
    api: Api<K>,
    name: &str,
    namespaced: bool,
    status: Value,
) -> Value
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply("bootplate-tests").force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("server-side apply of status");
    let gvk = GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &K::kind(&()));
    let resource = ApiResource::from_gvk_with_plural(&gvk, &K::plural(&()));
    let raw: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(client.clone(), NS, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    raw.get(name).await.expect("get").data["status"].clone()
}

/// Paths where `sent` and `stored` differ.
fn json_differences(path: &str, sent: &Value, stored: &Value) -> Vec<String> {
    match (sent, stored) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter()
                .flat_map(|k| {
                    json_differences(
                        &format!("{path}.{k}"),
                        a.get(k).unwrap_or(&Value::Null),
                        b.get(k).unwrap_or(&Value::Null),
                    )
                })
                .collect()
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (x, y))| json_differences(&format!("{path}[{i}]"), x, y))
            .collect(),
        (a, b) if a == b => vec![],
        // JSON does not distinguish 10 from 10.0; the apiserver writes the shorter form.
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => vec![],
        (a, b) => vec![format!("{path}: sent {a}, stored {b}")],
    }
}

fn condition(type_: &str) -> Value {
    json!({
        "type": type_, "status": "True", "reason": "Testing", "message": "set by the test",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1
    })
}

#[tokio::test]
async fn crds_round_trip_every_field_and_status() {
    let (_server, client) = setup().await;

    let bt = || Api::<BootstrapTemplate>::namespaced(client.clone(), NS);
    let cbt = || Api::<ClusterBootstrapTemplate>::all(client.clone());
    let bpc = || Api::<BootplateConfig>::namespaced(client.clone(), NS);
    let bpct = || Api::<BootplateConfigTemplate>::namespaced(client.clone(), NS);
    round_trip(
        &client,
        bt(),
        &fixtures::full_bootstrap_template(NS, "bt"),
        true,
    )
    .await;
    round_trip(
        &client,
        cbt(),
        &fixtures::full_cluster_bootstrap_template("cbt"),
        false,
    )
    .await;
    round_trip(&client, bpc(), &fixtures::full_config(NS, "bpc"), true).await;
    round_trip(
        &client,
        bpct(),
        &fixtures::full_config_template(NS, "bpct"),
        true,
    )
    .await;

    let bg = || Api::<BootstrapGenerator>::all(client.clone());
    round_trip(
        &client,
        bg(),
        &fixtures::full_bootstrap_generator("bg"),
        false,
    )
    .await;
    assert_eq!(
        bg().get("bg").await.unwrap().spec,
        fixtures::full_bootstrap_generator("bg").spec
    );

    let template_status = json!({"observedGeneration": 1, "revision": "0123456789abcdef", "conditions": [condition("Valid")]});
    assert_eq!(
        status_apply(&client, bt(), "bt", true, template_status.clone()).await,
        template_status
    );
    assert_eq!(
        status_apply(&client, cbt(), "cbt", false, template_status.clone()).await,
        template_status
    );

    let config_status = json!({
        "ready": true, "dataSecretName": "bpc", "initialization": {"dataSecretCreated": true},
        "observedGeneration": 1, "templateRevision": "0123456789abcdef", "role": "worker",
        "conditions": [condition("Ready"), condition("DataSecretAvailable"), condition("Paused")]
    });
    assert_eq!(
        status_apply(&client, bpc(), "bpc", true, config_status.clone()).await,
        config_status
    );

    // The typed client reads back what was stored.
    let config = bpc().get("bpc").await.unwrap();
    assert_eq!(config.spec, fixtures::full_config_spec());
    assert!(config.status.unwrap().ready);
    let stored = cbt().get("cbt").await.unwrap();
    assert_eq!(stored.spec.0, fixtures::full_template_spec());
    let stored = bpct().get("bpct").await.unwrap();
    assert_eq!(stored.spec.template.spec, fixtures::full_config_spec());
}

#[tokio::test]
async fn schema_validation_rejects_ill_typed_objects() {
    let (_server, client) = setup().await;
    let gvk = GroupVersionKind::gvk(crd_types::GROUP, crd_types::VERSION, "BootplateConfig");
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(&gvk, "bootplateconfigs"),
    );
    let cases = [
        (
            "skipParts is a string",
            json!({"templateRef": {"kind": "BootstrapTemplate", "name": "x"}, "skipParts": "install"}),
            "spec.skipParts",
        ),
        (
            "unknown template kind",
            json!({"templateRef": {"kind": "ConfigMap", "name": "x"}}),
            "spec.templateRef.kind",
        ),
        (
            "missing templateRef",
            json!({"variables": {}}),
            "spec.templateRef",
        ),
        (
            "bad permissions",
            json!({"templateRef": {"kind": "BootstrapTemplate", "name": "x"}, "files": [{"path": "/x", "permissions": "rwx", "content": "x"}]}),
            "spec.files[0].permissions",
        ),
    ];
    for (what, spec, field) in cases {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1", "kind": "BootplateConfig",
            "metadata": {"name": "bad", "namespace": NS}, "spec": spec,
        }))
        .unwrap();
        let err = api
            .create(&PostParams::default(), &object)
            .await
            .expect_err(what);
        let message = err.to_string();
        assert!(
            message.contains("Invalid") || message.contains("invalid"),
            "{what}: {message}"
        );
        assert!(
            message.contains(field),
            "{what}: the rejection should name {field}: {message}"
        );
    }

    let gvk = GroupVersionKind::gvk(crd_types::GROUP, crd_types::VERSION, "BootstrapTemplate");
    let templates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(&gvk, "bootstraptemplates"),
    );
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1", "kind": "BootstrapTemplate",
        "metadata": {"name": "bad", "namespace": NS},
        "spec": {"os": {"name": "x"}, "format": "yaml", "template": "#cloud-config\n"},
    }))
    .unwrap();
    let err = templates
        .create(&PostParams::default(), &object)
        .await
        .expect_err("format yaml is not a format");
    assert!(err.to_string().contains("spec.format"), "{err}");
}

#[tokio::test]
async fn kubectl_explains_fields_and_prints_columns() {
    let (server, client) = setup().await;
    let kubeconfig = server.kubeconfig_path().unwrap();
    Api::<BootplateConfig>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &fixtures::full_config(NS, "shown"))
        .await
        .unwrap();

    // The apiserver publishes the CRD descriptions in its OpenAPI document, which is what
    // `kubectl explain` reads; check the document directly so the test does not depend on kubectl.
    // The apiserver publishes CRD schemas asynchronously; give it a few seconds.
    let mut openapi = String::new();
    for _ in 0..60 {
        let request = http::Request::get("/openapi/v2").body(Vec::new()).unwrap();
        openapi = client.request_text(request).await.unwrap();
        if openapi.contains("Names of template parts not to render") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(
        openapi.contains("Names of template parts not to render"),
        "config field description missing from OpenAPI"
    );
    assert!(
        openapi.contains("The user-data format the template produces"),
        "template field description missing"
    );

    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output();
        out.ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    if which("kubectl") {
        let explain =
            kubectl(&["explain", "bootstraptemplate.spec"]).expect("kubectl explain works");
        assert!(
            explain.contains("The user-data format the template produces"),
            "{explain}"
        );
        assert!(explain.contains("partials"), "{explain}");
        let get = kubectl(&["get", "bootplateconfigs", "-n", NS]).expect("kubectl get works");
        let header = get.lines().next().unwrap_or_default();
        for column in [
            "NAME",
            "CLUSTER",
            "TEMPLATE",
            "READY",
            "DATA-SECRET",
            "BOOT",
            "PART",
            "AGE",
        ] {
            assert!(header.contains(column), "column {column} missing: {get}");
        }
        assert!(
            get.contains("ubuntu-2404"),
            "template column shows the reference: {get}"
        );
        let short = kubectl(&["get", "bpc", "-n", NS]).expect("short name bpc works");
        assert!(short.contains("shown"));
    }
    // Printer columns are served by the apiserver's Table conversion; check it without kubectl.
    let request = http::Request::get(format!(
        "/apis/bootstrap.bootplate.dev/v1alpha1/namespaces/{NS}/bootplateconfigs"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: Value = serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Cluster",
            "Template",
            "Ready",
            "Data-Secret",
            "Boot",
            "Part",
            "Age"
        ]
    );
    assert_eq!(table["rows"][0]["cells"][2], "ubuntu-2404");
}

fn which(tool: &str) -> bool {
    Command::new(tool)
        .arg("version")
        .arg("--client")
        .output()
        .is_ok()
}

#[tokio::test]
async fn capi_crds_serve_v1beta2_cluster_and_machine() {
    let (_server, client) = setup().await;
    testenv::install_capi_crds(&client)
        .await
        .expect("CAPI CRDs install");
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NS);
    let machines: Api<Machine> = Api::namespaced(client.clone(), NS);
    let cluster = fixtures::cluster(NS, "c1");
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("Cluster v1beta2 create");
    let machine = fixtures::machine(NS, "m1", "c1", true, "m1");
    machines
        .create(&PostParams::default(), &machine)
        .await
        .expect("Machine v1beta2 create");

    let got = clusters.get("c1").await.unwrap();
    assert_eq!(got.spec, cluster.spec);
    let got = machines.get("m1").await.unwrap();
    assert_eq!(got.spec, machine.spec);
    assert!(got.is_control_plane());

    // Status the way CAPI writes it, read back through bootplate's types.
    let patch = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "status": {
        "initialization": {"infrastructureProvisioned": true},
        "conditions": [{"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized",
                        "message": "initialized", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    clusters
        .patch_status(
            "c1",
            &PatchParams::apply("capi").force(),
            &Patch::Apply(&patch),
        )
        .await
        .unwrap();
    let got = clusters.get("c1").await.unwrap();
    assert!(got.infrastructure_provisioned());
    assert!(got.control_plane_initialized());
}

/// `kubectl apply` with a misspelled field is refused by the apiserver's strict field
/// validation, naming the field's path: the CRDs are structural and keep no unknown fields, so
/// a typo (`permission` for `permissions` on a file holding a key) cannot pass silently.
#[tokio::test]
async fn kubectl_apply_refuses_a_misspelled_field_with_its_path() {
    let (server, _client) = setup().await;
    let kubeconfig = server.kubeconfig_path().unwrap();
    let cases = [
        (
            "a config file's permission",
            format!(
                "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: BootplateConfig\nmetadata: {{name: typo, namespace: {NS}}}\nspec:\n  templateRef: {{kind: BootstrapTemplate, name: t}}\n  files:\n  - path: /etc/secret.key\n    permission: \"0600\"\n    content: key\n"
            ),
            "spec.files[0].permission",
        ),
        (
            "a template part's file",
            format!(
                "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: BootstrapTemplate\nmetadata: {{name: typo, namespace: {NS}}}\nspec:\n  os: {{name: linux}}\n  format: script\n  parts:\n  - name: configure\n    files:\n    - path: /etc/x\n      contnet: x\n"
            ),
            "spec.parts[0].files[0].contnet",
        ),
    ];
    for (what, yaml, path) in cases {
        let out = testenv::kubectl_apply(&kubeconfig, &[], &yaml);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: applied despite the typo");
        assert!(
            stderr.contains("unknown field") && stderr.contains(&format!("\"{path}\"")),
            "{what}: the refusal should name {path}: {stderr}"
        );
    }
}
