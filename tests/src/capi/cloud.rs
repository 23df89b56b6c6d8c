//! The parts of a real installation that are not Cluster API and not bootplate, played by test
//! code: a cloud (a test-only infrastructure provider with its `DevCluster`/`DevMachine` kinds),
//! the kubelets (Node objects in the workload apiserver; with real joins the real kubelets
//! register them and the cloud only sets their provider IDs) and, for the usual production shape, a
//! control-plane provider stand-in (`DevControlPlane`) that reports the control plane initialized
//! and owns the `<cluster>-ca` and `<cluster>-kubeconfig` Secrets, as KubeadmControlPlane does.
//!
//! A machine boots only from user-data that would join as its Machine should
//! ([`super::boot::check_render`], [`super::boot_check`]): read as the machine reads it, it runs
//! `kubeadm init` (the first control-plane machine of a Cluster whose control plane is not
//! initialized) or `kubeadm join` (`control-plane-join` for the other control-plane machines,
//! `worker` for the rest) on a configuration it writes that names the Machine's node, the
//! Cluster's endpoint and CA, and a control-plane machine is given the Cluster's key pairs. Where
//! the cloud plays the kubelets, a joining machine's token must also be taken by the workload
//! apiserver for `system:bootstrap:<id>`, and an `init` machine's CA be the workload apiserver's
//! ([`super::boot::check`]); on hosts ([`super::hosts`]) the boot proof runs the user-data as the
//! Machine's role and the record holds whom the apiserver took the kubelet's CSR from.
//! Otherwise the machine stays unprovisioned, its `Ready` condition False with reason
//! `BootRefused` and a message that says why; what a machine booted with is recorded in its
//! `status.boot` ([`super::boot::BootRecord`]). On hosts, a DevMachine's `spec.image` names the
//! OS image its instance boots, as an infrastructure machine names its image: the boot proof's
//! `--os` (the Debian root with that family's stand-ins), [`DEFAULT_IMAGE`] when unset. A Machine labelled [`PLAIN_MACHINE_LABEL`] is no
//! Kubernetes node: it boots whatever its user-data is.
//!
//! It only writes its own kinds, Secrets a control-plane provider owns and Nodes: never a Cluster
//! API object. Cluster API learns everything from these through its contracts.

use std::time::Duration;

use anyhow::Context;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::boot::{self, BootRecord, BootRole};
use super::boot_check::{self, Expected};
use crate::pki::TestCa;

/// The API group of the test infrastructure provider's kinds.
pub const INFRA_GROUP: &str = "infrastructure.test.bootplate.dev";
/// The API group of the control-plane provider stand-in.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.test.bootplate.dev";
/// The version both groups serve.
pub const VERSION: &str = "v1alpha1";
/// A Machine (or MachineDeployment template) with this label never gets a Node: its kubelet
/// "fails to start", for MachineHealthCheck scenarios.
pub const NO_NODE_LABEL: &str = "test.bootplate.dev/no-node";
/// A Machine (or MachineDeployment template) with this label is no Kubernetes node: its
/// user-data need not join a cluster, and the cloud boots it without checking a join.
pub const PLAIN_MACHINE_LABEL: &str = "test.bootplate.dev/plain-machine";
/// A Machine with this label boots on its host ([`super::hosts`]) even when its user-data
/// fails the cloud's check: for the drills that prove what the real kubeadm does with such a
/// user-data (it refuses a CA it does not pin, and the boot report says so).
pub const UNCHECKED_BOOT_LABEL: &str = "test.bootplate.dev/unchecked-boot";

/// The kinds the test providers serve (`DevMachinePool` is played in [`super::pool`]):
/// (group, kind, plural).
const KINDS: [(&str, &str, &str); 7] = [
    (INFRA_GROUP, "DevCluster", "devclusters"),
    (INFRA_GROUP, "DevClusterTemplate", "devclustertemplates"),
    (INFRA_GROUP, "DevMachine", "devmachines"),
    (INFRA_GROUP, "DevMachineTemplate", "devmachinetemplates"),
    (INFRA_GROUP, "DevMachinePool", "devmachinepools"),
    (CONTROL_PLANE_GROUP, "DevControlPlane", "devcontrolplanes"),
    (
        CONTROL_PLANE_GROUP,
        "DevControlPlaneTemplate",
        "devcontrolplanetemplates",
    ),
];

