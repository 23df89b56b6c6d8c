//! kube-controller-manager with the two controllers a management cluster's objects rely on: the
//! garbage collector (what ownerReferences say is orphaned goes; bootplate's data Secrets rely
//! on it) and ClusterRole aggregation (Cluster API's role is the union of the roles labelled
//! `cluster.x-k8s.io/aggregate-to-manager`, bootplate's among them).
//!
//! It serves nothing the tests use, so it binds no port (`--secure-port=0`: no port to lose to
//! another process), and "it started" is shown by what it does: an aggregated ClusterRole gets
//! its rules and a ConfigMap whose owner is deleted is collected, while the process still runs.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::Process;
use crate::{ApiServer, tools};

/// The label the probe's aggregated role selects.
const PROBE_LABEL: &str = "bootplate.dev/controller-manager-probe";
/// The names of the probe's objects.
const PROBE: &str = "bootplate-tests-controller-manager-probe";
/// How long the controllers may take to act after the process starts.
const WAIT: Duration = Duration::from_secs(90);

/// Starts kube-controller-manager for `server` and returns once both of its controllers have
/// acted; fails with its log when it exits or does not act in time.
pub async fn start(server: &ApiServer, client: &Client) -> anyhow::Result<Process> {
    let process = Process::spawn(
        "kube-controller-manager",
        Command::new(tools::path("kube-controller-manager")?)
            .arg(format!(
                "--kubeconfig={}",
                server.kubeconfig_path()?.display()
            ))
            .arg("--controllers=garbagecollector,clusterrole-aggregation")
            .arg("--leader-elect=false")
            .arg("--secure-port=0"),
        &server.dir().join("kube-controller-manager.log"),
    )?;
    wait_acting(process, client).await
}

/// Creates the probe objects and waits until both controllers have handled them.
async fn wait_acting(mut process: Process, client: &Client) -> anyhow::Result<Process> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(aggregated_role())?,
        )
        .await?;
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(labelled_role())?,
        )
        .await?;
    let owner = config_maps
        .create(&PostParams::default(), &config_map(PROBE, None))
        .await?;
    let dependent = format!("{PROBE}-dependent");
    config_maps
        .create(
            &PostParams::default(),
            &config_map(&dependent, Some(&owner)),
        )
        .await?;
    config_maps
        .delete(PROBE, &DeleteParams::background())
        .await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let aggregated = roles
            .get(PROBE)
            .await?
            .rules
            .is_some_and(|rules| !rules.is_empty());
        let collected = config_maps.get_opt(&dependent).await?.is_none();
        if aggregated && collected {
            break;
        }
        if process.exited() {
            bail!("kube-controller-manager exited:\n{}", process.log_tail(40));
        }
        if Instant::now() > deadline {
            bail!(
                "kube-controller-manager runs but did not act in {WAIT:?} (role aggregated: \
                 {aggregated}, orphan collected: {collected}):\n{}",
                process.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for name in [PROBE.to_owned(), format!("{PROBE}-rules")] {
        roles.delete(&name, &DeleteParams::default()).await?;
    }
    Ok(process)
}

/// A ClusterRole whose rules are the union of those labelled [`PROBE_LABEL`].
fn aggregated_role() -> serde_json::Value {
    json!({
        "metadata": {"name": PROBE},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {PROBE_LABEL: "true"}}]},
    })
}

fn labelled_role() -> serde_json::Value {
    json!({
        "metadata": {"name": format!("{PROBE}-rules"), "labels": {PROBE_LABEL: "true"}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    })
}

/// A ConfigMap in `default`, owned by `owner` when given.
fn config_map(name: &str, owner: Option<&ConfigMap>) -> ConfigMap {
    use kube::Resource;
    let mut config_map = ConfigMap {
        data: Some(BTreeMap::from([("probe".to_owned(), "1".to_owned())])),
        ..Default::default()
    };
    config_map.metadata.name = Some(name.to_owned());
    if let Some(owner) = owner {
        config_map.metadata.owner_references = owner.controller_owner_ref(&()).map(|o| vec![o]);
    }
    config_map
}
