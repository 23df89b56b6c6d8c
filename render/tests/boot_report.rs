//! The boot reporter in the user-data (docs/boot-channel.md): every format runs its steps under
//! it and still passes its consumer's checks; the library passes shellcheck as POSIX sh; and the
//! script render, run by bash with a recording `curl` on its PATH, sends a report naming the
//! failing part, step and status, with the token and the Secret values redacted.

mod common;

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use crd_types::{BootplateConfigSpec, Role};
use render::{BootReport, CompiledTemplate, SAMPLE_TOKEN, sample_context};

const SECRET_VALUE: &str = "correct horse battery staple";

fn spec(format: &str, extra: &str) -> crd_types::TemplateSpec {
    common::spec_yaml(&format!(
        r#"
os: {{name: linux}}
format: {format}
{extra}
parts:
- name: install
  files:
  - path: /etc/demo/install.conf
    content: "installed\n"
  units:
  - name: demo.service
    content: "[Service]\nExecStart=/bin/true\n"
  commands: ["echo installing"]
- name: join
  commands:
  - printf '\033[0;37mCONFIG_NAMESPACES\033[0m=enabled\n' >&2; echo "joining with {{{{join.token}}}} and {SECRET_VALUE}" >&2; sh -c 'exit 3'
  - echo never
"#
    ))
}

fn report() -> BootReport {
    BootReport {
        server: "https://127.0.0.1:1".into(),
        ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----".into(),
        namespace: "kube-system".into(),
        name: "bootplate-boot-uid".into(),
        metadata: r#"{"name":"bootplate-boot-uid","namespace":"kube-system"}"#.into(),
        token: SAMPLE_TOKEN.into(),
        secrets: vec![format!("{SECRET_VALUE}\n")],
        min_interval_seconds: 0,
    }
}

fn render(format: &str, extra: &str, with_report: bool) -> String {
    let compiled = CompiledTemplate::compile("t", &spec(format, extra)).unwrap();
    let mut ctx = sample_context(Role::Worker);
    ctx.boot_report = with_report.then(report);
    let rendered = compiled
        .render(&BootplateConfigSpec::default(), &ctx)
        .unwrap();
    String::from_utf8(rendered.data).unwrap()
}

/// The commands script of an Ignition config.
fn ignition_script(config: &str) -> String {
    let config: serde_json::Value = serde_json::from_str(config).unwrap();
    let files = config["storage"]["files"].as_array().unwrap();
    let script = files
        .iter()
        .find(|f| f["path"] == "/etc/bootplate/bootstrap.sh")
        .unwrap();
    let source = script["contents"]["source"].as_str().unwrap();
    if let Some(encoded) = source.strip_prefix("data:;base64,") {
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded);
        return String::from_utf8(decoded.unwrap()).unwrap();
    }
    // A percent-encoded data URL, decoded as Ignition's Go reader does (Python's the same).
    let text = source.strip_prefix("data:,").expect("a data URL");
    let decode = "import sys, urllib.parse; sys.stdout.write(urllib.parse.unquote(sys.argv[1]))";
    common::run_tool("python3", &["-c", decode, text])
}

#[test]
fn every_format_runs_its_steps_under_the_reporter_and_passes_its_checks() {
    let dir = tempfile::tempdir().unwrap();
    for format in ["cloud-config", "script", "mime-multipart", "ignition"] {
        let text = render(format, "", true);
        let path = dir.path().join(format);
        std::fs::write(&path, &text).unwrap();
        let commands = match format {
            "cloud-config" => {
                common::check_cloud_config(&path);
                text.clone()
            }
            "script" => {
                common::check_script(&path);
                text.clone()
            }
            "mime-multipart" => {
                common::check_mime(&path);
                text.clone()
            }
            _ => {
                common::check_ignition(&path);
                ignition_script(&text)
            }
        };
        for step in [
            "bootplate_report_start",
            "bootplate_step 'install' command 0",
            "bootplate_step 'join' command 1",
            "bootplate_report_done",
        ] {
            assert!(
                commands.contains(step),
                "{format}: no `{step}`:\n{commands}"
            );
        }
        assert!(text.contains("/etc/bootplate/boot-report.sh"), "{format}");
        // Without a report target, or with reports turned off, no reporter.
        let plain = render(format, "", false);
        let off = render(format, "bootReports: Disabled", true);
        for (what, text) in [("no target", plain), ("Disabled", off)] {
            assert!(!text.contains("bootplate_step"), "{format}, {what}");
            assert!(!text.contains("boot-report.sh"), "{format}, {what}");
        }
    }
}

