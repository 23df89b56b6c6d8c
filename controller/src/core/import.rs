//! `bootplate import`: a KubeadmConfigTemplate or KubeadmConfig (Cluster API's kubeadm bootstrap
//! provider, `bootstrap.cluster.x-k8s.io` v1beta1 or v1beta2) turned into the
//! BootplateConfigTemplate or BootplateConfig that renders the same cloud-config with the
//! shipped template `kubeadm-compat`, and the list of every field that cannot be carried.
//!
//! Pure: a parsed object in, a typed object and the lost fields out. The CLI reads the file
//! (bounded before it is parsed) and decides what a lost field means (an error, or a warning
//! with `--allow-lossy`). docs/migrating.md has the field table this module implements.

use std::collections::BTreeMap;

use crd_types::{
    BootplateConfigSpec, ConfigFile, FileEncoding, FileSource, SecretKeyRef, TemplateKind,
    TemplateRef,
};
use serde_json::{Map, Value, json};

/// The shipped template imported configs reference.
pub const COMPAT_TEMPLATE: &str = "kubeadm-compat";
/// The shipped template imported configs with `format: ignition` reference.
pub const COMPAT_IGNITION_TEMPLATE: &str = "kubeadm-compat-ignition";
/// The fields the kubeadm bootstrap provider's Ignition does not write (its webhook refuses
/// some; it ignores the others), so kubeadm-compat-ignition declares no variable for them.
const NOT_WITH_IGNITION: &[(&str, &str)] = &[
    (
        "bootCommands",
        "the kubeadm bootstrap provider refuses bootCommands with format ignition",
    ),
    (
        "useExperimentalRetryJoin",
        "the kubeadm bootstrap provider's Ignition ignores it (kubeadm join runs once)",
    ),
    (
        "mounts",
        "mounts are not carried for format ignition: declare the mount units in a template of your own",
    ),
    (
        "diskSetup",
        "disk setup is not carried for format ignition: declare storage.disks and filesystems in a template of your own",
    ),
];
/// The kubeadm bootstrap provider's API group.
const KUBEADM_GROUP: &str = "bootstrap.cluster.x-k8s.io/";
/// bootplate's API version.
const BOOTPLATE_API: &str = "bootstrap.bootplate.dev/v1alpha1";

/// Why an object cannot be imported at all.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ImportError {
    #[error(
        "{object}: not a KubeadmConfigTemplate or KubeadmConfig of {KUBEADM_GROUP}* (found kind {kind:?}, apiVersion {api_version:?})"
    )]
    NotKubeadm {
        object: String,
        kind: String,
        api_version: String,
    },
    #[error("{object}: {field}: {why}")]
    Field {
        object: String,
        field: String,
        why: String,
    },
}

/// A field of the source that the imported object does not carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Lost {
    /// The field's path in the source object, for example `spec.template.spec.files[2].append`.
    pub field: String,
    /// Why it is not carried, and what to do instead.
    pub why: String,
}

/// The imported object and what it leaves behind.
#[derive(Debug)]
pub struct Imported {
    /// `BootplateConfigTemplate` or `BootplateConfig`.
    pub kind: &'static str,
    pub name: String,
    pub namespace: Option<String>,
    pub spec: BootplateConfigSpec,
    pub lost: Vec<Lost>,
}

impl Imported {
    /// The kind of the source object.
    pub fn source_kind(&self) -> &'static str {
        if self.kind == "BootplateConfigTemplate" {
            "KubeadmConfigTemplate"
        } else {
            "KubeadmConfig"
        }
    }

    /// The object as Kubernetes reads it.
    pub fn object(&self) -> Value {
        let spec = serde_json::to_value(&self.spec).expect("a config spec always serializes");
        let mut metadata = json!({ "name": self.name });
        if let Some(ns) = &self.namespace {
            metadata["namespace"] = json!(ns);
        }
        let spec = if self.kind == "BootplateConfigTemplate" {
            json!({ "template": { "spec": spec } })
        } else {
            spec
        };
        json!({ "apiVersion": BOOTPLATE_API, "kind": self.kind, "metadata": metadata, "spec": spec })
    }
}

/// The merge patch that points MachineDeployment's bootstrap at `template` (Cluster API
/// v1beta2, which names the reference by `apiGroup`).
pub fn machine_deployment_patch(template: &str) -> Value {
    json!({ "spec": { "template": { "spec": { "bootstrap": { "configRef": {
        "apiGroup": "bootstrap.bootplate.dev",
        "kind": "BootplateConfigTemplate",
        "name": template,
    } } } } } })
}

/// Where the kubeadm bootstrap provider's users write cloud-init Jinja (every field of its
/// user-data is Jinja), as the field of the KubeadmConfigSpec and the name kubeadm-compat's
/// `jinja` variable gives it. The first match wins.
const JINJA_FIELDS: &[(&str, &str)] = &[
    ("joinConfiguration.nodeRegistration.name", "nodeName"),
    (
        "joinConfiguration.nodeRegistration.kubeletExtraArgs",
        "kubeletExtraArgs",
    ),
    ("preKubeadmCommands[", "preCommands"),
    ("postKubeadmCommands[", "postCommands"),
    ("bootCommands[", "bootCommands"),
    ("files[", "files"),
];

