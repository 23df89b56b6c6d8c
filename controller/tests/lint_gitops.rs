//! `bootplate lint -R` over a GitOps repository as platform teams lay one out: templates,
//! configs in other directories than their templates, Clusters, MachineDeployments and a
//! ClusterClass beside unrelated manifests, several objects per file, and mistakes seeded in
//! it. Every mistake must be reported exactly once, at its line and column, in every format;
//! the JUnit output must validate against the JUnit XSD (with xmllint, a real XML schema
//! validator) and the SARIF output against the SARIF 2.1.0 JSON schema (both vendored in
//! tests/schemas/).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bootplate(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("bootplate runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn schemas() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemas")
}

const TEMPLATES: &str = "\
# The platform team's templates, and something else in the same file.
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata:
  name: workers
  namespace: team-a
spec:
  os: {name: ubuntu}
  format: cloud-config
  variables:
    - name: proxy
      required: true
      schema: {type: string, pattern: \"^https?://[a-z0-9.:-]+$\"}
  parts:
    - name: configure
      files:
        - path: /etc/environment.d/proxy.conf
          permissions: \"0600\"
          content: \"HTTPS_PROXY={{values.proxy}}\\n\"
---
apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated, namespace: team-a}
data: {a: b}
---
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: plain
spec:
  os: {name: linux}
  format: script
  parts:
    - name: hello
      commands:
        - echo {{shell_quote machine.nmae}}
";

const OCTAL: &str = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: ClusterBootstrapTemplate
metadata:
  name: octal
spec:
  os: {name: linux}
  format: script
  parts:
    - name: keys
      files:
        - path: /etc/example.key
          permissions: 0600
          content: \"example\\n\"
---
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplat
metadata: {name: typo}
spec: {}
";

const CLUSTER: &str = "\
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: demo, namespace: team-a}
spec:
  controlPlaneEndpoint: {host: demo.example.com, port: 6443}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: demo-md-0, namespace: team-a}
spec:
  clusterName: demo
  template:
    spec:
      clusterName: demo
      bootstrap:
        configRef: {apiGroup: bootstrap.bootplate.dev, kind: BootplateConfigTemplate, name: workers-md}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: demo-md-1, namespace: team-a}
spec:
  clusterName: demo
  template:
    spec:
      clusterName: demo
      bootstrap:
        configRef: {apiGroup: bootstrap.bootplate.dev, kind: BootplateConfigTemplate, name: wrokers-md}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: team-a}
spec: {replicas: 1}
";

const CLASS: &str = "\
apiVersion: cluster.x-k8s.io/v1beta2
kind: ClusterClass
metadata: {name: standard, namespace: team-a}
spec:
  workers:
    machineDeployments:
      - class: default
        bootstrap:
          templateRef:
            apiVersion: bootstrap.bootplate.dev/v1alpha1
            kind: BootplateConfigTemplate
            name: class-workers
";

const CONFIGS: &str = "\
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfigTemplate
metadata: {name: workers-md, namespace: team-a}
spec:
  template:
    spec:
      templateRef: {kind: BootstrapTemplate, name: workers}
      variables:
        proxy: ftp://proxy.example.com
---
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: one-machine, namespace: team-a}
spec:
  templateRef: {kind: BootstrapTemplate, name: workers}
  variables:
    proxy: http://proxy.example.com:3128
";

/// Not Kubernetes objects at all: skipped.
const VALUES: &str = "replicas: 3\nimage: {tag: v1}\n";

/// Writes the tree under `root`; the files as lint shows them (relative to `root`).
fn write_tree(root: &Path) {
    for (path, body) in [
        ("platform/templates.yaml", TEMPLATES),
        ("platform/broken/octal.yaml", OCTAL),
        ("clusters/team-a/cluster.yaml", CLUSTER),
        ("clusters/team-a/class.yaml", CLASS),
        ("clusters/team-a/bootstrap/configs.yaml", CONFIGS),
        ("apps/values.yaml", VALUES),
        ("README.md", "# not read\n"),
    ] {
        let path = root.join("gitops").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }
}

/// A seeded mistake: the file, where (the line of `line_has`, the column of `at` in it) and
/// the code lint reports it with.
struct Mistake {
    file: &'static str,
    body: &'static str,
    line_has: &'static str,
    at: &'static str,
    code: &'static str,
}

impl Mistake {
    fn position(&self) -> (usize, usize) {
        let (i, line) = self
            .body
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(self.line_has))
            .unwrap_or_else(|| panic!("{:?} not in {}", self.line_has, self.file));
        (
            i + 1,
            line.find(self.at).expect("the culprit is on its line") + 1,
        )
    }

    fn file(&self) -> String {
        format!("gitops/{}", self.file)
    }
}