#[test]
fn the_library_is_posix_sh_that_shellcheck_accepts() {
    // The library is the heredoc of its `bootplate_write_file` in the script.
    let text = render("script", "", true);
    let mut lines = text.lines();
    let write = lines
        .find(|l| l.starts_with("bootplate_write_file '/etc/bootplate/boot-report.sh'"))
        .unwrap();
    let delimiter = write.rsplit("<<").next().unwrap().trim_matches('\'');
    let library: Vec<&str> = lines.take_while(|l| *l != delimiter).collect();
    assert!(library.len() > 50, "{library:?}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("boot-report.sh");
    std::fs::write(&path, library.join("\n") + "\n").unwrap();
    let path = path.to_string_lossy();
    common::run_tool("sh", &["-n", &path]);
    common::run_tool("shellcheck", &["--shell=sh", "--severity=style", &path]);
}

/// Runs the script render with its paths under `root`, a `curl` that records what it sends
/// and a `systemctl` that does nothing; returns its exit status and the reports sent, decoded.
fn run_script(script: &str, root: &Path) -> (Option<i32>, Vec<String>) {
    let r = root.to_string_lossy();
    let mut script = script
        .replace("/etc/", &format!("{r}/etc/"))
        .replace("/run/", &format!("{r}/run/"));
    if !nix_root() {
        script = script.replace("  chown -- \"$3\" \"$1\"\n", "");
    }
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let curl = bin.join("curl");
    std::fs::write(
        &curl,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in @*/body) cat \"${{a#@}}\" >> {r}/sent; echo >> {r}/sent;; esac; done\n"
        ),
    )
    .unwrap();
    // systemctl does nothing here: the units are files under `root`.
    std::fs::write(bin.join("systemctl"), "#!/bin/sh\nexit 0\n").unwrap();
    for program in ["curl", "systemctl"] {
        Command::new("chmod")
            .arg("+x")
            .arg(bin.join(program))
            .status()
            .unwrap();
    }
    let path = root.join("user-data.sh");
    std::fs::write(&path, script).unwrap();
    let status = Command::new("bash")
        .arg(&path)
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .output()
        .unwrap()
        .status;
    let sent = std::fs::read_to_string(root.join("sent")).unwrap_or_default();
    let reports = sent
        .lines()
        .map(|l| {
            let body: serde_json::Value = serde_json::from_str(l).unwrap();
            let encoded = body["data"]["report"].as_str().unwrap();
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap();
            String::from_utf8(decoded).unwrap()
        })
        .collect();
    (status.code(), reports)
}

fn nix_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
}

#[test]
fn a_failing_step_is_reported_with_its_output_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let script = render("script", "", true);
    let (status, reports) = run_script(&script, dir.path());
    assert_eq!(status, Some(3), "the failing step's status ends the boot");
    let last = reports.last().expect("reports were sent");
    assert!(
        last.starts_with("bootplate-boot-report 1\nstate failed\n"),
        "{last}"
    );
    assert!(last.contains("failed command 0 3 join\ntail\n"), "{last}");
    assert!(
        last.contains("\njoining with [redacted] and [redacted]\n"),
        "{last}"
    );
    assert!(
        last.contains("\nCONFIG_NAMESPACES=enabled\n") && !last.contains('\u{1b}'),
        "a colour code is removed, not taken for a random word: {last}"
    );
    let parts: Vec<&str> = last.lines().filter(|l| l.starts_with("part ")).collect();
    assert_eq!(parts.len(), 4, "files, units, install, join: {last}");
    assert!(parts[3].contains(" - join"), "join still runs: {last}");
    for report in &reports {
        assert!(!report.contains(SAMPLE_TOKEN), "{report}");
        assert!(!report.contains(SECRET_VALUE), "{report}");
    }
    // The file steps of the script format come first, each announced.
    assert!(
        script.contains(
            "bootplate_step 'files' file 0\nbootplate_write_file '/etc/demo/install.conf'"
        )
    );
}
