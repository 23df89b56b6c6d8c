//! A whole control plane from bootplate's renders under the real Cluster API manager (issue
//! 31): a Cluster with no control-plane provider, three control-plane Machines and a
//! MachineDeployment of one worker per other template, each rendered by the running controller
//! from a shipped kubeadm template: every one of them (`joins::kubeadm_templates`, the Ignition
//! one and the RPM families included) renders a node of the one control plane, each Machine's
//! DevMachine naming its template's OS image (the boot proof's `--os`). The test cloud (testenv::capi::cloud with testenv::capi::hosts)
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
use testenv::joins::ShippedTemplate;
use testenv::node::Node;
use testenv::{images, joins, tls_probe, tools};

/// The shipped template the wrong-CA drill doctors, and the ClusterBootstrapTemplate it holds.
const TEMPLATE: &str = "templates/kubeadm-debian-12.yaml";
const TEMPLATE_NAME: &str = "kubeadm-debian-12";
/// The OS image the drill's Machine boots (the boot proof's root as it is).
const TEMPLATE_OS: &str = "debian";

/// The files every control-plane node must hold alike, under `/etc/kubernetes/pki`: the key
/// pairs bootplate hands each control-plane render (fresh ones on a joiner would still make
/// an apiserver that serves, and break every token and aggregated API across the nodes).
const SHARED_PKI: [&str; 4] = ["ca.crt", "sa.pub", "front-proxy-ca.crt", "etcd/ca.crt"];

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
/// and a MachineDeployment of one worker per template no control-plane Machine takes.
const CLUSTER: &str = "whole";
const CONTROL_PLANE: [&str; 3] = ["whole-cp-0", "whole-cp-1", "whole-cp-2"];
/// The control-plane Machine that replaces the `init` one the first drill deletes.
const REPLACEMENT: &str = "whole-cp-3";

/// Which shipped template renders which Machine: control-plane Machine `i` the `i`-th template
/// (the replacement the deleted Machine's), one worker MachineDeployment of a single Machine per
/// template after those. So every kubeadm template renders a node of the cluster, whichever
/// control-plane Machine the first drill deletes.
struct Placement {
    templates: Vec<ShippedTemplate>,
}

impl Placement {
    fn new() -> Placement {
        let templates = joins::kubeadm_templates();
        assert!(
            templates.len() > CONTROL_PLANE.len(),
            "more shipped kubeadm templates than control-plane Machines: {}",
            templates.len()
        );
        Placement { templates }
    }

    /// The template of control-plane Machine `machine` (one of [`CONTROL_PLANE`]).
    fn control_plane(&self, machine: &str) -> &ShippedTemplate {
        let index = CONTROL_PLANE
            .iter()
            .position(|name| *name == machine)
            .unwrap_or_else(|| panic!("{machine} is not an initial control-plane Machine"));
        &self.templates[index]
    }

    /// The templates of the workers, one MachineDeployment each.
    fn workers(&self) -> &[ShippedTemplate] {
        &self.templates[CONTROL_PLANE.len()..]
    }

    /// How many Machines the cluster is made of once the first drill replaced the deleted one.
    fn machines(&self) -> usize {
        CONTROL_PLANE.len() + self.workers().len()
    }

    /// Every template's ClusterBootstrapTemplate name.
    fn names(&self) -> std::collections::BTreeSet<String> {
        self.templates.iter().map(|t| t.name.clone()).collect()
    }
}

/// The worker MachineDeployment (and its config and machine templates) of `template`.
fn workers_name(template: &ShippedTemplate) -> String {
    format!("whole-{}", template.name.trim_start_matches("kubeadm-"))
}
/// How long the scenario waits for a step (a whole control plane boots one machine at a time).
const SCENARIO_WAIT: Duration = Duration::from_secs(600);
/// How long bootplate may take to delete the join tokens of Machines that joined.
const TOKENS_WAIT: Duration = Duration::from_secs(180);

