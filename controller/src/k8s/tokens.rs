//! Bootstrap token Secrets in the workload cluster: `kube-system/bootstrap-token-<id>`.
//!
//! A config's token is named after the config's UID and labelled with it, so a restarted
//! controller finds and reuses the token it created before instead of minting a second one.
//! What to do with a token found is the core's verdict ([`token::assess`]).

use std::collections::BTreeMap;

use crd_types::conditions::reason;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::core::token::{
    self, Found, NAMESPACE, PoolToken, SECRET_TYPE, Token, TokenAction, Verdict,
};
use crate::error::{Error, Result, is_conflict, is_not_found};
use crate::labels;

/// A token this config can use, what was done to it, and when it expires.
pub(crate) type Ensured = (Token, TokenAction, Timestamp);

fn workload_error(e: kube::Error) -> Error {
    // The message of an API error names the URL and the status, never the token.
    Error::waiting(
        reason::BOOTSTRAP_TOKEN_ERROR,
        format!("workload cluster: cannot manage bootstrap tokens: {e}"),
    )
}

fn selector(config_uid: &str) -> String {
    format!("{}={config_uid}", labels::TOKEN_CONFIG_UID)
}

fn string_data(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
}

/// Ensures the config has a valid token in the workload cluster and returns it with what
/// was done and when it now expires: reuses the existing one, extends it once it is due (half of
/// `ttl` or less left, [`token::due`]), or creates one.
///
/// `first`: the config was never rendered (no ready status, no data Secret), so it has no token
/// but one whose creation was interrupted. Then the token is created at once under an ID
/// derived from the config's UID (one request instead of a listing and a create).
///
/// Otherwise the token is looked up by that derived name first (one GET, where a listing by
/// label makes the apiserver filter every Secret of `kube-system`), and only when it is not
/// there, not this config's or no longer usable, by the listing: a config whose derived name
/// was taken (by another config's token, by chance) has its token under a random ID.
pub(crate) async fn ensure(
    workload: &Client,
    config_uid: &str,
    config_key: &str,
    ttl: SignedDuration,
    first: bool,
) -> Result<Ensured> {
    let api: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    let now = Timestamp::now();
    let derived_name = id_secret_name(&token::derived_id(config_uid));
    if first && let Some(created) = create_derived(&api, config_uid, config_key, now, ttl).await? {
        return Ok(created);
    }
    let by_name = read_twice(|| api.get_opt(&derived_name))
        .await
        .map_err(workload_error)?;
    if let Some(secret) = by_name.filter(|s| belongs_to(s, config_uid))
        && let Some(found) = keep_or_refresh(&api, &secret, now, ttl).await?
    {
        return Ok(found);
    }
    let params = ListParams::default().labels(&selector(config_uid));
    let listed = read_twice(|| api.list(&params))
        .await
        .map_err(workload_error)?;
    for secret in listed.items.iter().filter(|s| s.name_any() != derived_name) {
        if let Some(found) = keep_or_refresh(&api, secret, now, ttl).await? {
            return Ok(found);
        }
    }
    create(&api, Token::generate(), config_uid, config_key, now, ttl)
        .await
        .map_err(workload_error)
}

/// The token a MachinePool's config renders with, and the config's other tokens to delete once
/// the data Secret holds it ([`token::stale`]: those that no longer work).
pub(crate) struct PoolEnsured {
    /// The token, what was done to it, and when it expires.
    pub ensured: Ensured,
    /// The IDs of the config's other tokens that no longer work; a replaced one that still
    /// works stays until it expires.
    pub replaced: Vec<String>,
}

/// Ensures a MachinePool's config has a young token in the workload cluster: the one it has
/// ([`token::pool_token`]), or a new one. A pool's token is rotated, never extended (see
/// [`PoolToken`]). `first`: as for [`ensure`], the config was never rendered, and its first
/// token is created at once under the ID derived from its UID.
pub(crate) async fn ensure_pool(
    workload: &Client,
    config_uid: &str,
    config_key: &str,
    ttl: SignedDuration,
    first: bool,
) -> Result<PoolEnsured> {
    let api: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    let now = Timestamp::now();
    if first && let Some(ensured) = create_derived(&api, config_uid, config_key, now, ttl).await? {
        let replaced = Vec::new();
        return Ok(PoolEnsured { ensured, replaced });
    }
    let params = ListParams::default().labels(&selector(config_uid));
    let listed = read_twice(|| api.list(&params))
        .await
        .map_err(workload_error)?;
    let tokens: Vec<(String, Option<Token>, Option<String>)> = listed
        .items
        .iter()
        .map(|secret| {
            let id = secret_name_id(&secret.name_any());
            (id, stored_token(secret), string_data(secret, "expiration"))
        })
        .collect();
    // A Secret without both token parts cannot be used: its expiry counts as unreadable.
    let found: Vec<Found<'_>> = tokens
        .iter()
        .map(|(id, token, expiration)| Found {
            id,
            expiration: token.as_ref().map_or(Some(""), |_| expiration.as_deref()),
        })
        .collect();
    let (ensured, in_use) = match token::pool_token(&found, now, ttl) {
        PoolToken::Use(index, expires) => {
            let token = tokens[index]
                .1
                .clone()
                .expect("a usable token has both parts");
            let id = token.id.clone();
            ((token, TokenAction::Reused, expires), id)
        }
        PoolToken::Create { rotation } => {
            let (token, _, expires) =
                create(&api, Token::generate(), config_uid, config_key, now, ttl)
                    .await
                    .map_err(workload_error)?;
            let action = if rotation {
                TokenAction::Rotated
            } else {
                TokenAction::Created
            };
            let id = token.id.clone();
            ((token, action, expires), id)
        }
    };
    let replaced = token::stale(&found, &in_use, now, ttl)
        .into_iter()
        .map(str::to_owned)
        .collect();
    Ok(PoolEnsured { ensured, replaced })
}

