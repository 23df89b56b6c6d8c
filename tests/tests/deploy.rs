//! The deploy/ manifests, checked with the real tools and against the code they describe:
//! `kubectl kustomize` builds them and the real kube-apiserver accepts them (`--dry-run=server`),
//! the ServiceAccount gets exactly the permissions the ClusterRole lists, `promtool` checks and
//! unit-tests the alerts, the clusterctl components are current and equal the kustomization,
//! the dashboard and alerts use only metrics that controller/src/metrics.rs exports, and
//! docs/operations.md lists every flag of `bootplate run --help` and every metric.
//!
//! Needs kubectl and promtool (tests/scripts/install-tools.sh); a missing tool fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use testenv::ApiServer;

const NAMESPACE: &str = "bootplate-system";
const SERVICE_ACCOUNT: &str = "bootplate-manager";
const MONITORING_CRDS: &str = include_str!("../fixtures/monitoring-crds.yaml");
const CERT_MANAGER_CRDS: &str = include_str!("../fixtures/cert-manager-crds.yaml");
/// Kinds of deploy/monitoring, left out of the clusterctl components.
const MONITORING_KINDS: [&str; 2] = ["ServiceMonitor", "PrometheusRule"];
const DASHBOARD_CONFIGMAP: &str = "bootplate-grafana-dashboard";

/// What the controller does in the management cluster: (API group, resources, verbs). The
/// ClusterRole `bootplate-manager` must grant exactly this, the Role `bootplate-leader-election`
/// exactly [`LEADER_ELECTION_PERMISSIONS`] in the controller's namespace.
const MANAGER_PERMISSIONS: &[(&str, &[&str], &[&str])] = &[
    (
        "bootstrap.bootplate.dev",
        &["bootplateconfigs"],
        &["get", "list", "watch"],
    ),
    (
        "bootstrap.bootplate.dev",
        &["bootplateconfigs/status"],
        &["patch"],
    ),
    (
        "bootstrap.bootplate.dev",
        &["bootplateconfigs/finalizers"],
        &["update"],
    ),
    (
        "bootstrap.bootplate.dev",
        &["bootstraptemplates", "clusterbootstraptemplates"],
        &["get", "list", "watch"],
    ),
    (
        "bootstrap.bootplate.dev",
        &[
            "bootstraptemplates/status",
            "clusterbootstraptemplates/status",
        ],
        &["patch"],
    ),
    (
        "bootstrap.bootplate.dev",
        &["bootplateconfigtemplates", "bootstrapgenerators"],
        &["get", "list", "watch"],
    ),
    (
        "cluster.x-k8s.io",
        &["machines", "machinepools", "clusters"],
        &["get", "list", "watch"],
    ),
    ("cluster.x-k8s.io", &["clusters/finalizers"], &["update"]),
    (
        "",
        &["secrets"],
        &["get", "list", "watch", "create", "patch"],
    ),
    ("", &["configmaps"], &["get", "create", "update", "delete"]),
    ("events.k8s.io", &["events"], &["create"]),
];
const LEADER_ELECTION_PERMISSIONS: &[(&str, &[&str], &[&str])] = &[(
    "coordination.k8s.io",
    &["leases"],
    &["get", "create", "update"],
)];
const ALL_VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];
const CLUSTER_SCOPED: [&str; 2] = ["clusterbootstraptemplates", "bootstrapgenerators"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Runs `cmd` (feeding `stdin`), returns its stdout, and panics with its stderr when it fails.
/// A missing program fails the test with a hint: these tests never skip.
fn run(cmd: &mut Command, stdin: Option<&str>) -> String {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {program}: {e}; tests/scripts/install-tools.sh installs or checks \
                 the tools these tests need"
            )
        });
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(input.as_bytes())
            .expect("write to the child's stdin");
    }
    let output = child.wait_with_output().expect("the child finishes");
    assert!(
        output.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn kubectl() -> Command {
    Command::new(std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into()))
}

/// `kubectl kustomize deploy/<dir>`.
fn kustomize(dir: &str) -> String {
    run(kubectl().arg("kustomize").arg(repo().join(dir)), None)
}

/// The documents of a multi-document YAML text, as JSON values; empty documents are dropped.
fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("valid YAML"))
        .filter(|doc| !doc.is_null())
        .map(|doc| serde_json::to_value(doc).expect("YAML maps to JSON"))
        .collect()
}

fn object_key(object: &Value) -> String {
    format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the kustomize output"))
}

fn is_monitoring(object: &Value) -> bool {
    MONITORING_KINDS.iter().any(|k| object["kind"] == *k)
        || (object["kind"] == "ConfigMap" && object["metadata"]["name"] == DASHBOARD_CONFIGMAP)
}

/// (group, resource, verb) triples of a permission table.
fn expand(table: &[(&str, &[&str], &[&str])]) -> BTreeSet<(String, String, String)> {
    let mut triples = BTreeSet::new();
    for (group, resources, verbs) in table {
        for resource in *resources {
            for verb in *verbs {
                triples.insert((group.to_string(), resource.to_string(), verb.to_string()));
            }
        }
    }
    triples
}

