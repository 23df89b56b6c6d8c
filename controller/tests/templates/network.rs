//! The network input (`spec.network`, docs/air-gapped.md) through every kubeadm template of the
//! catalogue and role: golden files with the input set, then a boot in the sandbox that looks
//! for each file where the OS reads it, the trust-store tool's call, kubeadm's
//! `imageRepository`, and the download checked by the real `sha256sum` (a drill: a tampered
//! download fails the boot and installs nothing).

use super::*;

/// The digest of what the sandbox's `curl` stub downloads ("stub download\n").
const STUB_DOWNLOAD_SHA256: &str =
    "152f52c743b3359cf3d40bb849899a2c7256d8835989356e4c407812cce39916";
const MIRROR: &str = "https://mirror.corp.example:5000";
const PROXY: &str = "http://proxy.corp.example:3128";
const ARTIFACT_URL: &str = "https://files.corp.example/k8s/v1.31.2/kubeadm";

/// One mirror, one proxy, a corporate CA, time servers, kubeadm's image repository and one
/// download: the worked example of docs/air-gapped.md.
fn network_input(sha256: &str) -> crd_types::NetworkConfig {
    let pem = render::network::SAMPLE_CA_PEM;
    serde_json::from_value(json!({
        "registryMirrors": [{"registry": "registry.k8s.io",
            "endpoints": [{"url": MIRROR, "ca": {"inline": pem}}]}],
        "proxy": {"http": PROXY, "https": PROXY, "noProxy": [".corp.example"]},
        "caBundles": [{"name": "corp", "inline": pem}],
        "ntpServers": ["ntp1.corp.example", "10.0.0.1"],
        "imageRepository": "mirror.corp.example:5000/k8s",
        "artifacts": [{"name": "kubeadm", "url": ARTIFACT_URL, "sha256": sha256}],
    }))
    .expect("a network input")
}

fn network_case(entry: Entry, role: Role) -> Case {
    let mut case = Case::new(entry, role, "v1.31");
    case.config.network = Some(Box::new(network_input(STUB_DOWNLOAD_SHA256)));
    case.tag = "network";
    case
}

/// Every kubeadm template × role with the network input (their golden files).
pub(super) fn cases() -> Vec<Case> {
    CATALOGUE
        .iter()
        .filter(|e| e.kubeadm)
        .flat_map(|e| Role::ALL.iter().map(|r| network_case(*e, *r)))
        .collect()
}

/// Renders `case`, checks the output (and its golden file when `golden`), and boots it in a
/// sandbox whose `sha256sum` is the real one.
fn boot_with_real_digests(case: &Case, golden: bool) -> (Sandbox, Run) {
    let what = format!("{} {}", case.entry.name, case.label());
    let data = case.render().unwrap_or_else(|e| panic!("{what}: {e}"));
    let boot = check_output(&what, case.format(), &data, true);
    if golden {
        check_golden(case, &data);
    }
    let sandbox = Sandbox::new(case.entry.image);
    std::fs::remove_file(sandbox.path("/bootplate-stubs/sha256sum")).expect("the stub");
    let run = sandbox.boot(&boot);
    (sandbox, run)
}

/// Where the OS's trust store takes extra CAs, the file's name, and the tool that reads them.
fn trust_store(image: Image) -> (&'static str, &'static str) {
    match image {
        Image::Apt => (
            "/usr/local/share/ca-certificates/bootplate-corp.crt",
            "update-ca-certificates",
        ),
        Image::Dnf => (
            "/etc/pki/ca-trust/source/anchors/bootplate-corp.crt",
            "update-ca-trust",
        ),
        Image::Flatcar => (
            "/etc/ssl/certs/bootplate-corp.pem",
            "update-ca-certificates",
        ),
    }
}

fn check_trust_and_mirror(what: &str, case: &Case, sandbox: &Sandbox) {
    let pem = render::network::SAMPLE_CA_PEM;
    let (anchor, tool) = trust_store(case.entry.image);
    assert_eq!(
        sandbox.read(anchor).as_deref(),
        Some(pem),
        "{what}: {anchor}"
    );
    assert!(sandbox.called(&[tool]), "{what}: {tool} not run");
    check_mirror(what, sandbox);
    let containerd = sandbox.read("/etc/containerd/config.toml").unwrap();
    assert!(containerd.contains("config_path = \"/etc/containerd/certs.d\""));
}

