//! What a machine's first boot takes from its user-data, and the checks the test cloud makes
//! before it lets a machine join: the user-data read as the machine runs it and checked against
//! its Machine, Cluster and the Cluster's CA Secrets ([`super::boot_check`]), and, where the
//! cloud plays the kubelets, the join token tried against the workload apiserver as kubeadm's
//! discovery would and an `init` machine's CA compared with the workload apiserver's. Both
//! bootplate's shipped templates and the kubeadm bootstrap provider write kubeadm
//! configurations that kubeadm reads the same way, so the same reading serves both.

use std::fmt;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::boot_check::{self, Expected};
use super::cloud::{self, CloudConfig};
use super::user_data::UserData;

/// The files the kubeadm configuration is written to when no command names one (a joining
/// machine's, the first control-plane machine's), as both providers write them.
const KUBEADM_CONFIGS: [&str; 2] = [
    "/run/kubeadm/kubeadm-join-config.yaml",
    "/run/kubeadm/kubeadm.yaml",
];
/// Where a control-plane machine's user-data puts the cluster CA certificate.
const CA_CERT: &str = "/etc/kubernetes/pki/ca.crt";

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
    /// The workload apiserver a fetch stub fetches its render from (`https://host:port`).
    pub server: Option<String>,
}

impl KubeadmBoot {
    /// Reads a cloud-config, Ignition or script user-data, or a fetch stub. An error when the
    /// cloud cannot read it.
    pub fn read(user_data: &str) -> Result<KubeadmBoot, String> {
        if let Some(boot) = Self::read_fetch_stub(user_data) {
            return Ok(boot);
        }
        Self::of(&UserData::read(user_data)?)
    }

    /// What `data` tells its machine: the configuration the first `kubeadm init|join` it runs
    /// names, else the file either provider writes it to.
    fn of(data: &UserData) -> Result<KubeadmBoot, String> {
        let mut boot = KubeadmBoot {
            ca_cert: data.file(CA_CERT)?,
            ..KubeadmBoot::default()
        };
        let named = boot_check::kubeadm_commands(data)
            .into_iter()
            .map(|c| c.config);
        for path in named.chain(KUBEADM_CONFIGS.map(str::to_owned)) {
            if let Some(content) = data.file(&path)? {
                boot.read_kubeadm_config(&content)?;
                break;
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
        // `NAME='value'` at the start of a word (the first variable starts a line).
        let value = |name: &str| -> Option<String> {
            let pattern = format!("{name}='");
            let (at, _) = user_data.match_indices(&pattern).find(|(at, _)| {
                (user_data[..*at].chars().next_back()).is_none_or(char::is_whitespace)
            })?;
            let after = &user_data[at + pattern.len()..];
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
            server: value("S"),
        })
    }

    /// The ID of the join token (the part before the dot).
    pub fn token_id(&self) -> Option<&str> {
        Some(self.token.as_deref()?.split_once('.')?.0)
    }
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
    /// Whom the workload apiserver took that token for (`system:bootstrap:<id>`), as it said:
    /// to the cloud trying the token (a machine without a host), or in the username of the
    /// CSR the machine's kubelet made with it (a machine on a host).
    pub authenticated_as: Option<String>,
}

impl BootRecord {
    /// The record in an infrastructure machine's status, when it booted.
    pub fn of(machine: &kube::api::DynamicObject) -> Option<BootRecord> {
        serde_json::from_value(machine.data["status"]["boot"].clone()).ok()
    }
}

/// The checks that need no apiserver: a render through [`boot_check::check`]; a fetch stub,
/// whose render stays sealed until its machine fetches it, by its role, the server it fetches
/// from and the CA it pins. A refusal (naming no secret) or what the machine boots with.
pub fn check_render(user_data: &str, expected: &Expected) -> Result<KubeadmBoot, String> {
    let boot = match KubeadmBoot::read_fetch_stub(user_data) {
        Some(stub) => {
            check_stub(&stub, expected)?;
            stub
        }
        None => {
            let data = UserData::read(user_data)?;
            boot_check::check(&data, expected)?;
            KubeadmBoot::of(&data)?
        }
    };
    let role = boot
        .role
        .ok_or("the user-data writes no kubeadm configuration")?;
    if role != expected.role {
        return Err(format!(
            "the user-data makes the machine {role}, its Machine should be {}",
            expected.role
        ));
    }
    if role != BootRole::Init && boot.token_id().is_none() {
        return Err("the user-data holds no join token".into());
    }
    Ok(boot)
}

fn check_stub(stub: &KubeadmBoot, expected: &Expected) -> Result<(), String> {
    let hash = expected.ca_hash()?;
    if !stub.ca_cert_hashes.contains(&hash) {
        return Err(format!(
            "the fetch stub's CA hash {:?} does not pin the cluster CA ({hash})",
            stub.ca_cert_hashes
        ));
    }
    let server = stub.server.as_deref().unwrap_or_default();
    let endpoint = server
        .strip_prefix("https://")
        .map(|s| s.trim_end_matches('/'));
    if endpoint != Some(expected.endpoint.as_str()) {
        return Err(format!(
            "the fetch stub fetches from {server:?}, the Cluster's controlPlaneEndpoint is {}",
            expected.endpoint
        ));
    }
    Ok(())
}

/// Checks the user-data of a machine the cloud boots without a host, playing its kubelet:
/// [`check_render`], then the workload apiserver the cloud plays must be the Cluster's (its CA
/// is the Cluster's), and a joining machine's token must be one it takes for
/// `system:bootstrap:<id>`. A refusal or what the machine booted with.
pub async fn check(
    config: &CloudConfig,
    user_data: &str,
    expected: &Expected,
) -> Result<BootRecord, String> {
    let boot = check_render(user_data, expected)?;
    if expected.ca_hash()? != config.cluster_ca.ca_hash() {
        return Err(format!(
            "the {}-ca Secret is not the CA of the workload apiserver",
            expected.cluster
        ));
    }
    if expected.role == BootRole::Init {
        return check_init(config, &boot);
    }
    let (Some(token), Some(token_id)) = (boot.token.as_deref(), boot.token_id()) else {
        return Err("the user-data holds no join token".into());
    };
    let authenticated_as = authenticate(config, token).await;
    if authenticated_as.as_deref() != Some(&format!("system:bootstrap:{token_id}")) {
        return Err(format!(
            "the workload apiserver refused join token {token_id} (took it for {authenticated_as:?})"
        ));
    }
    Ok(BootRecord {
        role: Some(expected.role),
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
}
