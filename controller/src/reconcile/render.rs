//! The render path of a config: template, role, the skip decision, certificates and files, a
//! trial render and the token, the data Secret and its Event.

use std::time::Instant;

use crd_types::capi::{Cluster, Machine, MachinePool};
use crd_types::conditions::reason;
use crd_types::payload::BootedManifest;
use crd_types::{BootplateConfig, BootplateConfigStatus, Role};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use render::generator::Generated;
use render::{BootReport, Endpoint, JoinInfo, MachineInfo, RenderContext};
use tracing::{debug, info, warn};

use super::context::{Context, config_key};
use super::generate::{Calls, Phase};
use crate::core::footprint;
use crate::core::gate;
use crate::core::network::{self as network_view, View as NetworkView};
use crate::core::outcome::{self, RenderFacts};
use crate::core::role::{self, RoleDecision, RoleFacts};
use crate::core::skip::{self, Inputs, LastRender, Record};
use crate::core::token::{self, Token, TokenAction};
use crate::core::write::{self, Plan, Written};
use crate::error::{Error, Result};
use crate::k8s::certs::CaCert;
use crate::k8s::data_secret::{self, Provenance};
use crate::k8s::footprint as k8s_footprint;
use crate::k8s::templates::{self, ResolvedTemplate};
use crate::k8s::{boot_report, certs, fetch_payload, files, init_lock, tokens};

/// What a render did.
pub(crate) struct Rendered {
    pub role: Role,
    pub revision: String,
    /// What to remember once the status is written (a full render whose inputs have a
    /// digest); `None` otherwise.
    pub record: Option<Record>,
    /// The config was found unchanged since the last render and nothing was done.
    pub unchanged: bool,
    /// The data Secret's resourceVersion as written or checked.
    pub secret_version: Option<String>,
    /// A MachinePool's replaced token could not be deleted after the write (tried again soon).
    pub cleanup_failed: bool,
    /// When the token in the user-data expires (`None` for `init`): the config is looked at
    /// again when it falls due.
    pub token_expires: Option<Timestamp>,
    /// The machine whose boot report the config shows (a Machine's joining machine, from a
    /// template that reports).
    pub boot: Option<super::boot::Subject>,
    /// What the render makes of the config's network input.
    pub network: NetworkView,
}

/// What a config renders for: the Machine it bootstraps, or the MachinePool whose instances
/// all boot from its data Secret.
#[derive(Clone, Copy)]
pub(crate) enum Subject<'a> {
    /// A Machine.
    Machine(&'a Machine),
    /// A MachinePool.
    Pool(&'a MachinePool),
}

impl Subject<'_> {
    /// What templates see of it, for `role`.
    fn info(self, role: Role) -> MachineInfo {
        match self {
            Subject::Machine(machine) => MachineInfo::from_machine(machine, role),
            Subject::Pool(pool) => MachineInfo::from_pool(pool, role),
        }
    }

    fn is_pool(self) -> bool {
        matches!(self, Subject::Pool(_))
    }
}

/// What a render works from, once gathered.
struct Scene<'a> {
    config: &'a BootplateConfig,
    subject: Subject<'a>,
    cluster: &'a Cluster,
    role: Role,
    template: ResolvedTemplate,
    endpoint: Endpoint,
}

/// Renders `config` for `subject` of `cluster`, unless nothing changed since the last render.
pub(crate) async fn render(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    subject: Subject<'_>,
    cluster: &Cluster,
) -> Result<Rendered> {
    let template = templates::resolve(&ctx.stores, &ctx.compiled, config).inspect_err(|e| {
        if e.reason() == reason::TEMPLATE_INVALID {
            let reference = templates::reference(&config.spec.template_ref);
            ctx.metrics.render_failed(&reference, e.reason());
        }
    })?;
    let role = match subject {
        Subject::Machine(machine) => decide_role(ctx, config, previous, cluster, machine).await?,
        Subject::Pool(pool) => role::decide_pool(
            pool.is_control_plane(),
            cluster.control_plane_initialized(),
            &format!(
                "{}/{}",
                pool.namespace().unwrap_or_default(),
                pool.name_any()
            ),
            &cluster.name_any(),
        )?,
    };
    debug!(%role, template = %template.display, "role decided");
    let endpoint = gate::endpoint(cluster)?;
    let revision = template.compiled.revision().to_owned();
    let inputs = inputs_digest(ctx, config, subject, cluster, role, &template);
    let inputs_ref = inputs.as_deref();
    let scene = Scene {
        config,
        subject,
        cluster,
        role,
        template,
        endpoint,
    };
    let boot = boot_subject(&scene);
    let network = network_of(&scene);
    if let Some(done) = unchanged(ctx, config, previous, inputs_ref, subject, role, &revision) {
        debug!(%role, "unchanged since the last render");
        return Ok(Rendered {
            boot,
            network,
            ..done
        });
    }
    let made = make_user_data(ctx, &scene).await?;
    debug!("rendered");
    let done = write_and_tell(ctx, &scene, made, inputs).await?;
    Ok(Rendered {
        boot,
        network,
        ..done
    })
}

