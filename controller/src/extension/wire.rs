//! The Runtime SDK's messages (`hooks.runtime.cluster.x-k8s.io/v1alpha1`), as far as bootplate
//! reads and writes them. Objects stay JSON: only their `metadata` and `spec` are read.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

/// The API version of every request and response.
pub const API_VERSION: &str = "hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// The handlers bootplate serves: (name, hook).
pub const HANDLERS: [(&str, &str); 3] = [
    ("can-update-machine-set", "CanUpdateMachineSet"),
    ("can-update-machine", "CanUpdateMachine"),
    ("update-machine", "UpdateMachine"),
];

/// `CanUpdateMachineSet`'s request.
#[derive(Deserialize)]
pub struct CanUpdateMachineSetRequest {
    /// The MachineSet as it is, with its templates.
    pub current: MachineSetObjects,
    /// The MachineSet as its MachineDeployment wants it.
    pub desired: MachineSetObjects,
}

/// A MachineSet and its templates.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetObjects {
    /// The MachineSet (metadata and spec).
    #[serde(default)]
    pub machine_set: Value,
    /// Its bootstrap config template, when it has one.
    #[serde(default)]
    pub bootstrap_config_template: Option<Value>,
}

/// `CanUpdateMachine`'s request.
#[derive(Deserialize)]
pub struct CanUpdateMachineRequest {
    /// The Machine as it is, with its bootstrap config.
    pub current: MachineObjects,
    /// The Machine as its owner wants it.
    pub desired: MachineObjects,
}

/// `UpdateMachine`'s request.
#[derive(Deserialize)]
pub struct UpdateMachineRequest {
    /// The Machine, as it is to be once updated.
    pub desired: MachineObjects,
}

/// A Machine and its bootstrap config.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjects {
    /// The Machine (metadata and spec).
    #[serde(default)]
    pub machine: Value,
    /// Its bootstrap config, when it has one.
    #[serde(default)]
    pub bootstrap_config: Option<Value>,
}

/// The discovery response: every handler, failing closed (Cluster API then rolls out).
pub fn discovery() -> Value {
    let handlers: Vec<Value> = HANDLERS
        .iter()
        .map(|(name, hook)| {
            json!({
                "name": name,
                "requestHook": {"apiVersion": API_VERSION, "hook": hook},
                "timeoutSeconds": 10,
                "failurePolicy": "Fail",
            })
        })
        .collect();
    json!({
        "apiVersion": API_VERSION,
        "kind": "DiscoveryResponse",
        "status": "Success",
        "handlers": handlers,
    })
}

/// A `<hook>Response` with status Success or Failure and `message`.
pub fn response(hook: &str, success: bool, message: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": format!("{hook}Response"),
        "status": if success { "Success" } else { "Failure" },
        "message": message,
    })
}

/// A JSON patch (RFC 6902) that replaces the value at `path` with `value`, as the Runtime SDK
/// carries it (`patch` is bytes: base64 in JSON).
pub fn replace_patch(path: &str, value: &Value) -> Value {
    let patch = json!([{"op": "replace", "path": path, "value": value}]);
    json!({
        "patchType": "JSONPatch",
        "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_names_each_hook_once_and_fails_closed() {
        let found = discovery();
        let handlers = found["handlers"].as_array().unwrap();
        assert_eq!(handlers.len(), 3);
        for (handler, (name, hook)) in handlers.iter().zip(HANDLERS) {
            assert_eq!(handler["name"], name);
            assert_eq!(handler["requestHook"]["hook"], hook);
            assert_eq!(handler["requestHook"]["apiVersion"], API_VERSION);
            assert_eq!(handler["failurePolicy"], "Fail");
        }
        assert_eq!(found["kind"], "DiscoveryResponse");
    }

    #[test]
    fn a_patch_is_a_base64_json_patch() {
        let patch = replace_patch("/spec/template/spec", &json!({"a": 1}));
        assert_eq!(patch["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch["patch"].as_str().unwrap())
            .unwrap();
        let ops: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            ops,
            json!([{"op": "replace", "path": "/spec/template/spec", "value": {"a": 1}}])
        );
    }
}
