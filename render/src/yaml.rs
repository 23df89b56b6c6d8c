//! Bounded YAML: every YAML text bootplate parses goes through here, so an alias cannot make a
//! small text a large value.
//!
//! serde_yaml caps how often aliases are followed (100 per event of the text), not what each
//! one repeats: an anchored list of M items aliased N times becomes M×N nodes, and 10 KB of text
//! took 675 MB. So a text is first measured, its nodes and scalar bytes counted with every alias
//! followed, and only parsed when the count stays within a [`YamlLimit`].
//!
//! The count is a serde visitor driven by serde_yaml's own deserializer, not a second parser:
//! it sees exactly the events the parse will build from (no disagreement between two parsers
//! about what an alias refers to), it builds nothing (the events serde_yaml keeps are linear in
//! the text), and it stops at the first node past the limit, so measuring a bomb costs as much
//! as measuring a text at the limit. The price: the size past the limit is not known, only that
//! the limit was passed, and where.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer as _, Visitor};

/// How large a YAML text may grow once its aliases are followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YamlLimit {
    /// Nodes (scalars, lists, maps; a map's keys count), over all documents of the text.
    pub nodes: u64,
    /// Bytes of scalar text (keys and tags included), over all documents of the text.
    pub bytes: u64,
    /// What the limit is for, in messages.
    pub source: &'static str,
}

/// Bytes the aliases of a text may add to the text's own scalar bytes. A scalar's value is at
/// most 1.5 times its text (`"\L"`: two characters, three bytes), so twice the text's length
/// plus this refuses no text for the size of what it writes out, only for what it repeats.
const ALIAS_BYTES: u64 = 1 << 20;

impl YamlLimit {
    /// One document bootplate reads or checks: a raw template's output, a kubeconfig, a value.
    /// The shipped kubeadm templates have about 200 nodes; 100 000 bound a parse to some tens
    /// of MiB, what a render may take when several run at once in a 512 MiB controller.
    pub fn document(text: &str) -> YamlLimit {
        YamlLimit {
            nodes: 100_000,
            bytes: 2 * text.len() as u64 + ALIAS_BYTES,
            source: "the limit of one YAML document",
        }
    }

    /// A file of objects the offline commands read (at most 16 MiB of up to 10 000 objects):
    /// 100 nodes per object, over the whole file.
    pub fn file(text: &str) -> YamlLimit {
        YamlLimit {
            nodes: 1_000_000,
            bytes: 2 * text.len() as u64 + ALIAS_BYTES,
            source: "the limit of one input file",
        }
    }
}

/// Why a YAML text was not parsed.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// The text grows past its limit once its aliases are followed.
    #[error("{0}")]
    TooLarge(Box<TooLarge>),
    /// serde_yaml's own error: syntax, or a shape the target type does not take.
    #[error(transparent)]
    Syntax(#[from] serde_yaml::Error),
}

/// Where and how a text passed its [`YamlLimit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// The document that passed it, from 1.
    pub document: usize,
    /// `nodes` or `bytes`.
    pub what: &'static str,
    /// The limit that was passed.
    pub limit: u64,
    /// Where in the text (line and column from 1) the count passed the limit: the node it
    /// reached, inside the anchor an alias repeats when one did.
    pub location: Option<(usize, usize)>,
    /// What the limit is for.
    pub source: &'static str,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "YAML document {} grows past {} {} once its aliases are followed ({}",
            self.document, self.limit, self.what, self.source
        )?;
        if let Some((line, column)) = self.location {
            write!(f, "; passed at line {line}, column {column}")?;
        }
        f.write_str(
            "): an alias repeats all its anchor holds; write the repeated text out, or repeat less",
        )
    }
}

impl YamlError {
    /// Line and column (from 1) of the problem, when known.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            YamlError::TooLarge(t) => t.location,
            YamlError::Syntax(e) => e.location().map(|l| (l.line(), l.column())),
        }
    }
}

/// Parses the one document of `text` as `T` (as `serde_yaml::from_str`), once its expansion is
/// within `limit`.
pub fn from_str<T: DeserializeOwned>(text: &str, limit: YamlLimit) -> Result<T, YamlError> {
    // Document by document: an empty text is no document to measure, and a null to the parse.
    let mut tally = Tally::new(limit);
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        tally.measure(document, i + 1)?;
    }
    Ok(serde_yaml::from_str(text)?)
}

/// The documents of `text` (as iterating `serde_yaml::Deserializer::from_str`), each parsed once
/// its expansion, with that of the documents before it, is within `limit`. The first error ends
/// the iteration (serde_yaml's own iterator repeats it forever).
pub fn documents(
    text: &str,
    limit: YamlLimit,
) -> impl Iterator<Item = Result<serde_yaml::Value, YamlError>> + '_ {
    let mut tally = Tally::new(limit);
    let mut measured = serde_yaml::Deserializer::from_str(text).enumerate();
    let mut parsed = serde_yaml::Deserializer::from_str(text);
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed {
            return None;
        }
        // One document's events at a time: those measured are dropped before the parse loads.
        let (i, document) = measured.next()?;
        let document = match tally.measure(document, i + 1) {
            Ok(()) => serde::Deserialize::deserialize(parsed.next()?).map_err(YamlError::from),
            Err(e) => Err(e),
        };
        failed = document.is_err();
        Some(document)
    })
}