/// The CRDs of the test providers, labelled with the Cluster API contract they follow (v1beta2)
/// so Cluster API reads them as it reads any provider's kinds. Their schemas keep unknown
/// fields: Cluster API's topology controller writes whatever a template holds.
pub fn crds() -> Vec<CustomResourceDefinition> {
    KINDS
        .iter()
        .map(|(group, kind, plural)| {
            let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
            serde_json::from_value(json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {
                    "name": format!("{plural}.{group}"),
                    "labels": {
                        "cluster.x-k8s.io/v1beta2": VERSION,
                        super::clusterctl::LABEL: "",
                    },
                },
                "spec": {
                    "group": group,
                    "names": {
                        "kind": kind,
                        "listKind": format!("{kind}List"),
                        "plural": plural,
                        "singular": kind.to_lowercase(),
                    },
                    "scope": "Namespaced",
                    "versions": [{
                        "name": VERSION,
                        "served": true,
                        "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": open, "status": open},
                        }},
                    }],
                },
            }))
            .expect("a valid CRD")
        })
        .collect()
}

/// The ClusterRole that lets Cluster API's manager work with the test providers' kinds, merged
/// into its role by the aggregation label every provider uses.
pub fn capi_aggregated_role() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": "test-providers-aggregated-to-capi-manager",
            "labels": {"cluster.x-k8s.io/aggregate-to-manager": "true"},
        },
        "rules": [{
            "apiGroups": [INFRA_GROUP, CONTROL_PLANE_GROUP],
            "resources": ["*"],
            "verbs": ["*"],
        }],
    })
}

/// The API resource of one of the test providers' kinds.
pub fn resource(group: &str, kind: &str) -> ApiResource {
    let plural = KINDS
        .iter()
        .find(|(g, k, _)| *g == group && *k == kind)
        .map(|(_, _, p)| *p)
        .expect("a kind of the test providers");
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, VERSION, kind), plural)
}

/// The dynamic API of one of the test providers' kinds in `namespace`.
pub fn api(client: &Client, namespace: &str, group: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource(group, kind))
}

pub(super) fn api_all(client: &Client, group: &str, kind: &str) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource(group, kind))
}

/// The Cluster API kinds the cloud reads (never writes): Machines.
pub fn capi_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

/// What the cloud needs to know: both apiservers and the workload cluster's CA and endpoint.
#[derive(Clone)]
pub struct CloudConfig {
    pub management: Client,
    pub workload: Client,
    /// The workload apiserver's address as the machines and Cluster API reach it (`127.0.0.1`
    /// when Cluster API runs on the host; the node's address when it runs in a Pod).
    pub workload_host: String,
    pub workload_port: u16,
    pub cluster_ca: TestCa,
    /// Real kubelets register the Nodes: the cloud only gives each its provider ID.
    pub real_kubelets: bool,
    /// The Nodes the cloud registers are cordoned (`spec.unschedulable`): when the workload
    /// cluster is a management cluster that runs Pods, its scheduler must never place a Pod on
    /// a Node that is only a record.
    pub cordon_nodes: bool,
    /// Machines boot on real hosts ([`super::hosts`]) that run their user-data, in the workload
    /// cluster those hosts make (the cloud then plays a cloud controller manager only: it
    /// gives each Node its provider ID).
    pub hosts: Option<std::sync::Arc<super::hosts::Hosts>>,
}

/// The running cloud, kubelets and control-plane stand-in; stopped on drop.
pub struct Cloud {
    task: JoinHandle<()>,
}

