//! What a machine's first boot takes from its user-data, and the checks the test cloud makes
//! before it lets a machine join: the kubeadm configuration the cloud-config writes (the role it
//! makes the machine take, the join token, the CA hashes, the CA certificate of an `init`), the
//! token tried against the workload apiserver as kubeadm's discovery would, the CA hashes and
//! certificate compared with the cluster CA, the role compared with the one the Machine should
//! have. Both bootplate's shipped templates and the kubeadm bootstrap provider write the kubeadm
//! configuration to the same files, so the same reading serves both.

use std::fmt;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::cloud::{self, CloudConfig};

/// The file a joining machine's kubeadm configuration is written to.
const JOIN_CONFIG: &str = "/run/kubeadm/kubeadm-join-config.yaml";
/// The file the first control-plane machine's kubeadm configuration is written to.
const INIT_CONFIG: &str = "/run/kubeadm/kubeadm.yaml";
/// Where a control-plane machine's user-data puts the cluster CA certificate.
const CA_CERT: &str = "/etc/kubernetes/pki/ca.crt";
/// The most user-data the cloud reads: a cloud's limit is tens of KB; a render beyond this is
/// refused before it is parsed.
const MAX_USER_DATA: usize = 1 << 20;

/// The part a kubeadm machine plays, as its user-data makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootRole {
    /// `kubeadm init`: the first control-plane machine.
    Init,
    /// `kubeadm join` with a `controlPlane` section.
    ControlPlaneJoin,
    /// `kubeadm join` as a worker.
    Worker,
}

impl BootRole {
    /// The name bootplate gives the role (`init`, `control-plane-join`, `worker`).
    pub fn as_str(self) -> &'static str {
        match self {
            BootRole::Init => "init",
            BootRole::ControlPlaneJoin => "control-plane-join",
            BootRole::Worker => "worker",
        }
    }
}

impl fmt::Display for BootRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a kubeadm cloud-config tells its machine to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeadmBoot {
    /// The role; `None` when the user-data writes no kubeadm configuration.
    pub role: Option<BootRole>,
    /// The join token (`<id>.<secret>`) of a joining machine.
    pub token: Option<String>,
    /// The CA hashes a joining machine pins the cluster CA with.
    pub ca_cert_hashes: Vec<String>,
    /// The cluster CA certificate (PEM) a control-plane machine is given.
    pub ca_cert: Option<String>,
}

impl KubeadmBoot {
    /// Reads a cloud-config or Ignition user-data. An error when the cloud cannot read it.
    pub fn read(user_data: &str) -> Result<KubeadmBoot, String> {
        if user_data.len() > MAX_USER_DATA {
            return Err(format!("the user-data is {} bytes", user_data.len()));
        }
        if let Some(boot) = Self::read_fetch_stub(user_data) {
            return Ok(boot);
        }
        let files = WrittenFiles::read(user_data)?;
        let mut boot = KubeadmBoot {
            ca_cert: files.content(CA_CERT)?,
            ..KubeadmBoot::default()
        };
        for path in [INIT_CONFIG, JOIN_CONFIG] {
            // Ignition cannot write below /run: there the bootstrap script writes the file.
            let content = match files.content(path)? {
                Some(content) => Some(content),
                None => files.written_by_script(path),
            };
            if let Some(content) = content {
                boot.read_kubeadm_config(&content)?;
            }
        }
        Ok(boot)
    }

