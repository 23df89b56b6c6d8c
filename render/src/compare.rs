//! The one comparison of two revisions of a machine's bootstrap data: a template and the config
//! spec rendered with it, before and after a change, both rendered for the same machine. Cluster
//! API's in-place hooks, the admission webhook's check of a written config and `bootplate diff`
//! all call [`compare`], so the verdict a pipeline previews is the one the cluster reaches.
//!
//! No generator is called: a generated part counts as changed when the request it would send
//! changes ([`CompiledTemplate::comparison_stand_ins`]).

use crd_types::capi::{Cluster, Machine};
use crd_types::{BootplateConfigSpec, Role};

use crate::error::RenderError;
use crate::inplace::{PartsRender, UpdatePlan};
use crate::{CompiledTemplate, JoinInfo, RenderContext, SAMPLE_CA_HASH, SAMPLE_TOKEN};

/// One side of a comparison: a compiled template and the config spec rendered with it.
#[derive(Clone, Copy)]
pub struct Revision<'a> {
    /// The template the config's `templateRef` names at this revision.
    pub template: &'a CompiledTemplate,
    /// The config's spec, with stand-ins for what is not read (Secrets' contents).
    pub config: &'a BootplateConfigSpec,
}

/// What one side rendered to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renders {
    /// A template with parts: the render split by part.
    Parts(PartsRender),
    /// A raw `spec.template` without parts: the whole output, which changes as one.
    Whole(Vec<u8>),
}

/// Both renders of a comparison and how a booted machine gets from the old to the new.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub old: Renders,
    pub new: Renders,
    pub plan: UpdatePlan,
}

/// Why two revisions could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The old revision does not render (any more).
    #[error("the old revision does not render: {0}")]
    Old(RenderError),
    /// The new revision does not render.
    #[error("the new revision does not render: {0}")]
    New(RenderError),
}

/// How a machine described by `ctx`, booted from `old`, gets to `new`. Both renders get the same
/// stand-ins for generated parts, so only what the change moves shows. A raw `spec.template`
/// without parts has nothing to apply in place: any difference in its output rolls out.
pub fn compare(
    old: Revision<'_>,
    new: Revision<'_>,
    ctx: &RenderContext,
) -> Result<Comparison, CompareError> {
    let old_parts = split(old, ctx).map_err(CompareError::Old)?;
    let new_parts = split(new, ctx).map_err(CompareError::New)?;
    if let (Some(old), Some(new)) = (&old_parts, &new_parts) {
        return Ok(Comparison {
            plan: new.update_from(old),
            old: Renders::Parts(old.clone()),
            new: Renders::Parts(new.clone()),
        });
    }
    let whole = |side: Revision<'_>| side.template.render(side.config, ctx).map(|r| r.data);
    let old = whole(old).map_err(CompareError::Old)?;
    let new = whole(new).map_err(CompareError::New)?;
    let plan = if old == new {
        UpdatePlan::Unchanged
    } else {
        UpdatePlan::Rollout {
            reason: "a raw spec.template has no parts, so every change to its output needs a new machine".to_owned(),
        }
    };
    Ok(Comparison {
        old: Renders::Whole(old),
        new: Renders::Whole(new),
        plan,
    })
}

fn split(side: Revision<'_>, ctx: &RenderContext) -> Result<Option<PartsRender>, RenderError> {
    let generated = side.template.comparison_stand_ins(side.config, ctx);
    side.template.render_parts(side.config, ctx, &generated)
}

/// The context a comparison renders `machine` of `cluster` with: the machine and cluster as they
/// are, and stand-ins for what is the same before and after a change (the sample token and CA
/// hash, sample certificates for control-plane roles), so a real credential never enters it.
pub fn comparison_context(cluster: &Cluster, machine: &Machine, role: Role) -> RenderContext {
    let endpoint = crate::ClusterInfo::from_cluster(cluster).control_plane_endpoint;
    let join = JoinInfo {
        token: SAMPLE_TOKEN.into(),
        api_server_endpoint: endpoint.address(),
        ca_cert_hashes: vec![SAMPLE_CA_HASH.into()],
    };
    let certs = Some(crate::sample_certificates());
    RenderContext::new(cluster, machine, role, Some(join), certs)
}
