//! The structured body: parts compiled once, then, for each render, the files, units and
//! commands of the parts that apply to the role (and are not skipped), plus the config's files
//! and commands, in order. The format writers only lay these out.

use crd_types::{BootplateConfigSpec, FileEncoding, Part, PartGenerator, Role, UpdateStrategy};
use handlebars::Context;

use crate::files::{
    File, Unit, check_content, check_path, is_systemd_path, owner, permissions, problem,
    valid_drop_in_name, valid_unit_name,
};
use crate::generator::{Call, Generated};

use crate::engine::{Engine, FieldError, Text};
use crate::error::{Origin, Problem};
use crate::limit::Budget;

/// What one render writes, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Body {
    pub(crate) files: Vec<File>,
    pub(crate) units: Vec<Unit>,
    /// The config's pre-commands, the parts' commands, the config's post-commands.
    pub(crate) commands: Vec<String>,
    /// Who `commands` come from, in order: a part's name (or [`PRE_COMMANDS`] and
    /// [`POST_COMMANDS`] for the config's) and how many commands; the boot reporter names
    /// steps by them.
    pub(crate) command_parts: Vec<(String, usize)>,
}

/// The name boot reports give the config's `preCommands` and `postCommands`.
pub(crate) const PRE_COMMANDS: &str = "preCommands";
pub(crate) const POST_COMMANDS: &str = "postCommands";

impl Body {
    /// Appends `commands` of `part`, remembering where they came from.
    fn add_commands(&mut self, part: &str, commands: impl IntoIterator<Item = String>) {
        let before = self.commands.len();
        self.commands.extend(commands);
        let count = self.commands.len() - before;
        if count > 0 {
            self.command_parts.push((part.to_owned(), count));
        }
    }
}

struct CompiledFile {
    field: String,
    path: Text,
    content: Text,
    permissions: String,
    owner: String,
    encoding: FileEncoding,
}

struct CompiledUnit {
    name: String,
    enable: Option<bool>,
    content: Option<Text>,
    drop_ins: Vec<(String, Text)>,
}

pub(crate) struct CompiledPart {
    pub(crate) name: String,
    /// `spec.parts[i]`.
    field: String,
    roles: Vec<Role>,
    files: Vec<CompiledFile>,
    units: Vec<CompiledUnit>,
    commands: Vec<Text>,
    generator: Option<PartGenerator>,
    pub(crate) update: UpdateStrategy,
    /// Its paths are Windows paths (a Windows format).
    windows: bool,
}

impl CompiledPart {
    /// The roles this part renders for (all when it names none).
    pub(crate) fn roles(&self) -> &[Role] {
        if self.roles.is_empty() {
            &Role::ALL
        } else {
            &self.roles
        }
    }

    /// The literal texts of this part (those without a mustache, which render as written)
    /// and their sizes, by field.
    pub(crate) fn literal_sizes(&self) -> Vec<(String, u64)> {
        let mut texts: Vec<(String, &Text)> = Vec::new();
        for f in &self.files {
            texts.push((format!("{}.content", f.field), &f.content));
        }
        for (j, u) in self.units.iter().enumerate() {
            let unit = format!("{}.units[{j}]", self.field);
            if let Some(content) = &u.content {
                texts.push((format!("{unit}.content"), content));
            }
            for (k, (_, text)) in u.drop_ins.iter().enumerate() {
                texts.push((format!("{unit}.dropIns[{k}].content"), text));
            }
        }
        for (k, c) in self.commands.iter().enumerate() {
            texts.push((format!("{}.commands[{k}]", self.field), c));
        }
        texts
            .into_iter()
            .filter_map(|(field, text)| match text {
                Text::Literal(s) => Some((field, s.len() as u64)),
                Text::Template(_) => None,
            })
            .collect()
    }

    /// The path of file `index` when it is literal text (not a template).
    pub(crate) fn literal_file_path(&self, index: usize) -> Option<&str> {
        match &self.files.get(index)?.path {
            Text::Literal(path) => Some(path),
            Text::Template(_) => None,
        }
    }
}

