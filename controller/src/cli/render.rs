//! `bootplate render`: one template, one Machine, one Cluster (and optionally a config) in,
//! the Machine's user-data out, with sample join data and throw-away certificates.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bootplate::core::network;
use bootplate::pki;
use crd_types::Role;
use crd_types::capi::{Cluster, Machine};
use render::{Certificates, ClusterInfo, CompiledTemplate, JoinInfo, KeyPair, RenderContext};

use super::diagnostic::Diagnostic;
use super::generator::Offline;
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
  bootplate render --template t.yaml --machine m.yaml --cluster c.yaml \\
      --set httpProxy=http://proxy:3128 --role all --output out/

With `delivery: Fetch`, a joining machine's user-data is a stub that fetches the render from
the workload cluster: render prints that stub (its token and keys as thrown away as the
certificates), and with --payload the render it fetches.

Unless given --token, --ca-cert and --ca-key, the join token is random and the certificates
(cluster CA, etcd CA, front-proxy CA, service-account key) are generated on the spot and thrown
away: the output shows what a machine would receive, but cannot join a real cluster. With
--pki-dir, every certificate comes from that directory, so renders of several control-plane
Machines share them as the controller's do (from the Cluster's Secrets).

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
    /// The role: init, control-plane-join or worker, or `all` for one output per role (with
    /// --output DIR). Default: init for a Machine labelled cluster.x-k8s.io/control-plane,
    /// worker otherwise.
    #[arg(long, value_name = "ROLE")]
    pub role: Option<RoleChoice>,
    /// Write the user-data to FILE instead of standard output; with `--role all`, a directory
    /// that gets one file per role (`user-data-init`, …).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Set a template variable, for a quick try without a config file: NAME=VALUE, repeatable,
    /// over the config's variables. VALUE is read as YAML, so `maxPods=110`, `debug=true` and
    /// `ntp=[a, b]` have their types; quote it (`name='"010"'`) to keep text.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,
    /// The bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`). Default: a random one.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// The cluster CA certificate (PEM), with --ca-key. Default: a throw-away CA.
    #[arg(long, value_name = "FILE", requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// The cluster CA private key (PEM), with --ca-cert.
    #[arg(long, value_name = "FILE", requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// Every certificate of the Cluster from DIR, laid out as kubeadm's /etc/kubernetes/pki:
    /// ca.crt and ca.key, etcd/ca.crt and etcd/ca.key, front-proxy-ca.crt and
    /// front-proxy-ca.key, sa.pub and sa.key (what `kubeadm init phase certs` writes).
    #[arg(long, value_name = "DIR", conflicts_with = "ca_cert")]
    pub pki_dir: Option<PathBuf>,
    /// Call the generator a template part names: NAME=URL (https), repeatable. Offline,
    /// generators receive no token and no keys.
    #[arg(long = "generator", value_name = "NAME=URL")]
    pub generators: Vec<String>,
    /// PEM CA certificates the generators' serving certificates are checked against.
    /// Default: the system's trusted roots.
    #[arg(long, value_name = "FILE")]
    pub generator_ca: Option<PathBuf>,
    /// With `delivery: Fetch` (the template's or the config's), write the render a machine
    /// fetches (a script, as the stub runs it) instead of its user-data, the stub. With
    /// `--role all`, one `payload-ROLE` file per role that fetches (init never does).
    #[arg(long)]
    pub payload: bool,
}

/// `--role`: one role, or all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChoice {
    One(Role),
    All,
}

impl std::str::FromStr for RoleChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            Ok(RoleChoice::All)
        } else {
            s.parse::<Role>()
                .map(RoleChoice::One)
                .map_err(|e| format!("{e}, or all"))
        }
    }
}

