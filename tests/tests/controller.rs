//! The controller against two real apiservers (management and workload) without Cluster API's
//! manager: the test plays CAPI's controllers (`testenv::capi_env`: it sets ownerReferences,
//! infrastructure readiness, ControlPlaneInitialized and nodeRef) because each scenario needs a
//! Cluster or Machine held in one state at a moment it chooses, which Cluster API's manager
//! passes through on its own schedule. What each one injects:
//! - three control planes and five workers: the Cluster held at "infrastructure not
//!   provisioned", then "control plane not initialized" (the init lock, workers waiting, no
//!   token yet), then initialized; a worker's nodeRef set at a chosen point (its token goes).
//! - pause, missing and broken templates: configs held waiting on a missing template, Secret or
//!   a broken template while the Cluster stays initialized, and the Events counted per render
//!   (a Cluster API Machine re-triggering reconciles would change the counts).
//! - namespace and watch-filter scope: a Machine left out of scope (no watch-filter label)
//!   while its config is in scope, so the config must wait on a Machine it cannot see.
//! - restarts (over ready configs, management or workload apiserver restart): the workload
//!   cluster made unreachable or an apiserver killed while configs are in a known state.
//! - init lock from the init Machine's join: the nodeRef set before ControlPlaneInitialized,
//!   an ordering real Cluster API shows only under load.
//! - init lock of a deleted holder: the Cluster held at "not initialized" after its init Machine
//!   is gone (with Cluster API, whether it gets there first depends on that machine's boot).
//! - edited data Secret restored after a restart: the user-data tampered while no controller
//!   runs.
//!
//! What runs under Cluster API's own manager instead is in `capi.rs` (lifecycle, rollouts,
//! pause, remediation, move, pools), `tenancy.rs` and `inplace_capi.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use crd_types::capi::{Cluster, Machine};
use crd_types::{
    BootplateConfig, ClusterBootstrapTemplate, ClusterBootstrapTemplateSpec, ConfigFile,
    FileSource, SecretKeyRef,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use testenv::capi_env::{NS, WAIT, cluster_template, env, field, publish_cluster_template};
use testenv::controller::ControllerProcess;
use testenv::{ApiServer, eventually, fixtures, machine_script};

#[tokio::test]
async fn renders_a_cluster_of_three_control_planes_and_five_workers() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.cluster("c1", false).await;
    let mut controller = env.controller(&["--bootstrap-token-ttl", "60s"]).await;

    let control_planes = ["cp-0", "cp-1", "cp-2"];
    let workers = ["w-0", "w-1", "w-2", "w-3", "w-4"];
    for name in control_planes {
        env.machine("c1", name, true, cluster_template("probe"))
            .await;
    }
    for name in workers {
        env.machine("c1", name, false, cluster_template("probe"))
            .await;
    }
    // Nothing renders before the infrastructure is provisioned.
    env.wait_reason("cp-0", "WaitingForInfrastructure").await;
    env.set_cluster_status("c1", true, false).await;

    // Exactly one control plane renders `init`; the others wait for the lock, workers for the
    // control plane.
    let init = eventually("one init config", WAIT, || async {
        let mut ready = Vec::new();
        for name in control_planes {
            if env.config(name).await.status.is_some_and(|s| s.ready) {
                ready.push(name);
            }
        }
        (ready.len() == 1).then(|| ready[0])
    })
    .await;
    let joiners: Vec<&str> = control_planes.into_iter().filter(|n| *n != init).collect();
    for name in &joiners {
        env.wait_reason(name, "WaitingForInitLock").await;
    }
    for name in workers {
        env.wait_reason(name, "WaitingForControlPlane").await;
    }
    let init_data = env.user_data(init).await;
    assert_eq!(field(&init_data, "role").as_deref(), Some("init"));
    assert!(
        field(&init_data, "token").is_none(),
        "init has no join data"
    );
    assert!(
        init_data.contains("PRIVATE KEY"),
        "init carries the CA keys"
    );
    let lock = Api::<ConfigMap>::namespaced(env.client.clone(), NS)
        .get("c1-lock")
        .await
        .unwrap();
    assert_eq!(lock.data.unwrap()["machine"], init);
    // The certificates were generated (no control-plane provider) and are the ones rendered.
    let ca = env.secret("c1-ca").await.expect("c1-ca generated");
    let ca_cert = String::from_utf8(ca.data.as_ref().unwrap()["tls.crt"].0.clone()).unwrap();
    assert!(init_data.contains(&ca_cert));
    for suffix in ["etcd", "proxy", "sa"] {
        assert!(
            env.secret(&format!("c1-{suffix}")).await.is_some(),
            "c1-{suffix} generated"
        );
    }
    // Still one init once the controller has looked at every joiner again: no second
    // control plane slipped through.
    for name in &joiners {
        env.settled(&controller, name).await;
    }
    for name in &joiners {
        assert!(
            !env.config(name).await.status.unwrap().ready,
            "{name} must wait for the control plane"
        );
    }

    env.set_cluster_status("c1", true, true).await;
    for name in control_planes.iter().chain(&workers) {
        env.wait_ready(name).await;
    }
    let expected_hash = bootplate::pki::ca_cert_hash(&ca_cert).unwrap();
    let tokens = env.tokens().await;
    assert_eq!(
        tokens.len(),
        joiners.len() + workers.len(),
        "one token per joining machine"
    );
    for name in joiners.iter().chain(&workers) {
        let config = env.config(name).await;
        let status = config.status.clone().unwrap();
        assert!(status.ready);
        assert!(status.initialization.unwrap().data_secret_created);
        assert_eq!(status.data_secret_name.as_deref(), Some(*name));
        assert_eq!(
            status.template_revision.as_deref(),
            Some(fixtures::probe_template_spec("v1").revision().as_str())
        );
        for type_ in ["Ready", "DataSecretAvailable"] {
            assert!(
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == type_ && c.status == "True"),
                "{name}: {type_}"
            );
        }

        let secret = env.secret(name).await.unwrap();
        assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
        let data = secret.data.clone().unwrap();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["format", "value"]);
        assert_eq!(data["format"].0, b"cloud-config");
        assert_eq!(secret.labels()["cluster.x-k8s.io/cluster-name"], "c1");
        let owner = &secret.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("BootplateConfig", *name, Some(true))
        );
        assert_eq!(owner.uid, config.uid().unwrap());

        let user_data = env.user_data(name).await;
        let is_worker = workers.contains(name);
        assert_eq!(
            field(&user_data, "role").as_deref(),
            Some(if is_worker {
                "worker"
            } else {
                "control-plane-join"
            })
        );
        assert_eq!(
            user_data.contains("PRIVATE KEY"),
            !is_worker,
            "{name}: private keys only for control planes"
        );
        assert_eq!(field(&user_data, "hash"), Some(expected_hash.clone()));
        assert_eq!(
            field(&user_data, "endpoint").as_deref(),
            Some("10.0.0.10:6443")
        );

        // The token exists in the workload cluster with the kubeadm shape.
        let token = field(&user_data, "token").unwrap();
        let (id, secret_part) = token.split_once('.').unwrap();
        let stored = tokens
            .iter()
            .find(|t| t.name_any() == format!("bootstrap-token-{id}"))
            .expect("token secret in the workload cluster");
        let d = stored.data.clone().unwrap();
        let s = |k: &str| String::from_utf8(d[k].0.clone()).unwrap();
        assert_eq!(s("token-secret"), secret_part);
        assert_eq!(s("usage-bootstrap-signing"), "true");
        assert_eq!(s("usage-bootstrap-authentication"), "true");
        // kubeadm's join group, the boot reports' group and the group naming its config (the
        // report admission policy holds the token to that config's report).
        assert_eq!(
            s("auth-extra-groups"),
            format!(
                "system:bootstrappers:kubeadm:default-node-token,system:bootstrappers:bootplate:reports,system:bootstrappers:bootplate:config:{}",
                config.uid().unwrap()
            )
        );
        let expiry: k8s_openapi::jiff::Timestamp = s("expiration").parse().unwrap();
        let left = expiry
            .duration_since(k8s_openapi::jiff::Timestamp::now())
            .as_secs();
        assert!(
            (1..=61).contains(&left),
            "expiry follows --bootstrap-token-ttl=60s: {left}s left"
        );
    }
    // The init lock is released once the control plane is initialized.
    eventually("init lock released", WAIT, || async {
        Api::<ConfigMap>::namespaced(env.client.clone(), NS)
            .get_opt("c1-lock")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // A steady state writes nothing, however often a config is reconciled.
    let before = written(&env, &workers).await;
    for name in workers {
        env.settled(&controller, name).await;
    }
    let after = written(&env, &workers).await;
    assert_eq!(before, after, "no data secret or status rewritten");

    // A token is extended once half its lifetime is left (by the requeue at that moment: the
    // controller trusts the expiry it wrote until then).
    let w0_token = field(&env.user_data("w-0").await, "token").unwrap();
    let w0_id = w0_token.split_once('.').unwrap().0.to_owned();
    let tokens_api = Api::<Secret>::namespaced(env.workload_client.clone(), "kube-system");
    let expiry_of = |secret: Secret| -> Option<k8s_openapi::jiff::Timestamp> {
        String::from_utf8(secret.data?["expiration"].0.clone())
            .ok()?
            .parse()
            .ok()
    };
    let w0_expiry = expiry_of(
        tokens_api
            .get(&format!("bootstrap-token-{w0_id}"))
            .await
            .unwrap(),
    )
    .expect("w-0's token has an expiry");
    eventually("w-0 token extended", Duration::from_secs(90), || async {
        let secret = tokens_api
            .get(&format!("bootstrap-token-{w0_id}"))
            .await
            .ok()?;
        (expiry_of(secret)? > w0_expiry).then_some(())
    })
    .await;
    assert_eq!(
        field(&env.user_data("w-0").await, "token"),
        Some(w0_token.clone()),
        "refreshing keeps the token"
    );

    // nodeRef on w-1: its token goes away; a template change leaves its Secret alone but
    // re-renders the machines that have not bootstrapped yet.
    let w1_token = field(&env.user_data("w-1").await, "token").unwrap();
    env.set_node_ref("w-1").await;
    let w1_name = format!("bootstrap-token-{}", w1_token.split_once('.').unwrap().0);
    eventually("w-1 token deleted", WAIT, || async {
        tokens_api
            .get_opt(&w1_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let w1_before = env.user_data("w-1").await;

    // Kill the controller without warning, change the template, restart: the new controller
    // re-renders with the tokens it finds by label, and creates no second token.
    controller.kill();
    publish_cluster_template(&env.client, "probe", "v2").await;
    let mut controller = env.controller(&["--bootstrap-token-ttl", "60s"]).await;
    eventually("w-2 re-rendered with the new revision", WAIT, || async {
        env.user_data("w-2").await.contains("# v2").then_some(())
    })
    .await;
    for name in ["w-0", "w-2", "w-3", "w-4"] {
        eventually(&format!("{name} re-rendered"), WAIT, || async {
            env.user_data(name).await.contains("# v2").then_some(())
        })
        .await;
    }
    assert_eq!(
        env.user_data("w-1").await,
        w1_before,
        "a bootstrapped machine's Secret is never rewritten"
    );
    let tokens = env.tokens().await;
    let mut per_config: BTreeMap<String, usize> = BTreeMap::new();
    for token in &tokens {
        *per_config
            .entry(token.labels()["bootstrap.bootplate.dev/config-uid"].clone())
            .or_default() += 1;
    }
    assert!(
        per_config.values().all(|n| *n == 1),
        "one token per config after a restart: {per_config:?}"
    );
    assert_eq!(
        tokens.len(),
        joiners.len() + workers.len() - 1,
        "w-1's token stays deleted"
    );
    assert_eq!(
        field(&env.user_data("w-0").await, "token"),
        Some(w0_token),
        "w-0 keeps its token across the restart"
    );
    let config = env.config("w-1").await;
    assert_eq!(
        config.status.unwrap().template_revision.as_deref(),
        Some(fixtures::probe_template_spec("v1").revision().as_str())
    );

    // A restart over ready configs writes nothing: no status, no data Secret, no token, no
    // Event (the data Secrets' hints stand in for the memory the old process had).
    let everyone: Vec<&str> = control_planes.iter().chain(&workers).copied().collect();
    for name in &everyone {
        env.wait_ready(name).await;
    }
    controller.terminate().unwrap();
    let untouched = Untouched::take(&env, &everyone).await;
    let tokens_before = token_names(&env).await;
    let restarted = env.controller(&["--bootstrap-token-ttl", "60s"]).await;
    untouched.check(&env, &restarted).await;
    assert_eq!(
        token_names(&env).await,
        tokens_before,
        "no token created or deleted"
    );
}

/// The names of the bootstrap token Secrets in the workload cluster, sorted.
async fn token_names(env: &testenv::capi_env::Env) -> Vec<String> {
    let mut names: Vec<String> = env.tokens().await.iter().map(|t| t.name_any()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn pause_missing_and_broken_templates() {
    let env = env().await;
    publish_cluster_template(&env.client, "good", "good").await;
    env.cluster("paused", true).await;
    env.cluster("live", false).await;
    env.set_cluster_status("paused", true, true).await;
    env.set_cluster_status("live", true, true).await;
    env.cluster_ca("paused").await;
    env.cluster_ca("live").await;
    let controller = env.controller(&[]).await;

    // Paused cluster: nothing is written until it is unpaused.
    env.machine("paused", "p-0", false, cluster_template("good"))
        .await;
    env.wait_reason("p-0", "Paused").await;
    let config = env.config("p-0").await;
    assert!(
        config
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "Paused" && c.status == "True")
    );
    env.settled(&controller, "p-0").await;
    assert!(
        env.secret("p-0").await.is_none(),
        "no data secret while paused"
    );
    assert!(env.tokens().await.is_empty(), "no token while paused");
    Api::<Cluster>::namespaced(env.client.clone(), NS)
        .patch(
            "paused",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    env.wait_ready("p-0").await;
    let config = env.config("p-0").await;
    assert!(
        config
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "Paused" && c.status == "False")
    );

    // Missing template: TemplateNotFound, then ready once it is published, without a restart.
    env.machine("live", "m-0", false, cluster_template("later"))
        .await;
    let message = env.wait_reason("m-0", "TemplateNotFound").await;
    assert!(
        message.contains("ClusterBootstrapTemplate later"),
        "{message}"
    );
    let config = env.config("m-0").await;
    assert!(
        config
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "DataSecretAvailable"
                && c.status == "False"
                && c.reason == "TemplateNotFound")
    );
    publish_cluster_template(&env.client, "later", "later").await;
    env.wait_ready("m-0").await;
    assert!(env.user_data("m-0").await.contains("# later"));

    // A contentFrom Secret created after its config: FileSourceError, then ready once the
    // Secret exists (such Secrets are not watched: the config is retried every 30 s).
    let machine = Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(
            &PostParams::default(),
            &fixtures::machine(NS, "f-0", "live", false, "f-0"),
        )
        .await
        .unwrap();
    let config = fixtures::owned_config(&machine, cluster_template("later"));
    create_with_secret_file(&env, config, "/etc/late.conf", "late-file").await;
    let message = env.wait_reason("f-0", "FileSourceError").await;
    assert!(
        message.contains("spec.files[0].contentFrom.secret")
            && message.contains("Secret team-a/late-file not found"),
        "{message}"
    );
    assert!(env.secret("f-0").await.is_none(), "no data Secret yet");
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: fixtures::meta(Some(NS), "late-file"),
                string_data: Some(BTreeMap::from([(
                    "content".to_owned(),
                    "late = true\n".to_owned(),
                )])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    env.wait_ready("f-0").await;

    // Broken template: Valid=False with the position; its configs fail naming it; a config on
    // another template still becomes ready.
    let mut broken = fixtures::probe_template_spec("broken");
    broken.template =
        Some("#!/bin/bash\necho ok\necho {{machine.name}} {{ machine..name }}\n".into());
    let api: Api<ClusterBootstrapTemplate> = Api::all(env.client.clone());
    api.create(
        &PostParams::default(),
        &ClusterBootstrapTemplate::new("broken", ClusterBootstrapTemplateSpec(broken)),
    )
    .await
    .unwrap();
    let valid = eventually("broken template reported invalid", WAIT, || async {
        let template = api.get("broken").await.ok()?;
        template
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "False")
    })
    .await;
    assert_eq!(valid.reason, "Invalid");
    // The cluster-scoped template gets its Warning Event too.
    let template_event = testenv::events::wait_for(
        &env.client,
        None,
        "broken",
        "the broken template's Event",
        |e| {
            e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ClusterBootstrapTemplate")
        },
    )
    .await;
    assert_eq!(template_event.type_.as_deref(), Some("Warning"));
    assert_eq!(template_event.reason.as_deref(), Some("Invalid"));
    assert!(
        template_event
            .note
            .as_deref()
            .is_some_and(|n| n.contains("line 3, column")),
        "{template_event:?}"
    );
    assert!(
        valid.message.contains("spec.template"),
        "names the field: {}",
        valid.message
    );
    assert!(
        valid.message.contains("line 3, column"),
        "names the line and column: {}",
        valid.message
    );
    let good = eventually("good template valid", WAIT, || async {
        let template = api.get("good").await.ok()?;
        template
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "True")
    })
    .await;
    assert_eq!(good.reason, "Valid");

    env.machine("live", "m-1", false, cluster_template("broken"))
        .await;
    env.machine("live", "m-2", false, cluster_template("good"))
        .await;
    let message = env.wait_reason("m-1", "TemplateInvalid").await;
    assert!(
        message.contains("ClusterBootstrapTemplate broken"),
        "{message}"
    );
    env.wait_ready("m-2").await;

    // Fixing the template makes its config ready without a restart.
    publish_cluster_template(&env.client, "broken", "fixed").await;
    env.wait_ready("m-1").await;
    assert!(env.user_data("m-1").await.contains("# fixed"));

    // Events on the config tell the story: waiting (why), render failed, token created, rendered.
    let events = eventually("events of m-1 and m-0", WAIT, || async {
        let (m1, m0) = (
            summaries(&env.client, "m-1").await,
            summaries(&env.client, "m-0").await,
        );
        let has = |events: &[(String, String, String)], reason: &str| {
            events.iter().any(|e| e.0 == reason)
        };
        (has(&m1, "TemplateInvalid") && has(&m1, "Rendered") && has(&m0, "TemplateNotFound"))
            .then_some((m1, m0))
    })
    .await;
    let (m1, m0) = events;
    let invalid = m1.iter().find(|e| e.0 == "TemplateInvalid").unwrap();
    assert_eq!(invalid.1, "Warning");
    assert!(
        invalid.2.contains("ClusterBootstrapTemplate broken"),
        "{invalid:?}"
    );
    // One Event per render, naming the token that render created.
    let rendered: Vec<_> = m1.iter().filter(|e| e.0 == "Rendered").collect();
    let m1_token = field(&env.user_data("m-1").await, "token").unwrap();
    let m1_token_id = m1_token.split_once('.').unwrap().0;
    assert_eq!(rendered.len(), 1, "{m1:?}");
    assert_eq!(rendered[0].1, "Normal");
    assert!(
        rendered[0].2.contains("ClusterBootstrapTemplate broken")
            && rendered[0].2.contains(&format!(
                "bootstrap token {m1_token_id} created in the workload cluster"
            )),
        "{:?}",
        rendered[0]
    );
    assert!(
        !rendered[0].2.contains(&m1_token),
        "the token's secret half is never in an Event"
    );
    let waiting = m0.iter().find(|e| e.0 == "TemplateNotFound").unwrap();
    assert_eq!(waiting.1, "Normal", "waiting is not a warning");
    assert!(
        waiting.2.contains("ClusterBootstrapTemplate later"),
        "{waiting:?}"
    );
    for (reason, _, note) in m1.iter().chain(&m0) {
        assert!(!note.contains("PRIVATE KEY"), "{reason}: {note}");
    }
    network_input_the_template_ignores(&env, &controller).await;
}

/// A config that sets network input (spec.network) on a template that takes none (the probe
/// template) still renders and stays ready, and says so: `NetworkApplied=False` with reason
/// `NetworkIgnored` naming the template and the fields, one Warning Event and one count of
/// `bootplate_network_ignored_total` per change (not per reconcile), nothing once the input
/// is gone.
async fn network_input_the_template_ignores(
    env: &testenv::capi_env::Env,
    controller: &ControllerProcess,
) {
    let machine = Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(
            &PostParams::default(),
            &fixtures::machine(NS, "n-0", "live", false, "n-0"),
        )
        .await
        .unwrap();
    let mut config = fixtures::owned_config(&machine, cluster_template("good"));
    config.spec.network = Some(
        serde_json::from_value(json!({"proxy": {"http": "http://proxy.example:3128"},
            "ntpServers": ["ntp.example"]}))
        .unwrap(),
    );
    let configs = Api::<BootplateConfig>::namespaced(env.client.clone(), NS);
    configs
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let network = |wanted: &'static str| async move {
        let wait = format!("n-0's NetworkApplied condition naming {wanted}");
        eventually(&wait, WAIT, || async {
            let status = env.config("n-0").await.status?;
            let c = status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "NetworkApplied");
            match c {
                None if wanted.is_empty() => Some(None),
                Some(c) if !wanted.is_empty() && c.message.contains(wanted) => Some(Some(c)),
                _ => None,
            }
        })
        .await
    };
    env.wait_ready("n-0").await;
    let c = network("spec.network.proxy, spec.network.ntpServers")
        .await
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NetworkIgnored")
    );
    assert!(
        c.message
            .contains("template ClusterBootstrapTemplate good takes no network input"),
        "{}",
        c.message
    );
    let series = "bootplate_network_ignored_total{template=\"ClusterBootstrapTemplate/good\"}";
    let told = |count: usize| async move {
        let wait = format!("{count} NetworkIgnored Event(s) of n-0");
        eventually(&wait, WAIT, || async {
            let events = summaries(&env.client, "n-0").await;
            let ignored: Vec<_> = events
                .into_iter()
                .filter(|e| e.0 == "NetworkIgnored")
                .collect();
            (ignored.len() >= count).then_some(ignored)
        })
        .await
    };
    let first = told(1).await;
    assert_eq!(
        (first[0].1.as_str(), first[0].2.as_str()),
        ("Warning", c.message.as_str())
    );
    // Another reconcile that finds the same says nothing new.
    env.settled(controller, "n-0").await;
    assert_eq!(
        told(1).await.len(),
        1,
        "one Event per change, not per reconcile"
    );
    assert_eq!(controller.metric(series), Some(1.0));
    assert!(
        env.config("n-0").await.status.unwrap().ready,
        "the config stays ready"
    );
    // A change of what is ignored is told again.
    let patch = json!({"spec": {"network": {"proxy": null}}});
    configs
        .patch("n-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    network("spec.network.ntpServers not applied").await;
    assert_eq!(told(2).await.len(), 2);
    eventually("the metric counts the change", WAIT, || async {
        (controller.metric(series) == Some(2.0)).then_some(())
    })
    .await;
    // Without the input, the condition goes.
    let patch = json!({"spec": {"network": null}});
    configs
        .patch("n-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    network("").await;
}

/// The Events regarding config `name`: (reason, type, note) each.
async fn summaries(client: &kube::Client, name: &str) -> Vec<(String, String, String)> {
    let events = testenv::events::regarding(client, Some(NS), name).await;
    events
        .into_iter()
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.type_.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// The resourceVersions of each named config's data Secret and of the config itself.
/// What the controller wrote for each config: its data Secret's resourceVersion and its
/// status. (Not the config's resourceVersion: `Env::settled` changes that.)
async fn written(env: &testenv::capi_env::Env, names: &[&str]) -> Vec<(String, String)> {
    futures::future::join_all(names.iter().map(|n| async {
        let secret = env.secret(n).await.unwrap().resource_version().unwrap();
        let status = serde_json::to_string(&env.config(n).await.status).unwrap();
        (secret, status)
    }))
    .await
}

/// Adds the `cluster.x-k8s.io/watch-filter` label to an object.
async fn label_for<K>(api: &Api<K>, name: &str, value: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"labels": {"cluster.x-k8s.io/watch-filter": value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn namespace_and_watch_filter_scope_the_controller() {
    use crd_types::BootplateConfig;
    use crd_types::capi::Cluster;
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    let controller = env
        .controller(&["--namespace", NS, "--watch-filter", "blue"])
        .await;
    let clusters = Api::<Cluster>::namespaced(env.client.clone(), NS);
    let machines = Api::<Machine>::namespaced(env.client.clone(), NS);
    let configs = Api::<BootplateConfig>::namespaced(env.client.clone(), NS);
    for name in ["blue", "red"] {
        env.cluster(name, false).await;
        env.set_cluster_status(name, true, true).await;
        env.cluster_ca(name).await;
    }
    label_for(&clusters, "blue", "blue").await;
    env.machine("blue", "b-0", false, cluster_template("probe"))
        .await;
    env.machine("red", "r-0", false, cluster_template("probe"))
        .await;
    env.machine("blue", "b-1", false, cluster_template("probe"))
        .await;
    label_for(&machines, "b-0", "blue").await;
    label_for(&configs, "b-0", "blue").await;
    // b-1 carries the label on its config only: its Machine is out of scope.
    label_for(&configs, "b-1", "blue").await;

    // The same objects, labelled, in another namespace.
    fixtures::namespace(&env.client, "team-b").await.unwrap();
    let mut cluster = fixtures::cluster("team-b", "blue");
    cluster.metadata.labels = Some(BTreeMap::from([(
        "cluster.x-k8s.io/watch-filter".to_owned(),
        "blue".to_owned(),
    )]));
    Api::<Cluster>::namespaced(env.client.clone(), "team-b")
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let machine = fixtures::machine("team-b", "b-0", "blue", false, "b-0");
    let machine = Api::<Machine>::namespaced(env.client.clone(), "team-b")
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut config = fixtures::owned_config(&machine, cluster_template("probe"));
    config
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("cluster.x-k8s.io/watch-filter".into(), "blue".into());
    let other_ns = Api::<BootplateConfig>::namespaced(env.client.clone(), "team-b");
    other_ns
        .create(&PostParams::default(), &config)
        .await
        .unwrap();

    env.wait_ready("b-0").await;
    let message = env.wait_reason("b-1", "WaitingForMachine").await;
    assert!(message.contains("b-1"), "{message}");
    // The config watch delivers in order: once the controller reconciled a config changed
    // after r-0 and the team-b config were created, it would have seen those too.
    env.settled(&controller, "b-1").await;
    assert!(
        env.config("r-0").await.status.is_none(),
        "a config without the watch-filter label is not touched"
    );
    assert!(env.secret("r-0").await.is_none());
    let outside = other_ns.get("b-0").await.unwrap();
    assert!(
        outside.status.is_none(),
        "a config outside --namespace is not touched"
    );
}

#[tokio::test]
async fn a_restart_over_ready_configs_needs_nothing_from_the_workload_cluster() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.cluster("r1", false).await;
    let mut controller = env.controller(&[]).await;
    env.machine("r1", "r-cp", true, cluster_template("probe"))
        .await;
    for name in ["r-w0", "r-w1"] {
        env.machine("r1", name, false, cluster_template("probe"))
            .await;
    }
    env.set_cluster_status("r1", true, false).await;
    env.wait_ready("r-cp").await;
    env.set_cluster_status("r1", true, true).await;
    let names = ["r-cp", "r-w0", "r-w1"];
    for name in names {
        env.wait_ready(name).await;
    }
    controller.terminate().unwrap();
    let untouched = Untouched::take(&env, &names).await;

    // The workload cluster becomes unreachable while the controller is down.
    let server = format!("https://127.0.0.1:{}", env.workload.port());
    let nowhere = env
        .workload
        .kubeconfig_yaml()
        .replace(&server, "https://127.0.0.1:1");
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .patch(
            "r1-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"value": nowhere}})),
        )
        .await
        .unwrap();

    // The restarted controller finds every config as it left it (the data Secrets' hints:
    // same inputs, tokens young enough) and asks the workload cluster nothing, so nothing
    // fails and nothing is written.
    let restarted = env.controller(&[]).await;
    untouched.check(&env, &restarted).await;

    // The control: a config that does need the workload cluster now fails, with its reason.
    env.machine("r1", "r-w2", false, cluster_template("probe"))
        .await;
    let message = env.wait_reason("r-w2", "BootstrapTokenError").await;
    assert!(message.contains("Cluster team-a/r1"), "{message}");
}

/// What a restart over ready configs must leave alone: the configs' and their data Secrets'
/// resourceVersions, and the Events.
struct Untouched {
    names: Vec<String>,
    versions: Vec<(String, String)>,
    events: usize,
}

impl Untouched {
    async fn take(env: &testenv::capi_env::Env, names: &[&str]) -> Untouched {
        Untouched {
            names: names.iter().map(|n| n.to_string()).collect(),
            versions: written(env, names).await,
            events: event_count(env).await,
        }
    }

    /// Waits until `restarted` has reconciled every config, then checks nothing was written.
    async fn check(&self, env: &testenv::capi_env::Env, restarted: &ControllerProcess) {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        eventually(
            "every config reconciled after the restart",
            WAIT,
            || async { (restarted.config_reconciles() >= names.len() as u64).then_some(()) },
        )
        .await;
        for name in &names {
            env.settled(restarted, name).await;
        }
        assert_eq!(
            written(env, &names).await,
            self.versions,
            "no status or data Secret written after the restart"
        );
        assert_eq!(
            event_count(env).await,
            self.events,
            "no Event after the restart"
        );
    }
}

/// A restart after joins writes nothing to the workload cluster. The workload apiserver enforces
/// ValidatingAdmissionPolicy, so the reports take the shared way: the cluster holds one report
/// grant for all its machines, each token carries its config's group, and bootplate writes no
/// per-machine object (the machine creates its own report; these machines do not boot). The
/// joined machines' tokens are deleted; the restarted process runs the join clean-up again (its
/// memory of it is gone, the tokens could still be live), finds no token and deletes nothing
/// more. The workload apiserver's audit log is the evidence.
#[tokio::test]
async fn a_restart_after_joins_writes_nothing_to_the_workload_cluster() {
    let (management, workload) = tokio::join!(ApiServer::start(), ApiServer::start_audited());
    let env = testenv::capi_env::with_clusters(management.unwrap(), workload.unwrap()).await;
    let template: ClusterBootstrapTemplate =
        serde_json::from_value(machine_script::failing_join_template("reports")).unwrap();
    Api::<ClusterBootstrapTemplate>::all(env.client.clone())
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    env.initialized_cluster("j1").await;
    let mut controller = env.controller(&[]).await;
    let names = ["j-w0", "j-w1"];
    for name in names {
        env.machine("j1", name, false, cluster_template("reports"))
            .await;
    }
    let mut config_uids = Vec::new();
    for name in names {
        config_uids.push(env.wait_ready(name).await.uid().unwrap());
    }
    assert_shared_report_grant(&env, &config_uids).await;
    for name in names {
        env.set_node_ref(name).await;
    }
    eventually("the joined machines' tokens deleted", WAIT, || async {
        env.tokens()
            .await
            .iter()
            .all(|t| !t.name_any().starts_with("bootstrap-token-"))
            .then_some(())
    })
    .await;
    controller.terminate().unwrap();
    let log = env.workload.audit_log();
    let before = std::fs::metadata(&log).unwrap().len() as usize;

    let restarted = env.controller(&[]).await;
    eventually(
        "both configs reconciled after the restart",
        WAIT,
        || async { (restarted.config_reconciles() >= names.len() as u64).then_some(()) },
    )
    .await;
    let audit = std::fs::read(&log).unwrap();
    let writes: Vec<String> = String::from_utf8_lossy(&audit[before..])
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| {
            let verb = entry["verb"].as_str().unwrap_or_default();
            entry["stage"] == "ResponseComplete"
                && entry["user"]["username"] != "system:apiserver"
                && ["create", "update", "patch", "delete", "deletecollection"].contains(&verb)
        })
        .map(|entry| format!("{} {}", entry["verb"], entry["requestURI"]))
        .collect();
    assert!(writes.is_empty(), "writes after the restart: {writes:#?}");
}

/// The workload cluster holds the shared report grant (the admission policy, its binding, the
/// Role and its RoleBinding, once), each config's token names the config in its groups, and no
/// report, Role or RoleBinding was made for a machine.
async fn assert_shared_report_grant(env: &testenv::capi_env::Env, config_uids: &[String]) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let shared = "bootplate-boot-reports";
    let client = &env.workload_client;
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .get(shared)
        .await
        .expect("the report admission policy is in place");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .get(shared)
        .await
        .expect("the report admission policy is bound");
    let roles: Api<Role> = Api::namespaced(client.clone(), "kube-system");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), "kube-system");
    roles.get(shared).await.expect("the shared report Role");
    let binding = bindings.get(shared).await.expect("the shared RoleBinding");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0].name, "system:bootstrappers:bootplate:reports");
    let per_machine = |name: &str| name.starts_with("bootplate-boot-") && name != shared;
    let made_for_machines: Vec<String> = (roles.list(&Default::default()).await.unwrap().items)
        .iter()
        .map(|r| r.name_any())
        .chain(
            (bindings.list(&Default::default()).await.unwrap().items)
                .iter()
                .map(|b| b.name_any()),
        )
        .chain(
            (Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
                .list(&Default::default())
                .await
                .unwrap()
                .items)
                .iter()
                .map(|c| c.name_any()),
        )
        .filter(|name| per_machine(name))
        .collect();
    assert!(
        made_for_machines.is_empty(),
        "per-machine objects: {made_for_machines:?}"
    );
    let groups: Vec<String> = (env.tokens().await.iter())
        .filter(|t| t.name_any().starts_with("bootstrap-token-"))
        .filter_map(|t| t.data.as_ref()?.get("auth-extra-groups").cloned())
        .map(|groups| String::from_utf8_lossy(&groups.0).into_owned())
        .collect();
    for uid in config_uids {
        let group = format!("system:bootstrappers:bootplate:config:{uid}");
        assert!(
            groups.iter().any(|g| g.split(',').any(|g| g == group)),
            "a token carries {group}: {groups:?}"
        );
    }
}

