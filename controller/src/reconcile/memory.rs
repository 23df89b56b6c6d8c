//! What the controller remembers per config, by UID, between reconciles.

use std::collections::{HashMap, HashSet};

/// Entries by config UID. A config deleted without a reconcile seeing it go leaves its entry
/// behind; such entries are dropped when the memory has doubled since it was last pruned, so
/// pruning (which lists the live configs) costs constant time per insertion on average.
#[derive(Debug)]
pub struct ByConfig<V> {
    entries: HashMap<String, V>,
    prune_at: usize,
}

/// Pruning never runs below this many entries.
const FLOOR: usize = 64;

impl<V> Default for ByConfig<V> {
    fn default() -> Self {
        ByConfig {
            entries: HashMap::new(),
            prune_at: FLOOR,
        }
    }
}

impl<V> ByConfig<V> {
    /// The entry of config `uid`.
    pub fn get(&self, uid: &str) -> Option<&V> {
        self.entries.get(uid)
    }

    /// Forgets config `uid`.
    pub fn remove(&mut self, uid: &str) {
        self.entries.remove(uid);
    }

    /// How many entries are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Sets the entry of config `uid`; when the memory is due for pruning, keeps only the
    /// entries of the UIDs `live` returns (the configs cached now).
    pub fn insert(&mut self, uid: String, value: V, live: impl FnOnce() -> HashSet<String>) {
        self.entries.insert(uid, value);
        self.prune(live);
    }

    /// Changes the entry of config `uid` (a default one if it has none) with `change`, and
    /// returns what `change` returns. `live`: as for [`ByConfig::insert`].
    pub fn update<R>(
        &mut self,
        uid: &str,
        change: impl FnOnce(&mut V) -> R,
        live: impl FnOnce() -> HashSet<String>,
    ) -> R
    where
        V: Default,
    {
        if let Some(entry) = self.entries.get_mut(uid) {
            return change(entry);
        }
        let mut entry = V::default();
        let result = change(&mut entry);
        self.entries.insert(uid.to_owned(), entry);
        self.prune(live);
        result
    }

    fn prune(&mut self, live: impl FnOnce() -> HashSet<String>) {
        if self.entries.len() > self.prune_at {
            let live = live();
            self.entries.retain(|uid, _| live.contains(uid));
            self.prune_at = (2 * self.entries.len()).max(FLOOR);
        }
    }
}

/// What one config was last told, by topic: a digest of the text (8 bytes, whatever its
/// length). Telling again what a config was last told about a topic is not news.
#[derive(Debug)]
pub struct Told<T>(Vec<(T, u64)>);

impl<T> Default for Told<T> {
    fn default() -> Self {
        Told(Vec::new())
    }
}

impl<T: Copy + PartialEq> Told<T> {
    /// Whether the config was last told something other than `text` about `topic` (or
    /// nothing); notes `text` as told.
    pub fn first(&mut self, topic: T, text: &str) -> bool {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let digest = BuildHasherDefault::<DefaultHasher>::default().hash_one(text);
        if self.0.contains(&(topic, digest)) {
            return false;
        }
        self.0.retain(|(t, _)| *t != topic);
        self.0.push((topic, digest));
        true
    }

    /// Forgets what the config was told about `topic`.
    pub fn forget(&mut self, topic: T) {
        self.0.retain(|(t, _)| *t != topic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_gone_configs_are_pruned_once_the_memory_doubles() {
        let mut memory = ByConfig::default();
        let live: HashSet<String> = (0..40).map(|i| format!("live-{i}")).collect();
        let mut listings = 0;
        for uid in &live {
            memory.insert(uid.clone(), 1, || unreachable!("below the floor"));
        }
        for i in 0..200 {
            memory.insert(format!("gone-{i}"), 0, || {
                listings += 1;
                live.clone()
            });
        }
        assert!(memory.len() <= 2 * FLOOR, "{} entries", memory.len());
        assert!(
            live.iter().all(|uid| memory.get(uid) == Some(&1)),
            "live entries stay"
        );
        // 200 insertions past the floor: a handful of listings, not one per insertion.
        assert!((1..=5).contains(&listings), "{listings} listings");
        memory.remove("live-0");
        assert!(memory.get("live-0").is_none());
    }

    /// Each step: (config, topic, text, `Some(text)` told or `None` forgotten) and whether it
    /// is news. A repeat is not; a change, or the same after a forget, is.
    #[test]
    fn a_config_is_told_once_per_change_by_topic() {
        let steps: &[(&str, u8, Option<&str>, bool)] = &[
            ("a", 1, Some("proxy ignored"), true),
            ("a", 1, Some("proxy ignored"), false),
            ("a", 2, Some("proxy ignored"), true),
            ("b", 1, Some("proxy ignored"), true),
            ("a", 1, Some("ntp ignored"), true),
            ("a", 1, Some("proxy ignored"), true),
            ("a", 2, Some("proxy ignored"), false),
            ("a", 1, None, false),
            ("a", 1, Some("proxy ignored"), true),
            ("a", 2, Some("proxy ignored"), false),
        ];
        let mut told: ByConfig<Told<u8>> = ByConfig::default();
        for (i, (uid, topic, text, news)) in steps.iter().enumerate() {
            let got = match text {
                Some(text) => told.update(uid, |t| t.first(*topic, text), HashSet::new),
                None => {
                    told.update(uid, |t| t.forget(*topic), HashSet::new);
                    false
                }
            };
            assert_eq!(got, *news, "step {i}");
        }
        told.remove("a");
        assert!(told.update("a", |t| t.first(2, "proxy ignored"), HashSet::new));
    }
}