/// Runs `bootplate render`.
pub fn run(args: &RenderArgs) -> ExitCode {
    if args.role == Some(RoleChoice::All) && args.output.is_none() {
        eprintln!("bootplate render: --role all writes one file per role: give --output DIR");
        return exit(EXIT_INPUT);
    }
    match render(args) {
        Ok(outputs) => {
            let written = match (&args.output, args.role) {
                (Some(dir), Some(RoleChoice::All)) => std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))
                    .and_then(|()| {
                        outputs.iter().try_for_each(|(role, data)| {
                            let kind = if args.payload { "payload" } else { "user-data" };
                            let path = dir.join(format!("{kind}-{role}"));
                            std::fs::write(&path, data)
                                .map_err(|e| format!("cannot write {}: {e}", path.display()))
                        })
                    }),
                (Some(path), _) => std::fs::write(path, &outputs[0].1)
                    .map_err(|e| format!("cannot write {}: {e}", path.display())),
                (None, _) => std::io::stdout()
                    .lock()
                    .write_all(&outputs[0].1)
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
pub(super) fn read_object<T: serde::de::DeserializeOwned>(
    path: &Path,
    kinds: &[&str],
) -> Result<(YamlFile, usize, T), ReadError> {
    let file = YamlFile::read(path)?;
    let index = file.find(kinds)?;
    let problems = file.check_kinds(kinds);
    if !problems.is_empty() {
        return Err(ReadError::Problems(problems));
    }
    let object = file.decode(index).map_err(ReadError::Problems)?;
    Ok((file, index, object))
}

/// The user-data of each role asked for.
fn render(args: &RenderArgs) -> Result<Vec<(Role, Vec<u8>)>, Failure> {
    let template_file = YamlFile::read(&args.template)?;
    let index = template_file.find(&TEMPLATE_KINDS)?;
    let problems = template_file.check_kinds(&TEMPLATE_KINDS);
    if !problems.is_empty() {
        return Err(ReadError::Problems(problems).into());
    }
    let (object, spec) = template(&template_file, index).map_err(ReadError::Problems)?;
    let (_, _, machine): (_, _, Machine) = read_object(&args.machine, &["Machine"])?;
    let (_, _, cluster): (_, _, Cluster) = read_object(&args.cluster, &["Cluster"])?;
    let config_input = args.config.as_deref().map(read_config).transpose()?;
    let mut config = config_input
        .as_ref()
        .map(|c| c.spec.clone())
        .unwrap_or_default();
    set_variables(&mut config, &args.set)?;
    let roles = match args.role {
        Some(RoleChoice::All) => Role::ALL.to_vec(),
        Some(RoleChoice::One(role)) => vec![role],
        None if machine.is_control_plane() => vec![Role::Init],
        None => vec![Role::Worker],
    };
    let token = join_token(args.token.as_deref())?;
    let ca = cluster_ca(args)?;
    let join = JoinInfo {
        token,
        api_server_endpoint: ClusterInfo::from_cluster(&cluster)
            .control_plane_endpoint
            .address(),
        ca_cert_hashes: vec![
            pki::ca_cert_hash(&ca.cert).map_err(|e| input(format!("--ca-cert: {e}")))?,
        ],
    };
    let certs = certificates(&roles, ca, args.pki_dir.as_deref())?;
    // Errors start with the file, line and column of their culprit, as lint's do.
    let at = |e: &render::RenderError| located(e, &template_file, index, config_input.as_ref());
    let compiled = CompiledTemplate::compile(&object, &spec)
        .map_err(|e| Failure::Render(format!("{}{e}", at(&e))))?;
    if let Some(input) = &config.network {
        let set = render::network::set_fields(input);
        let view = network::view(&object, set, compiled.ignored_network_fields(input));
        if let Some(warning) = network::warning(&view) {
            eprintln!("bootplate render: warning: {warning}");
        }
    }
    let generators = Offline::new(&args.generators, args.generator_ca.as_deref())?;
    let roles = fetching_roles(&compiled, &config, roles, args.payload)?;
    let shared = Shared {
        cluster: &cluster,
        machine: &machine,
        object: &object,
        compiled: &compiled,
        config: &config,
        join: &join,
        certs: &certs,
        generators: &generators,
        at: &at,
    };
    (roles.into_iter())
        .map(|role| render_role(&shared, role, args.payload))
        .collect()
}

/// What the render of every role shares.
struct Shared<'a> {
    cluster: &'a Cluster,
    machine: &'a Machine,
    /// The template, as messages name it.
    object: &'a str,
    compiled: &'a CompiledTemplate,
    config: &'a crd_types::BootplateConfigSpec,
    join: &'a JoinInfo,
    certs: &'a Option<Certificates>,
    generators: &'a Offline,
    /// Where a render error's culprit is (`FILE:LINE:COL: `).
    at: &'a dyn Fn(&render::RenderError) -> String,
}

/// The name the offline stub gives the payload it fetches (the controller's names a config).
const OFFLINE_PAYLOAD: &str = "bootplate-fetch-offline-render";

/// The roles to render: with `--payload`, those whose machines fetch their render (an error
/// when none does); without, all of `roles`, with a note on standard error when some of them
/// receive a fetch stub, which is not the render.
fn fetching_roles(
    compiled: &CompiledTemplate,
    config: &crd_types::BootplateConfigSpec,
    roles: Vec<Role>,
    payload: bool,
) -> Result<Vec<Role>, Failure> {
    let (fetching, whole): (Vec<Role>, Vec<Role>) = roles
        .into_iter()
        .partition(|role| compiled.fetches(config, *role));
    let names = |roles: &[Role]| {
        roles
            .iter()
            .map(Role::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (payload, fetching.is_empty()) {
        (true, true) => Err(input(format!(
            "--payload: a machine of role {} receives its whole render as user-data (the render fetches nothing: `delivery: Fetch` is not set, or the role is init, which never fetches)",
            names(&whole)
        ))),
        (true, false) => Ok(fetching),
        (false, true) => Ok(whole),
        (false, false) => {
            eprintln!(
                "bootplate render: note: delivery: Fetch: the user-data of role {} is the stub that fetches the render (its keys and token thrown away, as the certificates are); --payload writes the render it fetches",
                names(&fetching)
            );
            let mut all = whole;
            all.extend(fetching);
            all.sort_by_key(|role| Role::ALL.iter().position(|r| r == role));
            Ok(all)
        }
    }
}

/// The user-data of `role`, or with `payload` the render its machine fetches (the stub's
/// payload, unsealed).
fn render_role(s: &Shared<'_>, role: Role, payload: bool) -> Result<(Role, Vec<u8>), Failure> {
    // RenderContext::new drops the certificates for a worker and the join data for init.
    let mut ctx = RenderContext::new(
        s.cluster,
        s.machine,
        role,
        Some(s.join.clone()),
        s.certs.clone(),
    );
    if s.compiled.fetches(s.config, role) {
        let keys = render::fetch::PayloadKeys {
            cipher: rand::random(),
            mac: rand::random(),
            iv: rand::random(),
        };
        ctx.fetch = (ctx.join.as_ref()).map(|j| j.fetch_target(OFFLINE_PAYLOAD.to_owned(), keys));
    }
    let generated = (s.generators.answer(s.compiled, s.config, &ctx)).map_err(|(field, e)| {
        Failure::Render(format!("{} {field}: {e} (role {role})", s.object))
    })?;
    let rendered = (s.compiled.render_generated(s.config, &ctx, &generated))
        .map_err(|e| Failure::Render(format!("{}{e} (role {role})", (s.at)(&e))))?;
    if !payload {
        return Ok((role, rendered.data));
    }
    let sealed = rendered.payload.as_ref().zip(ctx.fetch.as_ref());
    let plain = sealed.and_then(|(sealed, target)| render::fetch::open(sealed, &target.keys));
    let plain = plain.ok_or_else(|| {
        Failure::Render(format!(
            "{}: the role {role} render holds no payload",
            s.object
        ))
    })?;
    Ok((role, plain))
}

/// Applies each `--set NAME=VALUE` to the config's variables, the value read as YAML.
fn set_variables(
    config: &mut crd_types::BootplateConfigSpec,
    assignments: &[String],
) -> Result<(), Failure> {
    for assignment in assignments {
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| input(format!("--set {assignment:?}: write NAME=VALUE")))?;
        let value: serde_json::Value =
            render::yaml::from_str(value, render::yaml::YamlLimit::document(value))
                .map_err(|e| input(format!("--set {name}: the value is not YAML: {e}")))?;
        config.variables.insert(name.to_owned(), value);
    }
    Ok(())
}

/// The `--token` given, checked, or a random one.
fn join_token(given: Option<&str>) -> Result<String, Failure> {
    match given {
        Some(t) if valid_token(t) => Ok(t.to_owned()),
        Some(_) => Err(input(
            "--token must look like abcdef.0123456789abcdef ([a-z0-9]{6}.[a-z0-9]{16})".to_owned(),
        )),
        None => Ok(random_token()),
    }
}

/// The cluster CA of `--pki-dir`, of `--ca-cert` and `--ca-key`, or a throw-away one.
fn cluster_ca(args: &RenderArgs) -> Result<KeyPair, Failure> {
    if let Some(dir) = &args.pki_dir {
        return read_pair(&dir.join("ca.crt"), &dir.join("ca.key"), "--pki-dir");
    }
    let (Some(cert), Some(key)) = (&args.ca_cert, &args.ca_key) else {
        return throw_away_ca("bootplate render throw-away cluster CA");
    };
    read_pair(cert, key, "--ca-cert/--ca-key")
}

/// The PEM key pair in files `cert` and `key`, checked; `flag` names where they came from.
fn read_pair(cert: &Path, key: &Path, flag: &str) -> Result<KeyPair, Failure> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| input(format!("{flag}: {}: cannot read: {e}", p.display())))
    };
    let pair = KeyPair {
        cert: read(cert)?,
        key: read(key)?,
    };
    pki::check_key_pair(&pair).map_err(|e| {
        input(format!(
            "{flag}: {} and {}: {e}",
            cert.display(),
            key.display()
        ))
    })?;
    Ok(pair)
}

