//! The bootplate controller library: everything `main.rs` wires up.
//!
//! Rendering lives in the `render` crate (no Kubernetes client). Here, in layers (see
//! docs/architecture.md): `core` decides what a reconcile does from plain facts, without a
//! client; `k8s` holds the thin adapters that read and write objects; `reconcile` gathers the
//! facts, asks the core and acts; `runtime` wires watches, leader election, HTTP endpoints
//! and logging; `metrics` holds the Prometheus series every layer counts in; `webhook` serves admission; `extension` serves Cluster API's in-place
//! update hooks; `server` is the bounded accept loop behind every port.

pub mod core;
pub(crate) mod error;
pub mod extension;
pub mod generator;
pub mod k8s;
pub mod labels;
pub mod metrics;
pub mod pki;
pub(crate) mod reconcile;
pub mod runtime;
pub mod server;
pub mod webhook;
