//! The admission webhook, called over TLS by a real kube-apiserver: broken templates and bad
//! configs are refused at `kubectl apply`, with the field and the position in the message.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::controller::ControllerProcess;
use testenv::{ApiServer, eventually, fixtures};

/// A CA and a serving certificate for 127.0.0.1 signed by it, written as tls.crt/tls.key.
fn write_serving_cert(dir: &Path) -> String {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("tls.crt.new"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key.new"), key.serialize_pem()).unwrap();
    // Rename into place so the controller never sees half a pair.
    std::fs::rename(dir.join("tls.key.new"), dir.join("tls.key")).unwrap();
    std::fs::rename(dir.join("tls.crt.new"), dir.join("tls.crt")).unwrap();
    ca.pem()
}

/// The SHA-256 fingerprint of the certificate served on `port`.
fn served_fingerprint(port: u16) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256"
        ))
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn kubectl_apply(kubeconfig: &Path, yaml: &str) -> Output {
    testenv::kubectl_apply(kubeconfig, &[], yaml)
}

fn denied(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a denial, got: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        stderr.contains("denied the request"),
        "not a webhook denial: {stderr}"
    );
    stderr
}

fn admitted(out: &Output) {
    assert!(
        out.status.success(),
        "expected admission: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn webhook_denies_bad_objects_over_tls() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client().await.unwrap();
    testenv::install_bootplate_crds(&client).await.unwrap();
    for ns in ["team-a", "team-b"] {
        fixtures::namespace(&client, ns).await.unwrap();
    }
    let cert_dir = server.dir().join("webhook-certs");
    std::fs::create_dir_all(&cert_dir).unwrap();
    let ca = write_serving_cert(&cert_dir);
    let port = testenv::free_port().unwrap();
    let kubeconfig = server.kubeconfig_path().unwrap();
    let _controller = ControllerProcess::start(
        &kubeconfig,
        &server.dir().join("controller.log"),
        &[
            &format!("--webhook-addr=127.0.0.1:{port}"),
            "--webhook-cert-dir",
            cert_dir.to_str().unwrap(),
        ],
    )
    .await
    .unwrap();

    use base64::Engine as _;
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "bootplate"},
        "webhooks": [{
            "name": "validate.bootstrap.bootplate.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"),
                             "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)},
            "rules": [{"apiGroups": ["bootstrap.bootplate.dev"], "apiVersions": ["v1alpha1"],
                       "operations": ["CREATE", "UPDATE"],
                       "resources": ["bootstraptemplates", "clusterbootstraptemplates", "bootplateconfigs", "bootplateconfigtemplates"]}],
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 10,
        }]
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();

    // A valid template is admitted (retrying while the apiserver picks up the configuration).
    let good = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata: {name: good, namespace: team-a}
spec:
  os: {name: linux}
  format: script
  variables:
  - {name: greeting, default: hello, schema: {type: string}}
  template: |
    #!/bin/bash
    echo {{shell_quote values.greeting}} {{machine.name}}
"#;
    eventually(
        "valid template admitted",
        Duration::from_secs(30),
        || async {
            let out = kubectl_apply(&kubeconfig, good);
            if !out.status.success() {
                eprintln!("not admitted yet: {}", String::from_utf8_lossy(&out.stderr));
            }
            out.status.success().then_some(())
        },
    )
    .await;

    // A broken template is denied with the field, line and column.
    let broken = good
        .replace("name: good", "name: broken")
        .replace("echo {{shell_quote", "echo {{machine..name}} {{shell_quote");
    let message = denied(&kubectl_apply(&kubeconfig, &broken));
    assert!(message.contains("spec.template"), "{message}");
    assert!(message.contains("line 2, column"), "{message}");

    // A default that does not match its schema, duplicate variables, template and parts together.
    let bad_default = good
        .replace("name: good", "name: bad-default")
        .replace("default: hello", "default: 42");
    let message = denied(&kubectl_apply(&kubeconfig, &bad_default));
    assert!(message.contains("spec.variables[0]"), "{message}");
    let both = good.replace("name: good", "name: both").replace(
        "  template: |",
        "  parts: [{name: install, commands: [\"true\"]}]\n  template: |",
    );
    let message = denied(&kubectl_apply(&kubeconfig, &both));
    assert!(
        message.contains("template") && message.contains("parts"),
        "{message}"
    );

    // A config naming another namespace's template is denied.
    let cross = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: cross, namespace: team-b}
spec:
  templateRef: {kind: BootstrapTemplate, name: good, namespace: team-a}
"#;
    let message = denied(&kubectl_apply(&kubeconfig, cross));
    assert!(message.contains("spec.templateRef.namespace"), "{message}");
    // ... and one reading another namespace's Secret.
    let secret = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: secret, namespace: team-b}
spec:
  templateRef: {kind: ClusterBootstrapTemplate, name: any}
  files:
  - path: /etc/x
    contentFrom: {secret: {name: creds, key: x, namespace: team-a}}
"#;
    let message = denied(&kubectl_apply(&kubeconfig, secret));
    assert!(
        message.contains("spec.files[0].contentFrom.secret.namespace"),
        "{message}"
    );
    // Variables are checked against the referenced template.
    let wrong_type = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: wrong-type, namespace: team-a}
spec:
  templateRef: {kind: BootstrapTemplate, name: good}
  variables: {greeting: 7}
