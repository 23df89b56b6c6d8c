//! Pairs of revisions of every shipped template (`templates/*.yaml`), judged for every role with
//! the sample machine: no edit is unchanged, an edit of an `update: InPlace` part is in place
//! (naming the part and what bootplate-agent writes), an edit of a `Rollout` part or of a raw
//! `spec.template` is a replacement naming what forces it.

use std::path::{Path, PathBuf};

use crd_types::Role;
use serde_yaml::Value;

use super::judge::{self, Inputs, Shape, Verdict};
use super::tree::{self, Side};
use crate::cli::input::{TEMPLATE_KINDS, YamlFile, kind};

/// The file an edit of an `InPlace` part adds.
const ADDED_FILE: &str = "/etc/bootplate-diff-test.conf";

fn shipped_templates() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    found.sort();
    assert!(found.len() >= 8, "the shipped templates: {found:?}");
    found
}

/// The template document of `text`.
fn template_document(text: &str) -> Value {
    let file = YamlFile::parse("t".into(), text.to_owned()).unwrap();
    let index = file.find(&TEMPLATE_KINDS).unwrap();
    file.documents[index].clone()
}

fn side(name: &str, document: &Value) -> Side {
    let text = serde_yaml::to_string(document).unwrap();
    Side {
        files: vec![YamlFile::parse(name.into(), text).unwrap()],
        single_file: true,
    }
}

/// Each role's verdict and reason, and the in-place parts and written files.
fn judged(old: &Value, new: &Value) -> Vec<(Role, judge::RoleDiff)> {
    judged_for(old, new, &Role::ALL)
}

/// [`judged`] for `roles` only.
fn judged_for(old: &Value, new: &Value, roles: &[Role]) -> Vec<(Role, judge::RoleDiff)> {
    let (old, new) = (side("old.yaml", old), side("new.yaml", new));
    let pairs = tree::pair(&old, &new);
    assert_eq!(pairs.len(), 1);
    let inputs = Inputs {
        old: &old,
        new: &new,
        shape: &Shape::Sample,
        roles,
        config: None,
        with: &[],
    };
    let judged = judge::judge(&pairs[0], &inputs);
    assert!(judged.input.is_empty() && judged.failed.is_empty());
    roles.iter().copied().zip(judged.object.roles).collect()
}

/// A Windows format renders workers only.
fn is_windows(document: &Value) -> bool {
    let format = document["spec"]["format"].clone();
    serde_yaml::from_value::<crd_types::OutputFormat>(format)
        .is_ok_and(crd_types::OutputFormat::is_windows)
}

/// A Windows template serves no control-plane role in diff, as in the controller (before, diff
/// compared its parts as if Windows could run a control plane).
#[test]
fn a_windows_templates_control_plane_roles_fail_to_render() {
    let path = shipped_templates()
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with("windows-2022-kubeadm.yaml"))
        .expect("the Windows template ships");
    let document = template_document(&std::fs::read_to_string(&path).unwrap());
    let (old, new) = (side("old.yaml", &document), side("new.yaml", &document));
    let pairs = tree::pair(&old, &new);
    let inputs = Inputs {
        old: &old,
        new: &new,
        shape: &Shape::Sample,
        roles: &[Role::Init, Role::Worker],
        config: None,
        with: &[],
    };
    let judged = judge::judge(&pairs[0], &inputs);
    let (init, worker) = (&judged.object.roles[0], &judged.object.roles[1]);
    assert_eq!(init.verdict, Verdict::NotServed, "{:?}", init.reason);
    let reason = init.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("renders workers only"), "{reason}");
    assert_eq!(worker.verdict, Verdict::Unchanged, "{:?}", worker.reason);
}

/// The first part whose `update` is (`in_place`) or is not `InPlace`: its index, name, roles.
fn part(document: &Value, in_place: bool) -> Option<(usize, String, Vec<String>)> {
    let parts = document["spec"]["parts"].as_sequence()?;
    parts.iter().enumerate().find_map(|(i, p)| {
        let is_in_place = p["update"].as_str() == Some("InPlace");
        let roles = (p["roles"].as_sequence().into_iter().flatten())
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect();
        (is_in_place == in_place).then(|| (i, p["name"].as_str().unwrap().to_owned(), roles))
    })
}

