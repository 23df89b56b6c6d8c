//! Conformance with the real Cluster API: its own manager (Machine, MachineSet,
//! MachineDeployment, Cluster, topology and MachineHealthCheck controllers, built from its Go
//! module) drives bootplate on a current kube-apiserver. Test code plays only the cloud, the
//! kubelets and a control-plane provider stand-in (`testenv::capi::cloud`); it never writes a
//! Cluster API object's status, clones a config or sets an owner reference.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use testenv::capi::boot::{BootRecord, BootRole, KubeadmBoot};
use testenv::capi::cloud;
use testenv::capi::objects::{self, KUBERNETES_VERSION};
use testenv::capi::pool::{self, Instance};
use testenv::capi::token_watch::{TokenWatch, handed_out};
use testenv::capi::{CapiEnv, NS, Options, condition};
use testenv::tools::CapiRelease;
use testenv::{eventually, joins, machine_script};

/// How long a scenario waits for Cluster API and bootplate together.
const WAIT: Duration = Duration::from_secs(180);
/// The shipped template the scenarios' machines use.
const TEMPLATE: &str = "kubeadm-ubuntu-2404";

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path),
    )
    .unwrap()
}

/// Publishes a shipped ClusterBootstrapTemplate, as a platform team does.
async fn publish_shipped_template(env: &CapiEnv, file: &str) {
    env.publish_shipped_template(file).await.unwrap();
}

/// The environment of a scenario against Cluster API `release`, which the manager reports.
async fn start(release: CapiRelease) -> CapiEnv {
    let env = CapiEnv::start(Options {
        release,
        ..Options::default()
    })
    .await
    .unwrap();
    // The manager logs its release as it starts: the scenario runs the release it names.
    let wanted = testenv::tools::capi_version(release).unwrap();
    let log = env.capi.log_tail(usize::MAX);
    let started = log.lines().find(|l| l.contains("\"Starting manager\""));
    assert!(
        started.is_some_and(|l| l.contains(&format!(" version=\"{wanted}\""))),
        "the manager runs Cluster API {wanted}: {started:?}"
    );
    env
}

/// Who holds a cluster's CA and reports its control plane initialized.
#[derive(Clone, Copy)]
enum ControlPlane<'a> {
    /// No control-plane provider: the user brings the CA, bootplate's control-plane Machines
    /// (`init`, then `control-plane-join`) make the control plane.
    Machines,
    /// A control-plane provider (the stand-in) at this Kubernetes version.
    Provider(&'a str),
}

/// A Cluster with its DevCluster, and its DevControlPlane or the user's CA.
async fn create_cluster(env: &CapiEnv, name: &str, control_plane: ControlPlane<'_>, paused: bool) {
    let plane = match control_plane {
        ControlPlane::Provider(version) => {
            env.apply(
                &objects::dev_control_plane_resource(),
                objects::dev_control_plane(name, version),
            )
            .await
            .unwrap();
            Some(name)
        }
        ControlPlane::Machines => {
            env.bring_cluster_ca(name).await.unwrap();
            None
        }
    };
    env.apply(&objects::dev_cluster_resource(), objects::dev_cluster(name))
        .await
        .unwrap();
    env.apply(
        &objects::cluster_resource(),
        objects::cluster(name, plane, paused),
    )
    .await
    .unwrap();
}

/// A control-plane Machine with its BootplateConfig and DevMachine.
async fn create_control_plane_machine(env: &CapiEnv, cluster: &str, name: &str) {
    env.apply(
        &objects::bootplate_resource("BootplateConfig", "bootplateconfigs"),
        objects::bootplate_config(name, TEMPLATE),
    )
    .await
    .unwrap();
    env.control_plane_machine(name, cluster).await.unwrap();
}

/// A BootplateConfigTemplate named `name` using the shipped template `template`.
async fn create_config_template(env: &CapiEnv, name: &str, template: &str) {
    env.apply(
        &objects::bootplate_resource("BootplateConfigTemplate", "bootplateconfigtemplates"),
        objects::bootplate_config_template(name, template),
    )
    .await
    .unwrap();
}

/// A MachineDeployment named `name` with a BootplateConfigTemplate and a DevMachineTemplate of
/// the same name, its Machines at `version`.
async fn create_workers(env: &CapiEnv, cluster: &str, name: &str, replicas: u32, version: &str) {
    let shape = Workers {
        replicas,
        version,
        template: TEMPLATE,
        labels: &[],
    };
    create_workers_shaped(env, cluster, name, shape).await;
}

/// What a scenario's MachineDeployment is made of besides its names.
struct Workers<'a> {
    replicas: u32,
    version: &'a str,
    /// The bootstrap template its BootplateConfigTemplate references.
    template: &'a str,
    /// Labels its Machines carry (the cloud's, such as [`cloud::NO_NODE_LABEL`]), each `true`.
    labels: &'a [&'a str],
}

/// [`create_workers`] of another shape.
async fn create_workers_shaped(env: &CapiEnv, cluster: &str, name: &str, shape: Workers<'_>) {
    create_config_template(env, name, shape.template).await;
    env.apply(
        &objects::dev_machine_template_resource(),
        objects::dev_machine_template(name, "small"),
    )
    .await
    .unwrap();
    let mut deployment =
        objects::machine_deployment(name, cluster, shape.replicas, name, name, shape.version);
    for label in shape.labels {
        deployment["spec"]["template"]["metadata"]["labels"][*label] = json!("true");
    }
    env.apply(&objects::machine_deployment_resource(), deployment)
        .await
        .unwrap();
}

fn phase(machine: &DynamicObject) -> &str {
    machine.data["status"]["phase"].as_str().unwrap_or_default()
}

fn has_node_ref(machine: &DynamicObject) -> bool {
    machine.data["status"]["nodeRef"]["name"].is_string()
}

/// Waits until `cluster` has `count` Machines, each Running with a nodeRef; returns them.
async fn wait_running(env: &CapiEnv, cluster: &str, count: usize) -> Vec<DynamicObject> {
    wait_machines(
        env,
        cluster,
        &format!("{count} Machines Running with a nodeRef"),
        |machines| {
            machines.len() == count
                && machines
                    .iter()
                    .all(|m| phase(m) == "Running" && has_node_ref(m))
        },
    )
    .await
}

/// Waits until the Machines of `cluster` satisfy `done`; returns them. On timeout the panic
/// shows every Machine and config and Cluster API's last errors.
async fn wait_machines(
    env: &CapiEnv,
    cluster: &str,
    what: &str,
    done: impl Fn(&[DynamicObject]) -> bool,
) -> Vec<DynamicObject> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let machines = env.capi_list("Machine", "machines", cluster).await;
        if done(&machines) {
            return machines;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {cluster}: {what}\n{}",
                env.describe().await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The role a kubeadm template rendered, read from its user-data as the test cloud reads it.
fn rendered_role(user_data: &str) -> &'static str {
    KubeadmBoot::read(user_data)
        .ok()
        .and_then(|b| b.role)
        .map_or("none", BootRole::as_str)
}

async fn data_secret(env: &CapiEnv, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .get_opt(name)
        .await
        .unwrap()
}

fn user_data(secret: &Secret) -> String {
    let data = secret.data.as_ref().expect("a data Secret has data");
    String::from_utf8(data["value"].0.clone()).unwrap()
}

/// The BootplateConfig each Machine's bootstrap points at, by Machine name.
fn config_names(machines: &[DynamicObject]) -> BTreeMap<String, String> {
    machines
        .iter()
        .map(|m| {
            let config = m.data["spec"]["bootstrap"]["configRef"]["name"]
                .as_str()
                .expect("a Machine with a bootstrap configRef")
                .to_owned();
            (m.name_any(), config)
        })
        .collect()
}

/// The data Secret of a bootstrapped config has what the contract asks.
fn assert_contract_secret(secret: &Secret, cluster: &str, config: &DynamicObject) {
    let name = secret.name_any();
    assert_eq!(
        secret.type_.as_deref(),
        Some("cluster.x-k8s.io/secret"),
        "{name}"
    );
    assert_eq!(
        secret
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some(cluster),
        "{name}"
    );
    let owners = secret.owner_references();
    assert!(
        owners.iter().any(|o| o.kind == "BootplateConfig"
            && o.uid == config.uid().unwrap()
            && o.controller == Some(true)),
        "{name} is not controlled by its config: {owners:?}"
    );
    let data = secret.data.as_ref().unwrap();
    assert_eq!(data["format"].0, b"cloud-config", "{name}");
    assert!(!data["value"].0.is_empty(), "{name}");
}

/// (a) Three control-plane Machines without a control-plane provider and a MachineDeployment of
/// five workers: every Machine runs with a node (the cloud booted each only after checking its
/// role, token and CA hash), exactly one rendered `init`, our Ready is True and Cluster API
/// mirrors it into BootstrapConfigReady, each join token worked at boot and bootplate deleted
/// it, data Secrets follow the contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_and_a_machine_deployment_come_up_through_cluster_api() {
    a_control_plane_and_a_machine_deployment(CapiRelease::Current).await;
}

/// (a) against the oldest Cluster API release bootplate supports: its own CRDs, manifests and
/// manager (`tests/tools/capi-oldest`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_on_the_oldest_supported_cluster_api() {
    a_control_plane_and_a_machine_deployment(CapiRelease::Oldest).await;
}

