//! In-place updates of booted machines: when a node's payload is published, what bootplate-agent
//! reported on the node means, what the config's status says meanwhile, and what Cluster API's
//! update hooks are answered. The comparison of two renders is `render::PartsRender::update_from`;
//! these are the rules around it.

use std::time::Duration;

use crd_types::capi::UPDATE_IN_PROGRESS_ANNOTATION;
use crd_types::conditions::{self, reason};
use crd_types::payload::{APPLIED_ANNOTATION, CONDITION_TYPE};
use crd_types::{BootplateConfigStatus, InPlaceStatus};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::outcome::Note;
use super::status::Desired;

/// How often a config under an in-place update looks at its node again.
pub(crate) const POLL: Duration = Duration::from_secs(3);
/// How soon Cluster API asks `UpdateMachine` again while the node is still applying.
pub(crate) const RETRY_AFTER_SECONDS: i32 = 5;

/// Whether Cluster API marked the object as being updated in place.
pub(crate) fn in_progress(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(UPDATE_IN_PROGRESS_ANNOTATION))
}

/// Whether the payload of a joined machine's node is to be rendered and published now: for each
/// new spec while Cluster API updates the machine in place, and never before the first update
/// (the machine runs what its user-data wrote; publishing at the join cost every machine a
/// Secret, a Role and a RoleBinding in its workload cluster, agent or not). A spec change
/// without Cluster API's mark does not reach the node: a config's spec is Cluster API's to roll
/// out.
pub(crate) fn publish_needed(
    previous: Option<&InPlaceStatus>,
    generation: Option<i64>,
    updating: bool,
) -> bool {
    updating
        && previous.is_none_or(|status| {
            status.published_revision.is_none() || status.observed_generation != generation
        })
}

/// Whether the node's report is worth reading: during an update, and once more right after
/// Cluster API ended it (to record the final state).
pub(crate) fn observe_node(previous: &BootplateConfigStatus, updating: bool) -> bool {
    updating || in_place_condition(previous).is_some_and(|c| c.status == "True")
}

/// Since when a config has been under an in-place update: its `InPlaceUpdating` condition's
/// last transition to True, which a restarted controller reads back from the status; `None`
/// when no update was in progress.
pub(crate) fn updating_since(
    status: &BootplateConfigStatus,
) -> Option<k8s_openapi::jiff::Timestamp> {
    in_place_condition(status)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0)
}

fn in_place_condition(
    status: &BootplateConfigStatus,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::IN_PLACE_UPDATING)
}

/// What bootplate-agent reported on its Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeReport {
    /// The revision it last applied (annotation).
    pub applied: Option<String>,
    /// Its `BootplateApplied` condition's message when that condition is False.
    pub failure: Option<String>,
}

impl NodeReport {
    /// The report on `node`.
    pub(crate) fn from_node(node: &Node) -> Self {
        let applied = (node.metadata.annotations.as_ref())
            .and_then(|a| a.get(APPLIED_ANNOTATION))
            .cloned();
        let failure = (node.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_TYPE))
            .filter(|c| c.status == "False")
            .map(|c| c.message.clone().unwrap_or_default());
        NodeReport { applied, failure }
    }
}

/// Where a node is with the payload revision published for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// The node applied it.
    Applied,
    /// Not yet; `applied` is what the node runs now.
    Applying { applied: Option<String> },
    /// The node tried it and failed; the agent's message names the part and the step.
    Failed { message: String },
}

/// Where the node is with revision `published`. The agent's failure message starts with the
/// revision it tried (`revision R failed: ...`), so a failure of an older revision does not
/// count against a newer one.
pub(crate) fn progress(published: &str, report: &NodeReport) -> Progress {
    if report.applied.as_deref() == Some(published) {
        return Progress::Applied;
    }
    match &report.failure {
        Some(message) if message.starts_with(&format!("revision {published} ")) => {
            Progress::Failed {
                message: message.clone(),
            }
        }
        _ => Progress::Applying {
            applied: report.applied.clone(),
        },
    }
}

