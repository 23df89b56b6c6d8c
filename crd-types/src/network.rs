//! `network`: what a machine on a restricted network needs — registry mirrors, a proxy, extra
//! trusted CAs, NTP servers, kubeadm's image repository and where to download binaries from —
//! as one typed input. A template sets defaults (`spec.network`); a config (`spec.network`)
//! replaces each of them that it sets. See docs/air-gapped.md.
//!
//! The schema bounds every list and string, so the apiserver refuses an oversized input before
//! the controller reads it; the render engine checks the content (URLs, CIDRs, PEM, digests).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::secret_ref::SecretKeyRef;

/// Most registries with mirrors.
pub const MAX_REGISTRIES: usize = 16;
/// Most endpoints of one registry.
pub const MAX_ENDPOINTS: usize = 8;
/// Most CA bundles.
pub const MAX_CA_BUNDLES: usize = 8;
/// Most NTP servers.
pub const MAX_NTP_SERVERS: usize = 8;
/// Most `noProxy` additions.
pub const MAX_NO_PROXY: usize = 64;
/// Most artifact sources.
pub const MAX_ARTIFACTS: usize = 16;
/// Longest URL, host or name.
pub const MAX_NAME_BYTES: usize = 512;
/// Largest PEM of one CA bundle or client certificate or key, inline or from a Secret.
pub const MAX_PEM_BYTES: usize = 64 * 1024;

/// The network input: every field is optional; a config's field replaces the template's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkConfig {
    /// Mirrors per upstream registry, written as containerd `hosts.toml` files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub registry_mirrors: Vec<RegistryMirror>,
    /// The HTTP(S) proxy of containerd, the kubelet and the download steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfig>,
    /// Extra CA certificates the machine trusts (added to the OS trust store).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub ca_bundles: Vec<CaBundle>,
    /// NTP servers (host names or addresses) for chrony or systemd-timesyncd.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 1, max = 512)))]
    pub ntp_servers: Vec<String>,
    /// The registry (and path) kubeadm pulls the control-plane images from, for example
    /// `mirror.example.com/k8s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image_repository: Option<String>,
    /// Where to download the binaries of images without packages, each with its SHA-256 digest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub artifacts: Vec<ArtifactSource>,
}

/// The mirrors of one upstream registry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryMirror {
    /// The upstream registry as images name it, `host` or `host:port` (for example
    /// `registry.k8s.io`), or `_default` for every registry without its own entry.
    #[schemars(length(min = 1, max = 253))]
    pub registry: String,
    /// The mirrors, tried in this order before the upstream registry.
    #[schemars(length(min = 1, max = 8))]
    pub endpoints: Vec<MirrorEndpoint>,
}

/// One mirror of a registry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MirrorEndpoint {
    /// `https://host[:port][/path]` (or `http://` for a plain-HTTP mirror).
    #[schemars(length(min = 1, max = 512))]
    pub url: String,
    /// The URL's path replaces the registry API's `/v2` root (a mirror under a path prefix).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub override_path: bool,
    /// What the mirror may be used for; default `[pull, resolve]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub capabilities: Vec<MirrorCapability>,
    /// The CA that signs the mirror's serving certificate, when the OS trust store lacks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PemSource>,
    /// A client certificate for mirrors that ask for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<ClientCertificate>,
}

/// What containerd may use a mirror for.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MirrorCapability {
    /// Fetch content by digest.
    Pull,
    /// Resolve a tag to a digest.
    Resolve,
    /// Push.
    Push,
}

impl MirrorCapability {
    /// The name containerd's `hosts.toml` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            MirrorCapability::Pull => "pull",
            MirrorCapability::Resolve => "resolve",
            MirrorCapability::Push => "push",
        }
    }
}

/// A client certificate and its key. The key must come from a Secret (the webhook refuses an
/// inline key).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientCertificate {
    /// The certificate (PEM).
    pub certificate: PemSource,
    /// The private key (PEM), from a Secret.
    pub key: PemSource,
}

/// PEM text, inline or from a key of a Secret in the config's own namespace. Exactly one is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PemSource {
    /// The PEM text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub inline: Option<String>,
    /// A key of a Secret in the config's own namespace (a template's defaults may not name
    /// Secrets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretKeyRef>,
}

/// An extra trusted CA bundle.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaBundle {
    /// The bundle's name: its file name in the trust store (`<name>.crt`). Lower-case letters,
    /// digits and `-`.
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// The certificates (PEM) inline. Exactly one of `inline` and `secret` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub inline: Option<String>,
    /// A key of a Secret in the config's own namespace holding the certificates (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretKeyRef>,
}

