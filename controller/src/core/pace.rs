//! How many Normal Events reach the apiserver: a token bucket, the clock passed in.
//!
//! A rollout renders every machine once, and each render is worth a `Rendered` Event to the
//! person who looks at one config. At a rollout of thousands the apiserver spends about as
//! much on those notes as on the data Secrets themselves (docs/benchmarks.md), for a record
//! nobody reads whole. So Normal Events pass at most `per_second` on average, with bursts of
//! `burst` (the kubelet's `--event-qps` and `--event-burst` do the same for a node); the
//! others are dropped and counted. Warnings never wait here: they tell of bad input, which
//! must show as an Event whatever else happens.

use std::time::{Duration, Instant};

/// The limit: Events per second on average, and how many may pass at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventPace {
    /// Average Normal Events per second; 0 means no limit.
    pub per_second: f64,
    /// The most that pass at once after a quiet time (at least 1).
    pub burst: u32,
}

impl Default for EventPace {
    fn default() -> Self {
        EventPace {
            per_second: 5.0,
            burst: 100,
        }
    }
}

/// A token bucket: full at first, one token per Normal Event, refilled at the pace's rate.
#[derive(Debug)]
pub(crate) struct Bucket {
    pace: EventPace,
    tokens: f64,
    filled_at: Option<Instant>,
}

impl Bucket {
    pub(crate) fn new(pace: EventPace) -> Self {
        Bucket {
            pace,
            tokens: f64::from(pace.burst.max(1)),
            filled_at: None,
        }
    }

    /// Whether an Event may pass at `now` (it takes a token when it does). Times before the
    /// last one (a clock read out of order) count as no time passed.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        if self.pace.per_second <= 0.0 {
            return true;
        }
        let burst = f64::from(self.pace.burst.max(1));
        let passed = self
            .filled_at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        self.tokens = (self.tokens + passed.as_secs_f64() * self.pace.per_second).min(burst);
        self.filled_at = Some(self.filled_at.map_or(now, |at| at.max(now)));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of `count` Events offered at `at` seconds pass.
    fn passed(bucket: &mut Bucket, start: Instant, at: f64, count: usize) -> usize {
        let now = start + Duration::from_secs_f64(at);
        (0..count).filter(|_| bucket.take(now)).count()
    }

    #[test]
    fn normal_events_pass_in_bursts_then_at_the_rate() {
        struct Case {
            name: &'static str,
            pace: EventPace,
            /// (seconds since start, Events offered, Events expected to pass)
            offers: &'static [(f64, usize, usize)],
        }
        let cases = [
            Case {
                name: "a quiet controller's first burst passes whole",
                pace: EventPace::default(),
                offers: &[(0.0, 100, 100), (0.0, 1, 0)],
            },
            Case {
                name: "then the rate refills it",
                pace: EventPace::default(),
                offers: &[(0.0, 150, 100), (1.0, 10, 5), (3.0, 10, 10), (3.0, 1, 0)],
            },
            Case {
                name: "a long quiet time refills no more than the burst",
                pace: EventPace {
                    per_second: 2.0,
                    burst: 3,
                },
                offers: &[(0.0, 3, 3), (3600.0, 10, 3)],
            },
            Case {
                name: "a fraction of a token waits for the rest",
                pace: EventPace {
                    per_second: 0.5,
                    burst: 1,
                },
                offers: &[(0.0, 1, 1), (1.0, 1, 0), (2.0, 1, 1)],
            },
            Case {
                name: "no limit",
                pace: EventPace {
                    per_second: 0.0,
                    burst: 0,
                },
                offers: &[(0.0, 10_000, 10_000)],
            },
            Case {
                name: "a burst of 0 still lets one through",
                pace: EventPace {
                    per_second: 1.0,
                    burst: 0,
                },
                offers: &[(0.0, 5, 1), (1.0, 5, 1)],
            },
        ];
        for case in cases {
            let start = Instant::now();
            let mut bucket = Bucket::new(case.pace);
            for (step, &(at, offered, expected)) in case.offers.iter().enumerate() {
                let got = passed(&mut bucket, start, at, offered);
                assert_eq!(got, expected, "{}: step {step}", case.name);
            }
        }
    }

    #[test]
    fn a_clock_read_out_of_order_adds_nothing() {
        let start = Instant::now() + Duration::from_secs(10);
        let mut bucket = Bucket::new(EventPace {
            per_second: 1.0,
            burst: 1,
        });
        assert!(bucket.take(start));
        assert!(!bucket.take(start - Duration::from_secs(5)));
        assert!(!bucket.take(start));
        assert!(bucket.take(start + Duration::from_secs(1)));
    }
}
