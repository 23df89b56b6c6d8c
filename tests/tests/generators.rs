//! External generators under the real Cluster API, with real HTTPS generator servers in the
//! test (certificates from a test CA that the BootstrapGenerators' caBundle names): a CMDB gives
//! each machine its own static-IP netplan file; generators that are down, slow, failing,
//! oversized or malformed each block only their own configs, with a condition naming the
//! generator and the cause, an Event, a metric and no bootstrap token; a restart over ready
//! configs calls no generator; a generator not granted secrets never receives a token or a key,
//! while one granted them does (so the absence is a measurement).
//!
//! It runs on the real-Cluster-API environment (`testenv::capi`): Cluster API's own manager
//! owns the Machines, sets the configs' owner references and reports the Cluster's state; the
//! test plays only the cloud and the control-plane provider stand-in. The faults are the
//! generators', injected by the test's own servers, so nothing of Cluster API needs to be played.
//! The cloud boots none of these machines (their user-data writes no kubeadm configuration):
//! what is checked is the data each config renders, not a boot.
//!
//! The offline tests at the end (`bootplate generator serve`, the Python example of
//! docs/generators.md) need no cluster at all.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use crd_types::{
    BootplateConfigSpec, BootstrapGenerator, ClusterBootstrapTemplate,
    ClusterBootstrapTemplateSpec, GeneratorSecrets, OsInfo, OutputFormat, Part, PartGenerator,
    TemplateFile, TemplateKind, TemplateRef, TemplateSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use testenv::capi::objects::KUBERNETES_VERSION;
use testenv::capi::{CapiEnv, NS, Options, WAIT};
use testenv::generator::{GeneratorServer, Reply};
use testenv::pki::TestCa;
use testenv::{events, eventually, fixtures};

/// The Cluster every Machine here belongs to.
const CLUSTER: &str = "c1";

/// The CMDB's addresses, by machine name.
const ADDRESSES: [(&str, &str); 4] = [
    ("w-0", "10.1.0.10"),
    ("w-1", "10.1.0.11"),
    ("cp-1", "10.1.0.5"),
    ("f-down", "10.1.0.20"),
];

/// The machines whose generators fail, the generator each calls and the cause its condition
/// names.
const FAILURES: [(&str, &str, &str); 6] = [
    ("f-down", "down", "cannot reach it"),
    (
        "f-slow",
        "slow",
        "no answer within 1s (spec.timeoutSeconds)",
    ),
    ("f-500", "err500", "it answered HTTP 500"),
    (
        "f-huge",
        "huge",
        "larger than 262144 bytes (spec.maxResponseBytes)",
    ),
    (
        "f-unit",
        "bad-unit",
        "units[0].name: \"../../etc/passwd\" is not a unit name",
    ),
    ("f-unknown", "unknown", "unknown field `hostname`"),
];

/// The netplan file the CMDB writes for `address` on `interface`.
fn netplan(interface: &str, address: &str) -> String {
    format!(
        "network:\n  version: 2\n  ethernets:\n    {interface}:\n      addresses: [{address}/24]\n      routes: [{{to: default, via: 10.1.0.1}}]\n"
    )
}

/// A CMDB: each machine's static address as a netplan file; a machine it does not know is
/// refused.
fn cmdb(request: &Value) -> Reply {
    let machine = request["context"]["machine"]["name"].as_str().unwrap_or("");
    let interface = request["parameters"]["interface"]
        .as_str()
        .unwrap_or("eth0");
    match ADDRESSES.iter().find(|(m, _)| *m == machine) {
        Some((_, address)) => Reply::success(json!({"files": [{
            "path": "/etc/netplan/60-static.yaml",
            "permissions": "0600",
            "content": netplan(interface, address),
        }]})),
        None => Reply::json(&json!({
            "apiVersion": "generator.bootplate.dev/v1alpha1", "kind": "GeneratePartResponse",
            "status": "Failure", "message": format!("no address for machine {machine}"),
        })),
    }
}

