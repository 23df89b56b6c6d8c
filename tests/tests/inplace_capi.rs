//! In-place updates driven by the real Cluster API (its manager with the `InPlaceUpdates` and
//! `RuntimeSDK` feature gates) through bootplate's Runtime SDK extension, registered by the
//! ExtensionConfig of `deploy/extension`. Test code plays the cloud, the kubelets and the nodes'
//! disks: each node runs the real bootplate-agent binary with the node's own identity against the
//! workload apiserver (Node and RBAC authorization), applying into a directory root with a
//! systemctl stub that records its calls.
//!
//! (a) A MachineDeployment's config changes only an `update: InPlace` part: Cluster API asks
//! `CanUpdateMachineSet`, moves the Machines to the new MachineSet and calls `UpdateMachine`;
//! the Machines keep their UIDs, each node's files hold the new content, only the changed unit
//! was restarted, the data Secret was not rewritten.
//! (b) A change to a `Rollout` part: the hook answers `rollout` (its metric and its log say so,
//! and no hook call failed), Cluster API replaces the Machines.
//! (c) The agent fails a step: the Machine's update is reported failed, the config's condition
//! names the part and the step, and the node's file is whole (old or new, never torn).
//! (d) A node's identity reads its own payload Secret and not another node's.
//! (e) A file changed by hand on a node is put back by its agent.
//! (f) Before Cluster API first updates a machine in place nothing is published for it: no
//! payload Secret, Role or RoleBinding in the workload cluster. Each node's disk holds what its
//! user-data wrote for the `InPlace` parts (the test plays cloud-init from the data Secret), and
//! the first payload's agent starts from the boot's record: nothing unchanged is rewritten,
//! re-enabled or restarted.
//! (g) `updatePolicy: InPlaceOnly`. On a config template: a MachineDeployment's move to one
//! whose render changes a `Rollout` part is refused by the hook (a failed response, answer
//! `refused`) and its Machine is not replaced; a move that changes only an `InPlace` part goes
//! through in place. On the template: an update that a running machine cannot take in place is
//! refused at admission, naming the machines' configs and the part; setting the policy alone,
//! and a change of an `InPlace` part, are admitted.
//!
//! (h) Warnings at admission: `kubectl apply --dry-run=server` of a template change writes
//! nothing and tells what it would do: every joined machine of the template outdated, able to
//! take a change of an `InPlace` part in place (naming the part) and replaced on its next
//! rollout for a change of a `Rollout` part (naming the part); of a config template's edit, how
//! many machines Cluster API created from it keep their configs. And before each move of a
//! MachineDeployment to another config template in (a), (b) and (g), `kubectl patch
//! --dry-run=server` tells what its rollout will do: in place naming the part, replaced naming
//! the part, refused by the `InPlaceOnly` holder.
//!
//! Before each change is applied, `bootplate diff` previews it offline (the template and the old
//! and the new config template, role worker): in place for (a) and (c), replacement naming part
//! `install` for (b). What the tier then sees Cluster API and bootplate do is that verdict.
//!
//! (i) Every shipped template (`templates/*.yaml`), each with a MachineDeployment of one worker
//! on a Cluster at a Kubernetes version the kubeadm templates know (`kubeadm-*` machines pass
//! the cloud's join check, the others boot as they are). Each moves through three revisions of
//! its config template: a new proxy in the network input, then a `postCommands` change.
//! `bootplate diff` previews each move offline, and what Cluster API and bootplate then do is its
//! verdict. The proxy's change is in place, naming part `network`, for a template with an
//! `InPlace` part: the Machine kept, its agent running the template's own `network` commands
//! chrooted into the node's root (`sandbox-chroot.sh`) after the boot ran the first revision's
//! there, and the node's `/etc` holding the new proxy and not the old. It is a replacement for
//! one without (the Windows templates). The `postCommands` change is a replacement for every
//! template: a new Machine, and the hook's logged answer for that MachineDeployment carries the
//! reason diff gave.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::agent::{AgentProcess, NodeDisk};
use testenv::capi::{CapiEnv, NS, Options, condition, objects};
use testenv::mirror::ChrootNode;

const WAIT: Duration = Duration::from_secs(240);
const MIRROR_FILE: &str = "/etc/containerd/certs.d/docker.io/hosts.toml";

/// A template with a `Rollout` install part, an `InPlace` configure part (a mirror file, a
/// drop-in of containerd that names the mirror, and a command, which fails when `failStep` is
/// set) and an `InPlace` part with a unit that does not read the mirror.
fn template() -> Value {
    json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "BootstrapTemplate",
        "metadata": {"name": "inplace", "namespace": NS},
        "spec": {
            "os": {"name": "linux"},
            "format": "cloud-config",
            "variables": [
                {"name": "mirror", "default": "https://mirror-a.example"},
                {"name": "runtime", "default": "2.0"},
                {"name": "failStep", "default": false, "schema": {"type": "boolean"}},
            ],
            "parts": [
                {"name": "install", "commands": ["echo install runtime {{shell_quote values.runtime}}"]},
                {
                    "name": "configure",
                    "update": "InPlace",
                    "files": [{
                        "path": MIRROR_FILE,
                        "permissions": "0644",
                        "content": "[host.\"{{values.mirror}}\"]\n  capabilities = [\"pull\"]\n",
                    }],
                    "units": [
                        {"name": "containerd.service", "dropIns": [{
                            "name": "10-mirror.conf",
                            "content": "[Service]\nEnvironment=MIRROR={{values.mirror}}\n",
                        }]},
                    ],
                    "commands": ["{{#if values.failStep}}echo cannot reach the mirror >&2; exit 3{{else}}mkdir -p \"$BOOTPLATE_ROOT/var/log\" && echo {{shell_quote values.mirror}} >> \"$BOOTPLATE_ROOT/var/log/mirror-history\"{{/if}}"],
                },
                // A service of its own part: a change of `configure`'s files does not concern it.
                {
                    "name": "exporter",
                    "update": "InPlace",
                    "units": [
                        {"name": "node-exporter.service", "enable": true,
                         "content": "[Unit]\nDescription=exporter\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"},
                    ],
                },
            ],
        },
    })
}

