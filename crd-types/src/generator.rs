//! `BootstrapGenerator`: an HTTPS service that returns a template part (files, units, commands)
//! for a machine. `docs/generators.md` describes the protocol and the security model.

use std::time::Duration;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.timeoutSeconds` when unset.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 10;
/// `spec.maxResponseBytes` when unset.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 256 * 1024;
/// `spec.maxConcurrency` when unset.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 4;

/// A service that generates the content of template parts. Cluster-scoped: a cluster admin
/// decides which services bootplate calls and what they may receive; templates name it in
/// `spec.parts[].generator.name`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bootstrap.bootplate.dev",
    version = "v1alpha1",
    kind = "BootstrapGenerator",
    doc = "An HTTPS service that generates the files, units and commands of template parts, called by bootplate with the machine's render context.",
    plural = "bootstrapgenerators",
    shortname = "bg",
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".spec.clientConfig.url"}"#,
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.clientConfig.service.name"}"#,
    printcolumn = r#"{"name":"Timeout","type":"integer","jsonPath":".spec.timeoutSeconds"}"#,
    printcolumn = r#"{"name":"Join-Token","type":"boolean","jsonPath":".spec.secrets.joinToken"}"#,
    printcolumn = r#"{"name":"Certificates","type":"boolean","jsonPath":".spec.secrets.certificates"}"#,
    printcolumn = r#"{"name":"Namespaces","type":"string","jsonPath":".spec.allowedNamespaces"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::schema::kubernetes_formats)]
pub struct GeneratorSpec {
    /// Where bootplate sends its requests (HTTPS only) and the CA that signs the service's
    /// certificate.
    pub client_config: ClientConfig,
    /// How long one request may take, connection and whole response included, in seconds.
    /// Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: Option<u32>,
    /// The largest response body bootplate reads, in bytes; a longer one fails the request.
    /// Default 262144 (256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 1048576))]
    pub max_response_bytes: Option<u64>,
    /// How many requests bootplate sends to this generator at once; configs over the limit
    /// wait (reason `WaitingForGenerator`). Default 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_concurrency: Option<u32>,
    /// Secret material the generator may receive. Default: none; it sees the Machine, the
    /// Cluster, the role, the template revision and the values, never a token or a key.
    #[serde(default, skip_serializing_if = "GeneratorSecrets::is_none")]
    pub secrets: GeneratorSecrets,
    /// The namespaces whose configs may use this generator: namespace names, or `*` for every
    /// namespace. Default: none. A config elsewhere whose template names the generator gets
    /// `Ready=False` with reason `GeneratorNotAllowed`, and the generator is not called: an
    /// app team cannot have a generator hand its machines what it hands another team's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 63)))]
    pub allowed_namespaces: Vec<String>,
}

impl GeneratorSpec {
    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(
            self.timeout_seconds
                .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
                .clamp(1, 30)
                .into(),
        )
    }

    /// The largest response body read.
    pub fn max_response_bytes(&self) -> u64 {
        self.max_response_bytes
            .unwrap_or(DEFAULT_MAX_RESPONSE_BYTES)
            .clamp(1024, 1024 * 1024)
    }

    /// Whether configs of namespace `namespace` may use this generator
    /// (`spec.allowedNamespaces`).
    pub fn allows(&self, namespace: &str) -> bool {
        self.allowed_namespaces
            .iter()
            .any(|allowed| allowed == "*" || allowed == namespace)
    }

    /// How many requests may be in flight at once.
    pub fn max_concurrency(&self) -> usize {
        self.max_concurrency
            .unwrap_or(DEFAULT_MAX_CONCURRENCY)
            .clamp(1, 64) as usize
    }
}

/// Where a generator is reached: exactly one of `url` and `service`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfig {
    /// The generator's URL, `https://host[:port]/path`. Requests are POSTed to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https://"))]
    pub url: Option<String>,
    /// A Service in the management cluster (reached as `https://<name>.<namespace>.svc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceReference>,
    /// PEM certificates of the CA that signs the generator's serving certificate (PEM text,
    /// not base64-encoded). Default: the system's trusted roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
}

