//! The init lock: ConfigMap `<cluster>-lock` naming the Machine that renders `init`. When to
//! take, wait for, take over or release it is the core's decision (`core::role`).

use std::collections::BTreeMap;

use crd_types::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};

use crate::core::role::{self, LockVerdict};
use crate::error::{Result, is_conflict, is_not_found};
use crate::k8s::stores::Stores;

/// The key in the lock ConfigMap naming the holder Machine.
const HOLDER_KEY: &str = "machine";

fn lock_name(cluster: &Cluster) -> String {
    format!("{}-lock", cluster.name_any())
}

fn lock(cluster: &Cluster, holder: &str) -> ConfigMap {
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
        data: Some(BTreeMap::from([(HOLDER_KEY.into(), holder.to_owned())])),
        ..Default::default()
    }
}

/// Takes the init lock for `machine`, or fails with `WaitingForInitLock`.
pub(crate) async fn acquire(
    client: &Client,
    stores: &Stores,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let name = lock_name(cluster);
    let me = machine.name_any();
    // Two rounds: the second runs after removing a lock whose holder is gone.
    for _ in 0..2 {
        match api
            .create(&PostParams::default(), &lock(cluster, &me))
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
        let holder = existing
            .data
            .as_ref()
            .and_then(|d| d.get(HOLDER_KEY))
            .cloned()
            .unwrap_or_default();
        let holder_exists = stores.machine(&namespace, &holder).is_some();
        match role::judge_lock(&holder, &me, holder_exists, &cluster.name_any()) {
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

/// Releases the init lock. Missing locks are fine.
pub(crate) async fn release(client: &Client, cluster: &Cluster) -> Result<()> {
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
