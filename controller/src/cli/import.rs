//! `bootplate import`: KubeadmConfigTemplates and KubeadmConfigs (file, standard input, or with
//! `--kubeconfig` one object read from a cluster) to the BootplateConfigTemplates and
//! BootplateConfigs of the shipped template `kubeadm-compat`. The conversion itself is
//! `core::import` (no client, no I/O); this module reads the input (bounded before it is
//! parsed; from a cluster with one `get`, through `lint --kubeconfig`'s client), reports the
//! fields that are not carried and writes the objects and the MachineDeployment patch.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use bootplate::core::import::{self, Imported};
use clap::Args;

use serde_json::Value;

use super::cluster;
use super::input::{self, ReadError, YamlFile};
use super::{EXIT_FAILED, EXIT_INPUT, EXIT_OK, exit};

#[derive(Args)]
#[command(
    long_about = "Turn the kubeadm bootstrap provider's KubeadmConfigTemplates and \
KubeadmConfigs into bootplate's BootplateConfigTemplates and BootplateConfigs.

Each object of kind KubeadmConfigTemplate or KubeadmConfig (bootstrap.cluster.x-k8s.io v1beta1 \
or v1beta2) in FILE (`-` or no FILE: standard input) becomes the object of the same name and \
namespace that references the shipped ClusterBootstrapTemplate kubeadm-compat \
(templates/kubeadm-compat.yaml, which must be installed; kubeadm-compat-ignition for a spec with \
format ignition), with its files, commands, users, NTP, mounts, disk setup and join \
configuration carried as the config's files, preCommands, postCommands and variables. The objects are written as YAML to standard output (or --output).

A field kubeadm-compat cannot carry (docs/migrating.md lists them) is named on standard error, \
and the import fails unless --allow-lossy is given; with it, those fields are left out and named \
as warnings.

With --machine-deployment NAME (one KubeadmConfigTemplate in the input), --patch-output FILE \
gets the merge patch that points that MachineDeployment's bootstrap configRef at the imported \
template; apply it with `kubectl patch machinedeployment NAME --type merge --patch-file FILE`, \
and Cluster API rolls the MachineDeployment's Machines out.

With --kubeconfig, the argument is KIND/NAME instead of a file (kubeadmconfigtemplate/NAME or \
kubeadmconfig/NAME; the kind's plural and its group suffix .bootstrap.cluster.x-k8s.io are \
taken too): that one object is read from the cluster (bootstrap.cluster.x-k8s.io/v1beta2, in \
--namespace, default the context's namespace) with a single `get`, which is all the identity \
needs; nothing is written to the cluster.

Exit codes: 0 imported, 1 a field is not carried (without --allow-lossy), 2 bad usage or \
unreadable input."
)]
pub struct ImportArgs {
    /// The YAML file with KubeadmConfigTemplates or KubeadmConfigs; `-` for standard input.
    /// With --kubeconfig: the object to read from the cluster, KIND/NAME.
    #[arg(value_name = "FILE | KIND/NAME", default_value = "-")]
    pub file: PathBuf,
    /// Read KIND/NAME from the cluster of this kubeconfig instead of a file (one `get`,
    /// read-only).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use (default: its current context).
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    pub context: Option<String>,
    /// The namespace of KIND/NAME (default: the context's namespace).
    #[arg(long, short = 'n', value_name = "NAMESPACE", requires = "kubeconfig")]
    pub namespace: Option<String>,
    /// Leave out the fields kubeadm-compat cannot carry, with a warning for each, instead of
    /// failing.
    #[arg(long)]
    pub allow_lossy: bool,
    /// Write the objects to FILE instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The MachineDeployment to switch to the imported template (needs --patch-output).
    #[arg(long, value_name = "NAME", requires = "patch_output")]
    pub machine_deployment: Option<String>,
    /// Where to write the MachineDeployment's merge patch (with --machine-deployment).
    #[arg(long, value_name = "FILE", requires = "machine_deployment")]
    pub patch_output: Option<PathBuf>,
}

/// Why the command stopped.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    Input(String),
    #[error("{0} field(s) not carried; see above, or import with --allow-lossy")]
    Lossy(usize),
}

pub fn run(args: &ImportArgs) -> ExitCode {
    match import_all(args) {
        Ok(()) => exit(EXIT_OK),
        Err(Failure::Input(message)) => {
            eprintln!("bootplate import: {message}");
            exit(EXIT_INPUT)
        }
        Err(e @ Failure::Lossy(_)) => {
            eprintln!("bootplate import: {e}");
            exit(EXIT_FAILED)
        }
    }
}

fn import_all(args: &ImportArgs) -> Result<(), Failure> {
    let (shown, documents) = match &args.kubeconfig {
        Some(kubeconfig) => read_from_cluster(args, kubeconfig)?,
        None => read(args)?,
    };
    let imported = convert(&shown, &documents)?;
    report_lost(&shown, &imported, args.allow_lossy)?;
    let mut text = String::new();
    for object in &imported {
        text.push_str("---\n");
        text.push_str(&to_yaml(&object.object()));
    }
    write(args.output.as_ref(), &text)?;
    if let (Some(name), Some(path)) = (&args.machine_deployment, &args.patch_output) {
        let template = match imported.as_slice() {
            [one] if one.kind == "BootplateConfigTemplate" => &one.name,
            _ => {
                return Err(Failure::Input(format!(
                    "{shown}: --machine-deployment {name} needs exactly one KubeadmConfigTemplate in the input"
                )));
            }
        };
        write(
            Some(path),
            &to_yaml(&import::machine_deployment_patch(template)),
        )?;
    }
    Ok(())
}

