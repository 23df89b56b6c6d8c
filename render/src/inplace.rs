//! In-place updates: a render split by part, and the rule that decides whether a change can be
//! applied on running machines. The rule compares renders, not specs: a template edit that
//! renders the same bytes changes nothing, and a variable that only an `InPlace` part reads
//! changes only that part.

use crd_types::payload::{NodePayload, PayloadDropIn, PayloadFile, PayloadPart, PayloadUnit};
use crd_types::{FileEncoding, OutputFormat, UpdateStrategy};

use crate::body::{PartBody, Split};
use crate::files::File;

/// A machine's render, split by origin: each part that applies (in template order) and the
/// config's own files and commands.
#[derive(Clone, PartialEq, Eq)]
pub struct PartsRender {
    /// The template's output format.
    pub format: OutputFormat,
    /// The parts that apply to the machine, in order.
    pub parts: Vec<RenderedPart>,
    /// The config's own `files`, `preCommands` and `postCommands` (name empty). They are not a
    /// part, so a change to them always rolls out.
    pub config: PayloadPart,
    /// A raw `spec.template`'s own output (its parts not merged in): any change to it rolls
    /// out. `None` for a structured template.
    pub raw: Option<String>,
}

impl std::fmt::Debug for PartsRender {
    // The content may hold credentials: names only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartsRender")
            .field("format", &self.format)
            .field(
                "parts",
                &self
                    .parts
                    .iter()
                    .map(|p| (&p.content.name, p.update))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// One part's rendered content and how a change to it may reach booted machines.
#[derive(Clone, PartialEq, Eq)]
pub struct RenderedPart {
    /// The part's `update`.
    pub update: UpdateStrategy,
    /// Its files (content decoded), units and commands.
    pub content: PayloadPart,
}

impl RenderedPart {
    /// No file, unit or command: the part applies but contributes nothing.
    fn renders_nothing(&self) -> bool {
        let c = &self.content;
        c.files.is_empty() && c.units.is_empty() && c.commands.is_empty()
    }
}

/// How a change from one render to another reaches a booted machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdatePlan {
    /// Both renders are the same: nothing to do.
    Unchanged,
    /// Every difference lies in `InPlace` parts, named here in template order.
    InPlace {
        /// The parts that differ (changed, added or removed).
        parts: Vec<String>,
    },
    /// Something outside the `InPlace` parts differs: the machine must be replaced.
    Rollout {
        /// Why, for people: names the part or what else changed.
        reason: String,
    },
}

impl PartsRender {
    /// How a machine rendered as `old` gets to `self`. A part counts as `InPlace` only when
    /// both renders say so: a part that was `Rollout` when the machine booted may hold what the
    /// agent never managed there.
    pub fn update_from<'a>(&'a self, old: &'a PartsRender) -> UpdatePlan {
        if self.format != old.format {
            return rollout(format!(
                "the output format changed from {} to {}",
                old.format, self.format
            ));
        }
        if self.raw != old.raw {
            return rollout("the output of the raw spec.template changed");
        }
        if self.config != old.config {
            return rollout("the config's own files or commands changed");
        }
        let mut changed = Vec::new();
        for name in part_names(old, self) {
            // A part that renders nothing (an opt-in part turned off) is no part: adding such a
            // part to a template changes no machine.
            let rendered = |p: Option<&'a RenderedPart>| p.filter(|p| !p.renders_nothing());
            let (before, after) = (rendered(old.part(&name)), rendered(self.part(&name)));
            if before.map(|p| &p.content) == after.map(|p| &p.content) {
                continue;
            }
            let in_place = [before, after]
                .into_iter()
                .flatten()
                .all(|p| p.update == UpdateStrategy::InPlace);
            if !in_place {
                let what = match (before, after) {
                    (Some(_), Some(_)) => "changed",
                    (None, _) => "was added",
                    (_, None) => "was removed",
                };
                return rollout(format!("part `{name}` {what} and is not `update: InPlace`"));
            }
            changed.push(name);
        }
        if changed.is_empty() {
            UpdatePlan::Unchanged
        } else {
            UpdatePlan::InPlace { parts: changed }
        }
    }

