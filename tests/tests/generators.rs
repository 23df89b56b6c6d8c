//! External generators against a real apiserver, with real HTTPS generator servers in the test
//! (certificates from a test CA that the BootstrapGenerators' caBundle names): a CMDB gives each
//! machine its own static-IP netplan file; generators that are down, slow, failing, oversized
//! or malformed each block only their own configs, with a condition naming the generator and
//! the cause and no bootstrap token; a restart over ready configs calls no generator; a
//! generator not granted secrets never receives a token or a key.
//!
//! Without Cluster API's manager: the test plays it (`testenv::capi_env`: owner references, an
//! initialized Cluster) only to set the stage; the faults are the generators'. It counts the
//! calls each generator received per render and across a restart, which needs no Cluster API
//! timing; moving it under the real manager is left for later (issue 29).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use crd_types::{
    BootstrapGenerator, ClientConfig, ClusterBootstrapTemplate, ClusterBootstrapTemplateSpec,
    GeneratorSecrets, GeneratorSpec, OsInfo, OutputFormat, Part, PartGenerator, TemplateFile,
    TemplateSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use testenv::capi_env::{Env, NS, WAIT, cluster_template, env};
use testenv::eventually;
use testenv::generator::{GeneratorServer, Reply};
use testenv::pki::TestCa;

