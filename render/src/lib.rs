//! bootplate's render engine: a template spec, a config spec and a typed render context in,
//! user-data bytes (and the Secret's `format`) or a typed error out. No Kubernetes client.
//!
//! ```text
//! let compiled = CompiledTemplate::compile("ClusterBootstrapTemplate ubuntu-2404", &spec)?; // once per revision
//! let rendered = compiled.render(&config, &RenderContext::new(&cluster, &machine, role, join, certs))?;
//! secret.data["value"] = rendered.data; secret.data["format"] = rendered.secret_format();
//! ```
//!
//! `docs/templates.md` is the template author's reference for everything here.

mod analysis;
mod body;
mod compare;
pub mod context;
mod engine;
mod error;
pub mod fetch;
mod files;
mod formats;
pub mod generator;
mod helpers;
mod inplace;
pub mod jinja;
mod limit;
mod lint;
mod lint_windows;
pub mod network;
pub mod powershell;
mod sample;
mod tree;
pub mod user_data;
mod values;
pub mod yaml;

use crd_types::{
    BootplateConfigSpec, Compression, Delivery, GeneratorSecrets, OutputFormat, Role, TemplateSpec,
    UpdateStrategy,
};
use handlebars::Context;
use serde_json::{Map, Value};

pub use compare::{CompareError, Comparison, Renders, Revision, compare, comparison_context};
pub use context::*;
pub use engine::{MAX_DEPTH, MAX_PARTIAL_EXPANSIONS, MAX_TEMPLATE_COST, MAX_TEXT_COST};
pub use error::{Origin, Position, Problem, RenderError, Severity};
pub use helpers::MAX_WORK;
pub use inplace::{PartsRender, RenderedPart, UpdatePlan};
pub use limit::{GZIP_EXPANSION, Limit, SECRET_LIMIT_BYTES};
pub use lint::{lint, user_data_problems};
pub use sample::{
    SAMPLE_CA_HASH, SAMPLE_CLUSTER, SAMPLE_TOKEN, machine_shapes, sample_certificates,
    sample_context, sample_fetching_context,
};
pub use user_data::UserDataLimit;

use body::CompiledPart;
use engine::{Engine, FieldError, Text};
use generator::{Call, Generated, Request, RequestContext, Response, TemplateInfo};
use limit::Budget;
use values::Declarations;

/// A template spec compiled once per revision; cheap to share (`Send + Sync`, use it behind an
/// `Arc`). Rendering borrows it immutably.
pub struct CompiledTemplate {
    object: String,
    revision: String,
    format: OutputFormat,
    compression: Compression,
    max_output_bytes: Option<u64>,
    /// The template does not turn boot reports off.
    boot_reports: bool,
    /// The template's `delivery` (a config may override it).
    delivery: Delivery,
    engine: Engine,
    declarations: Declarations,
    body: Body,
    /// The template's defaults of the network input.
    network: Option<crd_types::NetworkConfig>,
    /// The fields of `network` the template's texts read (see [`CompiledTemplate::ignored_network_fields`]),
    /// found once, when first asked.
    network_read: std::sync::OnceLock<std::collections::BTreeSet<String>>,
}

enum Body {
    /// A raw `spec.template`, and the `update: InPlace` parts whose files, units and commands
    /// are added to its output (docs/in-place.md).
    Raw(Text, Vec<CompiledPart>),
    Parts(Vec<CompiledPart>),
}

/// Rendered user-data.
#[derive(Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The bytes for the data Secret's `value` key (gzip-compressed when the template asks).
    pub data: Vec<u8>,
    /// The precise format (for the Secret's annotation).
    pub format: OutputFormat,
    /// With fetch delivery, the sealed render that `data`, a stub, fetches (see [`fetch`]).
    pub payload: Option<fetch::Sealed>,
}

impl std::fmt::Debug for Rendered {
    // The data holds tokens and keys: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendered")
            .field("data", &format_args!("<{} bytes>", self.data.len()))
            .field("format", &self.format)
            .field("payload", &self.payload)
            .finish()
    }
}

impl Rendered {
    /// The Secret's `format` key: `ignition` for Ignition, `cloud-config` otherwise (cloud-init
    /// consumes scripts and MIME archives as user-data).
    pub fn secret_format(&self) -> &'static str {
        self.format.secret_format()
    }
}

/// What a raw `spec.template` renders from: its text and parts, the config and what its
/// generators gave, the machine's role and the render context.
struct RawInput<'a> {
    text: &'a Text,
    parts: &'a [CompiledPart],
    config: &'a BootplateConfigSpec,
    generated: &'a Generated,
    role: crd_types::Role,
    context: &'a Context,
}

