//! The shipped template catalogue (`templates/`), checked by the tools the images run at boot.
//!
//! Every template is rendered for every role it supports at two Kubernetes versions (v1.30,
//! where kubeadm's configuration API is v1beta3, and v1.31, where it is v1beta4) with the sample
//! Cluster and Machines of `templates/testdata/`, and
//! - checked by its real consumer: `cloud-init schema --config-file` for cloud-config,
//!   `ignition-validate` for Ignition, `shellcheck` and `bash -n` (plus `sh -n` for POSIX
//!   scripts) for scripts and for every shell script inside the output: cloud-init's `runcmd`
//!   script, files starting with `#!`, the programs units run;
//! - compared byte for byte with `templates/golden/` (`BOOTPLATE_UPDATE_GOLDEN=1` rewrites them);
//! - booted in a sandbox: a throw-away root directory (a chroot inside a user and mount
//!   namespace, the host's /usr bound read-only) where package managers, systemctl, kubeadm and
//!   the like are stubs that record their arguments; the output's files are laid down first, as
//!   cloud-init or Ignition would, then its commands run with the shell the image would use.
//!
//! Hostile variable values (quotes, newlines, `$()`, backticks, handlebars) must be refused at
//! render time (by the variable's schema) or at boot (by the commands' own checks), or arrive
//! as inert data: a command they smuggled in would leave a marker file in the sandbox.
//!
//! A missing tool fails the tests: install the tools with tests/scripts/install-tools.sh.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use crd_types::capi::{Cluster, Machine};
use crd_types::{BootplateConfigSpec, ClusterBootstrapTemplate, OutputFormat, Role, TemplateSpec};
use render::{ClusterInfo, CompiledTemplate, JoinInfo, RenderContext};
use serde_json::{Value, json};

#[path = "templates/network.rs"]
mod network;

/// The catalogue: every template, the roles it is rendered for, and what it is.
const CATALOGUE: &[Entry] = &[
    Entry::kubeadm("kubeadm-ubuntu-2204", Image::Apt),
    Entry::kubeadm("kubeadm-ubuntu-2404", Image::Apt),
    Entry::kubeadm("kubeadm-debian-12", Image::Apt),
    Entry::kubeadm("kubeadm-rocky-9", Image::Dnf),
    Entry::kubeadm("kubeadm-amazonlinux-2023", Image::Dnf),
    Entry::kubeadm("kubeadm-flatcar", Image::Flatcar),
    Entry {
        name: "plain-linux",
        kubeadm: false,
        image: Image::Apt,
    },
];

/// The Windows templates: checked by cloudbase-init's own code in tests/windows.rs (goldens,
/// docs and variables there too); here they are only counted among the shipped files.
const WINDOWS: [&str; 2] = ["windows-2022-kubeadm", "windows-2022-kubeadm-powershell"];

/// Kubernetes versions the kubeadm templates are rendered for: the sample Machines'.
const VERSIONS: [&str; 2] = ["v1.30", "v1.31"];

/// A fixed bootstrap token for the renders (golden files must be stable).
const TOKEN: &str = "abcdef.0123456789abcdef";

#[derive(Clone, Copy, Debug)]
struct Entry {
    name: &'static str,
    kubeadm: bool,
    image: Image,
}

impl Entry {
    const fn kubeadm(name: &'static str, image: Image) -> Entry {
        Entry {
            name,
            kubeadm: true,
            image,
        }
    }

    fn roles(&self) -> &'static [Role] {
        if self.kubeadm {
            &Role::ALL
        } else {
            // Not a node: Cluster API renders a machine outside the control plane as a worker.
            &[Role::Worker]
        }
    }

    fn versions(&self) -> &'static [&'static str] {
        if self.kubeadm { &VERSIONS } else { &[""] }
    }
}

/// The kind of image a template is written for, for the sandbox's stand-in files.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Image {
    Apt,
    Dnf,
    Flatcar,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn templates_dir() -> PathBuf {
    repo().join("templates")
}

fn testdata(name: &str) -> PathBuf {
    templates_dir().join("testdata").join(name)
}

fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn template_path(name: &str) -> PathBuf {
    templates_dir().join(format!("{name}.yaml"))
}

/// The template's spec, after checking the object around it.
fn spec(name: &str) -> TemplateSpec {
    let object: ClusterBootstrapTemplate = read_yaml(&template_path(name));
    assert_eq!(object.metadata.name.as_deref(), Some(name), "metadata.name");
    object.spec.0
}

/// What one render is for.
#[derive(Clone, Debug)]
struct Case {
    entry: Entry,
    role: Role,
    /// `v1.30`, `v1.31`, or empty for the plain machine.
    version: &'static str,
    config: BootplateConfigSpec,
    /// Names the variant in the golden file's name (`configured`), or empty.
    tag: &'static str,
}

impl Case {
    fn new(entry: Entry, role: Role, version: &'static str) -> Case {
        Case {
            entry,
            role,
            version,
            config: BootplateConfigSpec::default(),
            tag: "",
        }
    }

    fn with_variables(mut self, variables: Value) -> Case {
        self.config.variables = serde_json::from_value(variables).expect("a map of variables");
        self
    }

    fn machine_file(&self) -> PathBuf {
        if self.version.is_empty() {
            testdata("machine-plain.yaml")
        } else {
            let kind = if self.role.is_control_plane() {
                "control-plane"
            } else {
                "worker"
            };
            testdata(&format!("machine-{kind}-{}.yaml", self.version))
        }
    }

    fn label(&self) -> String {
        let mut label = self.role.to_string();
        if !self.version.is_empty() {
            label.push('-');
            label.push_str(self.version);
        }
        if !self.config.skip_parts.is_empty() {
            label.push_str("-skip-");
            label.push_str(&self.config.skip_parts.join("-"));
        }
        if !self.tag.is_empty() {
            label.push('-');
            label.push_str(self.tag);
        }
        label
    }

    fn context(&self) -> RenderContext {
        let cluster: Cluster = read_yaml(&testdata("cluster.yaml"));
        let machine: Machine = read_yaml(&self.machine_file());
        self.context_with(&cluster, &machine)
    }

    fn context_with(&self, cluster: &Cluster, machine: &Machine) -> RenderContext {
        let join = JoinInfo {
            token: TOKEN.to_owned(),
            api_server_endpoint: ClusterInfo::from_cluster(cluster)
                .control_plane_endpoint
                .address(),
            ca_cert_hashes: vec![render::SAMPLE_CA_HASH.to_owned()],
        };
        RenderContext::new(
            cluster,
            machine,
            self.role,
            Some(join),
            Some(render::sample_certificates()),
        )
    }

    /// Renders with the engine, as the controller does.
    fn render(&self) -> Result<Vec<u8>, String> {
        self.render_with(&self.context())
    }

    fn render_with(&self, ctx: &RenderContext) -> Result<Vec<u8>, String> {
        let object = format!("ClusterBootstrapTemplate {}", self.entry.name);
        let compiled = CompiledTemplate::compile(&object, &spec(self.entry.name))
            .map_err(|e| e.to_string())?;
        compiled
            .render(&self.config, ctx)
            .map(|r| r.data)
            .map_err(|e| e.to_string())
    }

    fn format(&self) -> OutputFormat {
        spec(self.entry.name).format
    }
}

/// Every case of the catalogue: template × role × version.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for entry in CATALOGUE {
        for role in entry.roles() {
            for version in entry.versions() {
                cases.push(Case::new(*entry, *role, version));
            }
        }
    }
    cases
}

fn entry(name: &str) -> Entry {
    *CATALOGUE
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} is not in the catalogue"))
}

// ---------------------------------------------------------------------------------------------
// The real tools.

/// Runs a tool; panics (failing the test) when it is not installed.
fn tool(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| {
        panic!(
            "{program} is required by this test but cannot run ({e}); install it with tests/scripts/install-tools.sh"
        )
    })
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn tool_ok(what: &str, program: &str, args: &[&str]) -> String {
    let output = tool(program, args);
    assert!(
        output.status.success(),
        "{what}: {program} {args:?} failed ({}):\n{}",
        output.status,
        text(&output)
    );
    text(&output)
}

/// The shell a script is written for, from its `#!` line.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shell {
    Sh,
    Bash,
}

fn shell_of(script: &str) -> Option<Shell> {
    let first = script.lines().next()?;
    let interpreter = first.strip_prefix("#!")?.trim();
    match interpreter {
        "/bin/sh" | "/usr/bin/sh" => Some(Shell::Sh),
        "/bin/bash" | "/usr/bin/bash" | "/usr/bin/env bash" => Some(Shell::Bash),
        other => panic!("unexpected interpreter {other:?}"),
    }
}

/// shellcheck (every severity), `bash -n`, and `sh -n` for POSIX scripts.
fn check_shell(what: &str, script: &str, shellcheck: bool) {
    let shell = shell_of(script).unwrap_or_else(|| panic!("{what}: no #! line"));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("script");
    std::fs::write(&path, script).expect("write script");
    let path = path.to_string_lossy();
    let dialect = match shell {
        Shell::Sh => "--shell=sh",
        Shell::Bash => "--shell=bash",
    };
    if shellcheck {
        let output = tool("shellcheck", &[dialect, "--severity=style", &path]);
        assert!(
            output.status.success(),
            "{what}: shellcheck finds problems:\n{}\n--- script ---\n{script}",
            text(&output)
        );
    }
    tool_ok(what, "bash", &["-n", &path]);
    if shell == Shell::Sh {
        tool_ok(what, "sh", &["-n", &path]);
    }
}

/// What a rendered output writes and runs, as its consumer sees it.
#[derive(Debug, Default)]
struct Boot {
    /// Files in the order they are written: path, mode, content.
    files: Vec<(String, u32, Vec<u8>)>,
    /// The script the image runs after laying the files down, and where it lives.
    script: Option<(String, String)>,
    /// Unit files (contents and drop-ins) by path, for the ExecStart checks.
    units: Vec<(String, String)>,
}

/// Checks `data` with the real consumer of `format` and every shell script in it; returns what
/// it writes and runs. `full: false` (for hostile values) keeps ignition-validate and the
/// shells' own syntax checks but skips cloud-init and PyYAML (each a second of Python; the
/// cloud-config writer's quoting is the render engine's to test, with hostile text, in
/// render/tests) and shellcheck (which rightly warns about hostile text, as in "expressions
/// don't expand in single quotes").
fn check_output(what: &str, format: OutputFormat, data: &[u8], full: bool) -> Boot {
    let dir = tempfile::tempdir().expect("temp dir");
    match format {
        OutputFormat::CloudConfig if full => {
            let path = dir.path().join("user-data.yaml");
            std::fs::write(&path, data).expect("write");
            let out = tool_ok(
                what,
                "cloud-init",
                &["schema", "--config-file", &path.to_string_lossy()],
            );
            assert!(out.contains("Valid cloud-config"), "{what}: {out}");
            assert_eq!(
                pyyaml(data),
                yaml_to_json(data),
                "{what}: PyYAML (cloud-init's reader) reads another document"
            );
        }
        OutputFormat::Ignition => {
            let path = dir.path().join("config.ign");
            std::fs::write(&path, data).expect("write");
            let out = tool_ok(what, "ignition-validate", &[&path.to_string_lossy()]);
            assert!(
                out.trim().is_empty(),
                "{what}: ignition-validate warns:\n{out}"
            );
        }
        _ => {}
    }
    let boot = decode(format, data);
    if let Some((path, script)) = &boot.script {
        check_shell(&format!("{what}: {path}"), script, full);
    }
    for (path, _, content) in &boot.files {
        if content.starts_with(b"#!") {
            let script = String::from_utf8(content.clone()).expect("UTF-8 script");
            check_shell(&format!("{what}: {path}"), &script, full);
        }
    }
    for (path, unit) in &boot.units {
        check_unit(what, path, unit, &boot.files);
    }
    boot
}