fn config_template(name: &str, variables: Value) -> Value {
    json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "BootplateConfigTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {
            "templateRef": {"kind": "BootstrapTemplate", "name": "inplace"},
            "variables": variables,
        }}},
    })
}

/// A MachineDeployment that updates without a surge (one Machine unavailable at a time), so an
/// in-place update never needs a new Machine.
fn machine_deployment(name: &str, cluster: &str, replicas: u32, config_template: &str) -> Value {
    let mut md = objects::machine_deployment(
        name,
        cluster,
        replicas,
        config_template,
        "inplace",
        "v1.37.2",
    );
    without_surge(&mut md);
    // The template joins no cluster: the test cloud boots these machines without a join check.
    plain_machines(&mut md);
    md
}

/// Rolls MachineDeployment `md` out one Machine at a time with no surge: an in-place update
/// never needs a new Machine.
fn without_surge(md: &mut Value) {
    md["spec"]["rollout"] = json!({"strategy": {"type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}});
}

/// Marks the Machines of `md` as no Kubernetes nodes: the cloud boots them without a join check.
fn plain_machines(md: &mut Value) {
    md["spec"]["template"]["metadata"]["labels"][testenv::capi::cloud::PLAIN_MACHINE_LABEL] =
        json!("true");
}

async fn apply(env: &CapiEnv, resource: &kube::api::ApiResource, object: Value) {
    env.apply(resource, object).await.unwrap();
}

fn config_templates() -> kube::api::ApiResource {
    objects::bootplate_resource("BootplateConfigTemplate", "bootplateconfigtemplates")
}

/// What bootplate's webhook tells of pointing MachineDeployment `md` at BootplateConfigTemplate
/// `template`: `kubectl patch --dry-run=server`'s warnings (nothing written), each asserted to
/// hold its text of `expected`.
fn assert_switch_told(env: &CapiEnv, md: &str, template: &str, expected: &[&str]) {
    let kubeconfig = env.management.kubeconfig_path().unwrap();
    let patch =
        json!({"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": template}}}}}});
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "patch",
            "machinedeployment",
            md,
            "-n",
            NS,
            "--type",
            "merge",
        ])
        .args(["--dry-run=server", "-p", &patch.to_string()])
        .output()
        .expect("kubectl runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the dry run of {md}'s move: {stderr}");
    for text in expected {
        assert!(
            stderr.contains(text),
            "{md}'s move to {template}: no warning with {text:?}:\n{stderr}"
        );
    }
}

/// Points MachineDeployment `md` at BootplateConfigTemplate `template`.
async fn switch_template(env: &CapiEnv, md: &str, template: &str) {
    let api = env.capi("MachineDeployment", "machinedeployments");
    let patch =
        json!({"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": template}}}}}});
    api.patch(md, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The Machines of MachineDeployment `md`, by name.
async fn machines(env: &CapiEnv, md: &str) -> BTreeMap<String, DynamicObject> {
    let params = ListParams::default().labels(&format!("cluster.x-k8s.io/deployment-name={md}"));
    env.capi("Machine", "machines")
        .list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| (m.metadata.name.clone().unwrap(), m))
        .collect()
}

async fn config(env: &CapiEnv, name: &str) -> DynamicObject {
    env.configs().get(name).await.unwrap()
}

fn config_name(machine: &DynamicObject) -> String {
    machine.data["spec"]["bootstrap"]["configRef"]["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The worker's verdict of `bootplate diff --format json --role worker` between two revisions
/// of a MachineDeployment's config template, each file holding the template and the revision
/// (two single files: paired whatever their names). The exit code must be the one the report
/// states.
fn previewed(old: &Value, new: &Value) -> Value {
    previewed_with(&template().to_string(), old, new)
}

/// [`previewed`] with the template `template` (its YAML or JSON text).
fn previewed_with(template: &str, old: &Value, new: &Value) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, config: &Value| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{template}\n---\n{config}\n")).unwrap();
        path
    };
    let (old, new) = (write("old.yaml", old), write("new.yaml", new));
    let out = std::process::Command::new(testenv::controller::binary().unwrap())
        .args(["diff", "--format", "json", "--role", "worker"])
        .args([&old, &new])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bootplate diff: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        out.status.code().map(i64::from),
        report["exitCode"].as_i64(),
        "{report}"
    );
    let objects = report["objects"].as_array().unwrap();
    let config = objects
        .iter()
        .find(|o| o["kind"] == "BootplateConfigTemplate")
        .unwrap_or_else(|| panic!("the config template's revisions: {report}"));
    assert_eq!(config["presence"], "both", "{report}");
    config["roles"][0].clone()
}

/// Polls `check` every second until it returns `Some`; on timeout panics with `what` and
/// Cluster API's and bootplate's state.
async fn wait_for<T, F, Fut>(env: &CapiEnv, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}\n{}", env.describe().await);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until MachineDeployment `md` has `count` Machines with a Node, each config's in-place
/// step done for the join (its status names the node); returns the Machines.
async fn wait_joined(env: &CapiEnv, md: &str, count: usize) -> BTreeMap<String, DynamicObject> {
    wait_for(env, &format!("{count} joined Machines of {md}"), || async {
        let found = machines(env, md).await;
        if found.len() != count
            || found
                .values()
                .any(|m| m.data["status"]["nodeRef"].is_null())
        {
            return None;
        }
        for machine in found.values() {
            let config = config(env, &config_name(machine)).await;
            (config.data["status"]["inPlace"]["node"] == machine.data["status"]["nodeRef"]["name"])
                .then_some(())?;
        }
        Some(found)
    })
    .await
}

/// (f) Joined, not updated: no published revision, and none of the node's payload objects in
/// the workload cluster.
async fn nothing_published_before_an_update(
    env: &CapiEnv,
    machines: &BTreeMap<String, DynamicObject>,
) {
    let name = crd_types::payload::secret_name;
    let secrets: Api<Secret> = Api::namespaced(env.workload_client.clone(), "kube-system");
    let roles: Api<k8s_openapi::api::rbac::v1::Role> =
        Api::namespaced(env.workload_client.clone(), "kube-system");
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(env.workload_client.clone(), "kube-system");
    for machine in machines.values() {
        let config = config(env, &config_name(machine)).await;
        assert!(
            config.data["status"]["inPlace"]["publishedRevision"].is_null(),
            "{}",
            config.data["status"]
        );
        let node = node_of(machine);
        assert!(secrets.get_opt(&name(&node)).await.unwrap().is_none());
        assert!(roles.get_opt(&name(&node)).await.unwrap().is_none());
        assert!(bindings.get_opt(&name(&node)).await.unwrap().is_none());
    }
}