"#;
    let message = denied(&kubectl_apply(&kubeconfig, wrong_type));
    assert!(message.contains("greeting"), "{message}");
    let unknown = wrong_type
        .replace("name: wrong-type", "name: unknown")
        .replace("greeting: 7", "nosuch: x");
    let message = denied(&kubectl_apply(&kubeconfig, &unknown));
    assert!(message.contains("nosuch"), "{message}");
    // The same checks apply to config templates.
    let config_template = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfigTemplate
metadata: {name: workers, namespace: team-a}
spec:
  template:
    spec:
      templateRef: {kind: BootstrapTemplate, name: good}
      variables: {greeting: 7}
"#;
    let message = denied(&kubectl_apply(&kubeconfig, config_template));
    assert!(
        message.contains("spec.template.spec") && message.contains("greeting"),
        "{message}"
    );

    // A good config is admitted; once its data Secret is written, a change must apply in place
    // (docs/in-place.md): `good` is a raw template, so no change to its output does.
    let ok = wrong_type
        .replace("name: wrong-type", "name: ok")
        .replace("greeting: 7", "greeting: hi");
    admitted(&kubectl_apply(&kubeconfig, &ok));
    let configs = Api::<crd_types::BootplateConfig>::namespaced(client.clone(), "team-a");
    let status = json!({"apiVersion": "bootstrap.bootplate.dev/v1alpha1", "kind": "BootplateConfig",
                        "status": {"ready": true, "dataSecretName": "ok"}});
    configs
        .patch_status(
            "ok",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    let switched = ok.replace(
        "kind: BootstrapTemplate, name: good",
        "kind: ClusterBootstrapTemplate, name: other",
    );
    let message = denied(&kubectl_apply(&kubeconfig, &switched));
    assert!(
        message.contains("spec: the data Secret is written")
            && message.contains("ClusterBootstrapTemplate other is not found"),
        "{message}"
    );
    let message = denied(&kubectl_apply(
        &kubeconfig,
        &ok.replace("greeting: hi", "greeting: hey"),
    ));
    assert!(
        message.contains("a raw spec.template has no parts"),
        "{message}"
    );

    // Templates with parts: on a written config, a change that lies in `update: InPlace` parts
    // is admitted, also when it moves the config to another template; one that changes a
    // Rollout part is refused, naming the part.
    let parts = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata: {name: parts, namespace: team-a}
spec:
  os: {name: linux}
  format: cloud-config
  variables:
  - {name: mirror, default: "https://mirror.example", schema: {type: string}}
  - {name: runtime, default: "2.0", schema: {type: string}}
  parts:
  - name: install
    commands: ["install-runtime {{shell_quote values.runtime}}"]
  - name: configure
    update: InPlace
    files: [{path: /etc/mirror.toml, content: "endpoint = {{json values.mirror}}"}]
"#;
    admitted(&kubectl_apply(&kubeconfig, parts));
    admitted(&kubectl_apply(
        &kubeconfig,
        &parts
            .replace("name: parts,", "name: parts-v2,")
            .replace("endpoint = ", "mirror = "),
    ));
    let on_parts = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: in-place, namespace: team-a}
spec:
  templateRef: {kind: BootstrapTemplate, name: parts}
  variables: {mirror: "https://one.example"}
"#;
    admitted(&kubectl_apply(&kubeconfig, on_parts));
    let status = json!({"apiVersion": "bootstrap.bootplate.dev/v1alpha1", "kind": "BootplateConfig",
                        "status": {"ready": true, "dataSecretName": "in-place", "role": "worker"}});
    configs
        .patch_status(
            "in-place",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    let mirrored = on_parts.replace("https://one.example", "https://two.example");
    admitted(&kubectl_apply(&kubeconfig, &mirrored));
    admitted(&kubectl_apply(
        &kubeconfig,
        &mirrored.replace("name: parts}", "name: parts-v2}"),
    ));
    let message = denied(&kubectl_apply(
        &kubeconfig,
        &mirrored.replace("variables: {", "variables: {runtime: \"3.0\", "),
    ));
    assert!(
        message.contains("needs a new machine (role worker): part `install` changed"),
        "{message}"
    );

    // The template changes so that the config's variable no longer fits. Updates that leave
    // the config's spec alone (Cluster API adds its ownerReference and labels to every config,
    // controllers remove finalizers) are still admitted; a change to the spec is checked.
    let narrowed = good.replace(
        "schema: {type: string}",
        "schema: {type: string, enum: [hello]}",
    );
    admitted(&kubectl_apply(&kubeconfig, &narrowed));
    let labelled = ok.replace(
        "metadata: {name: ok, namespace: team-a}",
        "metadata: {name: ok, namespace: team-a, labels: {cluster.x-k8s.io/cluster-name: c1}}",
    );
    assert_ne!(labelled, ok);
    admitted(&kubectl_apply(&kubeconfig, &labelled));
    let message = denied(&kubectl_apply(
        &kubeconfig,
        &labelled.replace("greeting: hi", "greeting: hey"),
    ));
    assert!(message.contains("greeting"), "{message}");

    // Rotated certificate files are served without a restart.
    let before = served_fingerprint(port);
    assert!(
        before.contains("Fingerprint"),
        "openssl reads the served certificate: {before:?}"
    );
    write_serving_cert(&cert_dir);
    eventually(
        "rotated certificate served",
        Duration::from_secs(20),
        || async { (served_fingerprint(port) != before).then_some(()) },
    )
    .await;
}
