//! Converges a workload cluster to what `core::footprint` decides for a config: the shared
//! report grant and admission policy (once per workload cluster, kept current), the
//! per-machine report objects where the policy cannot be had, the sealed render, and at the
//! end the token alone (the garbage collector removes what it owns).
//!
//! The shared objects, all named [`SHARED`]:
//! - a ValidatingAdmissionPolicy and its binding: a request on a ConfigMap from a token of the
//!   reports group must be a create or an update, in `kube-system`, of the one report named
//!   after the config the token's group names, owned by that token's Secret if by anything,
//!   holding the key `report` only;
//! - a Role in `kube-system` allowing `create` and `patch` of ConfigMaps (RBAC cannot limit a
//!   create by name, the policy does), bound to the reports group. No `get`: a machine never
//!   reads a report, its own or another's.
//!
//! The Role exists only where the policy is seen enforced: before it is applied, a dry-run
//! create of a wrong name, as a token of the group would send it, must be refused by the policy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::core::footprint::{self, Admission, Facts, Plan, Report, Stage};
use crate::core::token::{CONFIG_GROUP_PREFIX, NAMESPACE, REPORTS_GROUP, Token};
use crate::error::{Error, Result, is_not_found};
use crate::k8s::boot_report::{self, ClusterKey, PREFIX};
use crate::labels;

/// The name of every shared object.
pub(crate) const SHARED: &str = "bootplate-boot-reports";

/// The admission policy: see the module documentation. The config's UID is the suffix of the
/// token's config group; the token ID the suffix of its user name.
pub(crate) fn policy() -> ValidatingAdmissionPolicy {
    let config = format!(
        "request.userInfo.groups.filter(g, g.startsWith('{CONFIG_GROUP_PREFIX}')).map(g, g.substring({}))",
        CONFIG_GROUP_PREFIX.len()
    );
    let user = "system:bootstrap:";
    let token = format!(
        "request.userInfo.username.startsWith('{user}') ? request.userInfo.username.substring({}) : ''",
        user.len()
    );
    let rules = [
        (
            "request.operation != 'DELETE'",
            "a bootstrap token deletes no ConfigMap",
        ),
        (
            &*format!(
                "request.namespace == '{NAMESPACE}' && size(variables.configs) == 1 && object.metadata.name == '{PREFIX}' + variables.configs[0]"
            ),
            "a bootstrap token writes only the boot report of its own config",
        ),
        (
            "!has(object.metadata.ownerReferences) || object.metadata.ownerReferences.all(r, r.apiVersion == 'v1' && r.kind == 'Secret' && r.name == 'bootstrap-token-' + variables.token)",
            "a boot report is owned by its own token's Secret or by nothing",
        ),
        (
            "(!has(object.data) || object.data.all(k, k == 'report')) && !has(object.binaryData)",
            "a boot report holds the key `report` only",
        ),
    ];
    let validations: Vec<_> = (rules.iter())
        .map(|(expression, message)| {
            json!({"expression": expression, "message": message, "reason": "Forbidden"})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": SHARED, "labels": managed()},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
            }]},
            "matchConditions": [{
                "name": "bootplate-report-tokens",
                "expression": format!("'{REPORTS_GROUP}' in request.userInfo.groups"),
            }],
            "variables": [
                {"name": "configs", "expression": config},
                {"name": "token", "expression": token},
            ],
            "validations": validations,
        }
    }))
    .expect("the policy is well-formed")
}

fn managed() -> serde_json::Value {
    json!({"app.kubernetes.io/managed-by": labels::FIELD_MANAGER})
}

/// The policy's binding: enforced (`Deny`), everywhere it matches.
pub(crate) fn policy_binding() -> ValidatingAdmissionPolicyBinding {
    serde_json::from_value(json!({
        "metadata": {"name": SHARED, "labels": managed()},
        "spec": {"policyName": SHARED, "validationActions": ["Deny"]},
    }))
    .expect("the binding is well-formed")
}