impl Cloud {
    /// Starts the loop that plays the cloud (every 300 ms, over all namespaces).
    pub fn start(config: CloudConfig) -> Cloud {
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = one_pass(&config).await {
                    eprintln!("test cloud: {e:#}");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Cloud { task }
    }
}

impl Drop for Cloud {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn one_pass(config: &CloudConfig) -> anyhow::Result<()> {
    provision_clusters(config).await?;
    initialize_control_planes(config).await?;
    provision_machines(config).await?;
    register_nodes(config).await?;
    super::pool::scale_pools(config).await
}

fn provisioned(object: &DynamicObject) -> bool {
    object.data["status"]["initialization"]["provisioned"] == json!(true)
}

pub(super) async fn patch_status(
    api: &Api<DynamicObject>,
    name: &str,
    status: Value,
) -> anyhow::Result<()> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .with_context(|| format!("patching the status of {name}"))?;
    Ok(())
}

/// A DevCluster gets the workload apiserver as its endpoint (the cloud's load balancer) and is
/// then provisioned.
async fn provision_clusters(config: &CloudConfig) -> anyhow::Result<()> {
    let all = api_all(&config.management, INFRA_GROUP, "DevCluster");
    for cluster in all.list(&ListParams::default()).await? {
        if provisioned(&cluster) {
            continue;
        }
        let namespace = cluster.namespace().unwrap_or_default();
        let api = api(&config.management, &namespace, INFRA_GROUP, "DevCluster");
        let endpoint = json!({"host": config.workload_host, "port": config.workload_port});
        api.patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controlPlaneEndpoint": endpoint}})),
        )
        .await?;
        patch_status(
            &api,
            &cluster.name_any(),
            json!({"initialization": {"provisioned": true}}),
        )
        .await?;
    }
    Ok(())
}

pub(super) fn owner<'a>(object: &'a DynamicObject, kind: &str) -> Option<&'a OwnerReference> {
    object
        .owner_references()
        .iter()
        .find(|o| o.kind == kind && o.api_version.starts_with("cluster.x-k8s.io/"))
}

