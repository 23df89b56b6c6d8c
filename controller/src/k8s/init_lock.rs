//! The init lock: ConfigMap `<cluster>-lock` naming the Machine that renders `init` (its name
//! and UID) and whether that Machine was handed its `init` data yet. When to take, wait for,
//! take over or release it is the core's decision (`core::role`).

use std::collections::BTreeMap;

use crd_types::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::info;

use crate::core::role::{self, Claimant, LockHolder, LockVerdict};
use crate::error::{Result, is_conflict, is_not_found};
use crate::k8s::stores::Stores;

/// The key in the lock ConfigMap naming the holder Machine.
const HOLDER_KEY: &str = "machine";
/// The key holding the holder Machine's UID.
const HOLDER_UID_KEY: &str = "machineUID";
/// The key saying whether the holder was handed its `init` data (`"true"` or `"false"`).
const HANDED_OUT_KEY: &str = "initDataHandedOut";

fn lock_name(cluster: &Cluster) -> String {
    format!("{}-lock", cluster.name_any())
}

/// The ConfigMaps of `cluster`'s namespace, where its lock lives.
fn locks(client: &Client, cluster: &Cluster) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), &cluster.namespace().unwrap_or_default())
}

/// `machine` as the lock names it.
fn claimant(machine: &Machine) -> Claimant<'_> {
    let meta = machine.meta();
    Claimant {
        name: meta.name.as_deref().unwrap_or_default(),
        uid: meta.uid.as_deref().unwrap_or_default(),
    }
}

fn lock(cluster: &Cluster, holder: &Machine) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(lock_name(cluster)),
            namespace: cluster.namespace(),
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
        data: Some(BTreeMap::from([
            (HOLDER_KEY.into(), claimant(holder).name.into()),
            (HOLDER_UID_KEY.into(), claimant(holder).uid.into()),
            (HANDED_OUT_KEY.into(), "false".into()),
        ])),
        ..Default::default()
    }
}

/// The holder as `lock` records it.
fn holder_of(lock: &ConfigMap) -> LockHolder<'_> {
    let value = |key: &str| {
        lock.data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(String::as_str)
    };
    LockHolder {
        name: value(HOLDER_KEY).unwrap_or_default(),
        uid: value(HOLDER_UID_KEY).filter(|uid| !uid.is_empty()),
        handed_out: value(HANDED_OUT_KEY).map(|v| v != "false"),
    }
}

/// Whether the cache holds the Machine `holder` names (with its UID, when recorded).
fn holder_present(stores: &Stores, namespace: &str, holder: &LockHolder<'_>) -> bool {
    stores
        .machine(namespace, holder.name)
        .is_some_and(|m| holder.uid.is_none_or(|uid| m.uid().as_deref() == Some(uid)))
}

/// Takes the init lock for `machine`, or fails with `WaitingForInitLock`.
pub(crate) async fn acquire(
    client: &Client,
    stores: &Stores,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api = locks(client, cluster);
    let name = lock_name(cluster);
    let me = claimant(machine);
    // Two rounds: the second runs after removing a lock whose holder is gone.
    for _ in 0..2 {
        match api
            .create(&PostParams::default(), &lock(cluster, machine))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
        let existing = match api.get(&name).await {
            Ok(existing) => existing,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        let holder = holder_of(&existing);
        let present = holder_present(stores, &namespace, &holder);
        let shown = format!("{namespace}/{name}");
        match role::judge_lock(holder, me, present, &shown, &cluster.name_any()) {
            LockVerdict::Ours => return Ok(()),
            LockVerdict::Wait(blocked) => return Err(blocked.into()),
            LockVerdict::TakeOver => remove_exactly(&api, &existing).await?,
        }
    }
    Err(role::lock_contended(&cluster.name_any()).into())
}

/// Removes `lock`, only that exact object (not one another machine created since).
async fn remove_exactly(api: &Api<ConfigMap>, lock: &ConfigMap) -> Result<()> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: lock.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&lock.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Records in the init lock that its holder `machine` is being handed its `init` data, before
/// that data is written: from then on the lock is not taken over when the Machine is gone
/// (`core::role::judge_lock`). A lock that is gone (released) or names another Machine is left
/// as it is.
pub(crate) async fn record_handed_out(
    client: &Client,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<()> {
    let api = locks(client, cluster);
    let Some(mut existing) = api.get_opt(&lock_name(cluster)).await? else {
        return Ok(());
    };
    let holder = holder_of(&existing);
    if !holder.is(claimant(machine)) || holder.handed_out == Some(true) {
        return Ok(());
    }
    existing
        .data
        .get_or_insert_default()
        .insert(HANDED_OUT_KEY.into(), "true".into());
    // A replace carries the resourceVersion read: a lock changed since is not overwritten.
    api.replace(&existing.name_any(), &PostParams::default(), &existing)
        .await?;
    info!(cluster = %cluster.name_any(), "init lock records the init data as handed out");
    Ok(())
}

/// Releases the init lock. Missing locks are fine.
pub(crate) async fn release(client: &Client, cluster: &Cluster) -> Result<()> {
    match locks(client, cluster)
        .delete(&lock_name(cluster), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
