//! The generator protocol, `generator.bootplate.dev/v1alpha1` (docs/generators.md): the request
//! bootplate POSTs to a `BootstrapGenerator` for one template part of one machine, and the
//! strict reading of its response. No HTTP here: the controller and the CLI carry the bytes.
//!
//! A request holds only what the generator is allowed to see: the Machine, the Cluster, the
//! role, the template revision and the values always; the join token and the certificates
//! only when its `spec.secrets` grants them. Its idempotency key is the digest of everything in
//! it but the request ID, so equal inputs give equal keys and a caller may answer from a cache.
//!
//! A response's files, units and commands are data, never templates: they are checked as the
//! API server checks a template's (paths, modes, owners, unit names, encodings), with unknown
//! fields refused, and written out in the template's format like any part.

use std::collections::BTreeMap;
use std::sync::Arc;

use crd_types::{FileEncoding, GeneratorSecrets, OutputFormat, TemplateFile, Unit};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::context::{Certificates, ClusterInfo, JoinInfo, MachineInfo, RenderContext};
use crate::error::{Origin, Problem};
use crate::files::{self, File};

/// The protocol version, the `apiVersion` of requests and responses.
pub const API_VERSION: &str = "generator.bootplate.dev/v1alpha1";
/// The `kind` of a request.
pub const REQUEST_KIND: &str = "GeneratePartRequest";
/// The `kind` of a response.
pub const RESPONSE_KIND: &str = "GeneratePartResponse";

/// Validated generator output by part name, as a render takes it.
pub type Generated = BTreeMap<String, Arc<GeneratedPart>>;

/// One generator call a render needs (see `CompiledTemplate::generator_calls`).
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The part's name.
    pub part: String,
    /// The part's generator field, `spec.parts[2].generator`, for messages.
    pub field: String,
    /// The `BootstrapGenerator`'s name.
    pub generator: String,
    /// The part's fixed parameters.
    pub parameters: Map<String, Value>,
}

/// A request: what bootplate POSTs (as JSON) to a generator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`REQUEST_KIND`].
    pub kind: String,
    /// Unique per request, for the generator's logs.
    #[serde(rename = "requestID")]
    pub request_id: String,
    /// The digest of the request's inputs: equal for equal inputs (see the module docs).
    pub idempotency_key: String,
    /// The `BootstrapGenerator`'s name.
    pub generator: String,
    /// The template and part asking.
    pub template: TemplateInfo,
    /// The part's fixed parameters.
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// The render context allowed to this generator.
    pub context: RequestContext,
}

/// The template and part a request is for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateInfo {
    /// How bootplate names the template: `ClusterBootstrapTemplate ubuntu-2404`.
    pub name: String,
    /// The template's revision.
    pub revision: String,
    /// The format the output is written in (informational: responses are parts, not output).
    pub format: OutputFormat,
    /// The part's name.
    pub part: String,
}

/// The render context a generator sees.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RequestContext {
    /// The machine's Cluster.
    pub cluster: ClusterInfo,
    /// The Machine, with its role.
    pub machine: MachineInfo,
    /// How to join (absent for `init`); `token` only with `spec.secrets.joinToken`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<RequestJoin>,
    /// The cluster's certificates and keys: control-plane roles with
    /// `spec.secrets.certificates` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certs: Option<Certificates>,
    /// The template's values (its defaults merged with the config's variables).
    #[serde(default)]
    pub values: Map<String, Value>,
}

/// Join data as a generator sees it.
#[derive(Serialize, Deserialize, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RequestJoin {
    /// The bootstrap token, only with `spec.secrets.joinToken`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// `host:port` of the API server.
    pub api_server_endpoint: String,
    /// `sha256:<hex>` hashes of the cluster CA's public key.
    pub ca_cert_hashes: Vec<String>,
}

