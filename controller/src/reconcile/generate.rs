//! A render's generator calls: for each part that takes content from a `BootstrapGenerator`,
//! the request its grant allows, answered from memory when this config's part was answered for
//! the same idempotency key, else by the generator within its limits. Generators that may not
//! see the token are called before any token exists (the trial render needs their parts); a
//! generator granted the token is called once the token exists.

use std::sync::Arc;
use std::time::Instant;

use crd_types::conditions::reason;
use crd_types::{BootplateConfig, BootplateConfigSpec, BootstrapGenerator};
use kube::ResourceExt;
use render::RenderContext;
use render::generator::{Call, Generated, GeneratedPart, redact};
use tracing::{debug, info, warn};

use super::context::Context;
use crate::error::{Error, Result};
use crate::k8s::templates::ResolvedTemplate;

/// Which calls a step of the render makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Every call (`init`: there is no token).
    All,
    /// Calls to generators not granted the token, before the token is created.
    BeforeToken,
    /// Calls to generators granted the token, once it exists.
    AfterToken,
}

impl Phase {
    fn includes(self, generator: &BootstrapGenerator) -> bool {
        match self {
            Phase::All => true,
            Phase::BeforeToken => !generator.spec.secrets.join_token,
            Phase::AfterToken => generator.spec.secrets.join_token,
        }
    }
}

/// The generator calls of one render.
pub(crate) struct Calls<'a> {
    pub ctx: &'a Context,
    pub config: &'a BootplateConfig,
    pub template: &'a ResolvedTemplate,
    /// The config spec, `contentFrom` resolved.
    pub spec: &'a BootplateConfigSpec,
    /// What the render needs (`CompiledTemplate::generator_calls`).
    pub calls: &'a [Call],
}

impl Calls<'_> {
    /// The answers of the calls of `phase` for the machine `context` describes.
    pub(crate) async fn run(&self, context: &RenderContext, phase: Phase) -> Result<Generated> {
        let mut generated = Generated::new();
        for call in self.calls {
            let generator = self.generator(call)?;
            // Every call is checked at every step, so the first step (before any token exists)
            // refuses a generator the namespace may not use, whichever step would call it.
            self.allowed(call, &generator)?;
            if phase.includes(&generator) {
                let answer = self.answer(call, &generator, context).await?;
                generated.insert(call.part.clone(), answer);
            }
        }
        Ok(generated)
    }

    /// `generated` with an empty stand-in for every call it lacks (the token-granted ones,
    /// in the trial render before the token exists).
    pub(crate) fn with_stand_ins(&self, generated: &Generated) -> Generated {
        let mut all = generated.clone();
        for call in self.calls {
            all.entry(call.part.clone())
                .or_insert_with(|| Arc::new(GeneratedPart::default()));
        }
        all
    }

    fn generator(&self, call: &Call) -> Result<Arc<BootstrapGenerator>> {
        self.ctx.stores.generator(&call.generator).ok_or_else(|| {
            Error::waiting(
                reason::GENERATOR_NOT_FOUND,
                format!(
                    "{} {}: BootstrapGenerator {} not found",
                    self.template.display, call.field, call.generator
                ),
            )
        })
    }

    /// Whether the config's namespace may use `generator` (`spec.allowedNamespaces`); counted
    /// as result `not_allowed` when not.
    fn allowed(&self, call: &Call, generator: &BootstrapGenerator) -> Result<()> {
        let namespace = self.config.namespace().unwrap_or_default();
        if generator.spec.allows(&namespace) {
            return Ok(());
        }
        self.ctx.metrics.generator_refused(&call.generator);
        Err(Error::failed(
            reason::GENERATOR_NOT_ALLOWED,
            format!(
                "{} {}: BootstrapGenerator {} does not allow namespace {namespace} (its spec.allowedNamespaces); it was not called",
                self.template.display, call.field, call.generator
            ),
        ))
    }

    /// The answer to `call`: remembered, or asked.
    async fn answer(
        &self,
        call: &Call,
        generator: &BootstrapGenerator,
        context: &RenderContext,
    ) -> Result<Arc<GeneratedPart>> {
        let ctx = self.ctx;
        let template = &self.template.compiled;
        let mut request = template
            .generator_request(call, self.spec, context, generator.spec.secrets)
            .map_err(|e| Error::failed(e.reason(), e.to_string()))?;
        let uid = self.config.uid().unwrap_or_default();
        let key = request.idempotency_key.clone();
        if let Some(answer) = ctx.generators.answer(&uid, &call.part, &key) {
            debug!(generator = %call.generator, part = %call.part, "generator answer remembered");
            return Ok(answer);
        }
        let named = |cause: &str| {
            format!(
                "{} {}: BootstrapGenerator {} {cause}",
                self.template.display, call.field, call.generator
            )
        };
        let client = ctx.generators.get(generator).map_err(|message| {
            Error::failed(
                reason::GENERATOR_FAILED,
                named(&format!("cannot be called: {message}")),
            )
        })?;
        let Some(_permit) = client.permit().await else {
            return Err(Error::waiting(
                reason::WAITING_FOR_GENERATOR,
                named("is busy with spec.maxConcurrency requests; trying again shortly"),
            ));
        };
        request.request_id = format!("{:032x}", rand::random::<u128>());
        let started = Instant::now();
        let answered = client.client.call(&request).await;
        let result = answered.as_ref().map_or_else(|e| e.result(), |_| "success");
        ctx.metrics
            .generator_request(&call.generator, result, started.elapsed());
        let endpoint = client.client.endpoint();
        match answered {
            Ok(part) => {
                let part = Arc::new(part);
                ctx.generators
                    .remember(&uid, &call.part, &key, part.clone());
                info!(generator = %call.generator, part = %call.part, request_id = %request.request_id, "generator answered");
                Ok(part)
            }
            Err(e) => {
                // A generator's own words may echo what it was sent: keep secrets out.
                let cause = redact(&e.to_string(), &request.secrets());
                warn!(generator = %call.generator, part = %call.part, %endpoint, result, request_id = %request.request_id, "generator failed: {cause}");
                Err(Error::failed(
                    reason::GENERATOR_FAILED,
                    named(&format!("({endpoint}) failed: {cause}")),
                ))
            }
        }
    }
}
