//! The Windows templates (`templates/windows-2022-kubeadm*.yaml`): rendered and checked by
//! cloudbase-init's own code, never booted on Windows.
//!
//! Each template is rendered for a worker with the `bootplate render` binary at Kubernetes
//! v1.30 and v1.31, with the defaults, with every variable and the network input set, and with
//! hostile variable values; the `powershell` one also as `powershell-aws`. Each render is
//! - compared byte for byte with `templates/golden/<template>/` (`BOOTPLATE_UPDATE_GOLDEN=1`
//!   rewrites them; the CA hash of the command line's throw-away CA is zeroed);
//! - read by cloudbase-init 1.1.9 (tests/windows/harness.py: its user-data plugin, cloud-config
//!   plugins and script handling, with its Windows OS layer replaced by a stand-in that writes
//!   into a sandbox and records the commands): no record at warning level or above (an unknown
//!   directive is logged as "not supported"), no path outside a drive, the files land at their
//!   Windows paths with their content, and the one command goes to the shell it must: cmd.exe
//!   for `runcmd` (which starts the PowerShell script), PowerShell (64-bit, sysnative) for the
//!   scripts;
//! - parsed: every PowerShell script in it parses with no error (the tree-sitter PowerShell
//!   grammar, `render::powershell`).
//!
//! The Python environment comes from tests/windows/cloudbase-init.sh (made once, cached).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use serde_json::{Value, json};

const CLOUD_CONFIG: &str = "windows-2022-kubeadm";
const POWERSHELL: &str = "windows-2022-kubeadm-powershell";
const VERSIONS: [&str; 2] = ["v1.30", "v1.31"];
const TOKEN: &str = "abcdef.0123456789abcdef";
const SCRIPT_PATH: &str = r"C:\bootplate\bootstrap.ps1";
const JOIN_CONFIG: &str = r"C:\k\kubeadm-join-config.yaml";
const CONTAINERD_CONFIG: &str = r"C:\Program Files\containerd\config.toml";
const SENTINEL: &str =
    r"Set-Content -Path 'C:\run\cluster-api\bootstrap-success.complete' -Value 'success'";
/// Quotes of every kind PowerShell knows, `$()`, backticks, a newline, a here-string end.
const HOSTILE: &str = "a'b\u{2019}c\"d $(Remove-Item C:\\ -Recurse) `whoami`;x\n'@\ny";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// A render: which template, version and config.
#[derive(Clone, Debug)]
struct Case {
    template: &'static str,
    version: &'static str,
    /// `default`, `configured` or `hostile`.
    variant: &'static str,
    /// Rendered as `powershell-aws` (from a copy of the template with that format).
    aws: bool,
}

impl Case {
    fn label(&self) -> String {
        let aws = if self.aws { "-aws" } else { "" };
        match self.variant {
            "default" => format!("worker-{}{aws}", self.version),
            v => format!("worker-{}-{v}{aws}", self.version),
        }
    }

    fn golden(&self) -> PathBuf {
        let ext = if self.template == CLOUD_CONFIG {
            "yaml"
        } else {
            "ps1"
        };
        repo()
            .join("templates/golden")
            .join(self.template)
            .join(format!("{}.{ext}", self.label()))
    }
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for template in [CLOUD_CONFIG, POWERSHELL] {
        for version in VERSIONS {
            for variant in ["default", "configured", "hostile"] {
                out.push(Case {
                    template,
                    version,
                    variant,
                    aws: false,
                });
            }
        }
    }
    out.push(Case {
        template: POWERSHELL,
        version: "v1.31",
        variant: "configured",
        aws: true,
    });
    out
}

