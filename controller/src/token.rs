//! Bootstrap tokens in the workload cluster: `kube-system/bootstrap-token-<id>`.
//!
//! A config's token is named after the config's UID and labelled with it, so a restarted
//! controller finds and reuses the token it created before instead of minting a second one.

use std::collections::BTreeMap;
use std::time::Duration;

use crd_types::conditions::reason;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use rand::Rng;

use crate::error::{Error, Result, is_conflict, is_not_found};
use crate::labels;

/// The namespace bootstrap tokens live in.
pub const NAMESPACE: &str = "kube-system";
/// The Secret type of bootstrap tokens.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group kubeadm's join RBAC is bound to.
pub const GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// What happened to a config's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenAction {
    /// A new token was created.
    Created,
    /// The existing token's expiry was extended.
    Refreshed,
    /// The existing token is still good.
    Reused,
}

/// A bootstrap token, `<id>.<secret>`. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The public part.
    pub id: String,
    secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}.<redacted>)", self.id)
    }
}

impl Token {
    /// A fresh random token: 6 + 16 characters of `[a-z0-9]`, as kubeadm requires.
    pub fn generate() -> Token {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::rng();
        let mut pick = |n: usize| -> String {
            (0..n)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect()
        };
        Token {
            id: pick(6),
            secret: pick(16),
        }
    }

    /// A stand-in of the same shape, for a trial render before a real token is made.
    pub fn placeholder() -> Token {
        Token {
            id: "000000".into(),
            secret: "0000000000000000".into(),
        }
    }

    /// `<id>.<secret>`, what `kubeadm join --token` takes.
    pub fn expose(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

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
pub async fn ensure(
    workload: &Client,
    config_uid: &str,
    config_key: &str,
    ttl: Duration,
    first: bool,
) -> Result<(Token, TokenAction, Timestamp)> {
    let api: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    let now = Timestamp::now();
    let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::from_secs(900));
    let derived = derived_id(config_uid);
    let derived_name = format!("bootstrap-token-{derived}");
    if first {
        let token = Token {
            id: derived,
            ..Token::generate()
        };
        let expires = expiry(now, ttl);
        match api
            .create(
                &PostParams::default(),
                &token_secret(&token, config_uid, config_key, expires.to_string()),
            )
            .await
        {
            Ok(_) => return Ok((token, TokenAction::Created, expires)),
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
    let token = Token::generate();
    let expires = expiry(now, ttl);
    api.create(
        &PostParams::default(),
        &token_secret(&token, config_uid, config_key, expires.to_string()),
    )
    .await
    .map_err(workload_error)?;
    Ok((token, TokenAction::Created, expires))
}

/// Whether a token expiring at `expires` has less than half of its lifetime `ttl` left at
/// `now`: then it is extended (and a render that relied on it looks at it again).
pub fn past_half_life(expires: Timestamp, now: Timestamp, ttl: SignedDuration) -> bool {
    expires.duration_since(now) * 2 < ttl
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

/// The token in `secret` when it is still usable, extended when less than half of `ttl` is
/// left; `None` when it is malformed or expired (the token cleaner deletes it).
async fn keep_or_refresh(
    api: &Api<Secret>,
    secret: &Secret,
    now: Timestamp,
    ttl: SignedDuration,
) -> Result<Option<(Token, TokenAction, Timestamp)>> {
    let (Some(id), Some(token_secret)) = (
        string_data(secret, "token-id"),
        string_data(secret, "token-secret"),
    ) else {
        return Ok(None);
    };
    let expiration = string_data(secret, "expiration")
        .and_then(|e| e.parse::<Timestamp>().ok())
        .unwrap_or(now);
    let token = Token {
        id,
        secret: token_secret,
    };
    if expiration <= now {
        return Ok(None);
    }
    if !past_half_life(expiration, now, ttl) {
        return Ok(Some((token, TokenAction::Reused, expiration)));
    }
    let expires = expiry(now, ttl);
    let patch = serde_json::json!({
        "stringData": { "expiration": expires.to_string() }
    });
    api.patch(
        &format!("bootstrap-token-{}", token.id),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(workload_error)?;
    Ok(Some((token, TokenAction::Refreshed, expires)))
}

/// A token ID (6 characters of `[a-z0-9]`) derived from the config's UID. Token IDs are the
/// public half of a token (they name its Secret); the secret half stays random.
fn derived_id(config_uid: &str) -> String {
    use sha2::Digest;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    sha2::Sha256::digest(config_uid.as_bytes())
        .iter()
        .take(6)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

fn expiry(now: Timestamp, ttl: SignedDuration) -> Timestamp {
    (now + ttl)
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or(now + ttl)
}

fn token_secret(token: &Token, config_uid: &str, config_key: &str, expiration: String) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        ("token-id", token.id.clone()),
        ("token-secret", token.secret.clone()),
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
            name: Some(format!("bootstrap-token-{}", token.id)),
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

/// Deletes the config's tokens (the Machine joined, or the config is gone). Returns how many.
pub async fn delete(workload: &Client, config_uid: &str) -> Result<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_have_the_kubeadm_shape() {
        let token = Token::generate();
        let exposed = token.expose();
        let (id, secret) = exposed.split_once('.').unwrap();
        assert_eq!(id.len(), 6);
        assert_eq!(secret.len(), 16);
        assert!(
            exposed
                .chars()
                .all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_ne!(Token::generate(), token, "tokens are random");
        assert!(
            !format!("{token:?}").contains(secret),
            "Debug never shows the secret part"
        );
    }

    #[test]
    fn a_token_is_past_half_life_with_less_than_half_its_ttl_left() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let ttl = SignedDuration::from_mins(15);
        let in_mins = |m: i64| now + SignedDuration::from_mins(m);
        assert!(!past_half_life(in_mins(15), now, ttl));
        assert!(!past_half_life(in_mins(8), now, ttl));
        assert!(past_half_life(in_mins(7), now, ttl));
        assert!(past_half_life(in_mins(-1), now, ttl), "expired");
    }

    #[test]
    fn derived_ids_have_the_kubeadm_shape_and_depend_on_the_uid() {
        let id = derived_id("0f8fad5b-d9cb-469f-a165-70867728950e");
        assert_eq!(id.len(), 6);
        assert!(
            id.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_eq!(id, derived_id("0f8fad5b-d9cb-469f-a165-70867728950e"));
        assert_ne!(id, derived_id("7c9e6679-7425-40de-944b-e07fc1f90ae7"));
    }
}
