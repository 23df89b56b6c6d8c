//! Certificate authorities the tests make: a workload cluster's CA (the `<cluster>-ca` Secret's
//! pair, which also signs that apiserver's serving certificate and the client certificates of
//! the kubeconfig Cluster API generates) and the CAs behind the webhooks' serving certificates.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A self-signed CA: its certificate and key in PEM.
#[derive(Clone, Debug)]
pub struct TestCa {
    /// The CA certificate (PEM).
    pub cert_pem: String,
    /// The CA's private key (PKCS#8 PEM).
    pub key_pem: String,
    params: CertificateParams,
}

/// A leaf certificate and its key in PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new CA whose subject's common name is `common_name` (kubeadm's is `kubernetes`).
    pub fn new(common_name: &str) -> TestCa {
        let key = KeyPair::generate().expect("key generation");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common_name);
        params.distinguished_name = name;
        let cert = params.self_signed(&key).expect("self-signed CA");
        TestCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            params,
        }
    }

    /// The CA hash a kubeadm join checks the cluster CA against: `sha256:` and the hex SHA-256
    /// of the CA's DER SubjectPublicKeyInfo. Computed from the key pair rcgen made, not from
    /// the certificate the way bootplate computes it, so the two cannot share a mistake.
    pub fn ca_hash(&self) -> String {
        use rcgen::PublicKeyData as _;
        use sha2::Digest as _;
        let key = KeyPair::from_pem(&self.key_pem).expect("the CA's own key parses");
        let digest = sha2::Sha256::digest(key.subject_public_key_info());
        format!("sha256:{}", hex::encode(digest))
    }

    fn issuer(&self) -> Issuer<'static, KeyPair> {
        let key = KeyPair::from_pem(&self.key_pem).expect("the CA's own key parses");
        Issuer::new(self.params.clone(), key)
    }

    /// A serving certificate for 127.0.0.1 and localhost, and for 10.0.2.2: the host as a qemu
    /// guest with user-mode networking sees it (tests/tests/vm.rs).
    pub fn serving(&self) -> Leaf {
        self.serving_for(&["127.0.0.1", "localhost", "10.0.2.2"])
    }

    /// A serving certificate for `names` (IP addresses or DNS names; the first is also the
    /// subject's common name).
    pub fn serving_for(&self, names: &[&str]) -> Leaf {
        let key = KeyPair::generate().expect("key generation");
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .expect("serving params");
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or_default(),
        );
        let cert = params.signed_by(&key, &self.issuer()).expect("signing");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A client certificate for user `common_name` in group `organization`.
    pub fn client(&self, common_name: &str, organization: &str) -> Leaf {
        self.client_expiring(common_name, organization, None)
    }

    /// [`TestCa::client`], valid until `not_after` when given (a kubelet's certificate before
    /// its rotation).
    pub fn client_expiring(
        &self,
        common_name: &str,
        organization: &str,
        not_after: Option<std::time::SystemTime>,
    ) -> Leaf {
        let key = KeyPair::generate().expect("key generation");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        if let Some(not_after) = not_after {
            params.not_after = not_after.into();
        }
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer()).expect("signing");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes the CA certificate and a serving certificate to `dir` as `ca.crt`, `tls.crt`
    /// and `tls.key` (the layout controller-runtime and bootplate read).
    pub fn write_serving(&self, dir: &Path) -> std::io::Result<()> {
        let leaf = self.serving();
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("ca.crt"), &self.cert_pem)?;
        std::fs::write(dir.join("tls.key"), &leaf.key_pem)?;
        std::fs::write(dir.join("tls.crt"), &leaf.cert_pem)
    }
}
