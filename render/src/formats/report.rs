//! The boot reporter: the steps of a structured body (files the script format writes, unit
//! commands, each part's commands), each announced to a small POSIX sh library
//! (`boot-report.sh`) that records part starts and ends and the first failure, and sends them to
//! the workload apiserver (docs/boot-channel.md).

use std::sync::LazyLock;

use crd_types::FileEncoding;

use super::{SENTINEL, enable_commands};
use crate::body::Body;
use crate::context::BootReport;
use crate::files::File;
use crate::helpers::quote;

/// Where the library (with this machine's settings and token: root only) and the CA go.
pub(super) const LIBRARY_PATH: &str = "/etc/bootplate/boot-report.sh";
const CA_PATH: &str = "/etc/bootplate/boot-report-ca.crt";

/// The functions, the same in every render, as written (with their comments).
const LIBRARY: &str = include_str!("boot-report.sh");

/// The functions as machines get them: [`LIBRARY`] without its comment lines and blank lines,
/// which were a quarter of it (1.6 KB of every reporting machine's user-data, where clouds cap
/// user-data at 16 KB), under a line that says where the commented source is. The
/// `# shellcheck` directives stay: the embedded copy is what shellcheck checks. Every line
/// whose first non-blank character is `#` is a comment in the library, for sh and for its awk
/// program alike, and it holds no heredoc, whose lines would be data (tested).
static FUNCTIONS: LazyLock<String> = LazyLock::new(|| without_comments(LIBRARY));

