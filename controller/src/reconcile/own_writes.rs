//! The controller's own writes, so that the watch events they cause do not trigger a
//! reconcile of their own.
//!
//! A config's status apply and its data Secret apply each come back as a watch event. The
//! reconcile that made the write had already acted on everything it read, so the event that
//! holds exactly its write is an echo: a reconcile for it finds nothing to do, and at 20 000
//! configs these made 2.8 reconciles per config out of one. An echo is known by its
//! resourceVersion, which the apiserver gives to that one write only.
//!
//! The event can come before the write's response. So from the start of a write until its
//! response, the object's events are held back; the response's version then tells them apart.
//! If any was someone else's change, the config is triggered again (through the stream
//! [`OwnWrites::channel`] returns); a write that fails or is dropped triggers it too when it
//! held anything back. Only watched `Apply` events are filtered: every object a re-list yields
//! triggers, since a listing may fold someone else's change into the same version.

use std::collections::HashMap;
use std::sync::Mutex;

use crd_types::BootplateConfig;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::runtime::reflector::ObjectRef;

/// What is written. Both are named like their config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum WriteTarget {
    /// A BootplateConfig's status.
    ConfigStatus,
    /// A data Secret.
    DataSecret,
}

/// Each object's write in flight or whose echo has not come yet. An entry goes with the
/// object's next event after the write (echo or not) and with its config's deletion, so the
/// map holds about as many entries as writes are in flight.
#[derive(Debug)]
pub(crate) struct OwnWrites {
    states: Mutex<HashMap<Key, State>>,
    retrigger: UnboundedSender<ObjectRef<BootplateConfig>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    target: WriteTarget,
    namespace: String,
    name: String,
}

#[derive(Debug)]
enum State {
    /// The write is in flight: the versions of the events held back meanwhile.
    Writing(Vec<Option<String>>),
    /// The write made this version; its event has not come yet.
    Written(String),
}

impl Default for OwnWrites {
    /// Writes whose re-triggers go nowhere: for a context no controller runs on.
    fn default() -> Self {
        OwnWrites::channel().0
    }
}

impl OwnWrites {
    /// The record, and the configs to reconcile again because a change of someone else's was
    /// held back during a write (or a write held events back and did not finish).
    pub(crate) fn channel() -> (OwnWrites, UnboundedReceiver<ObjectRef<BootplateConfig>>) {
        let (retrigger, retriggered) = unbounded();
        let own = OwnWrites {
            states: Mutex::new(HashMap::new()),
            retrigger,
        };
        (own, retriggered)
    }

    /// Starts a write of `namespace/name`: its events are held back until
    /// [`Writing::finish`] (or the guard's drop).
    pub(crate) fn start(&self, target: WriteTarget, namespace: &str, name: &str) -> Writing<'_> {
        let key = Key {
            target,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.lock().insert(key.clone(), State::Writing(Vec::new()));
        Writing {
            own: self,
            key: Some(key),
        }
    }