/// Compiles the parts, checking what the CRD schema checks too (the offline CLI bypasses the
/// API server): unique part names, modes, owners, unit and drop-in names.
pub(crate) fn compile_parts(
    parts: &[Part],
    windows: bool,
    engine: &mut Engine,
    problems: &mut Vec<Problem>,
) -> Vec<CompiledPart> {
    let mut out: Vec<CompiledPart> = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let field = format!("spec.parts[{i}]");
        if part.name.is_empty() || out.iter().any(|p| p.name == part.name) {
            problems.push(Problem::template(
                format!("{field}.name"),
                format!("part names must be unique and not empty (`{}`)", part.name),
            ));
        }
        let files = part
            .files
            .iter()
            .enumerate()
            .map(|(j, f)| {
                let field = format!("{field}.files[{j}]");
                CompiledFile {
                    path: engine.add(&format!("{field}.path"), &f.path, problems),
                    content: engine.add(&format!("{field}.content"), &f.content, problems),
                    permissions: permissions(
                        f.permissions.as_deref(),
                        Origin::Template,
                        &field,
                        problems,
                    ),
                    owner: owner(f.owner.as_deref(), Origin::Template, &field, problems),
                    encoding: f.encoding.unwrap_or_default(),
                    field,
                }
            })
            .collect();
        let units = part
            .units
            .iter()
            .enumerate()
            .map(|(j, u)| {
                let field = format!("{field}.units[{j}]");
                if !valid_unit_name(&u.name) {
                    problems.push(Problem::template(
                        format!("{field}.name"),
                        "a unit name is letters, digits and `:_.@-`, ending in .service, .socket, .timer, .path, .mount or .target",
                    ));
                }
                CompiledUnit {
                    name: u.name.clone(),
                    enable: u.enable,
                    content: u
                        .content
                        .as_ref()
                        .map(|c| engine.add(&format!("{field}.content"), c, problems)),
                    drop_ins: u
                        .drop_ins
                        .iter()
                        .enumerate()
                        .map(|(k, d)| {
                            let field = format!("{field}.dropIns[{k}]");
                            if !valid_drop_in_name(&d.name) {
                                problems.push(Problem::template(
                                    format!("{field}.name"),
                                    "a drop-in name is letters, digits and `_.@-`, ending in .conf",
                                ));
                            }
                            (
                                d.name.clone(),
                                engine.add(&format!("{field}.content"), &d.content, problems),
                            )
                        })
                        .collect(),
                }
            })
            .collect();
        let commands = part
            .commands
            .iter()
            .enumerate()
            .map(|(j, c)| engine.add(&format!("{field}.commands[{j}]"), c, problems))
            .collect();
        if let Some(generator) = &part.generator
            && !valid_object_name(&generator.name)
        {
            problems.push(Problem::template(
                format!("{field}.generator.name"),
                format!(
                    "`{}` is not a BootstrapGenerator name (lowercase letters, digits, `-` and `.`)",
                    crate::error::truncate(&generator.name, 64)
                ),
            ));
        }
        out.push(CompiledPart {
            name: part.name.clone(),
            field,
            roles: part.roles.clone(),
            files,
            units,
            commands,
            generator: part.generator.clone(),
            update: part.update,
            windows,
        });
    }
    out
}

/// A Kubernetes object name (RFC 1123 subdomain).
fn valid_object_name(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The generator calls a render for `role` with `config` needs: one per part that applies and
/// is not skipped and names a generator, in part order.
pub(crate) fn generator_calls(
    parts: &[CompiledPart],
    config: &BootplateConfigSpec,
    role: Role,
) -> Vec<Call> {
    parts
        .iter()
        .filter(|p| applies(p, config, role))
        .filter_map(|p| {
            let generator = p.generator.as_ref()?;
            Some(Call {
                part: p.name.clone(),
                field: format!("{}.generator", p.field),
                generator: generator.name.clone(),
                parameters: generator.parameters.clone(),
            })
        })
        .collect()
}

fn applies(part: &CompiledPart, config: &BootplateConfigSpec, role: Role) -> bool {
    (part.roles.is_empty() || part.roles.contains(&role)) && !config.skip_parts.contains(&part.name)
}

/// What one part of a render contributes, as the sequence of files and units it adds (merged
/// by [`add_file`] and [`add_unit`] when the body or the part's payload is built).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PartBody {
    pub(crate) name: String,
    pub(crate) update: UpdateStrategy,
    pub(crate) files: Vec<File>,
    pub(crate) units: Vec<UnitAdd>,
    pub(crate) commands: Vec<String>,
}