/// The shared Role: create and patch ConfigMaps of `kube-system`.
pub(crate) fn shared_role() -> Role {
    serde_json::from_value(json!({
        "metadata": {"name": SHARED, "namespace": NAMESPACE, "labels": managed()},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}],
    }))
    .expect("the role is well-formed")
}

/// The shared Role bound to the reports group.
pub(crate) fn shared_role_binding() -> RoleBinding {
    serde_json::from_value(json!({
        "metadata": {"name": SHARED, "namespace": NAMESPACE, "labels": managed()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SHARED},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": REPORTS_GROUP}],
    }))
    .expect("the binding is well-formed")
}

/// What is known of each workload cluster's shared objects: when they were last made current,
/// and whether the policy is enforced. Behind an async lock per cluster: the configs rendering
/// together make them current once.
#[derive(Default)]
pub struct Shared {
    clusters: Mutex<HashMap<ClusterKey, Arc<Known>>>,
}

/// When a cluster's shared objects were last made current, and what it enforced then.
type Known = tokio::sync::Mutex<Option<Made>>;

/// A cluster's shared objects as last made current.
struct Made {
    at: Instant,
    admission: Admission,
    /// The policy, its binding, the Role and the RoleBinding as the apply left them (none when
    /// not enforced): a recheck that finds them all so reads them and writes nothing.
    stamps: Vec<Stamp>,
}

/// What tells a shared object unchanged: its UID and, for the policy and its binding, their
/// generation (the apiserver writes their status, which changes no rule); for the Role and
/// RoleBinding, which have none, their resourceVersion. A missing object's is the default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Stamp {
    uid: Option<String>,
    version: Option<String>,
}

impl Stamp {
    fn of(meta: &kube::api::ObjectMeta) -> Stamp {
        let version = match meta.generation {
            Some(generation) => Some(generation.to_string()),
            None => meta.resource_version.clone(),
        };
        Stamp {
            uid: meta.uid.clone(),
            version,
        }
    }
}

impl Shared {
    /// Whether `workload` enforces the report policy, with its shared objects made current
    /// when last done `recheck` ago or more (put back if deleted, edited or from another
    /// version of bootplate). A recheck reads their metadata first and writes only when one
    /// is missing or changed since bootplate made it: at 400 Clusters the rechecks' applies and
    /// probes were 2 000 requests of the workload apiservers in three minutes, each apply of
    /// the policy validating its CEL rules again.
    pub(crate) async fn admission(
        &self,
        workload: &Client,
        key: &ClusterKey,
        recheck: Duration,
    ) -> Result<Admission> {
        let slot = {
            let mut clusters = self.clusters.lock().expect("lock");
            clusters.entry(key.clone()).or_default().clone()
        };
        let mut known = slot.lock().await;
        if let Some(made) = known.as_mut() {
            if made.at.elapsed() < recheck {
                return Ok(made.admission);
            }
            let unchanged = !made.stamps.is_empty()
                && stamps(workload).await.map_err(workload_error)? == made.stamps;
            if unchanged {
                made.at = Instant::now();
                return Ok(made.admission);
            }
        }
        let made = make_current(workload).await.map_err(workload_error)?;
        let admission = made.admission;
        *known = Some(made);
        Ok(admission)
    }

    /// Forgets a deleted Cluster.
    pub(crate) fn forget(&self, namespace: &str, cluster: &str) {
        let key = (namespace.to_owned(), cluster.to_owned());
        self.clusters.lock().expect("lock").remove(&key);
    }
}

fn workload_error(e: kube::Error) -> Error {
    Error::waiting(
        crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
        format!("workload cluster: cannot set up the boot reports: {e}"),
    )
}

