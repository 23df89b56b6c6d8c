//! Reconcile triggers from reflected watch streams, released only once the store holds what
//! they announce, and deletions, including those a re-list reveals.
//!
//! A watcher that re-lists (after `410 Gone`, or a watch the apiserver ended) emits `Init`,
//! one `InitApply` per object, then `InitDone`; the reflector fills a side buffer and swaps it
//! into the store only at `InitDone`. A reconcile triggered by an `InitApply` therefore runs
//! against the store from before the re-list: an object created during the gap is "not found"
//! and the request is dropped, one changed during the gap is read in its old state. Nothing
//! triggers it again, so such a config waited forever. Holding re-listed objects back until
//! `InitDone` closes that window.
//!
//! An object deleted while the watch was down has no `Delete` event: it is simply absent from
//! the re-list. Comparing the store before and after the re-list finds it, so it is reported
//! like any deletion.

use std::sync::Arc;

use futures::future::{Either, ready};
use futures::{Stream, StreamExt, TryStreamExt, stream};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

/// Whether deleted objects trigger too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletions {
    /// Like `WatchStreamExt::applied_objects`.
    Skip,
    /// Like `WatchStreamExt::touched_objects`.
    Include,
}

/// The objects of `events` (a stream already passed through `.reflect(writer)` of `store`) to
/// trigger reconciles on: applied (and, if asked, deleted) objects as they come, re-listed ones
/// at the end of their listing, read back from `store` one at a time so a re-list of thousands
/// of objects holds only their references. `deleted` is called with every deleted object,
/// whether its deletion was watched or found by a re-list.
pub fn settled<K, E>(
    events: impl Stream<Item = Result<Event<K>, E>> + Send + 'static,
    store: Store<K>,
    deletions: Deletions,
    deleted: impl Fn(&K) + Send + 'static,
) -> impl Stream<Item = Result<K, E>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    E: Send + 'static,
{
    let nothing = || Either::Left(stream::iter(Vec::new()));
    // During a re-list: the references listed so far, and the store as it was before (the
    // same objects the store held, not copies).
    let mut listing: Vec<ObjectRef<K>> = Vec::new();
    let mut before: Vec<Arc<K>> = Vec::new();
    events
        .map_ok(move |event| match event {
            Event::Apply(object) => Either::Left(stream::iter(vec![Ok(object)])),
            Event::Delete(object) => {
                deleted(&object);
                match deletions {
                    Deletions::Include => Either::Left(stream::iter(vec![Ok(object)])),
                    Deletions::Skip => nothing(),
                }
            }
            Event::Init => {
                listing.clear();
                // The reflector only starts a side buffer on Init: the store is still the old one.
                before = store.state();
                nothing()
            }
            Event::InitApply(object) => {
                listing.push(ObjectRef::from_obj(&object));
                nothing()
            }
            Event::InitDone => {
                let gone: Vec<Result<K, E>> = std::mem::take(&mut before)
                    .into_iter()
                    .filter(|old| store.get(&ObjectRef::from_obj(old.as_ref())).is_none())
                    .filter_map(|old| {
                        deleted(&old);
                        (deletions == Deletions::Include).then(|| Ok((*old).clone()))
                    })
                    .collect();
                let store = store.clone();
                let listed = stream::iter(std::mem::take(&mut listing))
                    .filter_map(move |key| ready(store.get(&key).map(|o| Ok((*o).clone()))));
                Either::Right(stream::iter(gone).chain(listed))
            }
        })
        .try_flatten()
}

/// The backoff for a Controller's merged trigger streams: none.
///
/// kube-runtime's `Controller` pauses all of its triggers after an error from any one trigger
/// stream, with one exponential backoff shared by all of them. Every watch stream here already
/// backs off on its own errors (`default_backoff()`), so the shared pause only silenced the
/// healthy streams: after an apiserver restart each watcher's errors (refused connections, then
/// `410 Gone`) doubled it, and the controller heard nothing for up to half a minute at a time.
pub struct NoSharedBackoff;

