//! What a reconcile's result means for the config: its state in the metrics, when to look at
//! it again, and which Event tells people.

use std::time::Duration;

use crd_types::Role;
use crd_types::conditions::reason;

use super::blocked::Blocked;

/// How long to wait before looking again at a config that waits for something no watch
/// reports (for example, a Secret in a workload cluster).
pub(crate) const WAIT_REQUEUE: Duration = Duration::from_secs(30);
/// How long before retrying a config with a problem someone has to fix; watches on the
/// config and its template usually trigger earlier.
pub(crate) const FAILED_REQUEUE: Duration = Duration::from_secs(300);

/// The state of a config, for `bootplate_configs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigState {
    /// The data Secret is written.
    Ready,
    /// Waiting for something that clears by itself.
    Waiting,
    /// A problem someone has to fix.
    Failed,
}

impl ConfigState {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigState::Ready => "ready",
            ConfigState::Waiting => "waiting",
            ConfigState::Failed => "failed",
        }
    }
}

/// When to look again at a ready config; `None`: only when something changes. `token_look`:
/// its user-data holds a token, to be looked at after that long (`token::next_look`: when it
/// falls due). `cleanup_failed`: a MachinePool's replaced token could not be deleted after the
/// write; it is tried again soon, so it does not outlive the write for longer than it must.
pub(crate) fn ready_requeue(
    token_look: Option<Duration>,
    cleanup_failed: bool,
) -> Option<Duration> {
    if cleanup_failed {
        return Some(token_look.map_or(CLEANUP_RETRY, |look| look.min(CLEANUP_RETRY)));
    }
    token_look
}

/// When to look again at a joined config whose clean-up failed.
pub(crate) const CLEANUP_RETRY: Duration = WAIT_REQUEUE;

/// The sooner of two optional requeue delays (`None`: no requeue asked).
pub(crate) fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The state and next look of a config whose Machine joined. A failed clean-up (a workload
/// cluster that does not answer, a token deletion refused) leaves it ready, since its data
/// Secret is written and its Machine booted, and counted as ready, not waiting (the
/// oldest-waiting alert is for machines that cannot boot); it is looked at again soon, so a
/// token does not outlive its use for longer than it must.
pub(crate) fn joined(cleanup_failed: bool) -> (ConfigState, Option<Duration>) {
    (ConfigState::Ready, cleanup_failed.then_some(CLEANUP_RETRY))
}

/// How long before trying a busy generator again: its calls take seconds at most.
pub(crate) const GENERATOR_BUSY_REQUEUE: Duration = Duration::from_secs(2);

/// The state and the next look for a blocked config. `generator_retry` is the backoff delay
/// of a config whose generator failed (it doubles per consecutive failure: a generator that
/// is down is not hammered, one that is back is used again soon).
pub(crate) fn blocked(why: &Blocked, generator_retry: Duration) -> (ConfigState, Duration) {
    if why.reason == reason::WAITING_FOR_GENERATOR {
        return (ConfigState::Waiting, GENERATOR_BUSY_REQUEUE);
    }
    if why.waiting {
        return (ConfigState::Waiting, WAIT_REQUEUE);
    }
    if why.reason == reason::GENERATOR_FAILED {
        return (ConfigState::Failed, generator_retry);
    }
    // contentFrom Secrets are not watched (they carry no label to select them by), and the
    // usual fix, creating the Secret, is often just late: look again soon. Nor is the init
    // lock, whose deletion is the fix for a holder that is gone.
    let retry = if why.reason == reason::FILE_SOURCE_ERROR || why.reason == reason::INIT_HOLDER_GONE
    {
        WAIT_REQUEUE
    } else {
        FAILED_REQUEUE
    };
    (ConfigState::Failed, retry)
}

/// An Event to publish about a config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    /// Warning (else Normal).
    pub warning: bool,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's action.
    pub action: &'static str,
    /// The text, for people.
    pub text: String,
}