    /// Whether a watched event of `namespace/name` at `version` triggers nothing: it comes
    /// during this controller's write of the object (held back), or it is that write's echo.
    pub(crate) fn is_echo(
        &self,
        target: WriteTarget,
        namespace: &str,
        name: &str,
        version: Option<&str>,
    ) -> bool {
        let key = Key {
            target,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let mut states = self.lock();
        match states.get_mut(&key) {
            None => false,
            Some(State::Writing(held)) => {
                held.push(version.map(str::to_owned));
                true
            }
            Some(State::Written(written)) => {
                let echo = version == Some(written.as_str());
                states.remove(&key);
                echo
            }
        }
    }

    /// Forgets the writes of a deleted config and of its data Secret.
    pub(crate) fn forget(&self, namespace: &str, name: &str) {
        let mut states = self.lock();
        for target in [WriteTarget::ConfigStatus, WriteTarget::DataSecret] {
            states.remove(&Key {
                target,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        }
    }

    /// Ends the write of `key`, which made `version` (`None`: it failed or was dropped).
    fn end(&self, key: Key, version: Option<&str>) {
        let mut states = self.lock();
        let held = match states.remove(&key) {
            Some(State::Writing(held)) => held,
            _ => Vec::new(),
        };
        let someone_elses = held
            .iter()
            .any(|seen| version.is_none() || seen.as_deref() != version);
        match version {
            _ if someone_elses => {
                drop(states);
                let config = format!("{}/{}", key.namespace, key.name);
                tracing::debug!(%config, written = ?version, "a change held back during a write");
                let config = ObjectRef::new(&key.name).within(&key.namespace);
                // Gone only when the controller stops.
                let _ = self.retrigger.unbounded_send(config);
            }
            Some(version) if held.is_empty() => {
                states.insert(key, State::Written(version.to_owned()));
            }
            // The echo came during the write, or nothing was written.
            _ => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, State>> {
        // A panic while holding the lock leaves a map that is still whole.
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A write in flight; dropped without [`Writing::finish`], it ends as failed.
#[derive(Debug)]
pub(crate) struct Writing<'a> {
    own: &'a OwnWrites,
    key: Option<Key>,
}

impl Writing<'_> {
    /// The write made `version` (`None`: the response named none).
    pub(crate) fn finish(mut self, version: Option<&str>) {
        if let Some(key) = self.key.take() {
            self.own.end(key, version);
        }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.own.end(key, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// One step: a write started or finished, an event seen (and whether it triggers nothing),
    /// or a config forgotten.
    enum Step {
        Start(WriteTarget, &'static str),
        Finish(WriteTarget, &'static str, Option<&'static str>),
        Event(WriteTarget, &'static str, Option<&'static str>, bool),
        Forget(&'static str),
    }

    /// Runs `steps` on a fresh record, checking each event; returns the configs triggered
    /// again, in order.
    fn run(case: &str, steps: &[Step]) -> Vec<String> {
        let (own, mut triggers) = OwnWrites::channel();
        let mut writing = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Step::Start(target, name) => writing.push(own.start(target, "ns", name)),
                Step::Finish(target, name, version) => {
                    let at = writing.iter().position(|w: &Writing<'_>| {
                        (w.key.as_ref()).is_some_and(|k| k.target == target && k.name == name)
                    });
                    writing.remove(at.expect("started")).finish(version);
                }
                Step::Event(target, name, version, quiet) => {
                    let got = own.is_echo(target, "ns", name, version);
                    assert_eq!(got, quiet, "{case}: step {i}");
                }
                Step::Forget(name) => own.forget("ns", name),
            }
        }
        assert!(writing.is_empty(), "{case}: every write finished");
        drop(writing);
        drop(own);
        let retriggered = futures::executor::block_on(triggers.by_ref().collect::<Vec<_>>());
        retriggered.into_iter().map(|config| config.name).collect()
    }

    #[test]
    fn the_echo_of_the_version_written_triggers_nothing_once() {
        use Step::*;
        use WriteTarget::*;
        let cases: &[(&str, &[Step])] = &[
            (
                "after the response",
                &[
                    Start(ConfigStatus, "a"),
                    Finish(ConfigStatus, "a", Some("10")),
                    Event(ConfigStatus, "a", Some("10"), true),
                    Event(ConfigStatus, "a", Some("10"), false),
                ],
            ),
            (
                "before the response",
                &[
                    Start(ConfigStatus, "a"),
                    Event(ConfigStatus, "a", Some("10"), true),
                    Finish(ConfigStatus, "a", Some("10")),
                    Event(ConfigStatus, "a", Some("11"), false),
                ],
            ),
            (
                "someone else's change after the write, before the echo: both trigger",
                &[
                    Start(ConfigStatus, "a"),
                    Finish(ConfigStatus, "a", Some("12")),
                    Event(ConfigStatus, "a", Some("11"), false),
                    Event(ConfigStatus, "a", Some("12"), false),
                ],
            ),
            (
                "the kinds and the objects are apart",
                &[
                    Start(DataSecret, "a"),
                    Event(ConfigStatus, "a", Some("13"), false),
                    Event(DataSecret, "b", Some("13"), false),
                    Finish(DataSecret, "a", Some("13")),
                    Event(ConfigStatus, "a", Some("13"), false),
                    Event(DataSecret, "a", Some("13"), true),
                ],
            ),
            (
                "an event without a version is not the echo",
                &[
                    Start(DataSecret, "a"),
                    Finish(DataSecret, "a", Some("14")),
                    Event(DataSecret, "a", None, false),
                ],
            ),
            (
                "a deleted config's writes are forgotten",
                &[
                    Start(ConfigStatus, "c"),
                    Finish(ConfigStatus, "c", Some("15")),
                    Start(DataSecret, "c"),
                    Finish(DataSecret, "c", Some("16")),
                    Forget("c"),
                    Event(ConfigStatus, "c", Some("15"), false),
                    Event(DataSecret, "c", Some("16"), false),
                ],
            ),
        ];
        for (case, steps) in cases {
            assert_eq!(run(case, steps), Vec::<String>::new(), "{case}");
        }
    }

    #[test]
    fn a_change_held_back_during_a_write_triggers_again() {
        use Step::*;
        use WriteTarget::*;
        let cases: &[(&str, &[Step], &[&str])] = &[
            (
                "someone else's change during the write",
                &[
                    Start(ConfigStatus, "a"),
                    Event(ConfigStatus, "a", Some("9"), true),
                    Event(ConfigStatus, "a", Some("10"), true),
                    Finish(ConfigStatus, "a", Some("10")),
                ],
                &["a"],
            ),
            (
                "a failed write that held an event back",
                &[
                    Start(DataSecret, "a"),
                    Event(DataSecret, "a", Some("5"), true),
                    Finish(DataSecret, "a", None),
                    Event(DataSecret, "a", Some("6"), false),
                ],
                &["a"],
            ),
            (
                "a failed write that held nothing back",
                &[Start(DataSecret, "a"), Finish(DataSecret, "a", None)],
                &[],
            ),
            (
                "only the echo held back",
                &[
                    Start(DataSecret, "b"),
                    Event(DataSecret, "b", Some("7"), true),
                    Finish(DataSecret, "b", Some("7")),
                ],
                &[],
            ),
        ];
        for (case, steps, retriggered) in cases {
            assert_eq!(run(case, steps), *retriggered, "{case}");
        }
    }

    #[test]
    fn a_write_dropped_unfinished_ends_and_triggers_again_for_what_it_held() {
        let (own, mut triggers) = OwnWrites::channel();
        let writing = own.start(WriteTarget::ConfigStatus, "ns", "a");
        assert!(own.is_echo(WriteTarget::ConfigStatus, "ns", "a", Some("3")));
        drop(writing);
        assert_eq!(own.len(), 0, "nothing held back once the write is gone");
        assert!(!own.is_echo(WriteTarget::ConfigStatus, "ns", "a", Some("4")));
        let _ = own.start(WriteTarget::ConfigStatus, "ns", "b");
        drop(own);
        let got: Vec<String> = futures::executor::block_on(triggers.by_ref().collect::<Vec<_>>())
            .into_iter()
            .map(|config| config.name)
            .collect();
        assert_eq!(got, ["a"]);
    }

    #[test]
    fn namespaces_are_apart() {
        let (own, _triggers) = OwnWrites::channel();
        own.start(WriteTarget::ConfigStatus, "one", "a")
            .finish(Some("7"));
        assert!(!own.is_echo(WriteTarget::ConfigStatus, "two", "a", Some("7")));
        assert!(own.is_echo(WriteTarget::ConfigStatus, "one", "a", Some("7")));
    }
}
