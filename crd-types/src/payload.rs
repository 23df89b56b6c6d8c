//! The node payload: the rendered `InPlace` parts of one machine, which bootplate publishes in
//! a per-node Secret of the workload cluster and bootplate-agent applies on the running node.
//!
//! The controller writes it (key [`SECRET_KEY`], JSON) and the agent reads it; both sides use
//! these types, so the wire format has one definition.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The key of the payload in the per-node Secret.
pub const SECRET_KEY: &str = "payload.json";
/// The key of the payload's [`NodeBinding`] in the per-node Secret: the Node the payload was
/// rendered for. A separate key, so the payload's revision does not change with it.
pub const NODE_KEY: &str = "node.json";
/// The key of a [`BootedManifest`]: in the data Secret (written with the render) and, copied from
/// there, in the per-node Secret of the first payload published for the machine.
pub const BOOTED_KEY: &str = "booted-in-place.json";
/// Where a payload's systemd unit files and drop-ins are written.
pub const UNIT_DIR: &str = "/etc/systemd/system";
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

    /// What writing this payload leaves on a node: each path (files, unit files, drop-ins) with
    /// the part that wrote it, and the units enabled. A later path wins, as on the node.
    pub fn manifest(&self) -> BootedManifest {
        let mut manifest = BootedManifest::default();
        for part in &self.parts {
            let mut wrote = |path: String| {
                manifest.files.insert(path, part.name.clone());
            };
            for file in &part.files {
                wrote(file.path.clone());
            }
            for unit in &part.units {
                if unit.content.is_some() {
                    wrote(unit.file_path());
                }
                for drop_in in &unit.drop_ins {
                    wrote(unit.drop_in_path(&drop_in.name));
                }
                if unit.enable {
                    manifest.units.insert(unit.name.clone());
                }
            }
        }
        manifest
    }
}

/// What a machine's user-data wrote and enabled for its `InPlace` parts when it booted. The
/// node payload is published only once Cluster API first updates the machine in place; the
/// agent, which has applied nothing on that node yet, starts from this record, so a file or a
/// unit that left the parts since the boot is removed as it would be between two payloads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BootedManifest {
    /// Path → the part that wrote it (files, unit files and drop-ins).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The units the user-data enabled.
    #[serde(default)]
    pub units: BTreeSet<String>,
}

impl BootedManifest {
    /// The record as the data Secret and the first payload Secret hold it, under [`BOOTED_KEY`].
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always serializes")
    }

    /// The record in `bytes`, as [`BootedManifest::to_bytes`] wrote it.
    pub fn from_bytes(bytes: &[u8]) -> Result<BootedManifest, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// The one Node a payload is for: node names are reused (clouds name nodes after their private
/// addresses), so a payload left behind by a deleted Node must not be applied by the next Node
/// of that name. The agent applies a payload only when its own Node has this UID (and this
/// provider ID, when recorded).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeBinding {
    /// The Node's name.
    pub name: String,
    /// The Node's `metadata.uid`.
    pub uid: String,
    /// The Node's `spec.providerID`, when it had one.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
}

/// Why a payload is not for the Node that read it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotThisNode {
    /// The Secret holds no binding (written by a bootplate that did not bind payloads).
    #[error(
        "Secret {NAMESPACE}/{secret}: no key {NODE_KEY}: the payload is bound to no Node and is not applied"
    )]
    Unbound {
        /// The Secret's name.
        secret: String,
    },
    /// The binding is not JSON of a [`NodeBinding`].
    #[error("Secret {NAMESPACE}/{secret}: key {NODE_KEY} is not a node binding: {cause}")]
    Malformed {
        /// The Secret's name.
        secret: String,
        /// The decoding error.
        cause: String,
    },
    /// The binding names another Node (another name, UID or provider ID).
    #[error(
        "the payload is for Node {bound} ({field} {expected}), not this Node ({field} {found}): a Node of the same name it was published for is gone; not applied"
    )]
    Other {
        /// The bound Node's name.
        bound: String,
        /// The field that differs: `name`, `uid` or `providerID`.
        field: &'static str,
        /// The bound value.
        expected: String,
        /// This Node's value.
        found: String,
    },
}

/// What a Node knows of itself, to compare with a [`NodeBinding`].
#[derive(Clone, Copy, Debug)]
pub struct ThisNode<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its `metadata.uid`.
    pub uid: &'a str,
    /// Its `spec.providerID`.
    pub provider_id: Option<&'a str>,
}

impl NodeBinding {
    /// Reads the binding stored under [`NODE_KEY`] of Secret `secret` (`None`: no such key).
    pub fn read(secret: &str, stored: Option<&[u8]>) -> Result<NodeBinding, NotThisNode> {
        let bytes = stored.ok_or_else(|| NotThisNode::Unbound {
            secret: secret.to_owned(),
        })?;
        serde_json::from_slice(bytes).map_err(|e| NotThisNode::Malformed {
            secret: secret.to_owned(),
            cause: e.to_string(),
        })
    }

