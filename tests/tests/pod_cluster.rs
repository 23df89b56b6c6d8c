//! The management cluster that runs Pods (`testenv::pod_cluster`) does what the "as it ships"
//! scenarios rely on: a Pod gets an address from the CNI in the Node's pod CIDR, a ClusterIP
//! Service routes to it through kube-proxy (from another Pod and from the host), and an
//! in-cluster client reaches the apiserver through the `kubernetes` Service with its
//! service-account token, verifying the apiserver with the CA the cluster published. Two
//! clusters run side by side, and when a cluster is dropped nothing it made is left on the host.
//!
//! Nothing here is a stand-in: the Pods are real containers (runc, from OCI archives the image
//! script builds), the addresses come from the bridge and host-local CNI plugins, the routing
//! from kube-proxy's nftables rules, the token from kube-controller-manager and the kubelet.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::DynamicObject;
use testenv::capi::boot::{BootRecord, BootRole};
use testenv::capi::objects;
use testenv::eventually;
use testenv::pod_cluster::fleet::Fleet;
use testenv::pod_cluster::{PodCluster, clusterctl, host, images};
use testenv::release::Release;

const NS: &str = "probe";

/// The probe's server and client Pods and the Service in front of the server.
fn manifests(probe_image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: prober, namespace: {NS}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: {NS}, labels: {{app: web}}}}
spec:
  automountServiceAccountToken: false
  containers:
  - name: web
    image: {probe_image}
    imagePullPolicy: Never
    command: [sh, -c, 'mkdir -p /www && echo "served by $(hostname)" > /www/index.html && exec httpd -f -p 8080 -h /www']
    ports: [{{containerPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NS}}}
spec:
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080}}]
"#
    )
}

/// A client Pod that fetches the `web` Service and asks the apiserver who it is, through the
/// `kubernetes` Service (kubectl's in-cluster configuration: the Service's environment, the
/// mounted token and CA).
fn client_pod(probe_image: &str, web_ip: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {NS}}}
spec:
  serviceAccountName: prober
  restartPolicy: Never
  containers:
  - name: client
    image: {probe_image}
    imagePullPolicy: Never
    command: [sh, -c, 'wget -qO- http://{web_ip}/ && echo "apiserver via $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT" && /bin/kubectl auth whoami -o jsonpath="user={{.status.userInfo.username}}{{\"\n\"}}"']
"#
    )
}