    /// What bootplate-agent applies on the machine: the `InPlace` parts, without the files
    /// the config's own files replace (the user-data writes the config's version; those are
    /// not the agent's to manage).
    pub fn payload(&self) -> NodePayload {
        let taken = |path: &str| self.config.files.iter().any(|f| f.path == path);
        NodePayload {
            parts: self
                .parts
                .iter()
                .filter(|p| p.update == UpdateStrategy::InPlace)
                .map(|p| PayloadPart {
                    files: (p.content.files.iter())
                        .filter(|f| !taken(&f.path))
                        .cloned()
                        .collect(),
                    ..p.content.clone()
                })
                .collect(),
        }
    }

    fn part(&self, name: &str) -> Option<&RenderedPart> {
        self.parts.iter().find(|p| p.content.name == name)
    }
}

fn rollout(reason: impl Into<String>) -> UpdatePlan {
    UpdatePlan::Rollout {
        reason: reason.into(),
    }
}

/// The part names of `new` in order, then those only `old` has.
fn part_names(old: &PartsRender, new: &PartsRender) -> Vec<String> {
    let mut names: Vec<String> = new.parts.iter().map(|p| p.content.name.clone()).collect();
    for p in &old.parts {
        if !names.contains(&p.content.name) {
            names.push(p.content.name.clone());
        }
    }
    names
}

/// Why a render's split cannot become a [`PartsRender`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SplitError {
    /// A file's content does not decode.
    #[error("file {path}: {message}")]
    Undecodable {
        /// The file's path on the machine.
        path: String,
        /// What is wrong with its content.
        message: String,
    },
    /// The decoded files add up to more than the limit: one gzip member can expand a thousand
    /// times, so decompression stops one byte past what is left.
    #[error(
        "file {path}: the decoded files add up to more than {limit} bytes (its gzip data expands past what is left)"
    )]
    TooLarge {
        /// The file whose content went past the limit.
        path: String,
        /// Bytes all decoded files may take together.
        limit: u64,
    },
}

/// Builds the public split from the body's, decoding file contents: all of them together may
/// take at most `limit` bytes.
pub(crate) fn from_split(
    format: OutputFormat,
    split: Split,
    pre_commands: &[String],
    post_commands: &[String],
    limit: u64,
) -> Result<PartsRender, SplitError> {
    let mut decoded = Decoded { left: limit, limit };
    let parts = split
        .parts
        .iter()
        .map(|part| {
            Ok(RenderedPart {
                update: part.update,
                content: payload_part(part, &mut decoded)?,
            })
        })
        .collect::<Result<_, SplitError>>()?;
    let config = PayloadPart {
        name: String::new(),
        files: (split.config_files.iter())
            .map(|f| payload_file(f, &mut decoded))
            .collect::<Result<_, _>>()?,
        units: Vec::new(),
        commands: pre_commands.iter().chain(post_commands).cloned().collect(),
    };
    Ok(PartsRender {
        format,
        parts,
        config,
        raw: None,
    })
}

/// What the decoded files of one split may still take.
struct Decoded {
    left: u64,
    limit: u64,
}

fn payload_part(part: &PartBody, decoded: &mut Decoded) -> Result<PayloadPart, SplitError> {
    let (files, units) = part.merged();
    Ok(PayloadPart {
        name: part.name.clone(),
        files: (files.iter())
            .map(|f| payload_file(f, decoded))
            .collect::<Result<_, _>>()?,
        units: units
            .into_iter()
            .map(|u| PayloadUnit {
                name: u.name,
                enable: u.enable,
                content: u.content,
                drop_ins: (u.drop_ins.into_iter())
                    .map(|(name, content)| PayloadDropIn { name, content })
                    .collect(),
            })
            .collect(),
        commands: part.commands.clone(),
    })
}