impl CompiledTemplate {
    /// Compiles every template text of `spec` (partials, the raw `template` or each file path,
    /// file content, unit, drop-in and command of the parts) and checks the spec: variable
    /// declarations, partial references and recursion, nesting depth, names and modes.
    /// `object` names the template in messages, for example
    /// `ClusterBootstrapTemplate ubuntu-2404` or `BootstrapTemplate ns/name`.
    ///
    /// Err is always [`RenderError::TemplateInvalid`], listing every problem found.
    pub fn compile(object: &str, spec: &TemplateSpec) -> Result<CompiledTemplate, RenderError> {
        let mut problems = Vec::new();
        let compiled = Self::compile_collecting(object, spec, &mut problems);
        if problems.is_empty() {
            Ok(compiled)
        } else {
            Err(RenderError::invalid(object, problems))
        }
    }

    fn compile_collecting(
        object: &str,
        spec: &TemplateSpec,
        problems: &mut Vec<Problem>,
    ) -> CompiledTemplate {
        let declarations = Declarations::compile(&spec.variables, problems);
        let mut engine = Engine::new();
        for (name, text) in &spec.partials {
            if valid_partial_name(name) {
                engine.add_partial(name, text, problems);
            } else {
                problems.push(Problem::template(
                    format!("spec.partials.{}", crate::error::truncate(name, 64)),
                    "a partial name is letters, digits, `_` and `-`",
                ));
            }
        }
        let body = match (&spec.template, spec.parts.is_empty()) {
            (Some(text), _) => {
                let raw = engine.add("spec.template", text, problems);
                check_raw_parts(spec, problems);
                Body::Raw(
                    raw,
                    body::compile_parts(
                        &spec.parts,
                        spec.format.is_windows(),
                        &mut engine,
                        problems,
                    ),
                )
            }
            (None, false) => Body::Parts(body::compile_parts(
                &spec.parts,
                spec.format.is_windows(),
                &mut engine,
                problems,
            )),
            (None, true) => {
                problems.push(Problem::template(
                    "spec",
                    "the template has no body: set spec.template or spec.parts",
                ));
                Body::Parts(Vec::new())
            }
        };
        check_windows(spec, problems);
        if spec.delivery == Some(Delivery::Fetch) && spec.template.is_some() {
            problems.push(Problem::template(
                "spec.delivery",
                "delivery: Fetch needs a structured body (spec.parts): the fetched render is laid out in the script format",
            ));
        }
        if let Some(network) = &spec.network {
            problems.extend(
                network::check(network, network::Source::Template)
                    .into_iter()
                    .map(|(field, message)| {
                        Problem::template(format!("spec.network.{field}"), message)
                    }),
            );
        }
        engine.check_partials(problems);
        if problems.is_empty() {
            engine.inline_partials();
        }
        CompiledTemplate {
            object: object.to_owned(),
            revision: spec.revision(),
            format: spec.format,
            compression: spec.compression.unwrap_or_default(),
            max_output_bytes: spec.max_output_bytes,
            boot_reports: spec.boot_reports.unwrap_or_default() == crd_types::BootReports::Enabled,
            delivery: spec.delivery.unwrap_or_default(),
            engine,
            declarations,
            body,
            network: spec.network.clone(),
            network_read: std::sync::OnceLock::new(),
        }
    }

