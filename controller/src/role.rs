//! Which role a machine renders with, and the init lock.
//!
//! The first control-plane machine of a Cluster renders `init`; the lock (ConfigMap
//! `<cluster>-lock`) makes sure exactly one does, even when all are created at once. The lock
//! is released once the Cluster reports its control plane initialized, or taken over when its
//! holder Machine is gone.

use std::collections::BTreeMap;

use crd_types::Role;
use crd_types::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use crd_types::conditions::reason;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};

use crate::context::Stores;
use crate::error::{Error, Result, is_conflict, is_not_found};

/// The key in the lock ConfigMap naming the holder Machine.
const HOLDER_KEY: &str = "machine";

/// The role `machine` renders with. `recorded` is the role a previous render used: a machine
/// keeps its role (the `init` machine stays `init` after the control plane comes up).
pub async fn decide(
    client: &Client,
    stores: &Stores,
    cluster: &Cluster,
    machine: &Machine,
    recorded: Option<Role>,
) -> Result<Role> {
    if let Some(role) = recorded {
        return Ok(role);
    }
    let initialized = cluster.control_plane_initialized();
    if !machine.is_control_plane() {
        return if initialized {
            Ok(Role::Worker)
        } else {
            Err(Error::waiting(
                reason::WAITING_FOR_CONTROL_PLANE,
                format!(
                    "waiting for the control plane of Cluster {} to be initialized",
                    cluster.name_any()
                ),
            ))
        };
    }
    if initialized {
        return Ok(Role::ControlPlaneJoin);
    }
    acquire_init_lock(client, stores, cluster, machine).await?;
    Ok(Role::Init)
}

fn lock_name(cluster: &Cluster) -> String {
    format!("{}-lock", cluster.name_any())
}

/// Takes the init lock for `machine`, or fails with `WaitingForInitLock`.
async fn acquire_init_lock(
    client: &Client,
    stores: &Stores,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let name = lock_name(cluster);
    let me = machine.name_any();
    let lock = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.into(),
                cluster.name_any(),
            )])),
            owner_references: cluster.controller_owner_ref(&()).map(|mut r| {
                r.controller = Some(false);
                vec![r]
            }),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(HOLDER_KEY.into(), me.clone())])),
        ..Default::default()
    };
    // Two rounds: the second runs after removing a lock whose holder is gone.
    for _ in 0..2 {
        match api.create(&PostParams::default(), &lock).await {
            Ok(_) => return Ok(()),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
        let existing = match api.get(&name).await {
            Ok(existing) => existing,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        let holder = existing
            .data
            .as_ref()
            .and_then(|d| d.get(HOLDER_KEY))
            .cloned()
            .unwrap_or_default();
        if holder == me {
            return Ok(());
        }
        if stores.machine(&namespace, &holder).is_some() {
            return Err(Error::waiting(
                reason::WAITING_FOR_INIT_LOCK,
                format!(
                    "Machine {holder} is initializing the control plane of Cluster {}",
                    cluster.name_any()
                ),
            ));
        }
        // The holder is gone: remove its lock (only that exact object) and try again.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: existing.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::waiting(
        reason::WAITING_FOR_INIT_LOCK,
        format!(
            "the init lock of Cluster {} is contended",
            cluster.name_any()
        ),
    ))
}

/// Releases the init lock once the control plane is initialized. Missing locks are fine.
pub async fn release_init_lock(client: &Client, cluster: &Cluster) -> Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    match api
        .delete(&lock_name(cluster), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
