//! Real VMs: a rendered user-data boots a Debian machine under qemu (TCG) from a NoCloud seed
//! disk, with the image's own kernel, systemd and cloud-init, and what it did is read from the
//! disk afterwards (tests/vm/: build-image.sh builds and caches the images, boot.sh boots one).
//! Unlike the boot proof, nothing is a stand-in: systemd runs the units the user-data enables,
//! `hostnamectl`, `useradd`, kubeadm and the kubelet are the machine's own. Three boots:
//! plain-linux on the plain image; kubeadm-debian-12 on the pre-baked one for a Machine under
//! Cluster API's own manager, booted from the data Secret the controller wrote, with the token
//! the controller created, joining a real control plane; and beside it a Machine whose join
//! command fails, whose boot report reaches bootplate (docs/boot-channel.md). The offline render
//! (`bootplate render --token`) joins for real in tests/tests/joins.rs; its boot in a VM repeated
//! this one's (same template, image and join) and took four to six minutes of a core.
//! Needs root and tests/scripts/install-tools.sh's qemu, cloud-localds and debugfs.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use testenv::joins;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cached image (tests/vm/build-image.sh builds it on first use), `args` choosing it.
fn image(args: &[&OsStr]) -> PathBuf {
    let out = Command::new(repo().join("tests/vm/build-image.sh"))
        .args(args)
        .output()
        .expect("running tests/vm/build-image.sh");
    assert!(
        out.status.success(),
        "tests/vm/build-image.sh (needs root and tests/scripts/install-tools.sh's tools):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Where VM boots keep their disks and consoles: under the target directory, for the
/// post-mortem (each boot replaces its own directory).
fn runs_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("vm")
}

/// Held while a machine boots: the tier's machines boot one at a time. Emulated (TCG), a boot is
/// CPU-bound, and the machine's own time limits are tight (kubeadm's CRI check gives containerd
/// seconds to answer): two boots sharing a core beside the other tiers took over 600 s and
/// failed that check, one boot at a time on a core of its own takes one to three minutes.
static ONE_BOOT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Boots `user_data` (tests/vm/boot.sh) as the machine `hostname`, the guest reaching the
/// host's loopback at 10.0.2.2 when `reach_host`; the run's directory.
fn boot(image: &Path, user_data: &[u8], hostname: &str, reach_host: bool) -> PathBuf {
    // A boot that failed an assertion below poisons the lock; the next boot still runs.
    let _one = ONE_BOOT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = runs_dir().join(hostname);
    std::fs::create_dir_all(runs_dir()).unwrap();
    let input = runs_dir().join(format!("{hostname}.user-data"));
    std::fs::write(&input, user_data).unwrap();
    let out = Command::new(repo().join("tests/vm/boot.sh"))
        .arg("--image")
        .arg(image)
        .arg("--user-data")
        .arg(&input)
        .arg("--out")
        .arg(&dir)
        .args(["--hostname", hostname])
        .args(reach_host.then_some("--reach-host"))
        .env("BOOTPLATE_VM_MEMORY", "2048")
        .output()
        .expect("running tests/vm/boot.sh");
    assert!(
        out.status.success(),
        "the VM boot of {hostname} (console: {}/console.log):\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// `bootplate render` of `template` (under templates/) for the Machine, Cluster and config
/// files, with `args` (role, token, CA); the user-data.
fn render(
    template: &str,
    machine: &Path,
    cluster: &Path,
    config: &Path,
    args: &[&OsStr],
) -> Vec<u8> {
    let template = repo().join("templates").join(template);
    testenv::controller::render(&template, machine, cluster, config, args)
}

/// The pre-baked image (tests/vm/build-image.sh --prebaked) with the built kubeadm and kubelet.
fn prebaked_image() -> PathBuf {
    let kube = runs_dir().join("kube-bin");
    std::fs::create_dir_all(&kube).unwrap();
    for name in ["kubeadm", "kubelet"] {
        let _ = std::fs::remove_file(kube.join(name));
        std::os::unix::fs::symlink(testenv::tools::path(name).unwrap(), kube.join(name)).unwrap();
    }
    image(&["--prebaked".as_ref(), kube.as_os_str()])
}

/// A file of the powered-off machine's disk (`debugfs -R cat`), or None when it is not there.
fn read_disk(disk: &Path, path: &str) -> Option<String> {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("cat {path}"))
        .arg(disk)
        .output()
        .expect("running debugfs (e2fsprogs)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "debugfs cat {path}: {stderr}");
    (!stderr.contains("File not found")).then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// plain-linux, rendered for a worker Machine, boots to "cloud-init finished": its script set
/// the host name to the Machine's name, made the user with sudo and SSH keys and the service
/// the variables ask for (enabled in systemd's tree, and running when cloud-init was done),
/// cloud-init recorded no error, and the Cluster API sentinel was written (copied from /run by
/// the image before it powered off).
#[test]
fn plain_linux_boots_in_a_vm() {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("config.yaml");
    std::fs::write(
        &config,
        r#"apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootplateConfig
metadata: {name: proof-worker-v1-31-2, namespace: boot-proof}
spec:
  templateRef: {kind: ClusterBootstrapTemplate, name: plain-linux}
  variables:
    users:
      - name: alice
        sudo: true
        sshAuthorizedKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIVmAliceKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA alice@vm"]
    serviceName: vm-web
    serviceCommand: [/usr/bin/python3, -m, http.server, "8080"]
    serviceUser: www-vm
"#,
    )
    .unwrap();
    let fixtures = repo().join("tests/boot/fixtures");
    let user_data = render(
        "plain-linux.yaml",
        &fixtures.join("machine-worker-v1.31.2.yaml"),
        &fixtures.join("cluster.yaml"),
        &config,
        &[],
    );

    // The seed's local-hostname differs from the Machine's name: the script must set it.
    let dir = boot(&image(&[]), &user_data, "vm-plain", false);
    let disk = dir.join("disk.raw");
    let read = |path: &str| read_disk(&disk, path).unwrap_or_else(|| panic!("{path} is missing"));

    let result: serde_json::Value =
        serde_json::from_str(&read("/var/lib/cloud/data/result.json")).unwrap();
    assert_eq!(result["v1"]["errors"], serde_json::json!([]), "{result}");
    assert_eq!(
        read("/var/lib/bootplate-vm/run/cluster-api/bootstrap-success.complete"),
        "success\n"
    );
    assert_eq!(read("/etc/hostname").trim(), "proof-worker-v1-31-2");
    assert!(read("/etc/passwd").contains("\nalice:"));
    assert!(
        read("/home/alice/.ssh/authorized_keys").contains("AAAAIVmAliceKey"),
        "alice's key"
    );
    assert_eq!(
        read("/etc/sudoers.d/90-bootplate-alice"),
        "alice ALL=(ALL) NOPASSWD:ALL\n"
    );
    assert!(read("/etc/passwd").contains("\nwww-vm:"));
    let unit = read("/etc/systemd/system/vm-web.service");
    assert!(unit.contains("User=www-vm"), "{unit}");
    assert!(
        read_disk(
            &disk,
            "/etc/systemd/system/multi-user.target.wants/vm-web.service"
        )
        .is_some(),
        "vm-web.service is not enabled"
    );
    // Started, and still running when cloud-init was done: its command ran as the unit says.
    let running = read("/var/lib/bootplate-vm/running-services");
    assert!(
        running
            .lines()
            .any(|l| l.split_whitespace().next() == Some("vm-web.service")),
        "vm-web.service is not running:\n{running}"
    );
}

/// The user-data Cluster API hands a machine, booted: kubeadm-debian-12 on the pre-baked image
/// for a worker Machine under Cluster API's own manager (the real-joins environment of the
/// Cluster API tier's scenario i), its user-data read from the data Secret bootplate wrote for
/// the Machine, with the token bootplate created in the workload cluster; nothing is rendered
/// or minted by the test. The Cluster's endpoint is the workload apiserver as the guest reaches
/// it (10.0.2.2: qemu's user-mode networking gives the guest the host's loopback there, so the
/// cluster's signed `cluster-info` says 10.0.2.2 too). The VM's kubeadm joins with that token (its
/// CSR comes from `system:bootstrap:<the token's id>`), the kubelet registers the Node under
/// the Machine's name, Cluster API sets the Machine's nodeRef, and bootplate deletes the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_under_cluster_api_boots_its_data_secret_in_a_vm_and_joins() {
    use testenv::capi::{CapiEnv, Options};

    const CLUSTER: &str = "vm-capi";
    const MACHINE: &str = "vm-capi-worker-0";
    let wait = std::time::Duration::from_secs(300);
    let env = CapiEnv::start(Options {
        real_joins: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let port = env.workload.port();
    guest_reaches_cluster_info(&env.workload_client, port).await;
    let version = joins::kube_version().unwrap();
    worker_for_the_guest(&env, (CLUSTER, MACHINE), &version, port).await;

    // What Cluster API hands the machine: the data Secret its Machine names.
    let user_data = data_secret_of(&env, MACHINE).await;
    let token_id = the_controllers_token(&env, MACHINE).await;
    let text = String::from_utf8_lossy(&user_data);
    assert!(
        text.contains(&format!("{token_id}.")) && text.contains(&format!("10.0.2.2:{port}")),
        "the user-data joins 10.0.2.2:{port} with token {token_id}"
    );

    let image = prebaked_image();
    let dir = tokio::task::spawn_blocking(move || boot(&image, &user_data, "vm-capi", true))
        .await
        .unwrap();

    let requester = format!("system:bootstrap:{token_id}");
    let approved = approved_csr_from(&env.workload_client, &requester).await;
    assert!(
        approved,
        "no approved CSR from {requester}; console: {}/console.log",
        dir.display()
    );
    let nodes: Api<Node> = Api::all(env.workload_client.clone());
    assert!(
        nodes.get_opt(MACHINE).await.unwrap().is_some(),
        "no Node {MACHINE}; console: {}/console.log",
        dir.display()
    );
    let disk = dir.join("disk.raw");
    assert_eq!(
        read_disk(
            &disk,
            "/var/lib/bootplate-vm/run/cluster-api/bootstrap-success.complete"
        )
        .as_deref(),
        Some("success\n")
    );
    assert!(
        read_disk(&disk, "/etc/kubernetes/kubelet.conf").is_some_and(|c| c.contains("10.0.2.2")),
        "the kubelet's kubeconfig names the endpoint the guest reaches"
    );
    testenv::eventually("Cluster API sets the Machine's nodeRef", wait, || async {
        let machine = env.capi("Machine", "machines").get(MACHINE).await.ok()?;
        (machine.data["status"]["nodeRef"]["name"] == json!(MACHINE)).then_some(())
    })
    .await;
    testenv::eventually("bootplate deletes the token", wait, || async {
        env.tokens().await.is_empty().then_some(())
    })
    .await;
    // The Node registers during `kubeadm join`; the token waits for the machine's last
    // report, the one with the join part's end.
    testenv::eventually("the good boot's end and durations", wait, || async {
        let config = env.configs().get(MACHINE).await.ok()?;
        let parts = reported_parts(&env, "kubeadm-debian-12");
        let ended = ["configure", "kubeadm-join"];
        let seen = ended.iter().all(|p| parts.iter().any(|q| q == p));
        (seen && config.data["status"]["boot"]["phase"] == "Booted").then_some(())
    })
    .await;
    a_failing_boot_is_reported_within_seconds(&env, CLUSTER, &version).await;
}

/// The parts of `template` that bootplate_boot_duration_seconds has an observation for.
fn reported_parts(env: &testenv::capi::CapiEnv, template: &str) -> Vec<String> {
    let metrics = env.bootplate.metrics().unwrap_or_default();
    let template = format!("template=\"ClusterBootstrapTemplate/{template}\"");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("bootplate_boot_duration_seconds_count{") && l.contains(&template)
        })
        .filter(|l| l.rsplit(' ').next().is_some_and(|n| n != "0"))
        .filter_map(|l| Some(l.split("part=\"").nth(1)?.split('"').next()?.to_owned()))
        .collect()
}

/// The boot channel in a real VM: a second worker of the same Cluster whose template's join
/// command fails (exit 7 with a message of its own). The machine's reporter sends the failure
/// with its own token; bootplate shows `Ready=False` reason `BootFailed` naming part
/// `kubeadm-join`, command 0 and the status, within 30 s of the failure the machine reported,
/// with the command's message in the Warning Event's tail.
async fn a_failing_boot_is_reported_within_seconds(
    env: &testenv::capi::CapiEnv,
    cluster: &str,
    version: &str,
) {
    use testenv::capi::{NS, objects};
    const MACHINE: &str = "vm-capi-worker-fails";
    const MESSAGE: &str = "this machine refuses to join on purpose";
    let text = std::fs::read_to_string(repo().join("templates/kubeadm-debian-12.yaml")).unwrap();
    let join = "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml";
    assert!(text.contains(join), "the shipped template runs {join}");
    let doctored = text.replace(join, &format!("echo '{MESSAGE}' >&2; exit 7"));
    let mut template: serde_json::Value = serde_yaml::from_str(&doctored).unwrap();
    template["metadata"]["name"] = json!("kubeadm-refuses-to-join");
    let templates =
        objects::bootplate_resource("ClusterBootstrapTemplate", "clusterbootstraptemplates");
    testenv::capi::cloud::apply(&env.client, &templates, None, &template)
        .await
        .unwrap();
    let mut config = objects::bootplate_config(MACHINE, "kubeadm-refuses-to-join");
    config["spec"]["skipParts"] = json!(["install"]);
    let configs = objects::bootplate_resource("BootplateConfig", "bootplateconfigs");
    env.apply(&configs, config).await.unwrap();
    env.worker_machine(MACHINE, cluster, version).await.unwrap();
    let user_data = data_secret_of(env, MACHINE).await;
    let image = prebaked_image();
    let dir = tokio::task::spawn_blocking(move || boot(&image, &user_data, "vm-capi-fails", true))
        .await
        .unwrap();

    let wait = std::time::Duration::from_secs(120);
    let ready = testenv::eventually(
        "BootFailed on the failing machine's config",
        wait,
        || async {
            let config = env.configs().get(MACHINE).await.ok()?;
            let ready = testenv::capi::condition(&config, "Ready")?;
            (ready["reason"] == "BootFailed").then(|| ready.clone())
        },
    )
    .await;
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        ready["status"] == "False"
            && message.contains("part `kubeadm-join`, command 0")
            && message.contains('7'),
        "the failed part, step and status: {ready}; console: {}/console.log",
        dir.display()
    );
    let failed_at = reported_failure_time(env, MACHINE).await;
    let shown_at: k8s_openapi::jiff::Timestamp = ready["lastTransitionTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let shown_at = shown_at.as_second();
    assert!(
        shown_at - failed_at <= 30,
        "BootFailed shown {} s after the machine's failure at {failed_at}",
        shown_at - failed_at
    );
    let parts = reported_parts(env, "kubeadm-refuses-to-join");
    assert!(
        parts == ["configure", "units"],
        "the failed boot's ended parts in bootplate_boot_duration_seconds: {parts:?}"
    );
    let event = testenv::events::wait_reason(&env.client, NS, MACHINE, "BootFailed").await;
    let note = event.note.unwrap_or_default();
    assert!(
        event.type_.as_deref() == Some("Warning") && note.contains(MESSAGE),
        "the command's message in the Event's tail: {note}"
    );
}

/// The data Secret's user-data of Machine `machine`, once Cluster API names it.
async fn data_secret_of(env: &testenv::capi::CapiEnv, machine: &str) -> Vec<u8> {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), testenv::capi::NS);
    let wait = std::time::Duration::from_secs(300);
    testenv::eventually("the Machine's data Secret", wait, || async {
        let machine = env.capi("Machine", "machines").get(machine).await.ok()?;
        let name = machine.data["spec"]["bootstrap"]["dataSecretName"].as_str()?;
        let secret = secrets.get_opt(name).await.ok()??;
        Some(secret.data?.get("value")?.0.clone())
    })
    .await
}

/// When the machine of config `name` says its boot failed: the `time` line of the failed
/// report in its ConfigMap on the workload cluster (seconds since the epoch, the VM's clock
/// being the host's).
async fn reported_failure_time(env: &testenv::capi::CapiEnv, name: &str) -> i64 {
    use kube::ResourceExt;
    let uid = env.configs().get(name).await.unwrap().uid().unwrap();
    let reports: Api<ConfigMap> = Api::namespaced(env.workload_client.clone(), "kube-system");
    let report = reports.get(&format!("bootplate-boot-{uid}")).await.unwrap();
    let text = report
        .data
        .unwrap_or_default()
        .remove("report")
        .unwrap_or_default();
    let text = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, text.trim())
        .map(|t| String::from_utf8_lossy(&t).into_owned())
        .unwrap_or(text);
    assert!(text.contains("\nstate failed\n"), "a failed report: {text}");
    text.lines()
        .find_map(|l| l.strip_prefix("time ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no time in the report: {text}"))
}