    /// The fields `input` sets (named as in `spec.network`) that no text of this template reads,
    /// so a render ignores them: every field set, for a template that takes no network input.
    /// The analysis runs once per compiled template.
    pub fn ignored_network_fields(&self, input: &crd_types::NetworkConfig) -> Vec<&'static str> {
        let read = self
            .network_read
            .get_or_init(|| lint::analyze(self).network_read);
        let unread = lint::unread_network_fields(read);
        network::set_fields(input)
            .into_iter()
            .filter(|field| unread.contains(field))
            .collect()
    }

    /// The revision of the compiled spec (`TemplateSpec::revision`).
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The output format.
    pub fn format(&self) -> OutputFormat {
        self.format
    }

    /// The object name given to [`CompiledTemplate::compile`].
    pub fn object(&self) -> &str {
        &self.object
    }

    /// Renders the user-data of the machine described by `ctx` with `config`: checks the config's
    /// variables against the declarations and builds `values` (defaults overridden by the
    /// config), renders (stopping as soon as the size budget runs out), lays the structured body
    /// out in the format or checks a raw body's output against it, compresses if the template
    /// asks, and enforces the size limit.
    ///
    /// `config.files` must carry `content` (the controller resolves `contentFrom` first).
    /// Parts with a generator contribute only their own content here (what offline checks
    /// see); [`CompiledTemplate::render_generated`] adds the generators' output.
    pub fn render(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
    ) -> Result<Rendered, RenderError> {
        self.render_inner(config, ctx, &Generated::new())
    }

    /// [`CompiledTemplate::render`] with the generators' output: `generated` must hold, by part
    /// name, the validated response of every call [`CompiledTemplate::generator_calls`] lists.
    pub fn render_generated(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
        generated: &Generated,
    ) -> Result<Rendered, RenderError> {
        if let Some(call) = self
            .generator_calls(config, ctx.machine.role)
            .into_iter()
            .find(|call| !generated.contains_key(&call.part))
        {
            return Err(RenderError::failed(
                &self.object,
                Problem::template(
                    call.field,
                    format!(
                        "part `{}` takes content from BootstrapGenerator {}, whose response is missing",
                        call.part, call.generator
                    ),
                )
                .with_reason(crd_types::conditions::reason::GENERATOR_FAILED),
            ));
        }
        self.render_inner(config, ctx, generated)
    }

    fn render_inner(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
        generated: &Generated,
    ) -> Result<Rendered, RenderError> {
        self.check_windows_render(config, ctx.machine.role)?;
        let _work = helpers::WorkBudget::start();
        let values = self.declarations.values(&self.object, &config.variables)?;
        let limit = Limit::new(self.max_output_bytes, config.max_output_bytes);
        let compress =
            self.compression == Compression::Gzip && self.format != OutputFormat::Ignition;
        let cap = if compress {
            limit.bytes * GZIP_EXPANSION
        } else {
            limit.bytes
        };
        let mut budget = Budget::new(cap);
        let context = self.machine_context(config, ctx, values)?;
        let mut payload = None;
        let text = match &self.body {
            Body::Raw(text, parts) => {
                self.check_raw_inline(config, ctx)?;
                let input = RawInput {
                    text,
                    parts,
                    config,
                    generated,
                    role: ctx.machine.role,
                    context: &context,
                };
                self.render_raw(input, &mut budget, limit, compress)?
            }
            Body::Parts(parts) => {
                let body = body::collect(
                    parts,
                    config,
                    ctx.machine.role,
                    &self.engine,
                    &context,
                    &mut budget,
                    generated,
                )
                .map_err(|e| self.field_error(e, &budget, limit, compress))?;
                formats::check_units(&body).map_err(|message| {
                    RenderError::failed(
                        &self.object,
                        Problem::template(
                            "spec.parts",
                            format!("not a valid systemd unit file: {message}"),
                        )
                        .with_reason(crd_types::conditions::reason::RENDER_FAILED),
                    )
                })?;
                let (text, sealed) = self.lay_out(&body, ctx, limit)?;
                payload = sealed;
                text
            }
        };
        if compress && text.len() as u64 > cap {
            return Err(self.too_large(text.len() as u64, cap, limit, true, false));
        }
        let data = if compress {
            helpers::gzip(text.as_bytes())
        } else {
            text.into_bytes()
        };
        if data.len() as u64 > limit.bytes {
            return Err(self.too_large(data.len() as u64, limit.bytes, limit, false, false));
        }
        Ok(Rendered {
            data,
            format: self.format,
            payload,
        })
    }

    /// A raw `spec.template`'s output with what its parts add merged in (nothing when they
    /// render nothing), checked against the format.
    fn render_raw(
        &self,
        input: RawInput<'_>,
        budget: &mut Budget,
        limit: Limit,
        compress: bool,
    ) -> Result<String, RenderError> {
        let RawInput {
            text,
            parts,
            config,
            generated,
            role,
            context,
        } = input;
        if !config.skip_parts.is_empty() && parts.is_empty() {
            return Err(RenderError::failed(
                &self.object,
                Problem::config(
                    "spec.skipParts[0]",
                    "the template has no parts to skip (it has a raw spec.template)",
                ),
            ));
        }
        let (out, added) = (self.engine.render(text, context, budget))
            .and_then(|out| {
                let added = body::collect_parts(
                    parts,
                    config,
                    role,
                    &self.engine,
                    context,
                    budget,
                    generated,
                )?;
                Ok((out, body::parts_body(added)))
            })
            .map_err(|e| self.field_error(e, budget, limit, compress))?;
        formats::merge_raw(self.format, out, &added)
            .and_then(|out| formats::check_raw(self.format, &out).map(|()| out))
            .map_err(|message| {
                RenderError::failed(
                    &self.object,
                    Problem::template("spec.template", message)
                        .with_reason(crd_types::conditions::reason::RENDER_FAILED),
                )
            })
    }

    /// A Windows format renders workers only (Windows runs no Kubernetes control plane) and
    /// cannot be fetched (a config may ask for it).
    fn check_windows_render(
        &self,
        config: &BootplateConfigSpec,
        role: Role,
    ) -> Result<(), RenderError> {
        if !self.format.is_windows() {
            return Ok(());
        }
        let problem = if role != Role::Worker {
            Problem::template(
                "spec.format",
                format!(
                    "format {} renders workers only: Windows cannot run a Kubernetes control plane, and this Machine's role is {role}",
                    self.format
                ),
            )
        } else if self.fetches(config, role) {
            Problem::config(
                "spec.delivery",
                format!(
                    "delivery: Fetch is not available for format {} (the fetch stub is a POSIX shell script): use Inline",
                    self.format
                ),
            )
        } else {
            return Ok(());
        };
        Err(RenderError::failed(&self.object, problem))
    }

    /// A raw body cannot be fetched.
    fn check_raw_inline(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
    ) -> Result<(), RenderError> {
        if ctx.fetch.is_some() && self.fetches(config, ctx.machine.role) {
            let problem = Problem::config(
                "spec.delivery",
                "delivery: Fetch needs a structured template (spec.parts); this one has a raw spec.template",
            );
            return Err(RenderError::failed(&self.object, problem));
        }
        Ok(())
    }

    /// The text of a structured body: in the template's format; with fetch delivery (a
    /// [`RenderContext::fetch`] and a role that fetches), the stub in that format and the
    /// render in the script format, sealed.
    fn lay_out(
        &self,
        body: &body::Body,
        ctx: &RenderContext,
        limit: Limit,
    ) -> Result<(String, Option<fetch::Sealed>), RenderError> {
        let meta = formats::Meta {
            object: &self.object,
            revision: &self.revision,
            role: ctx.machine.role,
            report: ctx.boot_report.as_ref().filter(|_| self.boot_reports),
            stub: false,
        };
        let Some(target) = ctx
            .fetch
            .as_ref()
            .filter(|_| ctx.machine.role != Role::Init)
        else {
            let text = formats::write(self.format, &meta, body);
            formats::check_written(self.format, &text).map_err(|message| {
                let problem = Problem::template("spec.parts", message)
                    .with_reason(crd_types::conditions::reason::RENDER_FAILED);
                RenderError::failed(&self.object, problem)
            })?;
            return Ok((text, None));
        };
        let payload = formats::write(OutputFormat::Script, &meta, body);
        if payload.len() as u64 > limit.bytes {
            return Err(self.too_large(payload.len() as u64, limit.bytes, limit, false, false));
        }
        let stub_meta = formats::Meta {
            report: None,
            stub: true,
            ..meta
        };
        let stub_body = body::Body {
            files: Vec::new(),
            units: Vec::new(),
            commands: vec![fetch::stub_script(target)],
            command_parts: Vec::new(),
        };
        let stub = formats::write(self.format, &stub_meta, &stub_body);
        if stub.len() > fetch::STUB_LIMIT {
            let problem = Problem::template(
                "spec.delivery",
                format!(
                    "the fetch stub is {} bytes, over its limit of {} (the workload API endpoint `{}` takes {} of them)",
                    stub.len(),
                    fetch::STUB_LIMIT,
                    target.server,
                    target.server.len()
                ),
            );
            let problem = problem.with_reason(crd_types::conditions::reason::RENDER_FAILED);
            return Err(RenderError::failed(&self.object, problem));
        }
        Ok((stub, Some(fetch::seal(payload.as_bytes(), &target.keys))))
    }

    /// Whether a machine of `role` rendered with `config` fetches its render: the config's
    /// `delivery`, else the template's, is `Fetch`, and the role is not `init` (an `init`
    /// machine has no workload apiserver to fetch from: it always gets the whole render).
    pub fn fetches(&self, config: &BootplateConfigSpec, role: Role) -> bool {
        role != Role::Init && config.delivery.unwrap_or(self.delivery) == Delivery::Fetch
    }

    /// The render of the machine described by `ctx`, split by part, for in-place updates:
    /// compare two with [`PartsRender::update_from`]; [`PartsRender::payload`] is what
    /// bootplate-agent applies. `None` for a raw `spec.template` without parts (every change to
    /// it rolls out); with parts, the raw output is kept whole beside them. Parts with a
    /// generator carry what `generated` holds for them.
    pub fn render_parts(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
        generated: &Generated,
    ) -> Result<Option<PartsRender>, RenderError> {
        self.check_windows_render(config, ctx.machine.role)?;
        let (parts, raw) = match &self.body {
            Body::Parts(parts) => (parts, None),
            Body::Raw(text, parts) if !parts.is_empty() => (parts, Some(text)),
            Body::Raw(..) => return Ok(None),
        };
        let _work = helpers::WorkBudget::start();
        let values = self.declarations.values(&self.object, &config.variables)?;
        let limit = Limit::new(self.max_output_bytes, config.max_output_bytes);
        let mut budget = Budget::new(limit.bytes * GZIP_EXPANSION);
        let context = self.machine_context(config, ctx, values)?;
        let role = ctx.machine.role;
        let (engine, budget_ref) = (&self.engine, &mut budget);
        // A raw body renders the config's files and commands itself: its output stands for
        // them (and for everything else it writes).
        let raw_out = raw.map(|text| engine.render(text, &context, budget_ref));
        let split = raw_out.transpose().and_then(|raw| {
            let parts =
                body::collect_parts(parts, config, role, engine, &context, budget_ref, generated)?;
            let split = match raw {
                Some(_) => body::Split {
                    parts,
                    config_files: Vec::new(),
                },
                None => {
                    body::with_config_files(parts, config, self.format.is_windows(), budget_ref)?
                }
            };
            Ok((split, raw))
        });
        let (split, raw) = split.map_err(|e| self.field_error(e, &budget, limit, true))?;
        let commands: (&[String], &[String]) = match raw {
            Some(_) => (&[], &[]),
            None => (&config.pre_commands, &config.post_commands),
        };
        inplace::from_split(self.format, split, commands.0, commands.1, budget.cap())
            .map(|parts| Some(PartsRender { raw, ..parts }))
            .map_err(|e| {
                use crd_types::conditions::reason;
                let reason = match e {
                    inplace::SplitError::TooLarge { .. } => reason::OUTPUT_TOO_LARGE,
                    inplace::SplitError::Undecodable { .. } => reason::RENDER_FAILED,
                };
                let problem = Problem::template("spec.parts", e.to_string()).with_reason(reason);
                RenderError::failed(&self.object, problem)
            })
    }

    /// Whether the body is structured (`spec.parts`): only such a template can be fetched.
    pub fn is_structured(&self) -> bool {
        matches!(self.body, Body::Parts(_))
    }

    /// Whether the machines of this template report their boot when the render context has a
    /// [`BootReport`]: a structured body whose template does not turn reports off.
    pub fn reports_boot(&self) -> bool {
        self.boot_reports && matches!(self.body, Body::Parts(_))
    }

    /// The names boot reports give steps: the parts', the config's `preCommands` and
    /// `postCommands`, and the reporter's `units` and `files`.
    pub fn step_part_names(&self) -> Vec<&str> {
        let mut names = vec![
            body::PRE_COMMANDS,
            body::POST_COMMANDS,
            formats::UNITS_PART,
            formats::FILES_PART,
        ];
        if let Body::Parts(parts) = &self.body {
            names.extend(parts.iter().map(|p| p.name.as_str()));
        }
        names
    }

    /// Whether any part may change on booted machines (`update: InPlace`): only then does a
    /// joined machine's node get a payload.
    pub fn updates_in_place(&self) -> bool {
        let (Body::Parts(parts) | Body::Raw(_, parts)) = &self.body;
        parts.iter().any(|p| p.update == UpdateStrategy::InPlace)
    }

    /// Lints the compiled template: the static checks (undeclared or unknown names, unused
    /// variables) and a sample render for every role with [`sample_context`], which also runs the
    /// format checks. This is what the controller's template `Valid` condition reports; use the
    /// free function [`lint`] to include compile problems and sample config variables.
    pub fn lint(&self) -> Vec<Problem> {
        lint::lint_compiled(self, None)
    }

    /// The sample renders lint makes, for checks outside the engine (`bootplate lint` runs
    /// `bash -n` and, with `--tools`, the consumers' own validators on them): the output for
    /// each role that renders, with `config` or, without one, sample values for the required
    /// variables.
    pub fn sample_renders(
        &self,
        config: Option<&BootplateConfigSpec>,
    ) -> Vec<(crd_types::Role, Rendered)> {
        let Ok(config) = lint::sample_config(self, config) else {
            return Vec::new();
        };
        crd_types::Role::ALL
            .into_iter()
            .filter_map(|role| {
                self.render(&config, &sample_context(role))
                    .ok()
                    .map(|r| (role, r))
            })
            .collect()
    }

    /// Stand-ins for the generators' output in a comparison of two renders (Cluster API's
    /// in-place hooks, the webhook's check of an update), which calls no generator: a part
    /// with a generator is seen as changed when the request it would send changes (its
    /// parameters, the values, the context the generator may see), and as unchanged when the
    /// request is the same. The template's revision is left out of the request compared, so an
    /// edit elsewhere in the template does not count as a change of every generated part.
    /// A call whose request cannot be built gets no stand-in: the render reports the cause.
    pub fn comparison_stand_ins(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
    ) -> Generated {
        let mut generated = Generated::new();
        for call in self.generator_calls(config, ctx.machine.role) {
            let secrets = crd_types::GeneratorSecrets::default();
            let Ok(mut request) = self.generator_request(&call, config, ctx, secrets) else {
                continue;
            };
            request.template.revision.clear();
            let stand_in =
                generator::GeneratedPart::stand_in(&call.generator, &request.inputs_digest());
            generated.insert(call.part, std::sync::Arc::new(stand_in));
        }
        generated
    }

    /// The generator calls a render for `role` with `config` needs, in part order: one per part
    /// that applies to the role, is not skipped and names a generator.
    pub fn generator_calls(
        &self,
        config: &BootplateConfigSpec,
        role: crd_types::Role,
    ) -> Vec<Call> {
        match &self.body {
            Body::Parts(parts) => body::generator_calls(parts, config, role),
            Body::Raw(..) => Vec::new(),
        }
    }

    /// The request for `call` (one of [`CompiledTemplate::generator_calls`]) to a generator
    /// granted `secrets`: the machine's context as that generator may see it, with `values`
    /// built from `config` as a render builds them. Err when the variables do not fit.
    pub fn generator_request(
        &self,
        call: &Call,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
        secrets: GeneratorSecrets,
    ) -> Result<Request, RenderError> {
        let values = self.declarations.values(&self.object, &config.variables)?;
        let info = TemplateInfo {
            name: self.object.clone(),
            revision: self.revision.clone(),
            format: self.format,
            part: call.part.clone(),
        };
        Ok(Request::new(
            call,
            info,
            RequestContext::allowed(ctx, values, secrets),
        ))
    }

    /// The config lint's sample renders use: `config`, or sample values for the required
    /// variables (`None` when no value fits a variable's schema).
    pub fn sample_config(
        &self,
        config: Option<&BootplateConfigSpec>,
    ) -> Option<BootplateConfigSpec> {
        lint::sample_config(self, config).ok()
    }

    /// Serves `request` as a generator (`bootplate generator serve`): renders this template's
    /// parts that apply to the request's role with the request's context, and answers with their
    /// files, units and commands. The request's values reach the template's declared variables
    /// (others are left out: they are the calling template's); its parameters must be declared.
    pub fn generate(&self, request: &Request) -> Response {
        let Body::Parts(parts) = &self.body else {
            return Response::failure(format!(
                "{}: a generator serves a template with spec.parts, not spec.template",
                self.object
            ));
        };
        let mut config = BootplateConfigSpec::default();
        for (name, value) in &request.context.values {
            if self.declarations.list.iter().any(|d| &d.decl.name == name) {
                config.variables.insert(name.clone(), value.clone());
            }
        }
        for (name, value) in &request.parameters {
            config.variables.insert(name.clone(), value.clone());
        }
        let generated = (|| {
            let _work = helpers::WorkBudget::start();
            let values = self.declarations.values(&self.object, &config.variables)?;
            let network =
                self.network_context(&config, &request.context.cluster, &request.context.machine)?;
            let context =
                self.context(&config, request.context.as_render_json(), network, values)?;
            let limit = Limit::new(self.max_output_bytes, None);
            let mut budget = Budget::new(limit.bytes);
            let role = request.context.machine.role;
            let empty = Generated::new();
            body::collect(
                parts,
                &config,
                role,
                &self.engine,
                &context,
                &mut budget,
                &empty,
            )
            .map_err(|e| self.field_error(e, &budget, limit, false))
        })();
        match generated {
            Ok(output) => generator::response_of(output.files, output.units, output.commands),
            Err(e) => Response::failure(e.to_string()),
        }
    }

    /// The literal texts (without a mustache) and their sizes, by field.
    pub(crate) fn literal_sizes(&self) -> Vec<(String, u64)> {
        match &self.body {
            Body::Raw(text, parts) => {
                let raw = match text {
                    Text::Literal(s) => Some(("spec.template".to_owned(), s.len() as u64)),
                    Text::Template(_) => None,
                };
                raw.into_iter()
                    .chain(parts.iter().flat_map(|p| p.literal_sizes()))
                    .collect()
            }
            Body::Parts(parts) => parts.iter().flat_map(|p| p.literal_sizes()).collect(),
        }
    }

    /// The bytes each templated text writes for the machine of `ctx`, each rendered alone (for
    /// lint to name what makes an output too large): field and size. Each render is bounded
    /// like a whole render with compression (16 × the limit); a text over it counts as that
    /// much; a text that fails to render is left out. Literal texts are not rendered: their
    /// size is their source's.
    pub(crate) fn text_sizes(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
    ) -> Vec<(String, u64)> {
        let context = self
            .declarations
            .values(&self.object, &config.variables)
            .and_then(|values| self.machine_context(config, ctx, values));
        let Ok(context) = context else {
            return Vec::new();
        };
        let cap = Limit::new(self.max_output_bytes, config.max_output_bytes).bytes * GZIP_EXPANSION;
        self.engine
            .texts()
            .filter_map(|(name, field)| {
                let _work = helpers::WorkBudget::start();
                let mut budget = Budget::new(cap);
                let text = Text::Template(name.to_owned());
                match self.engine.render(&text, &context, &mut budget) {
                    Ok(out) => Some((field.to_owned(), out.len() as u64)),
                    Err(FieldError::TooLarge) => Some((field.to_owned(), budget.used())),
                    Err(FieldError::Failed(_)) => None,
                }
            })
            .collect()
    }

    fn context_json(&self, ctx: &RenderContext) -> Result<Value, RenderError> {
        serde_json::to_value(ctx).map_err(|e| {
            RenderError::failed(
                &self.object,
                Problem::template("spec", format!("render context: {e}"))
                    .with_reason(crd_types::conditions::reason::RENDER_FAILED),
            )
        })
    }

    /// The render context of the machine `ctx` describes.
    fn machine_context(
        &self,
        config: &BootplateConfigSpec,
        ctx: &RenderContext,
        values: Map<String, Value>,
    ) -> Result<Context, RenderError> {
        let network = self.network_context(config, &ctx.cluster, &ctx.machine)?;
        self.context(config, self.context_json(ctx)?, network, values)
    }

    /// The render context as JSON: `base` (the typed context) plus `network`, `values`, `files`,
    /// `preCommands` and `postCommands`. Built once per render and shared by every field.
    fn context(
        &self,
        config: &BootplateConfigSpec,
        base: Value,
        network: Value,
        values: Map<String, Value>,
    ) -> Result<Context, RenderError> {
        let Value::Object(mut map) = base else {
            return Err(RenderError::failed(
                &self.object,
                Problem::template("spec", "the render context is not a map")
                    .with_reason(crd_types::conditions::reason::RENDER_FAILED),
            ));
        };
        let files = body::config_files(config)
            .map_err(|e| self.field_error(e, &Budget::new(0), Limit::new(None, None), false))?;
        let files: Vec<Value> = files
            .into_iter()
            .map(|f| {
                serde_json::json!({
                    "path": f.path,
                    "permissions": f.permissions,
                    "owner": f.owner,
                    "content": f.content,
                    "encoding": match f.encoding {
                        crd_types::FileEncoding::Plain => "plain",
                        crd_types::FileEncoding::Base64 => "base64",
                        crd_types::FileEncoding::GzipBase64 => "gzip+base64",
                    },
                })
            })
            .collect();
        map.insert("values".to_owned(), Value::Object(values));
        map.insert("network".to_owned(), network);
        map.insert("files".to_owned(), Value::Array(files));
        map.insert(
            "preCommands".to_owned(),
            serde_json::json!(config.pre_commands),
        );
        map.insert(
            "postCommands".to_owned(),
            serde_json::json!(config.post_commands),
        );
        Ok(Context::from(Value::Object(map)))
    }

    /// `network`: the template's defaults merged with the config's input, whose Secrets the
    /// caller has read (like `files[].contentFrom`).
    fn network_context(
        &self,
        config: &BootplateConfigSpec,
        cluster: &ClusterInfo,
        machine: &MachineInfo,
    ) -> Result<Value, RenderError> {
        let merged = network::merge(self.network.as_ref(), config.network.as_deref());
        let problems: Vec<Problem> = network::check(&merged, network::Source::Resolved)
            .into_iter()
            .map(|(field, message)| {
                Problem::config(format!("spec.network.{field}"), message)
                    .with_reason(crd_types::conditions::reason::INVALID_NETWORK)
                    .with_code("invalid-network")
            })
            .collect();
        if let Some(first) = problems.into_iter().next() {
            return Err(RenderError::failed(&self.object, first));
        }
        Ok(network::context(&merged, cluster, machine))
    }

    fn field_error(
        &self,
        e: FieldError,
        budget: &Budget,
        limit: Limit,
        compress: bool,
    ) -> RenderError {
        match e {
            FieldError::TooLarge => {
                self.too_large(budget.used(), budget.cap(), limit, compress, true)
            }
            FieldError::Failed(problem) => RenderError::failed(&self.object, problem),
        }
    }

    fn too_large(
        &self,
        size: u64,
        cap: u64,
        limit: Limit,
        uncompressed: bool,
        at_least: bool,
    ) -> RenderError {
        RenderError::OutputTooLarge {
            object: self.object.clone(),
            size,
            limit: cap,
            limit_source: if uncompressed {
                format!(
                    "{GZIP_EXPANSION} times {}, for the uncompressed output",
                    limit.source
                )
            } else {
                limit.source.to_owned()
            },
            at_least,
        }
    }
}