fn applies(roles: &[String], role: Role) -> bool {
    roles.is_empty() || roles.iter().any(|r| r == role.as_str())
}

/// The edits of a template and the verdict each must get for a role.
enum Edit {
    InPlacePart(String, Vec<String>),
    RolloutPart(String, Vec<String>),
    RawTemplate,
}

fn edits(document: &Value) -> Vec<(Edit, Value)> {
    let mut out = Vec::new();
    if let Some((i, name, roles)) = part(document, true) {
        let mut edited = document.clone();
        let file = serde_yaml::to_value(serde_json::json!(
            {"path": ADDED_FILE, "permissions": "0644", "content": "edited\n"}
        ))
        .unwrap();
        let files = &mut edited["spec"]["parts"][i]["files"];
        match files.as_sequence_mut() {
            Some(list) => list.push(file),
            None => *files = Value::Sequence(vec![file]),
        }
        out.push((Edit::InPlacePart(name, roles), edited));
    }
    if let Some((i, name, roles)) = part(document, false) {
        let mut edited = document.clone();
        let commands = &mut edited["spec"]["parts"][i]["commands"];
        let command = Value::String("true # edited".into());
        match commands.as_sequence_mut() {
            Some(list) => list.push(command),
            None => *commands = Value::Sequence(vec![command]),
        }
        out.push((Edit::RolloutPart(name, roles), edited));
    }
    if let Some(raw) = document["spec"]["template"].as_str() {
        let mut edited = document.clone();
        edited["spec"]["template"] = Value::String(format!("{raw}\n"));
        out.push((Edit::RawTemplate, edited));
    }
    out
}

fn check(template: &str, edit: &Edit, role: Role, r: &judge::RoleDiff) {
    let at = format!("{template}, role {role}: {:?} {:?}", r.verdict, r.reason);
    match edit {
        Edit::InPlacePart(name, roles) if applies(roles, role) => {
            assert_eq!(r.verdict, Verdict::InPlace, "{at}");
            assert_eq!(r.in_place_parts, std::slice::from_ref(name), "{at}");
            let agent = r.agent.as_ref().expect("what the agent does");
            assert_eq!(agent.write, [ADDED_FILE], "{at}");
            assert!(
                r.parts
                    .iter()
                    .any(|p| p.part == *name && p.diff.contains("+    edited")),
                "{at}"
            );
        }
        Edit::RolloutPart(name, roles) if applies(roles, role) => {
            assert_eq!(r.verdict, Verdict::Replacement, "{at}");
            let reason = r.reason.as_deref().unwrap_or_default();
            // A part that rendered nothing for the sample machine (no network input, say) is
            // added by the edit.
            let named = |how: &str| reason.contains(&format!("part `{name}` {how}"));
            assert!(named("changed") || named("was added"), "{at}");
            assert!(
                r.parts
                    .iter()
                    .any(|p| p.part == *name && p.diff.contains("+    true # edited")),
                "{at}"
            );
        }
        Edit::RawTemplate => {
            assert_eq!(r.verdict, Verdict::Replacement, "{at}");
            assert!(
                r.reason
                    .as_deref()
                    .unwrap_or_default()
                    .contains("raw spec.template"),
                "{at}"
            );
        }
        // An edit of a part that does not apply to the role changes nothing for it.
        _ => assert_eq!(r.verdict, Verdict::Unchanged, "{at}"),
    }
}