#[tokio::test]
async fn kustomization_applies_to_the_real_apiserver_and_grants_exactly_what_the_controller_uses() {
    let built = kustomize("deploy");
    let objects = documents(&built);
    assert!(
        !objects.is_empty(),
        "kubectl kustomize deploy/ built nothing"
    );

    let server = ApiServer::start()
        .await
        .expect("the real kube-apiserver starts");
    let client = server.client().await.expect("client");
    let kubeconfig = server.kubeconfig_path().expect("kubeconfig");
    // Issuer and Certificate need their CRDs, for real, before a dry run can check objects of
    // those kinds. The Prometheus operator's are not there: deploy/ must not need them.
    testenv::install_crds(
        &client,
        &testenv::crds_from_yaml(CERT_MANAGER_CRDS).expect("CRD fixtures parse"),
    )
    .await
    .expect("fixture CRDs install");
    // A server-side dry run creates nothing, so the namespaced objects need their namespace.
    let namespace = find(&objects, "Namespace", NAMESPACE);
    run(
        kubectl()
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["apply", "-f", "-"]),
        Some(&namespace.to_string()),
    );

    let dry_run = run(
        kubectl().arg("--kubeconfig").arg(&kubeconfig).args([
            "apply",
            "--dry-run=server",
            "-f",
            "-",
        ]),
        Some(&built),
    );
    assert_eq!(
        dry_run
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count(),
        objects.len(),
        "every object passes the server-side dry run:\n{dry_run}"
    );

    // Apply for real and ask the apiserver's RBAC authorizer what the ServiceAccount may do.
    run(
        kubectl()
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["apply", "-f", "-"]),
        Some(&built),
    );
    let manager = expand(MANAGER_PERMISSIONS);
    let leader_election = expand(LEADER_ELECTION_PERMISSIONS);
    let resources: BTreeSet<(String, String)> = manager
        .iter()
        .chain(&leader_election)
        .map(|(g, r, _)| (g.clone(), r.clone()))
        .collect();
    let mut wrong = Vec::new();
    for (group, resource) in &resources {
        let base = resource.split('/').next().unwrap();
        // Lease rights hold only in the controller's namespace; everything else everywhere.
        let namespaces: &[&str] = if CLUSTER_SCOPED.contains(&base) {
            &[""]
        } else {
            &["team-a", NAMESPACE, "kube-system"]
        };
        for namespace in namespaces {
            for verb in ALL_VERBS {
                let key = (group.clone(), resource.clone(), verb.to_owned());
                let expected = manager.contains(&key)
                    || (leader_election.contains(&key) && *namespace == NAMESPACE);
                if testenv::rbac::service_account_may(&client, group, resource, verb, namespace)
                    .await
                    .expect("SubjectAccessReview")
                    != expected
                {
                    wrong.push(format!(
                        "{verb} {group}/{resource} in {namespace:?}: expected allowed={expected}"
                    ));
                }
            }
        }
    }
    for (group, resource) in [("", "pods"), ("", "events"), ("apps", "deployments")] {
        if testenv::rbac::service_account_may(&client, group, resource, "create", "team-a")
            .await
            .expect("SubjectAccessReview")
        {
            wrong.push(format!("create {group}/{resource} is allowed"));
        }
    }
    assert!(
        wrong.is_empty(),
        "the ServiceAccount's permissions differ:\n{}",
        wrong.join("\n")
    );
}

/// `kubectl apply -k DIR` against `kubeconfig`; the output, or the error with kubectl's words.
fn apply_kustomization(kubeconfig: &Path, dir: &str) -> Result<String, String> {
    let out = kubectl()
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("apply")
        .arg("-k")
        .arg(repo().join(dir))
        .output()
        .expect("kubectl runs");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(said)
    } else {
        Err(said)
    }
}

/// A user without the Prometheus operator installs deploy/ and deploy/extension as the docs say
/// (`kubectl apply -k`, real kubectl, real apiserver with cert-manager's CRDs and Cluster API's
/// ExtensionConfig CRD only); monitoring is the opt-in part, which needs the operator's CRDs and applies once they
/// are there.
#[tokio::test]
async fn kustomizations_apply_without_the_prometheus_operator_and_monitoring_opts_in() {
    let server = ApiServer::start()
        .await
        .expect("the real kube-apiserver starts");
    let client = server.client().await.expect("client");
    let kubeconfig = server.kubeconfig_path().expect("kubeconfig");
    testenv::install_crds(
        &client,
        &testenv::crds_from_yaml(CERT_MANAGER_CRDS).expect("CRD fixtures parse"),
    )
    .await
    .expect("cert-manager's CRDs install");
    // deploy/extension's ExtensionConfig needs Cluster API's runtime CRD, from its module.
    let runtime_crd = testenv::tools::capi_source()
        .expect("the Cluster API module")
        .join("core/config/crd/bases/runtime.cluster.x-k8s.io_extensionconfigs.yaml");
    let runtime_crd = std::fs::read_to_string(&runtime_crd).expect("the ExtensionConfig CRD");
    testenv::install_crds(
        &client,
        &testenv::crds_from_yaml(&runtime_crd).expect("the ExtensionConfig CRD parses"),
    )
    .await
    .expect("the ExtensionConfig CRD installs");

    for dir in ["deploy", "deploy/extension"] {
        let applied = apply_kustomization(&kubeconfig, dir).unwrap_or_else(|e| {
            panic!("kubectl apply -k {dir} without the Prometheus operator: {e}")
        });
        assert!(
            applied.contains("deployment.apps/bootplate-controller-manager"),
            "{applied}"
        );
    }
    let refused = apply_kustomization(&kubeconfig, "deploy/monitoring")
        .expect_err("deploy/monitoring needs the Prometheus operator's CRDs");
    assert!(refused.contains("ServiceMonitor"), "{refused}");

    testenv::install_crds(
        &client,
        &testenv::crds_from_yaml(MONITORING_CRDS).expect("CRD fixtures parse"),
    )
    .await
    .expect("the Prometheus operator's CRDs install");
    let applied = apply_kustomization(&kubeconfig, "deploy/monitoring")
        .unwrap_or_else(|e| panic!("kubectl apply -k deploy/monitoring: {e}"));
    for object in [
        "servicemonitor.monitoring.coreos.com/bootplate",
        "prometheusrule.monitoring.coreos.com/bootplate",
    ] {
        assert!(applied.contains(object), "{applied}");
    }
}