    fn read_kubeadm_config(&mut self, content: &str) -> Result<(), String> {
        for document in serde_yaml::Deserializer::from_str(content) {
            let document = Value::deserialize(document)
                .map_err(|e| format!("a kubeadm configuration is not YAML: {e}"))?;
            match document["kind"].as_str() {
                Some("InitConfiguration") => self.role = Some(BootRole::Init),
                Some("JoinConfiguration") => {
                    let control_plane = !document["controlPlane"].is_null();
                    self.role = Some(if control_plane {
                        BootRole::ControlPlaneJoin
                    } else {
                        BootRole::Worker
                    });
                    let discovery = &document["discovery"]["bootstrapToken"];
                    self.token = discovery["token"].as_str().map(str::to_owned);
                    self.ca_cert_hashes = (discovery["caCertHashes"].as_array().into_iter())
                        .flatten()
                        .filter_map(|h| h.as_str().map(str::to_owned))
                        .collect();
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A fetch stub (docs/boot-channel.md, "Fetch delivery") names its role in its first
    /// comment and holds the token and the CA hash the render it fetches joins with.
    fn read_fetch_stub(user_data: &str) -> Option<KubeadmBoot> {
        let role = user_data
            .split("# bootplate fetch stub (")
            .nth(1)?
            .split(')')
            .next()?;
        let value = |name: &str| -> Option<String> {
            let after = user_data.split(&format!(" {name}='")).nth(1)?;
            Some(after.split('\'').next()?.to_owned())
        };
        Some(KubeadmBoot {
            role: Some(match role {
                "worker" => BootRole::Worker,
                "control-plane-join" => BootRole::ControlPlaneJoin,
                _ => return None,
            }),
            token: value("T"),
            ca_cert_hashes: value("H").into_iter().collect(),
            ca_cert: None,
        })
    }

    /// The ID of the join token (the part before the dot).
    pub fn token_id(&self) -> Option<&str> {
        Some(self.token.as_deref()?.split_once('.')?.0)
    }
}

/// The files a user-data writes: a cloud-config's `write_files` or an Ignition config's
/// `storage.files`.
enum WrittenFiles {
    CloudConfig(Value),
    Ignition(Value),
}

impl WrittenFiles {
    fn read(user_data: &str) -> Result<WrittenFiles, String> {
        if user_data.trim_start().starts_with('{') {
            let config = serde_json::from_str(user_data)
                .map_err(|e| format!("the user-data is no Ignition config: {e}"))?;
            return Ok(WrittenFiles::Ignition(config));
        }
        let config = serde_yaml::from_str(user_data)
            .map_err(|e| format!("the user-data is no cloud-config: {e}"))?;
        Ok(WrittenFiles::CloudConfig(config))
    }

    /// The content of the file written to `path`, decoded.
    fn content(&self, path: &str) -> Result<Option<String>, String> {
        let files = match self {
            WrittenFiles::CloudConfig(c) => &c["write_files"],
            WrittenFiles::Ignition(c) => &c["storage"]["files"],
        };
        let Some(file) = (files.as_array().into_iter())
            .flatten()
            .find(|f| f["path"] == path)
        else {
            return Ok(None);
        };
        let bytes = if matches!(self, WrittenFiles::Ignition(_)) {
            ignition_contents(&file["contents"])
        } else {
            cloud_config_content(file)
        }
        .map_err(|e| format!("{path}: {e}"))?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|e| format!("{path}: not UTF-8: {e}"))
    }
}

impl WrittenFiles {
    /// The text a script among the written files writes to `path` with a quoted here-document
    /// (`cat >PATH <<'MARK'` up to the line `MARK`), as the Flatcar template's bootstrap script
    /// does for the kubeadm configuration.
    fn written_by_script(&self, path: &str) -> Option<String> {
        let files = match self {
            WrittenFiles::CloudConfig(c) => &c["write_files"],
            WrittenFiles::Ignition(c) => &c["storage"]["files"],
        };
        let opening = format!("cat >{path} <<'");
        (files.as_array().into_iter().flatten()).find_map(|file| {
            let path = file["path"].as_str()?;
            let text = self.content(path).ok()??;
            here_document(&text, &opening)
        })
    }
}

/// The body of the first here-document in `script` whose line starts with `opening` (which
/// ends with the quote before the delimiter).
fn here_document(script: &str, opening: &str) -> Option<String> {
    let mut lines = script.lines();
    let mark = lines.find_map(|l| {
        let rest = l.trim_start().strip_prefix(opening)?;
        Some(rest.strip_suffix('\'')?.to_owned())
    })?;
    let mut body = String::new();
    for line in lines {
        if line.trim_end() == mark {
            return Some(body);
        }
        body.push_str(line);
        body.push('\n');
    }
    None
}

fn cloud_config_content(file: &Value) -> Result<Vec<u8>, String> {
    let content = file["content"].as_str().unwrap_or_default();
    match file["encoding"].as_str() {
        None | Some("text/plain") => Ok(content.as_bytes().to_vec()),
        Some("b64" | "base64") => base64_decode(content),
        Some(other) => Err(format!("the cloud does not read encoding {other}")),
    }
}

/// An Ignition file's `contents`: a data URL, percent-encoded or base64, not compressed.
fn ignition_contents(contents: &Value) -> Result<Vec<u8>, String> {
    if let Some(compression) = contents["compression"].as_str().filter(|c| !c.is_empty()) {
        return Err(format!("the cloud does not read compression {compression}"));
    }
    let source = contents["source"].as_str().unwrap_or_default();
    if let Some(data) = source.strip_prefix("data:;base64,") {
        return base64_decode(data);
    }
    let data = source
        .strip_prefix("data:,")
        .ok_or("the cloud reads only data URLs")?;
    Ok(percent_encoding::percent_decode_str(data).collect())
}

fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("not base64: {e}"))
}

/// The join token (`<id>.<secret>`) in a kubeadm user-data, if it holds one.
pub fn join_token(user_data: &str) -> Option<String> {
    KubeadmBoot::read(user_data).ok()?.token
}

/// What the cloud saw when it let a machine boot, recorded in the infrastructure machine's
/// status (`status.boot`) for the scenarios to check. It never holds the token's secret half.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootRecord {
    /// The role the user-data made the machine take; `None` for a machine that is no
    /// Kubernetes node.
    pub role: Option<BootRole>,
    /// The ID of the join token it joined with.
    pub token_id: Option<String>,
    /// Whom the workload apiserver took that token for (`system:bootstrap:<id>`).
    pub authenticated_as: Option<String>,
}