async fn event_count(env: &testenv::capi_env::Env) -> usize {
    Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len()
}

#[tokio::test]
async fn the_controller_carries_on_across_a_management_apiserver_restart() {
    let mut env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.initialized_cluster("a1").await;
    let mut controller = env.controller(&[]).await;
    for name in ["a-w0", "a-w1"] {
        env.machine("a1", name, false, cluster_template("probe"))
            .await;
    }
    for name in ["a-w0", "a-w1"] {
        env.wait_ready(name).await;
    }

    // Every watch breaks, and the new apiserver's watch cache starts over, so the controller's
    // watchers list again. What changes before they are back must not be missed: a config
    // created and one deleted right after the restart.
    env.management.restart_apiserver().await.unwrap();
    env.machine("a1", "a-w2", false, cluster_template("probe"))
        .await;
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .delete("a-w1", &Default::default())
        .await
        .unwrap();
    env.wait_ready("a-w2").await;
    assert_eq!(
        field(&env.user_data("a-w2").await, "role").as_deref(),
        Some("worker")
    );
    eventually("the deleted config no longer counted", WAIT, || async {
        (controller.metric("bootplate_configs{state=\"ready\"}") == Some(2.0)).then_some(())
    })
    .await;
    assert!(controller.is_running(), "{}", controller.log());
}

