//! `bootplate render`, `bootplate lint` and `bootplate diff` as a user runs them: the shipped examples, exit
//! codes, messages on stderr, and FILE:LINE:COL pointing at the right line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn bootplate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .args(args)
        .current_dir(repo(""))
        .output()
        .expect("bootplate runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Runs a tool that the test needs; a missing tool fails the test.
fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} is required (tests/scripts/install-tools.sh): {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

const EXAMPLE: [&str; 6] = [
    "render",
    "--template",
    "examples/ubuntu-2404.yaml",
    "--cluster",
    "examples/cluster.yaml",
    "--machine",
];

fn render_example(machine: &str, extra: &[&str]) -> Output {
    let mut args = EXAMPLE.to_vec();
    args.push(machine);
    args.extend_from_slice(extra);
    bootplate(&args)
}

fn check_cloud_config(data: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("user-data");
    std::fs::write(&path, data).unwrap();
    tool(
        "cloud-init",
        &["schema", "--config-file", &path.to_string_lossy()],
    );
}

/// A config whose `spec.network` the template never reads: the render succeeds and says so on
/// stderr, naming the template and the fields (never their values); a template that reads the
/// input (plain-linux) renders the same config without a word.
#[test]
fn render_warns_of_network_input_the_template_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: BootplateConfig\nmetadata: {name: workers, namespace: team-a}\nspec:\n  templateRef: {kind: ClusterBootstrapTemplate, name: any}\n  network:\n    proxy: {http: \"http://proxy.corp.example:3128\"}\n    ntpServers: [ntp.corp.example]\n",
    )
    .unwrap();
    let config = config.to_string_lossy().into_owned();
    let out = render_example("examples/machine-worker.yaml", &["--config", &config]);
    assert_exit(&out, 0);
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr,
        "bootplate render: warning: template ClusterBootstrapTemplate ubuntu-2404 takes no network input: spec.network.proxy, spec.network.ntpServers not applied to the machine (the config renders without it; pick a template that reads it, see docs/air-gapped.md)\n"
    );
    assert!(!stderr.contains("proxy.corp.example"), "{stderr}");
    let out = bootplate(&[
        "render",
        "--template",
        "templates/plain-linux.yaml",
        "--cluster",
        "templates/testdata/cluster.yaml",
        "--machine",
        "templates/testdata/machine-plain.yaml",
        "--config",
        &config,
    ]);
    assert_exit(&out, 0);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn readme_command_renders_a_valid_init_cloud_config() {
    let out = render_example("examples/machine-control-plane.yaml", &[]);
    assert_exit(&out, 0);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let user_data = text(&out.stdout);
    assert!(user_data.starts_with("#cloud-config\n"));
    assert!(user_data.contains("kubeadm init") && !user_data.contains("kubeadm join"));
    assert!(user_data.contains("kind: InitConfiguration"));
    assert!(
        user_data.contains("-----BEGIN CERTIFICATE-----"),
        "throw-away certificates"
    );
    assert!(user_data.contains("kubernetesVersion: \"v1.31.2\""));
    check_cloud_config(&out.stdout);
}

#[test]
fn worker_role_comes_from_labels_and_gets_no_private_key() {
    let out = render_example(
        "examples/machine-worker.yaml",
        &["--config", "examples/config.yaml"],
    );
    assert_exit(&out, 0);
    let user_data = text(&out.stdout);
    assert!(user_data.contains("kubeadm join") && user_data.contains("kind: JoinConfiguration"));
    assert!(!user_data.contains("PRIVATE KEY"));
    assert!(user_data.contains("apiServerEndpoint: \"10.0.0.100:6443\""));
    assert!(
        user_data.contains("HTTP_PROXY=http://proxy.example.com:3128"),
        "config variable"
    );
    assert!(
        user_data.contains("This machine was provisioned by bootplate."),
        "config file"
    );
    check_cloud_config(&out.stdout);
    // A random, well-formed token each time.
    let token = |s: &str| {
        s.lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .unwrap()
            .to_owned()
    };
    let again = text(&render_example("examples/machine-worker.yaml", &[]).stdout);
    assert_ne!(token(&user_data), token(&again));
    assert_eq!(token(&again).len(), "\"abcdef.0123456789abcdef\"".len());
}

#[test]
fn role_token_and_ca_can_be_given() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    openssl_ca(&cert, &key, "test-ca");
    // The CA hash as kubeadm's documentation computes it.
    let hash = tool(
        "sh",
        &[
            "-c",
            &format!(
                "openssl x509 -pubkey -in {} | openssl pkey -pubin -outform der | sha256sum",
                cert.display()
            ),
        ],
    );
    let hash = format!("sha256:{}", hash.split_whitespace().next().unwrap());
    let output = dir.path().join("user-data");
    let out = render_example(
        "examples/machine-control-plane.yaml",
        &[
            "--role",
            "control-plane-join",
            "--token",
            "abcdef.0123456789abcdef",
            "--ca-cert",
            &cert.to_string_lossy(),
            "--ca-key",
            &key.to_string_lossy(),
            "--output",
            &output.to_string_lossy(),
        ],
    );
    assert_exit(&out, 0);
    assert!(
        out.stdout.is_empty(),
        "--output writes the file, not stdout"
    );
    let user_data = std::fs::read_to_string(&output).unwrap();
    assert!(user_data.contains("controlPlane: {}"), "control-plane-join");
    assert!(user_data.contains("token: \"abcdef.0123456789abcdef\""));
    assert!(user_data.contains(&hash), "CA hash {hash} not in output");
    let cert_pem = std::fs::read_to_string(&cert).unwrap();
    let first_line = cert_pem.lines().nth(1).unwrap();
    assert!(
        user_data.contains(first_line),
        "the given CA certificate is written"
    );
}

/// A self-signed EC CA made by openssl: `cert` and `key` (PEM).
fn openssl_ca(cert: &Path, key: &Path, name: &str) {
    tool(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-days",
            "1",
            "-keyout",
            &key.to_string_lossy(),
            "-out",
            &cert.to_string_lossy(),
        ],
    );
}