/// The waits every machine goes through in Cluster API's order of things (its Machine, its
/// infrastructure, the control plane, the init lock, a Node): shown in the `Ready` condition
/// and the metrics, with no Event, so a rollout costs one Event per machine (`Rendered`).
/// Waits that point at something missing (a template, a generator, a Secret) keep theirs.
const ROUTINE_WAITS: &[&str] = &[
    reason::WAITING_FOR_MACHINE,
    reason::WAITING_FOR_INFRASTRUCTURE,
    reason::WAITING_FOR_CONTROL_PLANE,
    reason::WAITING_FOR_INIT_LOCK,
    reason::WAITING_FOR_NODE,
];

/// The Event of a blocked config: only when its status was written and its `Ready` condition
/// says something new, and not for a routine wait.
pub(crate) fn blocked_note(
    why: &Blocked,
    status_written: bool,
    condition_changed: bool,
) -> Option<Note> {
    let routine = why.waiting && ROUTINE_WAITS.contains(&why.reason);
    (status_written && condition_changed && !routine).then(|| Note {
        warning: !why.waiting,
        reason: why.reason,
        action: "Reconcile",
        text: why.message.clone(),
    })
}

/// What a full render did, for its Event.
pub(crate) struct RenderFacts<'a> {
    /// The data Secret was written.
    pub written: bool,
    /// How messages name the template.
    pub template: &'a str,
    /// The template revision.
    pub revision: &'a str,
    /// The role rendered.
    pub role: Role,
    /// The data Secret's name.
    pub secret: &'a str,
    /// The ID of a token this render created.
    pub created_token: Option<&'a str>,
    /// The IDs of a MachinePool's earlier tokens deleted after the write (expired ones, see
    /// `token::stale`).
    pub deleted_tokens: &'a [String],
}

