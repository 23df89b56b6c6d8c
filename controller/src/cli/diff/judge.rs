//! The verdict for one object of `bootplate diff`, per role: both revisions rendered for the
//! same machine and compared by `render::compare`, the comparison Cluster API's in-place hooks
//! and the admission webhook make, so the preview is the cluster's own verdict.

use crd_types::capi::{Cluster, Machine};
use crd_types::{BootplateConfigSpec, Role};
use render::{CompareError, CompiledTemplate, Problem, RenderContext, Revision, UpdatePlan};
use serde::Serialize;

use super::super::diagnostic::Diagnostic;
use super::super::input::{ConfigAt, ConfigInput, YamlFile, kind, template};
use super::super::objects::name_of;
use super::parts::{AgentActions, PartDiff, differences};
use super::tree::{At, Key, Pairing, Side};

/// The machine both revisions are rendered for.
pub enum Shape {
    /// `render::sample_context`: the sample cluster and machine lint renders with.
    Sample,
    /// `--machine` and `--cluster`.
    Given {
        machine: Box<Machine>,
        cluster: Box<Cluster>,
    },
}

impl Shape {
    fn context(&self, role: Role) -> RenderContext {
        match self {
            Shape::Sample => render::sample_context(role),
            Shape::Given { machine, cluster } => render::comparison_context(cluster, machine, role),
        }
    }
}

/// What a role's machines go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Both revisions render the same.
    Unchanged,
    /// Every difference lies in `update: InPlace` parts: bootplate-agent applies them.
    InPlace,
    /// Something else differs: Cluster API replaces the machines.
    Replacement,
    /// Neither revision renders for this role.
    NotServed,
    /// Only the new revision renders for this role: no running machine has the old one.
    NewlyServed,
    /// The old revision renders for this role and the new one does not.
    Fails,
}

impl Verdict {
    pub fn words(self) -> &'static str {
        match self {
            Verdict::Unchanged => "unchanged",
            Verdict::InPlace => "in place",
            Verdict::Replacement => "replacement",
            Verdict::NotServed => "not served",
            Verdict::NewlyServed => "newly served",
            Verdict::Fails => "fails to render",
        }
    }
}

/// One role's verdict and the differences behind it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleDiff {
    pub role: String,
    pub verdict: Verdict,
    /// What forces a replacement, why a role is not served, why the new revision fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The `InPlace` parts that change, for an in-place verdict.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub in_place_parts: Vec<String>,
    /// What bootplate-agent does on the node, for an in-place verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentActions>,
    pub parts: Vec<PartDiff>,
}

/// Whether an object is on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Presence {
    Both,
    Added,
    Removed,
}

/// One object's report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectDiff {
    #[serde(flatten)]
    pub key: Key,
    /// The old name, when two single files paired objects of different names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
    pub presence: Presence,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_file: Option<String>,
    pub roles: Vec<RoleDiff>,
}

/// What every object is judged with.
pub struct Inputs<'a> {
    pub old: &'a Side,
    pub new: &'a Side,
    pub shape: &'a Shape,
    pub roles: &'a [Role],
    /// `--config`: the variables a template is rendered with.
    pub config: Option<&'a ConfigInput>,
    /// `--with`: templates both sides share, for configs whose template is not on their side.
    pub with: &'a [YamlFile],
}

/// An object's report and its problems: `input` when a revision could not be read, compiled or
/// resolved, `failed` for renders of the new revision that fail.
pub struct Judged {
    pub object: ObjectDiff,
    pub input: Vec<Diagnostic>,
    pub failed: Vec<Diagnostic>,
}