impl std::fmt::Debug for RequestJoin {
    // The token is a credential: never in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestJoin")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("api_server_endpoint", &self.api_server_endpoint)
            .field("ca_cert_hashes", &self.ca_cert_hashes)
            .finish()
    }
}

impl RequestContext {
    /// The part of `ctx` a generator granted `secrets` may see, with `values`.
    pub fn allowed(
        ctx: &RenderContext,
        values: Map<String, Value>,
        secrets: GeneratorSecrets,
    ) -> Self {
        RequestContext {
            cluster: ctx.cluster.clone(),
            machine: ctx.machine.clone(),
            join: ctx.join.as_ref().map(|join| RequestJoin {
                token: secrets.join_token.then(|| join.token.clone()),
                api_server_endpoint: join.api_server_endpoint.clone(),
                ca_cert_hashes: join.ca_cert_hashes.clone(),
            }),
            certs: ctx.certs.clone().filter(|_| secrets.certificates),
            values,
        }
    }

    /// The context a served template renders with: `join.token` is absent (not empty) when the
    /// generator was not given it, so a strict render that reads it fails and says so.
    pub(crate) fn as_render_json(&self) -> Value {
        let mut json = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = json.as_object_mut() {
            map.remove("values");
        }
        json
    }

    /// The join data as the render context holds it (for callers that have the token).
    pub fn join_info(&self) -> Option<JoinInfo> {
        let join = self.join.as_ref()?;
        Some(JoinInfo {
            token: join.token.clone()?,
            api_server_endpoint: join.api_server_endpoint.clone(),
            ca_cert_hashes: join.ca_cert_hashes.clone(),
        })
    }
}

impl Request {
    /// A request for `call` with `context`, its idempotency key computed and no request ID
    /// (the caller sets one per attempt).
    pub fn new(call: &Call, template: TemplateInfo, context: RequestContext) -> Self {
        let mut request = Request {
            api_version: API_VERSION.to_owned(),
            kind: REQUEST_KIND.to_owned(),
            request_id: String::new(),
            idempotency_key: String::new(),
            generator: call.generator.clone(),
            template,
            parameters: call.parameters.clone(),
            context,
        };
        request.idempotency_key = request.inputs_digest();
        request
    }

    /// The SHA-256 (hex) of the request without its request ID and idempotency key.
    pub fn inputs_digest(&self) -> String {
        use sha2::Digest;
        let inputs = Request {
            request_id: String::new(),
            idempotency_key: String::new(),
            ..self.clone()
        };
        // Maps are sorted (serde_json's default Map is a BTreeMap), fields in declaration
        // order: equal requests serialize equally.
        let json = serde_json::to_vec(&inputs).expect("a request always serializes");
        hex::encode(sha2::Sha256::digest(json))
    }

    /// The secret strings the request carries (token, private keys), to keep out of messages
    /// that echo the generator.
    pub fn secrets(&self) -> Vec<&str> {
        let mut secrets = Vec::new();
        if let Some(token) = self.context.join.as_ref().and_then(|j| j.token.as_deref()) {
            secrets.push(token);
        }
        if let Some(certs) = &self.context.certs {
            for pair in [
                &certs.ca,
                &certs.etcd,
                &certs.front_proxy,
                &certs.service_account,
            ] {
                secrets.push(pair.key.as_str());
            }
        }
        secrets.retain(|s| !s.is_empty());
        secrets
    }
}

/// Whether the generator succeeded.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Status {
    /// The part is in `files`, `units` and `commands`.
    #[default]
    Success,
    /// The generator refused; `message` says why.
    Failure,
}

/// A response, as a generator writes it (the parts model of templates: `files`, `units`,
/// `commands`; contents are literal, never templates).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Response {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`RESPONSE_KIND`].
    pub kind: String,
    /// `Success` or `Failure`.
    pub status: Status,
    /// Why a `Failure` failed (shown in the config's condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Files to write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<TemplateFile>,
    /// systemd units to install.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Unit>,
    /// Shell commands, run after the part's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
}

