//! What one `bootplate lint` run found, and how it is printed: problems as text, short lines or
//! JSON lines, or the whole run as one JUnit XML or SARIF 2.1.0 document for CI systems; and a
//! summary line on standard error in every format, so standard output stays machine-readable.

use std::collections::BTreeMap;
use std::io::Write;

use render::Severity;
use serde_json::json;

use super::diagnostic::{Diagnostic, Format};
use super::input::{InputError, YamlFile, kind};
use super::objects::name_of;

/// An object lint checked: where it starts and what it is.
#[derive(Clone, Debug)]
pub struct Object {
    pub file: String,
    pub line: usize,
    /// `BootstrapTemplate ns/name`.
    pub name: String,
}

impl Object {
    /// Document `index` of `file`.
    pub fn of(file: &YamlFile, index: usize) -> Object {
        let document = &file.documents[index];
        let (namespace, name) = name_of(document);
        let name = match namespace {
            Some(ns) => format!("{} {ns}/{name}", kind(document)),
            None => format!("{} {name}", kind(document)),
        };
        Object {
            file: file.shown.clone(),
            line: file.positions.start_line(index),
            name,
        }
    }
}

/// Everything one run found.
#[derive(Default)]
pub struct Report {
    pub diagnostics: Vec<Diagnostic>,
    /// Inputs that could not be read or walked (exit code 2).
    pub input_errors: Vec<InputError>,
    pub objects: Vec<Object>,
    /// Documents of kinds lint does not check, or filtered out.
    pub skipped: usize,
    /// The text of every file read, for snippets, in the order read.
    sources: BTreeMap<String, (usize, String)>,
}

impl Report {
    /// Keeps `file`'s text for snippets; files are reported in the order they were added.
    pub fn add_source(&mut self, file: &YamlFile) {
        self.add_text(&file.shown, &file.text);
    }

    /// Keeps the text of the file shown as `shown`.
    pub fn add_text(&mut self, shown: &str, text: &str) {
        let order = self.sources.len();
        self.sources
            .entry(shown.to_owned())
            .or_insert_with(|| (order, text.to_owned()));
    }

    pub fn errors(&self) -> usize {
        self.count(Severity::Error)
    }

    fn count(&self, severity: Severity) -> usize {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == severity)
            .count()
    }

    /// `N objects, E errors, W warnings, S skipped`.
    pub fn summary(&self) -> String {
        format!(
            "{} objects, {} errors, {} warnings, {} skipped",
            self.objects.len(),
            self.errors(),
            self.count(Severity::Warning),
            self.skipped
        )
    }

    /// Sorts the problems (by file in the order read, then line and column) and prints them
    /// in `format`; input errors and the summary go to standard error.
    pub fn print(&mut self, format: Format) {
        let order = |file: &str| self.sources.get(file).map_or(usize::MAX, |(o, _)| *o);
        self.diagnostics
            .sort_by_key(|d| (order(&d.file), d.file.clone(), d.line, d.column));
        let shown = match format {
            Format::Junit => junit(self),
            Format::Sarif => sarif(self),
            _ => self
                .diagnostics
                .iter()
                .map(|d| {
                    let source = self.sources.get(&d.file).map(|(_, t)| t.as_str());
                    format!("{}\n", d.render(format, source))
                })
                .collect(),
        };
        // A closed pipe (`| head`) ends the output, not the run.
        let _ = std::io::stdout().lock().write_all(shown.as_bytes());
        for e in &self.input_errors {
            eprintln!("bootplate lint: {e}");
        }
        eprintln!("bootplate lint: {}", self.summary());
    }
}

/// The index of the object of `objects` (one file's, by start line) that `line` falls in.
fn owner(objects: &[&Object], line: usize) -> Option<usize> {
    objects.iter().rposition(|o| o.line <= line)
}

/// Text XML may hold in an attribute or an element: escaped, and without the control
/// characters XML 1.0 cannot carry.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