/// Judges one pairing for every role of `inputs`.
pub fn judge(pairing: &Pairing, inputs: &Inputs<'_>) -> Judged {
    let shown =
        |side: &Side, at: Option<&(Key, At)>| at.map(|(_, a)| side.files[a.file].shown.clone());
    let (key, presence) = match (&pairing.old, &pairing.new) {
        (_, Some((key, _))) if pairing.old.is_some() => (key.clone(), Presence::Both),
        (_, Some((key, _))) => (key.clone(), Presence::Added),
        (Some((key, _)), None) => (key.clone(), Presence::Removed),
        (None, None) => unreachable!("a pairing holds an object"),
    };
    let renamed_from = (pairing.old.as_ref())
        .filter(|(old, _)| old.name != key.name)
        .map(|(old, _)| old.to_string());
    let mut judged = Judged {
        object: ObjectDiff {
            key,
            renamed_from,
            presence,
            old_file: shown(inputs.old, pairing.old.as_ref()),
            new_file: shown(inputs.new, pairing.new.as_ref()),
            roles: Vec::new(),
        },
        input: Vec::new(),
        failed: Vec::new(),
    };
    let (Some((_, old_at)), Some((_, new_at))) = (&pairing.old, &pairing.new) else {
        return judged;
    };
    let old = Prepared::new(SideInputs::of(inputs, inputs.old, "old"), *old_at);
    let new = Prepared::new(SideInputs::of(inputs, inputs.new, "new"), *new_at);
    let (old, new) = match (old, new) {
        (Ok(old), Ok(new)) => (old, new),
        (old, new) => {
            judged.input.extend(old.err().into_iter().flatten());
            judged.input.extend(new.err().into_iter().flatten());
            return judged;
        }
    };
    for role in inputs.roles {
        let (diff, failed) = role_diff(&old, &new, &inputs.shape.context(*role), *role);
        judged.object.roles.push(diff);
        judged.failed.extend(failed);
    }
    judged
}

/// One role's verdict; the located problems of a new revision that fails.
fn role_diff(
    old: &Prepared<'_>,
    new: &Prepared<'_>,
    ctx: &RenderContext,
    role: Role,
) -> (RoleDiff, Vec<Diagnostic>) {
    let mut diff = RoleDiff {
        role: role.to_string(),
        verdict: Verdict::Unchanged,
        reason: None,
        in_place_parts: Vec::new(),
        agent: None,
        parts: Vec::new(),
    };
    let comparison = match render::compare(old.revision(), new.revision(), ctx) {
        Ok(comparison) => comparison,
        Err(CompareError::New(e)) => {
            diff.verdict = Verdict::Fails;
            diff.reason = Some(e.to_string());
            return (diff, new.locate(&e, role));
        }
        Err(CompareError::Old(e)) => {
            // A role the old revision did not serve has no running machine to update.
            let new_alone = render::compare(new.revision(), new.revision(), ctx);
            diff.verdict = match new_alone {
                Ok(_) => Verdict::NewlyServed,
                Err(_) => Verdict::NotServed,
            };
            diff.reason = Some(e.to_string());
            return (diff, Vec::new());
        }
    };
    diff.parts = differences(&comparison.old, &comparison.new);
    match comparison.plan {
        UpdatePlan::Unchanged => {}
        UpdatePlan::InPlace { parts } => {
            diff.verdict = Verdict::InPlace;
            diff.in_place_parts = parts;
            if let (render::Renders::Parts(o), render::Renders::Parts(n)) =
                (&comparison.old, &comparison.new)
            {
                diff.agent = Some(AgentActions::between(o, n));
            }
        }
        UpdatePlan::Rollout { reason } => {
            diff.verdict = Verdict::Replacement;
            diff.reason = Some(reason);
        }
    }
    (diff, Vec::new())
}

/// One revision, ready to render: its template compiled, the config spec it renders with, and
/// where both are for locating problems.
struct Prepared<'a> {
    compiled: CompiledTemplate,
    config: BootplateConfigSpec,
    template: (&'a YamlFile, usize),
    /// The config's file, for its problems (the object's, or `--config`).
    config_at: Option<ConfigAt<'a>>,
}

/// One side of the comparison and what both sides share.
struct SideInputs<'a> {
    side: &'a Side,
    /// `--with`'s templates.
    with: &'a [YamlFile],
    /// `--config`.
    config: Option<&'a ConfigInput>,
    /// `old` or `new`, for messages.
    which: &'static str,
}

