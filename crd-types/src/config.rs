//! `BootplateConfig` (the CAPI bootstrap config) and `BootplateConfigTemplate`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::secret_ref::SecretKeyRef;
use crate::template::FileEncoding;

/// The bootstrap configuration of one Machine: which template renders its user-data, and with
/// which variables. `Machine.spec.bootstrap.configRef` points at it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bootstrap.bootplate.dev",
    version = "v1alpha1",
    kind = "BootplateConfig",
    doc = "The Cluster API bootstrap config of one Machine: bootplate renders the referenced template into the data Secret of the same name.",
    plural = "bootplateconfigs",
    shortname = "bpc",
    namespaced,
    status = "BootplateConfigStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"}"#,
    printcolumn = r#"{"name":"Template","type":"string","jsonPath":".spec.templateRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"boolean","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Data-Secret","type":"string","jsonPath":".status.dataSecretName"}"#,
    printcolumn = r#"{"name":"Boot","type":"string","jsonPath":".status.boot.phase"}"#,
    printcolumn = r#"{"name":"Part","type":"string","jsonPath":".status.boot.part"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::schema::kubernetes_formats)]
pub struct BootplateConfigSpec {
    /// The template that renders this machine's user-data.
    pub template_ref: TemplateRef,
    /// Values for the template's declared variables, checked against their declarations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "any_map")]
    pub variables: BTreeMap<String, serde_json::Value>,
    /// Names of template parts not to render, for example `[install]` on an image that already
    /// carries the packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_parts: Vec<String>,
    /// Extra files to write, after the template's files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ConfigFile>,
    /// Commands run before the template's commands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_commands: Vec<String>,
    /// Commands run after the template's commands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_commands: Vec<String>,
    /// Largest allowed output in bytes; lowers the template's limit, never raises it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_output_bytes: Option<u64>,
    /// Registry mirrors, proxy, extra CAs, NTP servers, kubeadm's image repository and
    /// artifact sources for a restricted network (docs/air-gapped.md). Each field set here
    /// replaces the template's default for it.
    // Boxed: few configs set it, and the controller caches every config (inline, it was a
    // fifth of each cached config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Box<crate::network::NetworkConfig>>,
    /// Overrides the template's `delivery`: `Inline` or `Fetch` (docs/boot-channel.md, "Fetch
    /// delivery").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<crate::template::Delivery>,
}

/// Which template to render.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateRef {
    /// `BootstrapTemplate` (in the config's namespace) or `ClusterBootstrapTemplate`.
    pub kind: TemplateKind,
    /// The template's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Must be empty or the config's own namespace: a config may only use `BootstrapTemplate`s
    /// of its own namespace (and any `ClusterBootstrapTemplate`). Any other value is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The kind of a referenced template.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum TemplateKind {
    /// A namespaced `BootstrapTemplate` in the config's own namespace.
    #[default]
    BootstrapTemplate,
    /// A cluster-scoped `ClusterBootstrapTemplate`.
    ClusterBootstrapTemplate,
}

impl TemplateKind {
    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateKind::BootstrapTemplate => "BootstrapTemplate",
            TemplateKind::ClusterBootstrapTemplate => "ClusterBootstrapTemplate",
        }
    }
}

impl std::fmt::Display for TemplateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An extra file a config adds to the machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    /// Absolute path on the machine.
    pub path: String,
    /// Octal mode, for example `"0600"`. Default `"0644"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^0?[0-7]{3,4}$"))]
    pub permissions: Option<String>,
    /// `user:group`, default `root:root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Inline content (not a template). Exactly one of `content` and `contentFrom` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Content read from a Secret in the config's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_from: Option<FileSource>,
    /// How `content` is encoded: `plain` (default), `base64` or `gzip+base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<FileEncoding>,
}

/// Where a file's content comes from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSource {
    /// A key of a Secret in the config's namespace.
    pub secret: SecretKeyRef,
}

/// Observed state of a config, following the Cluster API bootstrap provider contract.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::kubernetes_formats)]
pub struct BootplateConfigStatus {
    /// True once the data Secret holds the rendered user-data (CAPI contract v1beta1).
    #[serde(default)]
    pub ready: bool,
    /// Name of the data Secret (the config's own name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
    /// The resourceVersion of the data Secret as bootplate last wrote or checked it. A Secret
    /// with another one was changed by someone else, and is compared again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_version: Option<String>,
    /// Initialization state (CAPI contract v1beta2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ConfigInitialization>,
    /// The generation of the spec that this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The template revision the data Secret was rendered from. Compare with the template's
    /// `status.revision` to find machines on an older revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_revision: Option<String>,
    /// The role the machine was rendered for: `init`, `control-plane-join` or `worker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// In-place updates of the booted machine (templates with `update: InPlace` parts): the
    /// payload published for its node and what the node applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place: Option<InPlaceStatus>,
    /// What the machine reported about its boot, until it joined (see docs/boot-channel.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootStatus>,
    /// `Ready`, `DataSecretAvailable`, `Paused` and, once the machine's node has a payload,
    /// `InPlaceUpdating`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A machine's boot as it reported it (see docs/boot-channel.md).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootStatus {
    /// `Booting`, `Booted`, `Failed`, `NotStarted`, or `Unreadable` (the machine wrote a
    /// report that cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The part that runs (`Booting`) or failed (`Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
}

/// The node payload of a config's machine (see docs/in-place.md).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceStatus {
    /// The Node the payload is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The revision of the payload published for the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_revision: Option<String>,
    /// The revision bootplate-agent last reported applied on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_revision: Option<String>,
    /// The config generation the published payload was rendered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// CAPI v1beta2 initialization status of a bootstrap config.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigInitialization {
    /// True once the data Secret is written.
    #[serde(default)]
    pub data_secret_created: bool,
}

/// A template for `BootplateConfig`s: MachineDeployments and MachineSets clone
/// `spec.template` into one config per Machine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bootstrap.bootplate.dev",
    version = "v1alpha1",
    kind = "BootplateConfigTemplate",
    doc = "A template for BootplateConfigs, cloned by MachineDeployments and MachineSets for each Machine.",
    plural = "bootplateconfigtemplates",
    shortname = "bpct",
    namespaced,
    printcolumn = r#"{"name":"Template","type":"string","jsonPath":".spec.template.spec.templateRef.name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::schema::kubernetes_formats)]
pub struct BootplateConfigTemplateSpec {
    /// The config every cloned `BootplateConfig` starts from.
    pub template: BootplateConfigTemplateResource,
    /// What a MachineDeployment's move from this config template to another may do to its
    /// machines (docs/changing-templates.md). `Any` (the default): Cluster API replaces them
    /// when the new render differs outside `InPlace` parts. `InPlaceOnly`: bootplate's in-place
    /// hooks refuse such a move instead of answering "roll out", so no machine is replaced;
    /// a move that every machine can take in place goes through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_policy: Option<crate::template::UpdatePolicy>,
}

/// The object a `BootplateConfigTemplate` stamps out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootplateConfigTemplateResource {
    /// Labels and annotations for the cloned configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The spec of the cloned configs.
    pub spec: BootplateConfigSpec,
}

/// The metadata a template may set on the objects it stamps out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectMetaTemplate {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

fn any_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
