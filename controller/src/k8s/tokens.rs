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

use crate::core::token::{self, GROUP, NAMESPACE, SECRET_TYPE, Token, TokenAction, Verdict};
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
/// was done and when it now expires: reuses the existing one, extends it when less than half of
/// `ttl` is left, or creates one.
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
    let derived = Token::derived(config_uid);
    let derived_name = secret_name(&derived);
    if first {
        match create(&api, derived, config_uid, config_key, now, ttl).await {
            Ok(created) => return Ok(created),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(workload_error(e)),
        }
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
    api.create(&PostParams::default(), &secret).await?;
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
    let (Some(id), Some(token_secret)) = (
        string_data(secret, "token-id"),
        string_data(secret, "token-secret"),
    ) else {
        return Ok(None);
    };
    let token = Token::from_parts(id, token_secret);
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
    format!("bootstrap-token-{}", token.id)
}

fn token_secret(token: &Token, config_uid: &str, config_key: &str, expiration: String) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        ("token-id", token.id.clone()),
        ("token-secret", token.secret().to_owned()),
        ("expiration", expiration),
        ("usage-bootstrap-signing", "true".into()),
        ("usage-bootstrap-authentication", "true".into()),
        ("auth-extra-groups", GROUP.into()),
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

/// Deletes the config's tokens (the Machine joined). Returns how many.
pub(crate) async fn delete(workload: &Client, config_uid: &str) -> Result<usize> {
    let api: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    let existing = api
        .list_metadata(&ListParams::default().labels(&selector(config_uid)))
        .await
        .map_err(workload_error)?;
    let mut deleted = 0;
    for secret in existing.items {
        let Some(name) = secret.metadata.name else {
            continue;
        };
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(workload_error(e)),
        }
    }
    Ok(deleted)
}
