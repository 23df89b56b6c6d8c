//! Boot reports under the grant shared by a workload cluster's machines (docs/security.md,
//! "Boot reports"): one Role for the tokens' group and a ValidatingAdmissionPolicy that holds
//! each token to the one report named for its config. With two machines' tokens on a real
//! workload apiserver (bootstrap token authentication, RBAC, the policy enforced):
//!
//! - a token creates its own report as the reporter does (a server-side apply of the whole
//!   object) and writes it again; bootplate wrote no report object for it;
//! - it cannot write the other machine's report, read it, delete its own, own it by another
//!   token, put another key in it, create any other ConfigMap in `kube-system` or elsewhere,
//!   patch one that exists, or create a Secret;
//! - the shared objects deleted or edited are put back by the next render that needs them;
//! - on a workload apiserver that does not serve ValidatingAdmissionPolicy
//!   (`--runtime-config=admissionregistration.k8s.io/v1/validatingadmissionpolicies=false`, its
//!   admission plugin disabled) the
//!   controller falls back to the per-machine Role, RoleBinding and report: the same refusals
//!   hold, by RBAC, and no shared grant exists.

use std::path::{Path, PathBuf};
use std::process::Command;

use crd_types::BootplateConfig;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use testenv::capi_env::{self, Env, WAIT, cluster_template};
use testenv::controller::ControllerProcess;
use testenv::pki::TestCa;
use testenv::{ApiServer, eventually};

use super::boot_report::{cluster, publish_failing_template, shell_value};

const SHARED: &str = "bootplate-boot-reports";
/// The API switched off, and its admission plugin with it (the plugin's informer would wait
/// for the API forever and the apiserver never be ready), as on an apiserver older than 1.30.
const UNSERVED: [&str; 2] = [
    "--runtime-config=admissionregistration.k8s.io/v1/validatingadmissionpolicies=false",
    "--disable-admission-plugins=ValidatingAdmissionPolicy",
];

