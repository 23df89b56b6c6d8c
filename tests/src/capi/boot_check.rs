//! What the test cloud requires of a kubeadm machine's user-data before it boots the machine,
//! read as the machine would run it ([`super::user_data`]), for every template and role: the
//! commands run `kubeadm init --config FILE` (the first control-plane machine) or `kubeadm join
//! --config FILE` (every other one) on a file the user-data writes; that file's kubeadm
//! configuration makes the machine take the role its Machine should have, names the node after
//! the Machine (or leaves the name to the host, which the cloud names after the Machine), joins
//! through the Cluster's `controlPlaneEndpoint` and pins the Cluster's CA; and an `init` or
//! `control-plane-join` machine is given the key pairs of the Cluster's `-ca`, `-etcd`, `-proxy`
//! and `-sa` Secrets (each private key checked against the public key of the Secret's
//! certificate, never printed).
//!
//! Only the Secrets' public halves come here: the cloud needs no private key to check one.

use serde::Deserialize as _;
use serde_json::Value;

use super::boot::BootRole;
use super::user_data::UserData;

/// The key pairs a control-plane machine needs: the suffix of the Cluster's Secret, the file
/// of the certificate (the public key for `sa`) and the file of the private key.
pub const KEY_PAIRS: [(&str, &str, &str); 4] = [
    (
        "ca",
        "/etc/kubernetes/pki/ca.crt",
        "/etc/kubernetes/pki/ca.key",
    ),
    (
        "etcd",
        "/etc/kubernetes/pki/etcd/ca.crt",
        "/etc/kubernetes/pki/etcd/ca.key",
    ),
    (
        "proxy",
        "/etc/kubernetes/pki/front-proxy-ca.crt",
        "/etc/kubernetes/pki/front-proxy-ca.key",
    ),
    (
        "sa",
        "/etc/kubernetes/pki/sa.pub",
        "/etc/kubernetes/pki/sa.key",
    ),
];

/// What a machine's user-data must do, from its Machine and Cluster.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The role its Machine should have.
    pub role: BootRole,
    /// The Machine's name: the node's.
    pub machine: String,
    /// The Cluster's name (its Secrets are `<cluster>-<suffix>`).
    pub cluster: String,
    /// The Cluster's `controlPlaneEndpoint` as `host:port`.
    pub endpoint: String,
    /// The `tls.crt` of each of the Cluster's CA Secrets that exists, by suffix.
    pub certs: Vec<(String, String)>,
}

impl Expected {
    fn cert(&self, suffix: &str) -> Result<&str, String> {
        (self.certs.iter())
            .find(|(s, _)| s == suffix)
            .map(|(_, cert)| cert.as_str())
            .ok_or_else(|| format!("the Cluster has no {}-{suffix} Secret", self.cluster))
    }

    /// `sha256:<hex>` of the SubjectPublicKeyInfo of the Cluster's CA, as kubeadm pins it.
    pub fn ca_hash(&self) -> Result<String, String> {
        use sha2::Digest as _;
        let pem = pem_block(self.cert("ca")?)?;
        let (_, cert) = x509_parser::parse_x509_certificate(&pem.contents)
            .map_err(|e| format!("the {}-ca certificate: {e}", self.cluster))?;
        let digest = sha2::Sha256::digest(cert.tbs_certificate.subject_pki.raw);
        Ok(format!("sha256:{}", hex::encode(digest)))
    }
}

/// A `kubeadm init|join` command the machine runs, and the configuration file it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeadmCommand {
    /// `init` or `join`.
    pub verb: String,
    /// The `--config` file.
    pub config: String,
}

/// The `kubeadm init|join --config FILE` commands the machine runs, in order (a line that is a
/// comment runs nothing).
pub fn kubeadm_commands(data: &UserData) -> Vec<KubeadmCommand> {
    let lines = data.runs().iter().flat_map(|r| r.lines());
    let lines = lines.filter(|l| !l.trim_start().starts_with('#'));
    lines.filter_map(kubeadm_command).collect()
}

