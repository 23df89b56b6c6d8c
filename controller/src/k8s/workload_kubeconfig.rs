//! What the controller accepts in a tenant's `<cluster>-kubeconfig` Secret.
//!
//! An app team can write that Secret in its own namespace, so a kubeconfig is hostile input
//! here, not a file an operator chose. client-go's kubeconfig is built for the second case: it
//! runs credential plugins (`exec`), reads files (`tokenFile`, `client-certificate`,
//! `certificate-authority`), calls auth providers and speaks plain HTTP. In the controller each
//! of those is a way out of the tenant's namespace: a command runs with the controller's
//! identity, a file such as the controller's own ServiceAccount token is sent to a server the
//! tenant chose, a plain-HTTP or unverified server reads the credentials. So only one shape is
//! accepted: an `https` server with inline CA data, and inline credentials (a bearer `token`, or
//! client certificate and key data). Everything the chosen context does not use is dropped before
//! kube's loader sees the kubeconfig.

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

/// The accepted shape, said once for every refusal.
const ACCEPTED: &str = "bootplate accepts an `https` server with `certificate-authority-data` and inline \
credentials (`token`, or `client-certificate-data` with `client-key-data`)";

/// Reads a kubeconfig's text: bounded by its expansion before kube's reader (serde-saphyr, whose
/// own budget allows 64 MiB of repeated scalars) sees it, and with an error that gives where, not
/// what: kube's message quotes the lines around the problem, which may hold a token or a key.
pub fn parse(text: &str) -> Result<Kubeconfig, String> {
    render::yaml::check(text, render::yaml::YamlLimit::document(text))
        .map_err(|e| e.to_string())?;
    Kubeconfig::from_yaml(text).map_err(|e| {
        let message = e.to_string();
        match line_and_column(&message) {
            Some((line, column)) => format!("not valid YAML at line {line}, column {column}"),
            None => "not a kubeconfig kube can read".to_owned(),
        }
    })
}

/// The first `line L column C` of a message.
fn line_and_column(message: &str) -> Option<(u64, u64)> {
    let rest = &message[message.find("line ")? + 5..];
    let (line, rest) = rest.split_once(" column ")?;
    let column: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((line.parse().ok()?, column.parse().ok()?))
}

/// Checks the context a kubeconfig selects and returns a kubeconfig that holds only it, its
/// cluster and its user. The error names the entry and the field, never a credential.
pub(crate) fn vet(kubeconfig: &Kubeconfig) -> Result<Kubeconfig, String> {
    let context_name = kubeconfig
        .current_context
        .as_deref()
        .filter(|name| !name.is_empty())
        .ok_or("`current-context` is not set")?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| format!("context `{context_name}` (the current context) not found"))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| {
            format!(
                "cluster `{}` of context `{context_name}` not found",
                context.cluster
            )
        })?;
    let user_name = context
        .user
        .as_deref()
        .ok_or_else(|| format!("context `{context_name}` names no user; {ACCEPTED}"))?;
    let user = kubeconfig
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .and_then(|u| u.auth_info.as_ref())
        .ok_or_else(|| format!("user `{user_name}` of context `{context_name}` not found"))?;
    vet_cluster(&context.cluster, cluster)?;
    vet_user(user_name, user)?;
    Ok(only(context_name, context, cluster, user_name, user))
}

fn vet_cluster(name: &str, cluster: &Cluster) -> Result<(), String> {
    let refuse =
        |field: &str, why: &str| Err(format!("cluster `{name}`: {field} {why}; {ACCEPTED}"));
    let server = cluster.server.as_deref().unwrap_or_default();
    let uri: http::Uri = match server.parse() {
        Ok(uri) => uri,
        Err(_) => return refuse("`server`", "is not a URL"),
    };
    if uri.scheme_str() != Some("https") || uri.host().is_none_or(str::is_empty) {
        return refuse("`server`", "is not an https URL");
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        return refuse("`insecure-skip-tls-verify`", "is refused");
    }
    if cluster.certificate_authority.is_some() {
        return refuse("`certificate-authority` (a file path)", "is refused");
    }
    if cluster.proxy_url.is_some() {
        return refuse("`proxy-url`", "is refused");
    }
    if cluster
        .certificate_authority_data
        .as_deref()
        .is_none_or(str::is_empty)
    {
        return refuse("`certificate-authority-data`", "is missing");
    }
    Ok(())
}

fn vet_user(name: &str, user: &AuthInfo) -> Result<(), String> {
    let refused = [
        ("exec", user.exec.is_some()),
        ("auth-provider", user.auth_provider.is_some()),
        ("tokenFile", user.token_file.is_some()),
        (
            "client-certificate (a file path)",
            user.client_certificate.is_some(),
        ),
        ("client-key (a file path)", user.client_key.is_some()),
        ("username", user.username.is_some()),
        ("password", user.password.is_some()),
        ("as", user.impersonate.is_some()),
        ("as-uid", user.impersonate_uid.is_some()),
        ("as-groups", user.impersonate_groups.is_some()),
        ("as-user-extra", user.impersonate_user_extra.is_some()),
    ];
    if let Some((field, _)) = refused.iter().find(|(_, present)| *present) {
        return Err(format!("user `{name}`: `{field}` is refused; {ACCEPTED}"));
    }
    let token = user.token.is_some();
    let certificate = user.client_certificate_data.is_some() && user.client_key_data.is_some();
    if !token && !certificate {
        return Err(format!(
            "user `{name}` has no inline credentials; {ACCEPTED}"
        ));
    }
    Ok(())
}

