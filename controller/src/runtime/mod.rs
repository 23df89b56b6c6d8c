//! The process around the reconcilers: flags, watches and triggers, leader election, the
//! operations endpoints and logging (the series are `crate::metrics`).

pub mod flags;
pub(crate) mod http;
pub(crate) mod leader;
pub(crate) mod logging;
pub mod run;
pub(crate) mod triggers;
pub(crate) mod trim;