fn kubeadm_command(line: &str) -> Option<KubeadmCommand> {
    let words: Vec<&str> = (line.split(|c: char| c.is_whitespace() || c == ';'))
        .map(|w| w.trim_matches(|c| c == '\'' || c == '"'))
        .filter(|w| !w.is_empty())
        .collect();
    let at = words.iter().position(|w| {
        w.rsplit(['/', '=']).next() == Some("kubeadm") && !w.starts_with('$') && !w.starts_with('-')
    })?;
    let verb = *words.get(at + 1).filter(|v| ["init", "join"].contains(v))?;
    let rest = &words[at + 2..];
    let config = rest.iter().enumerate().find_map(|(i, w)| {
        if *w == "--config" {
            rest.get(i + 1).map(|p| (*p).to_owned())
        } else {
            w.strip_prefix("--config=").map(str::to_owned)
        }
    })?;
    Some(KubeadmCommand {
        verb: verb.to_owned(),
        config,
    })
}

/// Checks `data` against `expected`: why the machine would not come up as its Machine should
/// (naming no secret), or the kubeadm configuration it runs with.
pub fn check(data: &UserData, expected: &Expected) -> Result<Value, String> {
    let verb = if expected.role == BootRole::Init {
        "init"
    } else {
        "join"
    };
    let commands = kubeadm_commands(data);
    let Some(command) = commands.iter().find(|c| c.verb == verb) else {
        let ran: Vec<String> = (commands.iter())
            .map(|c| format!("kubeadm {} --config {}", c.verb, c.config))
            .collect();
        return Err(format!(
            "the user-data runs no `kubeadm {verb} --config FILE`, which its Machine ({}) needs \
             (it runs {ran:?})",
            expected.role
        ));
    };
    let path = &command.config;
    let text = (data.file(path)?).ok_or_else(|| {
        format!("the user-data runs `kubeadm {verb} --config {path}` and writes no {path}")
    })?;
    let config = KubeadmConfig::read(&text).map_err(|e| format!("{path}: {e}"))?;
    config.check(expected).map_err(|e| format!("{path}: {e}"))?;
    if expected.role != BootRole::Worker {
        check_key_pairs(data, expected)?;
    }
    Ok(config.main)
}

/// The documents of a kubeadm configuration file that matter here.
struct KubeadmConfig {
    /// The InitConfiguration or JoinConfiguration.
    main: Value,
    /// The ClusterConfiguration (an `init` file's).
    cluster: Option<Value>,
}

impl KubeadmConfig {
    fn read(text: &str) -> Result<KubeadmConfig, String> {
        let (mut main, mut cluster) = (None, None);
        for document in serde_yaml::Deserializer::from_str(text) {
            let document = Value::deserialize(document).map_err(|e| format!("not YAML: {e}"))?;
            match document["kind"].as_str() {
                Some("InitConfiguration" | "JoinConfiguration") if main.is_none() => {
                    main = Some(document)
                }
                Some("InitConfiguration" | "JoinConfiguration") => {
                    return Err("two Init or JoinConfigurations".into());
                }
                Some("ClusterConfiguration") => cluster = Some(document),
                _ => {}
            }
        }
        let main = main.ok_or("no InitConfiguration or JoinConfiguration")?;
        Ok(KubeadmConfig { main, cluster })
    }

    /// The role this configuration makes kubeadm take.
    fn role(&self) -> BootRole {
        match self.main["kind"].as_str() {
            Some("InitConfiguration") => BootRole::Init,
            _ if self.main["controlPlane"].is_null() => BootRole::Worker,
            _ => BootRole::ControlPlaneJoin,
        }
    }

