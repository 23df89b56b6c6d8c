//! What the Secret cache holds of each Secret labelled with a cluster name, and what reconciles
//! read of it: plain fields instead of the Secret's label and annotation maps.
//!
//! The cache holds one entry per data Secret, so one per config; a `BTreeMap` allocates a node
//! of about half a kilobyte however few entries it has, and the two maps of each Secret were
//! about a tenth of the process's memory at 20 000 configs.

use std::borrow::Cow;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::api::ObjectMeta;

/// One cached Secret. `metadata` keeps its name and namespace (the cache's key) and its
/// resourceVersion; the rest are what reconciles read of its ownerReferences, label and
/// annotations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedSecret {
    /// Name, namespace, resourceVersion.
    pub metadata: ObjectMeta,
    /// The UID of the BootplateConfig its controller ownerReference names. (An ownerReference
    /// kept whole, with its API version, kind and name, was about 200 bytes a data Secret.)
    pub controlled_by: Option<String>,
    /// The data Secret label's value: the config whose data Secret this is.
    pub data_secret_of: Option<String>,
    /// The role annotation: the role it was rendered for.
    pub role: Option<String>,
    /// The template revision annotation: the revision it was rendered from.
    pub template_revision: Option<String>,
    /// The inputs digest hint of its render.
    pub inputs: Option<String>,
    /// The token expiry hint of its render (RFC 3339).
    pub token_expires: Option<String>,
    /// The delivery annotation says its machine fetches its render.
    pub fetches: bool,
}

impl CachedSecret {
    /// Whether it is a data Secret (labelled with the config it belongs to).
    pub fn is_data_secret(&self) -> bool {
        self.data_secret_of.is_some()
    }

    /// The UID of the BootplateConfig that controls it (its controller ownerReference).
    pub fn controller_uid(&self) -> Option<&str> {
        self.controlled_by.as_deref()
    }
}

/// A Secret's kind and API: the cache watches Secrets (metadata only) and stores them as this.
impl Resource for CachedSecret {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Secret::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Secret::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Secret::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Secret::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
