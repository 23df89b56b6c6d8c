//! A watch on the workload cluster's bootstrap tokens that checks, at every deletion, that the
//! data Secret of a MachinePool's config no longer hands out the deleted token (a pool's
//! replaced token goes only after its Secret holds the new one) and that the token had expired
//! (an instance started from an older copy of the user-data can join until then).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;

use super::pool::join_token;
use super::{CapiEnv, NS};

/// What the watch saw.
#[derive(Clone, Debug, Default)]
pub struct TokenHistory {
    /// The token IDs that exist now.
    pub live: BTreeSet<String>,
    /// The most tokens that existed at once.
    pub most_live: usize,
    /// The deleted token IDs, in order.
    pub deleted: Vec<String>,
    /// Deleted tokens the data Secret still held when their deletion was seen.
    pub deleted_while_handed_out: Vec<String>,
    /// Deleted tokens whose `expiration` was still ahead when their deletion was seen.
    pub deleted_before_expiry: Vec<String>,
}

/// The running watch; stopped on drop.
pub struct TokenWatch {
    history: Arc<Mutex<TokenHistory>>,
    task: JoinHandle<()>,
}

impl TokenWatch {
    /// Watches the tokens of `env`'s workload cluster against the data Secret `data_secret`.
    pub fn start(env: &CapiEnv, data_secret: &str) -> TokenWatch {
        let tokens: Api<Secret> = Api::namespaced(env.workload_client.clone(), "kube-system");
        let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
        let history = Arc::new(Mutex::new(TokenHistory::default()));
        let record = history.clone();
        let data_secret = data_secret.to_owned();
        let task = tokio::spawn(async move {
            let config = watcher::Config::default().fields("type=bootstrap.kubernetes.io/token");
            let mut events = watcher(tokens, config).default_backoff().boxed();
            let mut listing = BTreeSet::new();
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                match event {
                    watcher::Event::Init => listing.clear(),
                    watcher::Event::InitApply(secret) => {
                        listing.insert(token_id(&secret));
                    }
                    watcher::Event::InitDone => {
                        let mut history = record.lock().unwrap();
                        history.live = std::mem::take(&mut listing);
                        history.most_live = history.most_live.max(history.live.len());
                    }
                    watcher::Event::Apply(secret) => {
                        let mut history = record.lock().unwrap();
                        history.live.insert(token_id(&secret));
                        history.most_live = history.most_live.max(history.live.len());
                    }
                    watcher::Event::Delete(secret) => {
                        let id = token_id(&secret);
                        let held = handed_out(&secrets, &data_secret).await;
                        let mut history = record.lock().unwrap();
                        history.live.remove(&id);
                        if held.as_deref() == Some(id.as_str()) {
                            history.deleted_while_handed_out.push(id.clone());
                        }
                        if still_valid(&secret) {
                            history.deleted_before_expiry.push(id.clone());
                        }
                        history.deleted.push(id);
                    }
                }
            }
        });
        TokenWatch { history, task }
    }

    /// What the watch saw so far.
    pub fn history(&self) -> TokenHistory {
        self.history.lock().unwrap().clone()
    }
}

impl Drop for TokenWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The token ID of a token Secret (`bootstrap-token-<id>`).
fn token_id(secret: &Secret) -> String {
    let name = secret.name_any();
    name.strip_prefix("bootstrap-token-")
        .unwrap_or(&name)
        .to_owned()
}

/// Whether token Secret `secret` has an `expiration` that is still ahead (a token without one
/// never expires, and counts as valid).
fn still_valid(secret: &Secret) -> bool {
    let expiration = (secret.data.as_ref())
        .and_then(|d| d.get("expiration"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    match expiration {
        None => true,
        Some(text) => text
            .parse::<k8s_openapi::jiff::Timestamp>()
            .is_ok_and(|expires| expires > k8s_openapi::jiff::Timestamp::now()),
    }
}

/// The ID of the token the data Secret `name` hands out now, if any.
pub async fn handed_out(secrets: &Api<Secret>, name: &str) -> Option<String> {
    let secret = secrets.get_opt(name).await.ok()??;
    let user_data = secret.data?.get("value")?.0.clone();
    let token = join_token(&String::from_utf8(user_data).ok()?)?;
    Some(token.split_once('.')?.0.to_owned())
}