    fn check(&self, expected: &Expected) -> Result<(), String> {
        let role = self.role();
        if role != expected.role {
            return Err(format!(
                "makes the machine {role}, its Machine should be {}",
                expected.role
            ));
        }
        let (field, endpoint) = match role {
            BootRole::Init => (
                "ClusterConfiguration controlPlaneEndpoint",
                (self.cluster.as_ref()).map_or(&Value::Null, |c| &c["controlPlaneEndpoint"]),
            ),
            _ => (
                "discovery.bootstrapToken.apiServerEndpoint",
                &self.main["discovery"]["bootstrapToken"]["apiServerEndpoint"],
            ),
        };
        if endpoint.as_str() != Some(expected.endpoint.as_str()) {
            return Err(format!(
                "{field} is {endpoint}, the Cluster's controlPlaneEndpoint is {}",
                expected.endpoint
            ));
        }
        // Without a name kubeadm names the node after the host, which the cloud names after
        // the Machine.
        let name = &self.main["nodeRegistration"]["name"];
        if !name.is_null() && name.as_str() != Some(expected.machine.as_str()) {
            return Err(format!(
                "nodeRegistration.name is {name}, the Machine is {:?}",
                expected.machine
            ));
        }
        if role != BootRole::Init {
            let hashes = &self.main["discovery"]["bootstrapToken"]["caCertHashes"];
            let hash = expected.ca_hash()?;
            let pinned = (hashes.as_array().into_iter().flatten()).any(|h| h == hash.as_str());
            if !pinned {
                return Err(format!(
                    "caCertHashes {hashes} do not pin the cluster CA (the {}-ca Secret's, {hash})",
                    expected.cluster
                ));
            }
        }
        Ok(())
    }
}

/// Each of the Cluster's key pairs, written by the user-data: its certificate (or public key)
/// carries the public key of the Cluster's Secret, and its private key belongs to it.
fn check_key_pairs(data: &UserData, expected: &Expected) -> Result<(), String> {
    for (suffix, cert_path, key_path) in KEY_PAIRS {
        let secret = format!("{}-{suffix}", expected.cluster);
        let want = public_key(expected.cert(suffix)?)
            .map_err(|e| format!("the {secret} Secret's tls.crt: {e}"))?;
        let written = |path: &str| -> Result<String, String> {
            data.file(path)?.ok_or_else(|| {
                format!(
                    "the user-data writes no {path}, which a {} machine needs",
                    expected.role
                )
            })
        };
        let cert = public_key(&written(cert_path)?).map_err(|e| format!("{cert_path}: {e}"))?;
        if cert != want {
            return Err(format!(
                "{cert_path} is not the certificate of the {secret} Secret"
            ));
        }
        let key =
            private_key_public_half(&written(key_path)?).map_err(|e| format!("{key_path}: {e}"))?;
        if key != want {
            return Err(format!(
                "{key_path} is not the key of the {secret} Secret's certificate"
            ));
        }
    }
    Ok(())
}

fn pem_block(text: &str) -> Result<x509_parser::pem::Pem, String> {
    (x509_parser::pem::Pem::iter_from_buffer(text.as_bytes()).next())
        .ok_or("no PEM block")?
        .map_err(|e| format!("not PEM: {e}"))
}

/// The public key (the bits of the SubjectPublicKeyInfo) of a PEM certificate or public key.
fn public_key(pem: &str) -> Result<Vec<u8>, String> {
    use x509_parser::prelude::FromDer as _;
    let block = pem_block(pem)?;
    match block.label.as_str() {
        "CERTIFICATE" => {
            let (_, cert) = x509_parser::parse_x509_certificate(&block.contents)
                .map_err(|e| format!("not a certificate: {e}"))?;
            Ok(cert
                .tbs_certificate
                .subject_pki
                .subject_public_key
                .data
                .to_vec())
        }
        "PUBLIC KEY" => {
            let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&block.contents)
                .map_err(|e| format!("not a public key: {e}"))?;
            Ok(spki.subject_public_key.data.to_vec())
        }
        other => Err(format!("a PEM {other} block, not a certificate")),
    }
}

/// The public key of a PEM private key, in the form [`public_key`] gives: PKCS#8 keys (what
/// rcgen and kubeadm write) through rcgen, PKCS#1 RSA keys (what Cluster API writes) from their
/// modulus and exponent. Errors name the key's form, never its content.
fn private_key_public_half(pem: &str) -> Result<Vec<u8>, String> {
    let block = pem_block(pem)?;
    match block.label.as_str() {
        "PRIVATE KEY" => {
            let key = rcgen::KeyPair::try_from(block.contents.as_slice())
                .map_err(|_| "a PKCS#8 key that does not parse".to_owned())?;
            Ok(key.public_key_raw().to_vec())
        }
        "RSA PRIVATE KEY" => rsa_public_key(&block.contents),
        other => Err(format!("a PEM {other} block the cloud does not read")),
    }
}

