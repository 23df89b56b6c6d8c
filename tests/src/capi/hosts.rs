//! Real hosts behind the test cloud: a machine whose Machine has bootstrap data boots on a node
//! of its own ([`crate::node`]: its own network namespace, real cloud-init running that
//! user-data, containerd with the control-plane images, the real kubeadm and kubelet), as an
//! infrastructure provider starts an instance with the user-data it was given.
//!
//! The cloud asks [`Hosts::boot`] at every pass; the first ask starts the node in a thread of
//! its own and later asks see it booting, booted (its address) or failed. Control-plane
//! machines boot one at a time (etcd adds one learner at a time; `kubeadm join` of a second
//! control-plane machine while the first still joins fails), workers at once. Every
//! control-plane node's apiserver is put behind the control-plane endpoint as it boots. Each
//! node has a pod network of its own (a bridge, run.sh `--cni-subnet`), so its Node is Ready.
//!
//! The workload cluster exists only once the `init` machine booted: the scenario gives
//! [`Hosts::set_workload`] a client for it (through the `<cluster>-kubeconfig` Secret Cluster
//! API writes for a Cluster without a control-plane provider); until then the cloud has no
//! Nodes to look at.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use kube::Client;

use super::boot::BootRole;
use crate::endpoint::Endpoint;
use crate::node::{Node, NodeSpec};

/// The apiserver's port on every control-plane node.
const APISERVER_PORT: u16 = 6443;

/// What a host is doing, as the cloud sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostState {
    /// Its user-data still runs.
    Booting,
    /// Its user-data ran and its boot proof passed: the node's address.
    Booted(Ipv4Addr),
    /// Its boot failed: why (the boot proof's failures and kubeadm's output).
    Failed(String),
}

/// What one host boots as: the role its Machine should have, and the OS of the image its
/// infrastructure machine names (the boot proof's `--os`: the Debian root gets that family's
/// stand-ins).
pub struct HostImage {
    pub role: BootRole,
    pub os: String,
}

/// What every host shares: the Kubernetes version its kubeadm and kubelet are, the images in
/// its containerd, the endpoint its control-plane apiservers go behind.
pub struct HostsSpec {
    pub version: String,
    pub images: Vec<PathBuf>,
    pub endpoint: Arc<Endpoint>,
}

#[derive(Default)]
struct State {
    hosts: HashMap<String, HostState>,
    nodes: HashMap<String, Node>,
    workload: Option<Client>,
}

/// The running hosts, by Machine name; every node ends on drop.
pub struct Hosts {
    spec: HostsSpec,
    state: Mutex<State>,
    /// Held while a control-plane machine boots.
    control_plane: Mutex<()>,
    /// The third octet of the next node's pod subnet.
    next_subnet: AtomicU8,
}

impl Hosts {
    pub fn new(spec: HostsSpec) -> Arc<Hosts> {
        Arc::new(Hosts {
            spec,
            state: Mutex::default(),
            control_plane: Mutex::new(()),
            next_subnet: AtomicU8::new(1),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Machine `machine`'s host: started from `image` with `user_data` when it has none yet, its
    /// boot proof told `image.role`, the role the Machine should have (not the one the user-data
    /// names: a user-data that makes another role must fail the proof).
    pub fn boot(self: &Arc<Self>, machine: &str, user_data: &[u8], image: HostImage) -> HostState {
        let mut state = self.state();
        if let Some(host) = state.hosts.get(machine) {
            return host.clone();
        }
        state.hosts.insert(machine.to_owned(), HostState::Booting);
        let (hosts, machine, user_data) = (self.clone(), machine.to_owned(), user_data.to_vec());
        std::thread::spawn(move || {
            let result = hosts.run(&machine, &user_data, &image);
            let mut state = hosts.state();
            let host = match result {
                Ok(node) => {
                    let booted = HostState::Booted(node.address());
                    state.nodes.insert(machine.clone(), node);
                    booted
                }
                Err(e) => HostState::Failed(format!("{e:#}")),
            };
            state.hosts.insert(machine, host);
        });
        HostState::Booting
    }

    /// Starts a node, boots it with `user_data` as `image` says and checks its boot proof.
    fn run(&self, machine: &str, user_data: &[u8], image: &HostImage) -> anyhow::Result<Node> {
        let role = image.role;
        let _one_at_a_time = (role != BootRole::Worker)
            .then(|| self.control_plane.lock().unwrap_or_else(|e| e.into_inner()));
        let mut node = Node::new()?;
        // Each node's pods get a /24 of their own in 192.168.0.0/16 (the scenarios' pod CIDR).
        let subnet = format!(
            "192.168.{}.0/24",
            self.next_subnet.fetch_add(1, Ordering::SeqCst)
        );
        if role != BootRole::Worker {
            let apiserver = SocketAddr::from((node.address(), APISERVER_PORT));
            self.spec.endpoint.add_backend(apiserver);
        }
        node.boot(&NodeSpec {
            name: machine,
            user_data,
            role: role.as_str(),
            version: &self.spec.version,
            os: &image.os,
            images: &self.spec.images,
            cni_subnet: Some(&subnet),
        })?;
        let report = node.report()?;
        anyhow::ensure!(
            report["ok"] == true,
            "the boot proof of {machine} ({}): {}\n{}",
            role.as_str(),
            report["failures"],
            node.kubeadm_log()
        );
        Ok(node)
    }

    /// What Machine `machine`'s host is doing; `None` before it was asked to boot (or once it
    /// was removed).
    pub fn state_of(&self, machine: &str) -> Option<HostState> {
        self.state().hosts.get(machine).cloned()
    }

    /// Ends Machine `machine`'s host (once its boot ended) and takes its apiserver from behind
    /// the endpoint, as a cloud terminates an instance.
    pub fn remove(&self, machine: &str) {
        let node = {
            let mut state = self.state();
            state.hosts.remove(machine);
            state.nodes.remove(machine)
        };
        if let Some(node) = node {
            let apiserver = SocketAddr::from((node.address(), APISERVER_PORT));
            self.spec.endpoint.remove_backend(apiserver);
            drop(node);
        }
    }

    /// Runs `f` on Machine `machine`'s node, once it booted.
    pub fn with_node<T>(&self, machine: &str, f: impl FnOnce(&Node) -> T) -> Option<T> {
        self.state().nodes.get(machine).map(f)
    }

    /// The workload cluster's client, once the scenario gave one.
    pub fn workload(&self) -> Option<Client> {
        self.state().workload.clone()
    }

    /// Gives the cloud the workload cluster (once its `init` machine booted).
    pub fn set_workload(&self, client: Client) {
        self.state().workload = Some(client);
    }
}
