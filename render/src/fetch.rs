//! Fetch delivery (docs/boot-channel.md, "Fetch delivery"): instead of the whole render, the
//! user-data is a small stub in the template's format; the render itself, in the `script`
//! format, is sealed here and stored in the workload cluster by the controller.
//!
//! Sealing is AES-256-CTR (its key derived from a passphrase, see `cipher_key`), then
//! HMAC-SHA256 over the IV (as hex text) and the ciphertext (encrypt-then-MAC), so a node
//! undoes it with `openssl` and shell builtins alone. The keys and the IV are inputs (the
//! controller draws them at random per render): the render stays a pure function.
//!
//! The stub holds the workload API endpoint, the hash of the cluster CA's public key, the
//! machine's bootstrap token, the payload's name and the two keys. It reads
//! `kube-public/cluster-info` without trusting the server and checks it as `kubeadm join`
//! discovery does: the token's signature of its `kubeconfig`, and a CA in it whose public key
//! has the hash; from then on it trusts that one certificate only. Only then does it read the
//! payload Secret with the token, check its MAC, decrypt it and run it. No secret is a
//! program's argument: the token and the passphrase go on standard input, the MAC and JWS keys
//! through builtins. Each failure stops the boot with a message on standard error and the
//! console.

use aes::Aes256;
use ctr::cipher::{KeyIvInit, StreamCipher};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::helpers::quote;

/// The largest stub, in bytes: 3 KiB, which the stub of every format fits with the longest
/// endpoint there is (a 253-character DNS name; tested). The checks `kubeadm join` discovery
/// makes (issue 48) took it past the 2 KiB it had been.
pub const STUB_LIMIT: usize = 3072;

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
    /// The passphrase the AES key is derived from (`cipher_key`).
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
    ctr::Ctr128BE::<Aes256>::new(&cipher_key(keys).into(), &keys.iv.into())
        .apply_keystream(&mut data);
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
    ctr::Ctr128BE::<Aes256>::new(&cipher_key(keys).into(), &iv.into()).apply_keystream(&mut data);
    Some(data)
}

/// The AES key. `openssl enc` takes a raw key only as an argument (`-K`), which every user of
/// the machine could read; it reads a passphrase from standard input. So the stub passes the
/// hex of [`PayloadKeys::cipher`] as the passphrase of `-iter 1 -nosalt`: PBKDF2-HMAC-SHA256,
/// one iteration, no salt, whose first 32 bytes are one HMAC block (the IV is given apart).
fn cipher_key(keys: &PayloadKeys) -> [u8; 32] {
    let passphrase = hex::encode(keys.cipher);
    let mut block = Hmac::<Sha256>::new_from_slice(passphrase.as_bytes())
        .expect("HMAC takes a key of any length");
    block.update(&1u32.to_be_bytes());
    block.finalize().into_bytes().into()
}

fn mac(key: &[u8; 32], iv_hex: &str, data: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(iv_hex.as_bytes());
    mac.update(data);
    hex::encode(mac.finalize().into_bytes())
}

/// Shell helpers that pass no secret to a program as an argument (`/proc/PID/cmdline` is
/// readable by every user of the machine): `x KEYHEX BYTE` prints the key zero-padded to
/// SHA-256's 64-byte block, each byte XOR BYTE, with builtins only; `h KEYHEX` prints the
/// HMAC-SHA256 of its standard input (binary) from those pads, `openssl dgst` reading data
/// only; `u` turns binary into hex, `b` into base64url without padding (JWS); `js KEY FILE`
/// prints the string value of KEY in the JSON of FILE, still escaped (compact JSON, or pretty
/// as the apiserver answers curl).
const HELPERS: &str = r#"x() { k=$1 i=0; while [ $i -lt 64 ]; do y=${k%"${k#??}"}; k=${k#??}; v=$((0x${y:-0}^$2)); printf %b "\\0$((v/64))$((v/8%8))$((v%8))"; i=$((i+1)); done; }
h() { { x "$1" 54; cat; } | openssl sha256 -binary >j; { x "$1" 92; cat j; } | openssl sha256 -binary; }
u() { od -An -vtx1 | tr -dc 0-9a-f; }
b() { base64 -w0 | tr +/ -_ | tr -d =; }
js() { sed -n "s/.*\"$1\": *\"\([^\"\\\\]*\(\\\\.[^\"\\\\]*\)*\)\".*/\1/p" "$2"; }
"#;