/// One PEM input of a [`NetworkConfig`], wherever it sits, so that resolving Secrets, checking
/// their namespace and redacting their content treat every one alike.
#[derive(Debug)]
pub struct PemField<'a> {
    /// The field's path below the network input, for example `caBundles[0]`.
    pub field: String,
    /// The inline PEM (after resolution: the Secret's content).
    pub inline: &'a mut Option<String>,
    /// The Secret key it comes from, until resolved.
    pub secret: &'a mut Option<SecretKeyRef>,
    /// A private key: must come from a Secret, and is never shown.
    pub private_key: bool,
}

impl NetworkConfig {
    /// Every PEM input: CA bundles, then each mirror endpoint's CA, client certificate and key.
    pub fn pem_fields_mut(&mut self) -> Vec<PemField<'_>> {
        let mut out = Vec::new();
        for (i, bundle) in self.ca_bundles.iter_mut().enumerate() {
            out.push(PemField {
                field: format!("caBundles[{i}]"),
                inline: &mut bundle.inline,
                secret: &mut bundle.secret,
                private_key: false,
            });
        }
        for (i, mirror) in self.registry_mirrors.iter_mut().enumerate() {
            for (j, endpoint) in mirror.endpoints.iter_mut().enumerate() {
                let at = format!("registryMirrors[{i}].endpoints[{j}]");
                if let Some(ca) = endpoint.ca.as_mut() {
                    out.push(PemField::of(format!("{at}.ca"), ca, false));
                }
                if let Some(client) = endpoint.client_certificate.as_mut() {
                    let cert = format!("{at}.clientCertificate.certificate");
                    out.push(PemField::of(cert, &mut client.certificate, false));
                    let key = format!("{at}.clientCertificate.key");
                    out.push(PemField::of(key, &mut client.key, true));
                }
            }
        }
        out
    }
}

impl NetworkConfig {
    /// Whether any PEM input names a Secret.
    pub fn names_secrets(&self) -> bool {
        self.clone()
            .pem_fields_mut()
            .iter()
            .any(|f| f.secret.is_some())
    }
}

impl<'a> PemField<'a> {
    fn of(field: String, source: &'a mut PemSource, private_key: bool) -> Self {
        PemField {
            field,
            inline: &mut source.inline,
            secret: &mut source.secret,
            private_key,
        }
    }
}

/// The proxy. `noProxy` is computed: the Cluster's pod and service CIDRs, its service domain,
/// the control-plane endpoint's host, the machine's name, `localhost` and the loopback
/// addresses, then these additions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyConfig {
    /// Proxy for `http://` destinations, `http://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub http: Option<String>,
    /// Proxy for `https://` destinations, `http://host:port` or `https://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub https: Option<String>,
    /// Further destinations that bypass the proxy: host names, domains (`.example.com`),
    /// addresses or CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 512)))]
    pub no_proxy: Vec<String>,
}

/// A binary that images without packages download.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Artifact {
    /// The `kubeadm` binary.
    Kubeadm,
    /// The `kubelet` binary.
    Kubelet,
    /// The `kubectl` binary.
    Kubectl,
    /// The containerd release archive.
    Containerd,
    /// The `runc` binary.
    Runc,
    /// The CNI plugins archive.
    CniPlugins,
}

/// Every artifact, in the order templates install them.
pub const ARTIFACTS: [Artifact; 6] = [
    Artifact::Containerd,
    Artifact::Runc,
    Artifact::CniPlugins,
    Artifact::Kubeadm,
    Artifact::Kubelet,
    Artifact::Kubectl,
];

impl Artifact {
    /// The name used in the API and in templates.
    pub fn as_str(self) -> &'static str {
        match self {
            Artifact::Kubeadm => "kubeadm",
            Artifact::Kubelet => "kubelet",
            Artifact::Kubectl => "kubectl",
            Artifact::Containerd => "containerd",
            Artifact::Runc => "runc",
            Artifact::CniPlugins => "cni-plugins",
        }
    }
}

/// Where one artifact is downloaded from, and the digest it must have.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactSource {
    /// Which artifact.
    pub name: Artifact,
    /// `https://...` (or `http://...`: the digest is checked either way).
    #[schemars(length(min = 1, max = 512))]
    pub url: String,
    /// The SHA-256 digest of the download: 64 lower-case hex digits. A download with another
    /// digest is refused before it is installed.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
}
