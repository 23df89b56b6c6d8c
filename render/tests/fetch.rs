//! Fetch delivery (docs/boot-channel.md, "Fetch delivery"): the stub of every shipped kubeadm
//! template, for both joining roles, fits in 2048 bytes and passes its format's checker; a
//! control-plane-join stub holds no private key while its sealed payload does; `init` stays
//! inline. The script stub, run by bash with the real `openssl` and a stand-in `curl` that
//! serves files, checks the CA, fetches, decrypts and runs the payload, and stops with a clear
//! message on a refused token (401) or a CA that does not match the hash.

mod common;

use std::path::Path;
use std::process::Command;

use crd_types::{BootplateConfigSpec, ClusterBootstrapTemplate, Delivery, OutputFormat, Role};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use render::fetch::{self, Fetch, PayloadKeys};
use render::{CompiledTemplate, SAMPLE_TOKEN, sample_context};
use sha2::{Digest, Sha256};

/// A long but real-looking endpoint and a config UID: the stub's variable parts at full size.
const SERVER: &str = "https://workload-cluster-api-0123456789.eu-central-1.elb.amazonaws.com:6443";
const NAME: &str = "bootplate-fetch-0b8d6c5e-4f2a-4a58-9d7e-1c2b3a4d5e6f";

fn target(ca_hash: &str) -> Fetch {
    Fetch {
        server: SERVER.to_owned(),
        ca_hash: ca_hash.to_owned(),
        token: SAMPLE_TOKEN.to_owned(),
        name: NAME.to_owned(),
        keys: PayloadKeys {
            cipher: [0xa5; 32],
            mac: [0x5a; 32],
            iv: [0x3c; 16],
        },
    }
}

fn fetch_config() -> BootplateConfigSpec {
    BootplateConfigSpec {
        delivery: Some(Delivery::Fetch),
        ..BootplateConfigSpec::default()
    }
}

fn try_render(
    name: &str,
    spec: &crd_types::TemplateSpec,
    role: Role,
    fetch: Option<Fetch>,
) -> Result<render::Rendered, render::RenderError> {
    let object = format!("ClusterBootstrapTemplate {name}");
    let compiled = CompiledTemplate::compile(&object, spec).unwrap();
    let mut ctx = sample_context(role);
    ctx.fetch = fetch;
    compiled.render(&fetch_config(), &ctx)
}

fn render(spec: &crd_types::TemplateSpec, role: Role, fetch: Option<Fetch>) -> render::Rendered {
    try_render("t", spec, role, fetch).unwrap_or_else(|e| panic!("{role}: {e}"))
}

fn shipped() -> Vec<(String, crd_types::TemplateSpec)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("kubeadm-") && name.ends_with(".yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let t: ClusterBootstrapTemplate = serde_yaml::from_str(&text).unwrap();
            found.push((name, t.spec.0));
        }
    }
    assert!(
        found.len() >= 8,
        "{} shipped kubeadm templates",
        found.len()
    );
    found
}

fn check(format: OutputFormat, data: &[u8], dir: &Path) {
    let path = dir.join("stub");
    std::fs::write(&path, data).unwrap();
    match format {
        OutputFormat::CloudConfig => common::check_cloud_config(&path),
        OutputFormat::Ignition => common::check_ignition(&path),
        OutputFormat::Script => common::check_script(&path),
        OutputFormat::MimeMultipart => drop(common::check_mime(&path)),
    }
}

