//! The operations endpoints: `/metrics` (Prometheus text), `/healthz` (the process is alive)
//! and `/readyz` (the caches are synced, or this instance is a ready standby).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// Readiness, set by the controller: a leader is ready once its caches are synced; a standby
/// is ready as soon as it is waiting for the lease.
#[derive(Default)]
pub struct Readiness {
    ready: AtomicBool,
}

impl Readiness {
    /// Marks the instance ready or not.
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether the instance is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

/// The router serving every endpoint; `serve` binds it to one or two addresses.
fn router(metrics: Arc<Metrics>, readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Shared { metrics, readiness })
}

async fn metrics_handler(State(shared): State<Shared>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
}

async fn readyz(State(shared): State<Shared>) -> impl IntoResponse {
    if shared.readiness.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

/// Binds the metrics and health addresses (the same address serves both when they are equal)
/// and serves until the process ends, each connection bounded as every other port's
/// ([`crate::server`]).
pub async fn serve(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
) -> anyhow::Result<()> {
    let app = router(metrics, readiness);
    let plain = crate::server::Transport::Plain;
    let limits = crate::server::Limits::default();
    crate::server::serve(
        metrics_addr,
        "--metrics-addr",
        plain.clone(),
        app.clone(),
        limits,
    )
    .await?;
    if health_addr != metrics_addr {
        crate::server::serve(health_addr, "--health-addr", plain, app, limits).await?;
    }
    Ok(())
}
