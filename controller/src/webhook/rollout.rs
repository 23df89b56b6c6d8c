//! A MachineDeployment's move from one BootplateConfigTemplate to another, told at admission:
//! Cluster API rolls its machines out on that change, and the warnings say what the rollout
//! does to them (`core::preview::rollout_warnings`), judged as the in-place hooks will judge it
//! (`k8s::compare`). Only warnings: bootplate never refuses an update of Cluster API's
//! objects, and says so when it cannot tell.

use crd_types::capi::Machine;
use crd_types::{BootplateConfigTemplate, Role, UpdatePolicy};
use kube::api::ListParams;
use kube::core::DynamicObject;
use kube::{Api, Client};

use crate::core::preview::{self, Rollout, Verdict};
use crate::k8s::compare::{self, MachineView};

/// The warnings for an update of MachineDeployment `name` in `namespace` from `old` to `new`;
/// none unless its bootstrap reference moves between two BootplateConfigTemplates.
pub(super) async fn warnings(
    client: &Client,
    namespace: &str,
    name: &str,
    old: &DynamicObject,
    new: &DynamicObject,
) -> Vec<String> {
    let (Some(from), Some(to)) = (config_template_of(old), config_template_of(new)) else {
        return Vec::new();
    };
    if from == to {
        return Vec::new();
    }
    let deployment = Deployment {
        namespace,
        name,
        from: &from,
        to: &to,
    };
    match preview_rollout(client, &deployment).await {
        Ok(warnings) => warnings,
        Err(e) => vec![format!("bootplate cannot tell what this rollout does: {e}")],
    }
}

/// The BootplateConfigTemplate a MachineDeployment's machines are made with, when they are.
fn config_template_of(deployment: &DynamicObject) -> Option<String> {
    let reference = &deployment.data["spec"]["template"]["spec"]["bootstrap"]["configRef"];
    let group = (reference["apiGroup"].as_str())
        .or_else(|| reference["apiVersion"].as_str()?.split('/').next())?;
    let ours = group == crd_types::GROUP && reference["kind"] == "BootplateConfigTemplate";
    ours.then(|| reference["name"].as_str().map(str::to_owned))?
}

/// The MachineDeployment whose bootstrap reference moves `from` one config template `to`
/// another.
struct Deployment<'a> {
    namespace: &'a str,
    name: &'a str,
    from: &'a str,
    to: &'a str,
}

async fn preview_rollout(
    client: &Client,
    deployment: &Deployment<'_>,
) -> Result<Vec<String>, String> {
    let namespace = deployment.namespace;
    let templates: Api<BootplateConfigTemplate> = Api::namespaced(client.clone(), namespace);
    let read = |name: &str| {
        let (templates, name) = (templates.clone(), name.to_owned());
        async move {
            (templates.get(&name).await)
                .map_err(|e| format!("cannot read BootplateConfigTemplate {namespace}/{name}: {e}"))
        }
    };
    let (old, new) = (read(deployment.from).await?, read(deployment.to).await?);
    let machines: Api<Machine> = Api::namespaced(client.clone(), namespace);
    let selector = format!("cluster.x-k8s.io/deployment-name={}", deployment.name);
    let listed = (machines
        .list(&ListParams::default().labels(&selector))
        .await)
        .map_err(|e| {
            format!(
                "cannot list the Machines of MachineDeployment {namespace}/{}: {e}",
                deployment.name
            )
        })?;
    let joined: Vec<Machine> = listed.items.into_iter().filter(Machine::has_node).collect();
    let (old_spec, new_spec) = (&old.spec.template.spec, &new.spec.template.spec);
    let mut template_holds = None;
    let verdict = match joined.first() {
        None => None,
        Some(machine) => {
            let view = MachineView {
                namespace: namespace.to_owned(),
                machine: machine.clone(),
                role: Role::Worker,
            };
            let compared = compare::compare(client, &view, old_spec, new_spec).await;
            template_holds = compared.template_holds;
            Some(match compared.plan {
                Ok(render::UpdatePlan::Unchanged) => Verdict::Unchanged,
                Ok(render::UpdatePlan::InPlace { parts }) => Verdict::InPlace { parts },
                Ok(render::UpdatePlan::Rollout { reason }) => Verdict::Replaced { why: reason },
                Err(why) => Verdict::Unjudged { why },
            })
        }
    };
    let config_template_holds = (old.spec.update_policy == Some(UpdatePolicy::InPlaceOnly))
        .then(|| format!("BootplateConfigTemplate {namespace}/{}", deployment.from));
    let held_by = config_template_holds.or(template_holds);
    Ok(preview::rollout_warnings(&Rollout {
        joined: joined.len(),
        to: deployment.to,
        verdict,
        held_by,
    }))
}