/// kubeadm-debian-12 published, a Cluster under the stand-in provider whose endpoint is the
/// workload apiserver as the guest reaches it (10.0.2.2:`port`), and a worker Machine of it at
/// `version` whose config skips the install part (the pre-baked image has it).
async fn worker_for_the_guest(
    env: &testenv::capi::CapiEnv,
    (cluster, machine): (&str, &str),
    version: &str,
    port: u16,
) {
    use testenv::capi::objects;
    let template: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("templates/kubeadm-debian-12.yaml")).unwrap(),
    )
    .unwrap();
    let cluster_templates =
        objects::bootplate_resource("ClusterBootstrapTemplate", "clusterbootstraptemplates");
    testenv::capi::cloud::apply(&env.client, &cluster_templates, None, &template)
        .await
        .unwrap();
    // The endpoint as the guest reaches the workload apiserver.
    env.provider_cluster(cluster, version, Some(("10.0.2.2", port)))
        .await
        .unwrap();
    let mut config = objects::bootplate_config(machine, "kubeadm-debian-12");
    config["spec"]["skipParts"] = json!(["install"]);
    // Steps that run after the Node registered (as a post-command that labels the node or
    // pulls images would): the boot's end is reported well after Cluster API sees the join.
    config["spec"]["postCommands"] = json!(["sleep 20"]);
    env.apply(
        &objects::bootplate_resource("BootplateConfig", "bootplateconfigs"),
        config,
    )
    .await
    .unwrap();
    env.worker_machine(machine, cluster, version).await.unwrap();
}

