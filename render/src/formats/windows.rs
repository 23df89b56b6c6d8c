//! The Windows formats: `powershell` (a `#ps1_sysnative` script), `powershell-aws` (the same
//! script inside `<powershell>` tags) and `windows-cloud-config` (cloud-config as cloudbase-init
//! reads it).
//!
//! One PowerShell script does the work in each: it writes the files (verbatim here-strings,
//! or base64 for text a here-string cannot carry), runs each command in a script block of its
//! own, stopping at the first error (`$ErrorActionPreference = 'Stop'`; a command that runs a
//! program checks its exit code itself), and writes the Cluster API sentinel
//! `C:\run\cluster-api\bootstrap-success.complete` last. The cloud-config writes the files
//! with `write_files` and the script to [`SCRIPT_PATH`], which its one `runcmd` entry starts:
//! cloudbase-init joins `runcmd` into a cmd.exe batch, so no command of a template is ever read
//! by cmd.exe. Windows formats have no systemd units, no boot reporter and no fetch stub: the
//! template compile refuses them (`CompiledTemplate::compile`).

use crd_types::FileEncoding;

use super::cloud_config::write_files;
use super::{Meta, SENTINEL_WINDOWS};
use crate::body::Body;
use crate::files::File;
use crate::helpers::push_yaml_double_quoted;
use crate::powershell::{here_string, quote};

/// Where the cloud-config puts the script.
pub(crate) const SCRIPT_PATH: &str = r"C:\bootplate\bootstrap.ps1";

/// The `runcmd` entry: cmd.exe starts the script with Windows PowerShell.
pub(crate) const RUN_SCRIPT: &str = r"powershell.exe -NoLogo -NoProfile -NonInteractive -ExecutionPolicy Bypass -File C:\bootplate\bootstrap.ps1";

/// Writes a file: parent directories first; a file whose mode gives others nothing (`0600`,
/// `0640`, `0700`) is created empty and made readable by SYSTEM and Administrators only
/// before its content goes in.
const WRITE_FILE: &str = r#"# Write-BootplateFile: writes -Text (or the bytes of -Base64, gunzipped with -Gzip) to -Path.
function Write-BootplateFile {
  param([string]$Path, [string]$Text, [string]$Base64, [switch]$Gzip, [switch]$Private)
  $directory = Split-Path -Parent $Path
  if ($directory) {
    New-Item -ItemType Directory -Force -Path $directory | Out-Null
  }
  if ($Private) {
    [IO.File]::WriteAllBytes($Path, [byte[]]@())
    & icacls.exe $Path /inheritance:r /grant:r '*S-1-5-18:F' '*S-1-5-32-544:F' | Out-Null
    if ($LASTEXITCODE -ne 0) {
      throw "bootplate: cannot restrict access to $Path"
    }
  }
  if ($Base64) {
    $bytes = [Convert]::FromBase64String($Base64)
    if ($Gzip) {
      $compressed = New-Object IO.MemoryStream -ArgumentList @(, $bytes)
      $gunzip = New-Object IO.Compression.GZipStream -ArgumentList $compressed, ([IO.Compression.CompressionMode]::Decompress)
      $plain = New-Object IO.MemoryStream
      $gunzip.CopyTo($plain)
      $bytes = $plain.ToArray()
    }
    [IO.File]::WriteAllBytes($Path, $bytes)
  } else {
    [IO.File]::WriteAllText($Path, $Text, (New-Object Text.UTF8Encoding -ArgumentList $false))
  }
}
"#;

/// The `powershell` output.
pub(super) fn write_powershell(meta: &Meta<'_>, body: &Body) -> String {
    format!("#ps1_sysnative\n{}", script(meta, body, true))
}

/// The `powershell-aws` output: the script between the tags EC2Launch (and cloudbase-init)
/// look for. They take the text up to the first `</powershell>`: the render refuses a body
/// that holds one (`check_windows`).
pub(super) fn write_powershell_aws(meta: &Meta<'_>, body: &Body) -> String {
    format!("<powershell>\n{}</powershell>\n", script(meta, body, true))
}

