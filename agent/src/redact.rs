//! What of a failed program's error output may leave the node.
//!
//! The agent reports a failed step on its Node (a condition anyone who reads Nodes sees) and in
//! its log. A command may print what it should not (a token it was given, a key it read), so the
//! report carries a short, redacted tail of the error output, never the output itself. The rule:
//!
//! 1. only the last non-empty line of the error output is kept;
//! 2. it is cut into words at white space and at `=`, `:`, `,`, `;`, quotes and brackets; a
//!    word is replaced by `[redacted]` when
//!    - it is at least 16 characters long and holds both a letter and a digit (tokens, keys,
//!      hashes, base64: random strings look like that, words of a message rarely do), or
//!    - the word before it names a secret (`token`, `password`, `passwd`, `secret`, `key`,
//!      `credential(s)`, `bearer`, `authorization`, `apikey`, `auth`; any case), or
//!    - it is (or is part of) a PEM line: `-----BEGIN`/`-----END` and everything after it;
//! 3. the result is cut to its last 120 characters.

/// At most this many characters of the last line are reported.
pub const TAIL_CHARS: usize = 120;

const REDACTED: &str = "[redacted]";
const SECRET_NAMES: &[&str] = &[
    "token",
    "password",
    "passwd",
    "secret",
    "key",
    "credential",
    "credentials",
    "bearer",
    "authorization",
    "apikey",
    "auth",
];

/// The redacted tail of `output` (see the module doc); empty when it has no text.
pub fn tail(output: &str) -> String {
    let Some(line) = output.lines().rev().map(str::trim).find(|l| !l.is_empty()) else {
        return String::new();
    };
    let redacted = redact_line(line);
    let count = redacted.chars().count();
    if count <= TAIL_CHARS {
        return redacted;
    }
    let cut: String = redacted.chars().skip(count - TAIL_CHARS).collect();
    format!("…{cut}")
}

fn is_separator(c: char) -> bool {
    c.is_whitespace() || "=:,;\"'`()[]{}<>".contains(c)
}

/// Redacts the words of one line (rule 2), keeping the separators as they are.
fn redact_line(line: &str) -> String {
    if let Some(at) = line.find("-----BEGIN").or_else(|| line.find("-----END")) {
        return format!("{}{REDACTED}", redact_line(&line[..at]));
    }
    let mut out = String::with_capacity(line.len());
    let mut after_secret_name = false;
    let mut rest = line;
    while !rest.is_empty() {
        let word_len = rest.find(is_separator).unwrap_or(rest.len());
        if word_len == 0 {
            let sep = rest.chars().next().expect("not empty");
            out.push(sep);
            rest = &rest[sep.len_utf8()..];
            continue;
        }
        let (word, after) = rest.split_at(word_len);
        if after_secret_name || looks_random(word) {
            out.push_str(REDACTED);
        } else {
            out.push_str(word);
        }
        after_secret_name = names_a_secret(word);
        rest = after;
    }
    out
}

fn looks_random(word: &str) -> bool {
    word.chars().count() >= 16
        && word.chars().any(|c| c.is_ascii_alphabetic())
        && word.chars().any(|c| c.is_ascii_digit())
}

fn names_a_secret(word: &str) -> bool {
    let word = word.trim_matches(|c: char| !c.is_alphanumeric());
    let lower = word.to_ascii_lowercase();
    // `--token`, `api_key`, `client-secret`: the last piece of a compound name counts.
    let last = lower.rsplit(['-', '_', '.']).next().unwrap_or("");
    SECRET_NAMES.contains(&lower.as_str()) || SECRET_NAMES.contains(&last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_error_output_are_redacted() {
        let cases: &[(&str, &str)] = &[
            ("", ""),
            ("\n  \n", ""),
            ("first line\nno such file\n", "no such file"),
            (
                "kubeadm join --token abcdef.0123456789abcdef failed",
                "kubeadm join --token [redacted] failed",
            ),
            ("using abcdef.0123456789abcdef", "using [redacted]"),
            ("password=hunter2 rejected", "password=[redacted] rejected"),
            ("Password: hunter2", "Password: [redacted]"),
            ("client_secret='s3cr3t'", "client_secret='[redacted]'"),
            (
                "Authorization: Bearer abc",
                "Authorization: [redacted] [redacted]",
            ),
            (
                "sha256:0123456789abcdef0123456789abcdef mismatch",
                "sha256:[redacted] mismatch",
            ),
            (
                "bad key -----BEGIN PRIVATE KEY----- MIIEvQ",
                "bad key [redacted]",
            ),
            ("-----END CERTIFICATE-----", "[redacted]"),
            (
                "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln denied",
                "[redacted] denied",
            ),
            (
                "E: Unable to locate package containerd",
                "E: Unable to locate package containerd",
            ),
            (
                "Job for containerd.service failed because the control process exited",
                "Job for containerd.service failed because the control process exited",
            ),
            ("no key here", "no key [redacted]"),
        ];
        for (output, want) in cases {
            assert_eq!(tail(output), *want, "{output:?}");
        }
    }

    #[test]
    fn the_tail_is_short() {
        let long = "word ".repeat(100);
        let tail = tail(&long);
        assert_eq!(tail.chars().count(), TAIL_CHARS + 1, "{tail}");
        assert!(tail.starts_with('…') && tail.ends_with("word"));
    }
}