/// The file's name in messages, and its objects as JSON.
fn read(args: &ImportArgs) -> Result<(String, Vec<Value>), Failure> {
    // read_text stops at input::MAX_FILE_BYTES before anything is parsed.
    let (shown, text) = input::read_text(&args.file).map_err(|e| Failure::Input(e.0))?;
    let file = YamlFile::parse(shown, text).map_err(|e| match e {
        ReadError::Unreadable(e) => Failure::Input(e.0),
        ReadError::Problems(found) => Failure::Input(
            found
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    })?;
    let mut documents = Vec::new();
    for document in &file.documents {
        if matches!(
            input::kind(document),
            "KubeadmConfigTemplate" | "KubeadmConfig"
        ) {
            documents.push(serde_json::to_value(document).map_err(|e| {
                Failure::Input(format!("{}: not a JSON-compatible object: {e}", file.shown))
            })?);
        }
    }
    Ok((file.shown, documents))
}

/// `--kubeconfig`: the object KIND/NAME, read with one `get`, and where it was read.
fn read_from_cluster(
    args: &ImportArgs,
    kubeconfig: &std::path::Path,
) -> Result<(String, Vec<Value>), Failure> {
    let wanted = args.file.to_string_lossy();
    let (kind, name) = object_named(&wanted).map_err(Failure::Input)?;
    let target = cluster::Target {
        kubeconfig: kubeconfig.to_owned(),
        context: args.context.clone(),
    };
    let runtime = cluster::runtime().map_err(|e| Failure::Input(e.0))?;
    runtime.block_on(async {
        let (client, shown) = cluster::client(&target)
            .await
            .map_err(|e| Failure::Input(e.0))?;
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        if namespace.is_empty() || namespace.contains('/') {
            return Err(Failure::Input(format!(
                "--namespace: `{namespace}` is not a namespace's name"
            )));
        }
        let plural = format!("{}s", kind.to_lowercase());
        let url =
            format!("/apis/{KUBEADM_API}/namespaces/{namespace}/{plural}");
        let at = format!("{kind} {namespace}/{name} of {shown}");
        let failed = |why: String| Failure::Input(format!("--kubeconfig: {why} ({shown})"));
        let (status, body) = cluster::get_bounded(&client, &url, kind, name)
            .await
            .map_err(failed)?;
        match status.as_u16() {
            200 => {}
            404 => return Err(failed(format!("no {kind} `{name}` in namespace {namespace}"))),
            401 | 403 => {
                return Err(failed(format!(
                    "may not get {plural}.bootstrap.cluster.x-k8s.io in namespace {namespace}: import needs `get` on them (HTTP {status})"
                )));
            }
            _ => return Err(failed(format!("getting {kind} `{name}` answered HTTP {status}"))),
        }
        let object = serde_json::from_slice(&body)
            .map_err(|e| failed(format!("{kind} `{name}` is unreadable: {e}")))?;
        Ok((at, vec![object]))
    })
}

/// The kubeadm provider's API version `--kubeconfig` reads.
const KUBEADM_API: &str = "bootstrap.cluster.x-k8s.io/v1beta2";

/// KIND/NAME: the kind as the API names it, and the name.
fn object_named(wanted: &str) -> Result<(&'static str, &str), String> {
    let usage = || {
        format!(
            "--kubeconfig reads one object: give it as kubeadmconfigtemplate/NAME or kubeadmconfig/NAME, not `{wanted}`"
        )
    };
    let (kind, name) = wanted.split_once('/').ok_or_else(usage)?;
    let kind = kind.to_lowercase();
    let kind = kind
        .strip_suffix(".bootstrap.cluster.x-k8s.io")
        .unwrap_or(&kind);
    let kind = match kind.strip_suffix('s').unwrap_or(kind) {
        "kubeadmconfigtemplate" => "KubeadmConfigTemplate",
        "kubeadmconfig" => "KubeadmConfig",
        _ => return Err(usage()),
    };
    if name.is_empty() || name.contains('/') {
        return Err(usage());
    }
    Ok((kind, name))
}

fn convert(shown: &str, documents: &[Value]) -> Result<Vec<Imported>, Failure> {
    let mut imported = Vec::new();
    for document in documents {
        let one = import::import(document).map_err(|e| Failure::Input(format!("{shown}: {e}")))?;
        imported.push(one);
    }
    if imported.is_empty() {
        return Err(Failure::Input(format!(
            "{shown}: no KubeadmConfigTemplate or KubeadmConfig in this input"
        )));
    }
    Ok(imported)
}

/// Names every field that is not carried: errors, or warnings with --allow-lossy.
fn report_lost(shown: &str, imported: &[Imported], allow_lossy: bool) -> Result<(), Failure> {
    let severity = if allow_lossy { "warning" } else { "error" };
    let mut count = 0;
    for object in imported {
        for lost in &object.lost {
            count += 1;
            eprintln!(
                "{severity}: {shown}: {} {}: {}: not carried: {}",
                object.source_kind(),
                object.name,
                lost.field,
                lost.why
            );
        }
    }
    if count > 0 && !allow_lossy {
        return Err(Failure::Lossy(count));
    }
    Ok(())
}

fn to_yaml(value: &serde_json::Value) -> String {
    serde_yaml::to_string(value).expect("a JSON value always serializes as YAML")
}

fn write(path: Option<&PathBuf>, text: &str) -> Result<(), Failure> {
    match path {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| Failure::Input(format!("cannot write {}: {e}", path.display()))),
        None => std::io::stdout()
            .lock()
            .write_all(text.as_bytes())
            .map_err(|e| Failure::Input(format!("cannot write the output: {e}"))),
    }
}
