//! The validating admission webhook, served over TLS by `bootplate run`: broken templates and
//! bad configs are refused at `kubectl apply` instead of failing when a machine boots.

mod rollout;
pub mod tls;
pub mod validate;

use std::collections::HashSet;
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

use crate::k8s::templates::{display_name, referenced_template};

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
    let answer = match check(&client, &request).await {
        Ok(answer) => answer,
        Err(message) => Answer::refuse(vec![message]),
    };
    let mut response = AdmissionResponse::from(&request);
    if !answer.warnings.is_empty() {
        response.warnings = Some(answer.warnings);
    }
    let response = if answer.problems.is_empty() {
        response
    } else {
        let kind = &request.kind.kind;
        let name = request.name.clone();
        debug!(%kind, %name, "denied");
        response.deny(format!("{kind} {name}: {}", answer.problems.join("; ")))
    };
    Json(response.into_review())
}

/// The webhook's answer to one request: the reasons to deny it (none: admit), and what the
/// request will do, told as warnings (`kubectl` prints them, `--dry-run=server` included).
#[derive(Default)]
struct Answer {
    problems: Vec<String>,
    warnings: Vec<String>,
}

impl Answer {
    fn refuse(problems: Vec<String>) -> Answer {
        Answer {
            problems,
            warnings: Vec::new(),
        }
    }
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

/// The webhook's answer to `request`.
async fn check(
    client: &Client,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<Answer, String> {
    if request.operation == Operation::Delete || request.operation == Operation::Connect {
        return Ok(Answer::default());
    }
    let Some(object) = &request.object else {
        return Ok(Answer::default());
    };
    // An update that leaves the spec alone (Cluster API adds its ownerReference and labels to
    // every config; controllers remove finalizers) is admitted: the spec was checked when it
    // was written, and a template changed since must not block such updates.
    if let Some(old) = &request.old_object
        && old.data.get("spec") == object.data.get("spec")
    {
        return Ok(Answer::default());
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
            Ok(Answer::refuse(problems))
        }
        "BootstrapGenerator" => {
            let generator: crd_types::BootstrapGenerator = decode(object, "BootstrapGenerator")?;
            Ok(Answer::refuse(validate::generator(&generator.spec)))
        }
        "BootplateConfigTemplate" => {
            config_template_change(client, request, object, namespace).await
        }
        "MachineDeployment" => {
            let Some(old) = &request.old_object else {
                return Ok(Answer::default());
            };
            let warnings = rollout::warnings(client, &namespace, &request.name, old, object).await;
            Ok(Answer {
                problems: Vec::new(),
                warnings,
            })
        }
        _ => Ok(Answer::default()),
    }
}

/// The answer to a BootplateConfigTemplate written: its spec checked as a config's, and, for an
/// update, how many machines were created from it (Cluster API does not roll them out for it).
async fn config_template_change(
    client: &Client,
    request: &AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
    namespace: String,
) -> Result<Answer, String> {
    let config_template: BootplateConfigTemplate = decode(object, "BootplateConfigTemplate")?;
    let spec = config_template.spec.template.spec;
    let template = referenced_template(client, &namespace, &spec.template_ref).await?;
    let warnings = match &request.old_object {
        Some(_) => {
            let cloned = cloned_from(client, &namespace, &request.name).await?;
            crate::core::preview::config_template_warnings(cloned, MAX_CONFIGS_JUDGED)
        }
        None => Vec::new(),
    };
    let problems = off_runtime(move || {
        let template = template.as_ref().map(|(d, s)| (d.as_str(), s));
        validate::config("spec.template.spec", &namespace, &spec, template)
    })
    .await?;
    Ok(Answer { problems, warnings })
}

/// How many BootplateConfigs in `namespace` Cluster API cloned from config template `name`
/// (its `cloned-from-name` annotation); `None` beyond [`MAX_CONFIGS_JUDGED`].
async fn cloned_from(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<usize>, String> {
    let api: Api<BootplateConfig> = Api::namespaced(client.clone(), namespace);
    let cloned = list_bounded(&api, "configs", |c| {
        let annotations = c.metadata.annotations.as_ref();
        annotations
            .and_then(|a| a.get(crd_types::capi::CLONED_FROM_NAME))
            .is_some_and(|from| from == name)
    })
    .await?;
    Ok(cloned.map(|configs| configs.len()))
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

/// The answer to a template written: its own problems (`validate::template`); for an update,
/// what it does to the machines of the configs that reference it (`TemplateChange::preview`)
/// and, for one with `updatePolicy: InPlaceOnly`, what its running machines cannot take in place
/// (`TemplateChange::refusal`, one judge for both).
async fn template_change(client: &Client, changed: Changed<'_>) -> Result<Answer, String> {
    let display = display_name(changed.kind, changed.namespace, changed.name);
    let Some(old) = changed.old else {
        let new = changed.new;
        let problems = off_runtime(move || validate::template(&display, &new)).await?;
        return Ok(Answer::refuse(problems));
    };
    let scope = Scope {
        kind: changed.kind,
        namespace: changed.namespace,
        name: changed.name,
    };
    let new = changed.new;
    if old.policy() == UpdatePolicy::InPlaceOnly {
        return in_place_only_change(client, &scope, display, old, new).await;
    }
    // Only warnings are at stake: what does not fit in the budget is told as not counted, and
    // the update is judged on the template alone, within the webhook's time.
    let deadline = std::time::Instant::now() + PREVIEW_BUDGET;
    let gathered = tokio::time::timeout_at(deadline.into(), gather(client, &scope)).await;
    off_runtime(move || {
        let problems = validate::template(&display, &new);
        let warnings = match gathered {
            _ if !problems.is_empty() => Vec::new(),
            Ok(Ok(Some((configs, joined)))) => {
                let preview = validate::Preview {
                    configs: &configs,
                    joined: &joined,
                    deadline: Some(deadline),
                };
                validate::TemplateChange::new(&display, &old, &new).preview(&preview)
            }
            Ok(Ok(None)) => vec![format!(
                "more than {MAX_CONFIGS_JUDGED} configs reference this template: not counted"
            )],
            Ok(Err(e)) => vec![format!("what this change does is not told: {e}")],
            Err(_) => vec![format!(
                "the configs of this template were not listed within {} s: what this change does is not told",
                PREVIEW_BUDGET.as_secs()
            )],
        };
        Answer { problems, warnings }
    })
    .await
}

/// How long an update's preview may take (the webhook's own limit is 10 s, and the template's
/// checks need their share).
const PREVIEW_BUDGET: std::time::Duration = std::time::Duration::from_secs(4);

/// The answer to an update of a template with `updatePolicy: InPlaceOnly`: refused unless every
/// running machine can take it in place, which needs every one of them judged (no budget).
async fn in_place_only_change(
    client: &Client,
    scope: &Scope<'_>,
    display: String,
    old: TemplateSpec,
    new: TemplateSpec,
) -> Result<Answer, String> {
    let Some((configs, joined)) = gather(client, scope).await? else {
        return Ok(Answer::refuse(vec![format!(
            "spec: updatePolicy is InPlaceOnly and more than {MAX_CONFIGS_JUDGED} configs reference {} {}: the change cannot be judged at admission",
            scope.kind, scope.name
        )]));
    };
    off_runtime(move || {
        let mut problems = validate::template(&display, &new);
        let mut change = validate::TemplateChange::new(&display, &old, &new);
        problems.extend(change.refusal(&configs));
        let warnings = if problems.is_empty() {
            let preview = validate::Preview {
                configs: &configs,
                joined: &joined,
                deadline: None,
            };
            change.preview(&preview)
        } else {
            Vec::new()
        };
        Answer { problems, warnings }
    })
    .await
}

/// The configs that reference the template of `scope` and the joined Machines among their
/// owners; `None` beyond [`MAX_CONFIGS_JUDGED`] configs.
async fn gather(
    client: &Client,
    scope: &Scope<'_>,
) -> Result<Option<(Vec<BootplateConfig>, HashSet<(String, String)>)>, String> {
    let Some(configs) = configs_of(client, scope).await? else {
        return Ok(None);
    };
    let joined = joined_machines(client, scope.namespace, &configs).await?;
    Ok(Some((configs, joined)))
}

/// A template, for the listings of what references it: its kind, namespace (`None`:
/// cluster-scoped) and name.
struct Scope<'a> {
    kind: TemplateKind,
    namespace: Option<&'a str>,
    name: &'a str,
}

/// How many objects one listing page holds; a listing stops at [`MAX_CONFIGS_JUDGED`].
const CONFIG_PAGE: u32 = 500;
/// The most configs (and Machines) a template's update is judged against: beyond, an
/// `InPlaceOnly` template's update is refused (it could not be judged within the webhook's
/// time), and another's is admitted with a warning that nothing was counted.
const MAX_CONFIGS_JUDGED: usize = 50_000;

/// The configs that reference `template` (a BootstrapTemplate: in its namespace); `None` beyond
/// [`MAX_CONFIGS_JUDGED`] configs listed.
async fn configs_of(
    client: &Client,
    template: &Scope<'_>,
) -> Result<Option<Vec<BootplateConfig>>, String> {
    let api: Api<BootplateConfig> = match template.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    list_bounded(&api, "configs", |c| {
        let reference = &c.spec.template_ref;
        reference.kind == template.kind && reference.name == template.name
    })
    .await
}

/// The Machines (namespace, name) with a Node in `namespace` (`None`: every namespace); none
/// listed when no config of `configs` may be running (`validate::running`).
async fn joined_machines(
    client: &Client,
    namespace: Option<&str>,
    configs: &[BootplateConfig],
) -> Result<HashSet<(String, String)>, String> {
    if !configs.iter().any(validate::running) {
        return Ok(HashSet::new());
    }
    let api: Api<crd_types::capi::Machine> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let machines = list_bounded(&api, "Machines", |m| m.has_node()).await?;
    Ok((machines.unwrap_or_default().into_iter())
        .map(|m| {
            (
                m.metadata.namespace.unwrap_or_default(),
                m.metadata.name.unwrap_or_default(),
            )
        })
        .collect())
}

/// The objects `api` lists that `keep` keeps, page by page; `None` once more than
/// [`MAX_CONFIGS_JUDGED`] were kept.
async fn list_bounded<K>(
    api: &Api<K>,
    what: &str,
    keep: impl Fn(&K) -> bool,
) -> Result<Option<Vec<K>>, String>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut params = kube::api::ListParams::default().limit(CONFIG_PAGE);
    let mut found = Vec::new();
    loop {
        let page = (api.list(&params).await).map_err(|e| format!("cannot list the {what}: {e}"))?;
        found.extend(page.items.into_iter().filter(|item| keep(item)));
        if found.len() > MAX_CONFIGS_JUDGED {
            return Ok(None);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(Some(found)),
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