#[test]
fn roles_list_exactly_the_calls_and_capi_gets_its_aggregated_role() {
    let objects = documents(&kustomize("deploy"));
    let manager = find(&objects, "ClusterRole", "bootplate-manager");
    assert_eq!(
        testenv::rbac::granted(manager),
        expand(MANAGER_PERMISSIONS),
        "ClusterRole bootplate-manager"
    );
    assert!(
        manager["metadata"]["labels"]["cluster.x-k8s.io/aggregate-to-manager"].is_null(),
        "bootplate's own role must not be merged into Cluster API's manager role"
    );
    let leases = find(&objects, "Role", "bootplate-leader-election");
    assert_eq!(leases["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        testenv::rbac::granted(leases),
        expand(LEADER_ELECTION_PERMISSIONS)
    );

    // The contract: Cluster API's controllers get full access to the kinds they create and own.
    let capi = objects
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole"
                && o["metadata"]["labels"]["cluster.x-k8s.io/aggregate-to-manager"] == "true"
        })
        .expect("a ClusterRole aggregated to Cluster API's manager role");
    let full = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    let expected = expand(&[(
        "bootstrap.bootplate.dev",
        &["bootplateconfigs", "bootplateconfigtemplates"],
        &full,
    )]);
    assert_eq!(testenv::rbac::granted(capi), expected);

    for (kind, name, role_kind, role) in [
        (
            "ClusterRoleBinding",
            "bootplate-manager",
            "ClusterRole",
            "bootplate-manager",
        ),
        (
            "RoleBinding",
            "bootplate-leader-election",
            "Role",
            "bootplate-leader-election",
        ),
    ] {
        let binding = find(&objects, kind, name);
        assert_eq!(binding["roleRef"]["kind"], role_kind);
        assert_eq!(binding["roleRef"]["name"], role);
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}])
        );
    }
}

#[test]
fn deployment_runs_two_hardened_leader_elected_replicas() {
    let objects = documents(&kustomize("deploy"));
    for object in &objects {
        let kind = object["kind"].as_str().unwrap();
        let cluster_scoped = [
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingWebhookConfiguration",
        ];
        if !cluster_scoped.contains(&kind) {
            assert_eq!(
                object["metadata"]["namespace"],
                NAMESPACE,
                "{}",
                object_key(object)
            );
        }
        assert_eq!(
            object["metadata"]["labels"]["cluster.x-k8s.io/provider"],
            "bootstrap-bootplate",
            "{} carries clusterctl's provider label",
            object_key(object)
        );
    }
    let deployment = find(&objects, "Deployment", "bootplate-controller-manager");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], SERVICE_ACCOUNT);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(pod["securityContext"]["runAsUser"].as_u64().unwrap() > 0);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let manager = &containers[0];
    assert_eq!(
        manager["name"], "manager",
        "clusterctl requires the container name"
    );
    let security = &manager["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                manager["resources"][kind][resource].is_string(),
                "{kind}.{resource} is set"
            );
        }
    }
    let args: Vec<&str> = manager["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args.first(), Some(&"run"));
    assert!(args.contains(&"--leader-elect"));
    let env: BTreeMap<&str, &str> = manager["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(env.get("POD_NAME"), Some(&"metadata.name"));
    assert_eq!(env.get("POD_NAMESPACE"), Some(&"metadata.namespace"));

    // Probes and ports agree with the addresses the args give.
    let port_of = |name: &str| -> u64 {
        manager["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("container port {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    let arg_port = |flag: &str| -> u64 {
        let value = args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("{flag}=")))
            .unwrap_or_else(|| panic!("{flag} is passed"));
        value.rsplit(':').next().unwrap().parse().unwrap()
    };
    assert_eq!(port_of("metrics"), arg_port("--metrics-addr"));
    assert_eq!(port_of("health"), arg_port("--health-addr"));
    assert_eq!(port_of("webhook"), arg_port("--webhook-addr"));
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(manager[probe]["httpGet"]["path"], path);
        assert_eq!(manager[probe]["httpGet"]["port"], "health");
    }
    let service = find(&objects, "Service", "bootplate-metrics");
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &deployment["spec"]["template"]["metadata"]["labels"][key], value,
            "the metrics Service selects the pods"
        );
    }
    let monitoring = documents(&kustomize("deploy/monitoring"));
    let monitor = find(&monitoring, "ServiceMonitor", "bootplate");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the ServiceMonitor selects the Service"
        );
    }
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
}

/// The second webhook entry sends only MachineDeployment updates (Cluster API's objects, in any
/// version) to the same service and path, never blocks them (`Ignore`: it only warns), has no
/// side effects (dry runs reach it), and matches only moves of the bootstrap reference.
fn rollout_preview_only_warns(preview: &Value, validating: &Value) {
    assert_eq!(preview["name"], "rollout-preview.bootstrap.bootplate.dev");
    assert_eq!(preview["failurePolicy"], "Ignore");
    assert_eq!(preview["sideEffects"], "None");
    assert_eq!(preview["clientConfig"], validating["clientConfig"]);
    let rules = preview["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0]["apiGroups"],
        serde_json::json!(["cluster.x-k8s.io"])
    );
    assert_eq!(
        rules[0]["resources"],
        serde_json::json!(["machinedeployments"])
    );
    assert_eq!(rules[0]["operations"], serde_json::json!(["UPDATE"]));
    let conditions = preview["matchConditions"].as_array().unwrap();
    let expression = conditions[0]["expression"].as_str().unwrap();
    assert!(
        expression.contains("BootplateConfigTemplate") && expression.contains("oldObject"),
        "{expression}"
    );
}

