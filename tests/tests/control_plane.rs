//! A whole control plane from bootplate's renders under the real Cluster API manager (issue
//! 31): a Cluster with no control-plane provider, three control-plane Machines and a
//! MachineDeployment of two workers, each rendered by the running controller from a shipped
//! Debian-family template. The test cloud (testenv::capi::cloud with testenv::capi::hosts)
//! boots each Machine on a node of its own (testenv::node: its own network namespace and
//! address, real cloud-init running the Machine's user-data, containerd with the control-plane
//! images tests/scripts/build-images.sh built, the real kubeadm and kubelet): the `init`
//! Machine's real `kubeadm init` brings etcd, the apiserver, the controller-manager and the
//! scheduler up as static Pods from those local images; each `control-plane-join` Machine's
//! real `kubeadm join` adds an etcd member and an apiserver; the workers join. Every node
//! reaches the cluster through the control-plane endpoint (testenv::endpoint, in front of the
//! apiservers as a load balancer would be). etcd's members are what the real `etcdctl member
//! list` says. On the same cluster, two drills: the `init` Machine deleted while its instance
//! still runs `kubeadm init` (no second `init` until the lock is deleted by hand), and a
//! control-plane join that pins another CA (kubeadm's refusal, no etcd member added). Needs root,
//! the boot proof's Debian root (tests/boot/build-root.sh) and tests/scripts/install-tools.sh's
//! tools.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use testenv::capi::hosts::{Hosts, HostsSpec};
use testenv::endpoint::Endpoint;
use testenv::node::Node;
use testenv::{images, joins, tls_probe, tools};

/// The shipped template the control plane is rendered from, and the ClusterBootstrapTemplate
/// it holds.
const TEMPLATE: &str = "templates/kubeadm-debian-12.yaml";
const TEMPLATE_NAME: &str = "kubeadm-debian-12";

/// The repository the images are named in (the template's `imageRepository` variable): one
/// nothing can be pulled from, so every image must come from the node's containerd.
const REPOSITORY: &str = "bootplate.invalid/k8s";

/// The apiserver's port on the control-plane endpoint.
const PORT: u16 = 6443;

/// The template's variables on these nodes: the sandbox's (joins::sandbox_variables), the
/// local images' repository and sandbox image, and the preflight checks a chroot without
/// systemd fails (swap is the host's, and so are the kernel modules).
fn variables(pause: &str) -> Value {
    let mut variables = joins::sandbox_variables();
    variables["imageRepository"] = json!(REPOSITORY);
    variables["sandboxImage"] = json!(pause);
    variables["kubeadmIgnorePreflightErrors"]
        .as_array_mut()
        .expect("a list")
        .extend([json!("Swap"), json!("Mem"), json!("NumCPU")]);
    variables
}

/// The control-plane images in [`REPOSITORY`], and the sandbox image's reference.
fn control_plane_images() -> (Vec<PathBuf>, String) {
    let archives = images::archives_in(Some(REPOSITORY), &images::KUBEADM_IMAGES)
        .expect("the control-plane images");
    let pause = testenv::pod_cluster::images::reference_of(&archives["pause"]).unwrap();
    (archives.into_values().collect(), pause)
}

/// The names of etcd's members: `etcdctl member list` against the etcd at `node`, with the
/// etcd client certificate kubeadm made there.
fn etcd_members(node: &Node) -> Vec<String> {
    let pki = node.dir().join("etc-kubernetes/pki/etcd");
    let endpoint = format!("https://{}:2379", node.address());
    let out = Command::new(tools::path("etcdctl").expect("etcdctl"))
        .arg(format!("--endpoints={endpoint}"))
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("healthcheck-client.crt"))
        .arg("--key")
        .arg(pki.join("healthcheck-client.key"))
        .args([
            "--command-timeout=10s",
            "member",
            "list",
            "--write-out=json",
        ])
        .output()
        .expect("etcdctl runs");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "etcdctl member list at {endpoint}: {body}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("etcdctl member list at {endpoint}: {e}: {body}"));
    let mut names: Vec<String> = list["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members in {body}"))
        .iter()
        .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names
}