impl<'a> SideInputs<'a> {
    fn of(inputs: &Inputs<'a>, side: &'a Side, which: &'static str) -> SideInputs<'a> {
        SideInputs {
            side,
            with: inputs.with,
            config: inputs.config,
            which,
        }
    }
}

impl<'a> Prepared<'a> {
    fn new(given: SideInputs<'a>, at: At) -> Result<Prepared<'a>, Vec<Diagnostic>> {
        let SideInputs { side, config, .. } = given;
        let file = &side.files[at.file];
        let (template_at, spec, config_at) = match kind(&file.documents[at.index]) {
            "BootstrapTemplate" | "ClusterBootstrapTemplate" => (
                (file, at.index),
                config.map(|c| c.spec.clone()),
                config.map(ConfigInput::at),
            ),
            _ => {
                let (spec, config_at) = config_spec(file, at.index)?;
                let template_at = resolve(&given, &spec, &config_at)?;
                (template_at, Some(spec), Some(config_at))
            }
        };
        let (object, template_spec) = template(template_at.0, template_at.1)?;
        let at_template = |p: &Problem| locate(template_at, None, p);
        let compiled = CompiledTemplate::compile(&object, &template_spec)
            .map_err(|e| e.problems().iter().map(at_template).collect::<Vec<_>>())?;
        // A template alone renders with sample values for its required variables, as lint's
        // sample renders do.
        let config = compiled
            .sample_config(spec.as_ref())
            .or(spec)
            .unwrap_or_default();
        Ok(Prepared {
            compiled,
            config,
            template: template_at,
            config_at,
        })
    }

    fn revision(&self) -> Revision<'_> {
        Revision {
            template: &self.compiled,
            config: &self.config,
        }
    }

    /// The problems of a render error, each where its culprit is.
    fn locate(&self, e: &render::RenderError, role: Role) -> Vec<Diagnostic> {
        let mut problems = e.problems();
        for p in &mut problems {
            p.role.get_or_insert(role);
        }
        let config = self.config_at.as_ref();
        problems
            .iter()
            .map(|p| locate(self.template, config, p))
            .collect()
    }
}

/// A problem at its culprit: the config's file for the config's problems, the template's
/// otherwise.
fn locate(template: (&YamlFile, usize), config: Option<&ConfigAt<'_>>, p: &Problem) -> Diagnostic {
    let role = p.role.map(|r| format!(" (role {r})")).unwrap_or_default();
    let message = format!("{}{role}", p.message);
    match (p.origin, config) {
        (render::Origin::Config, Some(c)) => c.locate(&p.field, p.severity, p.code, message),
        _ => {
            let (file, index) = template;
            let location = file.positions.locate(index, &p.field, p.position);
            Diagnostic::new(&file.shown, location, p.severity, p.code, &p.field, message)
        }
    }
}

/// The spec of config document `index` of `file`, as the offline render reads it (placeholders
/// for Secrets' contents), and where it sits.
fn config_spec(
    file: &YamlFile,
    index: usize,
) -> Result<(BootplateConfigSpec, ConfigAt<'_>), Vec<Diagnostic>> {
    let (mut spec, spec_path) = super::super::input::config_spec(file, index)?;
    super::super::render::offline_spec(&mut spec);
    let at = ConfigAt {
        file,
        index,
        spec_path,
    };
    Ok((spec, at))
}

/// The template a config of `given`'s side references: among its side's files, else among
/// `--with`'s.
fn resolve<'a>(
    given: &SideInputs<'a>,
    spec: &BootplateConfigSpec,
    config: &ConfigAt<'_>,
) -> Result<(&'a YamlFile, usize), Vec<Diagnostic>> {
    let reference = &spec.template_ref;
    let (namespace, _) = name_of(&config.file.documents[config.index]);
    let find = |files: &'a [YamlFile]| {
        super::super::references::find(files, reference.kind.as_str(), &reference.name, namespace)
    };
    find(&given.side.files)
        .or_else(|| find(given.with))
        .ok_or_else(|| {
            let message = format!(
                "{} `{}` is not among the files of the {} side: give it on both sides, or with --with when it did not change",
                reference.kind, reference.name, given.which
            );
            vec![config.locate(
                "spec.templateRef.name",
                render::Severity::Error,
                "template-not-found",
                message,
            )]
        })
}