impl Response {
    /// A `Success` response with nothing in it yet.
    pub fn success() -> Self {
        Response {
            api_version: API_VERSION.to_owned(),
            kind: RESPONSE_KIND.to_owned(),
            ..Default::default()
        }
    }

    /// A `Failure` response saying `message`.
    pub fn failure(message: impl Into<String>) -> Self {
        Response {
            status: Status::Failure,
            message: Some(message.into()),
            ..Self::success()
        }
    }
}

/// Why a response cannot be used. Messages never quote file contents.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// The body is over the limit.
    #[error("the response is larger than {limit} bytes (spec.maxResponseBytes)")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Not a valid response: the field and the problem.
    #[error("the response is not valid: {0}")]
    Malformed(String),
    /// The generator answered `Failure`.
    #[error("the generator refused: {0}")]
    Refused(String),
}

/// A generator's output, validated: what a render adds to its part. Its Debug output shows
/// sizes only (generated files may hold credentials).
#[derive(Clone, PartialEq, Default)]
pub struct GeneratedPart {
    pub(crate) files: Vec<File>,
    pub(crate) units: Vec<files::Unit>,
    pub(crate) commands: Vec<String>,
}

impl std::fmt::Debug for GeneratedPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedPart")
            .field("files", &self.files.len())
            .field("units", &self.units.len())
            .field("commands", &self.commands.len())
            .field("bytes", &self.size())
            .finish()
    }
}

impl GeneratedPart {
    /// What a comparison of two renders puts where `generator`'s output goes, having not
    /// called it: one command naming the digest of the request's inputs, so the part differs
    /// between the two renders exactly when what the generator would be asked differs.
    pub(crate) fn stand_in(generator: &str, inputs_digest: &str) -> GeneratedPart {
        GeneratedPart {
            commands: vec![format!(
                ": content of BootstrapGenerator {generator} for inputs sha256:{inputs_digest}"
            )],
            ..Default::default()
        }
    }

    /// The bytes of content it adds (for the output size budget, and the controller's bound on
    /// the answers it keeps).
    pub fn size(&self) -> usize {
        let files: usize = self
            .files
            .iter()
            .map(|f| f.path.len() + f.content.len())
            .sum();
        let units: usize = self
            .units
            .iter()
            .map(|u| {
                u.content.as_ref().map_or(0, String::len)
                    + u.drop_ins
                        .iter()
                        .map(|(n, c)| n.len() + c.len())
                        .sum::<usize>()
            })
            .sum();
        files + units + self.commands.iter().map(String::len).sum::<usize>()
    }
}

/// Reads a response body of at most `limit` bytes strictly: the version and kind, no unknown
/// field anywhere, a `Failure` as [`ResponseError::Refused`], and every file path, mode, owner,
/// encoding, unit and drop-in name and command checked.
pub fn parse_response(body: &[u8], limit: u64) -> Result<GeneratedPart, ResponseError> {
    if body.len() as u64 > limit {
        return Err(ResponseError::TooLarge { limit });
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let response: Response = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = crate::error::truncate(&e.inner().to_string(), 300);
        ResponseError::Malformed(if path == "." {
            inner
        } else {
            format!("{path}: {inner}")
        })
    })?;
    deserializer
        .end()
        .map_err(|e| ResponseError::Malformed(format!("trailing data after the JSON: {e}")))?;
    if response.api_version != API_VERSION || response.kind != RESPONSE_KIND {
        return Err(ResponseError::Malformed(format!(
            "apiVersion/kind: expected {API_VERSION} {RESPONSE_KIND}, got {:?} {:?}",
            crate::error::truncate(&response.api_version, 64),
            crate::error::truncate(&response.kind, 64)
        )));
    }
    if response.status == Status::Failure {
        let message = response.message.unwrap_or_default();
        return Err(ResponseError::Refused(if message.trim().is_empty() {
            "(no message)".to_owned()
        } else {
            crate::error::truncate(message.trim(), 300)
        }));
    }
    validate(response)
}

