//! `BootstrapTemplate` and `ClusterBootstrapTemplate`: the templates platform teams publish.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A template for the bootstrap data (user-data) of machines of one OS image and purpose.
///
/// Either `template` (the whole output, rendered as one handlebars template) or `parts`
/// (files, systemd units and commands that bootplate writes out in the shape of `format`) is
/// set; a `template` may also carry `parts` that are all `update: InPlace`, added to its output.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bootstrap.bootplate.dev",
    version = "v1alpha1",
    kind = "BootstrapTemplate",
    doc = "Templates for the bootstrap data of machines of one OS image and purpose, usable by configs in the same namespace.",
    plural = "bootstraptemplates",
    shortname = "bt",
    namespaced,
    status = "BootstrapTemplateStatus",
    printcolumn = r#"{"name":"OS","type":"string","jsonPath":".spec.os.name"}"#,
    printcolumn = r#"{"name":"OS-Version","type":"string","jsonPath":".spec.os.version"}"#,
    printcolumn = r#"{"name":"Format","type":"string","jsonPath":".spec.format"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::schema::kubernetes_formats)]
pub struct TemplateSpec {
    /// The OS image this template is written for. Informational: shown by `kubectl get`.
    pub os: OsInfo,
    /// The user-data format the template produces: `cloud-config`, `ignition` (Ignition spec
    /// 3.x JSON), `script` (a shell script) or `mime-multipart` (a cloud-init MIME archive);
    /// for Windows workers `windows-cloud-config` (cloud-config as cloudbase-init reads it),
    /// `powershell` (a `#ps1_sysnative` script) or `powershell-aws` (the script inside
    /// `<powershell>` tags, as EC2Launch reads it).
    pub format: OutputFormat,
    /// Input variables that configs may set. Templates read them as `values.<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<VariableDecl>,
    /// Named handlebars partials, included with `{{> name}}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partials: BTreeMap<String, String>,
    /// Raw body: one handlebars template rendering the whole user-data. With `parts` beside it,
    /// every part must be `update: InPlace` (cloud-config and ignition only): their files, units
    /// and commands are added to the raw output (see docs/in-place.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Structured body: named parts (for example `install` and `configure`) whose files, units
    /// and commands are written out in the shape of `format`, in this order. Beside a raw
    /// `template`: `update: InPlace` parts added to its output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Compress the output. `gzip` applies to `cloud-config`, `script` and `mime-multipart`
    /// (cloud-init accepts gzipped user-data); Ignition output is never compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Largest allowed output in bytes. Defaults to and may not exceed 1 MiB (the Secret limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_output_bytes: Option<u64>,
    /// Boot reports (docs/boot-channel.md). `Enabled` (the default) runs the steps of a
    /// structured body under a small reporter that sends each part's start and end and the
    /// first failure (part, step, exit status, the redacted end of its output) to the workload
    /// cluster with the machine's bootstrap token; the config shows them as its `Booting`
    /// phase and `BootFailed`. `Disabled` leaves the reporter out. A raw `template` has no
    /// steps and never reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_reports: Option<BootReports>,
    /// How machines get the render (docs/boot-channel.md, "Fetch delivery"). `Inline` (the
    /// default) puts the whole render in the data Secret. `Fetch` puts there a stub of at most
    /// 3 KiB in `format` that fetches the render (in the `script` format, encrypted with a key
    /// only the stub holds) from the workload cluster with the machine's bootstrap token; for
    /// Machines of role `worker` and `control-plane-join` of a structured template. `init`
    /// machines and MachinePools still get the whole render. A config may override it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Defaults of the network input (registry mirrors, proxy, extra CAs, NTP servers,
    /// kubeadm's image repository, artifact sources; docs/air-gapped.md) for configs that do
    /// not set them. CAs are inline here: a template names no Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::network::NetworkConfig>,
    /// What a change of this template may do to the machines that booted from it
    /// (docs/changing-templates.md). `Any` (the default): a change outside `InPlace` parts is
    /// admitted, and those machines are replaced on their next rollout. `InPlaceOnly`: a change
    /// that cannot be applied in place to every running machine is refused at admission,
    /// naming the machines' configs and the parts that would need new machines; and Cluster
    /// API's in-place hooks get a refusal instead of "roll out" for a machine of this
    /// template. Not part of the revision: setting it re-renders nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_policy: Option<UpdatePolicy>,
}

