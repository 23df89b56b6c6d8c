//! What the admission webhook checks, free of HTTP and TLS: each function returns the reasons
//! to deny, each naming the field (and, for template text, the line and column).

use std::collections::{HashMap, HashSet};

use crd_types::conditions::reason;
use crd_types::{BootplateConfig, BootplateConfigSpec, Role, TemplateSpec};
use render::{Origin, Severity, UpdatePlan};

use crate::core::gate::Owner;
use crate::k8s::templates::{
    check_one_content_source, check_secret_namespace, check_template_namespace,
};

/// Fields of a whole object (`apiVersion`, `kind`, `metadata`, `spec`) that do not fit its
/// kind's schema: unknown fields (naming the field probably meant), wrong types, values outside
/// an enum, missing required fields.
pub fn strict(object: &serde_json::Value) -> Vec<String> {
    // The apiserver adds status and managed fields; only what a user writes is checked.
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    crd_types::strict::check(&object)
        .into_iter()
        .map(|p| p.to_string())
        .collect()
}

/// Problems that make a template unusable: every template and partial compiles, variable
/// declarations are unique and their defaults match their schema, `template` and `parts`
/// are exclusive, part names are unique, and a sample render succeeds for every role.
pub fn template(display: &str, spec: &TemplateSpec) -> Vec<String> {
    render::lint(display, spec, None)
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .map(|p| p.to_string())
        .collect()
}

/// Problems of a generator: its endpoint (one https URL or a Service) and its CA bundle (PEM
/// certificates), as the controller builds its client.
pub fn generator(spec: &crd_types::GeneratorSpec) -> Vec<String> {
    match crate::generator::client::GeneratorClient::new(spec) {
        Ok(_) => Vec::new(),
        Err(problem) => vec![problem],
    }
}

/// Problems of a config spec at `field` (`spec`, or `spec.template.spec` in a config template)
/// in `namespace`, checked against its template when that exists.
pub fn config(
    field: &str,
    namespace: &str,
    spec: &BootplateConfigSpec,
    template: Option<(&str, &TemplateSpec)>,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = check_template_namespace(&spec.template_ref, namespace) {
        problems.push(format!(
            "{field}.{}",
            e.to_string().trim_start_matches("spec.")
        ));
    }
    if spec.template_ref.name.contains('/') {
        problems.push(format!(
            "{field}.templateRef.name: {:?} is not a name; a config can only reference a {} by name",
            spec.template_ref.name, spec.template_ref.kind
        ));
    }
    for (index, file) in spec.files.iter().enumerate() {
        let path = format!("{field}.files[{index}]");
        if let Err(e) = check_one_content_source(&path, file) {
            problems.push(e.to_string());
        } else if file.content.is_none() && file.content_from.is_none() {
            problems.push(format!("{path}: set content or contentFrom"));
        }
        if let Some(source) = &file.content_from {
            let field = format!("{path}.contentFrom.secret");
            if let Err(e) = check_secret_namespace(&field, &source.secret, namespace) {
                problems.push(e.to_string());
            }
            if source.secret.name.is_empty() || source.secret.name.contains('/') {
                problems.push(format!(
                    "{path}.contentFrom.secret.name: {:?} is not a Secret name",
                    source.secret.name
                ));
            }
        }
    }
    problems.extend(network(field, namespace, spec));
    if let Some((display, template)) = template {
        // Render with the config's variables and sample context.
        let sample = sample_spec(spec);
        let skipped: Vec<_> = spec
            .skip_parts
            .iter()
            .filter(|name| !template.parts.iter().any(|p| &p.name == *name))
            .collect();
        for name in skipped {
            problems.push(format!("{field}.skipParts: {display} has no part {name:?}"));
        }
        // The config's problems, and an output its values make too large (a template whose
        // helpers repeat a tenant's long value; the template alone renders within the limit).
        let found = render::lint(display, template, Some(&sample));
        let too_large = |p: &render::Problem| p.reason == reason::OUTPUT_TOO_LARGE;
        let values_too_large = found.iter().any(too_large)
            && !render::lint(display, template, None).iter().any(too_large);
        problems.extend(
            found
                .into_iter()
                .filter(|p| p.severity == Severity::Error)
                .filter(|p| p.origin == Origin::Config || (values_too_large && too_large(p)))
                // Already reported, with the field as the config names it.
                .filter(|p| p.code != "invalid-network")
                .map(|p| {
                    format!(
                        "{field}: {}",
                        p.to_string().trim_start_matches("the config's ")
                    )
                }),
        );
    }
    problems
}

