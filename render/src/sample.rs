//! Sample render contexts: clearly fake values for lint, tests and the offline CLI. Nothing
//! here is a usable credential: the "certificates" are not even valid PEM.

use std::collections::BTreeMap;

use crd_types::Role;

use crate::context::{
    Certificates, ClusterInfo, Endpoint, JoinInfo, KeyPair, MachineInfo, Network, RenderContext,
};

/// The sample cluster's name.
pub const SAMPLE_CLUSTER: &str = "sample-cluster";
/// A bootstrap token in the right shape (`[a-z0-9]{6}.[a-z0-9]{16}`) that says what it is.
pub const SAMPLE_TOKEN: &str = "sample.notarealtoken000";
/// A CA hash in the right shape, all zeros.
pub const SAMPLE_CA_HASH: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn sample_pair(what: &str) -> KeyPair {
    KeyPair {
        cert: format!(
            "-----BEGIN CERTIFICATE-----\nSAMPLE {what} CERTIFICATE, NOT REAL\n-----END CERTIFICATE-----\n"
        ),
        key: format!(
            "-----BEGIN PRIVATE KEY-----\nSAMPLE {what} KEY, NOT REAL\n-----END PRIVATE KEY-----\n"
        ),
    }
}

/// Placeholder certificates (PEM-shaped text that says it is fake).
pub fn sample_certificates() -> Certificates {
    Certificates {
        ca: sample_pair("CLUSTER CA"),
        etcd: sample_pair("ETCD CA"),
        front_proxy: sample_pair("FRONT PROXY CA"),
        service_account: sample_pair("SERVICE ACCOUNT"),
    }
}

/// A fixed, clearly fake context for `role`: cluster `sample-cluster` in `default`, endpoint
/// `sample-cluster.example.invalid:6443`, machine `sample-cluster-<role>-0` at `v1.31.0`, join
/// data (not for `init`) with [`SAMPLE_TOKEN`], and placeholder certificates for control-plane
/// roles only, exactly as [`RenderContext::new`] would shape them.
pub fn sample_context(role: Role) -> RenderContext {
    let cluster_labels = BTreeMap::from([(
        crd_types::capi::CLUSTER_NAME_LABEL.to_owned(),
        SAMPLE_CLUSTER.to_owned(),
    )]);
    let mut machine_labels = cluster_labels.clone();
    if role.is_control_plane() {
        machine_labels.insert(
            crd_types::capi::CONTROL_PLANE_LABEL.to_owned(),
            String::new(),
        );
    }
    let endpoint = Endpoint {
        host: format!("{SAMPLE_CLUSTER}.example.invalid"),
        port: 6443,
    };
    RenderContext {
        join: (role != Role::Init).then(|| JoinInfo {
            token: SAMPLE_TOKEN.to_owned(),
            api_server_endpoint: endpoint.address(),
            ca_cert_hashes: vec![SAMPLE_CA_HASH.to_owned()],
        }),
        certs: role.is_control_plane().then(sample_certificates),
        boot_report: None,
        fetch: None,
        cluster: ClusterInfo {
            name: SAMPLE_CLUSTER.to_owned(),
            namespace: "default".to_owned(),
            control_plane_endpoint: endpoint,
            network: Network {
                pods: vec!["192.168.0.0/16".to_owned()],
                services: vec!["10.128.0.0/12".to_owned()],
                service_domain: "cluster.local".to_owned(),
            },
            labels: cluster_labels,
        },
        machine: MachineInfo {
            name: format!("{SAMPLE_CLUSTER}-{role}-0"),
            namespace: "default".to_owned(),
            version: "v1.31.0".to_owned(),
            failure_domain: "fd-1".to_owned(),
            failure_domains: vec!["fd-1".to_owned()],
            labels: machine_labels,
            role,
            pool: false,
        },
    }
}

/// [`sample_context`] of `role` with a fetch target when `role` joins (`init` does not): the
/// sample's apiserver, CA hash and token, payload `bootplate-fetch-sample`, fixed keys. What
/// lint measures as the stub of a template with `delivery: Fetch`.
pub fn sample_fetching_context(role: Role) -> RenderContext {
    let mut ctx = sample_context(role);
    let keys = crate::fetch::PayloadKeys {
        cipher: [0x5a; 32],
        mac: [0xa5; 32],
        iv: [0x3c; 16],
    };
    ctx.fetch = (ctx.join.as_ref())
        .map(|join| join.fetch_target("bootplate-fetch-sample".to_owned(), keys));
    ctx
}

/// The Machines the Cluster API contract allows beyond [`sample_context`]'s, for `role`: one
/// without `spec.version`, one without a failure domain, a cluster whose endpoint is an IPv6
/// address, and (for workers) an instance of a MachinePool. A template that renders for the
/// sample but not for one of these fails on real machines; lint renders each.
pub fn machine_shapes(role: Role) -> Vec<(&'static str, RenderContext)> {
    let base = sample_context(role);
    let mut no_version = base.clone();
    no_version.machine.version.clear();
    let mut no_failure_domain = base.clone();
    no_failure_domain.machine.failure_domain.clear();
    no_failure_domain.machine.failure_domains.clear();
    let mut ipv6 = base.clone();
    ipv6.cluster.control_plane_endpoint.host = "fd00::100".to_owned();
    let address = ipv6.cluster.control_plane_endpoint.address();
    if let Some(join) = &mut ipv6.join {
        join.api_server_endpoint = address;
    }
    let mut shapes = vec![
        ("a Machine without spec.version", no_version),
        ("a Machine without a failure domain", no_failure_domain),
        ("an IPv6 control-plane endpoint", ipv6),
    ];
    if role == Role::Worker {
        let mut pool = base;
        pool.machine.name = format!("{SAMPLE_CLUSTER}-pool-0");
        pool.machine.failure_domain.clear();
        pool.machine.failure_domains = vec!["fd-1".to_owned(), "fd-2".to_owned()];
        pool.machine.pool = true;
        shapes.push(("a MachinePool instance", pool));
    }
    shapes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_shapes_cover_what_the_contract_allows() {
        let worker = machine_shapes(Role::Worker);
        assert_eq!(worker.len(), 4);
        assert!(worker[0].1.machine.version.is_empty());
        assert!(worker[1].1.machine.failure_domains.is_empty());
        assert_eq!(
            worker[2].1.join.as_ref().unwrap().api_server_endpoint,
            "[fd00::100]:6443"
        );
        assert!(worker[3].1.machine.pool);
        assert_eq!(machine_shapes(Role::Init).len(), 3);
    }

    #[test]
    fn shaped_like_render_context_new() {
        assert!(sample_context(Role::Init).join.is_none());
        assert!(sample_context(Role::Init).certs.is_some());
        assert!(sample_context(Role::ControlPlaneJoin).join.is_some());
        assert!(sample_context(Role::Worker).certs.is_none());
        assert_eq!(
            sample_context(Role::Worker)
                .join
                .unwrap()
                .api_server_endpoint,
            "sample-cluster.example.invalid:6443"
        );
    }
}
