//! Reading the YAML files the offline commands take, and mapping a field of a document (and a
//! line and column inside that field's text) to a line and column of the file, so
//! `bootplate lint` can print `FILE:LINE:COL`.
//!
//! serde_yaml reads the objects; it does not expose positions, so yaml-rust2's event parser,
//! which marks every node, locates the fields.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crd_types::TemplateSpec;
use render::Position;
use serde::de::DeserializeOwned;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A problem with the command's input: exit code 2.
#[derive(Debug)]
pub struct InputError(pub String);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One YAML file: its text and documents.
pub struct YamlFile {
    pub path: PathBuf,
    pub text: String,
    pub documents: Vec<serde_yaml::Value>,
}

impl YamlFile {
    /// Reads and parses `path`; unreadable files and YAML syntax errors are input errors.
    pub fn read(path: &Path) -> Result<YamlFile, InputError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| InputError(format!("{}: cannot read: {e}", path.display())))?;
        let mut documents = Vec::new();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value =
                <serde_yaml::Value as serde::Deserialize>::deserialize(document).map_err(|e| {
                    let at = e
                        .location()
                        .map(|l| format!("{}:{}:", l.line(), l.column()))
                        .unwrap_or_default();
                    InputError(format!("{}:{at} not valid YAML: {e}", path.display()))
                })?;
            if !value.is_null() {
                documents.push(value);
            }
        }
        Ok(YamlFile {
            path: path.to_owned(),
            text,
            documents,
        })
    }

    /// The one document of one of `kinds` (a file may hold other objects too).
    pub fn object<T: DeserializeOwned>(&self, kinds: &[&str]) -> Result<(usize, T), InputError> {
        let found: Vec<usize> = (0..self.documents.len())
            .filter(|i| kinds.contains(&kind(&self.documents[*i])))
            .collect();
        let index = match found.as_slice() {
            [one] => *one,
            [] => {
                return Err(InputError(format!(
                    "{}: no {} in this file",
                    self.path.display(),
                    kinds.join(" or ")
                )));
            }
            _ => {
                return Err(InputError(format!(
                    "{}: more than one {} in this file",
                    self.path.display(),
                    kinds.join(" or ")
                )));
            }
        };
        let value = serde_yaml::from_value(self.documents[index].clone()).map_err(|e| {
            InputError(format!(
                "{}: not a valid {}: {e}",
                self.path.display(),
                kind(&self.documents[index])
            ))
        })?;
        Ok((index, value))
    }
}

/// The `kind` of a document ("" when it has none).
pub fn kind(document: &serde_yaml::Value) -> &str {
    document.get("kind").and_then(|k| k.as_str()).unwrap_or("")
}

/// The kinds that hold a template spec.
pub const TEMPLATE_KINDS: [&str; 2] = ["BootstrapTemplate", "ClusterBootstrapTemplate"];

/// A template document: the name used in messages (`ClusterBootstrapTemplate ubuntu-2404`,
/// `BootstrapTemplate ns/name`) and its spec.
pub fn template(document: &serde_yaml::Value) -> Result<(String, TemplateSpec), String> {
    let kind = kind(document);
    let metadata = document.get("metadata");
    let field = |name: &str| {
        metadata
            .and_then(|m| m.get(name))
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_owned()
    };
    let (name, namespace) = (field("name"), field("namespace"));
    let object = match (kind, namespace.is_empty()) {
        ("BootstrapTemplate", false) => format!("{kind} {namespace}/{name}"),
        _ => format!("{kind} {name}"),
    };
    let spec = document
        .get("spec")
        .cloned()
        .ok_or_else(|| "the object has no spec".to_owned())?;
    let spec: TemplateSpec = serde_yaml::from_value(spec).map_err(|e| format!("spec: {e}"))?;
    Ok((object, spec))
}

/// Where a node of a document starts, and how its scalar is written.
#[derive(Clone, Copy, Debug)]
struct Node {
    mark: Marker,
    style: Option<TScalarStyle>,
    /// Empty lines a block scalar starts with (its mark is on the first non-empty line).
    leading_newlines: usize,
}

enum Container {
    Mapping { key: Option<String> },
    Sequence { index: usize },
}

/// Positions of every node of every document, by path (`spec.parts[1].commands[0]`).
pub struct Positions {
    documents: Vec<BTreeMap<String, Node>>,
    starts: Vec<Marker>,
}

struct Collector {
    documents: Vec<BTreeMap<String, Node>>,
    starts: Vec<Marker>,
    /// Documents that are only a null scalar (empty, or comments only): serde_yaml skips them.
    nulls: Vec<bool>,
    stack: Vec<(String, Container)>,
}

impl Collector {
    fn path(&self) -> String {
        let Some((base, container)) = self.stack.last() else {
            return String::new();
        };
        match container {
            Container::Mapping { key } => {
                let key = key.as_deref().unwrap_or("");
                if base.is_empty() {
                    key.to_owned()
                } else {
                    format!("{base}.{key}")
                }
            }
            Container::Sequence { index } => format!("{base}[{index}]"),
        }
    }

    /// A value was completed in the current container.
    fn advance(&mut self) {
        match self.stack.last_mut() {
            Some((_, Container::Mapping { key })) => *key = None,
            Some((_, Container::Sequence { index })) => *index += 1,
            None => {}
        }
    }

    fn record(&mut self, node: Node) -> String {
        let path = self.path();
        if let Some(doc) = self.documents.last_mut() {
            doc.entry(path.clone()).or_insert(node);
        }
        path
    }
}