/// A DevControlPlane owned by a Cluster writes the Secrets a control-plane provider owns (the
/// cluster CA and an admin kubeconfig) and reports itself initialized at its version.
async fn initialize_control_planes(config: &CloudConfig) -> anyhow::Result<()> {
    let all = api_all(&config.management, CONTROL_PLANE_GROUP, "DevControlPlane");
    for plane in all.list(&ListParams::default()).await? {
        let Some(cluster) = owner(&plane, "Cluster").map(|o| o.name.clone()) else {
            continue;
        };
        let namespace = plane.namespace().unwrap_or_default();
        let version = plane.data["spec"]["version"].clone();
        let initialized = plane.data["status"]["initialization"]["controlPlaneInitialized"]
            == json!(true)
            && plane.data["status"]["version"] == version;
        if initialized {
            continue;
        }
        let owned_by_plane = OwnerReference {
            api_version: format!("{CONTROL_PLANE_GROUP}/{VERSION}"),
            kind: "DevControlPlane".into(),
            name: plane.name_any(),
            uid: plane.uid().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let secrets: Api<Secret> = Api::namespaced(config.management.clone(), &namespace);
        let ca = cluster_secret(
            &cluster,
            "ca",
            &owned_by_plane,
            &[
                ("tls.crt", config.cluster_ca.cert_pem.clone()),
                ("tls.key", config.cluster_ca.key_pem.clone()),
            ],
        );
        let kubeconfig = cluster_secret(
            &cluster,
            "kubeconfig",
            &owned_by_plane,
            &[("value", admin_kubeconfig(config, &cluster))],
        );
        for secret in [ca, kubeconfig] {
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let api = api(
            &config.management,
            &namespace,
            CONTROL_PLANE_GROUP,
            "DevControlPlane",
        );
        patch_status(
            &api,
            &plane.name_any(),
            json!({
                "initialization": {"controlPlaneInitialized": true},
                "version": version,
                "replicas": 0, "readyReplicas": 0, "availableReplicas": 0, "upToDateReplicas": 0,
            }),
        )
        .await?;
    }
    Ok(())
}

fn cluster_secret(
    cluster: &str,
    purpose: &str,
    owner: &OwnerReference,
    data: &[(&str, String)],
) -> Secret {
    let mut secret = Secret {
        type_: Some("cluster.x-k8s.io/secret".into()),
        ..Default::default()
    };
    secret.metadata.name = Some(format!("{cluster}-{purpose}"));
    secret.metadata.labels = Some(
        [(
            "cluster.x-k8s.io/cluster-name".to_owned(),
            cluster.to_owned(),
        )]
        .into(),
    );
    secret.metadata.owner_references = Some(vec![owner.clone()]);
    secret.string_data = Some(
        data.iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect(),
    );
    secret
}

/// A kubeconfig for the workload cluster with a `system:masters` client certificate signed by
/// the cluster CA, the kind a control-plane provider writes.
fn admin_kubeconfig(config: &CloudConfig, cluster: &str) -> String {
    let client = config
        .cluster_ca
        .client("kubernetes-admin", "system:masters");
    let user = format!(
        "client-certificate-data: {}\n    client-key-data: {}",
        b64(&client.cert_pem),
        b64(&client.key_pem)
    );
    workload_kubeconfig(config, cluster, &user)
}

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A kubeconfig for the workload cluster that trusts the cluster CA and authenticates with
/// `user` (the user's fields, YAML at an indent of four).
pub(super) fn workload_kubeconfig(config: &CloudConfig, cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: https://{host}:{port}\n    certificate-authority-data: {ca}\nusers:\n- name: {cluster}-user\n  user:\n    {user}\ncontexts:\n- name: {cluster}\n  context: {{cluster: {cluster}, user: {cluster}-user}}\ncurrent-context: {cluster}\n",
        host = config.workload_host,
        port = config.workload_port,
        ca = b64(&config.cluster_ca.cert_pem),
    )
}

/// The Cluster API Machine that owns infrastructure machine `machine`, once CAPI adopted it.
async fn owner_machine(
    config: &CloudConfig,
    machine: &DynamicObject,
) -> anyhow::Result<Option<DynamicObject>> {
    let Some(owner) = owner(machine, "Machine") else {
        return Ok(None);
    };
    let machines: Api<DynamicObject> = Api::namespaced_with(
        config.management.clone(),
        &machine.namespace().unwrap_or_default(),
        &capi_resource("Machine", "machines"),
    );
    Ok(machines.get_opt(&owner.name).await?)
}

/// How many machines the cloud boots, and kubelets register, at once: a rollout of thousands
/// of Machines (the side-by-side benchmark) should see them join while it runs, as real ones
/// do, not one request at a time.
const AT_ONCE: usize = 8;

/// A DevMachine whose Machine has bootstrap data boots: the cloud reads the data Secret, checks
/// it would join, gives the machine a provider ID and an address and reports it provisioned.
async fn provision_machines(config: &CloudConfig) -> anyhow::Result<()> {
    let all = api_all(&config.management, INFRA_GROUP, "DevMachine");
    let waiting = all.list(&ListParams::default()).await?.items;
    futures::stream::iter(waiting.into_iter().filter(|m| !provisioned(m)).map(Ok))
        .try_for_each_concurrent(AT_ONCE, |machine| provision_machine(config, machine))
        .await
}

async fn provision_machine(config: &CloudConfig, machine: DynamicObject) -> anyhow::Result<()> {
    let Some(capi_machine) = owner_machine(config, &machine).await? else {
        return Ok(());
    };
    let namespace = machine.namespace().unwrap_or_default();
    let Some(data_secret) = capi_machine.data["spec"]["bootstrap"]["dataSecretName"].as_str()
    else {
        return Ok(());
    };
    let secrets: Api<Secret> = Api::namespaced(config.management.clone(), &namespace);
    let user_data = secrets
        .get_opt(data_secret)
        .await?
        .and_then(|s| s.data)
        .and_then(|d| d.get("value").cloned())
        .filter(|v| !v.0.is_empty());
    let Some(user_data) = user_data else {
        return Ok(());
    };
    let api = api(&config.management, &namespace, INFRA_GROUP, "DevMachine");
    if machine.data["spec"]["providerID"].is_string() {
        // It booted before (its record came along with a `clusterctl move`, its status did not):
        // the instance runs, there is nothing to boot again.
        return report_provisioned(&api, &machine, None, LOOPBACK).await;
    }
    let plain = capi_machine.labels().contains_key(PLAIN_MACHINE_LABEL);
    if let Some(hosts) = &config.hosts {
        return boot_on_host(config, hosts, (&api, &machine, &capi_machine), &user_data.0).await;
    }
    let record = if plain {
        BootRecord::default()
    } else {
        let user_data = String::from_utf8_lossy(&user_data.0);
        let expected = expected(config, &capi_machine).await?;
        match boot::check(config, &user_data, &expected).await {
            Ok(record) => record,
            Err(refusal) => return refuse(&api, &machine, &refusal).await,
        }
    };
    let provider_id = format!("dev:///{namespace}/{}", capi_machine.name_any());
    api.patch(
        &machine.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"providerID": provider_id}})),
    )
    .await?;
    report_provisioned(&api, &machine, Some(&record), LOOPBACK).await
}

