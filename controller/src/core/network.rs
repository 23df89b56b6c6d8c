//! Whether a config's network input (`spec.network`) reaches its machine: a template that
//! never reads a field the config sets renders without it. The config still renders and stays
//! ready, but says so: the `NetworkApplied` condition, one Warning Event per change, and a
//! metric by template.

use crd_types::BootplateConfigStatus;
use crd_types::conditions::{self, reason};
use k8s_openapi::jiff::Timestamp;

use super::outcome::Note;
use super::status::{self, Desired};

/// What a render makes of the config's network input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum View {
    /// The config sets no field of the input.
    Unset,
    /// The template reads every field the config sets.
    Applied {
        /// The template (kind and name, as messages name it).
        template: String,
        /// The fields set.
        fields: Vec<&'static str>,
    },
    /// The template never reads `ignored` (all of `fields` for a template that takes no
    /// network input).
    Ignored {
        /// The template (kind and name, as messages name it).
        template: String,
        /// The fields set.
        fields: Vec<&'static str>,
        /// The fields set that the template never reads.
        ignored: Vec<&'static str>,
    },
}

/// The view from the fields the config sets (`set`) and those of them the template never
/// reads (`ignored`).
pub fn view(template: &str, set: Vec<&'static str>, ignored: Vec<&'static str>) -> View {
    let template = template.to_owned();
    match (set.is_empty(), ignored.is_empty()) {
        (true, _) => View::Unset,
        (false, true) => View::Applied {
            template,
            fields: set,
        },
        (false, false) => View::Ignored {
            template,
            fields: set,
            ignored,
        },
    }
}

/// The `NetworkApplied` condition `view` asks for; `None`: the config has none.
fn desired(view: &View) -> Option<Desired<'static>> {
    let names = |fields: &[&str]| {
        (fields.iter())
            .map(|f| format!("spec.network.{f}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match view {
        View::Unset => None,
        View::Applied { template, fields } => Some(Desired {
            type_: conditions::NETWORK_APPLIED,
            status: true,
            reason: reason::NETWORK_RENDERED,
            message: format!("template {template} renders {}", names(fields)),
        }),
        View::Ignored {
            template,
            fields,
            ignored,
        } => {
            let message = if ignored == fields {
                format!(
                    "template {template} takes no network input: {} not applied to the machine (the config renders without it; pick a template that reads it, see docs/air-gapped.md)",
                    names(ignored)
                )
            } else {
                format!(
                    "template {template} never reads {}: not applied to the machine (it renders {}; see docs/air-gapped.md)",
                    names(ignored),
                    names(&without(fields, ignored)),
                )
            };
            Some(Desired {
                type_: conditions::NETWORK_APPLIED,
                status: false,
                reason: reason::NETWORK_IGNORED,
                message,
            })
        }
    }
}

fn without(fields: &[&'static str], ignored: &[&'static str]) -> Vec<&'static str> {
    (fields.iter())
        .filter(|f| !ignored.contains(f))
        .copied()
        .collect()
}

/// `status` with the `NetworkApplied` condition of `view` (removed for [`View::Unset`]); the
/// transition time is kept from `previous` while the condition's status holds.
pub(crate) fn with_network(
    mut status: BootplateConfigStatus,
    previous: &BootplateConfigStatus,
    view: &View,
    now: Timestamp,
) -> BootplateConfigStatus {
    status
        .conditions
        .retain(|c| c.type_ != conditions::NETWORK_APPLIED);
    if let Some(desired) = desired(view) {
        let generation = status.observed_generation;
        let set = status::conditions(&previous.conditions, vec![desired], generation, now);
        status.conditions.extend(set);
    }
    status
}

/// Whether the stored status (`previous`) lacks what `view` says: then the status is written
/// even when nothing else changed.
pub(crate) fn changed(previous: &BootplateConfigStatus, view: &View) -> bool {
    let stored = (previous.conditions.iter())
        .find(|c| c.type_ == conditions::NETWORK_APPLIED)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()));
    let wanted = desired(view);
    let wanted = wanted.as_ref().map(|d| {
        let status = if d.status { "True" } else { "False" };
        (status, d.reason, d.message.as_str())
    });
    stored != wanted
}

/// The warning `bootplate render` prints for `view`: the condition's message, when the
/// template ignores part of the input.
pub fn warning(view: &View) -> Option<String> {
    match view {
        View::Ignored { .. } => desired(view).map(|d| d.message),
        _ => None,
    }
}

