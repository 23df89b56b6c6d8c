//! `bootplate import` proven against the kubeadm bootstrap provider itself: for every
//! KubeadmConfigSpec of `tests/corpus/kubeadm-specs.yaml`, the real provider (CABPK, its
//! manager built from Cluster API's module) renders the data Secret of one worker Machine under
//! the real Cluster API manager, bootplate renders the imported BootplateConfig (template
//! `kubeadm-compat`, or `kubeadm-compat-ignition` for the `format: ignition` specs) for another
//! Machine of the same Cluster, and the two cloud-configs (or Ignition configs) are
//! compared as cloud-init and kubeadm read them: the files (path, content after decoding,
//! permissions, owner), the commands in order, bootcmd, users, NTP, mounts, disk setup, and the
//! JoinConfiguration after parsing. The differences allowed are the ones docs/migrating.md
//! lists: the token's value, the kubeadm file's mode (0600, not 0640), the placeholder file's
//! text, the quoting of mount fields and partition numbers, and the user-data's first line.
//! An Ignition config is compared as Ignition reads it, whatever its spec version (the
//! provider writes 2.3, bootplate 3.3): files (data URL decoded, mode, user:group), units
//! (enabled, contents), passwd.users, disks; /etc/kubeadm.yml parsed without the token,
//! /etc/kubeadm.sh as its non-empty lines in order.
//! One environment, every Machine at once.
//!
//! Then both renders of every spec are booted by the boot proof (real cloud-init, or real
//! Ignition: v0.35.0 for the provider's spec 2.3, 2.14 for bootplate's 3.3; stubs for kubeadm
//! and the programs that would act on a machine): both pass it, and leave the same files (mode,
//! owner, content) and users, and ran the same commands in order, differences only where
//! docs/migrating.md says ([`boot_both`]); beside them, a drill shows that comparison failing
//! ([`the_boot_comparison_sees_a_dropped_file_and_a_reordered_command`]).
//!
//! In the same environment, the migration docs/migrating.md describes: a MachineDeployment of
//! three workers bootstrapped by CABPK is switched to bootplate with `bootplate import
//! --machine-deployment`'s patch; Cluster API rolls every worker out, the new ones boot (the
//! test cloud boots a machine only when its token is one the workload cluster takes) and get a
//! nodeRef, and no KubeadmConfig of the MachineDeployment remains.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use testenv::capi::kubeadm_bootstrap::KubeadmBootstrap;
use testenv::capi::objects::{self, KUBERNETES_VERSION};
use testenv::capi::{CapiEnv, NS, Options, WAIT};

const CLUSTER: &str = "compat";
const JOIN_FILE: &str = "/run/kubeadm/kubeadm-join-config.yaml";
const PLACEHOLDER: &str = "/run/cluster-api/placeholder";

fn repo_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fields corpus entry `name` lists under `lost`.
fn lost_fields(name: &str) -> Vec<String> {
    serde_yaml::Deserializer::from_str(&repo_file("tests/corpus/kubeadm-specs.yaml"))
        .map(|d| -> Value { serde::Deserialize::deserialize(d).expect("a corpus document") })
        .find(|doc| doc["name"] == name)
        .and_then(|doc| serde_json::from_value(doc["lost"].clone()).ok())
        .unwrap_or_default()
}

/// The corpus: (name, KubeadmConfigSpec).
fn corpus() -> Vec<(String, Value)> {
    serde_yaml::Deserializer::from_str(&repo_file("tests/corpus/kubeadm-specs.yaml"))
        .map(|d| {
            let doc: Value = serde::Deserialize::deserialize(d).expect("a corpus document");
            (
                doc["name"].as_str().expect("a name").to_owned(),
                doc["spec"].clone(),
            )
        })
        .collect()
}

fn kubeadm_config_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfig"),
        "kubeadmconfigs",
    )
}

/// A worker Machine `name` on a DevMachine of that name, bootstrapped by `kind` `name`.
async fn machine(env: &CapiEnv, name: &str, group: &str, kind: &str) {
    env.apply(&objects::dev_machine_resource(), objects::dev_machine(name))
        .await
        .unwrap();
    let mut machine = objects::worker_machine(name, CLUSTER, KUBERNETES_VERSION);
    machine["spec"]["bootstrap"]["configRef"] =
        json!({"apiGroup": group, "kind": kind, "name": name});
    env.apply(&objects::machine_resource(), machine)
        .await
        .unwrap();
}