/// A kubeconfig of one context, its cluster and its user, with the fields [`vet`] checked.
fn only(
    context_name: &str,
    context: &Context,
    cluster: &Cluster,
    user_name: &str,
    user: &AuthInfo,
) -> Kubeconfig {
    let cluster = Cluster {
        server: cluster.server.clone(),
        certificate_authority_data: cluster.certificate_authority_data.clone(),
        tls_server_name: cluster.tls_server_name.clone(),
        disable_compression: cluster.disable_compression,
        ..Cluster::default()
    };
    let user = AuthInfo {
        token: user.token.clone(),
        client_certificate_data: user.client_certificate_data.clone(),
        client_key_data: user.client_key_data.clone(),
        ..AuthInfo::default()
    };
    let context = Context {
        cluster: context.cluster.clone(),
        user: Some(user_name.to_owned()),
        namespace: context.namespace.clone(),
        ..Context::default()
    };
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: context.cluster.clone(),
            cluster: Some(cluster),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user_name.to_owned(),
            auth_info: Some(user),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: context_name.to_owned(),
            context: Some(context),
            ..NamedContext::default()
        }],
        current_context: Some(context_name.to_owned()),
        ..Kubeconfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "LS0tLS1CRUdJTg==";

    /// A kubeconfig of the accepted shape, with `cluster` and `user` lines added to its
    /// cluster and user entries.
    fn kubeconfig(server: &str, cluster: &str, user: &str) -> Kubeconfig {
        let yaml = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: {server}
    certificate-authority-data: {CA}
{cluster}
users:
- name: u
  user:
{user}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"
        );
        Kubeconfig::from_yaml(&yaml).unwrap()
    }

    #[test]
    fn inline_credentials_over_https_are_accepted() {
        for user in [
            "    token: abc",
            "    client-certificate-data: Y2VydA==\n    client-key-data: a2V5",
        ] {
            let vetted = vet(&kubeconfig("https://10.0.0.1:6443", "", user)).unwrap();
            assert_eq!(vetted.clusters.len(), 1);
            assert_eq!(vetted.auth_infos.len(), 1);
            let cluster = vetted.clusters[0].cluster.as_ref().unwrap();
            assert_eq!(cluster.certificate_authority_data.as_deref(), Some(CA));
        }
    }

    #[test]
    fn every_way_out_of_the_namespace_is_refused_and_named() {
        let token = "    token: abc";
        let cases: &[(&str, &str, &str, &str)] = &[
            ("http://10.0.0.1", "", token, "is not an https URL"),
            ("10.0.0.1:6443", "", token, "is not an https URL"),
            ("https://", "", token, "`server`"),
            (
                "https://a",
                "    insecure-skip-tls-verify: true",
                token,
                "insecure-skip-tls-verify",
            ),
            (
                "https://a",
                "    certificate-authority: /etc/ca.crt",
                token,
                "certificate-authority` (a file path)",
            ),
            (
                "https://a",
                "    proxy-url: http://p:3128",
                token,
                "proxy-url",
            ),
            (
                "https://a",
                "",
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, touch /tmp/x]",
                "`exec` is refused",
            ),
            (
                "https://a",
                "",
                "    auth-provider:\n      name: oidc",
                "`auth-provider` is refused",
            ),
            (
                "https://a",
                "",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
                "`tokenFile` is refused",
            ),
            (
                "https://a",
                "",
                "    client-certificate: /etc/c.crt\n    client-key-data: a2V5",
                "client-certificate (a file path)",
            ),
            (
                "https://a",
                "",
                "    client-certificate-data: Y2VydA==\n    client-key: /etc/k",
                "client-key (a file path)",
            ),
            (
                "https://a",
                "",
                "    username: admin\n    password: pw",
                "`username` is refused",
            ),
            (
                "https://a",
                "",
                "    token: abc\n    as: system:admin",
                "`as` is refused",
            ),
            (
                "https://a",
                "",
                "    client-certificate-data: Y2VydA==",
                "no inline credentials",
            ),
        ];
        for (server, cluster, user, want) in cases {
            let error = vet(&kubeconfig(server, cluster, user)).unwrap_err();
            assert!(error.contains(want), "{server} {cluster} {user}: {error}");
            assert!(!error.contains("abc") && !error.contains("pw"), "{error}");
        }
    }

    #[test]
    fn the_ca_data_must_be_inline() {
        let mut config = kubeconfig("https://a", "", "    token: abc");
        config.clusters[0]
            .cluster
            .as_mut()
            .unwrap()
            .certificate_authority_data = None;
        assert!(
            vet(&config)
                .unwrap_err()
                .contains("`certificate-authority-data` is missing")
        );
    }

    #[test]
    fn entries_the_context_does_not_use_are_dropped() {
        let mut config = kubeconfig("https://a", "", "    token: abc");
        let mut plugin = config.auth_infos[0].clone();
        plugin.name = "unused".into();
        plugin.auth_info.as_mut().unwrap().token_file = Some("/etc/shadow".into());
        config.auth_infos.push(plugin);
        let vetted = vet(&config).unwrap();
        assert_eq!(vetted.auth_infos.len(), 1);
        assert_eq!(vetted.auth_infos[0].name, "u");
    }

    #[test]
    fn a_context_that_is_not_there_is_named() {
        let mut config = kubeconfig("https://a", "", "    token: abc");
        config.current_context = Some("other".into());
        assert!(vet(&config).unwrap_err().contains("context `other`"));
        config.current_context = None;
        assert!(vet(&config).unwrap_err().contains("current-context"));
    }
}