impl MarkedEventReceiver for Collector {
    fn on_event(&mut self, event: Event, mark: Marker) {
        match event {
            Event::DocumentStart => {
                self.documents.push(BTreeMap::new());
                self.starts.push(mark);
                self.nulls.push(false);
                self.stack.clear();
            }
            Event::Scalar(value, style, ..) => {
                if self.stack.is_empty()
                    && style == TScalarStyle::Plain
                    && matches!(value.as_str(), "" | "~" | "null" | "Null" | "NULL")
                    && let Some(null) = self.nulls.last_mut()
                {
                    *null = true;
                }
                if let Some((_, Container::Mapping { key: key @ None })) = self.stack.last_mut() {
                    *key = Some(value);
                } else {
                    let leading_newlines = value.len() - value.trim_start_matches('\n').len();
                    self.record(Node {
                        mark,
                        style: Some(style),
                        leading_newlines,
                    });
                    self.advance();
                }
            }
            Event::Alias(_) => self.advance(),
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let path = self.record(Node {
                    mark,
                    style: None,
                    leading_newlines: 0,
                });
                let container = if matches!(event, Event::MappingStart(..)) {
                    Container::Mapping { key: None }
                } else {
                    Container::Sequence { index: 0 }
                };
                self.stack.push((path, container));
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.advance();
            }
            _ => {}
        }
    }
}

impl Positions {
    /// Locates the nodes of `text` (the whole file, all documents). Text yaml-rust2 cannot read
    /// yields no positions (serde_yaml, which read the objects, is the judge of validity).
    pub fn new(text: &str) -> Positions {
        let mut collector = Collector {
            documents: Vec::new(),
            starts: Vec::new(),
            nulls: Vec::new(),
            stack: Vec::new(),
        };
        let _ = Parser::new_from_str(text).load(&mut collector, true);
        // serde_yaml skips null documents; number the rest as YamlFile does.
        let mut documents = Vec::new();
        let mut starts = Vec::new();
        for ((doc, start), null) in collector
            .documents
            .into_iter()
            .zip(collector.starts)
            .zip(collector.nulls)
        {
            if !null && !doc.is_empty() {
                documents.push(doc);
                starts.push(start);
            }
        }
        Positions { documents, starts }
    }

    /// The file line and column (from 1) of `field` of document `document`, and of `position`
    /// inside its text when given. Exact for plain and quoted one-line scalars and for literal
    /// blocks (`|`); other multi-line scalars point at their start. Unknown fields fall back to
    /// the nearest enclosing field, then to the document's start.
    pub fn locate(
        &self,
        document: usize,
        field: &str,
        position: Option<Position>,
    ) -> (usize, usize) {
        let Some(nodes) = self.documents.get(document) else {
            return (1, 1);
        };
        let mut path = field.to_owned();
        let node = loop {
            if let Some(node) = nodes.get(&path) {
                break Some(*node);
            }
            match path.rfind(['.', '[']) {
                Some(cut) => path.truncate(cut),
                None => break None,
            }
        };
        let Some(node) = node else {
            let start = self.starts.get(document).copied();
            return start.map_or((1, 1), |m| (m.line().max(1), m.col() + 1));
        };
        let (line, col) = (node.mark.line(), node.mark.col() + 1);
        let (Some(position), true) = (position, path == field) else {
            return (line, col);
        };
        match node.style {
            Some(TScalarStyle::Literal) => {
                // The mark is on the first non-empty content line, at the block's indentation.
                let first = line.saturating_sub(node.leading_newlines);
                (first + position.line - 1, node.mark.col() + position.column)
            }
            Some(TScalarStyle::Plain) if position.line == 1 => (line, col + position.column - 1),
            Some(TScalarStyle::SingleQuoted | TScalarStyle::DoubleQuoted) if position.line == 1 => {
                (line, col + position.column)
            }
            _ => (line, col),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: t
spec:
  partials:
    a: \"x {{y}}\"
  parts:
    - name: p
      commands:
        - echo {{z}}
        - |
          line one
            {{w}}
---
kind: Other
spec: {template: hi}
";

    #[test]
    fn fields_and_positions_map_to_file_lines() {
        let p = Positions::new(DOC);
        let at = |line, column| Some(Position { line, column });
        assert_eq!(p.locate(0, "spec.parts[0].commands[0]", None), (11, 11));
        assert_eq!(p.locate(0, "spec.parts[0].commands[0]", at(1, 6)), (11, 16));
        assert_eq!(p.locate(0, "spec.partials.a", at(1, 3)), (7, 11));
        assert_eq!(p.locate(0, "spec.parts[0].commands[1]", at(2, 3)), (14, 13));
        assert_eq!(p.locate(0, "spec.parts[0].name", None), (9, 13));
        // Unknown fields fall back to the enclosing one.
        assert_eq!(p.locate(0, "spec.parts[0].files[2].path", None).0, 9);
        assert_eq!(p.locate(1, "spec.template", None), (17, 18));
    }

    #[test]
    fn empty_documents_are_skipped_like_serde_yaml_does() {
        let text = format!("---\n# only a comment\n---\n~\n---\n{DOC}");
        let file_docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect();
        assert_eq!(file_docs.len(), 2);
        let p = Positions::new(&text);
        assert_eq!(p.locate(0, "spec.parts[0].name", None), (9 + 5, 13));
        assert_eq!(p.locate(1, "spec.template", None), (17 + 5, 18));
    }
}