/// Creates both configs and Machines of one corpus entry.
async fn create(env: &CapiEnv, name: &str, spec: &Value) {
    let kubeadm = json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfig",
        "metadata": {"name": format!("k-{name}"), "namespace": NS},
        "spec": spec,
    });
    let mut imported = bootplate::core::import::import(&kubeadm).expect("imports");
    // The fields the entry says import does not carry (a control plane's init and cluster
    // configurations), each with its reason; nothing else.
    let lost: Vec<&str> = imported.lost.iter().map(|l| l.field.as_str()).collect();
    let expected: Vec<String> = lost_fields(name)
        .iter()
        .map(|f| format!("spec.{f}"))
        .collect();
    assert_eq!(lost, expected, "{name}: the fields import does not carry");
    assert!(imported.lost.iter().all(|l| !l.why.is_empty()), "{name}");
    imported.name = format!("b-{name}");
    env.apply(&kubeadm_config_resource(), kubeadm)
        .await
        .unwrap();
    env.apply(
        &objects::bootplate_resource("BootplateConfig", "bootplateconfigs"),
        imported.object(),
    )
    .await
    .unwrap();
    machine(
        env,
        &format!("k-{name}"),
        "bootstrap.cluster.x-k8s.io",
        "KubeadmConfig",
    )
    .await;
    machine(
        env,
        &format!("b-{name}"),
        objects::BOOTPLATE_GROUP,
        "BootplateConfig",
    )
    .await;
}

/// The user-data of Machine `name`, once Cluster API has its data Secret.
async fn user_data(env: &CapiEnv, name: &str) -> String {
    let machines = env.capi("Machine", "machines");
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
    let what = format!("Machine {name}'s data Secret");
    testenv::eventually(&what, WAIT, || async {
        let machine = machines.get(name).await.ok()?;
        let secret_name = machine.data["spec"]["bootstrap"]["dataSecretName"].as_str()?;
        let secret = secrets.get(secret_name).await.ok()?;
        let value = secret.data?.remove("value")?;
        String::from_utf8(value.0).ok()
    })
    .await
}

/// A file's content as cloud-init writes it (`b64`/`base64`, `gz+b64`/`gzip+base64` decoded).
fn decoded(file: &Value) -> Vec<u8> {
    let content = file["content"].as_str().unwrap_or_default().as_bytes();
    // A block scalar ends with a line break; base64 has none.
    let b64 = |c: &[u8]| {
        let c: Vec<u8> = c
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        base64::engine::general_purpose::STANDARD
            .decode(c)
            .expect("base64")
    };
    match file["encoding"].as_str().unwrap_or("") {
        "" | "text/plain" => content.to_vec(),
        "b64" | "base64" => b64(content),
        "gz+b64" | "gzip+base64" | "gz+base64" | "gzip+b64" => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&b64(content)[..])
                .read_to_end(&mut out)
                .expect("gzip");
            out
        }
        other => panic!("encoding {other}"),
    }
}

/// The kubeadm documents of the join file, without the token's value.
fn join_configuration(content: &[u8]) -> Vec<Value> {
    serde_yaml::Deserializer::from_slice(content)
        .filter_map(|d| {
            let mut doc: Value = serde::Deserialize::deserialize(d).ok()?;
            doc.is_object().then(|| {
                doc["discovery"]["bootstrapToken"]["token"] = json!("<token>");
                doc
            })
        })
        .collect()
}

