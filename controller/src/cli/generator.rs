//! `bootplate generator serve`, the reference generator: bootplate's render engine behind the
//! generator protocol (a template file in, its parts out). And the generators the offline
//! commands call (`--generator NAME=URL`): the same HTTPS client and response checks as the
//! controller's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use bootplate::generator::client::GeneratorClient;
use bootplate::webhook::tls::ClientAuth;
use crd_types::{BootplateConfigSpec, ClientConfig, GeneratorSecrets, GeneratorSpec};
use render::generator::{self, Generated, Request, Response};
use render::{CompiledTemplate, RenderContext};

use super::input::{InputError, ReadError, TEMPLATE_KINDS, YamlFile, template};
use super::{EXIT_INPUT, exit};

/// Arguments of `bootplate generator`.
#[derive(clap::Args, Debug)]
pub struct GeneratorArgs {
    #[command(subcommand)]
    pub command: GeneratorCommand,
}

/// `bootplate generator` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum GeneratorCommand {
    /// Serve a template's parts as a BootstrapGenerator (HTTPS, docs/generators.md).
    Serve(ServeArgs),
}

/// Arguments of `bootplate generator serve`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Answers each GeneratePartRequest (POST, generator.bootplate.dev/v1alpha1) by rendering the
template's parts that apply to the request's role, with the request's context (cluster, machine,
join data, certificates as granted) and values: the request's values fill the variables the
template declares, its parameters must be declared. The answer holds the rendered files, units
and commands; a render error is a Failure response with the message.

Each connection is bounded: at most 256 at once (one more is closed at once), 10 s for the TLS
handshake and for a request's headers (also the idle time of a kept-alive connection), 30 s per
request, 2 MiB per request body.

Example, serving on port 9443 with cert-manager's tls.crt and tls.key mounted in /tls, and
answering only callers with a client certificate signed by the CA in /ca/ca.crt (bootplate run
--generator-client-cert-dir):
  bootplate generator serve --template netplan.yaml --addr 0.0.0.0:9443 --cert-dir /tls \
    --client-ca /ca/ca.crt

Exit codes: 0 stopped by SIGTERM or SIGINT, 2 bad usage or unreadable template.")]
pub struct ServeArgs {
    /// The template whose parts are served: a YAML file with a BootstrapTemplate or
    /// ClusterBootstrapTemplate with `spec.parts` (none of which names a generator).
    #[arg(long, value_name = "FILE")]
    pub template: PathBuf,
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:9443", value_name = "ADDR")]
    pub addr: std::net::SocketAddr,
    /// Directory holding `tls.crt` and `tls.key` (reloaded when they change).
    #[arg(long, value_name = "DIR")]
    pub cert_dir: PathBuf,
    /// The URL path requests are POSTed to.
    #[arg(long, default_value = "/", value_name = "PATH")]
    pub path: String,
    /// PEM file of the CA(s) whose client certificates are accepted: a caller must present
    /// one (bootplate's `--generator-client-cert-dir`), or the TLS handshake fails before any
    /// request is read. Default: any caller is answered.
    #[arg(long, value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
}

/// Runs `bootplate generator`.
pub fn run(args: &GeneratorArgs) -> ExitCode {
    match &args.command {
        GeneratorCommand::Serve(serve) => run_serve(serve),
    }
}

