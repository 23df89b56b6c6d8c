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

/// How the render of `desired` differs from that of `current`, for `view`; `Err` says why they
/// cannot be compared.
pub(crate) async fn plan(
    client: &Client,
    view: &MachineView,
    current: &BootplateConfigSpec,
    desired: &BootplateConfigSpec,
) -> Result<UpdatePlan, String> {
    let cluster_name = &view.machine.spec.cluster_name;
    let cluster = Api::<Cluster>::namespaced(client.clone(), &view.namespace)
        .get(cluster_name)
        .await
        .map_err(|e| format!("cannot read Cluster {}/{cluster_name}: {e}", view.namespace))?;
    let old = side(client, view, current).await?;
    let new = side(client, view, desired).await?;
    let context = render::comparison_context(&cluster, &view.machine, view.role);
    tokio::task::spawn_blocking(move || {
        let compile = |(display, template, _): &Side| {
            CompiledTemplate::compile(display, template).map_err(|e| e.to_string())
        };
        let (old_compiled, new_compiled) = (compile(&old)?, compile(&new)?);
        render::compare(
            Revision {
                template: &old_compiled,
                config: &old.2,
            },
            Revision {
                template: &new_compiled,
                config: &new.2,
            },
            &context,
        )
        .map(|c| c.plan)
        .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("the render did not finish: {e}"))?
}

/// A spec's template (as messages name it, and its spec) and the spec with its files resolved.
type Side = (String, TemplateSpec, BootplateConfigSpec);

/// The template `spec` references and `spec` with its `contentFrom` files read, for `view`.
async fn side(
    client: &Client,
    view: &MachineView,
    spec: &BootplateConfigSpec,
) -> Result<Side, String> {
    let template_ref = &spec.template_ref;
    let (display, template) =
        super::templates::referenced_template(client, &view.namespace, template_ref)
            .await?
            .ok_or_else(|| {
                format!(
                    "{} {} (spec.templateRef) not found",
                    template_ref.kind, template_ref.name
                )
            })?;
    let mut config = BootplateConfig::new("in-place-comparison", spec.clone());
    config.metadata.namespace = Some(view.namespace.clone());
    let spec = crate::k8s::files::resolve(client, &config)
        .await
        .map_err(|e| e.to_string())?;
    Ok((display, template, spec))
}

/// The object whose `updatePolicy: InPlaceOnly` holds the machines of `spec` (`view`'s namespace)
/// to in-place updates: the template `spec` references, as messages name it; `None` when it has
/// no such policy or cannot be read (the comparison then says why).
pub(crate) async fn template_in_place_only(
    client: &Client,
    namespace: &str,
    spec: &BootplateConfigSpec,
) -> Option<String> {
    let (display, template) =
        super::templates::referenced_template(client, namespace, &spec.template_ref)
            .await
            .ok()??;
    (template.policy() == UpdatePolicy::InPlaceOnly).then_some(display)
}