/// Scenario (a) against `release`.
async fn a_control_plane_and_a_machine_deployment(release: CapiRelease) {
    let env = start(release).await;
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    create_cluster(&env, "alpha", ControlPlane::Machines, false).await;
    for i in 0..3 {
        create_control_plane_machine(&env, "alpha", &format!("alpha-cp-{i}")).await;
    }
    create_workers(&env, "alpha", "alpha-md", 5, KUBERNETES_VERSION).await;

    let machines = wait_running(&env, "alpha", 8).await;
    let configs = env_configs(&env).await;
    let mut roles = BTreeMap::<&str, usize>::new();
    for (machine, config_name) in config_names(&machines) {
        let config = &configs[&config_name];
        let secret_name = config.data["status"]["dataSecretName"].as_str().unwrap();
        assert_eq!(
            secret_name, config_name,
            "the data Secret is named after the config"
        );
        let secret = data_secret(&env, secret_name)
            .await
            .expect("the data Secret exists");
        assert_contract_secret(&secret, "alpha", config);
        let role = rendered_role(&user_data(&secret));
        *roles.entry(role).or_default() += 1;
        let m = machines.iter().find(|m| m.name_any() == machine).unwrap();
        assert_ready_mirrored(config, m, role);
        assert_eq!(
            config.data["status"]["initialization"]["dataSecretCreated"],
            json!(true)
        );
    }
    assert_eq!(
        roles,
        BTreeMap::from([("init", 1), ("control-plane-join", 2), ("worker", 5)]),
        "exactly one init"
    );
    assert_every_join_token_deleted(&env, &machines, 7).await;
}

/// Our `Ready` condition is True, says which role the data Secret holds, and Cluster API mirrors
/// it into the Machine's `BootstrapConfigReady` (status and reason).
fn assert_ready_mirrored(config: &DynamicObject, machine: &DynamicObject, role: &str) {
    let name = machine.name_any();
    let ours = condition(config, "Ready").expect("our Ready condition");
    assert_eq!(ours["status"], "True", "{name}: our Ready: {ours}");
    assert_eq!(
        ours["reason"], "DataSecretCreated",
        "{name}: our Ready: {ours}"
    );
    let message = ours["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("(role {role})")),
        "{name}: our Ready names the role {role}: {ours}"
    );
    let theirs = condition(machine, "BootstrapConfigReady").expect("CAPI's BootstrapConfigReady");
    assert_eq!(
        (&theirs["status"], &theirs["reason"]),
        (&ours["status"], &ours["reason"]),
        "{name}: BootstrapConfigReady mirrors our Ready: {theirs}"
    );
}

/// What the test cloud recorded when each of `machines` booted, by Machine name.
async fn boot_records(env: &CapiEnv, machines: &[DynamicObject]) -> BTreeMap<String, BootRecord> {
    let dev_machines = env.dynamic(&objects::dev_machine_resource());
    let mut records = BTreeMap::new();
    for machine in machines {
        let infra = machine.data["spec"]["infrastructureRef"]["name"]
            .as_str()
            .expect("a Machine with an infrastructureRef");
        let dev_machine = dev_machines.get(infra).await.unwrap();
        let record = BootRecord::of(&dev_machine)
            .unwrap_or_else(|| panic!("{}: the cloud recorded no boot", machine.name_any()));
        records.insert(machine.name_any(), record);
    }
    records
}

/// `joiners` of `machines` booted with a join token of their own, which existed and which the
/// workload apiserver took for `system:bootstrap:<id>` (the cloud's record of each boot); then
/// each of those tokens is gone, and bootplate counted exactly that many deletions: it deleted
/// them, not their expiry or another controller.
async fn assert_every_join_token_deleted(
    env: &CapiEnv,
    machines: &[DynamicObject],
    joiners: usize,
) {
    let records = boot_records(env, machines).await;
    let mut ids = BTreeSet::new();
    for (machine, record) in &records {
        let Some(id) = &record.token_id else {
            assert_eq!(record.role, Some(BootRole::Init), "{machine}: {record:?}");
            continue;
        };
        assert_eq!(
            record.authenticated_as.as_deref(),
            Some(format!("system:bootstrap:{id}").as_str()),
            "{machine}: {record:?}"
        );
        assert!(ids.insert(id.clone()), "{machine} shares token {id}");
    }
    assert_eq!(
        ids.len(),
        joiners,
        "Machines that joined with a token: {records:?}"
    );
    let tokens: Api<Secret> = Api::namespaced(env.workload_client.clone(), "kube-system");
    eventually("every join token deleted", WAIT, || async {
        for id in &ids {
            let name = format!("bootstrap-token-{id}");
            if tokens.get_opt(&name).await.unwrap().is_some() {
                return None;
            }
        }
        env.tokens().await.is_empty().then_some(())
    })
    .await;
    let deleted = env
        .bootplate
        .metric("bootplate_bootstrap_tokens_total{action=\"deleted\"}")
        .expect("bootplate's metrics hold the deleted tokens");
    assert_eq!(deleted, ids.len() as f64, "tokens bootplate deleted");
}

/// Every BootplateConfig in [`NS`], by name.
async fn env_configs(env: &CapiEnv) -> BTreeMap<String, DynamicObject> {
    let api: Api<DynamicObject> = env.configs();
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect()
}

async fn delete(api: &Api<DynamicObject>, name: &str) {
    api.delete(name, &DeleteParams::default()).await.unwrap();
}

async fn merge_patch(api: &Api<DynamicObject>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

fn names(objects: &[DynamicObject]) -> BTreeSet<String> {
    objects.iter().map(ResourceExt::name_any).collect()
}

/// The token id in a kubeadm user-data (`token: "<id>.<secret>"`).
fn token_id(user_data: &str) -> Option<String> {
    KubeadmBoot::read(user_data)
        .ok()?
        .token_id()
        .map(str::to_owned)
}

/// Waits until none of `configs` nor their data Secrets exist any more, and no join token is
/// left in the workload cluster.
async fn wait_nothing_left(env: &CapiEnv, configs: &BTreeSet<String>) {
    let api: Api<DynamicObject> = env.configs();
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
    eventually(
        &format!("configs {configs:?}, their Secrets and every token gone"),
        WAIT,
        || async {
            for name in configs {
                if api.get_opt(name).await.unwrap().is_some()
                    || secrets.get_opt(name).await.unwrap().is_some()
                {
                    return None;
                }
            }
            env.tokens().await.is_empty().then_some(())
        },
    )
    .await;
}

/// Waits until every one of `old` is replaced by a new Machine at `version`, Running with a
/// nodeRef (as many as before); returns the new ones.
async fn wait_replaced(
    env: &CapiEnv,
    cluster: &str,
    old: &[DynamicObject],
    version_wanted: &str,
) -> Vec<DynamicObject> {
    let old_names = names(old);
    let what = format!("{} new Machines at {version_wanted} Running", old.len());
    wait_machines(env, cluster, &what, |machines| {
        machines.len() == old.len()
            && machines.iter().all(|m| {
                !old_names.contains(&m.name_any())
                    && version(m) == version_wanted
                    && phase(m) == "Running"
                    && has_node_ref(m)
            })
    })
    .await
}

fn version(machine: &DynamicObject) -> &str {
    machine.data["spec"]["version"].as_str().unwrap_or_default()
}

/// (b) Rollout: the MachineDeployment switches to another BootplateConfigTemplate (another
/// OS image's template) and a new Kubernetes version; Cluster API replaces every worker, the new
/// ones render from the new template, old configs, Secrets and tokens are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_a_machine_deployment_rollout_renders_the_new_template() {
    a_machine_deployment_rollout(CapiRelease::Current).await;
}

/// (b) against the oldest Cluster API release bootplate supports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_on_the_oldest_supported_cluster_api() {
    a_machine_deployment_rollout(CapiRelease::Oldest).await;
}

/// Scenario (b) against `release`.
async fn a_machine_deployment_rollout(release: CapiRelease) {
    let env = start(release).await;
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    publish_shipped_template(&env, "templates/kubeadm-debian-12.yaml").await;
    create_cluster(&env, "beta", ControlPlane::Provider("v1.35.0"), false).await;
    create_workers(&env, "beta", "beta-md", 3, KUBERNETES_VERSION).await;
    let old = wait_running(&env, "beta", 3).await;
    let old_configs: BTreeSet<String> = config_names(&old).into_values().collect();

    create_config_template(&env, "beta-md-debian", "kubeadm-debian-12").await;
    merge_patch(
        &env.capi("MachineDeployment", "machinedeployments"),
        "beta-md",
        json!({"spec": {"template": {"spec": {
            "version": "v1.35.0",
            "bootstrap": {"configRef": {"name": "beta-md-debian"}},
        }}}}),
    )
    .await;
    let new = wait_replaced(&env, "beta", &old, "v1.35.0").await;
    for config in config_names(&new).into_values() {
        let secret = data_secret(&env, &config).await.expect("a data Secret");
        let user_data = user_data(&secret);
        assert!(
            user_data.contains("from ClusterBootstrapTemplate kubeadm-debian-12 "),
            "{config} did not render from the new template:\n{user_data}"
        );
        assert!(
            user_data.contains("v1.35"),
            "{config} renders the new version"
        );
    }
    wait_nothing_left(&env, &old_configs).await;
}