fn apply(cluster: &PodCluster, yaml: &str) {
    let dir = cluster.dir().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("m{}.yaml", yaml.len()));
    std::fs::write(&file, yaml).unwrap();
    let out = cluster
        .kubectl(&["apply", "-f", &file.display().to_string()])
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// GET http://ip:port/path from the host, with a short timeout; the body on success.
fn http_get(ip: &str, port: u16, path: &str) -> Option<String> {
    let addr = format!("{ip}:{port}").parse().ok()?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    body.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

async fn running_pod_ip(pods: &Api<Pod>, name: &str) -> String {
    eventually(
        &format!("pod {name} running"),
        Duration::from_secs(120),
        || async {
            let pod = pods.get(name).await.ok()?;
            let status = pod.status?;
            (status.phase.as_deref() == Some("Running")).then_some(status.pod_ip?)
        },
    )
    .await
}

/// Runs the `web` Pod and Service in `cluster`; checks that the Pod's address is from the
/// Node's pod CIDR and that the ClusterIP answers from the host (routed into the node, where
/// kube-proxy's rules send it to the Pod). Returns the ClusterIP.
async fn serve_web(cluster: &PodCluster, probe: &str) -> String {
    let layout = cluster.layout();
    let client = cluster.client().await.unwrap();
    apply(cluster, &manifests(probe));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let web_ip = running_pod_ip(&pods, "web").await;
    let prefix = layout.pod_cidr.trim_end_matches("0/24");
    assert!(
        web_ip.starts_with(prefix) && web_ip != layout.pod_gateway.to_string(),
        "pod IP {web_ip} not from {}",
        layout.pod_cidr
    );
    let services: Api<Service> = Api::namespaced(client, NS);
    let service = services.get("web").await.unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();
    assert!(
        cluster_ip.starts_with(layout.service_cidr.trim_end_matches("0/24")),
        "ClusterIP {cluster_ip} not from {}",
        layout.service_cidr
    );
    let body = eventually(
        "the web Service answers from the host",
        Duration::from_secs(60),
        || {
            let ip = cluster_ip.clone();
            async move { http_get(&ip, 80, "/") }
        },
    )
    .await;
    assert_eq!(body.trim(), "served by web");
    // From the node's own network namespace, as the apiserver calls a webhook's Service.
    // (bash's /dev/tcp: the host's BusyBox wget crashes outside a container.)
    let request = format!(
        "exec 3<>/dev/tcp/{cluster_ip}/80 && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && timeout 5 cat <&3"
    );
    let from_node = host::in_netns(layout, "bash", &["-c", &request]).map_err(|e| format!("{e:#}"));
    assert!(
        from_node
            .as_ref()
            .is_ok_and(|r| r.ends_with("served by web\n")),
        "the Service from the node: {from_node:?}"
    );
    cluster_ip
}

/// From a Pod of `cluster`: the `web` Service at `cluster_ip`, then the apiserver through the
/// `kubernetes` Service with the prober account's token.
async fn client_reaches_web_and_apiserver(cluster: &PodCluster, probe: &str, cluster_ip: &str) {
    let pods: Api<Pod> = Api::namespaced(cluster.client().await.unwrap(), NS);
    apply(cluster, &client_pod(probe, cluster_ip));
    eventually(
        "the client pod to finish",
        Duration::from_secs(120),
        || async {
            let phase = pods.get("client").await.ok()?.status?.phase?;
            assert_ne!(
                phase,
                "Failed",
                "client pod failed: {}",
                logs(cluster, "client")
            );
            (phase == "Succeeded").then_some(())
        },
    )
    .await;
    let log = logs(cluster, "client");
    assert!(log.contains("served by web"), "{log}");
    let kubernetes = cluster.layout().kubernetes_service_ip;
    assert!(
        log.contains(&format!("apiserver via {kubernetes}:443")),
        "{log}"
    );
    assert!(
        log.contains("user=system:serviceaccount:probe:prober"),
        "{log}"
    );
}

/// Two clusters side by side (as a `clusterctl move` needs): both serve, each through its own
/// kube-proxy tables, and each leaves nothing behind.
#[tokio::test(flavor = "multi_thread")]
async fn pods_get_addresses_services_route_and_clients_reach_the_apiserver() {
    let images = images::built(&["pause", "probe"])
        .expect("the image archives (tests/scripts/build-images.sh)");
    let probe = images.get("probe").unwrap().reference.clone();
    let archives = images.archives();
    let pause = images.pause().unwrap();
    let (a, b) = tokio::join!(
        PodCluster::start(&archives, pause),
        PodCluster::start(&archives, pause)
    );
    let (a, b) = (a.expect("cluster a starts"), b.expect("cluster b starts"));
    assert_ne!(a.layout(), b.layout());
    let imported = a.images().unwrap();
    assert!(imported.contains(&probe), "{probe} not among {imported:?}");

    let (web_a, web_b) = tokio::join!(serve_web(&a, &probe), serve_web(&b, &probe));
    client_reaches_web_and_apiserver(&a, &probe, &web_a).await;
    // Cluster a's Service stays served while b runs, and b's answers too.
    assert_eq!(
        http_get(&web_a, 80, "/").as_deref().map(str::trim),
        Some("served by web")
    );
    assert_eq!(
        http_get(&web_b, 80, "/").as_deref().map(str::trim),
        Some("served by web")
    );

    for cluster in [a, b] {
        let (dir, layout) = (cluster.dir().to_owned(), cluster.layout().clone());
        let runtime_files = runtime_files(&dir);
        assert!(
            !runtime_files.is_empty(),
            "no shim socket or CNI result found for {}",
            dir.display()
        );
        drop(cluster);
        let _slot = host::Slot::hold(layout.slot).unwrap();
        assert_nothing_left(&dir, &layout);
        let left: Vec<_> = runtime_files.iter().filter(|s| s.exists()).collect();
        assert!(left.is_empty(), "runtime files left: {left:?}");
    }
}

/// A holder killed before its drop (a test binary that timed out) leaves its namespace, veth,
/// routes, cgroups, mounts and directory; whoever takes that slot next sweeps them first.
#[test]
fn a_slot_taken_after_a_holder_died_is_swept() {
    let slot = host::Slot::take().unwrap();
    let layout = slot.layout.clone();
    let dir = tempfile::Builder::new()
        .prefix(&format!("bootplate-pods-{}-", layout.slot))
        .tempdir()
        .unwrap()
        .keep();
    let mut slot = slot;
    slot.record_dir(&dir).unwrap();
    host::make_network(&layout).unwrap();
    host::make_cgroups(&layout).unwrap();
    let mount = dir.join("containerd/state/netns");
    std::fs::create_dir_all(&mount).unwrap();
    host::run(
        "mount",
        &["-t", "tmpfs", "leftover", &mount.display().to_string()],
    )
    .unwrap();
    // The holder dies: its lock goes, nothing else does.
    drop(slot);

    // Whoever takes a slot next (this test, or a cluster test beside it) sweeps it.
    let next = host::Slot::take().unwrap();
    if next.layout == layout {
        assert_nothing_left(&dir, &layout);
    } else {
        // Another cluster took the freed slot first: its sweep removes the directory and the
        // mount, and the slot's names are its own now.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while dir.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!dir.exists(), "{} left", dir.display());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&dir.display().to_string()), "mount left");
    }
}

/// clusterctl reads Cluster API's components (built from its module as its release builds them)
/// and bootplate's shipped ones from local repositories, as a platform team's configuration
/// names them, and names Cluster API's image through the `images:` override: what `clusterctl
/// init` against a pod cluster will install.
#[test]
fn clusterctl_reads_both_providers_from_local_repositories() {
    let root = tempfile::tempdir().unwrap();
    let core = clusterctl::capi_core().unwrap();
    let version = core.version.clone();
    let repos = clusterctl::write(
        root.path(),
        &[core, clusterctl::bootplate().unwrap()],
        &[clusterctl::ImageOverride {
            component: "cluster-api".into(),
            repository: "registry.k8s.io/cluster-api".into(),
            tag: version.clone(),
        }],
        None,
    )
    .unwrap();
    let generate = |args: &[&str]| repos.clusterctl_ok(None, args);
    let capi = generate(&["generate", "provider", "--core", "cluster-api"]);
    let image = format!("image: registry.k8s.io/cluster-api/cluster-api-controller:{version}");
    assert!(
        capi.contains(&image),
        "no {image} in Cluster API's components"
    );
    assert!(
        capi.contains("imagePullPolicy: IfNotPresent") && !capi.contains("imagePullPolicy: Always")
    );
    let bootplate = generate(&["generate", "provider", "--bootstrap", "bootplate"]);
    assert!(
        bootplate.contains("kind: Deployment") && bootplate.contains("namespace: bootplate-system")
    );
    assert!(
        !bootplate.contains("${"),
        "a variable clusterctl left unset"
    );
}

/// The images the shipped install runs beside bootplate's own (which comes from the release):
/// the sandbox, Cluster API's manager and cert-manager's three.
const SHIPPED_IMAGES: [&str; 5] = [
    "pause",
    "capi-manager",
    "cert-manager-controller",
    "cert-manager-webhook",
    "cert-manager-cainjector",
];
/// The image name bootplate's release archive carries (and its components pin by digest).
const BOOTPLATE_IMAGE: &str = "ghcr.io/bootplate/bootplate";

/// bootplate's namespace and Deployment as `deploy/` ships them.
const BOOTPLATE_NS: &str = "bootplate-system";
const BOOTPLATE_DEPLOYMENT: &str = "bootplate-controller-manager";
/// The labels of its Pods.
const BOOTPLATE_SELECTOR: &str =
    "app.kubernetes.io/name=bootplate,app.kubernetes.io/component=controller-manager";

/// As it ships (issue 30, items 3 and 4): one pod cluster, installed as a platform team does,
/// then the scenarios that share it, in sequence (one management cluster keeps CI's budget).
/// The target of scenario g's `clusterctl move` starts beside it, and `clusterctl init`
/// installs it while scenarios a to f run on the first.
#[tokio::test(flavor = "multi_thread")]
async fn as_it_ships_clusterctl_installs_bootplate_and_the_scenarios_run() {
    let started = std::time::Instant::now();
    let images = images::built(&SHIPPED_IMAGES).expect("the image archives");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("pod-cluster-release");
    let release = tokio::task::spawn_blocking(move || Release::make(&out));
    let (archives, pause) = (images.archives(), images.pause().unwrap());
    let (cluster, target) = tokio::join!(
        PodCluster::start(&archives, pause),
        PodCluster::start(&archives, pause)
    );
    let cluster = cluster.expect("the pod cluster starts");
    let target = target.expect("the pod cluster of scenario g's move target starts");
    let release = release.await.unwrap().expect("scripts/release.sh's output");
    let target = install_beside(target, release.clone());
    cluster
        .import_pinned(&release.archive(), BOOTPLATE_IMAGE)
        .expect("the release's image archive imported");
    let repos = clusterctl_init(&cluster, &release);
    scenario_a_two_ready_replicas_one_leader_and_metrics(&cluster, &release).await;
    scenario_b_the_webhook_through_its_service_with_cert_managers_ca(&cluster).await;
    let fleet = Fleet::start(&cluster).await.expect("the test cloud starts");
    scenario_c_workers_get_their_data_from_bootplates_pod(&cluster, &fleet).await;
    scenario_d_the_leader_deleted_while_the_workers_scale_to_ten(&cluster, &fleet).await;
    scenario_e_a_rollout_restart_hands_over_and_renders_nothing_again(&cluster, &fleet).await;
    scenario_f_clusterctl_deletes_bootplate_and_a_new_init_resumes(&cluster, &fleet, &repos).await;
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("scenarios a to f passed at {elapsed:.1} s");
    let target = target.await.expect("clusterctl init on the move's target");
    scenario_g_clusterctl_moves_the_fleet_to_another_cluster(&cluster, &fleet, &repos, &target)
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("scenario g passed at {elapsed:.1} s");
}

/// `clusterctl init` of `target` as of the first cluster ([`clusterctl_init`]: the release's
/// image imported, the same local repositories), on a blocking thread while the first
/// cluster's scenarios run.
fn install_beside(target: PodCluster, release: Release) -> tokio::task::JoinHandle<PodCluster> {
    tokio::task::spawn_blocking(move || {
        target
            .import_pinned(&release.archive(), BOOTPLATE_IMAGE)
            .expect("the release's image archive imported into the target");
        clusterctl_init(&target, &release);
        target
    })
}

/// `clusterctl init --core cluster-api --bootstrap bootplate` with a configuration whose
/// `cert-manager:` and `providers:` point at local files (bootplate's at the release's output,
/// read in place), the images only in the cluster's containerd (Cluster API's named through
/// `images:`, bootplate's pinned by digest as the release's components name it, pulled
/// `IfNotPresent`). clusterctl installs cert-manager from its manifest and waits for it (its own
/// test Certificate, through cert-manager's webhook Service), then both providers, and waits for
/// their Pods. No test code applies a manifest of bootplate or Cluster API.
fn clusterctl_init(cluster: &PodCluster, release: &Release) -> clusterctl::Repositories {
    let core = clusterctl::capi_core().unwrap();
    let version = core.version.clone();
    let manifest = testenv::tools::path("cert-manager-manifest").unwrap();
    let cert_manager_version = manifest
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_prefix("cert-manager-"))
        .expect("cert-manager-VERSION.yaml")
        .to_owned();
    let repos = clusterctl::write(
        &cluster.dir().join("clusterctl"),
        &[core, clusterctl::released(release)],
        &[clusterctl::ImageOverride {
            component: "cluster-api".into(),
            repository: "registry.k8s.io/cluster-api".into(),
            tag: version,
        }],
        Some(&clusterctl::CertManager {
            manifest,
            version: cert_manager_version,
        }),
    )
    .unwrap();
    let out = repos
        .clusterctl(
            Some(cluster.kubeconfig_path()),
            &[
                "init",
                "--core",
                "cluster-api",
                "--bootstrap",
                "bootplate",
                "--control-plane",
                "-",
                "--wait-providers",
                "--wait-provider-timeout",
                "300",
            ],
        )
        .unwrap();
    let pods = kubectl_text(cluster, &["get", "pods", "-A", "-o", "wide"]);
    assert!(
        out.status.success(),
        "clusterctl init: {}{}\n{pods}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bootplate = format!("{BOOTPLATE_NS}/{BOOTPLATE_DEPLOYMENT}");
    for (deployment, replicas) in [
        ("capi-system/capi-controller-manager", "1"),
        ("cert-manager/cert-manager", "1"),
        ("cert-manager/cert-manager-webhook", "1"),
        ("cert-manager/cert-manager-cainjector", "1"),
        (bootplate.as_str(), "2"),
    ] {
        assert_eq!(
            ready_replicas(cluster, deployment),
            replicas,
            "{deployment} not ready:\n{pods}"
        );
    }
    repos
}

/// A Deployment's `status.readyReplicas` ("" when none).
fn ready_replicas(cluster: &PodCluster, deployment: &str) -> String {
    let (ns, name) = deployment.split_once('/').unwrap();
    kubectl_text(
        cluster,
        &[
            "get",
            "deployment",
            "-n",
            ns,
            name,
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
    )
}

/// kubectl's stdout, or its stderr with a marker when it failed.
fn kubectl_text(cluster: &PodCluster, args: &[&str]) -> String {
    let out = cluster.kubectl(args).unwrap();
    if out.status.success() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        format!("kubectl failed: {}", String::from_utf8_lossy(&out.stderr))
    }
}

/// Scenario a: both replicas Ready under the shipped securityContext and probes (as clusterctl
/// applied them, checked on the running Pods), running the release's image by its digest,
/// exactly one of them holds the Lease, and the metrics Service answers with `bootplate_*`
/// series.
async fn scenario_a_two_ready_replicas_one_leader_and_metrics(
    cluster: &PodCluster,
    release: &Release,
) {
    let digest = release.digest().unwrap();
    let client = cluster.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), BOOTPLATE_NS);
    let selector = BOOTPLATE_SELECTOR;
    let list = pods
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .unwrap();
    let names: Vec<String> = list
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names.len(), 2, "bootplate's Pods: {names:?}");
    for pod in &list.items {
        let container = &pod.spec.as_ref().unwrap().containers[0];
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert!(container.readiness_probe.is_some() && container.liveness_probe.is_some());
        let pinned = format!("{BOOTPLATE_IMAGE}@{digest}");
        assert_eq!(container.image.as_deref(), Some(pinned.as_str()));
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        let image_id = statuses
            .and_then(|s| s.first())
            .map(|s| s.image_id.as_str());
        assert!(
            image_id.is_some_and(|id| id.ends_with(&digest)),
            "{:?} runs {image_id:?}, not the release's {digest}",
            pod.metadata.name
        );
        let ready = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        assert!(
            ready.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            "{:?} not Ready",
            pod.metadata.name
        );
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), BOOTPLATE_NS);
    let holder = eventually(
        "a holder of bootplate's Lease",
        Duration::from_secs(60),
        || async {
            leases
                .get("bootplate-leader")
                .await
                .ok()?
                .spec?
                .holder_identity
        },
    )
    .await;
    assert!(
        names.contains(&holder),
        "the Lease holder {holder} is none of {names:?}"
    );
    let all = leases.list(&Default::default()).await.unwrap();
    assert_eq!(all.items.len(), 1, "one Lease in {BOOTPLATE_NS}");
    let services: Api<Service> = Api::namespaced(client, BOOTPLATE_NS);
    let metrics = services.get("bootplate-metrics").await.unwrap();
    let ip = metrics.spec.unwrap().cluster_ip.unwrap();
    let body = eventually(
        "bootplate_* series from the metrics Service",
        Duration::from_secs(60),
        || {
            let ip = ip.clone();
            async move { http_get(&ip, 8080, "/metrics").filter(|b| b.contains("\nbootplate_")) }
        },
    )
    .await;
    assert!(body.contains("# TYPE bootplate_"), "{body}");
}