/// What `data` writes and runs, as its consumer reads it.
fn decode(format: OutputFormat, data: &[u8]) -> Boot {
    match format {
        OutputFormat::CloudConfig => cloud_config_boot(&yaml_to_json(data)),
        OutputFormat::Ignition => {
            ignition_boot(&serde_json::from_slice(data).expect("Ignition JSON"))
        }
        OutputFormat::Script => {
            let script = String::from_utf8(data.to_vec()).expect("UTF-8 script");
            let mut boot = script_boot(&script);
            boot.script = Some(("/var/lib/cloud/instance/user-data.txt".to_owned(), script));
            boot
        }
        OutputFormat::MimeMultipart => panic!("no shipped template is a MIME archive"),
        other => panic!("{other}: the Windows templates are checked by tests/windows.rs"),
    }
}

/// Every program a unit runs is a binary or a script file the output writes (and which was
/// checked as a script): no inline `sh -c`, whose shell no tool would check.
fn check_unit(what: &str, path: &str, unit: &str, files: &[(String, u32, Vec<u8>)]) {
    for line in unit.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !key.trim().starts_with("Exec") || value.trim().is_empty() {
            continue;
        }
        let mut words = value
            .trim()
            .trim_start_matches(['-', '@', ':', '+', '!', '|'])
            .split_whitespace();
        let mut program = words.next().unwrap_or_default();
        assert!(
            program.starts_with('/'),
            "{what}: {path}: `{line}` does not run an absolute path"
        );
        let name = program.rsplit('/').next().unwrap_or_default();
        if matches!(name, "sh" | "bash" | "dash") {
            // A shell may run a script file the output writes (as kubeadm-compat-ignition's
            // `/bin/bash /etc/kubeadm.sh`), never inline text.
            let script = words.next().unwrap_or_default();
            assert!(
                script.starts_with('/') && files.iter().any(|(p, _, _)| p == script),
                "{what}: {path}: `{line}` runs inline shell; put it in a script file the tests check"
            );
            program = script;
        }
        if let Some((_, _, content)) = files.iter().find(|(p, _, _)| p == program) {
            assert!(
                content.starts_with(b"#!"),
                "{what}: {path} runs {program}, which the output writes without a #! line"
            );
        }
    }
}

/// Parses YAML with PyYAML, cloud-init's reader, into JSON.
fn pyyaml(yaml: &[u8]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("doc.yaml");
    std::fs::write(&path, yaml).expect("write");
    let out = tool_ok(
        "PyYAML",
        "python3",
        &[
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1], 'rb'))))",
            &path.to_string_lossy(),
        ],
    );
    serde_json::from_str(&out).expect("python printed JSON")
}

fn yaml_to_json(yaml: &[u8]) -> Value {
    let doc: serde_yaml::Value = serde_yaml::from_slice(yaml).expect("YAML");
    serde_json::to_value(doc).expect("JSON-compatible YAML")
}

fn mode(permissions: Option<&Value>) -> u32 {
    permissions
        .and_then(Value::as_str)
        .map(|p| u32::from_str_radix(p, 8).expect("octal permissions"))
        .unwrap_or(0o644)
}

fn cloud_config_boot(doc: &Value) -> Boot {
    let mut boot = Boot::default();
    for f in doc["write_files"].as_array().into_iter().flatten() {
        let path = f["path"].as_str().expect("path").to_owned();
        let content = f["content"].as_str().unwrap_or_default();
        let content = match f["encoding"].as_str() {
            None => content.as_bytes().to_vec(),
            Some("b64") => base64::engine::general_purpose::STANDARD
                .decode(content)
                .expect("base64"),
            Some(other) => panic!("{path}: unexpected encoding {other}"),
        };
        if path.starts_with("/etc/systemd/system/") {
            boot.units
                .push((path.clone(), String::from_utf8_lossy(&content).into_owned()));
        }
        boot.files.push((path, mode(f.get("permissions")), content));
    }
    // cloud-init's runcmd module writes one /bin/sh script: each string item as it is.
    let mut script = String::from("#!/bin/sh\n");
    for c in doc["runcmd"].as_array().into_iter().flatten() {
        script.push_str(c.as_str().expect("runcmd items are strings"));
        script.push('\n');
    }
    boot.script = Some(("/var/lib/cloud/instance/scripts/runcmd".to_owned(), script));
    boot
}

fn data_url(url: &str) -> Vec<u8> {
    if let Some(b64) = url.strip_prefix("data:;base64,") {
        return base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64 data URL");
    }
    let text = url.strip_prefix("data:,").expect("a data URL");
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("percent escape");
            out.push(u8::from_str_radix(hex, 16).expect("hex"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

fn ignition_boot(config: &Value) -> Boot {
    let mut boot = Boot::default();
    for f in config["storage"]["files"].as_array().into_iter().flatten() {
        let path = f["path"].as_str().expect("path").to_owned();
        assert!(f["contents"]["compression"].is_null(), "{path}: compressed");
        let content = data_url(f["contents"]["source"].as_str().expect("source"));
        let mode = f["mode"].as_u64().expect("mode") as u32;
        boot.files.push((path, mode, content));
    }
    for u in config["systemd"]["units"].as_array().into_iter().flatten() {
        let name = u["name"].as_str().expect("unit name");
        let dir = "/etc/systemd/system";
        if let Some(content) = u["contents"].as_str() {
            boot.units
                .push((format!("{dir}/{name}"), content.to_owned()));
        }
        for d in u["dropins"].as_array().into_iter().flatten() {
            let path = format!("{dir}/{name}.d/{}", d["name"].as_str().expect("name"));
            boot.units
                .push((path, d["contents"].as_str().expect("contents").to_owned()));
        }
    }
    for (path, content) in &boot.units {
        boot.files
            .push((path.clone(), 0o644, content.as_bytes().to_vec()));
    }
    // The oneshot unit the Ignition writer adds runs the commands script; kubeadm-compat-
    // ignition's kubeadm.service runs /etc/kubeadm.sh, as the kubeadm bootstrap provider's does,
    // after bootplate-parts.service's /etc/bootplate/parts.sh (the parts beside a raw body).
    let text = |path: &str| {
        (boot.files.iter())
            .find(|(p, _, _)| p == path)
            .map(|(p, _, c)| (p.clone(), String::from_utf8(c.clone()).expect("UTF-8")))
    };
    let (path, mut script) = text("/etc/bootplate/bootstrap.sh")
        .or_else(|| text("/etc/kubeadm.sh"))
        .expect("the oneshot unit's commands script");
    if let Some((_, parts)) = text("/etc/bootplate/parts.sh") {
        script = format!("{parts}{script}");
    }
    boot.script = Some((path, script));
    boot
}

/// The files a `script` output writes with `bootplate_write_file PATH MODE OWNER ENCODING
/// <<'DELIMITER'` heredocs (for the checks of the scripts among them).
fn script_boot(script: &str) -> Boot {
    let mut boot = Boot::default();
    let mut lines = script.lines();
    while let Some(line) = lines.next() {
        let Some(call) = line.strip_prefix("bootplate_write_file ") else {
            continue;
        };
        let words: Vec<&str> = call.split(' ').collect();
        let unquote = |w: &str| w.trim_matches('\'').to_owned();
        let path = unquote(words[0]);
        let mode = u32::from_str_radix(&unquote(words[1]), 8).expect("mode");
        let encoding = words[3];
        let delimiter = words[5].trim_matches('\'');
        let mut body = String::new();
        for l in lines.by_ref() {
            if l == delimiter {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        let content = match encoding {
            "plain" => body.into_bytes(),
            "base64" => base64::engine::general_purpose::STANDARD
                .decode(body.split_whitespace().collect::<String>())
                .expect("base64"),
            other => panic!("{path}: unexpected encoding {other}"),
        };
        if path.starts_with("/etc/systemd/system/") {
            boot.units
                .push((path.clone(), String::from_utf8_lossy(&content).into_owned()));
        }
        boot.files.push((path, mode, content));
    }
    boot
}

// ---------------------------------------------------------------------------------------------
// The sandbox.

/// Commands replaced by stubs that record their arguments: everything that would change the
/// host, reach the network or needs a running system.
const STUBS: &[&str] = &[
    "apt-get",
    "apt-mark",
    "chown",
    "chronyc",
    "curl",
    "dnf",
    "dpkg",
    "firewall-cmd",
    "getenforce",
    "getent",
    "hostname",
    "hostnamectl",
    "id",
    "kubeadm",
    "modprobe",
    "setenforce",
    "sha256sum",
    "sleep",
    "swapoff",
    "sysctl",
    "systemctl",
    "tar",
    "update-ca-certificates",
    "update-ca-trust",
    "useradd",
    "usermod",
    "visudo",
];

/// The stub: appends its name and arguments (NUL-separated, then a `\x1e` field) to
/// /bootplate-calls, and plays the few parts the scripts read back.
const STUB: &str = r#"#!/bin/sh
name=${0##*/}
{ printf '%s\0' "$name" "$@"; printf '\036\0'; } >>/bootplate-calls
case "$name" in
  dpkg) echo amd64 ;;
  getenforce) echo Enforcing ;;
  curl)
    out=
    previous=
    for arg in "$@"; do
      if [ "$previous" = -o ]; then out=$arg; fi
      previous=$arg
    done
    # A published digest (`F.sha256`) is the digest of what the other downloads hold.
    case "$out" in
      *.sha256) echo "152f52c743b3359cf3d40bb849899a2c7256d8835989356e4c407812cce39916  ${out%.sha256}" >"$out" ;;
      ?*) echo "stub download" >"$out" ;;
    esac ;;
  id | getent) exit 2 ;;
  sha256sum) cat >/dev/null ;;
  kubeadm)
    if [ -e /bootplate-stubs/fail-kubeadm ]; then echo "kubeadm: stub failure" >&2; exit 1; fi ;;
  systemctl)
    if [ -e /bootplate-stubs/fail-kubeadm ] && [ "$1 $2" = "start kubeadm.service" ]; then exit 1; fi ;;
esac
exit 0
"#;

/// Runs inside the new user and mount namespaces: binds the host's programs read-only into the
/// sandbox root, then chroots into it with a clean environment.
const SETUP: &str = include_str!("../../tests/scripts/sandbox-chroot.sh");

struct Sandbox {
    dir: tempfile::TempDir,
}

struct Run {
    status: std::process::ExitStatus,
    stdout: String,
    /// stdout and stderr.
    output: String,
}

