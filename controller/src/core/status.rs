//! The status a config or template should have: conditions from what a reconcile found.

use crd_types::conditions::{self, reason};
use crd_types::{BootStatus, BootplateConfigStatus, ConfigInitialization, InPlaceStatus, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{Timestamp, Unit};

use super::blocked::Blocked;
use super::boot::View as BootView;

/// A condition to set: type, status, reason, message.
pub(crate) struct Desired<'a> {
    /// Condition type.
    pub type_: &'a str,
    /// True or false.
    pub status: bool,
    /// Reason (CamelCase).
    pub reason: &'a str,
    /// Message for people (never empty: CAPI's schemas reject an empty message on apply).
    pub message: String,
}

/// The conditions `desired` describes at `now`, keeping the transition time of each condition
/// whose status did not change.
pub(crate) fn conditions(
    previous: &[Condition],
    desired: Vec<Desired<'_>>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let now = Time(now.round(Unit::Second).unwrap_or(now));
    desired
        .into_iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let last_transition_time = previous
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: d.type_.to_owned(),
                status: status.to_owned(),
                reason: d.reason.to_owned(),
                message: if d.message.is_empty() {
                    d.reason.to_owned()
                } else {
                    d.message
                },
                last_transition_time,
                observed_generation: generation,
            }
        })
        .collect()
}

/// Who a config is, as its status messages name it.
pub(crate) struct ConfigId<'a> {
    /// The config's name (also its data Secret's).
    pub name: &'a str,
    /// `metadata.generation`.
    pub generation: Option<i64>,
}

/// What a ready config's status says about its render.
pub(crate) struct ReadyFacts<'a> {
    /// The role rendered.
    pub role: Role,
    /// The template revision rendered.
    pub revision: &'a str,
    /// The data Secret's resourceVersion as this controller wrote or checked it.
    pub secret_version: Option<&'a str>,
}

/// The status of a config whose data Secret holds its user-data.
pub(crate) fn ready(
    config: &ConfigId<'_>,
    previous: &BootplateConfigStatus,
    done: &ReadyFacts<'_>,
    now: Timestamp,
) -> BootplateConfigStatus {
    let message = format!(
        "Secret {} holds the user-data (role {})",
        config.name, done.role
    );
    let desired = vec![
        Desired {
            type_: conditions::READY,
            status: true,
            reason: reason::DATA_SECRET_CREATED,
            message: message.clone(),
        },
        Desired {
            type_: conditions::DATA_SECRET_AVAILABLE,
            status: true,
            reason: reason::DATA_SECRET_CREATED,
            message,
        },
        not_paused(),
    ];
    BootplateConfigStatus {
        ready: true,
        data_secret_name: Some(config.name.to_owned()),
        data_secret_version: done.secret_version.map(str::to_owned),
        initialization: Some(ConfigInitialization {
            data_secret_created: true,
        }),
        observed_generation: config.generation,
        template_revision: Some(done.revision.to_owned()),
        role: Some(done.role.as_str().to_owned()),
        in_place: previous.in_place.clone(),
        boot: previous.boot.clone(),
        conditions: keep_others(
            &previous.conditions,
            conditions(&previous.conditions, desired, config.generation, now),
        ),
    }
}

/// `set` and, after them, the conditions of `previous` of the types `set` does not have: the
/// render path writes `Ready`, `DataSecretAvailable` and `Paused`; `InPlaceUpdating` is
/// written only while a node's payload is looked at, and stays as it was otherwise.
fn keep_others(previous: &[Condition], mut set: Vec<Condition>) -> Vec<Condition> {
    let others: Vec<Condition> = (previous.iter())
        .filter(|p| !set.iter().any(|c| c.type_ == p.type_))
        .cloned()
        .collect();
    set.extend(others);
    set
}

/// `status` with the in-place state `in_place` and, when given, the `InPlaceUpdating`
/// condition `condition` (its transition time kept while its status holds).
pub(crate) fn with_in_place(
    mut status: BootplateConfigStatus,
    in_place: InPlaceStatus,
    condition: Option<Desired<'_>>,
    now: Timestamp,
) -> BootplateConfigStatus {
    if let Some(desired) = condition {
        let generation = status.observed_generation;
        let set = conditions(&status.conditions, vec![desired], generation, now);
        status.conditions = keep_others(&status.conditions, set);
    }
    status.in_place = Some(in_place);
    status
}

