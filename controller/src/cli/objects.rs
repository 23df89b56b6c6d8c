//! Which documents of a GitOps tree `bootplate lint` checks, and the references between them.
//!
//! A repository holds bootplate's objects beside everything else (Deployments, Kustomizations,
//! Helm values): lint checks the kinds it owns and skips the rest, counting them. It owns every
//! kind of its API group (an unknown one there is a misspelling: an error) and Cluster API's
//! Machine, Cluster, MachineDeployment, MachinePool and ClusterClass (of group
//! `cluster.x-k8s.io`; another group's `Cluster` is someone else's and skipped).
//!
//! The references lint resolves among the objects it found: a config's `templateRef`, and the
//! bootstrap reference of a MachineDeployment, MachinePool or ClusterClass to bootplate's config
//! kinds. Pure functions over the parsed documents, table-tested below.

use serde_yaml::Value;

use super::input::kind;

/// bootplate's API group.
const GROUP: &str = crd_types::GROUP;
/// Cluster API's core group.
const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// The Cluster API kinds lint reads: Machine and Cluster (as `render` takes them), and the
/// kinds whose bootstrap reference may name a bootplate config.
pub const CAPI_KINDS: [&str; 5] = [
    "Machine",
    "Cluster",
    "MachineDeployment",
    "MachinePool",
    "ClusterClass",
];

/// Every kind lint checks.
pub fn owned_kinds() -> impl Iterator<Item = &'static str> + Clone {
    crd_types::strict::KINDS.into_iter().chain(CAPI_KINDS)
}

/// What lint does with a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// Checks it, as this kind.
    Lint(&'static str),
    /// Someone else's object (or not a Kubernetes object at all): skipped and counted.
    Skip(String),
    /// Filtered out with `--skip-kind` / `--only-kind`.
    Filtered,
    /// A document of bootplate's group whose kind it does not know: an error.
    Unknown,
}

/// The kinds `--only-kind` and `--skip-kind` select.
#[derive(Clone, Debug, Default)]
pub struct KindFilter {
    pub only: Vec<String>,
    pub skip: Vec<String>,
}

