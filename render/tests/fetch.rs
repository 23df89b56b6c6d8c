//! Fetch delivery (docs/boot-channel.md, "Fetch delivery"): the stub of every shipped kubeadm
//! template, for both joining roles, fits in its limit (with the longest endpoint there is)
//! and passes its format's checker; a control-plane-join stub holds no private key while its
//! sealed payload does; `init` stays inline. The script stub, run by bash and sh with the real
//! `openssl` and a stand-in `curl` that serves files (and checks TLS trust with the real
//! `openssl verify`), checks `cluster-info`'s signature and CA, fetches, decrypts and runs the
//! payload, and stops with a clear message on a refused token (401), a CA that does not match
//! the hash or a signature that does not match the token; a server without the cluster CA's
//! key or the token never gets the token; no secret is ever a program's argument.

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

/// The longest endpoint there is: a DNS name of 253 characters and a five-digit port.
fn longest_endpoint() -> String {
    let label = "a".repeat(63);
    let name = format!("{label}.{label}.{label}.{}", "b".repeat(61));
    assert_eq!(name.len(), 253);
    format!("https://{name}:65535")
}

fn target(ca_hash: &str) -> Fetch {
    target_at(SERVER, ca_hash)
}

fn target_at(server: &str, ca_hash: &str) -> Fetch {
    Fetch {
        server: server.to_owned(),
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
        other => panic!("format {other} has no fetch stub"),
    }
}

#[test]
fn every_shipped_kubeadm_template_has_a_stub_within_its_limit_per_joining_role() {
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
            let longest = try_render(
                name,
                &spec,
                role,
                Some(target_at(&longest_endpoint(), &hash)),
            )
            .unwrap_or_else(|e| panic!("{name} {role}, the longest endpoint: {e}"));
            assert!(longest.data.len() <= fetch::STUB_LIMIT, "{name} {role}");
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
        for role in [Role::Worker, Role::ControlPlaneJoin] {
            let rendered = try_render("golden", &spec, role, Some(target(&hash)))
                .unwrap_or_else(|e| panic!("{format} {role}: {e}"));
            assert!(rendered.data.len() <= fetch::STUB_LIMIT, "{format} {role}");
            check(format, &rendered.data, dir.path());
            let longest = target_at(&longest_endpoint(), &hash);
            let longest = try_render("golden", &spec, role, Some(longest))
                .unwrap_or_else(|e| panic!("{format} {role}, the longest endpoint: {e}"));
            assert!(longest.data.len() <= fetch::STUB_LIMIT, "{format} {role}");
        }
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

/// A stand-in `curl`, the server at `$S` made of files in `$FAKE`: writes `$FAKE/<last URL
/// segment>` to the `-o` file and prints `$FAKE/<segment>.code` (200 without one) for `-w`.
/// TLS as curl does it: unless `-k`, the server's certificate `$FAKE/server.crt` must verify
/// against the `--cacert` file alone, else it exits 60 having sent nothing. The headers it
/// sends (`-H` as text, `@file` or `@-`) go to `$FAKE/sent`, its arguments to `$FAKE/argv`.
const CURL: &str = r#"#!/bin/sh
printf '%s\n' "curl $*" >>"$FAKE/argv"
out=; url=; w=; ca=; k=; hdr=
while [ $# -gt 0 ]; do
  case $1 in
  -o) out=$2; shift ;;
  -w) w=$2; shift ;;
  --cacert) ca=$2; shift ;;
  -H) case $2 in @-) hdr=$(cat) ;; @*) hdr=$(cat "${2#@}") ;; *) hdr=$2 ;; esac; shift ;;
  --*) ;;
  -*k*) k=1 ;;
  -*) ;;
  *) url=$1 ;;
  esac
  shift
done
if [ -z "$k" ] && ! openssl verify -CAfile "${ca:-/dev/null}" "$FAKE/server.crt" >/dev/null 2>&1; then
  echo "curl: (60) SSL certificate problem: unable to get local issuer certificate" >&2
  exit 60