/// The variables and network input of the `configured` and `hostile` renders.
fn config(variant: &str) -> Value {
    let (labels, taint) = match variant {
        "hostile" => (HOSTILE, HOSTILE),
        _ => ("os=windows", "windows"),
    };
    json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "BootplateConfig",
        "metadata": {"name": "windows-workers", "namespace": "team-a"},
        "spec": {
            "templateRef": {"kind": "ClusterBootstrapTemplate", "name": "t"},
            "variables": {
                "containerdVersion": "1.7.25",
                "sandboxImage": "registry.example.com/pause:3.10",
                "kubeletExtraArgs": {"node-labels": labels, "cloud-provider": "external"},
                "nodeTaints": [{"key": "os", "value": taint, "effect": "NoSchedule"}],
                "nodeNameFromHostname": variant == "hostile",
                "kubeadmIgnorePreflightErrors": ["SystemVerification"],
            },
            "network": {
                "proxy": {"http": "http://proxy.example.com:3128", "noProxy": ["corp.example.com"]},
                "caBundles": [{"name": "corp", "inline": render::network::SAMPLE_CA_PEM}],
                "ntpServers": ["time.example.com"],
                "registryMirrors": [{"registry": "docker.io", "endpoints": [{"url": "https://mirror.example.com"}]}],
                "imageRepository": "registry.example.com/k8s",
                "artifacts": [{"name": "kubelet", "url": "https://files.example.com/kubelet.exe", "sha256": "ab".repeat(32)}],
            },
        },
    })
}