/// (A) A whole control plane under the real Cluster API manager: a Cluster with no
/// control-plane provider (the user brings the cluster CA and names the control-plane
/// endpoint), three control-plane Machines and a MachineDeployment of one worker per other
/// template ([`Placement`]), each rendered by the running controller from a shipped kubeadm
/// template and booted from its OS image. The test cloud boots every Machine on a real host once
/// its bootstrap data is there (`testenv::capi::hosts`, a bridge pod network on each) and gives
/// each Node its provider ID as a cloud controller manager does; Cluster API writes the
/// `<cluster>-kubeconfig` Secret from the CA the user brought, and the cloud reaches the new
/// cluster with it. Cluster API sets every Machine's nodeRef; every Node is Ready; the Nodes
/// come from every template; bootplate deletes every join token; etcd lists three members;
/// every control-plane node holds the `init` node's CA, service-account and front-proxy keys;
/// every apiserver answers `/readyz` with a certificate of the cluster CA; `kubectl get nodes`
/// lists every Machine. Before that, the first drill ([`init_machine_deleted_before_it_finishes`]);
/// after it, the second ([`a_control_plane_join_with_a_wrong_ca_adds_no_member`]).
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
    let placement = Placement::new();
    for template in &placement.templates {
        env.publish_shipped_template(&template.file.to_string_lossy())
            .await
            .unwrap();
    }
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
        let template = placement.control_plane(name);
        create_control_plane_machine(&env, ControlPlaneMachine::of(name, template), spec).await;
    }
    create_workers(&env, &placement, spec).await;

    let control_plane =
        init_machine_deleted_before_it_finishes(&env, &hosts, &placement, spec).await;
    let init = wait_init_host(&env, &hosts, &control_plane).await;
    let kubeconfig = capi_kubeconfig(&env).await;
    hosts.set_workload(client_of(&kubeconfig).await);
    let machines = wait_every_node_ref(&env, placement.machines()).await;
    wait_every_node_ready(&hosts.workload().unwrap(), placement.machines()).await;
    let whole = WholeCluster {
        machines: &machines,
        init: &init,
        control_plane: &control_plane,
    };
    assert_every_template_rendered_a_node(&env, &machines, &placement).await;
    assert_whole_cluster(&env, &hosts, whole, &endpoint).await;
    a_control_plane_join_with_a_wrong_ca_adds_no_member(&env, &hosts, whole, spec).await;
}

/// A control-plane Machine to create: its name, labels (each `true`), the
/// ClusterBootstrapTemplate its config references and the OS image its DevMachine names.
struct ControlPlaneMachine<'a> {
    name: &'a str,
    labels: &'a [&'a str],
    template: &'a str,
    os: &'a str,
}

impl<'a> ControlPlaneMachine<'a> {
    fn of(name: &'a str, template: &'a ShippedTemplate) -> ControlPlaneMachine<'a> {
        ControlPlaneMachine {
            name,
            labels: &[],
            template: &template.name,
            os: &template.os,
        }
    }
}

