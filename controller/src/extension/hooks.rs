//! The hook handlers: decode the request, gather the renders or the config's status, ask the
//! core (`core::inplace`), answer.

use axum::Json;
use axum::extract::{Path, State};
use crd_types::capi::{CLONED_FROM_GROUP_KIND, CLONED_FROM_NAME, CONTROL_PLANE_LABEL, Machine};
use crd_types::{
    BootplateConfig, BootplateConfigSpec, BootplateConfigTemplate, Role, UpdatePolicy,
};
use kube::Api;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::Hooks;
use super::wire::{
    self, CanUpdateMachineRequest, CanUpdateMachineSetRequest, UpdateMachineRequest,
};
use crate::core::inplace;
use crate::k8s::compare::{self, MachineView};

const GROUP: &str = "bootstrap.bootplate.dev/";

/// `POST <prefix>/discovery`.
pub(super) async fn discovery(State(hooks): State<Hooks>) -> Json<Value> {
    hooks.metrics.hook_request("discovery", "done");
    Json(wire::discovery())
}

/// `POST <prefix>/<hook>/<handler>`.
pub(super) async fn dispatch(
    State(hooks): State<Hooks>,
    Path((hook, _handler)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Json<Value> {
    // Cluster API's client sends JSON without a Content-Type: the body is read as JSON whatever
    // the header says.
    let answer = match serde_json::from_slice::<Value>(&body) {
        Err(e) => Err(format!("the request is not JSON: {e}")),
        Ok(body) => answer(&hooks, &hook, body).await,
    };
    Json(answer.unwrap_or_else(|message| {
        let label = hook_label(&hook);
        warn!(hook = label, %message, "runtime hook failed");
        hooks.metrics.hook_request(label, "error");
        wire::response(&hook, false, &message)
    }))
}

/// The metric label of a hook path segment: the names the success paths count under, and
/// `unknown` for any other segment, so a caller cannot mint label values (each one is a series
/// the process keeps for its lifetime).
fn hook_label(path_segment: &str) -> &'static str {
    match path_segment {
        "canupdatemachineset" => "can_update_machine_set",
        "canupdatemachine" => "can_update_machine",
        "updatemachine" => "update_machine",
        _ => "unknown",
    }
}

async fn answer(hooks: &Hooks, hook: &str, body: Value) -> Result<Value, String> {
    match hook {
        "canupdatemachineset" => can_update_machine_set(hooks, body).await,
        "canupdatemachine" => can_update_machine(hooks, body).await,
        "updatemachine" => update_machine(hooks, body).await,
        other => Err(format!("bootplate serves no hook {other:?}")),
    }
}

fn decode<T: DeserializeOwned>(value: Value, what: &str) -> Result<T, String> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| format!("not a valid {what}: {}: {}", e.path(), e.inner()))
}

/// `object` when it is one of bootplate's kinds (`kind`).
fn ours<'a>(object: Option<&'a Value>, kind: &str) -> Option<&'a Value> {
    object.filter(|o| {
        o["kind"] == kind
            && o["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with(GROUP))
    })
}

fn role_of(labels: &Value) -> Role {
    if labels.get(CONTROL_PLANE_LABEL).is_some() {
        Role::ControlPlaneJoin
    } else {
        Role::Worker
    }
}

