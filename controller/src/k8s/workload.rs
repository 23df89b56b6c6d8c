//! Clients of workload clusters, built from the Cluster's `<cluster>-kubeconfig` Secret.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;

use crd_types::conditions::reason;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use k8s_openapi::api::core::v1::Secret;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::config::KubeConfigOptions;
use kube::{Api, Client, Config, ResourceExt};
use rustls::client::Resumption;
use rustls_pki_types::ServerName;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

use crate::error::{Error, Result, is_not_found};
use crate::k8s::stores::Stores;
use crate::k8s::workload_kubeconfig;

/// Cached clients, keyed by the kubeconfig Secret and its resourceVersion: a rotated
/// kubeconfig gets a new client, an unchanged one reuses its connections. A client unused for
/// [`UNUSED_CLIENT_TTL`] is dropped with its TLS state and connections: a Cluster is busy while
/// its machines are created and join, then quiet for hours, and a quiet Cluster's client held
/// about 25 KB (TLS configuration and session cache, request buffer) for the process's life.
#[derive(Default)]
pub struct WorkloadClients {
    cached: Mutex<Cached>,
}

/// How long a workload client is kept unused. Building one again costs a read of the
/// kubeconfig Secret and a TLS handshake.
const UNUSED_CLIENT_TTL: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Cached {
    clients: HashMap<(String, String), CachedClient>,
    /// When unused clients were last dropped.
    swept: Option<Instant>,
}

struct CachedClient {
    kubeconfig_version: String,
    client: Client,
    used: Instant,
}

impl Cached {
    /// The client of `key` built from kubeconfig `version`, marked used at `now`.
    fn get(&mut self, key: &(String, String), version: &str, now: Instant) -> Option<Client> {
        self.drop_unused(now);
        let cached = self.clients.get_mut(key)?;
        if cached.kubeconfig_version != version {
            return None;
        }
        cached.used = now;
        Some(cached.client.clone())
    }

    /// Keeps `client`, used at `now`.
    fn insert(&mut self, key: (String, String), version: String, client: Client, now: Instant) {
        self.drop_unused(now);
        let cached = CachedClient {
            kubeconfig_version: version,
            client,
            used: now,
        };
        self.clients.insert(key, cached);
    }

    /// Drops the clients unused for [`UNUSED_CLIENT_TTL`]; looked for at most twice per
    /// period, so a burst of reconciles does not scan the map each time.
    fn drop_unused(&mut self, now: Instant) {
        let due = self
            .swept
            .is_none_or(|swept| now.saturating_duration_since(swept) >= UNUSED_CLIENT_TTL / 2);
        if due {
            self.clients
                .retain(|_, c| now.saturating_duration_since(c.used) < UNUSED_CLIENT_TTL);
            self.swept = Some(now);
        }
    }
}

impl WorkloadClients {
    /// Forgets the client of a deleted Cluster.
    pub(crate) fn forget(&self, namespace: &str, cluster: &str) {
        let key = (namespace.to_owned(), cluster.to_owned());
        self.cached.lock().expect("lock").clients.remove(&key);
    }

    #[cfg(test)]
    fn holds(&self, namespace: &str, cluster: &str) -> bool {
        let key = (namespace.to_owned(), cluster.to_owned());
        self.cached.lock().expect("lock").clients.contains_key(&key)
    }

