//! Lint of the Windows formats' templates, on the template's own texts (each finding at its
//! field, line and column):
//! - a raw `windows-cloud-config` directive cloudbase-init does not run (error
//!   `cloudbase-init-unsupported`: it would log "not supported" and skip it);
//! - PowerShell that does not parse (error `powershell-syntax`), in every text that is
//!   PowerShell: commands, a raw `powershell`/`powershell-aws` template, `.ps1` files; the
//!   mustaches are masked first (see [`crate::powershell::mask_mustaches`]);
//! - a Linux path (`/etc/…`, `/usr/…`) anywhere (warning `linux-path`), and a POSIX shell
//!   construct in PowerShell (warning `shell-construct`: `fi`, `set -e`, `[ -f … ]`, a heredoc,
//!   and `&&`/`||`, which Windows PowerShell 5.1 does not know).

use std::sync::LazyLock;

use crd_types::{OutputFormat, TemplateSpec};
use regex::Regex;

use crate::error::{Position, Problem};
use crate::formats::CLOUDBASE_INIT_DIRECTIVES;
use crate::powershell::{mask_mustaches, syntax_errors};

/// How many syntax errors one text reports: the first ones; the rest often follow from them.
const MAX_SYNTAX_ERRORS: usize = 3;

/// A Linux path: `/etc/`, `/usr/`, … at the start of a word, a string or a value.
static LINUX_PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?m)(?:^|[\s'"=(,\[:])(/(?:etc|usr|var|opt|run|bin|sbin|lib|lib64|home|root|tmp|srv|proc|sys)/)"#)
        .expect("a valid pattern")
});

/// POSIX shell that PowerShell does not run (or, for `&&` and `||`, only from version 7).
static SHELL_CONSTRUCT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?m)^[ \t]*(?:(fi|then|esac|done|elif)\b|(set -[euox]+)\b|(export [A-Za-z_][A-Za-z0-9_]*=)|(#!/)|(\[ -[a-z] ))|(;\s*(?:then|do)\s*$)|(<<-?'?[A-Z_]+'?\s*$)|\s(&&|\|\|)\s"#,
    )
    .expect("a valid pattern")
});

/// The Windows lint of `spec` (nothing for the other formats).
pub(crate) fn check(spec: &TemplateSpec) -> Vec<Problem> {
    if !spec.format.is_windows() {
        return Vec::new();
    }
    let mut problems = Vec::new();
    let powershell_raw = matches!(
        spec.format,
        OutputFormat::Powershell | OutputFormat::PowershellAws
    );
    if let Some(text) = &spec.template {
        if spec.format == OutputFormat::WindowsCloudConfig {
            unsupported_directives(text, &mut problems);
        }
        text_checks("spec.template", text, powershell_raw, &mut problems);
    }
    for (name, text) in &spec.partials {
        linux_paths(&format!("spec.partials.{name}"), text, &mut problems);
    }
    for (i, part) in spec.parts.iter().enumerate() {
        for (j, command) in part.commands.iter().enumerate() {
            let field = format!("spec.parts[{i}].commands[{j}]");
            text_checks(&field, command, true, &mut problems);
        }
        for (j, file) in part.files.iter().enumerate() {
            let field = format!("spec.parts[{i}].files[{j}]");
            linux_paths(&format!("{field}.path"), &file.path, &mut problems);
            let ps1 = file.path.to_ascii_lowercase().ends_with(".ps1");
            text_checks(
                &format!("{field}.content"),
                &file.content,
                ps1,
                &mut problems,
            );
        }
    }
    problems
}

/// Linux paths in `text`; when it is PowerShell, its syntax and shell constructs too.
fn text_checks(field: &str, text: &str, powershell: bool, problems: &mut Vec<Problem>) {
    linux_paths(field, text, problems);
    if !powershell {
        return;
    }
    let masked = mask_mustaches(text);
    for e in syntax_errors(&masked, MAX_SYNTAX_ERRORS) {
        problems.push(
            Problem::template(field, e.message)
                .at(Some(Position {
                    line: e.line,
                    column: e.column,
                }))
                .with_code("powershell-syntax"),
        );
    }
    for m in SHELL_CONSTRUCT.captures_iter(&masked) {
        let Some(found) = m.iter().skip(1).flatten().next() else {
            continue;
        };
        let what = found.as_str().trim();
        let message = if what == "&&" || what == "||" {
            format!(
                "`{what}` is PowerShell 7 syntax: Windows PowerShell 5.1, which cloudbase-init and EC2Launch run, cannot parse it (use `if ($LASTEXITCODE -ne 0) {{ … }}`)"
            )
        } else {
            format!(
                "`{what}` is POSIX shell, not PowerShell: Windows formats run their commands with PowerShell"
            )
        };
        problems.push(
            Problem::template(field, message)
                .at(Some(position(text, found.start())))
                .warning()
                .with_code("shell-construct"),
        );
    }
}