/// The shared objects' stamps as they are now: the policy, its binding, the Role and the
/// RoleBinding (a missing one has none). Four reads of metadata, where making them current is
/// four applies and a probe.
async fn stamps(workload: &Client) -> kube::Result<Vec<Stamp>> {
    let apis = SharedApis::of(workload);
    let found = [
        apis.policies
            .get_metadata_opt(SHARED)
            .await?
            .map(|o| o.metadata),
        apis.bindings
            .get_metadata_opt(SHARED)
            .await?
            .map(|o| o.metadata),
        apis.roles
            .get_metadata_opt(SHARED)
            .await?
            .map(|o| o.metadata),
        (apis.role_bindings.get_metadata_opt(SHARED).await?).map(|o| o.metadata),
    ];
    Ok(found
        .iter()
        .map(|meta| meta.as_ref().map(Stamp::of).unwrap_or_default())
        .collect())
}

/// The APIs of the shared objects' kinds.
struct SharedApis {
    policies: Api<ValidatingAdmissionPolicy>,
    bindings: Api<ValidatingAdmissionPolicyBinding>,
    roles: Api<Role>,
    role_bindings: Api<RoleBinding>,
}

impl SharedApis {
    fn of(workload: &Client) -> SharedApis {
        SharedApis {
            policies: Api::all(workload.clone()),
            bindings: Api::all(workload.clone()),
            roles: Api::namespaced(workload.clone(), NAMESPACE),
            role_bindings: Api::namespaced(workload.clone(), NAMESPACE),
        }
    }
}

/// Applies the policy and its binding; when the policy is seen enforced, the shared Role and
/// RoleBinding too, else they are removed (a token of the group must not hold the grant
/// without the policy).
async fn make_current(workload: &Client) -> kube::Result<Made> {
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    let SharedApis {
        policies,
        bindings,
        roles,
        role_bindings,
    } = SharedApis::of(workload);
    let missing = Made {
        at: Instant::now(),
        admission: Admission::Missing,
        stamps: Vec::new(),
    };
    let policy = match policies
        .patch(SHARED, &params, &Patch::Apply(policy()))
        .await
    {
        Err(e) if is_not_found(&e) => {
            info!(
                "workload cluster serves no ValidatingAdmissionPolicy: boot reports get per-machine objects"
            );
            return Ok(missing);
        }
        other => other?,
    };
    let binding = Patch::Apply(policy_binding());
    let binding = bindings.patch(SHARED, &params, &binding).await?;
    if !enforced(workload).await? {
        warn!(
            "workload cluster does not enforce the boot report policy: boot reports get per-machine objects"
        );
        for deleted in [
            role_bindings
                .delete(SHARED, &DeleteParams::default())
                .await
                .map(drop),
            roles
                .delete(SHARED, &DeleteParams::default())
                .await
                .map(drop),
        ] {
            deleted.or_else(|e| if is_not_found(&e) { Ok(()) } else { Err(e) })?;
        }
        return Ok(missing);
    }
    let role = (roles.patch(SHARED, &params, &Patch::Apply(shared_role()))).await?;
    let role_binding = Patch::Apply(shared_role_binding());
    let role_binding = role_bindings.patch(SHARED, &params, &role_binding).await?;
    let metas = [
        &policy.metadata,
        &binding.metadata,
        &role.metadata,
        &role_binding.metadata,
    ];
    Ok(Made {
        at: Instant::now(),
        admission: Admission::Enforced,
        stamps: metas.into_iter().map(Stamp::of).collect(),
    })
}