/// `--pki-dir`: every certificate and key of a kubeadm-layout directory is what a
/// control-plane render writes (so two renders share them); a missing file is an input error
/// that names it.
#[test]
fn pki_dir_gives_every_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(pki.join("etcd")).unwrap();
    for (cert, key) in [
        ("ca.crt", "ca.key"),
        ("etcd/ca.crt", "etcd/ca.key"),
        ("front-proxy-ca.crt", "front-proxy-ca.key"),
    ] {
        openssl_ca(&pki.join(cert), &pki.join(key), &cert.replace('/', "-"));
    }
    let sa_key = pki.join("sa.key").to_string_lossy().into_owned();
    tool(
        "openssl",
        &["genpkey", "-algorithm", "ed25519", "-out", &sa_key],
    );
    let sa_pub = tool("openssl", &["pkey", "-in", &sa_key, "-pubout"]);
    std::fs::write(pki.join("sa.pub"), sa_pub).unwrap();
    let args = [
        "--role",
        "control-plane-join",
        "--pki-dir",
        pki.to_str().unwrap(),
    ];
    let out = render_example("examples/machine-control-plane.yaml", &args);
    assert_exit(&out, 0);
    let user_data = text(&out.stdout);
    for file in [
        "ca.crt",
        "ca.key",
        "etcd/ca.crt",
        "etcd/ca.key",
        "front-proxy-ca.crt",
        "front-proxy-ca.key",
        "sa.pub",
        "sa.key",
    ] {
        let pem = std::fs::read_to_string(pki.join(file)).unwrap();
        let body = pem.lines().nth(1).unwrap();
        assert!(user_data.contains(body), "{file} is not in the render");
    }
    std::fs::remove_file(pki.join("front-proxy-ca.key")).unwrap();
    let out = render_example("examples/machine-control-plane.yaml", &args);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("--pki-dir: ")
            && text(&out.stderr).contains("front-proxy-ca.key"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_input_exits_2() {
    let cases: [&[&str]; 6] = [
        &["render"],
        &[
            "render",
            "--template",
            "nope.yaml",
            "--machine",
            "examples/machine-worker.yaml",
            "--cluster",
            "examples/cluster.yaml",
        ],
        &[
            "render",
            "--template",
            "examples/ubuntu-2404.yaml",
            "--machine",
            "examples/cluster.yaml",
            "--cluster",
            "examples/cluster.yaml",
        ],
        &[
            "render",
            "--template",
            "examples/ubuntu-2404.yaml",
            "--machine",
            "examples/machine-worker.yaml",
            "--cluster",
            "examples/cluster.yaml",
            "--token",
            "bad",
        ],
        &[
            "render",
            "--template",
            "examples/ubuntu-2404.yaml",
            "--machine",
            "examples/machine-worker.yaml",
            "--cluster",
            "examples/cluster.yaml",
            "--ca-cert",
            "examples/cluster.yaml",
        ],
        &["lint"],
    ];
    for args in cases {
        let out = bootplate(args);
        assert_exit(&out, 2);
        assert!(out.stdout.is_empty());
        assert!(!out.stderr.is_empty(), "{args:?} explains on stderr");
    }
    let out = bootplate(&[
        "render",
        "--template",
        "examples/ubuntu-2404.yaml",
        "--machine",
        "examples/cluster.yaml",
        "--cluster",
        "examples/cluster.yaml",
    ]);
    assert!(text(&out.stderr).contains("examples/cluster.yaml: no Machine in this file"));
}

fn write_template(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("template.yaml");
    std::fs::write(&path, body).unwrap();
    path
}

const BROKEN: &str = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata:
  name: broken
  namespace: team-a
spec:
  os: {name: ubuntu}
  format: cloud-config
  variables:
    - name: required
      required: true
      schema: {type: string}
  parts:
    - name: configure
      commands:
        - echo {{shell_quote values.required}}
        - |
          echo one
          echo {{values.typo}}
";

#[test]
fn render_failures_exit_1_with_the_reason_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let template = write_template(dir.path(), BROKEN);
    let out = bootplate(&[
        "render",
        "--template",
        &template.to_string_lossy(),
        "--machine",
        "examples/machine-worker.yaml",
        "--cluster",
        "examples/cluster.yaml",
    ]);
    assert_exit(&out, 1);
    assert!(out.stdout.is_empty());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("BootstrapTemplate team-a/broken: variable `required`: required"),
        "{stderr}"
    );
}

/// `bootplate render` errors start with FILE:LINE:COL of their culprit, in the template or in
/// the `--config` file, as lint's do. Before, they named only the field and a line inside it.
#[test]
fn render_errors_start_with_the_file_line_and_column_of_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let template = write_template(dir.path(), BROKEN);
    let config = dir.path().join("config.yaml");
    let config_text = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: c, namespace: team-a}
spec:
  templateRef: {kind: BootstrapTemplate, name: broken}
  variables:
    required: 5
";
    std::fs::write(&config, config_text).unwrap();
    let (template, config) = (template.to_string_lossy(), config.to_string_lossy());
    // (extra arguments, the file, the culprit in it)
    let cases = [
        (
            ["--set", "required=x"],
            &*template,
            BROKEN,
            "{{values.typo}}",
        ),
        (["--config", &*config], &*config, config_text, "5"),
    ];
    for (extra, file, body, culprit) in cases {
        let mut args = vec![
            "render",
            "--template",
            &*template,
            "--machine",
            "examples/machine-worker.yaml",
            "--cluster",
            "examples/cluster.yaml",
        ];
        args.extend(extra);
        let out = bootplate(&args);
        assert_exit(&out, 1);
        let (line, column) = find(body, culprit);
        let stderr = text(&out.stderr);
        assert!(
            stderr.starts_with(&format!("bootplate render: {file}:{line}:{column}: ")),
            "{culprit} at {line}:{column}: {stderr}"
        );
    }
}

#[test]
fn lint_points_at_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let template = write_template(dir.path(), BROKEN);
    let shown = template.to_string_lossy().to_string();
    let out = bootplate(&["lint", "--format", "short", &shown]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    // `{{values.typo}}` is on line 19, column 16 of the file.
    let expected = format!(
        "{shown}:19:16: error: spec.parts[0].commands[1]: `values.typo` is not declared in spec.variables (known: `required`)"
    );
    assert!(stdout.lines().any(|l| l == expected), "{stdout}");
    assert!(BROKEN.lines().nth(18).unwrap().find("{{values.typo}}") == Some(15));
    // Said once: the sample render fails on the same name at the same place, which adds
    // nothing (it was a second error, "undefined variable `values.typo`").
    assert_eq!(stdout.matches(":19:16:").count(), 1, "{stdout}");
}

#[test]
fn lint_reports_syntax_errors_in_partials_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_template(
        dir.path(),
        "kind: ClusterBootstrapTemplate\nmetadata: {name: a}\nspec:\n  os: {name: x}\n  format: script\n  variables: [{name: unused}]\n  template: \"#!/bin/sh\\n\"\napiVersion: bootstrap.bootplate.dev/v1alpha1\n---\nkind: ClusterBootstrapTemplate\nmetadata: {name: b}\nspec:\n  os: {name: x}\n  format: script\n  partials:\n    p: \"ok {{#if x}}\"\n  template: \"#!/bin/sh\\n{{> p}}\"\napiVersion: bootstrap.bootplate.dev/v1alpha1\n",
    );
    let shown = path.to_string_lossy().to_string();
    let out = bootplate(&["lint", "--format", "short", &shown]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "{shown}:6:15: warning: spec.variables[0]: variable `unused` is declared"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{shown}:16:"))
            && stdout.contains("error: spec.partials.p: syntax error"),
        "{stdout}"
    );
}

#[test]
fn lint_accepts_the_examples_and_rejects_unreadable_files() {
    let out = bootplate(&["lint", "--format", "short", "examples/ubuntu-2404.yaml"]);
    assert_exit(&out, 0);
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let out = bootplate(&[
        "lint",
        "--format",
        "short",
        "examples/ubuntu-2404.yaml",
        "does-not-exist.yaml",
    ]);
    assert_exit(&out, 2);
    assert!(text(&out.stderr).contains("does-not-exist.yaml: cannot read"));
    // Every example lints, the CAPI objects `render` takes included.
    let out = bootplate(&[
        "lint",
        "--format",
        "short",
        "examples/cluster.yaml",
        "examples/config.yaml",
    ]);
    assert_exit(&out, 0);
    let dir = tempfile::tempdir().unwrap();
    let empty = write_template(dir.path(), "# nothing\n");
    let out = bootplate(&["lint", "--format", "short", &empty.to_string_lossy()]);
    assert_exit(&out, 2);
    assert!(text(&out.stderr).contains("no objects in this file"));
    let help = text(&bootplate(&["lint", "--format", "short", "--help"]).stdout);
    assert!(help.contains("FILE:LINE:COL") && help.contains("Exit codes"));
}

/// Writes `body` as a template file in `dir` and lints it with `args` (short format): the
/// file's name as lint shows it, and the run.
fn lint_body(dir: &Path, body: &str, args: &[&str]) -> (String, Output) {
    let shown = write_template(dir, body).to_string_lossy().to_string();
    let mut all = vec!["lint", "--format", "short"];
    all.extend_from_slice(args);
    all.push(&shown);
    let out = bootplate(&all);
    (shown, out)
}