impl Sandbox {
    fn new(image: Image) -> Sandbox {
        let sandbox = Sandbox {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        let image_dirs: &[&str] = match image {
            Image::Apt => &["etc/apt/sources.list.d"],
            Image::Dnf => &["etc/yum.repos.d"],
            Image::Flatcar => &[],
        };
        let dirs = [
            "etc/systemd/system",
            "run",
            "var/lib",
            "opt",
            "root",
            "home",
            "tmp",
        ];
        for dir in dirs.iter().chain(image_dirs) {
            std::fs::create_dir_all(sandbox.root().join(dir)).expect("mkdir");
        }
        sandbox.write("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644);
        sandbox.write("/etc/group", b"root:x:0:\n", 0o644);
        sandbox.write(
            "/etc/fstab",
            b"LABEL=root / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n",
            0o644,
        );
        if image == Image::Dnf {
            sandbox.write(
                "/etc/selinux/config",
                b"SELINUX=enforcing\nSELINUXTYPE=targeted\n",
                0o644,
            );
            sandbox.write("/etc/chrony.conf", b"pool 2.pool.ntp.org iburst\n", 0o644);
        }
        sandbox.write("/bootplate-stubs/stub", STUB.as_bytes(), 0o755);
        for name in STUBS {
            std::os::unix::fs::symlink("stub", sandbox.path(&format!("/bootplate-stubs/{name}")))
                .expect("stub link");
        }
        sandbox
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The host path of `path` in the sandbox (paths are absolute and normalised: the render
    /// engine refuses others).
    fn path(&self, path: &str) -> PathBuf {
        assert!(path.starts_with('/') && !path.split('/').any(|s| s == ".."));
        match path.strip_prefix("/usr/local/") {
            // /usr/local is the sandbox's own .usr-local (the rest of /usr is the host's).
            Some(rest) => self.root().join(".usr-local").join(rest),
            None => self.root().join(path.trim_start_matches('/')),
        }
    }

    fn write(&self, path: &str, content: &[u8], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let host = self.path(path);
        std::fs::create_dir_all(host.parent().expect("parent")).expect("mkdir");
        std::fs::write(&host, content).expect("write");
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.path(path)).ok()
    }

    fn mode(&self, path: &str) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(self.path(path))
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .permissions()
            .mode()
            & 0o7777
    }

    fn fail_kubeadm(&self) {
        self.write("/bootplate-stubs/fail-kubeadm", b"", 0o644);
    }

    /// Lays `boot`'s files down, then runs its script with the shell of its `#!` line.
    fn boot(&self, boot: &Boot) -> Run {
        for (path, mode, content) in &boot.files {
            self.write(path, content, *mode);
        }
        let (path, script) = boot.script.as_ref().expect("a script to run");
        self.write(path, script.as_bytes(), 0o700);
        let shell = match shell_of(script).expect("#! line") {
            Shell::Sh => "/bin/sh",
            Shell::Bash => "/bin/bash",
        };
        self.exec(&[shell, path])
    }

    /// Runs `command` in the sandbox.
    fn exec(&self, command: &[&str]) -> Run {
        let root = self.root().to_string_lossy().into_owned();
        let mut args = vec![
            "--user",
            "--map-root-user",
            "--mount",
            "--",
            "timeout",
            "300",
            "sh",
            "-c",
            SETUP,
            "setup",
            &root,
        ];
        args.extend_from_slice(command);
        let output = tool("unshare", &args);
        let text = text(&output);
        assert!(
            !text.contains("setup: ") && output.status.code() != Some(124),
            "the sandbox could not start (user and mount namespaces are needed): {text}"
        );
        Run {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            output: text,
        }
    }

    /// Every stub call: the command's name, then its arguments.
    fn calls(&self) -> Vec<Vec<String>> {
        let data = std::fs::read(self.path("/bootplate-calls")).unwrap_or_default();
        let mut calls = Vec::new();
        let mut call = Vec::new();
        for field in data.split(|b| *b == 0) {
            if field == b"\x1e" {
                calls.push(std::mem::take(&mut call));
            } else if !field.is_empty() || !call.is_empty() {
                call.push(String::from_utf8_lossy(field).into_owned());
            }
        }
        calls
    }

    fn called(&self, command: &[&str]) -> bool {
        self.calls().iter().any(|c| c == command)
    }

    /// Files a smuggled-in command created: the hostile values `touch /pwned-*`.
    fn pwned(&self) -> Vec<String> {
        std::fs::read_dir(self.root())
            .expect("sandbox root")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("pwned"))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Golden files.

fn golden_path(case: &Case) -> PathBuf {
    let ext = match case.format() {
        OutputFormat::CloudConfig => "yaml",
        OutputFormat::Ignition => "json",
        OutputFormat::Script => "sh",
        OutputFormat::MimeMultipart => "mime",
        other => panic!("{other}: the Windows templates' goldens are tests/windows.rs's"),
    };
    templates_dir()
        .join("golden")
        .join(case.entry.name)
        .join(format!("{}.{ext}", case.label()))
}

fn check_golden(case: &Case, data: &[u8]) {
    let path = golden_path(case);
    if std::env::var_os("BOOTPLATE_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, data).expect("write golden file");
        return;
    }
    let golden = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; write it with BOOTPLATE_UPDATE_GOLDEN=1 cargo test -p bootplate --test templates",
            path.display()
        )
    });
    if golden != data {
        let diff_dir = tempfile::tempdir().expect("temp dir");
        let new = diff_dir.path().join("rendered");
        std::fs::write(&new, data).expect("write");
        let diff = Command::new("diff")
            .arg("-u")
            .arg(&path)
            .arg(&new)
            .output()
            .map(|o| text(&o))
            .unwrap_or_default();
        panic!(
            "{} differs from the render (BOOTPLATE_UPDATE_GOLDEN=1 rewrites it):\n{diff}",
            path.display()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// kubeadm configuration.

/// The YAML documents of the kubeadm configuration file the case writes, read from the
/// sandbox after boot.
fn kubeadm_documents(sandbox: &Sandbox, role: Role) -> Vec<Value> {
    let path = kubeadm_config_path(role);
    let text = sandbox
        .read(path)
        .unwrap_or_else(|| panic!("{path} was not written"));
    assert_eq!(
        sandbox.mode(path),
        0o600,
        "{path} holds the token: mode 0600"
    );
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).expect("kubeadm YAML");
            serde_json::to_value(v).expect("JSON-compatible YAML")
        })
        .collect()
}

fn kubeadm_config_path(role: Role) -> &'static str {
    if role == Role::Init {
        "/run/kubeadm/kubeadm.yaml"
    } else {
        "/run/kubeadm/kubeadm-join-config.yaml"
    }
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {docs:#?}"))
}

fn taints(doc: &Value) -> Vec<String> {
    doc["nodeRegistration"]["taints"]
        .as_array()
        .expect("taints")
        .iter()
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap(),
                t["effect"].as_str().unwrap()
            )
        })
        .collect()
}

/// The value of a variable in `case`: the config's, else the template's default.
fn variable(case: &Case, name: &str) -> Option<Value> {
    case.config.variables.get(name).cloned().or_else(|| {
        spec(case.entry.name)
            .variables
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.default.clone())
    })
}

/// A map of flags in the shape of the kubeadm API version: a map in v1beta3, a list of
/// `{name, value}` in v1beta4.
fn flags(v1beta4: bool, flags: &[(&str, &str)]) -> Value {
    if v1beta4 {
        Value::Array(
            flags
                .iter()
                .map(|(n, v)| json!({"name": n, "value": v}))
                .collect(),
        )
    } else {
        Value::Object(
            flags
                .iter()
                .map(|(n, v)| ((*n).to_owned(), json!(v)))
                .collect(),
        )
    }
}

/// The flags a map variable adds, after the ones the template always sets.
fn flags_of(case: &Case, fixed: &[(&str, &str)], name: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = fixed
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    if let Some(Value::Object(map)) = variable(case, name) {
        out.extend(
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("text").to_owned())),
        );
    }
    out
}

fn flags_value(v1beta4: bool, list: &[(String, String)]) -> Value {
    let pairs: Vec<(&str, &str)> = list.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    if pairs.is_empty() {
        Value::Null
    } else {
        flags(v1beta4, &pairs)
    }
}

/// kubeadm ran with the configuration file: directly, or (Flatcar) through kubeadm.service.
fn assert_ran_kubeadm(case: &Case, sandbox: &Sandbox, verb: &str, path: &str) {
    let what = format!("{} {}", case.entry.name, case.label());
    if sandbox.called(&["systemctl", "start", "kubeadm.service"]) {
        let unit = sandbox
            .read("/etc/systemd/system/kubeadm.service")
            .expect("kubeadm.service");
        assert!(
            unit.lines()
                .any(|l| l == format!("ExecStart=/opt/bin/kubeadm {verb} --config {path}")),
            "{what}: kubeadm.service runs something else:\n{unit}"
        );
    } else {
        assert!(
            sandbox.called(&["kubeadm", verb, "--config", path]),
            "{what}: kubeadm {verb} --config {path} did not run: {:?}",
            sandbox.calls()
        );
    }
}

/// The kubeadm configuration a kubeadm case writes, checked against the context and the
/// variables.
fn check_kubeadm_config(case: &Case, sandbox: &Sandbox) {
    let what = format!("{} {}", case.entry.name, case.label());
    let docs = kubeadm_documents(sandbox, case.role);
    let v1beta4 = case.version != "v1.30";
    let api = if v1beta4 {
        "kubeadm.k8s.io/v1beta4"
    } else {
        "kubeadm.k8s.io/v1beta3"
    };
    for doc in &docs {
        assert_eq!(doc["apiVersion"], api, "{what}: {doc}");
    }
    let machine: Machine = read_yaml(&case.machine_file());
    // kubeadm names the node after the hostname when the configuration names none.
    let name = if variable(case, "nodeNameFromHostname") == Some(json!(true)) {
        Value::Null
    } else {
        json!(machine.metadata.name.clone().unwrap())
    };
    let flatcar = case.entry.image == Image::Flatcar;
    let plugin_dir = "/opt/libexec/kubernetes/kubelet-plugins/volume/exec/";
    let role_taint = if case.role == Role::Worker {
        "node.cluster.x-k8s.io/uninitialized:NoSchedule"
    } else {
        "node-role.kubernetes.io/control-plane:NoSchedule"
    };
    let mut wanted_taints = vec![role_taint.to_owned()];
    for t in variable(case, "nodeTaints")
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
    {
        wanted_taints.push(format!(
            "{}:{}",
            t["key"].as_str().unwrap(),
            t["effect"].as_str().unwrap()
        ));
    }
    let kubelet_fixed: &[(&str, &str)] = if flatcar {
        &[("volume-plugin-dir", plugin_dir)]
    } else {
        &[]
    };
    let kubelet_args = flags_value(v1beta4, &flags_of(case, kubelet_fixed, "kubeletExtraArgs"));
    let registration = |doc: &Value| {
        let reg = &doc["nodeRegistration"];
        assert_eq!(reg["name"], name, "{what}");
        assert_eq!(
            reg["criSocket"],
            "unix:///var/run/containerd/containerd.sock"
        );
        assert_eq!(taints(doc), wanted_taints, "{what}");
        assert_eq!(reg["kubeletExtraArgs"], kubelet_args, "{what}");
        let ignored = variable(case, "kubeadmIgnorePreflightErrors").unwrap();
        if ignored.as_array().is_some_and(|a| !a.is_empty()) {
            assert_eq!(reg["ignorePreflightErrors"], ignored, "{what}");
        } else {
            assert!(reg["ignorePreflightErrors"].is_null(), "{what}");
        }
    };
    match case.role {
        Role::Init => {
            registration(kind(&docs, "InitConfiguration"));
            let cluster = kind(&docs, "ClusterConfiguration");
            assert_eq!(cluster["clusterName"], "demo");
            assert_eq!(
                cluster["kubernetesVersion"],
                machine.spec.version.as_deref().unwrap()
            );
            assert_eq!(cluster["controlPlaneEndpoint"], "api.demo.example.com:6443");
            assert_eq!(cluster["networking"]["podSubnet"], "192.168.0.0/16");
            assert_eq!(cluster["networking"]["serviceSubnet"], "10.96.0.0/12");
            assert_eq!(cluster["networking"]["dnsDomain"], "cluster.local");
            let network_repository = case
                .config
                .network
                .as_ref()
                .and_then(|n| n.image_repository.clone());
            let repository = network_repository
                .map(Value::from)
                .unwrap_or_else(|| variable(case, "imageRepository").unwrap());
            if repository == "" {
                assert!(cluster["imageRepository"].is_null(), "{what}");
            } else {
                assert_eq!(cluster["imageRepository"], repository, "{what}");
            }
            let sans = variable(case, "apiServerCertSANs").unwrap();
            if sans.as_array().is_some_and(|a| !a.is_empty()) {
                assert_eq!(cluster["apiServer"]["certSANs"], sans, "{what}");
            } else {
                assert!(cluster["apiServer"]["certSANs"].is_null(), "{what}");
            }
            assert_eq!(
                cluster["apiServer"]["extraArgs"],
                flags_value(v1beta4, &flags_of(case, &[], "apiServerExtraArgs")),
                "{what}"
            );
            let manager_fixed: &[(&str, &str)] = if flatcar {
                &[("flex-volume-plugin-dir", plugin_dir)]
            } else {
                &[]
            };
            assert_eq!(
                cluster["controllerManager"]["extraArgs"],
                flags_value(
                    v1beta4,
                    &flags_of(case, manager_fixed, "controllerManagerExtraArgs")
                ),
                "{what}"
            );
            assert_ran_kubeadm(case, sandbox, "init", "/run/kubeadm/kubeadm.yaml");
        }
        Role::ControlPlaneJoin | Role::Worker => {
            let join = kind(&docs, "JoinConfiguration");
            registration(join);
            let discovery = &join["discovery"]["bootstrapToken"];
            assert_eq!(discovery["token"], TOKEN);
            assert_eq!(discovery["apiServerEndpoint"], "api.demo.example.com:6443");
            assert_eq!(discovery["caCertHashes"], json!([render::SAMPLE_CA_HASH]));
            assert_eq!(
                join["controlPlane"].is_object(),
                case.role == Role::ControlPlaneJoin,
                "{what}: controlPlane"
            );
            assert_ran_kubeadm(
                case,
                sandbox,
                "join",
                "/run/kubeadm/kubeadm-join-config.yaml",
            );
        }
    }
}

