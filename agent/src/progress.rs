//! Which parts' commands of a payload revision have run, and when a failing part may be tried
//! again.
//!
//! The commands run once per payload revision, part after part in payload order. A part whose
//! commands completed is not run again for that revision; the first part that fails stops the
//! parts after it (they may depend on it) and is tried again, from its first command, after an
//! exponential back-off: `FIRST_DELAY` after the first failure, doubling, at most `MAX_DELAY`.
//! A new revision starts over. This is remembered in the agent's state file, so a restart of
//! the agent neither repeats a part that succeeded nor forgets a back-off.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The wait after a part's first failure.
pub const FIRST_DELAY: Duration = Duration::from_secs(30);
/// The longest wait between two attempts of a failing part.
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 60);

/// The commands' progress through one revision.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CommandProgress {
    /// The payload revision this is about.
    pub revision: String,
    /// Parts whose commands completed for this revision.
    pub done: BTreeSet<String>,
    /// Parts whose commands failed, by part.
    pub failing: BTreeMap<String, Failing>,
}

/// A part whose commands failed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Failing {
    /// Failed attempts so far.
    pub attempts: u32,
    /// Not to be tried before this time (seconds since the Unix epoch).
    pub next_attempt: u64,
    /// The step that failed (`command 2`).
    pub step: String,
    /// The failure as reported, back-off included (kept, so the report stays the same while
    /// the part waits).
    pub message: String,
}

/// What to do with a part's commands now.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// They completed for this revision.
    Done,
    /// Run them.
    Run,
    /// They failed and the back-off has not passed: report this failure again.
    Wait(&'a Failing),
}

/// The wait after `attempts` failed attempts (1 or more).
pub fn delay(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

impl CommandProgress {
    /// The progress for `revision`: `previous` if it is about that revision, else a fresh one.
    pub fn for_revision(previous: Option<CommandProgress>, revision: &str) -> CommandProgress {
        match previous {
            Some(p) if p.revision == revision => p,
            _ => CommandProgress {
                revision: revision.to_owned(),
                ..CommandProgress::default()
            },
        }
    }

    /// What to do with `part`'s commands at `now` (seconds since the Unix epoch).
    pub fn next(&self, part: &str, now: u64) -> Next<'_> {
        if self.done.contains(part) {
            return Next::Done;
        }
        match self.failing.get(part) {
            Some(failing) if now < failing.next_attempt => Next::Wait(failing),
            _ => Next::Run,
        }
    }

    /// `part`'s commands completed.
    pub fn succeeded(&mut self, part: &str) {
        self.failing.remove(part);
        self.done.insert(part.to_owned());
    }

    /// `part`'s commands failed at `step` because of `cause` at `now`: records the attempt and
    /// returns the failure as it is reported (with the back-off).
    pub fn failed(&mut self, part: &str, step: &str, cause: &str, now: u64) -> &Failing {
        let attempts = self.failing.get(part).map_or(0, |f| f.attempts) + 1;
        let wait = delay(attempts);
        let failing = Failing {
            attempts,
            next_attempt: now.saturating_add(wait.as_secs()),
            step: step.to_owned(),
            message: format!(
                "{cause} (attempt {attempts}; next attempt in {})",
                humantime::format_duration(wait)
            ),
        };
        self.failing.insert(part.to_owned(), failing);
        &self.failing[part]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_back_off_doubles_up_to_its_cap() {
        let table = [
            (1, 30),
            (2, 60),
            (3, 120),
            (4, 240),
            (6, 960),
            (7, 1800),
            (8, 1800),
            (u32::MAX, 1800),
        ];
        for (attempts, seconds) in table {
            assert_eq!(delay(attempts), Duration::from_secs(seconds), "{attempts}");
        }
    }

    #[test]
    fn a_failing_part_waits_then_runs_and_a_done_part_never_runs_again() {
        let mut p = CommandProgress::for_revision(None, "r1");
        assert_eq!(p.next("a", 1000), Next::Run);
        p.succeeded("a");
        let failing = p.failed("b", "command 1", "exit status: 3", 1000).clone();
        assert_eq!(failing.attempts, 1);
        assert_eq!(failing.next_attempt, 1030);
        assert_eq!(
            failing.message,
            "exit status: 3 (attempt 1; next attempt in 30s)"
        );
        let cases = [
            ("a", 1000, Next::Done),
            ("a", 99_999, Next::Done),
            ("b", 1000, Next::Wait(&failing)),
            ("b", 1029, Next::Wait(&failing)),
            ("b", 1030, Next::Run),
            ("c", 1000, Next::Run),
        ];
        for (part, now, want) in cases {
            assert_eq!(p.next(part, now), want, "{part} at {now}");
        }
        let second = p.failed("b", "command 0", "exit status: 1", 1030).clone();
        assert_eq!((second.attempts, second.next_attempt), (2, 1090));
        p.succeeded("b");
        assert_eq!(p.next("b", 1030), Next::Done);
        assert!(p.failing.is_empty());
    }

    #[test]
    fn a_new_revision_starts_over() {
        let mut p = CommandProgress::for_revision(None, "r1");
        p.succeeded("a");
        p.failed("b", "command 0", "x", 0);
        let same = CommandProgress::for_revision(Some(p.clone()), "r1");
        assert_eq!(same, p);
        let new = CommandProgress::for_revision(Some(p), "r2");
        assert_eq!(new.revision, "r2");
        assert_eq!(new.next("a", 0), Next::Run);
        assert_eq!(new.next("b", 0), Next::Run);
    }
}
