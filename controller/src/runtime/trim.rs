//! What the watch caches keep of each object: what reconciles and triggers read, nothing more.
//!
//! The caches hold every config, Machine and labelled Secret for as long as the process runs;
//! at 20 000 configs they are the larger part of its memory. Each trim here names the readers
//! of what it keeps; a field that gains a reader must be kept here too, or it reads as absent.

use crd_types::capi::Machine;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;

use crate::core::cached_secret::CachedSecret;
use crate::labels;

/// Drops what the controller never reads from any cached object: its managedFields (often the
/// larger part of an object) and kubectl's last-applied-configuration copy of it.
pub(crate) fn strip<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// What the cache keeps of a watched Secret's metadata: its name and namespace (the cache's
/// key), its resourceVersion (`Stores::secret_version`: cached CA hashes, workload clients and
/// data Secret comparisons are good while it holds), and as plain fields the UID of the
/// BootplateConfig its controller ownerReference names (`gate::adoptable`), the data
/// Secret label (the trigger filter and `gate::adoptable`), the role and template revision a
/// Secret to adopt was rendered with (`gate::adoptable`) and the hints a restarted process skips
/// a render by (`skip::LastRender::from_hints`), and whether its machine fetches its render (the
/// join's clean-up). Its UID, timestamps, finalizers, its other labels (the cluster-name label
/// it was selected by) and annotations (the template's name, the format) are read by nobody.
pub(crate) fn secret(secret: PartialObjectMeta<Secret>) -> CachedSecret {
    let old = secret.metadata;
    let mut labels = old.labels.unwrap_or_default();
    let mut annotations = old.annotations.unwrap_or_default();
    let mut annotation = |key: &str| annotations.remove(key);
    CachedSecret {
        metadata: ObjectMeta {
            name: old.name,
            namespace: old.namespace,
            resource_version: old.resource_version,
            ..Default::default()
        },
        controlled_by: (old.owner_references.into_iter().flatten())
            .find(|r| {
                r.kind == "BootplateConfig"
                    && r.api_version.split('/').next() == Some(crd_types::GROUP)
                    && r.controller == Some(true)
            })
            .map(|r| r.uid),
        data_secret_of: labels.remove(labels::DATA_SECRET),
        role: annotation(labels::ROLE),
        template_revision: annotation(labels::TEMPLATE_REVISION),
        inputs: annotation(labels::INPUTS),
        token_expires: annotation(labels::TOKEN_EXPIRES),
        fetches: annotation(labels::DELIVERY).is_some_and(|d| d == "Fetch"),
    }
}

/// `event` with its object, if any, passed through `convert`: a watch of one type that fills
/// a store of another.
pub(crate) fn map_event<A, B>(event: Event<A>, convert: impl FnOnce(A) -> B) -> Event<B> {
    match event {
        Event::Apply(object) => Event::Apply(convert(object)),
        Event::Delete(object) => Event::Delete(convert(object)),
        Event::Init => Event::Init,
        Event::InitApply(object) => Event::InitApply(convert(object)),
        Event::InitDone => Event::InitDone,
    }
}