/// What cloud-init (or Ignition) does with `user_data`, in comparable form.
fn semantic(user_data: &str) -> BTreeMap<String, Value> {
    if user_data.trim_start().starts_with('{') {
        return semantic_ignition(user_data);
    }
    let doc: Value = serde_yaml::from_str(user_data).expect("YAML user-data");
    let mut out = BTreeMap::new();
    for file in doc["write_files"].as_array().into_iter().flatten() {
        let path = file["path"].as_str().expect("a path").to_owned();
        let content = decoded(file);
        let content = match path.as_str() {
            JOIN_FILE => json!(join_configuration(&content)),
            PLACEHOLDER => json!("<placeholder>"),
            _ => json!(String::from_utf8_lossy(&content)),
        };
        let permissions = match path.as_str() {
            JOIN_FILE => json!("<holds the token>"),
            _ => json!(format!(
                "{:0>4}",
                file["permissions"].as_str().unwrap_or("0644")
            )),
        };
        let owner = json!(file["owner"].as_str().unwrap_or("root:root"));
        out.insert(format!("file {path}"), json!([content, permissions, owner]));
    }
    let runcmd: Vec<Value> = doc["runcmd"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!(
                c.as_str()
                    .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            )
        })
        .collect();
    out.insert("runcmd".into(), json!(runcmd));
    for module in ["bootcmd", "users", "ntp", "disk_setup"] {
        out.insert(module.into(), doc[module].clone());
    }
    // The kubeadm provider writes mount fields and a filesystem's partition as plain YAML
    // scalars (`0` reads as a number), bootplate quotes them: cloud-init's mounts module turns
    // every field into text, and disk setup reads a partition number either way.
    let mut mounts = doc["mounts"].clone();
    for mount in mounts.as_array_mut().into_iter().flatten() {
        for field in mount.as_array_mut().into_iter().flatten() {
            *field = as_text(field);
        }
    }
    out.insert("mounts".into(), mounts);
    let mut filesystems = doc["fs_setup"].clone();
    for fs in filesystems.as_array_mut().into_iter().flatten() {
        if let Some(partition) = fs.get_mut("partition") {
            *partition = as_text(partition);
        }
    }
    out.insert("fs_setup".into(), filesystems);
    out
}

const IGNITION_KUBEADM_FILE: &str = "/etc/kubeadm.yml";
const IGNITION_KUBEADM_SCRIPT: &str = "/etc/kubeadm.sh";
const IGNITION_KUBEADM_MOVED: &str = "/tmp/kubeadm.yml";
const IGNITION_PRESET: &str = "/etc/systemd/system-preset/20-ignition.preset";

/// Whether the boot ran an Ignition config (the boot proof keeps the user-data it ran).
fn is_ignition(boot: &testenv::joins::Boot) -> bool {
    std::fs::read_to_string(boot.dir.join("user-data"))
        .is_ok_and(|u| u.trim_start().starts_with('{'))
}

/// The bytes of a `data:` URL (percent-encoded or base64).
fn data_url(source: &str) -> Vec<u8> {
    let (meta, data) = source
        .strip_prefix("data:")
        .and_then(|s| s.split_once(','))
        .unwrap_or_else(|| panic!("not a data URL: {source}"));
    if meta.ends_with(";base64") {
        return base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64");
    }
    percent_encoding::percent_decode_str(data).collect()
}

/// A storage.files entry of Ignition 2.3 (the provider's) or 3.x (bootplate's): content,
/// mode, owner. The kubeadm file parsed without the token, the script as its non-empty lines.
fn ignition_file(file: &Value) -> (String, Value) {
    let path = file["path"].as_str().expect("a path").to_owned();
    let mut content = data_url(file["contents"]["source"].as_str().unwrap_or("data:,"));
    if file["contents"]["compression"] == "gzip" {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&content[..])
            .read_to_end(&mut out)
            .expect("gzip");
        content = out;
    }
    let content = match path.as_str() {
        IGNITION_KUBEADM_FILE => json!(join_configuration(&content)),
        IGNITION_KUBEADM_SCRIPT => json!(
            String::from_utf8_lossy(&content)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
        ),
        _ => json!(String::from_utf8_lossy(&content)),
    };
    let mode = format!("{:04o}", file["mode"].as_u64().unwrap_or(0o644));
    let name = |key: &str| file[key]["name"].as_str().unwrap_or("root").to_owned();
    let owner = format!("{}:{}", name("user"), name("group"));
    (format!("file {path}"), json!([content, mode, owner]))
}

/// What Ignition does with `config`, in comparable form: files, units, users, disks.
fn semantic_ignition(config: &str) -> BTreeMap<String, Value> {
    let doc: Value = serde_json::from_str(config).expect("Ignition JSON");
    let mut out = BTreeMap::new();
    for file in doc["storage"]["files"].as_array().into_iter().flatten() {
        let (key, value) = ignition_file(file);
        out.insert(key, value);
    }
    for unit in doc["systemd"]["units"].as_array().into_iter().flatten() {
        let name = unit["name"].as_str().expect("a unit name");
        let enabled = unit["enabled"].as_bool().unwrap_or(false);
        let dropins = unit["dropins"].as_array().cloned().unwrap_or_default();
        out.insert(
            format!("unit {name}"),
            json!([enabled, unit["contents"], dropins]),
        );
    }
    let users: Vec<Value> = doc["passwd"]["users"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|user| {
            let mut fields = user.as_object().cloned().unwrap_or_default();
            // Ignition 2.x could nest a user's fields under `create`.
            if let Some(Value::Object(create)) = fields.remove("create") {
                fields.extend(create);
            }
            fields.retain(|_, v| !(v.is_null() || v == &json!([]) || v == &json!("")));
            Value::Object(fields)
        })
        .collect();
    out.insert("users".into(), json!(users));
    for key in ["disks", "filesystems", "directories", "links", "raid"] {
        out.insert(format!("storage.{key}"), doc["storage"][key].clone());
    }
    out
}