/// The Nodes `kubectl get nodes` lists through `node`'s admin.conf (the control-plane endpoint).
fn listed_nodes(node: &Node) -> Vec<String> {
    let out = node
        .kubectl(&["get", "nodes", "-o", "name"])
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl get nodes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("node/").to_owned())
        .collect();
    names.sort();
    names
}

/// Asserts that the apiserver at `ip` (or the endpoint in front of them) serves a certificate
/// for `ip` of the cluster CA `ca`.
async fn serves_cluster_certificate(ip: Ipv4Addr, ca: &str, what: &str) {
    tls_probe::handshake_at(ip, PORT, ca)
        .await
        .unwrap_or_else(|e| panic!("{what} at {ip}: the serving certificate: {e:#}"));
}

/// The Cluster of the scenario under Cluster API, and its Machines: three control-plane ones
/// and a MachineDeployment of two workers.
const CLUSTER: &str = "whole";
const CONTROL_PLANE: [&str; 3] = ["whole-cp-0", "whole-cp-1", "whole-cp-2"];
/// The control-plane Machine that replaces the `init` one the first drill deletes.
const REPLACEMENT: &str = "whole-cp-3";
const WORKERS: &str = "whole-md";
/// How long the scenario waits for a step (a whole control plane boots one machine at a time).
const SCENARIO_WAIT: Duration = Duration::from_secs(600);
/// How long bootplate may take to delete the join tokens of Machines that joined.
const TOKENS_WAIT: Duration = Duration::from_secs(180);

/// (A) A whole control plane under the real Cluster API manager: a Cluster with no
/// control-plane provider (the user brings the cluster CA and names the control-plane
/// endpoint), three control-plane Machines and a MachineDeployment of two workers, each
/// rendered by the running controller from the shipped kubeadm-debian-12 template. The test
/// cloud boots every Machine on a real host once its bootstrap data is there
/// (`testenv::capi::hosts`, a bridge pod network on each) and gives each Node its provider ID as a cloud controller manager
/// does; Cluster API writes the `<cluster>-kubeconfig` Secret from the CA the user brought, and
/// the cloud reaches the new cluster with it. Cluster API sets every Machine's nodeRef; every
/// Node is Ready; bootplate deletes every join token; etcd lists three members; every apiserver
/// serves a certificate of the cluster CA; `kubectl get nodes` lists five Nodes. Before that,
/// the first drill ([`init_machine_deleted_before_it_finishes`]); after it, the second
/// ([`a_control_plane_join_with_a_wrong_ca_adds_no_member`]).
#[tokio::test(flavor = "multi_thread")]
async fn a_whole_control_plane_under_cluster_api() {
    use testenv::capi::{CapiEnv, Options, objects};
    let (images, pause) = control_plane_images();
    let ca = testenv::pki::TestCa::new("kubernetes");
    let endpoint = std::sync::Arc::new(Endpoint::start(PORT, &ca.cert_pem).expect("endpoint"));
    let version = joins::kube_version().unwrap();
    let hosts = Hosts::new(HostsSpec {
        version: version.clone(),
        images,
        endpoint: endpoint.clone(),
    });
    let env = CapiEnv::start(Options {
        hosts: Some(hosts.clone()),
        cluster_ca: Some(ca.clone()),
        ..Options::default()
    })
    .await
    .unwrap();
    env.publish_shipped_template(TEMPLATE).await.unwrap();
    env.bring_cluster_ca(CLUSTER).await.unwrap();
    env.apply(
        &objects::dev_cluster_resource(),
        objects::dev_cluster(CLUSTER),
    )
    .await
    .unwrap();
    let mut cluster = objects::cluster(CLUSTER, None, false);
    cluster["spec"]["controlPlaneEndpoint"] =
        json!({"host": endpoint.address().to_string(), "port": PORT});
    env.apply(&objects::cluster_resource(), cluster)
        .await
        .unwrap();
    let spec = MachineSpec {
        version: &version,
        pause: &pause,
    };
    for name in CONTROL_PLANE {
        create_control_plane_machine(&env, (name, &[]), TEMPLATE_NAME, spec).await;
    }
    create_workers(&env, spec).await;

    let control_plane = init_machine_deleted_before_it_finishes(&env, &hosts, spec).await;
    let init = wait_init_host(&env, &hosts, &control_plane).await;
    let kubeconfig = capi_kubeconfig(&env).await;
    hosts.set_workload(client_of(&kubeconfig).await);
    let machines = wait_every_node_ref(&env).await;
    wait_every_node_ready(&hosts.workload().unwrap()).await;
    let whole = WholeCluster {
        machines: &machines,
        init: &init,
        control_plane: &control_plane,
    };
    assert_whole_cluster(&env, &hosts, whole, &endpoint).await;
    a_control_plane_join_with_a_wrong_ca_adds_no_member(&env, &hosts, whole, spec).await;
}

