//! `bootplate lint --kubeconfig`: the configs of a GitOps tree checked against templates that
//! are already in a cluster rather than among the files. The cluster is a real kube-apiserver +
//! etcd with bootplate's CRDs. lint acts as a ServiceAccount granted only `get` on the two
//! template kinds, so any other request it made (a list, a write) would be refused and fail the
//! run: lint reads what it names and nothing else. A cluster that cannot be reached and an
//! identity without the right are each said once, with exit status 2.
//!
//! It runs in the apiserver of `lint_decoding` (called at the end of its test), which holds the
//! same CRDs: one apiserver start less in CI.

use std::path::Path;
use std::process::{Command, Output};

use testenv::{ApiServer, kubectl_apply, rbac};

/// What the platform team applied: its namespace, a template, and the one right lint needs.
const CLUSTER_OBJECTS: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata: {name: workers, namespace: team-a}
spec:
  os: {name: ubuntu}
  format: script
  variables:
    - name: proxy
      required: true
      schema: {type: string, pattern: \"^https?://[a-z0-9.:-]+$\"}
  parts:
    - name: configure
      commands:
        - echo {{shell_quote values.proxy}}
---
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfigTemplate
metadata: {name: applied, namespace: team-a}
spec:
  template:
    spec:
      templateRef: {kind: BootstrapTemplate, name: workers}
      variables: {proxy: \"http://proxy.example.com:3128\"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bootplate-lint}
rules:
  - apiGroups: [bootstrap.bootplate.dev]
    resources: [bootstraptemplates, clusterbootstraptemplates, bootplateconfigs, bootplateconfigtemplates]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: bootplate-lint}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bootplate-lint}
subjects:
  - {kind: ServiceAccount, name: linter, namespace: team-a}
";

/// The app team's configs; the template is not among the files. One fits it, one sets a value
/// its pattern refuses, one names a template that exists nowhere. And MachineDeployments whose
/// config template is applied already, or exists nowhere.
const CONFIGS: &str = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: fits, namespace: team-a}
spec:
  templateRef: {kind: BootstrapTemplate, name: workers}
  variables: {proxy: \"http://proxy.example.com:3128\"}
---
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfigTemplate
metadata: {name: refused, namespace: team-a}
spec:
  template:
    spec:
      templateRef: {kind: BootstrapTemplate, name: workers}
      variables: {proxy: \"ftp://proxy.example.com\"}
---
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: lost, namespace: team-a}
spec:
  templateRef: {kind: BootstrapTemplate, name: wrokers}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: md-0, namespace: team-a}
spec:
  clusterName: demo
  template:
    spec:
      clusterName: demo
      bootstrap:
        configRef: {apiGroup: bootstrap.bootplate.dev, kind: BootplateConfigTemplate, name: applied}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: md-1, namespace: team-a}
spec:
  clusterName: demo
  template:
    spec:
      clusterName: demo
      bootstrap:
        configRef: {apiGroup: bootstrap.bootplate.dev, kind: BootplateConfigTemplate, name: nowhere}
";

fn lint(dir: &Path, extra: &[&str]) -> Output {
    Command::new(testenv::controller::binary().unwrap())
        .args(["lint", "--format", "json"])
        .args(extra)
        .arg(dir.join("configs.yaml"))
        .output()
        .unwrap()
}

