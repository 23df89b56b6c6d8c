//! A machine's boot report (docs/boot-channel.md) across the boundary between machines: each
//! joining machine writes its report into the workload cluster with its own bootstrap token,
//! and a machine controls what it writes (it may be hostile, or print a secret).
//!
//! Against a real management apiserver and a real workload apiserver that authenticates
//! bootstrap tokens and authorizes with RBAC (as a kubeadm control plane does), with
//! `bootplate run` under deploy/rbac; the test plays Cluster API (Machine status, nodeRef)
//! because its faults are moments it must hold: a Machine provisioned whose node never shows
//! up past the not-started deadline, a machine that has written a report but not joined, and
//! the join itself, each for as long as a check needs.
//! The machine is the rendered `script` user-data itself, run by bash with its paths moved
//! under a temporary directory: its reporter sends with curl, the token and the CA from the
//! render. One environment for every step, to keep the tier's time short.
//!
//! - another machine's token gets 403 writing this machine's report; its own creates it (201);
//! - a failing command (that prints the token) makes the config `Ready=False`, reason
//!   `BootFailed`, naming the part, the command and the exit status, with the output's end in
//!   a Warning Event and the failure in `bootplate_boot_failures_total`; the token appears in
//!   none of the report, the status and the Events;
//! - a provisioned machine that never reported shows `BootNotStarted`; one that wrote garbage
//!   shows the phase `Unreadable`, and the others are still served;
//! - a tenant's own ConfigMaps labelled for the Cluster's listing (more than two pages, listed
//!   first) do not hide a machine's report;
//! - once the machine joined, its report goes with its token (bootplate deletes the token, the
//!   workload cluster's garbage collector what it owns);
//! - machines whose config sets `delivery: Fetch`: see `fetch_delivery.rs`.

use base64::Engine as _;
use crd_types::ClusterBootstrapTemplate;
use crd_types::capi::{Cluster, Machine};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use testenv::capi_env::{self, Env, NS, WAIT, cluster_template};
use testenv::pki::TestCa;
use testenv::{ApiServer, eventually, fixtures, machine_script};

use super::report_policy::{apply_as, report};

/// `count` ConfigMaps of 40 KiB each in the workload cluster's `kube-system`, labelled with
/// Cluster c1's UID as reports are, named `bootplate-boot-0-decoy-N` (before any config UID in
/// name order): more than two pages of the controller's listing.
async fn labelled_decoys(env: &Env, count: usize) {
    let cluster = Api::<Cluster>::namespaced(env.client.clone(), NS)
        .get("c1")
        .await
        .unwrap();
    let configmaps = Api::<ConfigMap>::namespaced(env.workload_client.clone(), "kube-system");
    for n in 0..count {
        let decoy: ConfigMap = serde_json::from_value(json!({
            "metadata": {
                "name": format!("bootplate-boot-0-decoy-{n:03}"),
                "labels": {
                    "bootstrap.bootplate.dev/boot-report-cluster-uid": cluster.uid().unwrap(),
                },
            },
            "data": {"report": "x".repeat(40 << 10)},
        }))
        .unwrap();
        configmaps
            .create(&PostParams::default(), &decoy)
            .await
            .unwrap();
    }
}

