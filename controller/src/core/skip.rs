//! Whether a config's render can be skipped: nothing it depends on changed since the last one.
//!
//! What the last full render of a config did is kept in memory by config UID ([`Record`]). A
//! reconcile whose inputs digest is the same, whose token is not due yet (more than half its
//! lifetime left) and whose data Secret still has the resourceVersion seen after the write does
//! nothing and sends no request: that is the reconcile the controller's own status and Secret
//! writes trigger, and one that another change to a watched object triggers while the token is
//! young. Anything else (a changed config,
//! Machine, Cluster, template or certificate Secret; a token to refresh; a touched data Secret;
//! another build of the controller) takes the full path, which reads and compares.
//!
//! After a restart the data Secret's hint annotations stand in for the record, but only as far
//! as they can be trusted: the Secret must still have the resourceVersion the config's status
//! recorded after the write (anyone else's edit, of the user-data or of a hint, changes it), and
//! a token expiry further away than one lifetime cannot be one this controller set.

use crd_types::{BootplateConfigStatus, Role};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use render::RenderContext;
use serde::Serialize;

use super::cached_secret::CachedSecret;
use super::token::young;

/// What the last full render of a config did (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// [`inputs_digest`] of the render.
    pub inputs: String,
    /// When the bootstrap token in the user-data expires (`None` for `init`).
    pub token_expires: Option<Timestamp>,
    /// `data_secret::digest` of the Secret written or found current.
    pub secret_digest: String,
    /// The Secret's resourceVersion after that.
    pub secret_version: Option<String>,
}

/// What is known of a config's last render: from memory, or after a restart from the hints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LastRender {
    /// From this process's memory (else from the hints).
    pub remembered: bool,
    /// The inputs digest.
    pub inputs: Option<String>,
    /// The token expiry.
    pub token_expires: Option<Timestamp>,
    /// The data Secret's resourceVersion right after the render.
    pub secret_version: Option<String>,
}

impl LastRender {
    /// From this process's memory.
    pub(crate) fn remembered(record: &Record) -> Self {
        LastRender {
            remembered: true,
            inputs: Some(record.inputs.clone()),
            token_expires: record.token_expires,
            secret_version: record.secret_version.clone(),
        }
    }

    /// From the hint annotations of the data Secret and the resourceVersion the config's status
    /// recorded for it (not the Secret's own: that one would vouch for any edit).
    pub(crate) fn from_hints(secret: &CachedSecret, status: &BootplateConfigStatus) -> Self {
        LastRender {
            remembered: false,
            inputs: secret.inputs.clone(),
            token_expires: secret.token_expires.as_deref().and_then(|t| t.parse().ok()),
            secret_version: status.data_secret_version.clone(),
        }
    }
}

/// What a skip is judged against now.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    /// The time.
    pub time: Timestamp,
    /// `--bootstrap-token-ttl`.
    pub ttl: SignedDuration,
}

/// Whether the render with inputs digest `inputs` for `role` can be skipped after `last`:
/// the data Secret now has resourceVersion `stored_version`; a `last` known from hints alone
/// counts only when they vouch ([`hints_vouch`]).
pub(crate) fn unchanged(
    last: &LastRender,
    hints_vouch: bool,
    inputs: &str,
    role: Role,
    stored_version: Option<&str>,
    now: Now,
) -> bool {
    if !last.remembered && !hints_vouch {
        return false;
    }
    if last.inputs.as_deref() != Some(inputs) {
        return false;
    }
    if role != Role::Init && !token_is_young(last.token_expires, now) {
        return false;
    }
    stored_version.is_some() && stored_version == last.secret_version.as_deref()
}

/// Whether a token known to expire at `expires` needs no look (see [`young`]).
fn token_is_young(expires: Option<Timestamp>, now: Now) -> bool {
    expires.is_some_and(|expires| young(expires, now.time, now.ttl))
}

/// Whether a last render known only from the data Secret's hints may vouch for a skip: for a
/// config whose status says its Secret was written (a Secret written just before a crash still
/// needs the status after it), and never for a MachinePool's (a controller stopped between
/// writing a pool's Secret and deleting the token it replaced must look, and delete it).
pub(crate) fn hints_vouch(previous_ready: bool, pool: bool) -> bool {
    previous_ready && !pool
}

/// Whether a config shows no trace of an earlier render: not ready, and no data Secret in the
/// (synced) metadata store. Then its token, if any, can only be one whose creation was
/// interrupted, and the token adapter creates it under its derived name instead of listing.
pub(crate) fn first_render(previous_ready: bool, stored_version: Option<&str>) -> bool {
    !previous_ready && stored_version.is_none()
}

/// Everything a render depends on besides the bootstrap token.
#[derive(Serialize)]
pub(crate) struct Inputs<'a> {
    /// This controller's build (a digest of its executable): another build may render
    /// differently from the same inputs.
    pub build: &'a str,
    /// The config's UID.
    pub config_uid: Option<&'a str>,
    /// The config's generation (its spec).
    pub generation: Option<i64>,
    /// The template revision.
    pub revision: &'a str,
    /// The role.
    pub role: Role,
    /// What the template sees of the Machine and the Cluster (their render context, so their
    /// status updates do not count).
    pub seen: RenderContext,
    /// The resourceVersions of the certificate Secrets the role reads.
    pub secret_versions: Vec<String>,
    /// The generators the render calls, with their spec generations (left out when none, so
    /// configs without generators keep their digests).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub generators: Vec<(String, Option<i64>)>,
}