/// On update, the Cluster API contract for in-place updates: once the data Secret is written
/// (the machine may have booted from it), a spec change is admitted only when it can reach the
/// machine in place, that is when every difference between the renders of the old and the new
/// spec, with the same sample machine, lies in `update: InPlace` parts
/// (`render::PartsRender::update_from`). That holds for a `templateRef` to another template too:
/// Cluster API's in-place flow applies the new spec from a new `BootplateConfigTemplate`. A change
/// that needs a new machine is refused, naming the part. `old_template` and `new_template` are
/// what the old and the new `spec.templateRef` reference (`None`: not found).
pub fn config_update(
    old: &BootplateConfig,
    new: &BootplateConfig,
    old_template: Option<(&str, &TemplateSpec)>,
    new_template: Option<(&str, &TemplateSpec)>,
) -> Vec<String> {
    if !running(old) || old.spec == new.spec {
        return Vec::new();
    }
    let refuse = |why: String| {
        vec![format!(
            "spec: the data Secret is written, so only a change that applies in place is admitted, \
             and this one {why}; create a new config (a new Machine) instead (docs/in-place.md)"
        )]
    };
    let (Some(old_template), Some(new_template)) = (old_template, new_template) else {
        let missing = if old_template.is_none() {
            &old.spec.template_ref
        } else {
            &new.spec.template_ref
        };
        return refuse(format!(
            "cannot be judged: {} {} is not found",
            missing.kind, missing.name
        ));
    };
    // The machine's role when the controller recorded it; otherwise every role must agree.
    let roles = recorded_roles(old);
    let compiled = (
        render::CompiledTemplate::compile(old_template.0, old_template.1),
        render::CompiledTemplate::compile(new_template.0, new_template.1),
    );
    let (old_compiled, new_compiled) = match compiled {
        (Err(e), _) => return refuse(format!("cannot be judged: {e}")),
        // `config` refuses a new template that does not compile, with the line and column.
        (_, Err(_)) => return Vec::new(),
        (Ok(old), Ok(new)) => (old, new),
    };
    let (old_spec, new_spec) = (sample_spec(&old.spec), sample_spec(&new.spec));
    for role in roles {
        let old = render::Revision {
            template: &old_compiled,
            config: &old_spec,
        };
        let new = render::Revision {
            template: &new_compiled,
            config: &new_spec,
        };
        match update_plan(old, new, role) {
            Ok(UpdatePlan::Unchanged | UpdatePlan::InPlace { .. }) => {}
            Ok(UpdatePlan::Rollout { reason }) => {
                return refuse(format!("needs a new machine (role {role}): {reason}"));
            }
            // `config` refuses a new spec that does not render, with the line and column.
            Err(Unjudged::NewSpec) => {}
            Err(Unjudged::Old(why)) => {
                return refuse(format!("cannot be judged (role {role}): {why}"));
            }
        }
    }
    Vec::new()
}

/// An update of a template from `old` to `new` (named `display` in messages), judged against
/// the configs that reference it: the `InPlaceOnly` refusal ([`TemplateChange::refusal`]) and
/// the warnings ([`TemplateChange::preview`]) share one [`Judge`], so a (spec, role) pair both
/// look at is rendered once. The templates are compiled when first needed.
pub struct TemplateChange<'a> {
    display: &'a str,
    old: &'a TemplateSpec,
    new: &'a TemplateSpec,
    /// `Ok(None)`: the new spec does not compile; `Err`: the old one does not.
    judge: Option<Result<Option<Judge>, String>>,
}

impl<'a> TemplateChange<'a> {
    pub fn new(display: &'a str, old: &'a TemplateSpec, new: &'a TemplateSpec) -> Self {
        TemplateChange {
            display,
            old,
            new,
            judge: None,
        }
    }

    fn judge(&mut self) -> &mut Result<Option<Judge>, String> {
        let (display, old, new) = (self.display, self.old, self.new);
        self.judge
            .get_or_insert_with(|| Judge::new(display, old, new))
    }

    /// On update of a template with `updatePolicy: InPlaceOnly` (the old spec's policy rules, so
    /// a change cannot lift the policy and replace machines at once): the change is admitted
    /// only when every running machine of it, that is every written config in `configs` (those
    /// that reference the template), can take it in place, each judged with its own spec and
    /// recorded role as [`config_update`] judges a config's change. Otherwise the refusal names
    /// how many machines would need replacing, a few of their configs, and why (the part or
    /// field).
    pub fn refusal(&mut self, configs: &[BootplateConfig]) -> Vec<String> {
        let (old, new) = (self.old, self.new);
        if old.policy() != crd_types::UpdatePolicy::InPlaceOnly || old.revision() == new.revision()
        {
            return Vec::new();
        }
        let judge = match self.judge() {
            Ok(Some(judge)) => judge,
            // `template` refuses a new spec that does not compile, with the line and column.
            Ok(None) => return Vec::new(),
            Err(e) => {
                return vec![format!(
                    "spec: updatePolicy is InPlaceOnly and the change cannot be judged: {e}"
                )];
            }
        };
        let mut replaced: Vec<(String, String)> = Vec::new();
        for config in configs.iter().filter(|c| running(c)) {
            match judge.judge(config) {
                Err(TooManySpecs) => {
                    return vec![format!(
                        "spec: updatePolicy is InPlaceOnly and its running machines have more than \
                         {MAX_SPECS_JUDGED} distinct specs: the change cannot be judged at admission; \
                         set updatePolicy to Any first (docs/changing-templates.md)"
                    )];
                }
                Ok(Judged::Rollout(why) | Judged::Old(why)) => {
                    replaced.push((config_name(config), why))
                }
                Ok(Judged::Unchanged | Judged::InPlace(_) | Judged::NewSpec) => {}
            }
        }
        refused_in_place_only(&replaced)
    }

    /// What the update does to the machines of `preview.configs`, told as admission warnings
    /// (`core::preview`): a config whose Machine is not joined re-renders; a joined machine is
    /// judged as [`TemplateChange::refusal`] judges it, until the deadline.
    pub fn preview(&mut self, preview: &Preview) -> Vec<String> {
        use crate::core::preview::{self, ConfigFact, Stage, Verdict};
        if self.old.revision() == self.new.revision() {
            return vec!["the template's revision is unchanged: nothing re-renders".to_owned()];
        }
        let judge = match self.judge() {
            Ok(Some(judge)) => judge,
            // A new spec that does not compile is refused (`template`): nothing to tell.
            Ok(None) => return Vec::new(),
            Err(_) => {
                let why = "the old revision no longer compiles".to_owned();
                return preview::preview(preview.configs.iter().map(|config| {
                    ConfigFact {
                        name: config_name(config),
                        stage: stage_of(config, preview.joined)
                            .unwrap_or(Stage::Running(Verdict::Unjudged { why: why.clone() })),
                    }
                }))
                .warnings();
            }
        };
        let late = || {
            preview
                .deadline
                .is_some_and(|d| std::time::Instant::now() > d)
        };
        let facts = preview.configs.iter().map(|config| {
            let stage = stage_of(config, preview.joined).unwrap_or_else(|| {
                if late() {
                    return Stage::Running(Verdict::Unjudged {
                        why: "not judged within the webhook's time".to_owned(),
                    });
                }
                Stage::Running(verdict_of(judge.judge(config)))
            });
            ConfigFact {
                name: config_name(config),
                stage,
            }
        });
        preview::preview(facts.collect::<Vec<_>>()).warnings()
    }
}