/// Sends `body` (JSON) to `path` of the workload apiserver as `token` with `method` and
/// `content_type`; returns the HTTP status.
fn send_as(env: &Env, ca: &Path, token: &str, request: (&str, &str, &str), body: &str) -> String {
    let (method, path, content_type) = request;
    let url = format!("https://127.0.0.1:{}{path}", env.workload.port());
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(ca)
        .args(["-X", method, "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .args(["-H", &format!("Content-Type: {content_type}")])
        .args(["--data", body])
        .arg(url)
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Applies ConfigMap `name` of `namespace` with `metadata` and `data` as `token`, as the
/// reporter does.
pub(super) fn apply_as(
    env: &Env,
    ca: &Path,
    token: &str,
    (namespace, name): (&str, &str),
    object: Value,
) -> String {
    let path = format!(
        "/api/v1/namespaces/{namespace}/configmaps/{name}?fieldManager=bootplate-boot-report&force=true"
    );
    let request = ("PATCH", path.as_str(), "application/apply-patch+yaml");
    send_as(env, ca, token, request, &object.to_string())
}

/// The report object machine `user_data` applies: its metadata from the render, `data`.
pub(super) fn report(user_data: &str, data: Value) -> Value {
    let metadata: Value = serde_json::from_str(&shell_value(user_data, "BOOTPLATE_REPORT_META"))
        .expect("the reporter's metadata is JSON");
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
}

/// Two ready machines' configs, their user-data and tokens; the CA file in `dir`.
struct Machines {
    configs: [BootplateConfig; 2],
    data: [String; 2],
    tokens: [String; 2],
}

async fn two_machines(env: &Env) -> Machines {
    for name in ["w-0", "w-1"] {
        env.machine("c1", name, false, cluster_template("boot"))
            .await;
    }
    let configs = [env.wait_ready("w-0").await, env.wait_ready("w-1").await];
    let data = [env.user_data("w-0").await, env.user_data("w-1").await];
    let tokens = data
        .clone()
        .map(|d| shell_value(&d, "BOOTPLATE_REPORT_TOKEN"));
    Machines {
        configs,
        data,
        tokens,
    }
}

fn report_name(config: &BootplateConfig) -> String {
    format!("bootplate-boot-{}", config.uid().unwrap())
}

/// What neither machine's token may do, whichever way the cluster grants reports.
fn refusals(env: &Env, ca: &Path, m: &Machines) {
    let (own, other) = (report_name(&m.configs[1]), report_name(&m.configs[0]));
    let token = &m.tokens[1];
    let report_data = json!({"report": "bm90IGEgcmVwb3J0"});
    // The other machine's report, written by it first (so a patch reaches admission), then
    // by this one under its name and metadata.
    let theirs = report(&m.data[0], report_data.clone());
    let written = apply_as(
        env,
        ca,
        &m.tokens[0],
        ("kube-system", &other),
        theirs.clone(),
    );
    assert!(written == "200" || written == "201", "{written}");
    assert_eq!(
        apply_as(env, ca, token, ("kube-system", &other), theirs),
        "403",
        "another machine's report"
    );
    let merge = (
        "PATCH",
        &*format!("/api/v1/namespaces/kube-system/configmaps/{other}"),
        "application/merge-patch+json",
    );
    assert_eq!(
        send_as(
            env,
            ca,
            token,
            merge,
            &json!({"data": report_data}).to_string()
        ),
        "403"
    );
    let read = (
        "GET",
        &*format!("/api/v1/namespaces/kube-system/configmaps/{other}"),
        "application/json",
    );
    assert_eq!(
        send_as(env, ca, token, read, ""),
        "403",
        "reading another machine's report"
    );
    // Any other ConfigMap: a new one in kube-system, one elsewhere, one that exists.
    for (namespace, name) in [
        ("kube-system", "coredns-extra"),
        ("default", own.as_str()),
        ("kube-system", "tenant-settings"),
    ] {
        let mut object = report(&m.data[1], report_data.clone());
        object["metadata"]["name"] = json!(name);
        object["metadata"]["namespace"] = json!(namespace);
        assert_eq!(
            apply_as(env, ca, token, (namespace, name), object),
            "403",
            "{namespace}/{name}"
        );
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}});
    let create = (
        "POST",
        "/api/v1/namespaces/kube-system/secrets",
        "application/json",
    );
    assert_eq!(
        send_as(env, ca, token, create, &secret.to_string()),
        "403",
        "a Secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_writes_only_its_own_report_under_the_shared_grant() {
    let ca = TestCa::new("kubernetes");
    let (management, workload) = tokio::join!(ApiServer::start(), ApiServer::start_for_joins(&ca));
    let env = capi_env::with_clusters(management.unwrap(), workload.unwrap()).await;
    let running = run_two_machines(&env, &ca).await;
    let (m, ca_file) = (&running.machines, &running.ca_file);
    let (configmaps, roles, _) = apis(&env);

    // bootplate wrote nothing for either machine: no report, no Role, no RoleBinding.
    for config in &m.configs {
        let found = per_machine_objects(&env, config).await;
        assert_eq!(found, [false; 3], "{}", report_name(config));
    }
    // The machine creates its report, then writes it again.
    let (own, token) = (report_name(&m.configs[1]), &m.tokens[1]);
    let mine = |text: &str| report(&m.data[1], json!({"report": text}));
    assert_eq!(
        apply_as(
            &env,
            ca_file,
            token,
            ("kube-system", &own),
            mine("Zmlyc3Q=")
        ),
        "201"
    );
    assert_eq!(
        apply_as(
            &env,
            ca_file,
            token,
            ("kube-system", &own),
            mine("c2Vjb25k")
        ),
        "200"
    );
    let created = configmaps.get(&own).await.unwrap();
    let owner = &created.owner_references()[0];
    assert_eq!(
        owner.name,
        format!("bootstrap-token-{}", &token[..6]),
        "owned by its token"
    );
    // Its own report, but owned by the other token, or holding another key: refused.
    let mut stolen_owner = mine("eA==");
    stolen_owner["metadata"]["ownerReferences"][0]["name"] =
        json!(format!("bootstrap-token-{}", &m.tokens[0][..6]));
    assert_eq!(
        apply_as(&env, ca_file, token, ("kube-system", &own), stolen_owner),
        "403"
    );
    let extra_key = report(&m.data[1], json!({"report": "eA==", "kubeconfig": "eA=="}));
    assert_eq!(
        apply_as(&env, ca_file, token, ("kube-system", &own), extra_key),
        "403"
    );
    let delete = (
        "DELETE",
        &*format!("/api/v1/namespaces/kube-system/configmaps/{own}"),
        "application/json",
    );
    assert_eq!(
        send_as(&env, ca_file, token, delete, ""),
        "403",
        "deleting its own report"
    );
    refusals(&env, ca_file, m);

    // The shared objects, deleted or edited, are put back by the next render that needs
    // them (after ten report intervals, 10 s here).
    let policies = Api::<ValidatingAdmissionPolicy>::all(env.workload_client.clone());
    policies
        .delete(SHARED, &DeleteParams::default())
        .await
        .unwrap();
    let widened = json!({"rules": [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["*"]}]});
    roles
        .patch(SHARED, &PatchParams::default(), &Patch::Merge(&widened))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    env.machine("c1", "w-2", false, cluster_template("boot"))
        .await;
    env.wait_ready("w-2").await;
    eventually("the shared objects put back", WAIT, || async {
        let role = roles.get(SHARED).await.unwrap();
        let rules = serde_json::to_value(role.rules.unwrap()).unwrap();
        let current = rules == json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}]);
        (current && policies.get_opt(SHARED).await.unwrap().is_some()).then_some(())
    })
    .await;
    refusals(&env, ca_file, m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_policy_api_each_machine_gets_its_own_grant() {
    let ca = TestCa::new("kubernetes");
    let (management, workload) = tokio::join!(
        ApiServer::start(),
        ApiServer::start_for_joins_with(&ca, &UNSERVED)
    );
    let env = capi_env::with_clusters(management.unwrap(), workload.unwrap()).await;
    let running = run_two_machines(&env, &ca).await;
    let (m, ca_file) = (&running.machines, &running.ca_file);
    let (_, roles, role_bindings) = apis(&env);

    for config in &m.configs {
        let found = per_machine_objects(&env, config).await;
        assert_eq!(found, [true; 3], "{}", report_name(config));
    }
    assert!(
        roles.get_opt(SHARED).await.unwrap().is_none(),
        "no shared grant"
    );
    assert!(role_bindings.get_opt(SHARED).await.unwrap().is_none());
    let (own, token) = (report_name(&m.configs[1]), &m.tokens[1]);
    let mine = report(&m.data[1], json!({"report": "Zmlyc3Q="}));
    assert_eq!(
        apply_as(&env, ca_file, token, ("kube-system", &own), mine),
        "200"
    );
    refusals(&env, ca_file, m);
}

/// A ConfigMap of the tenant's own in `kube-system`, which no token may patch.
async fn tenant_settings(env: &Env) {
    let object: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "tenant-settings"}, "data": {"a": "b"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(env.workload_client.clone(), "kube-system")
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// The controller over a workload cluster whose two machines rendered, and the cluster CA as a
/// file for the machines' requests.
struct Running {
    _controller: ControllerProcess,
    machines: Machines,
    _dir: tempfile::TempDir,
    ca_file: PathBuf,
}

async fn run_two_machines(env: &Env, ca: &TestCa) -> Running {
    publish_failing_template(&env.client).await;
    cluster(env, ca).await;
    tenant_settings(env).await;
    let controller = env.controller(&["--boot-report-interval", "1s"]).await;
    let machines = two_machines(env).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    Running {
        _controller: controller,
        machines,
        _dir: dir,
        ca_file,
    }
}

/// Whether the per-machine report ConfigMap, Role and RoleBinding of `config` exist.
async fn per_machine_objects(env: &Env, config: &BootplateConfig) -> [bool; 3] {
    let (configmaps, roles, role_bindings) = apis(env);
    let name = report_name(config);
    [
        configmaps.get_opt(&name).await.unwrap().is_some(),
        roles.get_opt(&name).await.unwrap().is_some(),
        role_bindings.get_opt(&name).await.unwrap().is_some(),
    ]
}

fn apis(env: &Env) -> (Api<ConfigMap>, Api<Role>, Api<RoleBinding>) {
    let client = env.workload_client.clone();
    (
        Api::namespaced(client.clone(), "kube-system"),
        Api::namespaced(client.clone(), "kube-system"),
        Api::namespaced(client, "kube-system"),
    )
}