/// The `windows-cloud-config` output.
pub(super) fn write_cloud_config(meta: &Meta<'_>, body: &Body) -> String {
    let mut out = String::with_capacity(super::size_estimate(body) * 2);
    out.push_str("#cloud-config\n");
    out.push_str(&meta.comment());
    let script = File {
        path: SCRIPT_PATH.to_owned(),
        permissions: "0700".to_owned(),
        owner: String::new(),
        content: script(meta, body, false),
        encoding: FileEncoding::Plain,
    };
    let files: Vec<File> = body.files.iter().cloned().chain([script]).collect();
    write_files(&mut out, &files, false);
    out.push_str("runcmd:\n- ");
    push_yaml_double_quoted(&mut out, RUN_SCRIPT);
    out.push('\n');
    out
}

/// The script: the comment, strict mode, the files (when `files`: the cloud-config writes
/// them itself), the commands, the sentinel.
fn script(meta: &Meta<'_>, body: &Body, files: bool) -> String {
    let mut out = String::with_capacity(super::size_estimate(body) * 2);
    out.push_str(&meta.comment());
    out.push_str("$ErrorActionPreference = 'Stop'\n$ProgressPreference = 'SilentlyContinue'\n");
    if files && !body.files.is_empty() {
        out.push('\n');
        out.push_str(WRITE_FILE);
        for f in &body.files {
            write_file(&mut out, f);
        }
    } else if !files {
        // cloudbase-init's write_files gives a file the folder's access rules (its mode only
        // sets the read-only flag): the private ones are restricted before anything else.
        for f in body.files.iter().filter(|f| private(&f.permissions)) {
            let path = quote(&f.path);
            out.push_str(&format!(
                "& icacls.exe {path} /inheritance:r /grant:r '*S-1-5-18:F' '*S-1-5-32-544:F' | Out-Null\n\
                 if ($LASTEXITCODE -ne 0) {{\n  throw ('bootplate: cannot restrict access to ' + {path})\n}}\n"
            ));
        }
    }
    for command in &body.commands {
        out.push_str("\n& {\n");
        out.push_str(command);
        if !command.ends_with('\n') {
            out.push('\n');
        }
        out.push_str("}\n");
    }
    if !meta.stub {
        out.push('\n');
        for line in SENTINEL_WINDOWS {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// One `Write-BootplateFile` call.
fn write_file(out: &mut String, f: &File) {
    out.push_str("\nWrite-BootplateFile -Path ");
    out.push_str(&quote(&f.path));
    if private(&f.permissions) {
        out.push_str(" -Private");
    }
    match f.encoding {
        FileEncoding::Plain => {
            out.push_str(" -Text ");
            out.push_str(&here_string(&f.content));
        }
        FileEncoding::Base64 | FileEncoding::GzipBase64 => {
            out.push_str(" -Base64 ");
            let joined: String = f.content.split_ascii_whitespace().collect();
            out.push_str(&quote(&joined));
            if f.encoding == FileEncoding::GzipBase64 {
                out.push_str(" -Gzip");
            }
        }
    }
    out.push('\n');
}

/// Whether a mode gives others no access (its last octal digit is 0).
fn private(permissions: &str) -> bool {
    permissions.ends_with('0')
}

/// What the readers of a Windows output would take other than written: EC2Launch and
/// cloudbase-init end the `powershell-aws` script at the first `</powershell>`, and
/// cloudbase-init runs a `<script>…</script>` section anywhere in it with cmd.exe. Err says
/// which, without quoting the output (it may hold a token).
pub(crate) fn check_tags(format: crd_types::OutputFormat, text: &str) -> Result<(), String> {
    if format != crd_types::OutputFormat::PowershellAws {
        return Ok(());
    }
    let inner = text
        .strip_prefix("<powershell>")
        .and_then(|t| t.trim_end().strip_suffix("</powershell>"))
        .ok_or("the output is not a powershell-aws script: it must start with `<powershell>` and end with `</powershell>`")?;
    let lower = inner.to_ascii_lowercase();
    if lower.contains("</powershell>") || lower.contains("<powershell>") {
        return Err("the output holds a `<powershell>` or `</powershell>` tag inside the script: EC2Launch and cloudbase-init would end the script there".to_owned());
    }
    if lower.contains("<script>") {
        return Err("the output holds a `<script>` tag: cloudbase-init runs a `<script>…</script>` section with cmd.exe".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta<'static> {
        Meta {
            object: "ClusterBootstrapTemplate w",
            revision: "r",
            role: crd_types::Role::Worker,
            report: None,
            stub: false,
        }
    }

    fn body() -> Body {
        Body {
            files: vec![
                File {
                    path: r"C:\k\it's.yaml".into(),
                    permissions: "0600".into(),
                    owner: "root:root".into(),
                    content: "token: x\n'@\n".into(),
                    encoding: FileEncoding::Plain,
                },
                File {
                    path: r"C:\k\a.txt".into(),
                    permissions: "0644".into(),
                    owner: "root:root".into(),
                    content: "a\nb\n".into(),
                    encoding: FileEncoding::Plain,
                },
            ],
            units: Vec::new(),
            commands: vec!["Write-Output 'one'".into(), "exit 3\n".into()],
            command_parts: vec![("p".into(), 2)],
        }
    }

    #[test]
    fn the_script_writes_files_runs_commands_and_the_sentinel_and_parses() {
        let out = write_powershell(&meta(), &body());
        assert!(
            out.starts_with("#ps1_sysnative\n# Rendered by bootplate"),
            "{out}"
        );
        assert!(
            out.contains(
                "Write-BootplateFile -Path 'C:\\k\\it''s.yaml' -Private -Text ([Text.Encoding]"
            ),
            "{out}"
        );
        assert!(
            out.contains("-Path 'C:\\k\\a.txt' -Text @'\na\nb\n\n'@\n"),
            "{out}"
        );
        let one = out.find("Write-Output 'one'").unwrap();
        let exit = out.find("exit 3").unwrap();
        let sentinel = out.find("bootstrap-success.complete").unwrap();
        assert!(one < exit && exit < sentinel, "{out}");
        assert_eq!(crate::powershell::syntax_errors(&out, 5), vec![], "{out}");
        let aws = write_powershell_aws(&meta(), &body());
        assert!(check_tags(crd_types::OutputFormat::PowershellAws, &aws).is_ok());
    }

    #[test]
    fn the_cloud_config_writes_the_script_and_starts_it_once() {
        let out = write_cloud_config(&meta(), &body());
        let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        let files = doc["write_files"].as_sequence().unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(files[2]["path"].as_str(), Some(SCRIPT_PATH));
        let script = files[2]["content"].as_str().unwrap();
        assert!(!script.contains("Write-BootplateFile"), "{script}");
        assert_eq!(crate::powershell::syntax_errors(script, 5), vec![]);
        assert_eq!(doc["runcmd"][0].as_str(), Some(RUN_SCRIPT));
        assert_eq!(doc.as_mapping().unwrap().len(), 2, "{out}");
    }

    /// A raw template's output is checked as its reader takes it; the messages quote none of it.
    #[test]
    fn raw_windows_outputs_are_checked() {
        use crd_types::OutputFormat::{Powershell, PowershellAws, WindowsCloudConfig};
        let check = super::super::check_raw;
        assert!(
            check(
                WindowsCloudConfig,
                "#cloud-config\nwrite_files: []\nruncmd: [dir]\n"
            )
            .is_ok()
        );
        let e = check(WindowsCloudConfig, "#cloud-config\nbootcmd: [secret-x]\n").unwrap_err();
        assert!(e.contains("`bootcmd`") && !e.contains("secret-x"), "{e}");
        assert!(check(WindowsCloudConfig, "runcmd: [dir]\n").is_err());
        assert!(check(Powershell, "#ps1_sysnative\nWrite-Output 'x'\n").is_ok());
        assert!(
            check(Powershell, "Write-Output 'x'\n")
                .unwrap_err()
                .contains("#ps1_sysnative")
        );
        let e = check(Powershell, "#ps1_sysnative\nif ($a { 'secret-x' }\n").unwrap_err();
        assert!(
            e.contains("output line 2") && !e.contains("secret-x"),
            "{e}"
        );
        assert!(
            check(
                PowershellAws,
                "<powershell>\nWrite-Output 'x'\n</powershell>\n"
            )
            .is_ok()
        );
        assert!(check(PowershellAws, "<powershell>\nif ($a {\n</powershell>\n").is_err());
    }

    #[test]
    fn tags_inside_an_aws_script_are_refused() {
        let aws = crd_types::OutputFormat::PowershellAws;
        for inner in ["x </powershell> y", "<script>dir</script>", "<PowerShell>"] {
            let text = format!("<powershell>\n{inner}\n</powershell>\n");
            assert!(check_tags(aws, &text).is_err(), "{inner}");
        }
    }
}
