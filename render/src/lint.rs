//! Lint: everything `compile` checks, plus static checks of the names templates read, plus a
//! sample render for every role (which also runs the format checks).

use std::collections::BTreeSet;

use crd_types::{BootplateConfigSpec, OutputFormat, Role, TemplateSpec};

use crate::analysis::{self, Entry, Output};
use crate::error::Problem;
use crate::{CompiledTemplate, machine_shapes, sample_context};

/// Lints `spec` (named `object` in messages): compile problems first; when it compiles, the
/// static checks and a sample render for each role with [`sample_context`]. `config` supplies
/// the sample render's config (variables, files, commands); without one, lint invents a value
/// for each required variable that has no default. Returns every problem, errors and warnings,
/// each with its field and, where known, the line and column in that field's text.
pub fn lint(
    object: &str,
    spec: &TemplateSpec,
    config: Option<&BootplateConfigSpec>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let compiled = CompiledTemplate::compile_collecting(object, spec, &mut problems);
    if problems.is_empty() {
        problems = lint_compiled(&compiled, config);
    }
    if let (OutputFormat::Ignition, Some(text)) = (spec.format, &spec.template) {
        for p in problems.iter_mut() {
            locate_ignition_path(p, text);
        }
    }
    problems
}

/// The output check of a raw Ignition template names a JSON path of the output
/// (`storage.files[0].mode`), and the render cannot tell where in the template's text that is:
/// the problem points at the text's start. Lint looks for the path's keys in the text, in order
/// (an index `[n]` skips to the n+1-th occurrence of the key after it): a raw Ignition template
/// writes its keys literally, so the last one found is the culprit's line. A key a mustache
/// writes is not found, and the problem stays where it was.
fn locate_ignition_path(p: &mut Problem, text: &str) {
    const CHECK: &str = "the output is not a valid Ignition 3.x config: `";
    if p.field != "spec.template" || p.position.is_some() {
        return;
    }
    let Some(path) = p
        .message
        .strip_prefix(CHECK)
        .and_then(|rest| rest.split('`').next())
    else {
        return;
    };
    let Some(offset) = find_json_path(text, path).filter(|_| !path.is_empty()) else {
        return;
    };
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    p.position = Some(crate::Position {
        line: before.matches('\n').count() + 1,
        column: before[line_start..].chars().count() + 1,
    });
}

/// The byte offset in `text` of the last key of `path` (`a.b[2].c`), found as described at
/// [`locate_ignition_path`].
fn find_json_path(text: &str, path: &str) -> Option<usize> {
    let mut from = 0;
    let mut found = None;
    let mut skip = 0;
    for step in path.split('.') {
        let mut pieces = step.split('[');
        let key = pieces.next()?;
        let index = pieces.next_back();
        let needle = format!("\"{key}\"");
        for _ in 0..=skip {
            let at = from + text.get(from..)?.find(&needle)?;
            found = Some(at);
            from = at + needle.len();
        }
        skip = index
            .and_then(|i| i.trim_end_matches(']').parse().ok())
            .unwrap_or(0);
    }
    found
}

/// The config of lint's sample renders: `config`, or sample values for the required variables
/// (Err names a variable no value fits).
pub(crate) fn sample_config(
    t: &CompiledTemplate,
    config: Option<&BootplateConfigSpec>,
) -> Result<BootplateConfigSpec, String> {
    match config {
        Some(c) => Ok(c.clone()),
        None => t
            .declarations
            .sample_variables()
            .map(|variables| BootplateConfigSpec {
                variables,
                ..Default::default()
            }),
    }
}

pub(crate) fn lint_compiled(
    t: &CompiledTemplate,
    config: Option<&BootplateConfigSpec>,
) -> Vec<Problem> {
    let mut problems = static_checks(t);
    let config = match sample_config(t, config) {
        Ok(config) => config,
        Err(name) => {
            let index = t
                .declarations
                .list
                .iter()
                .position(|d| d.decl.name == name)
                .unwrap_or(0);
            problems.push(
                    Problem::template(
                        format!("spec.variables[{index}].schema"),
                        format!(
                            "required variable `{name}` has no default and no value fits its schema (its type, pattern, length and range contradict each other), so no config can set it"
                        ),
                    )
                    .with_code("unsatisfiable-variable"),
                );
            return problems;
        }
    };
    let mut found: Vec<(Problem, Vec<Role>)> = Vec::new();
    for role in Role::ALL {
        if let Err(e) = t.render(&config, &sample_context(role)) {
            note(&mut found, e.problems(), role);
        }
    }
    // The other machine shapes once the template is otherwise clean: their failures would
    // mostly repeat what is reported already.
    let clean = found.is_empty()
        && !problems
            .iter()
            .any(|p| p.severity == crate::Severity::Error);
    if clean {
        for role in Role::ALL {
            for (shape, ctx) in machine_shapes(role) {
                if let Err(e) = t.render(&config, &ctx) {
                    let shaped = e.problems().into_iter().map(|p| for_shape(p, shape));
                    note(&mut found, shaped.collect(), role);
                }
            }
        }
    }
    // A name the analysis refused fails the sample render at the same spot: say it once.
    found.retain(|(p, _)| {
        !problems.iter().any(|q| {
            q.severity == crate::Severity::Error && q.field == p.field && q.position == p.position
        })
    });
    for (p, roles) in &mut found {
        if p.code == "output-too-large" && p.field == "spec" {
            largest_texts(p, t, &config, roles[0]);
        }
    }
    for (mut p, roles) in found {
        if roles.len() == Role::ALL.len() {
            problems.push(p);
        } else {
            for role in roles {
                p.role = Some(role);
                problems.push(p.clone());
            }
        }
    }
    problems
}