#[test]
fn webhook_configuration_service_certificate_and_deployment_fit_together() {
    let objects = documents(&kustomize("deploy"));
    let configs: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .collect();
    assert_eq!(configs.len(), 1, "one ValidatingWebhookConfiguration");
    let config = configs[0];
    let webhooks = config["webhooks"].as_array().unwrap();
    assert_eq!(
        webhooks.len(),
        2,
        "the validating webhook and the rollout preview"
    );
    rollout_preview_only_warns(&webhooks[1], &webhooks[0]);
    let webhook = &webhooks[0];
    assert_eq!(webhook["sideEffects"], "None");
    assert_eq!(webhook["failurePolicy"], "Fail");
    assert!(
        webhook["admissionReviewVersions"]
            .as_array()
            .unwrap()
            .contains(&"v1".into()),
        "the webhook answers admission.k8s.io/v1 reviews"
    );
    // Creates and updates of exactly bootplate's kinds, in every version the CRDs serve.
    let rules = webhook["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    let strings = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let crds = crd_types::crds::all();
    let plurals: BTreeSet<String> = crds.iter().map(|c| c.spec.names.plural.clone()).collect();
    let versions: BTreeSet<String> = crds
        .iter()
        .flat_map(|c| c.spec.versions.iter().map(|v| v.name.clone()))
        .collect();
    assert_eq!(strings(&rule["resources"]), plurals);
    assert_eq!(strings(&rule["apiVersions"]), versions);
    assert_eq!(
        strings(&rule["apiGroups"]),
        BTreeSet::from([crd_types::GROUP.to_owned()])
    );
    assert_eq!(
        strings(&rule["operations"]),
        BTreeSet::from(["CREATE".to_owned(), "UPDATE".to_owned()])
    );

    // The apiserver calls the Service, which sends port 443 to the container's webhook port,
    // on the path the controller serves.
    let client = &webhook["clientConfig"]["service"];
    assert_eq!(client["namespace"], NAMESPACE);
    assert_eq!(client["path"], bootplate::webhook::PATH);
    assert_eq!(client["port"], 443);
    let service = find(&objects, "Service", client["name"].as_str().unwrap());
    let port = &service["spec"]["ports"].as_array().unwrap()[0];
    assert_eq!(port["port"], 443);
    assert_eq!(port["targetPort"], "webhook");
    let deployment = find(&objects, "Deployment", "bootplate-controller-manager");
    let pod = &deployment["spec"]["template"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &pod["metadata"]["labels"][key], value,
            "the webhook Service selects the pods"
        );
    }
    let manager = &pod["spec"]["containers"][0];
    assert!(
        manager["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "webhook" && p["containerPort"] == 9443),
        "the container port `webhook` is 9443"
    );
    assert!(
        manager["args"]
            .as_array()
            .unwrap()
            .contains(&"--webhook-addr=0.0.0.0:9443".into()),
        "the controller serves the webhook on 9443"
    );

    // cert-manager issues the certificate for the Service's name into the Secret the pod mounts
    // (read-only) at the default --webhook-cert-dir, and injects its CA into the configuration.
    let annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("the cert-manager CA injection annotation");
    let (namespace, name) = annotation.split_once('/').unwrap();
    assert_eq!(namespace, NAMESPACE);
    let certificate = find(&objects, "Certificate", name);
    let service_name = service["metadata"]["name"].as_str().unwrap();
    assert_eq!(
        strings(&certificate["spec"]["dnsNames"]),
        BTreeSet::from([
            format!("{service_name}.{NAMESPACE}.svc"),
            format!("{service_name}.{NAMESPACE}.svc.cluster.local"),
        ])
    );
    let issuer = &certificate["spec"]["issuerRef"];
    assert_eq!(issuer["kind"], "Issuer");
    find(&objects, "Issuer", issuer["name"].as_str().unwrap());
    let secret = &certificate["spec"]["secretName"];
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| &v["secret"]["secretName"] == secret)
        .expect("a volume of the certificate's Secret");
    let mount = manager["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the certificate's volume is mounted");
    assert_eq!(mount["readOnly"], true);
    let cert_dir = run_flags()
        .remove("webhook-cert-dir")
        .and_then(|f| f.default)
        .expect("--webhook-cert-dir has a default");
    assert_eq!(
        mount["mountPath"], cert_dir,
        "mounted where the controller looks"
    );
}

#[test]
fn dockerfile_builds_a_static_binary_running_as_the_deployments_user() {
    let dockerfile = read("Dockerfile");
    let objects = documents(&kustomize("deploy"));
    let deployment = find(&objects, "Deployment", "bootplate-controller-manager");
    let security = &deployment["spec"]["template"]["spec"]["securityContext"];
    let final_stage = dockerfile
        .rsplit_once("\nFROM ")
        .expect("a multi-stage build")
        .1;
    let user = final_stage
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the final stage sets USER");
    assert_eq!(
        user.trim(),
        format!("{}:{}", security["runAsUser"], security["runAsGroup"]),
        "the image's USER is the Deployment's runAsUser:runAsGroup"
    );
    assert!(
        final_stage.starts_with("gcr.io/distroless/static") || final_stage.starts_with("scratch"),
        "a minimal base image"
    );
    assert!(final_stage.contains("ENTRYPOINT [\"/usr/local/bin/bootplate\"]"));
    assert!(final_stage.contains("CMD [\"run\"]"));
    assert!(
        dockerfile.contains("-unknown-linux-musl"),
        "a static musl build"
    );
}

