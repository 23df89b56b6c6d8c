//! The render's output budget, crossed by a tenant: a config whose variable is a large text
//! that the template's `join` repeats. The render engine refuses each helper result that
//! cannot fit in what is left of the output before building it (render/src/helpers.rs), so:
//!
//! - the admission webhook's sample render refuses such a config with the size error, and
//!   the replica serving the webhook does not grow by the gigabytes the join would take;
//! - the same join behind an `{{#if}}` that only a real Machine takes (its failure domain
//!   differs from the sample's) passes admission, and the controller's real render fails
//!   with `OutputTooLarge` on that config while its peak memory (VmHWM) stays bounded and
//!   other configs, created before and after, are served.
//!
//! Real kube-apiserver + etcd, the real `bootplate run` serving the webhook over TLS, as the
//! ServiceAccount of deploy/rbac.
//!
//! This module plays Cluster API's Cluster and Machine controllers (`testenv::capi_env`: owner
//! references, an initialized Cluster, a Machine written with its failure domain) only to set
//! the stage: what is measured is bootplate's render and its process's memory, and no Cluster API
//! state is held at a chosen moment. It needs no such fault and could run under the real manager
//! (issue 29).

use std::collections::BTreeMap;
use std::time::Duration;

use crd_types::capi::Machine;
use crd_types::{BootplateConfig, BootstrapTemplate, TemplateKind, TemplateRef};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use testenv::capi_env::{self, NS};
use testenv::controller::ControllerProcess;
use testenv::pki::TestCa;
use testenv::{eventually, fixtures};

/// The separator a tenant passes: 1 MiB minus a little (etcd takes objects up to 1.5 MiB).
const SEPARATOR_BYTES: usize = 1000 * 1000;
/// Items joined: the joined text would be this many times the separator (500 MB).
const ITEMS: usize = 500;
/// The controller's peak resident memory must stay below this. Idle it is a few tens of MiB;
/// one join here would take 500 MB, and handlebars copies a helper's result once more.
const PEAK_BOUND_KIB: u64 = 256 * 1024;

/// A template whose script joins the config's `list` with its `sep`: at the top (`direct`),
/// or only for machines in failure domain `zone-a` (`hidden`: the webhook's sample machine is
/// in `fd-1`).
fn template(name: &str, hidden: bool) -> BootstrapTemplate {
    let join = "{{shell_quote (join values.list values.sep)}}";
    let body = if hidden {
        format!("{{{{#if (eq machine.failureDomain \"zone-a\")}}}}{join}{{{{/if}}}}")
    } else {
        join.to_owned()
    };
    let spec = json!({
        "os": {"name": "linux"},
        "format": "script",
        "variables": [
            {"name": "list", "default": [], "schema": {"type": "array", "items": {"type": "string"}}},
            {"name": "sep", "default": ",", "schema": {"type": "string"}},
        ],
        "template": format!("#!/bin/sh\necho {{{{shell_quote machine.name}}}} {body}\n"),
    });
    let mut template = BootstrapTemplate::new(name, serde_json::from_value(spec).unwrap());
    template.metadata.namespace = Some(NS.into());
    template
}

fn template_ref(name: &str) -> TemplateRef {
    TemplateRef {
        kind: TemplateKind::BootstrapTemplate,
        name: name.into(),
        namespace: None,
    }
}

/// The variables of the hostile config: `ITEMS` items and a separator of `SEPARATOR_BYTES`.
fn hostile_variables() -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([
        ("list".to_owned(), json!(vec!["x"; ITEMS])),
        ("sep".to_owned(), json!("s".repeat(SEPARATOR_BYTES))),
    ])
}