/// For each Machine's node (named after the Machine): a disk holding what the user-data wrote
/// for the `InPlace` parts, and an agent on it; returns the agents and the disks by Machine.
async fn start_agents(
    env: &CapiEnv,
    machines: &BTreeMap<String, DynamicObject>,
) -> (Vec<AgentProcess>, BTreeMap<String, NodeDisk>) {
    let mut agents = Vec::new();
    let mut disks = BTreeMap::new();
    for (name, machine) in machines {
        let node = node_of(machine);
        let disk = NodeDisk::new().unwrap();
        boot_disk(env, &config_name(machine), &disk).await;
        agents.push(
            AgentProcess::start(
                env.management.dir(),
                env.workload.port(),
                &env.cluster_ca,
                &node,
                &disk.node(),
                "1s",
            )
            .unwrap(),
        );
        disks.insert(name.clone(), disk);
    }
    (agents, disks)
}

/// Writes into `disk` what the user-data of config `config_name` writes for its `InPlace` parts,
/// as cloud-init would: the paths its data Secret records of the boot, with the content the
/// user-data gives them.
async fn boot_disk(env: &CapiEnv, config_name: &str, disk: &NodeDisk) {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
    let data = secrets.get(config_name).await.unwrap().data.unwrap();
    let record = &data
        .get(crd_types::payload::BOOTED_KEY)
        .unwrap_or_else(|| panic!("the data Secret of {config_name} records no boot"))
        .0;
    let booted: crd_types::payload::BootedManifest = serde_json::from_slice(record).unwrap();
    assert!(!booted.files.is_empty(), "{booted:?}");
    let text = String::from_utf8(data["value"].0.clone()).unwrap();
    let user_data = testenv::capi::user_data::UserData::read(&text).unwrap();
    for path in booted.files.keys() {
        let content = (user_data.file(path).unwrap())
            .unwrap_or_else(|| panic!("the user-data does not write {path}"));
        let target = disk.path(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, content).unwrap();
    }
}

fn uids(machines: &BTreeMap<String, DynamicObject>) -> BTreeMap<String, String> {
    machines
        .iter()
        .map(|(n, m)| (n.clone(), m.metadata.uid.clone().unwrap()))
        .collect()
}