/// Parts beside a raw `spec.template` add to its output on boot and are applied by the agent
/// afterwards: each must be `update: InPlace` (a change to anything else is a change to the raw
/// body) and take no generator, and the format must be one whose output they can be merged
/// into (cloud-config, ignition).
fn check_raw_parts(spec: &TemplateSpec, problems: &mut Vec<Problem>) {
    if spec.parts.is_empty() {
        return;
    }
    if !matches!(
        spec.format,
        OutputFormat::CloudConfig | OutputFormat::Ignition
    ) {
        problems.push(Problem::template(
            "spec.parts",
            format!(
                "parts beside a raw spec.template are added to cloud-config or ignition output, not to {}",
                spec.format
            ),
        ));
    }
    for (i, part) in spec.parts.iter().enumerate() {
        if part.update != UpdateStrategy::InPlace {
            problems.push(Problem::template(
                format!("spec.parts[{i}].update"),
                "a part beside a raw spec.template must be `update: InPlace` (set either spec.template or spec.parts to have parts that roll out)",
            ));
        }
        if part.generator.is_some() {
            problems.push(Problem::template(
                format!("spec.parts[{i}].generator"),
                "a part beside a raw spec.template takes no generator",
            ));
        }
    }
}

/// What a Windows format cannot carry, each refused at its field: systemd units, the boot
/// reporter and the fetch stub (POSIX sh, curl and openssl), `update: InPlace` parts
/// (bootplate-agent runs on Linux).
fn check_windows(spec: &TemplateSpec, problems: &mut Vec<Problem>) {
    if !spec.format.is_windows() {
        return;
    }
    let format = spec.format;
    if spec.boot_reports != Some(crd_types::BootReports::Disabled) {
        problems.push(Problem::template(
            "spec.bootReports",
            format!("format {format} has no boot reporter (it is a POSIX shell library): set `bootReports: Disabled`"),
        ));
    }
    if spec.delivery == Some(Delivery::Fetch) {
        problems.push(Problem::template(
            "spec.delivery",
            format!("format {format} cannot be fetched (the fetch stub is a POSIX shell script): use `delivery: Inline`"),
        ));
    }
    for (i, part) in spec.parts.iter().enumerate() {
        if part.update == UpdateStrategy::InPlace {
            problems.push(Problem::template(
                format!("spec.parts[{i}].update"),
                format!("format {format}: bootplate-agent, which applies `update: InPlace` parts, runs on Linux only"),
            ));
        }
        if !part.units.is_empty() {
            problems.push(Problem::template(
                format!("spec.parts[{i}].units"),
                format!("format {format} is for Windows, which has no systemd: register Windows services in commands (New-Service, sc.exe)"),
            ));
        }
    }
}

fn valid_partial_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn compiled_template_is_shareable() {
        assert_send_sync::<CompiledTemplate>();
    }
}