/// The mirror's hosts.toml and CA where containerd's config_path reads them.
fn check_mirror(what: &str, sandbox: &Sandbox) {
    let pem = render::network::SAMPLE_CA_PEM;
    let dir = "/etc/containerd/certs.d/registry.k8s.io";
    let toml = sandbox
        .read(&format!("{dir}/hosts.toml"))
        .expect("hosts.toml");
    let wanted = format!(
        "server = \"https://registry.k8s.io\"\n\n[host.\"{MIRROR}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{dir}/mirror-0-ca.crt\"\n\n"
    );
    assert_eq!(toml, wanted, "{what}");
    let ca = sandbox.read(&format!("{dir}/mirror-0-ca.crt"));
    assert_eq!(ca.as_deref(), Some(pem), "{what}");
}

fn check_proxy(what: &str, case: &Case, sandbox: &Sandbox) {
    check_dropins(what, sandbox, &["containerd", "kubelet"]);
    assert!(sandbox.called(&["systemctl", "daemon-reload"]));
    let env = sandbox.read("/etc/bootplate/network-proxy.env").unwrap();
    assert!(
        env.contains(&format!("https_proxy={PROXY}\n")),
        "{what}: {env}"
    );
    let environment = sandbox.read("/etc/environment").unwrap_or_default();
    let block = format!("# BEGIN bootplate network.proxy\n{env}# END bootplate network.proxy\n");
    assert_eq!(
        environment.contains(&block),
        case.entry.image != Image::Flatcar,
        "{what}: /etc/environment: {environment}"
    );
}

/// The proxy drop-in of each of `units`, with the computed noProxy and the user's addition.
fn check_dropins(what: &str, sandbox: &Sandbox, units: &[&str]) {
    let line = format!("Environment=\"HTTPS_PROXY={PROXY}\"\n");
    for unit in units {
        let path = format!("/etc/systemd/system/{unit}.service.d/20-bootplate-network-proxy.conf");
        let dropin = sandbox
            .read(&path)
            .unwrap_or_else(|| panic!("{what}: no {path}"));
        assert!(
            dropin.starts_with("[Service]\n") && dropin.contains(&line),
            "{what}: {dropin}"
        );
        assert!(
            dropin.contains(",.corp.example\"\n"),
            "{what}: noProxy: {dropin}"
        );
    }
}

fn check_ntp(what: &str, case: &Case, sandbox: &Sandbox) {
    let (path, text) = match case.entry.image {
        Image::Apt => (
            "/etc/chrony/sources.d/bootplate-network.sources",
            "server ntp1.corp.example iburst\nserver 10.0.0.1 iburst\n",
        ),
        Image::Dnf => (
            "/etc/chrony.d/bootplate-network.sources",
            "server ntp1.corp.example iburst\nserver 10.0.0.1 iburst\n",
        ),
        Image::Flatcar => (
            "/etc/systemd/timesyncd.conf.d/bootplate-network.conf",
            "[Time]\nNTP=ntp1.corp.example 10.0.0.1\n",
        ),
    };
    assert_eq!(sandbox.read(path).as_deref(), Some(text), "{what}: {path}");
}

/// The downloaded kubeadm, installed where the template's binaries live, after its check.
fn artifact_path(image: Image) -> &'static str {
    if image == Image::Flatcar {
        "/opt/bin/kubeadm"
    } else {
        "/usr/local/bin/kubeadm"
    }
}

