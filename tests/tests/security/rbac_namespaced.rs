//! The controller's own reach: `deploy/rbac-namespaced` confines it to the namespace it watches.
//! Applied to the real apiserver through the overlay docs/operations.md shows, the apiserver's
//! RBAC authorizer says the controller may read and write Secrets in that namespace and in no
//! other, and `bootplate run --namespace` under it still brings a config to Ready. The Role and
//! the cluster-scoped ClusterRole together grant exactly what `deploy/rbac/role.yaml` grants.
//!
//! This module plays Cluster API's Cluster and Machine controllers (`testenv::capi_env`): what
//! is under test is which API calls the controller's ServiceAccount may make.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use kube::Api;
use kube::api::DeleteParams;
use serde_json::Value;
use testenv::capi_env::{NS, cluster_template, env, publish_cluster_template};
use testenv::fixtures;
use testenv::rbac::{granted, service_account_may};

/// Kinds without a namespace, which only a ClusterRole can grant.
const CLUSTER_SCOPED: [&str; 2] = ["clusterbootstraptemplates", "bootstrapgenerators"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The overlay of docs/operations.md ("RBAC: one namespace") for `namespace`, built: it moves
/// the Role and RoleBinding of deploy/rbac-namespaced to the watched namespace.
fn overlay(namespace: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    // kustomize takes only relative paths to a base.
    let up = "../".repeat(dir.path().components().count() - 1);
    let base = repo()
        .join("deploy/rbac-namespaced")
        .canonicalize()
        .unwrap();
    let base = format!("{up}{}", base.to_str().unwrap().trim_start_matches('/'));
    let move_to = format!("- {{op: replace, path: /metadata/namespace, value: {namespace}}}");
    let kustomization = format!(
        "resources:\n- {base}\npatches:\n- target: {{kind: Role, name: bootplate-manager}}\n  patch: |-\n    {move_to}\n- target: {{kind: RoleBinding, name: bootplate-manager}}\n  patch: |-\n    {move_to}\n"
    );
    std::fs::write(dir.path().join("kustomization.yaml"), kustomization).unwrap();
    kubectl(&["kustomize", dir.path().to_str().unwrap()], None)
}

fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_namespaced_roles_grant_what_the_cluster_wide_role_grants() {
    let cluster_wide =
        documents(&std::fs::read_to_string(repo().join("deploy/rbac/role.yaml")).unwrap());
    let wanted = granted(object(&cluster_wide, "ClusterRole", "bootplate-manager"));
    let objects = documents(&overlay("team-a"));
    let role = object(&objects, "Role", "bootplate-manager");
    assert_eq!(role["metadata"]["namespace"], "team-a");
    let scoped = granted(object(
        &objects,
        "ClusterRole",
        "bootplate-manager-cluster-scoped",
    ));
    let base = |resource: &str| resource.split('/').next().unwrap().to_owned();
    for (_, resource, _) in &scoped {
        assert!(
            CLUSTER_SCOPED.contains(&base(resource).as_str()),
            "cluster-wide {resource}"
        );
    }
    let namespaced = granted(role);
    assert!(
        namespaced
            .iter()
            .all(|(_, r, _)| !CLUSTER_SCOPED.contains(&base(r).as_str()))
    );
    let together: BTreeSet<_> = scoped.union(&namespaced).cloned().collect();
    assert_eq!(
        together, wanted,
        "the namespaced mode grants what deploy/rbac grants"
    );
    for kind in ["ClusterRole", "ClusterRoleBinding"] {
        assert!(
            !objects
                .iter()
                .any(|o| o["kind"] == kind && o["metadata"]["name"] == "bootplate-manager"),
            "the cluster-wide {kind} is not in the namespaced mode"
        );
    }
}

#[tokio::test]
async fn under_the_namespaced_roles_the_controller_serves_its_namespace_and_reaches_no_other() {
    let env = env().await;
    let admin = env.management.kubeconfig_path().unwrap();
    let admin = admin.to_str().unwrap();
    fixtures::namespace(&env.client, "team-b").await.unwrap();
    // deploy/rbac's cluster-wide grant, which env() installed, gives way to the namespaced mode.
    let dp = DeleteParams::default();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(env.client.clone())
        .delete("bootplate-manager", &dp)
        .await
        .unwrap();
    kubectl(
        &["--kubeconfig", admin, "apply", "-f", "-"],
        Some(&overlay(NS)),
    );

    let may = |verb: &'static str, resource: &'static str, namespace: &'static str| {
        let client = env.client.clone();
        async move {
            service_account_may(&client, "", resource, verb, namespace)
                .await
                .unwrap()
        }
    };
    for verb in ["get", "list", "watch", "create", "patch"] {
        assert!(may(verb, "secrets", NS).await, "{verb} Secrets in {NS}");
        assert!(
            !may(verb, "secrets", "team-b").await,
            "{verb} Secrets in team-b"
        );
        assert!(
            !may(verb, "secrets", "").await,
            "{verb} Secrets cluster-wide"
        );
    }
    assert!(!may("create", "configmaps", "team-b").await);
    assert!(!may("delete", "configmaps", "kube-system").await);

    // The controller, confined so, still does its whole job in its namespace.
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.initialized_cluster("n1").await;
    let _controller = env.controller(&["--namespace", NS]).await;
    env.machine("n1", "n1-w", false, cluster_template("probe"))
        .await;
    env.wait_ready("n1-w").await;
    assert!(env.user_data("n1-w").await.contains("# v1"));
}