/// The refusal of an `InPlaceOnly` template's update that `replaced` running machines (config,
/// why) cannot take in place; none when there are none.
fn refused_in_place_only(replaced: &[(String, String)]) -> Vec<String> {
    let Some((_, why)) = replaced.first() else {
        return Vec::new();
    };
    let named: Vec<&str> = replaced.iter().take(3).map(|(n, _)| n.as_str()).collect();
    let more = replaced.len().saturating_sub(named.len());
    let others = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    vec![format!(
        "spec: updatePolicy is InPlaceOnly and this change cannot be applied in place to {} running \
         machine(s) (BootplateConfig {}{others}): {why}; change only `update: InPlace` parts, or \
         set updatePolicy to Any first (docs/changing-templates.md)",
        replaced.len(),
        named.join(", "),
    )]
}

/// The configs a template's update is previewed against: those that reference it, the Machines
/// (namespace, name) with a Node among their owners, and when the judging must stop (the rest
/// is told as not judged).
pub struct Preview<'a> {
    pub configs: &'a [BootplateConfig],
    pub joined: &'a HashSet<(String, String)>,
    pub deadline: Option<std::time::Instant>,
}

/// How a running machine takes the change, as the warnings tell it.
fn verdict_of(judged: Result<Judged, TooManySpecs>) -> crate::core::preview::Verdict {
    use crate::core::preview::Verdict;
    match judged {
        Ok(Judged::Unchanged) => Verdict::Unchanged,
        Ok(Judged::InPlace(parts)) => Verdict::InPlace { parts },
        Ok(Judged::Rollout(why)) => Verdict::Replaced { why },
        Ok(Judged::Old(why)) => Verdict::Unjudged { why },
        Ok(Judged::NewSpec) => Verdict::Unjudged {
            why: "the new revision does not render for it".to_owned(),
        },
        Err(TooManySpecs) => Verdict::Unjudged {
            why: format!(
                "more than {MAX_SPECS_JUDGED} distinct specs are not rendered at admission"
            ),
        },
    }
}

/// Where `config` stands when its machine is not running: a MachinePool's, or one whose Machine
/// has no Node (not in `joined`); `None` for a running machine, which is judged.
fn stage_of(
    config: &BootplateConfig,
    joined: &HashSet<(String, String)>,
) -> Option<crate::core::preview::Stage> {
    use crate::core::preview::Stage;
    let namespace = config.metadata.namespace.clone().unwrap_or_default();
    match crate::core::gate::owner(config) {
        Some(Owner::Pool(_)) => Some(Stage::Pool),
        Some(Owner::Machine(machine)) if joined.contains(&(namespace, machine.clone())) => None,
        _ => Some(Stage::BeforeJoin),
    }
}

/// How one config's machine takes a template change.
#[derive(Clone)]
enum Judged {
    Unchanged,
    /// Every difference lies in these `InPlace` parts.
    InPlace(Vec<String>),
    /// Outside the `InPlace` parts: why, with the role.
    Rollout(String),
    /// The old revision does not render for it: why, with the role.
    Old(String),
    /// The new one does not (`config` refuses it, with the line and column).
    NewSpec,
}

/// More distinct (spec, role) pairs than [`MAX_SPECS_JUDGED`].
struct TooManySpecs;

/// Judges the configs of one template against a change of its spec: machines of one
/// MachineDeployment share a spec and a role, so each distinct pair is rendered once (twice:
/// old and new), and at most [`MAX_SPECS_JUDGED`] pairs are, within the webhook's time.
struct Judge {
    old: render::CompiledTemplate,
    new: render::CompiledTemplate,
    judged: HashMap<(String, Role), Judged>,
}

impl Judge {
    /// `None` when the new spec does not compile; the error when the old one does not.
    fn new(display: &str, old: &TemplateSpec, new: &TemplateSpec) -> Result<Option<Judge>, String> {
        let old = render::CompiledTemplate::compile(display, old).map_err(|e| e.to_string());
        let Ok(new) = render::CompiledTemplate::compile(display, new) else {
            return Ok(None);
        };
        Ok(Some(Judge {
            old: old?,
            new,
            judged: HashMap::new(),
        }))
    }