impl Iterator for NoSharedBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        Some(std::time::Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for NoSharedBackoff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::reflector;

    fn config_map(name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Runs `events` through a real reflector and `settled`, and records for every trigger
    /// the resource version the store held for that object at the moment it was emitted.
    async fn triggers(
        events: Vec<Event<ConfigMap>>,
        deletions: Deletions,
    ) -> Vec<(String, String, Option<String>)> {
        triggers_and_deletions(events, deletions).await.0
    }

    /// Also the names `settled` reported deleted.
    async fn triggers_and_deletions(
        events: Vec<Event<ConfigMap>>,
        deletions: Deletions,
    ) -> (Vec<(String, String, Option<String>)>, Vec<String>) {
        let deleted = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = deleted.clone();
        let (store, mut writer) = reflector::store::<ConfigMap>();
        // The store as the first listing left it, before the events under test.
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(config_map("old", "1")));
        writer.apply_watcher_event(&Event::InitApply(config_map("changed", "1")));
        writer.apply_watcher_event(&Event::InitDone);
        let reflected = stream::iter(
            events
                .into_iter()
                .map(Ok::<_, kube::runtime::watcher::Error>),
        )
        .reflect(writer);
        let seen = settled(
            reflected,
            store.clone(),
            deletions,
            move |gone: &ConfigMap| {
                record
                    .lock()
                    .unwrap()
                    .push(gone.metadata.name.clone().unwrap())
            },
        )
        .map(|object| {
            let object = object.unwrap();
            let stored = store
                .get(&ObjectRef::from_obj(&object))
                .and_then(|o| o.metadata.resource_version.clone());
            (
                object.metadata.name.clone().unwrap(),
                object.metadata.resource_version.clone().unwrap(),
                stored,
            )
        })
        .collect()
        .await;
        let deleted = deleted.lock().unwrap().clone();
        (seen, deleted)
    }

    #[tokio::test]
    async fn relisted_objects_trigger_only_once_the_store_holds_them() {
        let seen = triggers(
            vec![
                Event::Init,
                Event::InitApply(config_map("changed", "7")),
                Event::InitApply(config_map("created-in-the-gap", "8")),
                Event::InitDone,
            ],
            Deletions::Skip,
        )
        .await;
        assert_eq!(
            seen,
            vec![
                ("changed".into(), "7".into(), Some("7".into())),
                ("created-in-the-gap".into(), "8".into(), Some("8".into())),
            ]
        );
    }

    #[tokio::test]
    async fn watch_events_pass_through_and_deletions_only_when_asked() {
        let events = || {
            vec![
                Event::Apply(config_map("changed", "2")),
                Event::Delete(config_map("old", "3")),
                Event::Apply(config_map("new", "4")),
            ]
        };
        let skipped = triggers(events(), Deletions::Skip).await;
        assert_eq!(
            skipped,
            vec![
                ("changed".into(), "2".into(), Some("2".into())),
                ("new".into(), "4".into(), Some("4".into())),
            ]
        );
        let included = triggers(events(), Deletions::Include).await;
        assert_eq!(
            included,
            vec![
                ("changed".into(), "2".into(), Some("2".into())),
                ("old".into(), "3".into(), None),
                ("new".into(), "4".into(), Some("4".into())),
            ]
        );
    }

    #[tokio::test]
    async fn a_relist_ended_by_an_error_releases_nothing_until_the_next_one_completes() {
        // The watcher restarts a failed listing from Init; what the first attempt announced
        // is not released, the second attempt's objects are.
        let seen = triggers(
            vec![
                Event::Init,
                Event::InitApply(config_map("half", "5")),
                Event::Init,
                Event::InitApply(config_map("whole", "6")),
                Event::InitDone,
            ],
            Deletions::Skip,
        )
        .await;
        assert_eq!(seen, vec![("whole".into(), "6".into(), Some("6".into()))]);
    }

    #[tokio::test]
    async fn objects_gone_from_a_relist_are_reported_deleted() {
        // "old" was deleted while the watch was down: the re-list lacks it.
        let relist = || {
            vec![
                Event::Init,
                Event::InitApply(config_map("changed", "9")),
                Event::InitDone,
            ]
        };
        let (seen, deleted) = triggers_and_deletions(relist(), Deletions::Include).await;
        assert_eq!(
            seen,
            vec![
                ("old".into(), "1".into(), None),
                ("changed".into(), "9".into(), Some("9".into())),
            ]
        );
        assert_eq!(deleted, vec!["old".to_owned()]);
        let (seen, deleted) = triggers_and_deletions(relist(), Deletions::Skip).await;
        assert_eq!(seen, vec![("changed".into(), "9".into(), Some("9".into()))]);
        assert_eq!(
            deleted,
            vec!["old".to_owned()],
            "reported even when not a trigger"
        );
    }

    #[tokio::test]
    async fn watched_deletions_are_reported_whether_or_not_they_trigger() {
        for deletions in [Deletions::Skip, Deletions::Include] {
            let (_, deleted) =
                triggers_and_deletions(vec![Event::Delete(config_map("old", "3"))], deletions)
                    .await;
            assert_eq!(deleted, vec!["old".to_owned()]);
        }
    }
}
