//! The data Secret: what CAPI's Machine controller and the infrastructure providers read.
//!
//! Name = the config's name, same namespace, type `cluster.x-k8s.io/secret`, keys `value` and
//! `format`, label `cluster.x-k8s.io/cluster-name`, controller ownerReference to the config.

use std::collections::BTreeMap;

use crd_types::BootplateConfig;
use crd_types::Role;
use crd_types::capi::{CLUSTER_NAME_LABEL, CLUSTER_SECRET_TYPE};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use render::Rendered;

use crate::error::{Result, is_not_found};
use crate::labels;

/// Where a rendered Secret came from.
pub struct Provenance<'a> {
    /// The cluster's name.
    pub cluster: &'a str,
    /// `<Kind>/<name>` of the template.
    pub template: &'a str,
    /// The template revision.
    pub revision: &'a str,
    /// The role rendered.
    pub role: Role,
}

/// The Secret for `rendered`.
pub fn build(config: &BootplateConfig, rendered: &Rendered, provenance: &Provenance<'_>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(config.name_any()),
            namespace: config.namespace(),
            labels: Some(BTreeMap::from([
                (CLUSTER_NAME_LABEL.into(), provenance.cluster.into()),
                (labels::DATA_SECRET.into(), config.name_any()),
            ])),
            annotations: Some(BTreeMap::from([
                (labels::TEMPLATE.into(), provenance.template.into()),
                (labels::TEMPLATE_REVISION.into(), provenance.revision.into()),
                (labels::FORMAT.into(), rendered.format.as_str().into()),
                (labels::ROLE.into(), provenance.role.as_str().into()),
            ])),
            owner_references: config.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        type_: Some(CLUSTER_SECRET_TYPE.into()),
        data: Some(BTreeMap::from([
            ("value".to_owned(), ByteString(rendered.data.clone())),
            (
                "format".to_owned(),
                ByteString(rendered.secret_format().as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    }
}

/// The current data Secret of `config`, if any.
pub async fn get(client: &Client, config: &BootplateConfig) -> Result<Option<Secret>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &config.namespace().unwrap_or_default());
    match api.get(&config.name_any()).await {
        Ok(secret) => Ok(Some(secret)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether `existing` already holds exactly what `desired` would write.
pub fn is_current(existing: &Secret, desired: &Secret) -> bool {
    let labels_match = desired
        .labels()
        .iter()
        .all(|(k, v)| existing.labels().get(k) == Some(v));
    let annotations_match = desired
        .annotations()
        .iter()
        .all(|(k, v)| existing.annotations().get(k) == Some(v));
    let owned = existing.owner_references().iter().any(|r| {
        desired
            .owner_references()
            .first()
            .is_some_and(|d| d.uid == r.uid && r.controller == Some(true))
    });
    existing.type_ == desired.type_
        && existing.data == desired.data
        && labels_match
        && annotations_match
        && owned
}

/// A digest of everything [`is_current`] compares, to remember what was written.
pub fn digest(desired: &Secret) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(&(
        &desired.metadata.labels,
        &desired.metadata.annotations,
        desired.owner_references().first().map(|r| &r.uid),
        &desired.type_,
        &desired.data,
    ))
    .expect("a Secret always serializes");
    hex::encode(sha2::Sha256::digest(json))
}

/// Writes `desired` with server-side apply (one request whether it exists or not); returns the
/// resourceVersion written.
pub async fn write(client: &Client, desired: &Secret) -> Result<Option<String>> {
    let api: Api<Secret> =
        Api::namespaced(client.clone(), &desired.namespace().unwrap_or_default());
    let mut body = desired.clone();
    body.metadata.managed_fields = None;
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": body.metadata,
        "type": body.type_,
        "data": body.data,
    });
    let written = api
        .patch(
            &desired.name_any(),
            &PatchParams::apply(labels::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(written.resource_version())
}