fn as_text(value: &Value) -> Value {
    match value {
        Value::String(_) => value.clone(),
        other => json!(other.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn imported_configs_render_what_the_kubeadm_provider_renders() {
    let env = CapiEnv::start(Options::default()).await.unwrap();
    for template in ["kubeadm-compat", "kubeadm-compat-ignition"] {
        env.publish_shipped_template(&format!("templates/{template}.yaml"))
            .await
            .unwrap();
    }
    let cabpk = KubeadmBootstrap::install(&env).await.unwrap();
    // Its Ignition format is behind a feature gate (off in its Deployment); the flag given
    // again sets that gate and keeps the others.
    let ignition = "--feature-gates=KubeadmBootstrapFormatIgnition=true".to_owned();
    let _cabpk = cabpk
        .start(&env, &[ignition], "kubeadm-bootstrap.log")
        .await
        .unwrap();
    let mut secret = Secret::default();
    secret.metadata.name = Some("compat-file".into());
    secret.string_data = Some([("data".to_owned(), "from a Secret\n".to_owned())].into());
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    env.provider_cluster(CLUSTER, KUBERNETES_VERSION, None)
        .await
        .unwrap();
    env.wait_control_plane_initialized(CLUSTER).await;
    let corpus = corpus();
    assert!(
        corpus.len() >= 20,
        "the corpus holds {} specs",
        corpus.len()
    );
    futures::future::join_all(corpus.iter().map(|(name, spec)| create(&env, name, spec))).await;
    let mut differences = Vec::new();
    let mut renders = Vec::new();
    for (name, _) in &corpus {
        let (theirs, ours) = (
            user_data(&env, &format!("k-{name}")).await,
            user_data(&env, &format!("b-{name}")).await,
        );
        renders.push((name.clone(), theirs.clone(), ours.clone()));
        let (theirs, ours) = (semantic(&theirs), semantic(&ours));
        for key in theirs
            .keys()
            .chain(ours.keys())
            .collect::<std::collections::BTreeSet<_>>()
        {
            if theirs.get(key) != ours.get(key) {
                differences.push(format!(
                    "{name}: {key}:\n  kubeadm provider: {}\n  bootplate:        {}",
                    theirs.get(key).map_or("-".into(), Value::to_string),
                    ours.get(key).map_or("-".into(), Value::to_string),
                ));
            }
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    let cloud_config = renders
        .iter()
        .filter(|r| !r.1.trim_start().starts_with('{'))
        .count();
    assert!(cloud_config >= 20, "{cloud_config} cloud-config specs");
    let ignition_drill = ignition_drill_renders(&renders);
    renders.extend(drill_renders().into_iter().chain(ignition_drill));
    // The boots run beside the migration: one waits on Cluster API, the other on CPUs.
    let boots = tokio::task::spawn_blocking(move || boot_both(&renders));
    migrate_a_machine_deployment(&env).await;
    let (drill, differences): (Vec<String>, Vec<String>) = boots
        .await
        .expect("the boots")
        .into_iter()
        .partition(|d| d.starts_with("drill-"));
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    the_boot_comparison_sees_a_dropped_file_and_a_reordered_command(&drill);
    the_ignition_boot_comparison_sees_a_dropped_file_and_swapped_units(&drill);
}

/// Boots at once (the boot proof's default for two CPUs).
const BOOT_JOBS: usize = 4;

/// Every render of `renders` (name, the provider's, bootplate's) booted by the boot proof, with
/// real cloud-init or real Ignition (the provider's Ignition configs, spec 2.3, by Ignition
/// v0.35.0; bootplate's, spec 3.x, by Ignition 2.14: tests/boot/run.sh picks by the config's
/// version): each passes the proof, and both renders of a spec leave the same machine and run
/// the same commands in order ([`testenv::boot_compare`]).
fn boot_both(renders: &[(String, String, String)]) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join("kubeadm-compat-boots");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| std::path::PathBuf::from(t).join("kubeadm-compat-boots"))
        .unwrap_or(dir);
    let jobs: Vec<(String, &str)> = renders
        .iter()
        .flat_map(|(name, theirs, ours)| {
            [
                (format!("k-{name}"), theirs.as_str()),
                (format!("b-{name}"), ours.as_str()),
            ]
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let boots = std::sync::Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..BOOT_JOBS {
            scope.spawn(|| {
                while let Some((case, user_data)) =
                    jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::SeqCst))
                {
                    let ignition = user_data.trim_start().starts_with('{');
                    let run = testenv::joins::BootRun {
                        dir: dir.clone(),
                        case,
                        role: "worker",
                        version: KUBERNETES_VERSION,
                        // What the provider's renders expect (run.sh's stand-ins): kubeadm, the
                        // kubelet and a container runtime on the image; for its Ignition
                        // configs, Flatcar's (its units and groups).
                        os: if ignition { "flatcar" } else { "kubeadm-image" },
                    };
                    let boot = run.boot(user_data.as_bytes(), None).unwrap();
                    boots.lock().unwrap().insert(case.clone(), boot);
                }
            });
        }
    });
    compare_boots(&boots.into_inner().unwrap())
}

const PROVIDER: &str = "the kubeadm provider";

/// The failures of a boot but the cloud-init schema warnings docs/migrating.md explains:
/// cloud-init 22.4's schema takes no partition number in `fs_setup` (which its disk setup
/// reads) and wants a user's `inactive` as text (both write the KubeadmConfigSpec's boolean),
/// and the provider writes mount fields as plain YAML scalars (`0` reads as a number, the
/// schema wants text; the mounts module turns it into text).
fn unexplained_failures(boot: &testenv::joins::Boot, who: &str) -> Vec<String> {
    let any_schema = "is not valid under any of the given schemas";
    let explained = |error: &str| {
        (error.starts_with("fs_setup.")
            && error.contains(".partition: ")
            && error.ends_with(any_schema))
            || (error.starts_with("users.")
                && error.contains("'inactive': True")
                && error.ends_with(any_schema))
            || (who == PROVIDER
                && error.starts_with("mounts.")
                && error.ends_with("is not of type 'string'"))
    };
    let failures = boot.report["failures"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    failures
        .iter()
        .filter(|f| {
            let message = f["message"].as_str().unwrap_or_default();
            let schema = message.split_once("Cloud config schema errors: ");
            f["step"] != "cloud-init (schema)"
                || !schema
                    .is_some_and(|(_, errors)| schema_errors(errors).iter().all(|e| explained(e)))
        })
        .map(|f| format!("{}: {}", f["step"], f["message"]))
        .collect()
}

/// The errors of cloud-init's `Cloud config schema errors: KEY: MESSAGE, KEY: MESSAGE` (a
/// message may hold `, ` itself: a new error starts with a bare schema path and `: `).
fn schema_errors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in text.split(", ") {
        let path = |key: &str| {
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        match out.last_mut() {
            Some(last) if !piece.split_once(": ").is_some_and(|(k, _)| path(k)) => {
                last.push_str(", ");
                last.push_str(piece);
            }
            _ => out.push(piece.to_owned()),
        }
    }
    out
}

/// Each spec's two boots: both proven, and the same machine left behind.
fn compare_boots(boots: &BTreeMap<String, testenv::joins::Boot>) -> Vec<String> {
    let mut out = Vec::new();
    for (case, ours) in boots.iter().filter(|(c, _)| c.starts_with("b-")) {
        let name = &case[2..];
        let theirs = &boots[&format!("k-{name}")];
        let allowed = testenv::boot_compare::Allowed {
            // The Ignition script moves its kubeadm file to /tmp once kubeadm ran.
            kubeadm_files: &[JOIN_FILE, IGNITION_KUBEADM_MOVED],
            any_text: &[PLACEHOLDER],
            script_lines: &[IGNITION_KUBEADM_SCRIPT],
            any_order: &[IGNITION_PRESET],
            // Ignition v0.35.0 (the provider's spec 2.3) and 2.14 (bootplate's spec 3.3) keep
            // a user's keys in other files.
            ssh_keys_as_users: is_ignition(theirs),
        };
        for (who, boot) in [(PROVIDER, theirs), ("bootplate", ours)] {
            let failures = unexplained_failures(boot, who);
            if boot.status == Some(2) || !failures.is_empty() {
                out.push(format!(
                    "{name}: {who}'s render fails the boot proof: {failures:?}\n{}",
                    boot.explain()
                ));
            }
        }
        let documents = |text: &str| json!(join_configuration(text.as_bytes()));
        for difference in testenv::boot_compare::differences(theirs, ours, &allowed, documents) {
            out.push(format!("{name}: {difference}"));
        }
    }
    out
}

const MIGRATED: &str = "migrated";

fn node_ref(machine: &DynamicObject) -> bool {
    machine.data["status"]["nodeRef"]["name"].is_string()
        && machine.data["status"]["phase"] == "Running"
}

fn bootstrapped_by(machine: &DynamicObject) -> &str {
    machine.data["spec"]["bootstrap"]["configRef"]["kind"]
        .as_str()
        .unwrap_or_default()
}

/// Waits until the MachineDeployment's Cluster has three Running workers with a nodeRef, all
/// bootstrapped by `kind`; returns their names.
async fn wait_workers(env: &CapiEnv, kind: &str) -> Vec<String> {
    let what = format!("three Running workers of {kind}");
    testenv::eventually(&what, WAIT, || async {
        let machines = env.capi_list("Machine", "machines", MIGRATED).await;
        let done = machines.len() == 3
            && machines
                .iter()
                .all(|m| node_ref(m) && bootstrapped_by(m) == kind);
        done.then(|| machines.iter().map(|m| m.name_any()).collect())
    })
    .await
}

/// KubeadmConfigTemplate `workers` → MachineDeployment of 3 → `bootplate import` → patch.
async fn migrate_a_machine_deployment(env: &CapiEnv) {
    env.provider_cluster(MIGRATED, KUBERNETES_VERSION, None)
        .await
        .unwrap();
    env.wait_control_plane_initialized(MIGRATED).await;
    let spec = corpus()
        .into_iter()
        .find(|(n, _)| n == "everything")
        .expect("the corpus entry")
        .1;
    let kubeadm = json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfigTemplate",
        "metadata": {"name": "workers", "namespace": NS},
        "spec": {"template": {"spec": spec}},
    });
    let templates = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "bootstrap.cluster.x-k8s.io",
            "v1beta2",
            "KubeadmConfigTemplate",
        ),
        "kubeadmconfigtemplates",
    );
    env.apply(&templates, kubeadm.clone()).await.unwrap();
    env.apply(
        &objects::dev_machine_template_resource(),
        objects::dev_machine_template("workers", "small"),
    )
    .await
    .unwrap();
    let mut deployment = objects::machine_deployment(
        "md-0",
        MIGRATED,
        3,
        "workers",
        "workers",
        KUBERNETES_VERSION,
    );
    deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"] = json!({"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfigTemplate", "name": "workers"});
    env.apply(&objects::machine_deployment_resource(), deployment)
        .await
        .unwrap();
    let old = wait_workers(env, "KubeadmConfig").await;
    assert_eq!(
        migrated_kubeadm_configs(env).await.len(),
        3,
        "the workers' KubeadmConfigs"
    );

    // As a user does: `kubectl get … -o yaml | bootplate import --machine-deployment md-0
    // --patch-output FILE`, then `kubectl apply` its output and `kubectl patch` with its patch.
    let dir = tempfile::tempdir().unwrap();
    let patch = dir.path().join("md-0-patch.yaml");
    let output = import_with_binary(
        &serde_yaml::to_string(&kubeadm).unwrap(),
        &["--machine-deployment", "md-0", "--patch-output"],
        &patch,
    );
    import_from_the_cluster(env, &output, &std::fs::read_to_string(&patch).unwrap());
    let kubeconfig = env.management.kubeconfig_path().unwrap();
    let applied = testenv::kubectl_apply(&kubeconfig, &[], &output);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    let patched = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--namespace", NS, "patch", "machinedeployment", "md-0"])
        .args(["--type", "merge", "--patch-file"])
        .arg(&patch)
        .output()
        .unwrap();
    assert!(patched.status.success(), "{}", text(&patched.stderr));
    let new = wait_workers(env, "BootplateConfig").await;
    assert!(
        new.iter().all(|n| !old.contains(n)),
        "every worker rolled out: {old:?} → {new:?}"
    );
    let what = "no KubeadmConfig of the migrated workers";
    testenv::eventually(what, WAIT, || async {
        migrated_kubeadm_configs(env).await.is_empty().then_some(())
    })
    .await;
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `bootplate import ARGS PATCH` with `input` on standard input: its standard output, once it
/// succeeded without a word on standard error (nothing is lost).
fn import_with_binary(input: &str, args: &[&str], patch: &std::path::Path) -> String {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(testenv::controller::binary().unwrap())
        .arg("import")
        .args(args)
        .arg(patch)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "bootplate import: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The one right `bootplate import --kubeconfig` needs, for ServiceAccount `fleet/importer`.
const IMPORTER_RBAC: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: bootplate-import, namespace: fleet}
rules:
  - apiGroups: [bootstrap.cluster.x-k8s.io]
    resources: [kubeadmconfigtemplates, kubeadmconfigs]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bootplate-import, namespace: fleet}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: bootplate-import}
