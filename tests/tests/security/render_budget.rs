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
//! Real parts: the real-Cluster-API environment (`testenv::capi`: Cluster API's own manager
//! owns the Machines and sets the configs' owners; `bootplate run` under deploy/rbac serving
//! the webhook of deploy/webhook over TLS; a real workload apiserver). Nothing of Cluster API
//! is played: what is measured is bootplate's render and its process's memory.

use std::collections::BTreeMap;
use std::time::Duration;

use crd_types::{
    BootplateConfig, BootplateConfigSpec, BootstrapTemplate, TemplateKind, TemplateRef,
};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use testenv::capi::objects::{self, KUBERNETES_VERSION};
use testenv::capi::{CapiEnv, NS, Options};
use testenv::controller::ControllerProcess;
use testenv::eventually;

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

/// Creates config `name` with `variables` (the webhook's verdict is the result) and, once
/// admitted, a worker Machine for it in failure domain `zone-a` of Cluster `budget`.
async fn machine_with_config(
    env: &CapiEnv,
    name: &str,
    template: &str,
    variables: BTreeMap<String, serde_json::Value>,
) -> Result<(), kube::Error> {
    let mut config = BootplateConfig::new(
        name,
        BootplateConfigSpec {
            template_ref: template_ref(template),
            variables,
            ..Default::default()
        },
    );
    config.metadata.namespace = Some(NS.into());
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &config)
        .await?;
    let mut machine = objects::worker_machine(name, "budget", KUBERNETES_VERSION);
    machine["spec"]["failureDomain"] = json!("zone-a");
    env.apply(&objects::dev_machine_resource(), objects::dev_machine(name))
        .await
        .unwrap();
    env.apply(&objects::machine_resource(), machine)
        .await
        .unwrap();
    Ok(())
}

#[tokio::test]
async fn a_join_bomb_is_refused_at_admission_and_bounded_in_the_controller() {
    let mut env = CapiEnv::start(Options::default())
        .await
        .expect("the real-Cluster-API environment starts");
    env.provider_cluster("budget", KUBERNETES_VERSION, None)
        .await
        .unwrap();
    env.wait_control_plane_initialized("budget").await;
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
    env.wait_user_data("before").await;

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
        message.contains(&format!("BootstrapTemplate {NS}/hidden"))
            && message.contains("more than the limit of 1048576 bytes"),
        "{message}"
    );
    assert!(
        env.data_secret("hidden-bomb").await.is_none(),
        "no data Secret"
    );

    // Configs keep being served, and the process is still the one that started.
    machine_with_config(&env, "after", "direct", BTreeMap::new())
        .await
        .expect("a small config is admitted");
    env.wait_user_data("after").await;
    env.settled("hidden-bomb").await;
    assert!(
        env.bootplate.is_running(),
        "the controller is still running"
    );
    let peak = peak_rss_kib(&env.bootplate);
    assert!(
        peak < PEAK_BOUND_KIB,
        "the controller's peak resident memory was {} MiB",
        peak / 1024
    );
    eprintln!("controller peak RSS: {} MiB", peak / 1024);
}
