//! The per-node payload Secret in the workload cluster, and the Role and RoleBinding that let
//! that node, and only it, read it: `kube-system/bootplate-node-<node>`, readable by
//! `system:node:<node>` (the kubelet's identity, which bootplate-agent uses). The objects are
//! built by plain functions (unit-tested) and server-side applied.

use std::collections::BTreeMap;

use crd_types::payload::{NAMESPACE, NodePayload, SECRET_KEY, secret_name};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

use crate::labels;

/// The annotation on the payload Secret with the payload's revision.
pub const REVISION_ANNOTATION: &str = "bootstrap.bootplate.dev/payload-revision";
const NODE_LABEL: &str = "bootstrap.bootplate.dev/node";

fn meta(node: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(secret_name(node)),
        namespace: Some(NAMESPACE.to_owned()),
        labels: Some(BTreeMap::from([(NODE_LABEL.to_owned(), node.to_owned())])),
        ..ObjectMeta::default()
    }
}

/// The payload Secret of `node`.
pub fn secret(node: &str, payload: &NodePayload) -> Secret {
    let json = serde_json::to_vec(payload).expect("a payload always serializes");
    let mut metadata = meta(node);
    metadata.annotations = Some(BTreeMap::from([(
        REVISION_ANNOTATION.to_owned(),
        payload.revision(),
    )]));
    Secret {
        metadata,
        type_: Some("bootstrap.bootplate.dev/node-payload".to_owned()),
        data: Some(BTreeMap::from([(SECRET_KEY.to_owned(), ByteString(json))])),
        ..Secret::default()
    }
}

/// The Role that allows reading that one Secret (`get` by name: `list` and `watch` cannot be
/// limited to names, so the agent polls).
pub fn role(node: &str) -> Role {
    Role {
        metadata: meta(node),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".to_owned()]),
            resource_names: Some(vec![secret_name(node)]),
            verbs: vec!["get".to_owned()],
            ..PolicyRule::default()
        }]),
    }
}

/// The RoleBinding that grants [`role`] to the node's identity, `system:node:<node>`.
pub fn role_binding(node: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(node),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: secret_name(node),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "User".to_owned(),
            name: format!("system:node:{node}"),
            ..Subject::default()
        }]),
    }
}

/// Applies the Role, the RoleBinding and the payload Secret of `node` in the workload cluster
/// `client` reaches; returns the payload's revision.
pub async fn publish(
    client: &kube::Client,
    node: &str,
    payload: &NodePayload,
) -> Result<String, kube::Error> {
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    let name = secret_name(node);
    let roles: Api<Role> = Api::namespaced(client.clone(), NAMESPACE);
    roles
        .patch(&name, &params, &Patch::Apply(typed(role(node))))
        .await?;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), NAMESPACE);
    bindings
        .patch(&name, &params, &Patch::Apply(typed(role_binding(node))))
        .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    secrets
        .patch(&name, &params, &Patch::Apply(typed(secret(node, payload))))
        .await?;
    Ok(payload.revision())
}

/// `object` with its apiVersion and kind, as server-side apply wants.
fn typed<K: kube::Resource<DynamicType = ()> + serde::Serialize>(object: K) -> serde_json::Value {
    let mut value = serde_json::to_value(&object).expect("an object always serializes");
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nodes_own_identity_may_get_its_secret() {
        let role = role("worker-1");
        let rule = &role.rules.as_ref().unwrap()[0];
        assert_eq!(rule.verbs, ["get"]);
        assert_eq!(
            rule.resource_names.as_deref(),
            Some(&["bootplate-node-worker-1".to_owned()][..])
        );
        let binding = role_binding("worker-1");
        let subjects = binding.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "User");
        assert_eq!(subjects[0].name, "system:node:worker-1");
        assert_eq!(binding.role_ref.name, "bootplate-node-worker-1");
    }

    #[test]
    fn the_secret_holds_the_payload_and_its_revision() {
        let payload = NodePayload {
            parts: vec![crd_types::payload::PayloadPart {
                name: "configure".into(),
                commands: vec!["true".into()],
                ..Default::default()
            }],
        };
        let secret = secret("worker-1", &payload);
        let stored: NodePayload =
            serde_json::from_slice(&secret.data.unwrap()[SECRET_KEY].0).unwrap();
        assert_eq!(stored, payload);
        assert_eq!(
            secret.metadata.annotations.unwrap()[REVISION_ANNOTATION],
            payload.revision()
        );
        assert_eq!(secret.metadata.namespace.as_deref(), Some("kube-system"));
    }
}
