//! The boot proof (`tests/boot/`): every template, rendered by `bootplate render` for each role
//! it supports at two Kubernetes versions, is executed by the programs its images run at first
//! boot, real cloud-init 22.4 (cloud-config, script, MIME) or real Ignition 2.14, in a
//! throw-away copy of a cached Debian 12 root (a chroot in namespaces of its own, no VM), where
//! package managers, kubeadm, systemctl's actions on a running systemd, modprobe, sysctl and
//! downloads are stubs that record their arguments. The templates are the shipped catalogue
//! (`templates/*.yaml`, found there, so new templates are covered as they land) and the boot
//! proof's fixtures (`tests/boot/fixtures/templates/`), the kubeadm fixture in every format.
//!
//! `tests/boot/lib/check.py` compares the root with the user-data (files, units, steps, stub
//! calls, kubeadm configuration, users, hostname, sentinel); the tests here assert its report
//! and check it against the templates themselves. The failure drills prove that a broken
//! template fails the proof with a message naming the template, role and failing step.
//!
//! Runs as root. The first run builds the Debian root with debootstrap (about a minute, network
//! needed) and caches it under ~/.cache/bootplate/boot; without root or debootstrap the tests
//! fail and say so (tests/scripts/install-tools.sh installs debootstrap).

use std::path::{Path, PathBuf};
use std::process::Command;

use crd_types::{Role, TemplateSpec};
use serde::Deserialize;
use serde_json::Value;

/// Kubernetes versions the kubeadm templates are proven at (kubeadm's configuration API is
/// v1beta3 below 1.31 and v1beta4 from 1.31 on). prove.sh uses the same by default.
const VERSIONS: [&str; 2] = ["v1.30.4", "v1.31.2"];

/// What the fixture Machine without a version is called (tests/boot/fixtures/machine-plain.yaml).
const PLAIN_MACHINE: &str = "proof-plain-0";

/// Where kubeadm's configuration is written (issue 5): for `init`, for `join`.
const KUBEADM_CONFIG: [&str; 2] = [
    "/run/kubeadm/kubeadm.yaml",
    "/run/kubeadm/kubeadm-join-config.yaml",
];

/// The template keeping the layout of the kubeadm bootstrap provider's Ignition: the kubeadm
/// configuration at [`PROVIDER_IGNITION_CONFIG`], which its script moves to
/// [`PROVIDER_IGNITION_MOVED`] once kubeadm ran.
const PROVIDER_IGNITION: &str = "kubeadm-compat-ignition";
const PROVIDER_IGNITION_CONFIG: &str = "/etc/kubeadm.yml";
const PROVIDER_IGNITION_MOVED: &str = "/tmp/kubeadm.yml";

/// Package managers among the stubs: the packages are installed before kubeadm runs.
const PACKAGE_MANAGERS: [&str; 6] = ["apt-get", "apt", "dnf", "yum", "microdnf", "zypper"];

#[path = "boot/network.rs"]
mod network;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Where a proof's cases go: under the target directory, kept for inspection after a failure.
fn out_dir(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    target.join("boot-proof-tests").join(name)
}

