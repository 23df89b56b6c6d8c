//! Lint: everything `compile` checks, plus static checks of the names templates read, plus a
//! sample render for every role (which also runs the format checks).

use std::collections::BTreeSet;

use crd_types::conditions::reason;
use crd_types::{BootplateConfigSpec, OutputFormat, Role, TemplateSpec};

use crate::analysis::{self, Entry, Output};
use crate::error::Problem;
use crate::user_data::UserDataLimit;
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
    problems.extend(crate::lint_windows::check(spec));
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
    let roles = lint_roles(t.format);
    for &role in roles {
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
        for &role in roles {
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
        if roles.len() == lint_roles(t.format).len() {
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

/// The roles lint renders samples for: a Windows format renders workers only (the others are
/// refused by design, not by the template).
fn lint_roles(format: OutputFormat) -> &'static [Role] {
    if format.is_windows() {
        &[Role::Worker]
    } else {
        &Role::ALL
    }
}

/// The sample renders (with `config`, or sample values) of every role measured against a
/// cloud's user-data cap: one error per role over it, at the text that writes the most, with
/// the largest texts named and, where the format allows it, compression suggested. Empty when
/// the template does not render (its own problems say why).
pub fn user_data_problems(
    t: &CompiledTemplate,
    config: Option<&BootplateConfigSpec>,
    limit: &UserDataLimit,
) -> Vec<Problem> {
    let Ok(config) = sample_config(t, config) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for role in Role::ALL {
        if t.fetches(&config, role) {
            // The data Secret holds the stub: that is what the cloud's limit applies to.
            problems.extend(stub_problem(t, &config, role, limit));
            continue;
        }
        let Ok(rendered) = t.render(&config, &sample_context(role)) else {
            continue;
        };
        let Some(size) = limit.exceeded_by(&rendered.data) else {
            continue;
        };
        let mut p = Problem::template(
            "spec",
            format!("the {role} render is {size} bytes, over {limit}"),
        )
        .with_reason(reason::OUTPUT_TOO_LARGE)
        .with_code("user-data-too-large");
        p.role = Some(role);
        let template_largest = largest_texts(&mut p, t, &config, role);
        if let Some((field, n)) = largest_config_file(&config)
            && n > template_largest
        {
            // The config's own file is what makes the render too large: say it at the config.
            p.origin = crate::Origin::Config;
            p.message = format!("{}; the config's {field} alone is {n} bytes", p.message);
            p.field = field;
            p.position = None;
        }
        p.message.push_str(&fetch_way_out(t, role));
        problems.push(p);
    }
    problems
}

/// The fetch stub of `role` over `limit`, said at `spec.delivery`: the stub is the user-data
/// of a machine that fetches (its size mostly the endpoint's and the keys', not the template's).
fn stub_problem(
    t: &CompiledTemplate,
    config: &BootplateConfigSpec,
    role: Role,
    limit: &UserDataLimit,
) -> Option<Problem> {
    let rendered = t
        .render(config, &crate::sample_fetching_context(role))
        .ok()?;
    let size = limit.exceeded_by(&rendered.data)?;
    let mut p = Problem::template(
        "spec.delivery",
        format!("the {role} fetch stub (its user-data with `delivery: Fetch`) is {size} bytes, over {limit}"),
    )
    .with_reason(reason::OUTPUT_TOO_LARGE)
    .with_code("user-data-too-large");
    p.role = Some(role);
    if config.delivery.is_some() {
        // The config chose the delivery: say it there.
        p.origin = crate::Origin::Config;
        p.position = None;
    }
    Some(p)
}

/// The way out of a user-data cap that fetch delivery gives, for the roles it applies to.
fn fetch_way_out(t: &CompiledTemplate, role: Role) -> String {
    match role {
        Role::Init => {
            "; an `init` render always travels whole (it has no workload apiserver to fetch from)"
                .into()
        }
        _ if t.is_structured() => format!(
            "; `delivery: Fetch` leaves only a stub of at most {} bytes in the user-data (docs/boot-channel.md)",
            crate::fetch::STUB_LIMIT
        ),
        _ => "; `delivery: Fetch` needs a structured template (spec.parts)".into(),
    }
}

/// An output too large for its limit, said at `spec` (the template's first line) with no way
/// out: moved to the text that writes the most, with the largest texts named and, where the
/// format allows it, `compression: gzip` suggested.
/// The config's largest inline file: its field and size.
fn largest_config_file(config: &BootplateConfigSpec) -> Option<(String, u64)> {
    config
        .files
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            Some((
                format!("spec.files[{i}].content"),
                f.content.as_ref()?.len() as u64,
            ))
        })
        .max_by_key(|(_, n)| *n)
}

