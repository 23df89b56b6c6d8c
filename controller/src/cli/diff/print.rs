//! `bootplate diff`'s report as text, JSON or GitHub-flavoured markdown.

use std::fmt::Write as _;

use serde_json::json;

use super::judge::{ObjectDiff, Presence, RoleDiff, Verdict};
use super::parts::PartDiff;
use super::{DiffFormat, EXIT_REPLACEMENT};

/// Prints the report of `objects`, whose exit code is `code`, to standard output.
pub fn print(format: DiffFormat, objects: &[ObjectDiff], code: u8) {
    let out = match format {
        DiffFormat::Text => text(objects),
        DiffFormat::Json => json(objects, code),
        DiffFormat::Markdown => markdown(objects),
    };
    print!("{out}");
}

/// The overall verdict: the worst of every role's.
pub fn overall(objects: &[ObjectDiff]) -> &'static str {
    let verdicts: Vec<Verdict> = (objects.iter().flat_map(|o| &o.roles))
        .map(|r| r.verdict)
        .collect();
    let any = |v| verdicts.contains(&v);
    if any(Verdict::Fails) {
        "fails"
    } else if any(Verdict::Replacement) {
        "replacement"
    } else if any(Verdict::InPlace) {
        "in-place"
    } else {
        "unchanged"
    }
}

fn json(objects: &[ObjectDiff], code: u8) -> String {
    let document = json!({
        "verdict": overall(objects),
        "exitCode": code,
        "replacement": code == EXIT_REPLACEMENT,
        "objects": objects,
    });
    format!("{document:#}\n")
}

/// The object's name and files, for a heading.
fn heading(o: &ObjectDiff) -> String {
    let files = match (&o.old_file, &o.new_file) {
        (Some(a), Some(b)) if a == b => a.clone(),
        (Some(a), Some(b)) => format!("{a} -> {b}"),
        (Some(a), None) | (None, Some(a)) => a.clone(),
        (None, None) => String::new(),
    };
    let renamed = (o.renamed_from.as_ref())
        .map(|r| format!(", was {r}"))
        .unwrap_or_default();
    format!("{}{renamed} ({files})", o.key)
}

/// One role's verdict in a sentence.
fn summary(r: &RoleDiff) -> String {
    let mut s = r.verdict.words().to_owned();
    if !r.in_place_parts.is_empty() {
        let parts: Vec<String> = r.in_place_parts.iter().map(|p| format!("`{p}`")).collect();
        let _ = write!(s, ": parts {}", parts.join(", "));
    }
    if let Some(reason) = &r.reason {
        let _ = write!(s, ": {reason}");
    }
    s
}

/// What bootplate-agent does, in a sentence.
fn agent(r: &RoleDiff) -> Option<String> {
    let a = r.agent.as_ref()?;
    let list = |what: &str, items: &[String]| {
        (!items.is_empty()).then(|| format!("{what} {}", items.join(", ")))
    };
    let steps: Vec<String> = [
        list("writes", &a.write),
        list("removes", &a.remove),
        list("restarts", &a.restart),
        list("runs the commands of parts", &a.run_commands_of),
    ]
    .into_iter()
    .flatten()
    .collect();
    Some(match steps.is_empty() {
        true => "bootplate-agent has nothing to do".to_owned(),
        false => format!("bootplate-agent {}", steps.join("; ")),
    })
}

fn part_title(p: &PartDiff) -> String {
    match p.update {
        Some(update) => format!("part `{}` ({update}, {})", p.part, p.change),
        None => format!("{} ({})", p.part, p.change),
    }
}

fn text(objects: &[ObjectDiff]) -> String {
    let mut out = String::new();
    for o in objects {
        let _ = writeln!(out, "{}", heading(o));
        match o.presence {
            Presence::Added => out.push_str("  added: no running machine has it yet\n"),
            Presence::Removed => out.push_str("  removed\n"),
            Presence::Both => {}
        }
        for r in &o.roles {
            let _ = writeln!(out, "  {}: {}", r.role, summary(r));
            if let Some(agent) = agent(r) {
                let _ = writeln!(out, "    {agent}");
            }
            for p in &r.parts {
                let _ = writeln!(out, "    {}", part_title(p));
                for line in p.diff.lines() {
                    let _ = writeln!(out, "      {line}");
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "verdict: {} ({} object{})",
        overall(objects),
        objects.len(),
        if objects.len() == 1 { "" } else { "s" }
    );
    out
}

fn markdown(objects: &[ObjectDiff]) -> String {
    let mut out = format!(
        "### bootplate diff: {}\n\n| object | role | verdict | why |\n|---|---|---|---|\n",
        overall(objects)
    );
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    for o in objects {
        let name = cell(&o.key.to_string());
        match o.presence {
            Presence::Added => {
                let _ = writeln!(out, "| {name} | | added | no running machine has it yet |");
            }
            Presence::Removed => {
                let _ = writeln!(out, "| {name} | | removed | |");
            }
            Presence::Both => {}
        }
        for r in &o.roles {
            let mut why = summary(r);
            if let Some(agent) = agent(r) {
                why = format!("{why}; {agent}");
            }
            let verdict = match r.verdict {
                Verdict::Replacement | Verdict::Fails => format!("**{}**", r.verdict.words()),
                v => v.words().to_owned(),
            };
            let _ = writeln!(out, "| {name} | {} | {verdict} | {} |", r.role, cell(&why));
        }
    }
    for o in objects {
        for r in o.roles.iter().filter(|r| !r.parts.is_empty()) {
            let _ = write!(
                out,
                "\n<details><summary>{} — {}: {}</summary>\n\n",
                cell(&o.key.to_string()),
                r.role,
                r.verdict.words()
            );
            for p in &r.parts {
                let fence = fence(&p.diff);
                let _ = write!(
                    out,
                    "{}\n\n{fence}diff\n{}{fence}\n\n",
                    part_title(p),
                    p.diff
                );
            }
            out.push_str("</details>\n");
        }
    }
    out
}

/// A code fence longer than any run of backticks in `text`, so a diff cannot close it.
fn fence(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}
