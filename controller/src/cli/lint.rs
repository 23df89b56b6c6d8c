//! `bootplate lint`: checks template files before they are published, with the checks the
//! controller runs for a template's `Valid` condition plus the static ones, and prints each
//! problem as `FILE:LINE:COL: severity: field: message`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crd_types::capi::{Cluster, Machine};
use render::{Origin, Problem, Severity};

use super::diagnostic::{Diagnostic, Format};
use super::generator::Offline;
use super::input::{ConfigInput, InputError, ReadError, YamlFile, kind, template};
use super::{EXIT_FAILED, EXIT_INPUT, EXIT_OK, exit};

/// Arguments of `bootplate lint`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Each file may hold several YAML documents (FILE `-` reads standard input). Every document must be
a BootstrapTemplate, ClusterBootstrapTemplate, BootplateConfig, BootplateConfigTemplate (apiVersion
bootstrap.bootplate.dev/v1alpha1), Machine or Cluster (cluster.x-k8s.io): an unknown kind is an
error, never skipped. bootplate's objects are read strictly: an unknown field, a value of the
wrong type or outside its allowed values is an error naming the field (and the field probably
meant). Every template is then checked:
  - every template text and partial parses (an unclosed block is reported at its opening
    tag); partial references exist and do not recurse; nesting and size stay within limits;
  - every branch, loop and partial is walked whatever a sample machine would take: helper
    names and their parameters, paths in the render context (values declared, join not for
    init, certs only for control-plane roles), with \"did you mean\";
  - free text written unquoted into shell, YAML or JSON is a warning; declared variables and
    partials nothing uses are warnings;
  - a render with sample values (generated from patterns) succeeds for each role and its
    output reads as its consumer reads it (Ignition 3.x keys and types, cloud-config modules,
    unit files); its shell passes `bash -n`; with --tools, cloud-init schema,
    ignition-validate and shellcheck where installed.

Problems are printed to standard output: with the source lines and a caret (--format text),
one line each (--format short: FILE:LINE:COL: error: FIELD: MESSAGE), or one JSON object each
(--format json: file, line, column, severity, code, field, message, hint). --strict makes
warnings errors. docs/templates.md describes every check and code.

Exit codes: 0 no errors (warnings allowed, unless --strict), 1 problems found, 2 lint could not
run (bad usage, an unreadable file: the other files are still linted).")]
pub struct LintArgs {
    /// Template files (YAML) to check.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// How to print problems: `text` (with the lines around each), `short` (one line each) or
    /// `json` (one object per line).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Treat warnings (unquoted free text, unused variables and partials) as errors.
    #[arg(long)]
    pub strict: bool,
    /// Also check the sample renders with the consumers' validators where installed:
    /// `cloud-init schema`, `ignition-validate`, `shellcheck -S error`.
    #[arg(long)]
    pub tools: bool,
    /// A BootplateConfig or BootplateConfigTemplate whose variables (and files, commands) the
    /// sample renders use; its problems are reported at its own lines.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Call the generator a template part names, NAME=URL (https), with each sample render's
    /// request (no token, no keys), and check its answer and the output with it. Repeatable.
    #[arg(long = "generator", value_name = "NAME=URL")]
    pub generators: Vec<String>,
    /// PEM CA certificates the generators' serving certificates are checked against.
    /// Default: the system's trusted roots.
    #[arg(long, value_name = "FILE")]
    pub generator_ca: Option<PathBuf>,
}

/// The kinds lint reads: bootplate's five, and the CAPI objects `bootplate render` takes.
const LINT_KINDS: [&str; 7] = [
    "BootstrapTemplate",
    "ClusterBootstrapTemplate",
    "BootplateConfig",
    "BootplateConfigTemplate",
    "BootstrapGenerator",
    "Machine",
    "Cluster",
];