/// The control-plane certificates: written with private keys at 0600 for control-plane roles,
/// absent (and absent from the output) for workers.
fn check_certificates(case: &Case, data: &[u8], sandbox: &Sandbox) {
    let keys = [
        "/etc/kubernetes/pki/ca.key",
        "/etc/kubernetes/pki/etcd/ca.key",
        "/etc/kubernetes/pki/front-proxy-ca.key",
        "/etc/kubernetes/pki/sa.key",
    ];
    let certs = [
        "/etc/kubernetes/pki/ca.crt",
        "/etc/kubernetes/pki/etcd/ca.crt",
        "/etc/kubernetes/pki/front-proxy-ca.crt",
        "/etc/kubernetes/pki/sa.pub",
    ];
    if case.role.is_control_plane() {
        for key in keys {
            assert_eq!(sandbox.mode(key), 0o600, "{}: {key}", case.label());
            assert!(sandbox.read(key).unwrap().contains("PRIVATE KEY"));
        }
        for cert in certs {
            assert_eq!(sandbox.mode(cert), 0o640, "{}: {cert}", case.label());
        }
    } else {
        for path in keys.iter().chain(certs.iter()) {
            assert!(sandbox.read(path).is_none(), "a worker got {path}");
        }
        let text = String::from_utf8_lossy(data);
        assert!(
            !text.contains("PRIVATE KEY"),
            "a worker's user-data holds a key"
        );
    }
}

/// Whether the sandbox saw an install: package manager installs or downloads.
fn installed_anything(sandbox: &Sandbox) -> bool {
    sandbox.calls().iter().any(|c| {
        (matches!(c[0].as_str(), "apt-get" | "dnf") && c.iter().any(|a| a == "install"))
            || c[0] == "curl"
    })
}

/// The whole check of one case: tools, golden file, boot in the sandbox, the effects.
fn check_case(case: &Case) {
    boot_case(case);
}

/// [`check_case`], returning the booted sandbox for more checks.
fn boot_case(case: &Case) -> Sandbox {
    let what = format!("{} {}", case.entry.name, case.label());
    let data = case.render().unwrap_or_else(|e| panic!("{what}: {e}"));
    let boot = check_output(&what, case.format(), &data, true);
    check_golden(case, &data);

    let sandbox = Sandbox::new(case.entry.image);
    let run = sandbox.boot(&boot);
    assert!(run.status.success(), "{what}: boot failed:\n{}", run.output);
    assert!(sandbox.pwned().is_empty());
    assert_eq!(
        sandbox
            .read("/run/cluster-api/bootstrap-success.complete")
            .as_deref(),
        Some("success\n"),
        "{what}: no bootstrap sentinel"
    );
    if case.entry.kubeadm {
        let skips_install = case.config.skip_parts.iter().any(|p| p == "install");
        assert_eq!(
            installed_anything(&sandbox),
            !skips_install,
            "{what}: installs iff the install part runs"
        );
        check_kubeadm_config(case, &sandbox);
        check_certificates(case, &data, &sandbox);
        let fstab = sandbox.read("/etc/fstab").unwrap();
        assert!(fstab.contains("#/swap.img"), "{what}: swap left in fstab");
    }
    sandbox
}

