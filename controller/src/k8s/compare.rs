//! The renders an in-place hook (and the webhook's rollout preview) compares: a config spec
//! rendered for one machine's view, the template read from the apiserver. The comparison itself
//! is `render::compare`, the one `bootplate diff` and the admission webhook use: both renders
//! get the same stand-ins for what is the same for both (the token, the CA hash, certificates,
//! generated parts), so only what the spec or template change moves shows as a difference.

use crd_types::capi::{Cluster, Machine};
use crd_types::{BootplateConfig, BootplateConfigSpec, Role, TemplateSpec, UpdatePolicy};
use kube::{Api, Client};
use render::{CompiledTemplate, Revision, UpdatePlan};

/// A machine as the renders see it.
pub(crate) struct MachineView {
    pub namespace: String,
    pub machine: Machine,
    pub role: Role,
}

/// Two renders of one machine compared: how the render of the desired spec differs from the
/// current one's (`Err` says why they cannot be compared), and the current spec's template, as
/// messages name it, when its `updatePolicy: InPlaceOnly` holds the machine to in-place updates
/// (`None` too when it cannot be read: the plan then says why).
pub(crate) struct Compared {
    pub plan: Result<UpdatePlan, String>,
    pub template_holds: Option<String>,
}

/// Compares the renders of `current` and `desired` for `view`, each template read once.
pub(crate) async fn compare(
    client: &Client,
    view: &MachineView,
    current: &BootplateConfigSpec,
    desired: &BootplateConfigSpec,
) -> Compared {
    let current_template = template_of(client, &view.namespace, current).await;
    let template_holds = current_template
        .as_ref()
        .ok()
        .and_then(|t| (t.spec.policy() == UpdatePolicy::InPlaceOnly).then(|| t.display.clone()));
    let plan = match current_template {
        Ok(template) => plan(client, view, template, current, desired).await,
        Err(e) => Err(e),
    };
    Compared {
        plan,
        template_holds,
    }
}

/// How the render of `desired` differs from that of `current` (whose template is
/// `current_template`), for `view`; `Err` says why they cannot be compared.
async fn plan(
    client: &Client,
    view: &MachineView,
    current_template: Template,
    current: &BootplateConfigSpec,
    desired: &BootplateConfigSpec,
) -> Result<UpdatePlan, String> {
    let cluster_name = &view.machine.spec.cluster_name;
    let cluster = Api::<Cluster>::namespaced(client.clone(), &view.namespace)
        .get(cluster_name)
        .await
        .map_err(|e| format!("cannot read Cluster {}/{cluster_name}: {e}", view.namespace))?;
    let old = side(client, view, current_template, current).await?;
    let desired_template = template_of(client, &view.namespace, desired).await?;
    let new = side(client, view, desired_template, desired).await?;
    let context = render::comparison_context(&cluster, &view.machine, view.role);
    tokio::task::spawn_blocking(move || {
        let compile = |side: &Side| {
            CompiledTemplate::compile(&side.template.display, &side.template.spec)
                .map_err(|e| e.to_string())
        };
        let (old_compiled, new_compiled) = (compile(&old)?, compile(&new)?);
        render::compare(
            Revision {
                template: &old_compiled,
                config: &old.spec,
            },
            Revision {
                template: &new_compiled,
                config: &new.spec,
            },
            &context,
        )
        .map(|c| c.plan)
        .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("the render did not finish: {e}"))?
}

/// A config spec's template, as messages name it, and its spec.
struct Template {
    display: String,
    spec: TemplateSpec,
}

/// One side of a comparison: the template and the config spec with its files resolved.
struct Side {
    template: Template,
    spec: BootplateConfigSpec,
}

/// The template `spec` references, in `namespace`.
async fn template_of(
    client: &Client,
    namespace: &str,
    spec: &BootplateConfigSpec,
) -> Result<Template, String> {
    let template_ref = &spec.template_ref;
    let (display, spec) = super::templates::referenced_template(client, namespace, template_ref)
        .await?
        .ok_or_else(|| {
            format!(
                "{} {} (spec.templateRef) not found",
                template_ref.kind, template_ref.name
            )
        })?;
    Ok(Template { display, spec })
}

/// `spec` with its `contentFrom` files read, for `view`, beside its `template`.
async fn side(
    client: &Client,
    view: &MachineView,
    template: Template,
    spec: &BootplateConfigSpec,
) -> Result<Side, String> {
    let mut config = BootplateConfig::new("in-place-comparison", spec.clone());
    config.metadata.namespace = Some(view.namespace.clone());
    let spec = crate::k8s::files::resolve(client, &config)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Side { template, spec })
}
