//! Boot reports in the workload cluster (docs/boot-channel.md): the ConfigMap a machine writes
//! its report into, `kube-system/bootplate-boot-<config UID>`, and the Role and RoleBinding
//! that let the machine's bootstrap token, and only it, write that one ConfigMap.
//!
//! Where the workload cluster enforces a ValidatingAdmissionPolicy, the machine creates its
//! report itself under a grant shared by all machines (`k8s::footprint`), and none of these
//! per-machine objects is made. Elsewhere (the fallback) RBAC enforces it: the Role grants
//! `get` and `patch` on that name only (`resourceNames`), bound to the token's user
//! `system:bootstrap:<token ID>`; any other token is refused (403). The ConfigMap is then
//! created by bootplate (RBAC cannot limit a `create` by name).
//!
//! Every report and its objects carry an ownerReference to the token's Secret: the workload
//! cluster's garbage collector deletes them with the token (when bootplate deletes it after the
//! join, or the token cleaner an expired one). Nothing of it is deleted by request.
//!
//! Reads are coalesced: one listing per workload cluster per interval, shared by all its
//! configs and scoped to its Cluster's reports ([`Reports`]), and only while some config of
//! that cluster waits for its machine.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};

use crate::core::boot::{MAX_ENCODED, REPORT_KEY};
use crate::core::token::{NAMESPACE, Token};
use crate::error::{Error, Result};
use crate::labels;

/// What a report's name starts with; the config's UID follows.
pub(crate) const PREFIX: &str = "bootplate-boot-";

/// The name of the report objects of config `config_uid`.
pub fn name(config_uid: &str) -> String {
    format!("{PREFIX}{config_uid}")
}