/// The id of the one bootstrap token bootplate created for config `name` in the workload
/// cluster; no other token exists there to join with.
async fn the_controllers_token(env: &testenv::capi::CapiEnv, name: &str) -> String {
    use kube::ResourceExt;
    use kube::api::ListParams;
    // The token bootplate made for this config, and only that one, is in the workload cluster.
    let config = env.configs().get(name).await.unwrap();
    let selector = format!(
        "bootstrap.bootplate.dev/config-uid={}",
        config.uid().unwrap()
    );
    let tokens: Api<Secret> = Api::namespaced(env.workload_client.clone(), "kube-system");
    let token = tokens
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items;
    assert_eq!(token.len(), 1, "one token for {name}");
    assert_eq!(env.tokens().await.len(), 1, "no other token to join with");
    String::from_utf8(token[0].data.as_ref().unwrap()["token-id"].0.clone()).unwrap()
}

/// Whether the cluster approved a CSR that `user` made (the kubelet's TLS bootstrap).
async fn approved_csr_from(client: &kube::Client, user: &str) -> bool {
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    csrs.list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|csr| {
            csr.spec.username.as_deref() == Some(user)
                && csr
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"))
        })
}

/// Points the workload cluster's `cluster-info` at 10.0.2.2:`port`, the apiserver as a qemu
/// guest reaches it: kubeadm's discovery trusts the server cluster-info names (the bootstrap
/// signer signs it again after this change).
async fn guest_reaches_cluster_info(client: &kube::Client, port: u16) {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    let info = config_maps.get("cluster-info").await.unwrap();
    let kubeconfig = info.data.as_ref().unwrap()["kubeconfig"].replace(
        &format!("https://127.0.0.1:{port}"),
        &format!("https://10.0.2.2:{port}"),
    );
    assert!(kubeconfig.contains("10.0.2.2"), "{kubeconfig}");
    config_maps
        .patch(
            "cluster-info",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"kubeconfig": kubeconfig}})),
        )
        .await
        .unwrap();
}
