//! What a config waits for before anything is rendered, and when it is frozen.

use crd_types::capi::{Cluster, Machine, has_paused_annotation};
use crd_types::conditions::reason;
use crd_types::{BootplateConfig, BootplateConfigStatus, Role};
use kube::ResourceExt;
use render::Endpoint;

use super::blocked::Blocked;
use super::cached_secret::CachedSecret;

/// What owns a config, by the ownerReference CAPI adds: the Machine it bootstraps (CAPI's
/// Machine controller), or the MachinePool whose instances all boot from it (CAPI's MachinePool
/// controller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A Machine, by name.
    Machine(String),
    /// A MachinePool, by name.
    Pool(String),
}

/// The config's owner, when CAPI adopted it.
pub(crate) fn owner(config: &BootplateConfig) -> Option<Owner> {
    config
        .owner_references()
        .iter()
        .filter(|r| r.api_version.starts_with("cluster.x-k8s.io/"))
        .find_map(|r| match r.kind.as_str() {
            "Machine" => Some(Owner::Machine(r.name.clone())),
            "MachinePool" => Some(Owner::Pool(r.name.clone())),
            _ => None,
        })
}

/// Why a config no Machine owns yet waits. CAPI adopts configs only while their Cluster is not
/// paused, so a paused Cluster's configs say "paused", not "waiting for a Machine". `cluster`
/// is the name of the Cluster of the Machine whose configRef names the config, and whether it
/// is paused, when that Machine and Cluster are cached.
pub(crate) fn unadopted(config: &BootplateConfig, cluster: Option<(&str, bool)>) -> Blocked {
    if cluster.is_some_and(|(_, paused)| paused) || has_paused_annotation(&config.metadata) {
        return paused(cluster.map_or("of this config", |(name, _)| name));
    }
    Blocked::waiting(
        reason::WAITING_FOR_MACHINE,
        "waiting for a Machine to own this config (CAPI's Machine controller adds the ownerReference)",
    )
}

fn paused(cluster: &str) -> Blocked {
    Blocked::waiting(
        reason::PAUSED,
        format!(
            "reconciliation is paused (Cluster {cluster} spec.paused or the cluster.x-k8s.io/paused annotation)"
        ),
    )
}

/// The owner `kind` (`Machine`, `MachinePool`) `name` of a config in `namespace`, when the
/// cache holds it.
pub(crate) fn owner_found<M>(
    kind: &str,
    namespace: &str,
    name: &str,
    owner: Option<M>,
) -> Result<M, Blocked> {
    owner.ok_or_else(|| {
        Blocked::waiting(
            reason::WAITING_FOR_MACHINE,
            format!("owner {kind} {namespace}/{name} not found"),
        )
    })
}

/// The owner of a config as messages name it: its kind (`Machine`, `MachinePool`) and name.
#[derive(Clone, Copy)]
pub(crate) struct OwnerName<'a> {
    pub kind: &'a str,
    pub name: &'a str,
}

/// The Cluster `cluster_name` of `owner` (its `spec.clusterName`), when the cache holds it.
pub(crate) fn cluster_found<C>(
    namespace: &str,
    owner: OwnerName<'_>,
    cluster_name: &str,
    cluster: Option<C>,
) -> Result<C, Blocked> {
    let OwnerName { kind, name } = owner;
    cluster.ok_or_else(|| {
        Blocked::waiting(
            reason::CLUSTER_NOT_FOUND,
            format!(
                "Cluster {namespace}/{cluster_name} (spec.clusterName of {kind} {name}) not found"
            ),
        )
    })
}

/// Which way a config with its Machine and Cluster found goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Bootstrapped: the data Secret was written and the Machine's Node joined. The Secret
    /// stays as it is, whatever happens to the template; only the clean-up after join is left.
    Frozen {
        /// The role the config rendered (`worker` when the status does not say).
        role: Role,
        /// The template revision rendered.
        revision: String,
    },
    /// Go on to render.
    Render,
}

/// The role and template revision of the data Secret (its metadata: `secret`) a recreated
/// config finds beside it, when that Secret is to be adopted.
///
/// `clusterctl move` (and a restore from a backup) recreates a config without its status, next
/// to the data Secret its Machine already booted from: CAPI copied the Secret's name into the
/// Machine's `spec.bootstrap.dataSecretName` long ago. Rendering again would mint a new token
/// and rewrite user-data that has served its purpose; the Secret is adopted as it is instead.
/// Only a Secret bootplate wrote for this config (its label, and this config as controller,
/// whose UID clusterctl rewrites) is adopted.
pub(crate) fn adoptable(
    config: &BootplateConfig,
    machine: &Machine,
    secret: Option<&CachedSecret>,
) -> Option<(Role, String)> {
    let name = config.name_any();
    let secret = secret?;
    let named = machine.spec.bootstrap.data_secret_name.as_deref() == Some(name.as_str());
    let labelled = secret.data_secret_of.as_ref() == Some(&name);
    let controlled = config
        .metadata
        .uid
        .as_deref()
        .is_some_and(|uid| secret.controller_uid() == Some(uid));
    let role = secret.role.as_deref()?.parse().ok()?;
    let revision = secret.template_revision.clone()?;
    (named && labelled && controlled).then_some((role, revision))
}