/// The fields of kubeadm-compat's `jinja`: those where the spec at `at` holds a Jinja tag, in
/// the order of [`JINJA_FIELDS`]. A Jinja tag anywhere else is a lost field: kubeadm-compat
/// writes that value as it is. The first control plane's configurations are lost whole already.
fn jinja_fields(source: &Value, at: &str, walk: &mut Walk) -> Vec<&'static str> {
    let mut found = Vec::new();
    for path in jinja_paths(source) {
        if path.starts_with("initConfiguration") || path.starts_with("clusterConfiguration") {
            continue;
        }
        let field = JINJA_FIELDS
            .iter()
            .find(|(prefix, _)| path.starts_with(prefix))
            .filter(|(_, name)| match *name {
                "files" => path.ends_with(".content"),
                "kubeletExtraArgs" => !path.ends_with(".name"),
                _ => true,
            });
        match field {
            Some((_, name)) => found.push(*name),
            None => walk.lose(
                format!("{at}.{path}"),
                "a cloud-init Jinja expression where kubeadm-compat writes the value as it is (it writes Jinja in nodeName, kubeletExtraArgs values, the commands and files' content only)",
            ),
        }
    }
    JINJA_FIELDS
        .iter()
        .map(|(_, name)| *name)
        .filter(|name| found.contains(name))
        .collect()
}

/// The path (`files[0].content`) of every string of `value` that holds a Jinja tag. Walked
/// with a stack, not recursion: the object's depth is its author's.
fn jinja_paths(value: &Value) -> Vec<String> {
    let mut paths = Vec::new();
    let mut stack = vec![(String::new(), value)];
    while let Some((path, v)) = stack.pop() {
        match v {
            Value::String(s) if render::jinja::has_jinja(s) => paths.push(path),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate().rev() {
                    stack.push((format!("{path}[{i}]"), item));
                }
            }
            Value::Object(map) => {
                for (key, item) in map.iter().rev() {
                    let sep = if path.is_empty() { "" } else { "." };
                    stack.push((format!("{path}{sep}{key}"), item));
                }
            }
            _ => {}
        }
    }
    paths
}

/// What the conversion walks: the object's name for messages and the lost fields so far.
struct Walk {
    object: String,
    lost: Vec<Lost>,
    /// The spec has `format: ignition` (no Jinja there).
    ignition: bool,
}

impl Walk {
    fn lose(&mut self, field: impl Into<String>, why: impl Into<String>) {
        self.lost.push(Lost {
            field: field.into(),
            why: why.into(),
        });
    }

    fn error(&self, field: impl Into<String>, why: impl Into<String>) -> ImportError {
        ImportError::Field {
            object: self.object.clone(),
            field: field.into(),
            why: why.into(),
        }
    }
}

/// Imports `object`, a parsed KubeadmConfigTemplate or KubeadmConfig.
pub fn import(object: &Value) -> Result<Imported, ImportError> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let shown = format!("{kind} {name}");
    let (out_kind, spec_field) = match kind {
        "KubeadmConfigTemplate" => ("BootplateConfigTemplate", "spec.template.spec"),
        "KubeadmConfig" => ("BootplateConfig", "spec"),
        _ => ("", ""),
    };
    if out_kind.is_empty() || !api_version.starts_with(KUBEADM_GROUP) {
        return Err(ImportError::NotKubeadm {
            object: shown,
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
        });
    }
    let mut walk = Walk {
        object: shown,
        lost: Vec::new(),
        ignition: false,
    };
    if name.is_empty() {
        return Err(walk.error("metadata.name", "the object has no name"));
    }
    let source = spec_field.split('.').fold(object, |v, key| &v[key]);
    let spec = convert_spec(source, spec_field, &mut walk)?;
    Ok(Imported {
        kind: out_kind,
        name: name.to_owned(),
        namespace: object["metadata"]["namespace"].as_str().map(str::to_owned),
        spec,
        lost: walk.lost,
    })
}

/// The KubeadmConfigSpec at `at` as a BootplateConfigSpec of kubeadm-compat.
fn convert_spec(
    source: &Value,
    at: &str,
    walk: &mut Walk,
) -> Result<BootplateConfigSpec, ImportError> {
    let empty = Map::new();
    let fields = match source {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => return Err(walk.error(at, "not an object (a KubeadmConfigSpec)")),
    };
    let ignition = fields.get("format").and_then(Value::as_str) == Some("ignition");
    walk.ignition = ignition;
    let mut spec = BootplateConfigSpec {
        template_ref: TemplateRef {
            kind: TemplateKind::ClusterBootstrapTemplate,
            name: if ignition {
                COMPAT_IGNITION_TEMPLATE
            } else {
                COMPAT_TEMPLATE
            }
            .to_owned(),
            namespace: None,
        },
        ..Default::default()
    };
    for (key, value) in fields {
        let field = format!("{at}.{key}");
        match NOT_WITH_IGNITION.iter().find(|(k, _)| k == key) {
            Some((_, why)) if ignition => lose_unless_empty(value, &field, walk, why),
            _ => convert_field(key, value, &field, &mut spec, walk)?,
        }
    }
    if ignition && let Some(users) = spec.variables.get_mut("users") {
        lose_ignition_user_fields(users, &format!("{at}.users"), walk);
    }
    if !ignition {
        let jinja = jinja_fields(source, at, walk);
        if !jinja.is_empty() {
            set(&mut spec.variables, "jinja", json!(jinja));
        }
    }
    Ok(spec)
}