/// Runs `bootplate lint`.
pub fn run(args: &LintArgs) -> ExitCode {
    let mut code = EXIT_OK;
    let mut diagnostics = Vec::new();
    // The text of every file read, for snippets.
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    let config = match &args.config {
        Some(path) => match ConfigInput::read(path) {
            Ok(c) => {
                sources.insert(c.file.shown.clone(), c.file.text.clone());
                Some(c)
            }
            Err(ReadError::Unreadable(e)) => {
                eprintln!("bootplate lint: {e}");
                return exit(EXIT_INPUT);
            }
            Err(ReadError::Problems(found)) => {
                diagnostics.extend(found);
                None
            }
        },
        None => None,
    };
    let generators = match Offline::new(&args.generators, args.generator_ca.as_deref()) {
        Ok(generators) => generators,
        Err(e) => {
            eprintln!("bootplate lint: {e}");
            return exit(EXIT_INPUT);
        }
    };
    let checks = Checks {
        config: config.as_ref(),
        tools: args.tools,
        generators: &generators,
    };
    if args.config.is_none() || config.is_some() {
        for path in &args.files {
            match lint_file(path, &checks, &mut sources) {
                Ok(found) => diagnostics.extend(found),
                Err(e) => {
                    eprintln!("bootplate lint: {e}");
                    code = EXIT_INPUT;
                }
            }
        }
    }
    let mut out = std::io::stdout().lock();
    for d in &mut diagnostics {
        if args.strict {
            d.severity = Severity::Error;
        }
        let shown = d.render(args.format, sources.get(&d.file).map(String::as_str));
        // A closed pipe (`| head`) ends the output, not the run.
        let _ = writeln!(out, "{shown}");
        if d.severity == Severity::Error {
            code = code.max(EXIT_FAILED);
        }
    }
    exit(code)
}

/// What lint checks templates with, besides themselves.
struct Checks<'a> {
    /// `--config`.
    config: Option<&'a ConfigInput>,
    /// `--tools`.
    tools: bool,
    /// `--generator`.
    generators: &'a Offline,
}

/// The problems of every object in `path`.
fn lint_file(
    path: &Path,
    checks: &Checks<'_>,
    sources: &mut BTreeMap<String, String>,
) -> Result<Vec<Diagnostic>, InputError> {
    let config = checks.config;
    let file = match YamlFile::read(path) {
        Ok(file) => {
            sources.insert(file.shown.clone(), file.text.clone());
            file
        }
        Err(ReadError::Unreadable(e)) => return Err(e),
        Err(ReadError::Problems(found)) => return Ok(found),
    };
    if file.documents.is_empty() {
        return Err(InputError(format!(
            "{}: no objects in this file",
            file.shown
        )));
    }
    let mut out = file.check_kinds(&LINT_KINDS);
    for (index, document) in file.documents.iter().enumerate() {
        // A document of a wrong kind or apiVersion was reported by check_kinds.
        let json = serde_json::to_value(document).unwrap_or_default();
        if crd_types::strict::KINDS.contains(&kind(document))
            && crd_types::strict::kind_of(&json).is_err()
        {
            continue;
        }
        let decoded = match kind(document) {
            "BootstrapTemplate" | "ClusterBootstrapTemplate" => match template(&file, index) {
                Ok((object, spec)) => {
                    let problems = render::lint(&object, &spec, config.map(|c| &c.spec));
                    out.extend(problems.iter().map(|p| locate(&file, index, config, p)));
                    if !problems.iter().any(|p| p.severity == Severity::Error) {
                        out.extend(run_tools(
                            &file,
                            index,
                            &object,
                            &spec,
                            config,
                            checks.tools,
                        ));
                        out.extend(check_generators(&file, index, &object, &spec, checks));
                    }
                    Ok(())
                }
                Err(found) => Err(found),
            },
            "BootplateConfig" => file.decode::<crd_types::BootplateConfig>(index).map(drop),
            "BootplateConfigTemplate" => file
                .decode::<crd_types::BootplateConfigTemplate>(index)
                .map(drop),
            "BootstrapGenerator" => file
                .decode::<crd_types::BootstrapGenerator>(index)
                .and_then(|g| check_generator(&file, index, &g.spec)),
            "Machine" => file.decode::<Machine>(index).map(drop),
            "Cluster" => file.decode::<Cluster>(index).map(drop),
            _ => Ok(()),
        };
        if let Err(found) = decoded {
            out.extend(found);
        }
    }
    out.sort_by_key(|d| (d.line, d.column));
    Ok(out)
}