/// `status` (a ready config's) with what its machine's boot `view` shows: the phase and part
/// and, for a failed, silent or unreadable boot, `Ready=False` (the data Secret stays available: Cluster
/// API mirrors `Ready` into the Machine's `BootstrapConfigReady`, which a MachineHealthCheck
/// can act on). `Unknown` leaves the status as it is. Transition times are kept from
/// `previous` (the status as stored).
pub(crate) fn with_boot(
    mut status: BootplateConfigStatus,
    previous: &BootplateConfigStatus,
    view: &BootView,
    now: Timestamp,
) -> BootplateConfigStatus {
    let (phase, part, not_ready) = match view {
        BootView::Unknown => return status,
        BootView::Booting { part } => ("Booting", part.as_str(), None),
        BootView::Booted => ("Booted", "", None),
        BootView::Failed { part, message, .. } => (
            "Failed",
            part.as_str(),
            Some((reason::BOOT_FAILED, message)),
        ),
        BootView::NotStarted { message } => {
            ("NotStarted", "", Some((reason::BOOT_NOT_STARTED, message)))
        }
        // What the machine wrote is not a report: its boot cannot be vouched for.
        BootView::Unreadable { message } => (
            "Unreadable",
            "",
            Some((reason::BOOT_REPORT_UNREADABLE, message)),
        ),
    };
    status.boot = Some(BootStatus {
        phase: Some(phase.to_owned()),
        part: (!part.is_empty()).then(|| part.to_owned()),
    });
    if let Some((reason, message)) = not_ready {
        let desired = Desired {
            type_: conditions::READY,
            status: false,
            reason,
            message: message.clone(),
        };
        let generation = status.observed_generation;
        let set = conditions(&previous.conditions, vec![desired], generation, now);
        status.conditions = keep_others(&status.conditions, set);
    }
    status
}

fn not_paused() -> Desired<'static> {
    Desired {
        type_: conditions::PAUSED,
        status: false,
        reason: reason::NOT_PAUSED,
        message: "not paused".into(),
    }
}

/// The status of a config that is blocked: everything else as it was (a written data Secret
/// stays available: CAPI's ready flag never goes back).
pub(crate) fn blocked(
    config: &ConfigId<'_>,
    previous: &BootplateConfigStatus,
    why: &Blocked,
    now: Timestamp,
) -> BootplateConfigStatus {
    let available = if previous.ready {
        Desired {
            type_: conditions::DATA_SECRET_AVAILABLE,
            status: true,
            reason: reason::DATA_SECRET_CREATED,
            message: format!("Secret {} holds the user-data", config.name),
        }
    } else {
        Desired {
            type_: conditions::DATA_SECRET_AVAILABLE,
            status: false,
            reason: why.reason,
            message: why.message.clone(),
        }
    };
    let paused = if why.reason == reason::PAUSED {
        Desired {
            type_: conditions::PAUSED,
            status: true,
            reason: reason::PAUSED,
            message: why.message.clone(),
        }
    } else {
        not_paused()
    };
    let ready = Desired {
        type_: conditions::READY,
        status: false,
        reason: why.reason,
        message: why.message.clone(),
    };
    BootplateConfigStatus {
        observed_generation: config.generation,
        conditions: keep_others(
            &previous.conditions,
            conditions(
                &previous.conditions,
                vec![ready, available, paused],
                config.generation,
                now,
            ),
        ),
        ..previous.clone()
    }
}

/// Whether `why` differs from what the `Ready` condition already says (then it is worth an
/// Event).
pub(crate) fn ready_condition_changed(previous: &BootplateConfigStatus, why: &Blocked) -> bool {
    !previous
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY && c.reason == why.reason && c.message == why.message)
}