/// A template the webhook admits, in namespace `team-a`.
const GOOD_TEMPLATE: &str = r#"
apiVersion: bootstrap.bootplate.dev/v1alpha1
kind: BootstrapTemplate
metadata: {name: good, namespace: team-a}
spec:
  os: {name: linux}
  format: script
  template: |
    #!/bin/bash
    echo {{machine.name}}
"#;

/// Scenario b: the ValidatingWebhookConfiguration names bootplate's Service and carries the CA
/// that cainjector copied from cert-manager's Certificate Secret; through it, `kubectl apply`
/// admits a good template and refuses a broken one with the field.
async fn scenario_b_the_webhook_through_its_service_with_cert_managers_ca(cluster: &PodCluster) {
    let client = cluster.client().await.unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), BOOTPLATE_NS);
    let secret = secrets.get("bootplate-webhook-server-cert").await.unwrap();
    let ca = secret
        .data
        .unwrap()
        .remove("ca.crt")
        .expect("cert-manager's ca.crt")
        .0;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let config = configs
        .get("bootplate-validating-webhook-configuration")
        .await
        .unwrap();
    let webhook = &config.webhooks.unwrap()[0];
    let service = webhook.client_config.service.as_ref().expect("a Service");
    assert_eq!(
        (service.namespace.as_str(), service.name.as_str()),
        (BOOTPLATE_NS, "bootplate-webhook-service")
    );
    let injected = webhook
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    // Compared as text: a mismatch prints two PEM blocks, not byte arrays.
    assert_eq!(
        injected,
        Some(String::from_utf8_lossy(&ca).into_owned()),
        "the caBundle is not cert-manager's CA"
    );

    let kubeconfig = cluster.kubeconfig_path();
    let namespace = testenv::kubectl_apply(
        kubeconfig,
        &[],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n",
    );
    assert!(namespace.status.success());
    let out = testenv::kubectl_apply(kubeconfig, &[], GOOD_TEMPLATE);
    assert!(
        out.status.success(),
        "the good template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let broken = GOOD_TEMPLATE
        .replace("name: good", "name: broken")
        .replace("echo {{machine.name}}", "echo {{machine..name}}");
    let out = testenv::kubectl_apply(kubeconfig, &[], &broken);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("denied the request"),
        "the broken template was not refused by the webhook: {stderr}"
    );
    assert!(stderr.contains("spec.template"), "{stderr}");
}

