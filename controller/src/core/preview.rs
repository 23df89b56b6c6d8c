//! What an update of a template will do to the machines of the configs that reference it, told
//! at admission as warnings (`kubectl apply` and `kubectl apply --dry-run=server` print them):
//! where each config stands and, for a running machine, how it takes the change go in; the
//! counts and the warnings' text come out.
//!
//! The rules it tells are the controller's: a template change re-renders every config whose
//! machine has not joined (and every MachinePool's config, for its new instances); a joined
//! machine's data is frozen, so the machine runs an older revision until Cluster API rolls it
//! out, in place when every difference lies in `update: InPlace` parts and its in-place updates
//! are on, by replacement otherwise.

/// How a running machine takes a change, judged by rendering both revisions for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Both revisions render the same bootstrap data for it.
    Unchanged,
    /// Every difference lies in `InPlace` parts: these.
    InPlace { parts: Vec<String> },
    /// Something outside the `InPlace` parts differs: why (the part or field).
    Replaced { why: String },
    /// It could not be judged: why (the old revision no longer renders for it, the new one does
    /// not, or too many distinct specs to render at admission).
    Unjudged { why: String },
}

/// Where a config that references the template stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Its machine has not joined: it re-renders from the new revision before it boots (or, when
    /// its machine already booted from the old data, it is replaced by what Cluster API does
    /// next, never by this change).
    BeforeJoin,
    /// A MachinePool's: re-rendered, the pool's new instances boot from the new revision.
    Pool,
    /// Its machine joined: its data is frozen, and this is how it takes the change.
    Running(Verdict),
}

/// One config that references the template: its name (`namespace/name`) and where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConfigFact {
    pub name: String,
    pub stage: Stage,
}

/// What the update does, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Preview {
    /// Configs whose machines have not joined: they re-render.
    pub before_join: usize,
    /// MachinePools' configs: they re-render.
    pub pools: usize,
    /// Running machines whose bootstrap data does not change.
    pub unchanged: usize,
    /// Running machines that can take the change in place.
    pub in_place: usize,
    /// The `InPlace` parts those machines take, in the order first seen.
    pub parts: Vec<String>,
    /// Running machines replaced on their next rollout.
    pub replaced: usize,
    /// The first of them: its config and why.
    pub first_replaced: Option<(String, String)>,
    /// Running machines not judged.
    pub unjudged: usize,
    /// The first of them: its config and why.
    pub first_unjudged: Option<(String, String)>,
}

/// Counts what the update does to `facts`, the configs of the template.
pub(crate) fn preview(facts: impl IntoIterator<Item = ConfigFact>) -> Preview {
    let mut preview = Preview::default();
    for fact in facts {
        match fact.stage {
            Stage::BeforeJoin => preview.before_join += 1,
            Stage::Pool => preview.pools += 1,
            Stage::Running(Verdict::Unchanged) => preview.unchanged += 1,
            Stage::Running(Verdict::InPlace { parts }) => {
                preview.in_place += 1;
                for part in parts {
                    if !preview.parts.contains(&part) {
                        preview.parts.push(part);
                    }
                }
            }
            Stage::Running(Verdict::Replaced { why }) => {
                preview.replaced += 1;
                preview.first_replaced.get_or_insert((fact.name, why));
            }
            Stage::Running(Verdict::Unjudged { why }) => {
                preview.unjudged += 1;
                preview.first_unjudged.get_or_insert((fact.name, why));
            }
        }
    }
    preview
}

/// The most parts a warning names; the rest are counted.
const PARTS_NAMED: usize = 5;

impl Preview {
    /// Running machines that will run an older revision than the template's.
    pub(crate) fn outdated(&self) -> usize {
        self.in_place + self.replaced + self.unjudged
    }

