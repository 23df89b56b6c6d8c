//! What operators rely on: leader election on a Lease, the metrics, and logs that never carry
//! a secret.
//!
//! Without Cluster API's manager: the test plays its controllers (`testenv::capi_env`: owner
//! references, an initialized Cluster, a nodeRef) because what is checked is bootplate's
//! process at chosen moments: a leader killed or cut off by a stalling proxy mid-run, a shard
//! relabelled, a nodeRef set at one point so a metric moves by exactly one, a config left
//! waiting on a Cluster without infrastructure, a controller stopped with Events queued.
//! Cluster API's own reconciles would move the same counters on their own schedule.

use std::time::{Duration, Instant};

use bootplate::core::pace::EventPace;
use crd_types::{BootplateConfig, ClusterBootstrapTemplate, ClusterBootstrapTemplateSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use testenv::capi_env::{NS, WAIT, cluster_template, env, field, publish_cluster_template};
use testenv::controller::ControllerProcess;
use testenv::eventually;

const LEASE_NS: &str = "bootplate-system";
const LEASE: &str = "bootplate-leader";

async fn holder(env: &testenv::capi_env::Env) -> Option<String> {
    let lease = Api::<Lease>::namespaced(env.client.clone(), LEASE_NS)
        .get_opt(LEASE)
        .await
        .unwrap()?;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

fn is_leader(process: &ControllerProcess) -> bool {
    process.metric("bootplate_leader") == Some(1.0)
}

#[tokio::test]
async fn one_leader_reconciles_and_a_standby_takes_over() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.initialized_cluster("c1").await;
    // A long lease: a takeover after SIGTERM must not wait for it.
    let flags = [
        "--leader-elect",
        "--leader-elect-namespace",
        LEASE_NS,
        "--leader-elect-lease-duration",
        "20s",
        "--leader-elect-renew-deadline",
        "15s",
        "--leader-elect-retry-period",
        "1s",
    ];
    let mut a = env.controller_logging_to("a.log", &flags).await;
    let mut b = env.controller_logging_to("b.log", &flags).await;
    let first = eventually("a leader", WAIT, || async { holder(&env).await }).await;
    let (leader, standby) = if first.ends_with(&format!("-{}", a.pid())) {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert!(
        first.ends_with(&format!("-{}", leader.pid())),
        "holder {first} is one of the two"
    );

    env.machine("c1", "w-0", false, cluster_template("probe"))
        .await;
    env.wait_ready("w-0").await;
    // The reconcile is counted once it returns, just after the status write that made the
    // config ready: on a loaded machine the count may be read in between.
    eventually("the leader counts its reconcile", WAIT, || async {
        (leader.config_reconciles() > 0).then_some(())
    })
    .await;
    assert_eq!(
        standby.config_reconciles(),
        0,
        "the standby does not reconcile"
    );
    assert!(is_leader(leader) && !is_leader(standby));
    assert_eq!(standby.readyz(), Some(200), "a standby is ready");

    // SIGTERM: the leader releases the Lease and exits cleanly; the standby takes over at its
    // next poll, long before the 20 s lease would expire.
    let released_at = Instant::now();
    let status = leader.terminate().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    let second = eventually("the standby takes over", WAIT, || async {
        holder(&env).await.filter(|h| *h != first)
    })
    .await;
    let takeover = released_at.elapsed();
    assert!(
        takeover < Duration::from_secs(8),
        "takeover after release took {takeover:?}"
    );
    assert!(second.ends_with(&format!("-{}", standby.pid())));
    env.machine("c1", "w-1", false, cluster_template("probe"))
        .await;
    env.wait_ready("w-1").await;

    // SIGKILL: a third instance stands by; the dead leader's Lease expires and it finishes the
    // configs created meanwhile.
    let mut c = env.controller_logging_to("c.log", &flags).await;
    eventually("the third instance stands by", WAIT, || async {
        (c.readyz() == Some(200)).then_some(())
    })
    .await;
    standby.kill();
    env.machine("c1", "w-2", false, cluster_template("probe"))
        .await;
    let third = eventually(
        "the third instance takes over",
        Duration::from_secs(60),
        || async { holder(&env).await.filter(|h| *h != second) },
    )
    .await;
    assert!(third.ends_with(&format!("-{}", c.pid())));
    env.wait_ready("w-2").await;
    assert!(c.is_running());
}

/// The label the sharding test splits configs by.
const SHARD_LABEL: &str = "bootplate.dev/shard";

/// Puts config `name` in shard `shard`.
async fn put_in_shard(env: &testenv::capi_env::Env, name: &str, shard: &str) {
    let patch = serde_json::json!({"metadata": {"labels": {SHARD_LABEL: shard}}});
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The bootstrap token Secret of config `name` in the workload cluster.
async fn token_of(env: &testenv::capi_env::Env, name: &str) -> Secret {
    let uid = env.config(name).await.metadata.uid.unwrap();
    let mut tokens: Vec<Secret> = env
        .tokens()
        .await
        .into_iter()
        .filter(|t| t.labels().values().any(|v| *v == uid))
        .collect();
    assert_eq!(tokens.len(), 1, "one token for {name}");
    tokens.pop().unwrap()
}

#[tokio::test]
async fn two_shards_split_the_configs_each_on_its_own_lease() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.initialized_cluster("c1").await;
    let flags = |selector| {
        [
            "--shard-selector",
            selector,
            "--leader-elect",
            "--leader-elect-namespace",
            LEASE_NS,
            "--leader-elect-retry-period",
            "1s",
        ]
    };
    let a = env
        .controller_logging_to("shard-a.log", &flags("bootplate.dev/shard=a"))
        .await;
    let b = env
        .controller_logging_to("shard-b.log", &flags("bootplate.dev/shard=b"))
        .await;

    // Both lead at once, each on the Lease named after its shard.
    let leases = Api::<Lease>::namespaced(env.client.clone(), LEASE_NS);
    let holders = eventually("a leader on each shard's Lease", WAIT, || async {
        let holders: Vec<(String, String)> = leases
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|l| Some((l.name_any(), l.spec?.holder_identity?)))
            .collect();
        (holders.len() == 2 && is_leader(&a) && is_leader(&b)).then_some(holders)
    })
    .await;
    for (process, shard) in [(&a, "a"), (&b, "b")] {
        let (lease, _) = holders
            .iter()
            .find(|(_, holder)| holder.ends_with(&format!("-{}", process.pid())))
            .unwrap_or_else(|| panic!("shard {shard} holds a Lease: {holders:?}"));
        let prefix = format!("bootplate-leader-bootplate-dev-shard-{shard}-");
        assert!(lease.starts_with(&prefix), "shard {shard} leads on {lease}");
    }

    let configs: Vec<(String, &str)> = (0..6)
        .map(|i| (format!("w-{i}"), if i % 2 == 0 { "a" } else { "b" }))
        .collect();
    for (name, shard) in &configs {
        env.machine("c1", name, false, cluster_template("probe"))
            .await;
        put_in_shard(&env, name, shard).await;
    }
    for (name, _) in &configs {
        env.wait_ready(name).await;
        let user_data = env.user_data(name).await;
        assert_eq!(field(&user_data, "node").as_deref(), Some(name.as_str()));
        assert!(field(&user_data, "token").is_some(), "{user_data}");
    }
    // Each shard has now reconciled a config of its own changed after all were labelled: its
    // config watch, delivering in order, would have shown it the others' by then.
    env.settled(&a, "w-0").await;
    env.settled(&b, "w-1").await;
    for (name, shard) in &configs {
        let (owner, other) = if *shard == "a" { (&a, &b) } else { (&b, &a) };
        assert!(
            owner.reconciled(NS, name, 0),
            "shard {shard} reconciled {name}"
        );
        assert!(
            !other.reconciled(NS, name, 0),
            "{name} of shard {shard} was reconciled by the other shard too"
        );
    }
    assert!(a.config_reconciles() > 0 && b.config_reconciles() > 0);

    // w-0 moves to shard b: b takes it over; a lets it go without deleting its token.
    let token = token_of(&env, "w-0").await;
    put_in_shard(&env, "w-0", "b").await;
    let moved = env.config("w-0").await.metadata.resource_version.unwrap();
    let moved: u64 = moved.parse().unwrap();
    eventually("shard b reconciles w-0", WAIT, || async {
        b.reconciled(NS, "w-0", moved).then_some(())
    })
    .await;
    eventually("shard a lets w-0 go", WAIT, || async {
        a.logged_about("left this controller's scope", NS, "w-0")
            .then_some(())
    })
    .await;
    env.settled(&a, "w-2").await;
    assert!(
        !a.reconciled(NS, "w-0", moved),
        "shard a reconciled w-0 after it left the shard"
    );
    let kept = token_of(&env, "w-0").await;
    assert_eq!(
        kept.metadata.uid, token.metadata.uid,
        "the moved config keeps its token"
    );
    let user_data_token = field(&env.user_data("w-0").await, "token").unwrap();
    let token_id = user_data_token.split_once('.').unwrap().0;
    assert_eq!(
        kept.name_any(),
        format!("bootstrap-token-{token_id}"),
        "the user-data still carries the kept token"
    );
}

/// A TCP proxy to a local port that can be made to stall: it then still accepts connections
/// and reads what it is sent, but forwards nothing either way, as a hung apiserver or a broken
/// network path looks to a client.
struct StallingProxy {
    port: u16,
    stalled: tokio::sync::watch::Sender<bool>,
}

impl StallingProxy {
    async fn start(target: u16) -> StallingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stalled, watched) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                else {
                    continue;
                };
                let (from_client, to_client) = inbound.into_split();
                let (from_server, to_server) = outbound.into_split();
                tokio::spawn(forward(from_client, to_server, watched.clone()));
                tokio::spawn(forward(from_server, to_client, watched.clone()));
            }
        });
        StallingProxy { port, stalled }
    }

    /// From now on nothing gets through, in either direction.
    fn stall(&self) {
        self.stalled.send_replace(true);
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if stalled.wait_for(|stalled| !*stalled).await.is_err()
            || to.write_all(&buffer[..read]).await.is_err()
        {
            return;
        }
    }
}