/// Runs `check` on every item, a few at a time (the checks spend their time in child processes).
fn in_parallel<T: Sync>(items: &[T], check: impl Fn(&T) + Sync) {
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(4, 8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    check(item);
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Hostile values.

/// A value that tries everything: quotes, command substitution, backticks, a newline followed
/// by a command, shell operators, handlebars syntax, a trailing backslash. Each `touch` would
/// leave a marker in the sandbox's root if it ran.
const HOSTILE: &str = "x'y\"z $(touch /pwned-subst) `touch /pwned-backtick`;touch /pwned-semi\ntouch /pwned-newline\nkey: {{values.httpProxy}} \\";
/// The same on one line (values checked for line breaks get this one through).
const HOSTILE_LINE: &str = "x'y\"z $(touch /pwned-subst) `touch /pwned-backtick`; touch /pwned-semi & touch /pwned-amp | {{> p}} # é \\";

/// Hostile values for a variable of `spec`, by its declared type; none for booleans and enums
/// (their schema admits no free text).
fn hostile_values(name: &str, decl: &crd_types::VariableDecl) -> Vec<Value> {
    let schema = decl.schema.as_ref().expect("schema");
    if schema.enum_.is_some() {
        return Vec::new();
    }
    let items_are_objects = schema
        .items
        .as_ref()
        .is_some_and(|i| i.type_ == crd_types::ValueType::Object);
    match schema.type_.expect("type") {
        crd_types::ValueType::String => vec![json!(HOSTILE), json!(HOSTILE_LINE)],
        crd_types::ValueType::Array if items_are_objects => match name {
            "nodeTaints" => {
                vec![json!([{"key": HOSTILE, "value": HOSTILE_LINE, "effect": "NoSchedule"}])]
            }
            "users" => vec![
                json!([{"name": HOSTILE_LINE, "sshAuthorizedKeys": ["ssh-ed25519 AAAA a@b"]}]),
                json!([{"name": "alice", "sshAuthorizedKeys": [HOSTILE]}]),
                json!([{"name": "alice", "sshAuthorizedKeys": [HOSTILE_LINE]}]),
                json!([{"name": "alice", "sudo": true, "groups": [HOSTILE_LINE]}]),
                json!([{"name": "alice", "shell": HOSTILE_LINE}]),
            ],
            other => panic!("no hostile items for the array of objects `{other}`"),
        },
        crd_types::ValueType::Array => vec![json!([HOSTILE, "ok"]), json!([HOSTILE_LINE])],
        crd_types::ValueType::Object => vec![
            json!({"key": HOSTILE}),
            json!({"key": [HOSTILE_LINE]}),
            json!({HOSTILE_LINE: "value"}),
        ],
        crd_types::ValueType::Boolean
        | crd_types::ValueType::Integer
        | crd_types::ValueType::Number => Vec::new(),
    }
}

/// Whether `needle` is one of the scalars of `doc`.
fn holds_scalar(doc: &Value, needle: &str) -> bool {
    match doc {
        Value::String(s) => s == needle,
        Value::Array(items) => items.iter().any(|v| holds_scalar(v, needle)),
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k == needle || holds_scalar(v, needle)),
        _ => false,
    }
}

/// One hostile render and boot: refused at render time (without repeating the value), or rendered into output its consumer accepts, which then
/// boots (or stops at one of the commands' own checks, before kubeadm and the sentinel)
/// without running anything the value smuggled in.
fn check_hostile(case: &Case, variable: &str, value: &Value) {
    let what = format!("{} {} {variable}={value}", case.entry.name, case.label());
    let data = match case.render() {
        Err(e) => {
            // The schema names the variable; a value of the wrong shape deeper down (a list
            // where a map holds text) is refused by the helper that would have quoted it.
            assert!(
                e.contains(&format!("`{variable}`")) || e.contains("expects text"),
                "{what}: refused for another reason: {e}"
            );
            assert!(
                !e.contains("pwned"),
                "{what}: the error repeats the value: {e}"
            );
            return;
        }
        Ok(data) => data,
    };
    let boot = check_output(&what, case.format(), &data, false);
    let sandbox = Sandbox::new(case.entry.image);
    let run = sandbox.boot(&boot);
    assert!(
        sandbox.pwned().is_empty(),
        "{what}: a smuggled command ran: {:?}\n{}",
        sandbox.pwned(),
        run.output
    );
    let sentinel = sandbox.read("/run/cluster-api/bootstrap-success.complete");
    if !run.status.success() {
        assert!(
            run.output.contains("bootplate: "),
            "{what}: the boot failed, not at one of the template's checks:\n{}",
            run.output
        );
        assert!(sentinel.is_none(), "{what}: failed boot wrote the sentinel");
        assert!(
            !sandbox.calls().iter().any(|c| c[0] == "kubeadm")
                && !sandbox.called(&["systemctl", "start", "kubeadm.service"]),
            "{what}: kubeadm ran after a failed check"
        );
        return;
    }
    assert!(sentinel.is_some(), "{what}: no sentinel");
    if case.entry.kubeadm {
        // The kubeadm configuration is still YAML, and a value written into it is one scalar.
        let docs = kubeadm_documents(&sandbox, case.role);
        let reaches_kubeadm = [
            "kubeletExtraArgs",
            "nodeTaints",
            "kubeadmIgnorePreflightErrors",
            "apiServerExtraArgs",
            "apiServerCertSANs",
            "controllerManagerExtraArgs",
        ]
        .contains(&variable)
            && (case.role == Role::Init
                || ![
                    "apiServerExtraArgs",
                    "apiServerCertSANs",
                    "controllerManagerExtraArgs",
                ]
                .contains(&variable));
        if reaches_kubeadm {
            let payload = if data_has(value, HOSTILE) {
                HOSTILE
            } else {
                HOSTILE_LINE
            };
            assert!(
                docs.iter().any(|d| holds_scalar(d, payload)),
                "{what}: the value did not arrive as one scalar:\n{docs:#?}"
            );
        }
    }
}

fn data_has(value: &Value, needle: &str) -> bool {
    holds_scalar(value, needle)
}

/// Variables only the init machine reads (kubeadm keeps the cluster configuration in the
/// cluster).
const INIT_ONLY: [&str; 4] = [
    "imageRepository",
    "apiServerCertSANs",
    "apiServerExtraArgs",
    "controllerManagerExtraArgs",
];

/// Every free-text variable of `name` with each hostile value, for a machine of a role that
/// reads it, at v1.31 and, for maps (which kubeadm's API versions write differently), at v1.30
/// too.
fn hostile_cases(name: &str) -> Vec<(Case, String, Value)> {
    let entry = entry(name);
    let spec = spec(name);
    let mut cases = Vec::new();
    for decl in &spec.variables {
        let role = if INIT_ONLY.contains(&decl.name.as_str()) {
            Role::Init
        } else {
            Role::Worker
        };
        let versions: &[&str] = if !entry.kubeadm {
            &[""]
        } else if decl.schema.as_ref().and_then(|s| s.type_) == Some(crd_types::ValueType::Object) {
            &VERSIONS
        } else {
            &["v1.31"]
        };
        for value in hostile_values(&decl.name, decl) {
            for version in versions {
                // The plain machine's service commands only run with a service name.
                let mut variables = if name == "plain-linux" && decl.name != "serviceName" {
                    json!({"serviceName": "web", "serviceCommand": ["/usr/bin/env"]})
                } else {
                    json!({})
                };
                variables[&decl.name] = value.clone();
                let case = Case::new(entry, role, version).with_variables(variables);
                cases.push((case, decl.name.clone(), value.clone()));
            }
        }
    }
    cases
}

// ---------------------------------------------------------------------------------------------
// The catalogue itself.

/// kustomization.yml installs exactly the templates in templates/ (named `.yml` so that
/// `templates/*.yaml` is the templates alone), kustomize builds them, and the tests know them
/// all.
#[test]
fn kustomization_lists_every_template() {
    let kustomization: serde_yaml::Value = read_yaml(&templates_dir().join("kustomization.yml"));
    let listed: Vec<String> = kustomization["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_owned())
        .collect();
    let mut files: Vec<String> = std::fs::read_dir(templates_dir())
        .expect("templates/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(
        sorted, files,
        "kustomization.yaml resources vs templates/*.yaml"
    );
    let built = tool_ok(
        "kubectl kustomize",
        "kubectl",
        &["kustomize", &templates_dir().to_string_lossy()],
    );
    let mut names: Vec<String> = serde_yaml::Deserializer::from_str(&built)
        .map(|d| {
            let object: ClusterBootstrapTemplate =
                serde::Deserialize::deserialize(d).expect("a ClusterBootstrapTemplate");
            format!("{}.yaml", object.metadata.name.expect("a name"))
        })
        .collect();
    names.sort();
    assert_eq!(names, files, "kubectl kustomize templates/");
    let mut known: Vec<String> = CATALOGUE
        .iter()
        .chain([&COMPAT, &COMPAT_IGNITION])
        .map(|e| format!("{}.yaml", e.name))
        .chain(WINDOWS.iter().map(|name| format!("{name}.yaml")))
        .collect();
    known.sort();
    assert_eq!(known, files, "the tests' CATALOGUE vs templates/*.yaml");
}

/// Each template is a well-formed ClusterBootstrapTemplate; every variable has a description,
/// a default that fits its schema (none is required) and a schema type.
#[test]
fn every_variable_is_documented_typed_and_defaulted() {
    for entry in CATALOGUE {
        let object: ClusterBootstrapTemplate = read_yaml(&template_path(entry.name));
        let raw: serde_yaml::Value = read_yaml(&template_path(entry.name));
        assert_eq!(raw["apiVersion"], "bootstrap.bootplate.dev/v1alpha1");
        assert_eq!(raw["kind"], "ClusterBootstrapTemplate");
        let spec = &object.spec.0;
        assert!(
            !spec.os.name.is_empty() && spec.os.version.is_some(),
            "{}: os",
            entry.name
        );
        for v in &spec.variables {
            let what = format!("{}: variable {}", entry.name, v.name);
            assert!(
                v.description.as_deref().is_some_and(|d| d.len() > 20),
                "{what}: no description"
            );
            assert!(
                !v.required,
                "{what}: required (every variable needs a working default)"
            );
            assert!(v.default.is_some(), "{what}: no default");
            assert!(
                v.schema.as_ref().and_then(|s| s.type_).is_some(),
                "{what}: no schema type"
            );
        }
    }
}

/// The engine's lint: no error and no warning (every declared variable is read, every read
/// variable is declared, every role renders with the sample context).
#[test]
fn lint_finds_nothing() {
    for entry in CATALOGUE.iter().chain([&COMPAT, &COMPAT_IGNITION]) {
        let object = format!("ClusterBootstrapTemplate {}", entry.name);
        let problems = render::lint(&object, &spec(entry.name), None);
        let listed: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert!(listed.is_empty(), "{}:\n{}", entry.name, listed.join("\n"));
    }
}

/// The kubeadm configuration API follows the Machine's Kubernetes version.
#[test]
fn kubeadm_api_version_follows_the_kubernetes_version() {
    let cluster: Cluster = read_yaml(&testdata("cluster.yaml"));
    for (version, api) in [
        ("v1.29.10", "v1beta3"),
        ("v1.30.0", "v1beta3"),
        ("v1.30.14", "v1beta3"),
        ("v1.31.0-rc.1", "v1beta4"),
        ("v1.31.0", "v1beta4"),
        ("v1.32.3", "v1beta4"),
        ("v1.40.1", "v1beta4"),
    ] {
        for entry in CATALOGUE.iter().filter(|e| e.kubeadm) {
            for role in Role::ALL {
                let case = Case::new(*entry, role, "v1.31");
                let mut machine: Machine = read_yaml(&case.machine_file());
                machine.spec.version = Some(version.to_owned());
                let data = case
                    .render_with(&case.context_with(&cluster, &machine))
                    .unwrap();
                let boot = decode(case.format(), &data);
                let mut text = boot.script.map(|(_, s)| s).unwrap_or_default();
                for (_, _, content) in &boot.files {
                    text.push_str(&String::from_utf8_lossy(content));
                }
                let wanted = format!("apiVersion: kubeadm.k8s.io/{api}");
                let other = if api == "v1beta3" {
                    "v1beta4"
                } else {
                    "v1beta3"
                };
                assert!(
                    text.contains(&wanted) && !text.contains(&format!("kubeadm.k8s.io/{other}")),
                    "{} {role} at {version}: wants {api}",
                    entry.name
                );
            }
        }
    }
}

/// Every template × role × version: the tools, the golden files, a boot in the sandbox.
#[test]
fn every_template_renders_passes_its_tools_and_boots() {
    in_parallel(&cases(), check_case);
}

/// An image that already carries the packages: `skipParts: [install]` still yields a node,
/// and installs nothing.
#[test]
fn pre_baked_images_skip_the_install_part() {
    in_parallel(&pre_baked_cases(), check_case);
}

/// The documented pre-baked config (templates/testdata/config-prebaked.yaml), applied to
/// every kubeadm template.
fn pre_baked_cases() -> Vec<Case> {
    let object: crd_types::BootplateConfigTemplate = read_yaml(&testdata("config-prebaked.yaml"));
    let config = object.spec.template.spec;
    assert_eq!(config.skip_parts, ["install"]);
    let mut cases = Vec::new();
    for entry in CATALOGUE.iter().filter(|e| e.kubeadm) {
        for role in [Role::Init, Role::Worker] {
            let mut case = Case::new(*entry, role, "v1.31");
            case.config = config.clone();
            cases.push(case);
        }
    }
    cases
}

/// A failed kubeadm stops the boot before the Cluster API sentinel is written.
#[test]
fn no_sentinel_when_kubeadm_fails() {
    let mut cases = Vec::new();
    for entry in CATALOGUE.iter().filter(|e| e.kubeadm) {
        for role in Role::ALL {
            cases.push(Case::new(*entry, role, "v1.31"));
        }
    }
    in_parallel(&cases, |case| {
        let what = format!("{} {}", case.entry.name, case.label());
        let data = case.render().unwrap();
        let sandbox = Sandbox::new(case.entry.image);
        sandbox.fail_kubeadm();
        let run = sandbox.boot(&decode(case.format(), &data));
        assert!(
            !run.status.success(),
            "{what}: the boot succeeded with a failing kubeadm"
        );
        assert!(
            run.output.contains("kubeadm: stub failure")
                || sandbox.called(&["systemctl", "start", "kubeadm.service"]),
            "{what}: failed elsewhere:\n{}",
            run.output
        );
        assert!(
            sandbox
                .read("/run/cluster-api/bootstrap-success.complete")
                .is_none(),
            "{what}: sentinel written after kubeadm failed"
        );
    });
}

/// Hostile variable values are refused or stay inert data.
#[test]
fn hostile_values_stay_inert() {
    let mut cases = Vec::new();
    for entry in CATALOGUE {
        cases.extend(hostile_cases(entry.name));
    }
    in_parallel(&cases, |(case, variable, value)| {
        check_hostile(case, variable, value)
    });
}

/// The Cluster's API server host is written into the kubeadm configuration of the init
/// machine as it is (the render context has no `host:port` text to quote); a host that is not a
/// DNS name or IPv4 address stops the boot before kubeadm reads it.
#[test]
fn a_hostile_endpoint_host_stops_the_init_machine() {
    let mut cluster: Cluster = read_yaml(&testdata("cluster.yaml"));
    cluster
        .spec
        .control_plane_endpoint
        .as_mut()
        .expect("endpoint")
        .host = HOSTILE.to_owned();
    let cases: Vec<Case> = CATALOGUE
        .iter()
        .filter(|e| e.kubeadm)
        .map(|e| Case::new(*e, Role::Init, "v1.31"))
        .collect();
    in_parallel(&cases, |case| {
        let what = case.entry.name;
        let machine: Machine = read_yaml(&case.machine_file());
        let data = case
            .render_with(&case.context_with(&cluster, &machine))
            .unwrap();
        let boot = check_output(what, case.format(), &data, false);
        let sandbox = Sandbox::new(case.entry.image);
        let run = sandbox.boot(&boot);
        assert!(
            !run.status.success(),
            "{what}: booted with a hostile endpoint"
        );
        assert!(run.output.contains("bootplate: "), "{what}: {}", run.output);
        assert!(sandbox.pwned().is_empty(), "{what}: {:?}", sandbox.pwned());
        assert!(!sandbox.calls().iter().any(|c| c[0] == "kubeadm"));
        assert!(!sandbox.called(&["systemctl", "start", "kubeadm.service"]));
    });
}

// ---------------------------------------------------------------------------------------------
// Every variable, set.

/// A realistic value for every variable the catalogue declares.
fn configured_value(name: &str) -> Value {
    match name {
        "containerdVersion" => json!("1.7.24"),
        "sandboxImage" => json!("registry.example.com/pause:3.10"),
        "registryMirrors" => json!({
            "docker.io": ["https://mirror.example.com", "https://mirror2.example.com"],
            "registry.k8s.io": "https://k8s-mirror.example.com",
        }),
        "httpProxy" => json!("http://proxy.example.com:3128"),
        "httpsProxy" => json!("http://proxy.example.com:3129"),
        "noProxy" => json!(".internal.example.com,10.0.0.0/8"),
        "ntpServers" => json!(["ntp1.example.com", "10.0.0.1"]),
        "kubeletExtraArgs" => json!({"cloud-provider": "external", "node-labels": "tier=web"}),
        "nodeTaints" => json!([{"key": "dedicated", "value": "web", "effect": "NoSchedule"}]),
        "nodeNameFromHostname" => json!(false),
        "kubeadmIgnorePreflightErrors" => json!(["NumCPU"]),
        "cgroupDriver" => json!("cgroupfs"),
        "allowCgroupV1" => json!(true),
        "imageRepository" => json!("registry.example.com/k8s"),
        "apiServerCertSANs" => json!(["api.example.com", "10.0.0.100"]),
        "apiServerExtraArgs" => json!({"audit-log-maxage": "30"}),
        "controllerManagerExtraArgs" => json!({"bind-address": "0.0.0.0"}),
        "selinuxMode" => json!("enforcing"),
        "firewalld" => json!("open-ports"),
        "firewalldPorts" => json!(["179/tcp", "4789/udp"]),
        "cniPluginsVersion" => json!("v1.6.1"),
        "crictlVersion" => json!("v1.31.1"),
        "hostname" => json!("bastion"),
        "users" => json!([
            {"name": "alice", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3Nz alice@example.com"],
             "sudo": true, "groups": ["adm"]},
            {"name": "bob"},
        ]),
        "packages" => json!(["nginx", "jq=1.6-2.1"]),
        "serviceName" => json!("hello"),
        "serviceDescription" => json!("Hello, world"),
        "serviceCommand" => json!(["/usr/bin/python3", "-m", "http.server", "8080"]),
        "serviceUser" => json!("www-data"),
        "serviceEnvironment" => json!({"PYTHONUNBUFFERED": "1"}),
        "inPlaceAgent" => json!(true),
        "inPlaceAgentSource" => json!(AGENT_URL),
        "inPlaceAgentSha256" => json!(AGENT_SHA256),
        "inPlaceAgentInterval" => json!("30s"),
        other => panic!("configured_value has no value for the variable `{other}`"),
    }
}

/// Where the configured cases take bootplate-agent from, and the digest of what the sandbox's
/// `curl` gives (its `sha256sum` is a stub; the boot proof checks with the real one).
const AGENT_URL: &str = "https://downloads.example.com/bootplate/v0.1.0/bootplate-agent";
const AGENT_SHA256: &str = "152f52c743b3359cf3d40bb849899a2c7256d8835989356e4c407812cce39916";

/// Where a kubeadm template installs bootplate-agent from a URL (Flatcar's /usr is read-only).
fn agent_dir(image: Image) -> &'static str {
    if image == Image::Flatcar {
        "/opt/bin"
    } else {
        "/usr/local/bin"
    }
}

/// The node name the configured cases run bootplate-agent for: the Machine's name.
fn node_name(case: &Case) -> String {
    let machine: Machine = read_yaml(&case.machine_file());
    machine.metadata.name.expect("the sample Machine's name")
}

/// bootplate-agent installed at `binary` and running as a service for the case's node, with
/// the kubelet's kubeconfig.
fn check_agent_service(what: &str, case: &Case, sandbox: &Sandbox, binary: &str, interval: &str) {
    let path = "/etc/systemd/system/bootplate-agent.service";
    let unit = sandbox
        .read(path)
        .unwrap_or_else(|| panic!("{what}: no {path}"));
    assert_eq!(sandbox.mode(path), 0o644, "{what}");
    let exec = format!(
        "\nExecStart={binary} --node-name {} --kubeconfig /etc/kubernetes/kubelet.conf --interval {interval}\n",
        node_name(case)
    );
    assert!(unit.contains(&exec), "{what}: {exec:?} not in\n{unit}");
    assert!(unit.contains("\nRestart=always\n") && unit.contains("\nWantedBy=multi-user.target\n"));
    check_unit(what, path, &unit, &[]);
    let calls = sandbox.calls();
    let reload = calls
        .iter()
        .rposition(|c| c == &["systemctl", "daemon-reload"])
        .unwrap_or_else(|| panic!("{what}: no daemon-reload: {calls:?}"));
    let enable = calls
        .iter()
        .position(|c| {
            c == &[
                "systemctl",
                "enable",
                "--now",
                "--no-block",
                "bootplate-agent.service",
            ]
        })
        .unwrap_or_else(|| {
            panic!("{what}: bootplate-agent.service not enabled and started: {calls:?}")
        });
    assert!(
        reload < enable,
        "{what}: enabled before the unit file was loaded"
    );
}

fn configured(entry: Entry, role: Role, version: &'static str) -> Case {
    let variables: serde_json::Map<String, Value> = spec(entry.name)
        .variables
        .iter()
        .map(|v| (v.name.clone(), configured_value(&v.name)))
        .collect();
    let mut case = Case::new(entry, role, version).with_variables(Value::Object(variables));
    case.tag = "configured";
    case
}

/// The effects of the variables that do not reach kubeadm, in the booted sandbox.
fn check_configured_effects(case: &Case, sandbox: &Sandbox) {
    let what = format!("{} {}", case.entry.name, case.label());
    let calls = sandbox.calls();
    let called_with = |command: &str, arg: &str| {
        calls
            .iter()
            .any(|c| c[0] == command && c.iter().any(|a| a == arg))
    };
    if case.entry.name == "plain-linux" {
        assert!(
            sandbox.called(&["hostnamectl", "set-hostname", "bastion"]),
            "{what}"
        );
        assert!(
            sandbox.called(&["apt-get", "install", "-y", "-q", "nginx", "jq=1.6-2.1"]),
            "{what}: {calls:?}"
        );
        assert!(sandbox.called(&["useradd", "--create-home", "--shell", "/bin/bash", "alice"]));
        assert!(sandbox.called(&["usermod", "--append", "--groups", "adm", "alice"]));
        assert_eq!(
            sandbox.read("/home/alice/.ssh/authorized_keys").as_deref(),
            Some("ssh-ed25519 AAAAC3Nz alice@example.com\n")
        );
        assert_eq!(sandbox.mode("/home/alice/.ssh/authorized_keys"), 0o600);
        assert_eq!(
            sandbox.read("/home/bob/.ssh/authorized_keys").as_deref(),
            Some(""),
            "{what}: bob has no keys"
        );
        assert_eq!(
            sandbox.read("/etc/sudoers.d/90-bootplate-alice").as_deref(),
            Some("alice ALL=(ALL) NOPASSWD:ALL\n")
        );
        assert!(sandbox.read("/etc/sudoers.d/90-bootplate-bob").is_none());
        let unit = sandbox
            .read("/etc/systemd/system/hello.service")
            .expect("hello.service");
        assert!(unit.contains("Description=Hello, world\n") && unit.contains("User=www-data\n"));
        assert!(unit.contains("ExecStart=/usr/local/libexec/bootplate/hello\n"));
        let wrapper = sandbox
            .read("/usr/local/libexec/bootplate/hello")
            .expect("the service's wrapper");
        check_shell(&format!("{what}: the service's wrapper"), &wrapper, true);
        check_unit(
            &what,
            "/etc/systemd/system/hello.service",
            &unit,
            &[(
                "/usr/local/libexec/bootplate/hello".to_owned(),
                0o755,
                wrapper.into_bytes(),
            )],
        );
        assert!(sandbox.called(&[
            "useradd",
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "www-data"
        ]));
        assert!(sandbox.called(&["systemctl", "enable", "--now", "hello.service"]));
        return;
    }
    // bootplate-agent: downloaded, checked, installed, running.
    let agent = format!("{}/bootplate-agent", agent_dir(case.entry.image));
    assert_eq!(
        sandbox.read(&agent).as_deref(),
        Some("stub download\n"),
        "{what}: {agent}"
    );
    assert_eq!(sandbox.mode(&agent), 0o755, "{what}");
    assert!(called_with("curl", AGENT_URL), "{what}: {calls:?}");
    assert!(
        called_with("sha256sum", "--check"),
        "{what}: the download was not checked: {calls:?}"
    );
    check_agent_service(&what, case, sandbox, &agent, "30s");
    // Proxy: the settings, and everything of the cluster reached directly.
    let env = sandbox.read("/etc/bootplate/proxy.env").expect("proxy.env");
    assert_eq!(sandbox.mode("/etc/bootplate/proxy.env"), 0o600);
    assert!(
        env.contains("HTTP_PROXY=http://proxy.example.com:3128\n"),
        "{what}: {env}"
    );
    assert!(
        env.contains("https_proxy=http://proxy.example.com:3129\n"),
        "{what}: {env}"
    );
    assert!(
        env.contains(
            "NO_PROXY=localhost,127.0.0.1,::1,.svc,.svc.cluster.local,192.168.0.0/16,10.96.0.0/12,api.demo.example.com,.internal.example.com,10.0.0.0/8\n"
        ),
        "{what}: {env}"
    );
    let dropin = sandbox
        .read("/etc/systemd/system/containerd.service.d/10-bootplate-proxy.conf")
        .expect("containerd's proxy drop-in");
    assert!(dropin.contains("EnvironmentFile=-/etc/bootplate/proxy.env"));
    // Registry mirrors, in order, and the sandbox image.
    assert_eq!(
        sandbox
            .read("/etc/containerd/certs.d/docker.io/hosts.toml")
            .as_deref(),
        Some(
            "# Mirrors of docker.io (bootplate variable registryMirrors).\n\n[host.\"https://mirror.example.com\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n[host.\"https://mirror2.example.com\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
        "{what}"
    );
    assert!(
        sandbox
            .read("/etc/containerd/certs.d/registry.k8s.io/hosts.toml")
            .unwrap()
            .contains("[host.\"https://k8s-mirror.example.com\"]")
    );
    let containerd = sandbox.read("/etc/containerd/config.toml").unwrap();
    assert!(containerd.contains("sandbox_image = \"registry.example.com/pause:3.10\""));
    assert!(containerd.contains("config_path = \"/etc/containerd/certs.d\""));
    // Time servers.
    let ntp = match case.entry.image {
        Image::Apt => sandbox.read("/etc/chrony/sources.d/bootplate.sources"),
        Image::Dnf => sandbox.read("/etc/chrony.d/bootplate.sources"),
        Image::Flatcar => sandbox.read("/etc/systemd/timesyncd.conf.d/bootplate.conf"),
    };
    let wanted = if case.entry.image == Image::Flatcar {
        "[Time]\nNTP=ntp1.example.com 10.0.0.1\n"
    } else {
        "server ntp1.example.com iburst\nserver 10.0.0.1 iburst\n"
    };
    assert_eq!(ntp.as_deref(), Some(wanted), "{what}");
    if case.entry.image == Image::Dnf {
        assert!(
            sandbox
                .read("/etc/chrony.conf")
                .unwrap()
                .contains("\nsourcedir /etc/chrony.d\n")
        );
    }
    // The pinned containerd, and the packages of the Machine's version.
    let package_version = if case.version == "v1.30" {
        "1.30.5"
    } else {
        "1.31.2"
    };
    match case.entry.name {
        "kubeadm-rocky-9" => {
            assert!(
                called_with("dnf", "containerd.io-1.7.24"),
                "{what}: {calls:?}"
            );
            assert!(called_with("dnf", &format!("kubelet-{package_version}")));
        }
        "kubeadm-amazonlinux-2023" => {
            assert!(called_with("dnf", "containerd-1.7.24"), "{what}: {calls:?}");
            assert!(called_with("dnf", &format!("kubeadm-{package_version}")));
        }
        "kubeadm-flatcar" => {
            let minor = if case.version == "v1.30" {
                "v1.30.5"
            } else {
                "v1.31.2"
            };
            assert!(called_with(
                "curl",
                &format!("https://dl.k8s.io/release/{minor}/bin/linux/amd64/kubeadm")
            ));
            assert!(called_with(
                "curl",
                "https://github.com/kubernetes-sigs/cri-tools/releases/download/v1.31.1/crictl-v1.31.1-linux-amd64.tar.gz"
            ));
            assert!(called_with(
                "curl",
                "https://github.com/containernetworking/plugins/releases/download/v1.6.1/cni-plugins-linux-amd64-v1.6.1.tgz"
            ));
        }
        _ => {
            assert!(
                called_with("apt-get", "containerd.io=1.7.24-*"),
                "{what}: {calls:?}"
            );
            assert!(called_with(
                "apt-get",
                &format!("kubelet={package_version}-*")
            ));
            let list = sandbox
                .read("/etc/apt/sources.list.d/kubernetes.list")
                .unwrap();
            let minor = &case.version;
            assert_eq!(
                list,
                format!(
                    "deb [signed-by=/etc/apt/keyrings/kubernetes.asc] https://pkgs.k8s.io/core:/stable:/{minor}/deb/ /\n"
                )
            );
        }
    }
    if case.entry.name == "kubeadm-rocky-9" {
        // enforcing: SELinux left alone; open-ports: the role's ports and the extra ones.
        assert!(
            sandbox
                .read("/etc/selinux/config")
                .unwrap()
                .contains("SELINUX=enforcing")
        );
        assert!(!calls.iter().any(|c| c[0] == "setenforce"));
        assert!(sandbox.called(&[
            "firewall-cmd",
            "--quiet",
            "--permanent",
            "--add-port=4789/udp"
        ]));
        let api = "--add-port=6443/tcp";
        assert_eq!(
            sandbox.called(&["firewall-cmd", "--quiet", "--permanent", api]),
            case.role.is_control_plane(),
            "{what}"
        );
    }
}

/// Every variable set to a realistic value: tools, golden files, boot, and each variable's
/// effect (the kubeadm ones in the kubeadm configuration, in the shape of its API version).
#[test]
fn every_variable_takes_effect() {
    in_parallel(&configured_cases(), |case| {
        let sandbox = boot_case(case);
        check_configured_effects(case, &sandbox);
    });
}

fn configured_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for entry in CATALOGUE {
        if entry.kubeadm {
            cases.push(configured(*entry, Role::Init, "v1.30"));
            cases.push(configured(*entry, Role::ControlPlaneJoin, "v1.31"));
            cases.push(configured(*entry, Role::Worker, "v1.31"));
        } else {
            cases.push(configured(*entry, Role::Worker, ""));
        }
    }
    cases
}

/// bootplate-agent is opt-in: without `inPlaceAgent` no template mentions it (its part renders
/// nothing), and the part rolls out. With it, the agent also comes from a path on a pre-baked
/// image (the configured cases take it from a URL), and a missing binary or source fails the
/// boot with a message naming the part and the variable.
#[test]
fn the_in_place_agent_is_opt_in() {
    for entry in CATALOGUE.iter().filter(|e| e.kubeadm) {
        let case = Case::new(*entry, Role::Worker, "v1.31");
        let data = case.render().expect("renders");
        assert!(
            !String::from_utf8_lossy(&data).contains("bootplate-agent"),
            "{}: the agent is installed without inPlaceAgent",
            entry.name
        );
        let spec = spec(entry.name);
        let part = spec.parts.last().expect("parts");
        assert_eq!(
            (part.name.as_str(), part.update),
            ("in-place-agent", crd_types::UpdateStrategy::Rollout),
            "{}: installing the agent needs a new machine",
            entry.name
        );
        // From the image: the binary is used where it is, no download.
        let pre_baked = "/opt/bootplate/bin/bootplate-agent";
        // The node is named after the Machine (the sandbox's `hostname` is a stub).
        let case = case.with_variables(json!({
            "inPlaceAgent": true,
            "inPlaceAgentSource": pre_baked,
            "nodeNameFromHostname": false,
        }));
        let what = format!("{} {} from the image", entry.name, case.label());
        let data = case.render().expect("renders");
        let boot = check_output(&what, case.format(), &data, false);
        let sandbox = Sandbox::new(entry.image);
        sandbox.write(pre_baked, b"#!/bin/sh\n", 0o755);
        let run = sandbox.boot(&boot);
        assert!(run.status.success(), "{what}: {}", run.output);
        assert!(
            !sandbox
                .calls()
                .iter()
                .any(|c| c[0] == "curl" && c.iter().any(|a| a.contains("bootplate-agent")))
        );
        check_agent_service(&what, &case, &sandbox, pre_baked, "60s");
        // Not on the image: the boot fails, naming the part and the variable.
        let sandbox = Sandbox::new(entry.image);
        let run = sandbox.boot(&boot);
        assert!(!run.status.success(), "{what}: booted without the binary");
        assert!(
            run.output.contains("bootplate: in-place-agent: /opt/bootplate/bin/bootplate-agent (inPlaceAgentSource) is not an executable file"),
            "{what}: {}",
            run.output
        );
        assert!(
            sandbox
                .read("/etc/systemd/system/bootplate-agent.service")
                .is_none()
        );
        // On, but no source.
        let case = Case::new(*entry, Role::Worker, "v1.31")
            .with_variables(json!({"inPlaceAgent": true, "nodeNameFromHostname": false}));
        let data = case.render().expect("renders");
        let sandbox = Sandbox::new(entry.image);
        let run = sandbox.boot(&decode(case.format(), &data));
        assert!(!run.status.success());
        assert!(
            run.output
                .contains("bootplate: in-place-agent: set inPlaceAgentSource"),
            "{}: {}",
            entry.name,
            run.output
        );
    }
}

/// templates/golden holds the golden files of the cases above and nothing else.
#[test]
fn no_stale_golden_files() {
    let mut wanted: Vec<PathBuf> = cases()
        .iter()
        .chain(pre_baked_cases().iter())
        .chain(configured_cases().iter())
        .chain(compat_cases().iter())
        .chain(network::cases().iter())
        .chain(network::other_cases().iter())
        .chain(compat_ignition_cases().iter())
        .map(golden_path)
        .collect();
    wanted.sort();
    let mut found = Vec::new();
    for dir in std::fs::read_dir(templates_dir().join("golden")).expect("templates/golden") {
        let dir = dir.expect("entry");
        if WINDOWS.iter().any(|name| dir.file_name() == *name) {
            continue;
        }
        for file in std::fs::read_dir(dir.path()).expect("a template's directory") {
            found.push(file.expect("entry").path());
        }
    }
    found.sort();
    assert_eq!(found, wanted);
}

/// The defaults of the Rocky template: SELinux permissive (now and after reboots), firewalld
/// disabled.
#[test]
fn rocky_defaults_relax_selinux_and_disable_firewalld() {
    let case = Case::new(entry("kubeadm-rocky-9"), Role::Worker, "v1.31");
    let sandbox = boot_case(&case);
    assert!(sandbox.called(&["setenforce", "0"]));
    assert!(
        sandbox
            .read("/etc/selinux/config")
            .unwrap()
            .contains("SELINUX=permissive\n")
    );
    assert!(sandbox.called(&["systemctl", "disable", "--now", "firewalld.service"]));
    assert!(!sandbox.calls().iter().any(|c| c[0] == "firewall-cmd"));
}

/// The plain machine's service: every argument and environment value reaches the program
/// byte for byte, through the wrapper script, whatever it holds.
#[test]
fn plain_service_arguments_arrive_byte_for_byte() {
    let case = Case::new(entry("plain-linux"), Role::Worker, "").with_variables(json!({
        "serviceName": "echo",
        "serviceCommand": ["/bin/sh", "-c", "printf '%s|' \"$GREETING\" \"$@\"", "sh", HOSTILE, HOSTILE_LINE, ""],
        "serviceEnvironment": {"GREETING": HOSTILE},
        "users": [{"name": "alice", "sshAuthorizedKeys": [HOSTILE_LINE, "ssh-ed25519 AAAA b@c"]}],
    }));
    let data = case.render().unwrap();
    let sandbox = Sandbox::new(Image::Apt);
    let run = sandbox.boot(&check_output("plain service", case.format(), &data, false));
    assert!(run.status.success(), "{}", run.output);
    let wrapper = sandbox.read("/usr/local/libexec/bootplate/echo").unwrap();
    check_shell("the service's wrapper", &wrapper, false);
    let run = sandbox.exec(&["/usr/local/libexec/bootplate/echo"]);
    assert!(run.status.success(), "{}", run.output);
    assert_eq!(run.stdout, format!("{HOSTILE}|{HOSTILE}|{HOSTILE_LINE}||"));
    assert_eq!(
        sandbox.read("/home/alice/.ssh/authorized_keys").unwrap(),
        format!("{HOSTILE_LINE}\nssh-ed25519 AAAA b@c\n")
    );
    assert!(sandbox.pwned().is_empty(), "{:?}", sandbox.pwned());
}

/// Each template has its page in docs/templates/, listing every variable, linked from the
/// catalogue in docs/templates.md, which shows the pre-baked config the tests use.
#[test]
fn every_template_is_documented() {
    let catalogue = std::fs::read_to_string(repo().join("docs/templates.md")).expect("docs");
    for entry in CATALOGUE {
        let page = format!("templates/{}.md", entry.name);
        assert!(
            catalogue.contains(&format!("]({page})")),
            "docs/templates.md does not link {page}"
        );
        let text = std::fs::read_to_string(repo().join("docs").join(&page))
            .unwrap_or_else(|e| panic!("docs/{page}: {e}"));
        for v in &spec(entry.name).variables {
            assert!(
                text.contains(&format!("| `{}` |", v.name)),
                "docs/{page} does not describe the variable `{}`",
                v.name
            );
        }
    }
    let pre_baked = std::fs::read_to_string(testdata("config-prebaked.yaml")).expect("testdata");
    assert!(
        catalogue.contains(&format!("```yaml\n{pre_baked}```")),
        "docs/templates.md does not show templates/testdata/config-prebaked.yaml as it is"
    );
}

// ---------------------------------------------------------------------------------------------
// The command line.

fn bootplate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("the bootplate binary runs")
}

