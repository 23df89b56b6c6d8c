//! `bootplate diff`: two revisions of templates or configs (files or directories) in, what the
//! change does to running machines out, per object and role: unchanged, in place (which parts,
//! what bootplate-agent does) or replacement (what forces it), with the rendered difference by
//! part. Offline, for CI: the verdict is `render::compare`'s, the comparison Cluster API's
//! in-place hooks make in the cluster.

mod judge;
mod parts;
mod print;
mod tree;

use std::path::PathBuf;
use std::process::ExitCode;

use crd_types::Role;
use crd_types::capi::{Cluster, Machine};

use super::diagnostic::Diagnostic;
use super::input::{ConfigInput, InputError, ReadError};
use super::render::RoleChoice;
use super::{EXIT_FAILED, EXIT_INPUT, EXIT_OK, exit};

pub use judge::{ObjectDiff, Verdict};

/// Some machine would be replaced.
pub const EXIT_REPLACEMENT: u8 = 3;

/// Arguments of `bootplate diff`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
OLD and NEW are each a file or a directory (its .yaml, .yml and .json files; with -R its
subdirectories' too), read as `bootplate lint` reads them: for example the templates directory
of the main branch and of a pull request. Their BootstrapTemplates, ClusterBootstrapTemplates,
BootplateConfigs and BootplateConfigTemplates are paired by kind, namespace and name (two single
files with one object each of the same kind are paired whatever the names); objects only one
side has are reported as added or removed. A config is rendered with the template its
templateRef names on its own side, else with the one --with gives (a template both revisions
share and that did not change: a config template's revisions in one repository, the template
published from another); a template alone with --config's variables, or sample values for its
required variables. Objects --with gives are not compared.

Both revisions are rendered for the same machine, with the same stand-ins for the token, the CA
hash, the certificates and generated parts (no generator is called), and compared part by part
by the rule Cluster API's in-place hooks apply (docs/in-place.md): per role,
  unchanged     both revisions render the same
  in place      only `update: InPlace` parts differ: the parts, and what bootplate-agent does
                (files written and removed, units restarted, parts whose commands run)
  replacement   something else differs: the part or field that forces new machines
  not served    neither revision renders for the role (newly served: only the new one does)
  fails         the new revision does not render for a role the old one served
The machine is the sample one lint renders with (every role), or --machine and --cluster
(roles init and control-plane-join for a control-plane Machine, worker otherwise); --role
narrows or widens that. Secrets are never printed: PEM blocks show as their type and a digest,
bootstrap tokens as <bootstrap token>.

Formats (standard output): text (the default), json (one document: verdict, exitCode, objects
with roles, reasons, agent actions and each part's unified diff), markdown (a summary table and
the diffs in collapsed sections, for a GitHub step summary or a pull-request comment).

Exit codes, the same for every format:
  0  no machine is replaced: every role is unchanged or updated in place (or newly served)
  1  the new revision fails to render for a role the old one served (problems on stderr)
  2  bad usage or input: a file that cannot be read, YAML or a schema error, a template that
     does not compile, a config whose template is neither on its side nor given with --with
     (FILE:LINE:COL on stderr)
  3  some machine would be replaced
Examples, in CI:
  bootplate diff --format markdown base/templates templates >> \"$GITHUB_STEP_SUMMARY\"
  bootplate diff --with platform/kubeadm-ubuntu-2404.yaml base/workers.yaml workers.yaml")]
pub struct DiffArgs {
    /// The old revision: a file or a directory.
    #[arg(value_name = "OLD")]
    pub old: PathBuf,
    /// The new revision: a file or a directory.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// Also read the subdirectories of directories given (at most 32 deep; no symbolic link is
    /// followed).
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// The CAPI Machine (cluster.x-k8s.io/v1beta2) to render for, with --cluster. Default: the
    /// sample machine of every role.
    #[arg(long, value_name = "FILE", requires = "cluster")]
    pub machine: Option<PathBuf>,
    /// The CAPI Cluster (cluster.x-k8s.io/v1beta2) the Machine belongs to.
    #[arg(long, value_name = "FILE", requires = "machine")]
    pub cluster: Option<PathBuf>,
    /// The role: init, control-plane-join, worker, or all.
    #[arg(long, value_name = "ROLE")]
    pub role: Option<RoleChoice>,
    /// A BootplateConfig or BootplateConfigTemplate whose variables (and files, commands) the
    /// templates are rendered with (configs among OLD and NEW use their own).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A template both revisions share, unchanged (a file or a directory; repeatable): a config
    /// whose template is not on its own side renders with the one found here. Not compared.
    #[arg(long = "with", value_name = "PATH")]
    pub with: Vec<PathBuf>,
    /// How to print: text, json or markdown.
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    pub format: DiffFormat,
}

/// How `bootplate diff` prints its report.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiffFormat {
    /// Per object and role: the verdict, then each differing part's unified diff.
    #[default]
    Text,
    /// One JSON document.
    Json,
    /// A summary table and collapsed diffs (GitHub-flavoured markdown).
    Markdown,
}

