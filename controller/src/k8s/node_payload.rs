//! The per-node payload Secret in the workload cluster, and the Role and RoleBinding that let
//! that node, and only it, read it: `kube-system/bootplate-node-<node>`, readable by
//! `system:node:<node>` (the kubelet's identity, which bootplate-agent uses). The objects are
//! built by plain functions (unit-tested) and server-side applied.
//!
//! Node names are reused (clouds name nodes after their private addresses), and RBAC grants by
//! name only. So the three objects go with their Node and their config: each has an
//! ownerReference to the Node (by UID: the workload cluster's garbage collector deletes them
//! when that Node is deleted, also when a new Node of the same name exists by then), and a
//! label with the config's UID, by which bootplate deletes them when it sees the config
//! deleted. The Secret also records the Node's UID and provider ID ([`NodeBinding`]), and the
//! agent applies it only on that Node: a payload that outlived both is still not applied by the
//! next Node of the name.

use std::collections::BTreeMap;

use crd_types::payload::{
    BOOTED_KEY, BootedManifest, NAMESPACE, NODE_KEY, NodeBinding, NodePayload, SECRET_KEY,
    secret_name,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use crate::error::is_not_found;
use crate::labels;

/// The annotation on the payload Secret with the payload's revision.
pub const REVISION_ANNOTATION: &str = "bootstrap.bootplate.dev/payload-revision";
const NODE_LABEL: &str = "bootstrap.bootplate.dev/node";

/// The Node a payload is published for, and the config it comes from.
#[derive(Clone, Debug)]
pub struct Target {
    /// What the agent checks its Node against.
    pub binding: NodeBinding,
    /// The UID of the config whose payload it is.
    pub config_uid: String,
}

impl Target {
    /// The payload target of `node` (as read from the workload cluster) for config
    /// `config_uid`.
    pub fn new(node: &Node, config_uid: &str) -> Target {
        Target {
            binding: NodeBinding {
                name: node.name_any(),
                uid: node.uid().unwrap_or_default(),
                provider_id: node.spec.as_ref().and_then(|s| s.provider_id.clone()),
            },
            config_uid: config_uid.to_owned(),
        }
    }

    fn node(&self) -> &str {
        &self.binding.name
    }
}

fn meta(target: &Target) -> ObjectMeta {
    let node = target.node();
    ObjectMeta {
        name: Some(secret_name(node)),
        namespace: Some(NAMESPACE.to_owned()),
        labels: Some(BTreeMap::from([
            (NODE_LABEL.to_owned(), node.to_owned()),
            (
                labels::PAYLOAD_CONFIG_UID.to_owned(),
                target.config_uid.clone(),
            ),
        ])),
        owner_references: Some(vec![OwnerReference {
            api_version: Node::api_version(&()).into_owned(),
            kind: Node::kind(&()).into_owned(),
            name: node.to_owned(),
            uid: target.binding.uid.clone(),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    }
}

/// The payload Secret of the target Node; `booted`, what its user-data wrote for the `InPlace`
/// parts, is where the agent starts when it has applied nothing on the node yet.
pub fn secret(target: &Target, payload: &NodePayload, booted: Option<&BootedManifest>) -> Secret {
    let json = serde_json::to_vec(payload).expect("a payload always serializes");
    let binding = serde_json::to_vec(&target.binding).expect("a binding always serializes");
    let mut data = BTreeMap::from([
        (SECRET_KEY.to_owned(), ByteString(json)),
        (NODE_KEY.to_owned(), ByteString(binding)),
    ]);
    if let Some(booted) = booted {
        data.insert(BOOTED_KEY.to_owned(), ByteString(booted.to_bytes()));
    }
    let mut metadata = meta(target);
    metadata.annotations = Some(BTreeMap::from([(
        REVISION_ANNOTATION.to_owned(),
        payload.revision(),
    )]));
    Secret {
        metadata,
        type_: Some("bootstrap.bootplate.dev/node-payload".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The Role that allows reading that one Secret (`get` by name: `list` and `watch` cannot be
/// limited to names, so the agent polls).
pub fn role(target: &Target) -> Role {
    Role {
        metadata: meta(target),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".to_owned()]),
            resource_names: Some(vec![secret_name(target.node())]),
            verbs: vec!["get".to_owned()],
            ..PolicyRule::default()
        }]),
    }
}

/// The RoleBinding that grants [`role`] to the node's identity, `system:node:<node>`.
pub fn role_binding(target: &Target) -> RoleBinding {
    RoleBinding {
        metadata: meta(target),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: secret_name(target.node()),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "User".to_owned(),
            name: format!("system:node:{}", target.node()),
            ..Subject::default()
        }]),
    }
}

/// Applies the Role, the RoleBinding and the payload Secret (see [`secret`]) of the target Node
/// in the workload cluster `client` reaches; returns the payload's revision.
pub async fn publish(
    client: &kube::Client,
    target: &Target,
    payload: &NodePayload,
    booted: Option<&BootedManifest>,
) -> Result<String, kube::Error> {
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    let name = secret_name(target.node());
    let roles: Api<Role> = Api::namespaced(client.clone(), NAMESPACE);
    roles
        .patch(&name, &params, &Patch::Apply(typed(role(target))))
        .await?;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), NAMESPACE);
    bindings
        .patch(&name, &params, &Patch::Apply(typed(role_binding(target))))
        .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    secrets
        .patch(
            &name,
            &params,
            &Patch::Apply(typed(secret(target, payload, booted))),
        )
        .await?;
    Ok(payload.revision())
}