/// The OS image a host boots when its DevMachine names none (`spec.image`): the boot proof's
/// root is Debian, so Debian-family templates run on it as they are.
pub const DEFAULT_IMAGE: &str = "debian";

/// The address of a machine with no host of its own.
const LOOPBACK: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// Boots `machine` on a host of its own once its user-data passes [`boot::check_render`]
/// against what its Machine should be (the boot proof then runs it as that role); reports what
/// the host does ([`report_host`]).
async fn boot_on_host(
    config: &CloudConfig,
    hosts: &std::sync::Arc<super::hosts::Hosts>,
    (api, machine, capi_machine): (&Api<DynamicObject>, &DynamicObject, &DynamicObject),
    user_data: &[u8],
) -> anyhow::Result<()> {
    let name = capi_machine.name_any();
    let labels = capi_machine.labels();
    let mut role = BootRole::Worker;
    if hosts.state_of(&name).is_none() && !labels.contains_key(PLAIN_MACHINE_LABEL) {
        let expected = expected(config, capi_machine).await?;
        let checked = boot::check_render(&String::from_utf8_lossy(user_data), &expected);
        if let Err(refusal) = checked.as_ref()
            && !labels.contains_key(UNCHECKED_BOOT_LABEL)
        {
            return refuse(api, machine, refusal).await;
        }
        role = expected.role;
    }
    let os = machine.data["spec"]["image"]
        .as_str()
        .unwrap_or(DEFAULT_IMAGE);
    let image = super::hosts::HostImage {
        role,
        os: os.to_owned(),
    };
    let host = hosts.boot(&name, user_data, image);
    report_host(hosts, (api, machine, capi_machine), user_data, host).await
}

/// What `host` (the real host of `machine`, booted with `user_data`) is doing, reported as an
/// infrastructure provider reports its instance: nothing while it boots, `Ready=False` when its
/// boot failed, provisioned with its address and provider ID once it booted. Its boot record
/// is what the workload apiserver saw: the username of the CSR its kubelet made to join (none
/// for an `init` machine, whose kubelet kubeadm gives a certificate itself).
async fn report_host(
    hosts: &super::hosts::Hosts,
    (api, machine, capi_machine): (&Api<DynamicObject>, &DynamicObject, &DynamicObject),
    user_data: &[u8],
    host: super::hosts::HostState,
) -> anyhow::Result<()> {
    use super::hosts::HostState;
    let address = match host {
        HostState::Booting => return Ok(()),
        HostState::Failed(why) => return refuse(api, machine, &why).await,
        HostState::Booted(address) => address,
    };
    let boot = boot::KubeadmBoot::read(&String::from_utf8_lossy(user_data))
        .map_err(|e| anyhow::anyhow!("reading the user-data: {e}"))?;
    let mut record = BootRecord {
        role: boot.role,
        ..BootRecord::default()
    };
    if boot.token.is_some() {
        // The workload cluster is given to the cloud once its `init` machine booted.
        let Some(workload) = hosts.workload() else {
            return Ok(());
        };
        let Some(username) = kubelet_csr_user(&workload, &capi_machine.name_any()).await? else {
            return refuse(
                api,
                machine,
                "its kubelet made no CSR with a bootstrap token",
            )
            .await;
        };
        let token_id = username
            .strip_prefix("system:bootstrap:")
            .map(str::to_owned);
        if token_id.as_deref() != boot.token_id() {
            let refusal = format!(
                "its kubelet's CSR was made as {username}, not with the token of its user-data"
            );
            return refuse(api, machine, &refusal).await;
        }
        record.token_id = token_id;
        record.authenticated_as = Some(username);
    }
    let provider_id = format!(
        "dev:///{}/{}",
        capi_machine.namespace().unwrap_or_default(),
        capi_machine.name_any()
    );
    api.patch(
        &machine.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"providerID": provider_id}})),
    )
    .await?;
    report_provisioned(api, machine, Some(&record), address).await
}