/// Which fields of the config's network input the template writes out and which it ignores.
fn network_of(scene: &Scene<'_>) -> NetworkView {
    let Some(input) = &scene.config.spec.network else {
        return NetworkView::Unset;
    };
    network_view::view(
        &scene.template.display,
        render::network::set_fields(input),
        scene.template.compiled.ignored_network_fields(input),
    )
}

/// The machine whose boot the config shows, when it reports.
fn boot_subject(scene: &Scene<'_>) -> Option<super::boot::Subject> {
    let Subject::Machine(machine) = scene.subject else {
        return None;
    };
    reports_boot(scene).then(|| subject_of(machine, scene.cluster, &scene.template))
}

fn subject_of(
    machine: &Machine,
    cluster: &Cluster,
    template: &templates::ResolvedTemplate,
) -> super::boot::Subject {
    super::boot::Subject {
        machine: machine.name_any(),
        cluster: cluster.name_any(),
        cluster_uid: cluster.uid().unwrap_or_default(),
        provisioned_since: machine.infrastructure_provisioned_since(),
        template: template.reference.clone(),
        parts: (template.compiled.step_part_names().into_iter())
            .map(str::to_owned)
            .collect(),
    }
}

/// The boot a joined Machine's config showed, for the last look at its report: from the
/// template as it is now (its parts name the metric's labels). `None` when the machine did
/// not report (an `init`, a template without reports) or the template is gone.
pub(crate) fn joined_boot_subject(
    ctx: &Context,
    config: &BootplateConfig,
    machine: &Machine,
    cluster: &Cluster,
    role: Role,
) -> Option<super::boot::Subject> {
    let template = templates::resolve(&ctx.stores, &ctx.compiled, config).ok()?;
    machine_reports_boot(role, &template).then(|| subject_of(machine, cluster, &template))
}

