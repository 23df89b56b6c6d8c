//! Lint: everything `compile` checks, plus static checks of the names templates read, plus a
//! sample render for every role (which also runs the format checks).

use std::collections::BTreeSet;

use crd_types::{BootplateConfigSpec, Role, TemplateSpec};

use crate::error::{Problem, Severity};
use crate::{CompiledTemplate, sample_context};

/// The top-level names of the render context.
const ROOTS: [&str; 8] = [
    "cluster",
    "machine",
    "join",
    "certs",
    "values",
    "files",
    "preCommands",
    "postCommands",
];

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
    problems
}

pub(crate) fn lint_compiled(
    t: &CompiledTemplate,
    config: Option<&BootplateConfigSpec>,
) -> Vec<Problem> {
    let mut problems = static_checks(t);
    let config = match config {
        Some(c) => c.clone(),
        None => match t.declarations.sample_variables() {
            Ok(variables) => BootplateConfigSpec {
                variables,
                ..Default::default()
            },
            Err(name) => {
                let index = t
                    .declarations
                    .list
                    .iter()
                    .position(|d| d.decl.name == name)
                    .unwrap_or(0);
                problems.push(
                    Problem::template(
                        format!("spec.variables[{index}]"),
                        format!(
                            "required variable `{name}` has no default and lint cannot make up a value that fits its schema, so the sample renders were skipped (give lint a config with a value)"
                        ),
                    )
                    .warning(),
                );
                return problems;
            }
        },
    };
    let mut found: Vec<(Problem, Vec<Role>)> = Vec::new();
    for role in Role::ALL {
        let Err(e) = t.render(&config, &sample_context(role)) else {
            continue;
        };
        for p in e.problems() {
            match found.iter_mut().find(|(q, _)| *q == p) {
                Some((_, roles)) => roles.push(role),
                None => found.push((p, vec![role])),
            }
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

/// Names read from the root context must exist, `values.X` must be declared, and declared
/// variables should be read somewhere.
fn static_checks(t: &CompiledTemplate) -> Vec<Problem> {
    let mut problems = Vec::new();
    let declared: BTreeSet<&str> = t
        .declarations
        .list
        .iter()
        .map(|d| d.decl.name.as_str())
        .collect();
    let mut mentioned: BTreeSet<String> = BTreeSet::new();
    let mut whole_values = false;
    for (field, uses) in t.engine.uses() {
        for u in uses {
            let segments = segments(&u.path);
            mentioned.extend(segments.iter().cloned());
            let (rooted, rest) = match segments.first().map(String::as_str) {
                Some("@root") => (true, &segments[1..]),
                _ => (!u.scoped, &segments[..]),
            };
            if !rooted
                || u.path.starts_with("..")
                || u.path.starts_with('@') && !u.path.starts_with("@root")
            {
                if segments.iter().any(|s| s == "values")
                    && segments.last().is_some_and(|s| s == "values")
                {
                    whole_values = true;
                }
                continue;
            }
            let Some(root) = rest.first() else { continue };
            if !ROOTS.contains(&root.as_str()) {
                problems.push(
                    Problem::template(
                        &field,
                        format!(
                            "unknown name `{}` (the render context has {})",
                            crate::engine::truncate(root, 64),
                            ROOTS.join(", ")
                        ),
                    )
                    .at(u.position),
                );
                continue;
            }
            if root == "values" {
                match rest.get(1) {
                    None => whole_values = true,
                    Some(name) if !declared.contains(name.as_str()) => problems.push(
                        Problem::template(
                            &field,
                            format!(
                                "`values.{}` is not declared in spec.variables",
                                crate::engine::truncate(name, 64)
                            ),
                        )
                        .at(u.position),
                    ),
                    Some(_) => {}
                }
            }
        }
    }
    // The tree walk visits elements in no particular order; report them as they appear.
    problems.sort_by(|a, b| (&a.field, a.position).cmp(&(&b.field, b.position)));
    if !whole_values {
        for (i, d) in t.declarations.list.iter().enumerate() {
            if !mentioned.contains(&d.decl.name) {
                let mut p = Problem::template(
                    format!("spec.variables[{i}]"),
                    format!(
                        "variable `{}` is declared but no template reads it",
                        d.decl.name
                    ),
                );
                p.severity = Severity::Warning;
                problems.push(p);
            }
        }
    }
    problems
}

/// `this.a.[b c]/d` → `a`, `b c`, `d`; `@root.x` keeps `@root` as its first segment.
fn segments(path: &str) -> Vec<String> {
    let path = path
        .strip_prefix("this.")
        .or_else(|| path.strip_prefix("this/"))
        .or_else(|| path.strip_prefix("./"))
        .unwrap_or(path);
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_brackets = false;
    for c in path.chars() {
        match c {
            '[' if !in_brackets => in_brackets = true,
            ']' if in_brackets => in_brackets = false,
            '.' | '/' if !in_brackets => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    if out.first().is_some_and(|s| s == "this") {
        out.remove(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments() {
        assert_eq!(segments("values.a"), ["values", "a"]);
        assert_eq!(segments("this.values/[a b].c"), ["values", "a b", "c"]);
        assert_eq!(segments("@root.values.x"), ["@root", "values", "x"]);
        assert_eq!(segments("this"), Vec::<String>::new());
    }
}
