//! The boot report of a config's machine (docs/boot-channel.md): read from the workload
//! cluster's coalesced listing while the machine has not joined (and once more, from a listing
//! a few seconds old at most, when it has, before its token goes), turned into a view by
//! `core::boot`, and reported here as the Event and the metrics that go with the status. The
//! poller here lists the reports of the clusters with machines booting and triggers the
//! configs whose report changed.

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use futures::{StreamExt, stream};
use kube::runtime::reflector::ObjectRef;

use crd_types::conditions::reason;
use crd_types::{BootplateConfig, BootplateConfigStatus};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tracing::{debug, warn};

use super::context::{Context, Topic};
pub(crate) use crate::core::boot::Subject;
use crate::core::boot::{self, Facts, Report, ReportError, View};
use crate::core::outcome::Note;
use crate::k8s::boot_report::{ClusterKey, ClusterReports, Encoded, digest};

/// The most of a failure's output an Event carries (the Event API takes 1 KiB).
const EVENT_TEXT: usize = 1000;

/// The machine's boot as the config shows it, and the report it came from.
pub(crate) struct Looked {
    pub view: View,
    report: Option<Report>,
}

/// Reads the machine's report (from the cluster's listing, at most one per interval) and
/// decides what the config shows; the config waits for the poller to trigger it on a change
/// until its machine's boot ended. `None` when the reports cannot be read now: the status
/// keeps what it showed, and the poller triggers the config once they can be.
pub(crate) async fn look(
    ctx: &Context,
    config: &BootplateConfig,
    subject: &Subject,
) -> Option<Looked> {
    let key = (
        config.namespace().unwrap_or_default(),
        subject.cluster.clone(),
    );
    let uid = config.uid().unwrap_or_default();
    let reports = &ctx.boot_reports;
    let interval = ctx.settings.boot_report_interval;
    let entry = match machine_report(ctx, &key, &subject.cluster_uid, &uid, interval).await {
        Ok(entry) => entry,
        Err(e) => {
            debug!(error = %e, "boot reports not read; trying again later");
            reports.wait_for(&key, &uid, &config.name_any(), None);
            return None;
        }
    };
    let looked = looked(ctx, subject, entry.as_ref().map(Option::as_deref));
    match looked.view {
        View::Booted | View::Failed { .. } => reports.stop_waiting(&uid),
        _ => reports.wait_for(&key, &uid, &config.name_any(), Some(digest(entry.as_ref()))),
    }
    Some(looked)
}

/// Reads the machine's report a last time, from its cluster's listing made at most
/// `core::boot::LAST_REPORT_POLL` ago: the last look at a joined machine's boot before its
/// token (and with it the report) is deleted. Machines that join together share one listing.
/// `None` when it cannot be read.
pub(crate) async fn last_look(
    ctx: &Context,
    config: &BootplateConfig,
    subject: &Subject,
) -> Option<Looked> {
    let key = (
        config.namespace().unwrap_or_default(),
        subject.cluster.clone(),
    );
    let uid = config.uid().unwrap_or_default();
    let age = boot::LAST_REPORT_POLL;
    match machine_report(ctx, &key, &subject.cluster_uid, &uid, age).await {
        Ok(entry) => match entry {
            Some(report) => Some(looked(ctx, subject, Some(report.as_deref()))),
            // A joined machine that never reported did not fail to start.
            None => Some(Looked {
                view: View::Unknown,
                report: None,
            }),
        },
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
        for (part, seconds) in boot::durations(report, subject.provisioned_since, Timestamp::now())
        {
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

/// When the config looks at its machine's boot again by itself (`core::boot::next_look`).
pub(crate) fn next_look(ctx: &Context, subject: &Subject, looked: &Looked) -> Option<Duration> {
    let not_started_after = SignedDuration::try_from(ctx.settings.boot_not_started_after)
        .unwrap_or(SignedDuration::MAX);
    let since = subject.provisioned_since;
    boot::next_look(&looked.view, since, not_started_after, Timestamp::now())
}

/// Looks at the boot reports of every Cluster with configs waiting for one, once per
/// `--boot-report-interval` (one listing per Cluster, a few Clusters at a time), and sends
/// the configs whose report changed to `trigger`. Runs while the controller leads.
pub(crate) async fn poll(ctx: Arc<Context>, trigger: UnboundedSender<ObjectRef<BootplateConfig>>) {
    let interval = ctx.settings.boot_report_interval;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let clusters = ctx.boot_reports.clusters_waiting();
        stream::iter(clusters)
            .for_each_concurrent(POLL_CONCURRENCY, |key| {
                let (ctx, trigger) = (&ctx, &trigger);
                async move {
                    for name in poll_cluster(ctx, &key, interval).await {
                        let _ = trigger.unbounded_send(ObjectRef::new(&name).within(&key.0));
                    }
                }
            })
            .await;
    }
}

/// How many Clusters' reports are listed at once (an unreachable one waits out its timeout
/// without holding up the others).
const POLL_CONCURRENCY: usize = 8;

/// The configs of Cluster `key` whose report changed since their reconcile saw it.
async fn poll_cluster(ctx: &Context, key: &ClusterKey, interval: Duration) -> Vec<String> {
    let Some(cluster) = ctx.stores.cluster(&key.0, &key.1) else {
        return Vec::new();
    };
    let cluster_uid = cluster.uid().unwrap_or_default();
    // Listed at every tick: a listing younger than half an interval is one a reconcile made
    // since the last tick.
    match cluster_reports(ctx, key, &cluster_uid, interval / 2).await {
        Ok(reports) => ctx.boot_reports.changed(key, &reports),
        Err(e) => {
            debug!(cluster = %key.1, error = %e, "boot reports not polled");
            Vec::new()
        }
    }
}

/// The report of config `uid` of Cluster `key` (UID `cluster_uid`), from a listing at most
/// `max_age` old (`k8s::boot_report::Reports::report`); `None`: it has none.
async fn machine_report(
    ctx: &Context,
    key: &ClusterKey,
    cluster_uid: &str,
    uid: &str,
    max_age: Duration,
) -> crate::error::Result<Option<Encoded>> {
    let workload = ctx.workload_client(&key.0, &key.1).await?;
    ctx.boot_reports
        .report(&workload, key, cluster_uid, uid, max_age)
        .await
}

/// The reports of Cluster `key` (UID `cluster_uid`) from its workload cluster, listed when the
/// last listing is `max_age` old or older (`k8s::boot_report::Reports::of_cluster`).
async fn cluster_reports(
    ctx: &Context,
    key: &ClusterKey,
    cluster_uid: &str,
    max_age: Duration,
) -> crate::error::Result<Arc<ClusterReports>> {
    let workload = ctx.workload_client(&key.0, &key.1).await?;
    ctx.boot_reports
        .of_cluster(&workload, key, cluster_uid, max_age)
        .await
}