/// Every kubeadm template × role with the network input: golden file, boot, each file where
/// the OS reads it.
#[test]
fn the_network_input_lands_where_the_os_reads_it() {
    in_parallel(&cases(), |case| {
        let what = format!("{} {}", case.entry.name, case.label());
        let (sandbox, run) = boot_with_real_digests(case, true);
        assert!(run.status.success(), "{what}: boot failed:\n{}", run.output);
        check_kubeadm_config(case, &sandbox);
        check_trust_and_mirror(&what, case, &sandbox);
        check_proxy(&what, case, &sandbox);
        check_ntp(&what, case, &sandbox);
        let path = artifact_path(case.entry.image);
        assert_eq!(
            sandbox.read(path).as_deref(),
            Some("stub download\n"),
            "{what}"
        );
        assert_eq!(sandbox.mode(path), 0o755, "{what}");
        assert!(
            sandbox
                .calls()
                .iter()
                .any(|c| c[0] == "curl" && c.iter().any(|a| a == ARTIFACT_URL))
        );
    });
}

/// The drill: a download that does not match its digest fails the boot, naming the artifact,
/// and is not installed.
#[test]
fn a_tampered_download_fails_the_boot() {
    let wrong = "0".repeat(64);
    let cases: Vec<Case> = CATALOGUE
        .iter()
        .filter(|e| e.kubeadm)
        .map(|e| {
            let mut case = network_case(*e, Role::Worker);
            case.config.network = Some(Box::new(network_input(&wrong)));
            // A pre-baked image: nothing but the artifact could put kubeadm in place.
            case.config.skip_parts = vec!["install".to_owned()];
            case
        })
        .collect();
    in_parallel(&cases, |case| {
        let what = case.entry.name;
        let (sandbox, run) = boot_with_real_digests(case, false);
        assert!(!run.status.success(), "{what}: booted with a wrong digest");
        let message =
            format!("bootplate: artifacts: kubeadm from {ARTIFACT_URL} does not match its sha256");
        assert!(run.output.contains(&message), "{what}: {}", run.output);
        assert!(
            sandbox.read(artifact_path(case.entry.image)).is_none(),
            "{what}: installed"
        );
        assert!(
            sandbox
                .read("/run/cluster-api/bootstrap-success.complete")
                .is_none()
        );
    });
}

/// The render of `case`'s machine split by part, as the in-place comparison sees it.
fn parts(case: &Case) -> render::PartsRender {
    let object = format!("ClusterBootstrapTemplate {}", case.entry.name);
    let compiled = CompiledTemplate::compile(&object, &spec(case.entry.name)).expect("compiles");
    let generated = render::generator::Generated::new();
    compiled
        .render_parts(&case.config, &case.context(), &generated)
        .expect("renders")
        .expect("a structured body")
}

/// A new CA, another mirror endpoint, other time servers or another proxy reach booted
/// machines in place, through part `network` alone; so does a first network input without a
/// proxy or downloads. The downloads and kubeadm's image repository roll out.
#[test]
fn network_changes_are_applied_in_place() {
    let in_place = render::UpdatePlan::InPlace {
        parts: vec!["network".to_owned()],
    };
    for entry in CATALOGUE.iter().filter(|e| e.kubeadm) {
        let old = network_case(*entry, Role::Worker);
        let mut new = old.clone();
        let input = new.config.network.as_mut().unwrap();
        input.registry_mirrors[0].endpoints[0].url = "https://mirror2.corp.example".to_owned();
        input.ca_bundles[0].name = "corp-2027".to_owned();
        input.ntp_servers = vec!["ntp3.corp.example".to_owned()];
        input.proxy.as_mut().unwrap().http = Some("http://proxy2.corp.example:3128".to_owned());
        assert_eq!(
            parts(&new).update_from(&parts(&old)),
            in_place,
            "{}",
            entry.name
        );

        let bare = Case::new(*entry, Role::Worker, "v1.31");
        let mut first = bare.clone();
        let mut input = network_input(STUB_DOWNLOAD_SHA256);
        (input.proxy, input.artifacts) = (None, Vec::new());
        first.config.network = Some(Box::new(input));
        assert_eq!(
            parts(&first).update_from(&parts(&bare)),
            in_place,
            "{}",
            entry.name
        );

        let mut download = old.clone();
        download.config.network.as_mut().unwrap().artifacts[0].sha256 = "1".repeat(64);
        let plan = parts(&download).update_from(&parts(&old));
        assert!(
            matches!(&plan, render::UpdatePlan::Rollout { reason } if reason.contains("`artifacts`")),
            "{}: {plan:?}",
            entry.name
        );
    }
}

