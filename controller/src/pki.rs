//! Key material: cluster CAs, the service-account key, and the CA hash kubeadm verifies.
//!
//! rcgen generates (with ring, the same crypto provider the Kubernetes client uses) and
//! x509-parser reads; no hand-written ASN.1.

use render::KeyPair;
use sha2::{Digest, Sha256};

/// A key or certificate that cannot be generated or read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Generation failed.
    #[error("cannot generate key material: {0}")]
    Generate(#[from] rcgen::Error),
    /// Not a PEM certificate.
    #[error("not a PEM certificate: {0}")]
    Certificate(String),
    /// Not a PEM private key.
    #[error("not a PEM private key: {0}")]
    PrivateKey(String),
}

const YEAR_SECONDS: u64 = 31_556_952;

/// A self-signed CA certificate valid for ten years, with its private key.
pub fn generate_ca(common_name: &str) -> Result<KeyPair, PkiError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyUsagePurpose};
    let key = rcgen::KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let year = |secs: u64| 1970 + (secs / YEAR_SECONDS) as i32;
    // A day of slack for clocks that lag behind the controller's.
    params.not_before = rcgen::date_time_ymd(year(now.saturating_sub(86_400)), 1, 1);
    params.not_after = rcgen::date_time_ymd(year(now) + 10, 1, 1);
    let cert = params.self_signed(&key)?;
    Ok(KeyPair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A service-account signing key pair; `cert` holds the public key (PEM), as kubeadm's `sa.pub`.
pub fn generate_service_account_key() -> Result<KeyPair, PkiError> {
    let key = rcgen::KeyPair::generate()?;
    Ok(KeyPair {
        cert: key.public_key_pem(),
        key: key.serialize_pem(),
    })
}

/// `sha256:<hex>` of the certificate's DER SubjectPublicKeyInfo: the value of
/// `kubeadm join --discovery-token-ca-cert-hash`.
pub fn ca_cert_hash(cert_pem: &str) -> Result<String, PkiError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| PkiError::Certificate(e.to_string()))?;
    if pem.label != "CERTIFICATE" {
        return Err(PkiError::Certificate(format!(
            "PEM block is {:?}, not CERTIFICATE",
            pem.label
        )));
    }
    let cert = pem
        .parse_x509()
        .map_err(|e| PkiError::Certificate(e.to_string()))?;
    let spki = cert.tbs_certificate.subject_pki.raw;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(spki))))
}

/// Checks that `pair.cert` is a certificate (or, for the service-account pair, a public key)
/// and `pair.key` a private key whose DER parses, and, for PKCS#8 keys (what bootplate and
/// kubeadm write), that the key belongs to the certificate. Garbage is reported where it is
/// found, not when a machine fails to boot.
pub fn check_key_pair(pair: &KeyPair) -> Result<(), PkiError> {
    use x509_parser::prelude::FromDer;
    let cert = first_pem(&pair.cert).map_err(PkiError::Certificate)?;
    let public_key: Vec<u8> = match cert.label.as_str() {
        "CERTIFICATE" => {
            let parsed = cert
                .parse_x509()
                .map_err(|e| PkiError::Certificate(e.to_string()))?;
            parsed
                .tbs_certificate
                .subject_pki
                .subject_public_key
                .data
                .to_vec()
        }
        "PUBLIC KEY" => {
            let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&cert.contents)
                .map_err(|e| PkiError::Certificate(format!("not a public key: {e}")))?;
            spki.subject_public_key.data.to_vec()
        }
        "RSA PUBLIC KEY" => Vec::new(),
        other => return Err(PkiError::Certificate(format!("PEM block is {other:?}"))),
    };
    let key = first_pem(&pair.key).map_err(PkiError::PrivateKey)?;
    if !key.label.ends_with("PRIVATE KEY") || key.contents.is_empty() {
        return Err(PkiError::PrivateKey(format!(
            "PEM block is {:?}",
            key.label
        )));
    }
    match x509_parser::der_parser::parse_der(&key.contents) {
        Ok(([], _)) => {}
        _ => return Err(PkiError::PrivateKey("the key is not valid DER".to_owned())),
    }
    // rcgen (ring) reads PKCS#8 EC, Ed25519 and RSA keys; others are only checked to parse.
    if key.label == "PRIVATE KEY"
        && !public_key.is_empty()
        && let Ok(loaded) = rcgen::KeyPair::from_pem(&pair.key)
        && loaded.public_key_raw() != public_key.as_slice()
    {
        return Err(PkiError::PrivateKey(
            "the key does not belong to the certificate".to_owned(),
        ));
    }
    Ok(())
}

fn first_pem(text: &str) -> Result<x509_parser::pem::Pem, String> {
    x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .next()
        .ok_or_else(|| "no PEM block".to_owned())?
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_hash_matches_openssl() {
        let ca = generate_ca("kubernetes").unwrap();
        check_key_pair(&ca).unwrap();
        let ours = ca_cert_hash(&ca.cert).unwrap();
        // The same value computed by openssl, as kubeadm's documentation does it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, &ca.cert).unwrap();
        let script = format!(
            "openssl x509 -pubkey -in {} | openssl pkey -pubin -outform der | sha256sum",
            path.display()
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl failed: {out:?}");
        let theirs = String::from_utf8(out.stdout).unwrap();
        let theirs = theirs.split_whitespace().next().unwrap();
        assert_eq!(ours, format!("sha256:{theirs}"));
    }

    #[test]
    fn garbage_is_rejected() {
        let ca = generate_ca("kubernetes").unwrap();
        let garbage = KeyPair {
            cert: "not a certificate".into(),
            key: ca.key.clone(),
        };
        assert!(matches!(
            check_key_pair(&garbage),
            Err(PkiError::Certificate(_))
        ));
        let swapped = KeyPair {
            cert: ca.cert.clone(),
            key: ca.cert.clone(),
        };
        assert!(matches!(
            check_key_pair(&swapped),
            Err(PkiError::PrivateKey(_))
        ));
        assert!(ca_cert_hash(&ca.key).is_err(), "a key is not a certificate");
        let sa = generate_service_account_key().unwrap();
        check_key_pair(&sa).unwrap();
        // A key that parses but belongs to another certificate.
        let other = generate_ca("other").unwrap();
        let mismatched = KeyPair {
            cert: ca.cert.clone(),
            key: other.key.clone(),
        };
        assert!(
            matches!(check_key_pair(&mismatched), Err(PkiError::PrivateKey(m)) if m.contains("does not belong"))
        );
        let sa_mismatch = KeyPair {
            cert: sa.cert.clone(),
            key: ca.key.clone(),
        };
        assert!(check_key_pair(&sa_mismatch).is_err());
        // A key whose base64 decodes to something that is not DER.
        let not_der = KeyPair {
            cert: ca.cert.clone(),
            key: "-----BEGIN PRIVATE KEY-----\naGVsbG8gd29ybGQ=\n-----END PRIVATE KEY-----\n"
                .into(),
        };
        assert!(
            matches!(check_key_pair(&not_der), Err(PkiError::PrivateKey(m)) if m.contains("DER"))
        );
    }

    #[test]
    fn keys_written_by_openssl_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        let status = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=kubernetes",
                "-days",
                "1",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl is required (tests/scripts/install-tools.sh)");
        assert!(status.status.success(), "{status:?}");
        let pair = KeyPair {
            cert: std::fs::read_to_string(&cert).unwrap(),
            key: std::fs::read_to_string(&key).unwrap(),
        };
        check_key_pair(&pair).unwrap();
        ca_cert_hash(&pair.cert).unwrap();
    }
}
