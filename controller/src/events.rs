//! Kubernetes Events on configs and templates.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

/// The apiserver rejects event notes above 1 KiB.
const MAX_NOTE: usize = 1000;

/// Publishes an event about `object`; failures are logged, never fatal.
pub async fn publish<K>(
    recorder: &Recorder,
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
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &object.object_ref(&())).await {
        warn!(error = %e, "cannot publish event");
    }
}
