//! Reading the YAML files the offline commands take, strictly: every document must be a known
//! kind of the served `apiVersion`, and every field of a bootplate object must fit the kind's
//! CRD schema (`crd_types::strict`), as `kubectl apply` with strict field validation demands.
//! A field of a document (and a line and column inside that field's text) maps to a line and
//! column of the file, so problems print as `FILE:LINE:COL`.
//!
//! serde_yaml reads the objects; it does not expose positions, so yaml-rust2's event parser,
//! which marks every node, locates the fields. serde_yaml reads YAML 1.2, `kubectl apply` YAML
//! 1.1: every unquoted scalar the two read differently (`0600`, `yes`) is then set to what
//! `kubectl apply` sends (`yaml11.rs`), and a problem at such a field says why.
//!
//! Every input is bounded before it is allocated: a file is read up to [`MAX_FILE_BYTES`], and
//! holds at most [`MAX_DOCUMENTS`] documents.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use crd_types::TemplateSpec;
use crd_types::strict;
use render::yaml::{YamlError, YamlLimit};
use render::{Position, Severity};
use serde::de::DeserializeOwned;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::diagnostic::Diagnostic;
use super::yaml11;

/// The largest file the offline commands read: far above any object the apiserver stores
/// (etcd's default request limit is 1.5 MiB), so a file of many objects still fits.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// The most documents one file may hold.
pub const MAX_DOCUMENTS: usize = 10_000;

/// A problem with the command's input: exit code 2.
#[derive(Debug)]
pub struct InputError(pub String);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kinds of CAPI objects `bootplate render` reads, and the API group they must be of.
const CAPI_GROUP: &str = "cluster.x-k8s.io/";

/// One YAML file: its text, documents and the positions of their nodes.
pub struct YamlFile {
    /// The name shown in messages (`-` is standard input).
    pub shown: String,
    /// The file's text, for source snippets.
    pub text: String,
    pub documents: Vec<serde_yaml::Value>,
    pub positions: Positions,
}

impl YamlFile {
    /// Reads and parses `path` (`-`: standard input); unreadable files are input errors, YAML
    /// syntax errors a located diagnostic.
    pub fn read(path: &Path) -> Result<YamlFile, ReadError> {
        let (shown, text) = read_text(path)?;
        YamlFile::parse(shown, text)
    }

    /// Parses `text`, the content of the file shown as `shown`, bounded by its expansion.
    pub fn parse(shown: String, text: String) -> Result<YamlFile, ReadError> {
        let mut documents = Vec::new();
        for value in render::yaml::documents(&text, YamlLimit::file(&text)) {
            let value = value.map_err(|e| syntax_error(&shown, &e))?;
            if !value.is_null() {
                documents.push(value);
            }
            if documents.len() > MAX_DOCUMENTS {
                return Err(ReadError::Unreadable(InputError(format!(
                    "{shown}: more than {MAX_DOCUMENTS} documents in one file; split it"
                ))));
            }
        }
        let mut positions = Positions::new(&text);
        positions.reread_as_yaml_1_1(&mut documents);
        Ok(YamlFile {
            shown,
            text,
            documents,
            positions,
        })
    }

    /// The index of the one document of one of `kinds` (a file may hold other objects too).
    pub fn find(&self, kinds: &[&str]) -> Result<usize, InputError> {
        let found: Vec<usize> = (0..self.documents.len())
            .filter(|i| kinds.contains(&kind(&self.documents[*i])))
            .collect();
        match found.as_slice() {
            [one] => Ok(*one),
            [] => Err(InputError(format!(
                "{}: no {} in this file",
                self.shown,
                kinds.join(" or ")
            ))),
            _ => Err(InputError(format!(
                "{}: more than one {} in this file",
                self.shown,
                kinds.join(" or ")
            ))),
        }
    }