/// Returns the largest text's size (0 when no text writes anything).
fn largest_texts(
    p: &mut Problem,
    t: &CompiledTemplate,
    config: &BootplateConfigSpec,
    role: Role,
) -> u64 {
    let mut sizes: std::collections::BTreeMap<String, u64> =
        t.literal_sizes().into_iter().collect();
    sizes.extend(t.text_sizes(config, &sample_context(role)));
    let mut sizes: Vec<(String, u64)> = sizes.into_iter().filter(|(_, n)| *n > 0).collect();
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let Some((largest, largest_size)) = sizes.first().cloned() else {
        return 0;
    };
    p.field = largest;
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
    largest_size
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

/// The analysis of every text of `t` (see `analysis.rs`).
pub(crate) fn analyze(t: &CompiledTemplate) -> analysis::Findings {
    let parts: &[crate::body::CompiledPart] = match &t.body {
        crate::Body::Parts(parts) | crate::Body::Raw(_, parts) => parts,
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
    analysis::analyze(&t.engine, &t.declarations, &entries)
}

/// The fields of the network input (as `NetworkConfig` names them) that `read` (the analysis'
/// `network_read`) leaves unread: a config's value for them would be ignored.
pub(crate) fn unread_network_fields(read: &BTreeSet<String>) -> Vec<&'static str> {
    if read.contains("*") {
        return Vec::new();
    }
    NETWORK_FIELDS
        .iter()
        .filter(|(_, names)| !names.iter().any(|n| read.contains(*n)))
        .map(|(input, _)| *input)
        .collect()
}

/// The whole-template analysis (see `analysis.rs`) of every text, and a warning for each
/// declared variable no text reads and each partial no text includes.
fn static_checks(t: &CompiledTemplate) -> Vec<Problem> {
    let findings = analyze(t);
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
    problems.extend(network_ignored(t.network.is_some(), &findings.network_read));
    if t.delivery == crd_types::Delivery::Fetch {
        problems.push(
            Problem::template(
                "spec.delivery",
                "delivery: Fetch: machines of role `init` (and MachinePools) still get the whole render as user-data; an `init` machine has no workload apiserver to fetch from before it starts one",
            )
            .warning()
            .with_code("fetch-init-inline"),
        );
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

/// The fields of the network input, each with the context names that write it out.
const NETWORK_FIELDS: [(&str, &[&str]); 6] = [
    ("registryMirrors", &["registryMirrors"]),
    ("proxy", &["proxy"]),
    ("caBundles", &["caBundles", "caBundle"]),
    ("ntpServers", &["ntpServers"]),
    ("imageRepository", &["imageRepository"]),
    ("artifacts", &["artifacts", "artifact"]),
];

/// A warning for each field of the network input that a template taking the input (it sets
/// defaults or reads `network`) never reads: a config that sets it would see it ignored.
fn network_ignored(has_defaults: bool, read: &BTreeSet<String>) -> Vec<Problem> {
    if (!has_defaults && read.is_empty()) || read.contains("*") {
        return Vec::new();
    }
    let field = if has_defaults { "spec.network" } else { "spec" };
    NETWORK_FIELDS
        .iter()
        .filter(|(_, names)| !names.iter().any(|n| read.contains(*n)))
        .map(|(input, names)| {
            Problem::template(
                field,
                format!(
                    "the template takes the network input but never reads `network.{}`: a config's `network.{input}` would be ignored (see docs/air-gapped.md)",
                    names[0]
                ),
            )
            .warning()
            .with_code("network-ignored")
        })
        .collect()
}

/// The roles a text renders for and what its output is read as, from its field.
fn where_text_goes<'a>(
    format: OutputFormat,
    parts: &'a [crate::body::CompiledPart],
    field: &str,
) -> (&'a [Role], Output) {
    let Some(rest) = field.strip_prefix("spec.parts[") else {
        let output = match format {
            OutputFormat::CloudConfig | OutputFormat::WindowsCloudConfig => Output::Yaml,
            OutputFormat::Ignition => Output::Json,
            OutputFormat::Script => Output::Shell,
            OutputFormat::MimeMultipart => Output::Other,
            OutputFormat::Powershell | OutputFormat::PowershellAws => Output::PowerShell,
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
        if format.is_windows() {
            Output::PowerShell
        } else {
            Output::Shell
        }
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
            Some("ps1") => Output::PowerShell,
            Some("yaml" | "yml") => Output::Yaml,
            Some("json") => Output::Json,
            _ => Output::Other,
        }
    } else {
        Output::Other
    };
    (roles, output)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script template whose one command is `text`, with `network` defaults when given.
    fn template(text: &str, network: Option<&str>) -> TemplateSpec {
        let defaults = network.map_or(String::new(), |n| format!("network: {n}\n"));
        let yaml = format!(
            "os: {{name: linux}}\nformat: script\n{defaults}parts:\n- name: p\n  commands:\n  - {}\n",
            serde_json::to_string(text).unwrap()
        );
        serde_yaml::from_str(&yaml).unwrap()
    }

    /// Each case: a template's command text, its network defaults, and the network fields lint
    /// calls ignored (and on which field), in order.
    #[test]
    fn a_template_that_takes_the_network_input_but_ignores_part_of_it_is_warned() {
        let reads = [
            "{{#each network.registryMirrors}}{{hostsToml}}{{/each}}",
            "{{shell_quote network.proxy.http}}",
            "{{network.caBundle}}",
            "{{#each network.ntpServers}}{{this}}{{/each}}",
            "{{network.imageRepository}}",
            "{{shell_quote network.artifact.kubeadm.url}}",
        ];
        let all = reads.join(" ");
        let everything_but = |gone: &str| {
            let kept: Vec<&str> = reads
                .iter()
                .copied()
                .filter(|t| !t.contains(gone))
                .collect();
            kept.join(" ")
        };
        let cases: Vec<(String, Option<&str>, &str, Vec<&str>)> = vec![
            ("echo no network".into(), None, "spec", vec![]),
            (all.clone(), None, "spec", vec![]),
            (
                all.clone(),
                Some("{ntpServers: [ntp.corp]}"),
                "spec.network",
                vec![],
            ),
            ("{{json network}}".into(), None, "spec", vec![]),
            (
                "{{#each network.caBundles}}{{pem}}{{/each}}".into(),
                None,
                "spec",
                vec![
                    "registryMirrors",
                    "proxy",
                    "ntpServers",
                    "imageRepository",
                    "artifacts",
                ],
            ),
            (
                "echo defaults only".into(),
                Some("{imageRepository: m.corp/k8s}"),
                "spec.network",
                vec![
                    "registryMirrors",
                    "proxy",
                    "caBundles",
                    "ntpServers",
                    "imageRepository",
                    "artifacts",
                ],
            ),
            (everything_but("proxy"), None, "spec", vec!["proxy"]),
            (everything_but("artifact"), None, "spec", vec!["artifacts"]),
            (
                everything_but("registryMirrors"),
                None,
                "spec",
                vec!["registryMirrors"],
            ),
            (
                format!(
                    "{{{{#each network.ntpServers}}}}{{{{@root.network.proxy.noProxyList}}}}{{{{/each}}}} {}",
                    everything_but("proxy")
                ),
                None,
                "spec",
                vec![],
            ),
        ];
        for (text, defaults, field, expected) in cases {
            let problems = lint("BootstrapTemplate t", &template(&text, defaults), None);
            let errors: Vec<_> = problems
                .iter()
                .filter(|p| p.severity == crate::Severity::Error)
                .collect();
            assert!(errors.is_empty(), "{text}: {errors:?}");
            let ignored: Vec<&Problem> = problems
                .iter()
                .filter(|p| p.code == "network-ignored")
                .collect();
            let named: Vec<&str> = ignored
                .iter()
                .map(|p| {
                    p.message
                        .split("`network.")
                        .nth(2)
                        .unwrap()
                        .split('`')
                        .next()
                        .unwrap()
                })
                .collect();
            assert_eq!(named, expected, "{text}: {ignored:?}");
            for p in ignored {
                assert_eq!(
                    (p.field.as_str(), p.severity),
                    (field, crate::Severity::Warning),
                    "{text}"
                );
            }
        }
    }

    /// Each case: a template's command text and the fields of a config's input (proxy, NTP
    /// servers, image repository set) the render ignores: every one set for a template that
    /// takes no network input, the unread ones for a template that reads part of it, none
    /// when `network` is read whole.
    #[test]
    fn the_fields_a_config_sets_and_the_template_never_reads_are_ignored() {
        let input: crd_types::NetworkConfig = serde_json::from_value(serde_json::json!({
            "proxy": {"http": "http://proxy.example:3128"},
            "ntpServers": ["ntp.example"],
            "imageRepository": "mirror.example/k8s",
        }))
        .unwrap();
        let cases: [(&str, &[&str]); 5] = [
            (
                "echo no network",
                &["proxy", "ntpServers", "imageRepository"],
            ),
            (
                "echo {{cluster.network.serviceDomain}}",
                &["proxy", "ntpServers", "imageRepository"],
            ),
            (
                "{{shell_quote network.proxy.http}}",
                &["ntpServers", "imageRepository"],
            ),
            (
                "{{#each network.ntpServers}}{{this}}{{/each}} {{network.imageRepository}} {{network.proxy.enabled}}",
                &[],
            ),
            ("{{json network}}", &[]),
        ];
        for (text, expected) in cases {
            let compiled = CompiledTemplate::compile("t", &template(text, None)).unwrap();
            assert_eq!(compiled.ignored_network_fields(&input), expected, "{text}");
            let empty = crd_types::NetworkConfig::default();
            assert!(compiled.ignored_network_fields(&empty).is_empty(), "{text}");
        }
    }
}