/// `cluster-info` read without trust and checked as `kubeadm join` discovery does
/// (k8s.io/cluster-bootstrap's `DetachedTokenIsValid`): its `jws-kubeconfig-<token ID>` must
/// be the detached JWS (HS256, keyed by the token's secret, `kid` the ID) of its `kubeconfig`,
/// so only the cluster, which holds the token, can have written that `kubeconfig`. The
/// `kubeconfig` is the JSON string unescaped (`\n`, `\"`: all a kubeconfig holds; anything
/// else fails the check). From its CA bundle, only the certificate whose public key has hash
/// `$H` is trusted: a bundle may hold more (a rotation), and no other key may vouch for the
/// server that gets the token.
const DISCOVER: &str = r#"f() { echo "bootplate fetch: $*" >&2; exit 1; }
D=/run/bootplate-fetch A=$S/api/v1/namespaces I=${T%%.*} U=$(umask)
umask 077; rm -rf "$D"; mkdir -p "$D"; cd "$D" || f "cannot make $D"
curl -sSk -o i "$A/kube-public/configmaps/cluster-info" || f "cannot reach $S"
printf %s "$(js kubeconfig i)" | sed 's/\\n/\n/g;s/\\"/"/g' >k
s=$(js "jws-kubeconfig-$I" i)
[ -n "$s" ] || f "cluster-info has no signature for token $I: it expired or was deleted"
p=$(printf '{"alg":"HS256","kid":"%s"}' "$I" | b).$(b <k)
[ "$s" = "${p%.*}..$(printf %s "$p" | h "$(printf %s "${T#*.}" | u)" | b)" ] || f "cluster-info fails the signature check of token $I"
sed -n 's/^ *certificate-authority-data: *//p' k | base64 -d | csplit -szf c - /BEGIN/ '{*}'
for q in c*; do [ "$(openssl x509 -pubkey -noout -in "$q" | openssl pkey -pubin -outform der | sha256sum)" = "${H#*:}  -" ] && mv "$q" ca.crt; done
[ -f ca.crt ] || f "the CA of $S does not match $H"
"#;

/// The payload read over TLS trusting `ca.crt` alone, the token given on standard input.
const FETCH: &str = r#"c=$(printf 'Authorization: Bearer %s\n' "$T" | curl -sS -o p -w '%{http_code}' --cacert ca.crt -H @- "$A/kube-system/secrets/$N") || f "cannot reach $S"
case $c in
200) ;;
401) f "$S refused the bootstrap token (401): it expired or was deleted" ;;
*) f "cannot read $N: HTTP status $c" ;;
esac
"#;

/// Reads the payload Secret's JSON from `p` (compact, or pretty as the apiserver answers curl),
/// checks it with `$M`, decrypts it with the passphrase `$K` (on standard input) into `x.sh`;
/// calls `f` with a message on a failure. Shared with the test that runs it.
const OPEN: &str = r#"g() { js "$1" p | base64 -d; }
g iv >v; g payload >e
[ "$(cat v e | h "$M" | u)" = "$(g mac)" ] || f "$N fails its integrity check"
printf %s "$K" | openssl enc -d -aes-256-ctr -iter 1 -nosalt -pass stdin -iv "$(cat v)" -in e -out x.sh || f "cannot decrypt $N"
"#;

/// Runs the decrypted render from `/` with the boot's own umask, then removes it (the rest
/// holds no secret the stub does not hold).
const RUN: &str = r#"umask "$U"; (cd / && bash "$D/x.sh"); r=$?; rm -f x.sh
[ $r = 0 ] || f "the render failed: status $r"
set -e
"#;

