//! `#cloud-config`: `write_files` and `runcmd`.
//!
//! Emitted by hand rather than with serde_yaml: cloud-init reads YAML 1.1 (PyYAML), where plain
//! scalars such as `on`, `yes`, `1_000` or `2001-12-14` are booleans, numbers and dates, and
//! serde_yaml (a YAML 1.2 emitter) leaves them unquoted. Every scalar here is either a
//! double-quoted string with full escaping or a literal block whose characters all read back
//! unchanged in YAML 1.1 and 1.2.

use crd_types::FileEncoding;

use super::{Meta, all_commands, files_to_write};
use crate::body::Body;
use crate::files::File;
use crate::helpers::push_yaml_double_quoted;

/// The whole cloud-config of `body`: files and units in `write_files`, commands in `runcmd`.
pub(super) fn write(meta: &Meta<'_>, body: &Body) -> String {
    let mut out = String::with_capacity(super::size_estimate(body));
    out.push_str(&header(meta));
    write_files(&mut out, &files_to_write(body, meta.report), true);
    runcmd(&mut out, &all_commands(body, meta.report, !meta.stub));
    out
}

/// `#cloud-config` and the bootplate comment.
pub(super) fn header(meta: &Meta<'_>) -> String {
    format!("#cloud-config\n{}", meta.comment())
}

/// The `write_files` section with `files` (nothing when there are none: the cloud-init schema
/// wants at least one entry), with their `owner` unless `!owner` (cloudbase-init has no owner).
pub(super) fn write_files(out: &mut String, files: &[File], owner: bool) {
    if files.is_empty() {
        return;
    }
    out.push_str("write_files:\n");
    for f in files {
        let keys = [
            ("- path: ", &f.path),
            ("  permissions: ", &f.permissions),
            ("  owner: ", &f.owner),
        ];
        for (key, value) in &keys[..if owner { 3 } else { 2 }] {
            out.push_str(key);
            push_yaml_double_quoted(out, value);
            out.push('\n');
        }
        match f.encoding {
            FileEncoding::Plain => {}
            FileEncoding::Base64 => out.push_str("  encoding: \"b64\"\n"),
            FileEncoding::GzipBase64 => out.push_str("  encoding: \"gz+b64\"\n"),
        }
        out.push_str("  content: ");
        scalar(out, &f.content, 4);
    }
}

/// cloud-init joins string `runcmd` entries into one `sh` script run without `-e`: a failing
/// command would not stop the next ones, and the success sentinel at the end would claim a
/// bootstrap that failed. `set -e` first makes the first failure end the script.
fn runcmd(out: &mut String, commands: &[String]) {
    out.push_str("runcmd:\n");
    out.push_str("- \"set -e\"\n");
    for c in commands {
        out.push_str("- ");
        scalar(out, c, 2);
    }
}

/// Writes `s` as a YAML scalar value followed by a newline: a literal block (indented by
/// `indent` spaces) for readable multi-line text, a double-quoted string otherwise.
pub(super) fn scalar(out: &mut String, s: &str, indent: usize) {
    let Some(chomp) = literal_chomping(s) else {
        push_yaml_double_quoted(out, s);
        out.push('\n');
        return;
    };
    out.push('|');
    out.push_str(chomp);
    out.push('\n');
    const SPACES: &str = "        ";
    let wide;
    let pad = match SPACES.get(..indent) {
        Some(pad) => pad,
        None => {
            wide = " ".repeat(indent);
            &wide
        }
    };
    for line in s.trim_end_matches('\n').split('\n') {
        if !line.is_empty() {
            out.push_str(pad);
            out.push_str(line);
        }
        out.push('\n');
    }
    // `|+` keeps the trailing empty lines, which must be written out.
    let trailing = s.len() - s.trim_end_matches('\n').len();
    for _ in 1..trailing {
        out.push('\n');
    }
}