fn throw_away_ca(name: &str) -> Result<KeyPair, Failure> {
    pki::generate_ca(name).map_err(|e| Failure::Render(e.to_string()))
}

/// The certificates of a control-plane render (`ca`, and the others of `pki_dir` or throw-away
/// ones); none for workers.
fn certificates(
    roles: &[Role],
    ca: KeyPair,
    pki_dir: Option<&Path>,
) -> Result<Option<Certificates>, Failure> {
    if !roles.iter().any(|r| r.is_control_plane()) {
        return Ok(None);
    }
    if let Some(dir) = pki_dir {
        let pair = |cert: &str, key: &str| read_pair(&dir.join(cert), &dir.join(key), "--pki-dir");
        return Ok(Some(Certificates {
            ca,
            etcd: pair("etcd/ca.crt", "etcd/ca.key")?,
            front_proxy: pair("front-proxy-ca.crt", "front-proxy-ca.key")?,
            service_account: pair("sa.pub", "sa.key")?,
        }));
    }
    Ok(Some(Certificates {
        ca,
        etcd: throw_away_ca("bootplate render throw-away etcd CA")?,
        front_proxy: throw_away_ca("bootplate render throw-away front-proxy CA")?,
        service_account: pki::generate_service_account_key()
            .map_err(|e| Failure::Render(e.to_string()))?,
    }))
}

