//! The render context: everything a template sees, typed.
//!
//! Serialized with camelCase names, so templates read `cluster.controlPlaneEndpoint.host`,
//! `machine.role`, `join.caCertHashes`, `certs.ca.key`, `values.<name>`, `files`.

use std::collections::BTreeMap;

use crd_types::Role;
use crd_types::capi::{Cluster, Machine, MachinePool};
use serde::{Deserialize, Serialize};

/// What the engine renders a template with, minus `values` (built from the template's
/// declarations and the config's variables) and `files` (the config's files).
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RenderContext {
    /// The machine's Cluster.
    pub cluster: ClusterInfo,
    /// The machine itself.
    pub machine: MachineInfo,
    /// How to join the cluster. Absent for `init`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinInfo>,
    /// The cluster's certificates. Only for control-plane roles: a worker's context holds no
    /// private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certs: Option<Certificates>,
    /// Where the machine reports its boot; `None`: no reporter in the user-data. Not seen by
    /// templates (the reporter is the format writers' business).
    #[serde(skip)]
    pub boot_report: Option<BootReport>,
    /// With fetch delivery, where the machine fetches its render and the keys it is sealed
    /// with; `None`: the whole render is the user-data. Not seen by templates.
    #[serde(skip)]
    pub fetch: Option<crate::fetch::Fetch>,
}

/// Where and how a machine reports its boot (docs/boot-channel.md): the workload apiserver,
/// the ConfigMap only this machine's token may write, and that token.
#[derive(Clone, PartialEq)]
pub struct BootReport {
    /// `https://host:port` of the workload cluster's apiserver.
    pub server: String,
    /// PEM of the CA that signs the apiserver's serving certificate.
    pub ca_pem: String,
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// The ConfigMap's `metadata` as JSON (its name, namespace, labels and owner): each report
    /// is a server-side apply of the whole object, so the machine creates its report where the
    /// workload cluster lets it (a shared grant held to its own name by an admission policy),
    /// and patches one made for it elsewhere.
    pub metadata: String,
    /// The machine's bootstrap token, `<id>.<secret>`.
    pub token: String,
    /// Other values the machine was given from Secrets: redacted from the reported output
    /// (each line of 4 or more characters).
    pub secrets: Vec<String>,
    /// The least time between two progress reports, in seconds (a failure and the end are
    /// always sent).
    pub min_interval_seconds: u32,
}

impl std::fmt::Debug for BootReport {
    // The token and the Secret values never reach debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootReport")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("secrets", &self.secrets.len())
            .field("min_interval_seconds", &self.min_interval_seconds)
            .finish()
    }
}

/// The Cluster, as templates see it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// API server endpoint (`host` may be empty before the infrastructure sets it).
    pub control_plane_endpoint: Endpoint,
    /// Networks.
    pub network: Network,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// Host and port. Templates also see `address`: `host:port`, with an IPv6 host bracketed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Endpoint {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: i32,
}

impl Endpoint {
    /// `host:port`, with IPv6 hosts bracketed.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl Serialize for Endpoint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Endpoint", 3)?;
        s.serialize_field("host", &self.host)?;
        s.serialize_field("port", &self.port)?;
        s.serialize_field("address", &self.address())?;
        s.end()
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    // `address` is derived from host and port; a reader ignores it.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            host: String,
            port: i32,
        }
        let wire = Wire::deserialize(deserializer)?;
        Ok(Endpoint {
            host: wire.host,
            port: wire.port,
        })
    }
}

/// Cluster networks.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Pod CIDR blocks.
    pub pods: Vec<String>,
    /// Service CIDR blocks.
    pub services: Vec<String>,
    /// Service DNS domain (default `cluster.local`).
    pub service_domain: String,
}