    /// The warnings that tell it, one fact each (the apiserver shows each on a line of its own).
    pub(crate) fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.before_join + self.pools + self.unchanged + self.outdated() == 0 {
            warnings.push("no config references this template: nothing re-renders".to_owned());
        }
        if self.before_join > 0 {
            warnings.push(format!(
                "{} config(s) whose machines have not joined re-render from this revision",
                self.before_join
            ));
        }
        if self.pools > 0 {
            warnings.push(format!(
                "{} MachinePool config(s) re-render: their new instances boot from this revision",
                self.pools
            ));
        }
        if self.unchanged > 0 {
            warnings.push(format!(
                "{} running machine(s) get the same bootstrap data: nothing changes for them",
                self.unchanged
            ));
        }
        if self.outdated() > 0 {
            warnings.push(format!(
                "{} running machine(s) become outdated (an older revision) until Cluster API rolls them out",
                self.outdated()
            ));
        }
        if self.in_place > 0 {
            warnings.push(format!(
                "{} of them can take it in place when Cluster API updates them in place (parts {})",
                self.in_place,
                self.named_parts()
            ));
        }
        if let Some((config, why)) = &self.first_replaced {
            warnings.push(format!(
                "{} of them are replaced on their next rollout (BootplateConfig {config}: {why})",
                self.replaced
            ));
        }
        if let Some((config, why)) = &self.first_unjudged {
            warnings.push(format!(
                "{} of them could not be judged (BootplateConfig {config}: {why})",
                self.unjudged
            ));
        }
        warnings
    }

    fn named_parts(&self) -> String {
        let named: Vec<String> = (self.parts.iter().take(PARTS_NAMED))
            .map(|p| format!("`{p}`"))
            .collect();
        let more = self.parts.len().saturating_sub(PARTS_NAMED);
        if more > 0 {
            format!("{} and {more} more", named.join(", "))
        } else {
            named.join(", ")
        }
    }
}

/// What an edit of a BootplateConfigTemplate does, told as warnings: `cloned` configs (its
/// machines; `None`: more than `bound`, not counted) keep theirs, since Cluster API clones a
/// config template when it creates a machine and does not roll out for an edit of one.
pub(crate) fn config_template_warnings(cloned: Option<usize>, bound: usize) -> Vec<String> {
    let created = match cloned {
        Some(0) => "no machine was created from this config template yet".to_owned(),
        Some(count) => format!(
            "{count} machine(s) created from this config template keep their configs: Cluster API does not roll out on this edit"
        ),
        None => format!(
            "more than {bound} configs in this namespace: the machines created from it are not counted"
        ),
    };
    vec![
        created,
        "machines created from now on render from this spec; to roll out all of them, point the \
         MachineDeployment at a new config template"
            .to_owned(),
    ]
}

/// A MachineDeployment's move to another config template: how many of its machines joined, the
/// config template it moves `to`, how one joined machine takes the move (`None`: none joined),
/// and the object whose `updatePolicy: InPlaceOnly` holds its machines to in-place updates.
pub(crate) struct Rollout<'a> {
    pub joined: usize,
    pub to: &'a str,
    pub verdict: Option<Verdict>,
    pub held_by: Option<String>,
}

