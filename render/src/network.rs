//! The network input (`crd_types::network`) of a render: the template's defaults merged with
//! the config's input, checked (URLs, CIDRs, PEM, digests, sizes), and laid out for templates
//! as `network` — containerd `hosts.toml` text per registry, proxy environment lines with the
//! computed `noProxy`, CA bundles, NTP servers, kubeadm's image repository and artifact sources.
//!
//! Every check runs on bounded input: list lengths and string sizes are compared with the
//! limits of `crd_types::network` before anything is parsed or copied.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crd_types::network::{
    ArtifactSource, MAX_ARTIFACTS, MAX_CA_BUNDLES, MAX_ENDPOINTS, MAX_NAME_BYTES, MAX_NO_PROXY,
    MAX_NTP_SERVERS, MAX_PEM_BYTES, MAX_REGISTRIES, MirrorEndpoint, NetworkConfig, ProxyConfig,
    RegistryMirror,
};
use serde_json::{Value, json};

use crate::context::{ClusterInfo, MachineInfo};

/// Where containerd reads registry host configuration (`config_path`).
pub const CERTS_DIR: &str = "/etc/containerd/certs.d";

/// The network input a render uses: each field the config sets replaces the template's.
pub fn merge(defaults: Option<&NetworkConfig>, config: Option<&NetworkConfig>) -> NetworkConfig {
    let base = defaults.cloned().unwrap_or_default();
    let Some(over) = config else {
        return base;
    };
    let pick = |ours: &Vec<_>, theirs: Vec<_>| {
        if ours.is_empty() {
            theirs
        } else {
            ours.clone()
        }
    };
    NetworkConfig {
        registry_mirrors: pick(&over.registry_mirrors, base.registry_mirrors),
        proxy: over.proxy.clone().or(base.proxy),
        ca_bundles: pick_bundles(&over.ca_bundles, base.ca_bundles),
        ntp_servers: if over.ntp_servers.is_empty() {
            base.ntp_servers
        } else {
            over.ntp_servers.clone()
        },
        image_repository: over.image_repository.clone().or(base.image_repository),
        artifacts: if over.artifacts.is_empty() {
            base.artifacts
        } else {
            over.artifacts.clone()
        },
    }
}

fn pick_bundles(
    ours: &[crd_types::network::CaBundle],
    theirs: Vec<crd_types::network::CaBundle>,
) -> Vec<crd_types::network::CaBundle> {
    if ours.is_empty() {
        theirs
    } else {
        ours.to_vec()
    }
}

/// The fields `network` sets, named as in `spec.network`, in the order of the type.
pub fn set_fields(network: &NetworkConfig) -> Vec<&'static str> {
    [
        ("registryMirrors", !network.registry_mirrors.is_empty()),
        ("proxy", network.proxy.is_some()),
        ("caBundles", !network.ca_bundles.is_empty()),
        ("ntpServers", !network.ntp_servers.is_empty()),
        ("imageRepository", network.image_repository.is_some()),
        ("artifacts", !network.artifacts.is_empty()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect()
}

/// Where a network input comes from: what it may hold differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A template's defaults: no Secret references (a template is shared; its CAs are inline).
    Template,
    /// A config as written: private keys come from Secrets, not inline.
    Config,
    /// The merged input of a render, its Secrets already read: every PEM is inline.
    Resolved,
}

/// The problems of a network input, each `(field below the input, message)`.
pub fn check(network: &NetworkConfig, source: Source) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    if let Some(problem) = check_sizes(network) {
        // Nothing more is looked at in an oversized input.
        return vec![problem];
    }
    check_mirrors(&network.registry_mirrors, &mut problems);
    if let Some(proxy) = &network.proxy {
        check_proxy(proxy, &mut problems);
    }
    check_pems(network, source, &mut problems);
    for (i, server) in network.ntp_servers.iter().enumerate() {
        if !is_host(server) {
            problems.push((
                format!("ntpServers[{i}]"),
                format!("{server:?} is not a host name or address"),
            ));
        }
    }
    if let Some(repository) = &network.image_repository
        && !is_image_repository(repository)
    {
        problems.push((
            "imageRepository".into(),
            format!(
                "{repository:?} is not a registry path like mirror.example.com/k8s (no scheme)"
            ),
        ));
    }
    check_artifacts(&network.artifacts, &mut problems);
    problems
}

