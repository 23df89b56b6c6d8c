//! Whether a payload Secret is for this very Node. Node names are reused (clouds name nodes
//! after their private addresses), and the Role that lets `system:node:<name>` read the Secret
//! grants by name: a payload left behind by a deleted Node of the same name would otherwise be
//! applied here, as root. bootplate records the Node it published for (name, UID, provider ID)
//! in the Secret's `node.json`; the agent applies a payload only when its own Node matches.

use crd_types::payload::{NODE_KEY, NodeBinding, NotThisNode, ThisNode};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::{Api, ResourceExt};

/// Reads this agent's Node `node_name` and compares it with the binding in `secret`. The outer
/// error is a failed read of the Node; the inner one says why the payload is not for it.
pub async fn for_this_node(
    client: &kube::Client,
    node_name: &str,
    secret: &Secret,
) -> anyhow::Result<Result<(), NotThisNode>> {
    let stored = (secret.data.as_ref())
        .and_then(|d| d.get(NODE_KEY))
        .map(|b| b.0.as_slice());
    let binding = match NodeBinding::read(&secret.name_any(), stored) {
        Ok(binding) => binding,
        Err(refused) => return Ok(Err(refused)),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(node_name).await?;
    let uid = node.uid().unwrap_or_default();
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    Ok(binding.check(ThisNode {
        name: node_name,
        uid: &uid,
        provider_id,
    }))
}