/// Whether a render's ready status is to be written. Not for a config found unchanged since a
/// render whose ready status was written while the cache does not show it ready yet: the cache
/// is behind (ready never goes back), its watch event is on the way, and writing again would
/// only repeat that write.
pub(crate) fn write_ready_status(unchanged: bool, previous_ready: bool) -> bool {
    !unchanged || previous_ready
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    const ID: ConfigId<'static> = ConfigId {
        name: "w-0",
        generation: Some(3),
    };

    fn condition<'a>(status: &'a BootplateConfigStatus, type_: &str) -> &'a Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} condition"))
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let first = conditions(
            &[],
            vec![Desired {
                type_: "Ready",
                status: false,
                reason: "Waiting",
                message: String::new(),
            }],
            Some(1),
            at(0),
        );
        assert_eq!(
            first[0].message, "Waiting",
            "an empty message becomes the reason"
        );
        let cases = [(false, at(0)), (true, at(60))];
        for (status, transition) in cases {
            let next = conditions(
                &first,
                vec![Desired {
                    type_: "Ready",
                    status,
                    reason: "Other",
                    message: "m".into(),
                }],
                Some(2),
                at(60),
            );
            assert_eq!(
                next[0].last_transition_time.0, transition,
                "status {status}"
            );
            assert_eq!(next[0].observed_generation, Some(2));
        }
    }

    #[test]
    fn a_ready_status_names_the_secret_role_revision_and_version() {
        let done = ReadyFacts {
            role: Role::Worker,
            revision: "r1",
            secret_version: Some("42"),
        };
        let status = ready(&ID, &BootplateConfigStatus::default(), &done, at(0));
        assert!(status.ready);
        assert_eq!(status.data_secret_name.as_deref(), Some("w-0"));
        assert_eq!(status.data_secret_version.as_deref(), Some("42"));
        assert_eq!(status.template_revision.as_deref(), Some("r1"));
        assert_eq!(status.role.as_deref(), Some("worker"));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(condition(&status, conditions::READY).status, "True");
        assert_eq!(
            condition(&status, conditions::READY).message,
            "Secret w-0 holds the user-data (role worker)"
        );
        assert_eq!(condition(&status, conditions::PAUSED).status, "False");
    }

    #[test]
    fn a_blocked_status_keeps_a_written_secret_available() {
        let why = Blocked::waiting(reason::PAUSED, "paused by the Cluster");
        let cases = [
            (false, "False", reason::PAUSED),
            (true, "True", reason::DATA_SECRET_CREATED),
        ];
        for (was_ready, available, available_reason) in cases {
            let previous = BootplateConfigStatus {
                ready: was_ready,
                role: Some("worker".into()),
                ..Default::default()
            };
            let status = blocked(&ID, &previous, &why, at(0));
            assert_eq!(status.ready, was_ready, "ready never goes back");
            assert_eq!(status.role.as_deref(), Some("worker"), "the rest is kept");
            let ready = condition(&status, conditions::READY);
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                ("False", reason::PAUSED)
            );
            let data = condition(&status, conditions::DATA_SECRET_AVAILABLE);
            assert_eq!(
                (data.status.as_str(), data.reason.as_str()),
                (available, available_reason)
            );
            let paused = condition(&status, conditions::PAUSED);
            assert_eq!(
                (paused.status.as_str(), paused.message.as_str()),
                ("True", "paused by the Cluster")
            );
        }
    }

    #[test]
    fn an_event_is_worth_it_only_when_the_ready_condition_says_something_new() {
        let why = Blocked::failed(reason::TEMPLATE_INVALID, "line 3: bad");
        let previous = blocked(&ID, &BootplateConfigStatus::default(), &why, at(0));
        assert!(ready_condition_changed(
            &BootplateConfigStatus::default(),
            &why
        ));
        assert!(!ready_condition_changed(&previous, &why));
        let other = Blocked::failed(reason::TEMPLATE_INVALID, "line 4: bad");
        assert!(ready_condition_changed(&previous, &other));
    }

    #[test]
    fn an_unchanged_render_writes_status_only_when_the_cache_shows_it_ready() {
        let cases = [
            (false, false, true),
            (false, true, true),
            (true, true, true),
            (true, false, false),
        ];
        for (unchanged, previous_ready, write) in cases {
            assert_eq!(
                write_ready_status(unchanged, previous_ready),
                write,
                "{unchanged} {previous_ready}"
            );
        }
    }

    #[test]
    fn the_boot_shows_as_a_phase_and_a_failure_as_ready_false() {
        let facts = ReadyFacts {
            role: Role::Worker,
            revision: "r1",
            secret_version: Some("5"),
        };
        let base = ready(&ID, &BootplateConfigStatus::default(), &facts, at(0));
        let failed = BootView::Failed {
            part: "join".into(),
            message: "Machine m failed to boot: part `join`, command 0 exited with status 1".into(),
            tail: vec![],
        };
        let not_started = BootView::NotStarted {
            message: "silent".into(),
        };
        let unreadable = BootView::Unreadable {
            message: "garbage".into(),
        };
        let booting = BootView::Booting {
            part: "install".into(),
        };
        let cases = [
            (&BootView::Unknown, None, None, "True"),
            (&booting, Some("Booting"), Some("install"), "True"),
            (&BootView::Booted, Some("Booted"), None, "True"),
            (&failed, Some("Failed"), Some("join"), "False"),
            (&not_started, Some("NotStarted"), None, "False"),
            (&unreadable, Some("Unreadable"), None, "False"),
        ];
        for (view, phase, part, ready_status) in cases {
            let status = with_boot(base.clone(), &base, view, at(10));
            let boot = status.boot.clone().unwrap_or_default();
            assert_eq!(boot.phase.as_deref(), phase, "{view:?}");
            assert_eq!(boot.part.as_deref(), part, "{view:?}");
            let condition = condition(&status, conditions::READY);
            assert_eq!(condition.status, ready_status, "{view:?}");
            assert!(status.ready, "the data Secret stays available");
        }
        // A failure seen again later keeps its transition time (no status write per look).
        let first = with_boot(base.clone(), &base, &failed, at(10));
        let again = ready(&ID, &first, &facts, at(50));
        let again = with_boot(again, &first, &failed, at(50));
        assert_eq!(again, first);
        assert_eq!(
            condition(&again, conditions::READY).reason,
            reason::BOOT_FAILED
        );
    }
}