/// Deletes the payload Secrets, Roles and RoleBindings of config `config_uid` (found by their
/// label: a Node name reused by another config's Machine since is left alone). Returns how
/// many objects were deleted.
pub async fn delete_of_config(client: &kube::Client, config_uid: &str) -> kube::Result<usize> {
    let selector = format!("{}={config_uid}", labels::PAYLOAD_CONFIG_UID);
    let params = ListParams::default().labels(&selector);
    let mut deleted = 0;
    // The Secret first: once it is gone nothing is left to read, whatever the RBAC objects.
    deleted += delete_labelled::<Secret>(client, &params).await?;
    deleted += delete_labelled::<RoleBinding>(client, &params).await?;
    deleted += delete_labelled::<Role>(client, &params).await?;
    Ok(deleted)
}

async fn delete_labelled<K>(client: &kube::Client, params: &ListParams) -> kube::Result<usize>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), NAMESPACE);
    let mut deleted = 0;
    for object in api.list_metadata(params).await?.items {
        let Some(name) = object.metadata.name else {
            continue;
        };
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
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

    fn target() -> Target {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "worker-1", "uid": "node-uid-1"},
            "spec": {"providerID": "aws:///eu-west-1a/i-0aaa"},
        }))
        .unwrap();
        Target::new(&node, "config-uid-1")
    }

    #[test]
    fn only_the_nodes_own_identity_may_get_its_secret() {
        let role = role(&target());
        let rule = &role.rules.as_ref().unwrap()[0];
        assert_eq!(rule.verbs, ["get"]);
        assert_eq!(
            rule.resource_names.as_deref(),
            Some(&["bootplate-node-worker-1".to_owned()][..])
        );
        let binding = role_binding(&target());
        let subjects = binding.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "User");
        assert_eq!(subjects[0].name, "system:node:worker-1");
        assert_eq!(binding.role_ref.name, "bootplate-node-worker-1");
    }

    #[test]
    fn every_object_goes_with_its_node_and_its_config() {
        let target = target();
        let payload = NodePayload::default();
        let metas = [
            secret(&target, &payload, None).metadata,
            role(&target).metadata,
            role_binding(&target).metadata,
        ];
        for meta in metas {
            let owners = meta.owner_references.unwrap();
            assert_eq!(owners.len(), 1);
            assert_eq!(
                (owners[0].kind.as_str(), owners[0].api_version.as_str()),
                ("Node", "v1")
            );
            assert_eq!(
                (owners[0].name.as_str(), owners[0].uid.as_str()),
                ("worker-1", "node-uid-1")
            );
            assert_eq!(
                meta.labels.unwrap()[labels::PAYLOAD_CONFIG_UID],
                "config-uid-1"
            );
        }
    }

    #[test]
    fn the_secret_holds_the_payload_its_revision_and_its_node() {
        let payload = NodePayload {
            parts: vec![crd_types::payload::PayloadPart {
                name: "configure".into(),
                commands: vec!["true".into()],
                ..Default::default()
            }],
        };
        let secret = secret(&target(), &payload, None);
        let data = secret.data.unwrap();
        let stored: NodePayload = serde_json::from_slice(&data[SECRET_KEY].0).unwrap();
        assert_eq!(stored, payload);
        let bound = NodeBinding::read("s", Some(&data[NODE_KEY].0)).unwrap();
        assert_eq!(bound, target().binding);
        assert_eq!(
            bound.provider_id.as_deref(),
            Some("aws:///eu-west-1a/i-0aaa")
        );
        assert_eq!(
            secret.metadata.annotations.unwrap()[REVISION_ANNOTATION],
            payload.revision()
        );
        assert_eq!(secret.metadata.namespace.as_deref(), Some("kube-system"));
    }
}