/// The controller's peak resident set size in KiB (`VmHWM` of /proc/PID/status).
fn peak_rss_kib(controller: &ControllerProcess) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", controller.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Registers bootplate's validating webhook for configs and templates at `port`.
async fn register_webhook(client: &kube::Client, port: u16, ca: &TestCa) {
    use base64::Engine as _;
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "bootplate"},
        "webhooks": [{
            "name": "validate.bootstrap.bootplate.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"),
                             "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem)},
            "rules": [{"apiGroups": ["bootstrap.bootplate.dev"], "apiVersions": ["v1alpha1"],
                       "operations": ["CREATE", "UPDATE"],
                       "resources": ["bootstraptemplates", "bootplateconfigs"]}],
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
            "timeoutSeconds": 10,
        }]
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// Creates a Machine in failure domain `zone-a` of Cluster `cluster` and its config with
/// `variables`; the config's create result (the webhook's verdict).
async fn machine_with_config(
    env: &capi_env::Env,
    name: &str,
    template: &str,
    variables: BTreeMap<String, serde_json::Value>,
) -> Result<BootplateConfig, kube::Error> {
    let machine = fixtures::machine(NS, name, "budget", false, name);
    let machine = Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut config = fixtures::owned_config(&machine, template_ref(template));
    config.spec.variables = variables;
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &config)
        .await
}

#[tokio::test]
async fn a_join_bomb_is_refused_at_admission_and_bounded_in_the_controller() {
    let env = capi_env::env().await;
    env.initialized_cluster("budget").await;
    let ca = TestCa::new("bootplate-webhook");
    let cert_dir = env.management.dir().join("webhook-certs");
    ca.write_serving(&cert_dir).unwrap();
    let port = testenv::free_port().unwrap();
    let mut controller = env
        .controller(&[
            &format!("--webhook-addr=127.0.0.1:{port}"),
            "--webhook-cert-dir",
            cert_dir.to_str().unwrap(),
        ])
        .await;
    register_webhook(&env.client, port, &ca).await;
    let templates = Api::<BootstrapTemplate>::namespaced(env.client.clone(), NS);
    for (name, hidden) in [("direct", false), ("hidden", true)] {
        eventually(
            "the webhook admits a valid template",
            Duration::from_secs(30),
            || async {
                let created = templates
                    .create(&PostParams::default(), &template(name, hidden))
                    .await;
                created.map_err(|e| eprintln!("not admitted yet: {e}")).ok()
            },
        )
        .await;
    }
    // A config served before the hostile ones.
    machine_with_config(&env, "before", "direct", BTreeMap::new())
        .await
        .expect("a small config is admitted");
    env.wait_ready("before").await;

    // The join at the top: the webhook's sample render refuses it with the size error.
    let refused = machine_with_config(&env, "direct-bomb", "direct", hostile_variables()).await;
    let Err(refused) = refused else {
        panic!("the webhook admitted the config");
    };
    let message = refused.to_string();
    assert!(
        message.contains("denied the request")
            && message.contains("more than the limit of 1048576 bytes"),
        "{message}"
    );

    // The join behind a condition the sample machine does not meet: admitted, then the real
    // render fails with the size error, on that config only.
    machine_with_config(&env, "hidden-bomb", "hidden", hostile_variables())
        .await
        .expect("the webhook's sample render does not take the branch");
    let message = env.wait_reason("hidden-bomb", "OutputTooLarge").await;
    assert!(
        message.contains("BootstrapTemplate team-a/hidden")
            && message.contains("more than the limit of 1048576 bytes"),
        "{message}"
    );
    assert!(env.secret("hidden-bomb").await.is_none(), "no data Secret");

    // Configs keep being served, and the process is still the one that started.
    machine_with_config(&env, "after", "direct", BTreeMap::new())
        .await
        .expect("a small config is admitted");
    env.wait_ready("after").await;
    env.settled(&controller, "hidden-bomb").await;
    assert!(controller.is_running(), "the controller is still running");
    let peak = peak_rss_kib(&controller);
    assert!(
        peak < PEAK_BOUND_KIB,
        "the controller's peak resident memory was {} MiB",
        peak / 1024
    );
    eprintln!("controller peak RSS: {} MiB", peak / 1024);
}
