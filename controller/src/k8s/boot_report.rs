//! Boot reports in the workload cluster (docs/boot-channel.md): the ConfigMap a machine writes
//! its report into, `kube-system/bootplate-boot-<config UID>`, and the Role and RoleBinding
//! that let the machine's bootstrap token, and only it, write that one ConfigMap.
//!
//! RBAC enforces it: the Role grants `get` and `patch` on that name only
//! (`resourceNames`), bound to the token's user `system:bootstrap:<token ID>`. Any other
//! token is refused by the apiserver (403). The ConfigMap is created by bootplate (a
//! `create` cannot be limited by name), so the machine never needs more.
//!
//! The three objects carry an ownerReference to the token's Secret: the workload cluster's
//! garbage collector deletes them with the token (also when its token cleaner removes an
//! expired one), and bootplate deletes them by the config's label when it deletes the token.
//!
//! Reads are coalesced: one listing per workload cluster per interval, shared by all its
//! configs ([`Reports`]), and only while some config of that cluster waits for its machine.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};

use crate::core::boot::{MAX_ENCODED, REPORT_KEY};
use crate::core::token::NAMESPACE;
use crate::error::{Error, Result, is_not_found};
use crate::labels;

/// The name of the report objects of config `config_uid`.
pub(crate) fn name(config_uid: &str) -> String {
    format!("bootplate-boot-{config_uid}")
}

/// Who the objects are for: the config and its token.
pub(crate) struct Target<'a> {
    pub config_uid: &'a str,
    pub token_id: &'a str,
    /// The token Secret's UID (the objects' owner).
    pub token_uid: &'a str,
}

fn meta(target: &Target<'_>) -> ObjectMeta {
    meta_named(
        target,
        &name(target.config_uid),
        labels::BOOT_REPORT_CONFIG_UID,
    )
}

/// The metadata of object `name` of the config (label `label`: its UID), owned by its token.
pub(crate) fn meta_named(target: &Target<'_>, name: &str, label: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        labels: Some(BTreeMap::from([(
            label.to_owned(),
            target.config_uid.to_owned(),
        )])),
        owner_references: Some(vec![OwnerReference {
            api_version: Secret::api_version(&()).into_owned(),
            kind: Secret::kind(&()).into_owned(),
            name: format!("bootstrap-token-{}", target.token_id),
            uid: target.token_uid.to_owned(),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    }
}

/// The empty report ConfigMap.
pub(crate) fn config_map(target: &Target<'_>) -> ConfigMap {
    ConfigMap {
        metadata: meta(target),
        ..ConfigMap::default()
    }
}

/// The report's grant: `get` and `patch` of its one ConfigMap, `object`.
fn report_grant(object: &str) -> Grant<'_> {
    Grant {
        object,
        label: labels::BOOT_REPORT_CONFIG_UID,
        resource: "configmaps",
        verbs: &["get", "patch"],
    }
}

/// The Role of `grant`: its verbs on its one object (core group).
pub(crate) fn role(target: &Target<'_>, grant: &Grant<'_>) -> Role {
    Role {
        metadata: meta_named(target, grant.object, grant.label),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec![grant.resource.to_owned()]),
            resource_names: Some(vec![grant.object.to_owned()]),
            verbs: grant.verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..PolicyRule::default()
        }]),
    }
}

/// [`role`] bound to the token's user (and no one else).
pub(crate) fn role_binding(target: &Target<'_>, grant: &Grant<'_>) -> RoleBinding {
    RoleBinding {
        metadata: meta_named(target, grant.object, grant.label),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: grant.object.to_owned(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "User".to_owned(),
            name: format!("system:bootstrap:{}", target.token_id),
            ..Subject::default()
        }]),
    }
}

fn workload_error(e: kube::Error) -> Error {
    Error::waiting(
        crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
        format!("workload cluster: cannot set up the boot report: {e}"),
    )
}

