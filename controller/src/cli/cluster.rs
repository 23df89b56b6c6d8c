//! `bootplate lint --kubeconfig`: the templates configs reference that are not among the files,
//! read from a live cluster, and the configs Cluster API objects reference, looked for there. A
//! GitOps repository often holds the configs of an app team while the platform team's templates
//! are already applied; without them a config's variables go unchecked.
//!
//! Read-only and bounded: one `get` per distinct object (at most [`MAX_LOOKUPS`]), nothing
//! else is asked of the apiserver; each request has [`REQUEST_TIMEOUT`]; a response is read
//! up to [`MAX_RESPONSE_BYTES`] before it is parsed. The first request that cannot reach the
//! cluster, or that the cluster forbids, stops the look-ups: lint then says so once (exit 2)
//! instead of waiting out a timeout per config.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crd_types::{
    BootplateConfig, BootplateConfigTemplate, BootstrapTemplate, ClusterBootstrapTemplate,
    TemplateSpec,
};
use http_body_util::{BodyExt, Limited};
use kube::Resource;
use kube::config::KubeConfigOptions;

use super::input::InputError;

/// The most distinct templates one run looks up.
pub const MAX_LOOKUPS: usize = 256;
/// How long one request may take, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response read: the apiserver refuses requests over 3 MiB, so no stored object
/// is larger.
pub const MAX_RESPONSE_BYTES: usize = 3 << 20;

/// `--kubeconfig` and `--context`.
#[derive(Clone, Debug)]
pub struct Target {
    pub kubeconfig: PathBuf,
    pub context: Option<String>,
}

/// An object to look up, a template or a config: its kind, namespace (none for a
/// `ClusterBootstrapTemplate`, or for a referrer that sets none: then the context's namespace,
/// as `kubectl apply` would use) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Wanted {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

/// What the cluster holds for a [`Wanted`] object.
#[derive(Clone, Debug)]
pub enum Found {
    /// The template: its name in messages (`BootstrapTemplate team-a/workers`) and spec.
    Template {
        object: String,
        spec: Box<TemplateSpec>,
    },
    /// A config (only its existence matters: a Cluster API object's reference to it holds).
    Config,
    /// No such template (in that namespace).
    Absent { namespace: Option<String> },
}

/// What the cluster holds, by what was wanted, and where it was looked for.
#[derive(Debug, Default)]
pub struct ClusterTemplates {
    pub found: BTreeMap<Wanted, Found>,
    /// `the cluster at https://… (context ci)`, for messages.
    pub shown: String,
}

/// Looks up every object of `wanted` in the cluster of `target`. Err: the kubeconfig could not
/// be used, the cluster could not be reached or forbade a read (what was found before stays
/// unused: lint reports the run as incomplete).
pub fn look_up(target: &Target, wanted: BTreeSet<Wanted>) -> Result<ClusterTemplates, InputError> {
    if wanted.len() > MAX_LOOKUPS {
        return Err(InputError(format!(
            "--kubeconfig: {} objects to look up, more than {MAX_LOOKUPS}; lint fewer at once",
            wanted.len()
        )));
    }
    runtime()?.block_on(look_up_all(target, wanted))
}

/// The single-threaded runtime the look-ups run on.
pub(super) fn runtime() -> Result<tokio::runtime::Runtime, InputError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| InputError(format!("--kubeconfig: cannot start a runtime: {e}")))
}

async fn look_up_all(
    target: &Target,
    wanted: BTreeSet<Wanted>,
) -> Result<ClusterTemplates, InputError> {
    let (client, shown) = client(target).await?;
    let mut templates = ClusterTemplates {
        found: BTreeMap::new(),
        shown,
    };
    for w in wanted {
        let namespace = w
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let found = get(&client, &w, &namespace)
            .await
            .map_err(|why| InputError(format!("--kubeconfig: {why} ({})", templates.shown)))?;
        templates.found.insert(w, found);
    }
    Ok(templates)
}