/// (c) Scale down to 2, then delete a Machine: nothing is left behind for the removed
/// Machines (configs, data Secrets, tokens, Nodes) nor the init lock (seen taken, then gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_scaling_down_and_deleting_a_machine_leave_nothing_behind() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    let lock_taken = config_map_seen(&env.client, "gamma-lock");
    create_cluster(&env, "gamma", ControlPlane::Machines, false).await;
    create_control_plane_machine(&env, "gamma", "gamma-cp-0").await;
    create_workers(&env, "gamma", "gamma-md", 4, KUBERNETES_VERSION).await;
    let all = wait_running(&env, "gamma", 5).await;
    let configs = config_names(&all);

    merge_patch(
        &env.capi("MachineDeployment", "machinedeployments"),
        "gamma-md",
        json!({"spec": {"replicas": 2}}),
    )
    .await;
    let scaled = wait_running(&env, "gamma", 3).await;
    let victim = scaled
        .iter()
        .find(|m| !m.labels().contains_key("cluster.x-k8s.io/control-plane"))
        .expect("a worker")
        .name_any();
    delete(&env.capi("Machine", "machines"), &victim).await;
    let after = wait_machines(&env, "gamma", "the deleted Machine replaced", |machines| {
        machines.len() == 3
            && machines
                .iter()
                .all(|m| m.name_any() != victim && phase(m) == "Running")
    })
    .await;

    let kept = names(&after);
    let removed: BTreeSet<String> = configs
        .iter()
        .filter(|(machine, _)| !kept.contains(*machine))
        .map(|(_, config)| config.clone())
        .collect();
    assert_eq!(
        removed.len(),
        3,
        "two scaled away and one deleted: {removed:?}"
    );
    wait_nothing_left(&env, &removed).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.workload_client.clone());
    let node_names: BTreeSet<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(
        node_names, kept,
        "Cluster API removed the Nodes of removed Machines"
    );
    // The lock existed (its absence below proves nothing otherwise), and is gone.
    tokio::time::timeout(Duration::from_secs(10), lock_taken)
        .await
        .expect("the init lock gamma-lock was never taken")
        .unwrap();
    let locks: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.client.clone(), NS);
    assert!(
        locks.get_opt("gamma-lock").await.unwrap().is_none(),
        "the init lock is released once the control plane is initialized"
    );
}

/// A task that ends once ConfigMap `name` of the scenarios' namespace has existed, seen by a
/// watch that starts now: an object that lives for a moment is still seen.
fn config_map_seen(client: &kube::Client, name: &str) -> tokio::task::JoinHandle<()> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), NS);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    tokio::spawn(async move {
        let objects = watcher(api, config).default_backoff().applied_objects();
        let mut objects = std::pin::pin!(objects);
        while let Some(next) = objects.next().await {
            if next.is_ok() {
                return;
            }
        }
        panic!("the watch of ConfigMap {name} ended")
    })
}

/// (d) A paused Cluster renders nothing until it is unpaused; our Paused condition says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_a_paused_cluster_renders_nothing_until_unpaused() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    create_cluster(&env, "delta", ControlPlane::Machines, true).await;
    create_control_plane_machine(&env, "delta", "delta-cp-0").await;
    let configs: Api<DynamicObject> = env.configs();
    let paused = eventually("the config's Paused condition True", WAIT, || async {
        let config = configs.get("delta-cp-0").await.unwrap();
        let paused = condition(&config, "Paused")?;
        (paused["status"] == "True").then(|| config.clone())
    })
    .await;
    assert!(
        paused.data["status"]["dataSecretName"].is_null(),
        "a paused config names no data Secret"
    );
    assert!(
        data_secret(&env, "delta-cp-0").await.is_none(),
        "nothing rendered while paused"
    );
    assert!(env.tokens().await.is_empty(), "no token while paused");

    merge_patch(
        &env.capi("Cluster", "clusters"),
        "delta",
        json!({"spec": {"paused": false}}),
    )
    .await;
    wait_running(&env, "delta", 1).await;
    let config = configs.get("delta-cp-0").await.unwrap();
    assert_eq!(
        condition(&config, "Paused").expect("Paused")["status"],
        "False"
    );
}

/// (f) A worker whose Node never appears is remediated by Cluster API's MachineHealthCheck;
/// its config, data Secret and join token go with it. Then a worker whose boot fails is
/// remediated at once, on its boot report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_a_machine_health_check_remediation_takes_the_token_and_secret_along() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    create_cluster(
        &env,
        "zeta",
        ControlPlane::Provider(KUBERNETES_VERSION),
        false,
    )
    .await;
    let shape = Workers {
        replicas: 1,
        version: KUBERNETES_VERSION,
        template: TEMPLATE,
        labels: &[cloud::NO_NODE_LABEL],
    };
    create_workers_shaped(&env, "zeta", "zeta-md", shape).await;
    env.apply(
        &objects::machine_health_check_resource(),
        objects::machine_health_check(
            "zeta-workers",
            "zeta",
            "zeta-md",
            json!({"nodeStartupTimeoutSeconds": 30}),
        ),
    )
    .await
    .unwrap();

    // The first Machine boots (it has bootstrap data and a token) but its Node never appears.
    let first = wait_machines(&env, "zeta", "a provisioned Machine", |machines| {
        machines.len() == 1 && machines[0].data["spec"]["providerID"].is_string()
    })
    .await
    .remove(0);
    let config = first.data["spec"]["bootstrap"]["configRef"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let secret = data_secret(&env, &config)
        .await
        .expect("the first Machine's data Secret");
    let token = token_id(&user_data(&secret)).expect("a worker's user-data holds its token");
    let tokens: Api<Secret> = Api::namespaced(env.workload_client.clone(), "kube-system");
    assert!(
        tokens
            .get_opt(&format!("bootstrap-token-{token}"))
            .await
            .unwrap()
            .is_some(),
        "the first Machine's token exists while it waits for its Node"
    );

    let first_name = first.name_any();
    wait_machines(
        &env,
        "zeta",
        "the Machine without a Node remediated and replaced",
        |machines| !machines.is_empty() && machines.iter().all(|m| m.name_any() != first_name),
    )
    .await;
    eventually(
        "the remediated Machine's config, data Secret and token gone",
        WAIT,
        || async {
            let configs: Api<DynamicObject> = env.configs();
            let gone = configs.get_opt(&config).await.unwrap().is_none()
                && data_secret(&env, &config).await.is_none()
                && tokens
                    .get_opt(&format!("bootstrap-token-{token}"))
                    .await
                    .unwrap()
                    .is_none();
            gone.then_some(())
        },
    )
    .await;
    a_failed_boot_is_remediated_at_once(&env).await;
}

/// (f, continued) A worker that reports a failed boot is replaced at once. Its machine runs its
/// user-data (the rendered script, run by the test as the machine: the cloud does not run
/// user-data), whose `join` part fails; bootplate's `Ready=False` reason `BootFailed` is what
/// Cluster API mirrors into the Machine's `BootstrapConfigReady`, and a MachineHealthCheck on
/// that condition (docs/boot-channel.md) remediates the Machine long before its 20-minute
/// `nodeStartupTimeout` could. The check is created once the condition shows, so the test sees
/// the mirrored condition before the Machine goes.
async fn a_failed_boot_is_remediated_at_once(env: &CapiEnv) {
    let resource =
        objects::bootplate_resource("ClusterBootstrapTemplate", "clusterbootstraptemplates");
    let template = machine_script::failing_join_template("boot-fails");
    cloud::apply(&env.client, &resource, None, &template)
        .await
        .unwrap();
    let shape = Workers {
        replicas: 1,
        version: KUBERNETES_VERSION,
        template: "boot-fails",
        labels: &[cloud::NO_NODE_LABEL, cloud::PLAIN_MACHINE_LABEL],
    };
    create_workers_shaped(env, "zeta", "zeta-fails", shape).await;
    let of_deployment = |m: &DynamicObject| {
        m.labels()
            .get(objects::DEPLOYMENT_LABEL)
            .map(String::as_str)
            == Some("zeta-fails")
    };
    let machine = wait_machines(
        env,
        "zeta",
        "the failing deployment's Machine with its data",
        |ms| {
            ms.iter().any(|m| {
                of_deployment(m) && m.data["spec"]["bootstrap"]["dataSecretName"].is_string()
            })
        },
    )
    .await
    .into_iter()
    .find(|m| of_deployment(m))
    .unwrap();
    let name = machine.name_any();
    let secret = machine.data["spec"]["bootstrap"]["dataSecretName"]
        .as_str()
        .unwrap();
    let user_data = user_data(&data_secret(env, secret).await.unwrap());
    let root = tempfile::tempdir().unwrap();
    let status = machine_script::run_script(&user_data, root.path());
    assert_eq!(
        status,
        Some(machine_script::FAILING_STATUS),
        "the machine's boot fails"
    );
    wait_machines(
        env,
        "zeta",
        "BootstrapConfigReady False, reason BootFailed",
        |ms| {
            ms.iter().any(|m| {
                m.name_any() == name
                    && condition(m, "BootstrapConfigReady")
                        .is_some_and(|c| c["status"] == "False" && c["reason"] == "BootFailed")
            })
        },
    )
    .await;
    let checked = std::time::Instant::now();
    env.apply(
        &objects::machine_health_check_resource(),
        objects::machine_health_check(
            "zeta-boot",
            "zeta",
            "zeta-fails",
            json!({
                "nodeStartupTimeoutSeconds": 1200,
                "unhealthyMachineConditions": [{"type": "BootstrapConfigReady",
                    "status": "False", "timeoutSeconds": 0}],
            }),
        ),
    )
    .await
    .unwrap();
    wait_machines(
        env,
        "zeta",
        "the Machine that failed to boot replaced",
        |ms| ms.iter().any(of_deployment) && ms.iter().all(|m| m.name_any() != name),
    )
    .await;
    let event =
        testenv::events::wait_reason(&env.client, NS, &name, "MachineMarkedUnhealthy").await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("zeta-boot"),
        "remediated by the boot check: {note}"
    );
    eprintln!(
        "remediated {:?} after the check was created",
        checked.elapsed()
    );
}

