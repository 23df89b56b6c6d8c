//! Checks of lint's sample renders by programs outside bootplate: `bash -n` on the shell the
//! output runs (always, when bash is installed), and with `--tools` the consumers' own
//! validators when installed: `cloud-init schema`, `ignition-validate`, `shellcheck`.

use std::io::Write;
use std::process::{Command, Stdio};

use crd_types::{OutputFormat, Role};

/// One program's complaint about the output of one role.
pub struct ToolProblem {
    pub role: Role,
    pub tool: &'static str,
    pub message: String,
}

/// Whether `program` can be run.
fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Runs `program args` with `input` on standard input (or in a temporary file named by `{}`
/// in `args`); the first lines of its complaint when it fails.
fn run(program: &str, args: &[&str], input: &[u8]) -> Option<String> {
    let dir = tempfile_dir()?;
    let path = dir.join("user-data");
    std::fs::write(&path, input).ok()?;
    let path = path.to_string_lossy().into_owned();
    let args: Vec<String> = args.iter().map(|a| a.replace("{}", &path)).collect();
    let mut child = Command::new(program)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input);
    }
    let out = child.wait_with_output().ok()?;
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        return None;
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(6)
        .collect();
    Some(lines.join(" | ").replace(&path, "<output>"))
}

fn tempfile_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "bootplate-lint-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir(&dir).ok()?;
    Some(dir)
}

/// The shell the output runs: a script whole, the `runcmd` and `bootcmd` strings of a
/// cloud-config one by one.
fn shell_texts(format: OutputFormat, data: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(data);
    match format {
        OutputFormat::Script => vec![text.into_owned()],
        OutputFormat::CloudConfig => {
            let limit = render::yaml::YamlLimit::document(&text);
            let Ok(doc) = render::yaml::from_str::<serde_yaml::Value>(&text, limit) else {
                return Vec::new();
            };
            ["bootcmd", "runcmd"]
                .iter()
                .filter_map(|k| doc.get(*k).and_then(|v| v.as_sequence()))
                .flatten()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// The problems the programs find in the sample renders.
pub fn check(
    format: OutputFormat,
    renders: &[(Role, Vec<u8>)],
    external: bool,
) -> Vec<ToolProblem> {
    let mut out = Vec::new();
    let mut push = |role, tool, message: Option<String>| {
        if let Some(message) = message {
            out.push(ToolProblem {
                role,
                tool,
                message,
            });
        }
    };
    for (role, data) in renders {
        if installed("bash") {
            for text in shell_texts(format, data) {
                push(
                    *role,
                    "bash -n",
                    run("bash", &["-n", "{}"], text.as_bytes()),
                );
            }
        }
        if !external {
            continue;
        }
        match format {
            OutputFormat::CloudConfig | OutputFormat::MimeMultipart if installed("cloud-init") => {
                push(
                    *role,
                    "cloud-init schema",
                    run("cloud-init", &["schema", "--config-file", "{}"], data),
                );
            }
            OutputFormat::Ignition if installed("ignition-validate") => {
                push(
                    *role,
                    "ignition-validate",
                    run("ignition-validate", &["{}"], data),
                );
            }
            OutputFormat::Script if installed("shellcheck") => {
                push(
                    *role,
                    "shellcheck",
                    run("shellcheck", &["-S", "error", "{}"], data),
                );
            }
            _ => {}
        }
    }
    out
}