/// The role (taking the init lock for `init`), releasing the lock once it has served.
async fn decide_role(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<Role> {
    let initialized = cluster.control_plane_initialized();
    let facts = RoleFacts {
        recorded: gate::recorded_role(previous),
        control_plane: machine.is_control_plane(),
        initialized,
        cluster: &cluster.name_any(),
    };
    let role = match role::decide(facts)? {
        RoleDecision::Decided(role) => role,
        RoleDecision::InitIfLocked => {
            init_lock::acquire(&ctx.client, &ctx.stores, cluster, machine).await?;
            let now = ctx.stores.cluster(
                &cluster.namespace().unwrap_or_default(),
                &cluster.name_any(),
            );
            let role = role::after_lock_taken(now.is_some_and(|c| c.control_plane_initialized()));
            if role != Role::Init {
                init_lock::release(&ctx.client, cluster).await?;
            }
            role
        }
    };
    let uid = config.uid().unwrap_or_default();
    if role::release_init_lock(role, initialized) && !ctx.lock_released(&uid) {
        init_lock::release(&ctx.client, cluster).await?;
        ctx.mark_lock_released(&uid);
    }
    Ok(role)
}

/// The digest of what the render depends on (see [`skip::Inputs`]); `None` when one of the
/// certificate Secrets is not watched (not labelled with its cluster's name) or the config has
/// `contentFrom` files, whose Secrets are not watched either: such configs always render.
fn inputs_digest(
    ctx: &Context,
    config: &BootplateConfig,
    subject: Subject<'_>,
    cluster: &Cluster,
    role: Role,
    template: &ResolvedTemplate,
) -> Option<String> {
    if config.spec.files.iter().any(|f| f.content_from.is_some())
        || config
            .spec
            .network
            .as_ref()
            .is_some_and(|n| n.names_secrets())
    {
        return None;
    }
    let namespace = config.namespace().unwrap_or_default();
    let secret_versions = certs::secret_names(&cluster.name_any(), role)
        .iter()
        .map(|name| ctx.stores.secret_version(&namespace, name))
        .collect::<Option<Vec<String>>>()?;
    let uid = config.uid();
    // A generator's spec (its endpoint, its grant) counts; its answers are not known here.
    let generators = template
        .compiled
        .generator_calls(&config.spec, role)
        .into_iter()
        .map(|call| {
            let generation = ctx.stores.generator(&call.generator);
            (
                call.generator,
                generation.and_then(|g| g.metadata.generation),
            )
        })
        .collect();
    Some(skip::inputs_digest(&Inputs {
        build: &ctx.settings.build,
        config_uid: uid.as_deref(),
        generation: config.metadata.generation,
        revision: template.compiled.revision(),
        role,
        seen: RenderContext::with_machine(cluster, subject.info(role), None, None),
        secret_versions,
        generators,
    }))
}

/// What is known of a config's last render: from memory, or after a restart from the hints on
/// its data Secret.
pub(crate) fn last_render(ctx: &Context, config: &BootplateConfig) -> Option<LastRender> {
    let uid = config.uid()?;
    if let Some(last) = ctx.last_rendered(&uid, |record| record.map(LastRender::remembered)) {
        return Some(last);
    }
    let namespace = config.namespace().unwrap_or_default();
    let secret = ctx.stores.secret(&namespace, &config.name_any())?;
    let status = config.status.clone().unwrap_or_default();
    Some(LastRender::from_hints(&secret, &status))
}

/// The last render's result when nothing it depended on changed (see [`skip::unchanged`]).
fn unchanged(
    ctx: &Context,
    config: &BootplateConfig,
    previous: &BootplateConfigStatus,
    inputs: Option<&str>,
    subject: Subject<'_>,
    role: Role,
    revision: &str,
) -> Option<Rendered> {
    let inputs = inputs?;
    let last = last_render(ctx, config)?;
    let namespace = config.namespace().unwrap_or_default();
    let stored = ctx.stores.secret_version(&namespace, &config.name_any());
    let now = skip::Now {
        time: Timestamp::now(),
        ttl: token::signed_ttl(ctx.settings.bootstrap_token_ttl),
    };
    let vouch = skip::hints_vouch(previous.ready, subject.is_pool());
    skip::unchanged(&last, vouch, inputs, role, stored.as_deref(), now).then(|| Rendered {
        role,
        revision: revision.to_owned(),
        record: None,
        unchanged: true,
        secret_version: stored,
        cleanup_failed: false,
        token_expires: last.token_expires.filter(|_| role != Role::Init),
        boot: None,
        network: NetworkView::Unset,
    })
}

/// The user-data, the expiry of the token in it, the ID of a token created for it, and the
/// tokens it replaces (a MachinePool's, deleted once the data Secret holds the new one).
struct Made {
    user_data: render::Rendered,
    /// The user-data is a fetch stub.
    fetch: bool,
    token_expires: Option<Timestamp>,
    created_token: Option<String>,
    replaced: Vec<String>,
    /// What the user-data writes for the `InPlace` parts.
    booted: Option<BootedManifest>,
}

impl Made {
    /// An `init` render: inline, with no token (the control plane does not exist yet).
    fn init(user_data: render::Rendered, booted: Option<BootedManifest>) -> Made {
        Made {
            user_data,
            booted,
            fetch: false,
            token_expires: None,
            created_token: None,
            replaced: Vec::new(),
        }
    }
}

async fn make_user_data(ctx: &Context, scene: &Scene<'_>) -> Result<Made> {
    let certs = control_plane_certs(ctx, scene.cluster, scene.role).await?;
    let spec = files::resolve(&ctx.client, scene.config).await?;
    let context = |join: Option<JoinInfo>| {
        let machine = scene.subject.info(scene.role);
        RenderContext::with_machine(scene.cluster, machine, join, certs.clone())
    };
    // `trial`: a render whose output is thrown away; its failure counts, its time does not
    // (the duration histogram counts one render per user-data produced).
    let render = |context: &RenderContext, generated: &Generated, trial: bool| {
        let started = Instant::now();
        let template = &scene.template;
        let rendered = template
            .compiled
            .render_generated(&spec, context, generated)
            .map_err(|e| {
                ctx.metrics.render_failed(&template.reference, e.reason());
                Error::failed(e.reason(), e.to_string())
            })?;
        if !trial {
            ctx.metrics.rendered(&template.reference, started.elapsed());
        }
        Ok::<_, Error>(rendered)
    };
    let calls = scene.template.compiled.generator_calls(&spec, scene.role);
    let generators = Calls {
        ctx,
        config: scene.config,
        template: &scene.template,
        spec: &spec,
        calls: &calls,
    };
    if scene.role == Role::Init {
        let context = context(None);
        let generated = generators.run(&context, Phase::All).await?;
        let user_data = render(&context, &generated, false)?;
        let booted = booted_in_place(&scene.template, &spec, &context, &generated);
        return Ok(Made::init(user_data, booted));
    }
    let ca = cluster_ca(ctx, scene.cluster, certs.as_ref()).await?;
    let join = |token: &Token| JoinInfo {
        token: token.expose(),
        api_server_endpoint: scene.endpoint.address(),
        ca_cert_hashes: vec![ca.hash.clone()],
    };
    let reports = reports_boot(scene);
    let fetches = matches!(scene.subject, Subject::Machine(_))
        && (scene.template.compiled).fetches(&spec, scene.role);
    let with_report = |mut context: RenderContext, token: &Token| {
        if reports {
            context.boot_report = Some(report_target(ctx, scene, &spec, &ca.pem, token));
        }
        context.fetch = fetches.then(|| fetch_target(scene, &join(token)));
        context
    };
    // A trial render with a stand-in token of the same length first, with the parts of the
    // generators not granted the token: a config whose template, variables, generators or
    // size fail gets an error, and no token in the workload cluster.
    let placeholder = Token::placeholder();
    let trial = with_report(context(Some(join(&placeholder))), &placeholder);
    let mut generated = generators.run(&trial, Phase::BeforeToken).await?;
    render(&trial, &generators.with_stand_ins(&generated), true)?;
    let pool = scene.subject.is_pool();
    let ((token, action, expires), replaced) =
        bootstrap_token(ctx, scene.config, scene.cluster, pool).await?;
    let created = matches!(action, TokenAction::Created | TokenAction::Rotated);
    let context = with_report(context(Some(join(&token))), &token);
    generated.extend(generators.run(&context, Phase::AfterToken).await?);
    let user_data = render(&context, &generated, false)?;
    let booted = booted_in_place(&scene.template, &spec, &context, &generated);
    set_up_channels(ctx, scene, &token, reports, created, &user_data).await?;
    Ok(Made {
        user_data,
        booted,
        fetch: fetches,
        token_expires: Some(expires),
        created_token: created.then(|| token.id.clone()),
        replaced,
    })
}

/// What the user-data of `context` writes and enables for the template's `InPlace` parts,
/// recorded in the data Secret: the node payload is published only when Cluster API first
/// updates the machine in place, and its agent starts from this (`crd_types::payload`).
/// `None` when the template updates nothing in place. A second render of the parts, for
/// such templates only.
fn booted_in_place(
    template: &templates::ResolvedTemplate,
    spec: &crd_types::BootplateConfigSpec,
    context: &RenderContext,
    generated: &Generated,
) -> Option<BootedManifest> {
    if !template.compiled.updates_in_place() {
        return None;
    }
    match template.compiled.render_parts(spec, context, generated) {
        Ok(parts) => parts.map(|p| p.payload().manifest()),
        // The user-data rendered from the same inputs: not expected. The first update's
        // payload then goes without it, and the agent removes nothing the boot wrote.
        Err(e) => {
            warn!(template = %template.display, reason = e.reason(), "the in-place parts did not render apart");
            None
        }
    }
}

/// Whether the machine reports its boot: a Machine's (a pool's instances share one token and
/// would share one report) joining machine, from a template that reports.
fn reports_boot(scene: &Scene<'_>) -> bool {
    matches!(scene.subject, Subject::Machine(_))
        && machine_reports_boot(scene.role, &scene.template)
}

/// Whether a Machine of `role` reports its boot with `template`: an `init` machine has no
/// apiserver to report to before it starts one.
fn machine_reports_boot(role: Role, template: &templates::ResolvedTemplate) -> bool {
    role != Role::Init && template.compiled.reports_boot()
}

/// Where and how the machine reports its boot, with token `token`.
fn report_target(
    ctx: &Context,
    scene: &Scene<'_>,
    spec: &crd_types::BootplateConfigSpec,
    ca_pem: &str,
    token: &Token,
) -> BootReport {
    // The content of the files that came from Secrets is redacted from the reported output.
    let mut from_secrets: Vec<String> = (scene.config.spec.files.iter().zip(&spec.files))
        .filter(|(original, _)| original.content_from.is_some())
        .filter_map(|(_, resolved)| resolved.content.clone())
        .collect();
    from_secrets.extend(network_secret_values(&scene.config.spec, spec));
    let (uid, cluster_uid) = (scene.config.uid(), scene.cluster.uid());
    let (uid, cluster_uid) = (uid.unwrap_or_default(), cluster_uid.unwrap_or_default());
    BootReport {
        server: format!("https://{}", scene.endpoint.address()),
        ca_pem: ca_pem.to_owned(),
        namespace: token::NAMESPACE.to_owned(),
        name: boot_report::name(&uid),
        metadata: boot_report::machine_metadata(&uid, &cluster_uid, token),
        token: token.expose(),
        secrets: from_secrets,
        min_interval_seconds: ctx.settings.boot_report_interval.as_secs() as u32,
    }
}

/// The PEM texts of `resolved`'s network input that came from Secrets (`original` names them).
fn network_secret_values(
    original: &crd_types::BootplateConfigSpec,
    resolved: &crd_types::BootplateConfigSpec,
) -> Vec<String> {
    let (Some(mut original), Some(mut resolved)) =
        (original.network.clone(), resolved.network.clone())
    else {
        return Vec::new();
    };
    (original.pem_fields_mut().into_iter())
        .zip(resolved.pem_fields_mut())
        .filter(|(before, _)| before.secret.is_some())
        .filter_map(|(_, after)| after.inline.clone())
        .collect()
}

/// Where the machine joining with `join` fetches its render, and fresh keys to seal it with.
fn fetch_target(scene: &Scene<'_>, join: &JoinInfo) -> render::fetch::Fetch {
    let keys = render::fetch::PayloadKeys {
        cipher: rand::random(),
        mac: rand::random(),
        iv: rand::random(),
    };
    join.fetch_target(
        fetch_payload::name(&scene.config.uid().unwrap_or_default()),
        keys,
    )
}

/// Before the data Secret holds `user_data`: converges the workload cluster to what the
/// config's footprint needs for it (`core::footprint`): the shared report grant and policy or
/// the per-machine report objects for a new token, the sealed render a fetch stub reads (every
/// render: its keys are new each time).
async fn set_up_channels(
    ctx: &Context,
    scene: &Scene<'_>,
    token: &Token,
    reports: bool,
    token_new: bool,
    user_data: &render::Rendered,
) -> Result<()> {
    let facts = footprint::Facts {
        role: scene.role,
        pool: scene.subject.is_pool(),
        reports,
        fetch: user_data.payload.is_some(),
        stage: footprint::Stage::Rendered,
        admission: footprint::Admission::Missing,
        token_scoped: token.scoped,
        token_new,
        token_exists: true,
    };
    let best = footprint::plan(&footprint::Facts {
        admission: footprint::Admission::Enforced,
        ..facts
    });
    if best.report == footprint::Report::None && !best.payload {
        return Ok(());
    }
    let namespace = scene.config.namespace().unwrap_or_default();
    let cluster = scene.cluster.name_any();
    let workload = ctx.workload_client(&namespace, &cluster).await?;
    let render = k8s_footprint::Render {
        config_uid: &scene.config.uid().unwrap_or_default(),
        cluster_uid: &scene.cluster.uid().unwrap_or_default(),
        token,
        sealed: user_data.payload.as_ref(),
    };
    let in_cluster = k8s_footprint::Workload {
        client: &workload,
        cluster: &(namespace.clone(), cluster.clone()),
        recheck: shared_recheck(ctx),
    };
    k8s_footprint::set_up(&in_cluster, &ctx.footprint, facts, &render)
        .await
        .map_err(|e| naming_workload(e, &namespace, &cluster))?;
    Ok(())
}

/// How long a workload cluster's shared report objects are trusted as they were made before
/// they are made current again: ten report intervals (100 s by default), so one deleted or
/// edited is put back within that of the next render that needs it.
fn shared_recheck(ctx: &Context) -> std::time::Duration {
    ctx.settings.boot_report_interval * 10
}

/// Writes the data Secret as needed and publishes the render's Event.
async fn write_and_tell(
    ctx: &Context,
    scene: &Scene<'_>,
    made: Made,
    inputs: Option<String>,
) -> Result<Rendered> {
    let (config, template) = (scene.config, &scene.template);
    let revision = template.compiled.revision();
    let provenance = Provenance {
        cluster: &scene.cluster.name_any(),
        template: &template.reference,
        revision,
        role: scene.role,
        inputs: inputs.as_deref(),
        token_expires: made.token_expires,
        fetch: made.fetch,
    };
    let desired = data_secret::build(config, &made.user_data, made.booted.as_ref(), &provenance);
    let digest = data_secret::digest(&desired);
    record_init_handed_out(ctx, scene).await?;
    let (written, secret_version) = write_data_secret(ctx, config, &desired, &digest).await?;
    if written {
        ctx.metrics.secret_written();
        info!(role = %scene.role, template = %template.display, revision, "data secret written");
    }
    let cleanup_failed = delete_replaced(ctx, scene, &made.replaced).await;
    let facts = RenderFacts {
        written,
        template: &template.display,
        revision,
        role: scene.role,
        secret: &config.name_any(),
        created_token: made.created_token.as_deref(),
        deleted_tokens: if cleanup_failed { &[] } else { &made.replaced },
    };
    if let Some(note) = outcome::render_note(&facts) {
        ctx.publish(config, note);
    }
    // A render whose replaced tokens are still there is not remembered: the next reconcile
    // takes the full path and deletes them.
    let record = inputs.filter(|_| !cleanup_failed).map(|inputs| Record {
        inputs,
        token_expires: made.token_expires,
        secret_digest: digest,
        secret_version: secret_version.clone(),
    });
    Ok(Rendered {
        role: scene.role,
        revision: revision.to_owned(),
        record,
        unchanged: false,
        secret_version,
        cleanup_failed,
        token_expires: made.token_expires,
        boot: None,
        network: NetworkView::Unset,
    })
}

/// Before an `init` Machine's data is written, has its init lock say so (once per config):
/// the lock of a holder that got its data is never taken over by itself (`core::role`).
async fn record_init_handed_out(ctx: &Context, scene: &Scene<'_>) -> Result<()> {
    let (Role::Init, Subject::Machine(machine)) = (scene.role, scene.subject) else {
        return Ok(());
    };
    let uid = scene.config.uid().unwrap_or_default();
    if ctx.init_handed_out(&uid) {
        return Ok(());
    }
    init_lock::record_handed_out(&ctx.client, scene.cluster, machine).await?;
    ctx.mark_init_handed_out(&uid);
    Ok(())
}

/// Deletes the tokens a MachinePool's render replaced, now that its data Secret holds the new
/// one ([`token::stale`]); returns whether that failed (counted and logged here).
async fn delete_replaced(ctx: &Context, scene: &Scene<'_>, replaced: &[String]) -> bool {
    if replaced.is_empty() {
        return false;
    }
    let namespace = scene.config.namespace().unwrap_or_default();
    let cluster = scene.cluster.name_any();
    let deleted = match ctx.workload_client(&namespace, &cluster).await {
        Ok(workload) => tokens::delete_ids(&workload, replaced).await,
        Err(e) => Err(e),
    };
    match deleted {
        Ok(count) => {
            for _ in 0..count {
                ctx.metrics.token("deleted");
            }
            info!(token_ids = ?replaced, "replaced bootstrap tokens deleted: the data Secret holds the new one");
            false
        }
        Err(e) => {
            ctx.metrics.token("error");
            let e = naming_workload(e, &namespace, &cluster);
            warn!(error = %e, token_ids = ?replaced, "cannot delete replaced bootstrap tokens; trying again soon");
            true
        }
    }
}

/// Writes the data Secret as [`write::plan`] says; returns whether it wrote, and the Secret's
/// resourceVersion now.
async fn write_data_secret(
    ctx: &Context,
    config: &BootplateConfig,
    desired: &Secret,
    digest: &str,
) -> Result<(bool, Option<String>)> {
    let namespace = config.namespace().unwrap_or_default();
    let stored = ctx.stores.secret_version(&namespace, &config.name_any());
    let plan = config.uid().map_or(Plan::Write, |uid| {
        ctx.last_rendered(&uid, |record| {
            let last = record.map(|r| Written {
                digest: &r.secret_digest,
                version: r.secret_version.as_deref(),
            });
            write::plan(digest, stored.as_deref(), last)
        })
    });
    match plan {
        Plan::Keep(version) => return Ok((false, version)),
        Plan::Compare => {
            let current = data_secret::get(&ctx.client, config).await?;
            if let Some(current) = current.filter(|c| data_secret::is_current(c, desired)) {
                return Ok((false, current.resource_version()));
            }
        }
        Plan::Write => {}
    }
    Ok((true, data_secret::write(&ctx.client, desired).await?))
}

/// The cluster's certificates for the control-plane roles; `None` for workers.
async fn control_plane_certs(
    ctx: &Context,
    cluster: &Cluster,
    role: Role,
) -> Result<Option<render::Certificates>> {
    // The init machine of a Cluster without a control-plane provider generates missing ones.
    let generate = role == Role::Init && cluster.spec.control_plane_ref.is_none();
    if !role.is_control_plane() {
        return Ok(None);
    }
    Ok(Some(
        certs::control_plane(&ctx.client, cluster, generate).await?,
    ))
}

/// The cluster CA: the `sha256:` hash a joining machine pins, and the certificate its boot
/// reporter trusts.
async fn cluster_ca(
    ctx: &Context,
    cluster: &Cluster,
    certs: Option<&render::Certificates>,
) -> Result<CaCert> {
    match certs {
        Some(certs) => {
            let hash = crate::pki::ca_cert_hash(&certs.ca.cert).map_err(|e| {
                Error::failed(
                    reason::CERTIFICATES_ERROR,
                    format!("the cluster CA is not a certificate: {e}"),
                )
            })?;
            let pem = certs.ca.cert.clone();
            Ok(CaCert { hash, pem })
        }
        None => certs::ca_cert(&ctx.client, &ctx.stores, &ctx.ca_hashes, cluster).await,
    }
}

/// The config's bootstrap token in the workload cluster (see [`tokens::ensure`], and
/// [`tokens::ensure_pool`] for a MachinePool's), with the tokens it replaces; counted and logged
/// here, the Event follows the render.
async fn bootstrap_token(
    ctx: &Context,
    config: &BootplateConfig,
    cluster: &Cluster,
    pool: bool,
) -> Result<(tokens::Ensured, Vec<String>)> {
    let namespace = config.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let workload = ctx.workload_client(&namespace, &cluster_name).await?;
    let uid = config.uid().unwrap_or_default();
    let previous_ready = config.status.as_ref().is_some_and(|s| s.ready);
    let stored = ctx.stores.secret_version(&namespace, &config.name_any());
    let first = skip::first_render(previous_ready, stored.as_deref());
    let ttl = token::signed_ttl(ctx.settings.bootstrap_token_ttl);
    let key = config_key(config);
    let ensured = if pool {
        tokens::ensure_pool(&workload, &uid, &key, ttl, first)
            .await
            .map(|p| (p.ensured, p.replaced))
    } else {
        tokens::ensure(&workload, &uid, &key, ttl, first)
            .await
            .map(|e| (e, Vec::new()))
    }
    .map_err(|e| naming_workload(e, &namespace, &cluster_name))?;
    let ((token, action, _), _) = &ensured;
    match action {
        TokenAction::Created => {
            ctx.metrics.token("created");
            info!(token_id = %token.id, "bootstrap token created");
        }
        TokenAction::Refreshed => {
            ctx.metrics.token("refreshed");
            info!(token_id = %token.id, "bootstrap token refreshed");
        }
        TokenAction::Rotated => {
            ctx.metrics.token("rotated");
            info!(token_id = %token.id, "bootstrap token rotated: the pool's Secret is rendered with the new one");
        }
        TokenAction::Reused => {}
    }
    Ok(ensured)
}

/// A token error names the workload cluster and the Secret its kubeconfig came from: the API
/// error alone ("client error (Connect)", "Unauthorized") does not say which cluster it was.
pub(crate) fn naming_workload(error: Error, namespace: &str, cluster: &str) -> Error {
    match error {
        Error::Blocked(mut blocked) => {
            blocked.message = format!(
                "Cluster {namespace}/{cluster} (kubeconfig from Secret {namespace}/{cluster}-kubeconfig): {}",
                blocked.message
            );
            Error::Blocked(blocked)
        }
        other => other,
    }
}
