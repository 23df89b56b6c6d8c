//! Objects the integration tests create. Some play Cluster API: [`owned_config`] sets the
//! ownerReference Cluster API's Machine controller would add, [`cluster`] and [`machine`] are
//! written straight, for the tiers of [`crate::capi_env`] that hold them in chosen states; the
//! real-Cluster-API tier ([`crate::capi`]) uses none of these.

use std::collections::BTreeMap;

use crd_types::capi::{
    ApiEndpoint, Cluster, ClusterNetwork, ClusterSpec, ContractReference, Machine,
    MachineBootstrap, MachineSpec, NetworkRanges,
};
use crd_types::{
    BootplateConfig, BootplateConfigSpec, BootplateConfigTemplate, BootplateConfigTemplateResource,
    BootplateConfigTemplateSpec, BootstrapTemplate, ClusterBootstrapTemplate,
    ClusterBootstrapTemplateSpec, Compression, ConfigFile, DropIn, FileEncoding, FileSource,
    ItemSchema, ObjectMetaTemplate, OsInfo, OutputFormat, Part, PartGenerator, Role, SecretKeyRef,
    TemplateFile, TemplateKind, TemplateRef, TemplateSpec, Unit, ValueType, VariableDecl,
    VariableSchema,
};
use kube::api::ObjectMeta;
use serde_json::json;

/// Object metadata with a name and, when given, a namespace.
pub fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        ..Default::default()
    }
}

/// A Secret `<cluster>-<purpose>` as Cluster API writes it: labelled with its cluster's name,
/// which is how the controller's cache finds (and watches) CA and kubeconfig Secrets.
pub fn cluster_secret_meta(namespace: &str, cluster: &str, purpose: &str) -> ObjectMeta {
    ObjectMeta {
        labels: Some(BTreeMap::from([(
            crd_types::capi::CLUSTER_NAME_LABEL.to_owned(),
            cluster.to_owned(),
        )])),
        ..meta(Some(namespace), &format!("{cluster}-{purpose}"))
    }
}

/// The Secret `<cluster>-<purpose>` of type `cluster.x-k8s.io/secret` holding `data`, as Cluster
/// API (or a control-plane provider) writes a cluster's CA, kubeconfig and key Secrets.
pub fn cluster_secret(
    namespace: &str,
    cluster: &str,
    purpose: &str,
    data: impl IntoIterator<Item = (&'static str, String)>,
) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: cluster_secret_meta(namespace, cluster, purpose),
        string_data: Some(data.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()),
        type_: Some("cluster.x-k8s.io/secret".into()),
        ..Default::default()
    }
}

/// A template spec with every field set, so a round trip shows any pruned field.
pub fn full_template_spec() -> TemplateSpec {
    TemplateSpec {
        os: OsInfo {
            name: "ubuntu".into(),
            version: Some("24.04".into()),
        },
        format: OutputFormat::CloudConfig,
        variables: vec![
            VariableDecl {
                name: "containerdVersion".into(),
                description: Some("containerd package version".into()),
                required: false,
                default: Some(json!("1.7.22")),
                schema: Some(VariableSchema {
                    type_: Some(ValueType::String),
                    enum_: Some(vec![json!("1.7.22"), json!("2.0.0")]),
                    pattern: Some(r"^\d+\.\d+\.\d+$".into()),
                    min_length: Some(1),
                    max_length: Some(32),
                    ..Default::default()
                }),
            },
            VariableDecl {
                name: "ntpServers".into(),
                description: Some("NTP servers".into()),
                required: true,
                default: None,
                schema: Some(VariableSchema {
                    type_: Some(ValueType::Array),
                    items: Some(ItemSchema {
                        type_: ValueType::String,
                    }),
                    ..Default::default()
                }),
            },
            VariableDecl {
                name: "maxPods".into(),
                description: None,
                required: false,
                default: Some(json!(110)),
                schema: Some(VariableSchema {
                    type_: Some(ValueType::Integer),
                    minimum: Some(10.0),
                    maximum: Some(250.0),
                    ..Default::default()
                }),
            },
        ],
        partials: BTreeMap::from([("proxy".to_owned(), "HTTP_PROXY={{values.proxy}}".to_owned())]),
        template: None,
        parts: vec![
            Part {
                name: "install".into(),
                roles: vec![Role::Init, Role::Worker],
                files: vec![TemplateFile {
                    path: "/etc/sysctl.d/99-k8s.conf".into(),
                    permissions: Some("0644".into()),
                    owner: Some("root:root".into()),
                    content: "net.ipv4.ip_forward = 1\n".into(),
                    encoding: Some(FileEncoding::Plain),
                }],
                units: vec![Unit {
                    name: "kubelet.service".into(),
                    enable: Some(true),
                    content: Some("[Service]\nExecStart=/usr/bin/kubelet\n".into()),
                    drop_ins: vec![DropIn {
                        name: "10-proxy.conf".into(),
                        content: "[Service]\n".into(),
                    }],
                }],
                commands: vec!["systemctl daemon-reload".into()],
                generator: None,
                update: Default::default(),
            },
            Part {
                name: "network".into(),
                generator: Some(PartGenerator {
                    name: "cmdb".into(),
                    parameters: json!({"site": "fra", "vlan": 12, "nested": {"a": [1, true]}})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                }),
                ..Default::default()
            },
        ],
        compression: Some(Compression::Gzip),
        max_output_bytes: Some(65536),
        boot_reports: Some(crd_types::BootReports::Enabled),
        delivery: Some(crd_types::Delivery::Inline),
        network: Some(full_network(false)),
        update_policy: Some(crd_types::UpdatePolicy::InPlaceOnly),
    }
}

