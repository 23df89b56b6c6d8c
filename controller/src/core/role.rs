//! Which role a machine renders with, and the init lock.
//!
//! The first control-plane machine of a Cluster renders `init`; the lock (ConfigMap
//! `<cluster>-lock`) makes sure exactly one does, even when all are created at once. It is
//! released as soon as it has served: when the Cluster reports its control plane initialized,
//! or when the init Machine's Node joined, whichever Cluster API shows first (its Machine
//! controller can set `nodeRef` before the Cluster's `ControlPlaneInitialized` condition). A
//! lock whose holder Machine is gone is taken over only if that holder was never handed its
//! `init` data: once it was, its instance may have run `kubeadm init`, and a second `init` would
//! make a second control plane behind the same endpoint, so the lock stays until someone who
//! can see the instance deletes it.

use crd_types::Role;
use crd_types::capi::CONTROL_PLANE_LABEL;
use crd_types::conditions::reason;

use super::blocked::Blocked;

/// What the role decision needs to know.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoleFacts<'a> {
    /// The role a previous render used (see `gate::recorded_role`): a machine keeps it.
    pub recorded: Option<Role>,
    /// The Machine carries the control-plane label.
    pub control_plane: bool,
    /// The Cluster reports its control plane initialized.
    pub initialized: bool,
    /// The Cluster's name, for messages.
    pub cluster: &'a str,
}

/// The role, or that it is `init` if this machine gets the init lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RoleDecision {
    /// The role is known.
    Decided(Role),
    /// `init`, once the init lock is this machine's.
    InitIfLocked,
}

/// The role a machine renders with, or why it waits.
pub(crate) fn decide(facts: RoleFacts<'_>) -> Result<RoleDecision, Blocked> {
    if let Some(role) = facts.recorded {
        return Ok(RoleDecision::Decided(role));
    }
    match (facts.control_plane, facts.initialized) {
        (false, true) => Ok(RoleDecision::Decided(Role::Worker)),
        (false, false) => Err(Blocked::waiting(
            reason::WAITING_FOR_CONTROL_PLANE,
            format!(
                "waiting for the control plane of Cluster {} to be initialized",
                facts.cluster
            ),
        )),
        (true, true) => Ok(RoleDecision::Decided(Role::ControlPlaneJoin)),
        (true, false) => Ok(RoleDecision::InitIfLocked),
    }
}

/// The role of a MachinePool's instances, or why their config does not render: every instance
/// boots from the same data Secret, so a pool can only be made of workers. A pool whose template
/// carries the control-plane label (`control_plane`) is refused, not rendered as something else.
pub(crate) fn decide_pool(
    control_plane: bool,
    initialized: bool,
    pool: &str,
    cluster: &str,
) -> Result<Role, Blocked> {
    if control_plane {
        return Err(Blocked::failed(
            reason::ROLE_NOT_SUPPORTED,
            format!(
                "MachinePool {pool} has the label {CONTROL_PLANE_LABEL} in spec.template.metadata.labels: the instances of a pool share one data Secret, so a pool renders only the worker role; make the control plane with Machines or a control-plane provider"
            ),
        ));
    }
    if !initialized {
        return Err(Blocked::waiting(
            reason::WAITING_FOR_CONTROL_PLANE,
            format!("waiting for the control plane of Cluster {cluster} to be initialized"),
        ));
    }
    Ok(Role::Worker)
}

/// What to do about an init lock another attempt created first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LockVerdict {
    /// It names this machine: the lock is ours.
    Ours,
    /// Its holder is gone and never got `init` data: remove that exact lock and try again.
    TakeOver,
    /// Another machine initializes the control plane, or may have: wait.
    Wait(Blocked),
}

/// An init lock as stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockHolder<'a> {
    /// The holder Machine's name.
    pub name: &'a str,
    /// Its UID; `None` in a lock written before UIDs were recorded (then the name decides).
    pub uid: Option<&'a str>,
    /// Whether the holder was handed its `init` data; `None` when the lock does not say (a lock
    /// written before this was recorded: it may have been).
    pub handed_out: Option<bool>,
}

/// The machine asking for the lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Claimant<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

impl LockHolder<'_> {
    /// Whether the lock names this very Machine: the same UID, not only the same name (a Machine
    /// deleted and created again under its name is another machine).
    pub(crate) fn is(&self, machine: Claimant<'_>) -> bool {
        match self.uid {
            Some(uid) => uid == machine.uid,
            None => self.name == machine.name,
        }
    }
}