/// Checks that every document of `text` is within `limit`, for a text another parser reads
/// (kube's kubeconfig reader): what serde_yaml can read is measured, syntax is left to it.
pub fn check(text: &str, limit: YamlLimit) -> Result<(), TooLarge> {
    let mut tally = Tally::new(limit);
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        match tally.measure(document, i + 1) {
            Ok(()) => {}
            Err(YamlError::TooLarge(t)) => return Err(*t),
            Err(YamlError::Syntax(_)) => break,
        }
    }
    Ok(())
}

/// Nodes and bytes counted so far, over all documents of a text.
struct Tally {
    limit: YamlLimit,
    nodes: u64,
    bytes: u64,
    /// Set when a limit was passed (`nodes` or `bytes`): the error serde_yaml returns is then
    /// ours, with its location.
    passed: Option<&'static str>,
}

impl Tally {
    fn new(limit: YamlLimit) -> Self {
        Tally {
            limit,
            nodes: 0,
            bytes: 0,
            passed: None,
        }
    }

    /// Counts one document, every alias followed.
    fn measure(
        &mut self,
        document: serde_yaml::Deserializer<'_>,
        index: usize,
    ) -> Result<(), YamlError> {
        match document.deserialize_any(Count(self)) {
            Ok(()) => Ok(()),
            Err(e) => match self.passed {
                Some(what) => Err(YamlError::TooLarge(Box::new(TooLarge {
                    document: index,
                    what,
                    limit: if what == "nodes" {
                        self.limit.nodes
                    } else {
                        self.limit.bytes
                    },
                    location: e.location().map(|l| (l.line(), l.column())),
                    source: self.limit.source,
                }))),
                // serde_yaml's own cap on following aliases, reached before this limit.
                None if e.to_string().starts_with("repetition limit exceeded") => {
                    Err(YamlError::TooLarge(Box::new(TooLarge {
                        document: index,
                        what: "alias repetitions per event of the text",
                        limit: 100,
                        location: e.location().map(|l| (l.line(), l.column())),
                        source: self.limit.source,
                    })))
                }
                // Not measured to its end: not parsed either.
                None => Err(YamlError::Syntax(e)),
            },
        }
    }

    /// One node of `bytes` scalar bytes.
    fn node<E: de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        self.nodes += 1;
        self.add(bytes)?;
        if self.nodes > self.limit.nodes {
            self.passed = Some("nodes");
            return Err(E::custom("the YAML node limit"));
        }
        Ok(())
    }

    fn add<E: de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        self.bytes = self.bytes.saturating_add(bytes as u64);
        if self.bytes > self.limit.bytes {
            self.passed = Some("bytes");
            return Err(E::custom("the YAML byte limit"));
        }
        Ok(())
    }
}

