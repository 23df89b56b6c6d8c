//! The control-plane endpoint of a whole control plane, as a load balancer in front of its
//! control-plane machines provides it: a fixed address every node reaches, whose connections go
//! to the first apiserver that accepts one.
//!
//! The address is the host's end of a pod-cluster slot of its own ([`Slot`]): every node
//! routes the slots' links through the host ([`host::make_network`]), so each reaches it, and it
//! stays while nodes come and go. A plain TCP relay, one thread per direction of a connection:
//! TLS goes through untouched, so clients check the apiservers' own serving certificates.

use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;

use crate::pod_cluster::host::{self, Slot};

/// How long a backend may take to accept a connection before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A running endpoint; its listener stops and its slot is swept on drop.
pub struct Endpoint {
    slot: Slot,
    port: u16,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Takes a slot, and listens on its host address at `port` (no backend yet).
    pub fn start(port: u16) -> anyhow::Result<Endpoint> {
        let slot = Slot::take()?;
        host::make_network(&slot.layout)?;
        let listener = TcpListener::bind((slot.layout.host_ip, port))
            .with_context(|| format!("listening on {}:{port}", slot.layout.host_ip))?;
        let backends = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (backends, stop) = (backends.clone(), stop.clone());
            std::thread::spawn(move || accept_loop(listener, backends, stop))
        };
        Ok(Endpoint {
            slot,
            port,
            backends,
            stop,
            accept: Some(accept),
        })
    }

    /// The endpoint's address (the Cluster's `controlPlaneEndpoint.host`).
    pub fn address(&self) -> Ipv4Addr {
        self.slot.layout.host_ip
    }

    /// Adds an apiserver behind the endpoint, tried after those added before.
    pub fn add_backend(&self, backend: SocketAddr) {
        self.backends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(backend);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop up, which then sees the flag.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((self.slot.layout.host_ip, self.port)),
            CONNECT_TIMEOUT,
        );
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        host::sweep(&self.slot.layout, None);
    }
}

fn accept_loop(
    listener: TcpListener,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
) {
    for client in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let list = backends.lock().unwrap_or_else(|e| e.into_inner()).clone();
        std::thread::spawn(move || {
            // The first apiserver that accepts; none: the client sees its connection closed.
            let Some(server) = list
                .iter()
                .find_map(|b| TcpStream::connect_timeout(b, CONNECT_TIMEOUT).ok())
            else {
                return;
            };
            relay(client, server);
        });
    }
}

/// Copies both directions of a connection until each side has closed its half.
fn relay(client: TcpStream, server: TcpStream) {
    let (Ok(client_read), Ok(server_read)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let upstream = std::thread::spawn(move || copy_half(client_read, server));
    copy_half(server_read, client);
    let _ = upstream.join();
}

fn copy_half(mut from: TcpStream, mut to: TcpStream) {
    // An error (a reset) ends this direction as its end of stream does.
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}