/// Replaces each `${NAME:=default}` with its default; returns the text and the variables.
fn substitute_defaults(text: &str) -> (String, BTreeMap<String, String>) {
    let mut out = String::new();
    let mut variables = BTreeMap::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("a closed ${...} variable") + start;
        let inner = &rest[start + 2..end];
        let (name, default) = inner.split_once(":=").unwrap_or_else(|| {
            panic!("variable ${{{inner}}} has no default (write ${{NAME:=default}})")
        });
        assert!(
            name.starts_with("BOOTPLATE_")
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'),
            "clusterctl variable {name} is BOOTPLATE_ and upper case"
        );
        if let Some(previous) = variables.insert(name.to_owned(), default.to_owned()) {
            assert_eq!(
                previous, default,
                "{name} has one default everywhere it is used"
            );
        }
        out.push_str(default);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    (out, variables)
}

#[test]
fn bootstrap_components_are_current() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fresh = dir.path().join("bootstrap-components.yaml");
    run(
        Command::new(repo().join("deploy/build-components.sh")).arg(&fresh),
        None,
    );
    let fresh = std::fs::read_to_string(fresh).expect("the script wrote its output");
    assert!(
        read("deploy/bootstrap-components.yaml") == fresh,
        "deploy/bootstrap-components.yaml is out of date; regenerate it with:\n  \
         deploy/build-components.sh"
    );
}

#[test]
fn bootstrap_components_with_defaults_equal_the_kustomization() {
    let components = read("deploy/bootstrap-components.yaml");
    let (defaulted, variables) = substitute_defaults(&components);
    let by_key = |objects: Vec<Value>| -> BTreeMap<String, Value> {
        objects.into_iter().map(|o| (object_key(&o), o)).collect()
    };
    let components = by_key(documents(&defaulted));
    assert!(
        !components.values().any(is_monitoring),
        "the components carry no ServiceMonitor or PrometheusRule: clusterctl init would fail \
         without the Prometheus operator"
    );
    let kustomization = by_key(documents(&kustomize("deploy")));
    assert_eq!(
        components.keys().collect::<Vec<_>>(),
        kustomization.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, object) in &components {
        assert!(
            object == &kustomization[key],
            "{key} differs between deploy/bootstrap-components.yaml (with defaults) and \
             deploy/:\n{}\n---\n{}",
            serde_yaml::to_string(object).unwrap(),
            serde_yaml::to_string(&kustomization[key]).unwrap()
        );
    }
    let namespaces = components
        .values()
        .filter(|o| o["kind"] == "Namespace")
        .count();
    assert_eq!(
        namespaces, 1,
        "clusterctl wants exactly one Namespace object"
    );

    // Every variable is documented with its default.
    let doc = read("docs/operations.md");
    for (name, default) in &variables {
        assert!(
            doc.lines()
                .any(|l| l.starts_with(&format!("| `{name}` | `{default}` |"))),
            "docs/operations.md lists the clusterctl variable {name} with default {default}"
        );
    }
}

/// The real clusterctl reads deploy/'s components as a user's does, from a local repository
/// declared in `providers:`: `generate provider --describe` lists the variables and the image
/// (it reads images before it substitutes variables), and clusterctl's `images:` setting, the
/// way to point the controller at a mirror, changes the Deployment's image.
#[test]
fn clusterctl_describes_the_components_and_overrides_their_image() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    let components = testenv::clusterctl_repo::local_repository(
        dir.path(),
        &version,
        &repo().join("deploy/bootstrap-components.yaml"),
        &repo().join("deploy/metadata.yaml"),
    )
    .expect("a local repository");
    let mirror = "mirror.example.internal/platform";
    let images = format!(
        "images:\n  {}:\n    repository: {mirror}\n",
        testenv::clusterctl_repo::PROVIDER_LABEL
    );
    let config =
        testenv::clusterctl_repo::ClusterctlConfig::write(dir.path(), &components, &images)
            .expect("clusterctl.yaml");
    let ok = |args: &[&str]| {
        let out = config.run(args).expect("clusterctl runs");
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "clusterctl {} failed: {}{said}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        said
    };

    let described = ok(&[
        "generate",
        "provider",
        "--bootstrap",
        "bootplate",
        "--describe",
    ]);
    let (_, variables) = substitute_defaults(&read("deploy/bootstrap-components.yaml"));
    for name in variables.keys() {
        assert!(
            described.contains(&format!("  - {name}\n")),
            "{name} is listed:\n{described}"
        );
    }
    let image = format!("{mirror}/bootplate:{version}");
    assert!(
        described.contains(&format!("Images:\n  - {image}\n")),
        "{described}"
    );

    let generated = documents(&ok(&["generate", "provider", "--bootstrap", "bootplate"]));
    let deployment = find(&generated, "Deployment", "bootplate-controller-manager");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        image.as_str()
    );
}