/// An output too large for its limit, said at `spec` (the template's first line) with no way
/// out: moved to the text that writes the most, with the largest texts named and, where the
/// format allows it, `compression: gzip` suggested.
fn largest_texts(p: &mut Problem, t: &CompiledTemplate, config: &BootplateConfigSpec, role: Role) {
    let mut sizes: std::collections::BTreeMap<String, u64> =
        t.literal_sizes().into_iter().collect();
    sizes.extend(t.text_sizes(config, &sample_context(role)));
    let mut sizes: Vec<(String, u64)> = sizes.into_iter().filter(|(_, n)| *n > 0).collect();
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let Some((largest, _)) = sizes.first() else {
        return;
    };
    p.field = largest.clone();
    let named: Vec<String> = sizes
        .iter()
        .take(3)
        .map(|(field, n)| format!("{field} ({n} bytes)"))
        .collect();
    p.message = format!(
        "{}; the texts that write the most: {}",
        p.message,
        named.join(", ")
    );
    if t.format != OutputFormat::Ignition && t.compression != crd_types::Compression::Gzip {
        p.message.push_str(
            "; `compression: gzip` compresses the output (the limit then applies to the compressed bytes)",
        );
    }
}

/// Adds `problems`, found rendering for `role`, to `found` (one entry per problem, with the
/// roles it was found for).
fn note(found: &mut Vec<(Problem, Vec<Role>)>, problems: Vec<Problem>, role: Role) {
    for p in problems {
        match found.iter_mut().find(|(q, _)| *q == p) {
            Some((_, roles)) => roles.push(role),
            None => found.push((p, vec![role])),
        }
    }
}

/// A problem of a render for one of the [`machine_shapes`]: a warning that says which (the
/// sample render passed; `--strict` makes it an error, so that a template clean with
/// `--strict` renders on every Machine the contract allows).
fn for_shape(mut p: Problem, shape: &str) -> Problem {
    p.message = format!("{} (rendering for {shape})", p.message);
    p.severity = crate::Severity::Warning;
    p.code = "machine-shape";
    p
}

/// The whole-template analysis (see `analysis.rs`) of every text, and a warning for each
/// declared variable no text reads and each partial no text includes.
fn static_checks(t: &CompiledTemplate) -> Vec<Problem> {
    let parts: &[crate::body::CompiledPart] = match &t.body {
        crate::Body::Parts(parts) => parts,
        crate::Body::Raw(_) => &[],
    };
    let texts: Vec<(String, String)> = t
        .engine
        .texts()
        .map(|(name, field)| (name.to_owned(), field.to_owned()))
        .collect();
    let entries: Vec<Entry> = texts
        .iter()
        .map(|(name, field)| {
            let (roles, output) = where_text_goes(t.format, parts, field);
            Entry {
                name,
                field,
                roles,
                output,
            }
        })
        .collect();
    let findings = analysis::analyze(&t.engine, &t.declarations, &entries);
    let mut problems = findings.problems;
    if !findings.whole_values {
        for (i, d) in t.declarations.list.iter().enumerate() {
            if !findings.read.contains(&d.decl.name) {
                problems.push(
                    Problem::template(
                        format!("spec.variables[{i}]"),
                        format!(
                            "variable `{}` is declared but no template reads it",
                            d.decl.name
                        ),
                    )
                    .warning()
                    .with_code("unused-variable"),
                );
            }
        }
    }
    let included: BTreeSet<String> = t.engine.uses_of_partials().into_iter().collect();
    for name in t.engine.partial_names() {
        if !included.contains(name) {
            problems.push(
                Problem::template(
                    format!("spec.partials.{name}"),
                    format!(
                        "partial `{name}` is never included (include it with {{{{> {name}}}}})"
                    ),
                )
                .warning()
                .with_code("unused-partial"),
            );
        }
    }
    problems
}

/// The roles a text renders for and what its output is read as, from its field.
fn where_text_goes<'a>(
    format: OutputFormat,
    parts: &'a [crate::body::CompiledPart],
    field: &str,
) -> (&'a [Role], Output) {
    let Some(rest) = field.strip_prefix("spec.parts[") else {
        let output = match format {
            OutputFormat::CloudConfig => Output::Yaml,
            OutputFormat::Ignition => Output::Json,
            OutputFormat::Script => Output::Shell,
            OutputFormat::MimeMultipart => Output::Other,
        };
        return (&Role::ALL, output);
    };
    let index = |s: &str| s.split(']').next().and_then(|n| n.parse::<usize>().ok());
    let Some(part) = index(rest).and_then(|i| parts.get(i)) else {
        return (&Role::ALL, Output::Other);
    };
    let roles = part.roles();
    let inner = rest.split_once("].").map_or("", |(_, r)| r);
    let output = if inner.starts_with("commands[") {
        Output::Shell
    } else if inner.starts_with("units[") && inner.ends_with("content") {
        Output::Unit
    } else if let Some(file) = inner.strip_prefix("files[")
        && file.ends_with("].content")
    {
        let path = index(file)
            .and_then(|j| part.literal_file_path(j))
            .unwrap_or("");
        if crate::files::is_systemd_path(path) {
            return (roles, Output::Unit);
        }
        match path.rsplit('.').next() {
            Some("sh") => Output::Shell,
            Some("yaml" | "yml") => Output::Yaml,
            Some("json") => Output::Json,
            _ => Output::Other,
        }
    } else {
        Output::Other
    };
    (roles, output)
}
