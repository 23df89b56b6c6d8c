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
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Client::try_from(config).map_err(|e| bad(format!("cannot build a client: {e}")))
}