/// The chomping indicator when `s` can be a literal block: it has a line break, starts with a
/// character that is not white space, and holds only characters a YAML 1.1 reader keeps as they
/// are inside a block (no CR, NEL, U+2028/2029, BOM or control characters but tab).
fn literal_chomping(s: &str) -> Option<&'static str> {
    let body = s.trim_end_matches('\n');
    if !body.contains('\n') && body.len() == s.len() {
        return None;
    }
    if body.is_empty() || body.starts_with([' ', '\t', '\n']) {
        return None;
    }
    let printable = |c: char| {
        let n = c as u32;
        c == '\t'
            || c == '\n'
            || (0x20..0x7f).contains(&n)
            || ((0xa0..0xd800).contains(&n) && n != 0x2028 && n != 0x2029)
            || ((0xe000..=0xfffd).contains(&n) && n != 0xfeff)
            || n >= 0x10000
    };
    if !(ascii_printable(s) || s.chars().all(printable)) {
        return None;
    }
    Some(match s.len() - body.len() {
        0 => "-",
        1 => "",
        _ => "+",
    })
}

/// Whether `s` is only printable ASCII, tab and line feed. Most text is, and checking bytes
/// 32 at a time without stopping early lets the compiler compare them in vector registers: the
/// character by character check was a twentieth of a render.
fn ascii_printable(s: &str) -> bool {
    let ok = |b: &u8| *b == b'\t' || *b == b'\n' || (0x20..0x7f).contains(b);
    let chunks = s.as_bytes().chunks_exact(32);
    let rest = chunks.remainder();
    chunks
        .into_iter()
        .all(|chunk| chunk.iter().fold(true, |all, b| all & ok(b)))
        && rest.iter().all(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(s: &str) {
        let mut doc = String::from("v: ");
        scalar(&mut doc, s, 2);
        let parsed: std::collections::BTreeMap<String, String> =
            serde_yaml::from_str(&doc).unwrap_or_else(|e| panic!("{doc:?}: {e}"));
        assert_eq!(parsed["v"], s, "{doc}");
    }

    #[test]
    fn scalars_read_back_unchanged() {
        for s in [
            "",
            "on",
            "yes",
            "1_000",
            "2001-12-14",
            "a\nb",
            "a\nb\n",
            "a\nb\n\n\n",
            "a\n\n  b\n",
            "  lead\nx\n",
            "\nx\n",
            "x\r\ny\n",
            "x\u{2028}y\nz\n",
            "tab\there\n",
            "'; rm -rf / #\nkey: value\n",
            "é ✓ 𝄞\n",
            "\n",
            "\n\n",
        ] {
            round_trip(s);
        }
    }

    #[test]
    fn ascii_check_finds_a_control_character_anywhere() {
        let line = "0123456789 abcdefghijklmnopqrstuvwxyz\tABC\n".repeat(3);
        assert!(ascii_printable(&line));
        assert!(ascii_printable(""));
        for at in [0, 31, 32, 33, 64, line.len() - 1] {
            for bad in ['\r', '\u{7f}', '\u{1}', 'é'] {
                let mut s = line.clone();
                s.replace_range(at..at + 1, &bad.to_string());
                assert!(!ascii_printable(&s), "{bad:?} at {at}");
            }
        }
    }

    #[test]
    fn the_size_estimate_holds_a_typical_body_without_growing() {
        let body = Body {
            files: (0..10)
                .map(|i| File {
                    path: format!("/etc/example/{i}.conf"),
                    permissions: "0644".into(),
                    owner: "root:root".into(),
                    content: "key = \"value\"\n".repeat(i + 1),
                    encoding: FileEncoding::Plain,
                })
                .collect(),
            units: Vec::new(),
            commands: vec!["kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml".into(); 8],
            command_parts: vec![("join".into(), 8)],
        };
        let meta = Meta {
            object: "ClusterBootstrapTemplate t",
            revision: "abc",
            role: crd_types::Role::Worker,
            report: None,
            stub: false,
        };
        let out = write(&meta, &body);
        assert!(
            out.len() <= super::super::size_estimate(&body),
            "{}",
            out.len()
        );
    }

    #[test]
    fn multi_line_text_is_a_literal_block() {
        let mut out = String::new();
        scalar(&mut out, "a\n b\n", 4);
        assert_eq!(out, "|\n    a\n     b\n");
        let mut out = String::new();
        scalar(&mut out, "a\nb", 2);
        assert_eq!(out, "|-\n  a\n  b\n");
    }
}
