//! `files[].contentFrom` and the network input's PEM Secrets (`spec.network`): the Secrets of
//! the config's own namespace that contents come from. They are not watched (they carry no
//! label to select them by), so they are read.

use crd_types::conditions::reason;
use crd_types::{BootplateConfig, BootplateConfigSpec, SecretKeyRef};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};

use crate::error::{Error, Result, is_not_found};
use crate::k8s::templates;

/// The config spec with every `contentFrom` and every Secret of `spec.network` replaced by the
/// content of the Secret key it names, read from the config's own namespace only.
pub(crate) async fn resolve(
    client: &Client,
    config: &BootplateConfig,
) -> Result<BootplateConfigSpec> {
    let mut spec = config.spec.clone();
    for (index, file) in spec.files.iter().enumerate() {
        templates::check_one_content_source(&format!("spec.files[{index}]"), file)?;
    }
    let namespace = config.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for (index, file) in spec.files.iter_mut().enumerate() {
        let Some(source) = file.content_from.take() else {
            continue;
        };
        let field = format!("spec.files[{index}].contentFrom.secret");
        let content = read_key(&secrets, &namespace, &field, &source.secret).await?;
        file.content = Some(content);
    }
    resolve_network(&secrets, &namespace, &mut spec).await?;
    Ok(spec)
}

/// Every PEM of `spec.network` that names a Secret gets the Secret key's content inline.
async fn resolve_network(
    secrets: &Api<Secret>,
    namespace: &str,
    spec: &mut BootplateConfigSpec,
) -> Result<()> {
    let Some(network) = spec.network.as_mut() else {
        return Ok(());
    };
    for pem in network.pem_fields_mut() {
        let Some(secret) = pem.secret.take() else {
            continue;
        };
        let field = format!("spec.network.{}.secret", pem.field);
        let content = read_key(secrets, namespace, &field, &secret).await?;
        if content.len() > crd_types::network::MAX_PEM_BYTES {
            return Err(Error::failed(
                reason::INVALID_NETWORK,
                format!(
                    "{field}: key {:?} of Secret {namespace}/{} is larger than {} bytes",
                    secret.key,
                    secret.name,
                    crd_types::network::MAX_PEM_BYTES
                ),
            ));
        }
        *pem.inline = Some(content);
    }
    Ok(())
}

/// The UTF-8 content of the key `source` names, after checking that it names a Secret of
/// `namespace` (anything else is refused, never read).
async fn read_key(
    secrets: &Api<Secret>,
    namespace: &str,
    field: &str,
    source: &SecretKeyRef,
) -> Result<String> {
    let (name, key) = (&source.name, &source.key);
    templates::check_secret_namespace(field, source, namespace)?;
    let secret = match secrets.get(name).await {
        Ok(secret) => secret,
        Err(e) if is_not_found(&e) => {
            return Err(Error::failed(
                reason::FILE_SOURCE_ERROR,
                format!("{field}: Secret {namespace}/{name} not found"),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| {
            Error::failed(
                reason::FILE_SOURCE_ERROR,
                format!("{field}: Secret {namespace}/{name} has no key {key:?}"),
            )
        })?;
    String::from_utf8(bytes.0.clone()).map_err(|_| {
        Error::failed(
            reason::FILE_SOURCE_ERROR,
            format!("{field}: key {key:?} of Secret {namespace}/{name} is not valid UTF-8 (use base64 content instead)"),
        )
    })
}