    /// How `config`'s machine takes the change, under every role it may have (its recorded
    /// one): replaced when it is under any of them, in place when some part differs, unchanged
    /// otherwise.
    fn judge(&mut self, config: &BootplateConfig) -> Result<Judged, TooManySpecs> {
        let spec = serde_json::to_string(&config.spec).expect("a spec always serializes");
        let mut outcome = Judged::Unchanged;
        for role in recorded_roles(config) {
            let key = (spec.clone(), role);
            if !self.judged.contains_key(&key) && self.judged.len() >= MAX_SPECS_JUDGED {
                return Err(TooManySpecs);
            }
            let (old, new) = (&self.old, &self.new);
            let judged = self.judged.entry(key).or_insert_with(|| {
                let sample = sample_spec(&config.spec);
                let revision = |template| render::Revision {
                    template,
                    config: &sample,
                };
                match update_plan(revision(old), revision(new), role) {
                    Ok(UpdatePlan::Unchanged) => Judged::Unchanged,
                    Ok(UpdatePlan::InPlace { parts }) => Judged::InPlace(parts),
                    Ok(UpdatePlan::Rollout { reason }) => {
                        Judged::Rollout(format!("role {role}: {reason}"))
                    }
                    Err(Unjudged::Old(e)) => {
                        Judged::Old(format!("role {role}: cannot be judged: {e}"))
                    }
                    Err(Unjudged::NewSpec) => Judged::NewSpec,
                }
            });
            match judged {
                Judged::Rollout(_) | Judged::Old(_) => return Ok(judged.clone()),
                Judged::InPlace(_) if !matches!(outcome, Judged::InPlace(_)) => {
                    outcome = judged.clone()
                }
                Judged::NewSpec if matches!(outcome, Judged::Unchanged) => {
                    outcome = Judged::NewSpec
                }
                _ => {}
            }
        }
        Ok(outcome)
    }
}

/// Whether `config`'s machine may be running: its data Secret is written (the machine may have
/// booted from it), and it is a Machine's. A MachinePool's config is the launch data of its
/// instances: a change is meant to reach the pool's new instances (the infrastructure provider
/// decides about the running ones), so any change is admitted.
pub(super) fn running(config: &BootplateConfig) -> bool {
    let written = (config.status.as_ref()).is_some_and(|s| s.ready || s.data_secret_name.is_some());
    written && !matches!(crate::core::gate::owner(config), Some(Owner::Pool(_)))
}

/// The role the controller recorded for `config`; every role when none (or an unknown one).
fn recorded_roles(config: &BootplateConfig) -> Vec<Role> {
    match config.status.as_ref().and_then(|s| s.role.as_deref()) {
        Some(role) => role
            .parse::<Role>()
            .map_or_else(|_| Role::ALL.to_vec(), |r| vec![r]),
        None => Role::ALL.to_vec(),
    }
}