#[test]
fn every_shipped_kubeadm_template_has_a_stub_of_at_most_2048_bytes_per_joining_role() {
    let dir = tempfile::tempdir().unwrap();
    let hash = format!("sha256:{}", "ab".repeat(32));
    for (name, spec) in shipped() {
        let name = name.trim_end_matches(".yaml");
        if spec.template.is_some() {
            // A raw template (the kubeadm provider's shapes) cannot be fetched.
            let e = try_render(name, &spec, Role::Worker, Some(target(&hash))).unwrap_err();
            assert!(
                e.to_string().contains("delivery: Fetch needs"),
                "{name}: {e}"
            );
            continue;
        }
        for role in [Role::Worker, Role::ControlPlaneJoin] {
            let rendered = try_render(name, &spec, role, Some(target(&hash)))
                .unwrap_or_else(|e| panic!("{name} {role}: {e}"));
            let stub = String::from_utf8(rendered.data.clone()).unwrap();
            assert!(
                stub.len() <= fetch::STUB_LIMIT,
                "{name} {role}: stub of {} bytes:\n{stub}",
                stub.len()
            );
            check(spec.format, &rendered.data, dir.path());
            assert!(!stub.contains("PRIVATE KEY"), "{name} {role}: {stub}");
            let sealed = rendered.payload.expect("a sealed payload");
            let payload = fetch::open(&sealed, &target(&hash).keys).unwrap();
            let payload = String::from_utf8(payload).unwrap();
            assert!(payload.starts_with("#!/bin/bash\n"), "{name} {role}");
            assert!(payload.contains(SAMPLE_TOKEN), "{name} {role}");
            assert_eq!(
                payload.contains("PRIVATE KEY"),
                role == Role::ControlPlaneJoin,
                "{name} {role}: the payload carries the CA keys of a control-plane join only"
            );
        }
        // `init` has no apiserver to fetch from: the whole render, inline.
        let init = try_render(name, &spec, Role::Init, Some(target(&hash))).unwrap();
        assert!(init.payload.is_none(), "{name}");
        assert!(init.data.len() > fetch::STUB_LIMIT, "{name}");
    }
    // The fixture's parts in every format.
    let mut spec = common::spec("parts.yaml");
    for format in [
        OutputFormat::CloudConfig,
        OutputFormat::Ignition,
        OutputFormat::Script,
        OutputFormat::MimeMultipart,
    ] {
        spec.format = format;
        let rendered = try_render("golden", &spec, Role::Worker, Some(target(&hash)))
            .unwrap_or_else(|e| panic!("{format}: {e}"));
        assert!(rendered.data.len() <= fetch::STUB_LIMIT, "{format}");
        check(format, &rendered.data, dir.path());
    }
}

#[test]
fn a_raw_template_cannot_be_fetched() {
    let spec = common::spec_yaml(
        "os: {name: linux}\nformat: script\ndelivery: Fetch\ntemplate: \"#!/bin/sh\\n\"\n",
    );
    let e = CompiledTemplate::compile("t", &spec).err().unwrap();
    assert!(e.to_string().contains("delivery: Fetch needs"), "{e}");
}

/// A stand-in `curl`: writes `$FAKE/<last URL segment>` to the `-o` file, prints the status
/// from `$FAKE/<segment>.code` (200 without one) for `-w`, and records its arguments.
const CURL: &str = r#"#!/bin/sh
out=; url=; w=
while [ $# -gt 0 ]; do
  case $1 in -o) out=$2; shift ;; -w) w=$2; shift ;; -H|--cacert) echo "$1 $2" >>"$FAKE/args"; shift ;; -*) ;; *) url=$1 ;; esac
  shift
done
n=${url##*/}
cat "$FAKE/$n" >"$out"
[ -z "$w" ] || cat "$FAKE/$n.code" 2>/dev/null || printf 200
"#;

struct Machine {
    dir: tempfile::TempDir,
    ca_hash: String,
}

/// A machine's world: a real CA (its hash as kubeadm computes it), the stand-in `curl`, the
/// `cluster-info` ConfigMap and the payload Secret of a worker whose only command leaves a file.
fn machine() -> Machine {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("bin")).unwrap();
    std::fs::create_dir_all(d.join("run")).unwrap();
    std::fs::write(d.join("bin/curl"), CURL).unwrap();
    common::run_tool("chmod", &["0755", &d.join("bin/curl").to_string_lossy()]);
    let key = d.join("ca.key").to_string_lossy().into_owned();
    let crt = d.join("ca.crt").to_string_lossy().into_owned();
    common::run_tool(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kubernetes",
        ]
        .into_iter()
        .chain(["-days", "1", "-keyout", &key, "-out", &crt])
        .collect::<Vec<_>>(),
    );
    let pem = std::fs::read_to_string(&crt).unwrap();
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = parsed.parse_x509().unwrap();
    let ca_hash = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.tbs_certificate.subject_pki.raw))
    );
    use base64::Engine as _;
    let kubeconfig = format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: {SERVER}\n  name: \"\"\nkind: Config\n",
        base64::engine::general_purpose::STANDARD.encode(&pem)
    );
    let cluster_info = ConfigMap {
        data: Some([("kubeconfig".to_owned(), kubeconfig)].into()),
        ..ConfigMap::default()
    };
    std::fs::write(
        d.join("cluster-info"),
        serde_json::to_vec(&cluster_info).unwrap(),
    )
    .unwrap();
    Machine { dir, ca_hash }
}

