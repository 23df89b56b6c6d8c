//! Kubernetes Events on configs and templates.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Client, Resource};
use tracing::warn;

/// Creates `events.k8s.io/v1` Events, one request each, remembering nothing. (kube's
/// `Recorder` keeps every event it published for six minutes to count repeats into a series;
/// bootplate publishes an event when something changes, not repeatedly, and at thousands of
/// configs that cache was a fifth of the controller's memory.)
pub struct Publisher {
    client: Client,
    controller: String,
    instance: String,
}

impl Publisher {
    /// Events reported by `controller` from `instance` (the pod's name; the controller's
    /// name when unknown).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Publisher {
            client,
            instance: instance.unwrap_or_else(|| controller.to_owned()),
            controller: controller.to_owned(),
        }
    }

    async fn create(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
        regarding: ObjectReference,
    ) -> kube::Result<()> {
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let event = Event {
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
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
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
    }
}

/// The apiserver rejects event notes above 1 KiB.
const MAX_NOTE: usize = 1000;

/// Publishes an event about `object`; failures are logged, never fatal.
pub async fn publish<K>(
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
    if let Err(e) = publisher
        .create(type_, reason, action, note, object.object_ref(&()))
        .await
    {
        warn!(error = %e, "cannot publish event");
    }
}