fn payload_file(f: &File, decoded: &mut Decoded) -> Result<PayloadFile, SplitError> {
    let content = match decode(&f.content, f.encoding, decoded.left) {
        Ok(content) => content,
        Err(Decode::TooLarge) => {
            return Err(SplitError::TooLarge {
                path: f.path.clone(),
                limit: decoded.limit,
            });
        }
        Err(Decode::Invalid(message)) => {
            return Err(SplitError::Undecodable {
                path: f.path.clone(),
                message,
            });
        }
    };
    decoded.left -= content.len() as u64;
    Ok(PayloadFile {
        path: f.path.clone(),
        permissions: f.permissions.clone(),
        owner: f.owner.clone(),
        content,
    })
}

/// Why a file's content did not decode.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decode {
    /// Not valid base64 or gzip data.
    Invalid(String),
    /// More bytes than allowed.
    TooLarge,
}

/// A file's bytes as they land on disk, at most `limit` of them. A gzip member is read one
/// byte past the limit and no further: whatever it would expand to, no more is allocated.
pub(crate) fn decode(content: &str, encoding: FileEncoding, limit: u64) -> Result<Vec<u8>, Decode> {
    use base64::Engine as _;
    use std::io::Read as _;
    let base64 = || {
        base64::engine::general_purpose::STANDARD
            .decode(content.split_ascii_whitespace().collect::<String>())
            .map_err(|e| Decode::Invalid(format!("not valid base64: {e}")))
    };
    let bytes = match encoding {
        FileEncoding::Plain => content.as_bytes().to_vec(),
        FileEncoding::Base64 => base64()?,
        FileEncoding::GzipBase64 => {
            let compressed = base64()?;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&compressed[..])
                .take(limit.saturating_add(1))
                .read_to_end(&mut out)
                .map_err(|e| Decode::Invalid(format!("not valid gzip data: {e}")))?;
            out
        }
    };
    if bytes.len() as u64 > limit {
        return Err(Decode::TooLarge);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use base64::Engine as _;

    use super::*;

    fn gzip_base64(bytes: &[u8]) -> String {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(bytes).unwrap();
        base64::engine::general_purpose::STANDARD.encode(encoder.finish().unwrap())
    }

    // Every encoding is held to the limit; gzip data is read one byte past it and no further
    // (tests/budgets.rs measures what a bomb allocates).
    #[test]
    fn decoding_stops_at_the_limit() {
        let bomb = gzip_base64(&vec![0; 1 << 20]);
        assert!(
            bomb.len() < 2048,
            "a small member that expands a thousand times"
        );
        for (content, encoding, limit, expected) in [
            ("hello", FileEncoding::Plain, 5, Ok(b"hello".to_vec())),
            ("hello", FileEncoding::Plain, 4, Err(Decode::TooLarge)),
            ("aGVsbG8=", FileEncoding::Base64, 5, Ok(b"hello".to_vec())),
            ("aGVsbG8=", FileEncoding::Base64, 4, Err(Decode::TooLarge)),
            (
                bomb.as_str(),
                FileEncoding::GzipBase64,
                1 << 20,
                Ok(vec![0; 1 << 20]),
            ),
            (
                bomb.as_str(),
                FileEncoding::GzipBase64,
                (1 << 20) - 1,
                Err(Decode::TooLarge),
            ),
            (
                bomb.as_str(),
                FileEncoding::GzipBase64,
                0,
                Err(Decode::TooLarge),
            ),
        ] {
            assert_eq!(
                decode(content, encoding, limit).map_err(|e| format!("{e:?}")),
                expected.map_err(|e| format!("{e:?}")),
                "{encoding:?} at {limit}"
            );
        }
        let Err(Decode::Invalid(message)) = decode("aGVsbG8=", FileEncoding::GzipBase64, 10) else {
            panic!("plain text is not gzip data");
        };
        assert!(message.contains("not valid gzip data"), "{message}");
    }
}