/// What every Machine of the scenario is made with: its Kubernetes version and the sandbox
/// image its template gets.
#[derive(Clone, Copy)]
struct MachineSpec<'a> {
    version: &'a str,
    pause: &'a str,
}

/// The control-plane Machines' names once the first drill replaced the deleted one.
fn live_control_plane(deleted: &str) -> Vec<String> {
    let mut names: Vec<String> = CONTROL_PLANE
        .iter()
        .filter(|name| **name != deleted)
        .map(|name| (*name).to_owned())
        .chain([REPLACEMENT.to_owned()])
        .collect();
    names.sort();
    names
}

/// (B) The `init` Machine deleted before it finishes: its instance was handed the `init` data
/// and runs `kubeadm init` on, as one would whose termination failed; Cluster API removes the
/// Machine, and the Cluster never reports initialized from it. bootplate must not let a second
/// machine initialize behind the same endpoint: the other control-plane configs show
/// `InitHolderGone` naming the deleted Machine and the lock, get no data, and the lock still
/// names the deleted Machine's UID, also once that instance's `kubeadm init` ended. Then what
/// the message asks: the instance terminated (the cloud removes the host), the lock deleted; one
/// of the others initializes, and a replacement Machine makes three again. Returns the
/// control-plane Machines the cluster is then made of.
async fn init_machine_deleted_before_it_finishes(
    env: &testenv::capi::CapiEnv,
    hosts: &Hosts,
    spec: MachineSpec<'_>,
) -> Vec<String> {
    use kube::ResourceExt;
    let first = wait_host_started(env, hosts).await;
    let machines = env.dynamic(&testenv::capi::objects::machine_resource());
    let uid = machines.get(&first).await.unwrap().uid().unwrap();
    machines.delete(&first, &Default::default()).await.unwrap();
    assert_eq!(
        hosts.state_of(&first),
        Some(testenv::capi::hosts::HostState::Booting),
        "{first} was deleted while its instance still ran `kubeadm init`"
    );
    let others: Vec<&str> = CONTROL_PLANE.into_iter().filter(|n| *n != first).collect();
    for name in &others {
        let message = wait_config_reason(env, name, "InitHolderGone").await;
        let lock = format!("ConfigMap {}/{CLUSTER}-lock", testenv::capi::NS);
        assert!(
            message.contains(&format!("Machine {first},")) && message.contains(&lock),
            "{name}: {message}"
        );
    }
    let ended = testenv::eventually(
        "the deleted Machine's boot ended",
        SCENARIO_WAIT,
        || async {
            hosts
                .state_of(&first)
                .filter(|s| *s != testenv::capi::hosts::HostState::Booting)
        },
    )
    .await;
    eprintln!("{first}'s instance after its Machine was deleted: {ended:?}");
    assert_no_second_init(env, &others, &uid).await;

    // The way out the message names: the instance gone, the lock deleted by hand.
    hosts.remove(&first);
    let locks = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        env.client.clone(),
        testenv::capi::NS,
    );
    locks
        .delete(&format!("{CLUSTER}-lock"), &Default::default())
        .await
        .unwrap();
    create_control_plane_machine(env, (REPLACEMENT, &[]), TEMPLATE_NAME, spec).await;
    live_control_plane(&first)
}