/// The shipped template the scenarios' workers render, and its name.
const SHIPPED_TEMPLATE: (&str, &str) =
    ("templates/kubeadm-ubuntu-2404.yaml", "kubeadm-ubuntu-2404");
/// The Cluster of scenarios c to e, and its MachineDeployment.
const FLEET_CLUSTER: &str = "shipped";
const FLEET_MD: &str = "shipped-md";

/// Scenario c: a Cluster and a MachineDeployment of three workers. Cluster API (in its Pod)
/// makes the Machines and configs, bootplate (in its Pod) renders each worker's data with a join
/// token of its own, the test cloud boots a machine only from data that joins this cluster with
/// that token and CA, and the Machines run with a nodeRef. The renders are the leader Pod's: its
/// metrics (read from the Pod's address) count the three Secrets and tokens, the standby's none.
async fn scenario_c_workers_get_their_data_from_bootplates_pod(
    cluster: &PodCluster,
    fleet: &Fleet,
) {
    let kubeconfig = cluster.kubeconfig_path();
    let template = std::fs::read_to_string(repo_file(SHIPPED_TEMPLATE.0)).unwrap();
    let out = testenv::kubectl_apply(kubeconfig, &[], &template);
    assert!(
        out.status.success(),
        "publishing the shipped template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fleet
        .cluster_with_workers(FLEET_CLUSTER, SHIPPED_TEMPLATE.1, 3)
        .await
        .unwrap();
    each_machine_running_rendered_once(cluster, fleet, 3).await;
    let (leader, standby) = leader_and_standby(cluster).await;
    assert_rendered_by_the_leader_only(&leader, &standby, 3.0);
}

/// The leader Pod's metrics (read from its address) count `count` data Secrets written and
/// `count` join tokens made since it started; the standby's count none.
fn assert_rendered_by_the_leader_only(
    leader: &(String, String),
    standby: &(String, String),
    count: f64,
) {
    let written = "bootplate_data_secrets_written_total";
    let created = "bootplate_bootstrap_tokens_total{action=\"created\"}";
    let of = |pod: &(String, String), series| pod_metric(pod, series).unwrap_or(0.0);
    let counts = [of(leader, written), of(leader, created)];
    assert_eq!(
        counts, [count; 2],
        "the leader {}: written, created",
        leader.0
    );
    let counts = [of(standby, written), of(standby, created)];
    assert_eq!(
        counts, [0.0; 2],
        "the standby {}: written, created",
        standby.0
    );
}

/// Scenario d: `kubectl delete pod` of the leader while the MachineDeployment scales from 3 to
/// 10. Another replica (the standby, or the Pod started in the leader's place) takes the Lease
/// within its duration (the leader drains and releases it on SIGTERM), the ten Machines run, and each got its data exactly once: no data Secret ever held
/// a second user-data, and the workload cluster saw exactly one join token per Machine.
async fn scenario_d_the_leader_deleted_while_the_workers_scale_to_ten(
    cluster: &PodCluster,
    fleet: &Fleet,
) {
    let client = &fleet.client;
    let (leader, standby) = leader_and_standby(cluster).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), BOOTPLATE_NS);
    let lease = leases.get("bootplate-leader").await.unwrap().spec.unwrap();
    let duration = Duration::from_secs(lease.lease_duration_seconds.unwrap_or(15) as u64);
    scale(fleet, 10).await;
    let deleted_at = std::time::Instant::now();
    let out = kubectl_text(
        cluster,
        &[
            "delete",
            "pod",
            "-n",
            BOOTPLATE_NS,
            leader.0.as_str(),
            "--wait=false",
        ],
    );
    assert!(!out.starts_with("kubectl failed"), "{out}");
    let holder = eventually(
        "another holder of the Lease",
        Duration::from_secs(90),
        || async { Some(lease_holder(client).await).filter(|h| *h != leader.0 && !h.is_empty()) },
    )
    .await;
    let took = deleted_at.elapsed();
    assert!(
        took < duration,
        "the takeover took {took:?}, the lease is {duration:?}"
    );
    // The standby, or the Pod the ReplicaSet started in the leader's place: whichever asked
    // first after the leader released the Lease (a new Pod's container may take the Lease
    // before the kubelet reports the Pod Running: a short wait for that report).
    eventually(
        &format!(
            "the new holder {holder} a running replica (the standby was {})",
            standby.0
        ),
        Duration::from_secs(30),
        || async {
            let running = bootplate_pods(client).await;
            running.iter().any(|p| p.0 == holder).then_some(())
        },
    )
    .await;
    each_machine_running_rendered_once(cluster, fleet, 10).await;
    let deployment = format!("{BOOTPLATE_NS}/{BOOTPLATE_DEPLOYMENT}");
    eventually(
        "two bootplate replicas ready again",
        Duration::from_secs(120),
        || async { (ready_replicas(cluster, &deployment) == "2").then_some(()) },
    )
    .await;
}

