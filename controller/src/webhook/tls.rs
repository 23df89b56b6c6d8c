//! HTTPS serving for the webhook, the Runtime SDK extension and `bootplate generator serve`:
//! the serving certificate, reloaded when `tls.crt` or `tls.key` change on disk (cert-manager
//! rotates them in the mounted Secret) without dropping connections, and, when a client CA is
//! given, client certificates checked against it (reloaded the same way). The connections
//! themselves are bounded by [`crate::server`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};

use crate::server::{Limits, Transport};

/// Who may talk to a TLS server.
#[derive(Clone, Debug, Default)]
pub enum ClientAuth {
    /// Anyone: the caller is not asked for a certificate.
    #[default]
    Anyone,
    /// Only a caller presenting a certificate signed by a CA in this PEM file; any other
    /// caller fails the handshake, before a byte of its request is read. While the file is
    /// missing or holds no CA, every caller is refused.
    CertificateFrom(PathBuf),
}

/// Serves `app` over HTTPS on `addr` with the certificate in `cert_dir` until the process
/// ends; `flag` names the address in the error when it cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    cert_dir: &Path,
    app: axum::Router,
    flag: &str,
) -> anyhow::Result<()> {
    serve_with(
        addr,
        cert_dir,
        ClientAuth::Anyone,
        app,
        flag,
        Limits::default(),
    )
    .await
}

/// [`serve`], with `clients` deciding who may connect and `limits` bounding each connection.
pub async fn serve_with(
    addr: SocketAddr,
    cert_dir: &Path,
    clients: ClientAuth,
    app: axum::Router,
    flag: &str,
    limits: Limits,
) -> anyhow::Result<()> {
    let configs = ServerConfigs::watch(ReloadingCert::watch(cert_dir)?, clients);
    let transport = Transport::Tls(Arc::new(move || configs.current()));
    crate::server::serve(addr, flag, transport, app, limits).await
}

/// The TLS configuration new connections get: rebuilt when the client CA file changes (the
/// serving certificate is resolved per handshake by [`ReloadingCert`]). `None` while the
/// client CA cannot be loaded: every connection is then closed unanswered (the CA's Secret
/// may be created after the controller starts; the rest of the process keeps running).
struct ServerConfigs {
    cert: Arc<ReloadingCert>,
    clients: ClientAuth,
    current: RwLock<Option<Arc<rustls::ServerConfig>>>,
}

impl ServerConfigs {
    fn watch(cert: Arc<ReloadingCert>, clients: ClientAuth) -> Arc<Self> {
        let config = match server_config(&cert, &clients) {
            Ok(config) => Some(Arc::new(config)),
            Err(e) => {
                warn!(error = %e, "no client CA yet: every caller is refused until it loads");
                None
            }
        };
        let configs = Arc::new(ServerConfigs {
            cert,
            clients,
            current: RwLock::new(config),
        });
        if let ClientAuth::CertificateFrom(file) = &configs.clients {
            let file = file.clone();
            let stamp = move || modified_at(&file);
            poll_changes(Arc::downgrade(&configs), stamp, |configs| {
                let config = server_config(&configs.cert, &configs.clients)?;
                *configs.current.write().expect("config lock") = Some(Arc::new(config));
                info!("client CA loaded");
                Ok(())
            });
        }
        configs
    }

    fn current(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.current.read().expect("config lock").clone()
    }
}

fn server_config(
    cert: &Arc<ReloadingCert>,
    clients: &ClientAuth,
) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match clients {
        ClientAuth::Anyone => builder.with_no_client_auth(),
        ClientAuth::CertificateFrom(file) => {
            let roots = client_roots(file)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(cert.clone());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The CA certificates of a PEM file; an error names the file when it has none.
fn client_roots(file: &Path) -> anyhow::Result<rustls::RootCertStore> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    }
    if roots.is_empty() {
        anyhow::bail!("{}: no CA certificate", file.display());
    }
    Ok(roots)
}

/// Calls `reload` on `target` whenever `stamp` changes (checked every [`POLL`]) and `reload`
/// succeeds; stops when `target` is dropped. A failed reload (a half-written file) is retried
/// at the next check, the old state kept meanwhile.
fn poll_changes<T, S>(
    target: Weak<T>,
    stamp: impl Fn() -> S + Send + 'static,
    reload: impl Fn(&T) -> anyhow::Result<()> + Send + 'static,
) where
    T: Send + Sync + 'static,
    S: PartialEq + Send + 'static,
{
    let mut seen = stamp();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(POLL).await;
            let Some(target) = target.upgrade() else {
                return;
            };
            let now = stamp();
            if now == seen {
                continue;
            }
            match reload(&target) {
                Ok(()) => seen = now,
                Err(e) => warn!(error = %e, "cannot reload a TLS file yet"),
            }
        }
    });
}

fn modified_at(file: &Path) -> Option<SystemTime> {
    std::fs::metadata(file).and_then(|m| m.modified()).ok()
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
        let watched = dir.to_owned();
        poll_changes(
            Arc::downgrade(&cert),
            move || modified(&watched),
            |cert| {
                *cert.current.write().expect("cert lock") = Arc::new(load(&cert.dir)?);
                info!(dir = %cert.dir.display(), "serving certificate reloaded");
                Ok(())
            },
        );
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
    Some((
        modified_at(&dir.join("tls.crt"))?,
        modified_at(&dir.join("tls.key"))?,
    ))
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
