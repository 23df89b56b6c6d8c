//! Golden tests: the structured fixture rendered in every format for every role must equal the
//! checked-in bytes in tests/golden/, and each output must pass its real consumer's checker:
//! `cloud-init schema`, `ignition-validate`, `bash -n` + `shellcheck`, and for MIME archives
//! each part. Regenerate the goldens with `BOOTPLATE_UPDATE_GOLDEN=1 cargo test -p
//! bootplate-render --test golden`, then review the diff.

mod common;

use std::path::PathBuf;

use crd_types::{OutputFormat, Role};
use render::{CompiledTemplate, sample_context};

fn golden_path(format: OutputFormat, role: Role) -> PathBuf {
    let ext = match format {
        OutputFormat::CloudConfig => "yaml",
        OutputFormat::Ignition => "json",
        OutputFormat::Script => "sh",
        OutputFormat::MimeMultipart => "mime",
        // The fixture has systemd units, which no Windows format takes.
        OutputFormat::WindowsCloudConfig
        | OutputFormat::Powershell
        | OutputFormat::PowershellAws => {
            unreachable!("{format}: the golden fixture is a Linux body")
        }
    };
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{format}-{role}.{ext}"))
}

/// Renders the fixture for `role` in `format`, compares with (or updates) the golden, and
/// returns the golden's path.
fn golden(format: OutputFormat, role: Role) -> PathBuf {
    let mut spec = common::spec("parts.yaml");
    spec.format = format;
    let compiled = CompiledTemplate::compile("ClusterBootstrapTemplate golden", &spec)
        .unwrap_or_else(|e| panic!("{e}"));
    let rendered = compiled
        .render(&common::config("parts-config.yaml"), &sample_context(role))
        .unwrap_or_else(|e| panic!("{format} {role}: {e}"));
    assert_eq!(rendered.format, format);
    let path = golden_path(format, role);
    if std::env::var_os("BOOTPLATE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered.data).expect("write golden");
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (create it with BOOTPLATE_UPDATE_GOLDEN=1)",
            path.display()
        )
    });
    assert!(
        expected == rendered.data,
        "{} differs from the rendered output; if the change is intended, regenerate with BOOTPLATE_UPDATE_GOLDEN=1 and review the diff.\n--- rendered:\n{}",
        path.display(),
        String::from_utf8_lossy(&rendered.data)
    );
    path
}

#[test]
fn cloud_config_goldens_pass_cloud_init_schema() {
    for role in Role::ALL {
        let path = golden(OutputFormat::CloudConfig, role);
        common::check_cloud_config(&path);
    }
}

#[test]
fn ignition_goldens_pass_ignition_validate() {
    for role in Role::ALL {
        let path = golden(OutputFormat::Ignition, role);
        common::check_ignition(&path);
    }
}

#[test]
fn script_goldens_pass_bash_and_shellcheck() {
    for role in Role::ALL {
        let path = golden(OutputFormat::Script, role);
        common::check_script(&path);
    }
}

#[test]
fn mime_goldens_have_a_valid_cloud_config_and_script_part() {
    for role in Role::ALL {
        let path = golden(OutputFormat::MimeMultipart, role);
        assert_eq!(
            common::check_mime(&path),
            ["text/cloud-config", "text/x-shellscript"]
        );
    }
}

/// The goldens are not vacuous: role filters and the render context show in them.
#[test]
fn goldens_differ_by_role_as_the_template_says() {
    let read = |role| std::fs::read_to_string(golden_path(OutputFormat::Script, role)).unwrap();
    let (init, join, worker) = (
        read(Role::Init),
        read(Role::ControlPlaneJoin),
        read(Role::Worker),
    );
    assert!(init.contains("kubeadm init") && !init.contains("kubeadm join"));
    assert!(join.contains("kubeadm join") && join.contains("controlPlane: {}"));
    assert!(worker.contains("kubeadm join") && !worker.contains("controlPlane"));
    assert!(init.contains("SAMPLE CLUSTER CA KEY") && join.contains("SAMPLE CLUSTER CA KEY"));
    assert!(
        !worker.contains("PRIVATE KEY"),
        "a worker's user-data holds no private key"
    );
    assert!(worker.contains(render::SAMPLE_TOKEN) && !init.contains(render::SAMPLE_TOKEN));
    // Order: pre-commands, part commands, post-commands, sentinel last.
    let pre = worker.find("echo pre-command").unwrap();
    let apt = worker.find("apt-get update").unwrap();
    let post = worker.find("echo post-command").unwrap();
    let sentinel = worker.find("bootstrap-success.complete").unwrap();
    assert!(pre < apt && apt < post && post < sentinel);
}

/// The benchmark's template is a real one: it renders for every role and passes
/// `cloud-init schema`, so the figure in docs/benchmarks.md measures valid output.
#[test]
fn benchmark_template_renders_valid_cloud_config() {
    let spec: crd_types::TemplateSpec =
        serde_yaml::from_str(include_str!("../benches/kubeadm.yaml")).unwrap();
    let config: crd_types::BootplateConfigSpec = serde_yaml::from_str(
        "templateRef: {kind: ClusterBootstrapTemplate, name: bench}\nvariables:\n  httpProxy: http://proxy.example.com:3128\n  ntpServers: [ntp1.example.com]\n  nodeLabels: tier=web\n  apiServerExtraArgs: {profiling: \"false\"}\n",
    )
    .unwrap();
    assert_eq!(spec.variables.len(), 40);
    assert_eq!(spec.partials.len(), 3);
    let compiled = CompiledTemplate::compile("ClusterBootstrapTemplate bench", &spec)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(render::lint("ClusterBootstrapTemplate bench", &spec, Some(&config)).is_empty());
    let dir = tempfile::tempdir().unwrap();
    for role in Role::ALL {
        let rendered = compiled.render(&config, &sample_context(role)).unwrap();
        let path = dir.path().join(format!("{role}.yaml"));
        std::fs::write(&path, &rendered.data).unwrap();
        common::check_cloud_config(&path);
        let text = String::from_utf8(rendered.data).unwrap();
        let kubeadm = text.split("/run/kubeadm/kubeadm.yaml").nth(1).unwrap();
        assert!(kubeadm.contains("KubeletConfiguration"));
    }
}
