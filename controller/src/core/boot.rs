//! Boot reports (docs/boot-channel.md): reading what a machine reported about its boot, and
//! what the config shows of it.
//!
//! A report is written by the machine (a node may be hostile): it is the base64 of a short text
//! the reporter builds, checked for size before it is decoded and read line by line with a cap
//! on every count and length, so nothing a node writes makes the controller allocate more than
//! [`MAX_ENCODED`] and a few small strings.
//!
//! ```text
//! bootplate-boot-report 1
//! state running|failed|done
//! started <unix seconds>
//! time <unix seconds>
//! part <start> <end or -> <name>          (one per part begun, in order)
//! failed <kind> <index> <status> <part>    (state failed only)
//! tail                                     (state failed only; the lines after it)
//! ```

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The ConfigMap key the report is in.
pub(crate) const REPORT_KEY: &str = "report";
/// The largest encoded report read (the reporter sends at most 12 KiB of text: 16 KiB base64).
pub(crate) const MAX_ENCODED: usize = 16 * 1024;
/// At most this many parts, tail lines, and characters in a part name or a tail line.
const MAX_PARTS: usize = 64;
pub(crate) const MAX_TAIL_LINES: usize = 40;
const MAX_NAME: usize = 63;
const MAX_LINE: usize = 240;

/// Why a report cannot be read. The messages quote nothing of the report.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ReportError {
    #[error("the report is {0} bytes, more than the {MAX_ENCODED} allowed")]
    TooLarge(usize),
    #[error("the report is not base64")]
    NotBase64,
    #[error("the report is not a bootplate boot report (version 1)")]
    NotAReport,
    #[error("line {0} of the report is malformed")]
    Malformed(usize),
    #[error("the report names more than {MAX_PARTS} parts")]
    TooManyParts,
}

/// Where a boot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    Failed,
    Done,
}

/// One part's start and end (unix seconds; no end while it runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartTime {
    pub name: String,
    pub start: i64,
    pub end: Option<i64>,
}

/// The first failing step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub part: String,
    /// `file`, `unit` or `command`.
    pub kind: String,
    pub index: u32,
    pub status: i32,
}

/// A report as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    pub state: State,
    pub time: i64,
    pub parts: Vec<PartTime>,
    pub failure: Option<Failure>,
    /// The end of the failing step's output, as the machine redacted it.
    pub tail: Vec<String>,
}

/// Reads the report in `encoded` (the ConfigMap's value).
pub(crate) fn parse(encoded: &str) -> Result<Report, ReportError> {
    if encoded.len() > MAX_ENCODED {
        return Err(ReportError::TooLarge(encoded.len()));
    }
    let bytes = BASE64
        .decode(encoded.trim())
        .map_err(|_| ReportError::NotBase64)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines().enumerate();
    if lines.next().map(|(_, l)| l) != Some("bootplate-boot-report 1") {
        return Err(ReportError::NotAReport);
    }
    let mut report = Report {
        state: State::Running,
        time: 0,
        parts: Vec::new(),
        failure: None,
        tail: Vec::new(),
    };
    for (i, line) in lines.by_ref() {
        let bad = || ReportError::Malformed(i + 1);
        let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "state" => report.state = state(rest).ok_or_else(bad)?,
            "started" => {}
            "time" => report.time = rest.parse().map_err(|_| bad())?,
            "part" if report.parts.len() >= MAX_PARTS => return Err(ReportError::TooManyParts),
            "part" => report.parts.push(part(rest).ok_or_else(bad)?),
            "failed" => report.failure = Some(failure(rest).ok_or_else(bad)?),
            "tail" => break,
            _ => return Err(bad()),
        }
    }
    let tail: Vec<&str> = lines.map(|(_, l)| l).collect();
    let skip = tail.len().saturating_sub(MAX_TAIL_LINES);
    report.tail = tail[skip..].iter().map(|l| clean(l, MAX_LINE)).collect();
    Ok(report)
}

