//! How long a config waits after a reconcile failed on an error that is not the config's own
//! (the management apiserver refused or did not answer): twice as long after each consecutive
//! failure of the same config, from 5 s up to 5 min, as client-go's per-item rate limiter does.
//! A flat delay would have every config of a large fleet retry every few seconds through an
//! apiserver outage. The end of an outage does not wait for these delays: the watches list
//! again when the apiserver is back, and that listing triggers every config at once.

use std::time::Duration;

use crate::reconcile::memory::ByConfig;

/// The delay after a first failure.
pub const FIRST: Duration = Duration::from_secs(5);
/// The longest delay.
pub const LONGEST: Duration = Duration::from_secs(300);

/// The delay after `failures` consecutive failures (at least 1).
pub fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (FIRST * 2u32.pow(doublings)).min(LONGEST)
}

/// Consecutive failures per config UID.
#[derive(Default)]
pub struct Failures(std::sync::Mutex<ByConfig<u32>>);

impl Failures {
    /// Counts a failure of config `uid`; returns how long to wait before trying again.
    /// `live` lists the UIDs of the configs that still exist (see [`ByConfig::insert`]).
    pub fn failed(
        &self,
        uid: &str,
        live: impl FnOnce() -> std::collections::HashSet<String>,
    ) -> Duration {
        let mut failures = self.0.lock().expect("lock");
        let count = failures.get(uid).copied().unwrap_or(0).saturating_add(1);
        failures.insert(uid.to_owned(), count, live);
        delay(count)
    }

    /// Forgets the failures of config `uid` after a reconcile that did not fail.
    pub fn succeeded(&self, uid: &str) {
        self.0.lock().expect("lock").remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_per_consecutive_failure_up_to_five_minutes() {
        let delays: Vec<u64> = (1..=9).map(|n| delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(delay(u32::MAX), LONGEST);
    }

    #[test]
    fn a_success_starts_the_count_again_and_configs_count_apart() {
        let failures = Failures::default();
        let live = || ["a".to_owned(), "b".to_owned()].into();
        assert_eq!(failures.failed("a", live), FIRST);
        assert_eq!(failures.failed("a", live), 2 * FIRST);
        assert_eq!(failures.failed("b", live), FIRST, "b counts on its own");
        assert_eq!(failures.failed("a", live), 4 * FIRST);
        failures.succeeded("a");
        assert_eq!(failures.failed("a", live), FIRST);
        assert_eq!(failures.failed("b", live), 2 * FIRST);
    }
}