/// The shipped templates: every `templates/*.yaml` holding a (Cluster)BootstrapTemplate, but
/// the Windows ones (cloudbase-init's own code checks those: controller/tests/windows.rs).
fn catalogue() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo().join("templates"))
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
                .filter(|p| {
                    std::fs::read_to_string(p).is_ok_and(|t| {
                        t.lines().any(|l| {
                            l == "kind: ClusterBootstrapTemplate" || l == "kind: BootstrapTemplate"
                        }) && !t.lines().any(|l| {
                            l == "  format: windows-cloud-config" || l == "  format: powershell"
                        })
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn fixture(path: &str) -> PathBuf {
    repo().join("tests/boot/fixtures").join(path)
}

/// Copies of `template` in other output formats (`format:` and `metadata.name` changed), written
/// to `dir` as `<name>-<format>.yaml`.
fn format_variants(template: &Path, formats: &[&str], dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(template).expect("the template");
    let name = template.file_stem().unwrap().to_string_lossy().to_string();
    std::fs::create_dir_all(dir).expect("a directory for the variants");
    formats
        .iter()
        .map(|format| {
            let variant = text
                .replace(
                    "\n  format: cloud-config\n",
                    &format!("\n  format: {format}\n"),
                )
                .replace(
                    &format!("\n  name: {name}\n"),
                    &format!("\n  name: {name}-{format}\n"),
                );
            assert_ne!(
                variant,
                text,
                "{}: no `format: cloud-config` line",
                template.display()
            );
            let path = dir.join(format!("{name}-{format}.yaml"));
            std::fs::write(&path, variant).expect("the variant");
            path
        })
        .collect()
}

struct Proof {
    status: Option<i32>,
    stdout: String,
    stderr: String,
    summary: Value,
}

/// Runs `tests/boot/prove.sh` on `templates` with this test's bootplate binary.
fn prove(out: &Path, templates: &[PathBuf]) -> Proof {
    prove_with(out, templates, None)
}

/// [`prove`], every render with `config` when given.
fn prove_with(out: &Path, templates: &[PathBuf], config: Option<&Path>) -> Proof {
    prove_versions(out, templates, config, &VERSIONS)
}

/// [`prove_with`] for the Kubernetes `versions` given.
fn prove_versions(
    out: &Path,
    templates: &[PathBuf],
    config: Option<&Path>,
    versions: &[&str],
) -> Proof {
    let mut command = Command::new(repo().join("tests/boot/prove.sh"));
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    let output = command
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_bootplate"))
        .arg("--out")
        .arg(out)
        .arg("--versions")
        .arg(versions.join(" "))
        .args(templates)
        .output()
        .expect("tests/boot/prove.sh runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_ne!(
        output.status.code(),
        Some(2),
        "the boot proof could not run (it needs root, debootstrap and, the first time, the \
         network to build its Debian root; tests/scripts/install-tools.sh installs the tools):\n\
         {stdout}\n{stderr}"
    );
    let summary = std::fs::read_to_string(out.join("summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| panic!("prove.sh wrote no summary.json:\n{stdout}\n{stderr}"));
    Proof {
        status: output.status.code(),
        stdout,
        stderr,
        summary,
    }
}

/// Every case of `proof` was proven (prove.sh exited 0).
fn assert_proven(proof: &Proof) {
    assert_eq!(
        proof.status,
        Some(0),
        "the boot proof failed:\n{}\n{}",
        proof.stdout,
        proof.stderr
    );
}

/// One proven case: what prove.sh rendered and the report of its run.
struct Case {
    template: PathBuf,
    config: Option<PathBuf>,
    role: String,
    version: String,
    dir: PathBuf,
    report: Value,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{} role {} {}",
            self.template.file_stem().unwrap().to_string_lossy(),
            self.role,
            self.version
        )
    }

    fn spec(&self) -> TemplateSpec {
        let text = std::fs::read_to_string(&self.template).expect("the template");
        let object: serde_yaml::Value = serde_yaml::from_str(&text).expect("template YAML");
        serde_yaml::from_value(object["spec"].clone()).expect("a template spec")
    }

    /// A variable's value: the config's (prove.sh uses tests/boot/fixtures/configs/<template>
    /// when it exists), else the template's default.
    fn variable(&self, name: &str) -> Option<Value> {
        if let Some(config) = &self.config {
            let text = std::fs::read_to_string(config).expect("the config");
            let object: serde_yaml::Value = serde_yaml::from_str(&text).expect("config YAML");
            let value = &object["spec"]["variables"][name];
            if !value.is_null() {
                return Some(serde_json::to_value(value).expect("a JSON value"));
            }
        }
        self.spec()
            .variables
            .into_iter()
            .find(|v| v.name == name)
            .and_then(|v| v.default)
    }

    fn stem(&self) -> String {
        self.template.file_stem().unwrap().to_string_lossy().into()
    }

    /// The kubeadm configuration file the case's `kubeadm` reads.
    fn kubeadm_config(&self) -> &'static str {
        if self.stem() == PROVIDER_IGNITION {
            PROVIDER_IGNITION_CONFIG
        } else {
            KUBEADM_CONFIG[usize::from(self.role != "init")]
        }
    }

    fn kubeadm(&self) -> bool {
        runs_kubeadm(&self.template)
    }

    fn stub_calls(&self) -> Vec<(String, Vec<String>)> {
        self.report["stubCalls"]
            .as_array()
            .expect("stubCalls")
            .iter()
            .map(|c| {
                let args = c["args"].as_array().expect("args");
                (
                    c["program"].as_str().unwrap().to_owned(),
                    args.iter()
                        .map(|a| a.as_str().unwrap().to_owned())
                        .collect(),
                )
            })
            .collect()
    }

    /// Whether a command of the user-data ran `systemctl enable` on `unit` (a unit declared
    /// `enable: false` that the template's commands enable once its package is installed).
    fn enabled_by_a_command(&self, unit: &str) -> bool {
        let short = unit.strip_suffix(".service").unwrap_or(unit);
        self.stub_calls().iter().any(|(program, args)| {
            program == "systemctl"
                && args.first().is_some_and(|verb| verb == "enable")
                && args[1..].iter().any(|a| a == unit || a == short)
        })
    }

    /// `program arg...` of each stub call, for messages and exact comparisons.
    fn stub_lines(&self) -> Vec<String> {
        self.stub_calls()
            .into_iter()
            .map(|(p, a)| std::iter::once(p).chain(a).collect::<Vec<_>>().join(" "))
            .collect()
    }
}

fn cases(proof: &Proof) -> Vec<Case> {
    proof.summary["cases"]
        .as_array()
        .expect("summary cases")
        .iter()
        .map(|c| {
            let dir = PathBuf::from(c["dir"].as_str().unwrap());
            let report = std::fs::read_to_string(dir.join("run/report.json"))
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or(Value::Null);
            Case {
                template: PathBuf::from(c["template"].as_str().unwrap()),
                config: c["config"]
                    .as_str()
                    .filter(|c| !c.is_empty())
                    .map(PathBuf::from),
                role: c["role"].as_str().unwrap().to_owned(),
                version: c["version"].as_str().unwrap().to_owned(),
                dir,
                report,
            }
        })
        .collect()
}

/// Whether the template runs kubeadm (prove.sh's own test: it then proves every role).
fn runs_kubeadm(template: &Path) -> bool {
    let text = std::fs::read_to_string(template).expect("the template");
    text.contains("kubeadm init") || text.contains("kubeadm join")
}

fn applies(roles: &[Role], role: &str) -> bool {
    roles.is_empty() || roles.iter().any(|r| r.as_str() == role)
}

/// The report agrees with the template itself (not only with the rendered user-data): every
/// file with a literal path is written with the template's mode and owner, every unit is in
/// place with its drop-ins and enabled or not as declared.
fn check_against_template(case: &Case) {
    let spec = case.spec();
    let label = case.label();
    let files = case.report["files"].as_array().expect("files");
    let units = case.report["units"].as_array().expect("units");
    // A later unit of the same name merges into the earlier one (docs/templates.md).
    let mut declared_units: Vec<(String, bool, bool, Vec<String>)> = Vec::new();
    for part in spec.parts.iter().filter(|p| applies(&p.roles, &case.role)) {
        for file in part.files.iter().filter(|f| !f.path.contains("{{")) {
            let entry = files
                .iter()
                .find(|f| f["path"] == file.path.as_str())
                .unwrap_or_else(|| panic!("{label}: {} was not checked", file.path));
            assert_eq!(entry["ok"], true, "{label}: {entry}");
            let mode = format!("{:0>4}", file.permissions.as_deref().unwrap_or("0644"));
            assert_eq!(
                entry["declaredMode"],
                mode.as_str(),
                "{label}: {}",
                file.path
            );
            assert_eq!(entry["mode"], mode.as_str(), "{label}: {}", file.path);
            let owner = file.owner.as_deref().unwrap_or("root:root");
            let declared = entry["declaredOwner"].as_str().unwrap();
            assert!(
                declared == owner || declared.starts_with(&format!("{owner}:")),
                "{label}: {} declared owner {declared}, the template says {owner}",
                file.path
            );
        }
        for unit in &part.units {
            let drop_ins = unit.drop_ins.iter().map(|d| d.name.clone());
            match declared_units.iter_mut().find(|u| u.0 == unit.name) {
                Some(u) => {
                    u.1 = unit.enable.unwrap_or(u.1);
                    u.2 |= unit.content.is_some();
                    u.3.extend(drop_ins);
                }
                None => declared_units.push((
                    unit.name.clone(),
                    unit.enabled(),
                    unit.content.is_some(),
                    drop_ins.collect(),
                )),
            }
        }
    }
    for (name, enabled, has_content, drop_ins) in declared_units {
        let entry = units
            .iter()
            .find(|u| u["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{label}: unit {name} not in the report: {units:?}"));
        if has_content {
            assert_eq!(
                entry["unitFile"],
                format!("/etc/systemd/system/{name}").as_str(),
                "{label}: {entry}"
            );
        }
        for d in drop_ins {
            let path = format!("/etc/systemd/system/{name}.d/{d}");
            assert!(
                entry["dropIns"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p == path.as_str()),
                "{label}: drop-in {path} missing: {entry}"
            );
        }
        let state = entry["state"].as_str().unwrap();
        if enabled {
            // Also a unit with only drop-ins: its file comes with a package the commands
            // installed (the stubs put it in place), and a unit file missing there fails.
            assert_eq!(
                state, "enabled",
                "{label}: {name} should be enabled: {entry}"
            );
        } else if !case.enabled_by_a_command(&name) {
            assert_ne!(state, "enabled", "{label}: {name} should stay disabled");
        }
    }
}

/// kubeadm ran once, with `init` for the first control-plane machine and `join` otherwise, on a
/// configuration file the user-data wrote, in the configuration API of the Machine's version;
/// after the packages were installed and the units enabled.
fn check_kubeadm(case: &Case) {
    let label = case.label();
    let records = case.report["kubeadm"].as_array().expect("kubeadm records");
    let (subcommand, kind) = if case.role == "init" {
        ("init", "InitConfiguration")
    } else {
        ("join", "JoinConfiguration")
    };
    let api = if case.version.as_str() < "v1.31" {
        "kubeadm.k8s.io/v1beta3"
    } else {
        "kubeadm.k8s.io/v1beta4"
    };
    assert_eq!(records.len(), 1, "{label}: kubeadm runs once: {records:?}");
    let record = &records[0];
    assert_eq!(record["subcommand"], subcommand, "{label}: {record}");
    let config = record["config"].as_str().unwrap();
    assert_eq!(config, case.kubeadm_config(), "{label}");
    // The configuration kubeadm read (the stub keeps a copy), parsed here too.
    let copy = case
        .dir
        .join(format!("run/run/bootplate/kubeadm-{subcommand}.yaml"));
    let text = std::fs::read_to_string(&copy)
        .unwrap_or_else(|e| panic!("{label}: {}: {e}", copy.display()));
    let documents: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).expect("a YAML document"))
        .filter(|d| !d.is_null())
        .collect();
    assert!(
        documents.iter().any(|d| d["kind"] == kind),
        "{label}: no {kind} in {config}:\n{text}"
    );
    for d in &documents {
        let version = d["apiVersion"].as_str().unwrap_or("");
        if version.starts_with("kubeadm.k8s.io/") {
            assert_eq!(version, api, "{label}: {:?} in {config}", d["kind"]);
        }
    }
    assert_eq!(
        record["documents"].as_array().unwrap().len(),
        documents.len(),
        "{label}: the stub and this test read {config} differently"
    );
    let calls = case.stub_calls();
    let at = calls
        .iter()
        .position(|(p, a)| {
            p == "kubeadm"
                && a.first().map(String::as_str) == Some(subcommand)
                && a.iter()
                    .any(|x| x == config || *x == format!("--config={config}"))
        })
        .unwrap_or_else(|| {
            panic!(
                "{label}: no `kubeadm {subcommand} --config {config}` in {:#?}",
                case.stub_lines()
            )
        });
    for (i, (program, args)) in calls.iter().enumerate() {
        // kubeadm's preflight wants the kubelet installed and enabled; units that only get
        // drop-ins (containerd's) may be enabled by the writer after the commands.
        let before = PACKAGE_MANAGERS.contains(&program.as_str())
            || (program == "systemctl"
                && args.first().map(String::as_str) == Some("enable")
                && args.iter().any(|a| a.starts_with("kubelet")));
        assert!(
            !before || i < at,
            "{label}: `{program} {}` ran after kubeadm: {:#?}",
            args.join(" "),
            case.stub_lines()
        );
    }
}

/// A machine that is not a node: its hostname (in the run's UTS namespace) is the Machine's
/// name, its users exist with exactly their SSH keys (those of the `users` variable: the
/// config's, else the template's default), and a service unit is written and enabled.
fn check_plain(case: &Case) {
    let label = case.label();
    assert_eq!(case.report["hostname"], PLAIN_MACHINE, "{label}");
    assert_eq!(case.report["etcHostname"], PLAIN_MACHINE, "{label}");
    let users = case.report["users"].as_array().expect("users");
    let declared: Vec<(String, Vec<String>)> = case
        .variable("users")
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|u| {
            let name = u.get("name")?.as_str()?.to_owned();
            let keys = u
                .as_object()?
                .values()
                .filter_map(Value::as_array)
                .flatten()
                .filter_map(Value::as_str)
                .filter(|k| k.starts_with("ssh-") || k.starts_with("ecdsa-"))
                .map(str::to_owned)
                .collect();
            Some((name, keys))
        })
        .collect();
    assert!(
        !declared.is_empty(),
        "{label}: the proof wants users: give the template's `users` variable a value in \
         tests/boot/fixtures/configs/"
    );
    for (name, keys) in declared {
        let user = users
            .iter()
            .find(|u| u["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{label}: user {name} was not created: {users:?}"));
        let authorized: Vec<&str> = user["authorizedKeys"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(!keys.is_empty(), "{label}: {name} has no SSH key to check");
        assert_eq!(authorized, keys, "{label}: authorized keys of {name}");
    }
    let units = case.report["units"].as_array().unwrap();
    assert!(
        units.iter().any(|u| u["state"] == "enabled"
            && u["unitFile"]
                .as_str()
                .is_some_and(|f| f.starts_with("/etc/systemd/system/"))),
        "{label}: no service unit written and enabled: {units:?}"
    );
}

/// The provider's layout: its script moved the kubeadm configuration once kubeadm ran, and the
/// check found it moved, with the content, mode and owner declared, and nothing left behind.
fn check_moved_config(case: &Case) {
    let label = case.label();
    let files = case.report["files"].as_array().expect("files");
    let entry = files
        .iter()
        .find(|f| f["path"] == PROVIDER_IGNITION_CONFIG)
        .unwrap_or_else(|| panic!("{label}: {PROVIDER_IGNITION_CONFIG} not checked: {files:?}"));
    assert_eq!(
        entry["movedTo"], PROVIDER_IGNITION_MOVED,
        "{label}: {entry}"
    );
    assert_eq!(entry["ok"], true, "{label}: {entry}");
    assert_eq!(entry["mode"], "0600", "{label}: {entry}");
    let upper = case.dir.join("run/upper");
    assert!(
        !upper
            .join(PROVIDER_IGNITION_CONFIG.trim_start_matches('/'))
            .exists(),
        "{label}: {PROVIDER_IGNITION_CONFIG} is still there"
    );
}

/// The stub calls of the boot proof's kubeadm fixture, exactly and in order: the commands ran
/// in the order the template declares them.
fn check_fixture_order(case: &Case) {
    let format = case
        .template
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("kubeadm-mini")
        .trim_start_matches('-')
        .to_owned();
    let mut expected: Vec<String> = Vec::new();
    if format != "ignition" {
        // Units are enabled by commands; Ignition declares them (presets).
        expected.extend(
            [
                "systemctl daemon-reload",
                "systemctl enable proof-agent.service",
            ]
            .map(str::to_owned),
        );
    }
    expected.extend(
        [
            "curl -fsSL https://pkgs.k8s.io/core:/stable:/v1.31/deb/Release.key",
            "gpg --dearmor -o /etc/apt/keyrings/kubernetes.gpg",
            "apt-get update -q",
            "apt-get install -y -q containerd kubelet kubeadm kubectl",
            "apt-mark hold kubelet kubeadm kubectl",
            "systemctl enable kubelet",
            "modprobe overlay",
            "modprobe br_netfilter",
            "sysctl --system",
            "systemctl restart proof-agent",
        ]
        .map(str::to_owned),
    );
    expected.push(if case.role == "init" {
        "kubeadm init --config /run/kubeadm/kubeadm.yaml".to_owned()
    } else {
        "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml".to_owned()
    });
    // A unit with only drop-ins is enabled after the commands, in every format (its unit file
    // comes with the package they install).
    expected.push("systemctl enable containerd.service".to_owned());
    // cloud-init's set-passwords module asks `service ssh status` on its own (not a command of
    // the template).
    let mut lines = case.stub_lines();
    lines.retain(|l| l != "service ssh status");
    assert_eq!(lines, expected, "{}", case.label());
}

#[test]
fn every_template_boots_with_real_cloud_init_and_ignition() {
    let out = out_dir("templates");
    let mini = fixture("templates/kubeadm-mini.yaml");
    let mut templates = catalogue();
    // The README's example is proven like the shipped templates.
    templates.push(repo().join("examples/ubuntu-2404.yaml"));
    templates.push(mini.clone());
    templates.push(fixture("templates/plain-machine.yaml"));
    templates.extend(format_variants(
        &mini,
        &["ignition", "script", "mime-multipart"],
        &out.join("variants"),
    ));
    let proof = prove(&out.join("cases"), &templates);
    assert_proven(&proof);
    let cases = cases(&proof);
    for template in &templates {
        let proven = cases.iter().filter(|c| &c.template == template).count();
        let kubeadm = std::fs::read_to_string(template)
            .is_ok_and(|t| t.contains("kubeadm init") || t.contains("kubeadm join"));
        let expected = if kubeadm { 3 * VERSIONS.len() } else { 1 };
        assert_eq!(proven, expected, "{}: cases", template.display());
    }
    for case in &cases {
        let label = case.label();
        let report = &case.report;
        assert_eq!(report["ok"], true, "{label}: {}", case.dir.display());
        assert_eq!(report["failures"], serde_json::json!([]), "{label}");
        let steps = report["steps"].as_array().expect("steps");
        assert!(!steps.is_empty(), "{label}: no step ran");
        for step in steps {
            assert_eq!(step["state"], "ok", "{label}: {step}");
        }
        for stage in report["stages"].as_array().expect("stages") {
            assert_eq!(stage["status"], 0, "{label}: {stage}");
        }
        for call in report["stubCalls"].as_array().unwrap() {
            // `systemctl is-active` and the like answer with their status.
            assert!(
                call["status"] == 0 || call["query"] == true,
                "{label}: {call}"
            );
        }
        assert_eq!(
            report["sentinel"], true,
            "{label}: /run/cluster-api/bootstrap-success.complete is missing"
        );
        check_against_template(case);
        if case.kubeadm() {
            check_kubeadm(case);
        } else {
            check_plain(case);
        }
        if case.stem().starts_with("kubeadm-mini") {
            check_fixture_order(case);
        }
        if case.stem() == PROVIDER_IGNITION {
            check_moved_config(case);
        }
    }
}

/// The kubeadm templates' opt-in part `in-place-agent`, on: with real cloud-init (Ubuntu) and
/// real Ignition (Flatcar), bootplate-agent is downloaded into the template's binary directory,
/// checked by the real sha256sum against the config's digest, installed with mode 0755, and
/// runs as an enabled service for the Machine's node with the kubelet's kubeconfig. A wrong
/// digest fails the boot, naming the part, before kubeadm's sentinel, and leaves no binary.
#[test]
fn the_in_place_agent_part_installs_and_starts_the_agent() {
    let out = out_dir("in-place-agent");
    let templates = ["kubeadm-ubuntu-2404", "kubeadm-flatcar"]
        .map(|t| repo().join(format!("templates/{t}.yaml")));
    let config = fixture("in-place-agent/config.yaml");
    let proof = prove_with(&out.join("cases"), &templates, Some(&config));
    assert_proven(&proof);
    let proven = cases(&proof);
    assert_eq!(proven.len(), templates.len() * 3 * VERSIONS.len());
    for case in &proven {
        let label = case.label();
        assert_eq!(case.report["ok"], true, "{label}: {}", case.dir.display());
        check_against_template(case);
        check_kubeadm(case);
        let bin = if label.starts_with("kubeadm-flatcar") {
            "/opt/bin"
        } else {
            "/usr/local/bin"
        };
        let agent = format!("{bin}/bootplate-agent");
        let upper = case.dir.join("run/upper");
        let installed = upper.join(agent.trim_start_matches('/'));
        let content = std::fs::read_to_string(&installed)
            .unwrap_or_else(|e| panic!("{label}: {}: {e}", installed.display()));
        assert_eq!(
            content,
            "# boot-proof stub: the download of https://artifacts.example.com/bootplate/v0.1.0/bootplate-agent\n",
            "{label}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&installed).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "{label}");
        let unit =
            std::fs::read_to_string(upper.join("etc/systemd/system/bootplate-agent.service"))
                .unwrap_or_else(|e| panic!("{label}: the agent's unit: {e}"));
        let machine = match case.role.as_str() {
            "worker" => "proof-worker",
            _ => "proof-control-plane",
        };
        let node = format!("{machine}-{}", case.version.replace('.', "-"));
        assert!(
            unit.contains(&format!(
                "\nExecStart={agent} --node-name {node} --kubeconfig /etc/kubernetes/kubelet.conf --interval 2m\n"
            )),
            "{label}: {unit}"
        );
        let units = case.report["units"].as_array().unwrap();
        let entry = units
            .iter()
            .find(|u| u["name"] == "bootplate-agent.service")
            .unwrap_or_else(|| panic!("{label}: no bootplate-agent.service in {units:?}"));
        assert_eq!(entry["state"], "enabled", "{label}: {entry}");
        let lines = case.stub_lines();
        assert!(
            lines
                .iter()
                .any(|l| l == "systemctl enable --now --no-block bootplate-agent.service"),
            "{label}: {lines:#?}"
        );
    }

    // The drill: a digest that does not match.
    let wrong = fixture("in-place-agent/wrong-digest.yaml");
    let proof = prove_with(&out.join("wrong-digest"), &templates[..1], Some(&wrong));
    assert_eq!(proof.status, Some(1), "{}\n{}", proof.stdout, proof.stderr);
    for case in cases(&proof) {
        let label = case.label();
        assert_eq!(case.report["ok"], false, "{label}");
        assert_eq!(
            case.report["sentinel"], false,
            "{label}: sentinel after a failed part"
        );
        let output =
            std::fs::read_to_string(case.dir.join("run/cloud-init-output.log")).unwrap_or_default();
        assert!(
            output.contains("does not match inPlaceAgentSha256")
                && output.contains(
                    "bootplate: in-place-agent: cannot install bootplate-agent from inPlaceAgentSource"
                ),
            "{label}: {output}"
        );
        let bin = case.dir.join("run/upper/usr/local/bin");
        let left: Vec<_> = std::fs::read_dir(&bin)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            left.is_empty(),
            "{label}: left in {}: {left:?}",
            bin.display()
        );
    }
}

/// The failure drills: each broken template fails the proof, and its first failure names the
/// template, the role and the failing step; a failed command leaves no bootstrap sentinel, and
/// where a raw cloud-config goes on after one (no `set -e`) and writes it, the proof says so.
#[test]
fn a_broken_template_fails_the_boot_proof_and_names_the_step() {
    let out = out_dir("drills");
    let failing = fixture("broken/failing-command.yaml");
    let mut templates = vec![failing.clone()];
    templates.extend(format_variants(
        &failing,
        &["ignition", "script", "mime-multipart"],
        &out.join("variants"),
    ));
    templates.extend(
        [
            "failing-command-raw",
            "clobbered-file",
            "permissions-type",
            "permissions-type-ignition",
            "permissions-structured",
            "enable-missing-unit",
            "package-without-repository",
            "repository-without-key",
        ]
        .map(|n| fixture(&format!("broken/{n}.yaml"))),
    );
    let proof = prove(&out.join("cases"), &templates);
    assert_eq!(
        proof.status,
        Some(1),
        "the drills must fail the proof:\n{}\n{}",
        proof.stdout,
        proof.stderr
    );
    // (template, its first failure's step, words of that failure's message)
    let expectations: [(&str, &str, &[&str]); 12] = [
        (
            "failing-command",
            // runcmd[0] is the writer's `set -e`.
            "runcmd[2]",
            &[
                "stopped the script",
                "cp /etc/proof/missing.conf",
                "No such file",
            ],
        ),
        (
            "failing-command-ignition",
            "bootplate-bootstrap.service ExecStart=/etc/bootplate/bootstrap.sh",
            &["exited 1 at line", "cp /etc/proof/missing.conf"],
        ),
        (
            "failing-command-script",
            "user-data script part-001",
            &["exited 1 at line", "cp /etc/proof/missing.conf"],
        ),
        (
            "failing-command-mime-multipart",
            "user-data script bootstrap.sh",
            &["exited 1 at line", "cp /etc/proof/missing.conf"],
        ),
        (
            "failing-command-raw",
            "runcmd[1]",
            &["exited 1", "cp /etc/proof/missing.conf", "No such file"],
        ),
        (
            "clobbered-file",
            "cloud-config write_files[0] (/etc/proof/clobbered.conf)",
            &["content differs"],
        ),
        // cloud-init reads an integer 644 as mode 1204, and Ignition refuses a string mode:
        // the render's format check refuses both before a machine gets them.
        (
            "permissions-type",
            "render",
            &["`write_files[0].permissions` must be a string, got an integer"],
        ),
        (
            "permissions-type-ignition",
            "render",
            &["`storage.files[0].mode` must be an integer, got a string"],
        ),
        (
            "permissions-structured",
            "render",
            &["spec.parts[0].files[0].permissions", "octal digits"],
        ),
        // The stubs fail where the real programs do: a unit nothing installed, a package from a
        // repository never written, a repository whose key was never written.
        (
            "enable-missing-unit",
            "runcmd[2]",
            &["Failed to enable unit: Unit file proof-agent.service does not exist."],
        ),
        (
            "package-without-repository",
            "runcmd[2]",
            &[
                "Unable to locate package kubelet",
                "no repository file in /etc/apt/sources.list.d names pkgs.k8s.io",
            ],
        ),
        (
            "repository-without-key",
            "runcmd[2]",
            &[
                "Unable to locate package kubelet",
                "signed with /etc/apt/keyrings/kubernetes.asc, which does not exist",
            ],
        ),
    ];
    let cases = cases(&proof);
    assert_eq!(cases.len(), expectations.len());
    for (template, step, words) in expectations {
        let failures: Vec<&str> = proof
            .stderr
            .lines()
            .filter(|l| l.starts_with(&format!("boot-proof: {template} role worker: FAILED: ")))
            .collect();
        let first = failures
            .first()
            .unwrap_or_else(|| panic!("no failure of {template} in:\n{}", proof.stderr));
        assert!(
            first.starts_with(&format!(
                "boot-proof: {template} role worker: FAILED: {step}: "
            )),
            "{template}: the first failure should name {step}: {first}"
        );
        for word in words {
            assert!(first.contains(word), "`{word}` missing from: {first}");
        }
        let case = cases
            .iter()
            .find(|c| c.template.file_stem().unwrap() == template)
            .unwrap();
        if step == "render" {
            assert!(!case.dir.join("run").exists(), "{template}: ran unrendered");
            continue;
        }
        assert_eq!(case.report["ok"], false, "{template}");
        let sentinel_failure = failures.iter().any(|l| {
            l.contains("FAILED: sentinel: ") && l.contains("although the bootstrap failed")
        });
        if template == "clobbered-file" {
            for failure in [
                "FAILED: cloud-config write_files[0] (/etc/proof/clobbered.conf): \
                 /etc/proof/clobbered.conf: mode is 0644, declared 0640",
                "FAILED: cloud-config write_files[0] (/etc/proof/clobbered.conf): \
                 /etc/proof/clobbered.conf: owner is 65534:0, declared root:root",
                "FAILED: systemctl enable proof-clobbered.service: \
                 proof-clobbered.service should be enabled, systemctl is-enabled says 'disabled'",
            ] {
                assert!(
                    failures
                        .iter()
                        .any(|l| l.ends_with(failure) || l.contains(failure)),
                    "{template}: no `{failure}` in {failures:#?}"
                );
            }
        }
        if template == "failing-command-raw" {
            // cloud-init went on after the failed entry and wrote the sentinel: the proof says so.
            assert_eq!(case.report["sentinel"], true, "{template}");
            assert!(sentinel_failure, "{template}: {failures:#?}");
            let steps = case.report["steps"].as_array().unwrap();
            assert_eq!(steps[2]["state"], "ok", "{template}: {steps:?}");
        } else if template.starts_with("failing-command")
            || matches!(
                template,
                "enable-missing-unit" | "package-without-repository" | "repository-without-key"
            )
        {
            assert_eq!(
                case.report["sentinel"], false,
                "{template}: the bootstrap sentinel was written although a command failed"
            );
            assert!(!sentinel_failure, "{template}");
            if template == "failing-command" {
                let steps = case.report["steps"].as_array().unwrap();
                assert_eq!(steps[3]["state"], "not run", "{template}: {steps:?}");
            }
        }
    }
}
