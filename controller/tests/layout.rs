//! The shape of the code: no function in `controller/src` over 80 lines, and no import cycle in
//! `controller/src`, `render/src` or `crd-types/src`, neither between modules (each module's
//! file or `mod.rs`) nor between top-level modules. See docs/architecture.md.
//!
//! Both read the source as text with a small lexer that skips comments, strings and character
//! literals; that is enough for this code base's style (rustfmt-formatted).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest function body allowed, in lines from `fn` to its closing brace.
const LONGEST_FUNCTION: usize = 80;

fn source_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            files.extend(source_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// `text` with comments, string and character literals blanked out (newlines kept), so that
/// braces and paths in them do not count.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            loop {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && is_raw_start(&chars, i) {
            let mut hashes = 0;
            i += 1;
            while chars[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            loop {
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while chars[i] != '\'' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_raw_start(chars: &[char], i: usize) -> bool {
    let ident_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    !ident_before && chars.get(j) == Some(&'"')
}

/// A `'` opening a character literal rather than a lifetime or label.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    matches!(
        (chars.get(i + 1), chars.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

/// Each function of `code` (already [`code_only`]) with its first line and length in lines.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let mut depth = 0i32;
        let mut opened = false;
        'scan: for (offset, body_line) in lines[start..].iter().enumerate() {
            for c in body_line.chars() {
                match c {
                    ';' if !opened && depth == 0 => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            found.push((name.clone(), start + 1, offset + 1));
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    found
}

fn fn_name(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let qualifiers = [
        "pub",
        "pub(crate)",
        "pub(super)",
        "async",
        "const",
        "unsafe",
        "extern",
    ];
    if !words[..at].iter().all(|w| qualifiers.contains(w)) {
        return None;
    }
    let name = words.get(at + 1)?;
    Some(name.split(['(', '<']).next()?.to_owned())
}

#[test]
fn no_function_in_controller_src_is_over_80_lines() {
    let mut long = Vec::new();
    for file in source_files(&src()) {
        let code = code_only(&std::fs::read_to_string(&file).expect("readable source"));
        for (name, line, length) in functions(&code) {
            if length > LONGEST_FUNCTION {
                let path = file.strip_prefix(src()).unwrap_or(&file).display();
                long.push(format!("src/{path}:{line}: fn {name} is {length} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_counter_counts_bodies_not_strings_or_declarations() {
    let code = code_only(
        "fn a() {\n    let s = \"}}\"; // }\n    let c = '}';\n}\ntrait T {\n    fn b(&self);\n}\npub(crate) async fn c<'x>(v: &'x str) {\n    let r = r#\"{\"#;\n}\n",
    );
    assert_eq!(
        functions(&code),
        vec![("a".to_owned(), 1, 4), ("c".to_owned(), 8, 3)]
    );
}

/// The module a source file is: `reconcile::config` for `reconcile/config.rs`, `k8s` for
/// `k8s/mod.rs`.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).expect("under the crate's src");
    let mut parts: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// The modules `code` of module `module` refers to through `crate::` and `super::` paths,
/// resolved to the longest prefix that is a module of `modules`.
fn references(
    module: &[String],
    code: &str,
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let mut tokens: Vec<String> = Vec::new();
    // `use a::{b, c::{d}}` names a::b and a::c::d; other paths are written out in full.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let statement = &rest[at + 4..];
        let end = statement.find(';').unwrap_or(statement.len());
        // Only the keyword, not the end of a word such as `because`.
        let keyword = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || "{};".contains(c));
        if keyword {
            tokens.extend(expand_use(&compact(&statement[..end])));
        }
        rest = &statement[end..];
    }
    tokens.extend(
        code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .filter(|t| t.contains("::"))
            .map(str::to_owned),
    );
    for token in &tokens {
        let mut segments: Vec<&str> = token.split("::").filter(|s| !s.is_empty()).collect();
        let mut path: Vec<String> = match segments.first() {
            Some(&"crate") => {
                segments.remove(0);
                Vec::new()
            }
            Some(&"super") => {
                // In `a/b.rs` (module a::b) `super` is `a`; in `a/b/mod.rs` too.
                let mut base = module.to_vec();
                while segments.first() == Some(&"super") {
                    segments.remove(0);
                    base.pop();
                }
                base
            }
            _ => continue,
        };
        let mut target = None;
        for segment in segments {
            path.push(segment.to_owned());
            if modules.contains(&path) {
                target = Some(path.clone());
            }
        }
        if let Some(target) = target.filter(|t| t.as_slice() != module) {
            found.insert(target);
        }
    }
    found
}

/// `tree` with single spaces, none around `::`, braces and commas (`as` keeps its spaces).
fn compact(tree: &str) -> String {
    let single = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    for (i, c) in single.char_indices() {
        let neighbours = [
            single[..i].chars().next_back(),
            single[i + 1..].chars().next(),
        ];
        let next_to_punctuation = neighbours.iter().flatten().any(|n| "{},:".contains(*n));
        if !(c == ' ' && next_to_punctuation) {
            out.push(c);
        }
    }
    out
}

/// The paths a `use` tree (without spaces) names: `a::{b,c::{d,e as f}}` gives `a::b`,
/// `a::c::d` and `a::c::e`.
fn expand_use(tree: &str) -> Vec<String> {
    let close = tree.rfind('}');
    let Some(open) = tree
        .find('{')
        .filter(|open| close.is_some_and(|close| close > *open))
    else {
        return vec![tree.split(" as ").next().unwrap_or(tree).to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..close.unwrap_or(tree.len())];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.is_empty())
        .flat_map(expand_use)
        .map(|path| match path.as_str() {
            "self" => prefix.trim_end_matches("::").to_owned(),
            _ => format!("{prefix}{path}"),
        })
        .collect()
}

#[test]
fn use_trees_expand_to_the_paths_they_name() {
    assert_eq!(
        expand_use(&compact(
            "crate::core::{self, gate::{self, Path as P},\n token}"
        )),
        vec![
            "crate::core",
            "crate::core::gate",
            "crate::core::gate::Path",
            "crate::core::token"
        ]
    );
    assert_eq!(expand_use("super::render"), vec!["super::render"]);
}

#[test]
fn no_import_cycle_between_controller_modules() {
    assert_no_import_cycle(&src());
}

/// The render crate is held to the same rule: its layers (the engine, the body, the formats,
/// the generator protocol) are read one below the other.
#[test]
fn no_import_cycle_between_render_modules() {
    assert_no_import_cycle(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../render/src"));
}

/// The types and their schema are read one below the other too: `config` embeds `network` and
/// `template` types, and neither names `config` back.
#[test]
fn no_import_cycle_between_crd_types_modules() {
    assert_no_import_cycle(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../crd-types/src"));
}

/// No cycle between the crate's files, nor between its top-level modules (`reconcile`, `k8s`,
/// `core`, ...): `reconcile::a` naming `k8s::b` while `k8s::c` names `reconcile::d` is a cycle
/// between the layers although no file names one that names it back.
fn assert_no_import_cycle(root: &Path) {
    let graph = import_graph(root);
    let mut layers: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, refs) in &graph {
        let layer = module.iter().take(1).cloned().collect::<Vec<_>>();
        let entry = layers.entry(layer.clone()).or_default();
        entry.extend(
            refs.iter()
                .map(|r| r.iter().take(1).cloned().collect::<Vec<_>>())
                .filter(|r| *r != layer),
        );
    }
    for (what, graph) in [("modules", &graph), ("top-level modules", &layers)] {
        if let Some(cycle) = find_cycle(graph) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            panic!(
                "import cycle between the {what} of {}: {}",
                root.display(),
                names.join(" -> ")
            );
        }
    }
}

/// Each module of the crate under `root` and the modules it refers to.
fn import_graph(root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = source_files(root);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(root, f)).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let code = code_only(&std::fs::read_to_string(file).expect("readable source"));
        let module = module_of(root, file);
        let refs = references(&module, &code, &modules);
        graph.entry(module).or_default().extend(refs);
    }
    graph
}

fn find_cycle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        marks: &mut BTreeMap<Vec<String>, Mark>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut Vec::new()))
}

#[test]
fn the_cycle_finder_finds_cycles_and_only_them() {
    let module = |name: &str| vec![name.to_owned()];
    let mut graph = BTreeMap::from([
        (module("a"), BTreeSet::from([module("b")])),
        (module("b"), BTreeSet::from([module("c")])),
        (module("c"), BTreeSet::new()),
    ]);
    assert_eq!(find_cycle(&graph), None);
    graph.get_mut(&module("c")).unwrap().insert(module("a"));
    assert_eq!(
        find_cycle(&graph),
        Some(vec![module("a"), module("b"), module("c"), module("a")])
    );
}