/// The UID of token `token_id`'s Secret (the owner of the objects made for it).
pub(crate) async fn token_uid(workload: &Client, token_id: &str) -> kube::Result<String> {
    let secrets: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    let name = format!("bootstrap-token-{token_id}");
    Ok(secrets.get_metadata(&name).await?.uid().unwrap_or_default())
}

/// What a [`grant`] lets a token do: `verbs` on the one `resource` named `object` (the Role
/// and RoleBinding have that name too), labelled `label` with the config's UID.
pub(crate) struct Grant<'a> {
    pub object: &'a str,
    pub label: &'a str,
    pub resource: &'a str,
    pub verbs: &'a [&'a str],
}

/// Server-side applies, for config `config_uid`'s token `token_id`, the Role and RoleBinding
/// of `grant` and then the granted object (`object` makes it), all owned by the token's
/// Secret: four requests (the token's UID, three applies).
pub(crate) async fn grant<K>(
    workload: &Client,
    (config_uid, token_id): (&str, &str),
    grant: &Grant<'_>,
    object: impl FnOnce(&Target<'_>) -> K,
) -> kube::Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let token_uid = token_uid(workload, token_id).await?;
    let target = Target {
        config_uid,
        token_id,
        token_uid: &token_uid,
    };
    let name = grant.object;
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    let roles: Api<Role> = Api::namespaced(workload.clone(), NAMESPACE);
    let bindings: Api<RoleBinding> = Api::namespaced(workload.clone(), NAMESPACE);
    let objects: Api<K> = Api::namespaced(workload.clone(), NAMESPACE);
    let role = role(&target, grant);
    roles.patch(name, &params, &Patch::Apply(role)).await?;
    let binding = role_binding(&target, grant);
    bindings
        .patch(name, &params, &Patch::Apply(binding))
        .await?;
    let object = object(&target);
    objects.patch(name, &params, &Patch::Apply(object)).await?;
    Ok(())
}

/// Sets up the report objects of config `config_uid` for token `token_id` (just created):
/// server-side applied, so a config's later token takes them over.
pub(crate) async fn set_up(workload: &Client, config_uid: &str, token_id: &str) -> Result<()> {
    let object = name(config_uid);
    let ids = (config_uid, token_id);
    grant(workload, ids, &report_grant(&object), config_map)
        .await
        .map_err(workload_error)
}

/// Deletes the report objects of config `config_uid` (with its tokens). Returns how many were
/// there.
pub(crate) async fn delete(workload: &Client, config_uid: &str) -> Result<usize> {
    delete_granted::<ConfigMap>(workload, &name(config_uid))
        .await
        .map_err(workload_error)
}

