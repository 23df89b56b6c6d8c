//! A restricted network for real, on loopback: distribution's container registry serving TLS
//! with a certificate from a test CA (the mirror), a small forward proxy that records what it
//! is asked to reach, and a node root where the rendered part `network` (and `artifacts`) of a
//! shipped template runs as bootplate-agent runs it: through `sh -c`, here a shell that chroots
//! into the root first, so that the script's absolute paths (`/etc/containerd/certs.d`, the trust
//! store) land under it. The host's programs are bound read-only; `systemctl` is a stub that
//! logs its arguments and says containerd is active.
//!
//! The node's containerd ([`NodeContainerd`]) is the host's containerd daemon run with the
//! node's rendered configuration and its `/etc`, and images are pulled with crictl through its
//! CRI plugin, as the kubelet pulls: that plugin is what reads `config_path`. No pull here goes
//! through `ctr`, whose `--hosts-dir` resolves in the client and would bypass the daemon's
//! configuration.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use crd_types::payload::PayloadPart;

use crate::agent::NodeDisk;
use crate::capi::Process;
use crate::pki::TestCa;

/// The shipped template whose parts the node runs (any kubeadm template writes the same
/// `hosts.toml`; Debian's trust-store tool is the host's).
pub const TEMPLATE: &str = "kubeadm-ubuntu-2204";

/// distribution's `registry serve` on 127.0.0.1, TLS from a test CA, storage in its directory;
/// stopped on drop.
pub struct Registry {
    process: Process,
    dir: tempfile::TempDir,
    pub port: u16,
    /// The CA that signed its serving certificate.
    pub ca: TestCa,
}

impl Registry {
    /// Starts a registry whose certificate (for 127.0.0.1, localhost and `extra_names`) a new
    /// CA named `ca_name` signs, and waits until it answers.
    pub fn start(ca_name: &str, extra_names: &[&str]) -> anyhow::Result<Registry> {
        let dir = tempfile::Builder::new().prefix("registry").tempdir()?;
        let ca = TestCa::new(ca_name);
        let mut names = vec!["127.0.0.1", "localhost"];
        names.extend_from_slice(extra_names);
        let leaf = ca.serving_for(&names);
        let d = dir.path();
        std::fs::write(d.join("tls.crt"), &leaf.cert_pem)?;
        std::fs::write(d.join("tls.key"), &leaf.key_pem)?;
        std::fs::create_dir(d.join("certs"))?;
        std::fs::write(d.join("certs/ca.crt"), &ca.cert_pem)?;
        let port = crate::free_port()?;
        let config = format!(
            "version: 0.1\nlog: {{level: info}}\nstorage: {{filesystem: {{rootdirectory: {root}}}}}\n\
             http: {{addr: 127.0.0.1:{port}, tls: {{certificate: {d}/tls.crt, key: {d}/tls.key}}}}\n",
            root = d.join("data").display(),
            d = d.display(),
        );
        std::fs::write(d.join("config.yml"), config)?;
        let binary = crate::tools::path("registry")?;
        let process = Process::spawn(
            "registry",
            Command::new(binary).arg("serve").arg(d.join("config.yml")),
            &d.join("registry.log"),
        )?;
        let registry = Registry {
            process,
            dir,
            port,
            ca,
        };
        registry.wait_until_listening()?;
        Ok(registry)
    }

    fn wait_until_listening(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the registry did not listen within 20 s:\n{}",
                    self.process.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Pushes the OCI archive `archive` as `repository:tag` (skopeo, trusting the test CA).
    pub fn push(&self, archive: &Path, repository: &str) -> anyhow::Result<()> {
        let out = Command::new("skopeo")
            .arg("copy")
            .arg("--dest-cert-dir")
            .arg(self.dir.path().join("certs"))
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("docker://127.0.0.1:{}/{repository}", self.port))
            .output()
            .context("running skopeo")?;
        check("skopeo copy", &out).map(drop)
    }

    /// The request lines of its access log so far (`GET /v2/... HTTP/1.1`).
    pub fn requests(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| line.split('"').nth(1))
            .filter(|request| request.ends_with("HTTP/1.1") || request.ends_with("HTTP/2.0"))
            .map(str::to_owned)
            .collect()
    }
}

/// `out`'s stdout when it exited 0, else an error with everything it said.
fn check(what: &str, out: &Output) -> anyhow::Result<String> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The parts of [`TEMPLATE`] a worker with `network` (the JSON of `spec.network`) renders,
/// with the update plan's view of them.
pub fn render_parts(network: serde_json::Value) -> anyhow::Result<render::PartsRender> {
    render_parts_of(TEMPLATE, network)
}

