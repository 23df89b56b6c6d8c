//! What a reconcile decides, free of the Kubernetes client: the facts it gathered go in as
//! plain values, the decision comes out. Every rule here is unit-tested without an apiserver.

pub(crate) mod blocked;
pub(crate) mod boot;
pub mod cached_secret;
pub(crate) mod footprint;
pub(crate) mod gate;
pub mod import;
pub(crate) mod inplace;
pub mod network;
pub(crate) mod outcome;
pub mod pace;
pub(crate) mod preview;
pub(crate) mod role;
pub(crate) mod shard;
pub(crate) mod skip;
pub(crate) mod status;
pub mod token;
pub(crate) mod write;

/// The offline diff masks tokens as the boot failure events do.
pub use boot::redact_tokens;