/// `bootplate render` of `case` for a worker, in `dir`.
fn render(case: &Case, dir: &Path) -> Vec<u8> {
    let mut template = repo().join(format!("templates/{}.yaml", case.template));
    if case.aws {
        let text = std::fs::read_to_string(&template).expect("the template");
        let copy = dir.join("aws.yaml");
        let changed = text.replace("  format: powershell\n", "  format: powershell-aws\n");
        assert_ne!(changed, text, "the template names its format");
        std::fs::write(&copy, changed).expect("write");
        template = copy;
    }
    let machine = repo().join(format!(
        "templates/testdata/machine-worker-{}.yaml",
        case.version
    ));
    let mut args: Vec<String> = ["render", "--role", "worker", "--token", TOKEN]
        .map(str::to_owned)
        .to_vec();
    for (flag, path) in [
        ("--template", template),
        ("--machine", machine),
        ("--cluster", repo().join("templates/testdata/cluster.yaml")),
    ] {
        args.extend([flag.to_owned(), path.to_string_lossy().into_owned()]);
    }
    if case.variant != "default" {
        let path = dir.join("config.yaml");
        let text = serde_yaml::to_string(&config(case.variant)).expect("YAML");
        std::fs::write(&path, text).expect("write");
        args.extend(["--config".to_owned(), path.to_string_lossy().into_owned()]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .args(&args)
        .output()
        .expect("bootplate runs");
    assert!(
        out.status.success(),
        "{}: {}",
        case.label(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `text` with every `sha256:` and 64 hex digits zeroed (the command line's CA is new each run).
fn zero_ca_hashes(text: &str) -> String {
    let pattern = regex::Regex::new("sha256:[0-9a-f]{64}").expect("a pattern");
    pattern
        .replace_all(text, format!("sha256:{}", "0".repeat(64)))
        .into_owned()
}

fn check_golden(case: &Case, data: &[u8]) {
    let path = case.golden();
    let text = zero_ca_hashes(&String::from_utf8_lossy(data));
    if std::env::var_os("BOOTPLATE_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&path, &text).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (BOOTPLATE_UPDATE_GOLDEN=1 writes it)",
            path.display()
        )
    });
    assert!(
        expected == text,
        "{} differs from the render; if intended, BOOTPLATE_UPDATE_GOLDEN=1 rewrites it",
        path.display()
    );
}

/// The Python with cloudbase-init (made once by tests/windows/cloudbase-init.sh).
fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = Command::new(repo().join("tests/windows/cloudbase-init.sh"))
                .output()
                .expect("tests/windows/cloudbase-init.sh runs");
            assert!(
                out.status.success(),
                "tests/windows/cloudbase-init.sh: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout)
                .expect("a path")
                .trim()
                .to_owned()
        })
        .clone()
}

/// What cloudbase-init did with `data` (tests/windows/harness.py's report), after checking
/// that it logged nothing at warning level or above and wrote nowhere but under a drive.
fn cloudbase_init(what: &str, data: &[u8], dir: &Path) -> Value {
    let user_data = dir.join("user-data");
    std::fs::write(&user_data, data).expect("write");
    let out = Command::new(python())
        .arg(repo().join("tests/windows/harness.py"))
        .arg(&user_data)
        .arg(dir.join("sandbox"))
        .output()
        .expect("the harness runs");
    assert!(
        out.status.success(),
        "{what}: harness: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("the harness's JSON");
    let complaints: Vec<&Value> = report["log"]
        .as_array()
        .expect("log")
        .iter()
        .filter(|r| {
            let message = r["message"].as_str().unwrap_or_default().to_lowercase();
            !matches!(r["level"].as_str(), Some("DEBUG" | "INFO"))
                || message.contains("not supported")
                || message.contains("unsupported")
        })
        .collect();
    // What cloudbase-init logged, the bootstrap token masked.
    let shown = format!("{complaints:?}").replace(TOKEN, "<token>");
    assert!(complaints.is_empty(), "{what}: cloudbase-init: {shown}");
    assert_eq!(report["path_errors"], json!([]), "{what}");
    report
}

/// The files cloudbase-init wrote: Windows path → bytes.
fn written(report: &Value) -> BTreeMap<String, Vec<u8>> {
    let base64 = base64::engine::general_purpose::STANDARD;
    report["files"]
        .as_object()
        .expect("files")
        .iter()
        .map(|(path, data)| {
            let bytes = base64
                .decode(data.as_str().expect("base64"))
                .expect("base64");
            (path.clone(), bytes)
        })
        .collect()
}

/// The one command cloudbase-init handed on: its shell and the script it was given.
fn one_command(what: &str, report: &Value) -> (String, bool, String) {
    let commands = report["commands"].as_array().expect("commands");
    assert_eq!(commands.len(), 1, "{what}: {commands:?}");
    let c = &commands[0];
    (
        c["shell"].as_str().expect("shell").to_owned(),
        c["sysnative"].as_bool().unwrap_or(false),
        c["script"].as_str().expect("script").to_owned(),
    )
}

fn check_parses(what: &str, script: &str) {
    let errors = render::powershell::syntax_errors(script, 5);
    assert!(errors.is_empty(), "{what}: PowerShell syntax: {errors:?}");
}

/// The cloud-config render: cloudbase-init writes exactly its `write_files` (the script among
/// them) and hands cmd.exe one batch that starts the script with PowerShell.
fn check_cloud_config(what: &str, data: &[u8], report: &Value) -> BTreeMap<String, Vec<u8>> {
    let doc: Value = serde_yaml::from_slice(data).expect("YAML");
    let keys: Vec<&String> = doc.as_object().expect("a map").keys().collect();
    assert_eq!(keys, ["runcmd", "write_files"], "{what}");
    let expected: BTreeMap<String, Vec<u8>> = doc["write_files"]
        .as_array()
        .expect("write_files")
        .iter()
        .map(|f| {
            let path = f["path"].as_str().expect("path").to_owned();
            (
                path,
                f["content"].as_str().expect("content").as_bytes().to_vec(),
            )
        })
        .collect();
    let files = written(report);
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "{what}"
    );
    assert!(files == expected, "{what}: a file's content differs");
    let (shell, _, batch) = one_command(what, report);
    assert_eq!(shell, "cmd", "{what}");
    assert_eq!(
        batch,
        format!("rem cmd\n{}\n", doc["runcmd"][0].as_str().expect("runcmd")),
        "{what}"
    );
    assert!(
        batch.contains(&format!("-File {SCRIPT_PATH}")),
        "{what}: {batch}"
    );
    let script = String::from_utf8(files[SCRIPT_PATH].clone()).expect("UTF-8");
    check_parses(&format!("{what}: {SCRIPT_PATH}"), &script);
    assert_eq!(script.trim_end().lines().last(), Some(SENTINEL), "{what}");
    files
}

/// The script renders: cloudbase-init hands the whole script (between the tags for
/// `powershell-aws`) to 64-bit PowerShell. Returns the files the script writes.
fn check_script(what: &str, case: &Case, data: &[u8], report: &Value) -> BTreeMap<String, Vec<u8>> {
    let text = String::from_utf8(data.to_vec()).expect("UTF-8");
    let (shell, sysnative, script) = one_command(what, report);
    assert_eq!((shell.as_str(), sysnative), ("powershell", true), "{what}");
    if case.aws {
        let inner = text
            .strip_prefix("<powershell>")
            .and_then(|t| t.trim_end().strip_suffix("</powershell>"))
            .expect("the tags");
        assert_eq!(script, inner.trim(), "{what}");
    } else {
        assert!(text.starts_with("#ps1_sysnative\n"), "{what}");
        assert_eq!(script, text, "{what}");
    }
    assert_eq!(
        written(report),
        BTreeMap::new(),
        "{what}: the script writes its files itself"
    );
    check_parses(what, &script);
    assert_eq!(script.trim_end().lines().last(), Some(SENTINEL), "{what}");
    files_of_script(&script)
}

/// The files a script of the powershell format writes (its `Write-BootplateFile` calls, as the
/// writer lays them out): path → content.
fn files_of_script(script: &str) -> BTreeMap<String, Vec<u8>> {
    let call = regex::Regex::new(
        r"(?ms)^Write-BootplateFile -Path '((?:[^']|'')*)'(?: -Private)? -Text (?:@'\n(.*?)\n'@$|\(\[Text\.Encoding\]::UTF8\.GetString\(\[Convert\]::FromBase64String\('([A-Za-z0-9+/=]*)'\)\)\))",
    )
    .expect("a pattern");
    let base64 = base64::engine::general_purpose::STANDARD;
    call.captures_iter(script)
        .map(|c| {
            let path = c[1].replace("''", "'");
            let content = match (c.get(2), c.get(3)) {
                (Some(text), _) => text.as_str().as_bytes().to_vec(),
                (_, Some(encoded)) => base64.decode(encoded.as_str()).expect("base64"),
                _ => unreachable!(),
            };
            (path, content)
        })
        .collect()
}

/// The kubeadm configuration: a JoinConfiguration of the version's API, with the token, the
/// containerd pipe, the worker taint, and (configured) the variables' values as data.
fn check_join_config(what: &str, case: &Case, files: &BTreeMap<String, Vec<u8>>) {
    let doc: Value = serde_yaml::from_slice(&files[JOIN_CONFIG]).expect("kubeadm YAML");
    let api = if case.version == "v1.30" {
        "v1beta3"
    } else {
        "v1beta4"
    };
    assert_eq!(doc["apiVersion"], format!("kubeadm.k8s.io/{api}"), "{what}");
    assert_eq!(doc["kind"], "JoinConfiguration", "{what}");
    assert_eq!(doc["discovery"]["bootstrapToken"]["token"], TOKEN, "{what}");
    let registration = &doc["nodeRegistration"];
    assert_eq!(
        registration["criSocket"], "npipe:////./pipe/containerd-containerd",
        "{what}"
    );
    assert_eq!(
        registration["taints"][0]["key"], "node.cluster.x-k8s.io/uninitialized",
        "{what}"
    );
    if case.variant == "default" {
        return;
    }
    let labels = if case.variant == "hostile" {
        HOSTILE
    } else {
        "os=windows"
    };
    let args = &registration["kubeletExtraArgs"];
    let found = if case.version == "v1.30" {
        args["node-labels"].clone()
    } else {
        args.as_array()
            .expect("a list")
            .iter()
            .find(|a| a["name"] == "node-labels")
            .expect("node-labels")["value"]
            .clone()
    };
    assert_eq!(found, labels, "{what}");
}

fn check_case(case: &Case) {
    let what = format!("{} {}", case.template, case.label());
    let dir = tempfile::tempdir().expect("a temp dir");
    let data = render(case, dir.path());
    check_golden(case, &data);
    let report = cloudbase_init(&what, &data, dir.path());
    let files = if case.template == CLOUD_CONFIG {
        check_cloud_config(&what, &data, &report)
    } else {
        check_script(&what, case, &data, &report)
    };
    let mut paths: Vec<&str> = files.keys().map(String::as_str).collect();
    paths.retain(|p| *p != SCRIPT_PATH);
    assert_eq!(paths, [CONTAINERD_CONFIG, JOIN_CONFIG], "{what}");
    let image = match case.variant {
        "default" => "registry.k8s.io/pause:3.10",
        _ => "registry.example.com/pause:3.10",
    };
    let containerd = String::from_utf8_lossy(&files[CONTAINERD_CONFIG]);
    assert!(
        containerd.contains(&format!("sandbox_image = \"{image}\"")),
        "{what}: {containerd}"
    );
    check_join_config(&what, case, &files);
    let script = match files.get(SCRIPT_PATH) {
        Some(script) => String::from_utf8_lossy(script).into_owned(),
        None => String::from_utf8_lossy(&data).into_owned(),
    };
    if case.variant != "default" {
        // The network input, as the script takes it.
        for taken in [
            "Import-Certificate -FilePath $bundle -CertStoreLocation 'Cert:\\LocalMachine\\Root'",
            "Join-Path 'C:\\Program Files\\containerd\\certs.d' 'docker.io'",
            "HTTP_PROXY = 'http://proxy.example.com:3128'",
            "$servers = @('time.example.com')",
            "@('kubelet', 'https://files.example.com/kubelet.exe', 'abab",
            "# network.imageRepository is for the first control-plane machine only",
        ] {
            assert!(script.contains(taken), "{what}: {taken}");
        }
    }
    if case.variant == "hostile" {
        // The hostile text stands in the script as one single-quoted string, each quote
        // doubled: PowerShell reads it back as it was (the script's own check then refuses it
        // as a kubelet flag, before the service is made).
        let quoted = format!(
            "'{}'",
            HOSTILE
                .replace('\'', "''")
                .replace('\u{2019}', "\u{2019}\u{2019}")
        );
        let expected = format!("$kubeletArgs += ('--' + 'node-labels' + '=' + {quoted})");
        assert!(script.contains(&expected), "{what}: {expected}");
    }
}

#[test]
fn every_windows_render_is_read_by_cloudbase_init_and_parses() {
    let cases = cases();
    std::thread::scope(|scope| {
        for chunk in cases.chunks(cases.len().div_ceil(4)) {
            scope.spawn(move || chunk.iter().for_each(check_case));
        }
    });
}

/// Both templates write the same files: the cloud-config's `write_files` and the script's
/// `Write-BootplateFile` calls, byte for byte (the script aside).
#[test]
fn both_outputs_write_the_same_files() {
    for version in VERSIONS {
        for variant in ["default", "configured"] {
            let case = |template| Case {
                template,
                version,
                variant,
                aws: false,
            };
            let dir = tempfile::tempdir().expect("a temp dir");
            let yaml: Value =
                serde_yaml::from_slice(&render(&case(CLOUD_CONFIG), dir.path())).expect("YAML");
            let mut from_yaml: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            for f in yaml["write_files"].as_array().expect("write_files") {
                let content = zero_ca_hashes(f["content"].as_str().expect("content"));
                from_yaml.insert(f["path"].as_str().expect("path").to_owned(), content.into());
            }
            from_yaml.remove(SCRIPT_PATH);
            let script = zero_ca_hashes(&String::from_utf8_lossy(&render(
                &case(POWERSHELL),
                dir.path(),
            )));
            let from_script = files_of_script(&script);
            assert!(from_yaml == from_script, "{version} {variant}");
        }
    }
}

/// Windows runs no control plane: `init` and `control-plane-join` renders fail, naming the
/// template's `format` line and the role.
#[test]
fn control_plane_roles_are_refused() {
    for template in [CLOUD_CONFIG, POWERSHELL] {
        for (role, machine) in [
            ("init", "machine-control-plane-v1.31.yaml"),
            ("control-plane-join", "machine-control-plane-v1.31.yaml"),
        ] {
            let path = format!("templates/{template}.yaml");
            let out = Command::new(env!("CARGO_BIN_EXE_bootplate"))
                .current_dir(repo())
                .args(["render", "--role", role, "--template", &path])
                .args(["--machine", &format!("templates/testdata/{machine}")])
                .args(["--cluster", "templates/testdata/cluster.yaml"])
                .output()
                .expect("bootplate runs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{template} {role}: {stderr}");
            assert!(
                stderr.contains(&format!(
                    "{path}:12:11: ClusterBootstrapTemplate {template}: spec.format:"
                )) && stderr.contains("Windows cannot run a Kubernetes control plane")
                    && stderr.contains(&format!("role is {role}")),
                "{template} {role}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{template} {role}");
        }
    }
}

/// The templates lint clean, their variables are documented, typed and defaulted, and their
/// page lists every variable; the two templates hold the same spec but for `format`.
#[test]
fn the_templates_lint_clean_and_are_documented() {
    let read = |name: &str| -> crd_types::ClusterBootstrapTemplate {
        let path = repo().join(format!("templates/{name}.yaml"));
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("template")).expect("YAML")
    };
    let page = std::fs::read_to_string(repo().join("docs/templates/windows-2022-kubeadm.md"))
        .expect("docs/templates/windows-2022-kubeadm.md");
    let catalogue = std::fs::read_to_string(repo().join("docs/templates.md")).expect("docs");
    for name in [CLOUD_CONFIG, POWERSHELL] {
        let spec = read(name).spec.0;
        let problems = render::lint(&format!("ClusterBootstrapTemplate {name}"), &spec, None);
        assert!(problems.is_empty(), "{name}: {problems:?}");
        assert!(catalogue.contains(&format!("[`{name}`](templates/windows-2022-kubeadm.md)")));
        for v in &spec.variables {
            assert!(
                v.description.as_deref().is_some_and(|d| d.len() > 20),
                "{}",
                v.name
            );
            assert!(!v.required && v.default.is_some(), "{}", v.name);
            assert!(
                v.schema.as_ref().and_then(|s| s.type_).is_some(),
                "{}",
                v.name
            );
            assert!(page.contains(&format!("| `{}` |", v.name)), "{}", v.name);
        }
    }
    let (mut a, b) = (read(CLOUD_CONFIG).spec.0, read(POWERSHELL).spec.0);
    a.format = b.format;
    assert!(
        a == b,
        "the two Windows templates differ beyond their format"
    );
}

/// templates/golden holds the Windows goldens of the cases above and nothing else.
#[test]
fn no_stale_windows_golden_files() {
    let mut wanted: Vec<PathBuf> = cases().iter().map(Case::golden).collect();
    wanted.sort();
    let mut found = Vec::new();
    for template in [CLOUD_CONFIG, POWERSHELL] {
        for file in std::fs::read_dir(repo().join("templates/golden").join(template)).expect("dir")
        {
            found.push(file.expect("entry").path());
        }
    }
    found.sort();
    assert_eq!(found, wanted);
}