/// The ClusterBootstrapTemplate behind each of `machines` (its BootplateConfig's
/// `templateRef`) is, taken together, every shipped kubeadm template: each rendered a node.
async fn assert_every_template_rendered_a_node(
    env: &testenv::capi::CapiEnv,
    machines: &[kube::api::DynamicObject],
    placement: &Placement,
) {
    let mut rendered = std::collections::BTreeSet::new();
    for machine in machines {
        let config_name = machine.data["spec"]["bootstrap"]["configRef"]["name"]
            .as_str()
            .expect("a bootstrap config");
        let config = testenv::configs::config(&env.client, testenv::capi::NS, config_name).await;
        rendered.insert(config.spec.template_ref.name.clone());
    }
    assert_eq!(
        rendered,
        placement.names(),
        "the templates behind the Nodes"
    );
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
    placement: &Placement,
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
    // The replacement takes the deleted Machine's template: that template still renders a node.
    let template = placement.control_plane(&first);
    create_control_plane_machine(env, ControlPlaneMachine::of(REPLACEMENT, template), spec).await;
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
    let drill = ControlPlaneMachine {
        name: machine,
        labels: &unchecked,
        template: &name,
        os: TEMPLATE_OS,
    };
    create_control_plane_machine(env, drill, spec).await;
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

/// Control-plane Machine `machine` with its BootplateConfig (the scenario's variables) and its
/// DevMachine (booting the template's OS image).
async fn create_control_plane_machine(
    env: &testenv::capi::CapiEnv,
    machine: ControlPlaneMachine<'_>,
    spec: MachineSpec<'_>,
) {
    use testenv::capi::objects;
    let name = machine.name;
    let mut config = objects::bootplate_config(name, machine.template);
    config["spec"]["variables"] = variables(spec.pause);
    let resource = objects::bootplate_resource("BootplateConfig", "bootplateconfigs");
    env.apply(&resource, config).await.unwrap();
    let mut dev_machine = objects::dev_machine(name);
    dev_machine["spec"]["image"] = json!(machine.os);
    env.apply(&objects::dev_machine_resource(), dev_machine)
        .await
        .unwrap();
    let mut capi_machine = objects::control_plane_machine(name, CLUSTER);
    capi_machine["spec"]["version"] = json!(spec.version);
    for label in machine.labels {
        capi_machine["metadata"]["labels"][*label] = json!("true");
    }
    env.apply(&objects::machine_resource(), capi_machine)
        .await
        .unwrap();
}

/// A MachineDeployment of one worker per template of [`Placement::workers`] (its
/// BootplateConfigTemplate with the scenario's variables, its DevMachineTemplate booting the
/// template's OS image).
async fn create_workers(
    env: &testenv::capi::CapiEnv,
    placement: &Placement,
    spec: MachineSpec<'_>,
) {
    use testenv::capi::objects;
    for template in placement.workers() {
        let name = workers_name(template);
        let mut config_template = objects::bootplate_config_template(&name, &template.name);
        config_template["spec"]["template"]["spec"]["variables"] = variables(spec.pause);
        let resource =
            objects::bootplate_resource("BootplateConfigTemplate", "bootplateconfigtemplates");
        env.apply(&resource, config_template).await.unwrap();
        let mut machine_template = objects::dev_machine_template(&name, "small");
        machine_template["spec"]["template"]["spec"]["image"] = json!(template.os);
        env.apply(&objects::dev_machine_template_resource(), machine_template)
            .await
            .unwrap();
        let deployment = objects::machine_deployment(&name, CLUSTER, 1, &name, &name, spec.version);
        env.apply(&objects::machine_deployment_resource(), deployment)
            .await
            .unwrap();
    }
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

/// Waits until Cluster API set the nodeRef of all `count` Machines; returns them.
async fn wait_every_node_ref(
    env: &testenv::capi::CapiEnv,
    count: usize,
) -> Vec<kube::api::DynamicObject> {
    let deadline = std::time::Instant::now() + SCENARIO_WAIT;
    loop {
        let machines = env.capi_list("Machine", "machines", CLUSTER).await;
        let with_node = machines
            .iter()
            .filter(|m| m.data["status"]["nodeRef"]["name"].is_string())
            .count();
        if machines.len() == count && with_node == count {
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

/// Waits until the new cluster's `count` Nodes are Ready (each kubelet found its pod network).
async fn wait_every_node_ready(workload: &kube::Client, count: usize) {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(workload.clone());
    testenv::eventually(&format!("{count} Nodes Ready"), TOKENS_WAIT, || async {
        let list = nodes.list(&Default::default()).await.ok()?.items;
        let ready = list.iter().filter(|node| {
            let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
            conditions
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        (list.len() == count && ready.count() == count).then_some(())
    })
    .await;
}

/// The whole cluster: its Machines, the `init` one's name and the control-plane ones'.
#[derive(Clone, Copy)]
struct WholeCluster<'a> {
    machines: &'a [kube::api::DynamicObject],
    init: &'a str,
    control_plane: &'a [String],
}

/// What the whole cluster must be: each Machine's nodeRef names its Node, every join token is
/// gone and bootplate counted each deletion, etcd has the three control-plane members, each
/// control-plane node holds the `init` node's shared keys and its apiserver answers `/readyz`,
/// the endpoint serves a certificate of the cluster CA, `kubectl get nodes` lists every Machine,
/// each node's pods are in its own cgroup.
async fn assert_whole_cluster(
    env: &testenv::capi::CapiEnv,
    hosts: &Hosts,
    whole: WholeCluster<'_>,
    endpoint: &Endpoint,
) {
    use kube::ResourceExt;
    let (machines, init) = (whole.machines, whole.init);
    let mut names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    names.sort();
    for machine in machines {
        assert_eq!(
            machine.data["status"]["nodeRef"]["name"],
            json!(machine.name_any()),
            "the Node the real kubelet registered"
        );
    }
    assert_every_join_token_deleted(env, hosts, machines).await;
    let members = hosts.with_node(init, etcd_members).unwrap();
    assert_eq!(members, whole.control_plane, "etcd's members");
    assert_control_plane_nodes_alike(env, hosts, whole).await;
    let ca = env.cluster_ca.cert_pem.clone();
    serves_cluster_certificate(endpoint.address(), &ca, "the endpoint").await;
    let listed = hosts.with_node(init, listed_nodes).unwrap();
    assert_eq!(listed, names, "kubectl get nodes");
    for name in &names {
        let own = hosts.with_node(name, |node| (node.pods_in_own_cgroup(), node.cgroup_root()));
        let (own, root) = own.unwrap_or_else(|| panic!("{name} has no host"));
        assert!(own, "{name}'s kubelet keeps its pods under {root}");
    }
}

/// Every Machine but the `init` one joined with a token of its own (its boot record says which);
/// each token is gone from the workload cluster and bootplate counted each deletion.
async fn assert_every_join_token_deleted(
    env: &testenv::capi::CapiEnv,
    hosts: &Hosts,
    machines: &[kube::api::DynamicObject],
) {
    use kube::ResourceExt;
    use testenv::capi::boot::BootRecord;
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
    let joined = machines.len() - 1;
    assert_eq!(
        token_ids.len(),
        joined,
        "every Machine but the `init` one joined, each with a token of its own"
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
    assert_eq!(deleted, joined as f64, "tokens bootplate deleted");
}

/// Every control-plane node holds the `init` node's [`SHARED_PKI`] files byte for byte, and its
/// own apiserver (not the endpoint in front of them) answers `/readyz` with `ok`, over a
/// certificate of the cluster CA.
async fn assert_control_plane_nodes_alike(
    env: &testenv::capi::CapiEnv,
    hosts: &Hosts,
    whole: WholeCluster<'_>,
) {
    let pki_of = |name: &str| {
        hosts
            .with_node(name, |node| {
                SHARED_PKI.map(|file| {
                    let path = node.dir().join("etc-kubernetes/pki").join(file);
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                })
            })
            .unwrap_or_else(|| panic!("{name} has no host"))
    };
    let init_pki = pki_of(whole.init);
    let ca = env.cluster_ca.cert_pem.clone();
    for name in whole.control_plane {
        let pki = pki_of(name);
        for (file, (ours, init)) in SHARED_PKI.iter().zip(pki.iter().zip(&init_pki)) {
            assert!(ours == init, "{name}'s {file} is the `init` node's");
        }
        let address = hosts.with_node(name, Node::address).unwrap();
        let readyz = || tls_probe::get_at(address, PORT, &ca, "/readyz");
        let (status, body) = tokio::task::block_in_place(readyz)
            .unwrap_or_else(|e| panic!("{name}'s apiserver at {address}: {e:#}"));
        assert!(
            status == 200 && body.contains("ok"),
            "{name}'s apiserver at {address}: /readyz answered {status}: {body}"
        );
    }
}
