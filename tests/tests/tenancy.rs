//! Tenancy: nothing a config in namespace fleet names reaches into team-b. A Secret of team-b
//! named by a config of fleet gives it no data (the condition says why), a Secret name without
//! a namespace is looked up in the config's own namespace only, and a BootstrapTemplate of
//! team-b is never rendered for a config of fleet, by name or by `templateRef.namespace`.
//! The network input's CA bundles from Secrets (`spec.network`) obey the same rule.
//! bootplate's admission webhook refuses the configs that name team-b at `kubectl apply`;
//! the test then removes the webhook's configuration (a cluster installed without it, or
//! configs older than it) and shows the controller refuses them too.
//!
//! It runs on the real-Cluster-API environment (`testenv::capi`): Cluster API's own manager
//! owns the Machines, sets the configs' owner references and reports the Cluster's state; the
//! test plays only the cloud and the control-plane provider stand-in. No fault is injected here,
//! so nothing of Cluster API needs to be played.

use std::collections::BTreeMap;

use crd_types::conditions::reason;
use crd_types::{
    BootplateConfig, BootplateConfigSpec, BootstrapTemplate, ClusterBootstrapTemplate,
    ClusterBootstrapTemplateSpec, ConfigFile, FileSource, NetworkConfig, OsInfo, OutputFormat,
    Part, SecretKeyRef, TemplateKind, TemplateRef, TemplateSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use testenv::capi::objects::KUBERNETES_VERSION;
use testenv::capi::{CapiEnv, NS, Options, WAIT};
use testenv::{eventually, fixtures};

/// The Cluster every Machine here belongs to.
const CLUSTER: &str = "tenancy";
const OTHER_NS: &str = "team-b";
const B_SECRET_VALUE: &str = "password-of-team-b";
const B_TEMPLATE_MARKER: &str = "rendered-from-team-b";

async fn secret(client: &Client, namespace: &str, name: &str, key: &str, value: &str) {
    let secret = Secret {
        metadata: fixtures::meta(Some(namespace), name),
        string_data: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn namespaced_template(client: &Client, namespace: &str, name: &str, marker: &str) {
    let mut template = BootstrapTemplate::new(name, fixtures::probe_template_spec(marker));
    template.metadata.namespace = Some(namespace.to_owned());
    Api::<BootstrapTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

/// A worker Machine of [`CLUSTER`] with its DevMachine and its config with `spec`, as an app
/// team writes them; Cluster API's Machine controller makes the Machine the config's owner.
async fn machine(env: &CapiEnv, name: &str, spec: BootplateConfigSpec) {
    try_machine(env, name, spec).await.unwrap();
}

/// [`machine`], or the apiserver's refusal of the config (then nothing else is created).
async fn try_machine(env: &CapiEnv, name: &str, spec: BootplateConfigSpec) -> anyhow::Result<()> {
    env.bootplate_machine((CLUSTER, name), false, spec).await
}

/// The two configs that reach into team-b: a Secret of team-b by namespace, a template of
/// team-b by `templateRef.namespace`, with the field bootplate's refusal names.
fn reaching_into_team_b() -> [(&'static str, BootplateConfigSpec, &'static str); 3] {
    [
        (
            "reads-b",
            BootplateConfigSpec {
                template_ref: cluster_template("files"),
                files: vec![file_from("creds", "password", Some(OTHER_NS))],
                ..Default::default()
            },
            "spec.files[0].contentFrom.secret.namespace",
        ),
        (
            "names-b-template",
            BootplateConfigSpec {
                template_ref: TemplateRef {
                    kind: TemplateKind::BootstrapTemplate,
                    name: "private".into(),
                    namespace: Some(OTHER_NS.into()),
                },
                ..Default::default()
            },
            "spec.templateRef.namespace",
        ),
        (
            "ca-from-b",
            BootplateConfigSpec {
                template_ref: cluster_template("files"),
                network: Some(Box::new(ca_bundle_from(
                    "creds",
                    "password",
                    Some(OTHER_NS),
                ))),
                ..Default::default()
            },
            "spec.network.caBundles[0].secret.namespace",
        ),
    ]
}

/// A network input whose one CA bundle comes from Secret key `name`/`key`.
fn ca_bundle_from(name: &str, key: &str, namespace: Option<&str>) -> NetworkConfig {
    serde_json::from_value(json!({"caBundles": [{"name": "corp", "secret": {
        "name": name, "key": key, "namespace": namespace,
    }}]}))
    .unwrap()
}

/// bootplate's admission webhook refuses both configs at the door, naming the field; then its
/// configuration is removed, as on a cluster installed without it (or whose configs predate
/// it), so the controller's own guard is what the rest of the test sees.
async fn webhook_refuses_then_is_removed(env: &CapiEnv) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    for (name, spec, field) in reaching_into_team_b() {
        let refused = try_machine(env, name, spec).await.unwrap_err().to_string();
        assert!(
            refused.contains("denied the request") && refused.contains(field),
            "{name}: {refused}"
        );
    }
    Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .delete(
            "bootplate-validating-webhook-configuration",
            &Default::default(),
        )
        .await
        .unwrap();
}

fn cluster_template(name: &str) -> TemplateRef {
    TemplateRef {
        kind: TemplateKind::ClusterBootstrapTemplate,
        name: name.into(),
        namespace: None,
    }
}

fn file_from(name: &str, key: &str, namespace: Option<&str>) -> ConfigFile {
    ConfigFile {
        path: "/etc/app/password".into(),
        content_from: Some(FileSource {
            secret: SecretKeyRef {
                name: name.into(),
                key: key.into(),
                namespace: namespace.map(str::to_owned),
            },
        }),
        ..Default::default()
    }
}

/// Nothing in [`NS`], Secrets and configs alike, holds `needle`.
async fn own_namespace_never_holds(env: &CapiEnv, needle: &str) {
    for secret in Api::<Secret>::namespaced(env.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        for (key, value) in secret.data.unwrap_or_default() {
            assert!(
                !String::from_utf8_lossy(&value.0).contains(needle),
                "Secret {NS}/{:?} key {key} holds {needle:?}",
                secret.metadata.name
            );
        }
    }
    let configs = Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    let text = serde_json::to_string(&configs.items).unwrap();
    assert!(!text.contains(needle), "a config of {NS} holds {needle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_never_reaches_into_another_namespace() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    fixtures::namespace(&env.client, OTHER_NS).await.unwrap();
    // The stand-in provider brings the cluster CA and reports the control plane initialized;
    // Cluster API mirrors that into the Cluster.
    env.provider_cluster(CLUSTER, KUBERNETES_VERSION, None)
        .await
        .unwrap();
    secret(&env.client, OTHER_NS, "creds", "password", B_SECRET_VALUE).await;
    namespaced_template(&env.client, OTHER_NS, "private", B_TEMPLATE_MARKER).await;
    // A template that writes the config's extra files, usable from every namespace.
    let files = TemplateSpec {
        os: OsInfo {
            name: "ubuntu".into(),
            version: None,
        },
        format: OutputFormat::CloudConfig,
        parts: vec![Part {
            name: "configure".into(),
            commands: vec!["systemctl restart app".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    Api::<ClusterBootstrapTemplate>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &ClusterBootstrapTemplate::new("files", ClusterBootstrapTemplateSpec(files)),
        )
        .await
        .unwrap();

    webhook_refuses_then_is_removed(&env).await;

    // 1. A Secret of team-b, named with its namespace: refused, and the condition says why.
    let [(name, spec, _), names_b_template, ca_from_b] = reaching_into_team_b();
    // The apiserver drops the removed webhook configuration from its cache a moment later.
    eventually("the config admitted without the webhook", WAIT, || async {
        try_machine(&env, name, spec.clone()).await.ok()
    })
    .await;
    let message = env.wait_reason("reads-b", reason::INVALID_REFERENCE).await;
    for fragment in [
        "spec.files[0].contentFrom.secret.namespace",
        "a config in namespace fleet may not read Secret team-b/creds",
        "only Secrets of its own namespace",
    ] {
        assert!(message.contains(fragment), "{message}");
    }
    assert!(env.data_secret("reads-b").await.is_none(), "no data Secret");
    // The same for a CA bundle of the network input taken from team-b's Secret.
    let (name, spec, _) = ca_from_b;
    machine(&env, name, spec).await;
    let message = env.wait_reason(name, reason::INVALID_REFERENCE).await;
    for fragment in [
        "spec.network.caBundles[0].secret.namespace",
        "a config in namespace fleet may not read Secret team-b/creds",
    ] {
        assert!(message.contains(fragment), "{message}");
    }

    // 2. The same Secret name without a namespace is looked up in fleet only ...
    machine(
        &env,
        "same-name",
        BootplateConfigSpec {
            template_ref: cluster_template("files"),
            files: vec![file_from("creds", "password", None)],
            ..Default::default()
        },
    )
    .await;
    let message = env
        .wait_reason("same-name", reason::FILE_SOURCE_ERROR)
        .await;
    assert!(
        message.contains("spec.files[0].contentFrom.secret: Secret fleet/creds not found"),
        "{message}"
    );
    // ... and once fleet has its own, that one is used.
    secret(&env.client, NS, "creds", "password", "password-of-fleet").await;
    // Secrets named by contentFrom are not watched: a failed config is retried every five
    // minutes, or at once when it or its Machine changes.
    env.capi("Machine", "machines")
        .patch(
            "same-name",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    let user_data = env.wait_user_data("same-name").await;
    assert!(user_data.contains("password-of-fleet"), "{user_data}");

    // 3. A BootstrapTemplate of team-b by name: fleet has none of that name.
    machine(
        &env,
        "uses-b-template",
        BootplateConfigSpec {
            template_ref: TemplateRef {
                kind: TemplateKind::BootstrapTemplate,
                name: "private".into(),
                namespace: None,
            },
            ..Default::default()
        },
    )
    .await;
    let message = env
        .wait_reason("uses-b-template", reason::TEMPLATE_NOT_FOUND)
        .await;
    assert!(
        message.contains("BootstrapTemplate fleet/private not found"),
        "{message}"
    );
    // ... and by `templateRef.namespace`: refused, never followed.
    let (name, spec, _) = names_b_template;
    machine(&env, name, spec).await;
    let message = env
        .wait_reason("names-b-template", reason::INVALID_REFERENCE)
        .await;
    assert!(
        message.contains("spec.templateRef.namespace")
            && message.contains("BootstrapTemplate team-b/private"),
        "{message}"
    );
    // team-b's template is a good one: the refusal is about the namespace, not the template.
    let valid = eventually("team-b's template checked", WAIT, || async {
        Api::<BootstrapTemplate>::namespaced(env.client.clone(), OTHER_NS)
            .get("private")
            .await
            .ok()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid")
    })
    .await;
    assert_eq!(valid.status, "True", "{}", valid.message);
    // Once fleet publishes its own `private`, the config by name renders that one.
    namespaced_template(&env.client, NS, "private", "rendered-from-fleet").await;
    let user_data = env.wait_user_data("uses-b-template").await;
    assert!(user_data.contains("# rendered-from-fleet"), "{user_data}");
    // The refused ones stay refused.
    for (name, why) in [
        ("reads-b", reason::INVALID_REFERENCE),
        ("names-b-template", reason::INVALID_REFERENCE),
        ("ca-from-b", reason::INVALID_REFERENCE),
    ] {
        let ready = env.ready_condition(name).await;
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", why)
        );
        assert!(
            env.data_secret(name).await.is_none(),
            "{name}: no data Secret"
        );
    }

    // Nothing of team-b reached fleet, nor the controller's log.
    own_namespace_never_holds(&env, B_SECRET_VALUE).await;
    own_namespace_never_holds(&env, B_TEMPLATE_MARKER).await;
    let log = env.bootplate.log();
    assert!(!log.contains(B_SECRET_VALUE) && !log.contains(B_TEMPLATE_MARKER));
}