/// `bootplate lint templates/*.yaml` exits 0 and prints nothing: no error, no warning.
#[test]
fn bootplate_lint_prints_nothing() {
    let mut files: Vec<String> = std::fs::read_dir(templates_dir())
        .expect("templates/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .map(|n| format!("templates/{n}"))
        .collect();
    files.sort();
    // The catalogue, kubeadm-compat, kubeadm-compat-ignition and the Windows templates.
    let shipped = CATALOGUE.len() + 2 + WINDOWS.len();
    assert_eq!(files.len(), shipped);
    let mut args = vec!["lint"];
    args.extend(files.iter().map(String::as_str));
    let output = bootplate(&args);
    assert!(output.status.success(), "{}", text(&output));
    // No problem; the summary line on stderr counts the templates and nothing else.
    assert_eq!(
        text(&output),
        format!("bootplate lint: {shipped} objects, 0 errors, 0 warnings, 0 skipped\n"),
        "bootplate lint printed something"
    );
}

/// The CA hashes in `text`, zeroed (the command line signs with a throw-away CA).
fn zero_ca_hashes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("sha256:") {
        let (head, tail) = rest.split_at(i + "sha256:".len());
        out.push_str(head);
        let hex = tail.chars().take_while(char::is_ascii_hexdigit).count();
        if hex == 64 {
            out.push_str(&"0".repeat(64));
            rest = &tail[64..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

fn normalized(boot: &Boot) -> Vec<(String, u32, String)> {
    let mut items: Vec<(String, u32, String)> = boot
        .files
        .iter()
        .map(|(p, m, c)| (p.clone(), *m, zero_ca_hashes(&String::from_utf8_lossy(c))))
        .collect();
    if let Some((path, script)) = &boot.script {
        items.push((path.clone(), 0o700, zero_ca_hashes(script)));
    }
    items
}

/// `bootplate render --template T --machine M --cluster C --role R`, with no --config, renders
/// every template for every role and version into output its consumer accepts; with a fixed
/// --token, a worker's output is the engine's (the golden file's) but for the CA hash.
#[test]
fn bootplate_render_needs_no_config() {
    in_parallel(&cases(), |case| {
        let what = format!("bootplate render {} {}", case.entry.name, case.label());
        let template = format!("templates/{}.yaml", case.entry.name);
        let machine = case.machine_file().to_string_lossy().into_owned();
        let cluster = testdata("cluster.yaml").to_string_lossy().into_owned();
        let role = case.role.to_string();
        let mut args = vec![
            "render",
            "--template",
            &template,
            "--machine",
            &machine,
            "--cluster",
            &cluster,
            "--role",
            &role,
        ];
        let output = bootplate(&args);
        assert!(output.status.success(), "{what}: {}", text(&output));
        assert!(output.stderr.is_empty(), "{what}: {}", text(&output));
        check_output(&what, case.format(), &output.stdout, true);
        if case.role == Role::Worker {
            args.extend(["--token", TOKEN]);
            let output = bootplate(&args);
            assert!(output.status.success(), "{what}: {}", text(&output));
            let engine = case.render().expect("engine render");
            assert_eq!(
                normalized(&decode(case.format(), &output.stdout)),
                normalized(&decode(case.format(), &engine)),
                "{what}: the command line renders another user-data than the engine"
            );
        }
    });
}

/// bootplate-agent runs as root: a template that installs it from `inPlaceAgentSource` refuses
/// an `http://` URL without `inPlaceAgentSha256`, in the admission webhook's check and in lint
/// with the config (`InvalidVariables` on the config's variables), and takes an `https://` URL
/// (with or without the digest), an `http://` URL with the digest, and a path on the image.
#[test]
fn an_http_agent_source_needs_its_digest() {
    let digest = "0".repeat(64);
    let cases = [
        ("http://mirror.example/bootplate-agent", "", false),
        (
            "http://mirror.example/bootplate-agent",
            digest.as_str(),
            true,
        ),
        ("https://mirror.example/bootplate-agent", "", true),
        (
            "https://mirror.example/bootplate-agent",
            digest.as_str(),
            true,
        ),
        ("/opt/bin/bootplate-agent", "", true),
    ];
    let mut templates = 0;
    for entry in CATALOGUE {
        let spec = spec(entry.name);
        if !spec
            .variables
            .iter()
            .any(|v| v.name == "inPlaceAgentSource")
        {
            continue;
        }
        templates += 1;
        for (source, sha256, accepted) in &cases {
            let config: BootplateConfigSpec = serde_json::from_value(json!({
                "templateRef": {"kind": "ClusterBootstrapTemplate", "name": entry.name},
                "variables": {"inPlaceAgent": true, "inPlaceAgentSource": source, "inPlaceAgentSha256": sha256},
            }))
            .unwrap();
            let what = format!("{}: {source} with {sha256:?}", entry.name);
            let denials = bootplate::webhook::validate::config(
                "spec",
                "default",
                &config,
                Some((entry.name, &spec)),
            );
            let linted: Vec<_> = render::lint(entry.name, &spec, Some(&config))
                .into_iter()
                .filter(|p| p.reason == "InvalidVariables")
                .collect();
            if *accepted {
                assert!(denials.is_empty(), "{what}: {denials:?}");
                assert!(linted.is_empty(), "{what}: {linted:?}");
            } else {
                assert!(
                    denials.iter().any(|d| d.contains("spec.variables")
                        && d.contains("inPlaceAgentSha256 is empty")),
                    "{what}: {denials:?}"
                );
                assert!(
                    linted.iter().any(|p| p.origin == render::Origin::Config
                        && p.message.contains("inPlaceAgentSource is an http:// URL")),
                    "{what}: {linted:?}"
                );
            }
        }
    }
    assert_eq!(templates, 6, "the templates that install bootplate-agent");
}

// ---------------------------------------------------------------------------------------------
// kubeadm-compat: the kubeadm bootstrap provider's fields, which `bootplate import` fills in.
// Apart from the catalogue above: its variables are a KubeadmConfigSpec's (several unset by
// default on purpose, as in the spec), and it installs nothing (no install part, no swap edit).

const COMPAT: Entry = Entry {
    name: "kubeadm-compat",
    kubeadm: false,
    image: Image::Apt,
};

/// The configured cases' config: examples/kubeadm-config-template.yaml through the importer,
/// with the Secret of its `contentFrom` file resolved, as the controller does before rendering.
fn compat_imported() -> BootplateConfigSpec {
    let source: Value = read_yaml(&repo().join("examples/kubeadm-config-template.yaml"));
    let imported = bootplate::core::import::import(&source).expect("the example imports");
    assert_eq!(imported.lost, vec![], "the example carries every field");
    let mut spec = imported.spec;
    for file in &mut spec.files {
        if file.content_from.take().is_some() {
            file.content = Some("token-from-the-secret\n".to_owned());
        }
    }
    spec
}

/// Every role at both kubeadm API versions with the defaults, and the imported example for a
/// worker (v1.30 and v1.31) and a control-plane join.
fn compat_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for role in Role::ALL {
        for version in VERSIONS {
            cases.push(Case::new(COMPAT, role, version));
        }
    }
    for (role, version) in [
        (Role::Worker, "v1.30"),
        (Role::Worker, "v1.31"),
        (Role::ControlPlaneJoin, "v1.31"),
    ] {
        let mut case = Case::new(COMPAT, role, version);
        case.config = compat_imported();
        case.tag = "configured";
        cases.push(case);
    }
    cases
}

/// cloud-init's schema, the golden files and a sandbox boot (kubeadm join or init with the
/// file it wrote, the sentinel), and for the configured cases what the KubeadmConfigSpec says:
/// its files with their modes, the commands in order around kubeadm, the JoinConfiguration.
#[test]
fn kubeadm_compat_renders_passes_its_tools_and_boots() {
    in_parallel(&compat_cases(), |case| {
        let what = format!("kubeadm-compat {}", case.label());
        let sandbox = boot_case(case);
        let (verb, path) = match case.role {
            Role::Init => ("init", "/run/kubeadm/kubeadm.yaml"),
            _ => ("join", "/run/kubeadm/kubeadm-join-config.yaml"),
        };
        let flags: &[&str] = if case.tag.is_empty() {
            &[]
        } else {
            &["--v", "4"]
        };
        let mut expected = vec!["kubeadm", verb, "--config", path];
        expected.extend_from_slice(flags);
        assert!(sandbox.called(&expected), "{what}: {:?}", sandbox.calls());
        let docs = kubeadm_documents(&sandbox, case.role);
        assert_eq!(
            docs[0]["apiVersion"],
            if case.version == "v1.31" {
                "kubeadm.k8s.io/v1beta4"
            } else {
                "kubeadm.k8s.io/v1beta3"
            }
        );
        if !case.tag.is_empty() {
            check_compat_configured(&what, case, &sandbox, &docs[0]);
        }
    });
}

fn check_compat_configured(what: &str, case: &Case, sandbox: &Sandbox, join: &Value) {
    assert_eq!(
        sandbox.read("/etc/app/token").as_deref(),
        Some("token-from-the-secret\n")
    );
    assert_eq!(sandbox.mode("/etc/app/token"), 0o640, "{what}");
    assert_eq!(
        sandbox.read("/etc/app/config.json").as_deref(),
        Some("{\"a\":1}\n"),
        "{what}"
    );
    let registration = &join["nodeRegistration"];
    assert_eq!(
        registration["criSocket"],
        "unix:///var/run/containerd/containerd.sock"
    );
    assert_eq!(registration["ignorePreflightErrors"], json!(["NumCPU"]));
    let args = [("cloud-provider", "external"), ("node-labels", "tier=web")];
    assert_eq!(
        registration["kubeletExtraArgs"],
        flags(case.version == "v1.31", &args),
        "{what}"
    );
    let dedicated = json!({"key": "dedicated", "value": "web", "effect": "NoSchedule"});
    let expected = if case.role == Role::Worker {
        json!([dedicated, {"key": "node.cluster.x-k8s.io/uninitialized", "effect": "NoSchedule"}])
    } else {
        json!([dedicated])
    };
    assert_eq!(registration["taints"], expected, "{what}");
    assert_eq!(join["patches"]["directory"], "/etc/kubernetes/patches");
    assert_eq!(join["discovery"]["bootstrapToken"]["token"], TOKEN);
    assert_eq!(
        join.get("controlPlane").is_some(),
        case.role == Role::ControlPlaneJoin,
        "{what}"
    );
    check_compat_modules(what, case);
}

/// The cloud-init modules the sandbox does not run, as cloud-init reads them: the commands in
/// the spec's order around kubeadm, boot commands, users, NTP, disk setup and mounts.
fn check_compat_modules(what: &str, case: &Case) {
    let doc = yaml_to_json(&case.render().expect("renders"));
    let join = "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml --v 4 && echo success > /run/cluster-api/bootstrap-success.complete";
    assert_eq!(
        doc["runcmd"],
        json!(["echo pre-kubeadm", join, "echo post-kubeadm"]),
        "{what}"
    );
    assert_eq!(doc["bootcmd"], json!(["echo boot"]), "{what}");
    assert_eq!(
        doc["ntp"],
        json!({"servers": ["time.example.com"], "enabled": true}),
        "{what}"
    );
    assert_eq!(
        doc["users"],
        json!([{"name": "ops", "groups": "adm,sudo", "shell": "/bin/bash", "lock_passwd": true,
            "sudo": "ALL=(ALL) NOPASSWD:ALL",
            "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBootplateExampleKeyOnly ops@example"]}]),
        "{what}"
    );
    assert_eq!(
        doc["disk_setup"],
        json!({"/dev/sdb": {"table_type": "gpt", "layout": true, "overwrite": false}}),
        "{what}"
    );
    assert_eq!(
        doc["fs_setup"],
        json!([{"device": "/dev/sdb1", "filesystem": "ext4", "label": "data", "extra_opts": ["-E", "lazy_itable_init=1"]}]),
        "{what}"
    );
    assert_eq!(
        doc["mounts"],
        json!([["LABEL=data", "/var/lib/data"]]),
        "{what}"
    );
}

// kubeadm-compat-ignition: kubeadm-compat for a KubeadmConfigSpec with `format: ignition`, in
// the kubeadm bootstrap provider's layout (/etc/kubeadm.yml, /etc/kubeadm.sh, kubeadm.service).

const COMPAT_IGNITION: Entry = Entry {
    name: "kubeadm-compat-ignition",
    kubeadm: false,
    image: Image::Flatcar,
};

/// An imported KubeadmConfigSpec with `format: ignition` and every field the template carries.
fn compat_ignition_imported() -> BootplateConfigSpec {
    let source = json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfigTemplate",
        "metadata": {"name": "flatcar-workers", "namespace": "team-a"},
        "spec": {"template": {"spec": {
            "format": "ignition",
            "ignition": {"containerLinuxConfig": {}},
            "files": [
                {"path": "/etc/app/env", "content": "A=1 B=\"two words\"\n", "owner": "core:core", "permissions": "0640"},
                {"path": "/etc/app/blob", "content": "aGVsbG8K", "encoding": "base64"},
            ],
            "preKubeadmCommands": ["echo pre-kubeadm", "echo 'a|b' > /tmp/pre"],
            "postKubeadmCommands": ["echo post-kubeadm"],
            "users": [{"name": "ops", "groups": "docker, wheel", "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBootplateExampleKeyOnly ops@example"]}],
            "ntp": {"servers": ["time.example.com"], "enabled": true},
            "verbosity": 4,
            "joinConfiguration": {"nodeRegistration": {
                "ignorePreflightErrors": ["NumCPU"],
                "kubeletExtraArgs": [{"name": "node-labels", "value": "tier=web"}],
                "taints": [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}],
            }},
        }}},
    });
    let imported = bootplate::core::import::import(&source).expect("imports");
    assert_eq!(imported.lost, vec![], "every field carried");
    assert_eq!(imported.spec.template_ref.name, "kubeadm-compat-ignition");
    imported.spec
}

