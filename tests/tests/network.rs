//! The network input (`spec.network`, docs/air-gapped.md) on a real restricted network, on
//! loopback: distribution's registry as the mirror (TLS from a test CA), containerd run with
//! the node's rendered `/etc/containerd/config.toml` resolving `registry.k8s.io` images through
//! the `hosts.toml` and CA that part `network` of a shipped template writes, the agent applying
//! a CA rollover and a new mirror in place, and a forward proxy that sees part `artifacts`'
//! downloads and not the `noProxy` destinations. See `testenv::mirror` for how the rendered
//! scripts run under a node root.
//!
//! Every pull goes the kubelet's way: `crictl pull` through containerd's CRI plugin, which
//! resolves with the `config_path` of the rendered configuration (not a client-side
//! `ctr --hosts-dir`, which would prove nothing of that configuration). The node's `/etc/hosts`
//! names no real registry and it has no DNS: the mirror is the only way to an image.

use crd_types::payload::NodePayload;
use serde_json::{Value, json};
use testenv::agent::Workload;
use testenv::mirror::{ChrootNode, NodeContainerd, Registry, part, render_parts};

/// The mirror's path prefix: `registry.k8s.io/NAME` is `REGISTRY/v2/mirror/NAME`.
const MIRROR_PATH: &str = "mirror";

/// The pause image's archive and the `registry.k8s.io` reference it carries.
fn pause_image() -> (std::path::PathBuf, String) {
    let archive = testenv::images::archive("pause").unwrap();
    let reference = testenv::pod_cluster::images::reference_of(&archive).unwrap();
    assert!(reference.starts_with("registry.k8s.io/"), "{reference}");
    (archive, reference)
}

/// A registry holding the pause image under the mirror path.
fn mirror(ca_name: &str) -> Registry {
    let registry = Registry::start(ca_name, &[]).unwrap();
    let (archive, reference) = pause_image();
    let name = reference.trim_start_matches("registry.k8s.io/");
    registry
        .push(&archive, &format!("{MIRROR_PATH}/{name}"))
        .unwrap();
    registry
}

/// Where the network input puts the mirror's CA: nowhere, on the mirror endpoint (its file
/// named in `hosts.toml`), or in the trust store (CA bundle `corp`).
#[derive(Clone, Copy, PartialEq)]
enum CaIn {
    Nowhere,
    Endpoint,
    TrustStore,
}

/// The network input with `registry` as the one mirror of `registry.k8s.io`, its CA `ca`.
fn mirror_input(registry: &Registry, ca: CaIn) -> Value {
    let url = format!("https://127.0.0.1:{}/v2/{MIRROR_PATH}", registry.port);
    let mut endpoint = json!({"url": url, "overridePath": true});
    let mut input = json!({"registryMirrors": [{"registry": "registry.k8s.io"}]});
    match ca {
        CaIn::Nowhere => {}
        CaIn::Endpoint => endpoint["ca"] = json!({"inline": registry.ca.cert_pem}),
        CaIn::TrustStore => {
            input["caBundles"] = json!([{"name": "corp", "inline": registry.ca.cert_pem}]);
        }
    }
    input["registryMirrors"][0]["endpoints"] = json!([endpoint]);
    input
}