/// One JUnit XML document: a testsuite per file, a testcase per object (and one named after
/// the file for problems outside any object), a failure per error, warnings in system-out,
/// inputs that could not be read as errors of a testsuite of their own.
pub fn junit(report: &Report) -> String {
    let mut files: Vec<&str> = report.sources.keys().map(String::as_str).collect();
    files.sort_by_key(|f| report.sources[*f].0);
    let mut suites = String::new();
    let (mut tests, mut failures) = (0, 0);
    for file in files {
        let (suite, t, f) = junit_suite(report, file);
        suites.push_str(&suite);
        tests += t;
        failures += f;
    }
    let errors = report.input_errors.len();
    if errors > 0 {
        suites.push_str(&format!(
            "  <testsuite name=\"inputs\" tests=\"{errors}\" failures=\"0\" errors=\"{errors}\">\n"
        ));
        for e in &report.input_errors {
            let e = xml(&e.to_string());
            suites.push_str(&format!(
                "    <testcase name=\"{e}\" classname=\"inputs\">\n      <error type=\"input\" message=\"{e}\"/>\n    </testcase>\n"
            ));
        }
        suites.push_str("  </testsuite>\n");
        tests += errors;
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"bootplate lint\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\">\n{suites}</testsuites>\n"
    )
}

/// The testsuite of one file: its XML, its tests and its failed tests.
fn junit_suite(report: &Report, file: &str) -> (String, usize, usize) {
    let objects: Vec<&Object> = report.objects.iter().filter(|o| o.file == file).collect();
    // Testcase 0 is the file itself, for problems before any object; it is shown only then.
    let mut cases: Vec<Vec<&Diagnostic>> = vec![Vec::new(); objects.len() + 1];
    for d in report.diagnostics.iter().filter(|d| d.file == file) {
        cases[owner(&objects, d.line).map_or(0, |i| i + 1)].push(d);
    }
    let mut body = String::new();
    let (mut tests, mut failed) = (0, 0);
    for (i, found) in cases.iter().enumerate() {
        if i == 0 && found.is_empty() {
            continue;
        }
        let name = if i == 0 { file } else { &objects[i - 1].name };
        tests += 1;
        if found.iter().any(|d| d.severity == Severity::Error) {
            failed += 1;
        }
        body.push_str(&junit_case(file, name, found));
    }
    let suite = format!(
        "  <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failed}\" errors=\"0\" file=\"{}\">\n{body}  </testsuite>\n",
        xml(file),
        xml(file)
    );
    (suite, tests, failed)
}

/// One testcase: a failure per error, the warnings in system-out.
fn junit_case(file: &str, name: &str, found: &[&Diagnostic]) -> String {
    let mut out = format!(
        "    <testcase name=\"{}\" classname=\"{}\">\n",
        xml(name),
        xml(file)
    );
    let mut warnings = String::new();
    for d in found {
        let line = xml(&d.to_string());
        match d.severity {
            Severity::Error => out.push_str(&format!(
                "      <failure type=\"{}\" message=\"{line}\">{line}</failure>\n",
                d.code
            )),
            Severity::Warning => {
                warnings.push_str(&line);
                warnings.push('\n');
            }
        }
    }
    if !warnings.is_empty() {
        out.push_str(&format!("      <system-out>{warnings}</system-out>\n"));
    }
    out.push_str("    </testcase>\n");
    out
}