    /// Document `index`, checked strictly and decoded: bootplate's kinds against their CRD
    /// schema, CAPI's (`Machine`, `Cluster`) for their API group only (bootplate models a
    /// fraction of their fields). Err holds every problem, located.
    pub fn decode<T: DeserializeOwned>(&self, index: usize) -> Result<T, Vec<Diagnostic>> {
        let document = &self.documents[index];
        let json = serde_json::to_value(document).map_err(|e| {
            vec![self.at(
                index,
                "",
                false,
                "not-json",
                format!("not a JSON-compatible object: {e}"),
            )]
        })?;
        let kind = kind(document);
        if strict::KINDS.contains(&kind) {
            let problems = strict::check(&json);
            if !problems.is_empty() {
                return Err(problems
                    .into_iter()
                    .map(|p| {
                        let code = if p.at_key { "unknown-field" } else { "schema" };
                        self.at(index, &p.path, p.at_key, code, p.message)
                    })
                    .collect());
            }
        } else {
            let version = document
                .get("apiVersion")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            if !version.starts_with(CAPI_GROUP) {
                return Err(vec![self.at(
                    index,
                    "apiVersion",
                    false,
                    "schema",
                    format!("a {kind} of Cluster API has apiVersion `{CAPI_GROUP}v1beta2`, not `{version}`"),
                )]);
            }
        }
        serde_path_to_error::deserialize(json).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            vec![self.at(index, &path, false, "schema", e.into_inner().to_string())]
        })
    }

    /// A diagnostic at `field` of document `index` (its key when `at_key`).
    pub fn at(
        &self,
        index: usize,
        field: &str,
        at_key: bool,
        code: &'static str,
        message: String,
    ) -> Diagnostic {
        let location = if at_key {
            self.positions.locate_key(index, field)
        } else {
            self.positions.locate(index, field, None)
        };
        let mut d = Diagnostic::new(&self.shown, location, Severity::Error, code, field, message);
        // Only where text was wanted (or a key read as `true` is unknown): quoting a number
        // outside its range would not help.
        let wanted_text = d.message.contains("string") || code == "unknown-field";
        if let Some((text, value)) = self.positions.reread(index, field)
            && wanted_text
        {
            let why = yaml11::hint(text, value);
            d.hint = Some(match d.hint.take() {
                Some(hint) => format!("{hint}; {why}"),
                None => why,
            });
        }
        d
    }

    /// Checks that every document is one of `allowed` kinds (and, for bootplate's, of the
    /// served apiVersion): a misspelled kind is an error, never a skipped document.
    pub fn check_kinds(&self, allowed: &[&str]) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        for (index, document) in self.documents.iter().enumerate() {
            let kind = kind(document);
            if allowed.contains(&kind) {
                if strict::KINDS.contains(&kind) {
                    let json = serde_json::to_value(document).unwrap_or_default();
                    if let Err(p) = strict::kind_of(&json) {
                        out.push(self.at(index, &p.path, false, "api-version", p.message));
                    }
                }
                continue;
            }
            out.push(self.unknown_kind(index, allowed));
        }
        out
    }

    /// Document `index` is of none of the `allowed` kinds: the error, with the kind probably
    /// meant.
    pub fn unknown_kind(&self, index: usize, allowed: &[&str]) -> Diagnostic {
        let document = &self.documents[index];
        let kind = kind(document);
        let message = if document.get("kind").is_none() {
            format!(
                "the document has no kind (expected {})",
                allowed.join(" or ")
            )
        } else if strict::KINDS.contains(&kind) {
            format!(
                "a {kind} is not read here (expected {})",
                allowed.join(" or ")
            )
        } else {
            format!(
                "unknown kind `{}`{}",
                kind,
                strict::hint(kind, allowed.iter().copied())
            )
        };
        self.at(index, "kind", false, "unknown-kind", message)
    }
}

/// The name shown for `path` and its text (`-`: standard input), at most [`MAX_FILE_BYTES`] of
/// it: a larger file is refused before more than that is read.
pub fn read_text(path: &Path) -> Result<(String, String), InputError> {
    let shown = path.display().to_string();
    let text = read_bounded(path, &shown)?;
    Ok((shown, text))
}

/// [`read_text`] for a file a directory walk found as a regular file: read only if what is
/// opened is still that file, not a symbolic link put in its place since.
pub fn read_walked_text(path: &Path) -> Result<(String, String), InputError> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display().to_string();
    let unreadable = |why: String| InputError(format!("{shown}: {why}"));
    let file = std::fs::File::open(path).map_err(|e| unreadable(format!("cannot read: {e}")))?;
    let opened = file
        .metadata()
        .map_err(|e| unreadable(format!("cannot read: {e}")))?;
    let here =
        std::fs::symlink_metadata(path).map_err(|e| unreadable(format!("cannot read: {e}")))?;
    if !here.is_file() || (opened.dev(), opened.ino()) != (here.dev(), here.ino()) {
        return Err(unreadable(
            "no longer the regular file the walk found; not read".to_owned(),
        ));
    }
    let text = read_from(Box::new(file), &shown)?;
    Ok((shown, text))
}

