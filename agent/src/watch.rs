//! The agent's loop: read the node's payload Secret, apply it, report on the Node, again at
//! every interval (which is also how drift is put back). The only Kubernetes calls: get one
//! Secret, get and patch its own Node. The agent never needs the bootstrap token.

use std::time::{Duration, SystemTime};

use crd_types::payload::{
    APPLIED_ANNOTATION, BOOTED_KEY, BootedManifest, CONDITION_TYPE, NAMESPACE, NodePayload,
    SECRET_KEY, secret_name,
};
use k8s_openapi::api::core::v1::{Node as KubeNode, Secret};
use kube::api::{Api, Patch, PatchParams};

use crate::apply::{ApplyError, Node};
use crate::identity::Identity;

/// One node's agent.
pub struct Agent {
    /// The node's identity (`system:node:<name>`): its kubeconfig, read again before each pass
    /// so a rotated client certificate is used.
    pub identity: Identity,
    /// The Node's name.
    pub node_name: String,
    /// Where and how to apply.
    pub node: Node,
}

/// What a pass found.
#[derive(Debug, PartialEq, Eq)]
pub enum Pass {
    /// No payload Secret for this node (yet), or not readable (its Role comes with it):
    /// nothing to apply.
    NoPayload,
    /// The payload revision is applied.
    Applied(String),
    /// A step failed (the message names the part and the step).
    Failed(String),
}

impl Agent {
    /// Runs passes every `interval` until the process ends. A pass that cannot reach the API
    /// server is logged and tried again at the next interval.
    pub async fn run(&self, interval: Duration) {
        loop {
            match self.pass().await {
                Ok(pass) => tracing::info!(node = %self.node_name, ?pass, "pass done"),
                Err(e) => tracing::warn!(node = %self.node_name, error = %e, "pass failed"),
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// One pass: read, apply, report.
    pub async fn pass(&self) -> anyhow::Result<Pass> {
        let client = self.identity.client().await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
        let name = secret_name(&self.node_name);
        // Until bootplate publishes the node's payload, the Role that lets the node read it does
        // not exist either: forbidden means "not published yet" as much as not found does.
        let secret = match secrets.get(&name).await {
            Ok(secret) => secret,
            Err(kube::Error::Api(status)) if matches!(status.code, 403 | 404) => {
                return Ok(Pass::NoPayload);
            }
            Err(e) => return Err(e.into()),
        };
        // A payload published for an earlier Node of this name is not this Node's to apply.
        if let Err(refused) =
            crate::binding::for_this_node(&client, &self.node_name, &secret).await?
        {
            let pass = Pass::Failed(refused.to_string());
            self.report(client, &pass).await?;
            return Ok(pass);
        }
        let pass = match read_payload(&name, &secret) {
            Err(message) => Pass::Failed(message),
            Ok((payload, booted)) => {
                let node = self.node.clone();
                let revision = payload.revision();
                let apply =
                    move || node.apply_after_boot_at(&payload, booted.as_ref(), SystemTime::now());
                match tokio::task::spawn_blocking(apply).await? {
                    Ok(applied) => {
                        if !applied.written.is_empty() || !applied.removed.is_empty() {
                            tracing::info!(
                                written = ?applied.written,
                                removed = ?applied.removed,
                                restarted = ?applied.restarted,
                                "applied"
                            );
                        }
                        Pass::Applied(applied.revision)
                    }
                    Err(e) => Pass::Failed(failure(&revision, &e)),
                }
            }
        };
        self.report(client, &pass).await?;
        Ok(pass)
    }

    /// The annotation (on success) and the condition on the Node, patched only when they change.
    async fn report(&self, client: kube::Client, pass: &Pass) -> anyhow::Result<()> {
        let nodes: Api<KubeNode> = Api::all(client);
        let (status, reason, message) = match pass {
            Pass::NoPayload => return Ok(()),
            Pass::Applied(revision) => ("True", "Applied", format!("revision {revision} applied")),
            Pass::Failed(message) => ("False", "ApplyFailed", message.clone()),
        };
        let current = nodes.get(&self.node_name).await?;
        if let Pass::Applied(revision) = pass {
            let annotated = (current.metadata.annotations.as_ref())
                .and_then(|a| a.get(APPLIED_ANNOTATION))
                == Some(revision);
            if !annotated {
                let patch = serde_json::json!({
                    "metadata": { "annotations": { APPLIED_ANNOTATION: revision } }
                });
                nodes
                    .patch(
                        &self.node_name,
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
            }
        }
        let existing = (current.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_TYPE));
        let same =
            existing.is_some_and(|c| c.status == status && c.message.as_deref() == Some(&message));
        if !same {
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            );
            let patch = serde_json::json!({ "status": { "conditions": [{
                "type": CONDITION_TYPE,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }]}});
            nodes
                .patch_status(
                    &self.node_name,
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await?;
        }
        Ok(())
    }
}

/// The condition message of a failed revision.
pub fn failure(revision: &str, e: &ApplyError) -> String {
    format!("revision {revision} failed: {e}")
}

/// The payload in Secret `name`, and what the node booted with when the Secret records it (the
/// first payload of a machine does).
fn read_payload(
    name: &str,
    secret: &Secret,
) -> Result<(NodePayload, Option<BootedManifest>), String> {
    let key = |key: &str| secret.data.as_ref().and_then(|d| d.get(key));
    let bytes = key(SECRET_KEY).map(|b| b.0.as_slice()).unwrap_or_default();
    let payload = serde_json::from_slice::<NodePayload>(bytes).map_err(|e| {
        format!("Secret {NAMESPACE}/{name}: key {SECRET_KEY} is not a payload: {e}")
    })?;
    let booted = match key(BOOTED_KEY) {
        None => None,
        Some(bytes) => Some(BootedManifest::from_bytes(&bytes.0).map_err(|e| {
            format!("Secret {NAMESPACE}/{name}: key {BOOTED_KEY} is not a record of the boot: {e}")
        })?),
    };
    Ok((payload, booted))
}
