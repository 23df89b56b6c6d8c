//! Cluster API's Runtime SDK, served over TLS by `bootplate run --extension-addr`: discovery and
//! the in-place update hooks `CanUpdateMachineSet`, `CanUpdateMachine` and `UpdateMachine`
//! (feature gate `InPlaceUpdates` in Cluster API). The hooks compare renders
//! ([`compare`]), and `UpdateMachine` reads how far the node got from the config's status,
//! which the controller keeps ([`crate::reconcile`]): this server holds no state, and every
//! replica serves it.

mod compare;
mod hooks;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::routing::post;
use kube::Client;
use tracing::info;

use crate::runtime::metrics::Metrics;

/// The path prefix of every hook (`/<group>/<version>`).
pub const PREFIX: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct Hooks {
    client: Client,
    metrics: Arc<Metrics>,
}

/// Serves the extension on `addr` with the certificate in `cert_dir` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    cert_dir: &Path,
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
    crate::webhook::tls::serve(addr, cert_dir, app, "--extension-addr").await?;
    info!(%addr, "runtime extension listening");
    Ok(())
}