    /// Whether the payload is for `node`: same name and UID, and the same provider ID when the
    /// binding records one.
    pub fn check(&self, node: ThisNode<'_>) -> Result<(), NotThisNode> {
        let differs = |field, expected: &str, found: &str| NotThisNode::Other {
            bound: self.name.clone(),
            field,
            expected: expected.to_owned(),
            found: found.to_owned(),
        };
        if self.name != node.name {
            return Err(differs("name", &self.name, node.name));
        }
        if self.uid != node.uid {
            return Err(differs("uid", &self.uid, node.uid));
        }
        match (&self.provider_id, node.provider_id) {
            (Some(bound), found) if Some(bound.as_str()) != found => {
                Err(differs("providerID", bound, found.unwrap_or("<none>")))
            }
            _ => Ok(()),
        }
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

impl PayloadUnit {
    /// Where the unit file is written.
    pub fn file_path(&self) -> String {
        format!("{UNIT_DIR}/{}", self.name)
    }

    /// Where its drop-in `name` is written.
    pub fn drop_in_path(&self, name: &str) -> String {
        format!("{UNIT_DIR}/{}.d/{name}", self.name)
    }
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
    fn the_manifest_names_every_path_a_payload_writes_and_the_units_it_enables() {
        let unit = |name: &str, enable, content: Option<&str>, drop_in: Option<&str>| PayloadUnit {
            name: name.into(),
            enable,
            content: content.map(Into::into),
            drop_ins: (drop_in.into_iter())
                .map(|d| PayloadDropIn {
                    name: d.into(),
                    content: "[Service]\n".into(),
                })
                .collect(),
        };
        let file = |path: &str| PayloadFile {
            path: path.into(),
            permissions: "0644".into(),
            owner: "root".into(),
            content: Vec::new(),
        };
        let payload = NodePayload {
            parts: vec![
                PayloadPart {
                    name: "mirror".into(),
                    files: vec![file("/etc/mirror.toml"), file("/etc/shared.conf")],
                    units: vec![unit("containerd.service", true, None, Some("10-m.conf"))],
                    commands: vec!["true".into()],
                },
                PayloadPart {
                    name: "sysctl".into(),
                    files: vec![file("/etc/shared.conf")],
                    units: vec![unit("sysctl.service", false, Some("[Unit]\n"), None)],
                    commands: Vec::new(),
                },
            ],
        };
        let manifest = payload.manifest();
        let files: Vec<(&str, &str)> = (manifest.files.iter())
            .map(|(path, part)| (path.as_str(), part.as_str()))
            .collect();
        assert_eq!(
            files,
            [
                ("/etc/mirror.toml", "mirror"),
                ("/etc/shared.conf", "sysctl"),
                (
                    "/etc/systemd/system/containerd.service.d/10-m.conf",
                    "mirror"
                ),
                ("/etc/systemd/system/sysctl.service", "sysctl"),
            ],
            "a later part's path wins; a unit without content has no unit file"
        );
        assert_eq!(
            manifest.units.iter().collect::<Vec<_>>(),
            ["containerd.service"],
            "only enabled units"
        );
    }

    #[test]
    fn a_payload_applies_only_on_the_node_it_was_bound_to() {
        let bound = NodeBinding {
            name: "ip-10-0-0-7".into(),
            uid: "uid-1".into(),
            provider_id: Some("aws:///eu-west-1a/i-0aaa".into()),
        };
        let node = |name, uid, provider_id| ThisNode {
            name,
            uid,
            provider_id,
        };
        // (case, the Node reading the payload, the field named in the refusal)
        let cases = [
            (
                "the same Node",
                node("ip-10-0-0-7", "uid-1", Some("aws:///eu-west-1a/i-0aaa")),
                None,
            ),
            (
                "a new Node under a reused name",
                node("ip-10-0-0-7", "uid-2", Some("aws:///eu-west-1a/i-0bbb")),
                Some("uid"),
            ),
            (
                "same UID, another instance",
                node("ip-10-0-0-7", "uid-1", Some("aws:///eu-west-1a/i-0bbb")),
                Some("providerID"),
            ),
            (
                "no provider ID",
                node("ip-10-0-0-7", "uid-1", None),
                Some("providerID"),
            ),
            (
                "another name",
                node("ip-10-0-0-8", "uid-1", Some("aws:///eu-west-1a/i-0aaa")),
                Some("name"),
            ),
        ];
        for (case, node, refused) in cases {
            match (bound.check(node), refused) {
                (Ok(()), None) => {}
                (Err(NotThisNode::Other { field, .. }), Some(want)) => {
                    assert_eq!(field, want, "{case}")
                }
                (got, _) => panic!("{case}: {got:?}"),
            }
        }
        let without_provider = NodeBinding {
            provider_id: None,
            ..bound.clone()
        };
        assert_eq!(
            without_provider.check(node("ip-10-0-0-7", "uid-1", Some("kind://x"))),
            Ok(())
        );
        let message = bound
            .check(node("ip-10-0-0-7", "uid-2", None))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("Node ip-10-0-0-7 (uid uid-1)"),
            "{message}"
        );
    }

    #[test]
    fn a_missing_or_broken_binding_is_refused() {
        let json = serde_json::to_vec(&NodeBinding {
            name: "n".into(),
            uid: "u".into(),
            provider_id: Some("p".into()),
        })
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&json),
            r#"{"name":"n","uid":"u","providerID":"p"}"#
        );
        assert_eq!(NodeBinding::read("s", Some(&json)).unwrap().uid, "u");
        assert!(matches!(
            NodeBinding::read("s", None),
            Err(NotThisNode::Unbound { .. })
        ));
        assert!(matches!(
            NodeBinding::read("s", Some(b"{\"uid\":1}")),
            Err(NotThisNode::Malformed { .. })
        ));
    }

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