/// The first list or string over its limit.
fn check_sizes(n: &NetworkConfig) -> Option<(String, String)> {
    let lists = [
        ("registryMirrors", n.registry_mirrors.len(), MAX_REGISTRIES),
        ("caBundles", n.ca_bundles.len(), MAX_CA_BUNDLES),
        ("ntpServers", n.ntp_servers.len(), MAX_NTP_SERVERS),
        ("artifacts", n.artifacts.len(), MAX_ARTIFACTS),
        (
            "proxy.noProxy",
            n.proxy.as_ref().map_or(0, |p| p.no_proxy.len()),
            MAX_NO_PROXY,
        ),
    ];
    let endpoints = n.registry_mirrors.iter().enumerate().map(|(i, m)| {
        (
            format!("registryMirrors[{i}].endpoints"),
            m.endpoints.len(),
            MAX_ENDPOINTS,
        )
    });
    let over_list = lists
        .into_iter()
        .map(|(f, len, max)| (f.to_owned(), len, max))
        .chain(endpoints)
        .find(|(_, len, max)| len > max);
    if let Some((field, len, max)) = over_list {
        return Some((field, format!("{len} entries; at most {max} are allowed")));
    }
    let mut pems = n.clone();
    let too_big = pems
        .pem_fields_mut()
        .into_iter()
        .find(|f| f.inline.as_ref().is_some_and(|p| p.len() > MAX_PEM_BYTES))
        .map(|f| f.field);
    if let Some(field) = too_big {
        return Some((
            field,
            format!("larger than {MAX_PEM_BYTES} bytes; a PEM bundle is never that large"),
        ));
    }
    long_string(n).map(|field| (field, format!("longer than {MAX_NAME_BYTES} bytes")))
}

/// The first name, URL or host longer than [`MAX_NAME_BYTES`].
fn long_string(n: &NetworkConfig) -> Option<String> {
    let mut strings: Vec<(String, &str)> = Vec::new();
    for (i, m) in n.registry_mirrors.iter().enumerate() {
        strings.push((format!("registryMirrors[{i}].registry"), &m.registry));
        for (j, e) in m.endpoints.iter().enumerate() {
            strings.push((format!("registryMirrors[{i}].endpoints[{j}].url"), &e.url));
        }
    }
    if let Some(p) = &n.proxy {
        strings.extend(p.http.as_deref().map(|s| ("proxy.http".to_owned(), s)));
        strings.extend(p.https.as_deref().map(|s| ("proxy.https".to_owned(), s)));
        for (i, s) in p.no_proxy.iter().enumerate() {
            strings.push((format!("proxy.noProxy[{i}]"), s));
        }
    }
    for (i, s) in n.ntp_servers.iter().enumerate() {
        strings.push((format!("ntpServers[{i}]"), s));
    }
    strings.extend(
        n.image_repository
            .as_deref()
            .map(|s| ("imageRepository".to_owned(), s)),
    );
    for (i, a) in n.artifacts.iter().enumerate() {
        strings.push((format!("artifacts[{i}].url"), &a.url));
    }
    strings
        .into_iter()
        .find(|(_, s)| s.len() > MAX_NAME_BYTES)
        .map(|(field, _)| field)
}

fn check_mirrors(mirrors: &[RegistryMirror], problems: &mut Vec<(String, String)>) {
    let mut seen = BTreeSet::new();
    for (i, mirror) in mirrors.iter().enumerate() {
        let field = format!("registryMirrors[{i}]");
        if !is_registry(&mirror.registry) {
            problems.push((
                format!("{field}.registry"),
                format!(
                    "{:?} is not a registry host (host or host:port, or _default)",
                    mirror.registry
                ),
            ));
        } else if !seen.insert(mirror.registry.as_str()) {
            problems.push((
                format!("{field}.registry"),
                format!("{:?} is listed twice", mirror.registry),
            ));
        }
        if mirror.endpoints.is_empty() {
            problems.push((
                format!("{field}.endpoints"),
                "at least one mirror is needed".into(),
            ));
        }
        for (j, endpoint) in mirror.endpoints.iter().enumerate() {
            let at = format!("{field}.endpoints[{j}]");
            if let Err(message) = check_url(&endpoint.url, false) {
                problems.push((format!("{at}.url"), message));
            }
            let unique: BTreeSet<_> = endpoint.capabilities.iter().map(|c| c.as_str()).collect();
            if unique.len() != endpoint.capabilities.len() {
                problems.push((
                    format!("{at}.capabilities"),
                    "a capability is listed twice".into(),
                ));
            }
        }
    }
}

fn check_proxy(proxy: &ProxyConfig, problems: &mut Vec<(String, String)>) {
    for (field, url) in [("proxy.http", &proxy.http), ("proxy.https", &proxy.https)] {
        if let Some(url) = url
            && let Err(message) = check_url(url, true)
        {
            problems.push((field.to_owned(), message));
        }
    }
    if proxy.http.is_none() && proxy.https.is_none() {
        problems.push(("proxy".into(), "set http, https or both".into()));
    }
    for (i, entry) in proxy.no_proxy.iter().enumerate() {
        if !is_no_proxy_entry(entry) {
            problems.push((
                format!("proxy.noProxy[{i}]"),
                format!("{entry:?} is not a host, domain (.example.com), address or CIDR"),
            ));
        }
    }
}