fn state(s: &str) -> Option<State> {
    match s {
        "running" => Some(State::Running),
        "failed" => Some(State::Failed),
        "done" => Some(State::Done),
        _ => None,
    }
}

fn part(rest: &str) -> Option<PartTime> {
    let mut fields = rest.splitn(3, ' ');
    let start = fields.next()?.parse().ok()?;
    let end = match fields.next()? {
        "-" => None,
        end => Some(end.parse().ok()?),
    };
    let name = clean(fields.next()?, MAX_NAME);
    Some(PartTime { name, start, end })
}

fn failure(rest: &str) -> Option<Failure> {
    let mut fields = rest.splitn(4, ' ');
    let kind = fields.next()?;
    if !matches!(kind, "file" | "unit" | "command") {
        return None;
    }
    Some(Failure {
        kind: kind.to_owned(),
        index: fields.next()?.parse().ok()?,
        status: fields.next()?.parse().ok()?,
        part: clean(fields.next()?, MAX_NAME),
    })
}

/// `s` without control characters, cut to `max` characters.
fn clean(s: &str, max: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// What a config shows of its machine's boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum View {
    /// Nothing to show (no report yet, and not late).
    Unknown,
    /// Running `part` (empty before the first part).
    Booting { part: String },
    /// Every step succeeded.
    Booted,
    /// A step failed: the condition message, and the tail for the Event.
    Failed {
        part: String,
        message: String,
        tail: Vec<String>,
    },
    /// No report long after the infrastructure was provisioned.
    NotStarted { message: String },
    /// The report could not be read.
    Unreadable { message: String },
}

/// What the reconcile found about a machine's boot.
pub(crate) struct Facts<'a> {
    /// The Machine's name, for messages.
    pub machine: &'a str,
    /// The report, when the machine wrote one.
    pub report: Option<Result<Report, ReportError>>,
    /// Since when the Machine's infrastructure is provisioned, when it is.
    pub provisioned_since: Option<Timestamp>,
    /// How long a provisioned machine may stay silent.
    pub not_started_after: SignedDuration,
    pub now: Timestamp,
}

/// What the config shows of the boot described by `facts`.
pub(crate) fn view(facts: Facts<'_>) -> View {
    match facts.report {
        Some(Ok(report)) => from_report(facts.machine, report),
        Some(Err(e)) => View::Unreadable {
            message: format!(
                "the boot report of Machine {} is unreadable: {e}",
                facts.machine
            ),
        },
        None => match facts.provisioned_since {
            Some(since) if facts.now.duration_since(since) >= facts.not_started_after => {
                View::NotStarted {
                    message: format!(
                        "Machine {} has not reported its boot {}s after its infrastructure was \
                         provisioned (an image without cloud-init or Ignition, no network to the \
                         apiserver, or user-data that did not run)",
                        facts.machine,
                        facts.not_started_after.as_secs()
                    ),
                }
            }
            _ => View::Unknown,
        },
    }
}

fn from_report(machine: &str, report: Report) -> View {
    match (report.state, report.failure) {
        (State::Done, _) => View::Booted,
        (State::Failed, Some(f)) => View::Failed {
            message: format!(
                "Machine {machine} failed to boot: part `{}`, {} {} exited with status {}",
                f.part, f.kind, f.index, f.status
            ),
            part: f.part,
            tail: redact(&report.tail),
        },
        (State::Failed, None) => View::Failed {
            part: String::new(),
            message: format!("Machine {machine} failed to boot (the report names no step)"),
            tail: redact(&report.tail),
        },
        (State::Running, _) => View::Booting {
            part: (report.parts.iter().rev())
                .find(|p| p.end.is_none())
                .map(|p| p.name.clone())
                .unwrap_or_default(),
        },
    }
}

/// The tail with every bootstrap token and private key redacted: a second line of defence
/// behind the machine's own redaction (a tampered reporter may not redact at all). Values from
/// Secrets are redacted on the machine, which knows them.
fn redact(tail: &[String]) -> Vec<String> {
    tail.iter()
        .map(|line| render::generator::redact(&redact_tokens(line, "<redacted>"), &[]))
        .collect()
}