async fn data_secret_version(env: &CapiEnv, name: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
    secrets
        .get(name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn cluster_api_updates_machines_in_place_through_bootplate() {
    let env = CapiEnv::start(Options {
        in_place_updates: true,
        ..Default::default()
    })
    .await
    .unwrap();
    apply(
        &env,
        &objects::dev_control_plane_resource(),
        objects::dev_control_plane("ip", "v1.37.2"),
    )
    .await;
    apply(
        &env,
        &objects::dev_cluster_resource(),
        objects::dev_cluster("ip"),
    )
    .await;
    apply(
        &env,
        &objects::cluster_resource(),
        objects::cluster("ip", Some("ip"), false),
    )
    .await;
    apply(
        &env,
        &objects::bootplate_resource("BootstrapTemplate", "bootstraptemplates"),
        template(),
    )
    .await;
    apply(
        &env,
        &objects::dev_machine_template_resource(),
        objects::dev_machine_template("inplace", "small"),
    )
    .await;
    let v1 = json!({"mirror": "https://mirror-a.example"});
    apply(
        &env,
        &config_templates(),
        config_template("a-v1", v1.clone()),
    )
    .await;
    apply(&env, &config_templates(), config_template("c-v1", v1)).await;
    apply(
        &env,
        &objects::machine_deployment_resource(),
        machine_deployment("a", "ip", 2, "a-v1"),
    )
    .await;
    apply(
        &env,
        &objects::machine_deployment_resource(),
        machine_deployment("c", "ip", 1, "c-v1"),
    )
    .await;

    let before = wait_joined(&env, "a", 2).await;
    let failing = wait_joined(&env, "c", 1).await;
    nothing_published_before_an_update(&env, &before).await;
    let (_agents, disks) = start_agents(&env, &before).await;
    let (_failing_agent, failing_disks) = start_agents(&env, &failing).await;
    let mut secret_versions = BTreeMap::new();
    for (name, machine) in &before {
        let disk = &disks[name];
        let mirror = std::fs::read_to_string(disk.path(MIRROR_FILE)).unwrap();
        assert!(mirror.contains("mirror-a.example"), "{mirror}");
        let config_name = config_name(machine);
        secret_versions.insert(
            config_name.clone(),
            data_secret_version(&env, &config_name).await,
        );
    }

    in_place_update(&env, &before, &disks, &secret_versions).await;
    only_its_own_payload(&env, &before).await;
    drift_is_put_back(&before, &disks).await;
    failed_step(&env, &failing, &failing_disks).await;
    rollout(&env, &before).await;
    in_place_only_config_template(&env).await;
    admission_warnings(&env).await;
    in_place_only_template(&env).await;
    every_shipped_template(&env).await;
}

/// `kubectl apply --dry-run=server` of `object` against the management cluster: its warnings
/// (kubectl prints each as `Warning: ...` on standard error); fails when it is refused.
fn dry_run_warnings(env: &CapiEnv, object: &Value) -> String {
    let kubeconfig = env.management.kubeconfig_path().unwrap();
    let yaml = serde_json::to_string(object).unwrap();
    let out = testenv::kubectl_apply(&kubeconfig, &["--dry-run=server"], &yaml);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the dry run is admitted: {stderr}");
    stderr
}

/// The joined Machines of the scenario (every config of it references template `inplace`).
async fn joined_count(env: &CapiEnv) -> usize {
    let machines = env.capi("Machine", "machines");
    let list = machines.list(&ListParams::default()).await.unwrap().items;
    let joined = list
        .iter()
        .filter(|m| m.data["status"]["nodeRef"]["name"].is_string());
    joined.count()
}

/// (h) Warnings at admission, with nothing written: see the module doc.
async fn admission_warnings(env: &CapiEnv) {
    let resource = objects::bootplate_resource("BootstrapTemplate", "bootstraptemplates");
    let templates = env.dynamic(&resource);
    let version = |t: DynamicObject| t.metadata.resource_version.unwrap();
    let written = version(templates.get("inplace").await.unwrap());
    let mut configure = template();
    configure["spec"]["parts"][1]["commands"] = json!(["true"]);
    let mut install = template();
    install["spec"]["parts"][0]["commands"][0] = json!("echo install runtime v2");
    // Cluster API may still be settling the last update: the counts are compared to the
    // Machines as they are at each try.
    wait_for(env, "the dry runs' warnings to count the joined machines", || async {
        let joined = joined_count(env).await;
        let in_place = dry_run_warnings(env, &configure);
        let replaced = dry_run_warnings(env, &install);
        let outdated = format!("Warning: {joined} running machine(s) become outdated");
        let told = in_place.contains(&outdated)
            && in_place.contains(&format!(
                "{joined} of them can take it in place when Cluster API updates them in place (parts `configure`)"
            ))
            && replaced.contains(&outdated)
            && replaced.contains(&format!("{joined} of them are replaced on their next rollout"))
            && replaced.contains("part `install`");
        if !told {
            eprintln!("{joined} joined; warnings:\n{in_place}\n{replaced}");
        }
        (joined > 0 && told && joined == joined_count(env).await).then_some(())
    })
    .await;
    assert_eq!(
        version(templates.get("inplace").await.unwrap()),
        written,
        "a dry run writes nothing"
    );

    // A config template's edit: the machines Cluster API cloned from it keep their configs.
    let configs = env
        .configs()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let cloned_from = |c: &DynamicObject| {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("cluster.x-k8s.io/cloned-from-name").cloned())
    };
    let from = configs
        .iter()
        .find_map(cloned_from)
        .expect("a config cloned from a config template");
    let count = configs
        .iter()
        .filter(|c| cloned_from(c).as_ref() == Some(&from))
        .count();
    let edited = config_template(&from, json!({"mirror": "https://mirror-z.example"}));
    let warnings = dry_run_warnings(env, &edited);
    assert!(
        warnings.contains(&format!(
            "Warning: {count} machine(s) created from this config template keep their configs"
        )),
        "{from}: {warnings}"
    );
}

/// A config template of the policy case: [`config_template`] with `updatePolicy: InPlaceOnly`.
fn held_config_template(name: &str, variables: Value) -> Value {
    let mut template = config_template(name, variables);
    template["spec"]["updatePolicy"] = json!("InPlaceOnly");
    template
}

/// How often CanUpdateMachineSet answered `answer`.
fn set_answers(env: &CapiEnv, answer: &str) -> f64 {
    let key = ("can_update_machine_set".to_owned(), answer.to_owned());
    hook_answers(env).get(&key).copied().unwrap_or(0.0)
}

/// (g), the config template's policy, on MachineDeployment `p`.
async fn in_place_only_config_template(env: &CapiEnv) {
    let v1 = json!({"mirror": "https://mirror-a.example"});
    apply(env, &config_templates(), held_config_template("p-v1", v1)).await;
    apply(
        env,
        &objects::machine_deployment_resource(),
        machine_deployment("p", "ip", 1, "p-v1"),
    )
    .await;
    let before = wait_joined(env, "p", 1).await;
    let (_agents, disks) = start_agents(env, &before).await;

    let refused = set_answers(env, "refused");
    let new_runtime = json!({"mirror": "https://mirror-a.example", "runtime": "2.1"});
    apply(
        env,
        &config_templates(),
        held_config_template("p-v2", new_runtime),
    )
    .await;
    assert_switch_told(
        env,
        "p",
        "p-v2",
        &[
            "bootplate refuses this rollout: BootplateConfigTemplate fleet/p-v1 has updatePolicy InPlaceOnly",
        ],
    );
    switch_template(env, "p", "p-v2").await;
    wait_for(
        env,
        "CanUpdateMachineSet to refuse p's move to p-v2",
        || async { (set_answers(env, "refused") > refused).then_some(()) },
    )
    .await;
    // Cluster API asks again meanwhile; none of its answers may lead to a replacement.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        uids(&machines(env, "p").await),
        uids(&before),
        "no Machine of p is replaced"
    );
    let log = env.bootplate.log();
    assert!(
        log.lines()
            .any(|l| l.contains("refused: BootplateConfigTemplate")
                && l.contains("has updatePolicy InPlaceOnly")
                && l.contains("part `install`")),
        "bootplate logs the refusal naming the policy's holder and the part"
    );

    let new_mirror = json!({"mirror": "https://mirror-p.example"});
    apply(
        env,
        &config_templates(),
        held_config_template("p-v3", new_mirror),
    )
    .await;
    switch_template(env, "p", "p-v3").await;
    let (name, _) = before.iter().next().unwrap();
    let mirror_file = disks[name].path(MIRROR_FILE);
    wait_for(env, "p's machine to take p-v3 in place", || async {
        let mirror = std::fs::read_to_string(&mirror_file).ok()?;
        let same = uids(&machines(env, "p").await) == uids(&before);
        (mirror.contains("mirror-p.example") && same).then_some(())
    })
    .await;
}

/// (g), the template's policy: `inplace` with `updatePolicy: InPlaceOnly` and running machines.
async fn in_place_only_template(env: &CapiEnv) {
    let resource = objects::bootplate_resource("BootstrapTemplate", "bootstraptemplates");
    let mut held = template();
    held["spec"]["updatePolicy"] = json!("InPlaceOnly");
    env.apply(&resource, held.clone())
        .await
        .expect("setting the policy alone is admitted");
    let mut install = held.clone();
    install["spec"]["parts"][0]["commands"][0] = json!("echo install runtime v2");
    let refused = env
        .apply(&resource, install)
        .await
        .expect_err("a change of a Rollout part is refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains("updatePolicy is InPlaceOnly")
            && message.contains("running machine(s) (BootplateConfig fleet/")
            && message.contains("part `install` changed"),
        "{message}"
    );
    let mut configure = held;
    configure["spec"]["parts"][1]["commands"] = json!(["true"]);
    env.apply(&resource, configure)
        .await
        .expect("a change of an InPlace part is admitted");
}