/// A copy of `kubeconfig` whose server is `127.0.0.1:port` instead of the apiserver's.
fn through_port(
    env: &testenv::capi_env::Env,
    kubeconfig: &std::path::Path,
    port: u16,
) -> std::path::PathBuf {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let direct = format!("https://127.0.0.1:{}", env.management.port());
    assert!(text.contains(&direct), "the kubeconfig names {direct}");
    let proxied = text.replace(&direct, &format!("https://127.0.0.1:{port}"));
    let path = env.management.dir().join("proxied-kubeconfig");
    std::fs::write(&path, proxied).unwrap();
    path
}

#[tokio::test]
async fn leader_cut_off_by_a_stalling_proxy_stops_before_a_standby_takes_over() {
    let env = env().await;
    let flags = [
        "--leader-elect",
        "--leader-elect-namespace",
        LEASE_NS,
        "--leader-elect-lease-duration",
        "15s",
        "--leader-elect-renew-deadline",
        "10s",
        "--leader-elect-retry-period",
        "1s",
    ];
    let proxy = StallingProxy::start(env.management.port()).await;
    let kubeconfig = through_port(&env, env.controller_kubeconfig(), proxy.port);
    let log = env.management.dir().join("cut-off.log");
    let mut old = ControllerProcess::start(&kubeconfig, &log, &flags)
        .await
        .unwrap();
    let pid = format!("-{}", old.pid());
    eventually("the proxied replica leads", WAIT, || async {
        holder(&env).await.filter(|h| h.ends_with(&pid))
    })
    .await;
    let new = env.controller_logging_to("standby.log", &flags).await;
    eventually("the standby stands by", WAIT, || async {
        (new.readyz() == Some(200)).then_some(())
    })
    .await;

    // Cut the leader off: its renewals hang instead of failing.
    proxy.stall();
    let (mut stopped, mut taken_over) = (None, None);
    let deadline = Instant::now() + WAIT;
    while (stopped.is_none() || taken_over.is_none()) && Instant::now() < deadline {
        if stopped.is_none() && !old.is_running() {
            stopped = Some(Instant::now());
        }
        if taken_over.is_none() && holder(&env).await.is_some_and(|h| !h.ends_with(&pid)) {
            taken_over = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let taken_over = taken_over.expect("the standby takes over");
    let stopped = stopped.expect("the cut-off leader stops (its renewals time out)");
    assert!(
        stopped < taken_over,
        "the old leader stopped {:?} after the new one took over",
        stopped.duration_since(taken_over)
    );
    assert!(
        old.log().contains("lost the leader lease"),
        "the old leader says why it stopped"
    );
}

#[tokio::test]
async fn metrics_count_what_happened_and_logs_hold_no_secret() {
    let env = env().await;
    publish_cluster_template(&env.client, "probe", "v1").await;
    env.initialized_cluster("c1").await;
    // Everything the controller and its libraries log, at the most verbose level.
    let controller = env
        .controller_logging_to(
            "trace.log",
            &["--log-level", "trace", "--log-format", "json"],
        )
        .await;
    let workers = ["w-0", "w-1", "w-2"];
    for name in workers {
        env.machine("c1", name, false, cluster_template("probe"))
            .await;
    }
    for name in workers {
        env.wait_ready(name).await;
    }
    // A node joins: its token is deleted.
    env.set_node_ref("w-0").await;
    eventually("w-0 token deleted", WAIT, || async {
        (env.tokens().await.len() == 2).then_some(())
    })
    .await;

    let metrics = eventually("metrics settled", WAIT, || async {
        let m = controller.metrics()?;
        m.contains("bootplate_bootstrap_tokens_total{action=\"deleted\"} 1")
            .then_some(m)
    })
    .await;
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("series {series} missing:\n{metrics}"))
    };
    assert_eq!(value("bootplate_data_secrets_written_total"), 3.0);
    assert_eq!(
        value("bootplate_bootstrap_tokens_total{action=\"created\"}"),
        3.0
    );
    assert_eq!(value("bootplate_configs{state=\"ready\"}"), 3.0);
    // One Rendered Event per data Secret written, delivered off the reconciles' path.
    assert!(value("bootplate_events_total{result=\"published\"}") >= 3.0);
    assert_eq!(value("bootplate_events_total{result=\"dropped\"}"), 0.0);
    assert_eq!(value("bootplate_events_total{result=\"failed\"}"), 0.0);
    assert_eq!(value("bootplate_events_queued"), 0.0);
    assert_eq!(value("bootplate_configs{state=\"waiting\"}"), 0.0);
    assert_eq!(value("bootplate_templates{validity=\"valid\"}"), 1.0);
    assert_eq!(value("bootplate_config_time_to_ready_seconds_count"), 3.0);
    assert!(value("bootplate_reconciles_total{controller=\"config\",result=\"ready\"}") >= 3.0);
    // One render per user-data produced: the trial render before a token exists is not timed,
    // and reconciles with unchanged inputs do not render at all.
    assert_eq!(
        value(
            "bootplate_render_duration_seconds_count{template=\"ClusterBootstrapTemplate/probe\"}"
        ),
        3.0
    );
    assert_eq!(value("bootplate_leader"), 1.0);
    assert_eq!(value("bootplate_oldest_waiting_config_age_seconds"), 0.0);

    // promtool accepts the exposition.
    let out = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .output_with_stdin(metrics.as_bytes())
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // No token, key or rendered user-data in the log.
    let log = controller.log();
    assert!(
        log.contains("bootstrap token created"),
        "the log covers the token cycle"
    );
    for name in workers {
        let user_data = env.user_data(name).await;
        let token = field(&user_data, "token").unwrap();
        let secret_part = token.split_once('.').unwrap().1;
        let leak = log.lines().find(|l| l.contains(secret_part));
        assert!(
            leak.is_none(),
            "the token of {name} is in the log: {}",
            leak.unwrap_or_default()
                .chars()
                .take(600)
                .collect::<String>()
        );
        assert!(
            !log.contains(&user_data),
            "the user-data of {name} is in the log"
        );
    }
    let ca = env.secret("c1-ca").await.unwrap();
    let key = String::from_utf8(ca.data.unwrap()["tls.key"].0.clone()).unwrap();
    let key_body: String = key.lines().nth(1).unwrap().to_owned();
    assert!(!log.contains(&key_body), "the CA key is in the log");
    assert!(!log.contains("PRIVATE KEY"));
    assert!(
        !log.contains("# v1\n") && !log.contains("role=worker"),
        "rendered user-data leaked"
    );

    // A deleted template leaves the validity gauge (templates carry no finalizer).
    let mut broken = testenv::fixtures::probe_template_spec("broken");
    broken.template = Some("{{ machine..name }}\n".into());
    let templates: Api<ClusterBootstrapTemplate> = Api::all(env.client.clone());
    templates
        .create(
            &PostParams::default(),
            &ClusterBootstrapTemplate::new("broken", ClusterBootstrapTemplateSpec(broken)),
        )
        .await
        .unwrap();
    metric_reaches(
        &controller,
        "bootplate_templates{validity=\"invalid\"}",
        1.0,
    )
    .await;
    templates
        .delete("broken", &Default::default())
        .await
        .unwrap();
    metric_reaches(
        &controller,
        "bootplate_templates{validity=\"invalid\"}",
        0.0,
    )
    .await;

    // A deleted config leaves the state gauges (configs carry no finalizer either): one that
    // waits on a cluster without infrastructure is counted, then deleted.
    env.cluster("c2", false).await;
    env.machine("c2", "waits", false, cluster_template("probe"))
        .await;
    metric_reaches(&controller, "bootplate_configs{state=\"waiting\"}", 1.0).await;
    Api::<crd_types::BootplateConfig>::namespaced(env.client.clone(), testenv::capi_env::NS)
        .delete("waits", &Default::default())
        .await
        .unwrap();
    metric_reaches(&controller, "bootplate_configs{state=\"waiting\"}", 0.0).await;
    assert_eq!(
        controller.metric("bootplate_oldest_waiting_config_age_seconds"),
        Some(0.0)
    );
}

