//! `bootplate lint`: checks the files of a GitOps tree before they are applied: every bootplate
//! object (templates with the checks the controller runs for a template's `Valid` condition
//! plus the static ones), every config against the template it references, and Cluster API
//! objects whose bootstrap reference names a bootplate config. Other kinds are skipped and
//! counted. Problems print as text with the source, one line each, JSON, JUnit or SARIF.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;

use crd_types::capi::{Cluster, Machine};
use render::{Origin, Problem, Severity};

use super::cluster::{ClusterTemplates, Found, Wanted};
use super::diagnostic::{Diagnostic, Format};
use super::generator::Offline;
use super::input::{ConfigInput, InputError, ReadError, YamlFile, template};
use super::objects::{self, Class, KindFilter};
use super::report::{Object, Report};
use super::{EXIT_FAILED, EXIT_INPUT, EXIT_OK, exit};

/// Arguments of `bootplate lint`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Each PATH is a file or a directory (its .yaml, .yml and .json files; with -R its subdirectories'
too, hidden ones excepted); `-` reads standard input. In a directory lint reads regular files
only and follows no symbolic link: nothing outside the directory given is read, and a link that
leads out of it is an error (exit 2). A file may hold several YAML documents, at most 1 000 000
nodes once their aliases are followed.
Lint checks the kinds it owns and skips the others, counting them: bootplate's
(BootstrapTemplate, ClusterBootstrapTemplate, BootplateConfig, BootplateConfigTemplate,
BootstrapGenerator; an unknown kind of apiVersion bootstrap.bootplate.dev/* is an error) and
Cluster API's Machine, Cluster, MachineDeployment, MachinePool and ClusterClass
(cluster.x-k8s.io/*). --only-kind and --skip-kind narrow that; --strict-kinds makes every
skipped document an error. YAML is read as kubectl apply reads it (YAML 1.1: unquoted 0600 is
the number 384, yes/no/on/off are booleans). bootplate's objects are read strictly: an unknown
field, a value of the wrong type or outside its allowed values is an error naming the field.
  - every template text and partial parses; every branch, loop and partial is walked: helper
    names and parameters, paths in the render context, with \"did you mean\"; free text
    written unquoted into shell, YAML or JSON and unused variables and partials are warnings;
  - a render with sample values succeeds for each role and its output reads as its consumer
    reads it; its shell passes `bash -n`; with --tools, cloud-init schema, ignition-validate
    and shellcheck where installed; with --max-user-data, each role's render is no larger
    than that cloud accepts as user-data (docs/templates.md has the caps and their sources);
  - every BootplateConfig and BootplateConfigTemplate is rendered with the template its
    templateRef names, when that template is among the files (or, with --kubeconfig, in the
    cluster: read-only, one `get` per template): its variables, files and commands are
    checked, problems reported at the config's lines; a template not found is a warning
    (with --kubeconfig an error; a cluster that cannot be reached or forbids the read is
    exit 2);
  - a MachineDeployment's or MachinePool's configRef, and a ClusterClass's worker bootstrap
    references, to a BootplateConfigTemplate or BootplateConfig not among the files (nor, with
    --kubeconfig, in the cluster) are errors.

Every problem of every file is reported in one run; a summary line (`N objects, E errors, W
warnings, S skipped`) goes to standard error. Formats (standard output):
  text   the problem with the lines around it and a caret under the culprit (the default)
           error: spec.parts[0].files[0].permission: unknown field `permission`
             --> keys.yaml:12:11 ...
  short  one line each: FILE:LINE:COL: SEVERITY: FIELD: MESSAGE; HINT
           keys.yaml:12:11: error: spec.parts[0].files[0].permission: unknown field ...
  json   one JSON object per line (file, line, column, severity, code, field, message, hint)
           {\"file\":\"keys.yaml\",\"line\":12,\"column\":11,\"severity\":\"error\",...}
  junit  one JUnit XML document: a testsuite per file, a testcase per object, a failure per
         error (warnings in system-out)
           <testsuites ...><testsuite name=\"keys.yaml\" ...><testcase name=\"...\">...
  sarif  one SARIF 2.1.0 log (code-scanning annotations): a result per problem
           {\"version\":\"2.1.0\",\"runs\":[{\"tool\":{\"driver\":{\"name\":\"bootplate lint\",...
--strict makes warnings errors. docs/templates.md describes every check and code.

Exit codes, the same for every format: 0 no errors (warnings allowed, unless --strict), 1
problems found, 2 lint could not run fully (bad usage, a file that cannot be read, a
--kubeconfig cluster that cannot be reached or forbids the read: the others are still linted
and reported, and the report is still printed).")]
pub struct LintArgs {
    /// Files and directories to check.
    #[arg(required = true, value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Also read the subdirectories of each directory given (at most 32 deep; no symbolic link
    /// is followed).
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// How to print problems: `text`, `short`, `json`, `junit` or `sarif` (below).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Treat warnings (unquoted free text, unused variables and partials, templates not
    /// found) as errors.
    #[arg(long)]
    pub strict: bool,
    /// Check only objects of this kind (repeatable).
    #[arg(long = "only-kind", value_name = "KIND")]
    pub only_kinds: Vec<String>,
    /// Do not check objects of this kind (repeatable).
    #[arg(long = "skip-kind", value_name = "KIND")]
    pub skip_kinds: Vec<String>,
    /// Make every document of a kind lint does not check an error instead of skipping it.
    #[arg(long)]
    pub strict_kinds: bool,
    /// Also check the sample renders with the consumers' validators where installed:
    /// `cloud-init schema`, `ignition-validate`, `shellcheck -S error`.
    #[arg(long)]
    pub tools: bool,
    /// A BootplateConfig or BootplateConfigTemplate whose variables (and files, commands) the
    /// sample renders of every template use; its problems are reported at its own lines.
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
    /// Look up the templates configs reference, and the configs Cluster API objects reference,
    /// that are not among the files in the cluster of this kubeconfig (read-only: it needs only
    /// `get` on bootplate's bootstraptemplates, clusterbootstraptemplates, bootplateconfigs and
    /// bootplateconfigtemplates). Without it lint talks to no cluster.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use (default: its current context); a config that sets no
    /// namespace looks in the context's namespace.
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    pub context: Option<String>,
    /// Refuse a template whose render for any role is larger than a cloud accepts as
    /// user-data: `aws` (16384 bytes), `azure` (65535), `openstack` (65535 of base64),
    /// `vsphere` (65536 of base64), `hetzner` (32768), or a byte count. Measured on the sample
    /// renders (with --config's values when given), after the template's compression.
    #[arg(long, value_name = "CLOUD|BYTES")]
    pub max_user_data: Option<render::UserDataLimit>,
}

/// Runs `bootplate lint`.
pub fn run(args: &LintArgs) -> ExitCode {
    let filter = KindFilter {
        only: args.only_kinds.clone(),
        skip: args.skip_kinds.clone(),
    };
    if let Err(e) = filter.validate() {
        eprintln!("bootplate lint: {e}");
        return exit(EXIT_INPUT);
    }
    let generators = match Offline::new(&args.generators, args.generator_ca.as_deref()) {
        Ok(generators) => generators,
        Err(e) => {
            eprintln!("bootplate lint: {e}");
            return exit(EXIT_INPUT);
        }
    };
    let mut report = Report::default();
    let config = match &args.config {
        Some(path) => match read_config(path, &mut report) {
            Some(config) => Some(config),
            // A config that cannot be used would make every template's check misleading.
            None => return finish(args, report),
        },
        None => None,
    };
    let files = read_files(args, &mut report);
    let cluster = args.kubeconfig.as_ref().and_then(|path| {
        let target = super::cluster::Target {
            kubeconfig: path.clone(),
            context: args.context.clone(),
        };
        let mut wanted = templates_not_in(&files, &filter);
        wanted.extend(super::references::configs_not_in(&files));
        super::cluster::look_up(&target, wanted)
            .map_err(|e| report.input_errors.push(e))
            .ok()
    });
    let checks = Checks {
        config: config.as_ref(),
        tools: args.tools,
        generators: &generators,
        filter,
        strict_kinds: args.strict_kinds,
        cluster: cluster.as_ref(),
        max_user_data: args.max_user_data.as_ref(),
    };
    let mut own = OwnProblems::new();
    for file in &files {
        lint_file(file, &checks, &files, &mut own, &mut report);
    }
    for file in &files {
        check_configs(file, &checks, &files, &own, &mut report);
    }
    finish(args, report)
}

/// The templates the configs of `tree` (those `filter` selects) reference that `tree` does not
/// hold.
fn templates_not_in(tree: &[YamlFile], filter: &KindFilter) -> BTreeSet<Wanted> {
    let mut wanted = BTreeSet::new();
    for file in tree {
        for index in 0..file.documents.len() {
            if !matches!(
                objects::classify(&file.documents[index], filter),
                Class::Lint("BootplateConfig" | "BootplateConfigTemplate")
            ) {
                continue;
            }
            if let Some(config) = super::references::config(file, index)
                && let Err(w) = resolve(&config, tree)
            {
                wanted.insert(w);
            }
        }
    }
    wanted
}

/// The template of `config` among the files of `tree` (its file and document), or what to look
/// for in a cluster.
fn resolve<'a>(
    config: &super::references::FoundConfig<'_>,
    tree: &'a [YamlFile],
) -> Result<(&'a YamlFile, usize), Wanted> {
    let reference = &config.spec.template_ref;
    let kind = reference.kind.as_str();
    let (namespace, _) = objects::name_of(&config.at.file.documents[config.at.index]);
    super::references::find(tree, kind, &reference.name, namespace)
        .ok_or_else(|| super::references::wanted(kind, namespace, &reference.name))
}

/// Prints the report; the exit code.
fn finish(args: &LintArgs, mut report: Report) -> ExitCode {
    if args.strict {
        for d in &mut report.diagnostics {
            d.severity = Severity::Error;
        }
    }
    report.print(args.format);
    let code = if !report.input_errors.is_empty() {
        EXIT_INPUT
    } else if report.errors() > 0 {
        EXIT_FAILED
    } else {
        EXIT_OK
    };
    exit(code)
}

/// `--config`: the config, or None with its problems in the report.
fn read_config(path: &std::path::Path, report: &mut Report) -> Option<ConfigInput> {
    match ConfigInput::read(path) {
        Ok(c) => {
            report.add_source(&c.file);
            Some(c)
        }
        Err(ReadError::Unreadable(e)) => {
            report.input_errors.push(e);
            None
        }
        Err(ReadError::Problems(found)) => {
            report.diagnostics.extend(found);
            None
        }
    }
}

/// Every file of the paths given, parsed; what could not be read goes to the report.
fn read_files(args: &LintArgs, report: &mut Report) -> Vec<YamlFile> {
    let (sources, errors) = super::sources::expand(&args.files, args.recursive);
    report.input_errors.extend(errors);
    let mut files = Vec::new();
    for source in sources {
        let read = if source.named {
            super::input::read_text(&source.path)
        } else {
            super::input::read_walked_text(&source.path)
        };
        let (shown, text) = match read {
            Ok(read) => read,
            Err(e) => {
                report.input_errors.push(e);
                continue;
            }
        };
        // Kept before parsing, so that a YAML syntax error shows its line and a caret.
        report.add_text(&shown, &text);
        match YamlFile::parse(shown, text) {
            Ok(file) if file.documents.is_empty() && source.named => {
                report.input_errors.push(InputError(format!(
                    "{}: no objects in this file",
                    file.shown
                )));
            }
            Ok(file) => files.push(file),
            Err(ReadError::Unreadable(e)) => report.input_errors.push(e),
            Err(ReadError::Problems(found)) => report.diagnostics.extend(found),
        }
    }
    files
}

/// What lint checks objects with, besides themselves.
struct Checks<'a> {
    /// `--config`.
    config: Option<&'a ConfigInput>,
    /// `--tools`.
    tools: bool,
    /// `--generator`.
    generators: &'a Offline,
    /// `--only-kind`, `--skip-kind`.
    filter: KindFilter,
    /// `--strict-kinds`.
    strict_kinds: bool,
    /// What `--kubeconfig`'s cluster holds of the objects the files reference.
    cluster: Option<&'a ClusterTemplates>,
    /// `--max-user-data`.
    max_user_data: Option<&'a render::UserDataLimit>,
}

/// Each template's own problems (by file and document), so that a config's render reports
/// only what the config adds.
type OwnProblems = BTreeMap<(String, usize), Vec<Problem>>;

/// The problems of every document of `file`, into `report`.
fn lint_file(
    file: &YamlFile,
    checks: &Checks<'_>,
    tree: &[YamlFile],
    own: &mut OwnProblems,
    report: &mut Report,
) {
    for (index, document) in file.documents.iter().enumerate() {
        let kind = match objects::classify(document, &checks.filter) {
            Class::Lint(kind) => kind,
            Class::Unknown => {
                report.objects.push(Object::of(file, index));
                let d = file.unknown_kind(index, &crd_types::strict::KINDS);
                report.diagnostics.push(d);
                continue;
            }
            Class::Skip(kind) => {
                report.skipped += 1;
                if checks.strict_kinds {
                    let message =
                        format!("kind `{kind}` is not one lint checks (--strict-kinds refuses it)");
                    report
                        .diagnostics
                        .push(file.at(index, "kind", false, "unknown-kind", message));
                }
                continue;
            }
            Class::Filtered => {
                report.skipped += 1;
                continue;
            }
        };
        report.objects.push(Object::of(file, index));
        if let Err(found) = lint_object(file, index, kind, checks, tree, own) {
            report.diagnostics.extend(found);
        }
    }
}

/// The problems of document `index` of `file`, of kind `kind` (one lint owns).
fn lint_object(
    file: &YamlFile,
    index: usize,
    kind: &str,
    checks: &Checks<'_>,
    tree: &[YamlFile],
    own: &mut OwnProblems,
) -> Result<(), Vec<Diagnostic>> {
    let json = serde_json::to_value(&file.documents[index]).unwrap_or_default();
    if crd_types::strict::KINDS.contains(&kind)
        && let Err(p) = crd_types::strict::kind_of(&json)
    {
        return Err(vec![file.at(
            index,
            &p.path,
            false,
            "api-version",
            p.message,
        )]);
    }
    match kind {
        "BootstrapTemplate" | "ClusterBootstrapTemplate" => {
            let (object, spec) = template(file, index)?;
            let mut problems = render::lint(&object, &spec, checks.config.map(|c| &c.spec));
            if let Some(limit) = checks.max_user_data {
                let config = checks.config.map(|c| &c.spec);
                problems.extend(user_data(&object, &spec, config, limit, &problems));
            }
            let mut out: Vec<Diagnostic> = problems
                .iter()
                .map(|p| locate(file, index, checks.config, p))
                .collect();
            if !problems.iter().any(|p| p.severity == Severity::Error) {
                out.extend(run_tools(file, index, &object, &spec, checks));
                out.extend(check_generators(file, index, &object, &spec, checks));
            }
            own.insert((file.shown.clone(), index), problems);
            if out.is_empty() { Ok(()) } else { Err(out) }
        }
        "BootplateConfig" => file.decode::<crd_types::BootplateConfig>(index).map(drop),
        "BootplateConfigTemplate" => file
            .decode::<crd_types::BootplateConfigTemplate>(index)
            .map(drop),
        "BootstrapGenerator" => file
            .decode::<crd_types::BootstrapGenerator>(index)
            .and_then(|g| check_generator(file, index, &g.spec)),
        "Machine" => file.decode::<Machine>(index).map(drop),
        "Cluster" => file.decode::<Cluster>(index).map(drop),
        _ => super::references::check_bootstrap_refs(file, index, tree, checks.cluster),
    }
}

/// Every config of `file` (that `--only-kind`/`--skip-kind` select) rendered with the template
/// its `templateRef` names, when `tree` holds it: the config's problems at its own lines, and
/// the template's problems that only its values cause at the template's.
fn check_configs(
    file: &YamlFile,
    checks: &Checks<'_>,
    tree: &[YamlFile],
    own: &OwnProblems,
    report: &mut Report,
) {
    for index in 0..file.documents.len() {
        if !matches!(
            objects::classify(&file.documents[index], &checks.filter),
            Class::Lint("BootplateConfig" | "BootplateConfigTemplate")
        ) {
            continue;
        }
        let Some(config) = super::references::config(file, index) else {
            continue;
        };
        report
            .diagnostics
            .extend(check_config(&config, tree, own, checks));
    }
}

/// One config against its template, among the files or in the cluster.
fn check_config(
    config: &super::references::FoundConfig<'_>,
    tree: &[YamlFile],
    own: &OwnProblems,
    checks: &Checks<'_>,
) -> Vec<Diagnostic> {
    let limit = checks.max_user_data;
    let wanted = match resolve(config, tree) {
        Ok((template_file, template_index)) => {
            return check_against_file(config, template_file, template_index, own, limit);
        }
        Err(wanted) => wanted,
    };
    let reference = &config.spec.template_ref;
    let kind = reference.kind.as_str();
    let message = match checks.cluster.map(|c| (c.found.get(&wanted), &c.shown)) {
        Some((Some(Found::Template { object, spec }), shown)) => {
            return check_against_cluster(config, object, spec, shown, limit);
        }
        Some((absent, shown)) => {
            let namespace = match absent {
                Some(Found::Absent {
                    namespace: Some(ns),
                }) => format!("namespace {ns} of "),
                _ => String::new(),
            };
            let message = format!(
                "{kind} `{}` is neither among the files linted nor in {namespace}{shown}",
                reference.name
            );
            return vec![config.at.locate(
                "spec.templateRef.name",
                Severity::Error,
                "template-not-found",
                message,
            )];
        }
        None => format!(
            "{kind} `{}` is not among the files linted: the config's variables are not checked against it (give --kubeconfig to look it up in a cluster)",
            reference.name
        ),
    };
    vec![config.at.locate(
        "spec.templateRef.name",
        Severity::Warning,
        "template-not-found",
        message,
    )]
}

/// A config against a template of the cluster: the config's problems at its lines, and what
/// the template does with the config's values at the config's `templateRef` (the template has
/// no file here).
fn check_against_cluster(
    config: &super::references::FoundConfig<'_>,
    object: &str,
    spec: &crd_types::TemplateSpec,
    shown: &str,
    limit: Option<&render::UserDataLimit>,
) -> Vec<Diagnostic> {
    let mut known = render::lint(object, spec, None);
    if let Some(limit) = limit {
        known.extend(user_data(object, spec, None, limit, &known));
    }
    config_problems(config, object, spec, &known, limit, |p| {
        let message = format!("{object} in {shown}: {}: {}{}", p.field, p.message, role(p));
        config
            .at
            .locate("spec.templateRef.name", p.severity, p.code, message)
    })
}

/// The problems of `config` rendered with template `object`: the config's own at its lines,
/// the template's that `known` (what the template has without the config) does not hold as
/// `at_template` places them.
fn config_problems(
    config: &super::references::FoundConfig<'_>,
    object: &str,
    spec: &crd_types::TemplateSpec,
    known: &[Problem],
    limit: Option<&render::UserDataLimit>,
    at_template: impl Fn(&Problem) -> Diagnostic,
) -> Vec<Diagnostic> {
    let mut found = render::lint(object, spec, Some(&config.spec));
    if let Some(limit) = limit {
        found.extend(user_data(object, spec, Some(&config.spec), limit, &found));
    }
    found
        .into_iter()
        .filter(|p| p.origin == Origin::Config || !known.contains(p))
        .map(|p| match p.origin {
            Origin::Config => config_problem(config, &p),
            Origin::Template => at_template(&p),
        })
        .collect()
}

/// A problem of a config's own field, at the config's line.
fn config_problem(config: &super::references::FoundConfig<'_>, p: &Problem) -> Diagnostic {
    let message = format!("{}{}", p.message, role(p));
    config.at.locate(&p.field, p.severity, p.code, message)
}

/// ` (role worker)` when the problem is one role's.
fn role(p: &Problem) -> String {
    p.role.map(|r| format!(" (role {r})")).unwrap_or_default()
}

/// A config against the template at document `template_index` of `template_file`.
fn check_against_file(
    config: &super::references::FoundConfig<'_>,
    template_file: &YamlFile,
    template_index: usize,
    own: &OwnProblems,
    limit: Option<&render::UserDataLimit>,
) -> Vec<Diagnostic> {
    let Ok((object, spec)) = template(template_file, template_index) else {
        return Vec::new();
    };
    let known = own
        .get(&(template_file.shown.clone(), template_index))
        .map_or(&[][..], Vec::as_slice);
    config_problems(config, &object, &spec, known, limit, |p| {
        let message = format!(
            "{}{} (with the values of {})",
            p.message,
            role(p),
            config.shown
        );
        let location = template_file
            .positions
            .locate(template_index, &p.field, p.position);
        Diagnostic::new(
            &template_file.shown,
            location,
            p.severity,
            p.code,
            &p.field,
            message,
        )
    })
}

/// The sample renders of a template that lints clean, measured against `--max-user-data`.
fn user_data(
    object: &str,
    spec: &crd_types::TemplateSpec,
    config: Option<&crd_types::BootplateConfigSpec>,
    limit: &render::UserDataLimit,
    found: &[Problem],
) -> Vec<Problem> {
    if found.iter().any(|p| p.severity == Severity::Error) {
        return Vec::new();
    }
    let Ok(compiled) = render::CompiledTemplate::compile(object, spec) else {
        return Vec::new();
    };
    render::user_data_problems(&compiled, config, limit)
}

/// `bash -n`, and with `--tools` the consumers' validators, on the sample renders of a template
/// that lints clean; their complaints are reported at the template's body.
fn run_tools(
    file: &YamlFile,
    index: usize,
    object: &str,
    spec: &crd_types::TemplateSpec,
    checks: &Checks<'_>,
) -> Vec<Diagnostic> {
    let Ok(compiled) = render::CompiledTemplate::compile(object, spec) else {
        return Vec::new();
    };
    let renders: Vec<_> = compiled
        .sample_renders(checks.config.map(|c| &c.spec))
        .into_iter()
        .map(|(role, r)| (role, r.data))
        .filter(|(_, data)| !data.starts_with(&[0x1f, 0x8b])) // gzip: not readable as text
        .collect();
    let field = if spec.template.is_some() {
        "spec.template"
    } else {
        "spec.parts"
    };
    super::tools::check(spec.format, &renders, checks.tools)
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
        (Origin::Config, Some(config)) => config.at().locate(&p.field, p.severity, code, message),
        _ => {
            let location = file.positions.locate(index, &p.field, p.position);
            Diagnostic::new(&file.shown, location, p.severity, code, &p.field, message)
        }
    }
}
