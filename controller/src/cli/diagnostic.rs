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