/// A digest of `inputs`.
pub(crate) fn inputs_digest(inputs: &Inputs<'_>) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(inputs).expect("render inputs always serialize");
    hex::encode(sha2::Sha256::digest(json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crd_types::capi::{Cluster, Machine};

    fn at(minutes: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap() + SignedDuration::from_mins(minutes)
    }

    const NOW: Now = Now {
        time: Timestamp::constant(1_800_000_000, 0),
        ttl: SignedDuration::from_mins(15),
    };

    fn last(remembered: bool, token_expires: Option<Timestamp>) -> LastRender {
        LastRender {
            remembered,
            inputs: Some("d1".into()),
            token_expires,
            secret_version: Some("7".into()),
        }
    }

    #[test]
    fn the_render_is_skipped_only_when_nothing_changed() {
        use Role::{Init as I, Worker as W};
        // (case, remembered, status ready, inputs, role, token minutes left, stored, skip)
        #[rustfmt::skip]
        let cases = [
            ("nothing changed", true, true, "d1", W, Some(14), Some("7"), true),
            ("other inputs", true, true, "d2", W, Some(14), Some("7"), false),
            ("token past half", true, true, "d1", W, Some(7), Some("7"), false),
            ("expiry unknown", true, true, "d1", W, None, Some("7"), false),
            ("init, no token", true, true, "d1", I, None, Some("7"), true),
            ("secret touched", true, true, "d1", W, Some(14), Some("8"), false),
            ("secret gone", true, true, "d1", W, Some(14), None, false),
            ("hints, ready", false, true, "d1", W, Some(14), Some("7"), true),
            ("hints, not ready", false, false, "d1", W, Some(14), Some("7"), false),
            ("memory, not ready", true, false, "d1", W, Some(14), Some("7"), true),
        ];
        for (case, remembered, ready, inputs, role, left, stored, skip) in cases {
            let last = last(remembered, left.map(at));
            let skipped = unchanged(&last, ready, inputs, role, stored, NOW);
            assert_eq!(skipped, skip, "{case}");
        }
    }

    #[test]
    fn hints_vouch_only_for_a_written_config_of_a_machine() {
        let cases = [
            (true, false, true),
            (false, false, false),
            (true, true, false),
            (false, true, false),
        ];
        for (ready, pool, vouch) in cases {
            assert_eq!(hints_vouch(ready, pool), vouch, "ready={ready} pool={pool}");
        }
    }

    #[test]
    fn forward_dated_token_expires_hint_does_not_suppress_the_refresh() {
        // An expiry beyond one lifetime from now is not one this controller set: a hint edited
        // to the far future must not keep an unbooted machine's token from being refreshed.
        let forward = last(false, Some(at(60 * 24 * 365)));
        assert!(!unchanged(
            &forward,
            true,
            "d1",
            Role::Worker,
            Some("7"),
            NOW
        ));
        let at_most_one_ttl = last(false, Some(at(15)));
        let skip = |now| unchanged(&at_most_one_ttl, true, "d1", Role::Worker, Some("7"), now);
        assert!(skip(NOW));
        // A token just created has its expiry rounded to the second, possibly up.
        let rounded_up = Now {
            time: NOW.time - SignedDuration::from_millis(400),
            ..NOW
        };
        assert!(skip(rounded_up));
    }

    #[test]
    fn edited_data_secret_value_is_not_vouched_for_by_its_own_version() {
        // Hints are read with the resourceVersion the status recorded: an edit of `value` that
        // keeps the annotations changes the Secret's resourceVersion, and the render is redone.
        let secret = CachedSecret {
            inputs: Some("d1".into()),
            token_expires: Some(at(14).to_string()),
            ..Default::default()
        };
        let status = BootplateConfigStatus {
            ready: true,
            data_secret_version: Some("7".into()),
            ..Default::default()
        };
        let hints = LastRender::from_hints(&secret, &status);
        assert_eq!(hints.token_expires, Some(at(14)));
        assert!(unchanged(&hints, true, "d1", Role::Worker, Some("7"), NOW));
        assert!(
            !unchanged(&hints, true, "d1", Role::Worker, Some("9"), NOW),
            "edited since"
        );
        let unrecorded = LastRender::from_hints(&secret, &BootplateConfigStatus::default());
        assert!(!unchanged(
            &unrecorded,
            true,
            "d1",
            Role::Worker,
            Some("7"),
            NOW
        ));
    }

    #[test]
    fn inputs_digest_changes_with_the_controller_build() {
        let (cluster, machine) = (
            Cluster::new("c1", Default::default()),
            Machine::new("m-0", Default::default()),
        );
        let inputs = |build| Inputs {
            build,
            config_uid: Some("u1"),
            generation: Some(1),
            revision: "r1",
            role: Role::Worker,
            seen: RenderContext::new(&cluster, &machine, Role::Worker, None, None),
            secret_versions: vec!["5".into()],
            generators: Vec::new(),
        };
        let same = inputs_digest(&inputs("build-a"));
        assert_eq!(same, inputs_digest(&inputs("build-a")));
        assert_ne!(same, inputs_digest(&inputs("build-b")));
        let mut other = inputs("build-a");
        other.secret_versions = vec!["6".into()];
        assert_ne!(same, inputs_digest(&other), "a rotated certificate counts");
        let mut generated = inputs("build-a");
        generated.generators = vec![("cmdb".into(), Some(1))];
        let first = inputs_digest(&generated);
        generated.generators = vec![("cmdb".into(), Some(2))];
        assert_ne!(
            first,
            inputs_digest(&generated),
            "a changed generator spec counts"
        );
    }

    #[test]
    fn only_a_config_without_status_or_secret_is_a_first_render() {
        let cases = [
            (false, None, true),
            (true, None, false),
            (false, Some("3"), false),
        ];
        for (ready, stored, first) in cases {
            assert_eq!(first_render(ready, stored), first, "{ready} {stored:?}");
        }
    }
}
