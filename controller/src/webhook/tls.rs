//! The webhook's serving certificate, reloaded when `tls.crt` or `tls.key` change on disk
//! (cert-manager rotates them in the mounted Secret) without dropping connections.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};

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
