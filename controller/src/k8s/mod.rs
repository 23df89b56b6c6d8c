//! Thin adapters over the Kubernetes client: each reads or writes one kind of object and
//! decides nothing the core could decide.

pub mod boot_report;
pub(crate) mod certs;
pub(crate) mod compare;
pub(crate) mod data_secret;
pub mod events;
pub(crate) mod fetch_payload;
pub(crate) mod files;
pub(crate) mod footprint;
pub(crate) mod init_lock;
pub mod node_payload;
pub(crate) mod status;
pub(crate) mod stores;
pub(crate) mod templates;
pub(crate) mod tokens;
pub(crate) mod workload;
pub mod workload_kubeconfig;