fn validate(response: Response) -> Result<GeneratedPart, ResponseError> {
    let bad =
        |field: String, message: &str| ResponseError::Malformed(format!("{field}: {message}"));
    let mut part = GeneratedPart::default();
    for (i, f) in response.files.into_iter().enumerate() {
        let field = format!("files[{i}]");
        files::check_path(&f.path, false).map_err(|m| bad(format!("{field}.path"), m))?;
        let encoding = f.encoding.unwrap_or_default();
        files::check_content(&f.content, encoding)
            .map_err(|m| bad(format!("{field}.content"), m))?;
        let mut problems: Vec<Problem> = Vec::new();
        let permissions = files::permissions(
            f.permissions.as_deref(),
            Origin::Template,
            &field,
            &mut problems,
        );
        let owner = files::owner(f.owner.as_deref(), Origin::Template, &field, &mut problems);
        if let Some(p) = problems.first() {
            return Err(bad(p.field.clone(), &p.message));
        }
        part.files.push(File {
            path: f.path,
            permissions,
            owner,
            content: f.content,
            encoding,
        });
    }
    for (i, u) in response.units.into_iter().enumerate() {
        let field = format!("units[{i}]");
        if !files::valid_unit_name(&u.name) {
            return Err(bad(
                format!("{field}.name"),
                &format!(
                    "{:?} is not a unit name (letters, digits and `:_.@-`, ending in .service, .socket, .timer, .path, .mount or .target)",
                    crate::error::truncate(&u.name, 64)
                ),
            ));
        }
        for (j, d) in u.drop_ins.iter().enumerate() {
            if !files::valid_drop_in_name(&d.name) {
                return Err(bad(
                    format!("{field}.dropIns[{j}].name"),
                    "a drop-in name is letters, digits and `_.@-`, ending in .conf",
                ));
            }
        }
        part.units.push(files::Unit {
            enable: u.enabled(),
            name: u.name,
            content: u.content,
            drop_ins: u
                .drop_ins
                .into_iter()
                .map(|d| (d.name, d.content))
                .collect(),
        });
    }
    for (i, command) in response.commands.iter().enumerate() {
        if command.contains('\0') {
            return Err(bad(
                format!("commands[{i}]"),
                "a command must not contain NUL",
            ));
        }
    }
    part.commands = response.commands;
    Ok(part)
}

/// A rendered part's files, units and commands as the response a generator serving it sends.
pub(crate) fn response_of(
    files: Vec<File>,
    units: Vec<files::Unit>,
    commands: Vec<String>,
) -> Response {
    let encoding = |e: FileEncoding| (e != FileEncoding::Plain).then_some(e);
    Response {
        files: files
            .into_iter()
            .map(|f| TemplateFile {
                path: f.path,
                permissions: Some(f.permissions),
                owner: Some(f.owner),
                content: f.content,
                encoding: encoding(f.encoding),
            })
            .collect(),
        units: units
            .into_iter()
            .map(|u| Unit {
                name: u.name,
                enable: Some(u.enable),
                content: u.content,
                drop_ins: u
                    .drop_ins
                    .into_iter()
                    .map(|(name, content)| crd_types::DropIn { name, content })
                    .collect(),
            })
            .collect(),
        commands,
        ..Response::success()
    }
}

