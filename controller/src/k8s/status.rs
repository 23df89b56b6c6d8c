//! Status writes (server-side apply on the status subresource, skipped when
//! nothing changed so a steady-state reconcile writes nothing).

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Result;
use crate::labels;

/// Applies `status` to `object` unless it already has it. Returns whether it wrote.
pub(crate) async fn apply<K, S>(
    api: &Api<K>,
    object: &K,
    current: Option<&S>,
    status: &S,
) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(false);
    }
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let name = object.meta().name.clone().unwrap_or_default();
    api.patch_status(
        &name,
        &PatchParams::apply(labels::FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(true)
}