/// A file name as a relative URI reference: every byte but unreserved characters and `/`
/// percent-encoded.
fn uri(file: &str) -> String {
    let mut out = String::new();
    for b in file.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One SARIF 2.1.0 log: a rule per problem code, a result per problem (columns counted in
/// characters: `columnKind` `unicodeCodePoints`), inputs that could not be read as tool
/// execution notifications.
pub fn sarif(report: &Report) -> String {
    let mut rules: Vec<&str> = Vec::new();
    let results: Vec<serde_json::Value> = report
        .diagnostics
        .iter()
        .map(|d| {
            let rule = rules.iter().position(|r| *r == d.code).unwrap_or_else(|| {
                rules.push(d.code);
                rules.len() - 1
            });
            let mut text = if d.field.is_empty() {
                d.message.clone()
            } else {
                format!("{}: {}", d.field, d.message)
            };
            if let Some(hint) = &d.hint {
                text = format!("{text}; {hint}");
            }
            json!({
                "ruleId": d.code,
                "ruleIndex": rule,
                "level": d.severity.to_string(),
                "message": {"text": text},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {"uri": uri(&d.file)},
                    "region": {"startLine": d.line, "startColumn": d.column},
                }}],
            })
        })
        .collect();
    let notifications: Vec<serde_json::Value> = report
        .input_errors
        .iter()
        .map(|e| json!({"level": "error", "message": {"text": e.to_string()}}))
        .collect();
    let log = json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "bootplate lint",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules.iter().map(|r| json!({"id": r})).collect::<Vec<_>>(),
            }},
            "columnKind": "unicodeCodePoints",
            "invocations": [{
                "executionSuccessful": report.input_errors.is_empty(),
                "toolExecutionNotifications": notifications,
            }],
            "results": results,
        }],
    });
    format!(
        "{}\n",
        serde_json::to_string_pretty(&log).expect("a SARIF log serializes")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diagnostic(file: &str, line: usize, severity: Severity, message: &str) -> Diagnostic {
        Diagnostic::new(
            file,
            (line, 3),
            severity,
            "schema",
            "spec.x",
            message.to_owned(),
        )
    }

    fn report() -> Report {
        let mut report = Report::default();
        report
            .sources
            .insert("a.yaml".to_owned(), (0, String::new()));
        report.objects = vec![
            Object {
                file: "a.yaml".to_owned(),
                line: 1,
                name: "BootstrapTemplate t".to_owned(),
            },
            Object {
                file: "a.yaml".to_owned(),
                line: 10,
                name: "BootplateConfig c".to_owned(),
            },
        ];
        report.diagnostics = vec![
            diagnostic("a.yaml", 4, Severity::Error, "bad <value> & \"quote\""),
            diagnostic("a.yaml", 12, Severity::Warning, "odd"),
        ];
        report.skipped = 2;
        report
    }

    #[test]
    fn junit_gives_each_object_a_testcase_and_each_error_a_failure() {
        let xml = junit(&report());
        assert!(xml.contains("<testsuites name=\"bootplate lint\" tests=\"2\" failures=\"1\""));
        assert!(xml.contains("<testcase name=\"BootstrapTemplate t\" classname=\"a.yaml\">\n      <failure type=\"schema\" message=\"a.yaml:4:3: error: spec.x: bad &lt;value&gt; &amp; &quot;quote&quot;\">"), "{xml}");
        assert!(xml.contains("<testcase name=\"BootplateConfig c\" classname=\"a.yaml\">\n      <system-out>a.yaml:12:3: warning: spec.x: odd\n</system-out>"), "{xml}");
    }

    #[test]
    fn sarif_has_a_result_per_problem_with_its_region() {
        let log: serde_json::Value = serde_json::from_str(&sarif(&report())).unwrap();
        let results = &log["runs"][0]["results"];
        assert_eq!(results.as_array().unwrap().len(), 2);
        assert_eq!(results[1]["level"], "warning");
        assert_eq!(
            results[0]["locations"][0]["physicalLocation"]["region"],
            json!({"startLine": 4, "startColumn": 3})
        );
        assert_eq!(
            log["runs"][0]["tool"]["driver"]["rules"],
            json!([{"id": "schema"}])
        );
    }

    #[test]
    fn the_summary_counts_objects_problems_and_skipped_documents() {
        assert_eq!(
            report().summary(),
            "2 objects, 1 errors, 1 warnings, 2 skipped"
        );
    }

    #[test]
    fn file_names_become_uri_references() {
        assert_eq!(uri("gitops/a b#1.yaml"), "gitops/a%20b%231.yaml");
    }
}