/// `message` with every secret of `secrets` replaced, control characters removed and cut to
/// 300 characters: for text a generator wrote that ends up in a condition or an Event.
pub fn redact(message: &str, secrets: &[&str]) -> String {
    let mut out = message.to_owned();
    for secret in secrets.iter().filter(|s| s.len() >= 6) {
        out = out.replace(secret, "<redacted>");
    }
    if out.contains("PRIVATE KEY") {
        return "(the message held a private key and is not shown)".to_owned();
    }
    let out: String = out
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::error::truncate(out.trim(), 300)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(response: Value) -> Result<GeneratedPart, ResponseError> {
        parse_response(&serde_json::to_vec(&response).unwrap(), 1 << 20)
    }

    fn ok(extra: Value) -> Value {
        let mut response =
            json!({"apiVersion": API_VERSION, "kind": RESPONSE_KIND, "status": "Success"});
        for (k, v) in extra.as_object().unwrap() {
            response[k] = v.clone();
        }
        response
    }

    #[test]
    fn a_valid_response_becomes_a_part_with_defaults() {
        let part = parse(ok(json!({
            "files": [{"path": "/etc/netplan/60-static.yaml", "content": "network: {}\n", "permissions": "600"}],
            "units": [{"name": "cmdb-report.service", "content": "[Service]\nExecStart=/bin/true\n",
                        "dropIns": [{"name": "10-env.conf", "content": "[Service]\n"}]}],
            "commands": ["netplan apply"],
        })))
        .unwrap();
        assert_eq!(part.files[0].permissions, "0600");
        assert_eq!(part.files[0].owner, "root:root");
        assert!(part.units[0].enable, "units are enabled by default");
        assert_eq!(part.units[0].drop_ins[0].0, "10-env.conf");
        assert_eq!(part.commands, ["netplan apply"]);
        assert!(
            !format!("{part:?}").contains("network"),
            "Debug shows no content"
        );
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let e = parse(ok(
            json!({"files": [{"path": "/a", "content": "", "contnet": "x"}]}),
        ))
        .unwrap_err();
        assert!(
            matches!(&e, ResponseError::Malformed(m) if m.starts_with("files[0].contnet: unknown field `contnet`")),
            "{e}"
        );
        let e = parse(ok(json!({"extra": 1}))).unwrap_err();
        assert!(e.to_string().contains("unknown field `extra`"), "{e}");
    }

    #[test]
    fn paths_unit_names_modes_and_encodings_are_checked() {
        let cases = [
            (
                json!({"units": [{"name": "../../etc/passwd"}]}),
                "units[0].name: \"../../etc/passwd\" is not a unit name",
            ),
            (
                json!({"files": [{"path": "../../etc/passwd", "content": ""}]}),
                "files[0].path: the path must be absolute",
            ),
            (
                json!({"files": [{"path": "/etc/../passwd", "content": ""}]}),
                "files[0].path: the path must be normalised",
            ),
            (
                json!({"files": [{"path": "/a", "content": "", "permissions": "999"}]}),
                "files[0].permissions",
            ),
            (
                json!({"files": [{"path": "/a", "content": "", "owner": "root;rm"}]}),
                "files[0].owner",
            ),
            (
                json!({"files": [{"path": "/a", "content": "!!", "encoding": "base64"}]}),
                "files[0].content: the content is not valid base64",
            ),
            (
                json!({"units": [{"name": "a.service", "dropIns": [{"name": "../x.conf", "content": ""}]}]}),
                "units[0].dropIns[0].name",
            ),
            (
                json!({"commands": ["echo \u{0}"]}),
                "commands[0]: a command must not contain NUL",
            ),
        ];
        for (extra, expected) in cases {
            let e = parse(ok(extra.clone())).unwrap_err().to_string();
            assert!(e.contains(expected), "{extra}: {e}");
        }
    }

    #[test]
    fn version_kind_size_failure_and_syntax() {
        let e = parse(json!({"apiVersion": "v1", "kind": RESPONSE_KIND, "status": "Success"}))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("expected generator.bootplate.dev/v1alpha1"),
            "{e}"
        );
        let big = serde_json::to_vec(&ok(json!({"commands": ["x".repeat(2000)]}))).unwrap();
        assert_eq!(
            parse_response(&big, 1024),
            Err(ResponseError::TooLarge { limit: 1024 })
        );
        let e = parse(json!({"apiVersion": API_VERSION, "kind": RESPONSE_KIND, "status": "Failure", "message": "no free IP in 10.0.0.0/24"})).unwrap_err();
        assert_eq!(
            e,
            ResponseError::Refused("no free IP in 10.0.0.0/24".into())
        );
        assert!(matches!(
            parse_response(b"<html>", 1024),
            Err(ResponseError::Malformed(_))
        ));
        assert!(matches!(
            parse_response(b"{} {}", 1024),
            Err(ResponseError::Malformed(_))
        ));
    }

    #[test]
    fn generators_see_secrets_only_when_granted() {
        use crd_types::capi::{Cluster, Machine};
        let join = JoinInfo {
            token: "abcdef.0123456789abcdef".into(),
            api_server_endpoint: "10.0.0.1:6443".into(),
            ca_cert_hashes: vec!["sha256:00".into()],
        };
        let certs = crate::sample_certificates();
        let ctx = RenderContext::new(
            &Cluster::new("c1", Default::default()),
            &Machine::new("cp-1", Default::default()),
            crd_types::Role::ControlPlaneJoin,
            Some(join),
            Some(certs),
        );
        let none = RequestContext::allowed(&ctx, Map::new(), GeneratorSecrets::default());
        let json = serde_json::to_string(&none).unwrap();
        assert!(
            !json.contains("abcdef.0123") && !json.contains("PRIVATE KEY"),
            "{json}"
        );
        assert_eq!(
            none.join.as_ref().unwrap().api_server_endpoint,
            "10.0.0.1:6443"
        );
        let all = GeneratorSecrets {
            join_token: true,
            certificates: true,
        };
        let granted = RequestContext::allowed(&ctx, Map::new(), all);
        let json = serde_json::to_string(&granted).unwrap();
        assert!(json.contains("abcdef.0123456789abcdef") && json.contains("PRIVATE KEY"));
        assert!(
            !format!("{:?}", granted.join).contains("abcdef.0123"),
            "Debug redacts"
        );
    }

    #[test]
    fn the_idempotency_key_follows_the_inputs_not_the_request_id() {
        use crd_types::capi::{Cluster, Machine};
        let ctx = RenderContext::new(
            &Cluster::new("c1", Default::default()),
            &Machine::new("w-0", Default::default()),
            crd_types::Role::Worker,
            None,
            None,
        );
        let call = Call {
            part: "network".into(),
            field: "spec.parts[1].generator".into(),
            generator: "cmdb".into(),
            parameters: Map::new(),
        };
        let info = TemplateInfo {
            name: "ClusterBootstrapTemplate t".into(),
            revision: "r1".into(),
            format: OutputFormat::CloudConfig,
            part: "network".into(),
        };
        let request = |values: Value| {
            let context = RequestContext::allowed(
                &ctx,
                values.as_object().unwrap().clone(),
                GeneratorSecrets::default(),
            );
            Request::new(&call, info.clone(), context)
        };
        let a = request(json!({"site": "fra"}));
        let mut b = request(json!({"site": "fra"}));
        b.request_id = "other".into();
        assert_eq!(a.idempotency_key, b.inputs_digest());
        assert_ne!(
            a.idempotency_key,
            request(json!({"site": "ber"})).idempotency_key
        );
        assert_eq!(a.idempotency_key.len(), 64);
    }

    #[test]
    fn echoed_secrets_are_redacted() {
        let token = "abcdef.0123456789abcdef";
        assert_eq!(
            redact(&format!("bad token {token}\n"), &[token]),
            "bad token <redacted>"
        );
        assert!(!redact("-----BEGIN PRIVATE KEY-----", &[]).contains("BEGIN"));
        assert_eq!(redact(&"x".repeat(400), &[]).chars().count(), 301);
    }
}