fn node_of(machine: &DynamicObject) -> String {
    machine.data["status"]["nodeRef"]["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// (d) With its node's identity, an agent reads its own payload Secret (the one bootplate
/// published and granted), not another node's, and cannot list them.
async fn only_its_own_payload(env: &CapiEnv, machines: &BTreeMap<String, DynamicObject>) {
    let nodes: Vec<String> = machines.values().map(node_of).collect();
    let client = testenv::agent::node_client(env.workload.port(), &env.cluster_ca, &nodes[0])
        .await
        .unwrap();
    let own = testenv::agent::assert_reads_only_its_own_payload(client, &nodes[0], &nodes[1]).await;
    assert!(own.data.unwrap().contains_key("payload.json"));
}

/// (e) A file changed by hand on a node is put back by its agent (interval 1 s here).
async fn drift_is_put_back(
    machines: &BTreeMap<String, DynamicObject>,
    disks: &BTreeMap<String, NodeDisk>,
) {
    let name = machines.keys().next().unwrap();
    let file = disks[name].path(MIRROR_FILE);
    let original = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, "[host.\"https://edited-by-hand.example\"]\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&file).unwrap() != original {
        assert!(
            Instant::now() < deadline,
            "the agent did not put {MIRROR_FILE} back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    disks[name].take_systemctl_calls();
}

/// (a) Only the `InPlace` part changes: the Machines stay, the nodes apply it.
async fn in_place_update(
    env: &CapiEnv,
    before: &BTreeMap<String, DynamicObject>,
    disks: &BTreeMap<String, NodeDisk>,
    secret_versions: &BTreeMap<String, String>,
) {
    let v1 = config_template("a-v1", json!({"mirror": "https://mirror-a.example"}));
    let v2 = config_template("a-v2", json!({"mirror": "https://mirror-b.example"}));
    let preview = previewed(&v1, &v2);
    assert_eq!(preview["verdict"], "in-place", "{preview}");
    assert_eq!(preview["inPlaceParts"], json!(["configure"]), "{preview}");
    assert_eq!(
        preview["agent"]["restart"],
        json!(["containerd.service"]),
        "{preview}"
    );
    apply(env, &config_templates(), v2).await;
    let old_sets: BTreeSet<String> = before.values().map(machine_set_of).collect();
    assert_switch_told(
        env,
        "a",
        "a-v2",
        &[
            "Warning: 2 joined machine(s) of this MachineDeployment roll out to BootplateConfigTemplate a-v2",
            "they can take it in place (parts `configure`)",
        ],
    );
    switch_template(env, "a", "a-v2").await;
    let after = wait_for(
        env,
        "the in-place update of MachineDeployment a",
        || async {
            let found = machines(env, "a").await;
            if found.len() != 2
                || found.values().any(|m| {
                    m.metadata.annotations.as_ref().is_some_and(|a| {
                        a.contains_key(
                            "in-place-updates.internal.cluster.x-k8s.io/update-in-progress",
                        )
                    })
                })
            {
                return None;
            }
            for machine in found.values() {
                let config = config(env, &config_name(machine)).await;
                let updated = condition(&config, "InPlaceUpdating")
                    .is_some_and(|c| c["status"] == "False" && c["reason"] == "InPlaceUpdated");
                let mirror = config.data["spec"]["variables"]["mirror"].as_str();
                if !updated || mirror != Some("https://mirror-b.example") {
                    return None;
                }
            }
            Some(found)
        },
    )
    .await;
    assert_eq!(
        uids(&after),
        uids(before),
        "the Machines were updated in place, not replaced"
    );
    let new_set = machine_set_using(env, "a", "a-v2").await;
    assert!(
        !old_sets.contains(&new_set),
        "{new_set} is a MachineSet of a-v2, not one of before: {old_sets:?}"
    );
    for (name, machine) in &after {
        let disk = &disks[name];
        let mirror = std::fs::read_to_string(disk.path(MIRROR_FILE)).unwrap();
        assert_eq!(
            mirror,
            "[host.\"https://mirror-b.example\"]\n  capabilities = [\"pull\"]\n"
        );
        let history = std::fs::read_to_string(disk.path("/var/log/mirror-history")).unwrap();
        assert_eq!(
            history, "https://mirror-b.example\n",
            "the agent ran the new revision's command once (the boot's run was cloud-init's)"
        );
        assert_eq!(
            disk.take_systemctl_calls(),
            [
                "daemon-reload",
                "enable containerd.service",
                "restart containerd.service"
            ],
            "only the changed unit is enabled and restarted; node-exporter, which the boot \
             enabled and this update leaves alone, is not touched"
        );
        let config_name = config_name(machine);
        let config = config(env, &config_name).await;
        let status = &config.data["status"]["inPlace"];
        assert_eq!(status["appliedRevision"], status["publishedRevision"]);
        assert_eq!(
            data_secret_version(env, &config_name).await,
            secret_versions[&config_name],
            "the data Secret is not rewritten for an in-place update"
        );
        assert_eq!(
            machine_set_of(machine),
            new_set,
            "{name} moved to the new MachineSet"
        );
    }
}

/// The MachineSet that controls `machine`.
fn machine_set_of(machine: &DynamicObject) -> String {
    let owners = machine.metadata.owner_references.iter().flatten();
    owners
        .filter(|o| o.kind == "MachineSet" && o.controller == Some(true))
        .map(|o| o.name.clone())
        .next()
        .unwrap_or_else(|| panic!("a Machine without its MachineSet: {:?}", machine.metadata))
}

/// The one MachineSet of MachineDeployment `md` whose Machines bootstrap from
/// BootplateConfigTemplate `template`.
async fn machine_set_using(env: &CapiEnv, md: &str, template: &str) -> String {
    let sets = machine_set_objects(env, md).await;
    let using: Vec<String> = (sets.iter())
        .filter(|s| {
            s.data["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"] == template
        })
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        using.len(),
        1,
        "the MachineSets of {md} using {template}: {using:?}"
    );
    using.into_iter().next().unwrap()
}

/// (c) The new payload's command fails on the node.
async fn failed_step(
    env: &CapiEnv,
    failing: &BTreeMap<String, DynamicObject>,
    disks: &BTreeMap<String, NodeDisk>,
) {
    let v2 = config_template(
        "c-v2",
        json!({"mirror": "https://mirror-c.example", "failStep": true}),
    );
    let v1 = config_template("c-v1", json!({"mirror": "https://mirror-a.example"}));
    let preview = previewed(&v1, &v2);
    assert_eq!(preview["verdict"], "in-place", "{preview}");
    assert_eq!(preview["inPlaceParts"], json!(["configure"]), "{preview}");
    apply(env, &config_templates(), v2).await;
    switch_template(env, "c", "c-v2").await;
    let (name, machine) = failing.iter().next().unwrap();
    let config_name = config_name(machine);
    let message = wait_for(
        env,
        "the failed in-place update of MachineDeployment c",
        || async {
            let config = config(env, &config_name).await;
            let c = condition(&config, "InPlaceUpdating")?;
            (c["reason"] == "InPlaceUpdateFailed")
                .then(|| c["message"].as_str().unwrap().to_owned())
        },
    )
    .await;
    assert!(
        message.contains("part `configure`") && message.contains("command 0"),
        "{message}"
    );
    assert!(
        !message.contains("mirror-c"),
        "the condition names the step, not its content: {message}"
    );
    let machine_failed = wait_for(
        env,
        "Cluster API to report the Machine's update failed",
        || async {
            let m = env.capi("Machine", "machines").get(name).await.ok()?;
            let updating = condition(&m, "Updating")?;
            (updating["reason"] == "InPlaceUpdateFailed").then(|| updating.clone())
        },
    )
    .await;
    assert_eq!(machine_failed["status"], "True", "{machine_failed}");
    let disk = &disks[name];
    let mirror = std::fs::read_to_string(disk.path(MIRROR_FILE)).unwrap();
    assert!(
        mirror == "[host.\"https://mirror-c.example\"]\n  capabilities = [\"pull\"]\n"
            || mirror == "[host.\"https://mirror-a.example\"]\n  capabilities = [\"pull\"]\n",
        "a whole file, never a torn one: {mirror:?}"
    );
    let dir = disk.path("/etc/containerd/certs.d/docker.io");
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        [std::ffi::OsString::from("hosts.toml")],
        "no temporary file is left"
    );
    let events = env.client.clone();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(events, NS);
    let found = events.list(&ListParams::default()).await.unwrap();
    assert!(
        found
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("InPlaceUpdateFailed")
                && e.involved_object.name.as_deref() == Some(&config_name)),
        "a Warning Event tells about the failure"
    );
}