fn check_pems(network: &NetworkConfig, source: Source, problems: &mut Vec<(String, String)>) {
    let mut names = BTreeSet::new();
    for (i, bundle) in network.ca_bundles.iter().enumerate() {
        if !is_bundle_name(&bundle.name) {
            problems.push((
                format!("caBundles[{i}].name"),
                format!(
                    "{:?} must be lower-case letters, digits and -, at most 63",
                    bundle.name
                ),
            ));
        } else if !names.insert(bundle.name.as_str()) {
            problems.push((
                format!("caBundles[{i}].name"),
                format!("{:?} is listed twice", bundle.name),
            ));
        }
    }
    let mut copy = network.clone();
    for field in copy.pem_fields_mut() {
        let problem = match (field.inline.as_deref(), field.secret.as_ref(), source) {
            (Some(_), Some(_), _) | (None, None, _) => Some("set exactly one of inline and secret".to_owned()),
            (None, Some(_), Source::Template) => Some(
                "a template's defaults name no Secret: put the PEM inline, or let configs name their own Secret".to_owned(),
            ),
            (None, Some(_), Source::Resolved) => Some("the Secret was not read (render offline with the PEM inline)".to_owned()),
            (None, Some(_), Source::Config) => None,
            (Some(_), None, Source::Config) if field.private_key => {
                Some("a private key comes from a Secret, not inline".to_owned())
            }
            (Some(pem), None, _) => check_pem(pem, field.private_key).err(),
        };
        if let Some(message) = problem {
            problems.push((field.field, message));
        }
    }
}

/// A PEM text that holds at least one certificate (or, for a key, one private key), nothing
/// that fails to parse, and nothing but blank lines outside its blocks.
pub fn check_pem(pem: &str, private_key: bool) -> Result<(), String> {
    only_blocks(pem)?;
    let mut count = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| format!("not valid PEM: {e}"))?;
        if private_key {
            if !block.label.ends_with("PRIVATE KEY") {
                return Err(format!("holds a {} block, not a private key", block.label));
            }
        } else {
            if block.label != "CERTIFICATE" {
                return Err(format!("holds a {} block, not a CERTIFICATE", block.label));
            }
            block
                .parse_x509()
                .map_err(|e| format!("certificate {} does not parse: {e}", count + 1))?;
        }
        count += 1;
    }
    if count == 0 {
        return Err(if private_key {
            "holds no PEM private key".into()
        } else {
            "holds no PEM certificate".into()
        });
    }
    Ok(())
}

/// The PEM reader skips text outside `-----BEGIN`/`-----END` lines; a consumer of the bundle
/// (curl, containerd, a script that splits it) may not: such text is refused, by its line and
/// without quoting it (a key's file may hold more than the key).
fn only_blocks(pem: &str) -> Result<(), String> {
    let mut inside = false;
    for (i, line) in pem.lines().enumerate() {
        let line = line.trim();
        if line.starts_with("-----BEGIN ") && !inside {
            inside = true;
        } else if line.starts_with("-----END ") && inside {
            inside = false;
        } else if !inside && !line.is_empty() {
            return Err(format!(
                "line {} is text outside any PEM block; a bundle holds PEM blocks and blank lines only",
                i + 1
            ));
        }
    }
    Ok(())
}

fn check_artifacts(artifacts: &[ArtifactSource], problems: &mut Vec<(String, String)>) {
    let mut seen = BTreeSet::new();
    for (i, artifact) in artifacts.iter().enumerate() {
        if !seen.insert(artifact.name) {
            problems.push((
                format!("artifacts[{i}].name"),
                format!("{} is listed twice", artifact.name.as_str()),
            ));
        }
        if let Err(message) = check_url(&artifact.url, false) {
            problems.push((format!("artifacts[{i}].url"), message));
        }
        if !is_sha256(&artifact.sha256) {
            problems.push((
                format!("artifacts[{i}].sha256"),
                "must be 64 lower-case hex digits (the SHA-256 of the download)".into(),
            ));
        }
    }
}

/// An `http://` or `https://` URL with a host, without credentials, query or fragment. `proxy`:
/// a proxy URL, which has no path either.
pub fn check_url(text: &str, proxy: bool) -> Result<(), String> {
    // The URI parser takes a few characters (`"`, `{`, `|`) for compatibility that no URL
    // written by hand needs and that change the meaning of a quoted shell word or unit line.
    if text
        .chars()
        .any(|c| !c.is_ascii_graphic() || "\"\\{}|^<>`".contains(c))
    {
        return Err(format!("{text:?} holds a character a URL does not"));
    }
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("{text:?} must start with https:// or http://"));
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("{text:?} names no host"));
    };
    if authority.as_str().contains('@') {
        return Err(format!(
            "{text:?} carries credentials; they would be written where every process on the machine reads them"
        ));
    }
    if authority.host().is_empty() {
        return Err(format!("{text:?} names no host"));
    }
    if uri.query().is_some() || text.contains('#') {
        return Err(format!("{text:?} has a query or fragment"));
    }
    if proxy && !matches!(uri.path(), "" | "/") {
        return Err(format!("{text:?}: a proxy URL has no path"));
    }
    // A proxy URL goes into environment files and unit lines as it is: host and port only.
    if proxy
        && !authority
            .as_str()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c))
    {
        return Err(format!("{text:?}: a proxy URL is scheme, host and port"));
    }
    Ok(())
}

/// `host`, `host:port`, or `_default` (containerd's entry for every other registry).
fn is_registry(name: &str) -> bool {
    if name == "_default" {
        return true;
    }
    match name.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => is_host(host) && port.parse::<u16>().is_ok(),
        _ => is_host(name),
    }
}