/// One unit as a part (or a generator) adds it: `enable` is kept unset when not given, so a
/// later part's unit does not undo an earlier part's `enable: false`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct UnitAdd {
    pub(crate) name: String,
    pub(crate) enable: Option<bool>,
    pub(crate) content: Option<String>,
    pub(crate) drop_ins: Vec<(String, String)>,
}

impl PartBody {
    /// The part's files and units merged as the user-data merges them.
    pub(crate) fn merged(&self) -> (Vec<File>, Vec<Unit>) {
        let mut files = Vec::new();
        for f in &self.files {
            add_file(&mut files, f.clone());
        }
        let mut units = Vec::new();
        for u in &self.units {
            add_unit(&mut units, u);
        }
        (files, units)
    }
}

/// A render split by origin: the parts that apply, in order, and the config's own files (its
/// pre- and post-commands are `config.pre_commands` and `config.post_commands`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Split {
    pub(crate) parts: Vec<PartBody>,
    pub(crate) config_files: Vec<File>,
}

/// Collects what the render for `role` writes. A part with a generator gets the generator's
/// files, units and commands from `generated` after its own (none when `generated` has no entry
/// for it: offline checks render without calling generators).
pub(crate) fn collect(
    parts: &[CompiledPart],
    config: &BootplateConfigSpec,
    role: Role,
    engine: &Engine,
    ctx: &Context,
    budget: &mut Budget,
    generated: &Generated,
) -> Result<Body, FieldError> {
    let windows = parts.first().is_some_and(|p| p.windows);
    let parts = collect_parts(parts, config, role, engine, ctx, budget, generated)?;
    let split = with_config_files(parts, config, windows, budget)?;
    let mut body = Body::default();
    body.add_commands(PRE_COMMANDS, config.pre_commands.iter().cloned());
    add_parts(&mut body, split.parts);
    for f in split.config_files {
        add_file(&mut body.files, f);
    }
    body.add_commands(POST_COMMANDS, config.post_commands.iter().cloned());
    Ok(body)
}

/// The parts' files, units and commands merged into one body (the config's own are not in it:
/// what a raw `spec.template` gets added to its output).
pub(crate) fn parts_body(parts: Vec<PartBody>) -> Body {
    let mut body = Body::default();
    add_parts(&mut body, parts);
    body
}

fn add_parts(body: &mut Body, parts: Vec<PartBody>) {
    for part in parts {
        for f in part.files {
            add_file(&mut body.files, f);
        }
        for u in &part.units {
            add_unit(&mut body.units, u);
        }
        body.add_commands(&part.name, part.commands);
    }
}

/// [`collect`] before merging: each part's contribution ([`collect_parts`]) and the config's
/// files.
pub(crate) fn with_config_files(
    parts: Vec<PartBody>,
    config: &BootplateConfigSpec,
    windows: bool,
    budget: &mut Budget,
) -> Result<Split, FieldError> {
    let mut split = Split {
        parts,
        config_files: Vec::new(),
    };
    for (i, f) in config_files(config)?.into_iter().enumerate() {
        if !budget.take(f.content.len()) {
            return Err(FieldError::TooLarge);
        }
        check_path(&f.path, windows).map_err(|m| {
            FieldError::Failed(located(Origin::Config, format!("spec.files[{i}].path"), m))
        })?;
        check_content(&f.content, f.encoding).map_err(|m| {
            FieldError::Failed(located(
                Origin::Config,
                format!("spec.files[{i}].content"),
                m,
            ))
        })?;
        split.config_files.push(f);
    }
    Ok(split)
}

