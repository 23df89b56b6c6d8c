//! The accept loop behind every port bootplate listens on (the webhook, the Runtime SDK
//! extension, `generator serve`, metrics and health): anything in the cluster can reach these
//! ports, so each connection is bounded before it costs more than a file descriptor and a
//! task. A listener holds at most [`Limits::max_connections`] connections (one more is closed
//! at once), a TLS handshake must finish within [`Limits::handshake_timeout`], a request's
//! headers (and, on a kept-alive connection, the next request's) within
//! [`Limits::header_read_timeout`], and a request, body included, is answered within
//! [`Limits::request_timeout`]. Bodies above [`Limits::max_body`] are refused with 413.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tracing::{debug, warn};

/// What one listener allows each connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once; the next one is closed as soon as it is accepted.
    pub max_connections: usize,
    /// The longest a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// The longest a client may take to send a request's headers, counted from when the
    /// connection is ready for them: also how long an idle kept-alive connection stays open.
    pub header_read_timeout: Duration,
    /// The longest a request may take once its headers are in, reading its body included.
    pub request_timeout: Duration,
    /// The largest request body accepted.
    pub max_body: usize,
}

impl Default for Limits {
    /// Generous for the peers that call bootplate (the apiserver waits at most 30 s for a
    /// webhook, Cluster API 10 s for a hook) and small enough that a client that never
    /// finishes holds its slot for seconds, not forever.
    fn default() -> Self {
        Limits {
            max_connections: 256,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_body: 2 * 1024 * 1024,
        }
    }
}

/// How a connection is secured.
#[derive(Clone)]
pub enum Transport {
    /// Plain HTTP (metrics and health).
    Plain,
    /// TLS with the configuration current when the connection is accepted (certificates and
    /// client CAs are reloaded while the process runs); none: the connection is closed.
    Tls(Arc<dyn Fn() -> Option<Arc<rustls::ServerConfig>> + Send + Sync>),
}

/// Binds `addr` (`flag` names it in the error) and serves `app` on it with `limits` until the
/// process ends.
pub async fn serve(
    addr: SocketAddr,
    flag: &str,
    transport: Transport,
    app: Router,
    limits: Limits,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {flag} {addr}: {e}"))?;
    tokio::spawn(accept_loop(listener, transport, app, limits));
    Ok(())
}

async fn accept_loop(listener: TcpListener, transport: Transport, app: Router, limits: Limits) {
    let app = app.layer(DefaultBodyLimit::max(limits.max_body));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, typically: wait instead of spinning on the error.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, limit = limits.max_connections, "too many connections: closed");
            drop(stream);
            continue;
        };
        let (transport, app) = (transport.clone(), app.clone());
        tokio::spawn(async move {
            connection(stream, peer, transport, app, limits).await;
            drop(slot);
        });
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    transport: Transport,
    app: Router,
    limits: Limits,
) {
    let served = match transport {
        Transport::Plain => http(TokioIo::new(stream), app, limits).await,
        Transport::Tls(config) => {
            let Some(config) = config() else {
                return debug!(%peer, "no TLS configuration to serve with: closed");
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream))
                .await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return debug!(%peer, "TLS handshake timed out: closed"),
            };
            http(TokioIo::new(tls), app, limits).await
        }
    };
    if let Err(e) = served {
        debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Serves HTTP/1.1 on `io` (the only protocol the TLS servers offer in ALPN).
async fn http<I>(io: I, app: Router, limits: Limits) -> Result<(), hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let app = app.clone();
        async move {
            let answered = tokio::time::timeout(limits.request_timeout, app.oneshot(request));
            Ok::<_, std::convert::Infallible>(match answered.await {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => (StatusCode::REQUEST_TIMEOUT, "request timed out").into_response(),
            })
        }
    });
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(io, service)
        .await
}

#[cfg(test)]
mod tests {
    //! Real sockets on loopback against the real accept loop, with limits small enough for a
    //! unit test; tests/tests/security/servers.rs checks the defaults on the running binary.

    use super::*;
    use axum::routing::post;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const SHORT: Limits = Limits {
        max_connections: 2,
        handshake_timeout: Duration::from_millis(300),
        header_read_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_millis(300),
        max_body: 1024,
    };

    /// An echo of the body's length, served on a free loopback port with `limits`.
    async fn echo(limits: Limits) -> SocketAddr {
        let app = Router::new().route(
            "/",
            post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept_loop(listener, Transport::Plain, app, limits));
        addr
    }

    /// Sends `request` and reads until the server closes (or 5 s pass).
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    fn post_with(length: usize, body: &str) -> Vec<u8> {
        format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{body}")
            .into_bytes()
    }

    #[tokio::test]
    async fn requests_are_served_and_bounded() {
        let addr = echo(SHORT).await;
        // (request, what the answer starts with)
        let cases: [(Vec<u8>, &str); 3] = [
            (post_with(5, "hello"), "HTTP/1.1 200"),
            // A body announced but never finished: the request timeout answers.
            (post_with(100, "slow"), "HTTP/1.1 408"),
            // A body above the limit.
            (post_with(2000, &"x".repeat(2000)), "HTTP/1.1 413"),
        ];
        for (request, expected) in cases {
            let answer = exchange(addr, &request).await;
            assert!(answer.starts_with(expected), "{expected}: got {answer:?}");
        }
    }

    #[tokio::test]
    async fn silent_connections_are_closed_and_one_over_the_cap_at_once() {
        // Long enough that "at once" and "after the timeout" stay apart on a loaded machine;
        // the timeout counts from the accept, so never before `opened` plus the timeout.
        let limits = Limits {
            header_read_timeout: Duration::from_secs(3),
            ..SHORT
        };
        let addr = echo(limits).await;
        let opened = std::time::Instant::now();
        let mut held = Vec::new();
        for _ in 0..limits.max_connections {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        // Over the cap: closed before the header timeout could have closed it.
        let over = exchange(addr, b"").await;
        assert_eq!(over, "");
        assert!(started.elapsed() < limits.header_read_timeout);
        // Under the cap: held, then closed by the header timeout.
        for stream in &mut held {
            let mut buf = [0u8; 16];
            let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf));
            assert!(matches!(read.await, Ok(Ok(0)) | Ok(Err(_))));
        }
        assert!(opened.elapsed() >= limits.header_read_timeout);
        // The slots are free again.
        let answer = exchange(addr, &post_with(5, "hello")).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    }
}