/// A worker template whose `join` part fails, printing the machine's token first.
pub(super) async fn publish_failing_template(client: &Client) {
    let template: ClusterBootstrapTemplate =
        serde_json::from_value(machine_script::failing_join_template("boot")).unwrap();
    Api::<ClusterBootstrapTemplate>::all(client.clone())
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

/// Cluster `c1`, initialized, its endpoint the workload apiserver and its CA `ca`.
pub(super) async fn cluster(env: &Env, ca: &TestCa) {
    env.cluster("c1", false).await;
    let endpoint = json!({"spec": {"controlPlaneEndpoint": {
        "host": "127.0.0.1", "port": env.workload.port()}}});
    Api::<Cluster>::namespaced(env.client.clone(), NS)
        .patch("c1", &PatchParams::default(), &Patch::Merge(&endpoint))
        .await
        .unwrap();
    env.set_cluster_status("c1", true, true).await;
    let data = [
        ("tls.crt", ca.cert_pem.clone()),
        ("tls.key", ca.key_pem.clone()),
    ];
    let secret = fixtures::cluster_secret(NS, "c1", "ca", data);
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Plays Cluster API: Machine `name`'s infrastructure provisioned since long ago.
pub(super) async fn provisioned_long_ago(env: &Env, name: &str) {
    let patch = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "status": {
        "initialization": {"infrastructureProvisioned": true},
        "conditions": [{"type": "InfrastructureReady", "status": "True", "reason": "Ready",
            "message": "provisioned", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .patch_status(
            name,
            &PatchParams::apply("capi-machine-controller").force(),
            &Patch::Apply(&patch),
        )
        .await
        .unwrap();
}

/// The value of a `NAME='value'` line of the user-data.
pub(super) fn shell_value(user_data: &str, name: &str) -> String {
    let prefix = format!("{name}=");
    let line = user_data
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in the user-data"));
    line.trim_matches('\'').to_owned()
}

/// The `Ready` condition's reason and message, and the boot phase, of config `name`.
async fn ready_and_phase(env: &Env, name: &str) -> (String, String, Option<String>) {
    let status = env.config(name).await.status.unwrap_or_default();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    let (reason, message) =
        ready.map_or_else(Default::default, |c| (c.reason.clone(), c.message.clone()));
    (reason, message, status.boot.and_then(|b| b.phase))
}

/// The notes of the Events of reason `reason` about config `name`.
async fn event_notes(client: &Client, name: &str, reason: &str) -> Vec<String> {
    let list = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_reports_its_failed_boot_only_into_its_own_report_and_never_its_token() {
    let ca = TestCa::new("kubernetes");
    let (management, workload) = tokio::join!(ApiServer::start(), ApiServer::start_for_joins(&ca));
    let env = capi_env::with_clusters(management.unwrap(), workload.unwrap()).await;
    // What bootplate makes for a machine goes with its token through the collector.
    let _collector = testenv::joins::garbage_collector(&env.workload).unwrap();
    publish_failing_template(&env.client).await;
    cluster(&env, &ca).await;
    let controller = env.controller(&["--boot-report-interval", "1s"]).await;
    for name in ["w-0", "w-1"] {
        env.machine("c1", name, false, cluster_template("boot"))
            .await;
    }
    for name in ["w-2", "w-3"] {
        super::fetch_delivery::create_machine(&env, name).await;
    }
    let (w0, w1) = (env.wait_ready("w-0").await, env.wait_ready("w-1").await);
    let report_of =
        |config: &crd_types::BootplateConfig| format!("bootplate-boot-{}", config.uid().unwrap());
    let (data0, data1) = (env.user_data("w-0").await, env.user_data("w-1").await);
    let token0 = shell_value(&data0, "BOOTPLATE_REPORT_TOKEN");
    let token1 = shell_value(&data1, "BOOTPLATE_REPORT_TOKEN");
    assert!(
        data0.contains(&format!("--token {token0}")),
        "the join command has the token"
    );

    // A provisioned machine that never reported: BootNotStarted (its Machine's infrastructure
    // has been ready since long before --boot-not-started-after).
    provisioned_long_ago(&env, "w-1").await;
    let message = env.wait_reason("w-1", "BootNotStarted").await;
    assert!(
        message.contains("Machine w-1 has not reported its boot"),
        "{message}"
    );

    // The workload cluster's admission policy: w-1's token cannot write w-0's report; its
    // own, it creates (report_policy.rs tries the rest).
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    let garbage = json!({"report": "bm90IGEgcmVwb3J0"});
    let as_w1 = |config: &crd_types::BootplateConfig, data: &str| {
        let object = report(data, garbage.clone());
        apply_as(
            &env,
            &ca_file,
            &token1,
            ("kube-system", &report_of(config)),
            object,
        )
    };
    assert_eq!(as_w1(&w0, &data0), "403");
    assert_eq!(as_w1(&w1, &data1), "201");
    // What w-1 wrote is not a report: its phase says so; w-0 goes on being served.
    eventually("w-1's report shown unreadable", WAIT, || async {
        let (reason, _, phase) = ready_and_phase(&env, "w-1").await;
        (phase.as_deref() == Some("Unreadable") && reason == "BootReportUnreadable").then_some(())
    })
    .await;

    // The tenant labels ConfigMaps of its own for the Cluster's listing, named to be listed
    // before every real report: they are read page by page and kept by none, and w-0's
    // report, listed after them all, is still read.
    labelled_decoys(&env, 120).await;

    // w-0 boots: its `join` part fails with status 7, after printing its token.
    assert_eq!(
        machine_script::run_script(&data0, dir.path()),
        Some(7),
        "the failing step's status ends the boot"
    );
    let message = env.wait_reason("w-0", "BootFailed").await;
    assert_eq!(
        message,
        "Machine w-0 failed to boot: part `join`, command 0 exited with status 7"
    );
    let (_, _, phase) = ready_and_phase(&env, "w-0").await;
    assert_eq!(phase.as_deref(), Some("Failed"));
    let w0 = env.config("w-0").await;
    assert!(
        w0.status.as_ref().unwrap().ready,
        "the data Secret stays available"
    );
    assert_eq!(
        w0.status
            .as_ref()
            .unwrap()
            .boot
            .as_ref()
            .unwrap()
            .part
            .as_deref(),
        Some("join")
    );
    let notes = eventually("the BootFailed Event of w-0", WAIT, || async {
        let notes = event_notes(&env.client, "w-0", "BootFailed").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(
        notes[0].contains("kubeadm join --token [redacted]: preflight failed"),
        "the Event carries the redacted output: {notes:?}"
    );
    let series =
        r#"bootplate_boot_failures_total{part="join",template="ClusterBootstrapTemplate/boot"}"#;
    assert_eq!(controller.metric(series), Some(1.0));

    // The token is nowhere but in the user-data: not in the report, the status, the Events.
    let report = Api::<ConfigMap>::namespaced(env.workload_client.clone(), "kube-system")
        .get(&report_of(&w0))
        .await
        .unwrap();
    let encoded = &report.data.unwrap()["report"];
    let text = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("failed command 0 7 join"), "{text}");
    let secret_half = token0.split_once('.').unwrap().1;
    let status = serde_json::to_string(&w0.status).unwrap();
    let all_notes = event_notes(&env.client, "w-0", "BootFailed")
        .await
        .join("\n");
    for (what, text) in [
        ("report", &text),
        ("status", &status),
        ("events", &all_notes),
    ] {
        assert!(
            !text.contains(secret_half),
            "the {what} holds the token: {text}"
        );
    }

    // The machine joins: its token goes, and its report objects with it.
    env.set_node_ref("w-0").await;
    eventually(
        "w-0's report objects deleted with its token",
        WAIT,
        || async {
            let cm = Api::<ConfigMap>::namespaced(env.workload_client.clone(), "kube-system")
                .get_opt(&report_of(&w0))
                .await
                .unwrap();
            cm.is_none().then_some(())
        },
    )
    .await;

    super::fetch_delivery::check(&env, &ca, &ca_file, &token1, "w-2").await;
    super::fetch_delivery::check_expired(&env, "w-3").await;
}
