//! The network input (docs/air-gapped.md) through the boot proof: every shipped template ×
//! role, rendered with tests/boot/fixtures/network/config.yaml and run by real cloud-init or
//! real Ignition. The files land where the OS reads them, the trust-store tool runs, the
//! download is checked by the real sha256sum, and a tampered download fails the boot. The
//! templates that download nothing or run no kubeadm get the fixture without the fields they
//! refuse ([`trimmed_config`]).

use super::*;

const MIRROR_DIR: &str = "etc/containerd/certs.d/registry.k8s.io";
const ARTIFACT_URL: &str = "https://files.corp.example/k8s/v1.31.2/kubeadm";

/// The kubeadm templates that write the whole input, downloads included: those with a part
/// `network` and a part `artifacts` (plain-linux has the first only; the kubeadm-compat ones
/// write the input in their `template` body and install nothing).
fn network_templates() -> Vec<PathBuf> {
    catalogue()
        .into_iter()
        .filter(|p| has_part(p, "network") && has_part(p, "artifacts"))
        .collect()
}

/// Whether the template at `path` declares a part `name`.
fn has_part(path: &Path, name: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.lines()
            .any(|l| l.trim_end() == format!("    - name: {name}"))
    })
}

/// The CA of the fixture, as the files hold it.
fn fixture_ca(config: &Path) -> String {
    let text = std::fs::read_to_string(config).expect("the fixture");
    let object: serde_yaml::Value = serde_yaml::from_str(&text).expect("fixture YAML");
    object["spec"]["network"]["caBundles"][0]["inline"]
        .as_str()
        .expect("an inline CA")
        .to_owned()
}

/// Where the template's OS keeps extra CAs and the tool that reads them.
fn trust_store(template: &str) -> (&'static str, &'static str) {
    match template {
        "kubeadm-rocky-9" | "kubeadm-amazonlinux-2023" => (
            "etc/pki/ca-trust/source/anchors/bootplate-corp.crt",
            "update-ca-trust",
        ),
        "kubeadm-flatcar" => ("etc/ssl/certs/bootplate-corp.pem", "update-ca-certificates"),
        _ => (
            "usr/local/share/ca-certificates/bootplate-corp.crt",
            "update-ca-certificates",
        ),
    }
}

/// Where the template's time service takes the servers, and what it reads there.
fn ntp_file(template: &str) -> (&'static str, &'static str) {
    let chrony = "server ntp1.corp.example iburst\nserver 10.0.0.1 iburst\n";
    match template {
        "kubeadm-rocky-9" | "kubeadm-amazonlinux-2023" => {
            ("etc/chrony.d/bootplate-network.sources", chrony)
        }
        "kubeadm-flatcar" => (
            "etc/systemd/timesyncd.conf.d/bootplate-network.conf",
            "[Time]\nNTP=ntp1.corp.example 10.0.0.1\n",
        ),
        _ => ("etc/chrony/sources.d/bootplate-network.sources", chrony),
    }
}

/// The mirror's hosts.toml and its CA where containerd's config_path reads them.
fn check_mirror(label: &str, upper: &Path, ca: &str) {
    let toml = read(label, upper, &format!("{MIRROR_DIR}/hosts.toml"));
    assert!(
        toml.starts_with("server = \"https://registry.k8s.io\"\n")
            && toml.contains("[host.\"https://mirror.corp.example:5000\"]\n")
            && toml.contains(&format!("  ca = \"/{MIRROR_DIR}/mirror-0-ca.crt\"\n")),
        "{label}: {toml}"
    );
    let mirror_ca = read(label, upper, &format!("{MIRROR_DIR}/mirror-0-ca.crt"));
    assert_eq!(mirror_ca, ca, "{label}");
}

fn read(label: &str, upper: &Path, path: &str) -> String {
    std::fs::read_to_string(upper.join(path)).unwrap_or_else(|e| panic!("{label}: /{path}: {e}"))
}

