//! The node payload of a joined machine: rendered from the config's `update: InPlace` parts and
//! published in the workload cluster for each spec Cluster API updates it to in place (not
//! before: until then the node runs what its user-data wrote, which the data Secret records and
//! the payload Secret hands to the agent); while Cluster API's update runs, what
//! bootplate-agent reports on the Node goes into the config's status. Configs whose template has no `InPlace` part skip all of
//! it (no request).

use crd_types::capi::{Cluster, Machine};
use crd_types::payload::NodePayload;
use crd_types::{BootplateConfig, InPlaceStatus, Role};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use render::generator::Generated;
use render::{JoinInfo, RenderContext};
use tracing::{debug, info};

use super::context::Context;
use crate::core::inplace::{self, NodeReport};
use crate::core::outcome::Note;
use crate::core::status::Desired;
use crate::core::token::Token;
use crate::error::{Error, Result};
use crate::k8s::templates::{self, ResolvedTemplate};
use crate::k8s::{certs, data_secret, files, node_payload};

/// What the in-place step found: the state to record, the condition to set, and whether to
/// look again soon (Cluster API's update is under way).
pub(crate) struct InPlace {
    pub status: InPlaceStatus,
    pub condition: Option<Desired<'static>>,
    pub updating: bool,
    /// The Event and metric result of a step of the update.
    pub step: Option<(Note, &'static str)>,
}

/// The in-place step of `config`, whose `machine` of `cluster` joined with `role`; `None` when
/// its template has no `InPlace` part and no payload was ever published.
pub(crate) async fn sync(
    ctx: &Context,
    config: &BootplateConfig,
    machine: &Machine,
    cluster: &Cluster,
    role: Role,
) -> Result<Option<InPlace>> {
    let previous = config.status.clone().unwrap_or_default();
    let template = match templates::resolve(&ctx.stores, &ctx.compiled, config) {
        Ok(t) if t.compiled.updates_in_place() => t,
        // Nothing to publish; a payload published before stays as it is.
        other => {
            debug!(template = ?other.as_ref().map(|t| &t.display), "no in-place step");
            return Ok(None);
        }
    };
    let Some(node) = machine.status.as_ref().and_then(|s| s.node_ref.as_ref()) else {
        return Ok(None);
    };
    let node = node.name.clone();
    let updating = inplace::in_progress(&config.metadata);
    let generation = config.metadata.generation;
    debug!(%node, updating, ?generation, previous = ?previous.in_place, "in-place step");
    let mut status = previous.in_place.clone().unwrap_or_default();
    status.node = Some(node.clone());
    let namespace = config.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let workload = || async {
        ctx.workload_client(&namespace, &cluster_name)
            .await
            .map_err(|e| super::render::naming_workload(e, &namespace, &cluster_name))
    };
    if inplace::publish_needed(previous.in_place.as_ref(), generation, updating) {
        let payload = payload(ctx, config, machine, cluster, role, &template).await?;
        let client = workload().await?;
        let target = target(&client, config, &node).await?;
        let booted = (data_secret::get(&ctx.client, config).await?)
            .as_ref()
            .and_then(data_secret::booted_of);
        let revision = node_payload::publish(&client, &target, &payload, booted.as_ref())
            .await
            .map_err(|e| workload_error(&node, e))?;
        info!(%node, %revision, "node payload published");
        status.published_revision = Some(revision);
        status.observed_generation = generation;
    }
    let mut in_place = InPlace {
        status,
        condition: None,
        updating,
        step: None,
    };
    if inplace::observe_node(&previous, updating) {
        let nodes: Api<Node> = Api::all(workload().await?);
        let found = nodes
            .get_opt(&node)
            .await
            .map_err(|e| workload_error(&node, e))?;
        let report = found
            .as_ref()
            .map(NodeReport::from_node)
            .unwrap_or_default();
        let published = in_place
            .status
            .published_revision
            .clone()
            .unwrap_or_default();
        let progress = inplace::progress(&published, &report);
        let condition = inplace::condition(updating, &node, &published, &progress);
        in_place.step = inplace::transition(&previous, &condition);
        in_place.status.applied_revision = report.applied;
        in_place.condition = Some(condition);
    }
    Ok(Some(in_place))
}

/// Where the payload goes: the Node `node` as the workload cluster has it now, whose UID and
/// provider ID the payload is bound to.
async fn target(
    client: &kube::Client,
    config: &BootplateConfig,
    node: &str,
) -> Result<node_payload::Target> {
    let nodes: Api<Node> = Api::all(client.clone());
    let found = nodes
        .get_opt(node)
        .await
        .map_err(|e| workload_error(node, e))?
        .ok_or_else(|| {
            Error::waiting(
                crd_types::conditions::reason::WAITING_FOR_NODE,
                format!(
                    "Node {node} (the Machine's status.nodeRef) is not in the workload cluster; its in-place payload is published once it is"
                ),
            )
        })?;
    Ok(node_payload::Target::new(
        &found,
        &config.uid().unwrap_or_default(),
    ))
}

fn workload_error(node: &str, e: kube::Error) -> Error {
    Error::failed(
        crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
        format!("cannot publish or read the payload of node {node}: {e}"),
    )
}

/// The payload of the machine: its `InPlace` parts rendered with what its user-data was
/// rendered with, except the bootstrap token (long used and deleted: a stand-in takes its place)
/// and generators' content (not called again for a payload).
async fn payload(
    ctx: &Context,
    config: &BootplateConfig,
    machine: &Machine,
    cluster: &Cluster,
    role: Role,
    template: &ResolvedTemplate,
) -> Result<NodePayload> {
    let certs = if role.is_control_plane() {
        Some(certs::control_plane(&ctx.client, cluster, false).await?)
    } else {
        None
    };
    let ca_hash = match &certs {
        Some(c) => crate::pki::ca_cert_hash(&c.ca.cert).unwrap_or_default(),
        None => {
            certs::ca_cert(&ctx.client, &ctx.stores, &ctx.ca_hashes, cluster)
                .await?
                .hash
        }
    };
    let endpoint = render::ClusterInfo::from_cluster(cluster).control_plane_endpoint;
    let join = JoinInfo {
        token: Token::placeholder().expose(),
        api_server_endpoint: endpoint.address(),
        ca_cert_hashes: vec![ca_hash],
    };
    let spec = files::resolve(&ctx.client, config).await?;
    let context = RenderContext::new(cluster, machine, role, Some(join), certs);
    let parts = template
        .compiled
        .render_parts(&spec, &context, &Generated::new())
        .map_err(|e| Error::failed(e.reason(), e.to_string()))?;
    Ok(parts.map(|p| p.payload()).unwrap_or_default())
}
