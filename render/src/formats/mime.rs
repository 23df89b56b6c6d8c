//! `mime-multipart`: a cloud-init MIME archive with a cloud-config part (the files and unit
//! files) and a shell script part (units, commands, sentinel). cloud-init writes the files in
//! its init stage and runs the script later, in its final stage, so the commands see the files.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};

use super::{Meta, all_commands, cloud_config, files_to_write, script};
use crate::body::Body;

/// The MIME archive of `body`.
pub(super) fn write(meta: &Meta<'_>, body: &Body) -> String {
    if meta.stub {
        // A fetch stub has no files: its shell part alone.
        let mut shell = script::header(meta);
        script::commands(&mut shell, &all_commands(body, None, false));
        return archive(&[("text/x-shellscript", "bootstrap.sh", &shell)]);
    }
    let mut config = cloud_config::header(meta);
    cloud_config::write_files(&mut config, &files_to_write(body, meta.report), true);
    let mut shell = script::header(meta);
    script::commands(&mut shell, &all_commands(body, meta.report, true));
    archive(&[
        ("text/cloud-config", "cloud-config.yaml", &config),
        ("text/x-shellscript", "bootstrap.sh", &shell),
    ])
}

/// A `multipart/mixed` archive. The boundary is derived from the parts' content, so the output
/// is deterministic and the boundary cannot occur in a part. Parts that are all ASCII are
/// written as they are; others are base64 (cloud-init decodes 8-bit parts inconsistently).
fn archive(parts: &[(&str, &str, &str)]) -> String {
    let mut hasher = Sha256::new();
    for (_, _, content) in parts {
        hasher.update(content.as_bytes());
    }
    let mut boundary = format!("bootplate-{}", &hex::encode(hasher.finalize())[..24]);
    while parts.iter().any(|(_, _, c)| c.contains(&boundary)) {
        boundary.push('x');
    }
    let mut out =
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n");
    for (content_type, file_name, content) in parts {
        out.push_str(&format!(
            "--{boundary}\nContent-Type: {content_type}; charset=\"utf-8\"\nMIME-Version: 1.0\n"
        ));
        out.push_str(&format!(
            "Content-Disposition: attachment; filename=\"{file_name}\"\n"
        ));
        if content.is_ascii() {
            out.push_str("Content-Transfer-Encoding: 7bit\n\n");
            out.push_str(content);
        } else {
            out.push_str("Content-Transfer-Encoding: base64\n\n");
            let encoded = BASE64.encode(content.as_bytes());
            for chunk in encoded.as_bytes().chunks(76) {
                out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
                out.push('\n');
            }
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out.push_str(&format!("--{boundary}--\n"));
    out
}

/// A raw template's MIME output: a `multipart/...` Content-Type header with a boundary, and the
/// closing delimiter of that boundary.
pub(super) fn check(text: &str) -> Result<(), String> {
    let headers = text.split("\n\n").next().unwrap_or("");
    let content_type = headers
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.trim())
        })
        .ok_or("the output is not a MIME archive: it has no Content-Type header")?;
    if !content_type.to_ascii_lowercase().starts_with("multipart/") {
        return Err(
            "the output is not a MIME multi-part archive: its Content-Type is not multipart/*"
                .to_owned(),
        );
    }
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"'))
        .filter(|b| !b.is_empty())
        .ok_or("the output is not a MIME multi-part archive: its Content-Type has no boundary")?;
    if text.contains(&format!("--{boundary}--")) {
        Ok(())
    } else {
        Err("the output is not a complete MIME archive: the closing boundary is missing".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_is_checkable_and_non_ascii_parts_are_base64() {
        let a = archive(&[("text/x-shellscript", "a.sh", "#!/bin/sh\necho é\n")]);
        assert!(check(&a).is_ok(), "{a}");
        assert!(a.contains("Content-Transfer-Encoding: base64"));
        assert!(check("Content-Type: text/plain\n\nx").is_err());
        assert!(check("Content-Type: multipart/mixed; boundary=\"b\"\n\n--b\n").is_err());
    }
}