/// One top-level field of a KubeadmConfigSpec.
fn convert_field(
    key: &str,
    value: &Value,
    field: &str,
    spec: &mut BootplateConfigSpec,
    walk: &mut Walk,
) -> Result<(), ImportError> {
    let vars = &mut spec.variables;
    match key {
        "files" => spec.files = convert_files(value, field, walk)?,
        "preKubeadmCommands" => spec.pre_commands = strings(value, field, walk)?,
        "postKubeadmCommands" => spec.post_commands = strings(value, field, walk)?,
        "bootCommands" => set(vars, "bootCommands", json!(strings(value, field, walk)?)),
        "users" => set(vars, "users", convert_users(value, field, walk)?),
        "ntp" => set(
            vars,
            "ntp",
            keep_keys(value, field, &["servers", "enabled"], walk)?,
        ),
        "mounts" => set(vars, "mounts", list(value, field, walk)?.clone().into()),
        "diskSetup" => set(vars, "diskSetup", convert_disk_setup(value, field, walk)?),
        "verbosity" => set(vars, "verbosity", value.clone()),
        "useExperimentalRetryJoin" => set(vars, "useExperimentalRetryJoin", value.clone()),
        "joinConfiguration" => convert_join(value, field, vars, walk)?,
        "format" => convert_format(value, field, walk),
        "initConfiguration" | "clusterConfiguration" => lose_unless_empty(
            value,
            field,
            walk,
            "the first control-plane machine's kubeadm configuration: keep KubeadmControlPlane for the control plane (kubeadm-compat writes a minimal init only)",
        ),
        "ignition" => convert_ignition(value, field, walk),
        _ => walk.lose(field, "a field kubeadm-compat does not know"),
    }
    Ok(())
}

fn set(vars: &mut BTreeMap<String, Value>, name: &str, value: Value) {
    if !value.is_null() {
        vars.insert(name.to_owned(), value);
    }
}

fn lose_unless_empty(value: &Value, field: &str, walk: &mut Walk, why: &str) {
    let empty = match value {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        _ => false,
    };
    if !empty {
        walk.lose(field, why);
    }
}

fn convert_format(value: &Value, field: &str, walk: &mut Walk) {
    match value.as_str() {
        None | Some("") | Some("cloud-config") | Some("ignition") => {}
        Some(_) => walk.lose(
            field,
            "a format the kubeadm bootstrap provider does not know",
        ),
    }
}

/// `ignition.containerLinuxConfig`: the provider transpiles its additionalConfig (a Container
/// Linux Config) and merges it in; bootplate transpiles nothing, so a non-empty one is lost.
fn convert_ignition(value: &Value, field: &str, walk: &mut Walk) {
    let clc = &value["containerLinuxConfig"];
    let additional = clc["additionalConfig"].as_str().unwrap_or_default();
    if !additional.trim().is_empty() {
        walk.lose(
            format!("{field}.containerLinuxConfig.additionalConfig"),
            "a Container Linux Config is not transpiled: write its files and units as the config's files or in a template of your own",
        );
    }
    if let Value::Object(m) = value {
        for key in m.keys().filter(|k| *k != "containerLinuxConfig") {
            walk.lose(
                format!("{field}.{key}"),
                "a field kubeadm-compat-ignition does not know",
            );
        }
    }
}

/// users[].inactive (the provider refuses it with Ignition) and lockPassword (its sshd_config
/// for password logins is not written by kubeadm-compat-ignition) are lost and left out.
fn lose_ignition_user_fields(users: &mut Value, field: &str, walk: &mut Walk) {
    for (i, user) in users.as_array_mut().into_iter().flatten().enumerate() {
        let Value::Object(m) = user else { continue };
        for key in ["inactive", "lockPassword"] {
            if m.remove(key).is_some() {
                walk.lose(
                    format!("{field}[{i}].{key}"),
                    "not carried for format ignition: kubeadm-compat-ignition writes Ignition's passwd.users, SSH keys and sudo",
                );
            }
        }
    }
}

fn list<'a>(value: &'a Value, field: &str, walk: &Walk) -> Result<&'a Vec<Value>, ImportError> {
    static EMPTY: Vec<Value> = Vec::new();
    match value {
        Value::Array(items) => Ok(items),
        Value::Null => Ok(&EMPTY),
        _ => Err(walk.error(field, "not a list")),
    }
}

fn strings(value: &Value, field: &str, walk: &Walk) -> Result<Vec<String>, ImportError> {
    list(value, field, walk)?
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_str()
                .map(str::to_owned)
                .ok_or_else(|| walk.error(format!("{field}[{i}]"), "not a string"))
        })
        .collect()
}

/// The object `value` with only the `known` keys; every other key is lost.
fn keep_keys(
    value: &Value,
    field: &str,
    known: &[&str],
    walk: &mut Walk,
) -> Result<Value, ImportError> {
    let Value::Object(map) = value else {
        return if value.is_null() {
            Ok(Value::Null)
        } else {
            Err(walk.error(field, "not an object"))
        };
    };
    let mut kept = Map::new();
    for (key, v) in map {
        if known.contains(&key.as_str()) {
            kept.insert(key.clone(), v.clone());
        } else {
            walk.lose(
                format!("{field}.{key}"),
                "a field kubeadm-compat does not know",
            );
        }
    }
    Ok(Value::Object(kept))
}

/// The fields of a user that kubeadm-compat writes; `passwdFrom` reads a Secret the
/// template's render context never holds.
const USER_FIELDS: &[&str] = &[
    "name",
    "gecos",
    "groups",
    "homeDir",
    "inactive",
    "shell",
    "passwd",
    "primaryGroup",
    "lockPassword",
    "sudo",
    "sshAuthorizedKeys",
];

