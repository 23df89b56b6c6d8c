//! Errors and lint problems.
//!
//! Every message names the template object, the field (`spec.parts[1].commands[0]`), and where
//! known the line and column inside that field's text, so a platform team can find the mistake
//! without reading engine internals. Messages never contain rendered output or values: a token
//! or a private key must not end up in a condition, an event or a log line.

use std::fmt;

use crd_types::Role;
use crd_types::conditions::reason;

/// A line and column inside one field's text, both counted from 1 (columns in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1, in characters.
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// Which object a field belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The template (`BootstrapTemplate` / `ClusterBootstrapTemplate`).
    Template,
    /// The `BootplateConfig` being rendered.
    Config,
}

/// How bad a lint problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The template cannot be used as it is.
    Error,
    /// Suspicious, but renders (for example a declared variable that nothing reads).
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// One problem found while compiling, linting or rendering a template.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// Error or warning.
    pub severity: Severity,
    /// Template or config.
    pub origin: Origin,
    /// The field, for example `spec.parts[1].commands[0]`, `spec.partials.install`,
    /// `spec.template`, `spec.variables[2].default`.
    pub field: String,
    /// Where in the field's text, when known.
    pub position: Option<Position>,
    /// The role of the (sample) render that found it, when it is role-specific.
    pub role: Option<Role>,
    /// What is wrong, naming the variable, helper or partial involved.
    pub message: String,
    /// The condition reason (a `crd_types::conditions::reason` constant).
    pub reason: &'static str,
    /// A stable name for the kind of problem, for tools reading lint's JSON output:
    /// `unknown-name`, `unknown-helper`, `unquoted`, … (`template-invalid` when nothing more
    /// precise applies).
    pub code: &'static str,
}

impl Problem {
    pub(crate) fn template(field: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Error,
            origin: Origin::Template,
            field: field.into(),
            position: None,
            role: None,
            message: message.into(),
            reason: reason::TEMPLATE_INVALID,
            code: "template-invalid",
        }
    }

    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            origin: Origin::Config,
            reason: reason::RENDER_FAILED,
            code: "config-invalid",
            ..Problem::template(field, message)
        }
    }

    pub(crate) fn at(mut self, position: Option<Position>) -> Self {
        self.position = position;
        self
    }

    pub(crate) fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = reason;
        if self.code == "template-invalid" {
            self.code = match reason {
                reason::RENDER_FAILED => "render-failed",
                reason::INVALID_VARIABLES => "invalid-variable",
                reason::OUTPUT_TOO_LARGE => "output-too-large",
                _ => self.code,
            };
        }
        self
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }

    pub(crate) fn warning(mut self) -> Self {
        self.severity = Severity::Warning;
        self
    }
}

impl fmt::Display for Problem {
    /// `spec.parts[1].commands[0] line 3, column 7: undefined variable `values.x` (role worker)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.origin == Origin::Config {
            f.write_str("the config's ")?;
        }
        f.write_str(&self.field)?;
        if let Some(position) = self.position {
            write!(f, " {position}")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(role) = self.role {
            write!(f, " (role {role})")?;
        }
        Ok(())
    }
}

/// Why a template could not be compiled or rendered.
#[derive(thiserror::Error, Debug)]
pub enum RenderError {
    /// The template itself is broken: syntax, a missing or recursive partial, too deep nesting,
    /// a bad variable declaration, or both or neither of `template` and `parts`.
    #[error("{object}: {}{}", problems[0], more(problems.len()))]
    TemplateInvalid {
        /// The template object, for example `ClusterBootstrapTemplate ubuntu-2404`.
        object: String,
        /// Every problem found (at least one).
        problems: Vec<Problem>,
    },
    /// A config variable is missing, undeclared, or fails the declared schema.
    #[error("{object}: variable `{variable}`: {message}")]
    InvalidVariable {
        /// The template object.
        object: String,
        /// The variable's name.
        variable: String,
        /// What is wrong (never the value itself).
        message: String,
    },
    /// Rendering failed: an undefined variable, a helper error, a bad file path, output that is
    /// not in the declared format.
    #[error("{object}: {problem}")]
    RenderFailed {
        /// The template object.
        object: String,
        /// Where and what.
        problem: Box<Problem>,
    },
    /// The output is larger than allowed.
    #[error(
        "{object}: the output is {}{size} bytes, more than the limit of {limit} bytes ({limit_source})",
        if *at_least { "at least " } else { "" }
    )]
    OutputTooLarge {
        /// The template object.
        object: String,
        /// The output size in bytes (or the size when rendering stopped, see `at_least`).
        size: u64,
        /// The limit in bytes.
        limit: u64,
        /// Which setting the limit comes from.
        limit_source: String,
        /// Rendering stopped at `size` bytes: the whole output would be larger still.
        at_least: bool,
    },
}

fn more(count: usize) -> String {
    match count {
        0 | 1 => String::new(),
        2 => " (and 1 more problem)".to_owned(),
        n => format!(" (and {} more problems)", n - 1),
    }
}

impl RenderError {
    /// The condition reason: a `crd_types::conditions::reason` constant.
    pub fn reason(&self) -> &'static str {
        match self {
            RenderError::TemplateInvalid { .. } => reason::TEMPLATE_INVALID,
            RenderError::InvalidVariable { .. } => reason::INVALID_VARIABLES,
            RenderError::RenderFailed { problem, .. } => problem.reason,
            RenderError::OutputTooLarge { .. } => reason::OUTPUT_TOO_LARGE,
        }
    }

    /// The problems behind this error, with fields and positions (for `bootplate lint` and the
    /// template's `Valid` condition).
    pub fn problems(&self) -> Vec<Problem> {
        match self {
            RenderError::TemplateInvalid { problems, .. } => problems.clone(),
            RenderError::InvalidVariable {
                variable, message, ..
            } => vec![
                Problem::config(
                    format!("spec.variables.{variable}"),
                    format!("variable `{variable}`: {message}"),
                )
                .with_reason(reason::INVALID_VARIABLES),
            ],
            RenderError::RenderFailed { problem, .. } => vec![(**problem).clone()],
            RenderError::OutputTooLarge { limit_source, .. } => {
                let message = self.to_string();
                let message = message
                    .split_once(": ")
                    .map_or(message.as_str(), |(_, m)| m)
                    .to_owned();
                // A limit the config set itself is the config's problem, not the template's.
                let problem = if limit_source == crate::limit::CONFIG_LIMIT {
                    Problem::config("spec.maxOutputBytes", message)
                } else {
                    Problem::template("spec", message)
                };
                vec![problem.with_reason(reason::OUTPUT_TOO_LARGE)]
            }
        }
    }

    pub(crate) fn invalid(object: &str, problems: Vec<Problem>) -> Self {
        debug_assert!(!problems.is_empty());
        RenderError::TemplateInvalid {
            object: object.to_owned(),
            problems,
        }
    }

    pub(crate) fn failed(object: &str, problem: Problem) -> Self {
        RenderError::RenderFailed {
            object: object.to_owned(),
            problem: Box::new(problem),
        }
    }
}

/// Keeps messages short: handlebars quotes whole parameters in some errors, and names and
/// values a tenant wrote can be of any length.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}…")
    }
}
