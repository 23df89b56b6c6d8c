//! The boot report of a config's machine (docs/boot-channel.md): read from the workload
//! cluster's coalesced listing while the machine has not joined (and read directly once more
//! when it has, before its token goes), turned into a view by `core::boot`, and reported here
//! as the Event and the metrics that go with the status.

use std::time::Duration;

use crd_types::conditions::reason;
use crd_types::{BootplateConfig, BootplateConfigStatus};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tracing::{debug, warn};

use super::context::{Context, Topic};
pub(crate) use crate::core::boot::Subject;
use crate::core::boot::{self, Facts, Report, ReportError, View};
use crate::core::outcome::Note;

/// The most of a failure's output an Event carries (the Event API takes 1 KiB).
const EVENT_TEXT: usize = 1000;

/// The machine's boot as the config shows it, and the report it came from.
pub(crate) struct Looked {
    pub view: View,
    report: Option<Report>,
}

/// Reads the machine's report (from the cluster's listing, at most one per interval) and
/// decides what the config shows. `None` when the reports cannot be read now: the status keeps
/// what it showed, and the next look tries again.
pub(crate) async fn look(
    ctx: &Context,
    config: &BootplateConfig,
    subject: &Subject,
) -> Option<Looked> {
    let namespace = config.namespace().unwrap_or_default();
    let interval = ctx.settings.boot_report_interval;
    let listed = match ctx.workload_client(&namespace, &subject.cluster).await {
        Ok(workload) => {
            let reports = &ctx.boot_reports;
            reports
                .of_cluster(&workload, &namespace, &subject.cluster, interval)
                .await
        }
        Err(e) => Err(e),
    };
    let reports = match listed {
        Ok(reports) => reports,
        Err(e) => {
            debug!(error = %e, "boot reports not read; trying again later");
            return None;
        }
    };
    let uid = config.uid().unwrap_or_default();
    Some(looked(
        ctx,
        subject,
        reports.get(&uid).map(Option::as_deref),
    ))
}

/// Reads the machine's report now, past the shared listing: the last look at a joined
/// machine's boot before its token (and with it the report) is deleted. `None` when it cannot
/// be read.
pub(crate) async fn last_look(
    ctx: &Context,
    config: &BootplateConfig,
    subject: &Subject,
) -> Option<Looked> {
    let namespace = config.namespace().unwrap_or_default();
    let uid = config.uid().unwrap_or_default();
    let read = match ctx.workload_client(&namespace, &subject.cluster).await {
        Ok(workload) => crate::k8s::boot_report::read(&workload, &uid).await,
        Err(e) => Err(e),
    };
    match read {
        // A joined machine that never reported did not fail to start.
        Ok(None) => Some(Looked {
            view: View::Unknown,
            report: None,
        }),
        Ok(report) => Some(looked(ctx, subject, report.as_ref().map(Option::as_deref))),
        Err(e) => {
            debug!(error = %e, "last boot report not read");
            None
        }
    }
}

/// The view of `report` (the encoded report, `Some(None)` for one too large to keep).
fn looked(ctx: &Context, subject: &Subject, report: Option<Option<&str>>) -> Looked {
    let report = report.map(|r| match r {
        Some(encoded) => boot::parse(encoded),
        None => Err(ReportError::TooLarge(boot::MAX_ENCODED + 1)),
    });
    let kept = report.as_ref().and_then(|r| r.as_ref().ok()).cloned();
    let not_started_after = SignedDuration::try_from(ctx.settings.boot_not_started_after)
        .unwrap_or(SignedDuration::MAX);
    let view = boot::view(Facts {
        machine: &subject.machine,
        report,
        provisioned_since: subject.provisioned_since,
        not_started_after,
        now: Timestamp::now(),
    });
    Looked { view, report: kept }
}

/// The Event and metrics of a boot that reached a new phase (compared with the status as
/// stored): a failure or a silence is a Warning Event, a finished boot's parts are observed.
pub(crate) fn tell(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    subject: &Subject,
    looked: &Looked,
) {
    let was = (previous.boot.as_ref()).and_then(|b| b.phase.as_deref());
    let uid = config.uid().unwrap_or_default();
    let phase = match &looked.view {
        View::Failed { .. } => "Failed",
        View::Booted => "Booted",
        View::NotStarted { .. } => "NotStarted",
        View::Unreadable { .. } => "Unreadable",
        View::Booting { .. } => return ctx.forget_told(&uid, Topic::Boot),
        View::Unknown => return,
    };
    // The stored phase can be older than this process's last write: the memory settles it.
    if was == Some(phase) || !ctx.first_telling(&uid, Topic::Boot, phase) {
        return;
    }
    let label = |part: &str| {
        if subject.parts.iter().any(|p| p == part) {
            part.to_owned()
        } else {
            "other".to_owned()
        }
    };
    if let (Some(report), View::Failed { .. } | View::Booted) = (&looked.report, &looked.view) {
        for (part, seconds) in boot::durations(report) {
            ctx.metrics
                .boot_part(&subject.template, &label(part), seconds);
        }
    }
    let note = match &looked.view {
        View::Failed {
            part,
            message,
            tail,
        } => {
            ctx.metrics.boot_failed(&subject.template, &label(part));
            warn!(machine = %subject.machine, %part, "boot failed");
            Some(warning(
                reason::BOOT_FAILED,
                boot::event_text(message, tail, EVENT_TEXT),
            ))
        }
        View::NotStarted { message } => Some(warning(reason::BOOT_NOT_STARTED, message.clone())),
        View::Unreadable { message } => {
            ctx.metrics.boot_report_unreadable(&subject.template);
            warn!(machine = %subject.machine, %message, "boot report unreadable");
            Some(warning(reason::BOOT_REPORT_UNREADABLE, message.clone()))
        }
        _ => None,
    };
    if let Some(note) = note {
        ctx.publish(config, note);
    }
}

fn warning(reason: &'static str, text: String) -> Note {
    Note {
        warning: true,
        reason,
        action: "Boot",
        text,
    }
}

/// When to look again: soon while the machine boots or has not reported, not at all once it
/// reported its end (its joining reconciles the config).
pub(crate) fn next_look(view: &View, interval: Duration) -> Option<Duration> {
    match view {
        View::Booted | View::Failed { .. } => None,
        View::Unknown
        | View::Booting { .. }
        | View::NotStarted { .. }
        | View::Unreadable { .. } => Some(interval),
    }
}