/// Lint's `network-ignored`: silent for the shipped kubeadm templates (each reads every field
/// of the input), and it still speaks for one of them without its part `network`: the mirrors,
/// the CA bundles and the time servers would be ignored.
#[test]
fn lint_sees_every_network_field_read() {
    let ignored = |spec: &TemplateSpec, name: &str| -> Vec<String> {
        let object = format!("ClusterBootstrapTemplate {name}");
        render::lint(&object, spec, None)
            .into_iter()
            .filter(|p| p.code == "network-ignored")
            .map(|p| p.to_string())
            .collect()
    };
    for name in ["plain-linux", COMPAT.name, COMPAT_IGNITION.name] {
        assert_eq!(ignored(&spec(name), name), Vec::<String>::new(), "{name}");
    }
    for entry in CATALOGUE.iter().filter(|e| e.kubeadm) {
        let mut spec = spec(entry.name);
        assert_eq!(
            ignored(&spec, entry.name),
            Vec::<String>::new(),
            "{}",
            entry.name
        );
        spec.parts.retain(|p| p.name != "network");
        let found = ignored(&spec, entry.name);
        for field in ["registryMirrors", "caBundles", "ntpServers"] {
            let said = found
                .iter()
                .any(|p| p.contains(&format!("`network.{field}`")));
            assert!(said, "{}: no warning for {field}: {found:?}", entry.name);
        }
        assert_eq!(found.len(), 3, "{}: {found:?}", entry.name);
    }
}

/// The worked example without what only the kubeadm-* templates take (kubeadm's image
/// repository, the downloads): the input of kubeadm-compat, kubeadm-compat-ignition and
/// plain-linux.
fn input_without_downloads() -> crd_types::NetworkConfig {
    let mut input = network_input(STUB_DOWNLOAD_SHA256);
    (input.image_repository, input.artifacts) = (None, Vec::new());
    input
}

/// kubeadm-compat and kubeadm-compat-ignition for every role, plain-linux for its one (their
/// golden files), with the input of [`input_without_downloads`]; kubeadm-compat's init also
/// with kubeadm's image repository.
pub(super) fn other_cases() -> Vec<Case> {
    let plain = *CATALOGUE.iter().find(|e| e.name == "plain-linux").unwrap();
    let mut cases: Vec<Case> = [COMPAT, COMPAT_IGNITION]
        .iter()
        .flat_map(|e| Role::ALL.iter().map(|r| Case::new(*e, *r, "v1.31")))
        .chain([Case::new(plain, Role::Worker, "")])
        .collect();
    for case in &mut cases {
        let mut input = input_without_downloads();
        if case.role == Role::Init {
            input.image_repository = Some("mirror.corp.example:5000/k8s".to_owned());
        }
        case.config.network = Some(Box::new(input));
        case.tag = "network";
    }
    cases
}

/// The templates without kubeadm downloads, each role: golden file, boot, the CA in the trust
/// store and its tool run, hosts.toml, the proxy drop-ins (plain-linux: /etc/environment and
/// containerd's), the time servers, kubeadm's image repository.
#[test]
fn the_network_input_lands_where_the_os_reads_it_without_downloads() {
    in_parallel(&other_cases(), |case| {
        let what = format!("{} {}", case.entry.name, case.label());
        let data = case.render().unwrap_or_else(|e| panic!("{what}: {e}"));
        let boot = check_output(&what, case.format(), &data, true);
        check_golden(case, &data);
        let sandbox = Sandbox::new(case.entry.image);
        let plain = case.entry.name == "plain-linux";
        if plain {
            // plain-linux writes the mirrors only where containerd is installed.
            let link = sandbox.path("/bootplate-stubs/containerd");
            std::os::unix::fs::symlink("stub", link).expect("containerd stub");
        }
        let run = sandbox.boot(&boot);
        assert!(run.status.success(), "{what}: boot failed:\n{}", run.output);
        let (anchor, tool) = trust_store(case.entry.image);
        let pem = render::network::SAMPLE_CA_PEM;
        assert_eq!(
            sandbox.read(anchor).as_deref(),
            Some(pem),
            "{what}: {anchor}"
        );
        assert!(sandbox.called(&[tool]), "{what}: {tool} not run");
        check_mirror(&what, &sandbox);
        if plain {
            check_dropins(&what, &sandbox, &["containerd"]);
            let environment = sandbox.read("/etc/environment").unwrap_or_default();
            let line = format!("https_proxy={PROXY}\n");
            assert!(
                environment.starts_with("# BEGIN bootplate network.proxy\n")
                    && environment.contains(&line),
                "{what}: /etc/environment: {environment}"
            );
        } else {
            check_dropins(&what, &sandbox, &["containerd", "kubelet"]);
        }
        check_other_ntp_and_repository(&what, case, &sandbox);
    });
}