subjects:
  - {kind: ServiceAccount, name: importer, namespace: fleet}
";

/// `bootplate import --kubeconfig` reads KubeadmConfigTemplate `workers` from the cluster as an
/// identity that may only get it (any other request would be refused and fail the import),
/// and writes what the import of the file wrote (`from_file`, `patch_from_file`). An absent
/// object and an identity without the right: exit 2, said once.
fn import_from_the_cluster(env: &CapiEnv, from_file: &str, patch_from_file: &str) {
    use std::process::Command;
    assert_eq!(NS, "fleet", "IMPORTER_RBAC's namespace");
    let admin = env.management.kubeconfig_path().unwrap();
    let applied = testenv::kubectl_apply(&admin, &[], IMPORTER_RBAC);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    let reader =
        testenv::rbac::impersonating_kubeconfig(&env.management, NS, "importer", "importer")
            .unwrap();
    let nobody =
        testenv::rbac::impersonating_kubeconfig(&env.management, NS, "nobody", "nobody").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let patch = dir.path().join("patch.yaml");
    let import = |kubeconfig: &std::path::Path, object: &str| {
        Command::new(testenv::controller::binary().unwrap())
            .arg("import")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", NS, object, "--machine-deployment", "md-0"])
            .arg("--patch-output")
            .arg(&patch)
            .output()
            .unwrap()
    };
    let read = import(&reader, "kubeadmconfigtemplate/workers");
    assert!(
        read.status.success() && read.stderr.is_empty(),
        "{}",
        text(&read.stderr)
    );
    assert_eq!(text(&read.stdout), from_file);
    assert_eq!(std::fs::read_to_string(&patch).unwrap(), patch_from_file);

    let absent = import(&reader, "KubeadmConfigTemplate/nowhere");
    let why = text(&absent.stderr);
    assert_eq!(absent.status.code(), Some(2), "{why}");
    assert_eq!(why.matches("--kubeconfig:").count(), 1, "{why}");
    assert!(
        why.contains("no KubeadmConfigTemplate `nowhere` in namespace fleet"),
        "{why}"
    );
    let forbidden = import(&nobody, "kubeadmconfigtemplates/workers");
    let why = text(&forbidden.stderr);
    assert_eq!(forbidden.status.code(), Some(2), "{why}");
    assert!(
        why.contains(
            "may not get kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io in namespace fleet"
        ),
        "{why}"
    );
    assert!(forbidden.stdout.is_empty(), "nothing imported");
}

