//! Conditions and status writes (server-side apply on the status subresource, skipped when
//! nothing changed so a steady-state reconcile writes nothing).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Result;
use crate::labels;

/// A condition to set: type, status, reason, message.
pub struct Desired<'a> {
    /// Condition type.
    pub type_: &'a str,
    /// True or false.
    pub status: bool,
    /// Reason (CamelCase).
    pub reason: &'a str,
    /// Message for people (never empty: CAPI's schemas reject an empty message on apply).
    pub message: String,
}

/// The conditions `desired` describes, keeping the transition time of each condition whose
/// status did not change.
pub fn conditions(
    previous: &[Condition],
    desired: Vec<Desired<'_>>,
    generation: Option<i64>,
) -> Vec<Condition> {
    let now = Time(
        Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .unwrap_or(Timestamp::now()),
    );
    desired
        .into_iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let last_transition_time = previous
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: d.type_.to_owned(),
                status: status.to_owned(),
                reason: d.reason.to_owned(),
                message: if d.message.is_empty() {
                    d.reason.to_owned()
                } else {
                    d.message
                },
                last_transition_time,
                observed_generation: generation,
            }
        })
        .collect()
}

/// Applies `status` to `object` unless it already has it. Returns whether it wrote.
pub async fn apply<K, S>(api: &Api<K>, object: &K, current: Option<&S>, status: &S) -> Result<bool>
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