/// Scales the fleet's MachineDeployment to `replicas`.
async fn scale(fleet: &Fleet, replicas: u32) {
    let deployments = Api::<DynamicObject>::namespaced_with(
        fleet.client.clone(),
        testenv::capi::NS,
        &objects::machine_deployment_resource(),
    );
    let patch = serde_json::json!({"spec": {"replicas": replicas}});
    deployments
        .patch(
            FLEET_MD,
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// Scenario e: `kubectl rollout restart` of bootplate's Deployment. Both old Pods stop, new ones
/// take over the Lease; neither old Pod's log nor the new ones' holds a failed reconcile or an
/// ERROR line, and the new Pods' metrics count no reconcile that ended in an error; the new leader renders nothing again (its metrics count no Secret written and no token made for
/// the ten ready configs), and renders the one Machine the MachineDeployment then adds.
async fn scenario_e_a_rollout_restart_hands_over_and_renders_nothing_again(
    cluster: &PodCluster,
    fleet: &Fleet,
) {
    let old: Vec<String> = bootplate_pods(&fleet.client)
        .await
        .into_iter()
        .map(|p| p.0)
        .collect();
    let followed: Vec<_> = old.iter().map(|pod| follow_log(cluster, pod)).collect();
    let deployment = format!("deployment/{BOOTPLATE_DEPLOYMENT}");
    let deployment = deployment.as_str();
    for args in [
        vec!["rollout", "restart", "-n", BOOTPLATE_NS, deployment],
        vec![
            "rollout",
            "status",
            "-n",
            BOOTPLATE_NS,
            deployment,
            "--timeout=180s",
        ],
    ] {
        let out = kubectl_text(cluster, &args);
        assert!(!out.starts_with("kubectl failed"), "{out}");
    }
    eventually(
        "two new bootplate Pods, one holding the Lease",
        Duration::from_secs(120),
        || async {
            let pods = bootplate_pods(&fleet.client).await;
            let holder = lease_holder(&fleet.client).await;
            let new = pods.iter().all(|(name, _)| !old.contains(name));
            (new && pods.len() == 2 && pods.iter().any(|(name, _)| *name == holder)).then_some(())
        },
    )
    .await;
    let mut logs: Vec<(String, String)> = old
        .iter()
        .cloned()
        .zip(followed.into_iter().map(finish_log))
        .collect();
    scale(fleet, 11).await;
    each_machine_running_rendered_once(cluster, fleet, 11).await;
    let (leader, standby) = leader_and_standby(cluster).await;
    assert_rendered_by_the_leader_only(&leader, &standby, 1.0);
    assert_no_reconcile_errors(&[&leader, &standby]);
    for pod in [leader.0, standby.0] {
        let log = kubectl_text(cluster, &["logs", "-n", BOOTPLATE_NS, pod.as_str()]);
        logs.push((pod, log));
    }
    assert_no_failed_reconcile(&logs);
}

/// Each (Pod name, IP) counted no reconcile that ended in an error since it started (its
/// `bootplate_reconciles_total{result="error"}` series, per controller, absent or 0): a failure
/// the log words differently is still caught.
fn assert_no_reconcile_errors(pods: &[&(String, String)]) {
    for pod in pods {
        for controller in ["config", "template"] {
            let series = format!(
                "bootplate_reconciles_total{{controller=\"{controller}\",result=\"error\"}}"
            );
            let errors = pod_metric(pod, &series).unwrap_or(0.0);
            assert_eq!(errors, 0.0, "{}: {series}", pod.0);
        }
    }
}

/// Each (Pod, log) is a JSON log without a failed reconcile or any line logged at ERROR.
fn assert_no_failed_reconcile(logs: &[(String, String)]) {
    for (pod, log) in logs {
        assert!(
            log.contains("\"level\""),
            "{pod}'s log is empty or not JSON: {log}"
        );
        let failed: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("reconcile failed") || l.contains("\"level\":\"ERROR\""))
            .collect();
        assert!(
            failed.is_empty(),
            "{pod} logged failed reconciles:\n{}",
            failed.join("\n")
        );
    }
}

/// `kubectl logs -f` of bootplate Pod `pod`, into a file of the cluster's directory: the log of
/// a Pod that is about to go, read to its end.
fn follow_log(cluster: &PodCluster, pod: &str) -> (std::process::Child, std::path::PathBuf) {
    let path = cluster.dir().join(format!("{pod}.followed.log"));
    let file = std::fs::File::create(&path).unwrap();
    let child = std::process::Command::new(testenv::tools::path("kubectl").unwrap())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["logs", "-f", "-n", BOOTPLATE_NS, pod])
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    (child, path)
}

/// The followed log once its Pod's container ended (the stream ends with it; 30 s at most).
fn finish_log((mut child, path): (std::process::Child, std::path::PathBuf)) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    std::fs::read_to_string(path).unwrap()
}

fn repo_file(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// Waits until the fleet's Cluster has `count` Machines, each Running with a nodeRef; returns
/// them. On timeout the panic shows each Machine's phase and its infrastructure's Ready.
async fn wait_running(cluster: &PodCluster, fleet: &Fleet, count: usize) -> Vec<DynamicObject> {
    let machines = Api::<DynamicObject>::namespaced_with(
        fleet.client.clone(),
        testenv::capi::NS,
        &objects::machine_resource(),
    );
    let selector = format!("cluster.x-k8s.io/cluster-name={FLEET_CLUSTER}");
    let params = kube::api::ListParams::default().labels(&selector);
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let list = machines.list(&params).await.unwrap().items;
        let running = |m: &DynamicObject| {
            m.data["status"]["phase"] == "Running"
                && m.data["status"]["nodeRef"]["name"].is_string()
        };
        if list.len() == count && list.iter().all(running) {
            return list;
        }
        if std::time::Instant::now() > deadline {
            let all = kubectl_text(
                cluster,
                &[
                    "get",
                    "machines,devmachines,bootplateconfigs",
                    "-A",
                    "-o",
                    "wide",
                ],
            );
            panic!("{count} Machines Running with a nodeRef: not in 240 s\n{all}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the fleet's Cluster has `count` Machines Running with a nodeRef, then checks each
/// joined with a token of its own ([`assert_each_joined_with_its_own_token`]) and that each of
/// the `count` data Secrets only ever held one user-data.
async fn each_machine_running_rendered_once(cluster: &PodCluster, fleet: &Fleet, count: usize) {
    let machines = wait_running(cluster, fleet, count).await;
    assert_each_joined_with_its_own_token(fleet, &machines).await;
    let seen = fleet.renders.seen();
    assert_eq!(seen.values.len(), count, "data Secrets: {seen:?}");
    assert!(seen.rendered_twice().is_empty(), "rendered twice: {seen:?}");
}

/// Each Machine's DevMachine booted as a worker with a join token the workload apiserver took
/// for `system:bootstrap:<id>`, no two with the same token, each token one the watch saw made.
async fn assert_each_joined_with_its_own_token(fleet: &Fleet, machines: &[DynamicObject]) {
    let mut ids = std::collections::BTreeSet::new();
    for machine in machines {
        let id = joined_as_a_worker(fleet, machine).await;
        let name = machine.metadata.name.as_deref().unwrap_or_default();
        assert!(ids.insert(id.clone()), "{name} shares token {id}");
    }
    let seen = fleet.renders.seen();
    assert_eq!(
        seen.token_ids.len(),
        machines.len(),
        "one token per Machine, no more: {seen:?}"
    );
}

/// `machine`'s DevMachine booted as a worker with a join token the workload apiserver took for
/// `system:bootstrap:<id>`, one the fleet's watch saw made; returns the token's ID.
async fn joined_as_a_worker(fleet: &Fleet, machine: &DynamicObject) -> String {
    let dev_machines = Api::<DynamicObject>::namespaced_with(
        fleet.client.clone(),
        testenv::capi::NS,
        &objects::dev_machine_resource(),
    );
    let infra = machine.data["spec"]["infrastructureRef"]["name"]
        .as_str()
        .unwrap();
    let record = BootRecord::of(&dev_machines.get(infra).await.unwrap());
    let record = record.unwrap_or_else(|| panic!("{infra} has no boot record"));
    assert_eq!(record.role, Some(BootRole::Worker), "{infra}");
    let id = record.token_id.clone().unwrap_or_default();
    assert_eq!(
        record.authenticated_as,
        Some(format!("system:bootstrap:{id}")),
        "{infra}"
    );
    let seen = fleet.renders.seen();
    assert!(
        seen.token_ids.contains(&id),
        "{infra}: token {id} not seen made"
    );
    id
}

/// bootplate's Pods: (name, Pod IP) of the Lease holder and of the other replica.
async fn leader_and_standby(cluster: &PodCluster) -> ((String, String), (String, String)) {
    let client = cluster.client().await.unwrap();
    let holder = lease_holder(&client).await;
    let pods = bootplate_pods(&client).await;
    assert_eq!(pods.len(), 2, "bootplate's Pods: {pods:?}");
    let (leader, standby): (Vec<_>, Vec<_>) =
        pods.into_iter().partition(|(name, _)| *name == holder);
    assert_eq!(leader.len(), 1, "the holder {holder} is a running Pod");
    (leader[0].clone(), standby[0].clone())
}

/// The holder of bootplate's Lease.
async fn lease_holder(client: &kube::Client) -> String {
    let leases: Api<Lease> = Api::namespaced(client.clone(), BOOTPLATE_NS);
    let lease = leases.get("bootplate-leader").await.unwrap();
    lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

/// bootplate's running Pods that are not being deleted: (name, Pod IP).
async fn bootplate_pods(client: &kube::Client) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), BOOTPLATE_NS);
    let params = kube::api::ListParams::default().labels(BOOTPLATE_SELECTOR);
    let list = pods.list(&params).await.unwrap().items;
    list.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status?;
            (status.phase.as_deref() == Some("Running"))
                .then_some((p.metadata.name?, status.pod_ip?))
        })
        .collect()
}