/// The line and column of the first occurrence of `needle` in `text`, from 1.
fn find(text: &str, needle: &str) -> (usize, usize) {
    text.lines()
        .enumerate()
        .find_map(|(i, l)| l.find(needle).map(|c| (i + 1, c + 1)))
        .unwrap_or_else(|| panic!("{needle:?} not in the text"))
}

const KEY_FILE: &str = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: keys
spec:
  os: {name: ubuntu}
  format: cloud-config
  parts:
    - name: configure
      files:
        - path: /etc/kubernetes/pki/sa.key
          permission: \"0600\"
          content: \"{{#if certs}}{{certs.serviceAccount.key}}{{/if}}\"
";

#[test]
fn an_unknown_field_is_an_error_at_its_key_with_the_field_meant() {
    // Before: `permission` was dropped and the key rendered world-readable, lint exit 0.
    let dir = tempfile::tempdir().unwrap();
    let (shown, out) = lint_body(dir.path(), KEY_FILE, &[]);
    let (line, col) = find(KEY_FILE, "permission:");
    assert_exit(&out, 1);
    let expected = format!(
        "{shown}:{line}:{col}: error: spec.parts[0].files[0].permission: unknown field `permission`; did you mean `permissions`?"
    );
    assert!(
        text(&out.stdout).lines().any(|l| l == expected),
        "{}",
        text(&out.stdout)
    );
    // render refuses the same input, on stderr, as bad input.
    let out = bootplate(&[
        "render",
        "--template",
        &shown,
        "--machine",
        "examples/machine-control-plane.yaml",
        "--cluster",
        "examples/cluster.yaml",
    ]);
    assert_exit(&out, 2);
    assert!(out.stdout.is_empty(), "no key written");
    assert!(
        text(&out.stderr).contains(&expected),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_wrong_api_version_or_a_misspelled_kind_is_an_error() {
    // Before: a wrong apiVersion was accepted and a misspelled kind skipped with exit 0.
    let body = format!(
        "{}---\napiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: BootstrapTemplat\nmetadata: {{name: other}}\nspec: {{}}\n",
        KEY_FILE
            .replace("permission:", "permissions:")
            .replace("v1alpha1", "v1beta1")
    );
    let dir = tempfile::tempdir().unwrap();
    let (shown, out) = lint_body(dir.path(), &body, &[]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "{shown}:1:13: error: apiVersion: `bootstrap.bootplate.dev/v1beta1` does not serve ClusterBootstrapTemplate: use `bootstrap.bootplate.dev/v1alpha1`"
            ),
            format!(
                "{shown}:16:7: error: kind: unknown kind `BootstrapTemplat`; did you mean `BootstrapTemplate`?"
            ),
        ],
        "{stdout}"
    );
}

#[test]
fn wrong_types_point_at_the_value_not_the_spec() {
    let body = KEY_FILE
        .replace("permission:", "permissions:")
        .replace("  parts:\n", "  maxOutputBytes: lots\n  parts:\n");
    let dir = tempfile::tempdir().unwrap();
    let (shown, out) = lint_body(dir.path(), &body, &[]);
    assert_exit(&out, 1);
    let (line, col) = find(&body, "lots");
    assert_eq!(
        text(&out.stdout).trim_end(),
        format!(
            "{shown}:{line}:{col}: error: spec.maxOutputBytes: must be an integer, got a string"
        )
    );
}

#[test]
fn lint_and_render_take_the_same_config_kinds_and_locate_config_problems() {
    let dir = tempfile::tempdir().unwrap();
    let config_template = dir.path().join("bpct.yaml");
    let body = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfigTemplate
metadata: {name: workers}
spec:
  template:
    spec:
      templateRef: {kind: ClusterBootstrapTemplate, name: ubuntu-2404}
      variables:
        httpProxy: 17
";
    std::fs::write(&config_template, body).unwrap();
    let shown = config_template.to_string_lossy().to_string();
    let out = bootplate(&[
        "lint",
        "--format",
        "short",
        "--config",
        &shown,
        "examples/ubuntu-2404.yaml",
    ]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    let (line, _) = find(body, "httpProxy");
    assert!(
        stdout.starts_with(&format!("{shown}:{line}:")) && stdout.contains("httpProxy"),
        "{stdout}"
    );
    let out = render_example("examples/machine-worker.yaml", &["--config", &shown]);
    assert_exit(&out, 1);
    assert!(
        text(&out.stderr).contains("httpProxy"),
        "{}",
        text(&out.stderr)
    );
    let good = std::fs::read_to_string(repo("examples/config.yaml")).unwrap();
    assert!(good.contains("kind: BootplateConfig\n"));
    let fixed = body.replace("httpProxy: 17", "httpProxy: http://proxy.example.com:3128");
    std::fs::write(&config_template, fixed).unwrap();
    let out = bootplate(&[
        "lint",
        "--format",
        "short",
        "--config",
        &shown,
        "examples/ubuntu-2404.yaml",
    ]);
    assert_exit(&out, 0);
    let out = render_example("examples/machine-worker.yaml", &["--config", &shown]);
    assert_exit(&out, 0);
}

const INJECTABLE: &str = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata: {name: injectable}
spec:
  os: {name: ubuntu}
  format: cloud-config
  variables:
    - {name: greeting, default: hi, schema: {type: string}}
    - {name: nodeTaint, default: none, schema: {type: string}}
  parts:
    - name: configure
      files:
        - path: /run/kubeadm/join.yaml
          content: |
            kind: JoinConfiguration
            nodeRegistration:
              name: {{machine.name}}
              taints: [{key: {{values.nodeTaint}}}]
      commands:
        - echo \"{{values.greeting}}\"
        - echo {{shell_quote values.greeting}}
";

#[test]
fn free_text_written_unquoted_is_a_warning_and_an_error_with_strict() {
    // Before: `hi\"; touch /tmp/x; echo \"` in the command, or a newline and `controlPlane: {}` in
    // the worker's JoinConfiguration, linted clean.
    let dir = tempfile::tempdir().unwrap();
    let (shown, out) = lint_body(dir.path(), INJECTABLE, &[]);
    assert_exit(&out, 0);
    let stdout = text(&out.stdout);
    let expect = |needle: &str, what: &str, into: &str| {
        let (line, col) = find(INJECTABLE, needle);
        let prefix = format!("{shown}:{line}:{col}: warning: ");
        assert!(
            stdout.lines().any(|l| l.starts_with(&prefix)
                && l.contains(&format!(
                    "`{what}` is free text written unquoted into {into}"
                ))),
            "{prefix} {what}\n{stdout}"
        );
    };
    expect("{{machine.name}}", "machine.name", "a YAML document");
    expect(
        "{{values.nodeTaint}}",
        "values.nodeTaint",
        "a YAML document",
    );
    expect("{{values.greeting}}", "values.greeting", "a shell command");
    assert_eq!(
        stdout.lines().count(),
        3,
        "the quoted use is fine:\n{stdout}"
    );
    let out = bootplate(&["lint", "--strict", "--format", "short", &shown]);
    assert_exit(&out, 1);
    assert_eq!(text(&out.stdout).matches(": error: ").count(), 3);
}

#[test]
fn diagnostics_show_the_source_json_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_template(dir.path(), KEY_FILE);
    let shown = path.to_string_lossy().to_string();
    let out = bootplate(&["lint", &shown]);
    assert_exit(&out, 1);
    let (line, col) = find(KEY_FILE, "permission:");
    let expected = format!(
        "error: spec.parts[0].files[0].permission: unknown field `permission`\n  --> {shown}:{line}:{col}\n   |\n{line} |           permission: \"0600\"\n   |           ^^^^^^^^^^^ did you mean `permissions`?\n"
    );
    assert!(
        text(&out.stdout).starts_with(&expected),
        "{}",
        text(&out.stdout)
    );

    let out = bootplate(&["lint", "--format", "json", &shown]);
    assert_exit(&out, 1);
    let problem: serde_json::Value =
        serde_json::from_str(text(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(
        problem,
        serde_json::json!({
            "file": shown, "line": line, "column": col, "severity": "error",
            "code": "unknown-field", "field": "spec.parts[0].files[0].permission",
            "message": "unknown field `permission`", "hint": "did you mean `permissions`?",
        })
    );

    // `-` reads standard input; an unreadable file does not stop the others being linted.
    let mut child = Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .args([
            "lint",
            "--format",
            "short",
            "-",
            "does-not-exist.yaml",
            &shown,
        ])
        .current_dir(repo(""))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), KEY_FILE.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 2);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "-:{line}:{col}: error: spec.parts[0].files[0].permission"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{shown}:{line}:{col}: error:")),
        "{stdout}"
    );
    assert!(text(&out.stderr).contains("does-not-exist.yaml: cannot read"));
}