/// (h) The usual production shape: a control-plane provider reports the control plane
/// initialized and owns the cluster CA; bootplate workers join and nothing renders `init`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_workers_join_a_control_plane_managed_by_a_provider() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    create_cluster(
        &env,
        "eta",
        ControlPlane::Provider(KUBERNETES_VERSION),
        false,
    )
    .await;
    create_workers(&env, "eta", "eta-md", 3, KUBERNETES_VERSION).await;
    let machines = wait_running(&env, "eta", 3).await;
    for config in config_names(&machines).into_values() {
        let user_data = user_data(&data_secret(&env, &config).await.expect("a data Secret"));
        assert_eq!(rendered_role(&user_data), "worker", "{config}");
        assert!(
            !user_data.contains("PRIVATE KEY"),
            "{config}: a worker holds no private key"
        );
    }
    let locks: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.client.clone(), NS);
    assert!(
        locks.get_opt("eta-lock").await.unwrap().is_none(),
        "no init lock"
    );
    let ca = data_secret(&env, "eta-ca")
        .await
        .expect("the provider's CA");
    assert!(
        ca.owner_references()
            .iter()
            .any(|o| o.kind == "DevControlPlane"),
        "the CA stays the control-plane provider's"
    );
    assert_eq!(
        ca.data.as_ref().unwrap()["tls.crt"].0,
        env.cluster_ca.cert_pem.as_bytes(),
        "bootplate did not replace the provider's CA"
    );
    assert_every_join_token_deleted(&env, &machines, 3).await;
}

/// (e) ClusterClass: a topology-managed Cluster whose class names a BootplateConfigTemplate
/// for its workers. Cluster API's topology controller (with its server-side-apply dry runs
/// through bootplate's webhook) creates the workers, then rolls them out on a version upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_a_cluster_class_creates_and_rolls_out_bootplate_workers() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    let infra = format!("{}/v1alpha1", testenv::capi::cloud::INFRA_GROUP);
    let control_plane = format!("{}/v1alpha1", testenv::capi::cloud::CONTROL_PLANE_GROUP);
    env.apply(
        &objects::dev_cluster_template_resource(),
        json!({"apiVersion": infra, "kind": "DevClusterTemplate",
               "metadata": {"name": "dev-cluster", "namespace": NS},
               "spec": {"template": {"spec": {}}}}),
    )
    .await
    .unwrap();
    env.apply(
        &objects::dev_control_plane_template_resource(),
        json!({"apiVersion": control_plane, "kind": "DevControlPlaneTemplate",
               "metadata": {"name": "dev-control-plane", "namespace": NS},
               "spec": {"template": {"spec": {}}}}),
    )
    .await
    .unwrap();
    env.apply(
        &objects::dev_machine_template_resource(),
        objects::dev_machine_template("dev-worker", "small"),
    )
    .await
    .unwrap();
    create_config_template(&env, "class-workers", TEMPLATE).await;
    let template_ref = |api_version: &str, kind: &str, name: &str| json!({"templateRef": {"apiVersion": api_version, "kind": kind, "name": name}});
    env.apply(
        &objects::cluster_class_resource(),
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "ClusterClass",
            "metadata": {"name": "dev-class", "namespace": NS},
            "spec": {
                "infrastructure": template_ref(&infra, "DevClusterTemplate", "dev-cluster"),
                "controlPlane": template_ref(&control_plane, "DevControlPlaneTemplate", "dev-control-plane"),
                "workers": {"machineDeployments": [{
                    "class": "default-worker",
                    "bootstrap": template_ref(
                        &format!("{}/v1alpha1", objects::BOOTPLATE_GROUP),
                        "BootplateConfigTemplate",
                        "class-workers",
                    ),
                    "infrastructure": template_ref(&infra, "DevMachineTemplate", "dev-worker"),
                }]},
            },
        }),
    )
    .await
    .unwrap();
    let mut cluster = objects::cluster("epsilon", None, false);
    cluster["spec"]
        .as_object_mut()
        .unwrap()
        .remove("infrastructureRef");
    cluster["spec"]["topology"] = json!({
        "classRef": {"name": "dev-class"},
        "version": KUBERNETES_VERSION,
        "workers": {"machineDeployments": [{"class": "default-worker", "name": "md-0", "replicas": 2}]},
    });
    env.apply(&objects::cluster_resource(), cluster)
        .await
        .unwrap();

    let first = wait_running(&env, "epsilon", 2).await;
    let first_configs: BTreeSet<String> = config_names(&first).into_values().collect();
    for config in &first_configs {
        let user_data = user_data(&data_secret(&env, config).await.expect("a data Secret"));
        assert_eq!(rendered_role(&user_data), "worker", "{config}");
    }

    merge_patch(
        &env.capi("Cluster", "clusters"),
        "epsilon",
        json!({"spec": {"topology": {"version": "v1.35.0"}}}),
    )
    .await;
    let upgraded = wait_replaced(&env, "epsilon", &first, "v1.35.0").await;
    for config in config_names(&upgraded).into_values() {
        let user_data = user_data(&data_secret(&env, &config).await.expect("a data Secret"));
        assert_eq!(rendered_role(&user_data), "worker", "{config}");
        assert!(
            user_data.contains("v1.35"),
            "{config} renders the upgraded version"
        );
    }
    wait_nothing_left(&env, &first_configs).await;
}

/// (g) `clusterctl move` of a running cluster to another management cluster (both with
/// Cluster API and bootplate): every object of ours moves, the target's bootplate creates no
/// token and writes no data Secret for the bootstrapped machines, nothing is left on the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g_clusterctl_move_takes_every_object_along_and_rewrites_nothing() {
    let source = CapiEnv::start(Options::default()).await.unwrap();
    let target = CapiEnv::start_beside(&source, Options::default())
        .await
        .unwrap();
    // A namespaced template: it moves with the clusters of its namespace.
    let mut template: Value =
        serde_yaml::from_str(&repo_file("templates/kubeadm-ubuntu-2404.yaml")).unwrap();
    template["kind"] = json!("BootstrapTemplate");
    template["metadata"] = json!({"name": "ubuntu", "namespace": NS});
    source
        .apply(
            &objects::bootplate_resource("BootstrapTemplate", "bootstraptemplates"),
            template,
        )
        .await
        .unwrap();
    let namespaced = |mut object: Value, at: &[&str]| {
        let mut reference = &mut object;
        for key in at {
            reference = &mut reference[*key];
        }
        *reference = json!({"kind": "BootstrapTemplate", "name": "ubuntu"});
        object
    };
    create_cluster(&source, "theta", ControlPlane::Machines, false).await;
    source
        .apply(
            &objects::bootplate_resource("BootplateConfig", "bootplateconfigs"),
            namespaced(
                objects::bootplate_config("theta-cp-0", "-"),
                &["spec", "templateRef"],
            ),
        )
        .await
        .unwrap();
    source
        .apply(
            &objects::dev_machine_resource(),
            objects::dev_machine("theta-cp-0"),
        )
        .await
        .unwrap();
    source
        .apply(
            &objects::machine_resource(),
            objects::control_plane_machine("theta-cp-0", "theta"),
        )
        .await
        .unwrap();
    source
        .apply(
            &objects::bootplate_resource("BootplateConfigTemplate", "bootplateconfigtemplates"),
            namespaced(
                objects::bootplate_config_template("theta-md", "-"),
                &["spec", "template", "spec", "templateRef"],
            ),
        )
        .await
        .unwrap();
    source
        .apply(
            &objects::dev_machine_template_resource(),
            objects::dev_machine_template("theta-md", "small"),
        )
        .await
        .unwrap();
    source
        .apply(
            &objects::machine_deployment_resource(),
            objects::machine_deployment(
                "theta-md",
                "theta",
                2,
                "theta-md",
                "theta-md",
                KUBERNETES_VERSION,
            ),
        )
        .await
        .unwrap();
    let machines = wait_running(&source, "theta", 3).await;
    assert_every_join_token_deleted(&source, &machines, 2).await;
    let mut rendered = BTreeMap::new();
    for config in config_names(&machines).into_values() {
        let secret = data_secret(&source, &config).await.expect("a data Secret");
        rendered.insert(config, user_data(&secret));
    }

    let out = testenv::capi::clusterctl::move_namespace(&source.management, &target.management, NS)
        .unwrap();
    assert!(
        out.status.success(),
        "clusterctl move failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let moved = wait_running(&target, "theta", 3).await;
    assert_eq!(
        names(&moved),
        names(&machines),
        "the same Machines run on the target"
    );
    let configs: Api<DynamicObject> = target.configs();
    eventually("every moved config Ready on the target", WAIT, || async {
        let list = configs.list(&ListParams::default()).await.unwrap().items;
        let ready = list
            .iter()
            .filter(|c| condition(c, "Ready").is_some_and(|r| r["status"] == "True"))
            .count();
        (list.len() == rendered.len() && ready == list.len()).then_some(())
    })
    .await;
    for (config, user_data_before) in &rendered {
        let secret = data_secret(&target, config)
            .await
            .expect("the data Secret moved");
        assert_eq!(
            &user_data(&secret),
            user_data_before,
            "{config}: the same user-data"
        );
    }
    for kind in [
        ("BootstrapTemplate", "bootstraptemplates"),
        ("BootplateConfigTemplate", "bootplateconfigtemplates"),
        ("BootplateConfig", "bootplateconfigs"),
    ] {
        let on = |env: &CapiEnv| env.bootplate(kind.0, kind.1);
        let moved = on(&target)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        assert!(!moved.is_empty(), "no {} on the target", kind.0);
        let left = on(&source)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        assert!(
            left.is_empty(),
            "{} left on the source: {:?}",
            kind.0,
            names(&left)
        );
    }
    let source_secrets: Api<Secret> = Api::namespaced(source.client.clone(), NS);
    for config in rendered.keys() {
        assert!(
            source_secrets.get_opt(config).await.unwrap().is_none(),
            "{config}'s Secret left on the source"
        );
    }
    assert!(
        source
            .capi_list("Machine", "machines", "theta")
            .await
            .is_empty(),
        "Machines left on the source"
    );
    // The Ready conditions moved with the configs: only the target's own count shows that its
    // bootplate reconciled every moved config, so that the writes counted below mean something.
    let ready = rendered.len() as f64;
    eventually(
        "the target's bootplate counts every moved config ready",
        WAIT,
        || async {
            let counted = target
                .bootplate
                .metric("bootplate_configs{state=\"ready\"}");
            (counted == Some(ready)).then_some(())
        },
    )
    .await;
    assert_eq!(
        target
            .bootplate
            .metric("bootplate_data_secrets_written_total"),
        Some(0.0),
        "the target's bootplate wrote no data Secret"
    );
    assert!(
        target.tokens().await.is_empty(),
        "no token for bootstrapped machines"
    );
}

