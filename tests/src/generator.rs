//! Real HTTPS generator servers for the tests: each answers bootplate's generator requests as
//! the test says (a CMDB, one that is slow, one that fails, one that sends garbage), on
//! loopback with a serving certificate from a test CA, and keeps every request body it received
//! so a test can count them and look at what bootplate sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};

use crate::pki::TestCa;

/// What a server sends back for one request.
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Bytes,
    /// How long to wait before answering.
    pub delay: Duration,
}

impl Reply {
    /// A 200 with `body` as JSON.
    pub fn json(body: &Value) -> Reply {
        Reply {
            status: 200,
            body: Bytes::from(serde_json::to_vec(body).expect("JSON")),
            delay: Duration::ZERO,
        }
    }

    /// A `Success` response with `parts` (files, units, commands) merged in.
    pub fn success(parts: Value) -> Reply {
        let mut body = json!({
            "apiVersion": "generator.bootplate.dev/v1alpha1",
            "kind": "GeneratePartResponse",
            "status": "Success",
        });
        for (key, value) in parts.as_object().cloned().unwrap_or_default() {
            body[key] = value;
        }
        Reply::json(&body)
    }
}

type Answer = dyn Fn(&Value) -> Reply + Send + Sync;

/// A generator server on `https://127.0.0.1:<port>/`, stopped on drop.
pub struct GeneratorServer {
    /// Its URL.
    pub url: String,
    received: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl GeneratorServer {
    /// Starts a server with a certificate from `ca` that answers each request (its JSON body)
    /// with `answer`.
    pub async fn start(
        ca: &TestCa,
        answer: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> GeneratorServer {
        let leaf = ca.serving();
        let certs = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("serving certificate");
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("serving key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("TLS config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!("https://{}/", listener.local_addr().expect("address"));
        let received = Arc::new(Mutex::new(Vec::new()));
        let answer: Arc<Answer> = Arc::new(answer);
        let task = tokio::spawn(serve(listener, acceptor, answer, received.clone()));
        GeneratorServer {
            url,
            received,
            task,
        }
    }

    /// Its loopback address.
    pub fn address(&self) -> std::net::SocketAddr {
        let authority = self
            .url
            .trim_start_matches("https://")
            .trim_end_matches('/');
        authority.parse().expect("a socket address")
    }

    /// How many requests it received.
    pub fn count(&self) -> usize {
        self.received.lock().expect("lock").len()
    }

    /// The bodies of the requests it received, as sent.
    pub fn received(&self) -> Vec<String> {
        self.received.lock().expect("lock").clone()
    }
}

impl Drop for GeneratorServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    answer: Arc<Answer>,
    received: Arc<Mutex<Vec<String>>>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let (acceptor, answer, received) = (acceptor.clone(), answer.clone(), received.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let (answer, received) = (answer.clone(), received.clone());
                async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    let text = String::from_utf8_lossy(&body).into_owned();
                    received.lock().expect("lock").push(text);
                    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let reply = answer(&value);
                    tokio::time::sleep(reply.delay).await;
                    let response = hyper::Response::builder()
                        .status(reply.status)
                        .header("content-type", "application/json")
                        .body(Full::new(reply.body))
                        .expect("a response");
                    Ok::<_, hyper::Error>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