#[test]
fn an_unclosed_block_is_reported_at_its_opening_tag_in_plain_words() {
    // Before: at the end of the partial, with the parser's grammar rules listed.
    let body = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata: {name: s}
spec:
  os: {name: ubuntu}
  format: script
  partials:
    p: |
      echo one
      {{#if machine.name}}
      echo two
      echo three
  template: \"#!/bin/sh\\n{{> p}}\\n\"
";
    let dir = tempfile::tempdir().unwrap();
    let (shown, out) = lint_body(dir.path(), body, &[]);
    assert_exit(&out, 1);
    let (line, col) = find(body, "{{#if");
    assert_eq!(
        text(&out.stdout).trim_end(),
        format!(
            "{shown}:{line}:{col}: error: spec.partials.p: syntax error: `{{{{#if}}}}` is never closed: add `{{{{/if}}}}` where the block ends"
        )
    );
}

#[test]
fn every_shipped_template_and_example_lints_clean_with_strict() {
    let mut files: Vec<String> = ["templates", "examples"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(repo(dir)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(files.len() >= 12, "{files:?}");
    let mut args = vec!["lint", "--strict", "--format", "short"];
    args.extend(files.iter().map(String::as_str));
    let out = bootplate(&args);
    assert_exit(&out, 0);
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

#[test]
fn set_and_role_all_render_one_file_per_role() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = render_example(
        "examples/machine-worker.yaml",
        &[
            "--set",
            "httpProxy=http://set.example.com:3128",
            "--role",
            "all",
            "--output",
            &out_dir.to_string_lossy(),
        ],
    );
    assert_exit(&out, 0);
    for (role, joins) in [
        ("init", false),
        ("control-plane-join", true),
        ("worker", true),
    ] {
        let data = std::fs::read_to_string(out_dir.join(format!("user-data-{role}"))).unwrap();
        assert!(
            data.contains("HTTP_PROXY=http://set.example.com:3128"),
            "{role}"
        );
        assert_eq!(data.contains("kubeadm join"), joins, "{role}");
        assert_eq!(data.contains("PRIVATE KEY"), role != "worker", "{role}");
    }
    // A value --set gives is checked like a config's.
    let out = render_example("examples/machine-worker.yaml", &["--set", "httpProxy=17"]);
    assert_exit(&out, 1);
    assert!(
        text(&out.stderr).contains("httpProxy"),
        "{}",
        text(&out.stderr)
    );
    let out = render_example("examples/machine-worker.yaml", &["--role", "all"]);
    assert_exit(&out, 2);
    assert!(text(&out.stderr).contains("--output DIR"));
}

#[test]
fn shell_output_goes_through_bash_n_and_tools_run_on_request() {
    let body = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata: {name: sh}
spec:
  os: {name: ubuntu}
  format: script
  template: |
    #!/bin/bash
    if [ -n {{shell_quote machine.name}} ]; then
      echo hi
";
    let dir = tempfile::tempdir().unwrap();
    let (shown, out) = lint_body(dir.path(), body, &[]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    let (line, col) = find(body, "#!/bin/bash");
    assert!(
        stdout.lines().any(|l| l.starts_with(&format!(
            "{shown}:{line}:{col}: error: spec.template: bash -n rejects the output (role worker): "
        )) && l.contains("syntax error")),
        "{stdout}"
    );
    let fixed = body.replace("      echo hi\n", "      echo hi\n    fi\n");
    let (_, out) = lint_body(dir.path(), &fixed, &[]);
    assert_exit(&out, 0);
    // shellcheck (installed by tests/scripts/install-tools.sh) sees what bash -n does not: a
    // test of a quoted constant is always true.
    let (_, out) = lint_body(dir.path(), &fixed, &["--tools"]);
    assert_exit(&out, 1);
    assert!(text(&out.stdout).contains("shellcheck rejects the output (role worker)"));
    assert!(text(&out.stdout).contains("SC2157"));
    let compared = fixed.replace("-n {{", "\"$(hostname)\" = {{");
    let (_, out) = lint_body(dir.path(), &compared, &["--tools"]);
    assert_exit(&out, 0);
}

#[test]
fn every_kubeadm_template_renders_every_role_for_every_minor_from_v1_30_to_v1_37() {
    let machine = std::fs::read_to_string(repo("examples/machine-control-plane.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut templates: Vec<PathBuf> = std::fs::read_dir(repo("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| std::fs::read_to_string(p).unwrap().contains("kubeadm init"))
        .collect();
    templates.push(repo("examples/ubuntu-2404.yaml"));
    templates.sort();
    assert!(templates.len() >= 7, "{templates:?}");
    for minor in 30..=37 {
        let version = format!("v1.{minor}.1");
        let machine_file = dir.path().join(format!("machine-{minor}.yaml"));
        std::fs::write(&machine_file, machine.replace("v1.31.2", &version)).unwrap();
        let api = if minor < 31 { "v1beta3" } else { "v1beta4" };
        for template in &templates {
            let out_dir = dir.path().join(format!("out-{minor}"));
            let out = bootplate(&[
                "render",
                "--template",
                &template.to_string_lossy(),
                "--machine",
                &machine_file.to_string_lossy(),
                "--cluster",
                "examples/cluster.yaml",
                "--role",
                "all",
                "--output",
                &out_dir.to_string_lossy(),
            ]);
            assert_exit(&out, 0);
            for role in ["init", "control-plane-join", "worker"] {
                let data = std::fs::read(out_dir.join(format!("user-data-{role}"))).unwrap();
                let text = String::from_utf8_lossy(&data);
                if text.starts_with('{') {
                    // Ignition carries the kubeadm configuration inside the compressed bootstrap
                    // script; tests/templates.rs checks its version there.
                    continue;
                }
                assert!(
                    text.contains(&format!("kubeadm.k8s.io/{api}")),
                    "{} {version} {role}: no kubeadm.k8s.io/{api}",
                    template.display()
                );
            }
        }
    }
}

/// The controller runs on jemalloc with the options compiled into the binary (main.rs): asked
/// to print its statistics at exit, the allocator reports them as in effect. A renamed symbol
/// or another allocator would leave jemalloc's defaults (8 arenas here, 10 s decay) or print
/// nothing.
#[test]
fn the_binary_runs_on_jemalloc_with_its_compiled_in_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let stats = text(&out.stderr);
    for option in [
        "opt.narenas: 1\n",
        "opt.dirty_decay_ms: 1000 ",
        "opt.muzzy_decay_ms: 0 ",
    ] {
        assert!(
            stats.contains(option),
            "{option:?} not in jemalloc's statistics:\n{}",
            &stats[..stats.len().min(2000)]
        );
    }
}

/// `bootplate import`: the example imports cleanly into a config that renders with
/// kubeadm-compat; a field that is not carried fails (exit 1, named on stderr) unless
/// --allow-lossy; the MachineDeployment patch; input over the size limit, or of no kubeadm
/// kind, exits 2.
#[test]
fn import_carries_names_what_it_cannot_and_writes_the_patch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = bootplate(&["import", "examples/kubeadm-config-template.yaml"]);
    assert_exit(&out, 0);
    let imported = dir.path().join("imported.yaml");
    std::fs::write(&imported, &out.stdout).expect("write");
    let rendered = bootplate(&[
        "render",
        "--template",
        "templates/kubeadm-compat.yaml",
        "--machine",
        "templates/testdata/machine-worker-v1.31.yaml",
        "--cluster",
        "templates/testdata/cluster.yaml",
        "--config",
        &imported.to_string_lossy(),
    ]);
    assert_exit(&rendered, 0);
    let user_data = text(&rendered.stdout);
    for expected in [
        "\n  - \"echo pre-kubeadm\"\n  - \"kubeadm join",
        "path: \"/etc/app/token\"",
    ] {
        assert!(user_data.contains(expected), "{expected}:\n{user_data}");
    }

    let lossy = dir.path().join("lossy.yaml");
    std::fs::write(
        &lossy,
        "apiVersion: bootstrap.cluster.x-k8s.io/v1beta1\nkind: KubeadmConfigTemplate\n\
         metadata: {name: workers, namespace: team-a}\nspec:\n  template:\n    spec:\n      \
         files: [{path: /etc/a, content: x, append: true}]\n      format: ignition\n      \
         bootCommands: [echo]\n",
    )
    .expect("write");
    let out = bootplate(&["import", &lossy.to_string_lossy()]);
    assert_exit(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("KubeadmConfigTemplate workers: spec.template.spec.files[0].append"),
        "{stderr}"
    );
    // An Ignition spec imports to kubeadm-compat-ignition; what the provider refuses with
    // Ignition is named.
    assert!(
        stderr.contains(
            "KubeadmConfigTemplate workers: spec.template.spec.bootCommands: not carried: the kubeadm bootstrap provider refuses bootCommands with format ignition"
        ),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing written when the import fails"
    );

    let patch = dir.path().join("patch.yaml");
    let out = bootplate(&[
        "import",
        "--allow-lossy",
        "--machine-deployment",
        "md-0",
        "--patch-output",
        &patch.to_string_lossy(),
        &lossy.to_string_lossy(),
    ]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stderr).starts_with("warning: "),
        "{}",
        text(&out.stderr)
    );
    let patch: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&patch).expect("patch")).expect("YAML");
    let reference = &patch["spec"]["template"]["spec"]["bootstrap"]["configRef"];
    assert_eq!(reference["kind"], "BootplateConfigTemplate");
    assert_eq!(reference["name"], "workers");

    let big = dir.path().join("big.yaml");
    std::fs::write(&big, vec![b'#'; (16 << 20) + 1]).expect("write");
    let out = bootplate(&["import", &big.to_string_lossy()]);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("larger than 16 MiB"),
        "{}",
        text(&out.stderr)
    );
    assert_exit(&bootplate(&["import", "examples/cluster.yaml"]), 2);

    // --kubeconfig reads KIND/NAME (kubeadm_compat reads it from a real cluster): anything else
    // is refused before the kubeconfig is opened; --context and --namespace need --kubeconfig.
    let out = bootplate(&[
        "import",
        "--kubeconfig",
        "/nonexistent",
        "examples/kubeadm-config-template.yaml",
    ]);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("give it as kubeadmconfigtemplate/NAME or kubeadmconfig/NAME"),
        "{}",
        text(&out.stderr)
    );
    let out = bootplate(&["import", "--kubeconfig", "/nonexistent", "kubeadmconfig/m1"]);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("/nonexistent: cannot read"),
        "{}",
        text(&out.stderr)
    );
    for flag in ["--context", "--namespace"] {
        assert_exit(&bootplate(&["import", flag, "x", "kubeadmconfig/m1"]), 2);
    }
}