/// Waits until the DevMachinePool `name` records `count` instances; returns them.
async fn wait_instances(env: &CapiEnv, name: &str, count: usize) -> Vec<Instance> {
    let pools = env.dynamic(&objects::dev_machine_pool_resource());
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let pool = pools.get_opt(name).await.unwrap();
        let instances = pool.as_ref().map(pool::instances).unwrap_or_default();
        if instances.len() == count {
            return instances;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {count} instances of {name}, have {instances:?}\n{}",
                env.describe().await
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Each instance booted with a token whose Secret existed, unexpired, at its boot, and that the
/// workload apiserver took for `system:bootstrap:<id>`.
fn assert_joined_with_a_valid_token(instances: &[Instance]) {
    use k8s_openapi::jiff::Timestamp;
    for instance in instances {
        let booted: Timestamp = instance.booted_at.parse().unwrap();
        let expires: Timestamp = instance
            .token_expiration
            .as_deref()
            .unwrap_or_else(|| panic!("{instance:?}: its token's Secret did not exist at boot"))
            .parse()
            .unwrap();
        assert!(
            expires > booted,
            "{instance:?}: its token was expired at boot"
        );
        assert_eq!(
            instance.authenticated_as.as_deref(),
            Some(format!("system:bootstrap:{}", instance.token_id).as_str()),
            "{instance:?}: the workload apiserver refused its token"
        );
    }
}

/// The value of counter `series` in bootplate's metrics: 0 while the series has no sample yet.
/// Panics when the metrics cannot be read: an unreadable metric must not pass for a zero.
fn counter(env: &CapiEnv, series: &str) -> f64 {
    let metrics = env.bootplate.metrics().expect("bootplate's metrics");
    let value = metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '));
    value.map_or(0.0, |v| v.trim().parse().expect("a counter's value"))
}

/// The writes of data Secret `name` the management apiserver refused bootplate, oldest first,
/// as its audit log records them (each as its JSON line). bootplate publishes no Event for a
/// failed write (an API error is retried, not shown): the apiserver's own record is the
/// evidence that this write, not another call, was refused.
fn refused_writes(env: &CapiEnv, name: &str) -> Vec<String> {
    let (namespace, account) = testenv::rbac::SERVICE_ACCOUNT;
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let log = std::fs::read_to_string(env.management.audit_log()).expect("the audit log");
    log.lines()
        // Most of the log is other requests: parse only the lines that can be one of these.
        .filter(|line| line.contains(name) && line.contains("\"secrets\""))
        .filter(|line| {
            let entry: Value = serde_json::from_str(line).expect("an audit event");
            let object = &entry["objectRef"];
            entry["stage"] == "ResponseComplete"
                // bootplate's kubeconfig impersonates its ServiceAccount.
                && entry["impersonatedUser"]["username"] == user.as_str()
                && ["patch", "update"].contains(&entry["verb"].as_str().unwrap_or_default())
                && object["resource"] == "secrets"
                && object["namespace"] == NS
                && object["name"] == name
                && entry["responseStatus"]["code"].as_u64().unwrap_or(0) >= 400
                // A dry run is a question, not the write.
                && !entry["requestURI"].as_str().unwrap_or_default().contains("dryRun")
        })
        .map(str::to_owned)
        .collect()
}

/// A ValidatingAdmissionPolicy that refuses every update of Secret `name` in [`NS`]: the
/// management apiserver refuses bootplate's writes of that data Secret while it is bound.
fn freeze_secret(name: &str) -> [Value; 2] {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "freeze-data-secret"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["secrets"],
            }]},
            "validations": [{
                "expression": format!("object.metadata.namespace != '{NS}' || object.metadata.name != '{name}'"),
                "message": "the test holds this data Secret as it is",
            }],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "freeze-data-secret"},
        "spec": {"policyName": "freeze-data-secret", "validationActions": ["Deny"]},
    });
    [policy, binding]
}

/// (j) A MachinePool of 3 instances, then 5 once the first token would have expired, all from one
/// BootplateConfig whose Secret a test-only scale set reads whenever it starts an instance. Every
/// instance joins with a token that the workload apiserver accepts; the token is rotated at half
/// its lifetime and the replaced one stays until it has expired, deleted only once the Secret
/// holds the new one (also while the Secret's writes are refused); a changed config re-renders
/// the Secret and leaves running instances alone; deleting the pool takes its config, Secret and
/// token along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j_a_machine_pool_boots_at_any_time_with_a_valid_rotated_token() {
    let env = CapiEnv::start(Options {
        bootplate_args: vec!["--bootstrap-token-ttl=30s".into()],
        // The management apiserver's audit log records each write it refused bootplate.
        audited: true,
        ..Default::default()
    })
    .await
    .unwrap();
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    create_cluster(
        &env,
        "iota",
        ControlPlane::Provider(KUBERNETES_VERSION),
        false,
    )
    .await;
    let watch = TokenWatch::start(&env, "iota-pool");
    let mut config = objects::bootplate_config("iota-pool", TEMPLATE);
    // Instances share the user-data: the node is named after the host, not the pool.
    config["spec"]["variables"] = json!({"nodeNameFromHostname": true});
    let configs = objects::bootplate_resource("BootplateConfig", "bootplateconfigs");
    env.apply(&configs, config).await.unwrap();
    let pool_parts = (
        objects::dev_machine_pool_resource(),
        objects::dev_machine_pool("iota-pool"),
    );
    env.apply(&pool_parts.0, pool_parts.1).await.unwrap();
    let machine_pool = objects::machine_pool(
        "iota-pool",
        "iota",
        3,
        ("iota-pool", "iota-pool"),
        &["fd-a", "fd-b"],
    );
    env.apply(&objects::machine_pool_resource(), machine_pool)
        .await
        .unwrap();

    let first = wait_instances(&env, "iota-pool", 3).await;
    assert_joined_with_a_valid_token(&first);
    assert_pool_secret(&env).await;

    // The pool grows once every token its first instances got would have expired.
    let last_expiry = first
        .iter()
        .filter_map(|i| {
            i.token_expiration
                .as_deref()?
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
        })
        .max()
        .unwrap();
    let wait = last_expiry.duration_since(k8s_openapi::jiff::Timestamp::now());
    tokio::time::sleep(Duration::try_from(wait).unwrap_or_default() + Duration::from_secs(1)).await;
    let pools = env.capi("MachinePool", "machinepools");
    merge_patch(&pools, "iota-pool", json!({"spec": {"replicas": 5}})).await;
    let all = wait_instances(&env, "iota-pool", 5).await;
    assert_eq!(all[..3], first[..], "running instances are left alone");
    assert_joined_with_a_valid_token(&all[3..]);
    let first_tokens: BTreeSet<&str> = first.iter().map(|i| i.token_id.as_str()).collect();
    for late in &all[3..] {
        assert!(
            !first_tokens.contains(late.token_id.as_str()),
            "{late:?} got a token of the first instances, which expired"
        );
    }
    // Expired by now, they go at the pool's next render (a rotation every 15 s).
    eventually(
        "the first instances' expired tokens deleted",
        WAIT,
        || async {
            let live: BTreeSet<String> = env.tokens().await.iter().map(|t| t.name_any()).collect();
            let left = first_tokens
                .iter()
                .any(|id| live.contains(&format!("bootstrap-token-{id}")));
            (!left).then_some(())
        },
    )
    .await;
    eventually(
        "Cluster API finds the 5 Nodes of the pool",
        WAIT,
        || async {
            let pool = pools.get("iota-pool").await.unwrap();
            let refs = pool.data["status"]["nodeRefs"]
                .as_array()
                .map_or(0, Vec::len);
            (refs == 5).then_some(())
        },
    )
    .await;

    rotation_waits_for_the_write(&env).await;
    a_changed_config_renders_the_pool_again(&env, &all).await;

    let history = watch.history();
    drop(watch);
    assert_eq!(history.failure, None, "the token watch saw everything");
    // The one in use, the one it replaced (valid until it expires) and, during a rotation, the
    // new one until the write deletes the replaced one, expired by then.
    assert!(
        history.most_live <= 3,
        "more than three tokens at once: {history:?}"
    );
    assert!(
        history.deleted_before_expiry.is_empty(),
        "replaced tokens deleted while an instance could still use them: {history:?}"
    );
    assert!(
        history.deleted.len() >= 2,
        "rotated at least twice: {history:?}"
    );
    assert!(
        history.deleted_while_handed_out.is_empty(),
        "tokens deleted while the data Secret still held them: {history:?}"
    );
    let rotated = counter(&env, "bootplate_bootstrap_tokens_total{action=\"rotated\"}");
    assert!(rotated >= 2.0, "{rotated} rotations counted");

    delete(&pools, "iota-pool").await;
    wait_nothing_left(&env, &BTreeSet::from(["iota-pool".to_owned()])).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.workload_client.clone());
    let scale_sets = env.dynamic(&objects::dev_machine_pool_resource());
    eventually(
        "the pool, its scale set and its Nodes gone",
        WAIT,
        || async {
            let gone = pools.get_opt("iota-pool").await.unwrap().is_none()
                && scale_sets.get_opt("iota-pool").await.unwrap().is_none()
                && nodes
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .is_empty();
            gone.then_some(())
        },
    )
    .await;
}