/// The Machine, or the MachinePool whose instances all boot from one user-data, as templates
/// see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineInfo {
    /// Name: the Machine's (templates use it as the node name), or the pool's (shared by every
    /// instance, so not a node name).
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Kubernetes version, for example `v1.31.2` (empty when none is set).
    pub version: String,
    /// The Machine's failure domain; empty when none, and for a pool (the cloud picks each
    /// instance's).
    pub failure_domain: String,
    /// The failure domains the machine may be in: the Machine's one, or the pool's list.
    pub failure_domains: Vec<String>,
    /// Labels (a pool's: those of its instances' template).
    pub labels: BTreeMap<String, String>,
    /// `init`, `control-plane-join` or `worker`.
    pub role: Role,
    /// The user-data is shared by the instances of a MachinePool: take the node name from the
    /// host, not from `name`.
    pub pool: bool,
}

/// Join data for `control-plane-join` and `worker`.
#[derive(Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JoinInfo {
    /// Bootstrap token, `<id>.<secret>`.
    pub token: String,
    /// `host:port` of the API server.
    pub api_server_endpoint: String,
    /// `sha256:<hex>` hashes of the CA's SubjectPublicKeyInfo.
    pub ca_cert_hashes: Vec<String>,
}

impl JoinInfo {
    /// Where a machine joining with this data fetches its render: the same apiserver, CA hash
    /// and token; the payload named `name`, sealed with `keys`.
    pub fn fetch_target(
        &self,
        name: String,
        keys: crate::fetch::PayloadKeys,
    ) -> crate::fetch::Fetch {
        crate::fetch::Fetch {
            server: format!("https://{}", self.api_server_endpoint),
            ca_hash: self.ca_cert_hashes.first().cloned().unwrap_or_default(),
            token: self.token.clone(),
            name,
            keys,
        }
    }
}

impl std::fmt::Debug for JoinInfo {
    // The token is a credential: never print it, even in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinInfo")
            .field("token", &"<redacted>")
            .field("api_server_endpoint", &self.api_server_endpoint)
            .field("ca_cert_hashes", &self.ca_cert_hashes)
            .finish()
    }
}

/// The cluster's certificates, PEM-encoded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Certificates {
    /// The cluster CA (`<cluster>-ca`).
    pub ca: KeyPair,
    /// The etcd CA (`<cluster>-etcd`).
    pub etcd: KeyPair,
    /// The front-proxy CA (`<cluster>-proxy`).
    pub front_proxy: KeyPair,
    /// The service-account signing key pair (`<cluster>-sa`; `cert` holds the public key).
    pub service_account: KeyPair,
}

/// A PEM certificate (or public key) and its PEM private key.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KeyPair {
    /// Certificate (or public key), PEM.
    pub cert: String,
    /// Private key, PEM.
    pub key: String,
}

impl std::fmt::Debug for KeyPair {
    // Private keys never reach debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("cert", &self.cert)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl RenderContext {
    /// Builds the context of `machine` in `cluster` for `role`. `certs` is dropped for workers
    /// whatever the caller passes: a worker's context never holds a private key.
    pub fn new(
        cluster: &Cluster,
        machine: &Machine,
        role: Role,
        join: Option<JoinInfo>,
        certs: Option<Certificates>,
    ) -> Self {
        Self::with_machine(
            cluster,
            MachineInfo::from_machine(machine, role),
            join,
            certs,
        )
    }

    /// Builds the context of `machine` (a Machine's or a pool's view) in `cluster`, shaped for
    /// its role as [`RenderContext::new`] does.
    pub fn with_machine(
        cluster: &Cluster,
        machine: MachineInfo,
        join: Option<JoinInfo>,
        certs: Option<Certificates>,
    ) -> Self {
        let role = machine.role;
        RenderContext {
            cluster: ClusterInfo::from_cluster(cluster),
            machine,
            join: if role == Role::Init { None } else { join },
            certs: if role.is_control_plane() { certs } else { None },
            boot_report: None,
            fetch: None,
        }
    }
}

