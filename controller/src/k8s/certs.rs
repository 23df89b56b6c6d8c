//! The Cluster's certificates: `<cluster>-ca`, `-etcd`, `-proxy`, `-sa` Secrets (`tls.crt`,
//! `tls.key`), read for control-plane roles and generated for `init` when missing and no
//! control-plane provider manages the Cluster. Workers read only the CA certificate, for its hash.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crd_types::capi::{CLUSTER_NAME_LABEL, CLUSTER_SECRET_TYPE, Cluster};
use crd_types::conditions::reason;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use render::{Certificates, KeyPair};

use crate::error::{Error, Result, is_conflict, is_not_found};
use crate::k8s::stores::Stores;
use crate::pki;

/// The four certificate Secrets, by suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Ca,
    Etcd,
    FrontProxy,
    ServiceAccount,
}

impl Purpose {
    const ALL: [Purpose; 4] = [
        Purpose::Ca,
        Purpose::Etcd,
        Purpose::FrontProxy,
        Purpose::ServiceAccount,
    ];

    fn suffix(self) -> &'static str {
        match self {
            Purpose::Ca => "ca",
            Purpose::Etcd => "etcd",
            Purpose::FrontProxy => "proxy",
            Purpose::ServiceAccount => "sa",
        }
    }

    fn generate(self, cluster: &str) -> Result<KeyPair> {
        let generated = match self {
            Purpose::Ca => pki::generate_ca("kubernetes"),
            Purpose::Etcd => pki::generate_ca("etcd-ca"),
            Purpose::FrontProxy => pki::generate_ca("front-proxy-ca"),
            Purpose::ServiceAccount => pki::generate_service_account_key(),
        };
        generated.map_err(|e| {
            Error::failed(
                reason::CERTIFICATES_ERROR,
                format!(
                    "cannot generate the {} of Cluster {cluster}: {e}",
                    self.suffix()
                ),
            )
        })
    }
}

/// The certificate Secrets a render for `role` reads: all four for the control-plane roles,
/// `<cluster>-ca` alone (for its hash) for workers.
pub(crate) fn secret_names(cluster: &str, role: crd_types::Role) -> Vec<String> {
    if role.is_control_plane() {
        Purpose::ALL
            .iter()
            .map(|purpose| secret_name(cluster, *purpose))
            .collect()
    } else {
        vec![secret_name(cluster, Purpose::Ca)]
    }
}

fn secret_name(cluster: &str, purpose: Purpose) -> String {
    format!("{cluster}-{}", purpose.suffix())
}

fn key_pair_of(
    secret: &Secret,
    namespace: &str,
    purpose: Purpose,
    with_key: bool,
) -> Result<KeyPair> {
    let name = secret.name_any();
    let field = |key: &str| -> Result<String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| {
                Error::failed(
                    reason::CERTIFICATES_ERROR,
                    format!("Secret {namespace}/{name}: key `{key}` missing"),
                )
            })?;
        String::from_utf8(bytes.0.clone()).map_err(|_| {
            Error::failed(
                reason::CERTIFICATES_ERROR,
                format!("Secret {namespace}/{name}: key `{key}` is not PEM text"),
            )
        })
    };
    let pair = KeyPair {
        cert: field("tls.crt")?,
        key: if with_key {
            field("tls.key")?
        } else {
            String::new()
        },
    };
    let checked = if with_key {
        pki::check_key_pair(&pair)
    } else if purpose == Purpose::ServiceAccount {
        Ok(())
    } else {
        pki::ca_cert_hash(&pair.cert).map(drop)
    };
    checked.map_err(|e| {
        Error::failed(
            reason::CERTIFICATES_ERROR,
            format!("Secret {namespace}/{name}: not a valid certificate and key: {e}"),
        )
    })?;
    Ok(pair)
}

/// A cluster CA certificate: its PEM (the boot reporter trusts it) and the hash joining
/// machines pin.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CaCert {
    /// `sha256:<hex>`.
    pub hash: String,
    /// The certificate, PEM.
    pub pem: String,
}

/// CA certificates by `<cluster>-ca` Secret (namespace, name), with the resourceVersion they
/// were read from: a worker's reconcile reads the Secret only when it changed.
#[derive(Default)]
pub struct CaHashes {
    hashes: Mutex<HashMap<(String, String), (String, CaCert)>>,
}

impl CaHashes {
    /// The CA read from resourceVersion `version` of Cluster `cluster`'s CA Secret.
    pub(crate) fn cached(&self, namespace: &str, cluster: &str, version: &str) -> Option<CaCert> {
        let key = (namespace.to_owned(), secret_name(cluster, Purpose::Ca));
        let hashes = self.hashes.lock().expect("lock");
        let (cached_version, ca) = hashes.get(&key)?;
        (cached_version == version).then(|| ca.clone())
    }

