//! `script`: a bash script that writes the files with quoted heredocs, installs the units and
//! runs the commands, stopping at the first failure (`set -euo pipefail`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use crd_types::FileEncoding;

use super::{Meta, files_to_write, report};
use crate::body::Body;
use crate::files::File;
use crate::helpers::quote;

/// Writes stdin to a file: parent directories are created with the default umask, the file is
/// created private (umask 077) and only then given its owner and mode, so a key is never
/// readable by others, not even for a moment.
const WRITE_FILE: &str = r#"# bootplate_write_file PATH MODE OWNER ENCODING: write stdin to PATH.
bootplate_write_file() {
  mkdir -p -- "$(dirname -- "$1")"
  case "$4" in
    base64) (umask 077 && base64 -d > "$1") ;;
    gzip+base64) (umask 077 && base64 -d | gzip -d > "$1") ;;
    *) (umask 077 && cat > "$1") ;;
  esac
  chown -- "$3" "$1"
  chmod -- "$2" "$1"
}
"#;

/// The whole script of `body`. With a reporter, its files are written first and it starts
/// before the other files, so that each of them is a step it reports.
pub(super) fn write(meta: &Meta<'_>, body: &Body) -> String {
    let mut out = header(meta);
    let files = files_to_write(body, meta.report);
    let own = if meta.report.is_some() { 2 } else { 0 };
    if !files.is_empty() {
        out.push('\n');
        out.push_str(WRITE_FILE);
    }
    for f in &files[..own] {
        write_file(&mut out, f);
    }
    if meta.report.is_some() {
        commands(&mut out, &report::start());
    }
    for (i, f) in files[own..].iter().enumerate() {
        if meta.report.is_some() {
            out.push_str(&report::announce(report::FILES_PART, "file", i));
            out.push('\n');
        }
        write_file(&mut out, f);
    }
    let steps = report::steps(body, false);
    commands(
        &mut out,
        &report::lay_out(steps, meta.report, true, !meta.stub),
    );
    out
}

/// `#!/bin/bash`, the bootplate comment and the strict-mode line.
pub(super) fn header(meta: &Meta<'_>) -> String {
    format!("#!/bin/bash\n{}set -euo pipefail\n", meta.comment())
}

/// The commands, one after another.
pub(super) fn commands(out: &mut String, commands: &[String]) {
    out.push('\n');
    for c in commands {
        out.push_str(c);
        if !c.ends_with('\n') {
            out.push('\n');
        }
    }
}

/// One `bootplate_write_file` call with the content in a quoted heredoc (nothing in it is
/// expanded). Plain text that does not end in a newline, or holds a NUL, goes as base64, since a
/// heredoc always ends its last line and cannot carry NUL bytes.
fn write_file(out: &mut String, f: &File) {
    let (encoding, data) = match f.encoding {
        FileEncoding::Plain if f.content.ends_with('\n') && !f.content.contains('\0') => {
            ("plain", f.content.clone())
        }
        FileEncoding::Plain => ("base64", wrapped_base64(f.content.as_bytes())),
        FileEncoding::Base64 => ("base64", with_newline(&f.content)),
        FileEncoding::GzipBase64 => ("gzip+base64", with_newline(&f.content)),
    };
    let delimiter = report::delimiter(&data);
    out.push_str(&format!(
        "bootplate_write_file {} {} {} {encoding} <<'{delimiter}'\n{data}{delimiter}\n",
        quote(&f.path),
        quote(&f.permissions),
        quote(&f.owner),
    ));
}

fn with_newline(s: &str) -> String {
    if s.ends_with('\n') || s.is_empty() {
        s.to_owned()
    } else {
        format!("{s}\n")
    }
}

/// Base64 in 76-column lines, each ending in a newline.
fn wrapped_base64(data: &[u8]) -> String {
    let encoded = BASE64.encode(data);
    let mut out = String::with_capacity(encoded.len() + encoded.len() / 76 + 1);
    for chunk in encoded.as_bytes().chunks(76) {
        // Base64 output is ASCII.
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_without_final_newline_goes_as_base64() {
        let mut out = String::new();
        let f = File {
            path: "/x".into(),
            permissions: "0600".into(),
            owner: "root:root".into(),
            content: "no newline".into(),
            encoding: FileEncoding::Plain,
        };
        write_file(&mut out, &f);
        assert_eq!(
            out,
            "bootplate_write_file '/x' '0600' 'root:root' base64 <<'BOOTPLATE_EOF'\nbm8gbmV3bGluZQ==\nBOOTPLATE_EOF\n"
        );
    }
}