/// The report's metadata as the machine applies it with each report (JSON): its name, the
/// labels the listing selects and the config's, owned by `token`'s Secret, so the garbage
/// collector removes it with the token. A token whose Secret is not known yet (the trial
/// render's stand-in) gets a stand-in UID of the same length.
pub fn machine_metadata(config_uid: &str, cluster_uid: &str, token: &Token) -> String {
    let stand_in = "00000000-0000-0000-0000-000000000000";
    let target = Target {
        config_uid,
        token_id: &token.id,
        token_uid: token.secret_uid.as_deref().unwrap_or(stand_in),
    };
    let metadata = config_map(&target, cluster_uid).metadata;
    serde_json::to_string(&metadata).expect("metadata serializes")
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

/// The empty report ConfigMap, labelled with the UID of its management Cluster (the
/// listing's scope: one workload apiserver may serve more than one Cluster object).
pub(crate) fn config_map(target: &Target<'_>, cluster_uid: &str) -> ConfigMap {
    let mut metadata = meta(target);
    (metadata.labels.get_or_insert_default()).insert(
        labels::BOOT_REPORT_CLUSTER_UID.to_owned(),
        cluster_uid.to_owned(),
    );
    ConfigMap {
        metadata,
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

/// Server-side applies, for config `config_uid`'s token, the Role and RoleBinding of `grant`
/// and then the granted object (`object` makes it), all owned by the token's Secret: three
/// requests, and a fourth to read the Secret's UID when the token does not carry it.
pub(crate) async fn grant<K>(
    workload: &Client,
    config_uid: &str,
    token: &Token,
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
    let token_uid = match &token.secret_uid {
        Some(uid) => uid.clone(),
        None => token_uid(workload, &token.id).await?,
    };
    let target = Target {
        config_uid,
        token_id: &token.id,
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

/// Sets up the report objects of config `config_uid` (of the Cluster with UID `cluster_uid`)
/// for `token` (just created): server-side applied, so a config's later token takes them over.
pub(crate) async fn set_up(
    workload: &Client,
    config_uid: &str,
    cluster_uid: &str,
    token: &Token,
) -> Result<()> {
    let object = name(config_uid);
    grant(
        workload,
        config_uid,
        token,
        &report_grant(&object),
        |target| config_map(target, cluster_uid),
    )
    .await
    .map_err(workload_error)
}

/// A report as a listing holds it: the encoded report, or `None` for one too large to keep (the
/// machine wrote more than [`MAX_ENCODED`]).
pub(crate) type Encoded = Option<String>;

/// One listing of a Cluster's reports. Every listed report's digest, so the poller can tell
/// which waiting config's report changed; the reports themselves only of the configs that
/// waited (or asked) when it was made. The workload cluster is the tenant's: a listing may hold
/// many labelled ConfigMaps no config of ours waits for, and those are not kept.
#[derive(Default)]
pub(crate) struct ClusterReports {
    digests: HashMap<String, u64>,
    kept: HashMap<String, Encoded>,
}

/// What a listing knows of one config's report.
#[derive(Debug, PartialEq)]
enum Found<'a> {
    /// No report of that config was listed.
    Absent,
    /// Listed and kept.
    Kept(&'a Encoded),
    /// Listed, not kept: read on its own when a config needs it.
    NotKept,
}

impl ClusterReports {
    /// The digest of config `uid`'s entry ([`digest`]).
    pub(crate) fn digest_of(&self, uid: &str) -> u64 {
        (self.digests.get(uid).copied()).unwrap_or_else(|| digest(None))
    }

    fn find(&self, uid: &str) -> Found<'_> {
        match (self.kept.get(uid), self.digests.contains_key(uid)) {
            (Some(entry), _) => Found::Kept(entry),
            (None, true) => Found::NotKept,
            (None, false) => Found::Absent,
        }
    }

    /// Adds a listed report, keeping it when `keep`.
    fn add(&mut self, uid: String, entry: Encoded, keep: bool) {
        self.digests.insert(uid.clone(), digest(Some(&entry)));
        if keep {
            self.kept.insert(uid, entry);
        }
    }
}

/// Report ConfigMaps read per request of a listing: a page of the largest reports kept
/// ([`MAX_ENCODED`]) with their metadata is about 1 MiB, a quarter of what bootplate reads of
/// one workload response (`workload::MAX_RESPONSE_BYTES`).
const PAGE: u32 = 50;

/// The most report ConfigMaps one listing reads; past it the listing fails, with an error that
/// says so, and the Cluster's boots are not read. A Cluster's own machines make one each.
pub(crate) const MAX_LISTED: usize = 10_000;

/// A Cluster, as `(namespace, name)`.
pub(crate) type ClusterKey = (String, String);

/// A config waiting for its machine's report: its name (in the Cluster's namespace) and a
/// digest of the report as its last reconcile saw it (`None`: not read).
struct Waiting {
    name: String,
    seen: Option<u64>,
}

/// What is kept of one Cluster: its last listing (behind an async lock, so concurrent readers
/// make one listing, not one each) and its configs waiting for their machines.
struct Slot {
    /// The Cluster, shared with the waiting configs' entries in `Reports::cluster_of`.
    key: Arc<ClusterKey>,
    listing: tokio::sync::Mutex<Option<(Instant, Arc<ClusterReports>)>>,
    waiting: Mutex<HashMap<String, Waiting>>,
}

/// The boot reports of the workload clusters whose machines boot: each Cluster's reports as
/// last listed, and the configs waiting for a report (by UID), which the poller
/// (`reconcile::boot::poll`) triggers when their report changes. The cost at scale is one
/// listing per Cluster with booting machines per interval, and a reconcile per change, not
/// one per waiting config per interval.
#[derive(Default)]
pub struct Reports {
    clusters: Mutex<HashMap<ClusterKey, Arc<Slot>>>,
    /// The Cluster of each waiting config, by UID (one copy of the key per Cluster: at
    /// 20 000 waiting configs a copy each was 2 MB).
    cluster_of: Mutex<HashMap<String, Arc<ClusterKey>>>,
}

/// The digest of a config's entry in a listing (absent, too large, or the report).
pub(crate) fn digest(entry: Option<&Encoded>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    entry.hash(&mut hasher);
    hasher.finish()
}

impl Reports {
    fn slot(&self, key: &ClusterKey) -> Arc<Slot> {
        let mut clusters = self.clusters.lock().expect("lock");
        let slot = clusters.entry(key.clone()).or_insert_with(|| {
            Arc::new(Slot {
                key: Arc::new(key.clone()),
                listing: Default::default(),
                waiting: Default::default(),
            })
        });
        Arc::clone(slot)
    }

    /// The reports of `cluster` (its management Cluster's UID scopes the listing), listed
    /// when the last listing is `max_age` old or older; concurrent callers share one listing.
    /// The reports kept are those of the configs waiting at the time.
    pub(crate) async fn of_cluster(
        &self,
        workload: &Client,
        key: &ClusterKey,
        cluster_uid: &str,
        max_age: Duration,
    ) -> Result<Arc<ClusterReports>> {
        let slot = self.slot(key);
        let mut listing = slot.listing.lock().await;
        if let Some((at, reports)) = listing.as_ref()
            && at.elapsed() < max_age
        {
            return Ok(reports.clone());
        }
        let wanted: HashSet<String> = slot.waiting.lock().expect("lock").keys().cloned().collect();
        let reports = Arc::new(list(workload, cluster_uid, &wanted).await?);
        *listing = Some((Instant::now(), Arc::clone(&reports)));
        Ok(reports)
    }

    /// The report of config `uid` of `cluster` (UID `cluster_uid`; `None`: it has none), from a
    /// listing at most
    /// `max_age` old; a report listed but not kept (its config did not wait yet) is read on
    /// its own.
    pub(crate) async fn report(
        &self,
        workload: &Client,
        cluster: &ClusterKey,
        cluster_uid: &str,
        uid: &str,
        max_age: Duration,
    ) -> Result<Option<Encoded>> {
        let reports = (self.of_cluster(workload, cluster, cluster_uid, max_age)).await?;
        match reports.find(uid) {
            Found::Absent => Ok(None),
            Found::Kept(entry) => Ok(Some(entry.clone())),
            Found::NotKept => {
                let api: Api<ConfigMap> = Api::namespaced(workload.clone(), NAMESPACE);
                let read = api.get_opt(&name(uid)).await.map_err(read_error)?;
                Ok(read.and_then(entry).map(|(_, entry)| entry))
            }
        }
    }

    /// Records that config `uid` (named `name`, of Cluster `key`) waits for its machine's
    /// report, and what its reconcile saw of it (`seen`: [`digest`], `None` if not read).
    pub(crate) fn wait_for(&self, key: &ClusterKey, uid: &str, name: &str, seen: Option<u64>) {
        let waiting = Waiting {
            name: name.to_owned(),
            seen,
        };
        let slot = self.slot(key);
        slot.waiting
            .lock()
            .expect("lock")
            .insert(uid.to_owned(), waiting);
        let mut cluster_of = self.cluster_of.lock().expect("lock");
        cluster_of.insert(uid.to_owned(), Arc::clone(&slot.key));
    }

    /// Config `uid` no longer waits (its machine's boot ended or joined, or it is gone).
    pub(crate) fn stop_waiting(&self, uid: &str) {
        let Some(key) = self.cluster_of.lock().expect("lock").remove(uid) else {
            return;
        };
        let slot = self.clusters.lock().expect("lock").get(&*key).cloned();
        if let Some(slot) = slot {
            slot.waiting.lock().expect("lock").remove(uid);
        }
    }

    /// The Clusters with configs waiting; the others' listings are dropped.
    pub(crate) fn clusters_waiting(&self) -> Vec<ClusterKey> {
        let mut clusters = self.clusters.lock().expect("lock");
        clusters.retain(|_, slot| !slot.waiting.lock().expect("lock").is_empty());
        clusters.keys().cloned().collect()
    }

    /// The names of the configs of Cluster `key` whose report in `reports` differs from what
    /// their reconcile saw; each is then counted as having seen it.
    pub(crate) fn changed(&self, key: &ClusterKey, reports: &ClusterReports) -> Vec<String> {
        let Some(slot) = self.clusters.lock().expect("lock").get(key).cloned() else {
            return Vec::new();
        };
        let mut waiting = slot.waiting.lock().expect("lock");
        changed(&mut waiting, reports)
    }

    /// Forgets a deleted Cluster's reports and waiting configs.
    pub(crate) fn forget(&self, namespace: &str, cluster: &str) {
        let key = (namespace.to_owned(), cluster.to_owned());
        self.clusters.lock().expect("lock").remove(&key);
        self.cluster_of
            .lock()
            .expect("lock")
            .retain(|_, k| **k != key);
    }
}

/// The reports labelled for Cluster `cluster_uid`, page by page, keeping those of `wanted`
/// configs (at most [`MAX_LISTED`] read).
async fn list(
    workload: &Client,
    cluster_uid: &str,
    wanted: &HashSet<String>,
) -> Result<ClusterReports> {
    let api: Api<ConfigMap> = Api::namespaced(workload.clone(), NAMESPACE);
    let selector = format!("{}={cluster_uid}", labels::BOOT_REPORT_CLUSTER_UID);
    let mut params = ListParams::default().labels(&selector).limit(PAGE);
    let (mut reports, mut listed) = (ClusterReports::default(), 0);
    loop {
        let page = api.list(&params).await.map_err(read_error)?;
        listed += page.items.len();
        if listed > MAX_LISTED {
            return Err(Error::waiting(
                crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
                format!(
                    "workload cluster: more than {MAX_LISTED} boot report ConfigMaps in {NAMESPACE} are labelled for this Cluster; none is read"
                ),
            ));
        }
        for (uid, entry) in page.items.into_iter().filter_map(entry) {
            let keep = wanted.contains(&uid);
            reports.add(uid, entry, keep);
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(reports),
        }
    }
}

fn read_error(e: kube::Error) -> Error {
    Error::waiting(
        crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
        format!("workload cluster: cannot read boot reports: {e}"),
    )
}

/// The waiting configs whose entry in `reports` differs from what they saw, marked seen.
fn changed(waiting: &mut HashMap<String, Waiting>, reports: &ClusterReports) -> Vec<String> {
    let mut names = Vec::new();
    for (uid, config) in waiting.iter_mut() {
        let now = reports.digest_of(uid);
        if config.seen != Some(now) {
            config.seen = Some(now);
            names.push(config.name.clone());
        }
    }
    names
}

/// A listed ConfigMap as (config UID, report): the UID from its name (a machine may change
/// its labels, not its name).
fn entry(config_map: ConfigMap) -> Option<(String, Encoded)> {
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
        let config_map = config_map(&target, "c-uid");
        let labels = config_map.metadata.labels.unwrap();
        assert_eq!(labels[labels::BOOT_REPORT_CLUSTER_UID], "c-uid");
        assert_eq!(labels[labels::BOOT_REPORT_CONFIG_UID], "u-1");
        let owner = &config_map.metadata.owner_references.unwrap()[0];
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

    /// A listing triggers exactly the waiting configs whose entry differs from what they saw
    /// (a report written, changed, grown too large or gone; one never read), once.
    #[test]
    fn a_listing_triggers_only_the_configs_whose_report_changed() {
        let report = |r: &str| Some(r.to_owned());
        let mut listed = ClusterReports::default();
        listed.add("same".into(), report("a"), true);
        listed.add("new".into(), report("b"), false);
        listed.add("changed".into(), report("c2"), true);
        listed.add("too-large".into(), None, false);
        let seen = |uid: &str, entry: Option<Option<String>>| {
            let waiting = Waiting {
                name: format!("config-{uid}"),
                seen: Some(digest(entry.as_ref())),
            };
            (uid.to_owned(), waiting)
        };
        let mut waiting = HashMap::from([
            seen("same", Some(report("a"))),
            seen("new", None),
            seen("changed", Some(report("c1"))),
            seen("too-large", Some(report("d"))),
            seen("gone", Some(report("e"))),
            seen("still-none", None),
            (
                "never-read".to_owned(),
                Waiting {
                    name: "config-never-read".into(),
                    seen: None,
                },
            ),
        ]);
        let mut triggered = changed(&mut waiting, &listed);
        triggered.sort();
        let want = ["changed", "gone", "never-read", "new", "too-large"];
        assert_eq!(triggered, want.map(|u| format!("config-{u}")));
        assert!(
            changed(&mut waiting, &listed).is_empty(),
            "each change once"
        );
    }

    /// A listing keeps the reports of the configs that wait, and only a digest of the others:
    /// a tenant's labelled ConfigMaps cost the leader a few bytes each, not their contents.
    #[test]
    fn a_listing_keeps_only_the_reports_waited_for() {
        let mut listed = ClusterReports::default();
        listed.add("waits".into(), Some("a".repeat(MAX_ENCODED)), true);
        listed.add("other".into(), Some("b".repeat(MAX_ENCODED)), false);
        assert_eq!(listed.kept.len(), 1);
        assert_eq!(
            listed.find("waits"),
            Found::Kept(&Some("a".repeat(MAX_ENCODED)))
        );
        assert_eq!(listed.find("other"), Found::NotKept);
        assert_eq!(listed.find("none"), Found::Absent);
        let other = Some("b".repeat(MAX_ENCODED));
        assert_eq!(listed.digest_of("other"), digest(Some(&other)));
        assert_eq!(listed.digest_of("none"), digest(None));
    }

    /// A Cluster is polled while one of its configs waits; a config that stops waiting (its
    /// boot ended, it joined or went) is no longer triggered, and a deleted Cluster is dropped.
    #[test]
    fn clusters_are_polled_only_while_a_config_waits() {
        let reports = Reports::default();
        let (a, b) = (
            ("ns".to_owned(), "a".to_owned()),
            ("ns".to_owned(), "b".to_owned()),
        );
        reports.wait_for(&a, "u1", "c1", None);
        reports.wait_for(&a, "u2", "c2", None);
        reports.wait_for(&b, "u3", "c3", None);
        let mut polled = reports.clusters_waiting();
        polled.sort();
        assert_eq!(polled, [a.clone(), b.clone()]);
        reports.stop_waiting("u1");
        assert_eq!(reports.changed(&a, &ClusterReports::default()), ["c2"]);
        reports.stop_waiting("u2");
        reports.forget("ns", "b");
        assert!(reports.clusters_waiting().is_empty());
        assert!(reports.cluster_of.lock().unwrap().is_empty());
    }
}