/// Deletes the RoleBinding, the Role and the `K` named `object` in [`NAMESPACE`]. Returns how
/// many were there.
pub(crate) async fn delete_granted<K>(workload: &Client, object: &str) -> kube::Result<usize>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let objects: Api<K> = Api::namespaced(workload.clone(), NAMESPACE);
    let roles: Api<Role> = Api::namespaced(workload.clone(), NAMESPACE);
    let bindings: Api<RoleBinding> = Api::namespaced(workload.clone(), NAMESPACE);
    let params = DeleteParams::default();
    let results = [
        bindings.delete(object, &params).await.map(drop),
        roles.delete(object, &params).await.map(drop),
        objects.delete(object, &params).await.map(drop),
    ];
    let mut deleted = 0;
    for result in results {
        match result {
            Ok(()) => deleted += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// The reports of one workload cluster, by config UID: the encoded report, or `None` for one
/// too large to keep (the machine wrote more than [`MAX_ENCODED`]).
pub(crate) type ClusterReports = HashMap<String, Option<String>>;

/// A cluster's reports and when they were listed.
type Listed = (Instant, Arc<ClusterReports>);

/// Each workload cluster's reports as last listed, reused for an interval.
#[derive(Default)]
pub struct Reports {
    listed: Mutex<HashMap<(String, String), Listed>>,
}

impl Reports {
    /// The reports of Cluster `namespace/cluster`, listed at most once per `interval`.
    pub(crate) async fn of_cluster(
        &self,
        workload: &Client,
        namespace: &str,
        cluster: &str,
        interval: Duration,
    ) -> Result<Arc<ClusterReports>> {
        let key = (namespace.to_owned(), cluster.to_owned());
        if let Some((at, reports)) = self.listed.lock().expect("lock").get(&key)
            && at.elapsed() < interval
        {
            return Ok(reports.clone());
        }
        let api: Api<ConfigMap> = Api::namespaced(workload.clone(), NAMESPACE);
        let params = ListParams::default().labels(labels::BOOT_REPORT_CONFIG_UID);
        let list = api.list(&params).await.map_err(|e| {
            Error::waiting(
                crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
                format!("workload cluster: cannot read boot reports: {e}"),
            )
        })?;
        let reports: ClusterReports = list.items.into_iter().filter_map(entry).collect();
        let reports = Arc::new(reports);
        let mut listed = self.listed.lock().expect("lock");
        listed.insert(key, (Instant::now(), reports.clone()));
        // Clusters not listed for long are dropped: the map stays as large as the clusters
        // that have machines booting.
        listed.retain(|_, (at, _)| at.elapsed() < interval * 6);
        Ok(reports)
    }

    /// Forgets a deleted Cluster's reports.
    pub(crate) fn forget(&self, namespace: &str, cluster: &str) {
        let key = (namespace.to_owned(), cluster.to_owned());
        self.listed.lock().expect("lock").remove(&key);
    }
}

/// The report of config `config_uid`, read now (not from the shared listing): `None` when
/// there is none, `Some(None)` when it is too large to keep.
pub(crate) async fn read(workload: &Client, config_uid: &str) -> Result<Option<Option<String>>> {
    let api: Api<ConfigMap> = Api::namespaced(workload.clone(), NAMESPACE);
    let found = api.get_opt(&name(config_uid)).await.map_err(|e| {
        Error::waiting(
            crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
            format!("workload cluster: cannot read the boot report: {e}"),
        )
    })?;
    Ok(found.and_then(entry).map(|(_, report)| report))
}

/// A listed ConfigMap as (config UID, report): the UID from its name (a machine may change
/// its labels, not its name).
fn entry(config_map: ConfigMap) -> Option<(String, Option<String>)> {
    let uid = config_map
        .name_any()
        .strip_prefix("bootplate-boot-")?
        .to_owned();
    let report = config_map.data.and_then(|mut d| d.remove(REPORT_KEY));
    match report {
        None => None,
        Some(r) if r.len() > MAX_ENCODED => Some((uid, None)),
        Some(r) => Some((uid, Some(r))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_of_the_config_may_write_its_report() {
        let target = Target {
            config_uid: "u-1",
            token_id: "abcdef",
            token_uid: "t-uid",
        };
        let object = name("u-1");
        let grant = report_grant(&object);
        let rule = &role(&target, &grant).rules.unwrap()[0];
        assert_eq!(rule.resource_names.as_deref(), Some(&[name("u-1")][..]));
        assert_eq!(rule.verbs, ["get", "patch"]);
        let subject = &role_binding(&target, &grant).subjects.unwrap()[0];
        assert_eq!(subject.name, "system:bootstrap:abcdef");
        let owner = &config_map(&target).metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Secret", "bootstrap-token-abcdef", "t-uid")
        );
    }

    #[test]
    fn reports_are_found_by_name_and_oversized_ones_are_not_kept() {
        let cm = |name: &str, report: Option<String>| ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            data: report.map(|r| BTreeMap::from([(REPORT_KEY.to_owned(), r)])),
            ..ConfigMap::default()
        };
        assert_eq!(
            entry(cm("bootplate-boot-u1", Some("abc".into()))),
            Some(("u1".into(), Some("abc".into())))
        );
        assert_eq!(
            entry(cm("bootplate-boot-u1", Some("a".repeat(MAX_ENCODED + 1)))),
            Some(("u1".into(), None))
        );
        assert_eq!(entry(cm("bootplate-boot-u1", None)), None);
        assert_eq!(entry(cm("other", Some("abc".into()))), None);
    }
}
