//! Which role a machine renders with, and the init lock.
//!
//! The first control-plane machine of a Cluster renders `init`; the lock (ConfigMap
//! `<cluster>-lock`) makes sure exactly one does, even when all are created at once. It is
//! released as soon as it has served: when the Cluster reports its control plane initialized,
//! or when the init Machine's Node joined, whichever Cluster API shows first (its Machine
//! controller can set `nodeRef` before the Cluster's `ControlPlaneInitialized` condition). A
//! lock whose holder Machine is gone is taken over.

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
    /// Its holder is gone: remove that exact lock and try again.
    TakeOver,
    /// Another machine initializes the control plane: wait.
    Wait(Blocked),
}

/// The verdict on an existing lock held by `holder`, for machine `me`; `holder_exists` says
/// whether the cache holds the holder Machine.
pub(crate) fn judge_lock(
    holder: &str,
    me: &str,
    holder_exists: bool,
    cluster: &str,
) -> LockVerdict {
    if holder == me {
        LockVerdict::Ours
    } else if holder_exists {
        LockVerdict::Wait(Blocked::waiting(
            reason::WAITING_FOR_INIT_LOCK,
            format!("Machine {holder} is initializing the control plane of Cluster {cluster}"),
        ))
    } else {
        LockVerdict::TakeOver
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
        assert_eq!(judge_lock("m-0", "m-0", true, "c1"), LockVerdict::Ours);
        assert_eq!(judge_lock("m-1", "m-0", false, "c1"), LockVerdict::TakeOver);
        assert_eq!(judge_lock("", "m-0", false, "c1"), LockVerdict::TakeOver);
        let LockVerdict::Wait(blocked) = judge_lock("m-1", "m-0", true, "c1") else {
            panic!("waits for m-1");
        };
        assert_eq!(blocked.reason, reason::WAITING_FOR_INIT_LOCK);
        assert_eq!(
            blocked.message,
            "Machine m-1 is initializing the control plane of Cluster c1"
        );
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