/// (b) A change to the `Rollout` part: Cluster API replaces the Machines.
async fn rollout(env: &CapiEnv, before: &BTreeMap<String, DynamicObject>) {
    let v2 = config_template("a-v2", json!({"mirror": "https://mirror-b.example"}));
    let v3 = config_template(
        "a-v3",
        json!({"mirror": "https://mirror-b.example", "runtime": "2.1"}),
    );
    let preview = previewed(&v2, &v3);
    assert_eq!(preview["verdict"], "replacement", "{preview}");
    let reason = preview["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("part `install` changed"), "{preview}");
    apply(env, &config_templates(), v3).await;
    let answers_before = hook_answers(env);
    assert_switch_told(
        env,
        "a",
        "a-v3",
        &["they are replaced: part `install` changed"],
    );
    switch_template(env, "a", "a-v3").await;
    let after = wait_replaced(env, "a", before, 2).await;
    for machine in after.values() {
        let config = config(env, &config_name(machine)).await;
        assert_eq!(config.data["spec"]["variables"]["runtime"], "2.1");
        let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
        let secret = secrets.get(&config_name(machine)).await.unwrap();
        let user_data = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
        assert!(
            user_data.contains("echo install runtime '2.1'"),
            "{user_data}"
        );
    }
    assert_rollout_answered(env, &answers_before);
}

/// bootplate's extension was asked and answered `rollout` because part `install` changed, and
/// no hook call failed: the replacement is the hook's verdict, not what Cluster API does when
/// the hook errs or is never called.
fn assert_rollout_answered(env: &CapiEnv, before: &BTreeMap<(String, String), f64>) {
    let after = hook_answers(env);
    let grew = |hook: &str, answer: &str| {
        let key = (hook.to_owned(), answer.to_owned());
        after.get(&key).copied().unwrap_or(0.0) - before.get(&key).copied().unwrap_or(0.0)
    };
    assert!(
        grew("can_update_machine_set", "rollout") >= 1.0,
        "CanUpdateMachineSet answered rollout: before {before:?}, after {after:?}"
    );
    assert_eq!(
        grew("can_update_machine_set", "in_place"),
        0.0,
        "no in-place answer for a change of a Rollout part: {after:?}"
    );
    let errors: Vec<_> = (after.iter())
        .filter(|((_, answer), count)| answer == "error" && **count > 0.0)
        .collect();
    assert!(errors.is_empty(), "hook calls failed: {errors:?}");
    let log = env.bootplate.log();
    let verdict = log.lines().find(|l| {
        l.contains("CanUpdateMachineSet") && l.contains("rollout") && l.contains("part `install`")
    });
    assert!(
        verdict.is_some(),
        "bootplate logs its verdict naming the part that needs new machines"
    );
}

/// `bootplate_extension_requests_total` by (hook, answer). Panics when bootplate's metrics cannot
/// be read: an unreadable metric must not pass for a zero.
fn hook_answers(env: &CapiEnv) -> BTreeMap<(String, String), f64> {
    let metrics = env.bootplate.metrics().expect("bootplate's metrics");
    let mut answers = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("bootplate_extension_requests_total{") else {
            continue;
        };
        let (labels, value) = rest.split_once("} ").expect("a metric line");
        let label = |name: &str| {
            (labels.split(','))
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .expect("the extension's labels")
        };
        let count: f64 = value.trim().parse().expect("a counter");
        answers.insert((label("hook"), label("answer")), count);
    }
    answers
}