async fn can_update_machine_set(hooks: &Hooks, body: Value) -> Result<Value, String> {
    const HOOK: &str = "CanUpdateMachineSet";
    let request: CanUpdateMachineSetRequest = decode(body, "CanUpdateMachineSetRequest")?;
    let kind = "BootplateConfigTemplate";
    let (Some(current), Some(desired)) = (
        ours(request.current.bootstrap_config_template.as_ref(), kind),
        ours(request.desired.bootstrap_config_template.as_ref(), kind),
    ) else {
        hooks
            .metrics
            .hook_request("can_update_machine_set", "rollout");
        return Ok(wire::response(
            HOOK,
            true,
            "not a BootplateConfigTemplate: nothing for bootplate to say",
        ));
    };
    let machine_set = &request.desired.machine_set;
    let namespace = machine_set["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let template = &machine_set["spec"]["template"];
    let machine: Machine = decode(
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {
                "name": machine_set["metadata"]["name"],
                "namespace": namespace,
                "labels": template["metadata"]["labels"],
            },
            "spec": template["spec"],
        }),
        "MachineSet spec.template",
    )?;
    let view = MachineView {
        namespace: namespace.to_owned(),
        role: role_of(&template["metadata"]["labels"]),
        machine,
    };
    let desired_spec = &desired["spec"]["template"]["spec"];
    let policy_holder = (current["spec"]["updatePolicy"] == "InPlaceOnly").then(|| {
        let name = current["metadata"]["name"].as_str().unwrap_or_default();
        format!("BootplateConfigTemplate {namespace}/{name}")
    });
    let answer = compared(
        hooks,
        &view,
        &current["spec"]["template"]["spec"],
        desired_spec,
        policy_holder,
    )
    .await;
    hooks
        .metrics
        .hook_request("can_update_machine_set", answer.answer);
    info!(machine_set = %machine_set["metadata"]["name"], answer = answer.answer, message = %answer.message, "CanUpdateMachineSet");
    let mut response = wire::response(HOOK, answer.success, &answer.message);
    if answer.patch {
        response["bootstrapConfigTemplatePatch"] =
            wire::replace_patch("/spec/template/spec", desired_spec);
    }
    Ok(response)
}