impl KindFilter {
    /// Checks that every kind named is one lint checks (a typo would silently lint nothing).
    pub fn validate(&self) -> Result<(), String> {
        for name in self.only.iter().chain(&self.skip) {
            if !owned_kinds().any(|k| k == name) {
                return Err(format!(
                    "--only-kind/--skip-kind: lint does not check kind `{name}`{} (it checks {})",
                    crd_types::strict::hint(name, owned_kinds()),
                    owned_kinds().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        Ok(())
    }

    fn selects(&self, kind: &str) -> bool {
        (self.only.is_empty() || self.only.iter().any(|k| k == kind))
            && !self.skip.iter().any(|k| k == kind)
    }
}

/// The group of a document's `apiVersion` (`""` for the core group or none).
fn group(document: &Value) -> &str {
    let version = document
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// What lint does with `document`.
pub fn classify(document: &Value, filter: &KindFilter) -> Class {
    let kind = kind(document);
    let owned = crd_types::strict::KINDS
        .into_iter()
        .find(|k| *k == kind)
        .or_else(|| {
            (group(document) == CAPI_GROUP)
                .then(|| CAPI_KINDS.into_iter().find(|k| *k == kind))
                .flatten()
        });
    match owned {
        Some(kind) if filter.selects(kind) => Class::Lint(kind),
        Some(_) => Class::Filtered,
        None if group(document) == GROUP => Class::Unknown,
        None if kind.is_empty() => Class::Skip("(no kind)".to_owned()),
        None => Class::Skip(kind.to_owned()),
    }
}

/// An object's name and namespace (None when the manifest leaves it to `kubectl -n` or
/// kustomize).
pub fn name_of(document: &Value) -> (Option<&str>, &str) {
    let metadata = document.get("metadata");
    let field = |f: &str| metadata.and_then(|m| m.get(f)).and_then(Value::as_str);
    (field("namespace"), field("name").unwrap_or(""))
}

/// Whether an object in namespace `have` is visible from a referrer in `want`: unset on either
/// side matches (the namespace is set when the tree is applied).
pub fn same_namespace(have: Option<&str>, want: Option<&str>) -> bool {
    match (have, want) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// A bootstrap reference of a Cluster API object to one of bootplate's config kinds: where it
/// is (the field of its `name`), the kind it wants and the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapRef {
    pub field: String,
    pub kind: String,
    pub name: String,
}

/// The bootstrap references of a MachineDeployment, MachinePool or ClusterClass that name one
/// of bootplate's config kinds: `spec.template.spec.bootstrap.configRef` (with `apiVersion` in
/// v1beta1, `apiGroup` in v1beta2), a ClusterClass's worker classes' `bootstrap.templateRef`
/// (v1beta2) or `template.bootstrap.ref` (v1beta1).
pub fn bootstrap_refs(document: &Value) -> Vec<BootstrapRef> {
    let mut found = Vec::new();
    match kind(document) {
        "MachineDeployment" | "MachinePool" => {
            let bootstrap = "spec.template.spec.bootstrap";
            push_ref(document, bootstrap, &["configRef"], &mut found);
        }
        "ClusterClass" => {
            for list in ["machineDeployments", "machinePools"] {
                let classes = document
                    .get("spec")
                    .and_then(|s| s.get("workers"))
                    .and_then(|w| w.get(list))
                    .and_then(Value::as_sequence);
                for i in 0..classes.map_or(0, Vec::len) {
                    // v1beta2: `bootstrap.templateRef`; v1beta1: `template.bootstrap.ref`.
                    let class = format!("spec.workers.{list}[{i}]");
                    push_ref(
                        document,
                        &format!("{class}.bootstrap"),
                        &["templateRef"],
                        &mut found,
                    );
                    let v1beta1 = format!("{class}.template.bootstrap");
                    push_ref(document, &v1beta1, &["ref"], &mut found);
                }
            }
        }
        _ => {}
    }
    found
}

/// The reference at `bootstrap`.`field` (the first of `fields` present), when it names
/// bootplate's group and one of its config kinds.
fn push_ref(document: &Value, bootstrap: &str, fields: &[&str], found: &mut Vec<BootstrapRef>) {
    let Some(node) = at(document, bootstrap) else {
        return;
    };
    let Some((field, reference)) = fields.iter().find_map(|f| node.get(*f).map(|r| (*f, r))) else {
        return;
    };
    let text = |f: &str| reference.get(f).and_then(Value::as_str).unwrap_or("");
    let group = match text("apiGroup") {
        "" => text("apiVersion").rsplit_once('/').map_or("", |(g, _)| g),
        group => group,
    };
    let kind = text("kind");
    if group != GROUP || !super::input::CONFIG_KINDS.contains(&kind) {
        return;
    }
    found.push(BootstrapRef {
        field: format!("{bootstrap}.{field}.name"),
        kind: kind.to_owned(),
        name: text("name").to_owned(),
    });
}

/// The node at a dotted path with `[i]` indexes (`spec.workers.machinePools[0].template`).
fn at<'a>(document: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(document, |node, step| {
        let (key, index) = match step.split_once('[') {
            Some((key, rest)) => (key, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (step, None),
        };
        let node = node.get(key)?;
        match index {
            Some(i) => node.get(i),
            None => Some(node),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Value {
        serde_yaml::from_str(text).unwrap()
    }

    #[test]
    fn owned_kinds_are_linted_and_everything_else_skipped() {
        let none = KindFilter::default();
        let only_templates = KindFilter {
            only: vec!["BootstrapTemplate".to_owned()],
            skip: vec![],
        };
        let no_machines = KindFilter {
            only: vec![],
            skip: vec!["Machine".to_owned()],
        };
        let cases: &[(&str, &KindFilter, Class)] = &[
            (
                "{apiVersion: bootstrap.bootplate.dev/v1alpha1, kind: BootstrapTemplate}",
                &none,
                Class::Lint("BootstrapTemplate"),
            ),
            // A wrong version of bootplate's kind is still linted (and refused there).
            (
                "{apiVersion: bootstrap.bootplate.dev/v1beta1, kind: BootplateConfig}",
                &none,
                Class::Lint("BootplateConfig"),
            ),
            (
                "{apiVersion: bootstrap.bootplate.dev/v1alpha1, kind: BootstrapTemplat}",
                &none,
                Class::Unknown,
            ),
            (
                "{apiVersion: bootstrap.bootplate.dev/v1alpha1}",
                &none,
                Class::Unknown,
            ),
            (
                "{apiVersion: cluster.x-k8s.io/v1beta2, kind: MachineDeployment}",
                &none,
                Class::Lint("MachineDeployment"),
            ),
            (
                "{apiVersion: postgresql.cnpg.io/v1, kind: Cluster}",
                &none,
                Class::Skip("Cluster".to_owned()),
            ),
            (
                "{apiVersion: apps/v1, kind: Deployment}",
                &none,
                Class::Skip("Deployment".to_owned()),
            ),
            ("{replicas: 3}", &none, Class::Skip("(no kind)".to_owned())),
            (
                "{apiVersion: cluster.x-k8s.io/v1beta2, kind: Machine}",
                &only_templates,
                Class::Filtered,
            ),
            (
                "{apiVersion: cluster.x-k8s.io/v1beta2, kind: Machine}",
                &no_machines,
                Class::Filtered,
            ),
            (
                "{apiVersion: cluster.x-k8s.io/v1beta2, kind: Cluster}",
                &no_machines,
                Class::Lint("Cluster"),
            ),
        ];
        for (text, filter, expected) in cases {
            assert_eq!(&classify(&yaml(text), filter), expected, "{text}");
        }
    }

    #[test]
    fn kind_filters_name_kinds_lint_knows() {
        let typo = KindFilter {
            only: vec!["BootstrapTemplates".to_owned()],
            skip: vec![],
        };
        let message = typo.validate().unwrap_err();
        assert!(
            message.contains("did you mean `BootstrapTemplate`"),
            "{message}"
        );
        let fine = KindFilter {
            only: vec![],
            skip: vec!["ClusterClass".to_owned()],
        };
        assert!(fine.validate().is_ok());
    }

    #[test]
    fn bootstrap_references_of_both_contract_versions_are_found() {
        // (the object, its references: field, kind, name)
        type Expected<'a> = &'a [(&'a str, &'a str, &'a str)];
        let cases: &[(&str, Expected)] = &[
            (
                "{kind: MachineDeployment, spec: {template: {spec: {bootstrap: {configRef: {apiGroup: bootstrap.bootplate.dev, kind: BootplateConfigTemplate, name: md}}}}}}",
                &[(
                    "spec.template.spec.bootstrap.configRef.name",
                    "BootplateConfigTemplate",
                    "md",
                )],
            ),
            (
                "{kind: MachinePool, spec: {template: {spec: {bootstrap: {configRef: {apiVersion: bootstrap.bootplate.dev/v1alpha1, kind: BootplateConfig, name: mp}}}}}}",
                &[(
                    "spec.template.spec.bootstrap.configRef.name",
                    "BootplateConfig",
                    "mp",
                )],
            ),
            // Another provider's config is not ours to check.
            (
                "{kind: MachineDeployment, spec: {template: {spec: {bootstrap: {configRef: {apiGroup: bootstrap.cluster.x-k8s.io, kind: KubeadmConfigTemplate, name: k}}}}}}",
                &[],
            ),
            (
                "{kind: ClusterClass, spec: {workers: {machineDeployments: [{bootstrap: {templateRef: {apiVersion: bootstrap.bootplate.dev/v1alpha1, kind: BootplateConfigTemplate, name: a}}}], machinePools: [{template: {bootstrap: {ref: {apiVersion: bootstrap.bootplate.dev/v1alpha1, kind: BootplateConfigTemplate, name: b}}}}]}}}",
                &[
                    (
                        "spec.workers.machineDeployments[0].bootstrap.templateRef.name",
                        "BootplateConfigTemplate",
                        "a",
                    ),
                    (
                        "spec.workers.machinePools[0].template.bootstrap.ref.name",
                        "BootplateConfigTemplate",
                        "b",
                    ),
                ],
            ),
        ];
        for (text, expected) in cases {
            let found: Vec<(String, String, String)> = bootstrap_refs(&yaml(text))
                .into_iter()
                .map(|r| (r.field, r.kind, r.name))
                .collect();
            let expected: Vec<(String, String, String)> = expected
                .iter()
                .map(|(f, k, n)| (f.to_string(), k.to_string(), n.to_string()))
                .collect();
            assert_eq!(found, expected, "{text}");
        }
    }

    #[test]
    fn namespaces_left_unset_match_any() {
        assert!(same_namespace(None, Some("a")));
        assert!(same_namespace(Some("a"), None));
        assert!(same_namespace(Some("a"), Some("a")));
        assert!(!same_namespace(Some("a"), Some("b")));
    }
}