/// Waits until the controller exports `series` with `value`.
async fn metric_reaches(controller: &ControllerProcess, series: &str, value: f64) {
    eventually(&format!("{series} = {value}"), WAIT, || async {
        (controller.metric(series) == Some(value)).then_some(())
    })
    .await;
}

trait OutputWithStdin {
    fn output_with_stdin(&mut self, input: &[u8]) -> Option<std::process::Output>;
}

impl OutputWithStdin for std::process::Command {
    fn output_with_stdin(&mut self, input: &[u8]) -> Option<std::process::Output> {
        use std::io::Write;
        let mut child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .ok()?;
        child.stdin.take()?.write_all(input).ok()?;
        child.wait_with_output().ok()
    }
}

/// A publisher of Events about a probe ConfigMap, paced at `pace`, and its metrics.
struct EventProbe {
    publisher: bootplate::k8s::events::Publisher,
    metrics: std::sync::Arc<bootplate::metrics::Metrics>,
    regarding: k8s_openapi::api::core::v1::ConfigMap,
}

impl EventProbe {
    fn new(env: &testenv::capi_env::Env, name: &str, pace: EventPace) -> Self {
        let metrics = std::sync::Arc::new(bootplate::metrics::Metrics::new());
        let publisher = bootplate::k8s::events::Publisher::new(
            env.client.clone(),
            "bootplate",
            None,
            pace,
            metrics.clone(),
        );
        let mut regarding = k8s_openapi::api::core::v1::ConfigMap::default();
        regarding.metadata.name = Some(name.into());
        regarding.metadata.namespace = Some("default".into());
        EventProbe {
            publisher,
            metrics,
            regarding,
        }
    }