/// Keeps of a Machine what reconciles read: its name and namespace, its UID (the init lock
/// names its holder by it: a Machine created again under a deleted holder's name is another
/// machine), its labels (templates see them; the control-plane label sets the role), its
/// resourceVersion, spec and status. Its annotations, ownerReferences, finalizers and
/// timestamps are read by nobody (a Machine is found by name, from its config's ownerReference
/// or the init lock's holder).
pub(crate) fn machine(machine: &mut Machine) {
    let meta = &mut machine.metadata;
    let old = std::mem::take(meta);
    meta.name = old.name;
    meta.namespace = old.namespace;
    meta.uid = old.uid;
    meta.resource_version = old.resource_version;
    meta.labels = old.labels.filter(|l| !l.is_empty());
    // Of the conditions, only the one the boot report's `BootNotStarted` reads.
    if let Some(status) = machine.status.as_mut() {
        (status.conditions).retain(|c| c.type_ == crd_types::capi::INFRASTRUCTURE_READY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
    use std::collections::BTreeMap;

    fn owner(api_version: &str, kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "w-0".into(),
            uid: "0f8fad5b".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn map(entries: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn full_meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("w-0".into()),
            namespace: Some("ns".into()),
            resource_version: Some("42".into()),
            uid: Some("7c9e6679".into()),
            generation: Some(1),
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            finalizers: Some(vec!["machine.cluster.x-k8s.io".into()]),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            ..Default::default()
        }
    }

    /// What every trim keeps of [`full_meta`] (renamed `name`), with `labels`.
    fn kept(name: &str, labels: Option<BTreeMap<String, String>>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some("42".into()),
            labels,
            ..Default::default()
        }
    }

    #[test]
    fn a_data_secret_keeps_what_adoption_the_hints_and_the_triggers_read() {
        let group_version = format!("{}/v1alpha1", crd_types::GROUP);
        let secret = PartialObjectMeta::<Secret> {
            metadata: ObjectMeta {
                labels: map(&[
                    ("cluster.x-k8s.io/cluster-name", "c1"),
                    (labels::DATA_SECRET, "w-0"),
                ]),
                annotations: map(&[
                    (labels::TEMPLATE, "ClusterBootstrapTemplate/kubeadm"),
                    (labels::TEMPLATE_REVISION, "r1"),
                    (labels::FORMAT, "cloud-config"),
                    (labels::ROLE, "worker"),
                    (labels::INPUTS, "d1"),
                    (labels::TOKEN_EXPIRES, "2027-01-15T08:00:00Z"),
                    (labels::DELIVERY, "Fetch"),
                ]),
                owner_references: Some(vec![
                    owner(&group_version, "BootplateConfig"),
                    owner("cluster.x-k8s.io/v1beta2", "Machine"),
                ]),
                ..full_meta()
            },
            ..Default::default()
        };
        let cached = super::secret(secret);
        assert_eq!(
            cached,
            CachedSecret {
                metadata: kept("w-0", None),
                controlled_by: Some("0f8fad5b".into()),
                data_secret_of: Some("w-0".into()),
                role: Some("worker".into()),
                template_revision: Some("r1".into()),
                inputs: Some("d1".into()),
                token_expires: Some("2027-01-15T08:00:00Z".into()),
                fetches: true,
            },
            "the rest (UID, timestamps, finalizers, other labels and annotations, other owners) is dropped"
        );
        assert!(cached.is_data_secret());
        assert_eq!(cached.controller_uid(), Some("0f8fad5b"));
    }

    #[test]
    fn a_certificate_secret_keeps_its_name_and_version_only() {
        let secret = PartialObjectMeta::<Secret> {
            metadata: ObjectMeta {
                name: Some("c1-ca".into()),
                labels: map(&[("cluster.x-k8s.io/cluster-name", "c1")]),
                annotations: map(&[("note", "x")]),
                owner_references: Some(vec![owner(
                    "controlplane.cluster.x-k8s.io/v1beta2",
                    "KubeadmControlPlane",
                )]),
                ..full_meta()
            },
            ..Default::default()
        };
        let cached = super::secret(secret);
        assert_eq!(
            cached,
            CachedSecret {
                metadata: kept("c1-ca", None),
                ..Default::default()
            }
        );
        assert!(!cached.is_data_secret());
        assert_eq!(cached.controller_uid(), None);
    }

    #[test]
    fn a_machine_keeps_its_name_labels_spec_and_status() {
        let mut machine = crd_types::capi::Machine::new("w-0", Default::default());
        machine.spec.cluster_name = "c1".into();
        machine.spec.version = Some("v1.31.2".into());
        machine.status = Some(crd_types::capi::MachineStatus {
            node_ref: Some(crd_types::capi::NodeReference { name: "n0".into() }),
            ..Default::default()
        });
        machine.metadata = ObjectMeta {
            labels: map(&[("cluster.x-k8s.io/control-plane", ""), ("team", "a")]),
            annotations: map(&[(
                "controlplane.cluster.x-k8s.io/kubeadm-cluster-configuration",
                "{}",
            )]),
            owner_references: Some(vec![owner("cluster.x-k8s.io/v1beta2", "MachineSet")]),
            ..full_meta()
        };
        let (spec, status) = (machine.spec.clone(), machine.status.clone());
        super::machine(&mut machine);
        let labels = map(&[("cluster.x-k8s.io/control-plane", ""), ("team", "a")]);
        let uid = Some("7c9e6679".to_owned());
        assert_eq!(
            machine.metadata,
            ObjectMeta {
                uid,
                ..kept("w-0", labels)
            }
        );
        assert!(machine.is_control_plane());
        assert_eq!((machine.spec, machine.status), (spec, status));
    }

    #[test]
    fn strip_drops_managed_fields_and_the_last_applied_copy_only() {
        let mut machine = crd_types::capi::Machine::new("w-0", Default::default());
        machine.metadata = ObjectMeta {
            annotations: map(&[
                ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
                ("keep", "me"),
            ]),
            ..full_meta()
        };
        strip(&mut machine);
        assert_eq!(machine.metadata.managed_fields, None);
        assert_eq!(machine.metadata.annotations, map(&[("keep", "me")]));
        assert_eq!(machine.metadata.uid.as_deref(), Some("7c9e6679"));
    }
}
