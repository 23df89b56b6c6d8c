//! Reconciles `BootstrapTemplate`s and `ClusterBootstrapTemplate`s: compiles and lints each
//! revision and reports the result in the `Valid` condition.

use std::sync::Arc;
use std::time::Duration;

use crd_types::conditions::{self, reason};
use crd_types::{
    BootstrapTemplate, BootstrapTemplateStatus, ClusterBootstrapTemplate, TemplateSpec,
};
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use tracing::warn;

use crate::core::status::{self, Desired};
use crate::error::{Error, Result};
use crate::k8s::templates::{SpecStamp, display_of};
use crate::reconcile::context::Context;

/// Reconciles a namespaced template.
pub async fn reconcile_namespaced(
    template: Arc<BootstrapTemplate>,
    ctx: Arc<Context>,
) -> Result<Action> {
    let namespace = template.namespace().unwrap_or_default();
    let api = Api::namespaced(ctx.client.clone(), &namespace);
    let status = template.status.as_ref();
    check_and_report(&ctx, &api, template.as_ref(), &template.spec, status).await
}

/// Reconciles a cluster-scoped template.
pub async fn reconcile_cluster(
    template: Arc<ClusterBootstrapTemplate>,
    ctx: Arc<Context>,
) -> Result<Action> {
    let api = Api::all(ctx.client.clone());
    let status = template.status.as_ref();
    check_and_report(&ctx, &api, template.as_ref(), &template.spec.0, status).await
}

/// Checks a template of either kind and reports what was found in its status.
async fn check_and_report<K>(
    ctx: &Context,
    api: &Api<K>,
    template: &K,
    spec: &TemplateSpec,
    previous: Option<&BootstrapTemplateStatus>,
) -> Result<Action>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let display = display_of(template);
    let desired = check(ctx, &display, template.meta(), spec, previous);
    report(ctx, api, template, previous, desired).await
}

/// Transient errors: retry soon.
pub fn error_policy<K: ResourceExt>(template: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(template = %template.name_any(), %error, "template reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// The status a template should have: compiled (cached per revision) and linted.
fn check(
    ctx: &Context,
    display: &str,
    meta: &ObjectMeta,
    spec: &TemplateSpec,
    previous: Option<&BootstrapTemplateStatus>,
) -> BootstrapTemplateStatus {
    let generation = meta.generation;
    // Warnings (say, a declared variable nothing reads) do not make a template invalid.
    let problems: Vec<String> =
        match (ctx.compiled).get_or_compile(display, SpecStamp::of(meta), spec) {
            Ok(compiled) => compiled
                .lint()
                .iter()
                .filter(|p| p.severity == render::Severity::Error)
                .map(ToString::to_string)
                .collect(),
            Err(message) => vec![message],
        };
    let valid = problems.is_empty();
    let message = if valid {
        format!("{display} compiles and renders for every role it supports")
    } else {
        problems.join("; ")
    };
    let previous_conditions = previous
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    BootstrapTemplateStatus {
        observed_generation: generation,
        revision: Some(spec.revision()),
        conditions: status::conditions(
            previous_conditions,
            vec![Desired {
                type_: conditions::VALID,
                status: valid,
                reason: if valid {
                    reason::VALID
                } else {
                    reason::INVALID
                },
                message,
            }],
            generation,
            k8s_openapi::jiff::Timestamp::now(),
        ),
    }
}

async fn report<K>(
    ctx: &Context,
    api: &Api<K>,
    template: &K,
    previous: Option<&BootstrapTemplateStatus>,
    desired: BootstrapTemplateStatus,
) -> Result<Action>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = std::time::Instant::now();
    let invalid = desired
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::VALID && c.status == "False");
    ctx.metrics
        .template_validity(&metrics_key(template), Some(invalid.is_none()));
    let written = match crate::k8s::status::apply(api, template, previous, &desired).await {
        Ok(written) => written,
        Err(e) => {
            ctx.metrics
                .reconciled("template", "error", started.elapsed());
            return Err(e);
        }
    };
    let result = if invalid.is_some() { "failed" } else { "ready" };
    ctx.metrics
        .reconciled("template", result, started.elapsed());
    if written && let Some(condition) = invalid {
        let note = condition.message.clone();
        crate::k8s::events::publish(
            &ctx.recorder,
            template,
            EventType::Warning,
            reason::INVALID,
            "Validate",
            note,
        );
    }
    Ok(Action::await_change())
}

/// How the validity gauge knows a template: `[<namespace>/]<Kind>/<name>`.
pub fn metrics_key<K: Resource<DynamicType = ()>>(template: &K) -> String {
    let key = format!(
        "{}/{}",
        K::kind(&()),
        template.meta().name.clone().unwrap_or_default()
    );
    match template.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{key}"),
        None => key,
    }
}