/// NTP (every one of them writes the time service's file in its part `network`) and, for
/// kubeadm-compat's init, the ClusterConfiguration's imageRepository.
fn check_other_ntp_and_repository(what: &str, case: &Case, sandbox: &Sandbox) {
    check_ntp(what, case, sandbox);
    if case.entry.name == COMPAT.name && case.role == Role::Init {
        let docs = kubeadm_documents(sandbox, case.role);
        assert_eq!(
            docs[1]["imageRepository"], "mirror.corp.example:5000/k8s",
            "{what}"
        );
    }
}

/// What a template cannot do with the input it refuses at render time, naming the field:
/// downloads in kubeadm-compat (it installs nothing), kubeadm's fields in plain-linux. And
/// plain-linux on an image without containerd says that the mirrors were not written.
#[test]
fn what_a_template_cannot_apply_is_refused_or_said() {
    let plain = *CATALOGUE.iter().find(|e| e.name == "plain-linux").unwrap();
    let refusals = [
        (COMPAT, "network.artifacts needs a template that downloads"),
        (
            COMPAT_IGNITION,
            "network.artifacts needs a template that downloads",
        ),
        (plain, "network.imageRepository does not apply"),
    ];
    for (entry, message) in refusals {
        let version = if entry.name == "plain-linux" {
            ""
        } else {
            "v1.31"
        };
        let mut case = Case::new(entry, Role::Worker, version);
        case.config.network = Some(Box::new(network_input(STUB_DOWNLOAD_SHA256)));
        let error = case.render().expect_err(entry.name).to_string();
        assert!(error.contains(message), "{}: {error}", entry.name);
    }
    let mut case = Case::new(plain, Role::Worker, "");
    case.config.network = Some(Box::new(input_without_downloads()));
    let data = case.render().expect("renders");
    let boot = check_output("plain-linux", case.format(), &data, false);
    let sandbox = Sandbox::new(plain.image);
    // An image without containerd (the host's, under the sandbox's /usr, is shadowed).
    let missing = b"#!/bin/sh\necho 'containerd: not found' >&2\nexit 127\n";
    sandbox.write("/bootplate-stubs/containerd", missing, 0o755);
    let run = sandbox.boot(&boot);
    assert!(run.status.success(), "{}", run.output);
    assert!(
        run.output
            .contains("containerd is not installed; no hosts.toml written"),
        "{}",
        run.output
    );
    assert!(
        sandbox
            .read("/etc/containerd/certs.d/registry.k8s.io/hosts.toml")
            .is_none()
    );
}

/// plain-linux's part `network` is applied in place, like the kubeadm templates'.
#[test]
fn plain_linux_network_changes_are_applied_in_place() {
    let plain = *CATALOGUE.iter().find(|e| e.name == "plain-linux").unwrap();
    let mut old = Case::new(plain, Role::Worker, "");
    old.config.network = Some(Box::new(input_without_downloads()));
    let mut new = old.clone();
    new.config.network.as_mut().unwrap().ca_bundles[0].name = "corp-2027".to_owned();
    let in_place = render::UpdatePlan::InPlace {
        parts: vec!["network".to_owned()],
    };
    assert_eq!(parts(&new).update_from(&parts(&old)), in_place);
}
