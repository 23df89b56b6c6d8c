//! `bootplate render`: one template, one Machine, one Cluster (and optionally a config) in,
//! the Machine's user-data out, with sample join data and throw-away certificates.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bootplate::pki;
use crd_types::capi::{Cluster, Machine};
use crd_types::{BootplateConfigSpec, Role};
use render::{Certificates, ClusterInfo, CompiledTemplate, JoinInfo, KeyPair, RenderContext};

use super::diagnostic::Diagnostic;
use super::input::{ConfigInput, InputError, ReadError, TEMPLATE_KINDS, YamlFile, template};
use super::{EXIT_FAILED, EXIT_INPUT, EXIT_OK, exit};

/// Arguments of `bootplate render`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Examples:
  bootplate render --template examples/ubuntu-2404.yaml \\
      --machine examples/machine-control-plane.yaml --cluster examples/cluster.yaml
  bootplate render --template t.yaml --machine m.yaml --cluster c.yaml \\
      --config examples/config.yaml --role worker --output user-data

Unless given --token, --ca-cert and --ca-key, the join token is random and the certificates
(cluster CA, etcd CA, front-proxy CA, service-account key) are generated on the spot and thrown
away: the output shows what a machine would receive, but cannot join a real cluster.

Exit codes: 0 rendered, 1 the template failed to render (message on stderr), 2 bad usage or
unreadable input.")]
pub struct RenderArgs {
    /// The template: a YAML file with a BootstrapTemplate or ClusterBootstrapTemplate.
    #[arg(long, value_name = "FILE")]
    pub template: PathBuf,
    /// The CAPI Machine (cluster.x-k8s.io/v1beta2) to render for.
    #[arg(long, value_name = "FILE")]
    pub machine: PathBuf,
    /// The CAPI Cluster (cluster.x-k8s.io/v1beta2) the Machine belongs to.
    #[arg(long, value_name = "FILE")]
    pub cluster: PathBuf,
    /// A BootplateConfig (or BootplateConfigTemplate) with variables, files and commands.
    /// Files with contentFrom get placeholder content: Secrets are not read offline.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The role: init, control-plane-join or worker. Default: init for a Machine labelled
    /// cluster.x-k8s.io/control-plane, worker otherwise.
    #[arg(long, value_name = "ROLE")]
    pub role: Option<Role>,
    /// Write the user-data to FILE instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`). Default: a random one.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// The cluster CA certificate (PEM), with --ca-key. Default: a throw-away CA.
    #[arg(long, value_name = "FILE", requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// The cluster CA private key (PEM), with --ca-cert.
    #[arg(long, value_name = "FILE", requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
}

/// Runs `bootplate render`.
pub fn run(args: &RenderArgs) -> ExitCode {
    match render(args) {
        Ok(data) => {
            let written = match &args.output {
                Some(path) => std::fs::write(path, &data)
                    .map_err(|e| format!("cannot write {}: {e}", path.display())),
                None => std::io::stdout()
                    .lock()
                    .write_all(&data)
                    .map_err(|e| format!("cannot write the output: {e}")),
            };
            match written {
                Ok(()) => exit(EXIT_OK),
                Err(message) => {
                    eprintln!("bootplate render: {message}");
                    exit(EXIT_INPUT)
                }
            }
        }
        Err(Failure::Input(e)) => {
            eprintln!("bootplate render: {e}");
            exit(EXIT_INPUT)
        }
        Err(Failure::Problems(found)) => {
            for d in found {
                eprintln!("{d}");
            }
            exit(EXIT_INPUT)
        }
        Err(Failure::Render(message)) => {
            eprintln!("bootplate render: {message}");
            exit(EXIT_FAILED)
        }
    }
}

enum Failure {
    Input(InputError),
    /// Located problems of an input file.
    Problems(Vec<Diagnostic>),
    Render(String),
}

impl From<InputError> for Failure {
    fn from(e: InputError) -> Self {
        Failure::Input(e)
    }
}

impl From<ReadError> for Failure {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Unreadable(e) => Failure::Input(e),
            ReadError::Problems(found) => Failure::Problems(found),
        }
    }
}

fn input(message: String) -> Failure {
    Failure::Input(InputError(message))
}

/// Reads the one object of `kinds` in `path`, strictly (every other document of the file must
/// be of `kinds` too).
fn read_object<T: serde::de::DeserializeOwned>(
    path: &Path,
    kinds: &[&str],
) -> Result<(YamlFile, usize, T), Failure> {
    let file = YamlFile::read(path)?;
    let index = file.find(kinds)?;
    let problems = file.check_kinds(kinds);
    if !problems.is_empty() {
        return Err(ReadError::Problems(problems).into());
    }
    let object = file.decode(index).map_err(ReadError::Problems)?;
    Ok((file, index, object))
}