fn mistakes() -> Vec<Mistake> {
    vec![
        Mistake {
            file: "platform/templates.yaml",
            body: TEMPLATES,
            line_has: "machine.nmae",
            // The mustache at fault.
            at: "{{shell_quote machine.nmae",
            code: "unknown-name",
        },
        Mistake {
            file: "platform/broken/octal.yaml",
            body: OCTAL,
            line_has: "permissions: 0600",
            at: "0600",
            code: "schema",
        },
        Mistake {
            file: "platform/broken/octal.yaml",
            body: OCTAL,
            line_has: "kind: BootstrapTemplat",
            at: "BootstrapTemplat",
            code: "unknown-kind",
        },
        Mistake {
            file: "clusters/team-a/cluster.yaml",
            body: CLUSTER,
            line_has: "wrokers-md",
            at: "wrokers-md",
            code: "missing-reference",
        },
        Mistake {
            file: "clusters/team-a/class.yaml",
            body: CLASS,
            line_has: "class-workers",
            at: "class-workers",
            code: "missing-reference",
        },
        Mistake {
            file: "clusters/team-a/bootstrap/configs.yaml",
            body: CONFIGS,
            line_has: "ftp://",
            at: "ftp://",
            code: "config-invalid",
        },
    ]
}

/// Lints the tree in `format`; the run.
fn lint(root: &Path, format: &str) -> Output {
    bootplate(root, &["lint", "-R", "--format", format, "gitops"])
}