impl BootRecord {
    /// The record in an infrastructure machine's status, when it booted.
    pub fn of(machine: &kube::api::DynamicObject) -> Option<BootRecord> {
        serde_json::from_value(machine.data["status"]["boot"].clone()).ok()
    }
}

/// Checks the user-data of a machine that should take role `expected`: a refusal (why the
/// machine would not join, naming no secret) or what it booted with.
pub async fn check(
    config: &CloudConfig,
    user_data: &str,
    expected: BootRole,
) -> Result<BootRecord, String> {
    let boot = KubeadmBoot::read(user_data)?;
    let role = boot
        .role
        .ok_or("the user-data writes no kubeadm configuration")?;
    if role != expected {
        return Err(format!(
            "the user-data makes the machine {role}, its Machine should be {expected}"
        ));
    }
    if role == BootRole::Init {
        return check_init(config, &boot);
    }
    let (Some(token), Some(token_id)) = (boot.token.as_deref(), boot.token_id()) else {
        return Err("the user-data holds no join token".into());
    };
    let expected_hash = config.cluster_ca.ca_hash();
    if !boot.ca_cert_hashes.contains(&expected_hash) {
        return Err(format!(
            "caCertHashes {:?} do not pin the cluster CA ({expected_hash})",
            boot.ca_cert_hashes
        ));
    }
    let authenticated_as = authenticate(config, token).await;
    if authenticated_as.as_deref() != Some(&format!("system:bootstrap:{token_id}")) {
        return Err(format!(
            "the workload apiserver refused join token {token_id} (took it for {authenticated_as:?})"
        ));
    }
    Ok(BootRecord {
        role: Some(role),
        token_id: Some(token_id.to_owned()),
        authenticated_as,
    })
}

/// An `init` machine holds the cluster CA (it signs the apiserver's certificate with it) and
/// needs no token.
fn check_init(config: &CloudConfig, boot: &KubeadmBoot) -> Result<BootRecord, String> {
    let given = boot.ca_cert.as_deref().map(str::trim);
    if given != Some(config.cluster_ca.cert_pem.trim()) {
        return Err(format!(
            "{CA_CERT} in the user-data is not the cluster CA certificate"
        ));
    }
    Ok(BootRecord {
        role: Some(BootRole::Init),
        ..BootRecord::default()
    })
}