fn check_case(case: &Case, ca: &str) {
    let label = case.label();
    let template = case
        .template
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let upper = case.dir.join("run/upper");
    let (anchor, tool) = trust_store(&template);
    assert_eq!(read(&label, &upper, anchor), ca, "{label}");
    let lines = case.stub_lines();
    assert!(
        lines.iter().any(|l| l.trim() == tool),
        "{label}: {tool} not run: {lines:#?}"
    );
    check_mirror(&label, &upper, ca);
    let config = read(&label, &upper, "etc/containerd/config.toml");
    assert!(
        config.contains("config_path = \"/etc/containerd/certs.d\""),
        "{label}"
    );
    for unit in ["containerd", "kubelet"] {
        let path = format!("etc/systemd/system/{unit}.service.d/20-bootplate-network-proxy.conf");
        let dropin = read(&label, &upper, &path);
        assert!(
            dropin.contains("Environment=\"HTTPS_PROXY=http://proxy.corp.example:3128\"\n"),
            "{label}: {dropin}"
        );
    }
    let environment = std::fs::read_to_string(upper.join("etc/environment")).unwrap_or_default();
    assert_eq!(
        environment.contains(
            "# BEGIN bootplate network.proxy\nHTTP_PROXY=http://proxy.corp.example:3128\n"
        ),
        template != "kubeadm-flatcar",
        "{label}: /etc/environment: {environment}"
    );
    let (ntp, servers) = ntp_file(&template);
    assert_eq!(read(&label, &upper, ntp), servers, "{label}");
    let bin = if template == "kubeadm-flatcar" {
        "opt/bin"
    } else {
        "usr/local/bin"
    };
    let kubeadm = read(&label, &upper, &format!("{bin}/kubeadm"));
    assert!(
        kubeadm == stub(),
        "{label}: {bin}/kubeadm is not the download"
    );
    let lines = case.stub_lines();
    let fetched = |l: &String| l.starts_with("curl ") && l.trim_end().ends_with(ARTIFACT_URL);
    assert!(lines.iter().any(fetched), "{label}: {lines:#?}");
    if case.role == "init" {
        let init = read(&label, &case.dir, "run/run/bootplate/kubeadm-init.yaml");
        assert!(
            init.contains("\nimageRepository: \"mirror.corp.example:5000/k8s\"\n"),
            "{label}: {init}"
        );
    }
}

/// The boot proof's recording stub: what a download of `.../kubeadm` gives.
fn stub() -> String {
    std::fs::read_to_string(repo().join("tests/boot/stubs/stub")).expect("the stub")
}

/// The fixture with `digest` for its artifact, written into `out`; `install` skipped (as on an
/// image without package sources) when `skip_install`.
fn config_with(out: &Path, name: &str, digest: &str, skip_install: bool) -> PathBuf {
    let mut text = std::fs::read_to_string(fixture("network/config.yaml")).expect("the fixture");
    if skip_install {
        text = text.replace("\n  network:\n", "\n  skipParts: [install]\n  network:\n");
    }
    std::fs::create_dir_all(out).expect("the output directory");
    let path = out.join(name);
    std::fs::write(&path, text.replace("STUB_SHA256", digest)).expect("the config");
    path
}

/// Every shipped kubeadm template × role (one Kubernetes version: the input does not depend on
/// it) with the network input; then the drill, on one cloud-init and the Ignition template.
#[test]
fn the_network_input_lands_where_the_os_reads_it() {
    let out = out_dir("network");
    let templates = network_templates();
    assert_eq!(templates.len(), 6, "{templates:?}");
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(stub().as_bytes()));
    let config = config_with(&out, "config.yaml", &digest, false);
    let ca = fixture_ca(&config);
    let proof = prove_versions(&out.join("cases"), &templates, Some(&config), &["v1.31.2"]);
    assert_proven(&proof);
    let proven = cases(&proof);
    assert_eq!(proven.len(), templates.len() * 3);
    for case in &proven {
        assert_eq!(
            case.report["ok"],
            true,
            "{}: {}",
            case.label(),
            case.dir.display()
        );
        check_against_template(case);
        check_kubeadm(case);
        check_case(case, &ca);
    }
    tampered_download_fails_the_boot(&out);
}