/// The value of series `series` (name and labels, as exposed) on a bootplate Pod's metrics port.
fn pod_metric((name, ip): &(String, String), series: &str) -> Option<f64> {
    let body = http_get(ip, 8080, "/metrics");
    let body = body.unwrap_or_else(|| panic!("no metrics from {name} at {ip}"));
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The runtime's files in fixed host directories (shim sockets, cached CNI results) for the
/// cluster's tasks that exist now.
fn runtime_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    host::runtime_leftovers(dir)
        .into_iter()
        .filter(|s| s.exists())
        .collect()
}

/// The container's log, read through the apiserver from the kubelet (`kubectl logs`).
fn logs(cluster: &PodCluster, pod: &str) -> String {
    let out = cluster.kubectl(&["logs", "-n", NS, pod]).unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every cgroup hierarchy the host has mounted (v1 and v2, wherever mounted), read here from the
/// mount table rather than from the helper that made the cluster's cgroups: a hierarchy that
/// helper misses is still checked.
fn cgroup_mounts() -> Vec<std::path::PathBuf> {
    cgroup_mounts_in(&std::fs::read_to_string("/proc/self/mountinfo").unwrap())
}

/// The mount points of cgroup file systems in mount table `table` (`/proc/*/mountinfo`'s form).
fn cgroup_mounts_in(table: &str) -> Vec<std::path::PathBuf> {
    let mut mounts: Vec<std::path::PathBuf> = table
        .lines()
        .filter_map(|line| {
            // mountinfo: "ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE ..."
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let point = left.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| point.into())
        })
        .collect();
    mounts.sort();
    mounts.dedup();
    mounts
}

#[test]
fn every_cgroup_mount_is_found_whatever_its_place_and_optional_fields() {
    let table = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime shared:12 - cgroup cgroup rw,cpuset
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 23 0:38 / /run/unified rw,nosuid shared:4 master:1 - cgroup2 cgroup2 rw
42 23 0:39 / /mnt/cgroup-like rw - ext4 /dev/sda1 rw
";
    let found = cgroup_mounts_in(table);
    let want: Vec<std::path::PathBuf> = [
        "/run/unified",
        "/sys/fs/cgroup/cpuset",
        "/sys/fs/cgroup/systemd",
    ]
    .iter()
    .map(Into::into)
    .collect();
    assert_eq!(found, want);
}

/// What a dropped cluster must not leave: its namespace, veth, routes, cgroups, mounts,
/// directory, or any process started from it.
fn assert_nothing_left(dir: &std::path::Path, layout: &testenv::pod_cluster::config::Layout) {
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    assert!(!netns.contains(&layout.netns), "netns left: {netns}");
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(&layout.host_veth), "veth left: {links}");
    let routes = std::process::Command::new("ip")
        .arg("route")
        .output()
        .unwrap();
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(!routes.contains(&layout.pod_cidr), "route left: {routes}");
    let hierarchies = cgroup_mounts();
    assert!(!hierarchies.is_empty(), "no cgroup hierarchy is mounted");
    for h in hierarchies {
        let cg = h.join(&layout.cgroup);
        assert!(!cg.exists(), "cgroup left: {}", cg.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let prefix = dir.display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&prefix)),
        "mounts left under {prefix}"
    );
    if std::env::var_os("BOOTPLATE_KEEP_TEST_DIRS").is_none() {
        assert!(!dir.exists(), "{} left", dir.display());
    }
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.contains(&prefix)),
        "a process started from {prefix} is still running"
    );
}

/// What bootplate wrote, by object: (resourceVersion, content). Of `management`, each
/// BootplateConfig (content: its Ready status) and each Secret of Cluster API's type in the
/// fleet's namespace (the data Secrets, the cluster's CA and kubeconfig; content: a digest of
/// its data); of `workload`, each join token Secret (content: a digest of its data).
type Written = std::collections::BTreeMap<String, (String, String)>;