/// The DER RSAPublicKey (modulus, exponent) of a PKCS#1 RSAPrivateKey.
fn rsa_public_key(der: &[u8]) -> Result<Vec<u8>, String> {
    let invalid = || "an RSA key that does not parse".to_owned();
    let (_, key) = x509_parser::der_parser::parse_der(der).map_err(|_| invalid())?;
    let fields = key.as_sequence().map_err(|_| invalid())?;
    let integer = |i: usize| -> Result<Vec<u8>, String> {
        let bytes = fields.get(i).ok_or_else(invalid)?.as_slice();
        Ok(der_tlv(0x02, bytes.map_err(|_| invalid())?))
    };
    let body = [integer(1)?, integer(2)?].concat();
    Ok(der_tlv(0x30, &body))
}

/// A DER tag, length and value.
fn der_tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = (len.to_be_bytes().into_iter())
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(value);
    out
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crd_types::capi::{Cluster, Machine};
    use crd_types::{BootplateConfigSpec, ClusterBootstrapTemplate, Role};
    use render::{Certificates, CompiledTemplate, JoinInfo, KeyPair, RenderContext};

    use super::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";
    const ENDPOINT: &str = "api.demo.example.com:6443";

    fn templates() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates")
    }

    fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> T {
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// Every shipped template that makes a kubeadm node: (name, its spec).
    fn kubeadm_templates() -> Vec<(String, crd_types::TemplateSpec)> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(templates()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if name.starts_with("kubeadm-") && path.extension().is_some_and(|e| e == "yaml") {
                let object: ClusterBootstrapTemplate = read_yaml(&path);
                found.push((name, object.spec.0));
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert!(found.len() >= 8, "the kubeadm templates: {found:?}");
        found
    }

    /// The Cluster's key pairs, as its Secrets hold them.
    fn cluster_pairs() -> Certificates {
        Certificates {
            ca: bootplate::pki::generate_ca("kubernetes").unwrap(),
            etcd: bootplate::pki::generate_ca("etcd-ca").unwrap(),
            front_proxy: bootplate::pki::generate_ca("front-proxy-ca").unwrap(),
            service_account: bootplate::pki::generate_service_account_key().unwrap(),
        }
    }

    fn pairs_by_suffix(certs: &mut Certificates) -> [(&'static str, &mut KeyPair); 4] {
        [
            ("ca", &mut certs.ca),
            ("etcd", &mut certs.etcd),
            ("proxy", &mut certs.front_proxy),
            ("sa", &mut certs.service_account),
        ]
    }

    /// One render of a shipped template, and what the cloud expects of it.
    struct Case {
        spec: crd_types::TemplateSpec,
        role: Role,
        cluster: Cluster,
        machine: Machine,
        join: JoinInfo,
        certs: Certificates,
        expected: Expected,
    }

    impl Case {
        fn new(spec: &crd_types::TemplateSpec, role: Role, certs: &Certificates) -> Case {
            let testdata = templates().join("testdata");
            let kind = if role.is_control_plane() {
                "control-plane"
            } else {
                "worker"
            };
            let machine: Machine = read_yaml(&testdata.join(format!("machine-{kind}-v1.31.yaml")));
            let mut expected = Expected {
                role: match role {
                    Role::Init => BootRole::Init,
                    Role::ControlPlaneJoin => BootRole::ControlPlaneJoin,
                    Role::Worker => BootRole::Worker,
                },
                machine: machine.metadata.name.clone().unwrap(),
                cluster: "demo".into(),
                endpoint: ENDPOINT.into(),
                certs: Vec::new(),
            };
            let mut certs = certs.clone();
            for (suffix, pair) in pairs_by_suffix(&mut certs) {
                expected.certs.push((suffix.to_owned(), pair.cert.clone()));
            }
            Case {
                spec: spec.clone(),
                role,
                cluster: read_yaml(&testdata.join("cluster.yaml")),
                machine,
                join: JoinInfo {
                    token: TOKEN.into(),
                    api_server_endpoint: ENDPOINT.into(),
                    ca_cert_hashes: vec![expected.ca_hash().unwrap()],
                },
                certs,
                expected,
            }
        }

        fn render(&self) -> String {
            let ctx = RenderContext::new(
                &self.cluster,
                &self.machine,
                self.role,
                Some(self.join.clone()),
                Some(self.certs.clone()),
            );
            let compiled = CompiledTemplate::compile("t", &self.spec).unwrap();
            let rendered = compiled.render(&BootplateConfigSpec::default(), &ctx);
            String::from_utf8(rendered.unwrap().data).unwrap()
        }

        fn check(&self, user_data: &str) -> Result<Value, String> {
            check(&UserData::read(user_data)?, &self.expected)
        }
    }

    /// Every shipped kubeadm template × role, and what each gives.
    fn cases() -> Vec<(String, Case)> {
        let certs = cluster_pairs();
        let mut cases = Vec::new();
        for (name, spec) in kubeadm_templates() {
            for role in Role::ALL {
                cases.push((format!("{name} {role}"), Case::new(&spec, role, &certs)));
            }
        }
        cases
    }

    /// `case` rendered after `mutate` changed it must fail the check with `wanted` in the
    /// refusal (and never a private key in it).
    fn refused(label: &str, case: &Case, wanted: &str) {
        let Err(refusal) = case.check(&case.render()) else {
            panic!("{label}: passed");
        };
        assert!(refusal.contains(wanted), "{label}: {refusal}");
        assert!(!refusal.contains("PRIVATE KEY"), "{label}: {refusal}");
    }

    #[test]
    fn every_shipped_template_passes_for_every_role() {
        for (label, case) in cases() {
            let config = case
                .check(&case.render())
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            assert!(config["kind"].is_string(), "{label}");
        }
    }

    #[test]
    fn a_render_that_runs_no_kubeadm_is_refused() {
        for (label, case) in cases() {
            let user_data = case.render();
            let mut mutated = user_data.clone();
            for verb in ["init", "join"] {
                for space in [" ", "%20"] {
                    let command = format!("kubeadm{space}{verb}{space}--config");
                    mutated = mutated.replace(&command, &format!("kubeadm{space}version"));
                }
            }
            assert_ne!(mutated, user_data, "{label}: the mutation applies");
            let Err(refusal) = case.check(&mutated) else {
                panic!("{label}: passed");
            };
            assert!(refusal.contains("runs no `kubeadm"), "{label}: {refusal}");
        }
    }

    #[test]
    fn a_commented_out_kubeadm_runs_nothing() {
        let certs = cluster_pairs();
        let (_, spec) = kubeadm_templates().remove(usize::from(false));
        let case = Case::new(&spec, Role::Worker, &certs);
        let user_data = case
            .render()
            .replace("kubeadm join --config", "# kubeadm join --config");
        let Err(refusal) = case.check(&user_data) else {
            panic!("a commented-out kubeadm passed");
        };
        assert!(refusal.contains("runs no `kubeadm join"), "{refusal}");
    }

    #[test]
    fn another_endpoint_is_refused() {
        for (label, mut case) in cases() {
            case.join.api_server_endpoint = "api.other.example.com:6443".into();
            let endpoint = json_endpoint("api.other.example.com");
            case.cluster.spec.control_plane_endpoint =
                Some(serde_json::from_value(endpoint).unwrap());
            refused(&label, &case, "the Cluster's controlPlaneEndpoint is");
        }
    }

    fn json_endpoint(host: &str) -> Value {
        serde_json::json!({"host": host, "port": 6443})
    }

    #[test]
    fn another_node_name_is_refused() {
        let mut named = 0;
        for (label, mut case) in cases() {
            case.machine.metadata.name = Some("another-machine".into());
            // A template that leaves the name to the host (the kubeadm provider's, Amazon
            // Linux's by default) names none, and passes.
            if let Ok(config) = case.check(&case.render()) {
                assert!(config["nodeRegistration"]["name"].is_null(), "{label}");
                continue;
            }
            refused(
                &label,
                &case,
                "nodeRegistration.name is \"another-machine\"",
            );
            named += 1;
        }
        assert!(named >= 5 * 3, "{named} renders name the node");
    }

    #[test]
    fn another_role_is_refused() {
        for (label, mut case) in cases() {
            case.expected.role = match case.expected.role {
                BootRole::Init => BootRole::ControlPlaneJoin,
                BootRole::ControlPlaneJoin => BootRole::Worker,
                BootRole::Worker => BootRole::ControlPlaneJoin,
            };
            let Err(refusal) = case.check(&case.render()) else {
                panic!("{label}: passed");
            };
            assert!(
                refusal.contains("its Machine should be") || refusal.contains("runs no `kubeadm"),
                "{label}: {refusal}"
            );
        }
    }

    #[test]
    fn a_ca_hash_of_another_ca_is_refused() {
        for (label, mut case) in cases() {
            if case.role == Role::Init {
                continue;
            }
            case.join.ca_cert_hashes = vec![format!("sha256:{}", "0".repeat(64))];
            refused(&label, &case, "do not pin the cluster CA");
        }
    }

    #[test]
    fn a_key_pair_not_the_clusters_is_refused() {
        let other = cluster_pairs();
        for (label, case) in cases() {
            if case.role == Role::Worker {
                continue;
            }
            for at in 0..4 {
                let mut key_swapped = Case {
                    certs: case.certs.clone(),
                    ..case_copy(&case)
                };
                let mut other = other.clone();
                let (suffix, pair) = pairs_by_suffix(&mut key_swapped.certs)
                    .into_iter()
                    .nth(at)
                    .unwrap();
                let (_, other_pair) = pairs_by_suffix(&mut other).into_iter().nth(at).unwrap();
                pair.key = other_pair.key.clone();
                let wanted = format!("is not the key of the demo-{suffix} Secret's certificate");
                refused(&format!("{label} {suffix} key"), &key_swapped, &wanted);
                let mut cert_swapped = case_copy(&case);
                let (_, pair) = pairs_by_suffix(&mut cert_swapped.certs)
                    .into_iter()
                    .nth(at)
                    .unwrap();
                *pair = other_pair.clone();
                let wanted = format!("is not the certificate of the demo-{suffix} Secret");
                refused(&format!("{label} {suffix} pair"), &cert_swapped, &wanted);
            }
        }
    }

    fn case_copy(case: &Case) -> Case {
        Case {
            spec: case.spec.clone(),
            role: case.role,
            cluster: case.cluster.clone(),
            machine: case.machine.clone(),
            join: case.join.clone(),
            certs: case.certs.clone(),
            expected: case.expected.clone(),
        }
    }

    #[test]
    fn a_pkcs1_rsa_key_reads_as_its_certificates_public_key() {
        // Cluster API writes its CAs' keys as PKCS#1 RSA: openssl makes one here.
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pem");
        let cert = dir.path().join("c.pem");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "genrsa",
            "-traditional",
            "-out",
            key.to_str().unwrap(),
            "2048",
        ]);
        run(&[
            "req",
            "-x509",
            "-new",
            "-key",
            key.to_str().unwrap(),
            "-subj",
            "/CN=ca",
            "-days",
            "1",
            "-out",
            cert.to_str().unwrap(),
        ]);
        let key = std::fs::read_to_string(key).unwrap();
        assert!(key.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        let cert = std::fs::read_to_string(cert).unwrap();
        assert_eq!(private_key_public_half(&key), public_key(&cert));
        let other = bootplate::pki::generate_ca("other").unwrap();
        assert_ne!(private_key_public_half(&key), public_key(&other.cert));
    }

    #[test]
    fn kubeadm_commands_are_read_from_the_shell() {
        let cases = [
            ("kubeadm init --config /a.yaml", Some(("init", "/a.yaml"))),
            (
                "  /opt/bin/kubeadm join --config=/b.yaml --v=5",
                Some(("join", "/b.yaml")),
            ),
            (
                "kubeadm join --config '/c.yaml' && echo ok",
                Some(("join", "/c.yaml")),
            ),
            ("kubeadm join", None),
            ("kubeadm reset -f", None),
            ("echo kubeadm_init --config /a", None),
        ];
        for (line, want) in cases {
            let got = kubeadm_command(line);
            let got = got.as_ref().map(|c| (c.verb.as_str(), c.config.as_str()));
            assert_eq!(got, want, "{line}");
        }
    }
}