/// The KubeadmConfigs Cluster API made from the template (the corpus's are named `k-…`).
async fn migrated_kubeadm_configs(env: &CapiEnv) -> Vec<String> {
    let configs = env
        .dynamic(&kubeadm_config_resource())
        .list(&Default::default())
        .await;
    configs
        .expect("listing KubeadmConfigs")
        .items
        .iter()
        .map(|c| c.name_any())
        .filter(|n| !n.starts_with("k-"))
        .collect()
}

/// A cloud-config like the provider's: a file, the join file, commands around kubeadm.
const DRILL: &str = "#cloud-config
write_files:
- path: /etc/drill/a.conf
  permissions: '0640'
  content: |
    a
- path: /run/kubeadm/kubeadm-join-config.yaml
  permissions: 'MODE'
  content: |
    apiVersion: kubeadm.k8s.io/v1beta4
    kind: JoinConfiguration
    discovery:
      bootstrapToken: {apiServerEndpoint: '10.0.0.1:6443', token: TOKEN, unsafeSkipCAVerification: true}
runcmd:
- FIRST
- SECOND
- mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete
";

/// The drill's pairs of renders, booted with the corpus's: the same machine (another token,
/// the join file's mode 0600), one without a file, one with two commands swapped.
fn drill_renders() -> Vec<(String, String, String)> {
    let (reload, join) = (
        "systemctl daemon-reload",
        "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml",
    );
    let theirs = DRILL
        .replace("MODE", "0640")
        .replace("TOKEN", "abcdef.0123456789abcdef");
    let ours = DRILL
        .replace("MODE", "0600")
        .replace("TOKEN", "ghijkl.0123456789ghijkl");
    let renders = |ours: String| {
        (
            theirs.replace("FIRST", reload).replace("SECOND", join),
            ours,
        )
    };
    let cases = [
        (
            "same",
            renders(ours.replace("FIRST", reload).replace("SECOND", join)),
        ),
        (
            "dropped",
            renders(
                ours.replace("FIRST", reload)
                    .replace("SECOND", join)
                    .replace(
                        "- path: /etc/drill/a.conf\n  permissions: '0640'\n  content: |\n    a\n",
                        "",
                    ),
            ),
        ),
        (
            "reordered",
            renders(ours.replace("FIRST", join).replace("SECOND", reload)),
        ),
    ];
    cases
        .into_iter()
        .map(|(name, (theirs, ours))| (format!("drill-{name}"), theirs, ours))
        .collect()
}