async fn can_update_machine(hooks: &Hooks, body: Value) -> Result<Value, String> {
    const HOOK: &str = "CanUpdateMachine";
    let request: CanUpdateMachineRequest = decode(body, "CanUpdateMachineRequest")?;
    let kind = "BootplateConfig";
    let (Some(current), Some(desired)) = (
        ours(request.current.bootstrap_config.as_ref(), kind),
        ours(request.desired.bootstrap_config.as_ref(), kind),
    ) else {
        hooks.metrics.hook_request("can_update_machine", "rollout");
        return Ok(wire::response(
            HOOK,
            true,
            "not a BootplateConfig: nothing for bootplate to say",
        ));
    };
    let mut machine = request.desired.machine;
    let namespace = current["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    machine["metadata"]["namespace"] = namespace.clone().into();
    let machine: Machine = decode(machine, "Machine")?;
    let role = recorded_role(hooks, &namespace, current)
        .await
        .unwrap_or_else(|| role_of(&json!(machine.metadata.labels)));
    let view = MachineView {
        namespace,
        machine,
        role,
    };
    let policy_holder = cloned_from_in_place_only(hooks, &view.namespace, current).await;
    let answer = compared(
        hooks,
        &view,
        &current["spec"],
        &desired["spec"],
        policy_holder,
    )
    .await;
    hooks
        .metrics
        .hook_request("can_update_machine", answer.answer);
    info!(machine = %view.machine.metadata.name.as_deref().unwrap_or_default(), answer = answer.answer, message = %answer.message, "CanUpdateMachine");
    let mut response = wire::response(HOOK, answer.success, &answer.message);
    if answer.patch {
        response["bootstrapConfigPatch"] = wire::replace_patch("/spec", &desired["spec"]);
    }
    Ok(response)
}

/// The role a config's data Secret was rendered for, from its status.
async fn recorded_role(hooks: &Hooks, namespace: &str, config: &Value) -> Option<Role> {
    let name = config["metadata"]["name"].as_str()?;
    let found = Api::<BootplateConfig>::namespaced(hooks.client.clone(), namespace)
        .get_opt(name)
        .await
        .ok()??;
    found.status?.role?.parse().ok()
}

/// The BootplateConfigTemplate config `config` was cloned from (Cluster API's annotations) when
/// it has `updatePolicy: InPlaceOnly`, as messages name it.
async fn cloned_from_in_place_only(
    hooks: &Hooks,
    namespace: &str,
    config: &Value,
) -> Option<String> {
    let annotations = &config["metadata"]["annotations"];
    let kind = annotations[CLONED_FROM_GROUP_KIND].as_str()?;
    let name = annotations[CLONED_FROM_NAME].as_str()?;
    if kind != format!("BootplateConfigTemplate.{}", crd_types::GROUP) {
        return None;
    }
    let template = Api::<BootplateConfigTemplate>::namespaced(hooks.client.clone(), namespace)
        .get_opt(name)
        .await
        .ok()??;
    (template.spec.update_policy == Some(UpdatePolicy::InPlaceOnly))
        .then(|| format!("BootplateConfigTemplate {namespace}/{name}"))
}

/// Compares the renders of two config specs (JSON) for `view`. `policy_holder`: a config
/// template that holds its machines to in-place updates; the current spec's template may too.
async fn compared(
    hooks: &Hooks,
    view: &MachineView,
    current: &Value,
    desired: &Value,
    policy_holder: Option<String>,
) -> inplace::CanUpdate {
    let specs =
        decode::<BootplateConfigSpec>(current.clone(), "current config spec").and_then(|c| {
            Ok((
                c,
                decode::<BootplateConfigSpec>(desired.clone(), "desired config spec")?,
            ))
        });
    let (plan, policy_holder) = match specs {
        Ok((current, desired)) => {
            let compared = compare::compare(&hooks.client, view, &current, &desired).await;
            (compared.plan, policy_holder.or(compared.template_holds))
        }
        Err(e) => (Err(e), policy_holder),
    };
    inplace::can_update(plan, policy_holder.as_deref())
}

async fn update_machine(hooks: &Hooks, body: Value) -> Result<Value, String> {
    const HOOK: &str = "UpdateMachine";
    let request: UpdateMachineRequest = decode(body, "UpdateMachineRequest")?;
    let respond = |answer: inplace::UpdateAnswer, label: &str| {
        hooks.metrics.hook_request("update_machine", label);
        let mut response = wire::response(HOOK, answer.success, &answer.message);
        response["retryAfterSeconds"] = answer.retry_after_seconds.into();
        response
    };
    let Some(config) = ours(request.desired.bootstrap_config.as_ref(), "BootplateConfig") else {
        let answer = inplace::UpdateAnswer {
            success: true,
            message: "not a BootplateConfig: nothing for bootplate to apply".into(),
            retry_after_seconds: 0,
        };
        return Ok(respond(answer, "done"));
    };
    let namespace = config["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = config["metadata"]["name"].as_str().unwrap_or_default();
    let found = Api::<BootplateConfig>::namespaced(hooks.client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("cannot read BootplateConfig {namespace}/{name}: {e}"))?;
    let status = found.status.clone().unwrap_or_default();
    let answer = inplace::update_answer(&status, found.metadata.generation);
    let label = match (answer.success, answer.retry_after_seconds) {
        (false, _) => "failure",
        (true, 0) => "done",
        _ => "in_progress",
    };
    info!(config = %format!("{namespace}/{name}"), answer = label, message = %answer.message, "UpdateMachine");
    Ok(respond(answer, label))
}

#[cfg(test)]
mod label_tests {
    use super::hook_label;

    #[test]
    fn failed_calls_count_under_the_names_of_served_hooks_or_unknown() {
        for (segment, label) in [
            ("canupdatemachineset", "can_update_machine_set"),
            ("canupdatemachine", "can_update_machine"),
            ("updatemachine", "update_machine"),
            ("x".repeat(300).as_str(), "unknown"),
            ("discovery-typo", "unknown"),
        ] {
            assert_eq!(hook_label(segment), label, "{segment}");
        }
    }
}