/// The drill: the fixture with a digest its download does not match.
fn tampered_download_fails_the_boot(out: &Path) {
    let tampered = config_with(out, "tampered.yaml", &"f".repeat(64), true);
    let templates: Vec<PathBuf> = ["kubeadm-debian-12", "kubeadm-flatcar"]
        .iter()
        .map(|t| repo().join(format!("templates/{t}.yaml")))
        .collect();
    let proof = prove_versions(
        &out.join("tampered"),
        &templates,
        Some(&tampered),
        &["v1.31.2"],
    );
    assert_eq!(proof.status, Some(1), "{}\n{}", proof.stdout, proof.stderr);
    let proven = cases(&proof);
    assert_eq!(proven.len(), 6);
    for case in proven {
        let label = case.label();
        assert_eq!(case.report["ok"], false, "{label}");
        assert_eq!(
            case.report["sentinel"], false,
            "{label}: sentinel after a failed part"
        );
        // cloud-init's failure names the script's last output; Ignition's bootstrap.sh
        // writes it to the stages log.
        let logs = ["failures.log", "run/stages.log"]
            .map(|f| std::fs::read_to_string(case.dir.join(f)).unwrap_or_default());
        let message =
            format!("bootplate: artifacts: kubeadm from {ARTIFACT_URL} does not match its sha256");
        assert!(
            logs.iter().any(|l| l.contains(&message)),
            "{label}: {message:?} not in {}",
            case.dir.display()
        );
        let bin = if label.starts_with("kubeadm-flatcar") {
            "opt/bin"
        } else {
            "usr/local/bin"
        };
        let installed = case.dir.join("run/upper").join(bin).join("kubeadm");
        assert!(
            !installed.exists(),
            "{label}: the tampered download was installed"
        );
    }
}

/// The fixture as a template that downloads nothing or runs no kubeadm takes it: without
/// `artifacts` when the template has no part `artifacts` (nothing of it would install them),
/// without `imageRepository` when it runs no kubeadm; written into `out`.
fn trimmed_config(out: &Path, template: &Path) -> PathBuf {
    let text = std::fs::read_to_string(fixture("network/config.yaml")).expect("the fixture");
    let mut object: serde_yaml::Value = serde_yaml::from_str(&text).expect("fixture YAML");
    let network = object["spec"]["network"]
        .as_mapping_mut()
        .expect("spec.network");
    let mut name = String::from("config");
    if !has_part(template, "artifacts") {
        network.remove("artifacts");
        name.push_str("-no-artifacts");
    }
    if !runs_kubeadm(template) {
        network.remove("imageRepository");
        name.push_str("-no-image-repository");
    }
    std::fs::create_dir_all(out).expect("the output directory");
    let path = out.join(format!("{name}.yaml"));
    let yaml = serde_yaml::to_string(&object).expect("the trimmed config");
    std::fs::write(&path, yaml).expect("the trimmed config");
    path
}

/// Trust stores an image reads extra CAs from, and the tool that makes them trusted.
const TRUST_STORES: [(&str, &str); 4] = [
    ("usr/local/share/ca-certificates", "update-ca-certificates"),
    ("etc/pki/ca-trust/source/anchors", "update-ca-trust"),
    ("etc/pki/trust/anchors", "update-ca-certificates"),
    ("etc/ssl/certs", "update-ca-certificates"),
];

/// Files a time service reads its servers from (a chrony `server` line each, or timesyncd's
/// `NTP=`): chrony's sources directories and its own configuration, systemd-timesyncd's
/// drop-ins and file, ntpd's.
const NTP_FILES: [&str; 7] = [
    "etc/chrony/sources.d/bootplate-network.sources",
    "etc/chrony.d/bootplate-network.sources",
    "etc/chrony/chrony.conf",
    "etc/chrony.conf",
    "etc/systemd/timesyncd.conf.d/bootplate-network.conf",
    "etc/systemd/timesyncd.conf",
    "etc/ntp.conf",
];

/// The CA in a trust store (as the fixture's `corp` bundle) and that store's tool run.
fn check_trust_store(label: &str, upper: &Path, ca: &str, lines: &[String]) {
    let found: Vec<(String, &str)> = TRUST_STORES
        .iter()
        .flat_map(|(dir, tool)| {
            std::fs::read_dir(upper.join(dir))
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("bootplate-corp.")
                })
                .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t == ca))
                .map(move |e| (format!("{dir}/{}", e.file_name().to_string_lossy()), *tool))
        })
        .collect();
    assert!(!found.is_empty(), "{label}: the CA is in no trust store");
    for (path, tool) in found {
        assert!(
            lines.iter().any(|l| l.trim() == tool),
            "{label}: /{path} written, {tool} not run: {lines:#?}"
        );
    }
}

