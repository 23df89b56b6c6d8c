//! The references between the objects of one lint run: a config's `templateRef` to a template,
//! and a Cluster API object's bootstrap reference to a bootplate config. They are resolved among
//! the files read, as the apiserver would resolve them once the tree is applied; a namespace a
//! manifest leaves unset matches any (kustomize or `kubectl -n` sets it).

use super::cluster::{ClusterTemplates, Found, Wanted};
use super::diagnostic::Diagnostic;
use super::input::{ConfigAt, YamlFile, kind};
use super::objects::{bootstrap_refs, name_of, same_namespace};

/// The first object of `kind` named `name` visible from namespace `namespace`: its file and
/// document.
pub fn find<'a>(
    tree: &'a [YamlFile],
    kind: &str,
    name: &str,
    namespace: Option<&str>,
) -> Option<(&'a YamlFile, usize)> {
    let cluster_scoped = kind == "ClusterBootstrapTemplate";
    tree.iter().find_map(|file| {
        file.documents
            .iter()
            .position(|document| {
                let (ns, n) = name_of(document);
                super::input::kind(document) == kind
                    && n == name
                    && (cluster_scoped || same_namespace(ns, namespace))
            })
            .map(|index| (file, index))
    })
}

/// The bootstrap references of document `index` of `file` (a MachineDeployment, MachinePool or
/// ClusterClass) to a config that is not among `tree`'s objects (nor, with `--kubeconfig`, in
/// `cluster`): one error each, at the reference's `name`.
pub fn check_bootstrap_refs(
    file: &YamlFile,
    index: usize,
    tree: &[YamlFile],
    cluster: Option<&ClusterTemplates>,
) -> Result<(), Vec<Diagnostic>> {
    let document = &file.documents[index];
    let (namespace, name) = name_of(document);
    let missing: Vec<Diagnostic> = bootstrap_refs(document)
        .into_iter()
        .filter(|r| find(tree, &r.kind, &r.name, namespace).is_none())
        .filter_map(|r| {
            let wanted = wanted(&r.kind, namespace, &r.name);
            let nowhere = match cluster.map(|c| (c.found.get(&wanted), &c.shown)) {
                Some((Some(Found::Config), _)) => return None,
                Some((_, shown)) => format!(
                    "is neither among the files linted nor in {}{shown}",
                    namespace
                        .map(|ns| format!("namespace {ns} of "))
                        .unwrap_or_default()
                ),
                None => format!(
                    "is not among the files linted{}",
                    namespace
                        .map(|ns| format!(" (namespace {ns})"))
                        .unwrap_or_default()
                ),
            };
            let message = format!(
                "{} {name} references {} `{}`, which {nowhere}",
                kind(document),
                r.kind,
                r.name,
            );
            Some(file.at(index, &r.field, false, "missing-reference", message))
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing)
    }
}

/// What to look for in a cluster: `kind` `name`, referenced from `namespace`.
pub fn wanted(kind: &str, namespace: Option<&str>, name: &str) -> Wanted {
    Wanted {
        kind: kind.to_owned(),
        namespace: (kind != "ClusterBootstrapTemplate")
            .then(|| namespace.map(str::to_owned))
            .flatten(),
        name: name.to_owned(),
    }
}

/// The configs the Cluster API objects of `tree` reference that `tree` does not hold.
pub fn configs_not_in(tree: &[YamlFile]) -> Vec<Wanted> {
    let mut out = Vec::new();
    for file in tree {
        for document in &file.documents {
            let (namespace, _) = name_of(document);
            for r in bootstrap_refs(document) {
                if find(tree, &r.kind, &r.name, namespace).is_none() {
                    out.push(wanted(&r.kind, namespace, &r.name));
                }
            }
        }
    }
    out
}

/// A config of the tree, decoded: its spec and where the spec sits.
pub struct FoundConfig<'a> {
    pub at: ConfigAt<'a>,
    pub spec: crd_types::BootplateConfigSpec,
    /// `BootplateConfig demo-md-0`, for messages.
    pub shown: String,
}

/// Document `index` of `file` as a config, when it is one that decodes (its problems are
/// reported by its own check).
pub fn config(file: &YamlFile, index: usize) -> Option<FoundConfig<'_>> {
    let document = &file.documents[index];
    let (spec, spec_path) = match kind(document) {
        "BootplateConfig" => (
            file.decode::<crd_types::BootplateConfig>(index).ok()?.spec,
            "spec",
        ),
        "BootplateConfigTemplate" => (
            file.decode::<crd_types::BootplateConfigTemplate>(index)
                .ok()?
                .spec
                .template
                .spec,
            "spec.template.spec",
        ),
        _ => return None,
    };
    let shown = format!("{} {}", kind(document), name_of(document).1);
    Some(FoundConfig {
        at: ConfigAt {
            file,
            index,
            spec_path,
        },
        spec,
        shown,
    })
}
