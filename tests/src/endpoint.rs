//! The control-plane endpoint of a whole control plane, as a load balancer in front of its
//! control-plane machines provides it: a fixed address every node reaches, whose connections go
//! to the first apiserver whose `/readyz` answers 200 (a load balancer's health check: an
//! apiserver that accepts connections while its etcd is not ready yet gets none).
//!
//! The address is the host's end of a pod-cluster slot of its own ([`Slot`]): every node
//! routes the slots' links through the host ([`host::make_network`]), so each reaches it, and it
//! stays while nodes come and go. A plain TCP relay, one thread per direction of a connection:
//! TLS goes through untouched, so clients check the apiservers' own serving certificates. The
//! health check itself trusts the cluster CA only and asks anonymously, as kubeadm's apiservers
//! allow for `/readyz`.

use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::pod_cluster::host::{self, Slot};

/// How long a backend may take to accept a connection before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a backend's `/readyz` may take to answer before the next one is tried.
const READYZ_TIMEOUT: Duration = Duration::from_secs(3);

/// A running endpoint; its listener stops and its slot is swept on drop.
pub struct Endpoint {
    slot: Slot,
    port: u16,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Takes a slot, and listens on its host address at `port` (no backend yet); the health
    /// check trusts the CA certificate `ca_pem` (the cluster CA).
    pub fn start(port: u16, ca_pem: &str) -> anyhow::Result<Endpoint> {
        let check = Arc::new(HealthCheck::new(ca_pem)?);
        let slot = Slot::take()?;
        host::make_network(&slot.layout)?;
        let listener = TcpListener::bind((slot.layout.host_ip, port))
            .with_context(|| format!("listening on {}:{port}", slot.layout.host_ip))?;
        let backends = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (backends, stop) = (backends.clone(), stop.clone());
            std::thread::spawn(move || accept_loop(listener, backends, check, stop))
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

    /// Takes an apiserver from behind the endpoint (its instance is gone).
    pub fn remove_backend(&self, backend: SocketAddr) {
        self.backends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|b| *b != backend);
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
    check: Arc<HealthCheck>,
    stop: Arc<AtomicBool>,
) {
    for client in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let list = backends.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let check = check.clone();
        std::thread::spawn(move || {
            // The first ready apiserver; none: the client sees its connection closed.
            let Some(server) = list.iter().find_map(|b| {
                check.ready(*b).ok()?;
                TcpStream::connect_timeout(b, CONNECT_TIMEOUT).ok()
            }) else {
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

/// A load balancer's health check of an apiserver: `GET /readyz` over TLS, the server's
/// certificate verified against the cluster CA for the backend's address, no credentials.
struct HealthCheck {
    config: Arc<rustls::ClientConfig>,
}

impl HealthCheck {
    fn new(ca_pem: &str) -> anyhow::Result<HealthCheck> {
        let config = crate::tls_probe::client_config(ca_pem).context("the endpoint's CA")?;
        Ok(HealthCheck { config })
    }

    /// Ok when `backend`'s `/readyz` answers 200; the error says what it did instead.
    fn ready(&self, backend: SocketAddr) -> anyhow::Result<()> {
        let timeouts = crate::tls_probe::Timeouts {
            connect: CONNECT_TIMEOUT,
            io: READYZ_TIMEOUT,
        };
        let (status, _) = crate::tls_probe::get(self.config.clone(), backend, "/readyz", timeouts)?;
        if status != 200 {
            bail!("{backend}/readyz answered {status}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use rustls_pki_types::ServerName;

    use super::*;
    use crate::generator::{GeneratorServer, Reply};
    use crate::pki::TestCa;

    /// What a client gets through `endpoint`: the status line of `GET /` over TLS (it trusts
    /// `ca`, and expects the backends' certificate for 127.0.0.1), or none when the endpoint
    /// closed the connection.
    fn status_through(endpoint: &Endpoint, ca: &TestCa) -> Option<String> {
        let check = HealthCheck::new(&ca.cert_pem).unwrap();
        let tcp = TcpStream::connect((endpoint.address(), endpoint.port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let name = ServerName::from(std::net::IpAddr::from(Ipv4Addr::LOCALHOST));
        let connection = rustls::ClientConnection::new(check.config, name).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, tcp);
        let request = "GET / HTTP/1.1\r\nHost: endpoint\r\nConnection: close\r\n\r\n";
        tls.write_all(request.as_bytes()).ok()?;
        let mut reply = Vec::new();
        let _ = tls.read_to_end(&mut reply);
        let reply = String::from_utf8_lossy(&reply).into_owned();
        reply.lines().next().map(str::to_owned)
    }

    /// An apiserver that accepts connections but is not ready (503 on every path, `/readyz`
    /// among them) gets none, though it comes first: they go to the next one, which is ready;
    /// with no ready backend, the client's connection is closed.
    #[tokio::test(flavor = "multi_thread")]
    async fn connections_go_to_the_first_backend_whose_readyz_answers() {
        let ca = TestCa::new("kubernetes");
        let not_ready = GeneratorServer::start(&ca, |_| Reply {
            status: 503,
            body: "not ready".into(),
            delay: Duration::ZERO,
        })
        .await;
        let ready = GeneratorServer::start(&ca, |_| Reply::json(&serde_json::json!("ok"))).await;
        let endpoint = Endpoint::start(6443, &ca.cert_pem).expect("the endpoint");
        endpoint.add_backend(not_ready.address());
        let alone = {
            let endpoint = &endpoint;
            let ca = &ca;
            tokio::task::block_in_place(|| status_through(endpoint, ca))
        };
        assert_eq!(alone, None, "no ready backend: the connection is closed");
        endpoint.add_backend(ready.address());
        let status = tokio::task::block_in_place(|| status_through(&endpoint, &ca));
        assert_eq!(
            status.as_deref(),
            Some("HTTP/1.1 200 OK"),
            "the ready backend answers"
        );
    }
}