/// The script stub of a worker whose one command writes `$FAKE/ran`, with the payload Secret
/// it fetches in place; `/run/` moved under the machine's directory.
fn stub(m: &Machine, ca_hash: &str) -> String {
    let spec = common::spec_yaml(
        "os: {name: linux}\nformat: script\nparts:\n- name: join\n  commands: ['echo \"joined with {{join.token}}\" > \"$FAKE/ran\"']\n",
    );
    let rendered = render(&spec, Role::Worker, Some(target(ca_hash)));
    let d = m.dir.path();
    // The payload's own `/run/` (its Cluster API sentinel) moved too, sealed again.
    let keys = target(ca_hash).keys;
    let payload = fetch::open(&rendered.payload.unwrap(), &keys).unwrap();
    let payload = String::from_utf8(payload)
        .unwrap()
        .replace("/run/", &format!("{}/run/", d.display()));
    let sealed = fetch::seal(payload.as_bytes(), &keys);
    let secret = Secret {
        data: Some(
            [
                (fetch::IV_KEY, sealed.iv.into_bytes()),
                (fetch::MAC_KEY, sealed.mac.into_bytes()),
                (fetch::PAYLOAD_KEY, sealed.data),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v)))
            .collect(),
        ),
        ..Secret::default()
    };
    std::fs::write(d.join(NAME), serde_json::to_vec(&secret).unwrap()).unwrap();
    String::from_utf8(rendered.data)
        .unwrap()
        .replace("/run/", &format!("{}/run/", d.display()))
}

/// Runs `script` with the stand-in `curl` first on the PATH: success, and standard error.
fn run(m: &Machine, script: &str) -> (bool, String) {
    let d = m.dir.path();
    let path = format!("{}/bin:{}", d.display(), std::env::var("PATH").unwrap());
    let out = Command::new("bash")
        .args(["-c", script])
        .env("PATH", path)
        .env("FAKE", d)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_script_stub_checks_the_ca_fetches_decrypts_and_runs_its_payload() {
    let m = machine();
    let d = m.dir.path();
    let (ok, err) = run(&m, &stub(&m, &m.ca_hash));
    assert!(ok, "{err}");
    let ran = std::fs::read_to_string(d.join("ran")).unwrap();
    assert_eq!(ran, format!("joined with {SAMPLE_TOKEN}\n"));
    let args = std::fs::read_to_string(d.join("args")).unwrap();
    assert!(
        args.contains(&format!("-H Authorization: Bearer {SAMPLE_TOKEN}")),
        "{args}"
    );
    assert!(args.contains("--cacert ca.crt"), "{args}");
    // The decrypted render is not left behind; the sentinel is the render's.
    assert!(!d.join("run/bootplate-fetch/x.sh").exists());
    assert!(
        d.join("run/cluster-api/bootstrap-success.complete")
            .exists()
    );
}

#[test]
fn the_stub_stops_clearly_on_a_refused_token_and_on_a_ca_that_does_not_match() {
    let m = machine();
    let d = m.dir.path();
    std::fs::write(d.join(format!("{NAME}.code")), "401").unwrap();
    let (ok, err) = run(&m, &stub(&m, &m.ca_hash));
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "bootplate fetch: {SERVER} refused the bootstrap token (401): it expired or was deleted"
        )),
        "{err}"
    );
    assert!(!d.join("ran").exists());
    std::fs::remove_file(d.join(format!("{NAME}.code"))).unwrap();
    let other = format!("sha256:{}", "0".repeat(64));
    let (ok, err) = run(&m, &stub(&m, &other));
    assert!(!ok);
    assert!(
        err.contains(&format!("the CA of {SERVER} does not match {other}")),
        "{err}"
    );
    assert!(!d.join("ran").exists());
}