impl ClusterInfo {
    /// The template's view of a Cluster.
    pub fn from_cluster(cluster: &Cluster) -> Self {
        let network = cluster.spec.cluster_network.clone().unwrap_or_default();
        let endpoint = cluster
            .spec
            .control_plane_endpoint
            .clone()
            .unwrap_or_default();
        let port = if endpoint.port != 0 {
            endpoint.port
        } else {
            network.api_server_port.unwrap_or(6443)
        };
        ClusterInfo {
            name: cluster.metadata.name.clone().unwrap_or_default(),
            namespace: cluster.metadata.namespace.clone().unwrap_or_default(),
            control_plane_endpoint: Endpoint {
                host: endpoint.host,
                port,
            },
            network: Network {
                pods: network.pods.map(|p| p.cidr_blocks).unwrap_or_default(),
                services: network.services.map(|s| s.cidr_blocks).unwrap_or_default(),
                service_domain: network
                    .service_domain
                    .unwrap_or_else(|| "cluster.local".to_owned()),
            },
            labels: cluster.metadata.labels.clone().unwrap_or_default(),
        }
    }
}

impl MachineInfo {
    /// The template's view of a Machine.
    pub fn from_machine(machine: &Machine, role: Role) -> Self {
        let failure_domain = machine.spec.failure_domain.clone().unwrap_or_default();
        MachineInfo {
            name: machine.metadata.name.clone().unwrap_or_default(),
            namespace: machine.metadata.namespace.clone().unwrap_or_default(),
            version: machine.spec.version.clone().unwrap_or_default(),
            failure_domains: [failure_domain.clone()]
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect(),
            failure_domain,
            labels: machine.labels(),
            role,
            pool: false,
        }
    }

    /// The template's view of a MachinePool: its name, and what `spec.template` gives every
    /// instance (version, labels), with the pool's `spec.failureDomains`.
    pub fn from_pool(pool: &MachinePool, role: Role) -> Self {
        let template = &pool.spec.template;
        MachineInfo {
            name: pool.metadata.name.clone().unwrap_or_default(),
            namespace: pool.metadata.namespace.clone().unwrap_or_default(),
            version: template.spec.version.clone().unwrap_or_default(),
            failure_domain: String::new(),
            failure_domains: pool.spec.failure_domains.clone(),
            labels: template.metadata.labels.clone(),
            role,
            pool: true,
        }
    }
}

#[cfg(test)]
mod endpoint_tests {
    use super::Endpoint;

    #[test]
    fn templates_see_a_ready_made_address() {
        let v4 = Endpoint {
            host: "10.0.0.1".into(),
            port: 6443,
        };
        let v6 = Endpoint {
            host: "fd00::1".into(),
            port: 443,
        };
        let json = |e: &Endpoint| serde_json::to_value(e).unwrap();
        assert_eq!(
            json(&v4),
            serde_json::json!({"host": "10.0.0.1", "port": 6443, "address": "10.0.0.1:6443"})
        );
        assert_eq!(json(&v6)["address"], "[fd00::1]:443");
    }
}

#[cfg(test)]
mod machine_tests {
    use super::*;

    #[test]
    fn a_pool_is_seen_through_its_template_with_every_failure_domain() {
        let pool: MachinePool = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "workers", "namespace": "fleet"},
            "spec": {
                "clusterName": "c1",
                "failureDomains": ["fd-a", "fd-b"],
                "template": {
                    "metadata": {"labels": {"tier": "batch"}},
                    "spec": {"version": "v1.34.2", "clusterName": "c1"},
                },
            },
        }))
        .unwrap();
        let seen = serde_json::to_value(MachineInfo::from_pool(&pool, Role::Worker)).unwrap();
        assert_eq!(
            seen,
            serde_json::json!({
                "name": "workers", "namespace": "fleet", "version": "v1.34.2",
                "failureDomain": "", "failureDomains": ["fd-a", "fd-b"],
                "labels": {"tier": "batch"}, "role": "worker", "pool": true,
            })
        );
    }

    #[test]
    fn a_machine_lists_its_one_failure_domain_or_none() {
        let mut machine = Machine::new("m-0", Default::default());
        let info = MachineInfo::from_machine(&machine, Role::Worker);
        assert!(info.failure_domains.is_empty() && !info.pool);
        machine.spec.failure_domain = Some("fd-a".into());
        let info = MachineInfo::from_machine(&machine, Role::Worker);
        assert_eq!(
            (info.failure_domain.as_str(), info.failure_domains),
            ("fd-a", vec!["fd-a".to_owned()])
        );
    }
}