/// The pool's data Secret follows the contract and renders a worker of the pool's version; the
/// config says so and Cluster API took the Secret's name into the pool.
async fn assert_pool_secret(env: &CapiEnv) {
    let config = env.configs().get("iota-pool").await.unwrap();
    let status = &config.data["status"];
    assert_eq!(status["dataSecretName"], "iota-pool");
    assert_eq!(status["role"], "worker");
    assert_eq!(status["initialization"]["dataSecretCreated"], json!(true));
    let secret = data_secret(env, "iota-pool")
        .await
        .expect("the pool's data Secret");
    assert_contract_secret(&secret, "iota", &config);
    let user_data = user_data(&secret);
    assert_eq!(rendered_role(&user_data), "worker");
    assert!(
        user_data.contains(KUBERNETES_VERSION),
        "the pool's version:\n{user_data}"
    );
    assert!(
        !user_data.contains("name: \"iota-pool\""),
        "no node is named after the pool:\n{user_data}"
    );
    let pool = env
        .capi("MachinePool", "machinepools")
        .get("iota-pool")
        .await
        .unwrap();
    assert_eq!(
        pool.data["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"],
        "iota-pool"
    );
    assert_eq!(
        pool.data["status"]["initialization"]["bootstrapDataSecretCreated"],
        json!(true)
    );
}

/// While the management apiserver refuses writes of the pool's data Secret, a rotation makes a
/// new token but the Secret keeps handing out the old one, which stays; once writes go through,
/// the Secret holds the new token, and the old one is deleted once it has expired.
async fn rotation_waits_for_the_write(env: &CapiEnv) {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
    let [policy, binding] = freeze_secret("iota-pool");
    let policies = kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
    ));
    let bindings = kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
    ));
    testenv::capi::cloud::apply(&env.client, &policies, None, &policy)
        .await
        .unwrap();
    testenv::capi::cloud::apply(&env.client, &bindings, None, &binding)
        .await
        .unwrap();
    let probe = json!({"metadata": {"annotations": {"test.bootplate.dev/probe": "x"}}});
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        "the policy refuses writes of the data Secret",
        WAIT,
        || async {
            secrets
                .patch("iota-pool", &dry_run, &Patch::Merge(&probe))
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    let errors = "bootplate_reconciles_total{controller=\"config\",result=\"error\"}";
    let errors_before = counter(env, errors);
    let refused_before = refused_writes(env, "iota-pool").len();
    let held = handed_out(&secrets, "iota-pool")
        .await
        .unwrap()
        .expect("a token handed out");
    let before: BTreeSet<String> = env.tokens().await.iter().map(|t| t.name_any()).collect();
    let held_name = format!("bootstrap-token-{held}");
    eventually("a rotation makes a new token", WAIT, || async {
        let now = env.tokens().await;
        now.iter()
            .any(|t| !before.contains(&t.name_any()))
            .then_some(())
    })
    .await;
    let refused = eventually("the rotation's write is refused", WAIT, || async {
        let refused = refused_writes(env, "iota-pool");
        (refused.len() > refused_before).then(|| refused[refused_before].clone())
    })
    .await;
    assert!(
        refused.contains("the test holds this data Secret as it is"),
        "refused by the policy: {refused}"
    );
    assert!(
        counter(env, errors) > errors_before,
        "bootplate counts the refused write as a failed reconcile"
    );
    assert_eq!(
        handed_out(&secrets, "iota-pool").await.unwrap().as_deref(),
        Some(held.as_str())
    );
    assert!(
        env.tokens().await.iter().any(|t| t.name_any() == held_name),
        "the token the Secret still hands out was deleted"
    );
    Api::<DynamicObject>::all_with(env.client.clone(), &bindings)
        .delete("freeze-data-secret", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the new token written and the old one deleted once expired",
        WAIT,
        || async {
            let handed = handed_out(&secrets, "iota-pool").await.unwrap()?;
            let live = env.tokens().await;
            (handed != held && !live.iter().any(|t| t.name_any() == held_name)).then_some(())
        },
    )
    .await;
}

/// A changed config renders the pool's Secret again; the running instances keep what they
/// booted with.
async fn a_changed_config_renders_the_pool_again(env: &CapiEnv, running: &[Instance]) {
    merge_patch(
        &env.configs(),
        "iota-pool",
        json!({"spec": {"variables": {"kubeletExtraArgs": {"node-labels": "tier=pool"}}}}),
    )
    .await;
    eventually(
        "the pool's Secret rendered with the new variables",
        WAIT,
        || async {
            let secret = data_secret(env, "iota-pool").await?;
            user_data(&secret).contains("tier=pool").then_some(())
        },
    )
    .await;
    let instances = wait_instances(env, "iota-pool", running.len()).await;
    assert_eq!(instances, running, "running instances are not restarted");
}