/// Waits until a control-plane Machine's host started booting (the `init` one: the others
/// render only once the Cluster reports initialized); its name.
async fn wait_host_started(env: &testenv::capi::CapiEnv, hosts: &Hosts) -> String {
    let deadline = std::time::Instant::now() + SCENARIO_WAIT;
    loop {
        if let Some(name) = CONTROL_PLANE
            .iter()
            .find(|name| hosts.state_of(name).is_some())
        {
            return (*name).to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no control-plane host started:\n{}",
            env.describe().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The message of config `name`'s `Ready` condition once its reason is `reason`.
async fn wait_config_reason(env: &testenv::capi::CapiEnv, name: &str, reason: &str) -> String {
    testenv::configs::wait_reason(
        &env.client,
        testenv::capi::NS,
        (name, reason),
        SCENARIO_WAIT,
    )
    .await
}

/// No config of `others` rendered: each still shows `InitHolderGone` with no data Secret, and
/// the lock still names the deleted Machine `uid`.
async fn assert_no_second_init(env: &testenv::capi::CapiEnv, others: &[&str], uid: &str) {
    for name in others {
        let config = testenv::configs::config(&env.client, testenv::capi::NS, name).await;
        let status = config.status.unwrap_or_default();
        let reason = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.reason.clone());
        assert!(
            status.data_secret_name.is_none() && reason.as_deref() == Some("InitHolderGone"),
            "{name} got no data: {reason:?} {:?}",
            status.data_secret_name
        );
    }
    let locks = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        env.client.clone(),
        testenv::capi::NS,
    );
    let lock = locks.get(&format!("{CLUSTER}-lock")).await.unwrap();
    assert_eq!(
        lock.data
            .unwrap_or_default()
            .get("machineUID")
            .map(String::as_str),
        Some(uid),
        "the lock still names the deleted Machine"
    );
}

/// kubeadm's message when the CA it discovers is not the one the join pins.
const WRONG_CA_MESSAGE: &str = "cluster CA found in cluster-info ConfigMap is invalid";

/// (C) A control-plane join with a wrong CA, on the whole cluster: a Machine whose template
/// pins another cluster's CA hash renders `control-plane-join`; on its host the real `kubeadm
/// join` refuses the CA it discovers, with its own message, and etcd lists the same three
/// members. The machine's boot report makes its config `BootFailed`, kubeadm's message in the
/// Warning Event's tail.
async fn a_control_plane_join_with_a_wrong_ca_adds_no_member(
    env: &testenv::capi::CapiEnv,
    hosts: &Hosts,
    whole: WholeCluster<'_>,
    spec: MachineSpec<'_>,
) {
    use testenv::capi::hosts::HostState;
    let other_ca = testenv::pki::TestCa::new("kubernetes");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(TEMPLATE);
    let text = std::fs::read_to_string(path).unwrap();
    let pinned = "caCertHashes: {{json join.caCertHashes}}";
    assert!(text.contains(pinned), "the shipped template pins the hash");
    let doctored = text.replace(
        pinned,
        &format!("caCertHashes: [\"{}\"]", other_ca.ca_hash()),
    );
    let mut template: Value = serde_yaml::from_str(&doctored).unwrap();
    let name = format!("{TEMPLATE_NAME}-wrong-ca");
    template["metadata"]["name"] = json!(name);
    let resource = testenv::capi::objects::bootplate_resource(
        "ClusterBootstrapTemplate",
        "clusterbootstraptemplates",
    );
    testenv::capi::cloud::apply(&env.client, &resource, None, &template)
        .await
        .unwrap();
    let machine = "whole-cp-wrong-ca";
    // The cloud would refuse to boot it (its hash pins no cluster CA): the drill is what the
    // real kubeadm does with it.
    let unchecked = [testenv::capi::cloud::UNCHECKED_BOOT_LABEL];
    create_control_plane_machine(env, (machine, &unchecked), &name, spec).await;
    let failed = testenv::eventually("the wrong-CA join's boot", SCENARIO_WAIT, || async {
        match hosts.state_of(machine)? {
            HostState::Failed(why) => Some(why),
            HostState::Booted(_) => panic!("{machine} joined with another cluster's CA"),
            HostState::Booting => None,
        }
    })
    .await;
    assert!(
        failed.contains("(control-plane-join)") && failed.contains(WRONG_CA_MESSAGE),
        "kubeadm refuses the CA: {failed}"
    );
    let members = hosts.with_node(whole.init, etcd_members).unwrap();
    assert_eq!(members, whole.control_plane, "no etcd member added");
    wait_config_reason(env, machine, "BootFailed").await;
    let event =
        testenv::events::wait_reason(&env.client, testenv::capi::NS, machine, "BootFailed").await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(WRONG_CA_MESSAGE),
        "kubeadm's own message in the Event's tail: {note}"
    );
}

