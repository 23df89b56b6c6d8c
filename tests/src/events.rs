//! The Kubernetes Events bootplate publishes about an object, as an operator reads them
//! (`kubectl events --for`): one place for every tier that asserts what an Event says.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::{Api, Client};

use crate::eventually;

/// How long to wait for an Event once the test knows its cause happened (a condition seen, a
/// render done): bootplate publishes it in the same reconcile, so this is only load headroom.
pub const EVENT_WAIT: Duration = Duration::from_secs(60);

/// The Events in `namespace` (cluster-scoped objects' Events live in `default`; `None` lists
/// every namespace) regarding an object named `name`; empty when they cannot be listed.
pub async fn regarding(client: &Client, namespace: Option<&str>, name: &str) -> Vec<Event> {
    let api: Api<Event> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let Ok(list) = api.list(&Default::default()).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// Waits (up to [`EVENT_WAIT`]) for an Event regarding `name` in `namespace` that `matches`
/// says is the one; returns it. The panic of a timeout names `what`.
pub async fn wait_for(
    client: &Client,
    namespace: Option<&str>,
    name: &str,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) -> Event {
    let what = format!("{what} (an Event regarding {name})");
    eventually(&what, EVENT_WAIT, || async {
        regarding(client, namespace, name)
            .await
            .into_iter()
            .find(|e| matches(e))
    })
    .await
}

/// Waits for the Event with `reason` regarding `name` in `namespace`; returns it.
pub async fn wait_reason(client: &Client, namespace: &str, name: &str, reason: &str) -> Event {
    wait_for(client, Some(namespace), name, reason, |e| {
        e.reason.as_deref() == Some(reason)
    })
    .await
}
