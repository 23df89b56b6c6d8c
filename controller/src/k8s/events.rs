//! Kubernetes Events on configs and templates.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Client, Resource};
use tracing::warn;

/// How many Events may wait for delivery; more are dropped (and counted).
const QUEUE: usize = 8192;

/// Creates `events.k8s.io/v1` Events, remembering nothing. (kube's `Recorder` keeps every event
/// it published for six minutes to count repeats into a series; bootplate publishes an event
/// when something changes, not repeatedly, and at thousands of configs that cache was a fifth
/// of the controller's memory.)
///
/// Events are delivered by one background task, one at a time, off the reconciles' path: a
/// reconcile's status and Secret writes never wait behind an Event, and during a rollout of
/// thousands of machines the Events follow at the pace the apiserver allows instead of slowing
/// every machine down. Like client-go's recorder, delivery is best effort: an Event is dropped
/// when the queue is full or the apiserver refuses it, and the metrics count both.
pub struct Publisher {
    queue: tokio::sync::mpsc::Sender<Event>,
    controller: String,
    instance: String,
    metrics: std::sync::Arc<crate::runtime::metrics::Metrics>,
}

impl Publisher {
    /// Events reported by `controller` from `instance` (the pod's name; the controller's
    /// name when unknown). Spawns the delivery task: call within a Tokio runtime.
    pub fn new(
        client: Client,
        controller: &str,
        instance: Option<String>,
        metrics: std::sync::Arc<crate::runtime::metrics::Metrics>,
    ) -> Self {
        let (queue, pending) = tokio::sync::mpsc::channel(QUEUE);
        tokio::spawn(deliver(client, pending, metrics.clone()));
        Publisher {
            queue,
            instance: instance.unwrap_or_else(|| controller.to_owned()),
            controller: controller.to_owned(),
            metrics,
        }
    }

    /// Waits, at most `within`, until every queued Event was delivered or refused; returns how
    /// many were still waiting. A stopping controller calls it so the Events of its last
    /// reconciles are not lost with the process.
    pub async fn flush(&self, within: std::time::Duration) -> i64 {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let waiting = self.metrics.events_waiting();
            if waiting <= 0 || tokio::time::Instant::now() >= deadline {
                return waiting.max(0);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    fn enqueue(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
        regarding: ObjectReference,
    ) {
        let now = Timestamp::now();
        // An Event about a cluster-scoped object (a ClusterBootstrapTemplate) must live in
        // kube-system: the apiserver refuses events.k8s.io Events in any other namespace for it.
        let namespace = regarding
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "kube-system".into());
        let event = Event {
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: Some(namespace),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..Default::default()
        };
        match self.queue.try_send(event) {
            Ok(()) => self.metrics.event_queued(),
            Err(_) => {
                // A full queue means thousands of drops: warn on one in a thousand.
                if self.metrics.event_dropped() % 1000 == 1 {
                    warn!("event queue full: dropping events until it drains");
                }
            }
        }
    }
}

/// Creates the queued Events one after another until the publisher is dropped.
async fn deliver(
    client: Client,
    mut pending: tokio::sync::mpsc::Receiver<Event>,
    metrics: std::sync::Arc<crate::runtime::metrics::Metrics>,
) {
    while let Some(event) = pending.recv().await {
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let result = Api::<Event>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await;
        metrics.event_delivered(result.is_ok());
        if let Err(e) = result {
            warn!(error = %e, reason = event.reason.as_deref().unwrap_or_default(), "cannot publish event");
        }
    }
}

/// The apiserver rejects event notes above 1 KiB.
const MAX_NOTE: usize = 1000;

/// Publishes an event about `object` (queued; failures are logged and counted, never fatal).
pub fn publish<K>(
    publisher: &Publisher,
    object: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    mut note: String,
) where
    K: Resource<DynamicType = ()>,
{
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    publisher.enqueue(type_, reason, action, note, object.object_ref(&()));
}
