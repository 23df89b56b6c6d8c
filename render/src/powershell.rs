//! PowerShell for the Windows formats: quoting (single-quoted strings, here-strings) and the
//! syntax check of scripts.
//!
//! The syntax check parses with the tree-sitter PowerShell grammar (the `tree-sitter-powershell`
//! crate): a maintained grammar of the whole language (here-strings, script blocks, splatting,
//! type literals) that parses any text without running it and marks each error with its row
//! and column, which is what lint and the tests need; writing a PowerShell parser of our own
//! would be a second grammar to keep right. It parses more than Windows PowerShell 5.1 runs
//! (`&&` and `||` come from PowerShell 7): lint warns about those apart.

use base64::Engine as _;

use crate::limit::{GZIP_EXPANSION, SECRET_LIMIT_BYTES};

/// The characters PowerShell reads as a single quote: the ASCII one and the typographic ones
/// (‘ ’ ‚ ‛). Inside a single-quoted string each is written twice.
const SINGLE_QUOTES: [char; 5] = ['\'', '\u{2018}', '\u{2019}', '\u{201a}', '\u{201b}'];

/// A single-quoted PowerShell string holding `s` verbatim: nothing in it is expanded (no `$`,
/// no backtick escapes); each quote character is doubled.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(quoted_len(s));
    out.push('\'');
    for c in s.chars() {
        if SINGLE_QUOTES.contains(&c) {
            out.push(c);
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// The length of [`quote`]'s result.
pub(crate) fn quoted_len(s: &str) -> usize {
    let quotes: usize = s
        .chars()
        .filter(|c| SINGLE_QUOTES.contains(c))
        .map(char::len_utf8)
        .sum();
    s.len() + quotes + 2
}

/// `s` as a PowerShell expression: a verbatim here-string (`@'`, a line break, the text, a
/// line break, `'@` at the start of a line) when the text can be one, else the text decoded
/// from base64. A here-string ends at the first line that starts with a quote and `@`, and
/// its lines are split at CR as well as LF, so a text with such a line or a CR goes as
/// base64.
pub(crate) fn here_string(s: &str) -> String {
    if here_string_safe(s) {
        format!("@'\n{s}\n'@")
    } else {
        format!(
            "([Text.Encoding]::UTF8.GetString([Convert]::FromBase64String('{}')))",
            base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
        )
    }
}

/// Whether `s` reads back unchanged from a verbatim here-string.
pub(crate) fn here_string_safe(s: &str) -> bool {
    !s.contains(['\r', '\0'])
        && !s.split('\n').any(|line| {
            let mut chars = line.chars();
            chars.next().is_some_and(|c| SINGLE_QUOTES.contains(&c)) && chars.next() == Some('@')
        })
}

/// The largest text the syntax check parses: the largest render (uncompressed).
pub const PARSE_LIMIT_BYTES: u64 = SECRET_LIMIT_BYTES * GZIP_EXPANSION;

/// A syntax error: line and column from 1 (columns in characters), and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// The syntax errors of `script` (empty when it parses), the first ones in text order, at most
/// `max`. A text over [`PARSE_LIMIT_BYTES`] is not parsed: one error says so.
pub fn syntax_errors(script: &str, max: usize) -> Vec<SyntaxError> {
    if script.len() as u64 > PARSE_LIMIT_BYTES {
        return vec![SyntaxError {
            line: 1,
            column: 1,
            message: format!(
                "the script is {} bytes, over the {PARSE_LIMIT_BYTES} the syntax check reads",
                script.len()
            ),
        }];
    }
    let mut parser = tree_sitter::Parser::new();
    if parser
        .set_language(&tree_sitter_powershell::LANGUAGE.into())
        .is_err()
    {
        return vec![SyntaxError {
            line: 1,
            column: 1,
            message: "the PowerShell grammar does not load".to_owned(),
        }];
    }
    let Some(tree) = parser.parse(script, None) else {
        return vec![SyntaxError {
            line: 1,
            column: 1,
            message: "the PowerShell parser gave no result".to_owned(),
        }];
    };
    let mut errors = Vec::new();
    let mut cursor = tree.walk();
    collect_errors(script, &mut cursor, &mut errors, max);
    errors
}

/// The error and missing nodes below the cursor's node, depth first, in text order.
fn collect_errors(
    script: &str,
    cursor: &mut tree_sitter::TreeCursor<'_>,
    errors: &mut Vec<SyntaxError>,
    max: usize,
) {
    loop {
        let node = cursor.node();
        if errors.len() >= max {
            return;
        }
        if node.is_error() || node.is_missing() {
            errors.push(describe(script, node));
        } else if node.has_error() && cursor.goto_first_child() {
            collect_errors(script, cursor, errors, max);
            cursor.goto_parent();
        }
        if !cursor.goto_next_sibling() {
            return;
        }
    }
}

fn describe(script: &str, node: tree_sitter::Node<'_>) -> SyntaxError {
    // An error node that starts with comments (a script's `#ps1_sysnative`) is placed at its
    // first token of code: where the parser stopped understanding it.
    let mut cursor = node.walk();
    let at = node
        .children(&mut cursor)
        .find(|child| !child.is_extra() && child.kind() != "comment")
        .filter(|_| node.is_error())
        .unwrap_or(node);
    let start = at.start_position();
    let line_start = script
        .split_inclusive('\n')
        .take(start.row)
        .map(str::len)
        .sum::<usize>();
    let column = script
        .get(line_start..line_start + start.column)
        .map_or(start.column, |s| s.chars().count())
        + 1;
    let message = if node.is_missing() {
        format!("`{}` expected here", node.kind())
    } else {
        let text = node.utf8_text(script.as_bytes()).unwrap_or("");
        let first = text.lines().next().unwrap_or("").trim();
        let shown: String = first.chars().take(40).collect();
        if shown.is_empty() {
            "PowerShell cannot parse this (an unclosed block, string or parenthesis?)".to_owned()
        } else {
            format!("PowerShell cannot parse `{shown}`")
        }
    };
    SyntaxError {
        line: start.row + 1,
        column,
        message,
    }
}

/// A handlebars text with every mustache masked, for the syntax check of a template's own text
/// (before render): an expression (`{{x}}`, `{{ps_quote x}}`) becomes digits of the same length
/// (a number: a value wherever one may stand, and plain text inside a string), block tags,
/// comments and
/// partials become spaces, and line breaks stay, so positions in the mask are positions in the
/// template.
pub(crate) fn mask_mustaches(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let end = if tag.starts_with("{{!--") {
            tag.find("--}}").map(|i| i + 4)
        } else {
            tag.find("}}").map(|i| {
                let close = i + 2;
                if tag.starts_with("{{{") && tag[close..].starts_with('}') {
                    close + 1
                } else {
                    close
                }
            })
        };
        let Some(end) = end else {
            out.push_str(tag);
            return out;
        };
        let inner = tag[2..end - 2].trim_start_matches(['{', '~']);
        let expression =
            !inner.starts_with(['#', '/', '!', '>', '^']) && !inner.starts_with("else");
        for c in tag[..end].chars() {
            out.push(match c {
                '\n' => '\n',
                _ if expression => '0',
                _ => ' ',
            });
        }
        rest = &tag[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_quotes_are_doubled_and_nothing_else_changes() {
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(quote("$env:X `n \"y\""), "'$env:X `n \"y\"'");
        assert_eq!(quote("a\u{2019}b"), "'a\u{2019}\u{2019}b'");
        assert_eq!(quote(""), "''");
        for s in ["it's", "‘’‚‛'", "", "x\ny"] {
            assert_eq!(quote(s).len(), quoted_len(s), "{s}");
        }
    }

    #[test]
    fn here_strings_fall_back_to_base64_for_a_terminator_line() {
        assert_eq!(here_string("a\nb\n"), "@'\na\nb\n\n'@");
        for s in ["x\n'@\ny", "'@", "x\n\u{2019}@ z", "a\r\nb"] {
            let e = here_string(s);
            assert!(e.starts_with("([Text.Encoding]::UTF8"), "{s:?}: {e}");
        }
        assert!(here_string_safe("x '@ in the middle\n @'\n"));
    }

    #[test]
    fn quoted_values_parse_whatever_they_hold() {
        for s in [
            "it's",
            "'; Remove-Item C:\\ -Recurse; '",
            "‘’‚‛",
            "$(whoami) `whoami` \"x\"",
        ] {
            let script = format!("$v = {}\n$w = {}\n", quote(s), here_string(s));
            assert_eq!(syntax_errors(&script, 5), vec![], "{script}");
        }
    }

    #[test]
    fn errors_carry_their_line_and_column() {
        let errors = syntax_errors("$a = 1\nif ($a { 'x' }\n", 5);
        assert!(!errors.is_empty());
        assert_eq!(errors[0].line, 2, "{errors:?}");
        assert!(syntax_errors("Write-Output 'x\n", 5)[0].line >= 1);
        let errors = syntax_errors("#ps1_sysnative\n# note\nif ($a { 'x' }\n", 5);
        assert_eq!((errors[0].line, errors[0].column), (3, 1), "{errors:?}");
        assert_eq!(syntax_errors("& {\n  exit 1\n}\n", 5), vec![]);
    }

    #[test]
    fn an_oversized_script_is_not_parsed() {
        let script = " ".repeat(PARSE_LIMIT_BYTES as usize + 1);
        let errors = syntax_errors(&script, 5);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains("over the"), "{errors:?}");
    }

    #[test]
    fn masks_keep_positions() {
        let text = "{{#if a}}\nWrite-Output {{ps_quote b}} {{! note }}\n{{/if}}\n";
        let masked = mask_mustaches(text);
        assert_eq!(masked.len(), text.len());
        assert_eq!(
            masked,
            "         \nWrite-Output 00000000000000            \n       \n"
        );
        assert_eq!(syntax_errors(&masked, 5), vec![]);
    }
}
