//! What the admission webhook checks, free of HTTP and TLS: each function returns the reasons
//! to deny, each naming the field (and, for template text, the line and column).

use crd_types::{BootplateConfig, BootplateConfigSpec, TemplateSpec};
use render::{Origin, Severity};

use crate::k8s::templates::{
    check_one_content_source, check_secret_namespace, check_template_namespace,
};

/// Fields of a whole object (`apiVersion`, `kind`, `metadata`, `spec`) that do not fit its
/// kind's schema: unknown fields (naming the field probably meant), wrong types, values outside
/// an enum, missing required fields.
pub fn strict(object: &serde_json::Value) -> Vec<String> {
    // The apiserver adds status and managed fields; only what a user writes is checked.
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    crd_types::strict::check(&object)
        .into_iter()
        .map(|p| p.to_string())
        .collect()
}

/// Problems that make a template unusable: every template and partial compiles, variable
/// declarations are unique and their defaults match their schema, `template` and `parts`
/// are exclusive, part names are unique, and a sample render succeeds for every role.
pub fn template(display: &str, spec: &TemplateSpec) -> Vec<String> {
    render::lint(display, spec, None)
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .map(|p| p.to_string())
        .collect()
}

/// Problems of a generator: its endpoint (one https URL or a Service) and its CA bundle (PEM
/// certificates), as the controller builds its client.
pub fn generator(spec: &crd_types::GeneratorSpec) -> Vec<String> {
    match crate::generator::client::GeneratorClient::new(spec) {
        Ok(_) => Vec::new(),
        Err(problem) => vec![problem],
    }
}

/// Problems of a config spec at `field` (`spec`, or `spec.template.spec` in a config template)
/// in `namespace`, checked against its template when that exists.
pub fn config(
    field: &str,
    namespace: &str,
    spec: &BootplateConfigSpec,
    template: Option<(&str, &TemplateSpec)>,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = check_template_namespace(&spec.template_ref, namespace) {
        problems.push(format!(
            "{field}.{}",
            e.to_string().trim_start_matches("spec.")
        ));
    }
    if spec.template_ref.name.contains('/') {
        problems.push(format!(
            "{field}.templateRef.name: {:?} is not a name; a config can only reference a {} by name",
            spec.template_ref.name, spec.template_ref.kind
        ));
    }
    for (index, file) in spec.files.iter().enumerate() {
        let path = format!("{field}.files[{index}]");
        if let Err(e) = check_one_content_source(&path, file) {
            problems.push(e.to_string());
        } else if file.content.is_none() && file.content_from.is_none() {
            problems.push(format!("{path}: set content or contentFrom"));
        }
        if let Some(source) = &file.content_from {
            let field = format!("{path}.contentFrom.secret");
            if let Err(e) = check_secret_namespace(&field, &source.secret, namespace) {
                problems.push(e.to_string());
            }
            if source.secret.name.is_empty() || source.secret.name.contains('/') {
                problems.push(format!(
                    "{path}.contentFrom.secret.name: {:?} is not a Secret name",
                    source.secret.name
                ));
            }
        }
    }
    if let Some((display, template)) = template {
        // Render with the config's variables and sample context; file contents from Secrets are
        // not read here, so stand-ins keep the render going.
        let mut sample = spec.clone();
        for file in &mut sample.files {
            if file.content_from.take().is_some() {
                file.content = Some(String::new());
            }
        }
        let skipped: Vec<_> = spec
            .skip_parts
            .iter()
            .filter(|name| !template.parts.iter().any(|p| &p.name == *name))
            .collect();
        for name in skipped {
            problems.push(format!("{field}.skipParts: {display} has no part {name:?}"));
        }
        problems.extend(
            render::lint(display, template, Some(&sample))
                .into_iter()
                .filter(|p| p.severity == Severity::Error && p.origin == Origin::Config)
                .map(|p| {
                    format!(
                        "{field}: {}",
                        p.to_string().trim_start_matches("the config's ")
                    )
                }),
        );
    }
    problems
}

/// On update: `spec.templateRef` is fixed once the data Secret is written, so a Machine never
/// silently switches to a different template after it was bootstrapped.
pub fn config_update(old: &BootplateConfig, new: &BootplateConfig) -> Vec<String> {
    let written = old
        .status
        .as_ref()
        .is_some_and(|s| s.ready || s.data_secret_name.is_some());
    if written && old.spec.template_ref != new.spec.template_ref {
        vec![format!(
            "spec.templateRef is immutable once the data Secret is written (was {} {}); create a new config instead",
            old.spec.template_ref.kind, old.spec.template_ref.name
        )]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_generator_needs_one_https_endpoint_and_a_pem_ca_bundle() {
        let spec = |client_config: serde_json::Value| -> crd_types::GeneratorSpec {
            serde_json::from_value(json!({ "clientConfig": client_config })).unwrap()
        };
        let ca = crate::pki::generate_ca("generator CA").unwrap().cert;
        let good = spec(json!({"url": "https://cmdb.example/gen", "caBundle": ca}));
        assert!(super::generator(&good).is_empty());
        let service = spec(json!({"service": {"namespace": "infra", "name": "cmdb"}}));
        assert!(super::generator(&service).is_empty());
        let plain = super::generator(&spec(json!({"url": "http://cmdb.example/gen"})));
        assert!(plain[0].contains("HTTPS only"), "{plain:?}");
        let base64 = super::generator(&spec(json!({"url": "https://a/", "caBundle": "TUlJQg=="})));
        assert!(
            base64[0].starts_with("spec.clientConfig.caBundle"),
            "{base64:?}"
        );
    }

    #[test]
    fn objects_are_read_strictly() {
        let mut object = json!({
            "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
            "kind": "BootplateConfig",
            "metadata": {"name": "c", "namespace": "a", "uid": "1", "resourceVersion": "2"},
            "spec": {
                "templateRef": {"kind": "BootstrapTemplate", "name": "t"},
                "files": [{"path": "/k", "content": "k", "permision": "0600"}],
            },
            "status": {"ready": false},
        });
        assert_eq!(
            super::strict(&object),
            ["spec.files[0].permision: unknown field `permision`; did you mean `permissions`?"]
        );
        object["spec"]["files"][0]
            .as_object_mut()
            .unwrap()
            .remove("permision");
        assert!(super::strict(&object).is_empty());
        // serde agrees: the types refuse unknown fields too.
        object["spec"]["templateRef"]["nmae"] = json!("x");
        let decoded = serde_json::from_value::<crd_types::BootplateConfig>(object);
        assert!(
            decoded
                .unwrap_err()
                .to_string()
                .contains("unknown field `nmae`")
        );
    }
}