    /// Remembers the CA of resourceVersion `version` of Cluster `cluster`'s CA Secret.
    pub(crate) fn remember(&self, namespace: &str, cluster: &str, version: &str, ca: CaCert) {
        let key = (namespace.to_owned(), secret_name(cluster, Purpose::Ca));
        let value = (version.to_owned(), ca);
        self.hashes.lock().expect("lock").insert(key, value);
    }

    /// Forgets the CA of a deleted Cluster.
    pub(crate) fn forget(&self, namespace: &str, cluster: &str) {
        let key = (namespace.to_owned(), secret_name(cluster, Purpose::Ca));
        self.hashes.lock().expect("lock").remove(&key);
    }
}

/// The cluster CA for join data (its hash, `sha256:<hex of the CA's SubjectPublicKeyInfo
/// hash>`) and the boot reporter (its PEM). Reads only `tls.crt` of `<cluster>-ca`: a worker
/// never touches a private key. When the Secret is in the metadata store (`stores`, CAPI labels
/// it with the cluster's name), what was read for its current resourceVersion is reused
/// without reading it.
pub(crate) async fn ca_cert(
    client: &Client,
    stores: &Stores,
    cache: &CaHashes,
    cluster: &Cluster,
) -> Result<CaCert> {
    let namespace = cluster.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let name = secret_name(&cluster_name, Purpose::Ca);
    if let Some(version) = stores.secret_version(&namespace, &name)
        && let Some(hash) = cache.cached(&namespace, &cluster_name, &version)
    {
        return Ok(hash);
    }
    let secret = get(client, &namespace, &name).await?.ok_or_else(|| {
        Error::waiting(
            reason::CERTIFICATES_ERROR,
            format!("Secret {namespace}/{name} (the cluster CA) not found"),
        )
    })?;
    let pair = key_pair_of(&secret, &namespace, Purpose::Ca, false)?;
    let hash = pki::ca_cert_hash(&pair.cert).map_err(|e| {
        Error::failed(
            reason::CERTIFICATES_ERROR,
            format!("Secret {namespace}/{name}: key `tls.crt` is not a certificate: {e}"),
        )
    })?;
    let ca = CaCert {
        hash,
        pem: pair.cert,
    };
    if let Some(version) = secret.resource_version() {
        cache.remember(&namespace, &cluster_name, &version, ca.clone());
    }
    Ok(ca)
}

/// All four key pairs for a control-plane machine. With `generate` (the `init` machine of a
/// Cluster without a control-plane provider), missing ones are created, owned by the Cluster.
pub(crate) async fn control_plane(
    client: &Client,
    cluster: &Cluster,
    generate: bool,
) -> Result<Certificates> {
    let namespace = cluster.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let mut pairs = Vec::with_capacity(4);
    for purpose in Purpose::ALL {
        let name = secret_name(&cluster_name, purpose);
        let pair = match get(client, &namespace, &name).await? {
            Some(secret) => key_pair_of(&secret, &namespace, purpose, true)?,
            None if generate => create(client, cluster, purpose).await?,
            None => {
                return Err(Error::waiting(
                    reason::CERTIFICATES_ERROR,
                    format!("Secret {namespace}/{name} not found"),
                ));
            }
        };
        pairs.push(pair);
    }
    let mut pairs = pairs.into_iter();
    let mut next = || pairs.next().expect("four pairs");
    Ok(Certificates {
        ca: next(),
        etcd: next(),
        front_proxy: next(),
        service_account: next(),
    })
}

async fn get(client: &Client, namespace: &str, name: &str) -> Result<Option<Secret>> {
    match Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
    {
        Ok(secret) => Ok(Some(secret)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn create(client: &Client, cluster: &Cluster, purpose: Purpose) -> Result<KeyPair> {
    let namespace = cluster.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let name = secret_name(&cluster_name, purpose);
    let pair = purpose.generate(&cluster_name)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.into(),
                cluster_name.clone(),
            )])),
            owner_references: cluster.controller_owner_ref(&()).map(|mut r| {
                r.controller = Some(false);
                vec![r]
            }),
            ..Default::default()
        },
        type_: Some(CLUSTER_SECRET_TYPE.into()),
        data: Some(BTreeMap::from([
            (
                "tls.crt".to_owned(),
                ByteString(pair.cert.clone().into_bytes()),
            ),
            (
                "tls.key".to_owned(),
                ByteString(pair.key.clone().into_bytes()),
            ),
        ])),
        ..Default::default()
    };
    let api = Api::<Secret>::namespaced(client.clone(), &namespace);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(pair),
        // Someone else created it in the meantime: use theirs.
        Err(e) if is_conflict(&e) => {
            let theirs = api.get(&name).await?;
            key_pair_of(&theirs, &namespace, purpose, true)
        }
        Err(e) => Err(e.into()),
    }
}
