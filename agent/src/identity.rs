//! The node's identity: its kubeconfig, loaded again whenever it or a file it names changes.
//!
//! A kubelet rotates its client certificate (`kubelet.conf` names
//! `/var/lib/kubelet/pki/kubelet-client-current.pem`, which the kubelet replaces well before the
//! certificate expires). A client built once keeps the certificate it was built with and is
//! refused once that expires. So before each pass the agent reads the kubeconfig and every file
//! it names (certificate authority, client certificate and key, token file) and builds a new
//! client when any byte differs; otherwise it keeps the client and its connections.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// The longest kubeconfig, or file it names, the agent reads.
const FILE_LIMIT: u64 = 1 << 20;

/// Where the agent's client comes from.
pub enum Identity {
    /// A client used as it is (tests that run the agent in-process).
    Fixed(kube::Client),
    /// A kubeconfig file, followed as it changes.
    Kubeconfig(Reloading),
}

/// A kubeconfig file and the client built from what it (and the files it names) held.
pub struct Reloading {
    path: PathBuf,
    current: Mutex<Option<(Vec<u8>, kube::Client)>>,
}

impl Identity {
    /// The identity in the kubeconfig at `path`.
    pub fn kubeconfig(path: impl Into<PathBuf>) -> Identity {
        Identity::Kubeconfig(Reloading {
            path: path.into(),
            current: Mutex::new(None),
        })
    }

    /// The client for this pass.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        match self {
            Identity::Fixed(client) => Ok(client.clone()),
            Identity::Kubeconfig(reloading) => reloading.client().await,
        }
    }
}

impl From<kube::Client> for Identity {
    fn from(client: kube::Client) -> Identity {
        Identity::Fixed(client)
    }
}

impl Reloading {
    async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = Kubeconfig::read_from(&self.path)?;
        let fingerprint = fingerprint(&self.path, &kubeconfig)?;
        if let Some((seen, client)) = &*self.current.lock().expect("not poisoned")
            && *seen == fingerprint
        {
            return Ok(client.clone());
        }
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        let client = kube::Client::try_from(config)?;
        let reloaded = self.current.lock().expect("not poisoned").is_some();
        if reloaded {
            tracing::info!(kubeconfig = %self.path.display(), "the kubeconfig or a file it names changed: new client");
        }
        *self.current.lock().expect("not poisoned") = Some((fingerprint, client.clone()));
        Ok(client)
    }
}

/// The kubeconfig's bytes followed by those of every file it names, each with its path.
fn fingerprint(path: &Path, kubeconfig: &Kubeconfig) -> anyhow::Result<Vec<u8>> {
    let mut named: Vec<&String> = Vec::new();
    for cluster in kubeconfig
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref())
    {
        named.extend(&cluster.certificate_authority);
    }
    for user in kubeconfig
        .auth_infos
        .iter()
        .filter_map(|a| a.auth_info.as_ref())
    {
        named.extend(&user.client_certificate);
        named.extend(&user.client_key);
        named.extend(&user.token_file);
    }
    let mut out = read_bounded(path)?;
    for file in named {
        out.extend_from_slice(file.as_bytes());
        out.push(0);
        // A file that cannot be read is part of the picture too: the client build will say why.
        out.extend(read_bounded(Path::new(file)).unwrap_or_default());
        out.push(0);
    }
    Ok(out)
}

fn read_bounded(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(FILE_LIMIT + 1)
        .read_to_end(&mut bytes)?;
    anyhow::ensure!(
        bytes.len() as u64 <= FILE_LIMIT,
        "{} is larger than {FILE_LIMIT} bytes",
        path.display()
    );
    Ok(bytes)
}
