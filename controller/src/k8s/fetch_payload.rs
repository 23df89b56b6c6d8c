//! Fetch delivery in the workload cluster (docs/boot-channel.md, "Fetch delivery"): the Secret
//! `kube-system/bootplate-fetch-<config UID>` holding a machine's sealed render, and the Role
//! and RoleBinding that let the machine's bootstrap token, and only it, `get` that one Secret.
//!
//! The same per-machine trust and lifecycle as the boot report's objects (see
//! [`super::boot_report`]): RBAC with `resourceNames`, bound to `system:bootstrap:<token ID>`;
//! owned by the token's Secret: the workload cluster's garbage collector deletes them with the
//! token (bootplate deletes the token once the Machine joined; the token cleaner an expired
//! one), and bootplate deletes none of them by request. The
//! payload is sealed with keys only the machine's user-data holds: whoever reads Secrets in
//! `kube-system` sees ciphertext.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use render::fetch::{IV_KEY, MAC_KEY, PAYLOAD_KEY, Sealed};

use super::boot_report::{Grant, Target, grant, meta_named};
use crate::error::{Error, Result};
use crate::labels;

/// The name of the payload objects of config `config_uid`.
pub(crate) fn name(config_uid: &str) -> String {
    format!("bootplate-fetch-{config_uid}")
}

/// The payload Secret.
pub(crate) fn secret(target: &Target<'_>, sealed: &Sealed) -> Secret {
    let data = [
        (IV_KEY, sealed.iv.as_bytes().to_vec()),
        (MAC_KEY, sealed.mac.as_bytes().to_vec()),
        (PAYLOAD_KEY, sealed.data.clone()),
    ];
    Secret {
        metadata: meta_named(target, &name(target.config_uid), labels::FETCH_CONFIG_UID),
        type_: Some("Opaque".to_owned()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v)))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// The payload's grant: `get` of its one Secret, `object`.
fn payload_grant(object: &str) -> Grant<'_> {
    Grant {
        object,
        label: labels::FETCH_CONFIG_UID,
        resource: "secrets",
        verbs: &["get"],
    }
}

fn workload_error(e: kube::Error) -> Error {
    Error::waiting(
        crd_types::conditions::reason::BOOTSTRAP_TOKEN_ERROR,
        format!("workload cluster: cannot store the fetched render: {e}"),
    )
}

/// Stores `sealed` for config `config_uid`, readable with `token` only: the Role and
/// RoleBinding first, then the Secret, each server-side applied (a later render or token takes
/// them over). Three applies (and a read of the token Secret's UID when not known).
pub(crate) async fn store(
    workload: &Client,
    config_uid: &str,
    token: &crate::core::token::Token,
    sealed: &Sealed,
) -> Result<()> {
    let object = name(config_uid);
    grant(workload, config_uid, token, &payload_grant(&object), |t| {
        secret(t, sealed)
    })
    .await
    .map_err(workload_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::boot_report::{role, role_binding};

    #[test]
    fn only_the_token_of_the_config_may_read_its_payload() {
        let target = Target {
            config_uid: "u-1",
            token_id: "abcdef",
            token_uid: "t-uid",
        };
        let object = name("u-1");
        let grant = payload_grant(&object);
        let rule = &role(&target, &grant).rules.unwrap()[0];
        assert_eq!(rule.resources.as_deref(), Some(&["secrets".to_owned()][..]));
        assert_eq!(rule.resource_names.as_deref(), Some(&[name("u-1")][..]));
        assert_eq!(rule.verbs, ["get"]);
        let subject = &role_binding(&target, &grant).subjects.unwrap()[0];
        assert_eq!(subject.name, "system:bootstrap:abcdef");
        let sealed = Sealed {
            iv: "00".repeat(16),
            mac: "11".repeat(32),
            data: vec![1, 2, 3],
        };
        let secret = secret(&target, &sealed);
        let owner = &secret.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.name.as_str(), owner.uid.as_str()),
            ("bootstrap-token-abcdef", "t-uid")
        );
        let labels = secret.metadata.labels.unwrap();
        assert_eq!(labels[labels::FETCH_CONFIG_UID], "u-1");
        assert!(!labels.contains_key(labels::TOKEN_CONFIG_UID));
        // The stub reads it where it is written.
        assert_eq!(render::fetch::NAMESPACE, crate::core::token::NAMESPACE);
    }
}
