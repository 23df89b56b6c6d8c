//! bootplate-agent: applies a machine's `InPlace` parts on the running node and keeps them
//! applied.
//!
//! ```text
//! let node = Node { root: "/".into(), systemctl: "systemctl".into(), shell: "sh".into() };
//! let applied = node.apply(&payload)?;   // files, units, restarts, commands once per revision
//! report::applied(&nodes, name, &applied.revision).await?;
//! ```
//!
//! `apply` is free of the Kubernetes client; `watch` reads the node's payload Secret and
//! reports on its Node. docs/in-place.md describes what the agent touches.

pub mod apply;
pub mod binding;
pub mod owner;
pub mod watch;

pub use apply::{Applied, ApplyError, Node};