fn config_name(config: &BootplateConfig) -> String {
    let meta = &config.metadata;
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The most distinct (spec, role) pairs of running machines an `InPlaceOnly` template's update
/// is judged against at admission.
const MAX_SPECS_JUDGED: usize = 2_000;

/// Why a change cannot be judged.
enum Unjudged {
    /// The old spec does not render (any more).
    Old(String),
    /// The new one does not: `config` says why.
    NewSpec,
}

/// How a machine of `role` rendered from the old spec gets to the new one, both rendered with
/// the same sample machine, by the comparison the in-place hooks and `bootplate diff` make
/// (`render::compare`).
fn update_plan(
    old: render::Revision,
    new: render::Revision,
    role: Role,
) -> Result<UpdatePlan, Unjudged> {
    match render::compare(old, new, &render::sample_context(role)) {
        Ok(comparison) => Ok(comparison.plan),
        Err(e @ render::CompareError::Old(_)) => Err(Unjudged::Old(e.to_string())),
        Err(render::CompareError::New(_)) => Err(Unjudged::NewSpec),
    }
}

/// `spec` for a sample render: file contents from Secrets are not read at admission, so
/// empty stand-ins keep the render going.
fn sample_spec(spec: &BootplateConfigSpec) -> BootplateConfigSpec {
    let mut sample = spec.clone();
    for file in &mut sample.files {
        if file.content_from.take().is_some() {
            file.content = Some(String::new());
        }
    }
    if let Some(network) = sample.network.as_mut() {
        render::network::with_sample_secrets(network);
    }
    sample
}

/// The problems of a config's network input at `field`: its content, and Secrets only of the
/// config's own namespace.
fn network(field: &str, namespace: &str, spec: &BootplateConfigSpec) -> Vec<String> {
    let Some(network) = &spec.network else {
        return Vec::new();
    };
    let mut problems: Vec<String> =
        render::network::check(network, render::network::Source::Config)
            .into_iter()
            .map(|(at, message)| format!("{field}.network.{at}: {message}"))
            .collect();
    let mut copy = network.clone();
    for pem in copy.pem_fields_mut() {
        let Some(secret) = pem.secret.as_ref() else {
            continue;
        };
        let at = format!("{field}.network.{}.secret", pem.field);
        if let Err(e) = check_secret_namespace(&at, secret, namespace) {
            problems.push(e.to_string());
        }
        if secret.name.is_empty() || secret.name.contains('/') {
            problems.push(format!("{at}.name: {:?} is not a Secret name", secret.name));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_generator_needs_one_https_endpoint_and_a_pem_ca_bundle() {
        let spec = |client_config: serde_json::Value| -> crd_types::GeneratorSpec {
            serde_json::from_value(json!({ "clientConfig": client_config })).unwrap()
        };
        let ca = crate::pki::generate_ca("generator CA").unwrap().cert;
        let good = spec(json!({"url": "https://cmdb.example/gen", "caBundle": ca}));
        assert!(super::generator(&good).is_empty());
        let service = spec(json!({"service": {"namespace": "infra", "name": "cmdb"}}));
        assert!(super::generator(&service).is_empty());
        let plain = super::generator(&spec(json!({"url": "http://cmdb.example/gen"})));
        assert!(plain[0].contains("HTTPS only"), "{plain:?}");
        let base64 = super::generator(&spec(json!({"url": "https://a/", "caBundle": "TUlJQg=="})));
        assert!(
            base64[0].starts_with("spec.clientConfig.caBundle"),
            "{base64:?}"
        );
    }

    #[test]
    fn objects_are_read_strictly() {
        let mut object = json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
            "kind": "BootplateConfig",
            "metadata": {"name": "c", "namespace": "a", "uid": "1", "resourceVersion": "2"},
            "spec": {
                "templateRef": {"kind": "BootstrapTemplate", "name": "t"},
                "files": [{"path": "/k", "content": "k", "permision": "0600"}],
            },
            "status": {"ready": false},
        });
        assert_eq!(
            super::strict(&object),
            ["spec.files[0].permision: unknown field `permision`; did you mean `permissions`?"]
        );
        object["spec"]["files"][0]
            .as_object_mut()
            .unwrap()
            .remove("permision");
        assert!(super::strict(&object).is_empty());
        // serde agrees: the types refuse unknown fields too.
        object["spec"]["templateRef"]["nmae"] = json!("x");
        let decoded = serde_json::from_value::<crd_types::BootplateConfig>(object);
        assert!(
            decoded
                .unwrap_err()
                .to_string()
                .contains("unknown field `nmae`")
        );
    }

    /// A template with a `Rollout` part (`install`), an `InPlace` one (`configure`) and an
    /// init-only `Rollout` one (`init`).
    const TEMPLATE: &str = r#"
os: { name: linux }
format: cloud-config
variables:
  - { name: mirror, default: "https://mirror.example" }
  - { name: runtime, default: "2.0" }
  - { name: apiFlag, default: "" }
parts:
  - name: install
    commands: ["install-runtime {{shell_quote values.runtime}}"]
  - name: configure
    update: InPlace
    files: [{ path: /etc/mirror.toml, content: "endpoint = \"{{values.mirror}}\"\n" }]
  - name: init
    roles: [init]
    commands: ["init {{shell_quote values.apiFlag}}"]
"#;

    fn template(yaml: &str) -> crd_types::TemplateSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    // The webhook refuses what lint reports as an error and admits its warnings (docs/operations.md,
    // "Admission webhook"): `--strict` is the lint's option, not the webhook's.
    #[test]
    fn a_template_is_refused_for_lint_errors_and_admitted_with_warnings() {
        let cases = [
            // An unused variable and an unquoted free-text value are warnings.
            (
                "os: {name: linux}\nformat: script\nvariables: [{name: unused}, {name: name, default: x}]\ntemplate: \"#!/bin/sh\\necho {{values.name}}\\n\"\n",
                false,
            ),
            // A path the render context lacks is an error.
            (
                "os: {name: linux}\nformat: script\ntemplate: \"#!/bin/sh\\necho {{values.missing}}\\n\"\n",
                true,
            ),
            // An unknown helper is an error.
            (
                "os: {name: linux}\nformat: script\ntemplate: \"#!/bin/sh\\necho {{no_such_helper 1}}\\n\"\n",
                true,
            ),
        ];
        for (yaml, refused) in cases {
            let spec = template(yaml);
            let warnings = render::lint("t", &spec, None)
                .into_iter()
                .filter(|p| p.severity == render::Severity::Warning)
                .count();
            let problems = super::template("BootstrapTemplate team-a/t", &spec);
            assert_eq!(!problems.is_empty(), refused, "{yaml}: {problems:?}");
            if !refused {
                assert!(warnings >= 2, "{yaml}: lint warns about it ({warnings})");
            }
        }
    }

    // A config whose values make a helper's result too large is refused (the template renders
    // within the limit with its own sample values); a template too large by itself is the
    // template's problem, reported on the template, not on each config.
    #[test]
    fn a_config_whose_values_make_the_output_too_large_is_refused() {
        let joins = template(
            "os: {name: linux}\nformat: script\nvariables: [{name: l, default: [], schema: {type: array}}, {name: s, default: \",\"}]\ntemplate: \"#!/bin/sh\\n{{shell_quote (join values.l values.s)}}\\n\"\n",
        );
        let check = |template: &crd_types::TemplateSpec, variables: serde_json::Value| {
            let spec = config("t", variables, None).spec;
            super::config(
                "spec",
                "team-a",
                &spec,
                Some(("BootstrapTemplate team-a/t", template)),
            )
        };
        let denied = check(
            &joins,
            json!({"l": vec!["x"; 100], "s": "s".repeat(20_000)}),
        );
        assert!(
            denied
                .iter()
                .any(|d| d.contains("more than the limit of 1048576 bytes")),
            "{denied:?}"
        );
        assert_eq!(
            check(&joins, json!({"l": ["a", "b"]})),
            Vec::<String>::new()
        );
        let big = template(
            "os: {name: linux}\nformat: script\nmaxOutputBytes: 10\ntemplate: \"#!/bin/sh\\necho a long line\\n\"\n",
        );
        assert_eq!(check(&big, json!({})), Vec::<String>::new());
    }

    /// A config on template `name` with `variables`, written (data Secret set) when `role` is
    /// given, recorded with that role unless it is empty.
    fn config(
        name: &str,
        variables: serde_json::Value,
        role: Option<&str>,
    ) -> crd_types::BootplateConfig {
        serde_json::from_value(json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
            "kind": "BootplateConfig",
            "metadata": {"name": "m-0", "namespace": "team-a"},
            "spec": {"templateRef": {"kind": "BootstrapTemplate", "name": name}, "variables": variables},
            "status": match role {
                None => json!({}),
                Some("") => json!({"ready": true, "dataSecretName": "m-0"}),
                Some(role) => json!({"ready": true, "dataSecretName": "m-0", "role": role}),
            },
        }))
        .unwrap()
    }

    fn update(
        old: &crd_types::BootplateConfig,
        new: &crd_types::BootplateConfig,
        templates: [Option<&crd_types::TemplateSpec>; 2],
    ) -> Vec<String> {
        let [old_template, new_template] =
            templates.map(|t| t.map(|t| ("BootstrapTemplate team-a/t", t)));
        super::config_update(old, new, old_template, new_template)
    }

    #[test]
    fn a_config_not_yet_written_takes_any_change() {
        let t = template(TEMPLATE);
        let old = config("t", json!({}), None);
        let new = config("other", json!({"runtime": "3.0"}), None);
        assert!(update(&old, &new, [Some(&t), None]).is_empty());
    }

    #[test]
    fn a_written_config_takes_a_change_of_in_place_parts_only() {
        let t = template(TEMPLATE);
        let old = config("t", json!({}), Some("worker"));
        let mirror = config(
            "t",
            json!({"mirror": "https://other.example"}),
            Some("worker"),
        );
        assert_eq!(
            update(&old, &mirror, [Some(&t), Some(&t)]),
            Vec::<String>::new()
        );
        let runtime = config("t", json!({"runtime": "3.0"}), Some("worker"));
        assert_eq!(
            update(&old, &runtime, [Some(&t), Some(&t)]),
            [
                "spec: the data Secret is written, so only a change that applies in place is \
              admitted, and this one needs a new machine (role worker): part `install` changed \
              and is not `update: InPlace`; create a new config (a new Machine) instead \
              (docs/in-place.md)"
            ]
        );
    }

    #[test]
    fn an_in_place_only_template_takes_what_every_running_machine_takes_in_place() {
        let in_place_only = |yaml: &str| {
            let mut t = template(yaml);
            t.update_policy = Some(crd_types::UpdatePolicy::InPlaceOnly);
            t
        };
        let old = in_place_only(TEMPLATE);
        let mirror_only = in_place_only(&TEMPLATE.replace("endpoint = ", "mirror = "));
        let new_install =
            in_place_only(&TEMPLATE.replace("install-runtime", "install-runtime --v2"));
        let new_init = in_place_only(&TEMPLATE.replace(r#"["init {{"#, r#"["init --v2 {{"#));
        let named = |name: &str, role| {
            let mut c = config("t", json!({}), role);
            c.metadata.name = Some(name.into());
            c
        };
        let workers: Vec<_> = (0..5)
            .map(|i| named(&format!("w-{i}"), Some("worker")))
            .collect();
        let judge = |new: &crd_types::TemplateSpec, configs: &[crd_types::BootplateConfig]| {
            super::TemplateChange::new("BootstrapTemplate team-a/t", &old, new).refusal(configs)
        };
        // A change of the InPlace part only: every machine takes it.
        assert_eq!(judge(&mirror_only, &workers), Vec::<String>::new());
        // A change of a Rollout part: refused, naming how many machines, a few configs, the part.
        assert_eq!(
            judge(&new_install, &workers),
            [
                "spec: updatePolicy is InPlaceOnly and this change cannot be applied in place to 5 \
              running machine(s) (BootplateConfig team-a/w-0, team-a/w-1, team-a/w-2 and 2 more): \
              role worker: part `install` changed and is not `update: InPlace`; change only \
              `update: InPlace` parts, or set updatePolicy to Any first \
              (docs/changing-templates.md)"
            ]
        );
        // No machine runs yet (configs not written): nothing to protect.
        assert!(judge(&new_install, &[named("fresh", None)]).is_empty());
        // A change only the init machine renders: workers take it, the init machine does not.
        assert!(judge(&new_init, &workers).is_empty());
        let problems = judge(&new_init, &[named("cp-0", Some("init"))]);
        assert!(
            problems[0].contains("1 running machine(s) (BootplateConfig team-a/cp-0)"),
            "{problems:?}"
        );
        // Without the policy (the old spec's rules), or setting the policy alone: admitted.
        let plain = template(TEMPLATE);
        let any_install = template(&TEMPLATE.replace("install-runtime", "install-runtime --v2"));
        assert!(
            super::TemplateChange::new("t", &plain, &any_install)
                .refusal(&workers)
                .is_empty()
        );
        assert!(
            super::TemplateChange::new("t", &plain, &old)
                .refusal(&workers)
                .is_empty()
        );
        // Lifting the policy with the change: the old policy still rules.
        assert!(
            !super::TemplateChange::new("t", &old, &any_install)
                .refusal(&workers)
                .is_empty()
        );
        assert_eq!(
            old.revision(),
            plain.revision(),
            "the policy is not in the revision"
        );
    }

    /// Config `name` of `owner` (kind, name) with `variables`, written for `role` (`None`: not
    /// written).
    fn owned_config(
        name: &str,
        owner: (&str, &str),
        variables: serde_json::Value,
        role: Option<&str>,
    ) -> crd_types::BootplateConfig {
        let mut config = config("t", variables, role);
        config.metadata.name = Some(name.to_owned());
        config.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": owner.0,
                "name": owner.1, "uid": "1",
            }))
            .unwrap(),
        ]);
        config
    }

    /// Configs of template `t` at every stage, and the Machines of those that joined.
    fn configs_at_every_stage() -> (
        Vec<crd_types::BootplateConfig>,
        std::collections::HashSet<(String, String)>,
    ) {
        let joined: std::collections::HashSet<(String, String)> = ["m-in", "m-out", "m-ctl"]
            .iter()
            .map(|m| ("team-a".to_owned(), (*m).to_owned()))
            .collect();
        let configs = [
            // Joined: a worker takes the `configure` part in place; the same for a second
            // worker of another spec; a control-plane machine too (`init` is not its part).
            owned_config("in", ("Machine", "m-in"), json!({}), Some("worker")),
            owned_config(
                "out",
                ("Machine", "m-out"),
                json!({"runtime": "3"}),
                Some("worker"),
            ),
            owned_config(
                "ctl",
                ("Machine", "m-ctl"),
                json!({}),
                Some("control-plane-join"),
            ),
            // Written, its Machine without a Node; not written; a pool's.
            owned_config(
                "booting",
                ("Machine", "m-booting"),
                json!({}),
                Some("worker"),
            ),
            owned_config("waiting", ("Machine", "m-waiting"), json!({}), None),
            owned_config("pool", ("MachinePool", "p"), json!({}), Some("worker")),
        ];
        (configs.to_vec(), joined)
    }

    #[test]
    fn a_templates_update_tells_what_it_does_to_each_machine() {
        let old = template(TEMPLATE);
        let (configs, joined) = configs_at_every_stage();
        let mirror = template(&TEMPLATE.replace("endpoint = ", "mirror = "));
        let install = template(&TEMPLATE.replace("install-runtime", "install-runtime --v2"));
        let init = template(&TEMPLATE.replace(r#"["init {{"#, r#"["init --v2 {{"#));
        let cases: [(&str, &crd_types::TemplateSpec, &[&str]); 4] = [
            (
                "an InPlace part",
                &mirror,
                &[
                    "2 config(s) whose machines have not joined re-render",
                    "1 MachinePool config(s) re-render",
                    "3 running machine(s) become outdated",
                    "3 of them can take it in place when Cluster API updates them in place (parts `configure`)",
                ],
            ),
            (
                "a Replace part",
                &install,
                &[
                    "2 config(s)",
                    "1 MachinePool",
                    "3 running machine(s) become outdated",
                    "3 of them are replaced on their next rollout (BootplateConfig team-a/in: role worker: part `install`",
                ],
            ),
            (
                "a part of another role",
                &init,
                &[
                    "2 config(s)",
                    "1 MachinePool",
                    "3 running machine(s) get the same bootstrap data",
                ],
            ),
            (
                "the policy only",
                &{
                    let mut t = template(TEMPLATE);
                    t.update_policy = Some(crd_types::UpdatePolicy::InPlaceOnly);
                    t
                },
                &["the template's revision is unchanged"],
            ),
        ];
        for (case, new, expected) in cases {
            let preview = super::Preview {
                configs: &configs,
                joined: &joined,
                deadline: None,
            };
            let warnings = super::TemplateChange::new("t", &old, new).preview(&preview);
            assert_eq!(warnings.len(), expected.len(), "{case}: {warnings:#?}");
            for (warning, expected) in warnings.iter().zip(expected) {
                assert!(warning.contains(expected), "{case}: {warning}");
            }
        }
    }

    #[test]
    fn a_preview_past_its_deadline_tells_the_running_machines_not_judged() {
        let old = template(TEMPLATE);
        let new = template(&TEMPLATE.replace("endpoint = ", "mirror = "));
        let (configs, joined) = configs_at_every_stage();
        let preview = super::Preview {
            configs: &configs,
            joined: &joined,
            deadline: std::time::Instant::now().checked_sub(std::time::Duration::from_secs(1)),
        };
        let warnings = super::TemplateChange::new("t", &old, &new).preview(&preview);
        assert!(
            warnings.iter().any(|w| w.contains("2 config(s) whose machines have not joined"))
                && warnings.iter().any(|w| w.contains(
                    "3 of them could not be judged (BootplateConfig team-a/in: not judged within the webhook's time)"
                )),
            "{warnings:#?}"
        );
    }

    #[test]
    fn an_in_place_only_templates_update_is_judged_against_a_bounded_number_of_specs() {
        let mut old = template(TEMPLATE);
        old.update_policy = Some(crd_types::UpdatePolicy::InPlaceOnly);
        let mut new = template(&TEMPLATE.replace("endpoint = ", "mirror = "));
        new.update_policy = old.update_policy;
        let distinct = |count: usize| -> Vec<_> {
            (0..count)
                .map(|i| {
                    config(
                        "t",
                        json!({"mirror": format!("https://m{i}.example")}),
                        Some("worker"),
                    )
                })
                .collect()
        };
        let within = distinct(super::MAX_SPECS_JUDGED);
        assert!(
            super::TemplateChange::new("t", &old, &new)
                .refusal(&within)
                .is_empty()
        );
        let beyond = distinct(super::MAX_SPECS_JUDGED + 1);
        let problems = super::TemplateChange::new("t", &old, &new).refusal(&beyond);
        assert!(
            problems[0].contains("more than 2000 distinct specs"),
            "{problems:?}"
        );
        // Many machines of one spec are one judgement.
        let same: Vec<_> = (0..super::MAX_SPECS_JUDGED * 2)
            .map(|_| config("t", json!({}), Some("worker")))
            .collect();
        assert!(
            super::TemplateChange::new("t", &old, &new)
                .refusal(&same)
                .is_empty()
        );
    }

    #[test]
    fn a_machine_pools_config_takes_any_change() {
        let t = template(TEMPLATE);
        let mut old = config("t", json!({}), Some("worker"));
        old.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
                "name": "pool", "uid": "1",
            }))
            .unwrap(),
        ]);
        let mut new = config("t", json!({"runtime": "3.0"}), Some("worker"));
        new.metadata.owner_references = old.metadata.owner_references.clone();
        assert!(update(&old, &new, [Some(&t), Some(&t)]).is_empty());
        old.metadata.owner_references.as_mut().unwrap()[0].kind = "Machine".into();
        assert!(!update(&old, &new, [Some(&t), Some(&t)]).is_empty());
    }

    #[test]
    fn another_template_is_judged_by_its_render() {
        let t = template(TEMPLATE);
        let old = config("t", json!({}), Some("worker"));
        let new = config("t2", json!({}), Some("worker"));
        // Another template that renders differently only in its InPlace part: admitted.
        let mirror_only = template(&TEMPLATE.replace("endpoint = ", "mirror = "));
        assert!(update(&old, &new, [Some(&t), Some(&mirror_only)]).is_empty());
        // One that also changes the Rollout part: refused, naming the part.
        let new_install = template(&TEMPLATE.replace("install-runtime", "install-runtime --v2"));
        let problems = update(&old, &new, [Some(&t), Some(&new_install)]);
        assert!(
            problems[0].contains("part `install` changed"),
            "{problems:?}"
        );
        // One that is not found cannot be judged.
        let problems = update(&old, &new, [Some(&t), None]);
        assert!(
            problems[0].contains("cannot be judged: BootstrapTemplate t2 is not found"),
            "{problems:?}"
        );
    }

    #[test]
    fn the_recorded_role_decides_which_parts_count() {
        let t = template(TEMPLATE);
        // Only the init machine renders `init`: a worker's config takes the change.
        let (old, new) = (
            config("t", json!({}), Some("worker")),
            config("t", json!({"apiFlag": "--x"}), Some("worker")),
        );
        assert!(update(&old, &new, [Some(&t), Some(&t)]).is_empty());
        let (old, new) = (
            config("t", json!({}), Some("init")),
            config("t", json!({"apiFlag": "--x"}), Some("init")),
        );
        let problems = update(&old, &new, [Some(&t), Some(&t)]);
        assert!(
            problems[0].contains("(role init): part `init` changed"),
            "{problems:?}"
        );
        // No role recorded: every role must agree.
        let (old, new) = (
            config("t", json!({}), Some("")),
            config("t", json!({"apiFlag": "--x"}), Some("")),
        );
        let problems = update(&old, &new, [Some(&t), Some(&t)]);
        assert!(problems[0].contains("(role init)"), "{problems:?}");
    }

    #[test]
    fn a_raw_template_takes_no_change_to_its_output() {
        let raw = template(
            "os: { name: linux }\nformat: script\nvariables: [{ name: x, default: a }]\ntemplate: \"#!/bin/sh\\necho {{shell_quote values.x}}\\n\"\n",
        );
        let old = config("t", json!({}), Some("worker"));
        let same = config("t", json!({"x": "a"}), Some("worker"));
        assert!(update(&old, &same, [Some(&raw), Some(&raw)]).is_empty());
        let other = config("t", json!({"x": "b"}), Some("worker"));
        let problems = update(&old, &other, [Some(&raw), Some(&raw)]);
        assert!(
            problems[0].contains("a raw spec.template has no parts"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_new_spec_that_does_not_render_is_left_to_the_config_check() {
        let t = template(TEMPLATE);
        let old = config("t", json!({}), Some("worker"));
        let undeclared = config("t", json!({"nope": 1}), Some("worker"));
        assert!(update(&old, &undeclared, [Some(&t), Some(&t)]).is_empty());
        let problems = super::config(
            "spec",
            "team-a",
            &undeclared.spec,
            Some(("BootstrapTemplate team-a/t", &t)),
        );
        assert!(!problems.is_empty());
    }

    /// Each case: a config's network input and the one denial expected (a fragment), or none.
    /// The config renders with the template, so a Secret named in the config's own namespace is
    /// admitted (a sample certificate stands in for it).
    #[test]
    fn a_configs_network_input_is_checked_and_names_secrets_of_its_own_namespace_only() {
        let t = template(TEMPLATE);
        let ca_from = |namespace: Option<&str>| json!({"caBundles": [{"name": "corp", "secret": {"name": "ca", "key": "ca.crt", "namespace": namespace}}]});
        let key = "-----BEGIN PRIVATE KEY-----\nc2FtcGxl\n-----END PRIVATE KEY-----\n";
        let inline_key = json!({"registryMirrors": [{"registry": "registry.k8s.io", "endpoints": [{
            "url": "https://mirror.corp",
            "clientCertificate": {"certificate": {"inline": render::network::SAMPLE_CA_PEM}, "key": {"inline": key}}}]}]});
        let cases = [
            (ca_from(None), None),
            (ca_from(Some("team-a")), None),
            (
                ca_from(Some("team-b")),
                Some(
                    "spec.network.caBundles[0].secret.namespace: a config in namespace team-a may not read Secret team-b/ca",
                ),
            ),
            (
                inline_key,
                Some(
                    "spec.network.registryMirrors[0].endpoints[0].clientCertificate.key: a private key comes from a Secret",
                ),
            ),
            (
                json!({"artifacts": [{"name": "kubelet", "url": "https://f.corp/kubelet", "sha256": "00"}]}),
                Some("spec.network.artifacts[0].sha256: must be 64 lower-case hex digits"),
            ),
            (
                json!({"proxy": {"http": "http://p.corp:3128", "noProxy": ["10.0.0.0/40"]}}),
                Some("spec.network.proxy.noProxy[0]"),
            ),
        ];
        for (network, expected) in cases {
            let mut spec = config("t", json!({}), None).spec;
            spec.network = Some(serde_json::from_value(network.clone()).unwrap());
            let problems = super::config(
                "spec",
                "team-a",
                &spec,
                Some(("BootstrapTemplate team-a/t", &t)),
            );
            match expected {
                None => assert!(problems.is_empty(), "{network}: {problems:?}"),
                Some(fragment) => assert!(
                    problems.len() == 1 && problems[0].contains(fragment),
                    "{network}: {problems:?}"
                ),
            }
        }
    }
}