/// The CMDB's addresses, by machine name.
const ADDRESSES: [(&str, &str); 4] = [
    ("w-0", "10.1.0.10"),
    ("w-1", "10.1.0.11"),
    ("cp-1", "10.1.0.5"),
    ("f-down", "10.1.0.20"),
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

fn generator(name: &str, url: &str, ca: &TestCa, secrets: GeneratorSecrets) -> BootstrapGenerator {
    BootstrapGenerator::new(
        name,
        GeneratorSpec {
            client_config: ClientConfig {
                url: Some(url.to_owned()),
                ca_bundle: Some(ca.cert_pem.clone()),
                ..Default::default()
            },
            timeout_seconds: Some(1),
            secrets,
            allowed_namespaces: vec![NS.to_owned()],
            ..Default::default()
        },
    )
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
async fn written_files(env: &Env, name: &str) -> BTreeMap<String, String> {
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
async fn secret_versions(env: &Env, names: &[&str]) -> Vec<String> {
    let mut versions = Vec::new();
    for name in names {
        versions.push(env.secret(name).await.unwrap().resource_version().unwrap());
    }
    versions
}

/// The remaining CA Secrets a control-plane-join machine reads (`-ca` comes with the Cluster).
async fn control_plane_secrets(env: &Env, cluster: &str) {
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
        let secret = Secret {
            metadata: testenv::fixtures::cluster_secret_meta(NS, cluster, purpose),
            string_data: Some(BTreeMap::from([
                ("tls.crt".to_owned(), pair.cert),
                ("tls.key".to_owned(), pair.key),
            ])),
            type_: Some("cluster.x-k8s.io/secret".into()),
            ..Default::default()
        };
        create(&Api::<Secret>::namespaced(env.client.clone(), NS), &secret).await;
    }
}

#[tokio::test]
async fn generators_give_each_machine_its_part_and_failing_ones_block_only_their_configs() {
    let env = env().await;
    let ca = TestCa::new("generator test CA");
    let cmdb_server = GeneratorServer::start(&ca, cmdb).await;
    // A token-granted generator, to show who gets what: it answers with a harmless command.
    let vault = GeneratorServer::start(&ca, |_| {
        Reply::success(json!({"commands": ["echo vault-registered"]}))
    })
    .await;
    let slow = GeneratorServer::start(&ca, |request| Reply {
        delay: Duration::from_secs(5),
        ..cmdb(request)
    })
    .await;
    let failing = GeneratorServer::start(&ca, |_| Reply {
        status: 500,
        body: Bytes::from_static(b"internal error"),
        delay: Duration::ZERO,
    })
    .await;
    let huge_body = Bytes::from(vec![b' '; 50 << 20]);
    let huge = GeneratorServer::start(&ca, move |_| Reply {
        status: 200,
        body: huge_body.clone(),
        delay: Duration::ZERO,
    })
    .await;
    let bad_unit = GeneratorServer::start(&ca, |_| {
        Reply::success(
            json!({"units": [{"name": "../../etc/passwd", "content": "root::0:0::/:/bin/sh\n"}]}),
        )
    })
    .await;
    let unknown = GeneratorServer::start(&ca, |_| {
        Reply::success(json!({"files": [], "hostname": "w-9"}))
    })
    .await;
    let down_url = format!("https://127.0.0.1:{}/", testenv::free_port().unwrap());

    let generators: Api<BootstrapGenerator> = Api::all(env.client.clone());
    let none = GeneratorSecrets::default();
    let token = GeneratorSecrets {
        join_token: true,
        certificates: false,
    };
    for object in [
        generator("cmdb", &cmdb_server.url, &ca, none),
        generator("vault", &vault.url, &ca, token),
        generator("slow", &slow.url, &ca, none),
        generator("err500", &failing.url, &ca, none),
        generator("huge", &huge.url, &ca, none),
        generator("bad-unit", &bad_unit.url, &ca, none),
        generator("unknown", &unknown.url, &ca, none),
        generator("down", &down_url, &ca, none),
    ] {
        create(&generators, &object).await;
    }
    let templates: Api<ClusterBootstrapTemplate> = Api::all(env.client.clone());
    let netplan_parts = vec![
        generated_part("network", "cmdb"),
        generated_part("register", "vault"),
    ];
    create(&templates, &template("netplan", netplan_parts)).await;
    create(&templates, &template("plain", Vec::new())).await;
    let failures = [
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
    for (_, generator, _) in failures {
        let via = format!("via-{generator}");
        create(
            &templates,
            &template(&via, vec![generated_part("network", generator)]),
        )
        .await;
    }

    env.initialized_cluster("c1").await;
    control_plane_secrets(&env, "c1").await;
    let controller = env.controller(&[]).await;
    for name in ["w-0", "w-1"] {
        env.machine("c1", name, false, cluster_template("netplan"))
            .await;
    }
    env.machine("c1", "cp-1", true, cluster_template("netplan"))
        .await;
    env.machine("c1", "p-0", false, cluster_template("plain"))
        .await;
    for (name, generator, _) in failures {
        let via = format!("via-{generator}");
        env.machine("c1", name, false, cluster_template(&via)).await;
    }

    // The happy path: each machine gets its own static address, written in the template's
    // format beside the template's own files; the token-granted generator's command follows.
    for (name, address) in [
        ("w-0", "10.1.0.10"),
        ("w-1", "10.1.0.11"),
        ("cp-1", "10.1.0.5"),
    ] {
        env.wait_ready(name).await;
        let files = written_files(&env, name).await;
        assert_eq!(
            files.get("/etc/netplan/60-static.yaml").map(String::as_str),
            Some(netplan("ens3", address).as_str()),
            "{name}: its own netplan file, byte for byte"
        );
        assert!(files["/etc/bootplate/probe"].starts_with("token="));
        assert!(env.user_data(name).await.contains("echo vault-registered"));
    }
    env.wait_ready("p-0").await;

    // Each failing generator: a condition naming it and the cause, an Event, no token.
    for (name, generator, cause) in failures {
        let message = env.wait_reason(name, "GeneratorFailed").await;
        assert!(
            message.contains(&format!("BootstrapGenerator {generator} "))
                && message.contains("spec.parts[1].generator")
                && message.contains(cause),
            "{name}: {message}"
        );
        assert!(env.secret(name).await.is_none(), "{name}: no data Secret");
    }
    let event = eventually("a GeneratorFailed Event for f-500", WAIT, || async {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client.clone(), NS)
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("GeneratorFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("f-500")
            })
    })
    .await;
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
        (failing.count() >= 2).then_some(())
    })
    .await;
    assert!(huge.count() >= 1 && bad_unit.count() >= 1 && unknown.count() >= 1);

    // What the generators received: the CMDB (no secrets granted) never a token or a key, even
    // for the control-plane machine whose own render has the keys; the vault the token only.
    let user_data = env.user_data("w-0").await;
    let w0_token = user_data
        .lines()
        .find_map(|l| l.trim().strip_prefix("token="))
        .unwrap()
        .to_owned();
    assert_eq!(w0_token.len(), 23, "a real token in w-0's user-data");
    assert!(env.user_data("cp-1").await.contains("token="));
    let cmdb_requests = cmdb_server.received();
    assert!(cmdb_requests.len() >= 3, "{}", cmdb_requests.len());
    for body in &cmdb_requests {
        let request: Value = serde_json::from_str(body).unwrap();
        assert_eq!(request["apiVersion"], "generator.bootplate.dev/v1alpha1");
        assert_eq!(request["kind"], "GeneratePartRequest");
        assert_eq!(request["template"]["part"], "network");
        assert_eq!(request["idempotencyKey"].as_str().unwrap().len(), 64);
        assert!(request["context"]["join"]["token"].is_null(), "{body}");
        assert!(request["context"]["certs"].is_null(), "{body}");
        assert!(!body.contains(&w0_token) && !body.contains("PRIVATE KEY"));
        assert!(
            !body.contains(&w0_token[7..]),
            "not even the token's secret half"
        );
    }
    let vault_requests = vault.received();
    assert!(
        vault_requests.iter().any(|b| b.contains(&w0_token)),
        "the granted generator receives the real token"
    );
    assert!(vault_requests.iter().all(|b| !b.contains("PRIVATE KEY")));

    let metric = |series: &str| controller.metric(series).unwrap_or(0.0);
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

    // A fixed generator: the config using it becomes ready without a restart.
    let fixed = json!({"spec": {"clientConfig": {"url": cmdb_server.url}}});
    generators
        .patch("down", &PatchParams::default(), &Patch::Merge(&fixed))
        .await
        .unwrap();
    env.wait_ready("f-down").await;
    assert_eq!(
        written_files(&env, "f-down").await["/etc/netplan/60-static.yaml"],
        netplan("ens3", "10.1.0.20")
    );

    // Resyncs and a restart over ready configs call no generator again.
    let ready = ["w-0", "w-1", "cp-1", "f-down"];
    for name in ready {
        env.settled(&controller, name).await;
    }
    let (cmdb_before, vault_before) = (cmdb_server.count(), vault.count());
    let mut controller = controller;
    controller.terminate().unwrap();
    let secrets_before = secret_versions(&env, &ready).await;
    let restarted = env.controller(&[]).await;
    for name in ready {
        env.settled(&restarted, name).await;
    }
    assert_eq!(
        (cmdb_server.count(), vault.count()),
        (cmdb_before, vault_before),
        "no generator call after the restart for unchanged inputs"
    );
    assert_eq!(
        secrets_before,
        secret_versions(&env, &ready).await,
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
