//! Bootstrap tokens: their shape, and what to do with the one a config has.
//!
//! A token Secret's `expiration` decides, as the apiserver's bootstrap authenticator reads it:
//! missing means the token never expires, unparseable means it is expired.

use std::time::Duration;

use crd_types::Role;
use k8s_openapi::jiff::{SignedDuration, Timestamp, Unit};
use rand::Rng;

/// The namespace bootstrap tokens live in.
pub const NAMESPACE: &str = "kube-system";
/// The Secret type of bootstrap tokens.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group kubeadm's join RBAC is bound to.
pub const GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// The group the shared boot report grant is bound to (`k8s::footprint`): only tokens made by
/// a controller that also puts the report admission policy in place carry it.
pub const REPORTS_GROUP: &str = "system:bootstrappers:bootplate:reports";
/// The prefix of the group naming a token's config (its UID follows): the admission policy
/// lets a token write only the report of that config.
pub const CONFIG_GROUP_PREFIX: &str = "system:bootstrappers:bootplate:config:";
/// The longest `--bootstrap-token-ttl`: a token is a credential that lets anyone holding it join
/// a node to the cluster; one that outlives a week is one nobody remembers to revoke.
pub const LONGEST_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest `--bootstrap-token-ttl`: a token is looked at again when half its lifetime is
/// left, so a shorter one would have the controller extend (or rotate) every config's token
/// every few seconds, and leave a booting machine no time to use it.
pub const SHORTEST_TTL: Duration = Duration::from_secs(30);

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A bootstrap token, `<id>.<secret>`. Never printed.
#[derive(Clone)]
pub struct Token {
    /// The public part.
    pub id: String,
    secret: String,
    /// The UID of the workload cluster's Secret that holds it, when known (the owner of the
    /// objects made for it); not part of the token's identity.
    pub(crate) secret_uid: Option<String>,
    /// Its Secret carries its config's group ([`extra_groups`]): the machine may write its
    /// report under the shared grant.
    pub(crate) scoped: bool,
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        (&self.id, &self.secret) == (&other.id, &other.secret)
    }
}

impl Eq for Token {}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}.<redacted>)", self.id)
    }
}

impl Token {
    /// A fresh random token: 6 + 16 characters of `[a-z0-9]`, as kubeadm requires.
    pub fn generate() -> Token {
        let mut rng = rand::rng();
        let mut pick = |n: usize| -> String {
            (0..n)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect()
        };
        Token {
            id: pick(6),
            secret: pick(16),
            secret_uid: None,
            scoped: false,
        }
    }

    /// A fresh token whose ID is derived from the config's UID (see [`derived_id`]).
    pub(crate) fn derived(config_uid: &str) -> Token {
        Token {
            id: derived_id(config_uid),
            ..Token::generate()
        }
    }

    /// The token stored as `id` and `secret`.
    pub(crate) fn from_parts(id: String, secret: String) -> Token {
        Token {
            id,
            secret,
            secret_uid: None,
            scoped: false,
        }
    }

    /// A stand-in of the same shape, for a trial render before a real token is made.
    pub(crate) fn placeholder() -> Token {
        Token {
            id: "000000".into(),
            secret: "0000000000000000".into(),
            secret_uid: None,
            scoped: false,
        }
    }