/// Control-plane Machine `name` (with `labels`, each `true`) with its BootplateConfig (the
/// scenario's variables) rendered from ClusterBootstrapTemplate `template`.
async fn create_control_plane_machine(
    env: &testenv::capi::CapiEnv,
    (name, labels): (&str, &[&str]),
    template: &str,
    spec: MachineSpec<'_>,
) {
    use testenv::capi::objects;
    let mut config = objects::bootplate_config(name, template);
    config["spec"]["variables"] = variables(spec.pause);
    let resource = objects::bootplate_resource("BootplateConfig", "bootplateconfigs");
    env.apply(&resource, config).await.unwrap();
    env.apply(&objects::dev_machine_resource(), objects::dev_machine(name))
        .await
        .unwrap();
    let mut machine = objects::control_plane_machine(name, CLUSTER);
    machine["spec"]["version"] = json!(spec.version);
    for label in labels {
        machine["metadata"]["labels"][*label] = json!("true");
    }
    env.apply(&objects::machine_resource(), machine)
        .await
        .unwrap();
}

/// The MachineDeployment of two workers (a BootplateConfigTemplate with the scenario's
/// variables).
async fn create_workers(env: &testenv::capi::CapiEnv, spec: MachineSpec<'_>) {
    use testenv::capi::objects;
    let mut template = objects::bootplate_config_template(WORKERS, TEMPLATE_NAME);
    template["spec"]["template"]["spec"]["variables"] = variables(spec.pause);
    let resource =
        objects::bootplate_resource("BootplateConfigTemplate", "bootplateconfigtemplates");
    env.apply(&resource, template).await.unwrap();
    env.apply(
        &objects::dev_machine_template_resource(),
        objects::dev_machine_template(WORKERS, "small"),
    )
    .await
    .unwrap();
    let deployment =
        objects::machine_deployment(WORKERS, CLUSTER, 2, WORKERS, WORKERS, spec.version);
    env.apply(&objects::machine_deployment_resource(), deployment)
        .await
        .unwrap();
}

