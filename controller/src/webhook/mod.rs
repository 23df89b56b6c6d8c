//! The validating admission webhook, served over TLS by `bootplate run`: broken templates and
//! bad configs are refused at `kubectl apply` instead of failing when a machine boots.

pub mod tls;
pub mod validate;

use std::net::SocketAddr;
use std::path::Path;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use crd_types::{
    BootplateConfig, BootplateConfigTemplate, BootstrapTemplate, ClusterBootstrapTemplate,
    TemplateKind, TemplateSpec, UpdatePolicy,
};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tracing::{debug, info};

use crate::k8s::templates::display_name;

/// The path the ValidatingWebhookConfiguration calls.
pub const PATH: &str = "/validate";

/// Serves the webhook on `addr` with the certificate in `cert_dir` until the process ends.
pub async fn serve(addr: SocketAddr, cert_dir: &Path, client: Client) -> anyhow::Result<()> {
    let app = Router::new().route(PATH, post(review)).with_state(client);
    tls::serve(addr, cert_dir, app, "--webhook-addr").await?;
    info!(%addr, "admission webhook listening");
    Ok(())
}

async fn review(
    State(client): State<Client>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return Json(AdmissionResponse::invalid(e.to_string()).into_review()),
    };
    let problems = match check(&client, &request).await {
        Ok(problems) => problems,
        Err(message) => vec![message],
    };
    let response = AdmissionResponse::from(&request);
    let response = if problems.is_empty() {
        response
    } else {
        let kind = &request.kind.kind;
        let name = request.name.clone();
        debug!(%kind, %name, "denied");
        response.deny(format!("{kind} {name}: {}", problems.join("; ")))
    };
    Json(response.into_review())
}

/// Decodes `object` strictly: every field must fit the kind's schema (`crd_types::strict`), so
/// an object that reached the webhook past a lenient apiserver (field validation `Ignore` or
/// `Warn`) is refused all the same, naming every bad field.
fn decode<K: DeserializeOwned>(object: &DynamicObject, kind: &str) -> Result<K, String> {
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    let problems = validate::strict(&value);
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    serde_path_to_error::deserialize(value)
        .map_err(|e| format!("not a valid {kind}: {}: {}", e.path(), e.inner()))
}

/// The reasons to deny `request` (empty: admit).
async fn check(
    client: &Client,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<Vec<String>, String> {
    if request.operation == Operation::Delete || request.operation == Operation::Connect {
        return Ok(Vec::new());
    }
    let Some(object) = &request.object else {
        return Ok(Vec::new());
    };
    // An update that leaves the spec alone (Cluster API adds its ownerReference and labels to
    // every config; controllers remove finalizers) is admitted: the spec was checked when it
    // was written, and a template changed since must not block such updates.
    if let Some(old) = &request.old_object
        && old.data.get("spec") == object.data.get("spec")
    {
        return Ok(Vec::new());
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    match request.kind.kind.as_str() {
        "BootstrapTemplate" | "ClusterBootstrapTemplate" => {
            template_change(client, changed_template(request, object, &namespace)?).await
        }
        "BootplateConfig" => {
            let config: BootplateConfig = decode(object, "BootplateConfig")?;
            let template =
                referenced_template(client, &namespace, &config.spec.template_ref).await?;
            let (spec, checked, in_namespace) =
                (config.spec.clone(), template.clone(), namespace.clone());
            let mut problems = off_runtime(move || {
                let template = checked.as_ref().map(|(d, s)| (d.as_str(), s));
                validate::config("spec", &in_namespace, &spec, template)
            })
            .await?;
            if let Some(old) = &request.old_object {
                problems.extend(config_update(client, &namespace, old, config, template).await?);
            }
            Ok(problems)
        }
        "BootstrapGenerator" => {
            let generator: crd_types::BootstrapGenerator = decode(object, "BootstrapGenerator")?;
            Ok(validate::generator(&generator.spec))
        }
        "BootplateConfigTemplate" => {
            let config_template: BootplateConfigTemplate =
                decode(object, "BootplateConfigTemplate")?;
            let spec = config_template.spec.template.spec;
            let template = referenced_template(client, &namespace, &spec.template_ref).await?;
            off_runtime(move || {
                let template = template.as_ref().map(|(d, s)| (d.as_str(), s));
                validate::config("spec.template.spec", &namespace, &spec, template)
            })
            .await
        }
        _ => Ok(Vec::new()),
    }
}

/// A template written: its kind, namespace (`None`: cluster-scoped) and name, its spec before
/// (`None`: created) and now.
struct Changed<'a> {
    kind: TemplateKind,
    namespace: Option<&'a str>,
    name: &'a str,
    old: Option<TemplateSpec>,
    new: TemplateSpec,
}

/// The template `request` writes (`object`, a BootstrapTemplate in `namespace` or a
/// ClusterBootstrapTemplate), with its spec before when it is an update.
fn changed_template<'a>(
    request: &'a AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
    namespace: &'a str,
) -> Result<Changed<'a>, String> {
    let old = request.old_object.as_ref();
    let (kind, namespace, old, new) = if request.kind.kind == "BootstrapTemplate" {
        let spec = |o| decode::<BootstrapTemplate>(o, "BootstrapTemplate").map(|t| t.spec);
        let (old, new) = (old.map(spec).transpose()?, spec(object)?);
        (TemplateKind::BootstrapTemplate, Some(namespace), old, new)
    } else {
        let spec =
            |o| decode::<ClusterBootstrapTemplate>(o, "ClusterBootstrapTemplate").map(|t| t.spec.0);
        let (old, new) = (old.map(spec).transpose()?, spec(object)?);
        (TemplateKind::ClusterBootstrapTemplate, None, old, new)
    };
    Ok(Changed {
        kind,
        namespace,
        name: &request.name,
        old,
        new,
    })
}

