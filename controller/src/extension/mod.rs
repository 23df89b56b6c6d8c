//! Cluster API's Runtime SDK, served over TLS by `bootplate run --extension-addr`: discovery and
//! the in-place update hooks `CanUpdateMachineSet`, `CanUpdateMachine` and `UpdateMachine`
//! (feature gate `InPlaceUpdates` in Cluster API). The hooks compare renders
//! ([`crate::k8s::compare`]), and `UpdateMachine` reads how far the node got from the config's status,
//! which the controller keeps ([`crate::reconcile`]): this server holds no state, and every
//! replica serves it.
//!
//! Only Cluster API is answered: the hooks read Clusters, templates and `contentFrom` Secrets
//! of the namespace a request names, with the controller's rights, and their answers
//! (Unchanged or Rollout) say whether two renders differ. So the server asks every caller for a
//! client certificate from `--extension-client-ca` (Cluster API presents one with its manager's
//! `--runtime-extension-client-cert-file`) and a caller without one fails the TLS handshake:
//! no request of its reaches a handler.

mod hooks;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::routing::post;
use kube::Client;
use tracing::info;

use crate::metrics::Metrics;
use crate::webhook::tls::ClientAuth;

/// The path prefix of every hook (`/<group>/<version>`).
pub const PREFIX: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct Hooks {
    client: Client,
    metrics: Arc<Metrics>,
}

/// Serves the extension on `addr` with the certificate in `cert_dir`, to the `callers` only,
/// until the process ends.
pub async fn serve(
    addr: SocketAddr,
    cert_dir: &Path,
    callers: ClientAuth,
    client: Client,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route(&format!("{PREFIX}/discovery"), post(hooks::discovery))
        .route(
            &format!("{PREFIX}/{{hook}}/{{name}}"),
            post(hooks::dispatch),
        )
        .with_state(Hooks { client, metrics });
    let limits = crate::server::Limits::default();
    crate::webhook::tls::serve_with(addr, cert_dir, callers, app, "--extension-addr", limits)
        .await?;
    info!(%addr, "runtime extension listening");
    Ok(())
}