    /// A client of the workload cluster `cluster` in `namespace`. When the kubeconfig Secret
    /// is in the metadata store (CAPI labels it with the cluster's name) and its
    /// resourceVersion is the cached client's, the client is reused without reading it.
    pub async fn client(
        &self,
        management: &Client,
        stores: &Stores,
        namespace: &str,
        cluster: &str,
        timeout: Duration,
    ) -> Result<Client> {
        let secret_name = format!("{cluster}-kubeconfig");
        let key = (namespace.to_owned(), cluster.to_owned());
        if let Some(version) = stores.secret_version(namespace, &secret_name)
            && let Some(client) =
                self.cached
                    .lock()
                    .expect("lock")
                    .get(&key, &version, Instant::now())
        {
            return Ok(client);
        }
        let secrets: Api<Secret> = Api::namespaced(management.clone(), namespace);
        let secret = match secrets.get(&secret_name).await {
            Ok(secret) => secret,
            Err(e) if is_not_found(&e) => {
                return Err(Error::waiting(
                    reason::BOOTSTRAP_TOKEN_ERROR,
                    format!(
                        "Secret {namespace}/{secret_name} (the workload cluster's kubeconfig) not found"
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let version = secret.resource_version().unwrap_or_default();
        if let Some(client) = self
            .cached
            .lock()
            .expect("lock")
            .get(&key, &version, Instant::now())
        {
            return Ok(client);
        }
        let client = build_client(&secret, namespace, &secret_name, timeout).await?;
        self.cached
            .lock()
            .expect("lock")
            .insert(key, version, client.clone(), Instant::now());
        Ok(client)
    }
}

async fn build_client(
    secret: &Secret,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<Client> {
    let bad = |what: String| {
        Error::failed(
            reason::BOOTSTRAP_TOKEN_ERROR,
            format!("Secret {namespace}/{name}: {what}"),
        )
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .ok_or_else(|| bad("key `value` missing".into()))?;
    let text = std::str::from_utf8(&bytes.0).map_err(|_| bad("key `value` is not UTF-8".into()))?;
    let kubeconfig = workload_kubeconfig::parse(text)
        .map_err(|e| bad(format!("key `value` is not a kubeconfig: {e}")))?;
    // A tenant writes this Secret: nothing in it may run a command, read a file of the
    // controller or send credentials in the clear (see workload_kubeconfig).
    let kubeconfig = workload_kubeconfig::vet(&kubeconfig)
        .map_err(|e| bad(format!("key `value` is refused: {e}")))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(format!("key `value` is not a usable kubeconfig: {e}")))?;
    with_timeouts(&mut config, timeout);
    pooled_client(&config, IDLE_CONNECTION_TIMEOUT, timeout)
        .map_err(|e| bad(format!("cannot build a client: {e}")))
}

/// The most bootplate reads of one response from a workload cluster. The workload cluster and
/// the endpoint its kubeconfig names belong to a tenant: without a cap, an endpoint that streams
/// without end, or a listing of large objects, would take the leader's memory while one config
/// waits. The largest object an apiserver stores is about 1.5 MiB (etcd's request limit), and a
/// page of boot reports (`boot_report::PAGE` of at most `core::boot::MAX_ENCODED` each, the
/// most a report may hold) is well under it.
pub(crate) const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// Why a response from a workload cluster was not read. Its text becomes part of the request's
/// error (kube's `ServiceError: ...`), and with it of the condition that shows it.
#[derive(Debug, thiserror::Error)]
pub enum ResponseRefused {
    #[error(
        "the workload cluster's response is larger than {} MiB, the most bootplate reads of one",
        MAX_RESPONSE_BYTES >> 20
    )]
    TooLarge,
    #[error("the workload cluster did not answer in full within {0:?} (--workload-timeout)")]
    TooSlow(Duration),
}

/// Reads a whole response to a workload request: within `timeout` from the request's start
/// (connecting, writing, the headers and every byte of the body: the connector's timeouts
/// bound each read, not a body sent a byte at a time) and at most [`MAX_RESPONSE_BYTES`]. No
/// workload request watches or streams, so the response is read whole here and handed on as
/// one buffer; kube then decodes it.
async fn bounded<F>(response: F, timeout: Duration) -> Result<Response<Full<Bytes>>, BoxError>
where
    F: Future<Output = Result<Response<Incoming>, BoxError>>,
{
    let read = async {
        let (parts, body) = response.await?.into_parts();
        let body = Limited::new(body, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<LengthLimitError>() {
                    BoxError::from(ResponseRefused::TooLarge)
                } else {
                    e
                }
            })?;
        Ok(Response::from_parts(parts, Full::new(body.to_bytes())))
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| BoxError::from(ResponseRefused::TooSlow(timeout)))?
}

/// How long a connection to a workload cluster stays open unused. kube's default client checks
/// idle connections only when it next needs one, which for a Cluster whose machines are all
/// ready is never: at 400 Clusters those connections held about 40 MB after a rollout. Shorter
/// than `--boot-report-interval`'s default: a Cluster whose machines boot is listed once an
/// interval, and a connection kept open between two listings held about 30 KB (TLS and HTTP
/// buffers) per Cluster; the next listing resumes the TLS session instead. A burst of renders
/// reuses its connections well within this.
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// Idle connections kept per workload cluster. A burst of reconciles of one Cluster's machines
/// opens up to `--concurrency` connections; a few are enough for the next burst.
const MAX_IDLE_CONNECTIONS: usize = 4;

/// kube's client stack (base URI, retry of 429/503/504, authentication, impersonation headers,
/// connector timeouts over rustls), over a connection pool whose idle connections are closed
/// after `idle_timeout` by a timer of their own; each attempt's response is read [`bounded`] by
/// `timeout` and [`MAX_RESPONSE_BYTES`].
fn pooled_client(
    config: &Config,
    idle_timeout: Duration,
    timeout: Duration,
) -> Result<Client, BoxError> {
    let mut connector = TimeoutConnector::new(https_connector(config)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let pool: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(idle_timeout)
            .pool_max_idle_per_host(MAX_IDLE_CONNECTIONS)
            .pool_timer(TokioTimer::new())
            .build(connector);
    // kube's server-aware policy retries 15 times and sleeps as long as a `Retry-After` says,
    // up to 1000 s each: a workload endpoint answering 503 with `Retry-After: 1000` would hold a
    // reconcile worker for hours. Here: 3 retries, 0.5 to 5 s apart, whatever the server says.
    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::default()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_future(move |response| bounded(response, timeout))
        .map_err(BoxError::from)
        .service(pool);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// TLS sessions a workload client keeps for resumption. rustls's default cache holds 32
/// servers' sessions and allocates room for them up front (about 15 KB); a workload client
/// talks to one apiserver, and one server's entry keeps its 8 newest TLS 1.3 tickets.
const TLS_SESSIONS: usize = 8;

/// kube's rustls connector (the kubeconfig's CA, client identity and `tls-server-name`) with
/// a session cache sized for one server. HTTPS only: `workload_kubeconfig::vet` already refuses
/// an `http://` server, and the connector refuses one too, so no later path can send the
/// token in clear.
fn https_connector(config: &Config) -> Result<HttpsConnector<HttpConnector>, BoxError> {
    let mut tls = config.rustls_client_config()?;
    tls.resumption = Resumption::in_memory_sessions(TLS_SESSIONS);
    let mut builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    if let Some(name) = &config.tls_server_name {
        let name = ServerName::try_from(name.clone())?;
        builder = builder.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    Ok(builder.enable_http1().wrap_connector(http))
}

/// Bounds every request to a workload cluster by `timeout`. The read timeout counts from when a
/// request is written, not from when its pooled connection went idle: without the reset, a
/// connection idle for longer than the timeout failed the next request at once.
fn with_timeouts(config: &mut Config, timeout: Duration) {
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config.reset_reader_on_write = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_clients_reset_the_read_timeout_on_write() {
        let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        with_timeouts(&mut config, Duration::from_secs(10));
        assert_eq!(config.read_timeout, Some(Duration::from_secs(10)));
        assert_eq!(config.connect_timeout, Some(Duration::from_secs(10)));
        assert!(config.reset_reader_on_write);
    }

    /// A stand-in for an apiserver, over TLS with a throw-away certificate for 127.0.0.1, that
    /// answers `/version` after `delay` and counts the connections its clients hold open. A
    /// local server, not a real apiserver: what is under test is when the client closes
    /// connections, which only the server's side of each connection shows. Returns a client
    /// config that trusts the certificate and the open-connection count.
    async fn counting_server(
        delay: Duration,
    ) -> (Config, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (listener, acceptor, config) = tls_listener().await;
        let open = Arc::new(AtomicUsize::new(0));
        let counter = open.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                let (counter, acceptor) = (counter.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_| async move {
                        tokio::time::sleep(delay).await;
                        let body = r#"{"major":"1","minor":"37","gitVersion":"v1.37.2"}"#;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from(body)),
                        ))
                    });
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let io = hyper_util::rt::TokioIo::new(tls);
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    }
                    counter.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (config, open)
    }

    /// A TLS acceptor with a self-signed certificate for 127.0.0.1, and that certificate (DER).
    /// A listener on 127.0.0.1 for a local TLS server, its acceptor (a throw-away certificate),
    /// and a client config that trusts it.
    async fn tls_listener() -> (tokio::net::TcpListener, tokio_rustls::TlsAcceptor, Config) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let (acceptor, ca) = throwaway_tls();
        let mut config = Config::new(url.parse().unwrap());
        config.root_cert = Some(vec![ca]);
        (listener, acceptor, config)
    }

    fn throwaway_tls() -> (tokio_rustls::TlsAcceptor, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let der = cert.der().to_vec();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        (
            tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server)),
            der,
        )
    }