impl TemplateSpec {
    /// The revision of this spec: the first 16 hex digits of the SHA-256 of its canonical JSON,
    /// `updatePolicy` left out (it changes no render). Configs record the revision they were
    /// rendered from.
    pub fn revision(&self) -> String {
        // serde_json writes struct fields in declaration order and maps sorted (BTreeMap), so
        // equal specs always hash equally.
        let json = if self.update_policy.is_some() {
            let rendered_part = TemplateSpec {
                update_policy: None,
                ..self.clone()
            };
            serde_json::to_vec(&rendered_part)
        } else {
            serde_json::to_vec(self)
        };
        let json = json.expect("a template spec always serializes");
        hex::encode(&Sha256::digest(&json)[..8])
    }

    /// Its `updatePolicy`, the default when unset.
    pub fn policy(&self) -> UpdatePolicy {
        self.update_policy.unwrap_or_default()
    }
}

/// `ClusterBootstrapTemplate`: the same spec as `BootstrapTemplate`, cluster-scoped, usable by
/// configs in every namespace (like a StorageClass).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bootstrap.bootplate.dev",
    version = "v1alpha1",
    kind = "ClusterBootstrapTemplate",
    doc = "Templates for the bootstrap data of machines of one OS image and purpose, usable by configs in every namespace.",
    plural = "clusterbootstraptemplates",
    shortname = "cbt",
    status = "BootstrapTemplateStatus",
    printcolumn = r#"{"name":"OS","type":"string","jsonPath":".spec.os.name"}"#,
    printcolumn = r#"{"name":"OS-Version","type":"string","jsonPath":".spec.os.version"}"#,
    printcolumn = r#"{"name":"Format","type":"string","jsonPath":".spec.format"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
pub struct ClusterBootstrapTemplateSpec(pub TemplateSpec);

impl std::ops::Deref for ClusterBootstrapTemplateSpec {
    type Target = TemplateSpec;
    fn deref(&self) -> &TemplateSpec {
        &self.0
    }
}

/// Observed state of a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::kubernetes_formats)]
pub struct BootstrapTemplateStatus {
    /// The generation of the spec that this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The revision (hash) of the spec that was checked. Configs record the revision they were
    /// rendered from in `status.templateRevision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// `Valid`: whether every template and partial compiles and a sample render succeeds for
    /// each role; when not, the message names the field, line and column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The OS image a template targets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OsInfo {
    /// OS name, for example `ubuntu`, `flatcar`, `rocky`.
    pub name: String,
    /// OS version, for example `24.04`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A user-data format.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OutputFormat {
    /// `#cloud-config` YAML.
    #[default]
    CloudConfig,
    /// Ignition spec 3.x JSON.
    Ignition,
    /// A shell script (`#!` first line).
    Script,
    /// A cloud-init MIME multi-part archive.
    MimeMultipart,
    /// `#cloud-config` YAML for Windows images read by cloudbase-init: only the directives
    /// cloudbase-init runs (`write_files`, `runcmd`, …); the commands are PowerShell, written
    /// to one script that `runcmd` starts. Workers only.
    WindowsCloudConfig,
    /// A PowerShell script for Windows images (`#ps1_sysnative` first line, as cloudbase-init
    /// reads it). Workers only.
    Powershell,
    /// The same PowerShell script inside `<powershell>…</powershell>`, as EC2Launch on AWS
    /// Windows images (and cloudbase-init) read it. Workers only.
    PowershellAws,
}

impl OutputFormat {
    /// The name used in the API and in the Secret annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputFormat::CloudConfig => "cloud-config",
            OutputFormat::Ignition => "ignition",
            OutputFormat::Script => "script",
            OutputFormat::MimeMultipart => "mime-multipart",
            OutputFormat::WindowsCloudConfig => "windows-cloud-config",
            OutputFormat::Powershell => "powershell",
            OutputFormat::PowershellAws => "powershell-aws",
        }
    }

    /// Whether the output is for Windows machines (PowerShell commands, Windows paths, no
    /// systemd, no POSIX shell, no control plane).
    pub fn is_windows(self) -> bool {
        matches!(
            self,
            OutputFormat::WindowsCloudConfig
                | OutputFormat::Powershell
                | OutputFormat::PowershellAws
        )
    }

    /// The value of the data Secret's `format` key: CAPI infrastructure providers know
    /// `cloud-config` and `ignition`; cloud-init consumes scripts and MIME archives as
    /// cloud-config user-data.
    pub fn secret_format(self) -> &'static str {
        match self {
            OutputFormat::Ignition => "ignition",
            _ => "cloud-config",
        }
    }
}

