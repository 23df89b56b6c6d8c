//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics: the
//! leader renews every retry period and gives up when it cannot renew within the renew
//! deadline; a standby polls every retry period and takes over a Lease that expired or was
//! released. On SIGTERM the leader releases the Lease so a standby takes over at its next
//! poll instead of after the lease duration.
//!
//! Two rules keep two leaders from writing at once. Every request is bounded by a timeout
//! (the client has no read timeout), so a stalled renewal cannot outlast the renew deadline:
//! the leader stops no later than the renew deadline after the start of its last successful
//! renewal. And a standby judges expiry by its own clock, from the moment it saw the Lease
//! record last change, never from the holder's `renewTime` (the clocks may differ): the record
//! changed no earlier than that renewal started, so the standby takes over a full lease
//! duration, longer than the renew deadline, after it.
//!
//! Written here rather than taken from a crate because the crates available for kube 5 wait
//! for the lease duration to pass before taking over a released Lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::error::{is_conflict, is_not_found};

/// Timing of the election, as client-go names it.
#[derive(Clone, Debug)]
pub struct Timing {
    /// How long a Lease stays valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby tries to acquire.
    pub retry_period: Duration,
}

/// The least time kept between the moment a leader that cannot renew stops (the renew
/// deadline after its last renewal started) and the moment a standby may take over (the lease
/// duration after it saw that renewal), besides a retry period: a tenth of the lease duration,
/// and at least this. It covers the leader's stopping of its reconciles and clocks that run at
/// slightly different rates.
const LEAST_MARGIN: Duration = Duration::from_secs(1);

/// Whether `timing` keeps two leaders from reconciling at once; Err names the flags and says
/// what they must satisfy.
pub fn check_timing(timing: &Timing) -> Result<(), String> {
    let show = |d: Duration| humantime::format_duration(d).to_string();
    if timing.retry_period >= timing.renew_deadline {
        return Err(format!(
            "--leader-elect-retry-period ({}) must be shorter than --leader-elect-renew-deadline ({}): the leader must get to retry a failed renewal before it gives up",
            show(timing.retry_period),
            show(timing.renew_deadline)
        ));
    }
    let margin = (timing.lease_duration / 10).max(LEAST_MARGIN);
    let needed = timing.renew_deadline + timing.retry_period + margin;
    if needed > timing.lease_duration {
        return Err(format!(
            "--leader-elect-renew-deadline ({}) + --leader-elect-retry-period ({}) must be at least {} shorter than --leader-elect-lease-duration ({}): a leader that cannot renew stops at the renew deadline, and a standby takes over after the lease duration, so a shorter lease lets two leaders reconcile at once",
            show(timing.renew_deadline),
            show(timing.retry_period),
            show(margin),
            show(timing.lease_duration)
        ));
    }
    Ok(())
}

/// One participant of the election.
pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The Lease record as last seen, and when.
    observed: Mutex<Option<Observed>>,
}

/// A Lease record (its resourceVersion changes with every write) and when this participant
/// first saw it.
#[derive(Clone, Debug)]
struct Observed {
    version: String,
    at: Instant,
}

/// Whether the Lease, now at resourceVersion `version`, expired by this participant's clock:
/// it has not changed for `lease_duration` since it was first seen. Notes a changed record.
fn expired(
    observed: &mut Option<Observed>,
    version: &str,
    now: Instant,
    lease_duration: Duration,
) -> bool {
    match observed {
        Some(seen) if seen.version == version => now.duration_since(seen.at) > lease_duration,
        _ => {
            *observed = Some(Observed {
                version: version.to_owned(),
                at: now,
            });
            false
        }
    }
}

/// How long a renewal attempt may take so that, after a last successful renewal that started
/// at `last_renewal`, the leader stops within the renew deadline; `None` when that is past.
fn renewal_budget(
    last_renewal: Instant,
    now: Instant,
    renew_deadline: Duration,
) -> Option<Duration> {
    renew_deadline
        .checked_sub(now.duration_since(last_renewal))
        .filter(|left| !left.is_zero())
}