fi
[ -z "$hdr" ] || printf '%s\n' "$hdr" >>"$FAKE/sent"
n=${url##*/}
cat "$FAKE/$n" >"$out"
[ -z "$w" ] || cat "$FAKE/$n.code" 2>/dev/null || printf 200
"#;

/// Every other program, for [`the_stub_puts_no_secret_on_a_command_line`]: records its name and
/// arguments in `$FAKE/argv`, then runs the real one from `$REAL_PATH`.
const WRAPPER: &str = r#"#!/bin/sh
n=${0##*/}
printf '%s\n' "$n $*" >>"$FAKE/argv"
IFS=:
for d in $REAL_PATH; do [ -x "$d/$n" ] && exec "$d/$n" "$@"; done
exit 127
"#;

struct Machine {
    dir: tempfile::TempDir,
    ca_hash: String,
}

/// A machine's world: the cluster's CA (its hash as kubeadm computes it) and an attacker's,
/// each with a serving certificate it signed; the stand-in `curl`; the server at `$S` serving
/// with the cluster CA's certificate a `cluster-info` as `kubeadm init` and the bootstrap
/// signer publish it (the CA, signed for the machine's token).
fn machine() -> Machine {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("bin")).unwrap();
    std::fs::create_dir_all(d.join("run")).unwrap();
    std::fs::write(d.join("bin/curl"), CURL).unwrap();
    common::run_tool("chmod", &["0755", &d.join("bin/curl").to_string_lossy()]);
    let pem = certificate_authority(d, "kubernetes");
    certificate_authority(d, "attacker");
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = parsed.parse_x509().unwrap();
    let ca_hash = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.tbs_certificate.subject_pki.raw))
    );
    let m = Machine { dir, ca_hash };
    m.serve_with("kubernetes");
    let kubeconfig = kubeconfig(&pem);
    m.cluster_info(&kubeconfig, Some(&jws(&kubeconfig, SAMPLE_TOKEN)));
    m
}

/// Makes CA `name` in `d` (`name.key`, `name.crt`, EC keys: quick) and a serving certificate it
/// signed (`name-server.crt`); the CA's certificate.
fn certificate_authority(d: &Path, name: &str) -> String {
    let path = |file: &str| d.join(file).to_string_lossy().into_owned();
    let (key, crt) = (path(&format!("{name}.key")), path(&format!("{name}.crt")));
    let (server_key, csr) = (path(&format!("{name}-server.key")), path("server.csr"));
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let subject = format!("/CN={name}");
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend([
        "-subj", &subject, "-days", "1", "-keyout", &key, "-out", &crt,
    ]);
    common::run_tool("openssl", &args);
    let mut args = vec!["req", "-new"];
    args.extend(ec);
    args.extend(["-subj", "/CN=server", "-keyout", &server_key, "-out", &csr]);
    common::run_tool("openssl", &args);
    let server = path(&format!("{name}-server.crt"));
    common::run_tool(
        "openssl",
        &["x509", "-req", "-in", &csr, "-CA", &crt, "-CAkey", &key]
            .into_iter()
            .chain(["-set_serial", "2", "-days", "1", "-out", &server])
            .collect::<Vec<_>>(),
    );
    std::fs::read_to_string(&crt).unwrap()
}

/// The `kubeconfig` of `cluster-info` (as `kubeadm init` writes it) with CA bundle `bundle`.
fn kubeconfig(bundle: &str) -> String {
    use base64::Engine as _;
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: {SERVER}\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {{}}\nusers: null\n",
        base64::engine::general_purpose::STANDARD.encode(bundle)
    )
}

