//! The data Secret: what CAPI's Machine controller and the infrastructure providers read.
//!
//! Name = the config's name, same namespace, type `cluster.x-k8s.io/secret`, keys `value` and
//! `format` (and, for a template with `InPlace` parts, `booted-in-place.json`), label `cluster.x-k8s.io/cluster-name`, controller ownerReference to the config.

use std::collections::BTreeMap;

use crd_types::BootplateConfig;
use crd_types::Role;
use crd_types::capi::{CLUSTER_NAME_LABEL, CLUSTER_SECRET_TYPE};
use crd_types::payload::{BOOTED_KEY, BootedManifest};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
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
    /// The digest of the render's inputs, when it has one (hint annotation).
    pub inputs: Option<&'a str>,
    /// When the bootstrap token in the user-data expires (hint annotation).
    pub token_expires: Option<Timestamp>,
    /// The user-data is a fetch stub (annotation [`labels::DELIVERY`]).
    pub fetch: bool,
}

/// The Secret for `rendered`; with `booted` (the template updates parts in place), that record
/// too, under [`BOOTED_KEY`], for the machine's first in-place update.
pub fn build(
    config: &BootplateConfig,
    rendered: &Rendered,
    booted: Option<&BootedManifest>,
    provenance: &Provenance<'_>,
) -> Secret {
    let mut annotations = BTreeMap::from([
        (labels::TEMPLATE.into(), provenance.template.into()),
        (labels::TEMPLATE_REVISION.into(), provenance.revision.into()),
        (labels::FORMAT.into(), rendered.format.as_str().into()),
        (labels::ROLE.into(), provenance.role.as_str().into()),
    ]);
    if let Some(inputs) = provenance.inputs {
        annotations.insert(labels::INPUTS.into(), inputs.into());
    }
    if let Some(expires) = provenance.token_expires {
        annotations.insert(labels::TOKEN_EXPIRES.into(), expires.to_string());
    }
    if provenance.fetch {
        annotations.insert(labels::DELIVERY.into(), "Fetch".into());
    }
    let mut data = BTreeMap::from([
        ("value".to_owned(), ByteString(rendered.data.clone())),
        (
            "format".to_owned(),
            ByteString(rendered.secret_format().as_bytes().to_vec()),
        ),
    ]);
    if let Some(booted) = booted {
        data.insert(BOOTED_KEY.to_owned(), ByteString(booted.to_bytes()));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(config.name_any()),
            namespace: config.namespace(),
            labels: Some(BTreeMap::from([
                (CLUSTER_NAME_LABEL.into(), provenance.cluster.into()),
                (labels::DATA_SECRET.into(), config.name_any()),
            ])),
            annotations: Some(annotations),
            owner_references: config.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        type_: Some(CLUSTER_SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    }
}

/// What the data Secret `secret` records of the machine's `InPlace` parts at boot; `None` when
/// it records nothing (a template without them, or a render of an earlier bootplate) or not
/// a readable record (warned: the first update then removes nothing the boot wrote).
pub fn booted_of(secret: &Secret) -> Option<BootedManifest> {
    let bytes = secret.data.as_ref()?.get(BOOTED_KEY)?;
    BootedManifest::from_bytes(&bytes.0)
        .inspect_err(|e| {
            tracing::warn!(secret = %secret.name_any(), error = %e, "key {BOOTED_KEY} is not a record of the boot")
        })
        .ok()
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

/// The annotations that say what the Secret holds, without the hints ([`labels::HINTS`]).
fn compared_annotations(secret: &Secret) -> impl Iterator<Item = (&String, &String)> {
    secret
        .annotations()
        .iter()
        .filter(|(k, _)| !labels::HINTS.contains(&k.as_str()))
}

/// Whether `existing` already holds exactly what `desired` would write, hints aside: an
/// outdated hint alone is not worth a write.
pub fn is_current(existing: &Secret, desired: &Secret) -> bool {
    let labels_match = desired
        .labels()
        .iter()
        .all(|(k, v)| existing.labels().get(k) == Some(v));
    let annotations_match =
        compared_annotations(desired).all(|(k, v)| existing.annotations().get(k) == Some(v));
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
    let annotations: Vec<_> = compared_annotations(desired).collect();
    let json = serde_json::to_vec(&(
        &desired.metadata.labels,
        annotations,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crd_types::{BootplateConfigSpec, OutputFormat};
    use k8s_openapi::jiff::SignedDuration;

    fn config() -> BootplateConfig {
        let mut config = BootplateConfig::new("w-0", BootplateConfigSpec::default());
        config.metadata.namespace = Some("default".into());
        config.metadata.uid = Some("0f8fad5b-d9cb-469f-a165-70867728950e".into());
        config
    }

    fn secret(data: &str, inputs: Option<&str>, token_expires: Option<Timestamp>) -> Secret {
        built(data, inputs, token_expires, None)
    }

    /// The data Secret of a worker's render `data`, with those hints and that record of the boot.
    fn built(
        data: &str,
        inputs: Option<&str>,
        token_expires: Option<Timestamp>,
        booted: Option<&BootedManifest>,
    ) -> Secret {
        let rendered = Rendered {
            data: data.as_bytes().to_vec(),
            format: OutputFormat::CloudConfig,
            payload: None,
        };
        let provenance = Provenance {
            cluster: "c1",
            template: "ClusterBootstrapTemplate/ubuntu",
            revision: "abc",
            role: Role::Worker,
            inputs,
            token_expires,
            fetch: false,
        };
        build(&config(), &rendered, booted, &provenance)
    }

    #[test]
    fn the_record_of_the_boot_is_written_beside_the_user_data_and_read_back() {
        let booted = BootedManifest {
            files: [("/etc/mirror.toml".to_owned(), "configure".to_owned())].into(),
            units: ["mirror.service".to_owned()].into(),
        };
        let without = built("#cloud-config\n", None, None, None);
        assert_eq!(booted_of(&without), None);
        let with = built("#cloud-config\n", None, None, Some(&booted));
        assert_eq!(booted_of(&with), Some(booted));
        assert!(
            !is_current(&without, &with),
            "a record added is worth a write"
        );
        let mut garbled = with.clone();
        garbled
            .data
            .as_mut()
            .unwrap()
            .insert(BOOTED_KEY.into(), ByteString(b"{".to_vec()));
        assert_eq!(booted_of(&garbled), None);
    }

    #[test]
    fn hints_are_written_but_not_compared() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let written = secret("#cloud-config\n", Some("d1"), Some(now));
        let annotations = written.annotations();
        assert_eq!(annotations[labels::INPUTS], "d1");
        assert_eq!(annotations[labels::TOKEN_EXPIRES], "2027-01-15T08:00:00Z");

        // Newer hints alone are not worth a write...
        let refreshed = secret(
            "#cloud-config\n",
            Some("d2"),
            Some(now + SignedDuration::from_mins(10)),
        );
        assert!(is_current(&written, &refreshed));
        assert_eq!(digest(&written), digest(&refreshed));
        // ...other content is.
        let changed = secret("#cloud-config\nruncmd: []\n", Some("d1"), Some(now));
        assert!(!is_current(&written, &changed));
        assert_ne!(digest(&written), digest(&changed));
        let mut retemplated = written.clone();
        retemplated
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(labels::TEMPLATE_REVISION.into(), "def".into());
        assert!(!is_current(&written, &retemplated));
    }
}