/// The path of `config`, owned by `machine` of `cluster`, whose status was `previous`; or why
/// it waits: a paused Cluster or config, infrastructure not provisioned yet, or the Node of a
/// Machine whose data Secret is to be adopted (`adopt`, see [`adoptable`]).
pub(crate) fn path(
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    machine: &Machine,
    cluster: &Cluster,
    adopt: Option<(Role, String)>,
) -> Result<Path, Blocked> {
    if cluster.is_paused() || has_paused_annotation(&config.metadata) {
        return Err(paused(&cluster.name_any()));
    }
    if !previous.ready
        && let Some((role, revision)) = adopt
    {
        if !machine.has_node() {
            return Err(Blocked::waiting(
                reason::WAITING_FOR_NODE,
                format!(
                    "Machine {} booted from Secret {} before this config was recreated; waiting for its Node before adopting the Secret",
                    machine.name_any(),
                    config.name_any()
                ),
            ));
        }
        return Ok(Path::Frozen { role, revision });
    }
    if previous.ready && !machine.has_node() && super::inplace::in_progress(&config.metadata) {
        // The contract: the data Secret is not rewritten while Cluster API updates the
        // machine in place (its new spec reaches the node as a payload, not as user-data).
        return Err(Blocked::waiting(
            reason::IN_PLACE_UPDATING,
            format!(
                "Cluster API is updating Machine {} in place; Secret {} stays as it is until the update ends",
                machine.name_any(),
                config.name_any()
            ),
        ));
    }
    if previous.ready && machine.has_node() {
        return Ok(Path::Frozen {
            role: recorded_role(previous).unwrap_or(Role::Worker),
            revision: previous.template_revision.clone().unwrap_or_default(),
        });
    }
    infrastructure_provisioned(cluster)?;
    Ok(Path::Render)
}

/// Whether the config of a MachinePool renders now, or why it waits: a paused Cluster or
/// config, or infrastructure not provisioned yet. A pool's config is never frozen: its instances
/// boot at any time, long after the first render, so its data Secret is kept current (a fresh
/// token, a changed config or template) for as long as the pool exists.
pub(crate) fn pool_path(config: &BootplateConfig, cluster: &Cluster) -> Result<Path, Blocked> {
    if cluster.is_paused() || has_paused_annotation(&config.metadata) {
        return Err(paused(&cluster.name_any()));
    }
    infrastructure_provisioned(cluster)?;
    Ok(Path::Render)
}

fn infrastructure_provisioned(cluster: &Cluster) -> Result<(), Blocked> {
    if cluster.infrastructure_provisioned() {
        return Ok(());
    }
    Err(Blocked::waiting(
        reason::WAITING_FOR_INFRASTRUCTURE,
        format!(
            "waiting for the infrastructure of Cluster {} to be provisioned",
            cluster.name_any()
        ),
    ))
}

/// The role a config's written data Secret was rendered with: a machine keeps its role (the
/// `init` machine stays `init` after the control plane comes up). `None` before the first write.
pub(crate) fn recorded_role(previous: &BootplateConfigStatus) -> Option<Role> {
    previous
        .ready
        .then(|| previous.role.as_deref()?.parse().ok())
        .flatten()
}