fn convert_users(value: &Value, field: &str, walk: &mut Walk) -> Result<Value, ImportError> {
    let mut users = Vec::new();
    for (i, user) in list(value, field, walk)?.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if user
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(walk.error(format!("{at}.name"), "a user needs a name"));
        }
        if let Some(Value::Object(_)) = user.get("passwdFrom") {
            walk.lose(
                format!("{at}.passwdFrom"),
                "a password hash read from a Secret is not carried: set passwd, or use SSH keys",
            );
        }
        let mut user = user.clone();
        if let Value::Object(m) = &mut user {
            m.remove("passwdFrom");
        }
        users.push(keep_keys(&user, &at, USER_FIELDS, walk)?);
    }
    Ok(Value::Array(users))
}

fn convert_disk_setup(value: &Value, field: &str, walk: &mut Walk) -> Result<Value, ImportError> {
    let setup = keep_keys(value, field, &["partitions", "filesystems"], walk)?;
    let mut out = Map::new();
    let shapes: [(&str, &[&str]); 2] = [
        (
            "partitions",
            &["device", "layout", "overwrite", "tableType"],
        ),
        (
            "filesystems",
            &[
                "device",
                "filesystem",
                "label",
                "partition",
                "overwrite",
                "replaceFS",
                "extraOpts",
            ],
        ),
    ];
    for (key, known) in shapes {
        let at = format!("{field}.{key}");
        let mut items = Vec::new();
        for (i, item) in list(&setup[key], &at, walk)?.iter().enumerate() {
            items.push(keep_keys(item, &format!("{at}[{i}]"), known, walk)?);
        }
        if !items.is_empty() {
            out.insert(key.to_owned(), Value::Array(items));
        }
    }
    Ok(Value::Object(out))
}

/// The spec's files: inline or from a Secret of the config's namespace, as the config's own
/// files (written by kubeadm-compat in the same place of the cloud-config).
fn convert_files(
    value: &Value,
    field: &str,
    walk: &mut Walk,
) -> Result<Vec<ConfigFile>, ImportError> {
    let mut files = Vec::new();
    for (i, file) in list(value, field, walk)?.iter().enumerate() {
        files.push(convert_file(file, &format!("{field}[{i}]"), walk)?);
    }
    Ok(files)
}

fn convert_file(file: &Value, at: &str, walk: &mut Walk) -> Result<ConfigFile, ImportError> {
    for key in ["path", "owner", "permissions", "content", "encoding"] {
        if file
            .get(key)
            .is_some_and(|v| !v.is_null() && !v.is_string())
        {
            return Err(walk.error(format!("{at}.{key}"), "not a string (quote it)"));
        }
    }
    let text = |key: &str| file.get(key).and_then(Value::as_str).map(str::to_owned);
    let path =
        text("path").ok_or_else(|| walk.error(format!("{at}.path"), "a file needs a path"))?;
    let mut out = ConfigFile {
        path,
        owner: text("owner").filter(|o| !o.is_empty()),
        permissions: text("permissions").filter(|p| !p.is_empty()),
        content: text("content"),
        ..Default::default()
    };
    if let Some(p) = &out.permissions
        && (!(3..=4).contains(&p.len()) || !p.chars().all(|c| ('0'..='7').contains(&c)))
    {
        return Err(walk.error(
            format!("{at}.permissions"),
            "permissions are three or four octal digits, for example \"0644\"",
        ));
    }
    out.encoding = match text("encoding").as_deref() {
        None | Some("") => None,
        Some("base64") => Some(FileEncoding::Base64),
        Some("gzip+base64") => Some(FileEncoding::GzipBase64),
        Some(other) => {
            walk.lose(
                format!("{at}.encoding"),
                format!(
                    "encoding {other:?} is not carried: give the content as base64 or gzip+base64"
                ),
            );
            None
        }
    };
    if file.get("append").and_then(Value::as_bool) == Some(true) {
        walk.lose(
            format!("{at}.append"),
            "appending to a file of the image is not carried: the file is written whole",
        );
    }
    out.content_from = convert_content_from(file, at, walk)?;
    if out.content.is_some() == out.content_from.is_some() {
        return Err(walk.error(
            at.to_owned(),
            "a file needs exactly one of content and contentFrom",
        ));
    }
    Ok(out)
}

fn convert_content_from(
    file: &Value,
    at: &str,
    walk: &Walk,
) -> Result<Option<FileSource>, ImportError> {
    let Some(from) = file.get("contentFrom").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let secret = &from["secret"];
    let name = secret["name"].as_str().unwrap_or_default();
    let key = secret["key"].as_str().unwrap_or_default();
    if name.is_empty() || key.is_empty() {
        return Err(walk.error(
            format!("{at}.contentFrom.secret"),
            "contentFrom needs a Secret's name and key",
        ));
    }
    Ok(Some(FileSource {
        secret: SecretKeyRef {
            name: name.to_owned(),
            key: key.to_owned(),
            namespace: None,
        },
    }))
}

