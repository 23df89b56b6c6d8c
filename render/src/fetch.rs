//! Fetch delivery (docs/boot-channel.md, "Fetch delivery"): instead of the whole render, the
//! user-data is a small stub in the template's format; the render itself, in the `script`
//! format, is sealed here and stored in the workload cluster by the controller.
//!
//! Sealing is AES-256-CTR, then HMAC-SHA256 over the IV (as hex text) and the ciphertext
//! (encrypt-then-MAC), so a node undoes it with `openssl dgst` and `openssl enc` alone. The
//! keys and the IV are inputs (the controller draws them at random per render): the render
//! stays a pure function.
//!
//! The stub holds the workload API endpoint, the hash of the cluster CA's public key, the
//! machine's bootstrap token, the payload's name and the two keys. It reads
//! `kube-public/cluster-info` without trusting the server, checks the CA in it against the hash
//! (as `kubeadm join` discovery does) and from then on trusts only that CA; it reads the payload
//! Secret with the token, checks its MAC, decrypts it and runs it. Each failure stops the boot
//! with a message on standard error and the console.

use aes::Aes256;
use ctr::cipher::{KeyIvInit, StreamCipher};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::helpers::quote;

/// The largest stub, in bytes.
pub const STUB_LIMIT: usize = 2048;

/// The payload Secret's keys: the IV (hex), the MAC (hex) and the ciphertext.
pub const IV_KEY: &str = "iv";
pub const MAC_KEY: &str = "mac";
pub const PAYLOAD_KEY: &str = "payload";

/// The namespace of the payload Secret in the workload cluster.
pub const NAMESPACE: &str = "kube-system";

/// Where and how a machine fetches its render.
#[derive(Clone, PartialEq)]
pub struct Fetch {
    /// `https://host:port` of the workload cluster's apiserver.
    pub server: String,
    /// `sha256:<hex>` of the cluster CA's public key (kubeadm's `caCertHashes` form).
    pub ca_hash: String,
    /// The machine's bootstrap token, `<id>.<secret>`.
    pub token: String,
    /// The payload Secret's name (in [`NAMESPACE`]).
    pub name: String,
    /// The keys the payload is sealed with.
    pub keys: PayloadKeys,
}

impl std::fmt::Debug for Fetch {
    // The token and the keys never reach debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetch")
            .field("server", &self.server)
            .field("ca_hash", &self.ca_hash)
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// A cipher key, a MAC key and an IV, drawn at random for each render.
#[derive(Clone, PartialEq, Eq)]
pub struct PayloadKeys {
    pub cipher: [u8; 32],
    pub mac: [u8; 32],
    pub iv: [u8; 16],
}

/// A sealed payload, as the Secret's three keys hold it.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The IV, as lowercase hex.
    pub iv: String,
    /// HMAC-SHA256 of the IV's hex text followed by the ciphertext, as lowercase hex.
    pub mac: String,
    /// The ciphertext.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealed(<{} bytes>)", self.data.len())
    }
}

/// Encrypts `plain` with `keys` and authenticates the result.
pub fn seal(plain: &[u8], keys: &PayloadKeys) -> Sealed {
    let mut data = plain.to_vec();
    ctr::Ctr128BE::<Aes256>::new(&keys.cipher.into(), &keys.iv.into()).apply_keystream(&mut data);
    let iv = hex::encode(keys.iv);
    Sealed {
        mac: mac(&keys.mac, &iv, &data),
        iv,
        data,
    }
}

/// The plain text of `sealed`, or `None` when its MAC does not match.
pub fn open(sealed: &Sealed, keys: &PayloadKeys) -> Option<Vec<u8>> {
    let expected = mac(&keys.mac, &sealed.iv, &sealed.data);
    let iv: [u8; 16] = hex::decode(&sealed.iv).ok()?.try_into().ok()?;
    // Compared in full: the MAC is public, only the keys are secret.
    if expected != sealed.mac {
        return None;
    }
    let mut data = sealed.data.clone();
    ctr::Ctr128BE::<Aes256>::new(&keys.cipher.into(), &iv.into()).apply_keystream(&mut data);
    Some(data)
}

fn mac(key: &[u8; 32], iv_hex: &str, data: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(iv_hex.as_bytes());
    mac.update(data);
    hex::encode(mac.finalize().into_bytes())
}