/// Every role at both kubeadm API versions with the defaults, and the imported spec above for
/// a worker at v1.31.
fn compat_ignition_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for role in Role::ALL {
        for version in VERSIONS {
            cases.push(Case::new(COMPAT_IGNITION, role, version));
        }
    }
    let mut case = Case::new(COMPAT_IGNITION, Role::Worker, "v1.31");
    case.config = compat_ignition_imported();
    case.tag = "configured";
    cases.push(case);
    cases
}

/// ignition-validate, the golden files and a sandbox boot of /etc/kubeadm.sh (kubeadm with
/// /etc/kubeadm.yml, the sentinel, the file moved to /tmp), and for the configured case the
/// files, the commands in order around kubeadm, the JoinConfiguration, users and NTP.
#[test]
fn kubeadm_compat_ignition_renders_passes_its_tools_and_boots() {
    in_parallel(&compat_ignition_cases(), |case| {
        let what = format!("kubeadm-compat-ignition {}", case.label());
        let sandbox = boot_case(case);
        let verb = if case.role == Role::Init {
            "init"
        } else {
            "join"
        };
        let mut expected = vec!["kubeadm", verb, "--config", "/etc/kubeadm.yml"];
        if !case.tag.is_empty() {
            expected.extend_from_slice(&["--v", "4"]);
        }
        assert!(sandbox.called(&expected), "{what}: {:?}", sandbox.calls());
        assert!(
            sandbox.read("/etc/kubeadm.yml").is_none(),
            "{what}: moved away"
        );
        let text = sandbox.read("/tmp/kubeadm.yml").expect("/tmp/kubeadm.yml");
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .filter_map(|d| {
                let v: serde_yaml::Value = serde::Deserialize::deserialize(d).ok()?;
                (!v.is_null()).then(|| serde_json::to_value(v).expect("JSON-compatible YAML"))
            })
            .collect();
        let api = if case.version == "v1.31" {
            "v1beta4"
        } else {
            "v1beta3"
        };
        assert_eq!(
            docs[0]["apiVersion"],
            format!("kubeadm.k8s.io/{api}"),
            "{what}"
        );
        assert_eq!(
            docs.len(),
            if case.role == Role::Init { 2 } else { 1 },
            "{what}"
        );
        if !case.tag.is_empty() {
            check_compat_ignition_configured(&what, case, &sandbox, &docs[0]);
        }
    });
}

