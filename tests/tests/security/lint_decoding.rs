//! What `bootplate lint` reads against what the apiserver receives. A platform team's CI gate is
//! only a gate if it refuses what `kubectl apply` will refuse and passes what it will pass.
//! `kubectl apply` decodes YAML 1.1 (sigs.k8s.io/yaml over go-yaml v2): an unquoted
//! `permissions: 0600` reaches the apiserver as the integer 384 and the CRD (`type: string`)
//! refuses it, while `enable: yes` is the boolean true and passes. Before, lint read YAML 1.2
//! and said the opposite of the apiserver on both.
//!
//! Each case is one template file, applied with the real kubectl to a real kube-apiserver +
//! etcd holding bootplate's CRDs, and linted: both must agree, and lint's refusal names the
//! value's line and says to quote it.

use std::path::Path;
use std::process::Command;

use testenv::{ApiServer, install_bootplate_crds, kubectl_apply};

/// A template whose one file has `permissions: PERMISSIONS` and whose one unit has
/// `enable: ENABLE`, written as given (unquoted unless the case quotes it).
fn template(name: &str, permissions: &str, enable: &str) -> String {
    format!(
        "apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: {name}
spec:
  os: {{name: linux}}
  format: script
  parts:
    - name: configure
      files:
        - path: /etc/example.conf
          permissions: {permissions}
          content: \"example\\n\"
      units:
        - name: example.service
          enable: {enable}
          content: |
            [Service]
            ExecStart=/bin/true
"
    )
}

/// `bootplate lint --format json FILE`: whether it found errors, and its JSON lines.
fn lint(file: &Path) -> (bool, Vec<serde_json::Value>) {
    let out = Command::new(testenv::controller::binary().unwrap())
        .args(["lint", "--format", "json"])
        .arg(file)
        .output()
        .unwrap();
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code() == Some(1), lines)
}

#[tokio::test]
async fn lint_refuses_exactly_what_kubectl_apply_refuses_for_unquoted_scalars() {
    let server = ApiServer::start().await.unwrap();
    install_bootplate_crds(&server.client().await.unwrap())
        .await
        .unwrap();
    let kubeconfig = server.kubeconfig_path().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // (permissions, enable, what the apiserver does with it)
    let cases = [
        ("0600", "true", false),
        ("0o600", "true", false),
        ("\"0600\"", "true", true),
        ("'0644'", "yes", true),
        ("\"0600\"", "on", true),
    ];
    for (i, (permissions, enable, accepted)) in cases.into_iter().enumerate() {
        let name = format!("octal-{i}");
        let text = template(&name, permissions, enable);
        let out = kubectl_apply(&kubeconfig, &[], &text);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.success(),
            accepted,
            "kubectl apply of permissions {permissions}, enable {enable}: {stderr}"
        );
        if !accepted {
            assert!(stderr.contains("permissions"), "{stderr}");
        }
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &text).unwrap();
        let (refused, problems) = lint(&file);
        assert_eq!(
            refused, !accepted,
            "lint of {permissions}, {enable}: {problems:?}"
        );
        if accepted {
            assert!(problems.is_empty(), "{problems:?}");
            continue;
        }
        // One problem, at the value, saying why and how to fix it.
        assert_eq!(problems.len(), 1, "{problems:?}");
        let p = &problems[0];
        let line = text
            .lines()
            .position(|l| l.contains("permissions:"))
            .unwrap()
            + 1;
        let column = text
            .lines()
            .nth(line - 1)
            .unwrap()
            .find(permissions)
            .unwrap()
            + 1;
        assert_eq!(
            (p["line"].as_u64(), p["column"].as_u64()),
            (Some(line as u64), Some(column as u64))
        );
        assert_eq!(p["field"], "spec.parts[0].files[0].permissions");
        let hint = p["hint"].as_str().unwrap();
        assert!(
            hint.contains(&format!("reads unquoted `{permissions}` as the number 384"))
                && hint.contains(&format!("quote it: \"{permissions}\"")),
            "{hint}"
        );
    }
    // `lint --kubeconfig` needs the same apiserver and CRDs: checked here, not in a second one.
    super::lint_cluster::configs_against_a_cluster_with_get_only(&server).await;
}