/// [`render_parts`] of the shipped template `template` (`templates/<template>.yaml`).
pub fn render_parts_of(
    template: &str,
    network: serde_json::Value,
) -> anyhow::Result<render::PartsRender> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("a parent");
    let file = workspace.join(format!("templates/{template}.yaml"));
    let object: crd_types::ClusterBootstrapTemplate =
        serde_yaml::from_str(&std::fs::read_to_string(&file)?)?;
    let name = format!("ClusterBootstrapTemplate {template}");
    let compiled = render::CompiledTemplate::compile(&name, &object.spec.0)?;
    let config: crd_types::BootplateConfigSpec = serde_json::from_value(serde_json::json!({
        "templateRef": {"kind": "ClusterBootstrapTemplate", "name": template},
        "network": network,
    }))?;
    let context = render::sample_context(crd_types::Role::Worker);
    compiled
        .render_parts(&config, &context, &render::generator::Generated::new())?
        .context("the template has parts")
}

/// Part `name` of `parts`, as the agent's payload holds it (`InPlace`) or as the boot runs it.
pub fn part(parts: &render::PartsRender, name: &str) -> anyhow::Result<PayloadPart> {
    parts
        .parts
        .iter()
        .find(|p| p.content.name == name)
        .map(|p| p.content.clone())
        .with_context(|| format!("no part `{name}` in the render"))
}

/// The sandbox's chroot (see the script): the node root's commands run through it.
const CHROOT: &str = include_str!("../scripts/sandbox-chroot.sh");

/// The `systemctl` the scripts call: logs its arguments to `/systemctl.log`; containerd is
/// active.
const SYSTEMCTL: &str = "#!/bin/sh\necho \"$*\" >>/systemctl.log\nexit 0\n";

/// A node's disk ([`NodeDisk`]) whose commands run chrooted into its root, with the few files a
/// Debian root has that the scripts read: the trust store's configuration and directories,
/// `/etc/hosts` (`hosts` lines added), `/etc/passwd`.
pub struct ChrootNode {
    pub disk: NodeDisk,
    shell: PathBuf,
}

impl ChrootNode {
    pub fn new(hosts: &[&str]) -> anyhow::Result<ChrootNode> {
        let disk = NodeDisk::new()?;
        let root = disk.root();
        for dir in [
            "etc/ssl/certs",
            "usr/share/ca-certificates",
            ".usr-local",
            "tmp",
            "run",
        ] {
            std::fs::create_dir_all(root.join(dir))?;
        }
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
        std::fs::write(root.join("etc/ca-certificates.conf"), "")?;
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
        std::fs::write(root.join("etc/group"), "root:x:0:\n")?;
        let mut etc_hosts = String::from("127.0.0.1 localhost\n");
        for line in hosts {
            etc_hosts.push_str(line);
            etc_hosts.push('\n');
        }
        std::fs::write(root.join("etc/hosts"), etc_hosts)?;
        // This network has no DNS: names resolve from /etc/hosts alone, so that the real
        // registries are out of reach whatever the machine running the tests can reach.
        std::fs::write(root.join("etc/nsswitch.conf"), "hosts: files\n")?;
        write_executable(&root.join("bootplate-stubs/systemctl"), SYSTEMCTL)?;
        let outside = root.parent().context("the disk's directory")?;
        std::fs::write(outside.join("chroot.sh"), CHROOT)?;
        let shell = outside.join("chroot-shell");
        write_executable(
            &shell,
            &format!(
                "#!/bin/sh\nexec unshare --mount --propagation private -- sh '{}' '{}' sh \"$@\"\n",
                outside.join("chroot.sh").display(),
                root.display()
            ),
        )?;
        Ok(ChrootNode { disk, shell })
    }

    /// The agent's view of the node: its root, the disk's systemctl stub, the chroot shell.
    pub fn agent(&self) -> agent::Node {
        agent::Node {
            shell: self.shell.clone().into(),
            ..self.disk.node()
        }
    }

    /// Runs `script` as the boot would (`sh -c`, chrooted); returns its output.
    pub fn run(&self, script: &str) -> anyhow::Result<Output> {
        Ok(Command::new(&self.shell).arg("-c").arg(script).output()?)
    }

    /// Writes the node file `path` (its directory made first).
    pub fn write(&self, path: &str, text: &str) -> anyhow::Result<()> {
        let file = self.disk.path(path);
        std::fs::create_dir_all(file.parent().context("a parent")?)?;
        Ok(std::fs::write(file, text)?)
    }

    /// The node file `path`, if it is there.
    pub fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.disk.path(path)).ok()
    }

    /// The scripts' systemctl calls so far, and forgets them.
    pub fn take_script_systemctl_calls(&self) -> Vec<String> {
        let log = self.disk.path("/systemctl.log");
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        calls.lines().map(str::to_owned).collect()
    }
}

/// containerd as the node runs it, the CRI plugin included (the kubelet pulls through it): the
/// daemon imports the node's `/etc/containerd/config.toml` as it was rendered. Only what would
/// clash with the host is set beside it, in a configuration of its own: its root, state, socket
/// and `/opt` directory. It runs in a private mount namespace where the node's `/etc` is bound
/// over the host's: the registry hosts under `config_path`, the trust store, `/etc/hosts` (and
/// the CNI configuration directory the CRI plugin makes) are the node's. Stopped on drop.
pub struct NodeContainerd {
    process: Option<Process>,
    dir: tempfile::TempDir,
    etc: PathBuf,
}

