//! `bootplate lint`: checks template files before they are published, with the checks the
//! controller runs for a template's `Valid` condition plus the static ones, and prints each
//! problem as `FILE:LINE:COL: severity: field: message`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crd_types::BootplateConfigSpec;
use render::{Origin, Problem, Severity};

use super::input::{InputError, Positions, TEMPLATE_KINDS, YamlFile, kind, template};
use super::{EXIT_FAILED, EXIT_INPUT, EXIT_OK, exit};

/// Arguments of `bootplate lint`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Each file may hold several YAML documents; every BootstrapTemplate and ClusterBootstrapTemplate
in it is checked:
  - every template text and partial parses; partial references exist and do not recurse;
    nesting and size stay within the engine's limits;
  - variable declarations are valid (names, patterns, defaults fit their schema), every
    `values.X` a template reads is declared, every declared variable is read (warning);
  - a render with sample values succeeds for each role (init, control-plane-join, worker) and
    its output passes the format check (cloud-config header and YAML, Ignition 3.x JSON, `#!`).

Problems are printed to standard output, one per line:
  FILE:LINE:COL: error: spec.parts[1].commands[0]: undefined variable `values.x` (role worker)
LINE:COL point into FILE (exactly for one-line strings and `|` blocks).

Exit codes: 0 no errors (warnings allowed), 1 errors found, 2 bad usage or unreadable input.")]
pub struct LintArgs {
    /// Template files (YAML) to check.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// A BootplateConfig whose variables (and files, commands) the sample renders use, for
    /// required variables lint cannot make a sample value for.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Runs `bootplate lint`.
pub fn run(args: &LintArgs) -> ExitCode {
    let config = match &args.config {
        Some(path) => match read_config(path) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("bootplate lint: {e}");
                return exit(EXIT_INPUT);
            }
        },
        None => None,
    };
    let mut code = EXIT_OK;
    for path in &args.files {
        match lint_file(path, config.as_ref()) {
            Ok(lines) => {
                for (severity, line) in lines {
                    println!("{line}");
                    if severity == Severity::Error {
                        code = code.max(EXIT_FAILED);
                    }
                }
            }
            Err(e) => {
                eprintln!("bootplate lint: {e}");
                code = EXIT_INPUT;
            }
        }
    }
    exit(code)
}

fn read_config(path: &Path) -> Result<BootplateConfigSpec, InputError> {
    let (_, config) =
        YamlFile::read(path)?.object::<crd_types::BootplateConfig>(&["BootplateConfig"])?;
    Ok(config.spec)
}

/// The problems of every template in `path`, formatted.
fn lint_file(
    path: &Path,
    config: Option<&BootplateConfigSpec>,
) -> Result<Vec<(Severity, String)>, InputError> {
    let file = YamlFile::read(path)?;
    let positions = Positions::new(&file.text);
    let shown = path.display();
    let mut out = Vec::new();
    let mut templates = 0;
    for (index, document) in file.documents.iter().enumerate() {
        if !TEMPLATE_KINDS.contains(&kind(document)) {
            continue;
        }
        templates += 1;
        let (object, spec) = match template(document) {
            Ok(t) => t,
            Err(message) => {
                let (line, col) = positions.locate(index, "spec", None);
                out.push((
                    Severity::Error,
                    format!("{shown}:{line}:{col}: error: {message}"),
                ));
                continue;
            }
        };
        for problem in render::lint(&object, &spec, config) {
            out.push((
                problem.severity,
                format_problem(&shown.to_string(), &positions, index, &problem),
            ));
        }
    }
    if templates == 0 {
        return Err(InputError(format!(
            "{shown}: no BootstrapTemplate or ClusterBootstrapTemplate in this file"
        )));
    }
    Ok(out)
}

fn format_problem(file: &str, positions: &Positions, document: usize, p: &Problem) -> String {
    let role = p.role.map(|r| format!(" (role {r})")).unwrap_or_default();
    match p.origin {
        Origin::Template => {
            let (line, col) = positions.locate(document, &p.field, p.position);
            format!(
                "{file}:{line}:{col}: {}: {}: {}{role}",
                p.severity, p.field, p.message
            )
        }
        // A problem of the config given with --config: name the field, not a template line.
        Origin::Config => format!(
            "{file}:1:1: {}: the config's {}: {}{role}",
            p.severity, p.field, p.message
        ),
    }
}