#[test]
fn clusterctl_metadata_maps_this_release_series_to_the_crds_contract() {
    let metadata = &documents(&read("deploy/metadata.yaml"))[0];
    assert_eq!(
        metadata["apiVersion"],
        "clusterctl.cluster.x-k8s.io/v1alpha3"
    );
    assert_eq!(metadata["kind"], "Metadata");
    let version: Vec<u64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    let series = metadata["releaseSeries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["major"] == version[0] && s["minor"] == version[1])
        .unwrap_or_else(|| {
            panic!(
                "deploy/metadata.yaml has no release series {}.{}",
                version[0], version[1]
            )
        });
    assert_eq!(series["contract"], "v1beta2");
    for crd in testenv::crds_from_yaml(&kustomize("deploy/crds")).unwrap() {
        let labels = crd.metadata.labels.unwrap_or_default();
        assert!(
            labels.contains_key("cluster.x-k8s.io/v1beta2"),
            "{:?} carries the contract label of the metadata's contract",
            crd.metadata.name
        );
    }
}

/// The metrics controller/src/metrics.rs registers: name → (label names, is a histogram).
fn exported_metrics() -> BTreeMap<String, (Vec<String>, bool)> {
    let source = read("controller/src/metrics.rs");
    let mut metrics = BTreeMap::new();
    let mut rest = source.as_str();
    while let Some(start) = rest.find("\"bootplate_") {
        let before = &rest[..start];
        let after = &rest[start + 1..];
        let name = &after[..after.find('"').unwrap()];
        let before = before.trim_end();
        let histogram =
            before.ends_with("HistogramOpts::new(") || before.ends_with("histogram_vec(&r,");
        // The label names follow in `&["a", "b"]` before the metric's `.expect(`.
        let definition = &after[..after.find(".expect(").unwrap_or(after.len())];
        let labels = definition
            .find("&[")
            .map(|open| {
                let list = &definition[open + 2..];
                list[..list.find(']').unwrap()]
                    .split(',')
                    .map(|l| l.trim().trim_matches('"').to_owned())
                    .filter(|l| !l.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        metrics.insert(name.to_owned(), (labels, histogram));
        rest = &after[name.len()..];
    }
    assert!(
        metrics.len() >= 10,
        "parsed the metrics of controller/src/metrics.rs: {metrics:?}"
    );
    metrics
}

/// The metric names a PromQL expression uses, histogram series mapped to their metric.
fn metrics_in(expr: &str, exported: &BTreeMap<String, (Vec<String>, bool)>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("bootplate_") {
        let after = &rest[start..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|base| exported.get(*base).is_some_and(|(_, h)| *h))
            })
            .unwrap_or(name);
        names.insert(base.to_owned());
        rest = &after[end..];
    }
    names
}

/// Every `expr` string below `value`.
fn expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                match child {
                    Value::String(s) if key == "expr" || key == "definition" => out.push(s.clone()),
                    _ => expressions(child, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| expressions(i, out)),
        _ => {}
    }
}

#[test]
fn grafana_dashboard_shows_every_exported_metric_and_no_other() {
    let exported = exported_metrics();
    let text = read("deploy/monitoring/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is valid JSON");
    assert!(dashboard["title"].is_string() && dashboard["panels"].is_array());
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = metrics_in(expr, &exported);
        assert!(
            !names.is_empty(),
            "dashboard query {expr:?} uses no bootplate metric"
        );
        for name in names {
            assert!(
                exported.contains_key(&name),
                "dashboard query {expr:?} uses {name}, which controller/src/metrics.rs does not export"
            );
            used.insert(name);
        }
    }
    let missing: Vec<_> = exported.keys().filter(|m| !used.contains(*m)).collect();
    assert!(missing.is_empty(), "no dashboard panel shows {missing:?}");
    // The ConfigMap the monitoring kustomization generates holds the same dashboard.
    let objects = documents(&kustomize("deploy/monitoring"));
    let configmap = find(&objects, "ConfigMap", DASHBOARD_CONFIGMAP);
    let embedded: Value =
        serde_json::from_str(configmap["data"]["bootplate.json"].as_str().unwrap()).unwrap();
    assert_eq!(embedded, dashboard);
}

fn prometheus_rule() -> Value {
    let objects = documents(&read("deploy/monitoring/prometheus_rule.yaml"));
    assert_eq!(objects.len(), 1);
    objects.into_iter().next().unwrap()
}

#[test]
fn prometheus_rules_pass_promtool_check_and_unit_tests() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        serde_yaml::to_string(&prometheus_rule()["spec"]).unwrap(),
    )
    .unwrap();
    let checked = run(
        Command::new("promtool")
            .args(["check", "rules"])
            .arg(&rules),
        None,
    );
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tests = dir.path().join("prometheus-rule-tests.yaml");
    std::fs::copy(
        repo().join("tests/fixtures/prometheus-rule-tests.yaml"),
        &tests,
    )
    .unwrap();
    let tested = run(
        Command::new("promtool")
            .args(["test", "rules"])
            .arg(&tests)
            .current_dir(dir.path()),
        None,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn alerts_use_exported_metrics_and_each_has_a_runbook_in_the_operations_guide() {
    let exported = exported_metrics();
    let doc = read("docs/operations.md");
    let rule = prometheus_rule();
    let mut alerts = BTreeSet::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().expect("only alerting rules");
            let expr = rule["expr"].as_str().unwrap();
            let names = metrics_in(expr, &exported);
            assert!(!names.is_empty(), "{alert} uses a bootplate metric");
            for name in names {
                assert!(
                    exported.contains_key(&name),
                    "{alert} uses {name}, which controller/src/metrics.rs does not export"
                );
            }
            assert!(
                ["critical", "warning", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or_default()),
                "{alert} has a severity label"
            );
            for annotation in ["summary", "description"] {
                assert!(
                    rule["annotations"][annotation].is_string(),
                    "{alert} has a {annotation}"
                );
            }
            let anchor = alert.to_lowercase();
            assert!(
                rule["annotations"]["runbook_url"]
                    .as_str()
                    .is_some_and(|u| u.ends_with(&format!("docs/operations.md#{anchor}"))),
                "{alert}'s runbook_url points at its section of docs/operations.md"
            );
            assert!(
                doc.contains(&format!("\n### {alert}\n")),
                "docs/operations.md has a section `### {alert}`"
            );
            alerts.insert(alert.to_owned());
        }
    }
    for required in [
        "BootplateRenderFailures",
        "BootplateConfigsWaitingTooLong",
        "BootplateBootstrapTokenErrors",
        "BootplateNoLeader",
    ] {
        assert!(alerts.contains(required), "alert {required} exists");
    }
}