/// The differences of drill case `name` (`drill-NAME: …`).
fn drill_case<'a>(differences: &'a [String], name: &str) -> Vec<&'a String> {
    let prefix = format!("drill-{name}: ");
    differences
        .iter()
        .filter(|d| d.starts_with(&prefix))
        .collect()
}

/// The boot comparison fails when one render drops a file or runs two commands in another
/// order, and allows what docs/migrating.md allows (another token, the join file's mode):
/// `differences` are those of the drill's boots.
fn the_boot_comparison_sees_a_dropped_file_and_a_reordered_command(differences: &[String]) {
    let of = |name: &str| drill_case(differences, name);
    assert_eq!(of("same"), Vec::<&String>::new());
    let dropped = of("dropped");
    assert!(
        dropped.iter().all(|d| d.contains(": /etc/drill"))
            && dropped.iter().any(|d| d.contains(": /etc/drill/a.conf:")),
        "{dropped:#?}"
    );
    let reordered = of("reordered");
    assert!(
        reordered.len() == 1 && reordered[0].contains("the commands run (stub calls, in order)"),
        "{reordered:#?}"
    );
}

/// The Ignition drill: the provider's render of `ignition-users-ntp` against bootplate's, once
/// without `/etc/ntp.conf` and once with the names of its two units swapped.
fn ignition_drill_renders(renders: &[(String, String, String)]) -> Vec<(String, String, String)> {
    let (_, theirs, ours) = renders
        .iter()
        .find(|r| r.0 == "ignition-users-ntp")
        .expect("the corpus entry ignition-users-ntp");
    let ours: Value = serde_json::from_str(ours).expect("bootplate's Ignition config");
    let mut dropped = ours.clone();
    dropped["storage"]["files"]
        .as_array_mut()
        .expect("storage.files")
        .retain(|f| f["path"] != "/etc/ntp.conf");
    let mut swapped = ours;
    for unit in swapped["systemd"]["units"]
        .as_array_mut()
        .expect("systemd.units")
    {
        let other = match unit["name"].as_str() {
            Some("kubeadm.service") => "ntpd.service",
            Some("ntpd.service") => "kubeadm.service",
            _ => continue,
        };
        unit["name"] = json!(other);
    }
    [("dropped", dropped), ("swapped", swapped)]
        .into_iter()
        .map(|(name, ours)| {
            let name = format!("drill-ignition-{name}");
            (name, theirs.clone(), ours.to_string())
        })
        .collect()
}

/// The boot comparison of two Ignition renders fails when one drops a file or swaps two units:
/// `differences` are those of the Ignition drill's boots.
fn the_ignition_boot_comparison_sees_a_dropped_file_and_swapped_units(differences: &[String]) {
    let of = |name: &str| drill_case(differences, &format!("ignition-{name}"));
    let dropped = of("dropped");
    assert!(
        !dropped.is_empty() && dropped.iter().all(|d| d.contains(": /etc/ntp.conf:")),
        "{dropped:#?}"
    );
    let swapped = of("swapped");
    for unit in ["kubeadm.service", "ntpd.service"] {
        let path = format!(": /etc/systemd/system/{unit}:");
        assert!(swapped.iter().any(|d| d.contains(&path)), "{swapped:#?}");
    }
}