    fn publish(&self, type_: EventType, reason: &str, note: String) {
        let regarding = &self.regarding;
        bootplate::k8s::events::publish(&self.publisher, regarding, type_, reason, "Probe", note);
    }

    /// The types of the Events with `reason` the apiserver holds, once the queue is empty.
    async fn published(&self, env: &testenv::capi_env::Env, reason: &str) -> Vec<String> {
        assert_eq!(self.publisher.flush(Duration::from_secs(120)).await, 0);
        assert_eq!(self.metrics.events_waiting(), 0);
        let events = Api::<Event>::namespaced(env.client.clone(), "default");
        let listed = events.list(&Default::default()).await.unwrap().items;
        (listed.into_iter())
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.type_)
            .collect()
    }
}

#[tokio::test]
async fn a_stopping_controller_publishes_the_events_it_queued() {
    let env = env().await;
    let no_limit = EventPace {
        per_second: 0.0,
        burst: 0,
    };
    let probe = EventProbe::new(&env, "flush-probe", no_limit);
    // More Events than the apiserver takes in the time it takes to queue them.
    const QUEUED: usize = 300;
    for i in 0..QUEUED {
        probe.publish(EventType::Normal, "FlushProbe", format!("event {i}"));
    }
    assert_eq!(
        probe.published(&env, "FlushProbe").await.len(),
        QUEUED,
        "every queued Event was published by the time flush returned"
    );
}

/// Normal Events past the pace are dropped and counted; Warnings all reach the apiserver.
#[tokio::test]
async fn normal_events_past_the_pace_are_counted_and_warnings_all_published() {
    let env = env().await;
    // A burst of 5, then one an hour: none refills within the test.
    let pace = EventPace {
        per_second: 1.0 / 3600.0,
        burst: 5,
    };
    let probe = EventProbe::new(&env, "pace-probe", pace);
    let (normal, warnings) = (40, 12);
    for i in 0..normal + warnings {
        let type_ = if i % 4 == 3 && i / 4 < warnings {
            EventType::Warning
        } else {
            EventType::Normal
        };
        probe.publish(type_, "PaceProbe", format!("event {i}"));
    }
    let published = probe.published(&env, "PaceProbe").await;
    let count = |type_: &str| published.iter().filter(|t| *t == type_).count();
    assert_eq!(
        (count("Normal"), count("Warning")),
        (5, warnings),
        "{published:?}"
    );
    let text = probe.metrics.encode();
    let limited = format!(
        "bootplate_events_total{{result=\"limited\"}} {}",
        normal - 5
    );
    assert!(text.contains(&limited), "{text}");
}