/// The `bootplate` binary that `cargo test --workspace` built beside these tests. Not a
/// `cargo build -p bootplate` of its own: resolving features for one package would build every
/// dependency a second time, doubling the suite's time and disk.
fn bootplate_binary() -> PathBuf {
    testenv::controller::binary().expect("the bootplate binary")
}

/// A flag of `bootplate run` as its `--help` describes it.
#[derive(Debug, Default)]
struct Flag {
    default: Option<String>,
    env: Option<String>,
}

/// The flags `bootplate run --help` lists, by name without the dashes.
fn run_flags() -> BTreeMap<String, Flag> {
    let help = run(
        Command::new(bootplate_binary()).args(["run", "--help"]),
        None,
    );
    let mut flags: BTreeMap<String, Flag> = BTreeMap::new();
    let mut current = String::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        // Flags are indented by at most 6 columns, their descriptions by more.
        let flag_line = trimmed.strip_prefix("-h, ").unwrap_or(trimmed);
        if let Some(flag) = flag_line.strip_prefix("--").filter(|_| indent <= 6) {
            current = flag.split([' ', '=']).next().unwrap().to_owned();
            flags.insert(current.clone(), Flag::default());
        } else if let Some(default) = trimmed.strip_prefix("[default: ") {
            let flag = flags.get_mut(&current).expect("a flag before its default");
            flag.default = Some(default.trim_end_matches(']').to_owned());
        } else if let Some(env) = trimmed.strip_prefix("[env: ") {
            let flag = flags.get_mut(&current).expect("a flag before its variable");
            flag.env = Some(env.split('=').next().unwrap().to_owned());
        }
    }
    flags.remove("help");
    assert!(
        flags.len() >= 10,
        "parsed `bootplate run --help`: {flags:?}"
    );
    flags
}

#[test]
fn operations_guide_lists_every_flag_with_its_default_and_the_deployment_uses_real_flags() {
    let flags = run_flags();
    let doc = read("docs/operations.md");
    // Rows of the flags table start with "| `--<flag>".
    let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `--")).collect();
    for (flag, described) in &flags {
        let row = rows
            .iter()
            .find(|r| {
                r[5..]
                    .strip_prefix(flag.as_str())
                    .is_some_and(|after| after.starts_with([' ', '`']))
            })
            .unwrap_or_else(|| panic!("docs/operations.md has no row for --{flag}"));
        for (what, value) in [
            ("default", &described.default),
            ("variable", &described.env),
        ] {
            if let Some(value) = value {
                assert!(
                    row.contains(&format!("`{value}`")),
                    "the row of --{flag} in docs/operations.md shows its {what} `{value}`: {row}"
                );
            }
        }
    }
    for row in &rows {
        let flag = row[5..].split([' ', '`']).next().unwrap();
        assert!(
            flags.contains_key(flag),
            "docs/operations.md documents --{flag}, which `bootplate run` does not have"
        );
    }
    let objects = documents(&kustomize("deploy"));
    let deployment = find(&objects, "Deployment", "bootplate-controller-manager");
    for arg in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
    {
        if let Some(flag) = arg.as_str().unwrap().strip_prefix("--") {
            let name = flag.split('=').next().unwrap();
            assert!(
                flags.contains_key(name),
                "the Deployment passes --{name}, which `bootplate run` does not have"
            );
        }
    }
}

#[test]
fn operations_guide_lists_every_metric_with_its_labels() {
    let doc = read("docs/operations.md");
    for (name, (labels, _)) in exported_metrics() {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("docs/operations.md has no row for metric {name}"));
        for label in labels {
            assert!(
                row.contains(&format!("`{label}`")),
                "the row of {name} in docs/operations.md names its label `{label}`"
            );
        }
    }
}

/// The objects of `built` by key.
fn by_key(built: &str) -> BTreeMap<String, Value> {
    documents(built)
        .into_iter()
        .map(|o| (object_key(&o), o))
        .collect()
}