/// A namespaced template with every field set.
pub fn full_bootstrap_template(namespace: &str, name: &str) -> BootstrapTemplate {
    BootstrapTemplate {
        metadata: meta(Some(namespace), name),
        spec: full_template_spec(),
        status: None,
    }
}

/// A cluster-scoped template with every field set.
pub fn full_cluster_bootstrap_template(name: &str) -> ClusterBootstrapTemplate {
    ClusterBootstrapTemplate {
        metadata: meta(None, name),
        spec: ClusterBootstrapTemplateSpec(full_template_spec()),
        status: None,
    }
}

/// A generator with every field set.
pub fn full_bootstrap_generator(name: &str) -> crd_types::BootstrapGenerator {
    crd_types::BootstrapGenerator::new(
        name,
        crd_types::GeneratorSpec {
            client_config: crd_types::ClientConfig {
                url: None,
                service: Some(crd_types::ServiceReference {
                    namespace: "infra".into(),
                    name: "cmdb".into(),
                    port: Some(8443),
                    path: Some("/v1/generate".into()),
                }),
                ca_bundle: Some(
                    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
                ),
            },
            timeout_seconds: Some(5),
            max_response_bytes: Some(65536),
            max_concurrency: Some(8),
            secrets: crd_types::GeneratorSecrets {
                join_token: true,
                certificates: true,
            },
            allowed_namespaces: vec!["team-a".into(), "team-b".into()],
        },
    )
}

/// A BootstrapGenerator served at `url` (HTTPS, its certificate from `ca_pem`) that configs of
/// the `allowed` namespaces may call, waiting `timeout_seconds` for an answer; it is granted no
/// secret (set `spec.secrets` to grant some).
pub fn bootstrap_generator(
    name: &str,
    url: &str,
    ca_pem: &str,
    timeout_seconds: u32,
    allowed: &[&str],
) -> crd_types::BootstrapGenerator {
    crd_types::BootstrapGenerator::new(
        name,
        crd_types::GeneratorSpec {
            client_config: crd_types::ClientConfig {
                url: Some(url.to_owned()),
                ca_bundle: Some(ca_pem.to_owned()),
                ..Default::default()
            },
            timeout_seconds: Some(timeout_seconds),
            allowed_namespaces: allowed.iter().map(|n| (*n).to_owned()).collect(),
            ..Default::default()
        },
    )
}