fn check_compat_ignition_configured(what: &str, case: &Case, sandbox: &Sandbox, join: &Value) {
    assert_eq!(
        sandbox.read("/etc/app/env").as_deref(),
        Some("A=1 B=\"two words\"\n")
    );
    assert_eq!(sandbox.mode("/etc/app/env"), 0o640, "{what}");
    assert_eq!(sandbox.read("/etc/app/blob").as_deref(), Some("hello\n"));
    assert_eq!(sandbox.read("/tmp/pre").as_deref(), Some("a|b\n"));
    let script = sandbox.read("/etc/kubeadm.sh").expect("the script");
    let lines: Vec<&str> = script.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines,
        [
            "#!/bin/bash",
            "set -e",
            "echo pre-kubeadm",
            "echo 'a|b' > /tmp/pre",
            "kubeadm join --config /etc/kubeadm.yml --v 4",
            "mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete",
            "mv /etc/kubeadm.yml /tmp/",
            "echo post-kubeadm",
        ],
        "{what}"
    );
    let registration = &join["nodeRegistration"];
    assert_eq!(registration["ignorePreflightErrors"], json!(["NumCPU"]));
    assert_eq!(
        registration["kubeletExtraArgs"],
        json!([{"name": "node-labels", "value": "tier=web"}])
    );
    assert_eq!(
        registration["taints"],
        json!([{"key": "dedicated", "value": "web", "effect": "NoSchedule"},
            {"key": "node.cluster.x-k8s.io/uninitialized", "effect": "NoSchedule"}])
    );
    assert_eq!(join["discovery"]["bootstrapToken"]["token"], TOKEN);
    let doc: Value = serde_json::from_slice(&case.render().expect("renders")).expect("JSON");
    assert_eq!(
        doc["passwd"]["users"],
        json!([{"name": "ops", "groups": ["docker", "wheel"],
            "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBootplateExampleKeyOnly ops@example"]}]),
        "{what}"
    );
    let units: Vec<&str> = doc["systemd"]["units"]
        .as_array()
        .expect("units")
        .iter()
        .filter_map(|u| u["name"].as_str())
        .collect();
    assert_eq!(units, ["ntpd.service", "kubeadm.service"], "{what}");
    let ntp = sandbox.read("/etc/ntp.conf").expect("ntp.conf");
    assert!(
        ntp.starts_with("# Common pool\nserver time.example.com\n"),
        "{ntp}"
    );
    assert_eq!(
        sandbox.read("/etc/sudoers.d/ops").as_deref(),
        Some("ops ALL=(ALL) NOPASSWD:ALL\n")
    );
}