/// The Warning Event of an ignored input, only when the stored condition did not already say
/// the same (once per change, not once per reconcile).
pub(crate) fn note(previous: &BootplateConfigStatus, view: &View) -> Option<Note> {
    let View::Ignored { .. } = view else {
        return None;
    };
    let desired = desired(view)?;
    changed(previous, view).then_some(Note {
        warning: true,
        reason: reason::NETWORK_IGNORED,
        action: "Render",
        text: desired.message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    const T: &str = "ClusterBootstrapTemplate plain-linux";

    fn stored(view: &View) -> BootplateConfigStatus {
        with_network(
            BootplateConfigStatus::default(),
            &BootplateConfigStatus::default(),
            view,
            Timestamp::UNIX_EPOCH,
        )
    }

    fn condition(status: &BootplateConfigStatus) -> Option<&Condition> {
        (status.conditions.iter()).find(|c| c.type_ == conditions::NETWORK_APPLIED)
    }

    /// Each case: the fields set, those never read, and the condition (status, reason, message
    /// fragments) that follows; `None` for no condition.
    #[test]
    fn the_condition_names_the_template_and_the_fields_it_ignores() {
        type Case = (
            Vec<&'static str>,
            Vec<&'static str>,
            Option<(&'static str, &'static str, Vec<&'static str>)>,
        );
        let cases: Vec<Case> = vec![
            (vec![], vec![], None),
            (
                vec!["proxy", "caBundles"],
                vec![],
                Some((
                    "True",
                    "NetworkRendered",
                    vec![T, "spec.network.proxy, spec.network.caBundles"],
                )),
            ),
            (
                vec!["proxy", "ntpServers"],
                vec!["proxy", "ntpServers"],
                Some((
                    "False",
                    "NetworkIgnored",
                    vec![
                        T,
                        "takes no network input",
                        "spec.network.proxy, spec.network.ntpServers not applied",
                    ],
                )),
            ),
            (
                vec!["proxy", "artifacts"],
                vec!["artifacts"],
                Some((
                    "False",
                    "NetworkIgnored",
                    vec![
                        T,
                        "never reads spec.network.artifacts",
                        "renders spec.network.proxy",
                    ],
                )),
            ),
        ];
        for (set, ignored, expected) in cases {
            let view = view(T, set.clone(), ignored.clone());
            let status = stored(&view);
            let got = condition(&status);
            match (&expected, got) {
                (None, None) => {}
                (Some((s, r, fragments)), Some(c)) => {
                    assert_eq!((c.status.as_str(), c.reason.as_str()), (*s, *r), "{set:?}");
                    for f in fragments {
                        assert!(
                            c.message.contains(f),
                            "{set:?}: {:?} lacks {f:?}",
                            c.message
                        );
                    }
                }
                _ => panic!("{set:?} {ignored:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    /// The Event comes once per change of what is ignored: not again while the stored
    /// condition says the same, again when the ignored fields change, never when all is read.
    #[test]
    fn an_ignored_input_is_told_once_per_change() {
        let ignored = view(T, vec!["proxy"], vec!["proxy"]);
        let more = view(T, vec!["proxy", "ntpServers"], vec!["proxy", "ntpServers"]);
        let applied = view(T, vec!["proxy"], vec![]);
        let none = BootplateConfigStatus::default();
        let cases = [
            (&none, &ignored, true),
            (&stored(&ignored), &ignored, false),
            (&stored(&ignored), &more, true),
            (&stored(&applied), &ignored, true),
            (&none, &applied, false),
            (&stored(&ignored), &applied, false),
            (&none, &View::Unset, false),
        ];
        for (i, (previous, view, told)) in cases.into_iter().enumerate() {
            let note = note(previous, view);
            assert_eq!(note.is_some(), told, "case {i}: {note:?}");
            if let Some(note) = note {
                assert!(note.warning && note.reason == "NetworkIgnored", "case {i}");
            }
        }
    }

    /// The status is written when the condition is new, different or to be removed, and left
    /// alone when it already says what the view says.
    #[test]
    fn the_status_is_written_only_when_the_condition_changes() {
        let ignored = view(T, vec!["proxy"], vec!["proxy"]);
        let none = BootplateConfigStatus::default();
        assert!(changed(&none, &ignored));
        assert!(!changed(&stored(&ignored), &ignored));
        assert!(changed(&stored(&ignored), &View::Unset));
        assert!(!changed(&none, &View::Unset));
        let removed = with_network(stored(&ignored), &none, &View::Unset, Timestamp::UNIX_EPOCH);
        assert!(condition(&removed).is_none());
    }
}