/// `source` without its blank lines and its comment lines, `# shellcheck` directives kept.
fn without_comments(source: &str) -> String {
    let mut out = String::from(
        "# bootplate boot reporter, comments removed (docs/boot-channel.md; the source is \
         render/src/formats/boot-report.sh)\n",
    );
    for line in source.lines() {
        let code = line.trim_start();
        if code.is_empty() || (code.starts_with('#') && !code.starts_with("# shellcheck ")) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Part names the reporter gives to steps outside the template's parts.
pub(crate) const UNITS_PART: &str = "units";
pub(crate) const FILES_PART: &str = "files";

/// One step of the boot: what the reporter names it and the shell text that runs it.
pub(super) struct Step {
    pub(super) part: String,
    pub(super) kind: &'static str,
    pub(super) index: usize,
    pub(super) command: String,
}

/// The steps after the files are in place: `daemon-reload` and the units' `enable` (unless
/// the format declares units natively), the config's pre-commands, each part's commands, the
/// config's post-commands, the `enable` of units the commands install.
pub(super) fn steps(body: &Body, native_units: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut push = |part: &str, kind, command: String| {
        let index = steps
            .iter()
            .rev()
            .take_while(|s: &&Step| s.part == part && s.kind == kind)
            .count();
        steps.push(Step {
            part: part.to_owned(),
            kind,
            index,
            command,
        });
    };
    if !native_units {
        for c in super::unit_commands(body) {
            push(UNITS_PART, "unit", c);
        }
    }
    let mut commands = body.commands.iter();
    for (part, count) in &body.command_parts {
        for c in commands.by_ref().take(*count) {
            push(part, "command", c.clone());
        }
    }
    // A body built without part spans (none today) still reports its commands.
    for c in commands {
        push(crate::body::POST_COMMANDS, "command", c.clone());
    }
    for c in enable_commands(body, false) {
        push(UNITS_PART, "unit", c);
    }
    steps
}

/// The shell lines of `steps` and (with `sentinel`) the sentinel: with a reporter, each step is announced first,
/// the reporter starts before them (unless `started`: the script format starts it before
/// writing the files) and is told at the end that everything succeeded.
pub(super) fn lay_out(
    steps: Vec<Step>,
    report: Option<&BootReport>,
    started: bool,
    sentinel: bool,
) -> Vec<String> {
    let mut out = Vec::with_capacity(steps.len() * 2 + 4);
    if report.is_some() && !started {
        out.extend(start());
    }
    for step in steps {
        if report.is_some() {
            out.push(announce(&step.part, step.kind, step.index));
        }
        out.push(step.command);
    }
    if sentinel {
        out.extend(SENTINEL.iter().map(|s| (*s).to_owned()));
    }
    if report.is_some() {
        out.push("bootplate_report_done".to_owned());
    }
    out
}

/// Loads the library and starts the reporter (the directive tells shellcheck that the file is
/// not there to read when it checks the user-data).
pub(super) fn start() -> [String; 3] {
    [
        "# shellcheck source=/dev/null".to_owned(),
        format!(". {LIBRARY_PATH}"),
        "bootplate_report_start".to_owned(),
    ]
}

/// The line that tells the reporter the next step.
pub(super) fn announce(part: &str, kind: &str, index: usize) -> String {
    format!("bootplate_step {} {kind} {index}", quote(part))
}

/// The reporter's files: the library with this machine's settings (root only: it holds the
/// token) and the CA that signs the apiserver's certificate.
pub(super) fn files(report: &BootReport) -> [File; 2] {
    let file = |path: &str, permissions: &str, content: String| File {
        path: path.to_owned(),
        permissions: permissions.to_owned(),
        owner: "root:root".to_owned(),
        content,
        encoding: FileEncoding::Plain,
    };
    let mut ca = report.ca_pem.clone();
    if !ca.ends_with('\n') {
        ca.push('\n');
    }
    [
        file(LIBRARY_PATH, "0700", library(report)),
        file(CA_PATH, "0644", ca),
    ]
}

/// The settings, the secrets to redact and the functions.
fn library(report: &BootReport) -> String {
    let mut secrets: Vec<&str> = vec![&report.token];
    if let Some((_, secret)) = report.token.split_once('.') {
        secrets.push(secret);
    }
    let extra = report.secrets.iter().flat_map(|s| s.lines());
    secrets.extend(extra.map(str::trim).filter(|l| l.len() >= 4));
    let mut list = secrets.join("\n");
    list.push('\n');
    let delimiter = delimiter(&list);
    format!(
        "BOOTPLATE_REPORT_SERVER={}\nBOOTPLATE_REPORT_CA={CA_PATH}\n\
         BOOTPLATE_REPORT_NAMESPACE={}\nBOOTPLATE_REPORT_NAME={}\nBOOTPLATE_REPORT_META={}\n\
         BOOTPLATE_REPORT_TOKEN={}\n\
         BOOTPLATE_REPORT_INTERVAL={}\n\
         bootplate_report_secrets() {{\n  cat <<'{delimiter}'\n{list}{delimiter}\n}}\n{}",
        quote(&report.server),
        quote(&report.namespace),
        quote(&report.name),
        quote(&report.metadata),
        quote(&report.token),
        report.min_interval_seconds,
        *FUNCTIONS,
    )
}

/// A heredoc delimiter that is not a line of `data`.
pub(super) fn delimiter(data: &str) -> String {
    let mut candidate = "BOOTPLATE_EOF".to_owned();
    let mut n = 0;
    while data.lines().any(|l| l == candidate) {
        n += 1;
        candidate = format!("BOOTPLATE_EOF_{n}");
    }
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_library_drops_comment_and_blank_lines_only() {
        let source = "# a comment\nf() {\n\n  # shellcheck disable=SC2317\n  g # not alone\n    # indented\n}\n";
        assert_eq!(
            without_comments(source).lines().skip(1).collect::<Vec<_>>(),
            [
                "f() {",
                "  # shellcheck disable=SC2317",
                "  g # not alone",
                "}"
            ]
        );
        // Every code line of the library is kept, in order.
        let code: Vec<&str> = LIBRARY
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .collect();
        let embedded: Vec<&str> = FUNCTIONS
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        assert_eq!(embedded, code);
        assert!(
            FUNCTIONS.len() * 5 < LIBRARY.len() * 4,
            "{}",
            FUNCTIONS.len()
        );
    }

    #[test]
    fn the_library_has_no_heredoc_whose_lines_could_be_taken_for_comments() {
        assert!(!LIBRARY.contains("<<"));
    }

    #[test]
    fn delimiter_avoids_content_lines() {
        assert_eq!(delimiter("a\n"), "BOOTPLATE_EOF");
        assert_eq!(
            delimiter("BOOTPLATE_EOF\nBOOTPLATE_EOF_1\n"),
            "BOOTPLATE_EOF_2"
        );
    }

    #[test]
    fn steps_are_numbered_within_their_part() {
        let body = Body {
            commands: ["pre", "a0", "a1", "b0", "post"]
                .map(str::to_owned)
                .to_vec(),
            command_parts: [("preCommands", 1), ("a", 2), ("b", 1), ("postCommands", 1)]
                .map(|(p, n)| (p.to_owned(), n))
                .to_vec(),
            ..Body::default()
        };
        let named: Vec<String> = steps(&body, false)
            .iter()
            .map(|s| format!("{} {} {} {}", s.part, s.kind, s.index, s.command))
            .collect();
        assert_eq!(
            named,
            [
                "preCommands command 0 pre",
                "a command 0 a0",
                "a command 1 a1",
                "b command 0 b0",
                "postCommands command 0 post"
            ]
        );
    }
}
