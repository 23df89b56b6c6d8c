//! BootstrapGenerators against app teams and against callers that are not bootplate: a generator
//! serves only the namespaces its `allowedNamespaces` lists (checked before any call and any
//! token), and a generator can require bootplate's client certificate
//! (`bootplate run --generator-client-cert-dir`, `bootplate generator serve --client-ca`).
//!
//! Real parts: the real-Cluster-API environment (`testenv::capi`: Cluster API's own manager
//! owns the Machines and sets the configs' owners; `bootplate run` under deploy/rbac; a real
//! workload apiserver), and the real `bootplate generator serve` process as the generator. No
//! Cluster API state needs to be held at a chosen moment, so nothing of it is played.

use std::path::Path;
use std::time::Duration;

use crd_types::{BootstrapGenerator, ClusterBootstrapTemplate};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::capi::objects::KUBERNETES_VERSION;
use testenv::capi::{CapiEnv, NS, Options};
use testenv::capi_env::{cluster_template, publish_cluster_template};
use testenv::fixtures;
use testenv::pki::TestCa;

/// The template `bootplate generator serve` serves: one file naming the machine.
const SERVED: &str = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: served
spec:
  os: {name: linux}
  format: cloud-config
  parts:
  - name: site
    files:
    - path: /etc/site.conf
      content: "served for {{machine.name}}\n"
"#;

/// A template whose second part comes from generator `served`.
async fn publish_calling_template(client: &kube::Client) {
    let template: ClusterBootstrapTemplate = serde_json::from_value(json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "ClusterBootstrapTemplate",
        "metadata": {"name": "calling"},
        "spec": {
            "os": {"name": "linux"},
            "format": "cloud-config",
            "parts": [
                {"name": "base", "commands": ["true"]},
                {"name": "site", "generator": {"name": "served"}},
            ],
        },
    }))
    .unwrap();
    Api::<ClusterBootstrapTemplate>::all(client.clone())
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

/// `bootplate generator serve` of [`SERVED`], killed on drop; it logs one line per request.
struct Served {
    child: std::process::Child,
    log: std::path::PathBuf,
    port: u16,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// Serves with the serving certificate of `certs`, requiring client certificates signed by
    /// the CA of `client_ca`.
    fn start(dir: &Path, certs: &Path, client_ca: &Path) -> Served {
        let template = dir.join("served.yaml");
        std::fs::write(&template, SERVED).unwrap();
        let port = testenv::free_port().unwrap();
        let log = dir.join("serve.log");
        let child = std::process::Command::new(testenv::controller::binary().unwrap())
            .args(["generator", "serve", "--template"])
            .arg(&template)
            .arg(format!("--addr=127.0.0.1:{port}"))
            .arg("--cert-dir")
            .arg(certs)
            .arg("--client-ca")
            .arg(client_ca)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Served { child, log, port }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/", self.port)
    }

    /// How many requests it answered.
    fn requests(&self) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| l.starts_with("request ")).count()
    }
}

fn not_allowed(env: &CapiEnv) -> f64 {
    let series = r#"bootplate_generator_requests_total{generator="served",result="not_allowed"}"#;
    env.bootplate.metric(series).unwrap_or_default()
}