/// The token a token Secret holds, when it has both parts.
fn stored_token(secret: &Secret) -> Option<Token> {
    let mut token = Token::from_parts(
        string_data(secret, "token-id")?,
        string_data(secret, "token-secret")?,
    );
    token.secret_uid = secret.uid();
    let groups = string_data(secret, "auth-extra-groups").unwrap_or_default();
    let config_uid = secret.labels().get(labels::TOKEN_CONFIG_UID);
    token.scoped = config_uid.is_some_and(|uid| token::names_config(&groups, uid));
    Some(token)
}

/// The token ID of Secret `name` (`bootstrap-token-<id>`).
fn secret_name_id(name: &str) -> String {
    name.strip_prefix("bootstrap-token-")
        .unwrap_or(name)
        .to_owned()
}

/// Creates the first token of a config never rendered, under the ID derived from its UID;
/// `None` when that name is taken (an interrupted creation, or another config's token).
async fn create_derived(
    api: &Api<Secret>,
    config_uid: &str,
    config_key: &str,
    now: Timestamp,
    ttl: SignedDuration,
) -> Result<Option<Ensured>> {
    let token = Token::derived(config_uid);
    match create(api, token, config_uid, config_key, now, ttl).await {
        Ok(created) => Ok(Some(created)),
        Err(e) if is_conflict(&e) => Ok(None),
        Err(e) => Err(workload_error(e)),
    }
}

/// Creates `token` in the workload cluster.
async fn create(
    api: &Api<Secret>,
    token: Token,
    config_uid: &str,
    config_key: &str,
    now: Timestamp,
    ttl: SignedDuration,
) -> kube::Result<Ensured> {
    let expires = token::expiry(now, ttl);
    let secret = token_secret(&token, config_uid, config_key, expires.to_string());
    let created = api.create(&PostParams::default(), &secret).await?;
    let mut token = token;
    token.secret_uid = created.uid();
    token.scoped = token::config_group(config_uid).is_some();
    Ok((token, TokenAction::Created, expires))
}

/// Runs a read, and once more on a connection error: a read is safe to repeat, and one retry
/// rides over a pooled connection the server closed.
async fn read_twice<T, F, Fut>(read: F) -> kube::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    match read().await {
        Err(kube::Error::Service(_) | kube::Error::HyperError(_)) => read().await,
        other => other,
    }
}

/// Whether token Secret `secret` carries the label of config `config_uid`.
fn belongs_to(secret: &Secret, config_uid: &str) -> bool {
    secret
        .labels()
        .get(labels::TOKEN_CONFIG_UID)
        .map(String::as_str)
        == Some(config_uid)
}

/// The token in `secret` when it is usable, extended when the core says so; `None` when it is
/// malformed or expired (the token cleaner deletes it).
async fn keep_or_refresh(
    api: &Api<Secret>,
    secret: &Secret,
    now: Timestamp,
    ttl: SignedDuration,
) -> Result<Option<Ensured>> {
    let Some(token) = stored_token(secret) else {
        return Ok(None);
    };
    let expiration = string_data(secret, "expiration");
    match token::assess(expiration.as_deref(), now, ttl) {
        Verdict::Unusable => Ok(None),
        Verdict::Keep(expires) => Ok(Some((token, TokenAction::Reused, expires))),
        Verdict::Refresh => {
            let expires = token::expiry(now, ttl);
            let patch = serde_json::json!({
                "stringData": { "expiration": expires.to_string() }
            });
            api.patch(
                &secret_name(&token),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(workload_error)?;
            Ok(Some((token, TokenAction::Refreshed, expires)))
        }
    }
}

fn secret_name(token: &Token) -> String {
    id_secret_name(&token.id)
}

/// The name of the Secret of token ID `id`.
fn id_secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

fn token_secret(token: &Token, config_uid: &str, config_key: &str, expiration: String) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        ("token-id", token.id.clone()),
        ("token-secret", token.secret().to_owned()),
        ("expiration", expiration),
        ("usage-bootstrap-signing", "true".into()),
        ("usage-bootstrap-authentication", "true".into()),
        ("auth-extra-groups", token::extra_groups(config_uid)),
        ("description", format!("bootplate token for {config_key}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(token)),
            namespace: Some(NAMESPACE.into()),
            labels: Some(BTreeMap::from([(
                labels::TOKEN_CONFIG_UID.into(),
                config_uid.into(),
            )])),
            annotations: Some(BTreeMap::from([(
                labels::TOKEN_CONFIG.into(),
                config_key.into(),
            )])),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    }
}

/// Deletes the tokens with IDs `ids` (a MachinePool's replaced tokens, once its data Secret
/// holds the new one). Returns how many were still there.
pub(crate) async fn delete_ids(workload: &Client, ids: &[String]) -> Result<usize> {
    let api: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    delete_named(&api, ids.iter().map(|id| id_secret_name(id))).await
}

pub(crate) async fn delete_named(
    api: &Api<Secret>,
    names: impl Iterator<Item = String>,
) -> Result<usize> {
    let mut deleted = 0;
    for name in names {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(workload_error(e)),
        }
    }
    Ok(deleted)
}