/// A generator of [`NS`] that waits one second for an answer and is granted `secrets`.
fn generator(name: &str, url: &str, ca: &TestCa, secrets: GeneratorSecrets) -> BootstrapGenerator {
    let mut generator = fixtures::bootstrap_generator(name, url, &ca.cert_pem, 1, &[NS]);
    generator.spec.secrets = secrets;
    generator
}

/// A cloud-config template: a probe file with the join data, then `parts`.
fn template(name: &str, parts: Vec<Part>) -> ClusterBootstrapTemplate {
    let probe = Part {
        name: "probe".into(),
        files: vec![TemplateFile {
            path: "/etc/bootplate/probe".into(),
            content: "token={{#if join}}{{join.token}}{{/if}}\n".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let spec = TemplateSpec {
        os: OsInfo {
            name: "ubuntu".into(),
            version: Some("24.04".into()),
        },
        format: OutputFormat::CloudConfig,
        parts: std::iter::once(probe).chain(parts).collect(),
        ..Default::default()
    };
    ClusterBootstrapTemplate::new(name, ClusterBootstrapTemplateSpec(spec))
}

fn generated_part(name: &str, generator: &str) -> Part {
    Part {
        name: name.into(),
        generator: Some(PartGenerator {
            name: generator.into(),
            parameters: json!({"interface": "ens3"}).as_object().cloned().unwrap(),
        }),
        ..Default::default()
    }
}

async fn create<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await.unwrap();
}

/// The files a cloud-config writes, by path.
async fn written_files(env: &CapiEnv, name: &str) -> BTreeMap<String, String> {
    let user_data = env.user_data(name).await;
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(user_data.strip_prefix("#cloud-config\n").unwrap()).unwrap();
    yaml["write_files"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|f| {
            let path = f["path"].as_str().unwrap().to_owned();
            (path, f["content"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// The resourceVersions of the data Secrets of `names`.
async fn secret_versions(env: &CapiEnv, names: &[&str]) -> Vec<String> {
    let mut versions = Vec::new();
    for name in names {
        let secret = env.data_secret(name).await.expect("a data Secret");
        versions.push(secret.resource_version().unwrap());
    }
    versions
}

/// The CA Secrets a control-plane-join machine reads beside `-ca` (which the control-plane
/// stand-in brings), as the control-plane provider leaves them.
async fn control_plane_secrets(env: &CapiEnv, cluster: &str) {
    for (purpose, pair) in [
        ("etcd", bootplate::pki::generate_ca("etcd-ca").unwrap()),
        (
            "proxy",
            bootplate::pki::generate_ca("front-proxy-ca").unwrap(),
        ),
        (
            "sa",
            bootplate::pki::generate_service_account_key().unwrap(),
        ),
    ] {
        let data = [("tls.crt", pair.cert), ("tls.key", pair.key)];
        let secret = fixtures::cluster_secret(NS, cluster, purpose, data);
        create(&Api::<Secret>::namespaced(env.client.clone(), NS), &secret).await;
    }
}

/// A Machine `name` of [`CLUSTER`] (a control-plane one with `control_plane`) and its config
/// using the ClusterBootstrapTemplate `template`.
async fn machine(env: &CapiEnv, name: &str, control_plane: bool, template: &str) {
    let spec = BootplateConfigSpec {
        template_ref: TemplateRef {
            kind: TemplateKind::ClusterBootstrapTemplate,
            name: template.into(),
            namespace: None,
        },
        ..Default::default()
    };
    env.bootplate_machine((CLUSTER, name), control_plane, spec)
        .await
        .unwrap();
}

/// The test's generator servers: those that answer and those that fail each their own way.
struct Servers {
    cmdb: GeneratorServer,
    /// Granted the join token: it answers with a harmless command.
    vault: GeneratorServer,
    /// Granted the certificates: it answers with a harmless command.
    pki: GeneratorServer,
    slow: GeneratorServer,
    failing: GeneratorServer,
    huge: GeneratorServer,
    bad_unit: GeneratorServer,
    unknown: GeneratorServer,
    /// A URL nothing listens on.
    down_url: String,
}

impl Servers {
    async fn start(ca: &TestCa) -> Servers {
        let command =
            |line: &'static str| move |_: &Value| Reply::success(json!({"commands": [line]}));
        let huge_body = Bytes::from(vec![b' '; 50 << 20]);
        Servers {
            cmdb: GeneratorServer::start(ca, cmdb).await,
            vault: GeneratorServer::start(ca, command("echo vault-registered")).await,
            pki: GeneratorServer::start(ca, command("echo pki-checked")).await,
            slow: GeneratorServer::start(ca, |request| Reply {
                delay: Duration::from_secs(5),
                ..cmdb(request)
            })
            .await,
            failing: GeneratorServer::start(ca, |_| Reply {
                status: 500,
                body: Bytes::from_static(b"internal error"),
                delay: Duration::ZERO,
            })
            .await,
            huge: GeneratorServer::start(ca, move |_| Reply {
                status: 200,
                body: huge_body.clone(),
                delay: Duration::ZERO,
            })
            .await,
            bad_unit: GeneratorServer::start(ca, |_| {
                Reply::success(json!({"units": [
                    {"name": "../../etc/passwd", "content": "root::0:0::/:/bin/sh\n"},
                ]}))
            })
            .await,
            unknown: GeneratorServer::start(ca, |_| {
                Reply::success(json!({"files": [], "hostname": "w-9"}))
            })
            .await,
            down_url: format!("https://127.0.0.1:{}/", testenv::free_port().unwrap()),
        }
    }

    /// The BootstrapGenerators that point at these servers.
    fn generators(&self, ca: &TestCa) -> Vec<BootstrapGenerator> {
        let none = GeneratorSecrets::default();
        let token = GeneratorSecrets {
            join_token: true,
            certificates: false,
        };
        let certificates = GeneratorSecrets {
            join_token: false,
            certificates: true,
        };
        vec![
            generator("cmdb", &self.cmdb.url, ca, none),
            generator("vault", &self.vault.url, ca, token),
            generator("pki", &self.pki.url, ca, certificates),
            generator("slow", &self.slow.url, ca, none),
            generator("err500", &self.failing.url, ca, none),
            generator("huge", &self.huge.url, ca, none),
            generator("bad-unit", &self.bad_unit.url, ca, none),
            generator("unknown", &self.unknown.url, ca, none),
            generator("down", &self.down_url, ca, none),
        ]
    }
}

/// Publishes the generators and templates: `netplan` (the CMDB's network part, the vault's
/// and the PKI's commands), `plain` (no generator), and one `via-<generator>` per failure.
async fn publish(env: &CapiEnv, servers: &Servers, ca: &TestCa) {
    let generators: Api<BootstrapGenerator> = Api::all(env.client.clone());
    for object in servers.generators(ca) {
        create(&generators, &object).await;
    }
    let templates: Api<ClusterBootstrapTemplate> = Api::all(env.client.clone());
    let netplan_parts = vec![
        generated_part("network", "cmdb"),
        generated_part("register", "vault"),
        generated_part("pki", "pki"),
    ];
    create(&templates, &template("netplan", netplan_parts)).await;
    create(&templates, &template("plain", Vec::new())).await;
    for (_, generator, _) in FAILURES {
        let via = template(
            &format!("via-{generator}"),
            vec![generated_part("network", generator)],
        );
        create(&templates, &via).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generators_give_each_machine_its_part_and_failing_ones_block_only_their_configs() {
    let mut env = CapiEnv::start(Options::default()).await.unwrap();
    let ca = TestCa::new("generator test CA");
    let servers = Servers::start(&ca).await;
    publish(&env, &servers, &ca).await;
    env.provider_cluster(CLUSTER, KUBERNETES_VERSION, None)
        .await
        .unwrap();
    control_plane_secrets(&env, CLUSTER).await;
    // Before that, cp-1 would be the Cluster's first control-plane machine and render `init`.
    env.wait_control_plane_initialized(CLUSTER).await;
    for name in ["w-0", "w-1"] {
        machine(&env, name, false, "netplan").await;
    }
    machine(&env, "cp-1", true, "netplan").await;
    machine(&env, "p-0", false, "plain").await;
    for (name, generator, _) in FAILURES {
        machine(&env, name, false, &format!("via-{generator}")).await;
    }

    each_machine_gets_its_own_part(&env).await;
    failing_generators_block_only_their_configs(&env, &servers).await;
    generators_receive_only_what_they_are_granted(&env, &servers).await;
    generator_metrics_count_each_result(&env);
    a_fixed_generator_and_a_restart(&mut env, &servers).await;
}

/// The happy path: each machine gets its own static address, written in the template's format
/// beside the template's own files; the granted generators' commands follow. cp-1 renders as
/// the control-plane machine it is.
async fn each_machine_gets_its_own_part(env: &CapiEnv) {
    for (name, address) in [
        ("w-0", "10.1.0.10"),
        ("w-1", "10.1.0.11"),
        ("cp-1", "10.1.0.5"),
    ] {
        let user_data = env.wait_user_data(name).await;
        let files = written_files(env, name).await;
        assert_eq!(
            files.get("/etc/netplan/60-static.yaml").map(String::as_str),
            Some(netplan("ens3", address).as_str()),
            "{name}: its own netplan file, byte for byte"
        );
        let token = files["/etc/bootplate/probe"].trim_end();
        assert_eq!(
            token.len(),
            "token=".len() + 23,
            "{name}: a join token: {token}"
        );
        assert!(user_data.contains("echo vault-registered"), "{user_data}");
        assert!(user_data.contains("echo pki-checked"), "{user_data}");
    }
    let ready = env.ready_condition("cp-1").await;
    assert!(
        ready.message.contains("(role control-plane-join)"),
        "{}",
        ready.message
    );
    env.wait_user_data("p-0").await;
}

/// Each failing generator: a condition naming it and the cause, an Event, no data Secret, and
/// no token (a generator is called before any token is made); the failing one is asked again.
async fn failing_generators_block_only_their_configs(env: &CapiEnv, servers: &Servers) {
    for (name, generator, cause) in FAILURES {
        let message = env.wait_reason(name, "GeneratorFailed").await;
        assert!(
            message.contains(&format!("BootstrapGenerator {generator} "))
                && message.contains("spec.parts[1].generator")
                && message.contains(cause),
            "{name}: {message}"
        );
        assert!(
            env.data_secret(name).await.is_none(),
            "{name}: no data Secret"
        );
    }
    let event = events::wait_reason(&env.client, NS, "f-500", "GeneratorFailed").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(event.note.unwrap().contains("BootstrapGenerator err500"));
    let mut ready_uids = BTreeSet::new();
    for name in ["w-0", "w-1", "cp-1", "p-0"] {
        ready_uids.insert(env.config(name).await.uid().unwrap());
    }
    let token_owners: BTreeSet<String> = env
        .tokens()
        .await
        .iter()
        .map(|t| t.labels()["bootstrap.bootplate.dev/config-uid"].clone())
        .collect();
    assert_eq!(
        token_owners, ready_uids,
        "tokens exist for the ready configs only: a failing generator is called before any token"
    );

    // Retried with backoff: the failing generator is asked again without any change.
    eventually("err500 asked again", WAIT, || async {
        (servers.failing.count() >= 2).then_some(())
    })
    .await;
    for (server, name) in [
        (&servers.huge, "huge"),
        (&servers.bad_unit, "bad-unit"),
        (&servers.unknown, "unknown"),
        (&servers.slow, "slow"),
    ] {
        assert!(server.count() >= 1, "{name} was asked");
    }
}

/// What the generators received: the CMDB (no secrets granted) never a token or a key, even
/// for the control-plane machine whose own render has the keys; the vault the token only; the
/// PKI generator the keys for cp-1 only (so the CMDB's lack of them is not for lack of keys).
async fn generators_receive_only_what_they_are_granted(env: &CapiEnv, servers: &Servers) {
    let w0_token = written_files(env, "w-0").await["/etc/bootplate/probe"]
        .trim_end()
        .strip_prefix("token=")
        .unwrap()
        .to_owned();
    let (id, secret) = w0_token.split_once('.').unwrap();
    let token_secret = Api::<Secret>::namespaced(env.workload_client.clone(), "kube-system")
        .get(&format!("bootstrap-token-{id}"))
        .await
        .expect("w-0's token is a bootstrap token of the workload cluster");
    assert_eq!(
        token_secret.data.unwrap()["token-secret"].0,
        secret.as_bytes()
    );
    let cmdb_requests = servers.cmdb.received();
    let machines: BTreeSet<String> = cmdb_requests
        .iter()
        .map(|body| request_machine(body))
        .collect();
    assert!(
        machines.contains("cp-1") && machines.contains("w-0"),
        "{machines:?}"
    );
    for body in &cmdb_requests {
        let request: Value = serde_json::from_str(body).unwrap();
        assert_eq!(request["apiVersion"], "generator.bootplate.dev/v1alpha1");
        assert_eq!(request["kind"], "GeneratePartRequest");
        assert_eq!(request["template"]["part"], "network");
        assert_eq!(request["idempotencyKey"].as_str().unwrap().len(), 64);
        assert!(request["context"]["join"]["token"].is_null(), "{body}");
        assert!(request["context"]["certs"].is_null(), "{body}");
        assert!(!body.contains(&w0_token) && !body.contains("PRIVATE KEY"));
        assert!(!body.contains(secret), "not even the token's secret half");
    }
    let vault_requests = servers.vault.received();
    assert!(
        vault_requests.iter().any(|b| b.contains(&w0_token)),
        "the granted generator receives the real token"
    );
    assert!(vault_requests.iter().all(|b| !b.contains("PRIVATE KEY")));
    for body in servers.pki.received() {
        let keys = body.contains("PRIVATE KEY");
        assert_eq!(
            keys,
            request_machine(&body) == "cp-1",
            "keys for cp-1 only: {body:.200}"
        );
        let request: Value = serde_json::from_str(&body).unwrap();
        assert!(
            request["context"]["join"]["token"].is_null(),
            "the PKI generator gets no token"
        );
    }
}

/// The machine a generator request renders for.
fn request_machine(body: &str) -> String {
    let request: Value = serde_json::from_str(body).unwrap();
    request["context"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// bootplate's metrics count each generator's results and times its requests.
fn generator_metrics_count_each_result(env: &CapiEnv) {
    let metric = |series: &str| {
        env.bootplate
            .metric(series)
            .unwrap_or_else(|| panic!("no series {series} in bootplate's metrics"))
    };
    assert!(
        metric("bootplate_generator_requests_total{generator=\"cmdb\",result=\"success\"}") >= 3.0
    );
    for (generator, result) in [
        ("down", "unreachable"),
        ("slow", "timeout"),
        ("err500", "http_error"),
        ("huge", "too_large"),
        ("bad-unit", "invalid"),
        ("unknown", "invalid"),
    ] {
        let series = format!(
            "bootplate_generator_requests_total{{generator=\"{generator}\",result=\"{result}\"}}"
        );
        assert!(metric(&series) >= 1.0, "{series}");
    }
    assert!(
        metric("bootplate_generator_request_duration_seconds_count{generator=\"cmdb\"}") >= 3.0
    );
}

/// A fixed generator: the config using it becomes ready without a restart. Then resyncs and a
/// restart over ready configs call no generator again and rewrite no data Secret.
async fn a_fixed_generator_and_a_restart(env: &mut CapiEnv, servers: &Servers) {
    let fixed = json!({"spec": {"clientConfig": {"url": servers.cmdb.url}}});
    Api::<BootstrapGenerator>::all(env.client.clone())
        .patch("down", &PatchParams::default(), &Patch::Merge(&fixed))
        .await
        .unwrap();
    env.wait_user_data("f-down").await;
    assert_eq!(
        written_files(env, "f-down").await["/etc/netplan/60-static.yaml"],
        netplan("ens3", "10.1.0.20")
    );

    let ready = ["w-0", "w-1", "cp-1", "f-down"];
    for name in ready {
        env.settled(name).await;
    }
    let calls = |s: &Servers| (s.cmdb.count(), s.vault.count(), s.pki.count());
    let before = calls(servers);
    let secrets_before = secret_versions(env, &ready).await;
    env.restart_bootplate(&[], "restarted.log").await.unwrap();
    for name in ready {
        env.settled(name).await;
    }
    assert_eq!(
        calls(servers),
        before,
        "no generator call after the restart for unchanged inputs"
    );
    assert_eq!(
        secrets_before,
        secret_versions(env, &ready).await,
        "no data Secret rewritten"
    );
    assert!(env.config("p-0").await.status.unwrap().ready);
}

/// A served template for the offline test: the machine's name and a value in a file.
const SERVED: &str = r##"apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: netplan-generator
spec:
  os: {name: any}
  format: cloud-config
  variables:
  - {name: site, required: true}
  - {name: interface, required: true}
  parts:
  - name: netplan
    files:
    - path: /etc/netplan/60-{{values.interface}}.yaml
      permissions: "0600"
      content: "# {{machine.name}} in {{values.site}}\n"
    commands: [netplan apply]
"##;

/// The calling template: its `site` value and the part's `interface` parameter reach the
/// served template.
const CALLING: &str = r#"apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: calling
spec:
  os: {name: ubuntu, version: "24.04"}
  format: cloud-config
  variables:
  - {name: site, default: fra}
  parts:
  - name: network
    commands: ["echo {{shell_quote values.site}}"]
    generator:
      name: netgen
      parameters: {interface: ens3}
"#;

#[tokio::test]
async fn generator_serve_answers_render_and_lint_with_bootplates_own_engine() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("generator serve CA");
    let certs = dir.path().join("certs");
    ca.write_serving(&certs).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let served = write("served.yaml", SERVED);
    let calling = write("calling.yaml", CALLING);
    let port = testenv::free_port().unwrap();
    let bootplate = testenv::controller::binary().unwrap();
    let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
    let _server = KillOnDrop(
        std::process::Command::new(&bootplate)
            .args(["generator", "serve", "--template"])
            .arg(&served)
            .arg(format!("--addr=127.0.0.1:{port}"))
            .arg("--cert-dir")
            .arg(&certs)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let url = format!("netgen=https://127.0.0.1:{port}/");
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let run = |args: &[&str]| {
        std::process::Command::new(&bootplate)
            .args(args)
            .arg("--generator-ca")
            .arg(certs.join("ca.crt"))
            .output()
            .unwrap()
    };
    let (machine, cluster) = (
        examples.join("machine-worker.yaml"),
        examples.join("cluster.yaml"),
    );
    let render = |generators: &[&str]| {
        let mut args = vec![
            "render",
            "--template",
            calling.to_str().unwrap(),
            "--machine",
            machine.to_str().unwrap(),
            "--cluster",
            cluster.to_str().unwrap(),
        ];
        args.extend(generators);
        run(&args)
    };
    let out = eventually("bootplate generator serve answers", WAIT, || async {
        let out = render(&["--generator", &url]);
        out.status.success().then_some(out)
    })
    .await;
    let user_data = String::from_utf8(out.stdout).unwrap();
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(user_data.strip_prefix("#cloud-config\n").unwrap()).unwrap();
    let machine_name =
        serde_yaml::from_str::<serde_yaml::Value>(&std::fs::read_to_string(&machine).unwrap())
            .unwrap()["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
    let file = &yaml["write_files"][0];
    assert_eq!(file["path"], "/etc/netplan/60-ens3.yaml");
    assert_eq!(file["permissions"], "0600");
    assert_eq!(
        file["content"].as_str().unwrap(),
        format!("# {machine_name} in fra\n")
    );
    let runcmd = serde_yaml::to_string(&yaml["runcmd"]).unwrap();
    assert!(
        runcmd.find("fra").unwrap() < runcmd.find("netplan apply").unwrap(),
        "{runcmd}"
    );

    // Without the generator, render says which flag is missing.
    let missing = render(&[]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("spec.parts[0].generator") && stderr.contains("--generator netgen=URL"),
        "{stderr}"
    );

    // lint: unchecked without --generator (a warning), clean with it, an error when the
    // generator fails (the served template lacks a variable the request does not bring).
    let lint = |extra: &[&str]| {
        let mut args = vec!["lint", "--format", "short", calling.to_str().unwrap()];
        args.extend(extra);
        run(&args)
    };
    let unchecked = lint(&[]);
    let stdout = String::from_utf8_lossy(&unchecked.stdout);
    assert_eq!(unchecked.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("warning: spec.parts[0].generator: part `network` takes content from BootstrapGenerator netgen, whose answers are not checked"), "{stdout}");
    let checked = lint(&["--generator", &url]);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert_eq!(checked.status.code(), Some(0), "{stdout}");
    assert!(stdout.trim().is_empty(), "{stdout}");
    let without_parameter = CALLING.replace("parameters: {interface: ens3}", "parameters: {}");
    let broken = write("broken.yaml", &without_parameter);
    let out = run(&[
        "lint",
        "--format",
        "short",
        broken.to_str().unwrap(),
        "--generator",
        &url,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("error: spec.parts[0].generator: BootstrapGenerator netgen")
            && stdout.contains("the generator refused")
            && stdout.contains("interface"),
        "{stdout}"
    );
}

/// A child process killed when the test ends, also when it fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_python_example_of_docs_generators_md_serves_bootplate_render() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/generators.md"),
    )
    .unwrap();
    let example = doc
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/generators.md has a python example");
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("python example CA");
    let certs = dir.path().join("certs");
    ca.write_serving(&certs).unwrap();
    let script = dir.path().join("generator.py");
    std::fs::write(&script, example).unwrap();
    let port = testenv::free_port().unwrap();
    // python3 comes with cloud-init, which tests/scripts/install-tools.sh installs.
    let _server = KillOnDrop(
        std::process::Command::new("python3")
            .arg(&script)
            .env("PORT", port.to_string())
            .env("TLS_DIR", &certs)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("python.log")).unwrap())
            .spawn()
            .expect("python3 runs"),
    );
    let template = dir.path().join("calling.yaml");
    std::fs::write(
        &template,
        CALLING
            .replace("name: netgen", "name: cmdb")
            .replace("echo {{shell_quote values.site}}", "echo ok"),
    )
    .unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let machine = dir.path().join("machine.yaml");
    let worker = std::fs::read_to_string(examples.join("machine-worker.yaml")).unwrap();
    let render = |machine_name: &str| {
        std::fs::write(
            &machine,
            worker.replace("name: demo-md-0-abcde", &format!("name: {machine_name}")),
        )
        .unwrap();
        std::process::Command::new(testenv::controller::binary().unwrap())
            .arg("render")
            .arg("--template")
            .arg(&template)
            .arg("--machine")
            .arg(&machine)
            .arg("--cluster")
            .arg(examples.join("cluster.yaml"))
            .arg("--generator")
            .arg(format!("cmdb=https://127.0.0.1:{port}/"))
            .arg("--generator-ca")
            .arg(certs.join("ca.crt"))
            .output()
            .unwrap()
    };
    let out = eventually("the python generator answers", WAIT, || async {
        let out = render("w-1");
        out.status.success().then_some(out)
    })
    .await;
    let user_data = String::from_utf8(out.stdout).unwrap();
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(user_data.strip_prefix("#cloud-config\n").unwrap()).unwrap();
    assert_eq!(
        yaml["write_files"][0]["path"],
        "/etc/netplan/60-static.yaml"
    );
    assert_eq!(
        yaml["write_files"][0]["content"].as_str().unwrap(),
        "network:\n  version: 2\n  ethernets:\n    ens3:\n      addresses: [10.1.0.11/24]\n"
    );
    let refused = render("w-9");
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("BootstrapGenerator cmdb")
            && stderr.contains("the generator refused: no address for machine w-9"),
        "{stderr}"
    );
}