/// `FILE:LINE:COL: ` of the first problem of `e`: in the template (document `index` of
/// `template`), or in the `--config` file for a problem of the config's; empty for a value of
/// `--set`, which has no file.
fn located(
    e: &render::RenderError,
    template: &YamlFile,
    index: usize,
    config: Option<&ConfigInput>,
) -> String {
    let Some(p) = e.problems().into_iter().next() else {
        return String::new();
    };
    let (file, (line, column)) = match (p.origin, config) {
        (render::Origin::Config, Some(c)) => {
            let d = c.at().locate(&p.field, p.severity, p.code, String::new());
            (d.file, (d.line, d.column))
        }
        (render::Origin::Config, None) => return String::new(),
        (render::Origin::Template, _) => (
            template.shown.clone(),
            template.positions.locate(index, &p.field, p.position),
        ),
    };
    format!("{file}:{line}:{column}: ")
}

/// A BootplateConfig's spec, or a BootplateConfigTemplate's `spec.template.spec`, read
/// strictly. Files read from Secrets get a placeholder, PEM from Secrets a sample certificate:
/// nothing is read from a cluster offline.
fn read_config(path: &Path) -> Result<ConfigInput, Failure> {
    let mut input = ConfigInput::read(path)?;
    offline_spec(&mut input.spec);
    Ok(input)
}

/// `spec` as the offline commands render it: a placeholder for each file read from a Secret,
/// a sample certificate for the network input's Secrets.
pub(super) fn offline_spec(spec: &mut crd_types::BootplateConfigSpec) {
    for f in &mut spec.files {
        if let (None, Some(from)) = (&f.content, &f.content_from) {
            f.content = Some(format!(
                "placeholder: offline, bootplate render does not read Secret {} key {}\n",
                from.secret.name, from.secret.key
            ));
            f.encoding = None;
        }
    }
    // A sample certificate stands in for the network input's Secrets, for the same reason.
    if let Some(network) = spec.network.as_mut() {
        render::network::with_sample_secrets(network);
    }
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
    bootplate::core::token::Token::generate().expose()
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