    /// The secret half, for the token Secret.
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    /// `<id>.<secret>`, what `kubeadm join --token` takes.
    pub fn expose(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

/// The `auth-extra-groups` of config `config_uid`'s tokens: kubeadm's join group, and, when the
/// UID can be part of a group name (the token authenticator refuses a token whose groups do not
/// match `system:bootstrappers:[a-z0-9:-]*`), the shared report group and the config's own.
pub(crate) fn extra_groups(config_uid: &str) -> String {
    match config_group(config_uid) {
        Some(own) => format!("{GROUP},{REPORTS_GROUP},{own}"),
        None => GROUP.to_owned(),
    }
}

/// The group naming config `config_uid`, when its UID fits in a group name.
pub(crate) fn config_group(config_uid: &str) -> Option<String> {
    let fits = !config_uid.is_empty()
        && config_uid.len() <= 200
        && (config_uid.bytes()).all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !config_uid.ends_with('-');
    fits.then(|| format!("{CONFIG_GROUP_PREFIX}{config_uid}"))
}

/// Whether the `auth-extra-groups` value `groups` names config `config_uid`.
pub(crate) fn names_config(groups: &str, config_uid: &str) -> bool {
    config_group(config_uid).is_some_and(|own| groups.split(',').any(|g| g.trim() == own))
}

/// A token ID (6 characters of `[a-z0-9]`) derived from the config's UID. Token IDs are the
/// public half of a token (they name its Secret); the secret half stays random.
pub(crate) fn derived_id(config_uid: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(config_uid.as_bytes())
        .iter()
        .take(6)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// What happened to a config's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenAction {
    /// A new token was created.
    Created,
    /// The existing token's expiry was extended.
    Refreshed,
    /// A MachinePool's token was replaced by a new one (see [`PoolToken`]).
    Rotated,
    /// The existing token is still good.
    Reused,
}

/// What to do with a token Secret found for a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Use it as it is: it expires then, more than half its lifetime away.
    Keep(Timestamp),
    /// Use it, after setting its expiry to [`expiry`]: less than half its lifetime is left,
    /// or it has no expiry at all (it would never expire).
    Refresh,
    /// Leave it to the token cleaner and use another: expired, or unreadable.
    Unusable,
}

/// The verdict on a token whose Secret's `expiration` is `expiration`, at `now`.
pub(crate) fn assess(expiration: Option<&str>, now: Timestamp, ttl: SignedDuration) -> Verdict {
    let Some(text) = expiration else {
        return Verdict::Refresh;
    };
    match text.parse::<Timestamp>() {
        Ok(expires) if expires <= now => Verdict::Unusable,
        Ok(expires) if past_half_life(expires, now, ttl) => Verdict::Refresh,
        Ok(expires) => Verdict::Keep(expires),
        Err(_) => Verdict::Unusable,
    }
}

/// When a token expiring at `expires` falls due: once half of its lifetime `ttl` is left, it
/// is extended (a MachinePool's is rotated), and a render that relied on it looks at it again.
pub(crate) fn due(expires: Timestamp, ttl: SignedDuration) -> Timestamp {
    expires.checked_sub(ttl / 2).unwrap_or(Timestamp::MIN)
}

/// Whether a token expiring at `expires` is due at `now` ([`due`]): half of its lifetime `ttl`
/// or less is left.
pub(crate) fn past_half_life(expires: Timestamp, now: Timestamp, ttl: SignedDuration) -> bool {
    now >= due(expires, ttl)
}

/// The shortest wait before a token is looked at again: a timer that fires a little before the
/// wall clock reaches the due moment finds the token not due yet, and must not spin.
pub(crate) const SHORTEST_LOOK: Duration = Duration::from_secs(1);

/// How long after `now` to look again at a ready config whose user-data holds a token expiring
/// at `expires`: exactly when it falls due ([`due`]), not on a fixed period. A process that
/// starts over ready configs then extends the tokens the running one would have extended by
/// that moment, and no other: with a fixed period, each look extended every token past its
/// half-life, so a restart brought forward the extensions a running process would only have made
/// at its next look. An expiry that is not known (every render and every skip knows it) is
/// looked at after a third of `ttl`, well before it could expire; one further away than a
/// lifetime (not one this controller set, see [`young`]) after half of `ttl` at the latest.
pub(crate) fn next_look(
    expires: Option<Timestamp>,
    now: Timestamp,
    ttl: SignedDuration,
) -> Duration {
    let wait = match expires {
        Some(expires) => now.duration_until(due(expires, ttl)).min(ttl / 2),
        None => ttl / 3,
    };
    Duration::try_from(wait)
        .unwrap_or(Duration::ZERO)
        .max(SHORTEST_LOOK)
}

/// How far past one lifetime from now a token expiry this controller set can be: expiries are
/// rounded to the second, and another replica's clock may run a little ahead.
pub(crate) const CLOCK_SLACK: SignedDuration = SignedDuration::from_mins(1);

/// Whether a token expiring at `expires` is young at `now`: more than half its lifetime `ttl`
/// is left, and no more than a whole one (give or take [`CLOCK_SLACK`]: a later expiry is not
/// one this controller set, and is not trusted).
pub(crate) fn young(expires: Timestamp, now: Timestamp, ttl: SignedDuration) -> bool {
    let forward_dated = expires.duration_since(now) > ttl + CLOCK_SLACK;
    !forward_dated && !past_half_life(expires, now, ttl)
}

/// When a token created or refreshed at `now` expires: `ttl` later, to the second. Saturates
/// at the largest timestamp instead of overflowing.
pub(crate) fn expiry(now: Timestamp, ttl: SignedDuration) -> Timestamp {
    let expires = now.checked_add(ttl).unwrap_or(Timestamp::MAX);
    expires.round(Unit::Second).unwrap_or(expires)
}

/// `ttl` as a signed duration (flags cap it at [`LONGEST_TTL`]).
pub(crate) fn signed_ttl(ttl: Duration) -> SignedDuration {
    SignedDuration::try_from(ttl.min(LONGEST_TTL)).unwrap_or(SignedDuration::from_secs(900))
}

/// A token of a MachinePool's config, as found in the workload cluster.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found<'a> {
    /// The token's ID.
    pub id: &'a str,
    /// Its Secret's `expiration`, as stored.
    pub expiration: Option<&'a str>,
}