/// How long a policy just applied may take to be enforced (the apiserver loads policies from
/// a watch), and how often it is tried meanwhile.
const ENFORCED_WITHIN: Duration = Duration::from_secs(5);
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Whether the policy refuses, as a token of the reports group would send it, a dry-run create
/// of a report named for another config. The probe impersonates `system:masters` beside the
/// group so that RBAC lets it reach admission before the shared Role exists: the workload
/// credentials bootplate holds are that cluster's administrator already.
async fn enforced(workload: &Client) -> kube::Result<bool> {
    let started = Instant::now();
    loop {
        match probe(workload).await {
            Err(kube::Error::Api(status)) if status.message.contains(SHARED) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                warn!(message = %status.message, "cannot probe the boot report policy");
                return Ok(false);
            }
            Err(e @ kube::Error::Api(_)) | Err(e @ kube::Error::Service(_)) => {
                if started.elapsed() >= ENFORCED_WITHIN {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
            Ok(()) if started.elapsed() >= ENFORCED_WITHIN => return Ok(false),
            Ok(()) => {}
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

async fn probe(workload: &Client) -> kube::Result<()> {
    let body = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{PREFIX}not-the-probe"), "namespace": NAMESPACE},
    });
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{NAMESPACE}/configmaps?dryRun=All"
    ))
    .header("Content-Type", "application/json")
    .header("Impersonate-User", "system:bootstrap:probe0")
    .header("Impersonate-Group", "system:masters")
    .header("Impersonate-Group", REPORTS_GROUP)
    .header("Impersonate-Group", format!("{CONFIG_GROUP_PREFIX}probe"))
    .body(serde_json::to_vec(&body).expect("json"))
    .map_err(kube::Error::HttpError)?;
    workload.request_text(request).await.map(drop)
}

/// What a render made for the workload cluster: for config `config_uid` of the Cluster with
/// UID `cluster_uid`, its `token` and its sealed render (fetch delivery).
pub(crate) struct Render<'a> {
    pub config_uid: &'a str,
    pub cluster_uid: &'a str,
    pub token: &'a Token,
    pub sealed: Option<&'a render::fetch::Sealed>,
}

/// The workload cluster a config's footprint is in.
pub(crate) struct Workload<'a> {
    pub client: &'a Client,
    /// Its Cluster, as `(namespace, name)`.
    pub cluster: &'a ClusterKey,
    /// How long its shared objects are trusted as last made before they are made current again.
    pub recheck: Duration,
}

/// Before a data Secret holds a render: what `plan` asks for the config (`facts` without the
/// workload cluster's admission; it is asked only when the report would use it).
pub(crate) async fn set_up(
    in_cluster: &Workload<'_>,
    shared: &Shared,
    mut facts: Facts,
    render: &Render<'_>,
) -> Result<Plan> {
    // The workload cluster is asked only when the machine would write under the policy.
    facts.admission = Admission::Enforced;
    if footprint::plan(&facts).report == Report::MachineCreates {
        facts.admission = shared
            .admission(in_cluster.client, in_cluster.cluster, in_cluster.recheck)
            .await?;
    }
    let plan = footprint::plan(&facts);
    if plan.report_objects {
        let (config, cluster) = (render.config_uid, render.cluster_uid);
        boot_report::set_up(in_cluster.client, config, cluster, render.token).await?;
    }
    if plan.payload
        && let Some(sealed) = render.sealed
    {
        let client = in_cluster.client;
        super::fetch_payload::store(client, render.config_uid, render.token, sealed).await?;
    }
    Ok(plan)
}

/// After the join or the config's deletion (`stage`): deletes its tokens, the one thing
/// deleted by request. Returns how many.
pub(crate) async fn tear_down(workload: &Client, config_uid: &str, stage: Stage) -> Result<usize> {
    let api: Api<Secret> = Api::namespaced(workload.clone(), NAMESPACE);
    let selector = format!("{}={config_uid}", labels::TOKEN_CONFIG_UID);
    let existing = (api.list_metadata(&ListParams::default().labels(&selector)))
        .await
        .map_err(workload_error)?;
    let facts = Facts {
        token_exists: !existing.items.is_empty(),
        ..Facts::after(stage)
    };
    if !footprint::plan(&facts).delete_token {
        return Ok(0);
    }
    let names = existing.items.iter().map(|s| s.name_any());
    super::tokens::delete_named(&api, names).await
}