/// The `InPlaceUpdating` condition of a config whose node `node` has payload `published`:
/// True while Cluster API marks the update (`updating`), False once it ended.
pub(crate) fn condition(
    updating: bool,
    node: &str,
    published: &str,
    progress: &Progress,
) -> Desired<'static> {
    let (status, reason, message) = match (updating, progress) {
        (_, Progress::Failed { message }) => (
            updating,
            reason::IN_PLACE_UPDATE_FAILED,
            format!("node {node}: {message}"),
        ),
        (true, Progress::Applied) => (
            true,
            reason::IN_PLACE_UPDATING,
            format!(
                "node {node} applied payload revision {published}; Cluster API completes the update"
            ),
        ),
        (true, Progress::Applying { applied }) => (
            true,
            reason::IN_PLACE_UPDATING,
            format!(
                "node {node} is applying payload revision {published} (it runs {})",
                applied.as_deref().unwrap_or("none yet")
            ),
        ),
        (false, Progress::Applied) => (
            false,
            reason::IN_PLACE_UPDATED,
            format!("node {node} applied payload revision {published}"),
        ),
        (false, Progress::Applying { .. }) => (
            false,
            reason::IN_PLACE_UPDATED,
            format!(
                "Cluster API ended the update; node {node} has payload revision {published} to apply"
            ),
        ),
    };
    Desired {
        type_: conditions::IN_PLACE_UPDATING,
        status,
        reason,
        message,
    }
}

/// What a change of the `InPlaceUpdating` condition from `previous` to `desired` is worth: an
/// Event, and the `result` label of `bootplate_inplace_updates_total` (`started`, `succeeded`,
/// `failed`). Nothing when the condition says what it said.
pub(crate) fn transition(
    previous: &BootplateConfigStatus,
    desired: &Desired<'_>,
) -> Option<(Note, &'static str)> {
    let before = in_place_condition(previous);
    let was_updating = before.is_some_and(|c| c.status == "True");
    let same = before.is_some_and(|c| c.reason == desired.reason && c.message == desired.message);
    if same {
        return None;
    }
    let note = |warning, reason, result| {
        let text = desired.message.clone();
        (
            Note {
                warning,
                reason,
                action: "UpdateInPlace",
                text,
            },
            result,
        )
    };
    if desired.reason == reason::IN_PLACE_UPDATE_FAILED {
        let unchanged_failure = before.is_some_and(|c| c.reason == desired.reason);
        return (!unchanged_failure).then(|| note(true, "InPlaceUpdateFailed", "failed"));
    }
    match (was_updating, desired.status) {
        (false, true) => Some(note(false, "InPlaceUpdateStarted", "started")),
        (true, false) => Some(note(false, "InPlaceUpdated", "succeeded")),
        _ => None,
    }
}

/// The answer to Cluster API's `UpdateMachine` hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UpdateAnswer {
    /// Success (else Failure: Cluster API marks the Machine's update failed and retries).
    pub success: bool,
    /// For people: Cluster API shows it on the Machine or in its log.
    pub message: String,
    /// Non-zero: still in progress, ask again after this many seconds.
    pub retry_after_seconds: i32,
}

/// The answer to `UpdateMachine` for a config with status `status` at `generation`: done once
/// the payload of this spec is published and applied; failed with the node's message; in
/// progress otherwise.
pub(crate) fn update_answer(
    status: &BootplateConfigStatus,
    generation: Option<i64>,
) -> UpdateAnswer {
    let waiting = |message: String| UpdateAnswer {
        success: true,
        message,
        retry_after_seconds: RETRY_AFTER_SECONDS,
    };
    let Some(in_place) = status
        .in_place
        .as_ref()
        .filter(|s| s.observed_generation == generation && s.published_revision.is_some())
    else {
        return waiting(format!(
            "waiting for bootplate to publish the node payload of generation {}",
            generation.unwrap_or_default()
        ));
    };
    let published = in_place.published_revision.as_deref().unwrap_or_default();
    let node = in_place.node.as_deref().unwrap_or_default();
    if let Some(failed) = in_place_condition(status)
        .filter(|c| c.reason == reason::IN_PLACE_UPDATE_FAILED && c.message.contains(published))
    {
        return UpdateAnswer {
            success: false,
            message: failed.message.clone(),
            retry_after_seconds: 0,
        };
    }
    if in_place.applied_revision.as_deref() == Some(published) {
        return UpdateAnswer {
            success: true,
            message: format!("node {node} applied payload revision {published}"),
            retry_after_seconds: 0,
        };
    }
    waiting(format!(
        "node {node} is applying payload revision {published}"
    ))
}

