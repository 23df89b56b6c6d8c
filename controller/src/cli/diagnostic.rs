//! One problem of an input file, located: what `bootplate lint` prints (and `bootplate render`
//! for input it refuses), as text or as JSON for CI.

use render::Severity;
use serde::Serialize;

/// A located problem.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnostic {
    /// The file as given on the command line (`-`: standard input).
    pub file: String,
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1, in characters.
    pub column: usize,
    /// `error` or `warning`.
    #[serde(serialize_with = "severity")]
    pub severity: Severity,
    /// A stable name for the kind of problem (`unknown-field`, `undefined-name`, …).
    pub code: &'static str,
    /// The field of the object, for example `spec.parts[0].files[1].permissions` (empty when
    /// the problem is the file's, such as a YAML syntax error).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when known (`did you mean `permissions`?`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

fn severity<S: serde::Serializer>(s: &Severity, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&s.to_string())
}

impl Diagnostic {
    /// A diagnostic; a "; did you mean …?" ending of `message` becomes the hint.
    pub fn new(
        file: &str,
        (line, column): (usize, usize),
        severity: Severity,
        code: &'static str,
        field: &str,
        message: String,
    ) -> Diagnostic {
        let (message, hint) = match message.split_once("; did you mean ") {
            Some((m, h)) => (m.to_owned(), Some(format!("did you mean {h}"))),
            None => (message, None),
        };
        Diagnostic {
            file: file.to_owned(),
            line,
            column,
            severity,
            code,
            field: field.to_owned(),
            message,
            hint,
        }
    }
}

/// How `bootplate lint` prints diagnostics.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Each problem with the lines of the file around it and a caret under the culprit.
    #[default]
    Text,
    /// One line per problem: `FILE:LINE:COL: severity: field: message`.
    Short,
    /// One JSON object per line (file, line, column, severity, code, field, message, hint).
    Json,
    /// One JUnit XML document: a testsuite per file, a testcase per object, a failure per error.
    Junit,
    /// One SARIF 2.1.0 log, for code-scanning annotations: a result per problem.
    Sarif,
}

impl Diagnostic {
    /// The diagnostic as `format` prints it; `source` is the text of its file, when read.
    pub fn render(&self, format: Format, source: Option<&str>) -> String {
        match format {
            // The whole-run formats print through `report`; a lone line reads as `short`.
            Format::Short | Format::Junit | Format::Sarif => self.to_string(),
            Format::Json => serde_json::to_string(self).expect("a diagnostic serializes"),
            Format::Text => match source {
                Some(source) => self.snippet(source),
                None => self.to_string(),
            },
        }
    }

    fn snippet(&self, source: &str) -> String {
        use annotate_snippets::{AnnotationKind, Level, Renderer, Snippet};
        let start = offset(source, self.line, self.column);
        // Underline the word at the position: up to the next blank, quote or end of line.
        let rest = &source[start..];
        let len = match rest.chars().next() {
            Some(q @ ('"' | '\'')) => rest[1..].find(q).map_or(1, |end| end + 2),
            _ => rest
                .find(|c: char| c.is_whitespace() || c == '"' || c == ',' || c == '}')
                .unwrap_or(rest.len())
                .max(1),
        }
        .min(rest.len().max(1));
        let end = (start + len).min(source.len());
        let level = match self.severity {
            Severity::Error => Level::ERROR,
            Severity::Warning => Level::WARNING,
        };
        let title = if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        };
        let label = self.hint.clone().unwrap_or_default();
        let code = format!("code: {}", self.code);
        let report = [level
            .primary_title(title)
            .element(
                Snippet::source(source)
                    .line_start(1)
                    .path(self.file.as_str())
                    .annotation(AnnotationKind::Primary.span(start..end).label(label)),
            )
            .element(Level::NOTE.message(code))];
        Renderer::plain().render(&report).to_string()
    }
}

/// The byte offset of LINE:COL (from 1, columns in characters) in `source`, clamped to it.
fn offset(source: &str, line: usize, column: usize) -> usize {
    let mut start = 0;
    for (i, l) in source.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            let within: usize = l
                .char_indices()
                .nth(column.saturating_sub(1))
                .map_or(l.trim_end_matches('\n').len(), |(b, _)| b);
            return start + within;
        }
        start += l.len();
    }
    source.len()
}

impl std::fmt::Display for Diagnostic {
    /// `FILE:LINE:COL: error: FIELD: MESSAGE; HINT`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: ",
            self.file, self.line, self.column, self.severity
        )?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "; {hint}")?;
        }
        Ok(())
    }
}
