//! Kubernetes Events on configs and templates.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Client, Resource};
use tracing::warn;

use crate::core::pace::{Bucket, EventPace};

/// How many Events may wait for delivery; more are dropped (and counted). A rollout larger than
/// that outruns the apiserver's pace for Events anyway, and each waiting one is memory: 4096
/// queued [`Pending`] Events are about 2 MB.
const QUEUE: usize = 4096;

/// An Event waiting for delivery: what differs from one Event to the next. The Event itself,
/// about three times larger with its empty fields, is built when it is sent.
struct Pending {
    type_: EventType,
    reason: String,
    action: String,
    note: String,
    regarding: ObjectReference,
    time: Timestamp,
}

/// Creates `events.k8s.io/v1` Events, remembering nothing. (kube's `Recorder` keeps every event
/// it published for six minutes to count repeats into a series; bootplate publishes an event
/// when something changes, not repeatedly, and at thousands of configs that cache was a fifth
/// of the controller's memory.)
///
/// Events are delivered by one background task, one at a time, off the reconciles' path: a
/// reconcile's status and Secret writes never wait behind an Event, and during a rollout of
/// thousands of machines the Events follow at the pace the apiserver allows instead of slowing
/// every machine down. Like client-go's recorder, delivery is best effort: an Event is dropped
/// when the queue is full or the apiserver refuses it, and the metrics count both. Normal
/// Events also pass a pace (`core::pace`, `--event-qps` and `--event-burst`): past it they are
/// dropped and counted as limited; Warnings are not paced.
pub struct Publisher {
    queue: tokio::sync::mpsc::Sender<Pending>,
    pace: std::sync::Mutex<Bucket>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl Publisher {
    /// Events reported by `controller` from `instance` (the pod's name; the controller's
    /// name when unknown), Normal ones at most at `pace`. Spawns the delivery task: call within
    /// a Tokio runtime.
    pub fn new(
        client: Client,
        controller: &str,
        instance: Option<String>,
        pace: EventPace,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Self {
        let (queue, pending) = tokio::sync::mpsc::channel(QUEUE);
        let reporter = Reporter {
            instance: instance.unwrap_or_else(|| controller.to_owned()),
            controller: controller.to_owned(),
        };
        tokio::spawn(deliver(client, pending, reporter, metrics.clone()));
        let pace = std::sync::Mutex::new(Bucket::new(pace));
        Publisher {
            queue,
            pace,
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
        if type_ == EventType::Normal
            && !self
                .pace
                .lock()
                .expect("lock")
                .take(std::time::Instant::now())
        {
            self.metrics.event_limited();
            return;
        }
        let pending = Pending {
            type_,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note,
            regarding,
            time: Timestamp::now(),
        };
        match self.queue.try_send(pending) {
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

/// Who reports the Events: the controller's name, and the instance (pod) it runs as.
struct Reporter {
    controller: String,
    instance: String,
}

/// The Event `pending`, as `reporter` reports it.
fn event(pending: Pending, reporter: &Reporter) -> Event {
    let Pending {
        type_,
        reason,
        action,
        note,
        regarding,
        time,
    } = pending;
    // An Event about a cluster-scoped object (a ClusterBootstrapTemplate) must live in
    // kube-system: the apiserver refuses events.k8s.io Events in any other namespace for it.
    let namespace = regarding
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "kube-system".into());
    Event {
        action: Some(action),
        reason: Some(reason),
        event_time: Some(MicroTime(time)),
        note: Some(note),
        metadata: ObjectMeta {
            namespace: Some(namespace),
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or(&reporter.controller),
                time.as_nanosecond()
            )),
            ..Default::default()
        },
        regarding: Some(regarding),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone()),
        type_: Some(
            match type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        ..Default::default()
    }
}

/// Creates the queued Events one after another until the publisher is dropped.
async fn deliver(
    client: Client,
    mut pending: tokio::sync::mpsc::Receiver<Pending>,
    reporter: Reporter,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    while let Some(next) = pending.recv().await {
        let event = event(next, &reporter);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(namespace: Option<&str>) -> Pending {
        Pending {
            type_: EventType::Warning,
            reason: "Failed".into(),
            action: "Render".into(),
            note: "template broken".into(),
            regarding: ObjectReference {
                kind: Some("BootplateConfig".into()),
                name: Some("w-0".into()),
                namespace: namespace.map(str::to_owned),
                ..Default::default()
            },
            time: Timestamp::from_second(1_800_000_000).unwrap(),
        }
    }

    #[test]
    fn a_queued_event_is_sent_as_the_whole_event() {
        let reporter = Reporter {
            controller: "bootplate".into(),
            instance: "bootplate-7d9f".into(),
        };
        let event = event(pending(Some("ns")), &reporter);
        assert_eq!(event.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(
            event.metadata.name,
            Some(format!("w-0.{:x}", 1_800_000_000_000_000_000_i128))
        );
        assert_eq!(
            (
                event.type_.as_deref(),
                event.reason.as_deref(),
                event.action.as_deref(),
                event.note.as_deref()
            ),
            (
                Some("Warning"),
                Some("Failed"),
                Some("Render"),
                Some("template broken")
            )
        );
        assert_eq!(event.regarding.and_then(|r| r.name).as_deref(), Some("w-0"));
        assert_eq!(event.reporting_controller.as_deref(), Some("bootplate"));
        assert_eq!(event.reporting_instance.as_deref(), Some("bootplate-7d9f"));
        assert_eq!(
            event.event_time.map(|t| t.0),
            Some(Timestamp::from_second(1_800_000_000).unwrap())
        );
        // A cluster-scoped object's Events live in kube-system.
        let cluster_scoped = super::event(pending(None), &reporter);
        assert_eq!(
            cluster_scoped.metadata.namespace.as_deref(),
            Some("kube-system")
        );
    }

    #[test]
    fn a_queued_event_is_a_fraction_of_an_event() {
        // The queue holds thousands of them during a large rollout.
        assert!(std::mem::size_of::<Pending>() * 2 < std::mem::size_of::<Event>());
    }
}