/// A client for the kubeconfig's context, with [`REQUEST_TIMEOUT`]; and the cluster in words.
pub(super) async fn client(target: &Target) -> Result<(kube::Client, String), InputError> {
    let shown_path = target.kubeconfig.display();
    // Bounded like every file lint reads.
    let (_, text) = super::input::read_text(&target.kubeconfig)?;
    let kubeconfig = bootplate::k8s::workload_kubeconfig::parse(&text)
        .map_err(|e| InputError(format!("{shown_path}: not a kubeconfig: {e}")))?;
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| InputError(format!("{shown_path}: cannot use it: {e}")))?;
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    let context = target
        .context
        .as_deref()
        .map(|c| format!(" (context {c})"))
        .unwrap_or_default();
    let shown = format!("the cluster at {}{context}", config.cluster_url);
    let client = kube::Client::try_from(config)
        .map_err(|e| InputError(format!("{shown_path}: cannot use it: {e}")))?;
    Ok((client, shown))
}

/// One object, read with a `get`.
async fn get(client: &kube::Client, w: &Wanted, namespace: &str) -> Result<Found, String> {
    let cluster_scoped = w.kind == "ClusterBootstrapTemplate";
    let ns = Some(namespace);
    let (url, resource) = match w.kind.as_str() {
        "ClusterBootstrapTemplate" => (
            ClusterBootstrapTemplate::url_path(&(), None),
            "clusterbootstraptemplates",
        ),
        "BootstrapTemplate" => (BootstrapTemplate::url_path(&(), ns), "bootstraptemplates"),
        "BootplateConfig" => (BootplateConfig::url_path(&(), ns), "bootplateconfigs"),
        _ => (
            BootplateConfigTemplate::url_path(&(), ns),
            "bootplateconfigtemplates",
        ),
    };
    let (status, body) = get_bounded(client, &url, &w.kind, &w.name).await?;
    let at = if cluster_scoped {
        None
    } else {
        Some(namespace.to_owned())
    };
    match status.as_u16() {
        200 if w.kind.starts_with("Bootplate") => Ok(Found::Config),
        200 => decode(w, at.as_deref(), &body),
        404 => Ok(Found::Absent { namespace: at }),
        401 | 403 => Err(format!(
            "may not get {resource}.bootstrap.bootplate.dev{}: lint needs `get` on them (HTTP {status})",
            at.map(|ns| format!(" in namespace {ns}"))
                .unwrap_or_default()
        )),
        _ => Err(format!(
            "getting {} `{}` answered HTTP {status}",
            w.kind, w.name
        )),
    }
}

/// The `get` of object `name` of kind `kind` under `url` (its collection's path): the status
/// and the body, read up to [`MAX_RESPONSE_BYTES`], within [`REQUEST_TIMEOUT`]. Err: no answer.
pub(super) async fn get_bounded(
    client: &kube::Client,
    url: &str,
    kind: &str,
    name: &str,
) -> Result<(http::StatusCode, bytes::Bytes), String> {
    let request = kube::core::Request::new(url)
        .get(name, &kube::api::GetParams::default())
        .map_err(|e| format!("cannot ask for {kind} `{name}`: {e}"))?
        .map(kube::client::Body::from);
    let exchange = async {
        let response = client
            .send(request)
            .await
            .map_err(|e| format!("cannot reach it: {e}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading {kind} `{name}`: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()))?
}

/// A template as the apiserver sent it.
fn decode(w: &Wanted, namespace: Option<&str>, body: &[u8]) -> Result<Found, String> {
    let unreadable = |e: serde_json::Error| format!("{} `{}` is unreadable: {e}", w.kind, w.name);
    let (object, spec) = match namespace {
        None => {
            let t: ClusterBootstrapTemplate = serde_json::from_slice(body).map_err(unreadable)?;
            (format!("ClusterBootstrapTemplate {}", w.name), t.spec.0)
        }
        Some(ns) => {
            let t: BootstrapTemplate = serde_json::from_slice(body).map_err(unreadable)?;
            (format!("BootstrapTemplate {ns}/{}", w.name), t.spec)
        }
    };
    Ok(Found::Template {
        object,
        spec: Box::new(spec),
    })
}