/// The detached JWS (RFC 7515, appendix F) the bootstrap signer writes into `cluster-info` for
/// `token` over `content`: HS256 keyed by the token's secret, `kid` its ID. Written here from
/// the RFC, apart from the stub; checked against cluster-bootstrap's own test vectors below.
fn jws(content: &str, token: &str) -> String {
    use base64::Engine as _;
    use hmac::Mac as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (id, secret) = token.split_once('.').unwrap();
    let header = b64.encode(format!(r#"{{"alg":"HS256","kid":"{id}"}}"#));
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{header}.{}", b64.encode(content)).as_bytes());
    format!("{header}..{}", b64.encode(mac.finalize().into_bytes()))
}

#[test]
fn the_tests_jws_gives_cluster_bootstraps_test_vectors() {
    // k8s.io/cluster-bootstrap, token/jws/jws_test.go.
    let token = "joshua.my voice is my passcode";
    let content = "Hello from the other side. I must have called a thousand times.";
    assert_eq!(
        jws(content, token),
        "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..VShe2taLd-YTrmWuRkcL_8QTNDHYxQIEBsAYYiIj1_8"
    );
    assert_eq!(
        jws("", token),
        "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..7Ui1ALizW4jXphVUB7xUqC9vLYLL9RZeOFfVLoB7Tgk"
    );
}

impl Machine {
    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }

    fn pem(&self, ca: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{ca}.crt"))).unwrap()
    }

    /// The server at `$S` presents the serving certificate CA `ca` signed.
    fn serve_with(&self, ca: &str) {
        let server = self.path(&format!("{ca}-server.crt"));
        std::fs::copy(server, self.path("server.crt")).unwrap();
    }

    /// The server's `kube-public/cluster-info`: `kubeconfig`, and `jws` as the signature of
    /// [`SAMPLE_TOKEN`]'s ID. Pretty JSON, as the apiserver answers curl.
    fn cluster_info(&self, kubeconfig: &str, jws: Option<&str>) {
        let mut data = std::collections::BTreeMap::from([("kubeconfig".to_owned(), kubeconfig)]);
        let key = format!("jws-kubeconfig-{}", SAMPLE_TOKEN.split_once('.').unwrap().0);
        if let Some(jws) = jws {
            data.insert(key, jws);
        }
        let data = data.into_iter().map(|(k, v)| (k, v.to_owned())).collect();
        let cluster_info = ConfigMap {
            data: Some(data),
            ..ConfigMap::default()
        };
        let json = serde_json::to_vec_pretty(&cluster_info).unwrap();
        std::fs::write(self.path("cluster-info"), json).unwrap();
    }

    /// The headers the server received, one a line; empty when none.
    fn sent(&self) -> String {
        std::fs::read_to_string(self.path("sent")).unwrap_or_default()
    }

    /// Forgets what the last run left: the headers sent, the arguments, the payload's mark.
    fn reset(&self) {
        for file in ["sent", "argv", "ran"] {
            let _ = std::fs::remove_file(self.path(file));
        }
    }
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

/// Runs `script` from a file (as cloud-init and Ignition's unit do) with `shell`, the
/// stand-in `curl` first on the PATH: success, and standard error.
fn run(m: &Machine, shell: &str, script: &str) -> (bool, String) {
    run_with_path(m, shell, script, &std::env::var("PATH").unwrap())
}

fn run_with_path(m: &Machine, shell: &str, script: &str, path: &str) -> (bool, String) {
    let d = m.dir.path();
    std::fs::write(d.join("stub.sh"), script).unwrap();
    let out = Command::new(shell)
        .arg(d.join("stub.sh"))
        .env("PATH", format!("{}/bin:{path}", d.display()))
        .env("FAKE", d)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `script` (a script stub) as `shell` runs it: whole for bash; for sh, the stub's command
/// alone, as a cloud-config's `runcmd` has it (the script format's header is bash's).
fn as_shell(shell: &str, script: &str) -> String {
    match shell {
        "sh" => script[script.find("set +eu").expect("the stub's command")..].to_owned(),
        _ => script.to_owned(),
    }
}

/// The stub under bash (the script format) and sh (a cloud-config's `runcmd`; dash here).
#[test]
fn the_script_stub_checks_the_ca_fetches_decrypts_and_runs_its_payload() {
    let m = machine();
    let d = m.dir.path();
    for shell in ["bash", "sh"] {
        m.reset();
        let (ok, err) = run(&m, shell, &as_shell(shell, &stub(&m, &m.ca_hash)));
        assert!(ok, "{shell}: {err}");
        let ran = std::fs::read_to_string(d.join("ran")).unwrap();
        assert_eq!(ran, format!("joined with {SAMPLE_TOKEN}\n"), "{shell}");
        assert_eq!(
            m.sent(),
            format!("Authorization: Bearer {SAMPLE_TOKEN}\n"),
            "{shell}"
        );
        // The decrypted render is not left behind; the sentinel is the render's.
        assert!(!d.join("run/bootplate-fetch/x.sh").exists());
        assert!(
            d.join("run/cluster-api/bootstrap-success.complete")
                .exists()
        );
    }
}

#[test]
fn the_stub_stops_clearly_on_a_refused_token_and_on_a_ca_that_does_not_match() {
    let m = machine();
    let d = m.dir.path();
    std::fs::write(d.join(format!("{NAME}.code")), "401").unwrap();
    let (ok, err) = run(&m, "bash", &stub(&m, &m.ca_hash));
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
    let (ok, err) = run(&m, "bash", &stub(&m, &other));
    assert!(!ok);
    assert!(
        err.contains(&format!("the CA of {SERVER} does not match {other}")),
        "{err}"
    );
    assert!(!d.join("ran").exists());
}

/// Issue 48, item 3. A server that holds no key of the cluster CA (its certificate is the
/// attacker's CA's) serves a `cluster-info` whose bundle adds its own CA to the real one, in
/// either order, or holds its CA alone: with the cluster's signature of the real
/// `kubeconfig`, and even with a valid signature of its own bundle (an attacker who knew the
/// token's secret: the pinned CA alone must still stop it). The stub stops before it sends the
/// token.
#[test]
fn a_server_without_a_key_of_the_cluster_ca_never_gets_the_token() {
    let m = machine();
    let (real, own) = (m.pem("kubernetes"), m.pem("attacker"));
    let original = jws(&kubeconfig(&real), SAMPLE_TOKEN);
    m.serve_with("attacker");
    for (what, bundle) in [
        ("real CA + own CA", format!("{real}{own}")),
        ("own CA + real CA", format!("{own}{real}")),
        ("own CA only", own.clone()),
    ] {
        let config = kubeconfig(&bundle);
        for signature in [original.clone(), jws(&config, SAMPLE_TOKEN)] {
            m.reset();
            m.cluster_info(&config, Some(&signature));
            let (ok, err) = run(&m, "bash", &stub(&m, &m.ca_hash));
            assert_eq!(m.sent(), "", "{what}: the token was sent; {err}");
            assert!(!ok, "{what}: the stub went on");
            assert!(!m.path("ran").exists(), "{what}");
            assert!(err.contains("bootplate fetch: "), "{what}: {err}");
        }
    }
}

/// Issue 48, item 3. A server whose certificate the cluster CA signed (it holds the CA's key,
/// not the token) serves a `cluster-info` without the token's signature, with a signature
/// made with another secret, with the token's signature of another `kubeconfig`, or with one
/// for another token ID: the stub stops before it sends the token, and says why.
#[test]
fn a_cluster_info_not_signed_for_the_token_never_gets_it() {
    let m = machine();
    let config = kubeconfig(&m.pem("kubernetes"));
    let other_server = config.replace(SERVER, "https://elsewhere:6443");
    let id = SAMPLE_TOKEN.split_once('.').unwrap().0;
    let other_secret = format!("{id}.0000000000000000");
    let other_id = jws(&config, "zzzzzz.notarealtoken000");
    let no_signature = format!(
        "bootplate fetch: cluster-info has no signature for token {id}: it expired or was deleted"
    );
    let mismatch = format!("bootplate fetch: cluster-info fails the signature check of token {id}");
    for (what, signature, message) in [
        ("no signature", None, &no_signature),
        (
            "another secret",
            Some(jws(&config, &other_secret)),
            &mismatch,
        ),
        (
            "another kubeconfig",
            Some(jws(&other_server, SAMPLE_TOKEN)),
            &mismatch,
        ),
        ("another token's signature", Some(other_id), &mismatch),
        ("not a JWS", Some("x".to_owned()), &mismatch),
    ] {
        m.reset();
        m.cluster_info(&config, signature.as_deref());
        let (ok, err) = run(&m, "bash", &stub(&m, &m.ca_hash));
        assert_eq!(m.sent(), "", "{what}: the token was sent; {err}");
        assert!(!ok, "{what}: the stub went on");
        assert!(err.contains(message.as_str()), "{what}: {err}");
    }
}

/// Issue 48, item 4. While the stub runs, no program it starts has the token, its secret, or
/// either key in its arguments (what `/proc/PID/cmdline` shows every user of the machine):
/// every program on the PATH is a wrapper that records its arguments, then runs the real one.
#[test]
fn the_stub_puts_no_secret_on_a_command_line() {
    let m = machine();
    let wrap = m.path("wrap");
    std::fs::create_dir_all(&wrap).unwrap();
    std::fs::write(m.path("wrapper"), WRAPPER).unwrap();
    common::run_tool("chmod", &["0755", &m.path("wrapper").to_string_lossy()]);
    let real_path = std::env::var("PATH").unwrap();
    for dir in std::env::split_paths(&real_path) {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let link = wrap.join(entry.file_name());
            if !link.exists() && entry.file_name() != "curl" {
                std::os::unix::fs::symlink(m.path("wrapper"), link).unwrap();
            }
        }
    }
    let keys = target(&m.ca_hash).keys;
    let secret = SAMPLE_TOKEN.split_once('.').unwrap().1;
    let secrets = [
        secret.to_owned(),
        hex::encode(secret),
        hex::encode(keys.cipher),
        hex::encode(keys.mac),
    ];
    for shell in ["bash", "sh"] {
        m.reset();
        let path = format!("{}:{real_path}", wrap.display());
        let script = as_shell(shell, &stub(&m, &m.ca_hash));
        let out = Command::new(shell)
            .arg({
                std::fs::write(m.path("stub.sh"), &script).unwrap();
                m.path("stub.sh")
            })
            .env("PATH", format!("{}/bin:{path}", m.dir.path().display()))
            .env("REAL_PATH", &real_path)
            .env("FAKE", m.dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{shell}: {err}");
        assert!(m.path("ran").exists(), "{shell}: the payload ran");
        let argv = std::fs::read_to_string(m.path("argv")).unwrap();
        let ran = |program: &str| argv.lines().any(|l| l.starts_with(program));
        assert!(ran("openssl ") && ran("curl "), "{argv}");
        for secret in &secrets {
            assert!(
                !argv.contains(secret.as_str()),
                "{shell}: a secret on a command line:\n{argv}"
            );
        }
    }
}