/// A DNS name or an IP address.
fn is_host(text: &str) -> bool {
    if text.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// A host, a domain suffix (`.example.com`), an address or a CIDR.
fn is_no_proxy_entry(text: &str) -> bool {
    is_cidr(text) || is_host(text.strip_prefix('.').unwrap_or(text)) || text == "*"
}

/// `address/prefix`, the prefix no longer than the address.
pub fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

/// A registry host followed by an optional path, as kubeadm's `imageRepository` takes it.
fn is_image_repository(text: &str) -> bool {
    let (registry, path) = text.split_once('/').unwrap_or((text, ""));
    is_registry(registry)
        && registry != "_default"
        && path.split('/').all(|segment| {
            path.is_empty()
                || (!segment.is_empty()
                    && segment
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c)))
        })
}

fn is_bundle_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// `network` as templates see it. Call only with an input that [`check`] passed as
/// [`Source::Resolved`].
pub fn context(network: &NetworkConfig, cluster: &ClusterInfo, machine: &MachineInfo) -> Value {
    let bundles: Vec<Value> = network
        .ca_bundles
        .iter()
        .map(|b| {
            json!({
                "name": b.name,
                "fileName": format!("bootplate-{}.crt", b.name),
                "pem": b.inline.clone().unwrap_or_default(),
            })
        })
        .collect();
    let all_pem: String = network
        .ca_bundles
        .iter()
        .filter_map(|b| b.inline.as_deref())
        .map(|pem| format!("{}\n", pem.trim_end()))
        .collect();
    json!({
        "registryMirrors": network.registry_mirrors.iter().map(mirror_context).collect::<Vec<_>>(),
        "proxy": proxy_context(network.proxy.as_ref(), cluster, machine),
        "caBundles": bundles,
        "caBundle": all_pem,
        "ntpServers": network.ntp_servers,
        "imageRepository": network.image_repository.clone().unwrap_or_default(),
        "artifacts": network.artifacts.iter().map(|a| json!({
            "name": a.name.as_str(), "url": a.url, "sha256": a.sha256,
        })).collect::<Vec<_>>(),
        "artifact": artifact_map(&network.artifacts),
    })
}

/// Every artifact by name, absent ones with empty `url` and `sha256`, so a template can test
/// `network.artifact.kubeadm.url` in strict mode.
fn artifact_map(artifacts: &[ArtifactSource]) -> Value {
    let mut map = serde_json::Map::new();
    for name in crd_types::network::ARTIFACTS {
        let found = artifacts.iter().find(|a| a.name == name);
        map.insert(
            name.as_str().replace('-', "_"),
            json!({
                "url": found.map(|a| a.url.as_str()).unwrap_or_default(),
                "sha256": found.map(|a| a.sha256.as_str()).unwrap_or_default(),
            }),
        );
    }
    Value::Object(map)
}

/// One registry: its directory under [`CERTS_DIR`], its `hosts.toml` and the certificate files
/// the `hosts.toml` names.
fn mirror_context(mirror: &RegistryMirror) -> Value {
    let directory = format!("{CERTS_DIR}/{}", mirror.registry);
    let mut toml = String::new();
    if mirror.registry != "_default" {
        let server = upstream_server(&mirror.registry);
        let _ = writeln!(toml, "server = {}\n", toml_string(&server));
    }
    let mut files = Vec::new();
    for (j, endpoint) in mirror.endpoints.iter().enumerate() {
        endpoint_toml(&directory, j, endpoint, &mut toml, &mut files);
    }
    files.push(
        json!({"path": format!("{directory}/hosts.toml"), "permissions": "0644", "content": toml}),
    );
    json!({
        "registry": mirror.registry,
        "directory": directory,
        "hostsToml": toml,
        "files": files,
    })
}

/// The upstream registry's URL; Docker Hub's API lives at `registry-1.docker.io`.
fn upstream_server(registry: &str) -> String {
    match registry {
        "docker.io" => "https://registry-1.docker.io".to_owned(),
        other => format!("https://{other}"),
    }
}

fn endpoint_toml(
    directory: &str,
    index: usize,
    endpoint: &MirrorEndpoint,
    toml: &mut String,
    files: &mut Vec<Value>,
) {
    let _ = writeln!(toml, "[host.{}]", toml_string(&endpoint.url));
    let capabilities: Vec<&str> = if endpoint.capabilities.is_empty() {
        vec!["pull", "resolve"]
    } else {
        endpoint.capabilities.iter().map(|c| c.as_str()).collect()
    };
    let list: Vec<String> = capabilities.iter().map(|c| toml_string(c)).collect();
    let _ = writeln!(toml, "  capabilities = [{}]", list.join(", "));
    if endpoint.override_path {
        let _ = writeln!(toml, "  override_path = true");
    }
    if let Some(pem) = endpoint.ca.as_ref().and_then(|ca| ca.inline.as_deref()) {
        let path = format!("{directory}/mirror-{index}-ca.crt");
        let _ = writeln!(toml, "  ca = {}", toml_string(&path));
        files.push(json!({"path": path, "permissions": "0644", "content": pem}));
    }
    if let Some(client) = &endpoint.client_certificate {
        let cert = format!("{directory}/mirror-{index}-client.crt");
        let key = format!("{directory}/mirror-{index}-client.key");
        let _ = writeln!(
            toml,
            "  client = [[{}, {}]]",
            toml_string(&cert),
            toml_string(&key)
        );
        let cert_pem = client.certificate.inline.clone().unwrap_or_default();
        let key_pem = client.key.inline.clone().unwrap_or_default();
        files.push(json!({"path": cert, "permissions": "0644", "content": cert_pem}));
        files.push(json!({"path": key, "permissions": "0600", "content": key_pem}));
    }
    toml.push('\n');
}

