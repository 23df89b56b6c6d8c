//! bootplate-agent as the tests run it: the real binary (`target/<profile>/bootplate-agent`),
//! with a node's own identity (a client certificate for `system:node:<name>` in `system:nodes`,
//! what a kubelet has), applying into a directory root with a systemctl stub that records its
//! arguments.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;

use crate::ApiServer;
use crate::capi::Process;
use crate::pki::TestCa;

/// A payload of one part, `configure`: the file `/etc/containerd/mirror.toml` (`mirror`, mode
/// 0600), `containerd.service` enabled (restarted when the file changes), and one command.
pub fn configure_payload(mirror: &str, command: &str) -> crd_types::payload::NodePayload {
    use crd_types::payload::{NodePayload, PayloadFile, PayloadPart, PayloadUnit};
    NodePayload {
        parts: vec![PayloadPart {
            name: "configure".into(),
            files: vec![PayloadFile {
                path: "/etc/containerd/mirror.toml".into(),
                permissions: "0600".into(),
                owner: "root:root".into(),
                content: mirror.as_bytes().to_vec(),
            }],
            units: vec![PayloadUnit {
                name: "containerd.service".into(),
                enable: true,
                content: None,
                drop_ins: vec![],
            }],
            commands: vec![command.into()],
        }],
    }
}

/// A workload apiserver as kubeadm sets one up (Node and RBAC authorization), its CA, an admin
/// client, and the Node objects the agents report on.
pub struct Workload {
    pub apiserver: ApiServer,
    pub ca: TestCa,
    pub admin: kube::Client,
}

impl Workload {
    /// Starts the apiserver and creates a Node for each of `nodes`.
    pub async fn start(nodes: &[&str]) -> anyhow::Result<Workload> {
        use k8s_openapi::api::core::v1::Node;
        let ca = TestCa::new("workload-ca");
        let apiserver = ApiServer::start_for_joins(&ca).await?;
        let admin = apiserver.client().await?;
        let api: kube::Api<Node> = kube::Api::all(admin.clone());
        for name in nodes {
            let node: Node = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name }
            }))?;
            api.create(&Default::default(), &node).await?;
        }
        Ok(Workload {
            apiserver,
            ca,
            admin,
        })
    }

    /// A client with the identity of node `node`.
    pub async fn node_client(&self, node: &str) -> anyhow::Result<kube::Client> {
        node_client(self.apiserver.port(), &self.ca, node).await
    }
}

/// A kubeconfig for the apiserver on `port` (signed by `ca`) with the identity of node `node`.
pub fn node_kubeconfig(port: u16, ca: &TestCa, node: &str) -> String {
    let leaf = ca.client(&format!("system:node:{node}"), "system:nodes");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: w\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {}\nusers:\n- name: n\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: c\n  context: {{cluster: w, user: n}}\ncurrent-context: c\n",
        b64(&ca.cert_pem),
        b64(&leaf.cert_pem),
        b64(&leaf.key_pem),
    )
}

/// A client of the apiserver on `port` (signed by `ca`) with the identity of node `node`.
pub async fn node_client(port: u16, ca: &TestCa, node: &str) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&node_kubeconfig(port, ca, node))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Publishes `payload` for Node `node` as bootplate does (bound to the Node's UID and provider
/// ID as `admin` reads them now, labelled with config `config_uid`); returns its revision.
pub async fn publish(
    admin: &kube::Client,
    node: &str,
    config_uid: &str,
    payload: &crd_types::payload::NodePayload,
) -> anyhow::Result<String> {
    use bootplate::k8s::node_payload::{Target, publish};
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin.clone());
    let found = nodes.get(node).await?;
    Ok(publish(admin, &Target::new(&found, config_uid), payload, None).await?)
}