#[test]
fn every_shipped_template_unchanged_in_place_and_replaced() {
    for path in shipped_templates() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let document = template_document(&std::fs::read_to_string(&path).unwrap());
        assert!(TEMPLATE_KINDS.contains(&kind(&document)));
        let windows = is_windows(&document);
        let roles: &[Role] = if windows { &[Role::Worker] } else { &Role::ALL };
        for (role, r) in judged_for(&document, &document, roles) {
            assert_eq!(
                r.verdict,
                Verdict::Unchanged,
                "{name}, role {role}: {:?}",
                r.reason
            );
            assert!(r.parts.is_empty(), "{name}");
        }
        let edits = edits(&document);
        let in_place = edits
            .iter()
            .any(|(e, _)| matches!(e, Edit::InPlacePart(..)));
        // The Windows formats carry no `InPlace` part (bootplate-agent runs on Linux only):
        // their edits can only replace.
        assert!(
            in_place != windows && edits.len() >= if windows { 1 } else { 2 },
            "{name}: an InPlace part (none for a Windows format) and a part or raw template to replace"
        );
        for (edit, edited) in &edits {
            for (role, r) in judged_for(&document, edited, roles) {
                check(&name, edit, role, &r);
            }
        }
    }
}

/// A raw `spec.template` without parts has nothing to apply in place: the same output is
/// unchanged, any other output a replacement.
#[test]
fn a_raw_template_without_parts_is_unchanged_or_replaced() {
    let raw = |command: &str| {
        let text = format!(
            "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: BootstrapTemplate\nmetadata: {{name: raw, namespace: a}}\nspec:\n  os: {{name: linux}}\n  format: cloud-config\n  template: |\n    #cloud-config\n    runcmd: [{command}]\n"
        );
        template_document(&text)
    };
    for (_, r) in judged(&raw("a"), &raw("a")) {
        assert_eq!(r.verdict, Verdict::Unchanged, "{:?}", r.reason);
    }
    for (role, r) in judged(&raw("a"), &raw("b")) {
        assert_eq!(r.verdict, Verdict::Replacement, "role {role}");
        let reason = r.reason.unwrap_or_default();
        assert!(
            reason.contains("a raw spec.template has no parts"),
            "{reason}"
        );
        assert_eq!(r.parts[0].part, "(output)");
        assert!(
            r.parts[0].diff.contains("+runcmd: [b]"),
            "{}",
            r.parts[0].diff
        );
    }
}

/// Two revisions of a config template whose template is on neither side: refused naming the
/// field and `--with`, then judged with the template `--with` gives (and that template itself is
/// not compared).
#[test]
fn a_config_templates_revisions_render_with_the_template_given_with() {
    let path = shipped_templates()
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with("kubeadm-ubuntu-2404.yaml"))
        .unwrap();
    let template = YamlFile::parse("t.yaml".into(), std::fs::read_to_string(path).unwrap());
    let revision = |proxy: &str| {
        let text = format!(
            "apiVersion: bootstrap.bootplate.dev/v1alpha1\nkind: BootplateConfigTemplate\nmetadata: {{name: workers, namespace: a}}\nspec:\n  template:\n    spec:\n      templateRef: {{kind: ClusterBootstrapTemplate, name: kubeadm-ubuntu-2404}}\n      network: {{proxy: {{http: '{proxy}'}}}}\n"
        );
        serde_yaml::from_str::<Value>(&text).unwrap()
    };
    let (old, new) = (
        side("old.yaml", &revision("http://a.example:3128")),
        side("new.yaml", &revision("http://b.example:3128")),
    );
    let pairs = tree::pair(&old, &new);
    assert_eq!(pairs.len(), 1, "only the config template is compared");
    let with = vec![template.unwrap()];
    let judge_with = |with: &[YamlFile]| {
        let inputs = Inputs {
            old: &old,
            new: &new,
            shape: &Shape::Sample,
            roles: &[Role::Worker],
            config: None,
            with,
        };
        judge::judge(&pairs[0], &inputs)
    };
    let alone = judge_with(&[]);
    assert!(alone.object.roles.is_empty());
    let problem = alone.input.first().map(ToString::to_string);
    let problem = problem.unwrap_or_default();
    assert!(
        problem.contains("spec.template.spec.templateRef.name")
            && problem.contains("kubeadm-ubuntu-2404")
            && problem.contains("--with"),
        "{problem}"
    );
    let judged = judge_with(&with);
    assert!(judged.input.is_empty(), "{:?}", judged.input);
    let worker = &judged.object.roles[0];
    assert_eq!(worker.verdict, Verdict::InPlace, "{:?}", worker.reason);
    assert_eq!(worker.in_place_parts, ["network"]);
}