impl LeaderElection {
    /// A participant named `identity` competing for the Lease `namespace/name`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: String,
        timing: Timing,
    ) -> Self {
        LeaderElection {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity,
            timing,
            observed: Mutex::new(None),
        }
    }

    /// Waits until this participant holds the Lease; returns when the winning attempt started.
    pub async fn acquire(&self) -> Instant {
        loop {
            let started = Instant::now();
            let attempt = self.try_acquire_or_renew();
            match tokio::time::timeout(self.timing.renew_deadline, attempt).await {
                Err(_) => warn!(lease = %self.name, "acquiring the lease timed out"),
                Ok(Ok(true)) => {
                    info!(identity = %self.identity, lease = %self.name, "became the leader");
                    return started;
                }
                Ok(Ok(false)) => debug!(lease = %self.name, "another instance is the leader"),
                Ok(Err(e)) => {
                    warn!(error = %e, lease = %self.name, "cannot read or acquire the lease")
                }
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews the Lease until renewing fails for longer than the renew deadline (or another
    /// instance took it); returns then: leadership is lost. `acquired` is when the attempt
    /// that won the Lease started.
    pub async fn hold(&self, acquired: Instant) {
        let mut last_renewal = acquired;
        loop {
            // The next attempt comes a retry period later, but the wait ends at the renew
            // deadline: a leader whose last attempt failed or timed out near the deadline stops
            // at the deadline, not a retry period after it (a standby may lead by then).
            let deadline = last_renewal + self.timing.renew_deadline;
            tokio::time::sleep_until((Instant::now() + self.timing.retry_period).min(deadline))
                .await;
            let started = Instant::now();
            let Some(budget) = renewal_budget(last_renewal, started, self.timing.renew_deadline)
            else {
                warn!(lease = %self.name, "could not renew the lease within the renew deadline");
                return;
            };
            match tokio::time::timeout(budget, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_renewal = started,
                Ok(Ok(false)) => {
                    warn!(lease = %self.name, "another instance took the lease");
                    return;
                }
                Ok(Err(e)) => warn!(error = %e, lease = %self.name, "cannot renew the lease"),
                Err(_) => warn!(lease = %self.name, "renewing the lease timed out"),
            }
        }
    }

    /// Gives the Lease up (if held), so a standby takes over at its next poll.
    pub async fn release(&self) {
        let read = tokio::time::timeout(self.timing.retry_period, self.api.get(&self.name));
        let Ok(Ok(mut lease)) = read.await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let params = PostParams::default();
        let write = self.api.replace(&self.name, &params, &lease);
        match tokio::time::timeout(self.timing.retry_period, write).await {
            Ok(Ok(_)) => info!(lease = %self.name, "released the lease"),
            Ok(Err(e)) => warn!(error = %e, lease = %self.name, "cannot release the lease"),
            Err(_) => warn!(lease = %self.name, "releasing the lease timed out"),
        }
    }

    /// One round: takes the Lease if it is free, expired or already ours. The write carries the
    /// resourceVersion read, so of two contenders only one wins.
    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let duration_seconds =
            i32::try_from(self.timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let existing = match self.api.get(&self.name).await {
            Ok(lease) => lease,
            Err(e) if is_not_found(&e) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(duration_seconds),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let spec = existing.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        let version = existing
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let expired = {
            let mut observed = self.observed.lock().expect("lock");
            expired(&mut observed, &version, Instant::now(), duration)
        };
        if !mine && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let mut lease = existing;
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: if mine {
                spec.acquire_time
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if mine { transitions } else { transitions + 1 }),
            ..spec
        });
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn lease_expiry_is_judged_by_the_local_clock_from_the_last_change_seen() {
        let start = Instant::now();
        let lease = 15 * SECOND;
        let mut observed = None;
        // A record first seen is never expired, whatever its renewTime says: the holder's clock
        // may be behind.
        assert!(!expired(&mut observed, "100", start, lease));
        assert!(!expired(&mut observed, "100", start + 15 * SECOND, lease));
        assert!(expired(&mut observed, "100", start + 16 * SECOND, lease));
        // A renewal (a new resourceVersion) starts the count again.
        assert!(!expired(&mut observed, "101", start + 17 * SECOND, lease));
        assert!(!expired(&mut observed, "101", start + 31 * SECOND, lease));
        assert!(expired(&mut observed, "101", start + 33 * SECOND, lease));
    }

    /// A client whose every request hangs (`answer: None`) or fails at once.
    fn apiserver(hangs: bool) -> Client {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| async move {
            if hangs {
                std::future::pending::<()>().await;
            }
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("unreachable"))
        });
        Client::new(service, "default")
    }

    #[tokio::test]
    async fn a_leader_that_cannot_renew_stops_at_the_renew_deadline_not_a_retry_period_later() {
        // The renew deadline is not a multiple of the retry period: the attempt at 0.8 s fails
        // (at once, or by timing out at the deadline), and the next would come at 1.6 s.
        let timing = Timing {
            lease_duration: 3 * SECOND,
            renew_deadline: SECOND,
            retry_period: Duration::from_millis(800),
        };
        for hangs in [false, true] {
            let election =
                LeaderElection::new(apiserver(hangs), "ns", "lease", "me".into(), timing.clone());
            let acquired = Instant::now();
            election.hold(acquired).await;
            let held = acquired.elapsed();
            assert!(
                held >= timing.renew_deadline && held < Duration::from_millis(1300),
                "hanging apiserver: {hangs}: leadership held {held:?} after the last renewal"
            );
        }
    }

    #[test]
    fn timings_that_let_two_leaders_overlap_are_refused_naming_the_flags() {
        let timing = |lease, renew, retry| Timing {
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
        };
        // (lease, renew deadline, retry period in ms, the flag named in the refusal)
        let cases = [
            (15_000, 10_000, 2_000, None),
            (20_000, 15_000, 1_000, None),
            (15_000, 10_000, 1_000, None),
            // 10 + 2 + a margin of 1.3 s: the lease is 0.3 s short.
            (13_000, 10_000, 2_000, Some("--leader-elect-lease-duration")),
            // Passed the old check (retry < renew < lease), with no room for a retry period.
            (15_000, 14_000, 2_000, Some("--leader-elect-lease-duration")),
            (15_000, 13_500, 500, Some("--leader-elect-lease-duration")),
            // The margin is at least a second.
            (4_000, 2_000, 1_500, Some("--leader-elect-lease-duration")),
            (15_000, 2_000, 2_000, Some("--leader-elect-retry-period")),
        ];
        for (lease, renew, retry, refused) in cases {
            let checked = check_timing(&timing(lease, renew, retry));
            match refused {
                None => assert_eq!(checked, Ok(()), "{lease}/{renew}/{retry}"),
                Some(flag) => {
                    let message = checked.expect_err(&format!("{lease}/{renew}/{retry}"));
                    assert!(message.contains(flag), "{message}");
                    assert!(
                        message.contains("--leader-elect-renew-deadline"),
                        "{message}"
                    );
                }
            }
        }
    }

    #[test]
    fn leader_stops_within_the_renew_deadline_of_its_last_renewal() {
        let renewed = Instant::now();
        let deadline = 10 * SECOND;
        let cases = [
            (0, Some(10)),
            (2, Some(8)),
            (9, Some(1)),
            (10, None),
            (12, None),
        ];
        for (elapsed, budget) in cases {
            assert_eq!(
                renewal_budget(renewed, renewed + elapsed * SECOND, deadline),
                budget.map(|b| b * SECOND),
                "{elapsed} s after the last renewal"
            );
        }
    }
}