/// joinConfiguration: the node registration, the control-plane endpoint, skipped phases and
/// patches become variables; discovery is the Machine's own (bootplate fills it in).
fn convert_join(
    value: &Value,
    field: &str,
    vars: &mut BTreeMap<String, Value>,
    walk: &mut Walk,
) -> Result<(), ImportError> {
    let join = keep_keys(
        value,
        field,
        &[
            "nodeRegistration",
            "controlPlane",
            "skipPhases",
            "patches",
            "discovery",
            "caCertPath",
        ],
        walk,
    )?;
    if join.is_null() {
        return Ok(());
    }
    convert_node_registration(
        &join["nodeRegistration"],
        &format!("{field}.nodeRegistration"),
        vars,
        walk,
    )?;
    let cp = keep_keys(
        &join["controlPlane"],
        &format!("{field}.controlPlane"),
        &["localAPIEndpoint"],
        walk,
    )?;
    let endpoint = keep_keys(
        &cp["localAPIEndpoint"],
        &format!("{field}.controlPlane.localAPIEndpoint"),
        &["advertiseAddress", "bindPort"],
        walk,
    )?;
    set(
        vars,
        "controlPlaneAdvertiseAddress",
        endpoint["advertiseAddress"].clone(),
    );
    set(vars, "controlPlaneBindPort", endpoint["bindPort"].clone());
    set(vars, "skipPhases", join["skipPhases"].clone());
    let patches = keep_keys(
        &join["patches"],
        &format!("{field}.patches"),
        &["directory"],
        walk,
    )?;
    set(vars, "patchesDirectory", patches["directory"].clone());
    // bootplate fills in the bootstrap token discovery (the Machine's token, the API server
    // endpoint, the CA hashes), as the kubeadm bootstrap provider does: what a KubeadmConfig
    // holds there is the provider's own. Every other way of discovery is not carried.
    keep_keys(
        &join["discovery"],
        &format!("{field}.discovery"),
        &["bootstrapToken"],
        walk,
    )?;
    if join["caCertPath"].as_str().is_some_and(|p| !p.is_empty()) {
        walk.lose(
            format!("{field}.caCertPath"),
            "kubeadm's default CA path is used",
        );
    }
    Ok(())
}

fn convert_node_registration(
    value: &Value,
    field: &str,
    vars: &mut BTreeMap<String, Value>,
    walk: &mut Walk,
) -> Result<(), ImportError> {
    let known = [
        "name",
        "criSocket",
        "imagePullPolicy",
        "ignorePreflightErrors",
        "taints",
        "kubeletExtraArgs",
    ];
    let reg = keep_keys(value, field, &known, walk)?;
    if reg.is_null() {
        return Ok(());
    }
    match reg["name"].as_str() {
        Some(name) if walk.ignition && render::jinja::has_jinja(name) => walk.lose(
            format!("{field}.name"),
            "a cloud-init Jinja expression, and Ignition has no Jinja (the provider writes it as it is, and kubeadm refuses that name): left out, kubeadm names the node after its host name",
        ),
        _ => set(vars, "nodeName", reg["name"].clone()),
    }
    set(vars, "criSocket", reg["criSocket"].clone());
    set(vars, "imagePullPolicy", reg["imagePullPolicy"].clone());
    set(
        vars,
        "ignorePreflightErrors",
        reg["ignorePreflightErrors"].clone(),
    );
    set(vars, "taints", reg["taints"].clone());
    let args = kubelet_extra_args(
        &reg["kubeletExtraArgs"],
        &format!("{field}.kubeletExtraArgs"),
        walk,
    )?;
    if !args.is_empty() {
        vars.insert("kubeletExtraArgs".to_owned(), Value::Array(args));
    }
    Ok(())
}