/// A config spec with every field set.
pub fn full_config_spec() -> BootplateConfigSpec {
    BootplateConfigSpec {
        template_ref: TemplateRef {
            kind: TemplateKind::ClusterBootstrapTemplate,
            name: "ubuntu-2404".into(),
            namespace: None,
        },
        variables: BTreeMap::from([
            (
                "ntpServers".to_owned(),
                json!(["ntp1.example.com", "ntp2.example.com"]),
            ),
            ("maxPods".to_owned(), json!(200)),
            ("nested".to_owned(), json!({"a": {"b": [1, true, null]}})),
        ]),
        skip_parts: vec!["install".into()],
        files: vec![
            ConfigFile {
                path: "/etc/motd".into(),
                permissions: Some("0644".into()),
                owner: Some("root:root".into()),
                content: Some("aGVsbG8K".into()),
                content_from: None,
                encoding: Some(FileEncoding::Base64),
            },
            ConfigFile {
                path: "/etc/secret.conf".into(),
                permissions: Some("0600".into()),
                owner: None,
                content: None,
                content_from: Some(FileSource {
                    secret: SecretKeyRef {
                        name: "extra".into(),
                        key: "conf".into(),
                        namespace: Some("roundtrip".into()),
                    },
                }),
                encoding: None,
            },
        ],
        pre_commands: vec!["echo pre".into()],
        post_commands: vec!["echo post".into()],
        max_output_bytes: Some(524288),
        network: Some(Box::new(full_network(true))),
        delivery: Some(crd_types::Delivery::Inline),
    }
}

/// A config with every field set.
pub fn full_config(namespace: &str, name: &str) -> BootplateConfig {
    BootplateConfig {
        metadata: meta(Some(namespace), name),
        spec: full_config_spec(),
        status: None,
    }
}

/// A config template with every field set.
pub fn full_config_template(namespace: &str, name: &str) -> BootplateConfigTemplate {
    BootplateConfigTemplate {
        metadata: meta(Some(namespace), name),
        spec: BootplateConfigTemplateSpec {
            template: BootplateConfigTemplateResource {
                metadata: Some(ObjectMetaTemplate {
                    labels: BTreeMap::from([("team".to_owned(), "apps".to_owned())]),
                    annotations: BTreeMap::from([("note".to_owned(), "x".to_owned())]),
                }),
                spec: full_config_spec(),
            },
            update_policy: Some(crd_types::UpdatePolicy::InPlaceOnly),
        },
    }
}

/// A v1beta2 Cluster with its endpoint and networks set.
pub fn cluster(namespace: &str, name: &str) -> Cluster {
    let mut cluster = Cluster::new(
        name,
        ClusterSpec {
            paused: None,
            control_plane_endpoint: Some(ApiEndpoint {
                host: "10.0.0.10".into(),
                port: 6443,
            }),
            cluster_network: Some(ClusterNetwork {
                api_server_port: None,
                pods: Some(NetworkRanges {
                    cidr_blocks: vec!["192.168.0.0/16".into()],
                }),
                services: Some(NetworkRanges {
                    cidr_blocks: vec!["10.96.0.0/12".into()],
                }),
                service_domain: Some("cluster.local".into()),
            }),
            control_plane_ref: None,
            infrastructure_ref: Some(ContractReference {
                api_group: "infrastructure.cluster.x-k8s.io".into(),
                kind: "DockerCluster".into(),
                name: name.into(),
            }),
        },
    );
    cluster.metadata.namespace = Some(namespace.into());
    cluster
}

/// A v1beta2 Machine of `cluster` whose bootstrap config is the `BootplateConfig` `config`.
pub fn machine(
    namespace: &str,
    name: &str,
    cluster: &str,
    control_plane: bool,
    config: &str,
) -> Machine {
    let mut labels = BTreeMap::from([(
        crd_types::capi::CLUSTER_NAME_LABEL.to_owned(),
        cluster.to_owned(),
    )]);
    if control_plane {
        labels.insert(
            crd_types::capi::CONTROL_PLANE_LABEL.to_owned(),
            String::new(),
        );
    }
    let mut machine = Machine::new(
        name,
        MachineSpec {
            cluster_name: cluster.into(),
            bootstrap: MachineBootstrap {
                config_ref: Some(ContractReference {
                    api_group: crd_types::GROUP.into(),
                    kind: "BootplateConfig".into(),
                    name: config.into(),
                }),
                data_secret_name: None,
            },
            infrastructure_ref: ContractReference {
                api_group: "infrastructure.cluster.x-k8s.io".into(),
                kind: "DockerMachine".into(),
                name: name.into(),
            },
            version: Some("v1.31.2".into()),
            failure_domain: Some("zone-a".into()),
        },
    );
    machine.metadata.namespace = Some(namespace.into());
    machine.metadata.labels = Some(labels);
    machine
}