/// What a template without downloads must show on the booted root: the CA in a trust store and
/// its tool run, hosts.toml and the mirror's CA (containerd runs in the boot root: its stub
/// answers), containerd's proxy drop-in (and the kubelet's where kubeadm runs),
/// /etc/environment where the template writes it, a time service's servers, and kubeadm's
/// imageRepository in what `kubeadm init` read.
fn check_case_without_downloads(case: &Case, ca: &str) {
    let label = case.label();
    let upper = case.dir.join("run/upper");
    check_trust_store(&label, &upper, ca, &case.stub_lines());
    check_mirror(&label, &upper, ca);
    let kubeadm = runs_kubeadm(&case.template);
    for unit in ["containerd", "kubelet"] {
        let path = upper.join(format!(
            "etc/systemd/system/{unit}.service.d/20-bootplate-network-proxy.conf"
        ));
        let dropin = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            dropin.contains("Environment=\"HTTPS_PROXY=http://proxy.corp.example:3128\"\n"),
            unit == "containerd" || kubeadm,
            "{label}: {}: {dropin:?}",
            path.display()
        );
    }
    let text = std::fs::read_to_string(&case.template).expect("the template");
    let environment = std::fs::read_to_string(upper.join("etc/environment")).unwrap_or_default();
    assert_eq!(
        environment.contains(
            "# BEGIN bootplate network.proxy\nHTTP_PROXY=http://proxy.corp.example:3128\n"
        ),
        text.contains("/etc/environment"),
        "{label}: /etc/environment: {environment}"
    );
    let ntp: Vec<&str> = NTP_FILES
        .iter()
        .copied()
        .filter(|f| {
            std::fs::read_to_string(upper.join(f)).is_ok_and(|t| {
                let chrony = ["ntp1.corp.example", "10.0.0.1"]
                    .iter()
                    .all(|s| t.lines().any(|l| l == format!("server {s} iburst")));
                chrony || t.lines().any(|l| l == "NTP=ntp1.corp.example 10.0.0.1")
            })
        })
        .collect();
    assert!(!ntp.is_empty(), "{label}: no time service has the servers");
    if kubeadm && case.role == "init" {
        let init = read(&label, &case.dir, "run/run/bootplate/kubeadm-init.yaml");
        assert!(
            init.contains("\nimageRepository: \"mirror.corp.example:5000/k8s\"\n"),
            "{label}: {init}"
        );
    }
}

/// Every other shipped template (no part `artifacts`: kubeadm-compat, kubeadm-compat-ignition,
/// plain-linux) × role, with the fixture trimmed to what it takes ([`trimmed_config`]).
#[test]
fn the_network_input_without_downloads_lands_where_the_os_reads_it() {
    let out = out_dir("network-without-downloads");
    let full = network_templates();
    let templates: Vec<PathBuf> = catalogue()
        .into_iter()
        .filter(|t| !full.contains(t))
        .collect();
    assert_eq!(templates.len(), 3, "{templates:?}");
    let mut groups: Vec<(PathBuf, Vec<PathBuf>)> = Vec::new();
    for template in templates {
        let config = trimmed_config(&out, &template);
        match groups.iter_mut().find(|(c, _)| *c == config) {
            Some((_, members)) => members.push(template),
            None => groups.push((config, vec![template])),
        }
    }
    let ca = fixture_ca(&fixture("network/config.yaml"));
    let mut proven = 0;
    for (config, templates) in &groups {
        let name = config.file_stem().unwrap().to_string_lossy();
        let proof = prove_versions(&out.join(&*name), templates, Some(config), &["v1.31.2"]);
        assert_proven(&proof);
        for case in cases(&proof) {
            assert_eq!(case.report["ok"], true, "{}", case.label());
            check_against_template(&case);
            if case.kubeadm() {
                check_kubeadm(&case);
            }
            check_case_without_downloads(&case, &ca);
            proven += 1;
        }
    }
    assert_eq!(proven, 7, "two kubeadm templates × 3 roles and plain-linux");
}