impl std::fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Output compression.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// No compression.
    #[default]
    None,
    /// gzip.
    Gzip,
}

/// The role a machine plays in its cluster. Control-plane machines (label
/// `cluster.x-k8s.io/control-plane`) are `init` (the first) or `control-plane-join`; all others
/// are `worker`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The first control-plane machine: it creates the cluster (`kubeadm init`).
    Init,
    /// A further control-plane machine joining an initialized control plane.
    ControlPlaneJoin,
    /// A worker machine.
    Worker,
}

impl Role {
    /// All roles, in the order a cluster comes up.
    pub const ALL: [Role; 3] = [Role::Init, Role::ControlPlaneJoin, Role::Worker];

    /// The name used in the API and in templates.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Init => "init",
            Role::ControlPlaneJoin => "control-plane-join",
            Role::Worker => "worker",
        }
    }

    /// Whether this role runs a control plane (and so may see certificates).
    pub fn is_control_plane(self) -> bool {
        !matches!(self, Role::Worker)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!("unknown role {s:?} (expected init, control-plane-join or worker)")
            })
    }
}

/// A declared input variable.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VariableDecl {
    /// Name, read by templates as `values.<name>`. Letters, digits and `_`, starting with a letter.
    #[schemars(regex(pattern = r"^[A-Za-z][A-Za-z0-9_]*$"))]
    pub name: String,
    /// What the variable controls, for the people who set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A config must set a required variable (a default is then pointless).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    /// The value used when a config does not set the variable. Must satisfy `schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::template::any_value")]
    pub default: Option<serde_json::Value>,
    /// Type checks for the value (a subset of JSON schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<VariableSchema>,
}

/// The JSON-schema subset a variable's value is checked against.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VariableSchema {
    /// The value's type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<ValueType>,
    /// The allowed values.
    #[serde(rename = "enum", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::template::any_list")]
    pub enum_: Option<Vec<serde_json::Value>>,
    /// A regular expression a string value must match (anywhere; anchor it with `^...$`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Smallest allowed number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<f64>,
    /// Largest allowed number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<f64>,
    /// Shortest allowed string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_length: Option<u64>,
    /// Longest allowed string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    /// The type of each item of an array value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<ItemSchema>,
}

/// The type of the items of an array variable.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemSchema {
    /// Each item's type.
    #[serde(rename = "type")]
    pub type_: ValueType,
}

/// A JSON value type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// A string.
    #[default]
    String,
    /// A whole number.
    Integer,
    /// Any number.
    Number,
    /// `true` or `false`.
    Boolean,
    /// A list.
    Array,
    /// A map.
    Object,
}

impl ValueType {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ValueType::String => "string",
            ValueType::Integer => "integer",
            ValueType::Number => "number",
            ValueType::Boolean => "boolean",
            ValueType::Array => "array",
            ValueType::Object => "object",
        }
    }

    /// Whether `value` has this type.
    pub fn matches(self, value: &serde_json::Value) -> bool {
        use serde_json::Value;
        match self {
            ValueType::String => value.is_string(),
            ValueType::Integer => value.is_i64() || value.is_u64(),
            ValueType::Number => value.is_number(),
            ValueType::Boolean => value.is_boolean(),
            ValueType::Array => value.is_array(),
            ValueType::Object => matches!(value, Value::Object(_)),
        }
    }
}

