//! HTTPS serving for the webhook and `bootplate generator serve`: the serving certificate,
//! reloaded when `tls.crt` or `tls.key` change on disk (cert-manager rotates them in the
//! mounted Secret) without dropping connections, optionally a required client certificate,
//! and the accept loop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{debug, info, warn};

/// Serves `app` over HTTPS on `addr` with the certificate in `cert_dir` until the process
/// ends; `flag` names the address in the error when it cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    cert_dir: &Path,
    app: axum::Router,
    flag: &str,
) -> anyhow::Result<()> {
    serve_with_clients(addr, cert_dir, None, app, flag).await
}

/// [`serve`]; with `client_ca` (the path of PEM CA certificates), a client must present a
/// certificate one of them signed, or the TLS handshake fails before any request is read.
pub async fn serve_with_clients(
    addr: SocketAddr,
    cert_dir: &Path,
    client_ca: Option<&Path>,
    app: axum::Router,
    flag: &str,
) -> anyhow::Result<()> {
    let cert = ReloadingCert::watch(cert_dir)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {flag} {addr}: {e}"))?;
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let tls = match acceptor.accept(stream).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                };
                let service = TowerToHyperService::new(app);
                let served = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
                if let Err(e) = served {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
    });
    Ok(())
}

/// A verifier accepting client certificates signed by a CA of the PEM file `path`.
fn client_verifier(
    path: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> anyhow::Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    let named = |e: &dyn std::fmt::Display| anyhow::anyhow!("client CA {}: {e}", path.display());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| named(&e))? {
        roots
            .add(cert.map_err(|e| named(&e))?)
            .map_err(|e| named(&e))?;
    }
    if roots.is_empty() {
        anyhow::bail!("client CA {}: no CA certificate", path.display());
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| named(&e))
}

/// How often the files are checked for changes.
const POLL: Duration = Duration::from_secs(2);

/// Serves the current certificate of a directory holding `tls.crt` and `tls.key`.
#[derive(Debug)]
pub struct ReloadingCert {
    dir: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    /// Loads the certificate now (an error if it is missing or broken) and checks for changes
    /// every two seconds from then on.
    pub fn watch(dir: &Path) -> anyhow::Result<Arc<Self>> {
        let key = load(dir)?;
        let cert = Arc::new(ReloadingCert {
            dir: dir.to_owned(),
            current: RwLock::new(Arc::new(key)),
        });
        let watched = Arc::downgrade(&cert);
        let mut seen = modified(dir);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(POLL).await;
                let Some(cert) = watched.upgrade() else {
                    return;
                };
                let now = modified(&cert.dir);
                if now == seen {
                    continue;
                }
                // A half-written pair fails to load; keep serving the old one and retry.
                match load(&cert.dir) {
                    Ok(key) => {
                        *cert.current.write().expect("cert lock") = Arc::new(key);
                        seen = now;
                        info!(dir = %cert.dir.display(), "webhook certificate reloaded");
                    }
                    Err(e) => warn!(error = %e, "cannot reload the webhook certificate yet"),
                }
            }
        });
        Ok(cert)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("cert lock").clone())
    }
}

/// The same files serve as a client certificate (bootplate's, on calls to generators).
impl rustls::client::ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("cert lock").clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn modified(dir: &Path) -> Option<(SystemTime, SystemTime)> {
    let time = |f: &str| {
        std::fs::metadata(dir.join(f))
            .and_then(|m| m.modified())
            .ok()
    };
    Some((time("tls.crt")?, time("tls.key")?))
}

fn load(dir: &Path) -> anyhow::Result<CertifiedKey> {
    let crt = dir.join("tls.crt");
    let key = dir.join("tls.key");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&crt)
        .map_err(|e| anyhow::anyhow!("{}: {e}", crt.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", crt.display()))?;
    if chain.is_empty() {
        anyhow::bail!("{}: no certificate", crt.display());
    }
    let private = PrivateKeyDer::from_pem_file(&key)
        .map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(private)
        .map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
    Ok(CertifiedKey::new(chain, signing))
}
