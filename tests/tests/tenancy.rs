//! Tenancy: nothing a config in namespace team-a names reaches into team-b. A Secret of team-b
//! named by a config of team-a gives it no data (the condition says why), a Secret name without
//! a namespace is looked up in the config's own namespace only, and a BootstrapTemplate of
//! team-b is never rendered for a config of team-a, by name or by `templateRef.namespace`.

use std::collections::BTreeMap;

use crd_types::capi::Machine;
use crd_types::conditions::reason;
use crd_types::{
    BootplateConfig, BootplateConfigSpec, BootstrapTemplate, ClusterBootstrapTemplate,
    ClusterBootstrapTemplateSpec, ConfigFile, FileSource, OsInfo, OutputFormat, Part, SecretKeyRef,
    TemplateKind, TemplateRef, TemplateSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use testenv::capi_env::{Env, NS, WAIT, cluster_template, env};
use testenv::{eventually, fixtures};

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

/// A Machine of cluster `c` and its config with `spec`.
async fn machine(env: &Env, name: &str, spec: BootplateConfigSpec) {
    let machine = fixtures::machine(NS, name, "c", false, name);
    let machine = Api::<Machine>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut config = fixtures::owned_config(&machine, spec.template_ref.clone());
    config.spec = spec;
    Api::<BootplateConfig>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
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

/// Nothing in team-a, Secrets and configs alike, holds `needle`.
async fn team_a_never_holds(env: &Env, needle: &str) {
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

#[tokio::test]
async fn a_config_never_reaches_into_another_namespace() {
    let env = env().await;
    fixtures::namespace(&env.client, OTHER_NS).await.unwrap();
    env.cluster("c", false).await;
    env.set_cluster_status("c", true, true).await;
    env.cluster_ca("c").await;
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
    let controller = env.controller(&[]).await;

    // 1. A Secret of team-b, named with its namespace: refused, and the condition says why.
    machine(
        &env,
        "reads-b",
        BootplateConfigSpec {
            template_ref: cluster_template("files"),
            files: vec![file_from("creds", "password", Some(OTHER_NS))],
            ..Default::default()
        },
    )
    .await;
    let message = env.wait_reason("reads-b", reason::INVALID_REFERENCE).await;
    for fragment in [
        "spec.files[0].contentFrom.secret.namespace",
        "a config in namespace team-a may not read Secret team-b/creds",
        "only Secrets of its own namespace",
    ] {
        assert!(message.contains(fragment), "{message}");
    }
    assert!(env.secret("reads-b").await.is_none(), "no data Secret");

    // 2. The same Secret name without a namespace is looked up in team-a only ...
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
        message.contains("spec.files[0].contentFrom.secret: Secret team-a/creds not found"),
        "{message}"
    );
    // ... and once team-a has its own, that one is used.
    secret(&env.client, NS, "creds", "password", "password-of-team-a").await;
    // Secrets named by contentFrom are not watched: a failed config is retried every five
    // minutes, or at once when it or its Machine changes.
    Api::<Machine>::namespaced(env.client.clone(), NS)
        .patch(
            "same-name",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    env.wait_ready("same-name").await;
    let user_data = env.user_data("same-name").await;
    assert!(user_data.contains("password-of-team-a"), "{user_data}");

    // 3. A BootstrapTemplate of team-b by name: team-a has none of that name.
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
        message.contains("BootstrapTemplate team-a/private not found"),
        "{message}"
    );
    // ... and by `templateRef.namespace`: refused, never followed.
    machine(
        &env,
        "names-b-template",
        BootplateConfigSpec {
            template_ref: TemplateRef {
                kind: TemplateKind::BootstrapTemplate,
                name: "private".into(),
                namespace: Some(OTHER_NS.into()),
            },
            ..Default::default()
        },
    )
    .await;
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
    // Once team-a publishes its own `private`, the config by name renders that one.
    namespaced_template(&env.client, NS, "private", "rendered-from-team-a").await;
    env.wait_ready("uses-b-template").await;
    let user_data = env.user_data("uses-b-template").await;
    assert!(user_data.contains("# rendered-from-team-a"), "{user_data}");
    // The refused ones stay refused.
    for (name, why) in [
        ("reads-b", reason::INVALID_REFERENCE),
        ("names-b-template", reason::INVALID_REFERENCE),
    ] {
        let config = env.config(name).await;
        let ready = config
            .status
            .unwrap()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", why)
        );
        assert!(env.secret(name).await.is_none(), "{name}: no data Secret");
    }

    // Nothing of team-b reached team-a, nor the controller's log.
    team_a_never_holds(&env, B_SECRET_VALUE).await;
    team_a_never_holds(&env, B_TEMPLATE_MARKER).await;
    let log = controller.log();
    assert!(!log.contains(B_SECRET_VALUE) && !log.contains(B_TEMPLATE_MARKER));
}
