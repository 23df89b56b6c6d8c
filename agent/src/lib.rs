//! bootplate-agent: applies a machine's `InPlace` parts on the running node and keeps them
//! applied.
//!
//! ```text
//! let node = Node::at("/");                 // systemctl, sh, a 10m timeout per command
//! let applied = node.apply(&payload)?;   // files, units, restarts, commands once per revision
//! report::applied(&nodes, name, &applied.revision).await?;
//! ```
//!
//! `apply` is free of the Kubernetes client; `watch` reads the node's payload Secret and
//! reports on its Node. docs/in-place.md describes what the agent touches.

pub mod apply;
pub mod binding;
pub mod identity;
pub mod owner;
pub mod program;
pub mod progress;
pub mod redact;
pub mod safe_fs;
pub mod watch;

pub use apply::{Applied, ApplyError, Node};
