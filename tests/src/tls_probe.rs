//! Whether a loopback port is served by the process the test started: a TLS handshake that
//! verifies the server's certificate against the CA the test made for that process. A port
//! the tests pick is free when picked and bound a moment later, so another process (another
//! test's controller, apiserver or webhook) may hold it: that a connection is accepted proves
//! nothing, that the certificate chains to our CA and names 127.0.0.1 does.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

/// How long one connection or handshake may take before the probe gives up on it.
const STEP: Duration = Duration::from_secs(5);

/// Connects to `127.0.0.1:port` and completes a TLS handshake that trusts only `ca_pem` and
/// expects a certificate for 127.0.0.1. The error says what failed (nothing listening, a
/// certificate of another CA, no TLS at all).
pub async fn handshake(port: u16, ca_pem: &str) -> anyhow::Result<()> {
    handshake_at(Ipv4Addr::LOCALHOST, port, ca_pem).await
}

/// As [`handshake`], at `ip:port`, expecting a certificate for `ip`.
pub async fn handshake_at(ip: Ipv4Addr, port: u16, ca_pem: &str) -> anyhow::Result<()> {
    let connector = tokio_rustls::TlsConnector::from(client_config(ca_pem)?);
    let stream = tokio::time::timeout(STEP, tokio::net::TcpStream::connect((ip, port)))
        .await
        .with_context(|| format!("connecting to {ip}:{port} timed out"))?
        .with_context(|| format!("nothing accepts connections on {ip}:{port}"))?;
    let name = ServerName::from(IpAddr::from(ip));
    tokio::time::timeout(STEP, connector.connect(name, stream))
        .await
        .with_context(|| format!("the TLS handshake on {ip}:{port} timed out"))?
        .with_context(|| format!("{ip}:{port} does not serve a certificate of the expected CA"))?;
    Ok(())
}

/// The most of a response [`get`] reads: a health endpoint answers in a few bytes.
const MAX_RESPONSE: u64 = 64 * 1024;

/// How long [`get`] waits: for the connection, and for each read or write after it.
#[derive(Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub io: Duration,
}

/// `GET path` at `server` over TLS with `config` (no client certificate: what an anonymous
/// client, a load balancer's health check, sees), blocking; the status code and the body (with
/// any chunked framing left in: a health body is one short chunk). The certificate must chain to
/// `config`'s roots and name `server`'s address.
pub fn get(
    config: Arc<rustls::ClientConfig>,
    server: SocketAddr,
    path: &str,
    timeouts: Timeouts,
) -> anyhow::Result<(u16, String)> {
    use std::io::{Read, Write};
    let tcp = std::net::TcpStream::connect_timeout(&server, timeouts.connect)
        .with_context(|| format!("nothing accepts connections on {server}"))?;
    tcp.set_read_timeout(Some(timeouts.io))?;
    tcp.set_write_timeout(Some(timeouts.io))?;
    let connection = rustls::ClientConnection::new(config, ServerName::from(server.ip()))?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    while tls.conn.is_handshaking() {
        (tls.conn.complete_io(&mut tls.sock))
            .with_context(|| format!("{server} does not serve a certificate of the expected CA"))?;
    }
    let request = format!("GET {path} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n\r\n");
    (tls.write_all(request.as_bytes())).with_context(|| format!("asking {server} for {path}"))?;
    let mut reply = Vec::new();
    // A reset after the reply (no close_notify) still leaves the reply read.
    let _ = (&mut tls).take(MAX_RESPONSE).read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = (head.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("{server}{path} answered no HTTP status line: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// As [`get`], at `ip:port`, trusting only `ca_pem`, each step bounded by the probe's timeout.
pub fn get_at(ip: Ipv4Addr, port: u16, ca_pem: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let timeouts = Timeouts {
        connect: STEP,
        io: STEP,
    };
    get(
        client_config(ca_pem)?,
        SocketAddr::from((ip, port)),
        path,
        timeouts,
    )
}

/// A TLS client configuration that trusts only the CA certificates in `ca_pem` and presents no
/// client certificate.
pub fn client_config(ca_pem: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("the expected CA is not PEM")?)?;
    }
    anyhow::ensure!(!roots.is_empty(), "the expected CA holds no certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{GeneratorServer, Reply};
    use crate::pki::TestCa;

    #[tokio::test]
    async fn only_a_server_with_a_certificate_of_the_expected_ca_passes() {
        let (ours, theirs) = (TestCa::new("ours"), TestCa::new("theirs"));
        let server = GeneratorServer::start(&ours, |_| Reply::success(serde_json::json!({}))).await;
        let port = server.address().port();
        handshake(port, &ours.cert_pem).await.unwrap();
        let error = handshake(port, &theirs.cert_pem).await.unwrap_err();
        assert!(
            format!("{error:#}").contains("does not serve a certificate of the expected CA"),
            "{error:#}"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_get_returns_the_status_and_the_body_only_from_the_expected_ca() {
        let (ours, theirs) = (TestCa::new("ours"), TestCa::new("theirs"));
        let server = GeneratorServer::start(&ours, |_| Reply::success(serde_json::json!({}))).await;
        let port = server.address().port();
        let get = |ca: &TestCa| {
            tokio::task::block_in_place(|| {
                get_at(Ipv4Addr::LOCALHOST, port, &ca.cert_pem, "/readyz")
            })
        };
        let (status, body) = get(&ours).unwrap();
        assert_eq!(status, 200);
        assert!(body.contains("GeneratePartResponse"), "{body}");
        let error = get(&theirs).unwrap_err();
        assert!(
            format!("{error:#}").contains("does not serve a certificate of the expected CA"),
            "{error:#}"
        );
    }

    #[tokio::test]
    async fn a_port_that_accepts_without_tls_does_not_pass() {
        let ca = TestCa::new("ours");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts and closes at once, as a process speaking another protocol might.
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        assert!(handshake(port, &ca.cert_pem).await.is_err());
        task.abort();
        let free = crate::free_port().unwrap();
        let error = handshake(free, &ca.cert_pem).await.unwrap_err();
        assert!(
            format!("{error:#}").contains("nothing accepts connections"),
            "{error:#}"
        );
    }
}