impl NodeContainerd {
    /// Starts containerd on `node` (whose `/etc/containerd/config.toml` is written) and waits
    /// until its CRI image service answers.
    pub fn start(node: &ChrootNode) -> anyhow::Result<NodeContainerd> {
        let dir = tempfile::Builder::new().prefix("node-ctrd").tempdir()?;
        let d = dir.path().display();
        let config = format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             imports = [\"/etc/containerd/config.toml\"]\n\
             [grpc]\n  address = \"{d}/containerd.sock\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{d}/opt\"\n"
        );
        std::fs::write(dir.path().join("private.toml"), config)?;
        let mut containerd = NodeContainerd {
            process: None,
            dir,
            etc: node.disk.path("/etc"),
        };
        containerd.restart()?;
        Ok(containerd)
    }

    /// Stops the daemon if it runs, starts it again (as `systemctl restart containerd` does),
    /// and waits until its CRI image service answers.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut process) = self.process.take() {
            process.terminate()?;
        }
        let process = Process::spawn(
            "containerd",
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg("mount --bind \"$0\" /etc && exec \"$@\"")
                .arg(&self.etc)
                .arg("containerd")
                .arg("--config")
                .arg(self.dir.path().join("private.toml")),
            &self.dir.path().join("containerd.log"),
        )?;
        self.process = Some(process);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.crictl(&["images"]) {
                Ok(out) if out.status.success() => return Ok(()),
                _ if Instant::now() > deadline => bail!(
                    "containerd's CRI plugin did not answer within 20 s:\n{}",
                    self.process
                        .as_ref()
                        .map(|p| p.log_tail(20))
                        .unwrap_or_default()
                ),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Runs crictl with `args` against this containerd (its socket as the runtime and the
    /// image endpoint).
    pub fn crictl(&self, args: &[&str]) -> anyhow::Result<Output> {
        let endpoint = format!(
            "unix://{}",
            self.dir.path().join("containerd.sock").display()
        );
        Command::new(crate::tools::path("crictl")?)
            .args([
                "--runtime-endpoint",
                &endpoint,
                "--image-endpoint",
                &endpoint,
            ])
            .args(args)
            .output()
            .context("running crictl")
    }

    /// The references of the images the CRI plugin holds.
    pub fn images(&self) -> anyhow::Result<Vec<String>> {
        let out = check("crictl images", &self.crictl(&["images", "-o", "json"])?)?;
        let list: serde_json::Value = serde_json::from_str(&out)?;
        let tags = (list["images"].as_array().into_iter().flatten())
            .flat_map(|image| image["repoTags"].as_array().into_iter().flatten())
            .filter_map(|tag| tag.as_str().map(str::to_owned));
        Ok(tags.collect())
    }
}

fn write_executable(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(path.parent().context("a parent")?)?;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A forward proxy on 127.0.0.1 (HTTP `CONNECT` only, what HTTPS downloads use) that records
/// each target it is asked for and connects to it; a name in `resolve` is reached at
/// 127.0.0.1 (the proxy resolves what the node cannot). Stops with the test process.
pub struct ForwardProxy {
    pub port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl ForwardProxy {
    pub fn start(resolve: &'static [&'static str]) -> anyhow::Result<ForwardProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let log = log.clone();
                std::thread::spawn(move || {
                    let _ = tunnel(client, &log, resolve);
                });
            }
        });
        Ok(ForwardProxy { port, seen })
    }

    /// The targets asked for so far (`host:port`).
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("not poisoned").clone()
    }
}

/// Serves one client: reads its `CONNECT host:port` request, records the target, and copies
/// bytes both ways once connected.
fn tunnel(client: TcpStream, log: &Mutex<Vec<String>>, resolve: &[&str]) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut client = client;
    let mut words = line.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
        return client.write_all(b"HTTP/1.1 501 Not Implemented\r\n\r\n");
    };
    log.lock().expect("not poisoned").push(target.to_owned());
    let (host, port) = target.rsplit_once(':').unwrap_or((target, "443"));
    let address = if resolve.contains(&host) {
        "127.0.0.1"
    } else {
        host
    };
    let mut upstream = TcpStream::connect(format!("{address}:{port}"))?;
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    let buffered = reader.buffer().to_vec();
    upstream.write_all(&buffered)?;
    let (mut up_read, mut client_write) = (upstream.try_clone()?, client.try_clone()?);
    let back = std::thread::spawn(move || std::io::copy(&mut up_read, &mut client_write));
    let mut rest = reader.into_inner();
    let _ = std::io::copy(&mut rest, &mut upstream);
    let _ = upstream.shutdown(std::net::Shutdown::Write);
    let _ = back.join();
    Ok(())
}