/// A TOML basic string. JSON's escaping is a subset of TOML's for the checked inputs (URLs
/// and paths without control characters).
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string always serializes")
}

/// The proxy with the computed `noProxy`; `enabled: false` and empty strings without one.
fn proxy_context(
    proxy: Option<&ProxyConfig>,
    cluster: &ClusterInfo,
    machine: &MachineInfo,
) -> Value {
    let Some(proxy) = proxy else {
        return json!({"enabled": false, "http": "", "https": "", "noProxy": [], "noProxyList": "",
            "environment": "", "systemdEnvironment": ""});
    };
    let no_proxy = no_proxy(proxy, cluster, machine);
    let list = no_proxy.join(",");
    let http = proxy.http.clone().unwrap_or_default();
    let https = proxy.https.clone().unwrap_or_default();
    let mut pairs = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &https),
        ("NO_PROXY", &list),
    ] {
        if !value.is_empty() {
            pairs.push((name.to_owned(), value.clone()));
            pairs.push((name.to_lowercase(), value.clone()));
        }
    }
    let environment: String = pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let systemd: String = pairs
        .iter()
        .map(|(k, v)| format!("Environment=\"{k}={v}\"\n"))
        .collect();
    json!({
        "enabled": true,
        "http": http,
        "https": https,
        "noProxy": no_proxy,
        "noProxyList": list,
        "environment": environment,
        "systemdEnvironment": format!("[Service]\n{systemd}"),
    })
}

/// What bypasses the proxy: loopback, the Cluster's pod and service networks and service
/// domain, the control-plane endpoint, the machine's own name, then the user's additions; each
/// once, in that order.
pub fn no_proxy(proxy: &ProxyConfig, cluster: &ClusterInfo, machine: &MachineInfo) -> Vec<String> {
    let mut out: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    out.extend(cluster.network.pods.iter().cloned());
    out.extend(cluster.network.services.iter().cloned());
    out.push(".svc".into());
    if !cluster.network.service_domain.is_empty() {
        out.push(format!(".{}", cluster.network.service_domain));
    }
    if !cluster.control_plane_endpoint.host.is_empty() {
        out.push(cluster.control_plane_endpoint.host.clone());
    }
    // A pool's name is shared by its instances and is no host's name.
    if !machine.pool && !machine.name.is_empty() {
        out.push(machine.name.clone());
    }
    out.extend(proxy.no_proxy.iter().cloned());
    let mut seen = BTreeSet::new();
    // The Cluster's fields are not checked like the input: an entry that is no host, domain
    // or CIDR (a newline, a quote) never reaches the environment files.
    out.retain(|entry| is_no_proxy_entry(entry) && seen.insert(entry.clone()));
    out
}

/// A self-signed certificate (public, throw-away) that stands in for a Secret's PEM in sample
/// renders: the webhook and lint render a config before its Secrets are read.
pub const SAMPLE_CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBrjCCAVOgAwIBAgIUPsDlyARalflHm0C5777Bd1ugaMowCgYIKoZIzj0EAwIw
KzEpMCcGA1UEAwwgYm9vdHBsYXRlIHNhbXBsZSAobm90IGEgcmVhbCBDQSkwIBcN
MjYxMjAyMDUxNzU1WhgPMjEyNjExMDgwNTE3NTVaMCsxKTAnBgNVBAMMIGJvb3Rw
bGF0ZSBzYW1wbGUgKG5vdCBhIHJlYWwgQ0EpMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEyPhRhj+6PJsDPakwN0WoZ747Xo/oBThpXX+rr/VZg/0irHUZxKmK+Wxi
IVEMeRsZvoNkwbktOBdFuTc0kr1NuKNTMFEwHQYDVR0OBBYEFJqJ2dkcQ4AAq0OD
ntHFzx9eRITZMB8GA1UdIwQYMBaAFJqJ2dkcQ4AAq0ODntHFzx9eRITZMA8GA1Ud
EwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAIK3rbMo/z372bQ7L4YNxnNM
AL7H2VFFj7seGzTfhixXAiEAyA6tBdBaQH1iBKSETuKq2m/4bKcfF/QVdN55msbU
w6M=
-----END CERTIFICATE-----
";

/// A stand-in private key block: the label is what is checked, the content is no key.
const SAMPLE_KEY_PEM: &str =
    "-----BEGIN PRIVATE KEY-----\nc2FtcGxlIGtleSwgbm90IGEga2V5\n-----END PRIVATE KEY-----\n";