fn read_bounded(path: &Path, shown: &str) -> Result<String, InputError> {
    let unreadable = |why: String| InputError(format!("{shown}: {why}"));
    let reader: Box<dyn Read> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).map_err(|e| unreadable(format!("cannot read: {e}")))?)
    };
    read_from(reader, shown)
}

fn read_from(reader: Box<dyn Read>, shown: &str) -> Result<String, InputError> {
    let unreadable = |why: String| InputError(format!("{shown}: {why}"));
    let mut bytes = Vec::new();
    reader
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(unreadable(format!(
            "larger than {} MiB, more than any file of Kubernetes objects needs; split it",
            MAX_FILE_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|_| unreadable("cannot read: not UTF-8 text".to_owned()))
}

/// A YAML syntax error, or an expansion past the limit, as a located diagnostic.
fn syntax_error(shown: &str, e: &YamlError) -> ReadError {
    let (line, column) = e.location().unwrap_or((1, 1));
    let (code, message) = match e {
        YamlError::TooLarge(t) => ("yaml-too-large", t.to_string()),
        YamlError::Syntax(e) => {
            let message = e.to_string();
            // serde_yaml appends " at line L column C"; the location is shown already.
            let message = message.split(" at line ").next().unwrap_or(&message);
            ("yaml-syntax", format!("not valid YAML: {message}"))
        }
    };
    ReadError::Problems(vec![Diagnostic::new(
        shown,
        (line, column),
        Severity::Error,
        code,
        "",
        message,
    )])
}

/// Why an input could not be used.
#[derive(Debug)]
pub enum ReadError {
    /// Missing, unreadable, not UTF-8, not the object asked for: the command could not run.
    Unreadable(InputError),
    /// Located problems of the file: YAML syntax, kinds, fields.
    Problems(Vec<Diagnostic>),
}

impl From<InputError> for ReadError {
    fn from(e: InputError) -> Self {
        ReadError::Unreadable(e)
    }
}

impl From<Vec<Diagnostic>> for ReadError {
    fn from(d: Vec<Diagnostic>) -> Self {
        ReadError::Problems(d)
    }
}

/// The `kind` of a document ("" when it has none).
pub fn kind(document: &serde_yaml::Value) -> &str {
    document.get("kind").and_then(|k| k.as_str()).unwrap_or("")
}

/// The kinds that hold a template spec.
pub const TEMPLATE_KINDS: [&str; 2] = ["BootstrapTemplate", "ClusterBootstrapTemplate"];
/// The kinds that hold a config spec (a `BootplateConfigTemplate` holds it at
/// `spec.template.spec`).
pub const CONFIG_KINDS: [&str; 2] = ["BootplateConfig", "BootplateConfigTemplate"];

/// The name of a template in messages (`ClusterBootstrapTemplate ubuntu-2404`,
/// `BootstrapTemplate ns/name`).
pub fn template_name(document: &serde_yaml::Value) -> String {
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
    match (kind, namespace.is_empty()) {
        ("BootstrapTemplate", false) => format!("{kind} {namespace}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// Template document `index` of `file`, strictly decoded: its name and spec.
pub fn template(file: &YamlFile, index: usize) -> Result<(String, TemplateSpec), Vec<Diagnostic>> {
    let name = template_name(&file.documents[index]);
    let spec = match kind(&file.documents[index]) {
        "ClusterBootstrapTemplate" => {
            file.decode::<crd_types::ClusterBootstrapTemplate>(index)?
                .spec
                .0
        }
        _ => file.decode::<crd_types::BootstrapTemplate>(index)?.spec,
    };
    Ok((name, spec))
}

/// The spec of config document `index` of `file` (a BootplateConfig, or a
/// BootplateConfigTemplate's `spec.template.spec`), strictly decoded, and where it sits.
pub fn config_spec(
    file: &YamlFile,
    index: usize,
) -> Result<(crd_types::BootplateConfigSpec, &'static str), Vec<Diagnostic>> {
    Ok(match kind(&file.documents[index]) {
        "BootplateConfig" => (
            file.decode::<crd_types::BootplateConfig>(index)?.spec,
            "spec",
        ),
        _ => (
            file.decode::<crd_types::BootplateConfigTemplate>(index)?
                .spec
                .template
                .spec,
            "spec.template.spec",
        ),
    })
}

/// A config read for `--config`: its spec, where that spec sits in the file (`spec`, or
/// `spec.template.spec` in a `BootplateConfigTemplate`), and the file for locating problems.
pub struct ConfigInput {
    pub spec: crd_types::BootplateConfigSpec,
    pub file: YamlFile,
    pub index: usize,
    pub spec_path: &'static str,
}

impl ConfigInput {
    /// Reads the one BootplateConfig or BootplateConfigTemplate of `path`, strictly.
    pub fn read(path: &Path) -> Result<ConfigInput, ReadError> {
        let file = YamlFile::read(path)?;
        let index = file.find(&CONFIG_KINDS)?;
        let problems = file.check_kinds(&CONFIG_KINDS);
        if !problems.is_empty() {
            return Err(problems.into());
        }
        let (spec, spec_path) = config_spec(&file, index)?;
        Ok(ConfigInput {
            spec,
            file,
            index,
            spec_path,
        })
    }

    /// Where the config's spec sits, to locate its problems.
    pub fn at(&self) -> ConfigAt<'_> {
        ConfigAt {
            file: &self.file,
            index: self.index,
            spec_path: self.spec_path,
        }
    }
}

/// Where a config spec sits: document `index` of `file`, at `spec_path`.
pub struct ConfigAt<'a> {
    pub file: &'a YamlFile,
    pub index: usize,
    pub spec_path: &'static str,
}

impl ConfigAt<'_> {
    /// A problem of the config's field `field` (relative to a config spec: `spec.variables.x`),
    /// located in its file.
    pub fn locate(
        &self,
        field: &str,
        severity: Severity,
        code: &'static str,
        message: String,
    ) -> Diagnostic {
        let field = match field.strip_prefix("spec") {
            Some(rest) => format!("{}{rest}", self.spec_path),
            None => field.to_owned(),
        };
        let location = self.file.positions.locate(self.index, &field, None);
        Diagnostic::new(&self.file.shown, location, severity, code, &field, message)
    }
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

/// A step of the way into a document: a mapping key or a sequence index.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// An unquoted scalar YAML 1.1 reads as `value` (not the string `text`): at `steps`, or the
/// key at the end of `steps` when `key`.
#[derive(Clone, Debug)]
struct Reread {
    steps: Vec<Step>,
    path: String,
    text: String,
    value: serde_yaml::Value,
    key: bool,
}

/// Positions of every node of every document, by path (`spec.parts[1].commands[0]`), and of
/// every mapping key (for unknown fields, which are the key's fault).
pub struct Positions {
    documents: Vec<BTreeMap<String, Node>>,
    keys: Vec<BTreeMap<String, Marker>>,
    starts: Vec<Marker>,
    /// The unquoted scalars of each document YAML 1.1 reads as another value than YAML 1.2.
    rereads: Vec<Vec<Reread>>,
    /// Of those, the fields `reread_as_yaml_1_1` found (and set where YAML 1.2 read them
    /// otherwise): the unquoted text and the value.
    changed: Vec<BTreeMap<String, (String, serde_yaml::Value)>>,
}

struct Collector {
    documents: Vec<BTreeMap<String, Node>>,
    keys: Vec<BTreeMap<String, Marker>>,
    starts: Vec<Marker>,
    rereads: Vec<Vec<Reread>>,
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

    /// The way to the current node.
    fn steps(&self) -> Vec<Step> {
        self.stack
            .iter()
            .map(|(_, container)| match container {
                Container::Mapping { key } => Step::Key(key.clone().unwrap_or_default()),
                Container::Sequence { index } => Step::Index(*index),
            })
            .collect()
    }

    /// Notes a plain scalar (the current node, or the key just read) that YAML 1.1 reads as
    /// another value than a string.
    fn note_yaml_1_1(&mut self, text: &str, key: bool) {
        let Some(value) = yaml11::resolve_plain(text) else {
            return;
        };
        let reread = Reread {
            steps: self.steps(),
            path: self.path(),
            text: text.to_owned(),
            value,
            key,
        };
        if let Some(rereads) = self.rereads.last_mut() {
            rereads.push(reread);
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
                self.keys.push(BTreeMap::new());
                self.starts.push(mark);
                self.rereads.push(Vec::new());
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
                let plain = style == TScalarStyle::Plain;
                if let Some((_, Container::Mapping { key: key @ None })) = self.stack.last_mut() {
                    *key = Some(value.clone());
                    let path = self.path();
                    if let Some(keys) = self.keys.last_mut() {
                        keys.entry(path).or_insert(mark);
                    }
                    if plain {
                        self.note_yaml_1_1(&value, true);
                    }
                } else {
                    if plain && !self.stack.is_empty() {
                        self.note_yaml_1_1(&value, false);
                    }
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

/// The node at `steps` of `document`.
fn node_mut<'a>(
    document: &'a mut serde_yaml::Value,
    steps: &[Step],
) -> Option<&'a mut serde_yaml::Value> {
    steps.iter().try_fold(document, |node, step| match step {
        Step::Key(key) => node.get_mut(key.as_str()),
        Step::Index(index) => node.get_mut(*index),
    })
}

/// Sets the node of `r` to its YAML 1.1 value when serde_yaml read it as something else; the
/// field's path.
fn set_value(document: &mut serde_yaml::Value, r: &Reread) -> Option<String> {
    let node = node_mut(document, &r.steps)?;
    if *node != r.value {
        *node = r.value.clone();
    }
    // Kept even when YAML 1.2 agreed (`0o600`): a problem there still needs the quotes.
    Some(r.path.clone())
}

/// Renames the key of `r` to the text sigs.k8s.io/yaml gives a non-string key (a boolean's
/// `true`/`false`, an integer's decimal digits); the new field's path when it did.
fn rename_key(document: &mut serde_yaml::Value, r: &Reread) -> Option<String> {
    let (Step::Key(old), parent) = r.steps.split_last()? else {
        return None;
    };
    let new = match &r.value {
        serde_yaml::Value::Bool(b) => b.to_string(),
        serde_yaml::Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        _ => return None,
    };
    let mapping = node_mut(document, parent)?.as_mapping_mut()?;
    let value = mapping.remove(old.as_str())?;
    mapping.insert(serde_yaml::Value::String(new.clone()), value);
    let path = match r.path.rsplit_once('.') {
        Some((base, _)) => format!("{base}.{new}"),
        None => new,
    };
    Some(path)
}

impl Positions {
    /// Locates the nodes of `text` (the whole file, all documents). Text yaml-rust2 cannot read
    /// yields no positions (serde_yaml, which read the objects, is the judge of validity).
    pub fn new(text: &str) -> Positions {
        let mut collector = Collector {
            documents: Vec::new(),
            keys: Vec::new(),
            starts: Vec::new(),
            rereads: Vec::new(),
            nulls: Vec::new(),
            stack: Vec::new(),
        };
        let _ = Parser::new_from_str(text).load(&mut collector, true);
        // serde_yaml skips null documents; number the rest as YamlFile does.
        let mut documents = Vec::new();
        let mut keys = Vec::new();
        let mut starts = Vec::new();
        let mut rereads = Vec::new();
        for ((((doc, doc_keys), start), doc_rereads), null) in collector
            .documents
            .into_iter()
            .zip(collector.keys)
            .zip(collector.starts)
            .zip(collector.rereads)
            .zip(collector.nulls)
        {
            if !null && !doc.is_empty() {
                documents.push(doc);
                keys.push(doc_keys);
                starts.push(start);
                rereads.push(doc_rereads);
            }
        }
        Positions {
            documents,
            keys,
            starts,
            rereads,
            changed: Vec::new(),
        }
    }

    /// Sets every unquoted scalar of `documents` that YAML 1.1 reads differently to what
    /// `kubectl apply` sends: the value, or for a mapping key its JSON text (`on:` is `"true"`).
    pub fn reread_as_yaml_1_1(&mut self, documents: &mut [serde_yaml::Value]) {
        self.changed = vec![BTreeMap::new(); documents.len()];
        for ((document, rereads), changed) in documents
            .iter_mut()
            .zip(&self.rereads)
            .zip(&mut self.changed)
        {
            for r in rereads {
                let applied = if r.key {
                    rename_key(document, r)
                } else {
                    set_value(document, r)
                };
                if let Some(path) = applied {
                    changed.insert(path, (r.text.clone(), r.value.clone()));
                }
            }
        }
    }

    /// The line document `document` starts at (its `---`, or its first line).
    pub fn start_line(&self, document: usize) -> usize {
        self.starts.get(document).map_or(1, |m| m.line().max(1))
    }

    /// The unquoted text of `field` of document `document` and the value YAML 1.1 reads it as,
    /// when that is not the text.
    pub fn reread(&self, document: usize, field: &str) -> Option<(&str, &serde_yaml::Value)> {
        let (text, value) = self.changed.get(document)?.get(field)?;
        Some((text, value))
    }

    /// The file line and column of the key of `field` (a mapping entry) in document
    /// `document`; the field's value, or its nearest enclosing field, when the key is unknown.
    pub fn locate_key(&self, document: usize, field: &str) -> (usize, usize) {
        match self.keys.get(document).and_then(|k| k.get(field)) {
            Some(mark) => (mark.line(), mark.col() + 1),
            None => self.locate(document, field, None),
        }
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