/// Each part's contribution for `role`, in order (after checking the config's `skipParts`).
pub(crate) fn collect_parts(
    parts: &[CompiledPart],
    config: &BootplateConfigSpec,
    role: Role,
    engine: &Engine,
    ctx: &Context,
    budget: &mut Budget,
    generated: &Generated,
) -> Result<Vec<PartBody>, FieldError> {
    for (i, skip) in config.skip_parts.iter().enumerate() {
        if !parts.iter().any(|p| &p.name == skip) {
            let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
            return Err(FieldError::Failed(Problem::config(
                format!("spec.skipParts[{i}]"),
                format!(
                    "the template has no part named `{}` (parts: {})",
                    crate::error::truncate(skip, 64),
                    names.join(", ")
                ),
            )));
        }
    }
    let mut out_parts = Vec::new();
    for part in parts.iter().filter(|p| applies(p, config, role)) {
        let mut out = PartBody {
            name: part.name.clone(),
            update: part.update,
            ..PartBody::default()
        };
        for f in &part.files {
            let path = engine.render(&f.path, ctx, budget)?;
            let content = if is_systemd_path(&path) && f.encoding == FileEncoding::Plain {
                engine.render_unit(&f.content, ctx, budget)?
            } else {
                engine.render(&f.content, ctx, budget)?
            };
            check_path(&path, part.windows).map_err(|m| {
                FieldError::Failed(located(Origin::Template, format!("{}.path", f.field), m))
            })?;
            check_content(&content, f.encoding).map_err(|m| {
                FieldError::Failed(located(Origin::Template, format!("{}.content", f.field), m))
            })?;
            out.files.push(File {
                path,
                permissions: f.permissions.clone(),
                owner: f.owner.clone(),
                content,
                encoding: f.encoding,
            });
        }
        for u in &part.units {
            let content = match &u.content {
                Some(t) => Some(engine.render_unit(t, ctx, budget)?),
                None => None,
            };
            let mut drop_ins = Vec::with_capacity(u.drop_ins.len());
            for (name, text) in &u.drop_ins {
                drop_ins.push((name.clone(), engine.render_unit(text, ctx, budget)?));
            }
            out.units.push(UnitAdd {
                name: u.name.clone(),
                enable: u.enable,
                content,
                drop_ins,
            });
        }
        for c in &part.commands {
            // A command that renders to white space only is left out: a template makes a
            // command depend on a variable with `{{#if}}` around all of it (an opt-in step
            // leaves no trace in the user-data of machines that do not take it).
            let command = engine.render(c, ctx, budget)?;
            if !command.trim().is_empty() {
                out.commands.push(command);
            }
        }
        if let Some(output) = generated.get(&part.name) {
            add_generated(&mut out, output, budget)?;
        }
        out_parts.push(out);
    }
    Ok(out_parts)
}

/// Adds a generator's (already validated) output to its part, counting it against the size
/// budget.
fn add_generated(
    part: &mut PartBody,
    output: &crate::generator::GeneratedPart,
    budget: &mut Budget,
) -> Result<(), FieldError> {
    if !budget.take(output.size()) {
        return Err(FieldError::TooLarge);
    }
    part.files.extend(output.files.iter().cloned());
    part.units.extend(output.units.iter().map(|u| UnitAdd {
        name: u.name.clone(),
        enable: Some(u.enable),
        content: u.content.clone(),
        drop_ins: u.drop_ins.clone(),
    }));
    part.commands.extend(output.commands.iter().cloned());
    Ok(())
}

fn located(origin: Origin, field: String, message: &str) -> Problem {
    problem(origin, field, message).with_reason(crd_types::conditions::reason::RENDER_FAILED)
}

