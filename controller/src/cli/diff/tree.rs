//! The two sides of `bootplate diff`: each a file or a directory, read as `bootplate lint` reads
//! them, and the objects of both paired by kind, namespace and name.

use std::path::Path;

use serde::Serialize;

use super::super::diagnostic::Diagnostic;
use super::super::input::{CONFIG_KINDS, InputError, ReadError, TEMPLATE_KINDS, YamlFile, kind};
use super::super::objects::name_of;

/// The files of one side.
pub struct Side {
    pub files: Vec<YamlFile>,
    /// Whether the side was given as one file (not a directory).
    pub single_file: bool,
}

/// What could not be read: input errors and located problems.
#[derive(Default)]
pub struct Unreadable {
    pub errors: Vec<InputError>,
    pub problems: Vec<Diagnostic>,
}

impl Unreadable {
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty() && self.problems.is_empty()
    }
}

/// Reads `path`: a file, or with a directory its manifests (with `recursive`, its
/// subdirectories' too).
pub fn read(path: &Path, recursive: bool, unreadable: &mut Unreadable) -> Side {
    let (sources, errors) = super::super::sources::expand(&[path.to_owned()], recursive);
    unreadable.errors.extend(errors);
    let single_file = sources.len() == 1 && sources[0].named;
    let mut files = Vec::new();
    for source in sources {
        let read = if source.named {
            super::super::input::read_text(&source.path)
        } else {
            super::super::input::read_walked_text(&source.path)
        };
        let parsed = read
            .map_err(ReadError::Unreadable)
            .and_then(|(shown, text)| YamlFile::parse(shown, text));
        match parsed {
            Ok(file) => files.push(file),
            Err(ReadError::Unreadable(e)) => unreadable.errors.push(e),
            Err(ReadError::Problems(found)) => unreadable.problems.extend(found),
        }
    }
    Side { files, single_file }
}

/// An object of a side: kind, namespace (as the manifest sets it) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Key {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Where an object is: file and document of its side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub file: usize,
    pub index: usize,
}

/// One object of either side, or both.
#[derive(Clone, Debug)]
pub struct Pairing {
    pub old: Option<(Key, At)>,
    pub new: Option<(Key, At)>,
}

/// The templates and configs of `side`, in file order.
fn subjects(side: &Side) -> Vec<(Key, At)> {
    let mut found = Vec::new();
    for (file, f) in side.files.iter().enumerate() {
        for (index, document) in f.documents.iter().enumerate() {
            let kind = kind(document);
            if TEMPLATE_KINDS.contains(&kind) || CONFIG_KINDS.contains(&kind) {
                let (namespace, name) = name_of(document);
                let key = Key {
                    kind: kind.to_owned(),
                    namespace: namespace.map(str::to_owned),
                    name: name.to_owned(),
                };
                found.push((key, At { file, index }));
            }
        }
    }
    found
}

/// The objects of both sides paired by kind, namespace and name (the new side's order, then
/// what only the old side has). When both sides are single files, the one object of a kind
/// left unpaired on each side are paired whatever their names: a template or config template
/// published under a new name per revision (`workers-v2`) is still the next revision of the
/// old one.
pub fn pair(old: &Side, new: &Side) -> Vec<Pairing> {
    let (old_subjects, new_subjects) = (subjects(old), subjects(new));
    let mut pairs: Vec<Pairing> = (new_subjects.iter())
        .map(|n| Pairing {
            old: old_subjects.iter().find(|o| o.0 == n.0).cloned(),
            new: Some(n.clone()),
        })
        .collect();
    let mut removed: Vec<(Key, At)> = (old_subjects.into_iter())
        .filter(|o| !new_subjects.iter().any(|n| n.0 == o.0))
        .collect();
    if old.single_file && new.single_file {
        pair_renamed(&mut pairs, &mut removed);
    }
    pairs.extend(removed.into_iter().map(|o| Pairing {
        old: Some(o),
        new: None,
    }));
    pairs
}

/// Pairs each object of a kind that the new side alone has exactly one of with the one object
/// of that kind the old side alone has, when there is exactly one.
fn pair_renamed(pairs: &mut [Pairing], removed: &mut Vec<(Key, At)>) {
    let added: Vec<String> = (pairs.iter())
        .filter(|p| p.old.is_none())
        .filter_map(|p| p.new.as_ref().map(|n| n.0.kind.clone()))
        .collect();
    for pairing in pairs.iter_mut().filter(|p| p.old.is_none()) {
        let Some((key, _)) = &pairing.new else {
            continue;
        };
        let of_kind: Vec<usize> = (removed.iter().enumerate())
            .filter(|(_, o)| o.0.kind == key.kind)
            .map(|(i, _)| i)
            .collect();
        if added.iter().filter(|k| **k == key.kind).count() == 1 && of_kind.len() == 1 {
            pairing.old = Some(removed.remove(of_kind[0]));
        }
    }
}