/// The answer to `CanUpdateMachineSet` or `CanUpdateMachine` for the bootstrap object: whether
/// to return the patch that makes the current spec the desired one (Cluster API then updates the
/// machines in place, provided nothing else differs), why, and the metric's answer label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CanUpdate {
    /// Return the patch.
    pub patch: bool,
    /// Answer with success; `false` refuses the update (`updatePolicy: InPlaceOnly`), so Cluster
    /// API neither updates nor replaces the machines.
    pub success: bool,
    /// For people (Cluster API logs it).
    pub message: String,
    /// `in_place`, `unchanged`, `rollout` or `refused`.
    pub answer: &'static str,
}

/// What `plan` (the desired render compared with the current one; `Err`: they could not be
/// compared, with why) means for Cluster API: a change that lies only in `InPlace` parts, or
/// none, is taken; anything else, or a render that fails, is left to a rollout, unless
/// `in_place_only` names the object whose `updatePolicy: InPlaceOnly` forbids one: then it is
/// refused.
pub(crate) fn can_update(
    plan: Result<render::UpdatePlan, String>,
    in_place_only: Option<&str>,
) -> CanUpdate {
    let taken = |message: String, answer| CanUpdate {
        patch: true,
        success: true,
        message,
        answer,
    };
    let needs_new_machines = |why: String| match in_place_only {
        None => CanUpdate {
            patch: false,
            success: true,
            message: format!("needs new machines: {why}"),
            answer: "rollout",
        },
        Some(object) => CanUpdate {
            patch: false,
            success: false,
            message: format!(
                "refused: {object} has updatePolicy InPlaceOnly and this change needs new machines: {why}"
            ),
            answer: "refused",
        },
    };
    match plan {
        Ok(render::UpdatePlan::Unchanged) => {
            taken("the bootstrap data renders the same".into(), "unchanged")
        }
        Ok(render::UpdatePlan::InPlace { parts }) => taken(
            format!(
                "parts {} change, all `update: InPlace`: bootplate-agent applies them on the node",
                parts
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "in_place",
        ),
        Ok(render::UpdatePlan::Rollout { reason }) => needs_new_machines(reason),
        Err(why) => needs_new_machines(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;

    fn report(applied: Option<&str>, failure: Option<&str>) -> NodeReport {
        NodeReport {
            applied: applied.map(str::to_owned),
            failure: failure.map(str::to_owned),
        }
    }

    #[test]
    fn cluster_apis_mark_is_an_annotation() {
        let mut meta = ObjectMeta::default();
        assert!(!in_progress(&meta));
        meta.annotations = Some(BTreeMap::from([(
            UPDATE_IN_PROGRESS_ANNOTATION.to_owned(),
            String::new(),
        )]));
        assert!(in_progress(&meta));
    }

    #[test]
    fn a_payload_is_published_for_each_spec_cluster_api_updates_to_and_never_before() {
        let published = InPlaceStatus {
            published_revision: Some("r1".into()),
            observed_generation: Some(1),
            ..Default::default()
        };
        let unpublished = InPlaceStatus {
            node: Some("n".into()),
            ..Default::default()
        };
        // (what was published, the config's generation, Cluster API's mark, publish?, why)
        let cases: [(Option<&InPlaceStatus>, i64, bool, bool, &str); 7] = [
            (
                None,
                1,
                false,
                false,
                "joined, no update: the user-data wrote the parts",
            ),
            (None, 1, true, true, "the first update"),
            (
                Some(&unpublished),
                2,
                true,
                true,
                "the first update, node recorded",
            ),
            (Some(&unpublished), 2, false, false, "no update"),
            (Some(&published), 1, true, false, "this spec is published"),
            (
                Some(&published),
                2,
                false,
                false,
                "a change without Cluster API's mark",
            ),
            (Some(&published), 2, true, true, "the next update"),
        ];
        for (previous, generation, updating, expected, why) in cases {
            assert_eq!(
                publish_needed(previous, Some(generation), updating),
                expected,
                "{why}"
            );
        }
    }

    #[test]
    fn the_node_report_is_read_from_the_agents_annotation_and_condition() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "annotations": {APPLIED_ANNOTATION: "r1"}},
            "status": {"conditions": [{"type": CONDITION_TYPE, "status": "False",
                "message": "revision r2 failed: part configure: command 1 exited 1"}]}
        }))
        .unwrap();
        let report = NodeReport::from_node(&node);
        assert_eq!(report.applied.as_deref(), Some("r1"));
        assert_eq!(
            progress("r2", &report),
            Progress::Failed {
                message: "revision r2 failed: part configure: command 1 exited 1".into()
            }
        );
        assert_eq!(
            progress("r3", &report),
            Progress::Applying {
                applied: Some("r1".into())
            },
            "an older revision's failure does not count against a newer one"
        );
        assert_eq!(progress("r1", &report), Progress::Applied);
        let healthy: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(NodeReport::from_node(&healthy), report_none());
    }

    fn report_none() -> NodeReport {
        report(None, None)
    }

    fn status_with(desired: Desired<'_>) -> BootplateConfigStatus {
        BootplateConfigStatus {
            conditions: super::super::status::conditions(
                &[],
                vec![desired],
                Some(1),
                Timestamp::UNIX_EPOCH,
            ),
            ..Default::default()
        }
    }

    #[test]
    fn an_update_runs_since_its_condition_turned_true_and_not_after_it_ended() {
        let applying = Progress::Applying { applied: None };
        assert_eq!(updating_since(&BootplateConfigStatus::default()), None);
        let during = status_with(condition(true, "n", "r2", &applying));
        assert_eq!(updating_since(&during), Some(Timestamp::UNIX_EPOCH));
        let ended = status_with(condition(false, "n", "r2", &Progress::Applied));
        assert_eq!(updating_since(&ended), None);
    }

    #[test]
    fn the_condition_follows_the_update_and_each_step_is_told_once() {
        let none = BootplateConfigStatus::default();
        let applying = Progress::Applying { applied: None };
        let started = condition(true, "n", "r2", &applying);
        assert!(started.status);
        assert_eq!(started.reason, reason::IN_PLACE_UPDATING);
        let (note, result) = transition(&none, &started).unwrap();
        assert_eq!(
            (note.reason, result, note.warning),
            ("InPlaceUpdateStarted", "started", false)
        );
        let during = status_with(condition(true, "n", "r2", &applying));
        assert!(transition(&during, &condition(true, "n", "r2", &applying)).is_none());

        let failed = condition(
            true,
            "n",
            "r2",
            &progress(
                "r2",
                &report(None, Some("revision r2 failed: part configure: x")),
            ),
        );
        assert_eq!(failed.reason, reason::IN_PLACE_UPDATE_FAILED);
        assert_eq!(
            failed.message,
            "node n: revision r2 failed: part configure: x"
        );
        let (note, result) = transition(&during, &failed).unwrap();
        assert_eq!(
            (note.reason, result, note.warning),
            ("InPlaceUpdateFailed", "failed", true)
        );
        assert!(
            transition(
                &status_with(condition(
                    true,
                    "n",
                    "r2",
                    &progress(
                        "r2",
                        &report(None, Some("revision r2 failed: part configure: x"))
                    )
                )),
                &failed
            )
            .is_none()
        );

        let done = condition(false, "n", "r2", &Progress::Applied);
        assert!(!done.status);
        assert_eq!(done.reason, reason::IN_PLACE_UPDATED);
        let (note, result) = transition(&during, &done).unwrap();
        assert_eq!((note.reason, result), ("InPlaceUpdated", "succeeded"));
        assert!(
            observe_node(&during, false),
            "one more look after Cluster API ends it"
        );
        assert!(!observe_node(&status_with(done), false));
    }

    #[test]
    fn only_changes_within_in_place_parts_are_taken() {
        let in_place = || {
            Ok(render::UpdatePlan::InPlace {
                parts: vec!["configure".into()],
            })
        };
        let rollout = || {
            Ok(render::UpdatePlan::Rollout {
                reason: "part `install` changed and is not `update: InPlace`".into(),
            })
        };
        let broken = || Err("BootstrapTemplate ns/v2 not found".to_owned());
        let policy = Some("BootstrapTemplate fleet/inplace");
        struct Case {
            plan: Result<render::UpdatePlan, String>,
            in_place_only: Option<&'static str>,
            /// patch, success, answer
            expected: (bool, bool, &'static str),
            /// in the message
            says: &'static str,
        }
        let case = |plan, in_place_only, expected, says| Case {
            plan,
            in_place_only,
            expected,
            says,
        };
        let cases = [
            case(in_place(), None, (true, true, "in_place"), "`configure`"),
            case(in_place(), policy, (true, true, "in_place"), "`configure`"),
            case(
                Ok(render::UpdatePlan::Unchanged),
                policy,
                (true, true, "unchanged"),
                "same",
            ),
            case(rollout(), None, (false, true, "rollout"), "part `install`"),
            case(broken(), None, (false, true, "rollout"), "not found"),
            case(
                rollout(),
                policy,
                (false, false, "refused"),
                "has updatePolicy InPlaceOnly",
            ),
            case(broken(), policy, (false, false, "refused"), "not found"),
        ];
        for Case {
            plan,
            in_place_only,
            expected,
            says,
        } in cases
        {
            let got = can_update(plan, in_place_only);
            assert_eq!((got.patch, got.success, got.answer), expected, "{says}");
            assert!(got.message.contains(says), "{}", got.message);
        }
    }

    #[test]
    fn update_machine_is_done_only_when_this_specs_payload_is_applied() {
        let mut status = BootplateConfigStatus::default();
        let answer = update_answer(&status, Some(2));
        assert!(answer.success && answer.retry_after_seconds > 0);
        assert!(
            answer.message.contains("generation 2"),
            "{}",
            answer.message
        );

        status.in_place = Some(InPlaceStatus {
            node: Some("n".into()),
            published_revision: Some("r2".into()),
            applied_revision: Some("r1".into()),
            observed_generation: Some(1),
        });
        let stale = update_answer(&status, Some(2));
        assert!(stale.retry_after_seconds > 0, "published for an older spec");

        status.in_place.as_mut().unwrap().observed_generation = Some(2);
        let applying = update_answer(&status, Some(2));
        assert_eq!(
            (
                applying.success,
                applying.retry_after_seconds,
                applying.message.as_str()
            ),
            (
                true,
                RETRY_AFTER_SECONDS,
                "node n is applying payload revision r2"
            )
        );

        let failed = status_with(condition(
            true,
            "n",
            "r2",
            &Progress::Failed {
                message: "revision r2 failed: part configure: command 1 exited 1".into(),
            },
        ));
        let failed = BootplateConfigStatus {
            in_place: status.in_place.clone(),
            ..failed
        };
        let answer = update_answer(&failed, Some(2));
        assert!(!answer.success);
        assert!(
            answer.message.contains("part configure"),
            "{}",
            answer.message
        );

        status.in_place.as_mut().unwrap().applied_revision = Some("r2".into());
        let done = update_answer(&status, Some(2));
        assert_eq!((done.success, done.retry_after_seconds), (true, 0));
    }
}
