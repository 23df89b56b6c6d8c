//! Calling `BootstrapGenerator`s: one HTTPS client per generator (`client`), its concurrency
//! limit, and what each config's last calls answered, by idempotency key, so a resync or a
//! re-render with unchanged inputs does not call again (`answers`, bounded).

pub mod answers;
pub mod client;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crd_types::BootstrapGenerator;
use kube::ResourceExt;
use render::generator::GeneratedPart;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use answers::Answers;
use client::GeneratorClient;

/// One generator as this process calls it: built from one generation of its spec.
pub struct Generator {
    /// The client (endpoint, TLS roots, timeout, size limit).
    pub client: GeneratorClient,
    /// The spec's generation this was built from.
    generation: Option<i64>,
    /// `spec.maxConcurrency` permits: requests in flight.
    calls: Arc<Semaphore>,
    /// Twice as many: reconciles calling or waiting to call. The rest do not wait, so a slow
    /// generator holds at most this many of the controller's reconcile slots.
    admitted: Arc<Semaphore>,
    /// How long a reconcile waits for a call permit.
    wait: Duration,
}

/// Leave to call a generator, held for the duration of the call.
pub struct Permit {
    _call: OwnedSemaphorePermit,
    _admitted: OwnedSemaphorePermit,
}

impl Generator {
    /// Leave to call now or within the generator's timeout; `None` when it is busy with
    /// `spec.maxConcurrency` calls and as many waiting.
    pub async fn permit(&self) -> Option<Permit> {
        let admitted = self.admitted.clone().try_acquire_owned().ok()?;
        let call = tokio::time::timeout(self.wait, self.calls.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(Permit {
            _call: call,
            _admitted: admitted,
        })
    }
}

/// The generators' clients and the answers remembered per config.
#[derive(Default)]
pub struct Generators {
    /// The certificate every generator call presents, if any.
    client_cert: Option<client::ClientCert>,
    clients: Mutex<HashMap<String, Arc<Generator>>>,
    /// Per config UID: the answers of its latest calls, one per part.
    answers: Mutex<Answers>,
}

impl Generators {
    /// Generators whose calls present `client_cert` (`--generator-client-cert-dir`).
    pub fn with_client_cert(client_cert: Option<client::ClientCert>) -> Generators {
        Generators {
            client_cert,
            ..Generators::default()
        }
    }

    /// The client of `generator`, built again when its spec changed; Err says what in the
    /// spec is wrong.
    pub fn get(&self, generator: &BootstrapGenerator) -> Result<Arc<Generator>, String> {
        let name = generator.name_any();
        let generation = generator.metadata.generation;
        if let Some(existing) = self.clients.lock().expect("lock").get(&name)
            && existing.generation == generation
        {
            return Ok(existing.clone());
        }
        let spec = &generator.spec;
        let built = Arc::new(Generator {
            client: GeneratorClient::with_client_cert(spec, self.client_cert.clone())?,
            generation,
            calls: Arc::new(Semaphore::new(spec.max_concurrency())),
            admitted: Arc::new(Semaphore::new(2 * spec.max_concurrency())),
            wait: spec.timeout(),
        });
        self.clients
            .lock()
            .expect("lock")
            .insert(name, built.clone());
        Ok(built)
    }

    /// Forgets a deleted generator's client.
    pub fn forget(&self, name: &str) {
        self.clients.lock().expect("lock").remove(name);
    }

    /// What config `uid`'s part `part` was answered for idempotency key `key`, if remembered.
    pub fn answer(&self, uid: &str, part: &str, key: &str) -> Option<Arc<GeneratedPart>> {
        self.answers.lock().expect("lock").get(uid, part, key)
    }

    /// Remembers the answer for config `uid`'s part `part` (replacing the part's older one);
    /// the oldest answers of all go when the bound is reached (see [`answers`]).
    pub fn remember(&self, uid: &str, part: &str, key: &str, answer: Arc<GeneratedPart>) {
        self.answers
            .lock()
            .expect("lock")
            .insert(uid, part, key, answer);
    }

    /// Forgets the answers of a deleted config.
    pub fn forget_config(&self, uid: &str) {
        self.answers.lock().expect("lock").forget_config(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crd_types::{ClientConfig, GeneratorSpec};

    fn generator(generation: i64, max_concurrency: u32) -> BootstrapGenerator {
        let mut g = BootstrapGenerator::new(
            "cmdb",
            GeneratorSpec {
                client_config: ClientConfig {
                    url: Some("https://127.0.0.1:1/".into()),
                    ..Default::default()
                },
                timeout_seconds: Some(1),
                max_concurrency: Some(max_concurrency),
                ..Default::default()
            },
        );
        g.metadata.generation = Some(generation);
        g
    }

    #[tokio::test]
    async fn a_busy_generator_admits_its_limit_calling_and_as_many_waiting() {
        let generators = Generators::default();
        let g = generators.get(&generator(1, 1)).unwrap();
        let first = g.permit().await.expect("a free generator admits");
        // One waits (and gives up after the timeout); none beyond.
        let waiting = tokio::spawn({
            let g = g.clone();
            async move { g.permit().await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(g.permit().await.is_none(), "a third is not admitted");
        drop(first);
        assert!(waiting.await.unwrap(), "the waiter gets the freed permit");
    }

    #[test]
    fn clients_are_rebuilt_per_generation_and_answers_kept_per_part() {
        let generators = Generators::default();
        let a = generators.get(&generator(1, 4)).unwrap();
        assert!(Arc::ptr_eq(&a, &generators.get(&generator(1, 4)).unwrap()));
        assert!(!Arc::ptr_eq(&a, &generators.get(&generator(2, 4)).unwrap()));
        let answer = Arc::new(GeneratedPart::default());
        generators.remember("u1", "net", "k1", answer.clone());
        assert!(generators.answer("u1", "net", "k1").is_some());
        assert!(
            generators.answer("u1", "net", "k2").is_none(),
            "other inputs"
        );
        generators.remember("u1", "net", "k2", answer);
        assert!(generators.answer("u1", "net", "k1").is_none(), "replaced");
        generators.forget_config("u1");
        assert!(generators.answer("u1", "net", "k2").is_none());
    }
}