/// What XPath `expression` gives on the XML file `file`, by xmllint (a real XPath engine).
fn xpath(file: &Path, expression: &str) -> String {
    let out = Command::new("xmllint")
        .arg("--xpath")
        .arg(expression)
        .arg(file)
        .output()
        .expect("xmllint is required (tests/scripts/install-tools.sh installs libxml2-utils)");
    assert!(out.status.success(), "{expression}: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// The counts a JUnit report states are those of its elements, in every testsuite and in the
/// whole: tests are testcases, failures testcases with a failure, errors testcases with an error
/// (a CI server shows the counts, not the elements).
fn assert_junit_counts_match_its_elements(report: &Path) {
    let suites: usize = xpath(report, "count(/testsuites/testsuite)")
        .parse()
        .unwrap();
    assert!(suites > 0, "no testsuite in {}", report.display());
    let scopes = (1..=suites)
        .map(|i| format!("/testsuites/testsuite[{i}]"))
        .chain(["/testsuites".to_owned()]);
    for scope in scopes {
        for (attribute, elements) in [
            ("tests", "testcase"),
            ("failures", "testcase[failure]"),
            ("errors", "testcase[error]"),
        ] {
            let stated = xpath(report, &format!("string({scope}/@{attribute})"));
            let counted = xpath(report, &format!("count({scope}//{elements})"));
            assert_eq!(
                stated,
                counted,
                "{scope}/@{attribute} in {}",
                report.display()
            );
        }
    }
}

#[test]
fn a_gitops_tree_reports_every_mistake_once_at_its_place_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path());
    let mistakes = mistakes();

    // JSON: exactly the seeded mistakes, each once, with its code; nothing else.
    let out = lint(dir.path(), "json");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let mut found: Vec<(String, usize, usize, String)> = text(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["severity"], "error", "{l}");
            (
                v["file"].as_str().unwrap().to_owned(),
                v["line"].as_u64().unwrap() as usize,
                v["column"].as_u64().unwrap() as usize,
                v["code"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut expected: Vec<(String, usize, usize, String)> = mistakes
        .iter()
        .map(|m| {
            let (line, column) = m.position();
            (m.file(), line, column, m.code.to_owned())
        })
        .collect();
    found.sort();
    expected.sort();
    assert_eq!(found, expected, "{}", text(&out.stdout));
    // 3 templates, 2 configs, the misspelled kind, a Cluster, 2 MachineDeployments and a
    // ClusterClass; skipped: the ConfigMap, the Deployment, the values file.
    assert!(
        text(&out.stderr).contains("10 objects, 6 errors, 0 warnings, 3 skipped"),
        "{}",
        text(&out.stderr)
    );

    let short = text(&lint(dir.path(), "short").stdout);
    let plain = text(&lint(dir.path(), "text").stdout);
    let junit = text(&lint(dir.path(), "junit").stdout);
    let report = dir.path().join("report.xml");
    std::fs::write(&report, &junit).unwrap();
    assert_junit_counts_match_its_elements(&report);
    // A failure per error, a testcase per object (no problem lies outside an object here).
    assert_eq!(
        xpath(&report, "count(//failure)"),
        mistakes.len().to_string()
    );
    assert_eq!(xpath(&report, "string(/testsuites/@tests)"), "10");
    let sarif: serde_json::Value =
        serde_json::from_slice(&lint(dir.path(), "sarif").stdout).unwrap();
    let results = sarif["runs"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), mistakes.len());
    assert_eq!(short.lines().count(), mistakes.len(), "{short}");
    for m in &mistakes {
        let (line, column) = m.position();
        let at = format!("{}:{line}:{column}: error: ", m.file());
        let once = |haystack: &str, needle: &str| haystack.matches(needle).count() == 1;
        assert!(once(&short, &at), "{at} once in:\n{short}");
        assert!(
            once(&plain, &format!("--> {}:{line}:{column}\n", m.file())),
            "{at} once in:\n{plain}"
        );
        assert!(
            once(&junit, &format!("message=\"{at}")),
            "{at} once in:\n{junit}"
        );
        let in_sarif = results
            .iter()
            .filter(|r| {
                let location = &r["locations"][0]["physicalLocation"];
                location["artifactLocation"]["uri"] == m.file().as_str()
                    && location["region"]["startLine"] == line
                    && location["region"]["startColumn"] == column
                    && r["ruleId"] == m.code
            })
            .count();
        assert_eq!(in_sarif, 1, "{at} in {sarif:#}");
    }
}

#[test]
fn junit_and_sarif_validate_against_their_schemas() {
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path());
    // Seeded mistakes, a warning (--strict off) and an unreadable path: every element shows.
    std::fs::write(
        dir.path().join("gitops/platform/unused.yaml"),
        TEMPLATES.replace(
            "- name: proxy",
            "- name: unused\n      default: x\n    - name: proxy",
        ),
    )
    .unwrap();
    let junit = bootplate(
        dir.path(),
        &["lint", "-R", "--format", "junit", "gitops", "missing.yaml"],
    );
    assert_eq!(junit.status.code(), Some(2));
    let report = dir.path().join("report.xml");
    std::fs::write(&report, &junit.stdout).unwrap();
    let xmllint = Command::new("xmllint")
        .arg("--noout")
        .arg("--schema")
        .arg(schemas().join("junit-10.xsd"))
        .arg(&report)
        .output()
        .expect("xmllint is required (tests/scripts/install-tools.sh installs libxml2-utils)");
    assert!(
        xmllint.status.success(),
        "{}\n{}",
        text(&xmllint.stderr),
        text(&junit.stdout)
    );
    assert!(text(&junit.stdout).contains("<system-out>"));
    assert!(text(&junit.stdout).contains("<error type=\"input\""));
    assert_junit_counts_match_its_elements(&report);
    assert_eq!(xpath(&report, "string(/testsuites/@errors)"), "1");

    let sarif = bootplate(
        dir.path(),
        &["lint", "-R", "--format", "sarif", "gitops", "missing.yaml"],
    );
    assert_eq!(sarif.status.code(), Some(2));
    let log: serde_json::Value = serde_json::from_slice(&sarif.stdout).unwrap();
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(schemas().join("sarif-schema-2.1.0.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the SARIF schema compiles");
    let errors: Vec<String> = validator.iter_errors(&log).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    // The validator does refuse a log that breaks the schema.
    let mut broken = log.clone();
    broken["runs"][0]["results"][0]["level"] = "fatal".into();
    assert!(!validator.is_valid(&broken));
    let levels: Vec<&str> = log["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["level"].as_str())
        .collect();
    assert!(levels.contains(&"warning") && levels.contains(&"error"));
}

#[test]
fn a_yaml_syntax_error_shows_its_line_and_a_caret() {
    // Before, a file that did not parse printed only FILE:LINE:COL, without its source.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("broken.yaml"),
        "kind: [unclosed\nspec: {}\n",
    )
    .unwrap();
    let out = bootplate(dir.path(), &["lint", "broken.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    assert!(shown.contains("--> broken.yaml:2:5"), "{shown}");
    assert!(shown.contains("2 | spec: {}"), "{shown}");
    assert!(shown.contains('^'), "{shown}");
}

/// A repository's links lead nowhere outside it: `lint -R` reads the regular files under the
/// directory given and no symbolic link. A link out of the tree (here to a file of secrets, and
/// to the process's environment) is an error that quotes nothing of its target; a link inside
/// the tree is not followed (its target is read where it is).
#[test]
fn a_tree_walk_reads_no_link_and_nothing_outside_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("gitops/sub")).unwrap();
    std::fs::write(root.join("secrets.yaml"), "password: [SECRET-OUTSIDE\n").unwrap();
    std::fs::write(
        root.join("gitops/plain.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let link = |target: &Path, name: &str| {
        std::os::unix::fs::symlink(target, root.join("gitops").join(name)).unwrap();
    };
    link(&root.join("secrets.yaml"), "sub/leak.yaml");
    link(Path::new("/proc/self/environ"), "env.yaml");
    link(&root.join("gitops/plain.yaml"), "again.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .args(["lint", "-R", "gitops"])
        .current_dir(root)
        .env("BOOTPLATE_TEST_SECRET", "SECRET-FROM-ENV")
        .output()
        .expect("bootplate runs");
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{all}");
    for secret in ["SECRET-OUTSIDE", "SECRET-FROM-ENV"] {
        assert!(!all.contains(secret), "{secret} printed:\n{all}");
    }
    for link in ["gitops/sub/leak.yaml", "gitops/env.yaml"] {
        assert!(
            all.lines()
                .any(|l| l.contains(link) && l.contains("outside")),
            "{link}:\n{all}"
        );
    }
    assert!(!all.contains("again.yaml"), "{all}");
}