/// (i) Real joins: for every shipped kubeadm template at two Kubernetes minors, a worker Machine
/// whose user-data bootplate rendered with the real token and CA hash of the workload cluster is
/// booted by the boot proof with the real kubeadm and kubelet (tests/boot/run.sh --real-kube):
/// kubeadm joins, the kubelet's CSR from `system:bootstrap:<token id>` is approved and signed by
/// the real kube-controller-manager, the kubelet registers the Node under the Machine's name,
/// Cluster API sets the Machine's nodeRef (the cloud only adds the provider ID, as a cloud
/// controller manager does) and bootplate deletes the token. The token's groups and expiry are
/// what kubeadm needed: the join is the proof. Then a worker that pins the wrong CA hash fails
/// its join and reports it (see [`a_wrong_ca_hash_is_reported_with_kubeadms_message`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i_every_kubeadm_template_joins_a_real_control_plane() {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let env = CapiEnv::start(Options {
        real_joins: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let version = joins::kube_version().unwrap();
    let versions = [joins::previous_minor(&version), version.clone()];
    let templates = joins::kubeadm_templates();
    assert!(templates.len() >= 6, "the shipped kubeadm templates");
    for t in &templates {
        publish_shipped_template(&env, &t.file.to_string_lossy()).await;
    }
    create_cluster(&env, "iota", ControlPlane::Provider(&version), false).await;
    let mut cases = Vec::new();
    for t in &templates {
        for v in &versions {
            let name = format!(
                "{}-{}",
                t.name.trim_start_matches("kubeadm-"),
                v.replace('.', "-")
            );
            let mut config = objects::bootplate_config(&name, &t.name);
            config["spec"]["variables"] = joins::sandbox_variables();
            env.apply(
                &objects::bootplate_resource("BootplateConfig", "bootplateconfigs"),
                config,
            )
            .await
            .unwrap();
            env.apply(
                &objects::dev_machine_resource(),
                objects::dev_machine(&name),
            )
            .await
            .unwrap();
            env.apply(
                &objects::machine_resource(),
                objects::worker_machine(&name, "iota", v),
            )
            .await
            .unwrap();
            cases.push((name, t, v.clone()));
        }
    }

    let tokens: Api<Secret> = Api::namespaced(env.workload_client.clone(), "kube-system");
    let csrs: Api<CertificateSigningRequest> = Api::all(env.workload_client.clone());
    for (name, template, version) in &cases {
        let secret = eventually(&format!("{name}'s data Secret"), WAIT, || async {
            data_secret(&env, name).await
        })
        .await;
        let config = env.configs().get(name).await.unwrap();
        let selector = format!(
            "bootstrap.bootplate.dev/config-uid={}",
            config.uid().unwrap()
        );
        let token = tokens
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items;
        assert_eq!(token.len(), 1, "{name}: one token in the workload cluster");
        let field =
            |key: &str| String::from_utf8(token[0].data.as_ref().unwrap()[key].0.clone()).unwrap();
        let token_id = field("token-id");
        assert!(
            field("auth-extra-groups").contains(joins::BOOTSTRAPPERS),
            "{name}"
        );

        let user_data = secret.data.as_ref().unwrap()["value"].0.clone();
        let (case, role, os) = (format!("capi-{name}"), "worker", template.os.clone());
        let version = version.clone();
        let boot = tokio::task::spawn_blocking(move || {
            joins::boot(&user_data, &case, role, &version, &os)
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(boot.status, Some(0), "{name}: {}", boot.explain());
        assert_eq!(
            boot.kubeadm_status("join"),
            Some(0),
            "{name}: {}",
            boot.explain()
        );
        assert_eq!(
            boot.registered_node(),
            Some(name.as_str()),
            "{name}: {}",
            boot.explain()
        );
        assert_eq!(
            boot.report["sentinel"],
            json!(true),
            "{name}: {}",
            boot.explain()
        );

        let requester = format!("system:bootstrap:{token_id}");
        let approved = csrs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .any(|csr| {
                csr.spec.username.as_deref() == Some(requester.as_str())
                    && csr.status.as_ref().is_some_and(|s| {
                        s.certificate.is_some()
                            && s.conditions
                                .iter()
                                .flatten()
                                .any(|c| c.type_ == "Approved" && c.status == "True")
                    })
            });
        assert!(
            approved,
            "{name}: no approved and signed CSR from {requester}"
        );
    }

    let machines = wait_running(&env, "iota", cases.len()).await;
    for machine in &machines {
        assert_eq!(
            machine.data["status"]["nodeRef"]["name"],
            json!(machine.name_any()),
            "the Node the real kubelet registered"
        );
    }
    // The workload cluster runs no token cleaner (`joins::JoinServices`): a deleted token is one
    // bootplate deleted.
    assert_every_join_token_deleted(&env, &machines, cases.len()).await;
    a_worker_joins_from_a_fetch_stub(&env, &version).await;
    a_wrong_ca_hash_is_reported_with_kubeadms_message(&env, &version).await;
}

/// Worker Machine `name` of cluster `iota` at `version` with BootplateConfig `config` (given
/// the boot proof's sandbox variables) and its DevMachine; its data Secret, once written.
async fn sandbox_worker(env: &CapiEnv, name: &str, mut config: Value, version: &str) -> Secret {
    config["spec"]["variables"] = joins::sandbox_variables();
    let configs = objects::bootplate_resource("BootplateConfig", "bootplateconfigs");
    env.apply(&configs, config).await.unwrap();
    env.apply(&objects::dev_machine_resource(), objects::dev_machine(name))
        .await
        .unwrap();
    env.apply(
        &objects::machine_resource(),
        objects::worker_machine(name, "iota", version),
    )
    .await
    .unwrap();
    eventually(&format!("{name}'s data Secret"), WAIT, || async {
        data_secret(env, name).await
    })
    .await
}

/// (i, continued) Fetch delivery (docs/boot-channel.md): a worker of `kubeadm-ubuntu-2404` whose
/// config sets `delivery: Fetch` gets a cloud-config stub of at most 3072 bytes; booted by the
/// boot proof, the stub checks the real `cluster-info` (signed for its token by the real
/// bootstrap signer, its CA against the hash) as `kubeadm join` discovery does, fetches its
/// sealed render from the real workload apiserver with its token, decrypts it with the image's
/// openssl and runs it: the real kubeadm joins, the kubelet registers the Node, Cluster API
/// sets the nodeRef, and bootplate deletes the token and the payload with it.
async fn a_worker_joins_from_a_fetch_stub(env: &CapiEnv, version: &str) {
    let name = "iota-fetch";
    let mut config = objects::bootplate_config(name, "kubeadm-ubuntu-2404");
    config["spec"]["delivery"] = json!("Fetch");
    let secret = sandbox_worker(env, name, config, version).await;
    let stub = user_data(&secret);
    assert!(
        stub.len() <= 3072 && stub.contains("bootplate fetch stub"),
        "a stub of {} bytes:\n{stub}",
        stub.len()
    );
    let uid = env.configs().get(name).await.unwrap().uid().unwrap();
    let payload = format!("bootplate-fetch-{uid}");
    let secrets: Api<Secret> = Api::namespaced(env.workload_client.clone(), "kube-system");
    assert!(secrets.get_opt(&payload).await.unwrap().is_some());
    let version = version.to_owned();
    let boot = tokio::task::spawn_blocking(move || {
        joins::boot(stub.as_bytes(), "capi-fetch", "worker", &version, "ubuntu")
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(boot.status, Some(0), "{}", boot.explain());
    assert_eq!(boot.kubeadm_status("join"), Some(0), "{}", boot.explain());
    // The boot proof looks for the kubelet's registration only in user-data that names
    // kubeadm, which a stub does not: the Node itself is the proof.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.workload_client.clone());
    assert!(
        nodes.get_opt(name).await.unwrap().is_some(),
        "the kubelet registered its Node: {}",
        boot.explain()
    );
    wait_machines(
        env,
        "iota",
        &format!("{name} Running with a nodeRef"),
        |machines| {
            machines
                .iter()
                .any(|m| m.name_any() == name && phase(m) == "Running" && has_node_ref(m))
        },
    )
    .await;
    eventually("the payload deleted after the join", WAIT, || async {
        secrets
            .get_opt(&payload)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// kubeadm's message when the CA it discovers is not the one the join pins.
const WRONG_CA_HASH_MESSAGE: &str = "cluster CA found in cluster-info ConfigMap is invalid";

/// (i, continued) The wrong-CA-hash drill, reported. A worker whose template pins a CA hash that
/// is not the cluster CA's boots with the real kubeadm, which refuses the CA it discovers. The
/// machine's reporter (curl, the machine's own token, the cluster CA) sends the failure, and
/// bootplate shows `Ready=False` reason `BootFailed` naming part `kubeadm-join` and its command,
/// with kubeadm's own message in the Warning Event's tail.
async fn a_wrong_ca_hash_is_reported_with_kubeadms_message(env: &CapiEnv, version: &str) {
    let zero_hash = format!("[\"sha256:{}\"]", "0".repeat(64));
    let template = doctored_template(
        "wrong-hash",
        "caCertHashes: {{json join.caCertHashes}}",
        &format!("caCertHashes: {zero_hash}"),
    );
    let templates =
        objects::bootplate_resource("ClusterBootstrapTemplate", "clusterbootstraptemplates");
    cloud::apply(&env.client, &templates, None, &template)
        .await
        .unwrap();
    let name = "iota-wrong-hash";
    let config = objects::bootplate_config(name, "kubeadm-wrong-hash");
    let secret = sandbox_worker(env, name, config, version).await;
    let user_data = secret.data.as_ref().unwrap()["value"].0.clone();
    let version = version.to_owned();
    let boot = tokio::task::spawn_blocking(move || {
        joins::boot(&user_data, "capi-wrong-hash", "worker", &version, "ubuntu")
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        matches!(boot.kubeadm_status("join"), Some(s) if s != 0)
            && boot.kubeadm_log().contains(WRONG_CA_HASH_MESSAGE),
        "kubeadm refuses the wrong hash: {}",
        boot.explain()
    );
    let uid = env.configs().get(name).await.unwrap().uid().unwrap();
    let reports: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.workload_client.clone(), "kube-system");
    let report = reports.get(&format!("bootplate-boot-{uid}")).await.unwrap();
    assert!(
        report
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key("report")),
        "the machine's report in its ConfigMap: {report:?}\n{}",
        boot.explain()
    );
    let ready = eventually(&format!("{name} BootFailed"), WAIT, || async {
        let config = env.configs().get(name).await.ok()?;
        let ready = condition(&config, "Ready")?;
        (ready["reason"] == "BootFailed").then(|| ready.clone())
    })
    .await;
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        ready["status"] == "False" && message.contains("part `kubeadm-join`, command 0"),
        "the failed part and step: {ready}"
    );
    let event = testenv::events::wait_reason(&env.client, NS, name, "BootFailed").await;
    let note = event.note.unwrap_or_default();
    assert!(
        event.type_.as_deref() == Some("Warning") && note.contains(WRONG_CA_HASH_MESSAGE),
        "kubeadm's own message in the Event's tail: {note}"
    );
}

/// A copy of the shipped template named `kubeadm-<name>` whose text has `from` replaced by `to`.
fn doctored_template(name: &str, from: &str, to: &str) -> Value {
    let text = repo_file(&format!("templates/{TEMPLATE}.yaml"));
    assert!(text.contains(from), "the shipped template renders {from:?}");
    let mut template: Value = serde_yaml::from_str(&text.replace(from, to)).unwrap();
    template["metadata"]["name"] = json!(format!("kubeadm-{name}"));
    template
}

/// (k) The cloud boots a machine only from user-data that would join. Beside a worker of the
/// shipped template, which runs, workers whose templates render a token the workload apiserver
/// does not know, CA hashes that do not pin the cluster CA, a control-plane join, another
/// endpoint, another node name or no `kubeadm join` stay unprovisioned: their DevMachines say
/// why, Cluster API gives them no Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_a_machine_whose_user_data_would_not_join_is_not_booted() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    publish_shipped_template(&env, "templates/kubeadm-ubuntu-2404.yaml").await;
    let zero_hash = format!("[\"sha256:{}\"]", "0".repeat(64));
    let doctored = [
        (
            "bad-token",
            "token: {{yaml_quote join.token}}",
            "token: \"abcdef.0123456789abcdef\"".to_owned(),
            "the workload apiserver refused join token abcdef",
        ),
        (
            "bad-ca-hash",
            "caCertHashes: {{json join.caCertHashes}}",
            format!("caCertHashes: {zero_hash}"),
            "do not pin the cluster CA",
        ),
        (
            "bad-role",
            "{{#if (eq machine.role \"control-plane-join\")}}\n            controlPlane:",
            "{{#if (eq machine.role \"worker\")}}\n            controlPlane:".to_owned(),
            "makes the machine control-plane-join, its Machine should be worker",
        ),
        (
            "bad-endpoint",
            "apiServerEndpoint: {{yaml_quote join.apiServerEndpoint}}",
            "apiServerEndpoint: \"api.elsewhere.example.com:6443\"".to_owned(),
            "apiServerEndpoint is \"api.elsewhere.example.com:6443\", the Cluster's",
        ),
        (
            "bad-node-name",
            "name: {{yaml_quote machine.name}}",
            "name: \"another-node\"".to_owned(),
            "nodeRegistration.name is \"another-node\"",
        ),
        (
            "no-join",
            "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml",
            "kubeadm version".to_owned(),
            "runs no `kubeadm join --config FILE`",
        ),
    ];
    let templates =
        objects::bootplate_resource("ClusterBootstrapTemplate", "clusterbootstraptemplates");
    for (name, from, to, _) in &doctored {
        let template = doctored_template(name, from, to);
        testenv::capi::cloud::apply(&env.client, &templates, None, &template)
            .await
            .unwrap();
    }
    create_cluster(
        &env,
        "kappa",
        ControlPlane::Provider(KUBERNETES_VERSION),
        false,
    )
    .await;
    let shipped = ("good", TEMPLATE.to_owned());
    let bad = doctored.iter().map(|(n, ..)| (*n, format!("kubeadm-{n}")));
    for (name, template) in std::iter::once(shipped).chain(bad) {
        let name = format!("kappa-{name}");
        let configs = objects::bootplate_resource("BootplateConfig", "bootplateconfigs");
        let config = objects::bootplate_config(&name, &template);
        env.apply(&configs, config).await.unwrap();
        let dev_machine = objects::dev_machine(&name);
        env.apply(&objects::dev_machine_resource(), dev_machine)
            .await
            .unwrap();
        let machine = objects::worker_machine(&name, "kappa", KUBERNETES_VERSION);
        env.apply(&objects::machine_resource(), machine)
            .await
            .unwrap();
    }

    for (name, _, _, why) in &doctored {
        wait_refused(&env, &format!("kappa-{name}"), why).await;
    }
    wait_machines(&env, "kappa", "kappa-good Running", |machines| {
        machines
            .iter()
            .any(|m| m.name_any() == "kappa-good" && phase(m) == "Running" && has_node_ref(m))
    })
    .await;
    for (name, ..) in &doctored {
        assert_not_booted(&env, &format!("kappa-{name}")).await;
    }
}

/// Waits until the cloud refused to boot DevMachine `name`, saying `why` and no token secret.
async fn wait_refused(env: &CapiEnv, name: &str, why: &str) {
    let dev_machines = env.dynamic(&objects::dev_machine_resource());
    let refused = eventually(&format!("{name} refused"), WAIT, || async {
        let machine = dev_machines.get(name).await.unwrap();
        let ready = condition(&machine, "Ready")?;
        (ready["reason"] == "BootRefused").then(|| ready.clone())
    })
    .await;
    assert_eq!(refused["status"], "False", "{name}: {refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains(why), "{name}: {message}");
    assert!(
        !message.contains("0123456789abcdef"),
        "{name}: the refusal names no token secret: {message}"
    );
}

/// bootplate rendered `name`'s data, but its machine never booted: no provider ID, not
/// provisioned, no Node, and Cluster API does not run the Machine.
async fn assert_not_booted(env: &CapiEnv, name: &str) {
    let dev_machine = env
        .dynamic(&objects::dev_machine_resource())
        .get(name)
        .await
        .unwrap();
    assert!(
        dev_machine.data["spec"]["providerID"].is_null()
            && dev_machine.data["status"]["initialization"]["provisioned"].is_null(),
        "{name} was booted: {:?}",
        dev_machine.data
    );
    let machine = env.capi("Machine", "machines").get(name).await.unwrap();
    assert!(
        !has_node_ref(&machine) && phase(&machine) != "Running",
        "{name}: {:?}",
        machine.data["status"]
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.workload_client.clone());
    assert!(
        nodes.get_opt(name).await.unwrap().is_none(),
        "{name}'s Node"
    );
    let config = env.configs().get(name).await.unwrap();
    assert_eq!(
        condition(&config, "Ready").expect("Ready")["status"],
        "True",
        "{name}: bootplate rendered what the cloud refused"
    );
}

/// Every label, annotation, Secret type and condition name bootplate takes from Cluster API
/// (`crd_types::capi`) is spelled as Cluster API's own API module (the version the tests run)
/// spells it: a wrong name fails quietly at run time (an annotation never seen is simply absent).
#[test]
fn cluster_api_names_bootplate_uses_are_those_of_cluster_apis_source() {
    use crd_types::capi;
    let source = testenv::tools::capi_api_source().expect("Cluster API's API module");
    let mut go = String::new();
    for dir in [
        "core/v1beta2",
        "runtime/v1beta2",
        "bootstrap/kubeadm/v1beta2",
    ] {
        let Ok(entries) = std::fs::read_dir(source.join(dir)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".go") && !name.ends_with("_test.go") {
                go.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    assert!(
        go.len() > 10_000,
        "read Cluster API's API types from {}",
        source.display()
    );
    for name in [
        capi::CLUSTER_NAME_LABEL,
        capi::CONTROL_PLANE_LABEL,
        capi::PAUSED_ANNOTATION,
        capi::UPDATE_IN_PROGRESS_ANNOTATION,
        capi::WATCH_FILTER_LABEL,
        capi::CLUSTER_SECRET_TYPE,
        capi::CONTROL_PLANE_INITIALIZED,
    ] {
        assert!(
            go.contains(&format!("\"{name}\"")),
            "Cluster API's source in {} has no string {name:?}",
            source.display()
        );
    }
}

/// The harness: bootplate restarted while another process holds the port its webhook was
/// registered on (here a listener that accepts connections and says nothing, as any other
/// server would to a bare TCP connect) comes up on a new port, the webhook configuration
/// follows it, and the management apiserver's calls reach bootplate's webhook again: a valid
/// template is admitted and a broken one denied with bootplate's own message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_a_restart_finds_its_webhook_port_taken_and_serves_on_another() {
    let mut env = CapiEnv::start(Options::default()).await.unwrap();
    let port = env.webhook_port();
    env.bootplate.kill();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).expect("the freed port");
    env.restart_bootplate(&[], "restarted.log").await.unwrap();
    assert_ne!(env.webhook_port(), port, "a new port");
    assert!(env.bootplate.is_running(), "{}", env.bootplate.log());

    let templates = objects::bootplate_resource("BootstrapTemplate", "bootstraptemplates");
    let template = |name: &str, body: &str| {
        json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1", "kind": "BootstrapTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"os": {"name": "linux"}, "format": "script", "template": body},
        })
    };
    // The apiserver may call the old port for a moment after the configuration changed.
    eventually(
        "a valid template admitted",
        Duration::from_secs(30),
        || async {
            env.apply(
                &templates,
                template("fine", "#!/bin/sh\necho {{machine.name}}\n"),
            )
            .await
            .ok()
        },
    )
    .await;
    let denied = env
        .apply(
            &templates,
            template("broken", "#!/bin/sh\n{{#if machine.name}}\n"),
        )
        .await
        .unwrap_err();
    assert!(
        format!("{denied:#}").contains("validate.bootstrap.bootplate.dev\" denied the request"),
        "{denied:#}"
    );
    drop(squatter);
}
