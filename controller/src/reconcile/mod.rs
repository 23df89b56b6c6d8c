//! The reconcilers: each gathers the facts of one object from the caches and adapters, asks
//! the core what to do, and does it.

pub(crate) mod boot;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod deleted;
pub(crate) mod generate;
pub(crate) mod inplace;
pub(crate) mod joined;
pub(crate) mod memory;
pub(crate) mod render;
pub(crate) mod retry;
pub(crate) mod template;
