//! The subset of Cluster API (`cluster.x-k8s.io/v1beta2`) that bootplate reads.
//!
//! Only the fields the controller needs are modelled; unknown fields are ignored on read. These
//! types are for reading (and for tests that play CAPI's controllers): writing them back would
//! drop the fields not modelled here.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Label on every object that belongs to a cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Label on control-plane Machines.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// Annotation that pauses reconciliation of an object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Cluster API puts this annotation on a Machine, its infrastructure machine and its bootstrap
/// config while it updates the Machine in place (feature gate `InPlaceUpdates`); a bootstrap
/// provider must not rewrite the data Secret meanwhile.
pub const UPDATE_IN_PROGRESS_ANNOTATION: &str =
    "in-place-updates.internal.cluster.x-k8s.io/update-in-progress";
/// The annotation Cluster API puts on an object cloned from a template: the template's name.
pub const CLONED_FROM_NAME: &str = "cluster.x-k8s.io/cloned-from-name";
/// The same: the template's group and kind, as `Kind.group`.
pub const CLONED_FROM_GROUP_KIND: &str = "cluster.x-k8s.io/cloned-from-groupkind";
/// Label that scopes objects to one controller instance (`--watch-filter`).
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
/// The Secret type CAPI uses for the bootstrap data Secret.
pub const CLUSTER_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The condition CAPI sets on a Cluster once its first control-plane machine is up.
pub const CONTROL_PLANE_INITIALIZED: &str = "ControlPlaneInitialized";

/// A Cluster API Cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Reconciliation of the cluster and its objects is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The endpoint of the cluster's API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Pod and service networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_network: Option<ClusterNetwork>,
    /// Set when a control-plane provider manages the control plane (then bootplate never
    /// generates certificates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractReference>,
    /// The infrastructure object of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractReference>,
}

/// A host and port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ApiEndpoint {
    /// Host name or address.
    #[serde(default)]
    pub host: String,
    /// Port.
    #[serde(default)]
    pub port: i32,
}

/// Cluster networking.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// The API server's port, when the endpoint does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_port: Option<i32>,
    /// Pod network ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NetworkRanges>,
    /// Service network ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<NetworkRanges>,
    /// DNS domain of services, for example `cluster.local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_domain: Option<String>,
}

/// CIDR blocks.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRanges {
    /// CIDR blocks.
    #[serde(default)]
    pub cidr_blocks: Vec<String>,
}

/// A v1beta2 contract reference (group, kind, name; same namespace).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContractReference {
    /// API group.
    #[serde(default)]
    pub api_group: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub name: String,
}

/// Observed state of a Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Initialization progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// Conditions (v1beta2: `metav1.Condition`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Initialization progress of a Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// The infrastructure is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// The control plane is initialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

impl Cluster {
    /// Whether reconciliation is paused by `spec.paused` or the paused annotation.
    pub fn is_paused(&self) -> bool {
        self.spec.paused.unwrap_or(false) || has_paused_annotation(&self.metadata)
    }

    /// Whether the infrastructure is provisioned.
    pub fn infrastructure_provisioned(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.infrastructure_provisioned)
            .unwrap_or(false)
    }

    /// Whether the control plane is initialized, by `status.initialization` or the
    /// `ControlPlaneInitialized` condition.
    pub fn control_plane_initialized(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        status
            .initialization
            .as_ref()
            .and_then(|i| i.control_plane_initialized)
            .unwrap_or(false)
            || status
                .conditions
                .iter()
                .any(|c| c.type_ == CONTROL_PLANE_INITIALIZED && c.status == "True")
    }
}

/// Whether an object carries the `cluster.x-k8s.io/paused` annotation.
pub fn has_paused_annotation(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
}

/// A Cluster API Machine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    namespaced,
    status = "MachineStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The Cluster this Machine belongs to.
    pub cluster_name: String,
    /// Bootstrap configuration.
    #[serde(default)]
    pub bootstrap: MachineBootstrap,
    /// The infrastructure object of the Machine.
    #[serde(default)]
    pub infrastructure_ref: ContractReference,
    /// Kubernetes version, for example `v1.31.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Failure domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
}

/// How a Machine is bootstrapped.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineBootstrap {
    /// The bootstrap config object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ContractReference>,
    /// The data Secret, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

/// Observed state of a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// The Node of this Machine, once it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<NodeReference>,
    /// Initialization progress (v1beta2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// Conditions (v1beta2); bootplate reads `InfrastructureReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Initialization progress of a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineInitialization {
    /// The infrastructure machine is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
}

/// The Machine condition that tells since when its infrastructure is ready.
pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";

/// A reference to a Node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NodeReference {
    /// The Node's name.
    #[serde(default)]
    pub name: String,
}

impl Machine {
    /// Whether this is a control-plane Machine.
    pub fn is_control_plane(&self) -> bool {
        self.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
    }

    /// Whether the Machine's Node has joined (`status.nodeRef` set).
    pub fn has_node(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.node_ref.as_ref())
            .is_some_and(|n| !n.name.is_empty())
    }

    /// Since when the Machine's infrastructure is provisioned: the transition time of its
    /// `InfrastructureReady` condition once `status.initialization.infrastructureProvisioned`
    /// is true; `None` before, or when the condition does not say.
    pub fn infrastructure_provisioned_since(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        let status = self.status.as_ref()?;
        let provisioned = status.initialization.as_ref()?.infrastructure_provisioned?;
        let ready = (status.conditions.iter())
            .find(|c| c.type_ == INFRASTRUCTURE_READY && c.status == "True")?;
        provisioned.then_some(ready.last_transition_time.0)
    }

    /// The Machine's labels (empty when none).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata.labels.clone().unwrap_or_default()
    }
}

/// A Cluster API MachinePool: one bootstrap config and one data Secret for every instance an
/// autoscaling group or scale set starts. Read only for what its config renders from.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachinePool",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolSpec {
    /// The Cluster this pool belongs to.
    pub cluster_name: String,
    /// What every instance of the pool is made from.
    #[serde(default)]
    pub template: MachineTemplate,
    /// The failure domains the pool's instances are spread over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<String>,
}

/// The template of a pool's instances (`spec.template`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplate {
    /// Labels and annotations of the instances' Machines.
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// The instances' Machine spec.
    #[serde(default)]
    pub spec: MachineTemplateSpec,
}

/// Metadata in a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateMetadata {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// The Machine spec in a pool's template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateSpec {
    /// Bootstrap configuration shared by every instance.
    #[serde(default)]
    pub bootstrap: MachineBootstrap,
    /// Kubernetes version, for example `v1.31.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl MachinePool {
    /// Whether the pool's template carries the control-plane label (a pool cannot make a
    /// control plane; its config refuses to render).
    pub fn is_control_plane(&self) -> bool {
        self.spec
            .template
            .metadata
            .labels
            .contains_key(CONTROL_PLANE_LABEL)
    }
}