async fn written_state(management: &kube::Client, workload: &kube::Client) -> Written {
    use sha2::Digest as _;
    let mut state = Written::new();
    let configs = Api::<DynamicObject>::namespaced_with(
        management.clone(),
        testenv::capi::NS,
        &objects::bootplate_resource("BootplateConfig", "bootplateconfigs"),
    );
    for config in configs.list(&Default::default()).await.unwrap().items {
        let conditions = config.data["status"]["conditions"].as_array().cloned();
        let ready = conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["status"].as_str().map(str::to_owned));
        let version = config.metadata.resource_version.clone().unwrap_or_default();
        let name = format!("BootplateConfig/{}", config.metadata.name.unwrap());
        let ready = format!("Ready={}", ready.unwrap_or_default());
        state.insert(name, (version, ready));
    }
    for (client, ns, secret_type) in [
        (management, testenv::capi::NS, "cluster.x-k8s.io/secret"),
        (workload, "kube-system", "bootstrap.kubernetes.io/token"),
    ] {
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
        let params = kube::api::ListParams::default().fields(&format!("type={secret_type}"));
        for secret in secrets.list(&params).await.unwrap().items {
            let data = serde_json::to_vec(&secret.data).unwrap();
            let digest = hex::encode(sha2::Sha256::digest(data));
            let version = secret.metadata.resource_version.unwrap_or_default();
            let name = format!("Secret/{ns}/{}", secret.metadata.name.unwrap());
            state.insert(name, (version, digest));
        }
    }
    state
}

/// A join token's entry: it may go at any time (deleted once its Machine joined: clean-up
/// that any leader, an old one included, may finish whenever).
fn is_join_token(name: &str) -> bool {
    name.starts_with("Secret/kube-system/bootstrap-token-")
}

/// Every object of `after` is as it was `before` (nothing created or updated); of the objects
/// gone, only join tokens (deleted once their Machine joined: clean-up that any leader, the old
/// one included, may finish at any time).
fn assert_nothing_written(before: &Written, after: &Written, when: &str) {
    let written: Vec<_> = after
        .iter()
        .filter(|(name, state)| before.get(*name) != Some(*state))
        .collect();
    assert!(written.is_empty(), "{when}: written {written:?}");
    let gone: Vec<_> = before
        .keys()
        .filter(|name| !after.contains_key(*name))
        .filter(|name| !is_join_token(name))
        .collect();
    assert!(gone.is_empty(), "{when}: deleted {gone:?}");
}