/// The verdict on an existing lock for machine `me`; `holder_present` says whether the cache
/// holds the holder Machine (its name and, when recorded, its UID).
pub(crate) fn judge_lock(
    holder: LockHolder<'_>,
    me: Claimant<'_>,
    holder_present: bool,
    lock: &str,
    cluster: &str,
) -> LockVerdict {
    let name = holder.name;
    if holder.is(me) {
        LockVerdict::Ours
    } else if holder_present {
        LockVerdict::Wait(Blocked::waiting(
            reason::WAITING_FOR_INIT_LOCK,
            format!("Machine {name} is initializing the control plane of Cluster {cluster}"),
        ))
    } else if holder.handed_out == Some(false) {
        LockVerdict::TakeOver
    } else {
        LockVerdict::Wait(Blocked::failed(
            reason::INIT_HOLDER_GONE,
            format!(
                "Machine {name}, which was handed the `init` bootstrap data of Cluster {cluster}, is gone and the Cluster does not report its control plane initialized; if its instance ran `kubeadm init`, a second `init` would make a second control plane behind the same endpoint, so bootplate does not hand the init lock over by itself. Make sure that instance is gone, then delete ConfigMap {lock}: the next control-plane Machine initializes the cluster"
            ),
        ))
    }
}

/// Why a machine waits when the lock changed hands under it twice.
pub(crate) fn lock_contended(cluster: &str) -> Blocked {
    Blocked::waiting(
        reason::WAITING_FOR_INIT_LOCK,
        format!("the init lock of Cluster {cluster} is contended"),
    )
}

/// Whether the init lock is to be released: once the machine that rendered `init` sees the
/// control plane initialized, and not before, even when its own Node joined earlier. Until the
/// Cluster says initialized, another control-plane machine decides `init` or wait from that
/// same Cluster: a lock released at the join let it take the lock and render a second `init`
/// (seen on real Cluster API under load: the Machine's nodeRef came before the Cluster's
/// ControlPlaneInitialized reached the cache).
pub(crate) fn release_init_lock(role: Role, initialized: bool) -> bool {
    role == Role::Init && initialized
}