impl ClientConfig {
    /// The URL requests go to, or why there is none.
    pub fn endpoint(&self) -> Result<String, String> {
        match (&self.url, &self.service) {
            (Some(url), None) => {
                if !url.starts_with("https://") || url.len() <= "https://".len() {
                    return Err(format!(
                        "spec.clientConfig.url: {url:?} is not an https:// URL (generators are called over HTTPS only)"
                    ));
                }
                Ok(url.clone())
            }
            (None, Some(service)) => Ok(format!(
                "https://{}.{}.svc:{}{}",
                service.name,
                service.namespace,
                service.port.unwrap_or(443),
                service.path.as_deref().unwrap_or("/")
            )),
            (Some(_), Some(_)) => {
                Err("spec.clientConfig: set either url or service, not both".to_owned())
            }
            (None, None) => Err("spec.clientConfig: set url or service".to_owned()),
        }
    }
}

/// A Service that serves a generator over HTTPS.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceReference {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The Service port. Default 443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// The URL path requests are POSTed to. Default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/"))]
    pub path: Option<String>,
}

/// Secret material a generator may receive. A worker's render context holds no private key,
/// so `certificates` only ever gives control-plane machines' keys.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GeneratorSecrets {
    /// Send the bootstrap token (`context.join.token`). Such a generator is called after the
    /// token exists; all others are called before any token is created.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub join_token: bool,
    /// Send the cluster's certificates and private keys (`context.certs`, control-plane roles
    /// only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub certificates: bool,
}

impl GeneratorSecrets {
    /// Whether no secret material is allowed.
    pub fn is_none(&self) -> bool {
        !self.join_token && !self.certificates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_is_one_https_url_or_a_service() {
        let url = |u: &str| ClientConfig {
            url: Some(u.into()),
            ..Default::default()
        };
        assert_eq!(
            url("https://cmdb.example/gen").endpoint().unwrap(),
            "https://cmdb.example/gen"
        );
        assert!(
            url("http://cmdb.example/")
                .endpoint()
                .unwrap_err()
                .contains("HTTPS only")
        );
        let service = ClientConfig {
            service: Some(ServiceReference {
                namespace: "infra".into(),
                name: "cmdb".into(),
                port: None,
                path: Some("/v1/generate".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            service.endpoint().unwrap(),
            "https://cmdb.infra.svc:443/v1/generate"
        );
        let both = ClientConfig {
            url: Some("https://a/".into()),
            ..service
        };
        assert!(both.endpoint().unwrap_err().contains("not both"));
        assert!(ClientConfig::default().endpoint().is_err());
    }

    #[test]
    fn only_the_allowed_namespaces_may_use_a_generator() {
        let spec = |allowed: &[&str]| GeneratorSpec {
            allowed_namespaces: allowed.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        // (allowed namespaces, namespace asking, allowed)
        let cases: [(&[&str], &str, bool); 6] = [
            (&[], "team-a", false),
            (&["team-a"], "team-a", true),
            (&["team-a"], "team-b", false),
            (&["team-a", "team-b"], "team-b", true),
            (&["*"], "anyone", true),
            (&["team-*"], "team-a", false),
        ];
        for (allowed, namespace, expected) in cases {
            assert_eq!(
                spec(allowed).allows(namespace),
                expected,
                "{allowed:?} / {namespace}"
            );
        }
    }

    #[test]
    fn limits_have_defaults_and_bounds() {
        let spec = GeneratorSpec::default();
        assert_eq!(spec.timeout(), Duration::from_secs(10));
        assert_eq!(spec.max_response_bytes(), 262144);
        assert_eq!(spec.max_concurrency(), 4);
        let spec = GeneratorSpec {
            timeout_seconds: Some(0),
            max_response_bytes: Some(u64::MAX),
            max_concurrency: Some(1000),
            ..Default::default()
        };
        assert_eq!(spec.timeout(), Duration::from_secs(1));
        assert_eq!(spec.max_response_bytes(), 1048576);
        assert_eq!(spec.max_concurrency(), 64);
    }
}