/// The stub as one command (the format writers lay it out as a body's only command).
pub(crate) fn stub_script(fetch: &Fetch) -> String {
    format!(
        "set +eu\nS={} H={} T={} N={}\nK={} M={}\n{HELPERS}{DISCOVER}{FETCH}{OPEN}{RUN}",
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
            "f() {{ echo \"$*\" >&2; exit 1; }}\nN=payload K={} M={}\n{HELPERS}{OPEN}",
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

    /// Runs `script` with `shell` in `dir`: standard output, or standard error on a failure.
    fn run_in(shell: &str, script: &str, dir: &std::path::Path) -> Result<Vec<u8>, String> {
        let out = std::process::Command::new(shell)
            .args(["-c", script])
            .current_dir(dir)
            .output()
            .expect("the shell runs");
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The stub's HMAC (builtins, and `openssl dgst` on data only) is HMAC-SHA256, for a token
    /// secret's 16 bytes and a MAC key's 32, on data with every byte value, in sh and bash.
    #[test]
    fn the_stubs_hmac_is_hmac_sha256() {
        let dir = tempfile::tempdir().expect("temp dir");
        let data: Vec<u8> = (0..=255u8).cycle().take(700).collect();
        std::fs::write(dir.path().join("data"), &data).expect("write data");
        let keys = [
            b"notarealtoken000".to_vec(),
            vec![0xff; 32],
            (0..32).collect(),
        ];
        for key in keys {
            let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any length");
            mac.update(&data);
            let expected = hex::encode(mac.finalize().into_bytes());
            let script = format!("{HELPERS}h {} <data | u", hex::encode(&key));
            for shell in ["sh", "bash"] {
                let out = run_in(shell, &script, dir.path()).expect("h runs");
                assert_eq!(String::from_utf8_lossy(&out), expected, "{shell}");
            }
        }
    }

    /// [`DISCOVER`] with a shell function for `curl` serving `cluster_info` (JSON) for
    /// token `token`: the line it stopped with.
    fn discover(cluster_info: &str, token: &str) -> String {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("cluster-info"), cluster_info).expect("write");
        let discover = DISCOVER.replace("/run/", &format!("{}/run/", dir.path().display()));
        let script = format!(
            "curl() {{ cat {}/cluster-info >i; }}\nS=https://s H=sha256:00 T={}\n{HELPERS}{discover}",
            dir.path().display(),
            quote(token)
        );
        let err = run_in("sh", &script, dir.path()).expect_err("no CA in these");
        let stop = err.lines().find(|l| l.starts_with("bootplate fetch: "));
        stop.unwrap_or_else(|| panic!("no stop line: {err}"))
            .to_owned()
    }

    /// The stub's check of `cluster-info`'s signature passes k8s.io/cluster-bootstrap's own
    /// test vectors (token/jws/jws_test.go) and one computed here over a `kubeconfig` that JSON
    /// escapes, compact or pretty: the stub goes on to look for the CA. A changed byte of the
    /// signature or the content, or another token, fails it.
    #[test]
    fn the_stubs_signature_check_passes_cluster_bootstraps_test_vectors() {
        use base64::Engine as _;
        let token = "joshua.my voice is my passcode";
        let content = "Hello from the other side. I must have called a thousand times.";
        let signed =
            "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..VShe2taLd-YTrmWuRkcL_8QTNDHYxQIEBsAYYiIj1_8";
        let empty =
            "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..7Ui1ALizW4jXphVUB7xUqC9vLYLL9RZeOFfVLoB7Tgk";
        let escaped = "apiVersion: v1\nclusters:\n- name: \"\"\n";
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(r#"{"alg":"HS256","kid":"joshua"}"#);
        let mut mac = Hmac::<Sha256>::new_from_slice(b"my voice is my passcode").expect("key");
        mac.update(format!("{header}.{}", b64.encode(escaped)).as_bytes());
        let escaped_signed = format!("{header}..{}", b64.encode(mac.finalize().into_bytes()));
        let cluster_info = |content: &str, jws: &str, pretty: bool| {
            let value = serde_json::json!({"kind": "ConfigMap",
                "data": {"kubeconfig": content, "jws-kubeconfig-joshua": jws}});
            let text = if pretty {
                serde_json::to_string_pretty(&value)
            } else {
                serde_json::to_string(&value)
            };
            text.expect("JSON")
        };
        let passed = "bootplate fetch: the CA of https://s does not match sha256:00";
        let failed = "bootplate fetch: cluster-info fails the signature check of token joshua";
        for pretty in [false, true] {
            assert_eq!(
                discover(&cluster_info(content, signed, pretty), token),
                passed
            );
            assert_eq!(discover(&cluster_info("", empty, pretty), token), passed);
            let escaped = cluster_info(escaped, &escaped_signed, pretty);
            assert_eq!(discover(&escaped, token), passed);
            let flipped = signed.replace("VShe", "VShf");
            assert_eq!(
                discover(&cluster_info(content, &flipped, pretty), token),
                failed
            );
            let changed = content.replace("thousand", "hundred");
            assert_eq!(
                discover(&cluster_info(&changed, signed, pretty), token),
                failed
            );
            let other = "joshua.my voice is not my passcode";
            assert_eq!(
                discover(&cluster_info(content, signed, pretty), other),
                failed
            );
        }
        let unsigned = r#"{"data":{"kubeconfig":"x"}}"#;
        assert_eq!(
            discover(unsigned, token),
            "bootplate fetch: cluster-info has no signature for token joshua: it expired or was deleted"
        );
    }
}
