//! `SecretKeyRef`: how a config or its network input names a key of a Secret. A module of its own
//! because both `config` and `network` name it, and `config` embeds `network`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A key of a Secret in the config's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in the Secret's `data`.
    pub key: String,
    /// Must be empty or the config's own namespace: Secrets of other namespaces are never read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}