/// The config's files with defaults filled in. `contentFrom` must have been resolved into
/// `content` by the caller (the controller reads the Secret).
pub(crate) fn config_files(config: &BootplateConfigSpec) -> Result<Vec<File>, FieldError> {
    let mut problems = Vec::new();
    let mut files = Vec::with_capacity(config.files.len());
    for (i, f) in config.files.iter().enumerate() {
        let field = format!("spec.files[{i}]");
        let Some(content) = &f.content else {
            return Err(FieldError::Failed(
                Problem::config(
                    format!("{field}.content"),
                    "the file has no content (contentFrom must be resolved before rendering)",
                )
                .with_reason(crd_types::conditions::reason::FILE_SOURCE_ERROR),
            ));
        };
        files.push(File {
            path: f.path.clone(),
            permissions: permissions(
                f.permissions.as_deref(),
                Origin::Config,
                &field,
                &mut problems,
            ),
            owner: owner(f.owner.as_deref(), Origin::Config, &field, &mut problems),
            content: content.clone(),
            encoding: f.encoding.unwrap_or_default(),
        });
    }
    match problems.into_iter().next() {
        Some(p) => Err(FieldError::Failed(
            p.with_reason(crd_types::conditions::reason::RENDER_FAILED),
        )),
        None => Ok(files),
    }
}

/// A later file with the same path replaces the earlier one in place (a config can override a
/// template's file; Ignition rejects duplicate paths).
fn add_file(files: &mut Vec<File>, file: File) {
    match files.iter_mut().find(|f| f.path == file.path) {
        Some(existing) => *existing = file,
        None => files.push(file),
    }
}

/// A later unit of the same name merges into the earlier one: its content and `enable` win
/// when set, its drop-ins are added (replacing drop-ins of the same name).
fn add_unit(units: &mut Vec<Unit>, add: &UnitAdd) {
    if let Some(u) = units.iter_mut().find(|u| u.name == add.name) {
        if add.content.is_some() {
            u.content.clone_from(&add.content);
        }
        if let Some(e) = add.enable {
            u.enable = e;
        }
        for (n, c) in &add.drop_ins {
            match u.drop_ins.iter_mut().find(|(existing, _)| existing == n) {
                Some(d) => d.1.clone_from(c),
                None => u.drop_ins.push((n.clone(), c.clone())),
            }
        }
    } else {
        units.push(Unit {
            name: add.name.clone(),
            enable: add.enable.unwrap_or(true),
            content: add.content.clone(),
            drop_ins: add.drop_ins.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_absolute_and_clean() {
        assert!(check_path("/etc/a.conf", false).is_ok());
        for bad in [
            "etc/a",
            "/",
            "/etc/",
            "/etc/../a",
            "/etc//a",
            "/a\nb",
            "/./a",
            "",
        ] {
            assert!(check_path(bad, false).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn encoded_content_must_decode() {
        assert!(check_content("aGk=", FileEncoding::Base64).is_ok());
        assert!(check_content("aGk=\n", FileEncoding::Base64).is_ok());
        assert!(check_content("not base64!", FileEncoding::Base64).is_err());
        assert!(check_content("aGk=", FileEncoding::GzipBase64).is_err());
    }

    #[test]
    fn later_units_merge_into_earlier_ones() {
        let mut units = Vec::new();
        let add = |name: &str, enable, content: Option<&str>, drop_ins: &[(&str, &str)]| UnitAdd {
            name: name.into(),
            enable,
            content: content.map(Into::into),
            drop_ins: drop_ins
                .iter()
                .map(|(n, c)| (n.to_string(), c.to_string()))
                .collect(),
        };
        add_unit(
            &mut units,
            &add("a.service", None, Some("x"), &[("1.conf", "one")]),
        );
        add_unit(
            &mut units,
            &add(
                "a.service",
                Some(false),
                None,
                &[("1.conf", "uno"), ("2.conf", "two")],
            ),
        );
        add_unit(&mut units, &add("a.service", None, None, &[]));
        assert_eq!(units.len(), 1);
        assert_eq!(units[0].content.as_deref(), Some("x"));
        assert!(!units[0].enable);
        assert_eq!(
            units[0].drop_ins,
            [
                ("1.conf".into(), "uno".into()),
                ("2.conf".into(), "two".into())
            ]
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_unit_name("kubelet.service"));
        assert!(valid_unit_name("getty@tty1.service"));
        assert!(!valid_unit_name("kubelet"));
        assert!(!valid_unit_name("a b.service"));
        assert!(valid_drop_in_name("10-kubeadm.conf"));
        assert!(!valid_drop_in_name("x.txt"));
        assert!(!valid_drop_in_name("../x.conf"));
    }
}
