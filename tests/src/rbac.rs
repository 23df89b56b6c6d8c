//! The controller's RBAC from `deploy/rbac`, applied to a test apiserver, and a kubeconfig that
//! impersonates its ServiceAccount: tests then run the controller with exactly the rights a
//! cluster admin grants it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::ApiServer;

/// The namespace and name of the controller's ServiceAccount in `deploy/rbac`.
pub const SERVICE_ACCOUNT: (&str, &str) = ("bootplate-system", "bootplate-manager");

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin.unwrap_or_default().as_bytes())?;
    drop(input);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies `deploy/rbac` (and its namespace) and returns a kubeconfig that acts as the
/// controller's ServiceAccount.
pub async fn install(server: &ApiServer) -> anyhow::Result<PathBuf> {
    let admin = server.kubeconfig_path()?;
    let rbac_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rbac");
    let (namespace, name) = SERVICE_ACCOUNT;
    kubectl(&admin, &["create", "namespace", namespace], None)?;
    let manifests = kubectl(
        &admin,
        &["kustomize", rbac_dir.to_str().context("UTF-8 path")?],
        None,
    )?;
    kubectl(&admin, &["apply", "-f", "-"], Some(&manifests))?;
    impersonating_kubeconfig(server, namespace, name, "controller-kubeconfig")
}

/// Writes a kubeconfig (file `file` in the server's directory) with which the admin acts as
/// ServiceAccount `namespace/name`: a process run with it has exactly that account's rights.
pub fn impersonating_kubeconfig(
    server: &ApiServer,
    namespace: &str,
    name: &str,
    file: &str,
) -> anyhow::Result<PathBuf> {
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let impersonating = server.kubeconfig_yaml().replace(
        "    token: ",
        &format!(
            "    as: {user}\n    as-groups: [system:serviceaccounts, \"system:serviceaccounts:{namespace}\", system:authenticated]\n    token: "
        ),
    );
    let path = server.dir().join(file);
    std::fs::write(&path, impersonating)?;
    Ok(path)
}

/// Whether the controller's ServiceAccount ([`SERVICE_ACCOUNT`]) may `verb` `group/resource`
/// (`resource/subresource` allowed) in `namespace` (empty: cluster-wide), asked of the real
/// apiserver's RBAC authorizer with a SubjectAccessReview.
pub async fn service_account_may(
    client: &kube::Client,
    group: &str,
    resource: &str,
    verb: &str,
    namespace: &str,
) -> anyhow::Result<bool> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let (account_namespace, account) = SERVICE_ACCOUNT;
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!(
                "system:serviceaccount:{account_namespace}:{account}"
            )),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{account_namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                verb: Some(verb.to_owned()),
                namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    let answer = api.create(&Default::default(), &review).await?;
    Ok(answer.status.context("a review status")?.allowed)
}

/// (group, resource, verb) triples that the rules of a Role or ClusterRole (as JSON) grant.
pub fn granted(role: &serde_json::Value) -> std::collections::BTreeSet<(String, String, String)> {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut triples = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    triples.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    triples
}