/// Waits until one of the `control_plane` Machines' host booted (the first one is the `init`
/// one: the others join only once the Cluster reports its control plane initialized); its name.
async fn wait_init_host(
    env: &testenv::capi::CapiEnv,
    hosts: &Hosts,
    control_plane: &[String],
) -> String {
    let deadline = std::time::Instant::now() + SCENARIO_WAIT;
    loop {
        if let Some(name) = control_plane
            .iter()
            .find(|name| hosts.with_node(name, |_| ()).is_some())
        {
            return name.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no control-plane host booted:\n{}",
            env.describe().await
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The `<cluster>-kubeconfig` Secret's kubeconfig: Cluster API's Cluster controller writes it
/// (owned by the Cluster) from the `<cluster>-ca` the user brought and the control-plane
/// endpoint, as it does for every Cluster without a control-plane provider.
async fn capi_kubeconfig(env: &testenv::capi::CapiEnv) -> String {
    use k8s_openapi::api::core::v1::Secret;
    let secrets = kube::Api::<Secret>::namespaced(env.client.clone(), testenv::capi::NS);
    let name = format!("{CLUSTER}-kubeconfig");
    let secret = testenv::eventually("Cluster API's kubeconfig Secret", SCENARIO_WAIT, || async {
        secrets.get_opt(&name).await.unwrap()
    })
    .await;
    let owners = secret.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "Cluster" && o.name == CLUSTER),
        "{name} is Cluster API's (owned by the Cluster): {owners:?}"
    );
    let value = &secret.data.as_ref().expect("data")["value"].0;
    String::from_utf8(value.clone()).unwrap()
}

async fn client_of(kubeconfig: &str) -> kube::Client {
    let config = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Waits until Cluster API set the nodeRef of all five Machines; returns them.
async fn wait_every_node_ref(env: &testenv::capi::CapiEnv) -> Vec<kube::api::DynamicObject> {
    let deadline = std::time::Instant::now() + SCENARIO_WAIT;
    loop {
        let machines = env.capi_list("Machine", "machines", CLUSTER).await;
        let with_node = machines
            .iter()
            .filter(|m| m.data["status"]["nodeRef"]["name"].is_string())
            .count();
        if machines.len() == 5 && with_node == 5 {
            return machines;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{with_node} of {} Machines have a nodeRef:\n{}",
            machines.len(),
            env.describe().await
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Waits until the new cluster's five Nodes are Ready (each kubelet found its pod network).
async fn wait_every_node_ready(workload: &kube::Client) {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(workload.clone());
    testenv::eventually("five Nodes Ready", TOKENS_WAIT, || async {
        let list = nodes.list(&Default::default()).await.ok()?.items;
        let ready = list.iter().filter(|node| {
            let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
            conditions
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        (list.len() == 5 && ready.count() == 5).then_some(())
    })
    .await;
}

/// The whole cluster: its five Machines, the `init` one's name and the control-plane ones'.
#[derive(Clone, Copy)]
struct WholeCluster<'a> {
    machines: &'a [kube::api::DynamicObject],
    init: &'a str,
    control_plane: &'a [String],
}

/// What the whole cluster must be: each Machine's nodeRef names its Node, every join token is
/// gone and bootplate counted each deletion, etcd has the three control-plane members, each
/// apiserver and the endpoint serve a certificate of the cluster CA, five Nodes.
async fn assert_whole_cluster(
    env: &testenv::capi::CapiEnv,
    hosts: &Hosts,
    whole: WholeCluster<'_>,
    endpoint: &Endpoint,
) {
    use kube::ResourceExt;
    use testenv::capi::boot::BootRecord;
    let (machines, init) = (whole.machines, whole.init);
    let ca = env.cluster_ca.cert_pem.clone();
    let mut names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    names.sort();
    for machine in machines {
        assert_eq!(
            machine.data["status"]["nodeRef"]["name"],
            json!(machine.name_any()),
            "the Node the real kubelet registered"
        );
    }
    let dev_machines = env.dynamic(&testenv::capi::objects::dev_machine_resource());
    let mut token_ids = Vec::new();
    for machine in machines {
        let infra = machine.data["spec"]["infrastructureRef"]["name"]
            .as_str()
            .unwrap();
        let record = BootRecord::of(&dev_machines.get(infra).await.unwrap())
            .unwrap_or_else(|| panic!("{}: no boot record", machine.name_any()));
        token_ids.extend(record.token_id);
    }
    token_ids.sort();
    token_ids.dedup();
    assert_eq!(
        token_ids.len(),
        4,
        "four Machines joined, each with a token of its own"
    );
    let workload = hosts.workload().unwrap();
    let tokens: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(workload, "kube-system");
    testenv::eventually("every join token deleted", TOKENS_WAIT, || async {
        for id in &token_ids {
            let name = format!("bootstrap-token-{id}");
            if tokens.get_opt(&name).await.unwrap().is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    let deleted = env
        .bootplate
        .metric("bootplate_bootstrap_tokens_total{action=\"deleted\"}")
        .expect("bootplate's metrics hold the deleted tokens");
    assert_eq!(deleted, 4.0, "tokens bootplate deleted");
    let members = hosts.with_node(init, etcd_members).unwrap();
    assert_eq!(members, whole.control_plane, "etcd's members");
    for name in whole.control_plane {
        let address = hosts.with_node(name, Node::address).unwrap();
        serves_cluster_certificate(address, &ca, name).await;
    }
    serves_cluster_certificate(endpoint.address(), &ca, "the endpoint").await;
    let listed = hosts.with_node(init, listed_nodes).unwrap();
    assert_eq!(listed, names, "kubectl get nodes");
    for name in &names {
        let own = hosts.with_node(name, |node| (node.pods_in_own_cgroup(), node.cgroup_root()));
        let (own, root) = own.unwrap_or_else(|| panic!("{name} has no host"));
        assert!(own, "{name}'s kubelet keeps its pods under {root}");
    }
}