/// What Cluster API's rollout of such a move does, told as warnings.
pub(crate) fn rollout_warnings(rollout: &Rollout) -> Vec<String> {
    let to = rollout.to;
    let Some(verdict) = &rollout.verdict else {
        return vec![format!(
            "no machine of this MachineDeployment has joined: its machines render from BootplateConfigTemplate {to}"
        )];
    };
    let mut warnings = vec![format!(
        "{} joined machine(s) of this MachineDeployment roll out to BootplateConfigTemplate {to}",
        rollout.joined
    )];
    warnings.push(match (verdict, &rollout.held_by) {
        (Verdict::Unchanged, _) => {
            "their bootstrap data renders the same: Cluster API updates them without a change".to_owned()
        }
        (Verdict::InPlace { parts }, _) => format!(
            "they can take it in place (parts {}) when Cluster API's in-place updates are on; else they are replaced",
            parts.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        ),
        (Verdict::Replaced { why }, Some(holder)) => format!(
            "bootplate refuses this rollout: {holder} has updatePolicy InPlaceOnly and it needs new machines ({why}); no machine is replaced"
        ),
        (Verdict::Replaced { why }, None) => format!("they are replaced: {why}"),
        (Verdict::Unjudged { why }, _) => format!("how they take it could not be judged: {why}"),
    });
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(name: &str, stage: Stage) -> ConfigFact {
        ConfigFact {
            name: name.to_owned(),
            stage,
        }
    }

    fn running(verdict: Verdict) -> Stage {
        Stage::Running(verdict)
    }

    fn in_place(parts: &[&str]) -> Verdict {
        Verdict::InPlace {
            parts: parts.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    fn replaced(why: &str) -> Verdict {
        Verdict::Replaced {
            why: why.to_owned(),
        }
    }

    struct Case {
        name: &'static str,
        facts: Vec<ConfigFact>,
        /// Each expected warning holds this text, in this order; no other warning.
        warnings: &'static [&'static str],
    }

    fn cases() -> Vec<Case> {
        vec![
            Case {
                name: "no config",
                facts: vec![],
                warnings: &["no config references this template"],
            },
            Case {
                name: "machines before their join re-render, pools too",
                facts: vec![
                    fact("ns/a", Stage::BeforeJoin),
                    fact("ns/b", Stage::BeforeJoin),
                    fact("ns/pool", Stage::Pool),
                ],
                warnings: &[
                    "2 config(s) whose machines have not joined re-render",
                    "1 MachinePool config(s) re-render",
                ],
            },
            Case {
                name: "running machines with the same data",
                facts: vec![fact("ns/a", running(Verdict::Unchanged))],
                warnings: &["1 running machine(s) get the same bootstrap data"],
            },
            Case {
                name: "in place, parts named once each",
                facts: vec![
                    fact("ns/a", running(in_place(&["kubelet-config"]))),
                    fact("ns/b", running(in_place(&["kubelet-config", "motd"]))),
                ],
                warnings: &[
                    "2 running machine(s) become outdated",
                    "2 of them can take it in place when Cluster API updates them in place (parts `kubelet-config`, `motd`)",
                ],
            },
            Case {
                name: "replaced and in place mixed, the first replaced named",
                facts: vec![
                    fact("ns/a", running(in_place(&["motd"]))),
                    fact(
                        "ns/b",
                        running(replaced("role worker: part `install` changed")),
                    ),
                    fact(
                        "ns/c",
                        running(replaced("role worker: part `other` changed")),
                    ),
                    fact("ns/d", Stage::BeforeJoin),
                ],
                warnings: &[
                    "1 config(s) whose machines have not joined",
                    "3 running machine(s) become outdated",
                    "1 of them can take it in place",
                    "2 of them are replaced on their next rollout (BootplateConfig ns/b: role worker: part `install` changed)",
                ],
            },
            Case {
                name: "not judged",
                facts: vec![fact(
                    "ns/a",
                    running(Verdict::Unjudged {
                        why: "too many".into(),
                    }),
                )],
                warnings: &[
                    "1 running machine(s) become outdated",
                    "1 of them could not be judged (BootplateConfig ns/a: too many)",
                ],
            },
        ]
    }

    #[test]
    fn each_stage_and_verdict_is_counted_and_told() {
        for case in cases() {
            let warnings = preview(case.facts).warnings();
            assert_eq!(
                warnings.len(),
                case.warnings.len(),
                "{}: {warnings:#?}",
                case.name
            );
            for (warning, expected) in warnings.iter().zip(case.warnings) {
                assert!(warning.contains(expected), "{}: {warning}", case.name);
            }
        }
    }

    #[test]
    fn a_config_templates_edit_tells_how_many_machines_keep_their_configs() {
        let counted = config_template_warnings(Some(3), 10);
        assert!(counted[0].starts_with("3 machine(s) created from this config template keep"));
        assert!(counted[1].contains("point the MachineDeployment at a new config template"));
        assert!(config_template_warnings(Some(0), 10)[0].contains("no machine was created"));
        assert!(config_template_warnings(None, 10)[0].contains("more than 10 configs"));
    }

    #[test]
    fn a_deployments_move_tells_what_its_rollout_does() {
        let rollout = |verdict: Option<Verdict>, held_by: Option<&str>| {
            rollout_warnings(&Rollout {
                joined: 3,
                to: "md-v2",
                verdict,
                held_by: held_by.map(str::to_owned),
            })
        };
        let cases: [(&str, Vec<String>, &[&str]); 5] = [
            (
                "none joined",
                rollout(None, None),
                &["no machine of this MachineDeployment has joined"],
            ),
            (
                "in place",
                rollout(Some(in_place(&["configure"])), None),
                &[
                    "3 joined machine(s) of this MachineDeployment roll out to BootplateConfigTemplate md-v2",
                    "they can take it in place (parts `configure`)",
                ],
            ),
            (
                "replaced",
                rollout(Some(replaced("part `install` changed")), None),
                &["3 joined", "they are replaced: part `install` changed"],
            ),
            (
                "held",
                rollout(
                    Some(replaced("part `install` changed")),
                    Some("BootplateConfigTemplate ns/md-v1"),
                ),
                &[
                    "3 joined",
                    "bootplate refuses this rollout: BootplateConfigTemplate ns/md-v1 has updatePolicy InPlaceOnly",
                ],
            ),
            (
                "unchanged",
                rollout(Some(Verdict::Unchanged), None),
                &["3 joined", "renders the same"],
            ),
        ];
        for (case, warnings, expected) in cases {
            assert_eq!(warnings.len(), expected.len(), "{case}: {warnings:#?}");
            for (warning, expected) in warnings.iter().zip(expected) {
                assert!(warning.contains(expected), "{case}: {warning}");
            }
        }
    }

    #[test]
    fn many_parts_are_named_up_to_a_bound() {
        let parts: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let preview = preview([fact("ns/a", running(in_place(&refs)))]);
        let warning = &preview.warnings()[1];
        assert!(
            warning.contains("`p4` and 3 more") && !warning.contains("p5"),
            "{warning}"
        );
    }
}