/// Counts a node and everything under it into the tally.
struct Count<'a>(&'a mut Tally);

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// A number or a boolean counts as the bytes of its longest text.
const NUMBER_BYTES: usize = 20;

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.0.node(NUMBER_BYTES)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.0.node(NUMBER_BYTES)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.0.node(NUMBER_BYTES)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.0.node(NUMBER_BYTES)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.node(v.len())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.node(0)
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.0.node(0)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.node(0)?;
        while seq.next_element_seed(Count(self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.node(0)?;
        while map.next_key_seed(Count(self.0))?.is_some() {
            map.next_value_seed(Count(self.0))?;
        }
        Ok(())
    }

    /// serde_yaml gives a tagged node (`!x value`) as an enum: the tag, then the node.
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let (tag, node): (String, _) = data.variant()?;
        self.0.add(tag.len())?;
        de::VariantAccess::newtype_variant_seed(node, Count(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An anchored list of `items` aliased `aliases` times: about items × aliases nodes from a
    /// text of some items + aliases × 4 bytes.
    pub(crate) fn bomb(items: usize, aliases: usize) -> String {
        let list = vec!["x"; items].join(",");
        let refs = vec!["*a"; aliases].join(",");
        format!("a: &a [{list}]\nb: [{refs}]\n")
    }

    #[test]
    fn documents_within_the_limit_parse_as_serde_yaml_parses_them() {
        let texts = [
            "",
            "# only a comment\n",
            "a: 1\nb: [x, y, {c: !tag d}]\n",
            "a: &a {x: 1}\nb: *a\nc: *a\n",
            "a: 1\n---\nb: 2\n---\n",
        ];
        for text in texts {
            let expected: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(text)
                .map(|d| serde::Deserialize::deserialize(d).unwrap())
                .collect();
            let got: Vec<_> = documents(text, YamlLimit::document(text))
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(got, expected, "{text:?}");
            assert!(check(text, YamlLimit::document(text)).is_ok(), "{text:?}");
        }
        let v: serde_yaml::Value = from_str("", YamlLimit::document("")).unwrap();
        assert!(v.is_null());
    }

    #[test]
    fn expansion_past_the_limit_is_refused_where_it_passes() {
        // The text, its limit, and what it passes, the limit passed and where.
        type Case<'a> = (&'a str, YamlLimit, &'a str, u64, (usize, usize));
        let cases: &[Case<'_>] = &[
            // 3 nodes for the map and `a`'s list, then 2 for each alias of a 1-item list.
            (
                "a: &a [x]\nb: [*a, *a, *a]\n",
                YamlLimit {
                    nodes: 8,
                    bytes: 100,
                    source: "a test limit",
                },
                "nodes",
                8,
                (1, 4),
            ),
            (
                "a: &a xxxxxxxxxx\nb: [*a, *a, *a]\n",
                YamlLimit {
                    nodes: 100,
                    bytes: 30,
                    source: "a test limit",
                },
                "bytes",
                30,
                (1, 4),
            ),
        ];
        for (text, limit, what, at, location) in cases {
            let e = from_str::<serde_yaml::Value>(text, *limit).unwrap_err();
            let YamlError::TooLarge(t) = &e else {
                panic!("{text:?}: {e}")
            };
            assert_eq!(
                (t.what, t.limit, t.location, t.document),
                (*what, *at, Some(*location), 1)
            );
            let message = e.to_string();
            assert!(message.contains("a test limit"), "{message}");
            assert_eq!(check(text, *limit).unwrap_err(), **t);
        }
    }

    /// serde_yaml stops following aliases past 100 per event of the text; a text that reaches
    /// that before the node limit is refused as an expansion too, not as bad YAML.
    #[test]
    fn serde_yamls_own_alias_cap_is_refused_as_an_expansion() {
        // 250 lists of 250 aliases: about 62 750 nodes, within the document limit, and 62 750
        // aliases followed for about 500 events.
        let list = |alias: &str| format!("[{}]", vec![alias; 250].join(", "));
        let text = format!("a: &a x\nb: &b {}\nc: {}\n", list("*a"), list("*b"));
        let limit = YamlLimit::document(&text);
        let e = from_str::<serde_yaml::Value>(&text, limit).unwrap_err();
        let YamlError::TooLarge(t) = &e else {
            panic!("not refused as an expansion: {e}")
        };
        assert_eq!(
            (t.what, t.limit),
            ("alias repetitions per event of the text", 100)
        );
        assert!(e.to_string().contains("grows past"), "{e}");
    }

    #[test]
    fn the_limit_counts_every_document_of_a_text() {
        let text = "a: &a [x, x, x]\nb: *a\n---\nc: *a\n";
        // serde_yaml's anchors do not cross documents: the second one is a syntax error, and
        // the first one is within the limit.
        let limit = YamlLimit {
            nodes: 20,
            bytes: 100,
            source: "t",
        };
        let mut docs = documents(text, limit);
        assert!(docs.next().unwrap().is_ok());
        assert!(matches!(docs.next().unwrap(), Err(YamlError::Syntax(_))));
        let text = "a: [x, x, x]\n---\nb: [x, x, x]\n";
        let limit = YamlLimit {
            nodes: 7,
            bytes: 100,
            source: "t",
        };
        let results: Vec<_> = documents(text, limit).collect();
        assert!(results[0].is_ok());
        let Err(YamlError::TooLarge(t)) = &results[1] else {
            panic!("{results:?}")
        };
        assert_eq!((t.document, t.what), (2, "nodes"));
    }

    #[test]
    fn a_syntax_error_ends_the_reading() {
        let text = "a: [1\n";
        let limit = YamlLimit::document(text);
        let one = from_str::<serde_yaml::Value>(text, limit);
        assert!(matches!(one, Err(YamlError::Syntax(_))), "{one:?}");
        let all: Vec<_> = documents(text, limit).collect();
        assert!(
            matches!(all.as_slice(), [Err(YamlError::Syntax(_))]),
            "{all:?}"
        );
        assert!(check(text, limit).is_ok());
    }

    #[test]
    fn a_bomb_is_measured_in_the_time_of_the_limit() {
        // 10^4 × 10^4 = 10^8 nodes from 60 KB: refused after 100 000 of them.
        let text = bomb(10_000, 10_000);
        let start = std::time::Instant::now();
        let e = from_str::<serde_yaml::Value>(&text, YamlLimit::document(&text)).unwrap_err();
        assert!(
            matches!(&e, YamlError::TooLarge(t) if t.what == "nodes"),
            "{e}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}