/// `network` with every Secret reference replaced by sample PEM, for sample renders.
pub fn with_sample_secrets(network: &mut NetworkConfig) {
    for field in network.pem_fields_mut() {
        if field.secret.take().is_some() {
            *field.inline = Some(if field.private_key {
                SAMPLE_KEY_PEM.to_owned()
            } else {
                SAMPLE_CA_PEM.to_owned()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Endpoint;
    use serde_json::json;

    fn parse(value: Value) -> NetworkConfig {
        serde_json::from_value(value).expect("a network input")
    }

    fn digest() -> String {
        "ab".repeat(32)
    }

    /// Each case: an input, where it comes from, and the field of the one problem expected
    /// (`None`: valid).
    #[test]
    fn check_names_the_field_of_each_bad_input() {
        let key = |inline: bool| {
            if inline {
                json!({"inline": SAMPLE_KEY_PEM})
            } else {
                json!({"secret": {"name": "mirror-client", "key": "tls.key"}})
            }
        };
        let client = |inline_key: bool| {
            json!({"registryMirrors": [{"registry": "registry.k8s.io", "endpoints": [{
                "url": "https://mirror.example:5000",
                "clientCertificate": {"certificate": {"inline": SAMPLE_CA_PEM}, "key": key(inline_key)}}]}]})
        };
        let mirror = |registry: &str, url: &str| json!({"registryMirrors": [{"registry": registry, "endpoints": [{"url": url}]}]});
        let cases: Vec<(Value, Source, Option<&str>)> = vec![
            (
                mirror("registry.k8s.io", "https://mirror.example/v2/k8s"),
                Source::Config,
                None,
            ),
            (
                mirror("_default", "http://10.0.0.5:5000"),
                Source::Config,
                None,
            ),
            (
                mirror("registry.k8s.io", "ftp://mirror.example"),
                Source::Config,
                Some("registryMirrors[0].endpoints[0].url"),
            ),
            (
                mirror("registry.k8s.io", "https://user:pw@mirror.example"),
                Source::Config,
                Some("registryMirrors[0].endpoints[0].url"),
            ),
            (
                mirror("registry.k8s.io", "https://mirror.example/?a=b"),
                Source::Config,
                Some("registryMirrors[0].endpoints[0].url"),
            ),
            (
                mirror("registry k8s io", "https://mirror.example"),
                Source::Config,
                Some("registryMirrors[0].registry"),
            ),
            (
                mirror("../etc", "https://mirror.example"),
                Source::Config,
                Some("registryMirrors[0].registry"),
            ),
            (
                json!({"proxy": {"http": "http://proxy.corp:3128", "noProxy": [".corp", "10.0.0.0/8", "db.corp"]}}),
                Source::Config,
                None,
            ),
            (
                json!({"proxy": {"noProxy": ["a"]}}),
                Source::Config,
                Some("proxy"),
            ),
            (
                json!({"proxy": {"http": "http://[::1]:3128"}}),
                Source::Config,
                None,
            ),
            (
                json!({"proxy": {"http": "http://p%24x:3128"}}),
                Source::Config,
                Some("proxy.http"),
            ),
            (
                json!({"proxy": {"http": "http://p$x;y:3128"}}),
                Source::Config,
                Some("proxy.http"),
            ),
            (
                mirror("registry.k8s.io", "https://m.corp/a\"b"),
                Source::Config,
                Some("registryMirrors[0].endpoints[0].url"),
            ),
            (
                mirror("registry.k8s.io", "https://m.corp/a b"),
                Source::Config,
                Some("registryMirrors[0].endpoints[0].url"),
            ),
            (
                json!({"proxy": {"https": "http://proxy.corp:3128/path"}}),
                Source::Config,
                Some("proxy.https"),
            ),
            (
                json!({"proxy": {"http": "http://p:1", "noProxy": ["10.0.0.0/33"]}}),
                Source::Config,
                Some("proxy.noProxy[0]"),
            ),
            (
                json!({"proxy": {"http": "http://p:1", "noProxy": ["a\nB=c"]}}),
                Source::Config,
                Some("proxy.noProxy[0]"),
            ),
            (
                json!({"caBundles": [{"name": "corp", "inline": SAMPLE_CA_PEM}]}),
                Source::Template,
                None,
            ),
            (
                json!({"caBundles": [{"name": "corp", "inline": "not pem"}]}),
                Source::Config,
                Some("caBundles[0]"),
            ),
            (
                json!({"caBundles": [{"name": "corp", "inline": SAMPLE_KEY_PEM}]}),
                Source::Config,
                Some("caBundles[0]"),
            ),
            (
                json!({"caBundles": [{"name": "corp", "inline": SAMPLE_CA_PEM.replace("MIIB", "MIIC")}]}),
                Source::Config,
                Some("caBundles[0]"),
            ),
            (
                json!({"caBundles": [{"name": "corp"}]}),
                Source::Config,
                Some("caBundles[0]"),
            ),
            (
                json!({"caBundles": [{"name": "Corp", "inline": SAMPLE_CA_PEM}]}),
                Source::Config,
                Some("caBundles[0].name"),
            ),
            (
                json!({"caBundles": [{"name": "corp", "secret": {"name": "ca", "key": "ca.crt"}}]}),
                Source::Config,
                None,
            ),
            (
                json!({"caBundles": [{"name": "corp", "secret": {"name": "ca", "key": "ca.crt"}}]}),
                Source::Template,
                Some("caBundles[0]"),
            ),
            (
                json!({"caBundles": [{"name": "corp", "secret": {"name": "ca", "key": "ca.crt"}}]}),
                Source::Resolved,
                Some("caBundles[0]"),
            ),
            (client(false), Source::Config, None),
            (
                client(true),
                Source::Config,
                Some("registryMirrors[0].endpoints[0].clientCertificate.key"),
            ),
            (client(true), Source::Resolved, None),
            (
                json!({"ntpServers": ["ntp.corp", "10.1.1.1"]}),
                Source::Config,
                None,
            ),
            (
                json!({"ntpServers": ["ntp corp"]}),
                Source::Config,
                Some("ntpServers[0]"),
            ),
            (
                json!({"imageRepository": "mirror.corp:5000/k8s"}),
                Source::Config,
                None,
            ),
            (
                json!({"imageRepository": "https://mirror.corp/k8s"}),
                Source::Config,
                Some("imageRepository"),
            ),
            (
                json!({"artifacts": [{"name": "kubeadm", "url": "https://files.corp/kubeadm", "sha256": digest()}]}),
                Source::Config,
                None,
            ),
            (
                json!({"artifacts": [{"name": "kubeadm", "url": "https://files.corp/kubeadm", "sha256": "AB".repeat(32)}]}),
                Source::Config,
                Some("artifacts[0].sha256"),
            ),
            (
                json!({"artifacts": [{"name": "kubeadm", "url": "https://files.corp/kubeadm", "sha256": "ab"}]}),
                Source::Config,
                Some("artifacts[0].sha256"),
            ),
            (
                json!({"artifacts": [{"name": "runc", "url": "https://f/r", "sha256": digest()}, {"name": "runc", "url": "https://f/r", "sha256": digest()}]}),
                Source::Config,
                Some("artifacts[1].name"),
            ),
        ];
        for (input, source, expected) in cases {
            let problems = check(&parse(input.clone()), source);
            let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
            match expected {
                None => assert!(problems.is_empty(), "{input} ({source:?}): {problems:?}"),
                Some(field) => assert_eq!(fields, [field], "{input} ({source:?}): {problems:?}"),
            }
        }
    }

    /// A bundle is PEM blocks and blank lines only: text before, between or after the
    /// certificates (which the PEM reader skips, and a consumer may not) is refused by its line,
    /// without quoting it.
    #[test]
    fn text_outside_the_pem_blocks_is_refused() {
        let ca = SAMPLE_CA_PEM.trim_end();
        let key = SAMPLE_KEY_PEM.trim_end();
        let after_ca = ca.lines().count() + 1;
        let cases: &[(String, bool, Option<usize>)] = &[
            (format!("{ca}\n"), false, None),
            (format!("\n{ca}\n\n{ca}\n\n"), false, None),
            (format!("{ca}\n  \t\n{ca}"), false, None),
            (format!("{key}\n"), true, None),
            (
                format!("{ca}\nexport TOKEN=secret\n{ca}\n"),
                false,
                Some(after_ca),
            ),
            (format!("Bag Attributes\n{ca}\n"), false, Some(1)),
            (format!("{ca}\ntrailing secret\n"), false, Some(after_ca)),
            (format!("{key}\nsecret\n"), true, Some(4)),
        ];
        for (pem, private_key, refused) in cases {
            let got = check_pem(pem, *private_key);
            match refused {
                None => assert!(got.is_ok(), "{pem:?}: {got:?}"),
                Some(line) => {
                    let e = got.expect_err(pem);
                    assert!(e.contains(&format!("line {line} ")), "{e}");
                    assert!(e.contains("outside"), "{e}");
                    assert!(!e.contains("secret") && !e.contains("Bag"), "{e}");
                }
            }
        }
    }

    #[test]
    fn oversized_inputs_are_refused_before_they_are_parsed() {
        let many = |n: usize| json!({"ntpServers": vec!["ntp.corp"; n]});
        assert!(check(&parse(many(MAX_NTP_SERVERS)), Source::Config).is_empty());
        let over = check(&parse(many(MAX_NTP_SERVERS + 1)), Source::Config);
        assert_eq!(over[0].0, "ntpServers", "{over:?}");
        let huge_pem = "x".repeat(MAX_PEM_BYTES + 1);
        let over = check(
            &parse(json!({"caBundles": [{"name": "a", "inline": huge_pem}]})),
            Source::Config,
        );
        assert_eq!(over.len(), 1, "{over:?}");
        assert!(over[0].1.contains("larger than"), "{over:?}");
        let long_url = format!("https://{}.corp", "a".repeat(MAX_NAME_BYTES));
        let over = check(
            &parse(json!({"artifacts": [{"name": "runc", "url": long_url, "sha256": digest()}]})),
            Source::Config,
        );
        assert_eq!(over[0].0, "artifacts[0].url", "{over:?}");
        let endpoints = vec![json!({"url": "https://m"}); MAX_ENDPOINTS + 1];
        let over = check(
            &parse(json!({"registryMirrors": [{"registry": "r", "endpoints": endpoints}]})),
            Source::Config,
        );
        assert_eq!(over[0].0, "registryMirrors[0].endpoints", "{over:?}");
    }

    #[test]
    fn a_config_field_replaces_the_template_default_and_leaves_the_others() {
        let template = parse(
            json!({"ntpServers": ["ntp.template"], "imageRepository": "template.corp/k8s",
            "proxy": {"http": "http://template:3128"}}),
        );
        let config = parse(json!({"ntpServers": ["ntp.config"]}));
        let merged = merge(Some(&template), Some(&config));
        assert_eq!(merged.ntp_servers, ["ntp.config"]);
        assert_eq!(
            merged.image_repository.as_deref(),
            Some("template.corp/k8s")
        );
        assert_eq!(merged.proxy, template.proxy);
        // Each field the config sets wins over the template's.
        let every = parse(
            json!({"ntpServers": ["c"], "imageRepository": "config.corp/k8s",
            "proxy": {"https": "http://config:3128"}, "caBundles": [{"name": "c", "inline": "x"}],
            "registryMirrors": [{"registry": "c", "endpoints": [{"url": "https://c"}]}],
            "artifacts": [{"name": "runc", "url": "https://c/runc", "sha256": digest()}]}),
        );
        let with_all = parse(json!({"caBundles": [{"name": "t", "inline": "y"}],
            "registryMirrors": [{"registry": "t", "endpoints": [{"url": "https://t"}]}],
            "artifacts": [{"name": "runc", "url": "https://t/runc", "sha256": digest()}],
            "ntpServers": ["t"], "imageRepository": "t.corp/k8s", "proxy": {"http": "http://t:1"}}));
        assert_eq!(merge(Some(&with_all), Some(&every)), every);
        assert_eq!(merge(None, None), NetworkConfig::default());
        assert_eq!(merge(Some(&template), None), template);
    }

    fn cluster() -> ClusterInfo {
        ClusterInfo {
            name: "c1".into(),
            namespace: "team".into(),
            control_plane_endpoint: Endpoint {
                host: "api.c1.corp".into(),
                port: 6443,
            },
            network: crate::context::Network {
                pods: vec!["192.168.0.0/16".into()],
                services: vec!["10.96.0.0/12".into(), "bad\nLINE=1".into()],
                service_domain: "cluster.local".into(),
            },
            labels: Default::default(),
        }
    }

    #[test]
    fn no_proxy_holds_the_cluster_networks_the_endpoint_and_the_node_then_the_additions() {
        let mut machine = crate::sample::sample_context(crd_types::Role::Worker).machine;
        machine.name = "c1-worker-0".into();
        let proxy = ProxyConfig {
            http: Some("http://proxy.corp:3128".into()),
            https: None,
            no_proxy: vec![".corp".into(), "localhost".into()],
        };
        let expected = [
            "localhost",
            "127.0.0.1",
            "::1",
            "192.168.0.0/16",
            "10.96.0.0/12",
            ".svc",
            ".cluster.local",
            "api.c1.corp",
            "c1-worker-0",
            ".corp",
        ];
        assert_eq!(no_proxy(&proxy, &cluster(), &machine), expected);
        machine.pool = true;
        let pooled = no_proxy(&proxy, &cluster(), &machine);
        assert!(!pooled.contains(&"c1-worker-0".to_owned()), "{pooled:?}");
        let value = proxy_context(Some(&proxy), &cluster(), &machine);
        assert_eq!(
            value["systemdEnvironment"].as_str().unwrap().lines().nth(1),
            Some("Environment=\"HTTP_PROXY=http://proxy.corp:3128\"")
        );
        assert!(
            value["environment"]
                .as_str()
                .unwrap()
                .contains("no_proxy=localhost,")
        );
    }

    #[test]
    fn hosts_toml_names_the_upstream_each_mirror_and_its_certificate_files() {
        let network = parse(
            json!({"registryMirrors": [{"registry": "registry.k8s.io", "endpoints": [
            {"url": "https://mirror.corp:5000/v2/k8s", "overridePath": true, "ca": {"inline": SAMPLE_CA_PEM}},
            {"url": "https://backup.corp", "capabilities": ["pull"]}]}]}),
        );
        let machine = crate::sample::sample_context(crd_types::Role::Worker).machine;
        let value = context(&network, &cluster(), &machine);
        let mirror = &value["registryMirrors"][0];
        assert_eq!(
            mirror["directory"],
            "/etc/containerd/certs.d/registry.k8s.io"
        );
        let toml = mirror["hostsToml"].as_str().unwrap();
        let expected = "server = \"https://registry.k8s.io\"\n\n\
            [host.\"https://mirror.corp:5000/v2/k8s\"]\n  capabilities = [\"pull\", \"resolve\"]\n  override_path = true\n  \
            ca = \"/etc/containerd/certs.d/registry.k8s.io/mirror-0-ca.crt\"\n\n\
            [host.\"https://backup.corp\"]\n  capabilities = [\"pull\"]\n\n";
        assert_eq!(toml, expected);
        let paths: Vec<&str> = mirror["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "/etc/containerd/certs.d/registry.k8s.io/mirror-0-ca.crt",
                "/etc/containerd/certs.d/registry.k8s.io/hosts.toml",
            ]
        );
        assert_eq!(value["artifact"]["cni_plugins"]["url"], "");
        assert_eq!(value["proxy"]["enabled"], false);
    }
}