/// The role of a control-plane machine that just took the init lock, given whether its Cluster,
/// read again after taking it, is initialized. The lock is released only once that same cache
/// shows the Cluster initialized ([`release_init_lock`]), so a machine that decided from an
/// older read and took the lock right after it was released finds the Cluster initialized here
/// and joins instead of initializing a second time.
pub(crate) fn after_lock_taken(initialized_now: bool) -> Role {
    if initialized_now {
        Role::ControlPlaneJoin
    } else {
        Role::Init
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(recorded: Option<Role>, control_plane: bool, initialized: bool) -> RoleFacts<'static> {
        RoleFacts {
            recorded,
            control_plane,
            initialized,
            cluster: "c1",
        }
    }

    #[test]
    fn each_machine_gets_its_role() {
        use RoleDecision::*;
        let waits = Err(reason::WAITING_FOR_CONTROL_PLANE);
        let cases = [
            (facts(None, false, false), waits),
            (facts(None, false, true), Ok(Decided(Role::Worker))),
            (facts(None, true, false), Ok(InitIfLocked)),
            (facts(None, true, true), Ok(Decided(Role::ControlPlaneJoin))),
            (facts(Some(Role::Init), true, true), Ok(Decided(Role::Init))),
            (
                facts(Some(Role::Worker), false, false),
                Ok(Decided(Role::Worker)),
            ),
        ];
        for (facts, expected) in cases {
            assert_eq!(decide(facts).map_err(|b| b.reason), expected, "{facts:?}");
        }
    }

    #[test]
    fn a_pool_renders_worker_or_refuses_a_control_plane() {
        // (control-plane label, control plane initialized, expected)
        let cases = [
            (false, true, Ok(Role::Worker)),
            (false, false, Err(reason::WAITING_FOR_CONTROL_PLANE)),
            (true, true, Err(reason::ROLE_NOT_SUPPORTED)),
            (true, false, Err(reason::ROLE_NOT_SUPPORTED)),
        ];
        for (control_plane, initialized, expected) in cases {
            let decided = decide_pool(control_plane, initialized, "ns/p", "c1");
            assert_eq!(
                decided.as_ref().map_err(|b| b.reason).copied(),
                expected,
                "control_plane={control_plane} initialized={initialized}"
            );
        }
        let refused = decide_pool(true, true, "ns/p", "c1").unwrap_err();
        assert!(!refused.waiting, "someone has to fix the pool");
        assert!(
            refused.message.starts_with(
                "MachinePool ns/p has the label cluster.x-k8s.io/control-plane in spec.template.metadata.labels"
            ),
            "{}",
            refused.message
        );
    }

    #[test]
    fn an_existing_lock_is_ours_taken_over_or_waited_for() {
        const ME: Claimant<'static> = Claimant {
            name: "m-0",
            uid: "u-0",
        };
        let holder = |name, uid, handed_out| LockHolder {
            name,
            uid,
            handed_out,
        };
        use LockVerdict::{Ours, TakeOver};
        let ours = Ok(Ours);
        let take = Ok(TakeOver);
        let waits = Err(reason::WAITING_FOR_INIT_LOCK);
        let gone = Err(reason::INIT_HOLDER_GONE);
        // (holder, holder present in the cache, verdict)
        let cases = [
            (holder("m-0", Some("u-0"), Some(true)), true, ours.clone()),
            // A lock written before UIDs were recorded: the name decides.
            (holder("m-0", None, None), true, ours.clone()),
            // The same name, another Machine: the holder is gone and was handed its data.
            (
                holder("m-0", Some("u-old"), Some(true)),
                false,
                gone.clone(),
            ),
            (
                holder("m-0", Some("u-old"), Some(false)),
                false,
                take.clone(),
            ),
            (holder("m-1", Some("u-1"), Some(false)), true, waits.clone()),
            (holder("m-1", Some("u-1"), Some(true)), true, waits),
            (holder("m-1", Some("u-1"), Some(false)), false, take.clone()),
            (holder("", None, Some(false)), false, take),
            // Gone after its `init` data was written, or a lock that does not say: never
            // handed over by bootplate.
            (holder("m-1", Some("u-1"), Some(true)), false, gone.clone()),
            (holder("m-1", None, None), false, gone),
        ];
        for (holder, present, expected) in cases {
            let verdict = match judge_lock(holder, ME, present, "ns/c1-lock", "c1") {
                LockVerdict::Wait(blocked) => Err(blocked.reason),
                other => Ok(other),
            };
            assert_eq!(verdict, expected, "{holder:?} present={present}");
        }
        let present = holder("m-1", Some("u-1"), Some(false));
        let LockVerdict::Wait(blocked) = judge_lock(present, ME, true, "ns/c1-lock", "c1") else {
            panic!("waits for m-1");
        };
        assert!(blocked.waiting, "clears by itself");
        assert_eq!(
            blocked.message,
            "Machine m-1 is initializing the control plane of Cluster c1"
        );
        let handed = holder("m-1", Some("u-1"), Some(true));
        let LockVerdict::Wait(blocked) = judge_lock(handed, ME, false, "ns/c1-lock", "c1") else {
            panic!("never taken over");
        };
        assert!(!blocked.waiting, "someone has to look at the instance");
        for needle in ["Machine m-1", "Cluster c1", "delete ConfigMap ns/c1-lock"] {
            assert!(blocked.message.contains(needle), "{}", blocked.message);
        }
        assert_eq!(lock_contended("c1").reason, reason::WAITING_FOR_INIT_LOCK);
    }

    #[test]
    fn init_lock_is_released_only_once_the_control_plane_is_initialized() {
        // Cluster API may set the init Machine's nodeRef before the Cluster reports
        // ControlPlaneInitialized: the lock stays until the Cluster says so.
        let cases = [
            (Role::Init, false, false),
            (Role::Init, true, true),
            (Role::ControlPlaneJoin, true, false),
            (Role::Worker, true, false),
        ];
        for (role, initialized, release) in cases {
            assert_eq!(
                release_init_lock(role, initialized),
                release,
                "{role} initialized={initialized}"
            );
        }
    }

    #[test]
    fn a_machine_that_took_a_released_lock_joins_an_initialized_control_plane() {
        assert_eq!(after_lock_taken(false), Role::Init);
        assert_eq!(after_lock_taken(true), Role::ControlPlaneJoin);
    }
}