/// The Cluster's control-plane endpoint, or a wait until it has one.
pub(crate) fn endpoint(cluster: &Cluster) -> Result<Endpoint, Blocked> {
    let endpoint = render::ClusterInfo::from_cluster(cluster).control_plane_endpoint;
    if endpoint.host.is_empty() {
        return Err(Blocked::waiting(
            reason::WAITING_FOR_INFRASTRUCTURE,
            format!(
                "waiting for spec.controlPlaneEndpoint of Cluster {}",
                cluster.name_any()
            ),
        ));
    }
    Ok(endpoint)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crd_types::BootplateConfigSpec;
    use crd_types::capi::{ClusterStatus, MachineStatus, NodeReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    pub(crate) fn config(owned: bool) -> BootplateConfig {
        let mut config = BootplateConfig::new("w-0", BootplateConfigSpec::default());
        config.metadata.namespace = Some("ns".into());
        if owned {
            config.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "cluster.x-k8s.io/v1beta2".into(),
                kind: "Machine".into(),
                name: "m-0".into(),
                uid: "m-uid".into(),
                ..Default::default()
            }]);
        }
        config
    }

    pub(crate) fn machine(joined: bool) -> Machine {
        let mut machine = Machine::new("m-0", Default::default());
        machine.spec.cluster_name = "c1".into();
        if joined {
            machine.status = Some(MachineStatus {
                node_ref: Some(NodeReference {
                    name: "node-0".into(),
                }),
                ..Default::default()
            });
        }
        machine
    }

    /// A Cluster `c1`: provisioned or not, control plane initialized or not.
    pub(crate) fn cluster(provisioned: bool, initialized: bool) -> Cluster {
        let mut cluster = Cluster::new("c1", Default::default());
        let mut status: ClusterStatus =
            serde_json::from_value(serde_json::json!({"initialization": {}})).unwrap();
        let init = status.initialization.as_mut().unwrap();
        init.infrastructure_provisioned = Some(provisioned);
        init.control_plane_initialized = Some(initialized);
        cluster.status = Some(status);
        cluster
    }

    fn ready(role: &str) -> BootplateConfigStatus {
        BootplateConfigStatus {
            ready: true,
            role: Some(role.into()),
            template_revision: Some("r1".into()),
            ..Default::default()
        }
    }

    /// A config owned by MachinePool `pool`, as CAPI's MachinePool controller adopts it.
    pub(crate) fn pool_config(pool: &str) -> BootplateConfig {
        let mut config = config(false);
        config.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "MachinePool".into(),
            name: pool.into(),
            uid: "p-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        config
    }

    #[test]
    fn a_config_waits_for_its_owner_and_cluster() {
        assert_eq!(owner(&config(true)), Some(Owner::Machine("m-0".into())));
        assert_eq!(owner(&pool_config("p")), Some(Owner::Pool("p".into())));
        assert_eq!(owner(&config(false)), None);
        let mut foreign = pool_config("p");
        foreign.metadata.owner_references.as_mut().unwrap()[0].api_version =
            "example.com/v1".into();
        assert_eq!(
            owner(&foreign),
            None,
            "only Cluster API's kinds own configs"
        );
        let missing = owner_found::<Machine>("Machine", "ns", "m-0", None).unwrap_err();
        assert_eq!(
            (missing.reason, missing.message.as_str(), missing.waiting),
            (
                reason::WAITING_FOR_MACHINE,
                "owner Machine ns/m-0 not found",
                true
            )
        );
        let missing = owner_found::<Machine>("MachinePool", "ns", "p", None).unwrap_err();
        assert_eq!(missing.message, "owner MachinePool ns/p not found");
        let pool = OwnerName {
            kind: "MachinePool",
            name: "p",
        };
        let no_cluster = cluster_found::<Cluster>("ns", pool, "c1", None).unwrap_err();
        assert_eq!(no_cluster.reason, reason::CLUSTER_NOT_FOUND);
        assert_eq!(
            no_cluster.message,
            "Cluster ns/c1 (spec.clusterName of MachinePool p) not found"
        );
    }

    #[test]
    fn a_pool_config_renders_whenever_it_may_and_is_never_frozen() {
        // (case, infrastructure provisioned, paused, expected)
        let cases = [
            ("render", true, "", Ok(Path::Render)),
            (
                "no infra",
                false,
                "",
                Err(reason::WAITING_FOR_INFRASTRUCTURE),
            ),
            ("paused cluster", true, "cluster", Err(reason::PAUSED)),
            ("paused config", true, "config", Err(reason::PAUSED)),
        ];
        for (case, provisioned, paused, expected) in cases {
            let mut config = pool_config("p");
            if paused == "config" {
                config.metadata.annotations =
                    Some([("cluster.x-k8s.io/paused".to_owned(), String::new())].into());
            }
            let mut cluster = cluster(provisioned, true);
            cluster.spec.paused = Some(paused == "cluster");
            let taken = pool_path(&config, &cluster).map_err(|b| b.reason);
            assert_eq!(taken, expected, "{case}");
        }
    }

    #[test]
    fn an_unadopted_config_of_a_paused_cluster_says_paused() {
        let cases = [
            (None, false, reason::WAITING_FOR_MACHINE, None),
            (
                Some(("c1", false)),
                false,
                reason::WAITING_FOR_MACHINE,
                None,
            ),
            (
                Some(("c1", true)),
                false,
                reason::PAUSED,
                Some("Cluster c1 "),
            ),
            (None, true, reason::PAUSED, Some("Cluster of this config ")),
        ];
        for (cluster, annotated, expected, names) in cases {
            let mut config = config(false);
            if annotated {
                config.metadata.annotations =
                    Some([("cluster.x-k8s.io/paused".to_owned(), String::new())].into());
            }
            let why = unadopted(&config, cluster);
            assert_eq!(why.reason, expected, "{cluster:?} {annotated}");
            if let Some(names) = names {
                assert!(why.message.contains(names), "{}", why.message);
            }
        }
    }

    #[test]
    fn each_config_takes_its_path() {
        // What happened, in short: the path taken or the reason of the wait.
        let summary = |result: Result<Path, Blocked>| match result {
            Ok(Path::Render) => "render".to_owned(),
            Ok(Path::Frozen { role, revision }) => format!("frozen {role} {revision}"),
            Err(blocked) => blocked.reason.to_owned(),
        };
        // (case, role of a written Secret, Node joined, infrastructure, paused, expected)
        let cases = [
            ("render", None, false, true, "", "render"),
            ("joined, not written", None, true, true, "", "render"),
            (
                "written, not joined",
                Some("worker"),
                false,
                true,
                "",
                "render",
            ),
            ("frozen", Some("init"), true, true, "", "frozen init r1"),
            (
                "frozen, no infra",
                Some("worker"),
                true,
                false,
                "",
                "frozen worker r1",
            ),
            (
                "paused config",
                Some("worker"),
                true,
                true,
                "config",
                reason::PAUSED,
            ),
            (
                "paused cluster",
                None,
                false,
                true,
                "cluster",
                reason::PAUSED,
            ),
            (
                "no infra",
                None,
                false,
                false,
                "",
                reason::WAITING_FOR_INFRASTRUCTURE,
            ),
        ];
        for (case, written, joined, provisioned, paused, expected) in cases {
            let mut config = config(true);
            if paused == "config" {
                config.metadata.annotations =
                    Some([("cluster.x-k8s.io/paused".to_owned(), String::new())].into());
            }
            let mut cluster = cluster(provisioned, true);
            cluster.spec.paused = Some(paused == "cluster");
            let previous = written.map(ready).unwrap_or_default();
            let taken = path(&config, &previous, &machine(joined), &cluster, None);
            assert_eq!(summary(taken), expected, "{case}");
        }
    }

    /// The data Secret a config wrote, as `clusterctl move` recreates it: controlled by the
    /// recreated config (whose UID is `uid`).
    fn moved_secret(uid: &str) -> CachedSecret {
        CachedSecret {
            metadata: kube::api::ObjectMeta {
                name: Some("c".into()),
                ..Default::default()
            },
            controlled_by: Some(uid.into()),
            data_secret_of: Some("c".into()),
            role: Some("worker".into()),
            template_revision: Some("r7".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_recreated_config_adopts_the_secret_its_machine_booted_from() {
        let mut config = config(true);
        config.metadata.name = Some("c".into());
        config.metadata.uid = Some("new-uid".into());
        let mut booted = machine(true);
        booted.spec.bootstrap.data_secret_name = Some("c".into());
        let secret = moved_secret("new-uid");
        // (case, machine, secret, adopted)
        let cases = [
            ("booted from it", booted.clone(), Some(secret.clone()), true),
            (
                "never named by the Machine",
                machine(true),
                Some(secret.clone()),
                false,
            ),
            ("no Secret", booted.clone(), None, false),
            (
                "another config's Secret",
                booted.clone(),
                Some(moved_secret("other")),
                false,
            ),
        ];
        for (case, machine, secret, adopted) in cases {
            let found = adoptable(&config, &machine, secret.as_ref());
            assert_eq!(found.is_some(), adopted, "{case}");
        }
        let adopt = adoptable(&config, &booted, Some(&secret));
        let cluster = cluster(true, true);
        let taken = path(
            &config,
            &Default::default(),
            &booted,
            &cluster,
            adopt.clone(),
        );
        assert_eq!(
            taken,
            Ok(Path::Frozen {
                role: Role::Worker,
                revision: "r7".into()
            }),
            "adopted as it is: no render, no token"
        );
        let mut not_joined = booted.clone();
        not_joined.status = None;
        let waiting = path(&config, &Default::default(), &not_joined, &cluster, adopt);
        assert_eq!(waiting.unwrap_err().reason, reason::WAITING_FOR_NODE);
    }

    #[test]
    fn the_role_recorded_counts_only_once_the_secret_was_written() {
        assert_eq!(recorded_role(&ready("init")), Some(Role::Init));
        let not_written = BootplateConfigStatus {
            role: Some("init".into()),
            ..Default::default()
        };
        assert_eq!(recorded_role(&not_written), None);
        assert_eq!(recorded_role(&ready("nonsense")), None);
    }

    #[test]
    fn a_cluster_without_endpoint_waits() {
        let mut with = cluster(true, true);
        with.spec.control_plane_endpoint =
            serde_json::from_value(serde_json::json!({"host": "10.0.0.1", "port": 6443})).unwrap();
        assert_eq!(endpoint(&with).unwrap().address(), "10.0.0.1:6443");
        let without = endpoint(&cluster(true, true)).unwrap_err();
        assert_eq!(without.reason, reason::WAITING_FOR_INFRASTRUCTURE);
    }
}