/// One named part of a structured template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Part {
    /// Part name, unique in the template (for example `install`, `configure`). Configs skip
    /// parts by name with `skipParts`.
    pub name: String,
    /// Roles this part applies to. Empty: every role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<Role>,
    /// Files to write. Paths and contents are handlebars templates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<TemplateFile>,
    /// systemd units to install. Contents are handlebars templates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Unit>,
    /// Shell commands, run in order after the files and units are in place. Each is a
    /// handlebars template; quote values with `shell_quote`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    /// Take (more of) this part's content from a `BootstrapGenerator`: its files, units and
    /// commands follow the part's own. The generator is called for each machine the part
    /// applies to (see docs/generators.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<PartGenerator>,
    /// How a change to this part's rendered output reaches machines that already booted:
    /// `Rollout` (the default) replaces them; `InPlace` lets bootplate-agent apply the part's
    /// files, units and commands on the running node, through Cluster API's in-place update
    /// hooks. A change is applied in place only when every difference in the rendered output
    /// lies in `InPlace` parts (see docs/in-place.md).
    #[serde(default, skip_serializing_if = "UpdateStrategy::is_rollout")]
    pub update: UpdateStrategy,
}

/// Whether the machines of a structured template report their boot.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum BootReports {
    /// Run the steps under the boot reporter.
    #[default]
    Enabled,
    /// No reporter: the config shows no `Booting` phase and no `BootFailed`.
    Disabled,
}

/// What a change may do to the machines that already booted from a template: `Any` or
/// `InPlaceOnly` (docs/changing-templates.md).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum UpdatePolicy {
    /// A change outside `InPlace` parts is admitted; the machines are replaced on their next
    /// rollout.
    #[default]
    Any,
    /// Only a change that every running machine can take in place is admitted.
    InPlaceOnly,
}

/// How a machine gets its render.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Delivery {
    /// The whole render is the user-data.
    #[default]
    Inline,
    /// The user-data is a small stub that fetches the encrypted render from the workload
    /// cluster with the machine's bootstrap token.
    Fetch,
}

/// How a change to a part reaches machines that already booted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum UpdateStrategy {
    /// Replace the machines (Cluster API rolls them out).
    #[default]
    Rollout,
    /// Apply the part on the running machines with bootplate-agent.
    InPlace,
}

impl UpdateStrategy {
    /// Whether this is the default, `Rollout` (left out of the serialized spec, so templates
    /// written before the field existed keep their revision).
    pub fn is_rollout(&self) -> bool {
        *self == UpdateStrategy::Rollout
    }
}

/// The generator a part takes content from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PartGenerator {
    /// The `BootstrapGenerator`'s name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Fixed parameters sent with every request (`parameters` in the request), for example
    /// which profile of the generator to use.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schemars(schema_with = "crate::template::any_object")]
    pub parameters: serde_json::Map<String, serde_json::Value>,
}

/// A file written by a template part.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateFile {
    /// Absolute path on the machine.
    pub path: String,
    /// Octal mode, for example `"0644"` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^0?[0-7]{3,4}$"))]
    pub permissions: Option<String>,
    /// `user:group`, default `root:root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The content (a handlebars template), in `encoding`.
    pub content: String,
    /// How `content` is encoded: `plain` (default), `base64` or `gzip+base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<FileEncoding>,
}

/// How a file's content is encoded in the object.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FileEncoding {
    /// Plain text.
    #[default]
    #[serde(rename = "plain")]
    Plain,
    /// Base64 of the bytes.
    #[serde(rename = "base64")]
    Base64,
    /// Base64 of the gzipped bytes.
    #[serde(rename = "gzip+base64")]
    GzipBase64,
}

/// A systemd unit written by a template part.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Unit {
    /// Unit name, for example `kubelet.service`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9:_.@-]+\.(service|socket|timer|path|mount|target)$"))]
    pub name: String,
    /// Enable the unit. Default: true. A unit without `content` is enabled after the commands:
    /// its file comes with the image or with a package the commands install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// The unit file (a handlebars template). Omit to only add drop-ins to an existing unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Drop-ins written to `/etc/systemd/system/<name>.d/`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_ins: Vec<DropIn>,
}

impl Unit {
    /// Whether the unit is enabled (default true).
    pub fn enabled(&self) -> bool {
        self.enable.unwrap_or(true)
    }
}

/// A systemd drop-in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DropIn {
    /// File name, for example `10-proxy.conf`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9_.@-]+\.conf$"))]
    pub name: String,
    /// Content (a handlebars template).
    pub content: String,
}

pub(crate) fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

pub(crate) fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

pub(crate) fn any_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "x-kubernetes-preserve-unknown-fields": true },
    })
}