/// A template whose one file holds `size` bytes of text, and whose worker render adds a second
/// file of the same size (so the roles differ), optionally gzip-compressed.
fn sized_template(size: usize, compression: &str) -> String {
    let filler = "abcdefghij".repeat(size / 10);
    format!(
        "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata:
  name: sized
  namespace: team-a
spec:
  os: {{name: ubuntu}}
  format: cloud-config
  compression: {compression}
  parts:
    - name: configure
      files:
        - path: /etc/filler
          content: \"{filler}\"
        - path: /etc/worker-filler
          content: \"{{{{#if (eq machine.role \\\"worker\\\")}}}}{filler}{{{{/if}}}}\"
"
    )
}

/// `--max-user-data` measures each role's render as the named cloud counts it (raw bytes, or
/// the base64 text), says which role is over at the text that writes the most, and names
/// compression as the way out; a compressed render that fits passes.
#[test]
fn max_user_data_refuses_renders_a_cloud_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    // About 20 KB for init and control-plane-join, 40 KB for the worker.
    let body = sized_template(20_000, "none");
    let (shown, out) = lint_body(dir.path(), &body, &["--max-user-data", "aws"]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains("user-data")).collect();
    assert_eq!(lines.len(), 3, "one per role:\n{stdout}");
    for role in ["init", "control-plane-join", "worker"] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("the {role} render is "))),
            "{role}:\n{stdout}"
        );
    }
    let worker = lines
        .iter()
        .find(|l| l.contains("the worker render"))
        .unwrap();
    assert!(worker.starts_with(&format!("{shown}:")), "{worker}");
    assert!(
        worker.contains("aws's user-data limit of 16384 bytes (--max-user-data aws)")
            && worker.contains("spec.parts[0].files[")
            && worker.contains("`compression: gzip`")
            && worker.contains("`delivery: Fetch` leaves only a stub"),
        "{worker}"
    );
    let init = lines
        .iter()
        .find(|l| l.contains("the init render"))
        .unwrap();
    assert!(init.contains("always travels whole"), "{init}");
    // Fetch delivery: worker and control-plane-join carry a stub, only init is over.
    let fetched = body.replace(
        "  compression: none\n",
        "  compression: none\n  delivery: Fetch\n",
    );
    assert_ne!(fetched, body);
    let (_, out) = lint_body(dir.path(), &fetched, &["--max-user-data", "aws"]);
    assert_exit(&out, 1);
    let over: Vec<String> = (text(&out.stdout).lines())
        .filter(|l| l.contains("user-data limit"))
        .map(str::to_owned)
        .collect();
    assert!(
        over.len() == 1 && over[0].contains("the init render"),
        "{over:?}"
    );
    // A limit below the stub's size: the stubs of the roles that fetch are over, each said once.
    let (_, out) = lint_body(dir.path(), &fetched, &["--max-user-data", "1000"]);
    assert_exit(&out, 1);
    let stubs: Vec<String> = (text(&out.stdout).lines())
        .filter(|l| l.contains("fetch stub"))
        .map(str::to_owned)
        .collect();
    assert_eq!(stubs.len(), 2, "{stubs:?}");
    for role in ["control-plane-join", "worker"] {
        assert!(
            stubs
                .iter()
                .any(|l| l.contains(&format!("the {role} fetch stub"))),
            "{role}: {stubs:?}"
        );
    }
    // Hetzner's 32 KiB: only the worker is over. Azure's 65,535 raw bytes: none; OpenStack's
    // 65,535 of base64 at 40 KB raw (about 53 KB of base64): none; with 50 KB raw, the
    // worker's 100 KB is over both, and the control plane's 50 KB over OpenStack's only.
    let (_, out) = lint_body(dir.path(), &body, &["--max-user-data", "hetzner"]);
    assert_exit(&out, 1);
    let over: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| l.contains("user-data"))
        .map(str::to_owned)
        .collect();
    assert!(
        over.len() == 1 && over[0].contains("the worker render"),
        "{over:?}"
    );
    for cloud in ["azure", "openstack"] {
        let (_, out) = lint_body(dir.path(), &body, &["--max-user-data", cloud]);
        assert_exit(&out, 0);
    }
    let body = sized_template(50_000, "none");
    let count = |cloud: &str| {
        let (_, out) = lint_body(dir.path(), &body, &["--max-user-data", cloud]);
        text(&out.stdout).matches("user-data limit").count()
    };
    assert_eq!((count("azure"), count("openstack")), (1, 3));
    // gzip: the filler compresses to almost nothing, and the limit applies to what is sent.
    let (_, out) = lint_body(
        dir.path(),
        &sized_template(20_000, "gzip"),
        &["--max-user-data", "aws"],
    );
    assert_exit(&out, 0);
    // A byte count, and a target lint does not know (usage error, exit 2, the choices named).
    let (_, out) = lint_body(dir.path(), &body, &["--max-user-data", "60000"]);
    assert_eq!(
        text(&out.stdout)
            .matches("the limit of 60000 bytes")
            .count(),
        1
    );
    let (_, out) = lint_body(dir.path(), &body, &["--max-user-data", "gcp"]);
    assert_exit(&out, 2);
    assert!(text(&out.stderr).contains("aws, azure, openstack, vsphere, hetzner"));
}