/// kubeletExtraArgs as the `{name, value}` list: v1beta1's map (in its key order, which is
/// what kubeadm's own conversion gives) or v1beta2's list as it is.
fn kubelet_extra_args(value: &Value, field: &str, walk: &Walk) -> Result<Vec<Value>, ImportError> {
    let pair = |name: &str, value: &Value, at: String| match value.as_str() {
        Some(v) => Ok(json!({ "name": name, "value": v })),
        None => Err(walk.error(at, "a flag's value must be a string")),
    };
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| pair(k, v, format!("{field}.{k}")))
            .collect(),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let name = item["name"].as_str().unwrap_or_default();
                if name.is_empty() {
                    return Err(walk.error(format!("{field}[{i}].name"), "a flag needs a name"));
                }
                pair(name, &item["value"], format!("{field}[{i}].value"))
            })
            .collect(),
        _ => Err(walk.error(field, "neither a map nor a list of {name, value}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(spec: Value) -> Value {
        json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmConfigTemplate",
            "metadata": { "name": "workers", "namespace": "team-a" },
            "spec": { "template": { "spec": spec } },
        })
    }

    const AT: &str = "spec.template.spec";

    /// Each case: a KubeadmConfigSpec and the variables it becomes (and no field lost).
    #[test]
    fn carried_fields_become_variables() {
        let cases: &[(&str, Value, Value)] = &[
            ("empty", json!({}), json!({})),
            (
                "boot commands",
                json!({"bootCommands": ["echo a"]}),
                json!({"bootCommands": ["echo a"]}),
            ),
            (
                "ntp",
                json!({"ntp": {"servers": ["a.example"], "enabled": true}}),
                json!({"ntp": {"servers": ["a.example"], "enabled": true}}),
            ),
            (
                "users, passwdFrom-free",
                json!({"users": [{"name": "ops", "sudo": "ALL=(ALL) NOPASSWD:ALL", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"], "lockPassword": false}]}),
                json!({"users": [{"name": "ops", "sudo": "ALL=(ALL) NOPASSWD:ALL", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"], "lockPassword": false}]}),
            ),
            (
                "mounts",
                json!({"mounts": [["LABEL=etcd", "/var/lib/etcd"]]}),
                json!({"mounts": [["LABEL=etcd", "/var/lib/etcd"]]}),
            ),
            (
                "disk setup",
                json!({"diskSetup": {"partitions": [{"device": "/dev/sdb", "layout": true, "tableType": "gpt"}], "filesystems": [{"device": "/dev/sdb1", "filesystem": "ext4", "label": "etcd"}]}}),
                json!({"diskSetup": {"partitions": [{"device": "/dev/sdb", "layout": true, "tableType": "gpt"}], "filesystems": [{"device": "/dev/sdb1", "filesystem": "ext4", "label": "etcd"}]}}),
            ),
            (
                "verbosity and retry",
                json!({"verbosity": 5, "useExperimentalRetryJoin": true}),
                json!({"verbosity": 5, "useExperimentalRetryJoin": true}),
            ),
            (
                "v1beta1 kubelet args map",
                json!({"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": {"node-labels": "a=b", "cloud-provider": "external"}}}}),
                json!({"kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}, {"name": "node-labels", "value": "a=b"}]}),
            ),
            (
                "v1beta2 kubelet args list, a flag repeated",
                json!({"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "v", "value": "2"}, {"name": "v", "value": "4"}]}}}),
                json!({"kubeletExtraArgs": [{"name": "v", "value": "2"}, {"name": "v", "value": "4"}]}),
            ),
            (
                "node registration",
                json!({"joinConfiguration": {"nodeRegistration": {"name": "n1", "criSocket": "unix:///run/c.sock", "imagePullPolicy": "Always", "ignorePreflightErrors": ["NumCPU"], "taints": []}}}),
                json!({"nodeName": "n1", "criSocket": "unix:///run/c.sock", "imagePullPolicy": "Always", "ignorePreflightErrors": ["NumCPU"], "taints": []}),
            ),
            (
                "control plane, phases, patches, empty discovery",
                json!({"joinConfiguration": {"controlPlane": {"localAPIEndpoint": {"advertiseAddress": "10.0.0.5", "bindPort": 6444}}, "skipPhases": ["preflight"], "patches": {"directory": "/etc/p"}, "discovery": {}}}),
                json!({"controlPlaneAdvertiseAddress": "10.0.0.5", "controlPlaneBindPort": 6444, "skipPhases": ["preflight"], "patchesDirectory": "/etc/p"}),
            ),
            (
                "cloud-config format",
                json!({"format": "cloud-config"}),
                json!({}),
            ),
        ];
        assert_carried(cases);
    }

    /// Each case: cloud-init Jinja where the kubeadm provider's users write it, carried with the
    /// `jinja` variable naming its fields.
    #[test]
    fn jinja_fields_become_variables() {
        let cases: &[(&str, Value, Value)] = &[
            (
                "a Jinja node name (AWS, Azure, GCP, OpenStack, Metal3)",
                json!({"joinConfiguration": {"nodeRegistration": {"name": "{{ ds.meta_data.local_hostname }}"}}}),
                json!({"nodeName": "{{ ds.meta_data.local_hostname }}", "jinja": ["nodeName"]}),
            ),
            (
                "Jinja in a flag's value, listed in the template's order",
                json!({"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": {"provider-id": "metal3://{{ ds.meta_data.providerid }}"}, "name": "{% if 1 %}n{% endif %}"}}}),
                json!({"kubeletExtraArgs": [{"name": "provider-id", "value": "metal3://{{ ds.meta_data.providerid }}"}], "nodeName": "{% if 1 %}n{% endif %}", "jinja": ["nodeName", "kubeletExtraArgs"]}),
            ),
            (
                "Jinja in commands and file content (vSphere's hostname commands)",
                json!({"preKubeadmCommands": ["hostnamectl set-hostname \"{{ ds.meta_data.hostname }}\""], "postKubeadmCommands": ["echo {# c #}"], "bootCommands": ["echo {{ v1.region }}"], "files": [{"path": "/etc/h", "content": "{{ ds.meta_data.hostname }}"}]}),
                json!({"bootCommands": ["echo {{ v1.region }}"], "jinja": ["preCommands", "postCommands", "bootCommands", "files"]}),
            ),
            (
                "braces that are not Jinja",
                json!({"preKubeadmCommands": ["echo ${A} {a: 1}"]}),
                json!({}),
            ),
        ];
        assert_carried(cases);
    }

    fn assert_carried(cases: &[(&str, Value, Value)]) {
        for (name, spec, variables) in cases {
            let imported =
                import(&template(spec.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(imported.lost, vec![], "{name}");
            assert_eq!(json!(imported.spec.variables), *variables, "{name}");
            assert_eq!(imported.spec.template_ref.name, COMPAT_TEMPLATE, "{name}");
            assert_eq!(
                imported.spec.template_ref.kind,
                TemplateKind::ClusterBootstrapTemplate
            );
        }
    }

    /// Each case: a spec with a field kubeadm-compat cannot carry, and the field named.
    #[test]
    fn lost_fields_are_named() {
        let cases: &[(Value, &str)] = &[
            (
                json!({"files": [{"path": "/a", "content": "x", "append": true}]}),
                "files[0].append",
            ),
            (
                json!({"files": [{"path": "/a", "content": "x", "encoding": "gzip"}]}),
                "files[0].encoding",
            ),
            (
                json!({"users": [{"name": "u", "passwdFrom": {"secret": {"name": "s", "key": "k"}}}]}),
                "users[0].passwdFrom",
            ),
            (
                json!({"users": [{"name": "u", "shelll": "/bin/sh"}]}),
                "users[0].shelll",
            ),
            (json!({"format": "yaml"}), "format"),
            (
                json!({"clusterConfiguration": {"apiServer": {}}}),
                "clusterConfiguration",
            ),
            (
                json!({"initConfiguration": {"nodeRegistration": {}}}),
                "initConfiguration",
            ),
            (
                json!({"users": [{"name": "u", "gecos": "{{ ds.meta_data.instance_id }}"}]}),
                "users[0].gecos",
            ),
            (
                json!({"files": [{"path": "/a", "content": "x", "owner": "{{ v1.user }}"}]}),
                "files[0].owner",
            ),
            (
                json!({"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "{{ x }}", "value": "1"}]}}}),
                "joinConfiguration.nodeRegistration.kubeletExtraArgs[0].name",
            ),
            (
                json!({"joinConfiguration": {"nodeRegistration": {"imagePullSerial": false}}}),
                "joinConfiguration.nodeRegistration.imagePullSerial",
            ),
            (
                json!({"joinConfiguration": {"discovery": {"timeout": "5m", "bootstrapToken": {"token": "a.b"}}}}),
                "joinConfiguration.discovery.timeout",
            ),
            (
                json!({"joinConfiguration": {"controlPlane": {"certificateKey": "x"}}}),
                "joinConfiguration.controlPlane.certificateKey",
            ),
            (
                json!({"joinConfiguration": {"timeouts": {}}}),
                "joinConfiguration.timeouts",
            ),
            (
                json!({"joinConfiguration": {"caCertPath": "/x"}}),
                "joinConfiguration.caCertPath",
            ),
            (
                json!({"diskSetup": {"partitions": [{"device": "/dev/sdb", "layout": true, "size": 3}]}}),
                "diskSetup.partitions[0].size",
            ),
            (json!({"somethingNew": 1}), "somethingNew"),
        ];
        assert_lost(cases);
        // The first control plane's configuration is lost whole, its Jinja not named again.
        let init =
            json!({"initConfiguration": {"nodeRegistration": {"name": "{{ local_hostname }}"}}});
        let imported = import(&template(init)).unwrap();
        assert_eq!(imported.lost.len(), 1);
        assert!(imported.spec.variables.is_empty());
    }

    fn assert_lost(cases: &[(Value, &str)]) {
        for (spec, field) in cases {
            let imported =
                import(&template(spec.clone())).unwrap_or_else(|e| panic!("{field}: {e}"));
            let fields: Vec<&str> = imported.lost.iter().map(|l| l.field.as_str()).collect();
            assert_eq!(fields, vec![format!("{AT}.{field}")], "{spec}");
        }
    }

    /// With `format: ignition`, what the provider refuses or ignores there, and what
    /// kubeadm-compat-ignition does not write, is named.
    #[test]
    fn ignition_lost_fields_are_named() {
        let cases: &[(Value, &str)] = &[
            (
                json!({"format": "ignition", "ignition": {"containerLinuxConfig": {"additionalConfig": "x"}}}),
                "ignition.containerLinuxConfig.additionalConfig",
            ),
            (
                json!({"format": "ignition", "bootCommands": ["echo"]}),
                "bootCommands",
            ),
            (
                json!({"format": "ignition", "useExperimentalRetryJoin": true}),
                "useExperimentalRetryJoin",
            ),
            (
                json!({"format": "ignition", "mounts": [["a", "/b"]]}),
                "mounts",
            ),
            (
                json!({"format": "ignition", "diskSetup": {"partitions": [{"device": "/dev/sdb"}]}}),
                "diskSetup",
            ),
            (
                json!({"format": "ignition", "users": [{"name": "u", "lockPassword": false}]}),
                "users[0].lockPassword",
            ),
            (
                json!({"format": "ignition", "joinConfiguration": {"nodeRegistration": {"name": "{{ ds.meta_data.local_hostname }}"}}}),
                "joinConfiguration.nodeRegistration.name",
            ),
        ];
        assert_lost(cases);
        // Ignition has no Jinja: a Jinja node name is left out (kubeadm would refuse it), and
        // no `jinja` variable is set; Jinja in a command is written as it is, as the provider
        // writes it.
        let spec = json!({"format": "ignition", "preKubeadmCommands": ["echo {{ x }}"],
            "joinConfiguration": {"nodeRegistration": {"name": "{{ ds.meta_data.local_hostname }}"}}});
        let imported = import(&template(spec)).unwrap();
        assert!(imported.spec.variables.is_empty());
        assert_eq!(imported.spec.pre_commands, ["echo {{ x }}"]);
    }

    /// Each case: an object that cannot be imported, and the field the error names.
    #[test]
    fn refused_objects_name_the_field() {
        let cases: &[(Value, &str)] = &[
            (json!({"files": [{"content": "x"}]}), "files[0].path"),
            (json!({"files": [{"path": "/a"}]}), "files[0]"),
            (
                json!({"files": [{"path": "/a", "content": "x", "contentFrom": {"secret": {"name": "s", "key": "k"}}}]}),
                "files[0]",
            ),
            (
                json!({"files": [{"path": "/a", "contentFrom": {"secret": {"name": "s"}}}]}),
                "files[0].contentFrom.secret",
            ),
            (
                json!({"files": [{"path": "/a", "content": "x", "permissions": "rw-r--r--"}]}),
                "files[0].permissions",
            ),
            (json!({"files": "x"}), "files"),
            (
                json!({"files": [{"path": "/a", "content": "x", "permissions": 644}]}),
                "files[0].permissions",
            ),
            (json!({"preKubeadmCommands": [1]}), "preKubeadmCommands[0]"),
            (json!({"users": [{"sudo": "ALL"}]}), "users[0].name"),
            (
                json!({"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": {"v": 4}}}}),
                "joinConfiguration.nodeRegistration.kubeletExtraArgs.v",
            ),
            (
                json!({"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"value": "4"}]}}}),
                "joinConfiguration.nodeRegistration.kubeletExtraArgs[0].name",
            ),
        ];
        for (spec, field) in cases {
            match import(&template(spec.clone())) {
                Err(ImportError::Field {
                    field: got, object, ..
                }) => {
                    assert_eq!(got, format!("{AT}.{field}"), "{spec}");
                    assert_eq!(object, "KubeadmConfigTemplate workers");
                }
                other => panic!("{spec}: {other:?}"),
            }
        }
    }

    /// `format: ignition` imports to kubeadm-compat-ignition, with the variables it declares.
    #[test]
    fn ignition_specs_import_to_the_ignition_template() {
        let spec = json!({
            "format": "ignition",
            "ignition": {"containerLinuxConfig": {}},
            "users": [{"name": "core", "sudo": "ALL=(ALL) NOPASSWD:ALL", "groups": "docker, wheel"}],
            "ntp": {"servers": ["a.example"], "enabled": true},
            "verbosity": 4,
            "files": [{"path": "/a", "content": "x"}],
        });
        let imported = import(&template(spec)).unwrap();
        assert_eq!(imported.lost, vec![]);
        assert_eq!(imported.spec.template_ref.name, COMPAT_IGNITION_TEMPLATE);
        assert_eq!(
            json!(imported.spec.variables),
            json!({
                "users": [{"name": "core", "sudo": "ALL=(ALL) NOPASSWD:ALL", "groups": "docker, wheel"}],
                "ntp": {"servers": ["a.example"], "enabled": true},
                "verbosity": 4,
            })
        );
        assert_eq!(imported.spec.files.len(), 1);
        let template = shipped("templates/kubeadm-compat-ignition.yaml");
        for name in imported.spec.variables.keys() {
            assert!(
                template.contains(&format!("    - name: {name}\n")),
                "{name}"
            );
        }
    }

    fn shipped(path: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        std::fs::read_to_string(&path).unwrap()
    }

    #[test]
    fn files_commands_and_kinds() {
        let spec = json!({
            "files": [
                {"path": "/etc/a", "content": "a", "owner": "root:adm", "permissions": "0600", "encoding": "base64"},
                {"path": "/etc/b", "contentFrom": {"secret": {"name": "s", "key": "k"}}},
            ],
            "preKubeadmCommands": ["echo pre"],
            "postKubeadmCommands": ["echo post"],
        });
        let imported = import(&template(spec)).unwrap();
        let files = &imported.spec.files;
        assert_eq!(files[0].encoding, Some(FileEncoding::Base64));
        assert_eq!(files[0].permissions.as_deref(), Some("0600"));
        assert_eq!(files[0].owner.as_deref(), Some("root:adm"));
        assert_eq!(files[1].content_from.as_ref().unwrap().secret.key, "k");
        assert_eq!(imported.spec.pre_commands, ["echo pre"]);
        assert_eq!(imported.spec.post_commands, ["echo post"]);
        let object = imported.object();
        assert_eq!(object["kind"], "BootplateConfigTemplate");
        assert_eq!(
            object["metadata"],
            json!({"name": "workers", "namespace": "team-a"})
        );
        assert_eq!(
            object["spec"]["template"]["spec"]["templateRef"]["name"],
            COMPAT_TEMPLATE
        );

        let config = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig",
            "metadata": {"name": "m1"}, "spec": {"preKubeadmCommands": ["x"]}});
        let imported = import(&config).unwrap();
        assert_eq!(imported.object()["kind"], "BootplateConfig");
        assert_eq!(imported.object()["spec"]["preCommands"], json!(["x"]));

        for (kind, api) in [
            ("MachineDeployment", "cluster.x-k8s.io/v1beta2"),
            ("KubeadmConfig", "example.com/v1"),
        ] {
            let other = json!({"apiVersion": api, "kind": kind, "metadata": {"name": "x"}});
            assert!(
                matches!(import(&other), Err(ImportError::NotKubeadm { .. })),
                "{kind}"
            );
        }
    }

    /// The comparison tier's corpus, the providers' templates included: each imports with the
    /// lost fields it names and no other, and a Jinja node name is carried with `jinja`.
    #[test]
    fn the_corpus_imports_with_the_losses_it_names() {
        let text = shipped("tests/corpus/kubeadm-specs.yaml");
        let mut jinja = 0;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let doc: Value = serde::Deserialize::deserialize(doc).unwrap();
            let name = doc["name"].as_str().unwrap();
            let config = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmConfig", "metadata": {"name": name}, "spec": doc["spec"]});
            let imported = import(&config).unwrap_or_else(|e| panic!("{name}: {e}"));
            let lost: Vec<String> = imported.lost.iter().map(|l| l.field.clone()).collect();
            let named: Vec<String> = (doc["lost"].as_array().into_iter().flatten())
                .map(|f| format!("spec.{}", f.as_str().unwrap()))
                .collect();
            assert_eq!(lost, named, "{name}");
            let node = &doc["spec"]["joinConfiguration"]["nodeRegistration"]["name"];
            if node.as_str().is_some_and(render::jinja::has_jinja) {
                assert_eq!(imported.spec.variables["nodeName"], *node, "{name}");
                assert_eq!(
                    imported.spec.variables["jinja"],
                    json!(["nodeName"]),
                    "{name}"
                );
                jinja += 1;
            }
        }
        assert_eq!(
            jinja, 8,
            "the providers' specs that name the node with Jinja"
        );
    }

    #[test]
    fn the_patch_points_at_the_template() {
        let patch = machine_deployment_patch("workers");
        assert_eq!(
            patch["spec"]["template"]["spec"]["bootstrap"]["configRef"],
            json!({"apiGroup": "bootstrap.bootplate.dev", "kind": "BootplateConfigTemplate", "name": "workers"})
        );
    }
}