/// The user the workload apiserver took the kubelet of node `node` for when it asked for its
/// client certificate with a bootstrap token: the username of the kubelet-client CSR whose
/// subject is `system:node:<node>`, made by a `system:bootstrap:` user.
async fn kubelet_csr_user(workload: &Client, node: &str) -> anyhow::Result<Option<String>> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let csrs: Api<CertificateSigningRequest> = Api::all(workload.clone());
    let subject = format!("system:node:{node}");
    for csr in csrs.list(&ListParams::default()).await? {
        let spec = csr.spec;
        let username = spec.username.unwrap_or_default();
        if spec.signer_name == "kubernetes.io/kube-apiserver-client-kubelet"
            && username.starts_with("system:bootstrap:")
            && csr_common_name(&spec.request.0).as_deref() == Some(subject.as_str())
        {
            return Ok(Some(username));
        }
    }
    Ok(None)
}

/// The subject's common name of a PEM certificate request.
fn csr_common_name(pem: &[u8]) -> Option<String> {
    use x509_parser::prelude::FromDer as _;
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let (_, request) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
            .ok()?;
    let subject = &request.certification_request_info.subject;
    let name = subject.iter_common_name().next()?.as_str().ok()?;
    Some(name.to_owned())
}

/// Reports `machine` provisioned at `address` (with what it booted with, when it booted just
/// now).
async fn report_provisioned(
    api: &Api<DynamicObject>,
    machine: &DynamicObject,
    record: Option<&BootRecord>,
    address: std::net::Ipv4Addr,
) -> anyhow::Result<()> {
    let mut status = json!({
        "initialization": {"provisioned": true},
        "addresses": [{"type": "InternalIP", "address": address.to_string()}],
        "conditions": [ready_condition("True", "Booted", "the machine booted")],
    });
    if let Some(record) = record {
        status["boot"] = serde_json::to_value(record)?;
    }
    patch_status(api, &machine.name_any(), status).await
}

/// Leaves `machine` unprovisioned, saying why in its `Ready` condition (written once per
/// reason: the cloud looks again at every pass).
async fn refuse(
    api: &Api<DynamicObject>,
    machine: &DynamicObject,
    refusal: &str,
) -> anyhow::Result<()> {
    let said = machine.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["message"] == refusal);
    if said {
        return Ok(());
    }
    let condition = ready_condition("False", "BootRefused", refusal);
    patch_status(api, &machine.name_any(), json!({"conditions": [condition]})).await
}

fn ready_condition(status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    })
}

/// What `machine`'s user-data must do ([`boot_check::Expected`]): its role (a worker unless it
/// is a control-plane machine; the first control-plane machine, while its Cluster reports no
/// initialized control plane, inits), its name, its Cluster's endpoint and CA certificates.
async fn expected(config: &CloudConfig, machine: &DynamicObject) -> anyhow::Result<Expected> {
    let namespace = machine.namespace().unwrap_or_default();
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        config.management.clone(),
        &namespace,
        &capi_resource("Cluster", "clusters"),
    );
    let name = machine.data["spec"]["clusterName"]
        .as_str()
        .unwrap_or_default();
    let cluster = clusters.get(name).await?;
    let status = &cluster.data["status"];
    let initialized = status["initialization"]["controlPlaneInitialized"] == json!(true)
        || (status["conditions"].as_array().into_iter().flatten())
            .any(|c| c["type"] == "ControlPlaneInitialized" && c["status"] == "True");
    let role = if !machine
        .labels()
        .contains_key("cluster.x-k8s.io/control-plane")
    {
        BootRole::Worker
    } else if initialized {
        BootRole::ControlPlaneJoin
    } else {
        BootRole::Init
    };
    let endpoint = &cluster.data["spec"]["controlPlaneEndpoint"];
    let host = endpoint["host"].as_str().unwrap_or_default();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let secrets: Api<Secret> = Api::namespaced(config.management.clone(), &namespace);
    let mut certs = Vec::new();
    for (suffix, _, _) in boot_check::KEY_PAIRS {
        let secret = secrets.get_opt(&format!("{name}-{suffix}")).await?;
        let cert = (secret.and_then(|s| s.data)).and_then(|d| d.get("tls.crt").cloned());
        if let Some(cert) = cert {
            certs.push((
                suffix.to_owned(),
                String::from_utf8_lossy(&cert.0).into_owned(),
            ));
        }
    }
    Ok(Expected {
        role,
        machine: machine.name_any(),
        cluster: name.to_owned(),
        endpoint: format!("{host}:{}", endpoint["port"]),
        certs,
    })
}