/// `line` with every bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`, not part of a longer word)
/// replaced by `with`.
pub fn redact_tokens(line: &str, with: &str) -> String {
    const LEN: usize = 6 + 1 + 16;
    let token_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let word_char = |b: u8| b.is_ascii_alphanumeric();
    let bytes = line.as_bytes();
    let is_token_at = |i: usize| {
        bytes.get(i..i + LEN).is_some_and(|w| {
            w[6] == b'.'
                && w[..6].iter().all(|b| token_char(*b))
                && w[7..].iter().all(|b| token_char(*b))
        }) && (i == 0 || !word_char(bytes[i - 1]))
            && bytes.get(i + LEN).is_none_or(|b| !word_char(*b))
    };
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < bytes.len() {
        if is_token_at(i) {
            out.push_str(with);
            i += LEN;
        } else {
            // Copy up to the next byte that may start a token (an ASCII boundary).
            let next = (i + 1..bytes.len())
                .find(|j| line.is_char_boundary(*j))
                .unwrap_or(bytes.len());
            out.push_str(&line[i..next]);
            i = next;
        }
    }
    out
}

/// The Event text of a failure: the message and the last lines of the tail that fit in
/// `max` characters.
pub(crate) fn event_text(message: &str, tail: &[String], max: usize) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut size = message.len() + 32;
    for line in tail.iter().rev() {
        if size + line.len() + 1 > max {
            break;
        }
        size += line.len() + 1;
        kept.push(line);
    }
    kept.reverse();
    if kept.is_empty() {
        return message.to_owned();
    }
    format!("{message}; output:\n{}", kept.join("\n"))
}

/// What a config's render knows of the machine whose boot it may report.
#[derive(Clone, Debug)]
pub(crate) struct Subject {
    /// The Machine's name.
    pub machine: String,
    /// Its Cluster's name.
    pub cluster: String,
    /// Its Cluster's UID (the scope of the cluster's report listing).
    pub cluster_uid: String,
    /// Since when its infrastructure is provisioned.
    pub provisioned_since: Option<Timestamp>,
    /// The template's `<Kind>/<name>`, the metrics' label.
    pub template: String,
    /// The part names the template's reports may name (others count as `other`).
    pub parts: Vec<String>,
}

/// When a config's reconcile looks at its machine's boot again by itself: only when a machine
/// that has not reported reaches the `BootNotStarted` deadline. A report that changes is
/// noticed by its cluster's poller, which triggers the reconcile; an ended boot is not looked
/// at again; a machine not yet provisioned is looked at when its Machine changes.
pub(crate) fn next_look(
    view: &View,
    provisioned_since: Option<Timestamp>,
    not_started_after: SignedDuration,
    now: Timestamp,
) -> Option<Duration> {
    let View::Unknown = view else {
        return None;
    };
    let deadline = provisioned_since?.checked_add(not_started_after).ok()?;
    let left = Duration::try_from(now.duration_until(deadline)).unwrap_or(Duration::ZERO);
    Some(left.max(Duration::from_secs(1)))
}

/// How long after its Machine joined a config's token is kept for the machine's last report.
/// A Node registers during `kubeadm join`, before the boot's last steps and the `done` report
/// that carries their durations; that report is written with the token.
pub(crate) const LAST_REPORT_GRACE: Duration = Duration::from_secs(60);

/// How often a joined machine's report is read again while its token waits for it.
pub(crate) const LAST_REPORT_POLL: Duration = Duration::from_secs(5);

/// Whether a joined machine's token waits for its last report, and for how long before the
/// next look: only while the report says the boot still runs and for at most
/// [`LAST_REPORT_GRACE`] after this process first saw the join (`joined_for` ago). A machine
/// that never reported, or reported its end, does not hold its token back.
pub(crate) fn wait_for_last_report(view: &View, joined_for: Duration) -> Option<Duration> {
    let View::Booting { .. } = view else {
        return None;
    };
    let left = LAST_REPORT_GRACE.checked_sub(joined_for)?;
    (!left.is_zero()).then(|| left.min(LAST_REPORT_POLL))
}