#[tokio::test]
async fn a_workload_apiserver_restart_fails_no_render() {
    let mut env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.initialized_cluster("b1").await;
    let controller = env.controller(&[]).await;
    env.machine("b1", "b-w0", false, cluster_template("probe"))
        .await;
    env.wait_ready("b-w0").await;

    // The controller's pooled connections to the workload cluster die with its apiserver; the
    // next machine's token must not fail on one of them (that would cost it a 30 s wait).
    env.workload.restart_apiserver().await.unwrap();
    env.machine("b1", "b-w1", false, cluster_template("probe"))
        .await;
    env.wait_ready("b-w1").await;
    assert_eq!(
        env.tokens().await.len(),
        2,
        "a token for each machine in the restarted workload cluster"
    );
    assert_eq!(
        controller
            .metric("bootplate_bootstrap_tokens_total{action=\"error\"}")
            .unwrap_or(0.0),
        0.0,
        "no token operation failed: {}",
        controller.log()
    );
}

/// Cluster API's Machine controller can set the init Machine's nodeRef before the Cluster reports
/// its control plane initialized. The lock must hold until the Cluster says so: a second
/// control-plane machine meanwhile decides from that same Cluster, and a lock released at the
/// join let it render a second `init` (seen on real Cluster API under load).
#[tokio::test]
async fn init_lock_holds_from_the_init_machines_join_until_the_control_plane_is_initialized() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.cluster("n1", false).await;
    env.set_cluster_status("n1", true, false).await;
    let _controller = env.controller(&[]).await;
    env.machine("n1", "n-cp", true, cluster_template("probe"))
        .await;
    env.wait_ready("n-cp").await;
    let locks = Api::<ConfigMap>::namespaced(env.client.clone(), NS);
    env.set_node_ref("n-cp").await;
    env.machine("n1", "n-cp-2", true, cluster_template("probe"))
        .await;
    let waiting = env.wait_reason("n-cp-2", "WaitingForInitLock").await;
    assert!(waiting.contains("n-cp"), "{waiting}");
    let lock = locks.get("n1-lock").await.expect("the lock is held");
    assert_eq!(lock.data.unwrap()["machine"], "n-cp");

    env.set_cluster_status("n1", true, true).await;
    eventually("init lock released", WAIT, || async {
        locks
            .get_opt("n1-lock")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    env.wait_ready("n-cp-2").await;
    let joined = env.user_data("n-cp-2").await;
    assert_eq!(
        field(&joined, "role").as_deref(),
        Some("control-plane-join"),
        "one init only"
    );
}

/// Creates `config` with one file at `path` whose content comes from key `content` of Secret
/// `secret` in the config's namespace.
async fn create_with_secret_file(
    env: &testenv::capi_env::Env,
    mut config: BootplateConfig,
    path: &str,
    secret: &str,
) {
    config.spec.files = vec![ConfigFile {
        path: path.into(),
        content_from: Some(FileSource {
            secret: SecretKeyRef {
                name: secret.into(),
                key: "content".into(),
                namespace: None,
            },
        }),
        ..Default::default()
    }];
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// The lock as it is now, by key.
async fn lock_data(env: &testenv::capi_env::Env, name: &str) -> BTreeMap<String, String> {
    Api::<ConfigMap>::namespaced(env.client.clone(), NS)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("the lock {name}: {e}"))
        .data
        .unwrap_or_default()
}

/// The init Machine deleted after it was handed its `init` data, before the Cluster reports its
/// control plane initialized (the test holds the Cluster there, as Cluster API would while that
/// machine's `kubeadm init` runs): its instance may have initialized a control plane, so the lock
/// is never handed over by itself, not to another control-plane Machine, not to a Machine
/// created again under the holder's name. Both show `InitHolderGone` naming the holder and the
/// lock, with a Warning Event and the `failed` count; no second `init` data is written. Deleting
/// the lock (what the message asks, once the instance is known gone) lets exactly one initialize.
#[tokio::test]
async fn init_lock_is_never_handed_over_once_its_holder_got_its_data() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.cluster("h1", false).await;
    env.set_cluster_status("h1", true, false).await;
    let controller = env.controller(&[]).await;
    env.machine("h1", "h-cp", true, cluster_template("probe"))
        .await;
    env.wait_ready("h-cp").await;
    let machines = Api::<Machine>::namespaced(env.client.clone(), NS);
    let holder_uid = machines.get("h-cp").await.unwrap().uid().unwrap();
    let lock = lock_data(&env, "h1-lock").await;
    assert_eq!(lock["machine"], "h-cp");
    assert_eq!(lock["machineUID"], holder_uid);
    assert_eq!(
        lock["initDataHandedOut"], "true",
        "recorded before the data"
    );
    env.machine("h1", "h-cp-2", true, cluster_template("probe"))
        .await;
    env.wait_reason("h-cp-2", "WaitingForInitLock").await;

    machines.delete("h-cp", &Default::default()).await.unwrap();
    let message = env.wait_reason("h-cp-2", "InitHolderGone").await;
    for needle in [
        "Machine h-cp,",
        "Cluster h1",
        "delete ConfigMap team-a/h1-lock",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message}");
    }
    let event = testenv::events::wait_reason(&env.client, NS, "h-cp-2", "InitHolderGone").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // A Machine created again under the holder's name is another machine.
    let configs = Api::<BootplateConfig>::namespaced(env.client.clone(), NS);
    configs.delete("h-cp", &Default::default()).await.unwrap();
    eventually("the old config gone", WAIT, || async {
        configs
            .get_opt("h-cp")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    env.machine("h1", "h-cp", true, cluster_template("probe"))
        .await;
    env.wait_reason("h-cp", "InitHolderGone").await;
    eventually("both counted failed", WAIT, || async {
        (controller.metric("bootplate_configs{state=\"failed\"}") == Some(2.0)).then_some(())
    })
    .await;
    assert!(env.secret("h-cp-2").await.is_none(), "no data for h-cp-2");
    // (The old h-cp's data Secret stays: nothing here collects what its config owned.)
    let status = env.config("h-cp").await.status.unwrap_or_default();
    assert!(
        !status.ready && status.data_secret_name.is_none(),
        "no data for the new h-cp: {status:?}"
    );
    assert_eq!(lock_data(&env, "h1-lock").await["machineUID"], holder_uid);

    // The way out: the lock deleted, one of them initializes, the other waits for it.
    Api::<ConfigMap>::namespaced(env.client.clone(), NS)
        .delete("h1-lock", &Default::default())
        .await
        .unwrap();
    let init = eventually("one new init", WAIT, || async {
        for name in ["h-cp", "h-cp-2"] {
            if env.config(name).await.status.is_some_and(|s| s.ready) {
                return Some(name);
            }
        }
        None
    })
    .await;
    assert_eq!(
        field(&env.user_data(init).await, "role").as_deref(),
        Some("init")
    );
    let other = if init == "h-cp" { "h-cp-2" } else { "h-cp" };
    env.wait_reason(other, "WaitingForInitLock").await;
    assert_eq!(lock_data(&env, "h1-lock").await["machine"], init);
}

/// The init Machine deleted before it was handed any data (here its config waits for a
/// `contentFrom` Secret, after taking the lock): no instance can have run `kubeadm init`, so the
/// next control-plane Machine takes the lock over and initializes.
#[tokio::test]
async fn init_lock_is_taken_over_from_a_holder_gone_before_its_data() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.cluster("t1", false).await;
    env.set_cluster_status("t1", true, false).await;
    let _controller = env.controller(&[]).await;
    let machines = Api::<Machine>::namespaced(env.client.clone(), NS);
    let machine = machines
        .create(
            &PostParams::default(),
            &fixtures::machine(NS, "t-cp", "t1", true, "t-cp"),
        )
        .await
        .unwrap();
    let config = fixtures::owned_config(&machine, cluster_template("probe"));
    create_with_secret_file(&env, config, "/etc/missing.conf", "missing").await;
    env.wait_reason("t-cp", "FileSourceError").await;
    let lock = lock_data(&env, "t1-lock").await;
    assert_eq!(
        (lock["machine"].as_str(), lock["initDataHandedOut"].as_str()),
        ("t-cp", "false")
    );
    env.machine("t1", "t-cp-2", true, cluster_template("probe"))
        .await;
    env.wait_reason("t-cp-2", "WaitingForInitLock").await;
    machines.delete("t-cp", &Default::default()).await.unwrap();
    env.wait_ready("t-cp-2").await;
    assert_eq!(
        field(&env.user_data("t-cp-2").await, "role").as_deref(),
        Some("init")
    );
    assert_eq!(lock_data(&env, "t1-lock").await["machine"], "t-cp-2");
}

#[tokio::test]
async fn edited_data_secret_value_is_restored_after_a_restart() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.initialized_cluster("e1").await;
    let mut controller = env.controller(&[]).await;
    env.machine("e1", "e-0", false, cluster_template("probe"))
        .await;
    env.wait_ready("e-0").await;
    let rendered = env.user_data("e-0").await;
    controller.terminate().unwrap();

    // Someone edits the user-data while no controller runs, keeping every annotation (the
    // restart hints among them).
    let tampered = "#cloud-config\nruncmd: [echo tampered]\n";
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .patch(
            "e-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"value": tampered}})),
        )
        .await
        .unwrap();
    assert_eq!(env.user_data("e-0").await, tampered);

    let _restarted = env.controller_logging_to("restarted.log", &[]).await;
    eventually("the user-data rendered again", WAIT, || async {
        (env.user_data("e-0").await != tampered).then_some(())
    })
    .await;
    assert_eq!(env.user_data("e-0").await, rendered);
}
