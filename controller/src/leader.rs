//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics: the
//! leader renews every retry period and gives up when it cannot renew within the renew
//! deadline; a standby polls every retry period and takes over a Lease that expired or was
//! released. On SIGTERM the leader releases the Lease so a standby takes over at its next
//! poll instead of after the lease duration.
//!
//! Written here rather than taken from a crate because the crates available for kube 5 wait
//! for the lease duration to pass before taking over a released Lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
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

/// One participant of the election.
pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
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
        }
    }

    /// This participant's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this participant holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(identity = %self.identity, lease = %self.name, "became the leader");
                    return;
                }
                Ok(false) => debug!(lease = %self.name, "another instance is the leader"),
                Err(e) => warn!(error = %e, lease = %self.name, "cannot read or acquire the lease"),
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews the Lease until renewing fails for longer than the renew deadline (or another
    /// instance took it); returns then: leadership is lost.
    pub async fn hold(&self) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    warn!(lease = %self.name, "another instance took the lease");
                    return;
                }
                Err(e) => warn!(error = %e, lease = %self.name, "cannot renew the lease"),
            }
            if last_renewal.elapsed() > self.timing.renew_deadline {
                warn!(lease = %self.name, "could not renew the lease within the renew deadline");
                return;
            }
        }
    }

    /// Gives the Lease up (if held), so a standby takes over at its next poll.
    pub async fn release(&self) {
        let Ok(mut lease) = self.api.get(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.name, "released the lease"),
            Err(e) => warn!(error = %e, lease = %self.name, "cannot release the lease"),
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
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(seconds)) => {
                renewed.0 + SignedDuration::from_secs(i64::from(seconds)) < now
            }
            _ => true,
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