fn render(args: &RenderArgs) -> Result<Vec<u8>, Failure> {
    let template_file = YamlFile::read(&args.template)?;
    let index = template_file.find(&TEMPLATE_KINDS)?;
    let problems = template_file.check_kinds(&TEMPLATE_KINDS);
    if !problems.is_empty() {
        return Err(ReadError::Problems(problems).into());
    }
    let (object, spec) = template(&template_file, index).map_err(ReadError::Problems)?;
    let (_, _, machine): (_, _, Machine) = read_object(&args.machine, &["Machine"])?;
    let (_, _, cluster): (_, _, Cluster) = read_object(&args.cluster, &["Cluster"])?;
    let config = match &args.config {
        Some(path) => read_config(path)?,
        None => BootplateConfigSpec::default(),
    };
    let role = args.role.unwrap_or(if machine.is_control_plane() {
        Role::Init
    } else {
        Role::Worker
    });
    let token = match &args.token {
        Some(t) if valid_token(t) => t.clone(),
        Some(_) => {
            return Err(input(
                "--token must look like abcdef.0123456789abcdef ([a-z0-9]{6}.[a-z0-9]{16})"
                    .to_owned(),
            ));
        }
        None => random_token(),
    };
    let ca = match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &PathBuf| {
                std::fs::read_to_string(p)
                    .map_err(|e| input(format!("{}: cannot read: {e}", p.display())))
            };
            let pair = KeyPair {
                cert: read(cert)?,
                key: read(key)?,
            };
            pki::check_key_pair(&pair).map_err(|e| input(format!("--ca-cert/--ca-key: {e}")))?;
            pair
        }
        _ => throw_away_ca("bootplate render throw-away cluster CA")?,
    };
    let join = JoinInfo {
        token,
        api_server_endpoint: ClusterInfo::from_cluster(&cluster)
            .control_plane_endpoint
            .address(),
        ca_cert_hashes: vec![
            pki::ca_cert_hash(&ca.cert).map_err(|e| input(format!("--ca-cert: {e}")))?,
        ],
    };
    let certs = if role.is_control_plane() {
        Some(Certificates {
            ca,
            etcd: throw_away_ca("bootplate render throw-away etcd CA")?,
            front_proxy: throw_away_ca("bootplate render throw-away front-proxy CA")?,
            service_account: pki::generate_service_account_key()
                .map_err(|e| Failure::Render(e.to_string()))?,
        })
    } else {
        None
    };
    let ctx = RenderContext::new(&cluster, &machine, role, Some(join), certs);
    let compiled =
        CompiledTemplate::compile(&object, &spec).map_err(|e| Failure::Render(e.to_string()))?;
    let rendered = compiled
        .render(&config, &ctx)
        .map_err(|e| Failure::Render(e.to_string()))?;
    Ok(rendered.data)
}

fn throw_away_ca(name: &str) -> Result<KeyPair, Failure> {
    pki::generate_ca(name).map_err(|e| Failure::Render(e.to_string()))
}

/// A BootplateConfig's spec, or a BootplateConfigTemplate's `spec.template.spec`, read
/// strictly. Files read from Secrets get a placeholder: nothing is read from a cluster offline.
fn read_config(path: &Path) -> Result<BootplateConfigSpec, Failure> {
    let mut spec = ConfigInput::read(path)?.spec;
    for f in &mut spec.files {
        if let (None, Some(from)) = (&f.content, &f.content_from) {
            f.content = Some(format!(
                "placeholder: offline, bootplate render does not read Secret {} key {}\n",
                from.secret.name, from.secret.key
            ));
            f.encoding = None;
        }
    }
    Ok(spec)
}

fn valid_token(t: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    t.split_once('.')
        .is_some_and(|(id, secret)| ok(id, 6) && ok(secret, 16))
}

/// A random bootstrap token in kubeadm's format (the one the controller creates).
fn random_token() -> String {
    bootplate::token::Token::generate().expose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        for _ in 0..20 {
            assert!(valid_token(&random_token()));
        }
        assert_ne!(random_token(), random_token());
        assert!(valid_token("abcdef.0123456789abcdef"));
        assert!(!valid_token("ABCDEF.0123456789abcdef"));
        assert!(!valid_token("abcdef0123456789abcdef"));
        assert!(!valid_token("abcde.0123456789abcdef"));
    }
}