/// The longest a part may take when the machine's provisioning time is unknown.
const MAX_PART_SECONDS: i64 = 24 * 3600;

/// How far a machine's clock may run ahead of the controller's.
const CLOCK_ALLOWANCE_SECONDS: i64 = 600;

/// The durations of the parts that ended, for the metric. The times are the machine's (a node
/// may be hostile, its clock wrong): a part that ends before it starts, or that took longer than
/// the machine has been provisioned (plus [`CLOCK_ALLOWANCE_SECONDS`]; a day when that is not
/// known), is not observed, so no node can put an absurd value in a histogram every tenant
/// reads. The labels are not the node's either: the caller maps part names to the template's.
pub(crate) fn durations(
    report: &Report,
    provisioned_since: Option<Timestamp>,
    now: Timestamp,
) -> impl Iterator<Item = (&str, f64)> {
    let window = provisioned_since.map_or(MAX_PART_SECONDS, |since| {
        now.as_second().saturating_sub(since.as_second()).max(0) + CLOCK_ALLOWANCE_SECONDS
    });
    report.parts.iter().filter_map(move |p| {
        let seconds = p.end?.checked_sub(p.start)?;
        (0..=window)
            .contains(&seconds)
            .then_some((p.name.as_str(), seconds as f64))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(text: &str) -> String {
        BASE64.encode(text)
    }

    const FAILED: &str = "bootplate-boot-report 1\nstate failed\nstarted 100\ntime 130\n\
        part 100 110 install\npart 110 - join\nfailed command 2 7 join\ntail\n\
        kubeadm: error\ncould not join with abcdef.0123456789abcdef\n";

    #[test]
    fn reports_are_read() {
        // The report, and its state, part count, failed part and tail length when readable.
        type Read<'a> = Result<(State, usize, Option<&'a str>, usize), ReportError>;
        let cases: &[(&str, Read<'_>)] = &[
            (FAILED, Ok((State::Failed, 2, Some("join"), 2))),
            (
                "bootplate-boot-report 1\nstate running\ntime 5\npart 1 - a b\n",
                Ok((State::Running, 1, None, 0)),
            ),
            (
                "bootplate-boot-report 1\nstate done\ntime 5\n",
                Ok((State::Done, 0, None, 0)),
            ),
            ("hello\n", Err(ReportError::NotAReport)),
            (
                "bootplate-boot-report 1\nstate sideways\n",
                Err(ReportError::Malformed(2)),
            ),
            (
                "bootplate-boot-report 1\npart x - a\n",
                Err(ReportError::Malformed(2)),
            ),
            (
                "bootplate-boot-report 1\nfailed shell 1 1 a\n",
                Err(ReportError::Malformed(2)),
            ),
            (
                "bootplate-boot-report 1\nrm -rf /\n",
                Err(ReportError::Malformed(2)),
            ),
        ];
        for (text, want) in cases {
            let got = parse(&encode(text)).map(|r| {
                let part = r.failure.as_ref().map(|f| f.part.as_str());
                (
                    r.state,
                    r.parts.len(),
                    part.map(str::to_owned),
                    r.tail.len(),
                )
            });
            let want = want
                .clone()
                .map(|(s, n, p, t)| (s, n, p.map(str::to_owned), t));
            assert_eq!(got, want, "{text:?}");
        }
    }

    #[test]
    fn only_plausible_part_durations_are_observed() {
        let since = Some(Timestamp::from_second(1_000).unwrap());
        let now = Timestamp::from_second(1_000 + 3_600).unwrap();
        // Parts as the machine wrote them, when it was provisioned, and what is observed.
        type Observed<'a> = &'a [(&'a str, f64)];
        let cases: &[(&str, Option<Timestamp>, Observed<'_>)] = &[
            (
                "part 100 110 install\npart 110 - join\n",
                since,
                &[("install", 10.0)],
            ),
            ("part 0 9223372036854775807 join\n", since, &[]),
            ("part 0 9223372036854775807 join\n", None, &[]),
            (
                "part -9223372036854775808 9223372036854775807 join\n",
                None,
                &[],
            ),
            ("part 200 100 join\n", since, &[]),
            // Within the hour since provisioning, plus the clock allowance; not past it.
            ("part 0 3900 a\npart 0 4300 b\n", since, &[("a", 3900.0)]),
            // Without a provisioning time, a day at most.
            ("part 0 86400 a\npart 0 86401 b\n", None, &[("a", 86_400.0)]),
        ];
        for (parts, since, want) in cases {
            let report = parse(&encode(&format!(
                "bootplate-boot-report 1\nstate done\n{parts}"
            )))
            .unwrap();
            let got: Vec<(&str, f64)> = durations(&report, *since, now).collect();
            assert_eq!(got, *want, "{parts:?}");
        }
    }

    #[test]
    fn hostile_reports_are_bounded() {
        let huge = "A".repeat(MAX_ENCODED + 1);
        assert_eq!(parse(&huge), Err(ReportError::TooLarge(MAX_ENCODED + 1)));
        assert_eq!(parse("not base64!"), Err(ReportError::NotBase64));
        let parts = "part 1 2 p\n".repeat(MAX_PARTS + 1);
        let text = format!("bootplate-boot-report 1\n{parts}");
        assert_eq!(parse(&encode(&text)), Err(ReportError::TooManyParts));
        let long = format!(
            "bootplate-boot-report 1\nstate failed\npart 1 - {}\x1b[31m\ntail\n{}",
            "n".repeat(500),
            "line\n".repeat(300)
        );
        let report = parse(&encode(&long)).unwrap();
        assert_eq!(report.parts[0].name.len(), MAX_NAME);
        assert_eq!(report.tail.len(), MAX_TAIL_LINES);
        let wide = format!("bootplate-boot-report 1\ntail\n{}\n", "w".repeat(5000));
        assert_eq!(parse(&encode(&wide)).unwrap().tail[0].len(), MAX_LINE);
    }

    #[test]
    fn what_the_config_shows() {
        let now = Timestamp::from_second(10_000).unwrap();
        let after = SignedDuration::from_secs(600);
        let facts = |report: Option<&str>, since: Option<i64>| Facts {
            machine: "m-0",
            report: report.map(|t| parse(&encode(t))),
            provisioned_since: since.map(|s| Timestamp::from_second(s).unwrap()),
            not_started_after: after,
            now,
        };
        let failed = view(facts(Some(FAILED), None));
        let View::Failed {
            part,
            message,
            tail,
        } = failed
        else {
            panic!("{failed:?}")
        };
        assert_eq!(part, "join");
        assert_eq!(
            message,
            "Machine m-0 failed to boot: part `join`, command 2 exited with status 7"
        );
        assert_eq!(tail[1], "could not join with <redacted>");
        let running = "bootplate-boot-report 1\nstate running\npart 1 2 a\npart 2 - b\n";
        let cases = [
            (facts(Some(running), None), "Booting b"),
            (
                facts(Some("bootplate-boot-report 1\nstate done\n"), None),
                "Booted",
            ),
            (facts(None, None), "Unknown"),
            (facts(None, Some(10_000 - 599)), "Unknown"),
            (facts(None, Some(10_000 - 600)), "NotStarted"),
            (facts(Some("garbage"), Some(0)), "Unreadable"),
        ];
        for (facts, want) in cases {
            let got = match view(facts) {
                View::Booting { part } => format!("Booting {part}"),
                View::Booted => "Booted".into(),
                View::Unknown => "Unknown".into(),
                View::NotStarted { message } => {
                    assert!(message.contains("600s"), "{message}");
                    "NotStarted".into()
                }
                View::Unreadable { message } => {
                    assert!(message.contains("not a bootplate boot report"), "{message}");
                    "Unreadable".into()
                }
                View::Failed { .. } => "Failed".into(),
            };
            assert_eq!(got, want);
        }
    }

    #[test]
    fn tokens_and_keys_are_redacted_again() {
        let cases = [
            ("join abcdef.0123456789abcdef now", "join <redacted> now"),
            ("--token=abcdef.0123456789abcdef", "--token=<redacted>"),
            ("abcdef.0123456789abcdef", "<redacted>"),
            ("xabcdef.0123456789abcdef", "xabcdef.0123456789abcdef"),
            ("abcdef.0123456789abcdefx", "abcdef.0123456789abcdefx"),
            ("ABCDEF.0123456789ABCDEF", "ABCDEF.0123456789ABCDEF"),
            ("é abcdef.0123456789abcdef é", "é <redacted> é"),
            (
                "-----BEGIN RSA PRIVATE KEY-----",
                "(the message held a private key and is not shown)",
            ),
            ("plain output", "plain output"),
        ];
        for (line, want) in cases {
            assert_eq!(redact(&[line.to_owned()]), [want], "{line}");
        }
    }

    #[test]
    fn the_event_keeps_the_last_lines_that_fit() {
        let tail: Vec<String> = (0..40).map(|i| format!("line {i:02}")).collect();
        let text = event_text("failed", &tail, 100);
        assert!(text.starts_with("failed; output:\n"), "{text}");
        assert!(text.ends_with("line 39"), "{text}");
        assert!(text.len() <= 100, "{}", text.len());
        assert_eq!(event_text("failed", &[], 100), "failed");
    }

    /// Each case: the view, how long ago the join was first seen (seconds), and the wait.
    #[test]
    fn a_joined_machine_token_waits_for_the_last_report_only_while_the_boot_runs() {
        let booting = View::Booting {
            part: "post".into(),
        };
        let secs = Duration::from_secs;
        let cases = [
            (booting.clone(), 0, Some(LAST_REPORT_POLL)),
            (booting.clone(), 58, Some(secs(2))),
            (booting.clone(), 60, None),
            (booting, 600, None),
            (View::Booted, 0, None),
            (View::Unknown, 0, None),
            (
                View::Failed {
                    part: "post".into(),
                    message: String::new(),
                    tail: vec![],
                },
                0,
                None,
            ),
        ];
        for (i, (view, joined_for, wait)) in cases.into_iter().enumerate() {
            assert_eq!(
                wait_for_last_report(&view, secs(joined_for)),
                wait,
                "case {i}"
            );
        }
    }

    /// Each case: the view, how long ago the machine was provisioned (seconds; `None`: not
    /// yet), and when the config looks again by itself (deadline 600 s).
    #[test]
    fn only_a_silent_provisioned_machine_is_looked_at_again_by_its_deadline() {
        let booting = View::Booting {
            part: "join".into(),
        };
        let not_started = View::NotStarted {
            message: String::new(),
        };
        let secs = Duration::from_secs;
        let cases = [
            (View::Unknown, Some(0), Some(secs(600))),
            (View::Unknown, Some(599), Some(secs(1))),
            (View::Unknown, Some(100), Some(secs(500))),
            // Past the deadline (a view computed an instant earlier): soon, not never.
            (View::Unknown, Some(900), Some(secs(1))),
            (View::Unknown, None, None),
            (booting, Some(10), None),
            (not_started, Some(900), None),
            (View::Booted, Some(10), None),
        ];
        let now = Timestamp::from_second(1_000_000).unwrap();
        let deadline = SignedDuration::from_secs(600);
        for (i, (view, ago, want)) in cases.into_iter().enumerate() {
            let since = ago.map(|a| now - SignedDuration::from_secs(a));
            assert_eq!(next_look(&view, since, deadline, now), want, "case {i}");
        }
    }
}