/// What a MachinePool's config renders with.
///
/// A pool's token is never extended: its instances boot at any time, so the token sits in the
/// pool's data Secret for as long as the pool exists, and extending it would keep one credential
/// valid forever. It is rotated instead: once less than half its lifetime is left, a new token
/// is made, the data Secret is rendered again with it, and only then is the old one deleted
/// ([`stale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PoolToken {
    /// Render with the found token at this index, which expires then.
    Use(usize, Timestamp),
    /// Make a new token and render with it. `rotation`: a working token is replaced (less
    /// than half its lifetime left, no expiry, or an expiry further away than one lifetime);
    /// else no token works any more (none, expired or unreadable).
    Create {
        /// A working token is replaced.
        rotation: bool,
    },
}

/// The token a pool's config renders with, among the config's tokens `found`, at `now`: the
/// one that expires last, while it is [`young`].
pub(crate) fn pool_token(found: &[Found<'_>], now: Timestamp, ttl: SignedDuration) -> PoolToken {
    // A token without expiry never expires: it works, and is never young.
    let working = found.iter().enumerate().filter_map(|(index, token)| {
        match token.expiration.map(str::parse::<Timestamp>) {
            None => Some((index, Timestamp::MAX)),
            Some(Ok(expires)) if expires > now => Some((index, expires)),
            Some(_) => None,
        }
    });
    match working.max_by_key(|(_, expires)| *expires) {
        Some((index, expires)) if young(expires, now, ttl) => PoolToken::Use(index, expires),
        Some(_) => PoolToken::Create { rotation: true },
        None => PoolToken::Create { rotation: false },
    }
}

/// The tokens of a pool's config to delete once its data Secret holds token `in_use`, at `now`:
/// the others that no longer work (expired, or an unreadable expiry) or would work longer than
/// a token this controller sets (no expiry, or one further away than a lifetime `ttl`, see
/// [`young`]). A replaced token that still works stays until it expires (within half a
/// lifetime: it was replaced because less than that was left): infrastructure providers copy
/// the user-data into their launch configuration some time after the Secret changes, and an
/// instance started from the old copy must still join. Called only after the write.
pub(crate) fn stale<'a>(
    found: &[Found<'a>],
    in_use: &str,
    now: Timestamp,
    ttl: SignedDuration,
) -> Vec<&'a str> {
    let works_as_set = |expiration: Option<&str>| match expiration.map(str::parse::<Timestamp>) {
        Some(Ok(expires)) => expires > now && expires.duration_since(now) <= ttl + CLOCK_SLACK,
        _ => false,
    };
    found
        .iter()
        .filter(|token| token.id != in_use && !works_as_set(token.expiration))
        .map(|token| token.id)
        .collect()
}