/// A worker Machine `name` of Cluster c1 whose config uses the ClusterBootstrapTemplate
/// `template`.
async fn machine(env: &CapiEnv, name: &str, template: &str) {
    let spec = crd_types::BootplateConfigSpec {
        template_ref: cluster_template(template),
        ..Default::default()
    };
    env.bootplate_machine(("c1", name), false, spec)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generator_serves_only_its_namespaces_and_only_callers_with_bootplates_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("generator CA");
    let certs = dir.path().join("serving");
    ca.write_serving(&certs).unwrap();
    let client_dir = dir.path().join("bootplate-client");
    std::fs::create_dir_all(&client_dir).unwrap();
    let client = ca.client("bootplate", "bootplate");
    std::fs::write(client_dir.join("tls.crt"), &client.cert_pem).unwrap();
    std::fs::write(client_dir.join("tls.key"), &client.key_pem).unwrap();
    let served = Served::start(dir.path(), &certs, &certs.join("ca.crt"));

    let client_flag = format!("--generator-client-cert-dir={}", client_dir.display());
    let env = CapiEnv::start(Options {
        bootplate_args: vec![client_flag],
        ..Options::default()
    })
    .await
    .unwrap();
    publish_calling_template(&env.client).await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.provider_cluster("c1", KUBERNETES_VERSION, None)
        .await
        .unwrap();
    let generators: Api<BootstrapGenerator> = Api::all(env.client.clone());
    generators
        .create(
            &PostParams::default(),
            &fixtures::bootstrap_generator("served", &served.url(), &ca.cert_pem, 2, &["team-z"]),
        )
        .await
        .unwrap();

    // fleet is not allowed: a condition and an Event naming the generator and the namespace,
    // a count, no request, no token; the namespace's other configs are served.
    machine(&env, "w-0", "calling").await;
    machine(&env, "w-1", "probe").await;
    let message = env.wait_reason("w-0", "GeneratorNotAllowed").await;
    assert!(
        message.contains("BootstrapGenerator served")
            && message.contains(&format!("namespace {NS}"))
            && message.contains("spec.parts[1].generator"),
        "{message}"
    );
    let note = testenv::events::wait_reason(&env.client, NS, "w-0", "GeneratorNotAllowed")
        .await
        .note
        .unwrap();
    assert!(note.contains(&format!("namespace {NS}")), "{note}");
    env.wait_user_data("w-1").await;
    env.settled("w-0").await;
    assert!(not_allowed(&env) >= 1.0);
    assert_eq!(served.requests(), 0, "the generator was called");
    assert!(
        env.data_secret("w-0").await.is_none(),
        "w-0 has a data Secret"
    );
    let w1 = env.config("w-1").await;
    let token_owners: Vec<String> = env
        .tokens()
        .await
        .iter()
        .filter_map(|t| {
            t.metadata
                .labels
                .as_ref()?
                .get("bootstrap.bootplate.dev/config-uid")
                .cloned()
        })
        .collect();
    assert_eq!(token_owners, [w1.metadata.uid.unwrap()], "a token for w-0");

    // Allowed: the controller's calls carry its client certificate, which the generator requires.
    let patch = json!({"spec": {"allowedNamespaces": ["team-z", NS]}});
    generators
        .patch("served", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let user_data = env.wait_user_data("w-0").await;
    assert!(user_data.contains("served for w-0"), "{user_data}");
    assert!(served.requests() >= 1);

    // A caller without the certificate gets no answer: the handshake fails.
    let offline = std::process::Command::new(testenv::controller::binary().unwrap())
        .args(["render", "--template"])
        .arg(write_calling(dir.path()))
        .args(["--machine", "../examples/machine-worker.yaml"])
        .args(["--cluster", "../examples/cluster.yaml"])
        .arg(format!("--generator=served={}", served.url()))
        .arg("--generator-ca")
        .arg(certs.join("ca.crt"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&offline.stderr);
    assert!(
        !offline.status.success(),
        "answered without a client certificate"
    );
    assert!(stderr.contains("cannot reach it"), "{stderr}");
    let answered = served.requests();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        served.requests(),
        answered,
        "a request without a certificate was answered"
    );
}

/// The calling template as a file, for `bootplate render`.
fn write_calling(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("calling.yaml");
    std::fs::write(
        &path,
        "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: ClusterBootstrapTemplate\nmetadata: {name: calling}\nspec:\n  os: {name: linux}\n  format: cloud-config\n  parts:\n  - name: base\n    commands: [\"true\"]\n  - name: site\n    generator: {name: served}\n",
    )
    .unwrap();
    path
}
