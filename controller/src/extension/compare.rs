//! The renders a hook compares: a config spec rendered for one machine's view, the template read
//! from the apiserver. Both renders of a comparison get the same stand-ins for what is the same
//! for both (the token, the CA hash, certificates), so only what the spec or template change
//! moves shows as a difference. No generator is called: a generated part counts as changed
//! when the request it would send changes (`CompiledTemplate::comparison_stand_ins`).

use crd_types::capi::{Cluster, Machine};
use crd_types::{BootplateConfig, BootplateConfigSpec, Role};
use kube::{Api, Client};
use render::{CompiledTemplate, JoinInfo, PartsRender, RenderContext, UpdatePlan};

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
    let old = parts(client, view, &cluster, current).await?;
    let new = parts(client, view, &cluster, desired).await?;
    match (old, new) {
        (Some(old), Some(new)) => Ok(new.update_from(&old)),
        _ if current == desired => Ok(UpdatePlan::Unchanged),
        _ => Err("a template with a raw spec.template has no parts to update in place".into()),
    }
}

/// The render of `spec` for `view`, split by part; `None` for a raw template.
async fn parts(
    client: &Client,
    view: &MachineView,
    cluster: &Cluster,
    spec: &BootplateConfigSpec,
) -> Result<Option<PartsRender>, String> {
    let template_ref = &spec.template_ref;
    let (display, template) =
        crate::webhook::referenced_template(client, &view.namespace, template_ref)
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
    let endpoint = render::ClusterInfo::from_cluster(cluster).control_plane_endpoint;
    let join = JoinInfo {
        token: render::SAMPLE_TOKEN.into(),
        api_server_endpoint: endpoint.address(),
        ca_cert_hashes: vec![render::SAMPLE_CA_HASH.into()],
    };
    let certs = Some(render::sample_certificates());
    let context = RenderContext::new(cluster, &view.machine, view.role, Some(join), certs);
    tokio::task::spawn_blocking(move || {
        let compiled = CompiledTemplate::compile(&display, &template).map_err(|e| e.to_string())?;
        let generated = compiled.comparison_stand_ins(&spec, &context);
        compiled
            .render_parts(&spec, &context, &generated)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("the render did not finish: {e}"))?
}
