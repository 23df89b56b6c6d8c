//! The process around the reconcilers: flags, watches and triggers, leader election, the
//! operations endpoints, metrics and logging.

pub mod flags;
pub(crate) mod http;
pub(crate) mod leader;
pub(crate) mod logging;
pub mod metrics;
pub mod run;
pub(crate) mod triggers;
pub(crate) mod trim;
