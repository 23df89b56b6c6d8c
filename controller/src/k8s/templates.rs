//! Finding a config's template and compiling it once per revision.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crd_types::conditions::reason;
use crd_types::{
    BootplateConfig, BootstrapTemplate, ClusterBootstrapTemplate, TemplateKind, TemplateSpec,
};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use render::CompiledTemplate;

use crate::error::{Error, Result};
use crate::k8s::stores::Stores;

/// `<Kind>/<name>`: how the data Secret's annotation and the render metrics name the template a
/// config references.
pub fn reference(template_ref: &crd_types::TemplateRef) -> String {
    format!("{}/{}", template_ref.kind, template_ref.name)
}

/// A template a config resolved to.
pub struct ResolvedTemplate {
    /// `BootstrapTemplate ns/name` or `ClusterBootstrapTemplate name`: how messages name it.
    pub display: String,
    /// [`reference`]: `<Kind>/<name>`.
    pub reference: String,
    /// The compiled template.
    pub compiled: Arc<CompiledTemplate>,
}

/// How messages name a template object.
pub(crate) fn display_name(
    kind: impl std::fmt::Display,
    namespace: Option<&str>,
    name: &str,
) -> String {
    match namespace {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// How messages (and the compiled cache) name `template`.
pub(crate) fn display_of<K: kube::Resource<DynamicType = ()>>(template: &K) -> String {
    let meta = template.meta();
    display_name(
        K::kind(&()),
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Compiled templates keyed by object, replaced when the revision changes.
#[derive(Default)]
pub struct CompiledCache {
    entries: Mutex<HashMap<String, CacheEntry>>,
}

struct CacheEntry {
    /// The object and spec the entry was last checked against; `None` when unknown.
    stamp: Option<SpecStamp>,
    revision: String,
    compiled: Result<Arc<CompiledTemplate>, String>,
}

/// Which template object, at which spec, a compiled entry was checked against: its UID and
/// `metadata.generation`, which the apiserver moves on every change of the spec. Every config's
/// reconcile resolves its template; with the stamp unchanged, the cached entry is used without
/// copying the spec and hashing it for its revision (at 20 000 configs the copy and the hash
/// were about 7% of the controller's CPU).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SpecStamp {
    uid: String,
    generation: i64,
}

impl SpecStamp {
    /// The stamp of a template object; `None` without a UID or a generation (an object the
    /// apiserver has not stored), which is then compared by revision every time.
    pub fn of(meta: &kube::api::ObjectMeta) -> Option<Self> {
        Some(SpecStamp {
            uid: meta.uid.clone()?,
            generation: meta.generation?,
        })
    }
}

impl CompiledCache {
    /// The compiled form of `spec`, compiling it only when this object's revision changed.
    /// A compile error is cached too, so a broken template is not recompiled on every reconcile.
    /// `stamp` is the object's [`SpecStamp`]: when it is the entry's, the spec is not hashed.
    pub fn get_or_compile(
        &self,
        display: &str,
        stamp: Option<SpecStamp>,
        spec: &TemplateSpec,
    ) -> Result<Arc<CompiledTemplate>, String> {
        if let Some(entry) = self.entries.lock().expect("cache lock").get(display)
            && stamp.is_some()
            && entry.stamp == stamp
        {
            return entry.compiled.clone();
        }
        let revision = spec.revision();
        if let Some(entry) = self.entries.lock().expect("cache lock").get_mut(display)
            && entry.revision == revision
        {
            // A change that renders nothing differently (`updatePolicy`): same compiled form.
            entry.stamp = stamp;
            return entry.compiled.clone();
        }
        // Compile outside the lock: a large template must not block other reconciles.
        let compiled = CompiledTemplate::compile(display, spec)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        let entry = CacheEntry {
            stamp,
            revision,
            compiled: compiled.clone(),
        };
        self.entries
            .lock()
            .expect("cache lock")
            .insert(display.to_owned(), entry);
        compiled
    }

    /// Forgets a deleted template.
    pub fn remove(&self, display: &str) {
        self.entries.lock().expect("cache lock").remove(display);
    }
}

/// Resolves and compiles the template `config` references. A `BootstrapTemplate` is looked up
/// in the config's own namespace only: the reference has no namespace field by design.
pub fn resolve(
    stores: &Stores,
    cache: &CompiledCache,
    config: &BootplateConfig,
) -> Result<ResolvedTemplate> {
    let template_ref = &config.spec.template_ref;
    let namespace = config.namespace().unwrap_or_default();
    check_template_namespace(template_ref, &namespace)?;
    let (display, compiled) = match template_ref.kind {
        TemplateKind::BootstrapTemplate => {
            let key = ObjectRef::new(&template_ref.name).within(&namespace);
            let display = display_name(template_ref.kind, Some(&namespace), &template_ref.name);
            let compiled = (stores.templates.get(&key))
                .map(|t| cache.get_or_compile(&display, SpecStamp::of(&t.metadata), &t.spec));
            (display, compiled)
        }
        TemplateKind::ClusterBootstrapTemplate => {
            let key = ObjectRef::new(&template_ref.name);
            let display = display_name(template_ref.kind, None, &template_ref.name);
            let compiled = (stores.cluster_templates.get(&key))
                .map(|t| cache.get_or_compile(&display, SpecStamp::of(&t.metadata), &t.spec.0));
            (display, compiled)
        }
    };
    let Some(compiled) = compiled else {
        return Err(Error::waiting(
            reason::TEMPLATE_NOT_FOUND,
            format!("spec.templateRef: {display} not found"),
        ));
    };
    let compiled = compiled.map_err(|message| {
        Error::failed(
            reason::TEMPLATE_INVALID,
            format!("spec.templateRef: {display} is invalid: {message}"),
        )
    })?;
    Ok(ResolvedTemplate {
        reference: reference(template_ref),
        display,
        compiled,
    })
}

/// A `BootstrapTemplate` is usable only from its own namespace; a `ClusterBootstrapTemplate`
/// has none. Anything else in `spec.templateRef.namespace` is refused, never followed.
pub fn check_template_namespace(
    template_ref: &crd_types::TemplateRef,
    namespace: &str,
) -> Result<()> {
    match (&template_ref.namespace, template_ref.kind) {
        (None, _) => Ok(()),
        (Some(ns), TemplateKind::BootstrapTemplate) if ns == namespace => Ok(()),
        (Some(ns), TemplateKind::BootstrapTemplate) => Err(Error::failed(
            reason::INVALID_REFERENCE,
            format!(
                "spec.templateRef.namespace: a config in namespace {namespace} may not use BootstrapTemplate {ns}/{}; \
                 use a BootstrapTemplate of its own namespace or a ClusterBootstrapTemplate",
                template_ref.name
            ),
        )),
        (Some(_), TemplateKind::ClusterBootstrapTemplate) => Err(Error::failed(
            reason::INVALID_REFERENCE,
            "spec.templateRef.namespace: a ClusterBootstrapTemplate has no namespace; remove the field",
        )),
    }
}

/// `files[].contentFrom.secret` at `field` may name only a Secret of the config's own
/// namespace; anything else is refused, never read.
pub fn check_secret_namespace(
    field: &str,
    secret: &crd_types::SecretKeyRef,
    namespace: &str,
) -> Result<()> {
    match secret.namespace.as_deref().filter(|ns| *ns != namespace) {
        None => Ok(()),
        Some(other) => Err(Error::failed(
            reason::INVALID_REFERENCE,
            format!(
                "{field}.namespace: a config in namespace {namespace} may not read Secret {other}/{}; \
                 only Secrets of its own namespace are read",
                secret.name
            ),
        )),
    }
}

/// A config file at `field` takes its content from exactly one place: `content` or
/// `contentFrom`. (Neither is left to the engine, which names the missing content.)
pub fn check_one_content_source(field: &str, file: &crd_types::ConfigFile) -> Result<()> {
    if file.content.is_some() && file.content_from.is_some() {
        return Err(Error::failed(
            reason::FILE_SOURCE_ERROR,
            format!("{field}: set either content or contentFrom, not both"),
        ));
    }
    Ok(())
}

/// The referenced template when it exists (a missing one is not an error at admission: the
/// platform team may publish it later). Never looks outside the config's namespace.
pub(crate) async fn referenced_template(
    client: &Client,
    namespace: &str,
    template_ref: &crd_types::TemplateRef,
) -> Result<Option<(String, TemplateSpec)>, String> {
    if template_ref
        .namespace
        .as_deref()
        .is_some_and(|ns| ns != namespace)
        || template_ref.name.contains('/')
    {
        return Ok(None);
    }
    let found = match template_ref.kind {
        TemplateKind::BootstrapTemplate => {
            Api::<BootstrapTemplate>::namespaced(client.clone(), namespace)
                .get_opt(&template_ref.name)
                .await
                .map(|t| t.map(|t| t.spec))
        }
        TemplateKind::ClusterBootstrapTemplate => {
            Api::<ClusterBootstrapTemplate>::all(client.clone())
                .get_opt(&template_ref.name)
                .await
                .map(|t| t.map(|t| t.spec.0))
        }
    };
    let namespace = (template_ref.kind == TemplateKind::BootstrapTemplate).then_some(namespace);
    match found {
        Ok(spec) => Ok(spec.map(|spec| {
            (
                display_name(template_ref.kind, namespace, &template_ref.name),
                spec,
            )
        })),
        Err(e) => Err(format!(
            "cannot read {} {}: {e}",
            template_ref.kind, template_ref.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(script: &str) -> TemplateSpec {
        let yaml =
            format!("os: {{name: linux}}\nformat: script\ntemplate: \"#!/bin/sh\\n{script}\\n\"\n");
        serde_yaml::from_str(&yaml).unwrap()
    }

    fn stamp(uid: &str, generation: i64) -> Option<SpecStamp> {
        let meta = kube::api::ObjectMeta {
            uid: Some(uid.into()),
            generation: Some(generation),
            ..Default::default()
        };
        SpecStamp::of(&meta)
    }

    /// What a lookup after the first compile of `spec("echo one")` at uid `a`, generation 1,
    /// gives: the same compiled form, or another one.
    #[test]
    fn a_template_is_compiled_again_only_when_its_spec_renders_differently() {
        let changed_policy = TemplateSpec {
            update_policy: Some(crd_types::UpdatePolicy::InPlaceOnly),
            ..spec("echo one")
        };
        let cases = [
            (
                "same object, same generation",
                stamp("a", 1),
                spec("echo one"),
                true,
            ),
            (
                "a new generation, same spec",
                stamp("a", 2),
                spec("echo one"),
                true,
            ),
            (
                "a new generation, only the update policy",
                stamp("a", 2),
                changed_policy,
                true,
            ),
            (
                "a new generation, another script",
                stamp("a", 2),
                spec("echo two"),
                false,
            ),
            (
                "another object of that name",
                stamp("b", 1),
                spec("echo two"),
                false,
            ),
            ("no stamp, another script", None, spec("echo two"), false),
            ("no stamp, same spec", None, spec("echo one"), true),
        ];
        for (case, lookup_stamp, lookup_spec, same) in cases {
            let cache = CompiledCache::default();
            let first = cache
                .get_or_compile("t", stamp("a", 1), &spec("echo one"))
                .unwrap();
            let again = cache
                .get_or_compile("t", lookup_stamp, &lookup_spec)
                .unwrap();
            assert_eq!(Arc::ptr_eq(&first, &again), same, "{case}");
            assert_eq!(again.revision(), lookup_spec.revision(), "{case}");
        }
    }

    #[test]
    fn an_unchanged_stamp_skips_hashing_and_a_stale_one_is_replaced() {
        let cache = CompiledCache::default();
        let first = cache
            .get_or_compile("t", stamp("a", 1), &spec("echo one"))
            .unwrap();
        // The stamp is what the lookup trusts: with it unchanged, the entry is used as it is.
        let trusted = cache
            .get_or_compile("t", stamp("a", 1), &spec("echo two"))
            .unwrap();
        assert!(Arc::ptr_eq(&first, &trusted));
        // A policy-only change keeps the compiled form and moves the stamp on: the next
        // lookup at generation 2 uses it without compiling, even with another spec.
        let policy = TemplateSpec {
            update_policy: Some(crd_types::UpdatePolicy::Any),
            ..spec("echo one")
        };
        let kept = cache.get_or_compile("t", stamp("a", 2), &policy).unwrap();
        assert!(Arc::ptr_eq(&first, &kept));
        let at_two = cache
            .get_or_compile("t", stamp("a", 2), &spec("echo three"))
            .unwrap();
        assert!(Arc::ptr_eq(&first, &at_two));
        // A compile error is cached under its stamp as well.
        let broken = spec("echo {{values.missing");
        let error = cache.get_or_compile("t", stamp("a", 3), &broken).err();
        assert!(error.is_some());
        let again = cache.get_or_compile("t", stamp("a", 3), &broken);
        assert_eq!(again.err(), error);
    }
}