/// The problems of a template written: its own/// The problems of a template written: its own (`validate::template`), and for an update of
/// one with `updatePolicy: InPlaceOnly`, what its running machines cannot take in place
/// (`validate::template_update`, over the configs that reference it).
async fn template_change(client: &Client, changed: Changed<'_>) -> Result<Vec<String>, String> {
    let display = display_name(changed.kind, changed.namespace, changed.name);
    let configs = match &changed.old {
        Some(old) if old.policy() == UpdatePolicy::InPlaceOnly => {
            configs_of(client, changed.kind, changed.namespace, changed.name).await?
        }
        _ => Vec::new(),
    };
    off_runtime(move || {
        let mut problems = validate::template(&display, &changed.new);
        if let Some(old) = &changed.old {
            problems.extend(validate::template_update(
                &display,
                old,
                &changed.new,
                &configs,
            ));
        }
        problems
    })
    .await
}

/// How many configs one listing page holds; the listing stops at [`MAX_CONFIGS_JUDGED`].
const CONFIG_PAGE: u32 = 500;
/// The most configs an `InPlaceOnly` template's update is judged against: beyond, it is refused
/// (it could not be judged within the webhook's time).
const MAX_CONFIGS_JUDGED: usize = 50_000;

/// The configs that reference template `name` of `kind` (a BootstrapTemplate: in its
/// namespace), listed page by page.
async fn configs_of(
    client: &Client,
    kind: TemplateKind,
    namespace: Option<&str>,
    name: &str,
) -> Result<Vec<BootplateConfig>, String> {
    let api: Api<BootplateConfig> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let mut params = kube::api::ListParams::default().limit(CONFIG_PAGE);
    let mut found = Vec::new();
    loop {
        let page = (api.list(&params).await)
            .map_err(|e| format!("cannot list the configs of {kind} {name}: {e}"))?;
        found.extend(page.items.into_iter().filter(|c| {
            let reference = &c.spec.template_ref;
            reference.kind == kind && reference.name == name
        }));
        if found.len() > MAX_CONFIGS_JUDGED {
            return Err(format!(
                "spec: updatePolicy is InPlaceOnly and more than {MAX_CONFIGS_JUDGED} configs reference {kind} {name}: the change cannot be judged at admission"
            ));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(found),
        }
    }
}

/// The problems of updating a written config from `old` to `config` (whose template is
/// `template`): see `validate::config_update`.
async fn config_update(
    client: &Client,
    namespace: &str,
    old: &DynamicObject,
    config: BootplateConfig,
    template: Option<(String, TemplateSpec)>,
) -> Result<Vec<String>, String> {
    let old: BootplateConfig = decode(old, "BootplateConfig")?;
    // The same template for both unless the reference changed.
    let old_template = if old.spec.template_ref == config.spec.template_ref {
        template.clone()
    } else {
        referenced_template(client, namespace, &old.spec.template_ref).await?
    };
    off_runtime(move || {
        validate::config_update(
            &old,
            &config,
            old_template.as_ref().map(|(d, s)| (d.as_str(), s)),
            template.as_ref().map(|(d, s)| (d.as_str(), s)),
        )
    })
    .await
}

/// Runs `work` (compiling, linting and sample-rendering templates: CPU-bound, unbounded by
/// the request) on a blocking thread, off the async runtime that also renews the leader
/// Lease and serves the health endpoints.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("the check did not finish: {e}"))
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

    #[tokio::test(flavor = "current_thread")]
    async fn webhook_lints_templates_off_the_async_runtime() {
        let runtime_thread = std::thread::current().id();
        let checked_on = off_runtime(|| std::thread::current().id()).await.unwrap();
        assert_ne!(checked_on, runtime_thread);
    }
}
