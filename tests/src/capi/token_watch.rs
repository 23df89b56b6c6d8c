//! A watch on the workload cluster's bootstrap tokens that checks, at every deletion, that the
//! data Secret of a MachinePool's config no longer hands out the deleted token (a pool's
//! replaced token goes only after its Secret holds the new one) and that the token had expired
//! (an instance started from an older copy of the user-data can join until then). A watch
//! error, or a data Secret it cannot read, ends the watch with the failure recorded: a deletion
//! it did not see must not pass for one that did not happen.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;

use super::boot::join_token;
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
    /// Why the watch stopped before it was dropped; `None` while it runs.
    pub failure: Option<String>,
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
            let failure = watch(tokens, &secrets, &data_secret, &record).await;
            record.lock().unwrap().failure = Some(failure);
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

/// Records what the watch of `tokens` sees into `record` until it fails; returns why.
async fn watch(
    tokens: Api<Secret>,
    secrets: &Api<Secret>,
    data_secret: &str,
    record: &Mutex<TokenHistory>,
) -> String {
    let config = watcher::Config::default().fields("type=bootstrap.kubernetes.io/token");
    let mut events = watcher(tokens, config).boxed();
    let mut listing = BTreeSet::new();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => return format!("the token watch failed: {e}"),
        };
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
                let held = match handed_out(secrets, data_secret).await {
                    Ok(held) => held,
                    Err(e) => return format!("at the deletion of token {id}: {e:#}"),
                };
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
    "the token watch ended".to_owned()
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

/// The ID of the token the data Secret `name` hands out now; `None` when the Secret or its
/// user-data does not exist or holds no token. An error when the Secret cannot be read.
pub async fn handed_out(secrets: &Api<Secret>, name: &str) -> anyhow::Result<Option<String>> {
    let secret = secrets
        .get_opt(name)
        .await
        .with_context(|| format!("reading data Secret {name}"))?;
    let Some(user_data) = secret.and_then(|s| s.data?.get("value").map(|v| v.0.clone())) else {
        return Ok(None);
    };
    let token = join_token(&String::from_utf8_lossy(&user_data));
    Ok(token.and_then(|t| Some(t.split_once('.')?.0.to_owned())))
}