/// Asserts that `client`, with node `node`'s identity, reads that node's payload Secret and is
/// refused (403) node `other`'s and the list of Secrets; returns its own Secret.
pub async fn assert_reads_only_its_own_payload(
    client: kube::Client,
    node: &str,
    other: &str,
) -> k8s_openapi::api::core::v1::Secret {
    use crd_types::payload::secret_name;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client, "kube-system");
    let own = secrets
        .get(&secret_name(node))
        .await
        .unwrap_or_else(|e| panic!("node {node} cannot read its own payload: {e}"));
    for denied in [
        secrets.get(&secret_name(other)).await.map(|_| ()),
        secrets.list(&Default::default()).await.map(|_| ()),
    ] {
        match denied {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
            other => panic!("node {node} read what is not its own: {other:?}"),
        }
    }
    own
}

/// A node's disk: a directory root, and a systemctl stub logging each call's arguments (and
/// failing, with `unit failed` on stderr, for the arguments [`NodeDisk::fail_systemctl_on`]
/// names).
pub struct NodeDisk {
    dir: tempfile::TempDir,
}

impl NodeDisk {
    /// An empty root and the stub.
    pub fn new() -> anyhow::Result<NodeDisk> {
        let dir = tempfile::tempdir()?;
        let stub = dir.path().join("systemctl");
        let d = dir.path().display();
        std::fs::write(
            &stub,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{d}/systemctl.log'\n\
                 [ \"$*\" = \"$(cat '{d}/fail-on' 2>/dev/null)\" ] && {{ echo 'unit failed' >&2; exit 1; }}\n\
                 exit 0\n"
            ),
        )?;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755))?;
        std::fs::create_dir(dir.path().join("root"))?;
        Ok(NodeDisk { dir })
    }

    /// The directory the node's `/` is.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The stub's path.
    pub fn systemctl(&self) -> PathBuf {
        self.dir.path().join("systemctl")
    }

    /// The node path `path` (absolute) under the root.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root().join(path.trim_start_matches('/'))
    }

    /// From now on the systemctl stub fails for `args` (`""`: for none).
    pub fn fail_systemctl_on(&self, args: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.path().join("fail-on"), args)
    }

    /// The agent's view of this disk: its root, the stub, `sh`, the default command timeout.
    pub fn node(&self) -> agent::Node {
        agent::Node {
            systemctl: self.systemctl().into(),
            ..agent::Node::at(self.root())
        }
    }

    /// The systemctl calls so far, one per line, and forgets them.
    pub fn take_systemctl_calls(&self) -> Vec<String> {
        let log = self.dir.path().join("systemctl.log");
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        calls.lines().map(str::to_owned).collect()
    }
}

/// A running bootplate-agent for node `node` (killed on drop).
pub struct AgentProcess {
    _process: Process,
}

impl AgentProcess {
    /// Starts the agent for `node` against the apiserver on `port`, applying every `interval`
    /// into `on` (its root, its systemctl and the shell its commands run in: a [`NodeDisk`]'s
    /// [`NodeDisk::node`], or a chrooted node's); its kubeconfig and log go to `dir`.
    pub fn start(
        dir: &Path,
        port: u16,
        ca: &TestCa,
        node: &str,
        on: &agent::Node,
        interval: &str,
    ) -> anyhow::Result<AgentProcess> {
        let kubeconfig = dir.join(format!("{node}.kubeconfig"));
        std::fs::write(&kubeconfig, node_kubeconfig(port, ca, node))?;
        let binary = crate::controller::workspace_binary("bootplate-agent")?;
        let process = Process::spawn(
            "bootplate-agent",
            Command::new(binary)
                .arg(format!("--node-name={node}"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--root={}", on.root.display()))
                .arg(format!(
                    "--systemctl={}",
                    Path::new(&on.systemctl).display()
                ))
                .arg(format!("--shell={}", Path::new(&on.shell).display()))
                .arg(format!("--interval={interval}"))
                .env("RUST_LOG", "info"),
            &dir.join(format!("agent-{node}.log")),
        )?;
        Ok(AgentProcess { _process: process })
    }
}