/// Reads the payload Secret's JSON from `p` (compact, or pretty as the apiserver answers curl),
/// checks it with `$M`, decrypts it with `$K` into
/// `x.sh`; calls `f` with a message on a failure. Shared with the test that runs it.
const OPEN: &str = r#"g() { sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" p | base64 -d; }
g iv >v; g payload >e
m=$(cat v e | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$M" | sed 's/.*= *//')
[ "$m" = "$(g mac)" ] || f "$N fails its integrity check"
openssl enc -d -aes-256-ctr -K "$K" -iv "$(cat v)" -in e -out x.sh || f "cannot decrypt $N"
"#;

/// The stub's steps before [`OPEN`]: the CA checked against `$H`, the payload read with `$T`.
const FETCH: &str = r#"f() { echo "bootplate fetch: $*" >&2; exit 1; }
D=/run/bootplate-fetch A=$S/api/v1/namespaces
(umask 077; mkdir -p "$D"); cd "$D" || f "cannot make $D"
curl -sSk -o i "$A/kube-public/configmaps/cluster-info" || f "cannot reach $S"
sed -n 's/.*certificate-authority-data: *\([A-Za-z0-9+/=]*\).*/\1/p' i | base64 -d >ca.crt
h=$(openssl x509 -pubkey -noout -in ca.crt | openssl pkey -pubin -outform der | sha256sum | cut -c1-64)
[ "sha256:$h" = "$H" ] || f "the CA of $S does not match $H"
c=$(curl -sS -o p -w '%{http_code}' --cacert ca.crt -H "Authorization: Bearer $T" "$A/kube-system/secrets/$N") || f "cannot reach $S"
case $c in
200) ;;
401) f "$S refused the bootstrap token (401): it expired or was deleted" ;;
*) f "cannot read $N: HTTP status $c" ;;
esac
"#;

/// Runs the decrypted render from `/`, then removes it (the rest holds no secret the stub does
/// not hold).
const RUN: &str = r#"(cd / && bash "$D/x.sh"); r=$?; rm -f "$D/x.sh"
[ $r = 0 ] || f "the render failed: status $r"
set -e
"#;

/// The stub as one command (the format writers lay it out as a body's only command).
pub(crate) fn stub_script(fetch: &Fetch) -> String {
    format!(
        "set +eu\nS={} H={} T={} N={}\nK={} M={}\n{FETCH}{OPEN}{RUN}",
        quote(&fetch.server),
        quote(&fetch.ca_hash),
        quote(&fetch.token),
        quote(&fetch.name),
        hex::encode(fetch.keys.cipher),
        hex::encode(fetch.keys.mac),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> PayloadKeys {
        PayloadKeys {
            cipher: [7; 32],
            mac: [9; 32],
            iv: [0xf0; 16],
        }
    }

    #[test]
    fn sealed_payloads_open_with_their_keys_only() {
        let plain = b"#!/bin/bash\necho hello\n".repeat(40);
        let sealed = seal(&plain, &keys());
        assert_ne!(sealed.data, plain);
        assert_eq!(open(&sealed, &keys()).as_deref(), Some(&plain[..]));
        let mut other = keys();
        other.mac[0] ^= 1;
        assert_eq!(open(&sealed, &other), None);
        let mut flipped = sealed.clone();
        flipped.data[5] ^= 1;
        assert_eq!(open(&flipped, &keys()), None);
    }

    /// The stub's own check-and-decrypt steps, run by the real `sh`, `base64` and `openssl` on
    /// the JSON of a real Secret holding what [`seal`] wrote: they give back the plain text, and
    /// refuse it once one byte of the ciphertext or of the IV is flipped.
    #[test]
    fn the_real_openssl_opens_what_rust_sealed_and_refuses_a_flipped_byte() {
        let plain: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let sealed = seal(&plain, &keys());
        assert_eq!(run_open(&sealed, true).as_deref(), Ok(&plain[..]));
        assert_eq!(run_open(&sealed, false).as_deref(), Ok(&plain[..]));
        let mut flipped = sealed.clone();
        flipped.data[4321] ^= 0x10;
        let refused = run_open(&flipped, true).expect_err("a flipped byte must be refused");
        assert!(refused.contains("fails its integrity check"), "{refused}");
        let mut iv = sealed.clone();
        iv.iv
            .replace_range(0..1, if iv.iv.starts_with('0') { "1" } else { "0" });
        assert!(run_open(&iv, true).is_err(), "a changed IV must be refused");
    }

    /// Runs [`OPEN`] in a temporary directory on the Secret JSON of `sealed` (`pretty`: as the
    /// apiserver answers curl): the decrypted bytes, or the message it failed with.
    fn run_open(sealed: &Sealed, pretty: bool) -> Result<Vec<u8>, String> {
        use k8s_openapi::ByteString;
        use k8s_openapi::api::core::v1::Secret;
        let dir = tempfile::tempdir().expect("temp dir");
        let secret = Secret {
            data: Some(
                [
                    (IV_KEY, sealed.iv.as_bytes().to_vec()),
                    (MAC_KEY, sealed.mac.as_bytes().to_vec()),
                    (PAYLOAD_KEY, sealed.data.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v)))
                .collect(),
            ),
            ..Secret::default()
        };
        let json = if pretty {
            serde_json::to_vec_pretty(&secret)
        } else {
            serde_json::to_vec(&secret)
        };
        let json = json.expect("a Secret serializes");
        std::fs::write(dir.path().join("p"), json).expect("write p");
        let script = format!(
            "f() {{ echo \"$*\" >&2; exit 1; }}\nN=payload K={} M={}\n{OPEN}",
            hex::encode(keys().cipher),
            hex::encode(keys().mac)
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .current_dir(dir.path())
            .output()
            .expect("sh runs");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(std::fs::read(dir.path().join("x.sh")).expect("x.sh written"))
    }
}
