//! `files[].contentFrom`: the Secrets of the config's own namespace that file contents come
//! from. They are not watched (they carry no label to select them by), so they are read.

use crd_types::conditions::reason;
use crd_types::{BootplateConfig, BootplateConfigSpec};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};

use crate::error::{Error, Result, is_not_found};
use crate::k8s::templates;

/// The config spec with every `contentFrom` replaced by the content of the Secret key it names,
/// read from the config's own namespace only.
pub(crate) async fn resolve(
    client: &Client,
    config: &BootplateConfig,
) -> Result<BootplateConfigSpec> {
    let mut spec = config.spec.clone();
    for (index, file) in spec.files.iter().enumerate() {
        templates::check_one_content_source(&format!("spec.files[{index}]"), file)?;
    }
    if spec.files.iter().all(|f| f.content_from.is_none()) {
        return Ok(spec);
    }
    let namespace = config.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for (index, file) in spec.files.iter_mut().enumerate() {
        let Some(source) = file.content_from.take() else {
            continue;
        };
        let field = format!("spec.files[{index}].contentFrom.secret");
        let (name, key) = (&source.secret.name, &source.secret.key);
        templates::check_secret_namespace(&field, &source.secret, &namespace)?;
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
        let text = String::from_utf8(bytes.0.clone()).map_err(|_| {
            Error::failed(
                reason::FILE_SOURCE_ERROR,
                format!("{field}: key {key:?} of Secret {namespace}/{name} is not valid UTF-8 (use base64 content instead)"),
            )
        })?;
        file.content = Some(text);
    }
    Ok(spec)
}
