//! The node payload: the rendered `InPlace` parts of one machine, which bootplate publishes in
//! a per-node Secret of the workload cluster and bootplate-agent applies on the running node.
//!
//! The controller writes it (key [`SECRET_KEY`], JSON) and the agent reads it; both sides use
//! these types, so the wire format has one definition.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The key of the payload in the per-node Secret.
pub const SECRET_KEY: &str = "payload.json";
/// The namespace of the per-node Secrets in the workload cluster.
pub const NAMESPACE: &str = "kube-system";
/// The Node annotation where the agent reports the revision it applied.
pub const APPLIED_ANNOTATION: &str = "bootstrap.bootplate.dev/applied-revision";
/// The Node condition type the agent reports on.
pub const CONDITION_TYPE: &str = "BootplateApplied";

/// The name of the payload Secret of node `node`.
pub fn secret_name(node: &str) -> String {
    format!("bootplate-node-{node}")
}

/// What the agent applies on one node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePayload {
    /// The parts, in template order.
    pub parts: Vec<PayloadPart>,
}

impl NodePayload {
    /// The revision of this payload: the first 16 hex digits of the SHA-256 of its JSON. The
    /// agent reports it once applied; in-place commands run once per revision.
    pub fn revision(&self) -> String {
        let json = serde_json::to_vec(self).expect("a payload always serializes");
        hex::encode(&Sha256::digest(&json)[..8])
    }
}

/// The rendered content of one part.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PayloadPart {
    /// The part's name in its template.
    pub name: String,
    /// Files, each written atomically.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<PayloadFile>,
    /// systemd units and drop-ins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<PayloadUnit>,
    /// Shell commands, run after the files and units, once per payload revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
}

/// A file, its content decoded (no `encoding`: the bytes as they land on disk).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PayloadFile {
    /// Absolute, normalised path.
    pub path: String,
    /// Four octal digits, for example `0644`.
    pub permissions: String,
    /// `user` or `user:group`.
    pub owner: String,
    /// The bytes, base64 in JSON.
    #[serde(with = "base64_bytes")]
    pub content: Vec<u8>,
}

/// A systemd unit: its unit file (absent when only drop-ins are added) and drop-ins.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PayloadUnit {
    /// Unit name, for example `containerd.service`.
    pub name: String,
    /// Enable the unit.
    pub enable: bool,
    /// The unit file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Drop-ins under `/etc/systemd/system/<name>.d/`: (file name, content).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_ins: Vec<PayloadDropIn>,
}

/// A systemd drop-in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PayloadDropIn {
    /// File name, for example `10-mirror.conf`.
    pub name: String,
    /// Content.
    pub content: String,
}

mod base64_bytes {
    //! Standard base64, the encoding of Secret data, for `Vec<u8>` fields: k8s-openapi's
    //! `ByteString` already (de)serializes that way.
    use k8s_openapi::ByteString;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        ByteString(bytes.to_vec()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        ByteString::deserialize(d).map(|b| b.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_with_base64_content() {
        let payload = NodePayload {
            parts: vec![PayloadPart {
                name: "configure".into(),
                files: vec![PayloadFile {
                    path: "/etc/a".into(),
                    permissions: "0600".into(),
                    owner: "root:root".into(),
                    content: b"hi\n".to_vec(),
                }],
                ..Default::default()
            }],
        };
        let json = serde_json::to_string(&payload).unwrap();
        assert!(json.contains(r#""content":"aGkK""#), "{json}");
        assert_eq!(serde_json::from_str::<NodePayload>(&json).unwrap(), payload);
        let mut changed = payload.clone();
        changed.parts[0].files[0].content = b"ho\n".to_vec();
        assert_ne!(changed.revision(), payload.revision());
        assert_eq!(payload.revision().len(), 16);
    }
}