/// Runs `bootplate diff`.
pub fn run(args: &DiffArgs) -> ExitCode {
    let mut unreadable = tree::Unreadable::default();
    let old = tree::read(&args.old, args.recursive, &mut unreadable);
    let new = tree::read(&args.new, args.recursive, &mut unreadable);
    let with: Vec<_> = (args.with.iter())
        .flat_map(|path| tree::read(path, args.recursive, &mut unreadable).files)
        .collect();
    let given = read_given(args, &mut unreadable);
    if !unreadable.is_empty() {
        return refuse(&unreadable.errors, &unreadable.problems);
    }
    let Some((shape, config)) = given else {
        return exit(EXIT_INPUT);
    };
    let roles = roles(args.role, &shape);
    let inputs = judge::Inputs {
        old: &old,
        new: &new,
        shape: &shape,
        roles: &roles,
        config: config.as_ref(),
        with: &with,
    };
    let (mut objects, mut input, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for pairing in tree::pair(&old, &new) {
        let judged = judge::judge(&pairing, &inputs);
        objects.push(judged.object);
        input.extend(judged.input);
        failed.extend(judged.failed);
    }
    for d in input.iter().chain(&failed) {
        eprintln!("{d}");
    }
    let code = exit_code(&objects, !input.is_empty());
    print::print(args.format, &objects, code);
    exit(code)
}

/// The exit code of a report: input problems first, then failing renders, then replacements.
pub fn exit_code(objects: &[ObjectDiff], input_problems: bool) -> u8 {
    let any = |v: Verdict| {
        objects
            .iter()
            .flat_map(|o| &o.roles)
            .any(|r| r.verdict == v)
    };
    if input_problems {
        EXIT_INPUT
    } else if any(Verdict::Fails) {
        EXIT_FAILED
    } else if any(Verdict::Replacement) {
        EXIT_REPLACEMENT
    } else {
        EXIT_OK
    }
}

fn refuse(errors: &[InputError], problems: &[Diagnostic]) -> ExitCode {
    for e in errors {
        eprintln!("bootplate diff: {e}");
    }
    for d in problems {
        eprintln!("{d}");
    }
    exit(EXIT_INPUT)
}

/// `--machine`/`--cluster` and `--config`; `None` when one of them could not be read (its
/// problems are in `unreadable`).
fn read_given(
    args: &DiffArgs,
    unreadable: &mut tree::Unreadable,
) -> Option<(judge::Shape, Option<ConfigInput>)> {
    let mut note = |e: ReadError| match e {
        ReadError::Unreadable(e) => unreadable.errors.push(e),
        ReadError::Problems(found) => unreadable.problems.extend(found),
    };
    let shape = match (&args.machine, &args.cluster) {
        (Some(machine), Some(cluster)) => {
            let machine = super::render::read_object::<Machine>(machine, &["Machine"]);
            let cluster = super::render::read_object::<Cluster>(cluster, &["Cluster"]);
            match (machine, cluster) {
                (Ok((_, _, machine)), Ok((_, _, cluster))) => Some(judge::Shape::Given {
                    machine: Box::new(machine),
                    cluster: Box::new(cluster),
                }),
                (machine, cluster) => {
                    machine
                        .err()
                        .into_iter()
                        .chain(cluster.err())
                        .for_each(&mut note);
                    None
                }
            }
        }
        _ => Some(judge::Shape::Sample),
    };
    let config = match args.config.as_deref().map(ConfigInput::read).transpose() {
        Ok(mut config) => {
            if let Some(c) = config.as_mut() {
                super::render::offline_spec(&mut c.spec);
            }
            Some(config)
        }
        Err(e) => {
            note(e);
            None
        }
    };
    Some((shape?, config?))
}

/// The roles to judge: `--role`, else those of the Machine given, else every role.
fn roles(choice: Option<RoleChoice>, shape: &judge::Shape) -> Vec<Role> {
    match (choice, shape) {
        (Some(RoleChoice::One(role)), _) => vec![role],
        (Some(RoleChoice::All), _) | (None, judge::Shape::Sample) => Role::ALL.to_vec(),
        (None, judge::Shape::Given { machine, .. }) if machine.is_control_plane() => {
            vec![Role::Init, Role::ControlPlaneJoin]
        }
        (None, judge::Shape::Given { .. }) => vec![Role::Worker],
    }
}

#[cfg(test)]
mod tests;