    /// Waits (up to 10 s) until `open` reads `want`; returns what it read last.
    async fn settles_at(open: &std::sync::atomic::AtomicUsize, want: usize) -> usize {
        for _ in 0..200 {
            let now = open.load(std::sync::atomic::Ordering::SeqCst);
            if now == want {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        open.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn workload_connections_are_closed_once_idle_and_few_are_kept() {
        let (config, open) = counting_server(Duration::from_millis(300)).await;
        let client =
            pooled_client(&config, Duration::from_secs(2), Duration::from_secs(10)).unwrap();
        // A burst of 8 requests at once opens 8 connections; once they are answered, at most
        // MAX_IDLE_CONNECTIONS stay open for the next burst.
        let burst = (0..8).map(|_| client.apiserver_version());
        for version in futures::future::join_all(burst).await {
            assert_eq!(version.unwrap().git_version, "v1.37.2");
        }
        assert_eq!(
            settles_at(&open, MAX_IDLE_CONNECTIONS).await,
            MAX_IDLE_CONNECTIONS
        );
        // Unused for longer than the idle timeout, the rest are closed too, while the client
        // itself is still alive and cached.
        assert_eq!(settles_at(&open, 0).await, 0);
        // And the client still works, over a new connection.
        assert_eq!(client.apiserver_version().await.unwrap().minor, "37");
    }

    #[tokio::test]
    async fn clients_unused_for_a_minute_are_dropped_with_their_connections() {
        let (config, open) = counting_server(Duration::ZERO).await;
        let key = |cluster: &str| ("ns".to_owned(), cluster.to_owned());
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut cached = Cached::default();
        // Connections stay open an hour when idle: only dropping the client closes them.
        let quiet =
            pooled_client(&config, Duration::from_secs(3600), Duration::from_secs(10)).unwrap();
        quiet.apiserver_version().await.unwrap();
        assert_eq!(settles_at(&open, 1).await, 1);
        cached.insert(key("quiet"), "1".into(), quiet, at(0));
        let busy =
            pooled_client(&config, Duration::from_secs(3600), Duration::from_secs(10)).unwrap();
        cached.insert(key("busy"), "1".into(), busy, at(1));
        // Used within the minute, a client is kept; a rotated kubeconfig is a miss.
        assert!(cached.get(&key("busy"), "1", at(40)).is_some());
        assert!(cached.get(&key("busy"), "2", at(40)).is_none());
        // The next new client, 70 s in, drops the one unused since 0 s, not the one used at 40 s.
        let other =
            pooled_client(&config, Duration::from_secs(3600), Duration::from_secs(10)).unwrap();
        cached.insert(key("other"), "1".into(), other, at(70));
        assert!(cached.get(&key("quiet"), "1", at(70)).is_none());
        assert!(cached.get(&key("busy"), "1", at(70)).is_some());
        assert_eq!(
            settles_at(&open, 0).await,
            0,
            "the dropped client's connection"
        );
        // Looked for at most every 30 s: a new client 10 s later scans nothing.
        cached.insert(
            key("late"),
            "1".into(),
            Client::try_from(config.clone()).unwrap(),
            at(80),
        );
        assert_eq!(cached.swept, Some(at(70)));
        assert_eq!(cached.clients.len(), 3);
        // A lookup drops them too, with no new client built: at 150 s every client is unused
        // for more than a minute, the one asked for included.
        assert!(cached.get(&key("late"), "1", at(150)).is_none());
        assert!(cached.clients.is_empty());
    }

    /// A stand-in for a hostile workload endpoint (a real apiserver never does this), over TLS:
    /// answers every request with a chunked body of `chunk` bytes every `pause`, without end.
    /// Returns a client config that trusts it and the count of body bytes it wrote.
    async fn endless_server(
        chunk: usize,
        pause: Duration,
    ) -> (Config, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (listener, acceptor, config) = tls_listener().await;
        let written = Arc::new(AtomicUsize::new(0));
        let counter = written.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (counter, acceptor) = (counter.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                transfer-encoding: chunked\r\n\r\n";
                    if tls.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let data = format!("{chunk:x}\r\n{}\r\n", " ".repeat(chunk));
                    while tls.write_all(data.as_bytes()).await.is_ok() {
                        counter.fetch_add(chunk, Ordering::SeqCst);
                        tokio::time::sleep(pause).await;
                    }
                });
            }
        });
        (config, written)
    }

    /// An endpoint that streams without end is read up to the cap, then dropped: the request
    /// fails saying so, and the client stops reading (the server's writes then stall on a full
    /// socket, a few buffers past the cap).
    #[tokio::test]
    async fn a_response_past_the_cap_is_refused_and_no_longer_read() {
        let (config, written) = endless_server(64 << 10, Duration::ZERO).await;
        let client =
            pooled_client(&config, Duration::from_secs(2), Duration::from_secs(60)).unwrap();
        let asked = tokio::time::timeout(Duration::from_secs(30), client.apiserver_version());
        let err = asked.await.expect("ends before its timeout").unwrap_err();
        assert!(err.to_string().contains("larger than 4 MiB"), "{err}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sent = written.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let later = written.load(std::sync::atomic::Ordering::SeqCst);
        assert!(sent >= MAX_RESPONSE_BYTES, "read up to the cap: {sent}");
        assert!(later < 4 * MAX_RESPONSE_BYTES, "not read on: {later} bytes");
    }

    /// A workload endpoint that answers every request with 503 and `Retry-After: 1000` gets a
    /// few retries a few seconds apart, not hours of them.
    #[tokio::test]
    async fn a_server_asking_to_retry_much_later_is_not_waited_for() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let asked = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let (listener, acceptor, config) = tls_listener().await;
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (counter, acceptor) = (counter.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        async move {
                            let mut response = hyper::Response::new(http_body_util::Full::new(
                                bytes::Bytes::new(),
                            ));
                            *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                            response
                                .headers_mut()
                                .insert("retry-after", http::HeaderValue::from_static("1000"));
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let io = hyper_util::rt::TokioIo::new(tls);
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    }
                });
            }
        });
        let client =
            pooled_client(&config, Duration::from_secs(2), Duration::from_secs(5)).unwrap();
        let version = tokio::time::timeout(Duration::from_secs(60), client.apiserver_version());
        let err = version
            .await
            .expect("given up within a minute")
            .unwrap_err();
        assert!(err.to_string().contains("503"), "{err}");
        assert_eq!(asked.load(Ordering::SeqCst), 4, "the request and 3 retries");
    }

    /// A body sent a little at a time never trips the connector's read timeout; the whole
    /// response is bounded by the request's timeout.
    #[tokio::test]
    async fn a_response_that_trickles_ends_at_the_request_timeout() {
        let (config, _) = endless_server(16, Duration::from_millis(50)).await;
        let timeout = Duration::from_secs(1);
        let client = pooled_client(&config, Duration::from_secs(2), timeout).unwrap();
        let asked = tokio::time::timeout(Duration::from_secs(30), client.apiserver_version());
        let err = asked.await.expect("ends at its timeout").unwrap_err();
        assert!(
            err.to_string().contains("did not answer in full within 1s"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_plain_http_server_is_never_spoken_to() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let config = Config::new(url.parse().unwrap());
        let client =
            pooled_client(&config, Duration::from_secs(2), Duration::from_secs(10)).unwrap();
        // A plain-HTTP client would send its request and wait for an answer that never comes.
        let asked = tokio::time::timeout(Duration::from_secs(5), client.apiserver_version());
        let err = asked.await.expect("refused at once").unwrap_err();
        assert!(format!("{err:?}").contains("unsupported scheme"), "{err:?}");
    }

    /// Why `build_client` refuses a kubeconfig Secret holding `text`.
    async fn refusal(text: String) -> String {
        let secret = Secret {
            data: Some(std::collections::BTreeMap::from([(
                "value".to_owned(),
                k8s_openapi::ByteString(text.into_bytes()),
            )])),
            ..Secret::default()
        };
        let built = build_client(&secret, "ns", "c-kubeconfig", Duration::from_secs(1)).await;
        built.err().expect("refused").to_string()
    }

    /// kube's reader quotes the lines around a problem; the condition gets where, not what.
    #[tokio::test]
    async fn a_kubeconfig_parse_error_quotes_no_line_of_it() {
        let text =
            "apiVersion: v1\nusers: [{name: u, user: {token: SECRET-TOKEN}}\nclusters: [x: {y\n";
        let message = refusal(text.to_owned()).await;
        assert!(message.contains("not a kubeconfig"), "{message}");
        assert!(message.contains("line 3"), "{message}");
        assert!(!message.contains("SECRET-TOKEN"), "{message}");
    }

    /// A tenant writes the kubeconfig Secret: a kubeconfig whose aliases repeat a 200 KB
    /// string 500 times (100 MB once expanded, from 200 KB) is refused before kube reads it.
    #[tokio::test]
    async fn a_kubeconfig_alias_bomb_is_refused_before_it_is_read() {
        let names = vec!["{name: *s}"; 500].join(", ");
        let text = format!(
            "apiVersion: v1\nkind: Config\nx: &s \"{}\"\nclusters: [{names}]\n",
            "A".repeat(200_000)
        );
        let message = refusal(text).await;
        assert!(message.contains("Secret ns/c-kubeconfig"), "{message}");
        assert!(
            message.contains("grows past") && message.contains("line 3"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn caches_forget_deleted_clusters() {
        let clients = WorkloadClients::default();
        let client =
            Client::try_from(Config::new("https://127.0.0.1:6443".parse().unwrap())).unwrap();
        for cluster in ["c1", "c2"] {
            let key = ("ns".to_owned(), cluster.to_owned());
            clients
                .cached
                .lock()
                .unwrap()
                .insert(key, "1".into(), client.clone(), Instant::now());
        }
        clients.forget("ns", "c1");
        assert!(!clients.holds("ns", "c1"));
        assert!(clients.holds("ns", "c2"));
        let hashes = crate::k8s::certs::CaHashes::default();
        let ca = crate::k8s::certs::CaCert {
            hash: "sha256:ab".into(),
            pem: String::new(),
        };
        hashes.remember("ns", "c1", "1", ca);
        hashes.forget("ns", "c1");
        assert_eq!(hashes.cached("ns", "c1", "1"), None);
    }
}