/// What is known, after its Machine joined, of a config's token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AfterJoin {
    /// The role the config rendered: `init` user-data holds no token.
    pub role: Role,
    /// This process already deleted the config's tokens.
    pub deleted: bool,
    /// When the token expires, as the last render knew it (memory, or the data Secret's hint).
    pub known_expiry: Option<Timestamp>,
}

/// Whether a joined Machine's config may still have a live bootstrap token to delete. A hint can
/// be stale by one refresh, so a token refreshed just before a restart may be left to expire by
/// itself, within one TTL, as the token cleaner does for every token.
pub(crate) fn may_be_live(after: AfterJoin, now: Timestamp) -> bool {
    if after.role == Role::Init || after.deleted {
        return false;
    }
    after.known_expiry.is_none_or(|expires| expires > now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token names its config in a group the authenticator accepts; a UID that cannot be
    /// part of a group name leaves the token with kubeadm's group only (per-machine reports).
    #[test]
    fn a_token_names_its_config_in_a_group() {
        let uid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        let groups = extra_groups(uid);
        assert_eq!(
            groups,
            format!("{GROUP},{REPORTS_GROUP},{CONFIG_GROUP_PREFIX}{uid}")
        );
        assert!(names_config(&groups, uid));
        assert!(!names_config(&groups, "1b4e28ba"));
        assert!(!names_config(GROUP, uid));
        for odd in ["", "UPPER", "a_b", "ends-", &"a".repeat(201)] {
            assert_eq!(extra_groups(odd), GROUP, "{odd:?}");
            assert!(!names_config(&extra_groups(odd), odd));
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn in_mins(m: i64) -> Timestamp {
        now() + SignedDuration::from_mins(m)
    }

    const TTL: SignedDuration = SignedDuration::from_mins(15);

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
        assert_eq!(Token::placeholder().expose().len(), exposed.len());
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
        assert_eq!(
            Token::derived("0f8fad5b-d9cb-469f-a165-70867728950e").id,
            id
        );
    }

    #[test]
    fn a_token_is_past_half_life_with_half_its_ttl_or_less_left() {
        let cases = [(15, false), (8, false), (7, true), (-1, true)];
        for (minutes_left, past) in cases {
            assert_eq!(
                past_half_life(in_mins(minutes_left), now(), TTL),
                past,
                "{minutes_left} minutes left"
            );
        }
        let at_half = now() + TTL / 2;
        assert_eq!(due(at_half, TTL), now());
        assert!(past_half_life(at_half, now(), TTL), "due at exactly half");
        assert!(!past_half_life(
            at_half,
            now() - SignedDuration::from_millis(1),
            TTL
        ));
    }

    #[test]
    fn a_ready_config_is_looked_at_when_its_token_falls_due() {
        // Expires in 14 minutes: due in 6.5, when 7.5 are left.
        assert_eq!(
            next_look(Some(in_mins(14)), now(), TTL),
            Duration::from_secs(390)
        );
        // Freshly made: due after half its lifetime.
        assert_eq!(
            next_look(Some(expiry(now(), TTL)), now(), TTL),
            Duration::from_secs(450)
        );
        // Already due (a look that came early by the wall clock): again shortly, not at once.
        assert_eq!(next_look(Some(in_mins(7)), now(), TTL), SHORTEST_LOOK);
        assert_eq!(next_look(None, now(), TTL), Duration::from_secs(300));
        // Forward-dated by a year: looked at again after half a lifetime, not in half a year.
        let far = now() + SignedDuration::from_hours(24 * 366);
        assert_eq!(next_look(Some(far), now(), TTL), Duration::from_secs(450));
    }

    #[test]
    fn a_token_checked_at_restart_before_it_is_due_is_kept_until_its_due_time() {
        // Made 6 minutes before the restart: 9 minutes left, due in 1.5.
        let expiration = in_mins(9).to_string();
        assert_eq!(
            assess(Some(&expiration), now(), TTL),
            Verdict::Keep(in_mins(9))
        );
        assert_eq!(
            next_look(Some(in_mins(9)), now(), TTL),
            Duration::from_secs(90)
        );
        // At that look it is extended, and the next one is half a lifetime later.
        let then = now() + SignedDuration::from_secs(90);
        assert_eq!(assess(Some(&expiration), then, TTL), Verdict::Refresh);
        assert_eq!(
            next_look(Some(expiry(then, TTL)), then, TTL),
            Duration::from_secs(450)
        );
    }

    /// Runs a process that looks at one token when [`next_look`] says, from its creation at
    /// `created` until `until` (excluded); returns the token's expiry then.
    fn expiry_when_stopped(created: Timestamp, until: Timestamp) -> Timestamp {
        let mut expires = expiry(created, TTL);
        let mut look = created;
        loop {
            look += SignedDuration::try_from(next_look(Some(expires), look, TTL)).unwrap();
            if look >= until {
                return expires;
            }
            match assess(Some(&expires.to_string()), look, TTL) {
                Verdict::Refresh => expires = expiry(look, TTL),
                Verdict::Keep(_) => {}
                Verdict::Unusable => panic!("the token expired while the process ran"),
            }
        }
    }

    #[test]
    fn a_restart_extends_no_token_the_running_process_would_not_have_extended_then() {
        // Tokens made one every 7 seconds over 40 minutes (several extensions each); the process
        // stops between two whole seconds, and a new one looks at every token at once.
        let restart = in_mins(40) + SignedDuration::from_millis(250);
        let mut extended = Vec::new();
        for n in 0..(40 * 60 / 7) {
            let created = now() + SignedDuration::from_secs(7 * n);
            let expiration = expiry_when_stopped(created, restart).to_string();
            if assess(Some(&expiration), restart, TTL) == Verdict::Refresh {
                extended.push(n);
            }
        }
        assert_eq!(extended, Vec::<i64>::new(), "no extension brought forward");
    }

    #[test]
    fn each_token_expiration_gets_its_verdict() {
        let cases: [(Option<String>, Verdict); 6] = [
            (Some(in_mins(14).to_string()), Verdict::Keep(in_mins(14))),
            (Some(in_mins(7).to_string()), Verdict::Refresh),
            (Some(in_mins(0).to_string()), Verdict::Unusable),
            (Some(in_mins(-5).to_string()), Verdict::Unusable),
            (Some("next tuesday".into()), Verdict::Unusable),
            (None, Verdict::Refresh),
        ];
        for (expiration, verdict) in cases {
            assert_eq!(
                assess(expiration.as_deref(), now(), TTL),
                verdict,
                "{expiration:?}"
            );
        }
    }

    #[test]
    fn token_without_expiration_is_refreshed_not_replaced() {
        // A token without `expiration` never expires: creating a second one would leave the
        // first valid forever. Setting an expiry on it bounds its life.
        assert_eq!(assess(None, now(), TTL), Verdict::Refresh);
    }

    #[test]
    fn expiry_is_whole_seconds_and_never_overflows() {
        let now = now() + SignedDuration::from_millis(400);
        assert_eq!(expiry(now, TTL), in_mins(15));
        let huge = SignedDuration::from_hours(20_000 * 24 * 366);
        assert_eq!(
            expiry(now, huge),
            Timestamp::MAX.round(Unit::Second).unwrap_or(Timestamp::MAX)
        );
        assert_eq!(
            signed_ttl(Duration::from_secs(u64::MAX)),
            SignedDuration::try_from(LONGEST_TTL).unwrap()
        );
    }

    #[test]
    fn a_token_is_young_with_more_than_half_and_at_most_a_whole_lifetime_left() {
        let cases = [
            (14, true),
            (16, true),
            (8, true),
            (7, false),
            (-1, false),
            (17, false),
        ];
        for (minutes_left, is_young) in cases {
            assert_eq!(
                young(in_mins(minutes_left), now(), TTL),
                is_young,
                "{minutes_left} minutes left"
            );
        }
    }

    #[test]
    fn a_pool_keeps_its_newest_young_token_and_rotates_the_rest() {
        let (young_one, old, expired) = (
            in_mins(14).to_string(),
            in_mins(6).to_string(),
            in_mins(-1).to_string(),
        );
        let found = |tokens: &[(&'static str, Option<&str>)]| -> Vec<(String, Option<String>)> {
            tokens
                .iter()
                .map(|(id, e)| (id.to_string(), e.map(str::to_owned)))
                .collect()
        };
        // (case, tokens found, expected)
        let cases = [
            ("none", found(&[]), PoolToken::Create { rotation: false }),
            (
                "young",
                found(&[("a", Some(&young_one))]),
                PoolToken::Use(0, in_mins(14)),
            ),
            (
                "past half its life",
                found(&[("a", Some(&old))]),
                PoolToken::Create { rotation: true },
            ),
            (
                "no expiry: would never expire",
                found(&[("a", None)]),
                PoolToken::Create { rotation: true },
            ),
            (
                "forward-dated",
                found(&[("a", Some(&in_mins(60).to_string()))]),
                PoolToken::Create { rotation: true },
            ),
            (
                "expired",
                found(&[("a", Some(&expired))]),
                PoolToken::Create { rotation: false },
            ),
            (
                "unreadable",
                found(&[("a", Some("soon"))]),
                PoolToken::Create { rotation: false },
            ),
            (
                "rotated, old one not deleted yet",
                found(&[("old", Some(&old)), ("new", Some(&young_one))]),
                PoolToken::Use(1, in_mins(14)),
            ),
        ];
        for (case, tokens, expected) in cases {
            let found: Vec<Found<'_>> = tokens
                .iter()
                .map(|(id, e)| Found {
                    id,
                    expiration: e.as_deref(),
                })
                .collect();
            assert_eq!(pool_token(&found, now(), TTL), expected, "{case}");
        }
    }

    #[test]
    fn after_the_write_a_replaced_token_stays_until_it_expires() {
        let (at_now, in_6, in_14, in_60, ago_1) = (
            now().to_string(),
            in_mins(6).to_string(),
            in_mins(14).to_string(),
            in_mins(60).to_string(),
            in_mins(-1).to_string(),
        );
        let token = |id, expiration| Found { id, expiration };
        // (case, the other token, whether it is deleted once the Secret holds "new")
        let cases = [
            // Replaced with less than half its life left: an instance started from a launch
            // configuration that still holds it must be able to join until it expires.
            (
                "replaced, still valid",
                token("old", Some(in_6.as_str())),
                false,
            ),
            ("still young", token("old", Some(in_14.as_str())), false),
            ("expired", token("old", Some(ago_1.as_str())), true),
            ("expires now", token("old", Some(at_now.as_str())), true),
            ("unreadable expiry", token("old", Some("garbage")), true),
            ("no expiry: would never expire", token("old", None), true),
            (
                "forward-dated: not one we set",
                token("old", Some(in_60.as_str())),
                true,
            ),
        ];
        for (case, other, deleted) in cases {
            let found = [other, token("new", Some(in_14.as_str()))];
            let expected = if deleted { vec!["old"] } else { vec![] };
            assert_eq!(stale(&found, "new", now(), TTL), expected, "{case}");
        }
        let only_new = [token("new", None)];
        assert_eq!(stale(&only_new, "new", now(), TTL), Vec::<&str>::new());
    }

    #[test]
    fn only_a_token_that_may_still_work_is_deleted_after_join() {
        let after = |role, deleted, known_expiry| AfterJoin {
            role,
            deleted,
            known_expiry,
        };
        let cases = [
            (after(Role::Worker, false, None), true),
            (after(Role::Worker, false, Some(in_mins(3))), true),
            (after(Role::ControlPlaneJoin, false, Some(in_mins(3))), true),
            (after(Role::Worker, false, Some(in_mins(-3))), false),
            (after(Role::Worker, true, Some(in_mins(3))), false),
            (after(Role::Init, false, None), false),
        ];
        for (after, live) in cases {
            assert_eq!(may_be_live(after, now()), live, "{after:?}");
        }
    }
}