/// `bash -n`, and with `--tools` the consumers' validators, on the sample renders of a template
/// that lints clean; their complaints are reported at the template's body.
fn run_tools(
    file: &YamlFile,
    index: usize,
    object: &str,
    spec: &crd_types::TemplateSpec,
    config: Option<&ConfigInput>,
    external: bool,
) -> Vec<Diagnostic> {
    let Ok(compiled) = render::CompiledTemplate::compile(object, spec) else {
        return Vec::new();
    };
    let renders: Vec<_> = compiled
        .sample_renders(config.map(|c| &c.spec))
        .into_iter()
        .map(|(role, r)| (role, r.data))
        .filter(|(_, data)| !data.starts_with(&[0x1f, 0x8b])) // gzip: not readable as text
        .collect();
    let field = if spec.template.is_some() {
        "spec.template"
    } else {
        "spec.parts"
    };
    super::tools::check(spec.format, &renders, external)
        .into_iter()
        .map(|p| {
            file.at(
                index,
                field,
                false,
                "tool",
                format!(
                    "{} rejects the output (role {}): {}",
                    p.tool, p.role, p.message
                ),
            )
        })
        .collect()
}

/// A BootstrapGenerator's endpoint and CA bundle, as the controller builds its client.
fn check_generator(
    file: &YamlFile,
    index: usize,
    spec: &crd_types::GeneratorSpec,
) -> Result<(), Vec<Diagnostic>> {
    bootplate::generator::client::GeneratorClient::new(spec)
        .map(drop)
        .map_err(|message| {
            let field = message.split(':').next().unwrap_or("spec").to_owned();
            vec![file.at(index, &field, false, "generator-invalid", message)]
        })
}

/// The generator references of a template that lints clean: each part's generator is checked
/// with `--generator` (its answer to every sample render's request, and the output with it);
/// without, it is a warning that its output goes unchecked.
fn check_generators(
    file: &YamlFile,
    index: usize,
    object: &str,
    spec: &crd_types::TemplateSpec,
    checks: &Checks<'_>,
) -> Vec<Diagnostic> {
    let Ok(compiled) = render::CompiledTemplate::compile(object, spec) else {
        return Vec::new();
    };
    let Some(config) = compiled.sample_config(checks.config.map(|c| &c.spec)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut unchecked = std::collections::BTreeSet::new();
    for role in crd_types::Role::ALL {
        let ctx = render::sample_context(role);
        let calls = compiled.generator_calls(&config, role);
        if calls.is_empty() {
            continue;
        }
        if let Some(call) = calls.iter().find(|c| !checks.generators.has(&c.generator)) {
            if unchecked.insert(call.field.clone()) {
                let message = format!(
                    "part `{}` takes content from BootstrapGenerator {}, whose answers are not checked: give --generator {}=URL",
                    call.part, call.generator, call.generator
                );
                let mut d = file.at(index, &call.field, false, "generator-unchecked", message);
                d.severity = Severity::Warning;
                out.push(d);
            }
            continue;
        }
        let rendered = checks
            .generators
            .answer(&compiled, &config, &ctx)
            .and_then(|generated| {
                compiled
                    .render_generated(&config, &ctx, &generated)
                    .map_err(|e| ("spec.parts".to_owned(), e.to_string()))
            });
        if let Err((field, message)) = rendered {
            let message = format!("{message} (role {role})");
            out.push(file.at(index, &field, false, "generator", message));
        }
    }
    out
}

/// A problem of a template's lint as a diagnostic: template problems in the template's file,
/// config problems in the `--config` file.
fn locate(file: &YamlFile, index: usize, config: Option<&ConfigInput>, p: &Problem) -> Diagnostic {
    let role = p.role.map(|r| format!(" (role {r})")).unwrap_or_default();
    let message = format!("{}{role}", p.message);
    let code = p.code;
    match (p.origin, config) {
        (Origin::Config, Some(config)) => config.locate(&p.field, p.severity, code, message),
        _ => {
            let location = file.positions.locate(index, &p.field, p.position);
            Diagnostic::new(&file.shown, location, p.severity, code, &p.field, message)
        }
    }
}
