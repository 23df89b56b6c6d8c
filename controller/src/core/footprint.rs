//! What a config puts in its workload cluster beside its bootstrap token, at each stage of its
//! machine's life (docs/architecture.md, "A machine's footprint"): the decision, free of the
//! client. `k8s::footprint` converges the workload cluster to it.
//!
//! Two ways for a machine to write its boot report:
//! - **shared**: the workload cluster holds, once for all its machines, a Role that lets the
//!   tokens' group create and patch ConfigMaps in `kube-system`, and a ValidatingAdmissionPolicy
//!   that lets a token write only the report named for its config (the token carries its
//!   config's UID as a group). The machine creates its own report; bootplate writes nothing for
//!   it. Needs `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicy served and enforced
//!   (Kubernetes 1.30 and later) and a token made with the config's group.
//! - **per machine** (the fallback): bootplate applies the empty report, a Role naming it and a
//!   RoleBinding to the token's user, as before the shared way existed.
//!
//! Whatever is made for a machine is owned by its token's Secret: deleting the token is the
//! only delete by request; the workload cluster's garbage collector removes the rest.

use crd_types::Role;

/// Whether a workload cluster enforces the report admission policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The policy is in place and a probe saw it refuse a wrong name.
    Enforced,
    /// The API is not served, or the policy is not enforced: per-machine objects.
    Missing,
}

/// Where a config's machine is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The data Secret is being written with a token just created for it.
    Rendered,
    /// The Machine joined (and its last report, if any, was read).
    Joined,
    /// The config is gone.
    Deleted,
}

/// The facts the decision needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts {
    /// The role rendered.
    pub role: Role,
    /// The config is a MachinePool's (its instances share one token).
    pub pool: bool,
    /// The template reports boots.
    pub reports: bool,
    /// The user-data is a fetch stub (the render is stored in the workload cluster).
    pub fetch: bool,
    /// Where the machine is.
    pub stage: Stage,
    /// What the workload cluster enforces.
    pub admission: Admission,
    /// The config's token carries the config's group (made by a controller that knows the
    /// shared way; older tokens do not).
    pub token_scoped: bool,
    /// The render's token was just created (what is made for a machine is owned by its
    /// token, so it is made once per token).
    pub token_new: bool,
    /// Some token of the config exists in the workload cluster.
    pub token_exists: bool,
}

impl Facts {
    /// The facts that matter after the join or the config's deletion: only `token_exists` is
    /// left to fill in.
    pub(crate) fn after(stage: Stage) -> Facts {
        Facts {
            role: Role::Worker,
            pool: false,
            reports: false,
            fetch: false,
            stage,
            admission: Admission::Missing,
            token_scoped: false,
            token_new: false,
            token_exists: false,
        }
    }
}

/// How the machine's report gets written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// No report.
    None,
    /// The machine creates it under the shared grant and policy.
    MachineCreates,
    /// bootplate applies the report, its Role and its RoleBinding.
    PerMachine,
}

/// What should exist (or be done) for one config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// How the report is written (with [`Report::MachineCreates`], the workload cluster's
    /// shared grant and policy are needed and kept current).
    pub report: Report,
    /// bootplate applies the report, its Role and its RoleBinding now (a new token's).
    pub report_objects: bool,
    /// The sealed render, its Role and RoleBinding are applied.
    pub payload: bool,
    /// The token is deleted by request; what it owns goes with it through the garbage
    /// collector.
    pub delete_token: bool,
}

const NOTHING: Plan = Plan {
    report: Report::None,
    report_objects: false,
    payload: false,
    delete_token: false,
};

/// The plan for `facts`.
pub(crate) fn plan(facts: &Facts) -> Plan {
    match facts.stage {
        // A booting machine's reconcile that renders nothing (a restart) asks for no plan:
        // what its render needed was made then, and is owned by its token.
        Stage::Rendered => rendered(facts),
        Stage::Joined | Stage::Deleted => Plan {
            delete_token: facts.token_exists,
            ..NOTHING
        },
    }
}

fn rendered(facts: &Facts) -> Plan {
    // An `init` machine has no apiserver to report to; a pool's instances would share one report.
    let reports = facts.reports && facts.role != Role::Init && !facts.pool;
    let report = match (reports, facts.admission, facts.token_scoped) {
        (false, _, _) => Report::None,
        (true, Admission::Enforced, true) => Report::MachineCreates,
        (true, _, _) => Report::PerMachine,
    };
    Plan {
        report,
        report_objects: report == Report::PerMachine && facts.token_new,
        payload: facts.fetch,
        delete_token: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(stage: Stage) -> Facts {
        Facts {
            role: Role::Worker,
            pool: false,
            reports: true,
            fetch: false,
            stage,
            admission: Admission::Enforced,
            token_scoped: true,
            token_new: true,
            token_exists: true,
        }
    }

    #[test]
    fn what_a_config_puts_in_its_workload_cluster() {
        use Report::{MachineCreates, None as NoReport, PerMachine};
        let plan_of = |change: &dyn Fn(&mut Facts), stage| {
            let mut f = facts(stage);
            change(&mut f);
            plan(&f)
        };
        let set_up = |report, report_objects, payload| Plan {
            report,
            report_objects,
            payload,
            delete_token: false,
        };
        // (case, facts changed, stage, plan)
        type Case<'a> = (&'a str, &'a dyn Fn(&mut Facts), Stage, Plan);
        // One case a line: the table reads as a table.
        #[rustfmt::skip]
        let cases: [Case<'_>; 15] = [
            ("shipped", &|_| {}, Stage::Rendered, set_up(MachineCreates, false, false)),
            ("control-plane join", &|f| f.role = Role::ControlPlaneJoin, Stage::Rendered, set_up(MachineCreates, false, false)),
            ("fetch", &|f| f.fetch = true, Stage::Rendered, set_up(MachineCreates, false, true)),
            ("fetch, token reused: a new payload", &|f| { f.fetch = true; f.token_new = false }, Stage::Rendered, set_up(MachineCreates, false, true)),
            ("no policy", &|f| f.admission = Admission::Missing, Stage::Rendered, set_up(PerMachine, true, false)),
            ("no policy, token reused: made with it", &|f| { f.admission = Admission::Missing; f.token_new = false }, Stage::Rendered, set_up(PerMachine, false, false)),
            ("token from before the shared way", &|f| f.token_scoped = false, Stage::Rendered, set_up(PerMachine, true, false)),
            ("reports off", &|f| f.reports = false, Stage::Rendered, set_up(NoReport, false, false)),
            ("reports off, fetch", &|f| { f.reports = false; f.fetch = true }, Stage::Rendered, set_up(NoReport, false, true)),
            ("init", &|f| f.role = Role::Init, Stage::Rendered, set_up(NoReport, false, false)),
            ("pool", &|f| f.pool = true, Stage::Rendered, set_up(NoReport, false, false)),
            ("joined: the token only", &|f| f.fetch = true, Stage::Joined, Plan { delete_token: true, ..NOTHING }),
            ("joined, token gone (a restart)", &|f| f.token_exists = false, Stage::Joined, NOTHING),
            ("deleted: the token only", &|f| f.admission = Admission::Missing, Stage::Deleted, Plan { delete_token: true, ..NOTHING }),
            ("deleted, token gone", &|f| f.token_exists = false, Stage::Deleted, NOTHING),
        ];
        for (case, change, stage, want) in cases {
            assert_eq!(plan_of(change, stage), want, "{case}");
        }
    }
}