fn linux_paths(field: &str, text: &str, problems: &mut Vec<Problem>) {
    for m in LINUX_PATH.captures_iter(text) {
        let Some(path) = m.get(1) else { continue };
        problems.push(
            Problem::template(
                field,
                format!(
                    "`{}…` is a Linux path, in a template for Windows (paths there look like C:\\k\\…)",
                    path.as_str()
                ),
            )
            .at(Some(position(text, path.start())))
            .warning()
            .with_code("linux-path"),
        );
    }
}

/// The top-level keys of a raw cloud-config text (lines starting with a name and `:`) that
/// cloudbase-init does not run.
fn unsupported_directives(text: &str, problems: &mut Vec<Problem>) {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let key: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        if !key.is_empty()
            && line[key.len()..].starts_with(':')
            && !CLOUDBASE_INIT_DIRECTIVES.contains(&key.as_str())
        {
            problems.push(
                Problem::template(
                    "spec.template",
                    format!(
                        "cloudbase-init does not run the cloud-config directive `{key}`: it logs \"not supported\" and skips it (it runs {})",
                        CLOUDBASE_INIT_DIRECTIVES.join(", ")
                    ),
                )
                .at(Some(position(text, offset)))
                .with_code("cloudbase-init-unsupported"),
            );
        }
        offset += line.len();
    }
}

/// The line and column (from 1, in characters) of byte `offset` of `text`.
fn position(text: &str, offset: usize) -> Position {
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Position {
        line: before.matches('\n').count() + 1,
        column: before[line_start..].chars().count() + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> TemplateSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn found(spec: &TemplateSpec) -> Vec<String> {
        check(spec)
            .iter()
            .map(|p| {
                let at = p.position.map_or(String::new(), |p| format!("{p}"));
                format!("{} {} {}", p.code, p.field, at)
            })
            .collect()
    }

    #[test]
    fn an_unsupported_directive_is_found_at_its_line() {
        let s = spec(
            "os: {name: windows}\nformat: windows-cloud-config\nbootReports: Disabled\ntemplate: |\n  #cloud-config\n  bootcmd: [x]\n  runcmd: [dir]\n  mounts: []\n",
        );
        assert_eq!(
            found(&s),
            [
                "cloudbase-init-unsupported spec.template line 2, column 1",
                "cloudbase-init-unsupported spec.template line 4, column 1"
            ]
        );
    }

    #[test]
    fn powershell_syntax_linux_paths_and_shell_are_found_where_they_are() {
        let s = spec(concat!(
            "os: {name: windows}\nformat: powershell\nbootReports: Disabled\nparts:\n- name: p\n",
            "  files:\n  - path: C:\\k\\a.ps1\n    content: \"Write-Output (1\\n\"\n",
            "  commands:\n  - \"Write-Output {{ps_quote values.x}}\\nif ($a) { 'b' }\"\n",
            "  - \"Get-Content /etc/hosts\\nset -e\\nfoo && bar\"\n",
        ));
        let found = found(&s);
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("powershell-syntax spec.parts[0].files[0].content line 1")),
            "{found:?}"
        );
        assert!(
            found.contains(&"linux-path spec.parts[0].commands[1] line 1, column 13".to_owned()),
            "{found:?}"
        );
        assert!(
            found
                .contains(&"shell-construct spec.parts[0].commands[1] line 2, column 1".to_owned()),
            "{found:?}"
        );
        assert!(
            found
                .contains(&"shell-construct spec.parts[0].commands[1] line 3, column 5".to_owned()),
            "{found:?}"
        );
        assert!(
            !found.iter().any(|f| f.contains("commands[0]")),
            "{found:?}"
        );
    }
}