/// (line, column, code, severity) of each problem lint printed.
fn problems(out: &Output) -> Vec<(u64, u64, String, String)> {
    let mut found: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["line"].as_u64().unwrap(),
                v["column"].as_u64().unwrap(),
                v["code"].as_str().unwrap().to_owned(),
                v["severity"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    found.sort();
    found
}

/// The line and column (from 1) of the `nth` line of [`CONFIGS`] that holds `needle`.
fn at(needle: &str, nth: usize) -> (u64, u64) {
    CONFIGS
        .lines()
        .enumerate()
        .filter_map(|(i, l)| l.find(needle).map(|c| (i as u64 + 1, c as u64 + 1)))
        .nth(nth)
        .unwrap()
}

fn problem(needle: &str, nth: usize, code: &str, severity: &str) -> (u64, u64, String, String) {
    let (line, column) = at(needle, nth);
    (line, column, code.to_owned(), severity.to_owned())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Configs checked against a cluster's templates by an identity that may only get them, in
/// `server` (bootplate's CRDs installed).
pub async fn configs_against_a_cluster_with_get_only(server: &ApiServer) {
    let applied = kubectl_apply(&server.kubeconfig_path().unwrap(), &[], CLUSTER_OBJECTS);
    assert!(applied.status.success(), "{}", stderr(&applied));
    // The reader may only get templates; a second context points at a port nothing serves.
    let reader = rbac::impersonating_kubeconfig(server, "team-a", "linter", "reader").unwrap();
    let dead = testenv::free_port().unwrap();
    let yaml = std::fs::read_to_string(&reader)
        .unwrap()
        .replace(
            "clusters:\n",
            &format!("clusters:\n- name: dead\n  cluster:\n    server: https://127.0.0.1:{dead}\n"),
        )
        .replace(
            "contexts:\n",
            "contexts:\n- name: dead\n  context:\n    cluster: dead\n    user: admin\n",
        );
    std::fs::write(&reader, yaml).unwrap();
    let reader = reader.to_str().unwrap();
    let nobody = rbac::impersonating_kubeconfig(server, "team-a", "nobody", "nobody").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("configs.yaml"), CONFIGS).unwrap();

    // Offline, the configs go unchecked: a warning each, the refused value unnoticed; both
    // config templates are missing.
    let offline = lint(dir.path(), &[]);
    assert_eq!(offline.status.code(), Some(1), "{}", stderr(&offline));
    let mut unchecked = vec![
        problem("workers}", 0, "template-not-found", "warning"),
        problem("workers}", 1, "template-not-found", "warning"),
        problem("wrokers", 0, "template-not-found", "warning"),
        problem("applied}", 0, "missing-reference", "error"),
        problem("nowhere}", 0, "missing-reference", "error"),
    ];
    unchecked.sort();
    assert_eq!(problems(&offline), unchecked);

    // With the cluster: the refused value at its line, the missing template an error, the
    // applied config template found.
    let online = lint(dir.path(), &["--kubeconfig", reader]);
    assert_eq!(online.status.code(), Some(1), "{}", stderr(&online));
    let mut expected = vec![
        problem("\"ftp://", 0, "config-invalid", "error"),
        problem("wrokers", 0, "template-not-found", "error"),
        problem("nowhere}", 0, "missing-reference", "error"),
    ];
    expected.sort();
    assert_eq!(
        problems(&online),
        expected,
        "{}",
        String::from_utf8_lossy(&online.stdout)
    );
    let said = String::from_utf8_lossy(&online.stdout);
    assert!(
        said.contains("namespace team-a of the cluster at https://127.0.0.1:"),
        "{said}"
    );

    // A cluster nothing answers for, and an identity without the right: said once, exit 2.
    let unreachable = lint(dir.path(), &["--kubeconfig", reader, "--context", "dead"]);
    assert_eq!(
        unreachable.status.code(),
        Some(2),
        "{}",
        stderr(&unreachable)
    );
    let why = stderr(&unreachable);
    assert_eq!(why.matches("--kubeconfig:").count(), 1, "{why}");
    assert!(
        why.contains("cannot reach it") && why.contains("(context dead)"),
        "{why}"
    );
    let forbidden = lint(dir.path(), &["--kubeconfig", nobody.to_str().unwrap()]);
    assert_eq!(forbidden.status.code(), Some(2), "{}", stderr(&forbidden));
    let why = stderr(&forbidden);
    assert_eq!(why.matches("--kubeconfig:").count(), 1, "{why}");
    assert!(
        why.contains(
            "may not get bootplateconfigtemplates.bootstrap.bootplate.dev in namespace team-a"
        ),
        "{why}"
    );
}