/// Creates a namespace.
pub async fn namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    api.create(
        &Default::default(),
        &Namespace {
            metadata: meta(None, name),
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

/// A config owned by `machine` (playing Cluster API: the ownerReference its Machine controller
/// adds), labelled with its cluster, referencing `template_ref`.
pub fn owned_config(machine: &Machine, template_ref: TemplateRef) -> BootplateConfig {
    use kube::Resource;
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let name = machine
        .spec
        .bootstrap
        .config_ref
        .as_ref()
        .map(|r| r.name.clone())
        .unwrap_or_default();
    let mut config = BootplateConfig::new(
        &name,
        BootplateConfigSpec {
            template_ref,
            ..Default::default()
        },
    );
    config.metadata.namespace = Some(namespace);
    config.metadata.labels = Some(BTreeMap::from([(
        crd_types::capi::CLUSTER_NAME_LABEL.to_owned(),
        machine.spec.cluster_name.clone(),
    )]));
    let mut owner = machine
        .controller_owner_ref(&())
        .expect("a created Machine has a uid");
    owner.controller = Some(true);
    owner.block_owner_deletion = Some(true);
    config.metadata.owner_references = Some(vec![owner]);
    config
}

/// A template spec with a raw script body that shows what the render context held:
/// role, join data, and whether certificates (with private keys) were present.
pub fn probe_template_spec(marker: &str) -> TemplateSpec {
    TemplateSpec {
        os: OsInfo {
            name: "linux".into(),
            version: None,
        },
        format: OutputFormat::Script,
        template: Some(format!(
            "#!/bin/bash\n# {marker}\nrole={{{{machine.role}}}}\nnode={{{{machine.name}}}}\n\
             {{{{#if join}}}}token={{{{join.token}}}}\nendpoint={{{{join.apiServerEndpoint}}}}\n\
             {{{{#each join.caCertHashes}}}}hash={{{{this}}}}\n{{{{/each}}}}{{{{/if}}}}\
             {{{{#if certs}}}}{{{{certs.ca.cert}}}}{{{{certs.ca.key}}}}{{{{certs.etcd.key}}}}{{{{certs.frontProxy.key}}}}{{{{certs.serviceAccount.key}}}}{{{{/if}}}}\n"
        )),
        ..Default::default()
    }
}

/// A network input with every field set; `secrets`: the client key and one CA bundle come from
/// Secrets (a config's), else everything is inline (a template's defaults).
pub fn full_network(secrets: bool) -> crd_types::NetworkConfig {
    let ca = render::network::SAMPLE_CA_PEM;
    let key = if secrets {
        json!({"secret": {"name": "mirror-client", "key": "tls.key"}})
    } else {
        json!({"inline": "-----BEGIN PRIVATE KEY-----\nc2FtcGxl\n-----END PRIVATE KEY-----\n"})
    };
    let second = if secrets {
        json!({"name": "team", "secret": {"name": "team-ca", "key": "ca.crt"}})
    } else {
        json!({"name": "team", "inline": ca})
    };
    serde_json::from_value(json!({
        "registryMirrors": [{"registry": "registry.k8s.io", "endpoints": [{
            "url": "https://mirror.example.com:5000/v2/k8s",
            "overridePath": true,
            "capabilities": ["pull", "resolve"],
            "ca": {"inline": ca},
            "clientCertificate": {"certificate": {"inline": ca}, "key": key},
        }]}],
        "proxy": {"http": "http://proxy.example.com:3128", "https": "http://proxy.example.com:3128",
            "noProxy": [".example.com", "10.0.0.0/8"]},
        "caBundles": [{"name": "corp", "inline": ca}, second],
        "ntpServers": ["ntp.example.com"],
        "imageRepository": "mirror.example.com:5000/k8s",
        "artifacts": [{"name": "kubeadm", "url": "https://files.example.com/kubeadm",
            "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}],
    }))
    .expect("a network input")
}