/// The agent's apply code applies part `network` of the template's render for `network` on
/// `node`.
fn apply_network(node: &ChrootNode, network: Value) {
    let payload = network_payload(network);
    assert_eq!(payload.parts.len(), 1, "part network is InPlace");
    node.agent()
        .apply(&payload)
        .unwrap_or_else(|e| panic!("the agent could not apply part network: {e}"));
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The manifest requests `registry` has served so far.
fn manifest_requests(registry: &Registry) -> usize {
    (registry.requests().iter())
        .filter(|r| r.contains(&format!("/v2/{MIRROR_PATH}/pause/manifests/")))
        .count()
}

/// Pulls `reference` through `containerd`'s CRI plugin (the image removed first); panics unless
/// it is pulled and `registry` served its manifest.
fn pull_through(containerd: &NodeContainerd, registry: &Registry, reference: &str) {
    let _ = containerd.crictl(&["rmi", reference]);
    let before = manifest_requests(registry);
    let out = containerd.crictl(&["pull", reference]).unwrap();
    assert!(out.status.success(), "the pull failed: {}", stderr(&out));
    assert!(
        manifest_requests(registry) > before,
        "not through the mirror"
    );
    let images = containerd.images().unwrap();
    assert!(images.iter().any(|i| i == reference), "{images:?}");
}

/// A node with the `/etc/containerd/config.toml` part `configure` of the template renders.
fn node_with_containerd_config() -> ChrootNode {
    let node = ChrootNode::new(&[]).unwrap();
    let path = "/etc/containerd/config.toml";
    let configure = part(&render_parts(json!({})).unwrap(), "configure").unwrap();
    let file = (configure.files.iter().find(|f| f.path == path))
        .unwrap_or_else(|| panic!("part configure writes no {path}"));
    let text = String::from_utf8(file.content.clone()).unwrap();
    assert!(
        text.contains("config_path = \"/etc/containerd/certs.d\""),
        "{text}"
    );
    node.write(path, &text).unwrap();
    node
}

/// Restarts `containerd` when the scripts run on `node` since the last call asked systemd to.
fn restart_if_asked(node: &ChrootNode, containerd: &mut NodeContainerd) {
    let calls = node.take_script_systemctl_calls();
    if calls.iter().any(|c| c == "restart containerd") {
        containerd.restart().unwrap();
    }
}

/// The mirror drill: containerd (its own root, state and socket) configured only by the
/// rendered `config.toml` and what part `network` wrote (`hosts.toml` under `config_path`, the
/// endpoint's CA file, the trust store) pulls `registry.k8s.io/pause` from the registry's
/// mirror path through its CRI plugin, trusting the mirror through the endpoint's CA and,
/// apart, through the trust store (containerd restarted as the part asks, to read it); with
/// no CA in the input the same pull fails on the certificate.
#[test]
fn containerd_pulls_through_the_rendered_mirror_and_not_without_its_ca() {
    let registry = mirror("mirror-ca");
    let (_, reference) = pause_image();
    let node = node_with_containerd_config();
    apply_network(&node, mirror_input(&registry, CaIn::Nowhere));
    let mut containerd = NodeContainerd::start(&node).unwrap();

    let out = containerd.crictl(&["pull", &reference]).unwrap();
    assert!(!out.status.success(), "pulled without the mirror's CA");
    assert!(
        stderr(&out).contains("x509: certificate signed by unknown authority"),
        "{}",
        stderr(&out)
    );

    apply_network(&node, mirror_input(&registry, CaIn::Endpoint));
    restart_if_asked(&node, &mut containerd);
    pull_through(&containerd, &registry, &reference);
    let dir = "/etc/containerd/certs.d/registry.k8s.io";
    let hosts = node.read(&format!("{dir}/hosts.toml")).unwrap();
    assert!(
        hosts.contains(&format!("ca = \"{dir}/mirror-0-ca.crt\"")),
        "{hosts}"
    );

    apply_network(&node, mirror_input(&registry, CaIn::TrustStore));
    assert!(
        !node
            .read(&format!("{dir}/hosts.toml"))
            .unwrap()
            .contains("ca =")
    );
    restart_if_asked(&node, &mut containerd);
    pull_through(&containerd, &registry, &reference);
}

/// The network input a site rolls over to: `registry` as the mirror, its CA on the endpoint
/// and as CA bundle `corp`.
fn site_input(registry: &Registry) -> Value {
    let mut input = mirror_input(registry, CaIn::Endpoint);
    input["caBundles"] = json!([{"name": "corp", "inline": registry.ca.cert_pem}]);
    input
}

/// Part `network` of the render for `network` alone: what bootplate publishes for the node
/// when only that part is `InPlace` and changed (the other parts' commands need a whole
/// machine).
fn network_payload(network: Value) -> NodePayload {
    let payload = render_parts(network).unwrap().payload();
    NodePayload {
        parts: (payload.parts.into_iter())
            .filter(|p| p.name == "network")
            .collect(),
    }
}

/// Publishes `network`'s payload for Node `node-a` of `w` and runs one pass of its agent.
async fn publish_and_pass(w: &Workload, agent: &agent::watch::Agent, network: Value) {
    let payload = network_payload(network);
    let revision = testenv::agent::publish(&w.admin, "node-a", "config-uid", &payload)
        .await
        .unwrap();
    let pass = agent.pass().await.unwrap();
    assert_eq!(pass, agent::watch::Pass::Applied(revision));
}

/// In place, on the agent tier (a workload apiserver, the node's payload Secret, the agent with
/// the node's identity): a running node pulls through mirror `old` (CA `corp-2026`); the input
/// changes to mirror `new` on another port with another CA (`corp-2027`, on the endpoint and in
/// the trust store). The render changes part `network` alone, the agent applies it: the trust
/// store and `hosts.toml` hold only the new CA and endpoint, containerd alone is restarted, and
/// the next pull through the CRI plugin (containerd restarted as the part asked) is served by
/// the new mirror (the old one is stopped).
#[tokio::test]
async fn a_ca_rollover_and_a_new_mirror_reach_a_running_node_in_place() {
    let (old, new) = (mirror("corp-2026"), mirror("corp-2027"));
    let (_, reference) = pause_image();
    let node = node_with_containerd_config();
    let w = Workload::start(&["node-a"]).await.unwrap();
    let agent = agent::watch::Agent {
        identity: w.node_client("node-a").await.unwrap().into(),
        node_name: "node-a".into(),
        node: node.agent(),
    };
    publish_and_pass(&w, &agent, site_input(&old)).await;
    let mut containerd = NodeContainerd::start(&node).unwrap();
    pull_through(&containerd, &old, &reference);
    node.take_script_systemctl_calls();
    node.disk.take_systemctl_calls();

    let plan = (render_parts(site_input(&new)).unwrap())
        .update_from(&render_parts(site_input(&old)).unwrap());
    let network = render::UpdatePlan::InPlace {
        parts: vec!["network".to_owned()],
    };
    assert_eq!(plan, network);
    publish_and_pass(&w, &agent, site_input(&new)).await;
    check_rolled_over(&node, &old, &new);

    // The part asked for containerd's restart (checked above): what systemd would do.
    containerd.restart().unwrap();
    drop(old);
    pull_through(&containerd, &new, &reference);
}

/// The node trusts only `new`'s CA and resolves through `new` alone; the only acting systemctl
/// call was containerd's restart.
fn check_rolled_over(node: &ChrootNode, old: &Registry, new: &Registry) {
    let anchor = node.read("/.usr-local/share/ca-certificates/bootplate-corp.crt");
    assert_eq!(anchor.as_deref(), Some(new.ca.cert_pem.as_str()));
    let bundle = node.read("/etc/ssl/certs/ca-certificates.crt").unwrap();
    assert!(
        bundle.contains(new.ca.cert_pem.trim()),
        "new CA not trusted"
    );
    assert!(
        !bundle.contains(old.ca.cert_pem.trim()),
        "old CA still trusted"
    );
    let dir = "/etc/containerd/certs.d/registry.k8s.io";
    let hosts = node.read(&format!("{dir}/hosts.toml")).unwrap();
    assert!(
        hosts.contains(&format!("127.0.0.1:{}/", new.port)),
        "{hosts}"
    );
    assert!(
        !hosts.contains(&format!("127.0.0.1:{}/", old.port)),
        "{hosts}"
    );
    let ca = node.read(&format!("{dir}/mirror-0-ca.crt"));
    assert_eq!(ca.as_deref(), Some(new.ca.cert_pem.as_str()));
    let calls = node.take_script_systemctl_calls();
    let acting: Vec<&String> = (calls.iter())
        .filter(|c| !c.starts_with("is-active"))
        .collect();
    assert_eq!(acting, ["restart containerd"], "{calls:?}");
    assert_eq!(node.disk.take_systemctl_calls(), Vec::<String>::new());
}

/// The digest (hex) and content of the pause image's config blob, a blob the registry serves
/// at `/v2/NAME/blobs/sha256:DIGEST` once the image is pushed: a download with a known sha256.
fn config_blob(archive: &std::path::Path) -> (String, Vec<u8>) {
    let member = |path: &str| {
        let out = std::process::Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{path}: {}", stderr(&out));
        out.stdout
    };
    let blob = |digest: &str| member(&format!("blobs/sha256/{}", &digest["sha256:".len()..]));
    let index: Value = serde_json::from_slice(&member("index.json")).unwrap();
    let manifest: Value =
        serde_json::from_slice(&blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    let digest = manifest["config"]["digest"].as_str().unwrap().to_owned();
    let content = blob(&digest);
    (digest["sha256:".len()..].to_owned(), content)
}

/// The proxy drill: part `network` writes the proxy environment, part `artifacts` downloads two
/// files with the real curl and sha256sum. The one from `files.corp.test` (a name only the
/// proxy resolves) goes through the forward proxy; the one from `files.internal.test` (the
/// node's own /etc/hosts, `noProxy: [.internal.test]`) goes straight to the server. The proxy
/// sees the first and nothing else; both are installed.
#[test]
fn artifact_downloads_go_through_the_proxy_and_no_proxy_destinations_do_not() {
    let files = Registry::start("files-ca", &["files.corp.test", "files.internal.test"]).unwrap();
    let (archive, _) = pause_image();
    files.push(&archive, "k8s/pause:1").unwrap();
    let (sha256, content) = config_blob(&archive);
    let proxy = testenv::mirror::ForwardProxy::start(&["files.corp.test"]).unwrap();
    let url = |host: &str| {
        format!(
            "https://{host}:{}/v2/k8s/pause/blobs/sha256:{sha256}",
            files.port
        )
    };
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
    let input = json!({
        "proxy": {"http": proxy_url, "https": proxy_url, "noProxy": [".internal.test"]},
        "caBundles": [{"name": "files", "inline": files.ca.cert_pem}],
        "artifacts": [
            {"name": "kubeadm", "url": url("files.corp.test"), "sha256": sha256},
            {"name": "kubectl", "url": url("files.internal.test"), "sha256": sha256},
        ],
    });
    let node = ChrootNode::new(&["127.0.0.1 files.internal.test"]).unwrap();
    let parts = render_parts(input).unwrap();
    for name in ["network", "artifacts"] {
        for command in part(&parts, name).unwrap().commands {
            let out = node.run(&command).unwrap();
            assert!(out.status.success(), "part {name}: {}", stderr(&out));
        }
    }
    assert_eq!(proxy.seen(), [format!("files.corp.test:{}", files.port)]);
    for binary in ["kubeadm", "kubectl"] {
        let installed = std::fs::read(node.disk.path(&format!("/.usr-local/bin/{binary}")));
        assert_eq!(installed.ok().as_ref(), Some(&content), "{binary}");
    }
}