/// The Cluster of case (i), at a Kubernetes version the kubeadm templates know.
const SHIPPED_CLUSTER: &str = "st";
/// The proxy of each revision of case (i) (the third keeps the second's).
const PROXY_BEFORE: &str = "http://proxy-a.example:3128";
const PROXY_AFTER: &str = "http://proxy-b.example:3128";

/// A shipped template that case (i) moves machines of through its revisions.
struct Shipped {
    /// Its file under the workspace (for [`CapiEnv::publish_shipped_template`]).
    file: String,
    /// Its name (a ClusterBootstrapTemplate).
    name: String,
    /// Its text, as `bootplate diff` reads it.
    text: String,
    /// A `kubeadm-*` template joins a cluster (the cloud checks its join); others do not.
    joins: bool,
    /// It has an `update: InPlace` part: the network input's change is taken in place.
    in_place: bool,
}

impl Shipped {
    fn machine_deployment(&self) -> String {
        format!("st-{}", self.name)
    }

    /// Revision `n` (1 to 3) of its config template: see the module doc.
    fn revision(&self, n: u32) -> Value {
        let name = format!("{}-v{n}", self.name);
        let mut revision = objects::bootplate_config_template(&name, &self.name);
        let spec = &mut revision["spec"]["template"]["spec"];
        let proxy = if n == 1 { PROXY_BEFORE } else { PROXY_AFTER };
        spec["network"] = json!({"proxy": {"http": proxy}});
        if n == 3 {
            spec["postCommands"] = json!(["echo revision 3"]);
        }
        revision
    }

    /// The verdict the move to revision `n` must get: in place for the network input's
    /// change when the template has an `InPlace` part, a replacement otherwise.
    fn expected(&self, n: u32) -> &'static str {
        if n == 2 && self.in_place {
            "in-place"
        } else {
            "replacement"
        }
    }
}

/// Every shipped template.
fn shipped_templates() -> Vec<Shipped> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(workspace.join("templates")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let document: Value = serde_yaml::from_str(&text).unwrap();
        let parts = document["spec"]["parts"].as_array().cloned();
        let in_place = parts
            .into_iter()
            .flatten()
            .any(|p| p["update"] == "InPlace");
        let name = document["metadata"]["name"].as_str().unwrap().to_owned();
        let stem = path.file_stem().unwrap().to_string_lossy();
        assert_eq!(stem, name, "a shipped template's file is named after it");
        let file = path.strip_prefix(&workspace).unwrap();
        found.push(Shipped {
            file: file.to_string_lossy().into_owned(),
            joins: name.starts_with("kubeadm-"),
            name,
            text,
            in_place,
        });
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// A machine of case (i): its Machine by name, and for a template with an `InPlace` part the
/// node root its agent applies into.
struct ShippedMachine {
    machines: BTreeMap<String, DynamicObject>,
    node: Option<ChrootNode>,
}

/// (i) Every shipped template's diff verdicts, as Cluster API and bootplate then act on them.
async fn every_shipped_template(env: &CapiEnv) {
    let shipped = shipped_templates();
    let with_in_place = shipped.iter().filter(|t| t.in_place).count();
    assert!(
        shipped.len() >= 10 && with_in_place >= 8,
        "the shipped templates, most with InPlace parts"
    );
    let version = objects::KUBERNETES_VERSION;
    let control_plane = objects::dev_control_plane(SHIPPED_CLUSTER, version);
    apply(env, &objects::dev_control_plane_resource(), control_plane).await;
    let dev_cluster = objects::dev_cluster(SHIPPED_CLUSTER);
    apply(env, &objects::dev_cluster_resource(), dev_cluster).await;
    let cluster = objects::cluster(SHIPPED_CLUSTER, Some(SHIPPED_CLUSTER), false);
    apply(env, &objects::cluster_resource(), cluster).await;
    for t in &shipped {
        env.publish_shipped_template(&t.file).await.unwrap();
        for n in 1..=3 {
            apply(env, &config_templates(), t.revision(n)).await;
        }
        let mut md = objects::machine_deployment(
            &t.machine_deployment(),
            SHIPPED_CLUSTER,
            1,
            &format!("{}-v1", t.name),
            "inplace",
            version,
        );
        without_surge(&mut md);
        if !t.joins {
            plain_machines(&mut md);
        }
        apply(env, &objects::machine_deployment_resource(), md).await;
    }
    let mut running = Vec::new();
    let mut agents = Vec::new();
    for t in &shipped {
        let md = t.machine_deployment();
        if !t.in_place {
            let machines = wait_nodes(env, &md).await;
            running.push(ShippedMachine {
                machines,
                node: None,
            });
            continue;
        }
        let machines = wait_joined(env, &md, 1).await;
        let node = booted_network(t);
        let machine = machines.values().next().unwrap();
        let agent = AgentProcess::start(
            env.management.dir(),
            env.workload.port(),
            &env.cluster_ca,
            &node_of(machine),
            &node.agent(),
            "2s",
        );
        agents.push(agent.unwrap());
        running.push(ShippedMachine {
            machines,
            node: Some(node),
        });
    }
    for n in [2, 3] {
        shipped_move(env, &shipped, &mut running, n).await;
    }
}

/// Waits until MachineDeployment `md` has one Machine with a Node; returns it by name.
async fn wait_nodes(env: &CapiEnv, md: &str) -> BTreeMap<String, DynamicObject> {
    wait_for(env, &format!("a Machine of {md} with a Node"), || async {
        let found = machines(env, md).await;
        let noded = found.len() == 1
            && found
                .values()
                .all(|m| !m.data["status"]["nodeRef"].is_null());
        noded.then_some(found)
    })
    .await
}

/// (i), the move of every shipped template's MachineDeployment to revision `n`: previewed by
/// `bootplate diff`, then taken as previewed.
async fn shipped_move(env: &CapiEnv, shipped: &[Shipped], running: &mut [ShippedMachine], n: u32) {
    let mut previews = Vec::new();
    for t in shipped {
        let preview = previewed_with(&t.text, &t.revision(n - 1), &t.revision(n));
        assert_eq!(
            preview["verdict"],
            t.expected(n),
            "{} v{n}: {preview}",
            t.name
        );
        if preview["verdict"] == "in-place" {
            assert_eq!(preview["inPlaceParts"], json!(["network"]), "{}", t.name);
        }
        let sets = machine_sets(env, &t.machine_deployment()).await;
        previews.push((preview, sets));
        switch_template(env, &t.machine_deployment(), &format!("{}-v{n}", t.name)).await;
    }
    for ((t, machine), (preview, sets)) in shipped.iter().zip(running).zip(previews) {
        if preview["verdict"] == "in-place" {
            taken_in_place(env, t, machine).await;
        } else {
            let reason = preview["reason"].as_str().unwrap();
            machine.machines = replaced(env, t, &machine.machines, sets, reason).await;
        }
    }
}

/// The network input's change taken in place: the Machine kept, its config updated, and the
/// node's `/etc` holding the new proxy and not the boot's.
async fn taken_in_place(env: &CapiEnv, t: &Shipped, machine: &ShippedMachine) {
    let md = t.machine_deployment();
    wait_for(
        env,
        &format!("{md} to take {}-v2 in place", t.name),
        || async {
            let found = machines(env, &md).await;
            let machine = found.values().next()?;
            let config = config(env, &config_name(machine)).await;
            let updated = condition(&config, "InPlaceUpdating")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "InPlaceUpdated");
            let proxy = &config.data["spec"]["network"]["proxy"]["http"];
            (updated && proxy == PROXY_AFTER).then_some(())
        },
    )
    .await;
    assert_eq!(
        uids(&machines(env, &md).await),
        uids(&machine.machines),
        "{md}: updated in place, not replaced"
    );
    let node = machine
        .node
        .as_ref()
        .expect("a node root for a template with InPlace parts");
    let (after, before) = (
        etc_holding(node, PROXY_AFTER),
        etc_holding(node, PROXY_BEFORE),
    );
    assert!(
        !after.is_empty() && before.is_empty(),
        "{}: the agent ran part network's new commands on the node, which replaced the \
         boot's proxy: files with the new proxy {after:?}, with the old {before:?}",
        t.name
    );
}