/// The kubelet of each provisioned machine registers its Node (named after the Machine, with
/// the machine's provider ID) and reports it Ready, unless the Machine says it never will.
async fn register_nodes(config: &CloudConfig) -> anyhow::Result<()> {
    let all = api_all(&config.management, INFRA_GROUP, "DevMachine");
    let workload = match &config.hosts {
        // No workload cluster before the `init` host made it.
        Some(hosts) => match hosts.workload() {
            Some(client) => client,
            None => return Ok(()),
        },
        None => config.workload.clone(),
    };
    let nodes: Api<Node> = Api::all(workload);
    // One listing of the Nodes instead of a read per machine: a machine whose Node exists is
    // done, and needs no read of its Machine either (a Node is named after its Machine).
    let registered: std::collections::HashSet<String> = nodes
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let booted = all.list(&ListParams::default()).await?.items.into_iter();
    let unregistered = booted.filter(|machine| {
        machine.data["spec"]["providerID"].is_string()
            && machine.metadata.deletion_timestamp.is_none()
            && (config.real_kubelets
                || config.hosts.is_some()
                || owner(machine, "Machine").is_none_or(|o| !registered.contains(&o.name)))
    });
    futures::stream::iter(unregistered.map(Ok))
        .try_for_each_concurrent(AT_ONCE, |machine| register_machine(config, &nodes, machine))
        .await
}

async fn register_machine(
    config: &CloudConfig,
    nodes: &Api<Node>,
    machine: DynamicObject,
) -> anyhow::Result<()> {
    let provider_id = machine.data["spec"]["providerID"]
        .as_str()
        .unwrap_or_default();
    let Some(capi_machine) = owner_machine(config, &machine).await? else {
        return Ok(());
    };
    let node_name = capi_machine.name_any();
    if config.real_kubelets || config.hosts.is_some() {
        return set_provider_id(nodes, &node_name, provider_id).await;
    }
    if capi_machine.labels().contains_key(NO_NODE_LABEL)
        || capi_machine.metadata.deletion_timestamp.is_some()
    {
        return Ok(());
    }
    if nodes.get_opt(&node_name).await?.is_some() {
        return Ok(());
    }
    register_node(nodes, &node_name, provider_id, config.cordon_nodes).await
}

/// What a healthy kubelet does when it starts: registers Node `name` with `provider_id` (cordoned
/// with `cordon`) and reports it Ready, with none of the pressure conditions.
pub(super) async fn register_node(
    nodes: &Api<Node>,
    node_name: &str,
    provider_id: &str,
    cordon: bool,
) -> anyhow::Result<()> {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": node_name},
        "spec": {"providerID": provider_id, "unschedulable": cordon},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    let conditions = json!([
        condition("Ready", "True", "KubeletReady"),
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID"),
    ]);
    nodes
        .patch_status(
            node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": conditions}})),
        )
        .await?;
    Ok(())
}

/// What a cloud controller manager does for a Node its kubelet registered: sets the provider ID
/// of the machine it runs on (Cluster API matches Machines to Nodes by it).
async fn set_provider_id(nodes: &Api<Node>, name: &str, provider_id: &str) -> anyhow::Result<()> {
    let Some(node) = nodes.get_opt(name).await? else {
        return Ok(());
    };
    if node.spec.and_then(|s| s.provider_id).is_none() {
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"providerID": provider_id}})),
            )
            .await?;
    }
    Ok(())
}

/// Server-side applies `object`, of the kind `resource` describes, as the test's user.
pub async fn apply(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    object: &Value,
) -> anyhow::Result<DynamicObject> {
    let name = object["metadata"]["name"]
        .as_str()
        .context("an object without a name")?;
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    api.patch(
        name,
        &PatchParams::apply("bootplate-tests").force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("applying {} {name}", resource.kind))
}