/// A config linted beside its template is measured with its own values: a file it adds that
/// takes a render over the cap is an error the template alone does not have, said at that file.
#[test]
fn max_user_data_measures_each_config_with_its_values() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let body = format!(
        "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {{name: big-files, namespace: default}}
spec:
  templateRef: {{kind: ClusterBootstrapTemplate, name: ubuntu-2404}}
  files:
    - path: /etc/filler
      content: \"{}\"
",
        "0123456789".repeat(2_000)
    );
    std::fs::write(&config, &body).unwrap();
    let shown = config.to_string_lossy().to_string();
    let lint = |files: &[&str]| {
        let mut args = vec!["lint", "--format", "short", "--max-user-data", "aws"];
        args.extend_from_slice(files);
        bootplate(&args)
    };
    let out = lint(&["examples/ubuntu-2404.yaml"]);
    assert_exit(&out, 0);
    let out = lint(&["examples/ubuntu-2404.yaml", &shown]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    let over: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("user-data limit"))
        .collect();
    assert!(!over.is_empty(), "{stdout}");
    // Said at the config's file, which is what makes it too large, once per role.
    let (line, column) = find(&body, "\"0123456789");
    assert_eq!(over.len(), 3, "{stdout}");
    for line_text in over {
        assert!(
            line_text.starts_with(&format!(
                "{shown}:{line}:{column}: error: spec.files[0].content: the "
            )) && line_text.contains("the config's spec.files[0].content alone is 20000 bytes"),
            "{line_text}"
        );
    }
}

/// A YAML file whose aliases repeat one anchored list: 1 200 000 nodes once expanded (past the
/// 1 000 000 of one input file) from 10 KB, in a document of `kind`.
fn alias_bomb_file(dir: &Path, kind: &str) -> PathBuf {
    let path = dir.join(format!("{kind}.yaml"));
    let text = format!(
        "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: {kind}\nmetadata: {{name: bomb, namespace: a}}\n\
         x-items: &a [{}]\nx-bomb: [{}]\n",
        vec!["x"; 1000].join(","),
        vec!["*a"; 1200].join(",")
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Every file the offline commands read is bounded by its expansion: lint, import and render
/// refuse an alias bomb at its file, line and column, with the limit, in the time of the limit
/// (before the bound, lint took 675 MB for 10 KB and then reported an unknown field).
#[test]
fn alias_bombs_in_input_files_are_refused_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let template = alias_bomb_file(dir.path(), "BootstrapTemplate");
    let kubeadm = alias_bomb_file(dir.path(), "KubeadmConfigTemplate");
    let (template, kubeadm) = (template.to_string_lossy(), kubeadm.to_string_lossy());
    let runs: [(Vec<&str>, i32, &str); 3] = [
        (vec!["lint", &template], 1, &template),
        (vec!["import", &kubeadm], 2, &kubeadm),
        (
            vec![
                "render",
                "--template",
                &template,
                "--machine",
                "examples/machine-worker.yaml",
                "--cluster",
                "examples/cluster.yaml",
            ],
            2,
            &template,
        ),
    ];
    for (args, code, file) in runs {
        let start = std::time::Instant::now();
        let out = bootplate(&args);
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_exit(&out, code);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{args:?}"
        );
        for fragment in [file, ":4:", "grows past 1000000 nodes", "aliases"] {
            assert!(
                all.contains(fragment),
                "{args:?}: {fragment:?} not in:\n{all}"
            );
        }
    }
}

/// A config with `delivery: Fetch`: the offline render prints what a joining machine receives,
/// the stub (no private key, no join configuration, under the stub's limit), with a note; with
/// `--payload` the render it fetches; `init`, which never fetches, has no payload to show.
#[test]
fn render_with_fetch_delivery_prints_the_stub_and_with_payload_what_it_fetches() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: BootplateConfig\nmetadata: {name: cp, namespace: team-a}\nspec:\n  templateRef: {kind: ClusterBootstrapTemplate, name: ubuntu-2404}\n  delivery: Fetch\n",
    )
    .unwrap();
    let config = config.to_string_lossy().into_owned();
    let machine = "examples/machine-control-plane.yaml";
    let join = ["--config", config.as_str(), "--role", "control-plane-join"];
    let stub = render_example(machine, &join);
    assert_exit(&stub, 0);
    let user_data = text(&stub.stdout);
    assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
    assert!(user_data.len() <= 3072, "{} bytes", user_data.len());
    assert!(
        user_data.contains("bootplate-fetch-offline-render"),
        "{user_data}"
    );
    for secret in ["PRIVATE KEY", "JoinConfiguration", "kubeadm join"] {
        assert!(
            !user_data.contains(secret),
            "{secret} in the stub:\n{user_data}"
        );
    }
    let note = text(&stub.stderr);
    assert!(
        note.contains("note: delivery: Fetch") && note.contains("--payload"),
        "{note}"
    );
    check_cloud_config(&stub.stdout);

    let payload = render_example(machine, &[&join[..], &["--payload"]].concat());
    assert_exit(&payload, 0);
    let fetched = text(&payload.stdout);
    assert!(fetched.starts_with("#!"), "a script: {fetched}");
    for part in ["PRIVATE KEY", "JoinConfiguration", "kubeadm join"] {
        assert!(fetched.contains(part), "{part} not in the payload");
    }

    let init = render_example(
        machine,
        &["--config", &config, "--role", "init", "--payload"],
    );
    assert_exit(&init, 2);
    assert!(
        text(&init.stderr).contains("--payload: a machine of role init receives its whole render"),
        "{}",
        text(&init.stderr)
    );
    let out = dir.path().join("out");
    let all = render_example(
        machine,
        &[
            "--config",
            &config,
            "--role",
            "all",
            "--payload",
            "--output",
            &out.to_string_lossy(),
        ],
    );
    assert_exit(&all, 0);
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, ["payload-control-plane-join", "payload-worker"]);
}