/// Whom the workload apiserver takes bootstrap token `token` for, as a kubelet joining with it
/// is taken; `None` when it refuses the token.
pub(super) async fn authenticate(config: &CloudConfig, token: &str) -> Option<String> {
    let kubeconfig = cloud::workload_kubeconfig(config, "boot", &format!("token: {token}"));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&kubeconfig).ok()?;
    let client_config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .ok()?;
    let client = Client::try_from(client_config).ok()?;
    let reviews: Api<SelfSubjectReview> = Api::all(client);
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?;
    review.status?.user_info?.username
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_a_script_writes_is_read_from_its_here_document() {
        let script = "install -d /run/kubeadm\n(\n  cat >/run/kubeadm/kubeadm.yaml <<'END'\nkind: InitConfiguration\nEND\n)\n";
        let body = here_document(script, "cat >/run/kubeadm/kubeadm.yaml <<'");
        assert_eq!(body.as_deref(), Some("kind: InitConfiguration\n"));
        assert_eq!(here_document(script, "cat >/run/other <<'"), None);
        let unterminated = "cat >/run/kubeadm/kubeadm.yaml <<'END'\nkind: x\n";
        assert_eq!(
            here_document(unterminated, "cat >/run/kubeadm/kubeadm.yaml <<'"),
            None
        );
    }

    fn cloud_config(files: &str) -> String {
        format!("#cloud-config\nwrite_files:\n{files}runcmd: []\n")
    }

    const JOIN: &str = "- path: /run/kubeadm/kubeadm-join-config.yaml\n  content: |\n    apiVersion: kubeadm.k8s.io/v1beta4\n    kind: JoinConfiguration\n    discovery:\n      bootstrapToken:\n        apiServerEndpoint: \"127.0.0.1:6443\"\n        token: \"abcdef.0123456789abcdef\"\n        caCertHashes: [\"sha256:aa\"]\n";

    #[test]
    fn each_kubeadm_shape_reads_as_its_role() {
        let cp_join = format!("{JOIN}    controlPlane:\n      localAPIEndpoint: {{}}\n");
        let init = "- path: /etc/kubernetes/pki/ca.crt\n  content: \"CA\"\n- path: /run/kubeadm/kubeadm.yaml\n  content: |\n    kind: InitConfiguration\n    ---\n    kind: ClusterConfiguration\n";
        let b64 = "- path: /run/kubeadm/kubeadm-join-config.yaml\n  encoding: b64\n  content: a2luZDogSm9pbkNvbmZpZ3VyYXRpb24K\n";
        let cases = [
            (JOIN.to_owned(), Some(BootRole::Worker)),
            (cp_join, Some(BootRole::ControlPlaneJoin)),
            (init.to_owned(), Some(BootRole::Init)),
            (b64.to_owned(), Some(BootRole::Worker)),
            (String::new(), None),
        ];
        for (files, role) in cases {
            let boot = KubeadmBoot::read(&cloud_config(&files)).unwrap();
            assert_eq!(boot.role, role, "{files}");
        }
        let ignition = r#"{"ignition": {"version": "3.4.0"}, "storage": {"files": [
            {"path": "/run/kubeadm/kubeadm-join-config.yaml",
             "contents": {"source": "data:,kind%3A%20JoinConfiguration%0AcontrolPlane%3A%20%7B%7D%0A"}},
            {"path": "/etc/kubernetes/pki/ca.crt", "contents": {"source": "data:;base64,Q0E="}}]}}"#;
        let boot = KubeadmBoot::read(ignition).unwrap();
        assert_eq!(boot.role, Some(BootRole::ControlPlaneJoin));
        assert_eq!(boot.ca_cert.as_deref(), Some("CA"));
    }

    #[test]
    fn a_join_gives_its_token_and_hashes() {
        let boot = KubeadmBoot::read(&cloud_config(JOIN)).unwrap();
        assert_eq!(boot.token.as_deref(), Some("abcdef.0123456789abcdef"));
        assert_eq!(boot.token_id(), Some("abcdef"));
        assert_eq!(boot.ca_cert_hashes, ["sha256:aa"]);
        assert_eq!(
            join_token(&cloud_config(JOIN)).as_deref(),
            Some("abcdef.0123456789abcdef")
        );
    }

    #[test]
    fn what_the_cloud_cannot_read_is_an_error() {
        for user_data in [
            "not: [yaml".to_owned(),
            cloud_config("- path: /run/kubeadm/kubeadm.yaml\n  encoding: gz+b64\n  content: x\n"),
            r#"{"storage": {"files": [{"path": "/run/kubeadm/kubeadm.yaml", "contents": {"source": "https://x"}}]}}"#.to_owned(),
            "a".repeat(MAX_USER_DATA + 1),
        ] {
            assert!(KubeadmBoot::read(&user_data).is_err(), "{user_data:.60}");
        }
    }
}