/// Scenario f: `clusterctl upgrade plan` lists bootplate under its contract; `clusterctl delete
/// --bootstrap bootplate` removes its Deployment, webhook configuration and inventory entry and
/// keeps its CRDs, the configs and their data Secrets untouched (clusterctl's default); a new
/// `clusterctl init --bootstrap bootplate` resumes over the ready configs with no write (the
/// same resourceVersions, the new leader's metrics count no Secret written and no token made
/// once it counts every config ready; a join token may only go, as its clean-up), and renders
/// the next Machine.
async fn scenario_f_clusterctl_deletes_bootplate_and_a_new_init_resumes(
    cluster: &PodCluster,
    fleet: &Fleet,
    repos: &clusterctl::Repositories,
) {
    let plan = repos.clusterctl_ok(Some(cluster.kubeconfig_path()), &["upgrade", "plan"]);
    eprintln!("clusterctl upgrade plan:\n{plan}");
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert!(
        plan.contains("v1beta2 Cluster API contract"),
        "no contract in the plan:\n{plan}"
    );
    let row = plan.lines().find(|l| l.starts_with("bootstrap-bootplate "));
    let row: Vec<&str> = row
        .unwrap_or_else(|| panic!("no bootplate in the plan:\n{plan}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..4],
        [
            "bootstrap-bootplate",
            BOOTPLATE_NS,
            "BootstrapProvider",
            &version
        ],
        "{plan}"
    );
    let before = written_state(&fleet.client, &fleet.workload).await;
    repos.clusterctl_ok(
        Some(cluster.kubeconfig_path()),
        &["delete", "--bootstrap", "bootplate"],
    );
    assert_bootplate_deleted_and_its_objects_kept(cluster, fleet).await;
    assert_nothing_written(
        &before,
        &written_state(&fleet.client, &fleet.workload).await,
        "after the delete",
    );

    repos.clusterctl_ok(
        Some(cluster.kubeconfig_path()),
        &[
            "init",
            "--bootstrap",
            "bootplate",
            "--wait-providers",
            "--wait-provider-timeout",
            "300",
        ],
    );
    let configs = before.keys().filter(|k| k.starts_with("BootplateConfig/"));
    let ready = format!("{}", configs.count());
    let leader = eventually(
        "a new leader that counts every config ready",
        Duration::from_secs(120),
        || async {
            let pods = bootplate_pods(&fleet.client).await;
            let holder = lease_holder(&fleet.client).await;
            let leader = pods.into_iter().find(|(name, _)| *name == holder)?;
            let count = pod_metric(&leader, "bootplate_configs{state=\"ready\"}")?;
            (format!("{count}") == ready).then_some(leader)
        },
    )
    .await;
    assert_nothing_written(
        &before,
        &written_state(&fleet.client, &fleet.workload).await,
        "after the new init",
    );
    let written = pod_metric(&leader, "bootplate_data_secrets_written_total");
    let created = pod_metric(
        &leader,
        "bootplate_bootstrap_tokens_total{action=\"created\"}",
    );
    assert_eq!(
        [written.unwrap_or(0.0), created.unwrap_or(0.0)],
        [0.0; 2],
        "the new leader {}: written, created",
        leader.0
    );
    let next = before
        .keys()
        .filter(|k| k.starts_with("BootplateConfig/"))
        .count()
        + 1;
    scale(fleet, next as u32).await;
    each_machine_running_rendered_once(cluster, fleet, next).await;
    let (leader, standby) = leader_and_standby(cluster).await;
    assert_rendered_by_the_leader_only(&leader, &standby, 1.0);
}

/// After `clusterctl delete --bootstrap bootplate`: no Deployment, Pod, webhook configuration
/// or inventory entry of bootplate; its CRDs and the fleet's configs are still there.
async fn assert_bootplate_deleted_and_its_objects_kept(cluster: &PodCluster, fleet: &Fleet) {
    let pods: Api<Pod> = Api::namespaced(fleet.client.clone(), BOOTPLATE_NS);
    let params = kube::api::ListParams::default().labels(BOOTPLATE_SELECTOR);
    eventually("bootplate's Pods gone", Duration::from_secs(90), || async {
        pods.list(&params)
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    for (kind, name) in [
        (
            "deployment",
            format!("-n {BOOTPLATE_NS} {BOOTPLATE_DEPLOYMENT}"),
        ),
        (
            "validatingwebhookconfiguration",
            "bootplate-validating-webhook-configuration".to_owned(),
        ),
    ] {
        let mut args = vec!["get", kind];
        args.extend(name.split(' '));
        let out = kubectl_text(cluster, &args);
        assert!(out.contains("NotFound"), "{kind} {name} left: {out}");
    }
    let providers = kubectl_text(
        cluster,
        &["get", "providers.clusterctl.cluster.x-k8s.io", "-A"],
    );
    assert!(
        providers.contains("cluster-api") && !providers.contains("bootplate"),
        "the inventory: {providers}"
    );
    let crds = kubectl_text(cluster, &["get", "crd", "-o", "name"]);
    let crds: Vec<&str> = crds.lines().collect();
    for crd in [
        "bootplateconfigs",
        "bootplateconfigtemplates",
        "bootstrapgenerators",
        "bootstraptemplates",
        "clusterbootstraptemplates",
    ] {
        let name =
            format!("customresourcedefinition.apiextensions.k8s.io/{crd}.bootstrap.bootplate.dev");
        assert!(crds.contains(&name.as_str()), "{name} deleted: {crds:?}");
    }
}

/// Scenario g: `clusterctl move --namespace` of the fleet (the Cluster, its MachineDeployment
/// and Machines, their Ready configs and data Secrets) from the first pod cluster to a second
/// one that `clusterctl init` installed the same way, as scenario g of the Cluster API tier does
/// between processes. The test cloud follows the move: the target's boots the target's new
/// Machines; the workload cluster stays the first pod cluster (the target's Pods reach it
/// through the host). On the target, every moved config is Ready with the same data Secret
/// (same data digest), the leader's metrics count every config ready and no Secret written, no
/// token made, and the join tokens are those of before (some may only go, as their clean-up);
/// the source holds none of the objects. A Machine added on the target then gets its data once,
/// from the target's leader.
async fn scenario_g_clusterctl_moves_the_fleet_to_another_cluster(
    source: &PodCluster,
    fleet: &Fleet,
    repos: &clusterctl::Repositories,
    target: &PodCluster,
) {
    // Cluster-scoped templates are the platform team's to publish on every management cluster.
    publish_shipped_template(target);
    let target_fleet = Fleet::start_beside(target, source)
        .await
        .expect("the test cloud of the move's target starts");
    let count = fleet_machines(&fleet.client).await.len();
    let machines = wait_running(source, fleet, count).await;
    let before = written_state(&fleet.client, &fleet.workload).await;
    let to = target.kubeconfig_path().display().to_string();
    let moved = repos.clusterctl_ok(
        Some(source.kubeconfig_path()),
        &[
            "move",
            "--to-kubeconfig",
            &to,
            "--namespace",
            testenv::capi::NS,
        ],
    );
    eprintln!("clusterctl move:\n{moved}");
    let (leader, standby) = leader_counting_ready(target, count).await;
    assert_rendered_by_the_leader_only(&leader, &standby, 0.0);
    let after = written_state(&target_fleet.client, &target_fleet.workload).await;
    assert_moved_unchanged(&before, &after);
    assert_source_holds_none(&fleet.client).await;
    let running = wait_running(target, &target_fleet, count).await;
    assert_eq!(
        names_of(&running),
        names_of(&machines),
        "the same Machines run on the target"
    );

    scale(&target_fleet, count as u32 + 1).await;
    let all = wait_running(target, &target_fleet, count + 1).await;
    let added: Vec<DynamicObject> = all
        .into_iter()
        .filter(|m| !names_of(&machines).contains(m.metadata.name.as_ref().unwrap()))
        .collect();
    assert_eq!(added.len(), 1, "one Machine added on the target");
    joined_as_a_worker(&target_fleet, &added[0]).await;
    let (leader, standby) = leader_and_standby(target).await;
    assert_rendered_by_the_leader_only(&leader, &standby, 1.0);
    let seen = target_fleet.renders.seen();
    assert_eq!(seen.values.len(), count + 1, "data Secrets: {seen:?}");
    assert!(seen.rendered_twice().is_empty(), "rendered twice: {seen:?}");
}

/// `kubectl apply` of the shipped ClusterBootstrapTemplate on `cluster`.
fn publish_shipped_template(cluster: &PodCluster) {
    let template = std::fs::read_to_string(repo_file(SHIPPED_TEMPLATE.0)).unwrap();
    let out = testenv::kubectl_apply(cluster.kubeconfig_path(), &[], &template);
    assert!(
        out.status.success(),
        "publishing the shipped template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The fleet Cluster's Machines on the management cluster of `client`.
async fn fleet_machines(client: &kube::Client) -> Vec<DynamicObject> {
    let machines = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        testenv::capi::NS,
        &objects::machine_resource(),
    );
    let selector = format!("cluster.x-k8s.io/cluster-name={FLEET_CLUSTER}");
    let params = kube::api::ListParams::default().labels(&selector);
    machines.list(&params).await.unwrap().items
}

fn names_of(objects: &[DynamicObject]) -> std::collections::BTreeSet<String> {
    objects
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect()
}

/// The (leader, standby) of `cluster`'s bootplate once the leader's metrics count `count`
/// configs ready.
async fn leader_counting_ready(
    cluster: &PodCluster,
    count: usize,
) -> ((String, String), (String, String)) {
    let client = cluster.client().await.unwrap();
    let ready = format!("{count}");
    eventually(
        "the target's leader counts every moved config ready",
        Duration::from_secs(180),
        || async {
            let holder = lease_holder(&client).await;
            let leader = bootplate_pods(&client)
                .await
                .into_iter()
                .find(|(name, _)| *name == holder)?;
            let counted = pod_metric(&leader, "bootplate_configs{state=\"ready\"}")?;
            (format!("{counted}") == ready).then_some(())
        },
    )
    .await;
    leader_and_standby(cluster).await
}

/// The target holds every config and Secret of `before` with the same content (Ready, data
/// digest), and nothing more; of the join tokens, some may have gone.
fn assert_moved_unchanged(before: &Written, after: &Written) {
    let content = |state: &Written| -> std::collections::BTreeMap<String, String> {
        state
            .iter()
            .map(|(k, (_, c))| (k.clone(), c.clone()))
            .collect()
    };
    let (before, after) = (content(before), content(after));
    let changed: Vec<_> = after
        .iter()
        .filter(|(name, c)| before.get(*name) != Some(*c))
        .collect();
    assert!(
        changed.is_empty(),
        "new or changed on the target: {changed:?}"
    );
    let missing: Vec<_> = before
        .keys()
        .filter(|name| !after.contains_key(*name) && !is_join_token(name))
        .collect();
    assert!(missing.is_empty(), "not moved: {missing:?}");
    let configs = after.keys().filter(|k| k.starts_with("BootplateConfig/"));
    assert!(configs.count() > 0, "no config on the target: {after:?}");
}

/// The source (admin client `client`) holds no Cluster, MachineDeployment, Machine,
/// BootplateConfig or Secret of Cluster API's type in the fleet's namespace once the move ends.
async fn assert_source_holds_none(client: &kube::Client) {
    let ns = testenv::capi::NS;
    let apis = [
        objects::cluster_resource(),
        objects::machine_deployment_resource(),
        objects::machine_resource(),
        objects::bootplate_resource("BootplateConfig", "bootplateconfigs"),
    ]
    .map(|r| Api::<DynamicObject>::namespaced_with(client.clone(), ns, &r));
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    let params = kube::api::ListParams::default().fields("type=cluster.x-k8s.io/secret");
    eventually(
        "the source holds none of the moved objects",
        Duration::from_secs(60),
        || async {
            let mut left = Vec::new();
            for api in &apis {
                left.extend(names_of(&api.list(&Default::default()).await.ok()?.items));
            }
            let secrets = secrets.list(&params).await.ok()?.items;
            left.extend(secrets.into_iter().filter_map(|s| s.metadata.name));
            if !left.is_empty() {
                eprintln!("left on the source: {left:?}");
            }
            left.is_empty().then_some(())
        },
    )
    .await;
}
