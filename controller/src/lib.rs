//! The bootplate controller library: everything `main.rs` wires up.
//!
//! Rendering lives in the `render` crate (no Kubernetes client); this crate talks to the
//! apiserver: it reads Machines, Clusters and templates, and writes data Secrets, bootstrap
//! tokens and status.

pub mod certs;
pub mod config_controller;
pub mod context;
pub mod data_secret;
pub mod deleted_configs;
pub mod error;
pub mod events;
pub mod flags;
pub mod http;
pub mod labels;
pub mod leader;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod pki;
pub mod retry;
pub mod role;
pub mod run;
pub mod status;
pub mod template_controller;
pub mod templates;
pub mod token;
pub mod triggers;
pub mod webhook;
pub mod workload;