#[test]
fn extension_overlay_adds_only_the_extension_and_its_parts_fit_together() {
    let base = by_key(&kustomize("deploy"));
    let mut overlay = by_key(&kustomize("deploy/extension"));
    let config = overlay
        .remove("ExtensionConfig//bootplate")
        .expect("deploy/extension has the ExtensionConfig `bootplate`, cluster-scoped");
    let service = overlay
        .remove(&format!("Service/{NAMESPACE}/bootplate-extension-service"))
        .expect("deploy/extension has the extension's Service");
    assert_eq!(
        overlay.keys().collect::<Vec<_>>(),
        base.keys().collect::<Vec<_>>(),
        "deploy/extension builds the objects of deploy/ and two more"
    );
    let deployment_key = format!("Deployment/{NAMESPACE}/bootplate-controller-manager");
    let certificate_key = format!("Certificate/{NAMESPACE}/bootplate-serving-cert");
    let policy_key = format!("NetworkPolicy/{NAMESPACE}/bootplate-controller-manager");
    for (key, object) in &base {
        if ![&deployment_key, &certificate_key, &policy_key].contains(&key) {
            assert_eq!(&overlay[key], object, "{key} differs in deploy/extension");
        }
    }

    // The controller: deploy/'s arguments and ports, plus the extension's, on a real flag.
    let container = |objects: &BTreeMap<String, Value>| {
        objects[&deployment_key]["spec"]["template"]["spec"]["containers"][0].clone()
    };
    let (before, after) = (container(&base), container(&overlay));
    let added = |field: &str| -> Vec<Value> {
        let old = before[field].as_array().unwrap();
        let new = after[field].as_array().unwrap();
        assert_eq!(&new[..old.len()], &old[..], "deploy/'s {field} are kept");
        new[old.len()..].to_vec()
    };
    assert_eq!(
        added("args"),
        vec![
            Value::from("--extension-addr=0.0.0.0:9444"),
            Value::from("--extension-client-ca=/tmp/k8s-extension-client-ca/ca.crt"),
        ]
    );
    assert!(run_flags().contains_key("extension-addr"));
    assert!(run_flags().contains_key("extension-client-ca"));
    let ports = added("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["name"], "extension");
    assert_eq!(ports[0]["containerPort"], 9444);

    // The client CA: a Secret's `ca.crt` mounted where --extension-client-ca reads it,
    // optional so that the rest of the controller runs before the Secret exists.
    let mounts = added("volumeMounts");
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0]["mountPath"], "/tmp/k8s-extension-client-ca");
    let pod = |objects: &BTreeMap<String, Value>| {
        objects[&deployment_key]["spec"]["template"]["spec"]["volumes"].clone()
    };
    let volumes = pod(&overlay);
    let volume = (volumes.as_array().unwrap().iter())
        .find(|v| v["name"] == mounts[0]["name"])
        .expect("the mounted volume exists");
    assert_eq!(
        volume["secret"]["secretName"],
        "bootplate-extension-client-ca"
    );
    assert_eq!(volume["secret"]["optional"], true);

    // The NetworkPolicy: deploy/'s rules, plus the extension's port for Cluster API's pods only.
    let rules = |objects: &BTreeMap<String, Value>| {
        objects[&policy_key]["spec"]["ingress"]
            .as_array()
            .unwrap()
            .clone()
    };
    let (base_rules, rules) = (rules(&base), rules(&overlay));
    assert_eq!(&rules[..base_rules.len()], &base_rules[..]);
    let extension_rule = &rules[base_rules.len()..];
    assert_eq!(extension_rule.len(), 1);
    assert_eq!(
        extension_rule[0]["ports"],
        serde_json::json!([{"port": "extension", "protocol": "TCP"}])
    );
    let from = &extension_rule[0]["from"];
    assert_eq!(
        from.as_array().unwrap().len(),
        1,
        "one peer: namespace AND pods"
    );
    assert_eq!(
        from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "capi-system"
    );
    assert_eq!(
        from[0]["podSelector"]["matchLabels"]["cluster.x-k8s.io/provider"],
        "cluster-api"
    );

    // Cluster API calls the Service, which sends 443 to that port of the controller's pods.
    let client = &config["spec"]["clientConfig"]["service"];
    assert_eq!(client["name"], service["metadata"]["name"]);
    assert_eq!(client["namespace"], NAMESPACE);
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(client["port"], service_port["port"]);
    assert_eq!(service_port["targetPort"], "extension");
    let pod_labels = &overlay[&deployment_key]["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &pod_labels[key], value,
            "the extension Service selects the pods"
        );
    }
    assert!(
        config["spec"]["namespaceSelector"]
            .as_object()
            .is_some_and(|s| s.is_empty()),
        "the hooks are called for every namespace"
    );

    // TLS: the webhook's certificate names the Service too, and its Secret is where Cluster API
    // reads the CA from (the extension serves from --webhook-cert-dir by default).
    let certificate = &overlay[&certificate_key];
    let names: Vec<&str> = (certificate["spec"]["dnsNames"].as_array().unwrap().iter())
        .filter_map(Value::as_str)
        .collect();
    let service_name = service["metadata"]["name"].as_str().unwrap();
    for name in [
        format!("{service_name}.{NAMESPACE}.svc"),
        format!("{service_name}.{NAMESPACE}.svc.cluster.local"),
    ] {
        assert!(
            names.contains(&name.as_str()),
            "the certificate names {name}"
        );
    }
    let secret = certificate["spec"]["secretName"].as_str().unwrap();
    assert_eq!(
        config["metadata"]["annotations"]["runtime.cluster.x-k8s.io/inject-ca-from-secret"],
        format!("{NAMESPACE}/{secret}")
    );
    assert!(
        !after["args"].as_array().unwrap().iter().any(|a| a
            .as_str()
            .is_some_and(|a| a.starts_with("--extension-cert-dir"))),
        "the extension serves the webhook's certificate (the default of --extension-cert-dir)"
    );
}

#[test]
fn network_policy_selects_the_controller_and_admits_only_the_ports_it_serves() {
    let objects = documents(&kustomize("deploy"));
    let policy = find(&objects, "NetworkPolicy", "bootplate-controller-manager");
    let deployment = find(&objects, "Deployment", "bootplate-controller-manager");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &pod_labels[key], value,
            "the policy selects the controller's pods"
        );
    }
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let container_ports: BTreeSet<&str> = (deployment["spec"]["template"]["spec"]["containers"][0]
        ["ports"]
        .as_array()
        .unwrap()
        .iter())
    .filter_map(|p| p["name"].as_str())
    .collect();
    let admitted: BTreeSet<&str> = (policy["spec"]["ingress"].as_array().unwrap().iter())
        .flat_map(|rule| rule["ports"].as_array().unwrap().iter())
        .filter_map(|p| p["port"].as_str())
        .collect();
    assert_eq!(
        admitted,
        BTreeSet::from(["health", "metrics", "webhook"]),
        "deploy/ admits its three ports by name, and no other"
    );
    assert!(
        admitted.is_subset(&container_ports),
        "each admitted port is a container port"
    );
}
