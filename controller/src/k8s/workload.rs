//! Clients of workload clusters, built from the Cluster's `<cluster>-kubeconfig` Secret.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crd_types::conditions::reason;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};

use crate::error::{Error, Result, is_not_found};
use crate::k8s::stores::Stores;

/// Cached clients, keyed by the kubeconfig Secret and its resourceVersion: a rotated
/// kubeconfig gets a new client, an unchanged one reuses its connections.
#[derive(Default)]
pub struct WorkloadClients {
    clients: Mutex<HashMap<(String, String), (String, Client)>>,
}

impl WorkloadClients {
    /// Forgets the client of a deleted Cluster.
    pub(crate) fn forget(&self, namespace: &str, cluster: &str) {
        let key = (namespace.to_owned(), cluster.to_owned());
        self.clients.lock().expect("lock").remove(&key);
    }

    #[cfg(test)]
    fn holds(&self, namespace: &str, cluster: &str) -> bool {
        let key = (namespace.to_owned(), cluster.to_owned());
        self.clients.lock().expect("lock").contains_key(&key)
    }

    /// A client of the workload cluster `cluster` in `namespace`. When the kubeconfig Secret
    /// is in the metadata store (CAPI labels it with the cluster's name) and its
    /// resourceVersion is the cached client's, the client is reused without reading it.
    pub async fn client(
        &self,
        management: &Client,
        stores: &Stores,
        namespace: &str,
        cluster: &str,
        timeout: Duration,
    ) -> Result<Client> {
        let secret_name = format!("{cluster}-kubeconfig");
        let key = (namespace.to_owned(), cluster.to_owned());
        if let Some(version) = stores.secret_version(namespace, &secret_name)
            && let Some((cached_version, client)) = self.clients.lock().expect("lock").get(&key)
            && *cached_version == version
        {
            return Ok(client.clone());
        }
        let secrets: Api<Secret> = Api::namespaced(management.clone(), namespace);
        let secret = match secrets.get(&secret_name).await {
            Ok(secret) => secret,
            Err(e) if is_not_found(&e) => {
                return Err(Error::waiting(
                    reason::BOOTSTRAP_TOKEN_ERROR,
                    format!(
                        "Secret {namespace}/{secret_name} (the workload cluster's kubeconfig) not found"
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let version = secret.resource_version().unwrap_or_default();
        if let Some((cached_version, client)) = self.clients.lock().expect("lock").get(&key)
            && *cached_version == version
        {
            return Ok(client.clone());
        }
        let client = build_client(&secret, namespace, &secret_name, timeout).await?;
        self.clients
            .lock()
            .expect("lock")
            .insert(key, (version, client.clone()));
        Ok(client)
    }
}

async fn build_client(
    secret: &Secret,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<Client> {
    let bad = |what: String| {
        Error::failed(
            reason::BOOTSTRAP_TOKEN_ERROR,
            format!("Secret {namespace}/{name}: {what}"),
        )
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .ok_or_else(|| bad("key `value` missing".into()))?;
    let text = std::str::from_utf8(&bytes.0).map_err(|_| bad("key `value` is not UTF-8".into()))?;
    // The parse errors of a kubeconfig never echo credentials, only structure.
    let kubeconfig = Kubeconfig::from_yaml(text)
        .map_err(|e| bad(format!("key `value` is not a kubeconfig: {e}")))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(format!("key `value` is not a usable kubeconfig: {e}")))?;
    with_timeouts(&mut config, timeout);
    Client::try_from(config).map_err(|e| bad(format!("cannot build a client: {e}")))
}

/// Bounds every request to a workload cluster by `timeout`. The read timeout counts from when a
/// request is written, not from when its pooled connection went idle: without the reset, a
/// connection idle for longer than the timeout failed the next request at once.
fn with_timeouts(config: &mut Config, timeout: Duration) {
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config.reset_reader_on_write = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_clients_reset_the_read_timeout_on_write() {
        let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        with_timeouts(&mut config, Duration::from_secs(10));
        assert_eq!(config.read_timeout, Some(Duration::from_secs(10)));
        assert_eq!(config.connect_timeout, Some(Duration::from_secs(10)));
        assert!(config.reset_reader_on_write);
    }

    #[tokio::test]
    async fn caches_forget_deleted_clusters() {
        let clients = WorkloadClients::default();
        let client =
            Client::try_from(Config::new("https://127.0.0.1:6443".parse().unwrap())).unwrap();
        for cluster in ["c1", "c2"] {
            let key = ("ns".to_owned(), cluster.to_owned());
            clients
                .clients
                .lock()
                .unwrap()
                .insert(key, ("1".into(), client.clone()));
        }
        clients.forget("ns", "c1");
        assert!(!clients.holds("ns", "c1"));
        assert!(clients.holds("ns", "c2"));
        let hashes = crate::k8s::certs::CaHashes::default();
        hashes.remember("ns", "c1", "1", "sha256:ab");
        hashes.forget("ns", "c1");
        assert_eq!(hashes.cached("ns", "c1", "1"), None);
    }
}
