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
    ObjectMeta {
        name: Some(name(target.config_uid)),
        namespace: Some(NAMESPACE.to_owned()),
        labels: Some(BTreeMap::from([(
            labels::BOOT_REPORT_CONFIG_UID.to_owned(),
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

/// `get` and `patch` of that one ConfigMap.
pub(crate) fn role(target: &Target<'_>) -> Role {
    Role {
        metadata: meta(target),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".to_owned()]),
            resource_names: Some(vec![name(target.config_uid)]),
            verbs: vec!["get".to_owned(), "patch".to_owned()],
            ..PolicyRule::default()
        }]),
    }
}

/// [`role`] for the token's user.
pub(crate) fn role_binding(target: &Target<'_>) -> RoleBinding {
    RoleBinding {
        metadata: meta(target),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: name(target.config_uid),
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

/// Sets up the report objects of config `config_uid` for token `token_id` (just created):
/// server-side applied, so a config's later token takes them over.
pub(crate) async fn set_up(workload: &Client, config_uid: &str, token_id: &str) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    let token = (secrets
        .get_metadata(&format!("bootstrap-token-{token_id}"))
        .await)
        .map_err(workload_error)?;
    let token_uid = token.uid().unwrap_or_default();
    let target = Target {
        config_uid,
        token_id,
        token_uid: &token_uid,
    };
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    let object = name(config_uid);
    let config_maps: Api<ConfigMap> = Api::namespaced(workload.clone(), NAMESPACE);
    let roles: Api<Role> = Api::namespaced(workload.clone(), NAMESPACE);
    let bindings: Api<RoleBinding> = Api::namespaced(workload.clone(), NAMESPACE);
    (roles
        .patch(&object, &params, &Patch::Apply(role(&target)))
        .await)
        .map_err(workload_error)?;
    let binding = Patch::Apply(role_binding(&target));
    (bindings.patch(&object, &params, &binding).await).map_err(workload_error)?;
    let config_map = Patch::Apply(config_map(&target));
    (config_maps.patch(&object, &params, &config_map).await).map_err(workload_error)?;
    Ok(())
}

/// Deletes the report objects of config `config_uid` (with its tokens). Returns how many were
/// there.
pub(crate) async fn delete(workload: &Client, config_uid: &str) -> Result<usize> {
    let object = name(config_uid);
    let mut deleted = 0;
    let config_maps: Api<ConfigMap> = Api::namespaced(workload.clone(), NAMESPACE);
    let roles: Api<Role> = Api::namespaced(workload.clone(), NAMESPACE);
    let bindings: Api<RoleBinding> = Api::namespaced(workload.clone(), NAMESPACE);
    let results = [
        bindings
            .delete(&object, &DeleteParams::default())
            .await
            .map(drop),
        roles
            .delete(&object, &DeleteParams::default())
            .await
            .map(drop),
        config_maps
            .delete(&object, &DeleteParams::default())
            .await
            .map(drop),
    ];
    for result in results {
        match result {
            Ok(()) => deleted += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(workload_error(e)),
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
        let rule = &role(&target).rules.unwrap()[0];
        assert_eq!(rule.resource_names.as_deref(), Some(&[name("u-1")][..]));
        assert_eq!(rule.verbs, ["get", "patch"]);
        let subject = &role_binding(&target).subjects.unwrap()[0];
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