/// A template with a `Rollout` part and an `InPlace` part (a file, a unit's drop-in reading the
/// same value, a command), as tests/tests/inplace_capi.rs has it; `{mirror}` and `{runtime}` are
/// what the revisions change.
fn diff_template(mirror: &str, runtime: &str) -> String {
    format!(
        "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata:
  name: inplace
  namespace: team-a
spec:
  os: {{name: linux}}
  format: cloud-config
  variables:
    - {{name: mirror, default: \"{mirror}\"}}
  parts:
    - name: install
      commands: [\"echo install runtime {runtime}\"]
    - name: configure
      update: InPlace
      files:
        - path: /etc/containerd/certs.d/docker.io/hosts.toml
          content: |
            server = \"{{{{values.mirror}}}}\"
      units:
        - name: containerd.service
          dropIns: [{{name: 10-mirror.conf, content: \"[Service]\\nEnvironment=MIRROR={{{{values.mirror}}}}\\n\"}}]
      commands: [\"echo {{{{shell_quote values.mirror}}}}\"]
"
    )
}

/// Writes `files` (name, content) under `dir`.
fn write_all(dir: &Path, files: &[(&str, &str)]) {
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
}

fn diff_json(args: &[&str]) -> (Output, serde_json::Value) {
    let mut all = vec!["diff", "--format", "json"];
    all.extend_from_slice(args);
    let out = bootplate(&all);
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    (out, report)
}

/// `bootplate diff`: per role the verdict, what the agent does, the diff by part, and exit codes
/// a pipeline gates on (0 unchanged or in place, 3 replacement), in every format.
#[test]
fn diff_tells_unchanged_in_place_and_replacement_with_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let a = diff_template("https://mirror-a.example", "2.0");
    let b = diff_template("https://mirror-b.example", "2.0");
    let c = diff_template("https://mirror-b.example", "2.1");
    write_all(
        dir.path(),
        &[("a.yaml", &a), ("b.yaml", &b), ("c.yaml", &c)],
    );
    let at = |n: &str| dir.path().join(n).to_string_lossy().into_owned();

    let (out, report) = diff_json(&[&at("a.yaml"), &at("a.yaml")]);
    assert_exit(&out, 0);
    assert_eq!(report["verdict"], "unchanged");
    let roles = report["objects"][0]["roles"].as_array().unwrap();
    assert_eq!(roles.len(), 3, "every role of the sample machine");
    assert!(
        roles
            .iter()
            .all(|r| r["verdict"] == "unchanged" && r["parts"] == serde_json::json!([]))
    );

    let (out, report) = diff_json(&[&at("a.yaml"), &at("b.yaml")]);
    assert_exit(&out, 0);
    assert_eq!(report["verdict"], "in-place");
    assert_eq!(report["exitCode"], 0);
    for role in report["objects"][0]["roles"].as_array().unwrap() {
        assert_eq!(role["verdict"], "in-place", "{role}");
        assert_eq!(role["inPlaceParts"], serde_json::json!(["configure"]));
        let agent = &role["agent"];
        assert_eq!(
            agent["write"],
            serde_json::json!([
                "/etc/containerd/certs.d/docker.io/hosts.toml",
                "/etc/systemd/system/containerd.service.d/10-mirror.conf"
            ])
        );
        assert_eq!(agent["restart"], serde_json::json!(["containerd.service"]));
        assert_eq!(agent["runCommandsOf"], serde_json::json!(["configure"]));
        let part = &role["parts"][0];
        assert_eq!(
            (&part["part"], &part["update"]),
            (&"configure".into(), &"InPlace".into())
        );
        let diff = part["diff"].as_str().unwrap();
        assert!(
            diff.contains("-    server = \"https://mirror-a.example\"")
                && diff.contains("+    server = \"https://mirror-b.example\""),
            "{diff}"
        );
    }

    let out = bootplate(&["diff", &at("b.yaml"), &at("c.yaml")]);
    assert_exit(&out, 3);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("worker: replacement: part `install` changed and is not `update: InPlace`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("      +    echo install runtime 2.1"),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: replacement"), "{stdout}");

    let out = bootplate(&[
        "diff",
        "--format",
        "markdown",
        "--role",
        "worker",
        &at("a.yaml"),
        &at("c.yaml"),
    ]);
    assert_exit(&out, 3);
    let markdown = text(&out.stdout);
    assert!(
        markdown.starts_with("### bootplate diff: replacement\n"),
        "{markdown}"
    );
    assert!(markdown.contains("| BootstrapTemplate team-a/inplace | worker | **replacement** | replacement: part `install` changed"), "{markdown}");
    assert!(
        markdown.contains("<details><summary>") && markdown.contains("```diff\n"),
        "{markdown}"
    );
}

/// Directories are paired by kind, namespace and name: what one side lacks is added or removed;
/// a config is rendered with its own side's template; --machine picks the roles.
#[test]
fn diff_pairs_directories_and_renders_configs_with_their_sides_templates() {
    let dir = tempfile::tempdir().unwrap();
    let a = diff_template("https://mirror-a.example", "2.0");
    let b = diff_template("https://mirror-b.example", "2.0");
    let other = a.replace("name: inplace", "name: other");
    let gone = a.replace("name: inplace", "name: gone");
    let config = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfigTemplate
metadata: {name: workers, namespace: team-a}
spec:
  template:
    spec:
      templateRef: {kind: BootstrapTemplate, name: inplace}
      variables: {mirror: \"https://mirror-config.example\"}
";
    let in_place = config.replace("mirror-config", "mirror-config-2");
    write_all(
        dir.path(),
        &[
            ("old/t.yaml", &a),
            ("old/sub/gone.yaml", &gone),
            ("old/sub/config.yaml", config),
            ("new/t.yaml", &b),
            ("new/sub/other.yaml", &other),
            ("new/sub/config.yaml", &in_place),
        ],
    );
    let at = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let machine = [
        "--machine",
        "examples/machine-worker.yaml",
        "--cluster",
        "examples/cluster.yaml",
    ];
    let (old, new) = (at("old"), at("new"));
    let mut args = vec!["-R", old.as_str(), new.as_str()];
    args.extend(machine);
    let (out, report) = diff_json(&args);
    assert_exit(&out, 0);
    let objects: Vec<(String, String, Vec<String>)> =
        (report["objects"].as_array().unwrap().iter())
            .map(|o| {
                let roles = (o["roles"].as_array().unwrap().iter())
                    .map(|r| {
                        format!(
                            "{} {}",
                            r["role"].as_str().unwrap(),
                            r["verdict"].as_str().unwrap()
                        )
                    })
                    .collect();
                (
                    o["name"].as_str().unwrap().to_owned(),
                    o["presence"].as_str().unwrap().to_owned(),
                    roles,
                )
            })
            .collect();
    let row = |name: &str, presence: &str, roles: &[&str]| {
        (
            name.to_owned(),
            presence.to_owned(),
            roles.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        objects,
        [
            row("workers", "both", &["worker in-place"]),
            row("other", "added", &[]),
            row("inplace", "both", &["worker in-place"]),
            row("gone", "removed", &[]),
        ]
    );
    let config_diff = report["objects"][0]["roles"][0]["parts"][0]["diff"]
        .as_str()
        .unwrap();
    assert!(
        config_diff.contains("+    server = \"https://mirror-config-2.example\""),
        "{config_diff}"
    );
    // The config's template is looked up on its own side only.
    let lonely = dir.path().join("lonely.yaml");
    std::fs::write(&lonely, config).unwrap();
    let out = bootplate(&["diff", &lonely.to_string_lossy(), &lonely.to_string_lossy()]);
    assert_exit(&out, 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("lonely.yaml:7:")
            && stderr
                .contains("BootstrapTemplate `inplace` is not among the files of the old side"),
        "{stderr}"
    );
}

/// Input errors exit 2 naming the file, line and column; a new revision that no longer renders
/// exits 1; keys and tokens never reach the output.
#[test]
fn diff_input_errors_failures_and_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let a = diff_template("https://mirror-a.example", "2.0");
    let bad_yaml = a.replace("  format: cloud-config\n", "  format: [cloud-config\n");
    let unknown_field = a.replace("      update: InPlace\n", "      updates: InPlace\n");
    let failing = a.replace("echo install runtime 2.0", "echo {{values.typo}}");
    let keyed = |key: &str| {
        a.replace(
            "      commands: [\"echo install runtime 2.0\"]\n",
            &format!(
                "      commands: [\"echo install runtime 2.0\"]\n      files:\n        - path: /etc/key.pem\n          content: |\n            -----BEGIN PRIVATE KEY-----\n            {key}\n            -----END PRIVATE KEY-----\n        - path: /etc/join\n          content: \"kubeadm join --token {{{{join.token}}}}\"\n"
            ),
        )
    };
    let (key_a, key_b) = (keyed("MIIEsecretnumberone"), keyed("MIIEsecretnumbertwo"));
    write_all(
        dir.path(),
        &[
            ("a.yaml", &a),
            ("bad.yaml", &bad_yaml),
            ("unknown.yaml", &unknown_field),
            ("failing.yaml", &failing),
            ("key-a.yaml", &key_a),
            ("key-b.yaml", &key_b),
        ],
    );
    let at = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let out = bootplate(&["diff", &at("a.yaml"), &at("bad.yaml")]);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("bad.yaml:9:"),
        "{}",
        text(&out.stderr)
    );
    let out = bootplate(&["diff", &at("a.yaml"), &at("unknown.yaml")]);
    assert_exit(&out, 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("unknown.yaml:15:7") && stderr.contains("spec.parts[1].updates"),
        "{stderr}"
    );
    let out = bootplate(&["diff", &at("a.yaml"), &at("failing.yaml")]);
    assert_exit(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "failing.yaml:13:24: error: spec.parts[0].commands[0]: undefined variable `values.typo`"
        ),
        "{stderr}"
    );
    assert!(
        text(&out.stdout).contains("fails to render"),
        "{}",
        text(&out.stdout)
    );

    let out = bootplate(&[
        "diff",
        "--role",
        "worker",
        &at("key-a.yaml"),
        &at("key-b.yaml"),
    ]);
    assert_exit(&out, 3);
    let stdout = text(&out.stdout);
    assert!(
        !stdout.contains("MIIE") && !stdout.contains("BEGIN PRIVATE KEY"),
        "{stdout}"
    );
    assert!(!stdout.contains(render::SAMPLE_TOKEN), "{stdout}");
    assert!(stdout.contains("<bootstrap token>"), "{stdout}");
    let digests: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("<private key sha256:"))
        .collect();
    assert_eq!(
        digests.len(),
        2,
        "a changed key shows as a changed digest: {stdout}"
    );
    assert_ne!(digests[0][1..], digests[1][1..]);
}

/// The shipped templates: every `templates/*.yaml` holding a (Cluster)BootstrapTemplate, parsed;
/// not the Windows ones, which have no `InPlace` part (bootplate-agent runs on Linux only).
fn shipped_templates() -> Vec<(String, serde_yaml::Value)> {
    let mut found: Vec<(String, serde_yaml::Value)> = std::fs::read_dir(repo("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter_map(|p| {
            let object: serde_yaml::Value =
                serde_yaml::from_str(&std::fs::read_to_string(&p).unwrap()).ok()?;
            let kind = object["kind"].as_str().unwrap_or_default();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let format = object["spec"]["format"].clone();
            let windows = serde_yaml::from_value::<crd_types::OutputFormat>(format)
                .is_ok_and(crd_types::OutputFormat::is_windows);
            (kind.ends_with("BootstrapTemplate") && !windows).then_some((name, object))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The first part of `template` that a worker renders and whose update strategy is (`in_place`)
/// or is not `InPlace`: its index and name.
fn worker_part(template: &serde_yaml::Value, in_place: bool) -> Option<(usize, String)> {
    let parts = template["spec"]["parts"].as_sequence()?;
    parts.iter().enumerate().find_map(|(index, part)| {
        let roles = part["roles"].as_sequence();
        let for_worker = roles.is_none_or(|r| r.iter().any(|role| role == "worker"));
        let is_in_place = part["update"] == "InPlace";
        (for_worker && is_in_place == in_place)
            .then(|| (index, part["name"].as_str().unwrap().to_owned()))
    })
}

/// `template` with a comment line added to its raw `spec.template` (beside its parts): a change
/// outside the parts.
fn with_changed_body(template: &serde_yaml::Value) -> String {
    let mut changed = template.clone();
    let body = changed["spec"]["template"]
        .as_str()
        .expect("a raw template");
    changed["spec"]["template"] = format!("{body}\n# bootplate diff table test\n").into();
    serde_yaml::to_string(&changed).unwrap()
}

/// `template` with one more command in its part `index`: a change of that part alone.
fn with_changed_part(template: &serde_yaml::Value, index: usize) -> String {
    let mut changed = template.clone();
    let part = &mut changed["spec"]["parts"][index];
    if part["commands"].as_sequence().is_none() {
        part["commands"] = serde_yaml::Value::Sequence(Vec::new());
    }
    let command = serde_yaml::Value::from("echo bootplate-diff-table-test");
    part["commands"].as_sequence_mut().unwrap().push(command);
    serde_yaml::to_string(&changed).unwrap()
}

/// For every shipped template, pairs of revisions `bootplate diff` judges as the in-place hooks
/// will (both are `render::compare`): the same revision is unchanged; a change of the first
/// `InPlace` part a worker renders is in place, naming only that part; a change of the first
/// other part (or, for a template whose parts are all `InPlace` beside a raw `spec.template`,
/// of that body) is a replacement naming what changed, with exit code 3.
#[test]
fn every_shipped_templates_revision_pairs_get_the_verdict_of_the_part_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let templates = shipped_templates();
    assert!(
        templates.len() >= 9,
        "the shipped templates: {}",
        templates.len()
    );
    for (name, template) in &templates {
        let (in_place, in_place_name) =
            worker_part(template, true).unwrap_or_else(|| panic!("{name}: no InPlace part"));
        let (rollout, named) = match worker_part(template, false) {
            Some((index, part)) => (
                with_changed_part(template, index),
                format!("part `{part}` changed and is not `update: InPlace`"),
            ),
            None => (
                with_changed_body(template),
                "the output of the raw spec.template changed".to_owned(),
            ),
        };
        let files = [
            ("old", serde_yaml::to_string(template).unwrap()),
            ("in-place", with_changed_part(template, in_place)),
            ("rollout", rollout),
        ];
        for (revision, text) in &files {
            std::fs::write(dir.path().join(format!("{name}-{revision}.yaml")), text).unwrap();
        }
        let at = |revision: &str| {
            let path = dir.path().join(format!("{name}-{revision}.yaml"));
            path.to_string_lossy().into_owned()
        };
        let judged = |revision: &str| diff_json(&["--role", "worker", &at("old"), &at(revision)]);

        let (out, report) = judged("old");
        assert_exit(&out, 0);
        assert_eq!(report["verdict"], "unchanged", "{name}: {report}");
        let (out, report) = judged("in-place");
        assert_exit(&out, 0);
        assert_eq!(report["verdict"], "in-place", "{name}: {report}");
        let role = &report["objects"][0]["roles"][0];
        assert_eq!(
            role["inPlaceParts"],
            serde_json::json!([in_place_name]),
            "{name}: {report}"
        );
        let (out, report) = judged("rollout");
        assert_exit(&out, 3);
        assert_eq!(report["verdict"], "replacement", "{name}: {report}");
        let reason = report["objects"][0]["roles"][0]["reason"].to_string();
        assert!(reason.contains(&named), "{name}: {report}");
    }
}