/// One Event per render, which also tells of a token the render created: a rollout of thousands
/// of machines records one Event each, not two. None when nothing was written or created.
pub(crate) fn render_note(facts: &RenderFacts<'_>) -> Option<Note> {
    let token = facts.created_token.map(|id| {
        let created = format!("bootstrap token {id} created in the workload cluster");
        match facts.deleted_tokens {
            [] => created,
            deleted => format!("{created}; deleted {}", deleted.join(", ")),
        }
    });
    if facts.written {
        let rendered = format!(
            "rendered {} (revision {}) for role {} into Secret {}",
            facts.template, facts.revision, facts.role, facts.secret
        );
        return Some(Note {
            warning: false,
            reason: "Rendered",
            action: "Render",
            text: match token {
                Some(token) => format!("{rendered}; {token}"),
                None => rendered,
            },
        });
    }
    token.map(|text| Note {
        warning: false,
        reason: "TokenCreated",
        action: "CreateToken",
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_configs_wait_or_fail_and_are_looked_at_again() {
        let cases = [
            (
                Blocked::waiting(reason::WAITING_FOR_MACHINE, "m"),
                ConfigState::Waiting,
                WAIT_REQUEUE,
            ),
            (
                Blocked::failed(reason::TEMPLATE_INVALID, "m"),
                ConfigState::Failed,
                FAILED_REQUEUE,
            ),
            (
                Blocked::failed(reason::FILE_SOURCE_ERROR, "m"),
                ConfigState::Failed,
                WAIT_REQUEUE,
            ),
            (
                Blocked::failed(reason::INIT_HOLDER_GONE, "m"),
                ConfigState::Failed,
                WAIT_REQUEUE,
            ),
        ];
        let backoff = Duration::from_secs(20);
        for (why, state, requeue) in cases {
            assert_eq!(blocked(&why, backoff), (state, requeue), "{why:?}");
        }
        let failed = Blocked::failed(reason::GENERATOR_FAILED, "cmdb down");
        assert_eq!(blocked(&failed, backoff), (ConfigState::Failed, backoff));
        let busy = Blocked::waiting(reason::WAITING_FOR_GENERATOR, "cmdb busy");
        assert_eq!(
            blocked(&busy, backoff),
            (ConfigState::Waiting, GENERATOR_BUSY_REQUEUE)
        );
    }

    #[test]
    fn failed_token_deletion_keeps_a_bootstrapped_config_ready() {
        assert_eq!(joined(true), (ConfigState::Ready, Some(CLEANUP_RETRY)));
        assert_eq!(joined(false), (ConfigState::Ready, None));
    }

    #[test]
    fn a_ready_config_is_looked_at_when_its_token_says() {
        let look = Duration::from_secs(450);
        assert_eq!(ready_requeue(Some(look), false), Some(look));
        assert_eq!(ready_requeue(None, false), None);
        assert_eq!(ready_requeue(Some(look), true), Some(CLEANUP_RETRY));
        assert_eq!(ready_requeue(None, true), Some(CLEANUP_RETRY));
        let soon = Duration::from_secs(10);
        assert_eq!(
            ready_requeue(Some(soon), true),
            Some(soon),
            "never later than the next token look"
        );
    }

    #[test]
    fn a_blocked_config_gets_an_event_only_for_news() {
        let waiting = Blocked::waiting(reason::TEMPLATE_NOT_FOUND, "no template");
        let failed = Blocked::failed(reason::TEMPLATE_INVALID, "bad");
        assert_eq!(blocked_note(&waiting, true, false), None);
        assert_eq!(blocked_note(&waiting, false, true), None);
        let note = blocked_note(&waiting, true, true).unwrap();
        assert_eq!(
            (note.warning, note.reason, note.text.as_str()),
            (false, reason::TEMPLATE_NOT_FOUND, "no template")
        );
        assert!(blocked_note(&failed, true, true).unwrap().warning);
    }

    /// Each case: the reason, whether it waits, and whether it gets an Event when new.
    #[test]
    fn the_routine_waits_of_cluster_api_get_no_event() {
        let cases = [
            (reason::WAITING_FOR_MACHINE, true, false),
            (reason::WAITING_FOR_INFRASTRUCTURE, true, false),
            (reason::WAITING_FOR_CONTROL_PLANE, true, false),
            (reason::WAITING_FOR_INIT_LOCK, true, false),
            (reason::WAITING_FOR_NODE, true, false),
            (reason::TEMPLATE_NOT_FOUND, true, true),
            (reason::GENERATOR_NOT_FOUND, true, true),
            (reason::CLUSTER_NOT_FOUND, true, true),
            (reason::CERTIFICATES_ERROR, true, true),
            (reason::INIT_HOLDER_GONE, false, true),
            (reason::TEMPLATE_INVALID, false, true),
        ];
        for (why, waiting, event) in cases {
            let blocked = if waiting {
                Blocked::waiting(why, "m")
            } else {
                Blocked::failed(why, "m")
            };
            assert_eq!(blocked_note(&blocked, true, true).is_some(), event, "{why}");
        }
    }

    #[test]
    fn a_render_tells_in_one_event_what_it_wrote_and_created() {
        let facts = |written, created_token| RenderFacts {
            written,
            template: "ClusterBootstrapTemplate ubuntu",
            revision: "r1",
            role: Role::Worker,
            secret: "w-0",
            created_token,
            deleted_tokens: &[],
        };
        let both = render_note(&facts(true, Some("abc123"))).unwrap();
        assert_eq!(both.reason, "Rendered");
        assert_eq!(
            both.text,
            "rendered ClusterBootstrapTemplate ubuntu (revision r1) for role worker into Secret w-0; bootstrap token abc123 created in the workload cluster"
        );
        let written = render_note(&facts(true, None)).unwrap();
        assert!(!written.text.contains("token"));
        let token = render_note(&facts(false, Some("abc123"))).unwrap();
        assert_eq!(
            (token.reason, token.action),
            ("TokenCreated", "CreateToken")
        );
        assert_eq!(render_note(&facts(false, None)), None);
        let replaced = ["old111".to_owned()];
        let rotated = RenderFacts {
            deleted_tokens: &replaced,
            ..facts(true, Some("new222"))
        };
        assert!(
            render_note(&rotated).unwrap().text.ends_with(
                "; bootstrap token new222 created in the workload cluster; deleted old111"
            )
        );
    }

    #[test]
    fn the_sooner_requeue_wins_and_none_asks_for_none() {
        let s = Duration::from_secs;
        let cases = [
            (None, None, None),
            (Some(s(5)), None, Some(s(5))),
            (None, Some(s(7)), Some(s(7))),
            (Some(s(5)), Some(s(7)), Some(s(5))),
            (Some(s(9)), Some(s(7)), Some(s(7))),
        ];
        for (a, b, want) in cases {
            assert_eq!(sooner(a, b), want, "{a:?} {b:?}");
        }
    }
}