fn run_serve(args: &ServeArgs) -> ExitCode {
    let compiled = match served_template(&args.template) {
        Ok(compiled) => Arc::new(compiled),
        Err(message) => {
            eprintln!("bootplate generator serve: {message}");
            return exit(EXIT_INPUT);
        }
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let served = runtime.block_on(async {
        let app = Router::new()
            .route(&args.path, post(answer))
            .with_state(compiled.clone());
        let callers = match &args.client_ca {
            Some(file) => ClientAuth::CertificateFrom(file.clone()),
            None => ClientAuth::Anyone,
        };
        let limits = bootplate::server::Limits::default();
        bootplate::webhook::tls::serve_with(
            args.addr,
            &args.cert_dir,
            callers,
            app,
            "--addr",
            limits,
        )
        .await?;
        eprintln!(
            "bootplate generator serve: serving {} on https://{}{}",
            compiled.object(),
            args.addr,
            args.path
        );
        bootplate::runtime::run::shutdown_signal().await;
        Ok::<_, anyhow::Error>(())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bootplate generator serve: {e:#}");
            exit(EXIT_INPUT)
        }
    }
}

/// The template of `path`, compiled, if it can be served.
fn served_template(path: &Path) -> Result<CompiledTemplate, String> {
    let unreadable = |e: ReadError| match e {
        ReadError::Unreadable(e) => e.0,
        ReadError::Problems(found) => found
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    };
    let file = YamlFile::read(path).map_err(unreadable)?;
    let index = file.find(&TEMPLATE_KINDS).map_err(|e| e.0)?;
    let (object, spec) =
        template(&file, index).map_err(|found| unreadable(ReadError::Problems(found)))?;
    if spec.parts.is_empty() {
        return Err(format!(
            "{object}: a generator serves spec.parts; this template has none"
        ));
    }
    if let Some((i, _)) = spec
        .parts
        .iter()
        .enumerate()
        .find(|(_, p)| p.generator.is_some())
    {
        return Err(format!(
            "{object}: spec.parts[{i}].generator: a served template cannot call generators itself"
        ));
    }
    CompiledTemplate::compile(&object, &spec).map_err(|e| e.to_string())
}

/// Answers one request; a request that is not one is a 400 with a Failure saying why.
async fn answer(
    State(compiled): State<Arc<CompiledTemplate>>,
    body: axum::body::Bytes,
) -> (StatusCode, axum::Json<Response>) {
    let request: Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            let failure = Response::failure(format!("not a {}: {e}", generator::REQUEST_KIND));
            return (StatusCode::BAD_REQUEST, axum::Json(failure));
        }
    };
    if request.api_version != generator::API_VERSION || request.kind != generator::REQUEST_KIND {
        let failure = Response::failure(format!(
            "this generator speaks {} {}",
            generator::API_VERSION,
            generator::REQUEST_KIND
        ));
        return (StatusCode::BAD_REQUEST, axum::Json(failure));
    }
    let (id, machine) = (
        request.request_id.clone(),
        request.context.machine.name.clone(),
    );
    let response = tokio::task::spawn_blocking(move || compiled.generate(&request))
        .await
        .unwrap_or_else(|e| Response::failure(format!("the render did not finish: {e}")));
    eprintln!(
        "request {id}: machine {machine}: {:?}{}",
        response.status,
        response
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    );
    (StatusCode::OK, axum::Json(response))
}

/// The generators of `--generator NAME=URL` (with `--generator-ca`), called from the offline
/// commands with no secrets: a throw-away token or key would tell a generator nothing.
pub struct Offline {
    clients: BTreeMap<String, GeneratorClient>,
    runtime: tokio::runtime::Runtime,
}

impl Offline {
    /// Parses the flags; Err names the flag that is wrong.
    pub fn new(flags: &[String], ca: Option<&Path>) -> Result<Offline, InputError> {
        let ca_bundle = match ca {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                InputError(format!(
                    "--generator-ca {}: cannot read: {e}",
                    path.display()
                ))
            })?),
            None => None,
        };
        let mut clients = BTreeMap::new();
        for flag in flags {
            let (name, url) = flag
                .split_once('=')
                .ok_or_else(|| InputError(format!("--generator {flag:?}: write NAME=URL")))?;
            let spec = GeneratorSpec {
                client_config: ClientConfig {
                    url: Some(url.to_owned()),
                    ca_bundle: ca_bundle.clone(),
                    ..Default::default()
                },
                ..Default::default()
            };
            let client = GeneratorClient::new(&spec)
                .map_err(|e| InputError(format!("--generator {name}: {e}")))?;
            clients.insert(name.to_owned(), client);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| InputError(format!("cannot start an async runtime: {e}")))?;
        if !clients.is_empty() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        Ok(Offline { clients, runtime })
    }

    /// Whether `name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.clients.contains_key(name)
    }

    /// The answers of every generator call a render of `compiled` with `config` for `ctx`
    /// makes; Err names the part, the generator and the cause.
    pub fn answer(
        &self,
        compiled: &CompiledTemplate,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
    ) -> Result<Generated, (String, String)> {
        let mut generated = Generated::new();
        for call in compiled.generator_calls(config, ctx.machine.role) {
            let Some(client) = self.clients.get(&call.generator) else {
                let message = format!(
                    "part `{}` takes content from BootstrapGenerator {}: give --generator {}=URL",
                    call.part, call.generator, call.generator
                );
                return Err((call.field, message));
            };
            let secrets = GeneratorSecrets::default();
            let request = compiled
                .generator_request(&call, config, ctx, secrets)
                .map_err(|e| (call.field.clone(), e.to_string()))?;
            let answered = self.runtime.block_on(client.call(&request));
            let part = answered.map_err(|e| {
                let message = format!(
                    "BootstrapGenerator {} ({}): {e}",
                    call.generator,
                    client.endpoint()
                );
                (call.field.clone(), message)
            })?;
            generated.insert(call.part, Arc::new(part));
        }
        Ok(generated)
    }
}