/// A node root where the boot ran part `network` of `t`'s first revision, as cloud-init runs
/// it (chrooted into the root); its `/etc` then holds the first proxy. The test cloud boots no
/// user-data here, so this plays that part of the boot.
fn booted_network(t: &Shipped) -> ChrootNode {
    let node = ChrootNode::new(&[]).unwrap();
    let network = t.revision(1)["spec"]["template"]["spec"]["network"].clone();
    let parts = testenv::mirror::render_parts_of(&t.name, network).unwrap();
    let part = testenv::mirror::part(&parts, "network").unwrap();
    for command in &part.commands {
        let out = node.run(command).unwrap();
        assert!(
            out.status.success(),
            "{}: the boot's part network: {}",
            t.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        !etc_holding(&node, PROXY_BEFORE).is_empty(),
        "{}: the boot wrote the proxy",
        t.name
    );
    node
}

/// The files under `node`'s `/etc` whose content holds `text` (links not followed).
fn etc_holding(node: &ChrootNode, text: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![node.disk.path("/etc")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten() {
            let path = entry.unwrap().path();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file()
                && std::fs::read(&path).is_ok_and(|b| String::from_utf8_lossy(&b).contains(text))
            {
                found.push(path);
            }
        }
    }
    found
}

/// A move previewed as a replacement: Cluster API replaces the Machine (`before`) because
/// bootplate's hook answered `rollout` for one of the MachineDeployment's MachineSets (`sets`
/// from before the move, and those after it) with `reason`, what diff gave. Returns the new
/// Machine.
async fn replaced(
    env: &CapiEnv,
    t: &Shipped,
    before: &BTreeMap<String, DynamicObject>,
    mut sets: BTreeSet<String>,
    reason: &str,
) -> BTreeMap<String, DynamicObject> {
    let md = t.machine_deployment();
    let after = wait_replaced(env, &md, before, 1).await;
    sets.extend(machine_sets(env, &md).await);
    let log = env.bootplate.log();
    assert!(
        !log.contains('\u{1b}'),
        "bootplate's text log to a file carries terminal escape sequences"
    );
    let answered = log.lines().any(|l| {
        let of_md = (l.split_whitespace())
            .filter_map(|w| w.strip_prefix("machine_set="))
            .any(|set| sets.contains(set.trim_matches('"')));
        of_md && l.contains("CanUpdateMachineSet") && l.contains("rollout") && l.contains(reason)
    });
    assert!(
        answered,
        "{md}: bootplate's hook answered rollout for a MachineSet of it ({sets:?}) because {reason}"
    );
    after
}

/// Waits until MachineDeployment `md` has `count` Machines with a Node, none of them one of
/// `before`; returns them.
async fn wait_replaced(
    env: &CapiEnv,
    md: &str,
    before: &BTreeMap<String, DynamicObject>,
    count: usize,
) -> BTreeMap<String, DynamicObject> {
    let old = uids(before);
    wait_for(
        env,
        &format!("the rollout of MachineDeployment {md}"),
        || async {
            let found = machines(env, md).await;
            let replaced = found.len() == count
                && found.values().all(|m| {
                    !old.values().any(|u| Some(u) == m.metadata.uid.as_ref())
                        && !m.data["status"]["nodeRef"].is_null()
                });
            replaced.then_some(found)
        },
    )
    .await
}

/// The names of MachineDeployment `md`'s MachineSets.
async fn machine_sets(env: &CapiEnv, md: &str) -> BTreeSet<String> {
    (machine_set_objects(env, md).await.into_iter())
        .filter_map(|s| s.metadata.name)
        .collect()
}

/// MachineDeployment `md`'s MachineSets.
async fn machine_set_objects(env: &CapiEnv, md: &str) -> Vec<DynamicObject> {
    let params = ListParams::default().labels(&format!("cluster.x-k8s.io/deployment-name={md}"));
    let sets = env.capi("MachineSet", "machinesets").list(&params).await;
    sets.unwrap().items
}
