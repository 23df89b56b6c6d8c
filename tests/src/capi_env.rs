//! A management and a workload cluster, each a real apiserver, with the CRDs installed (Cluster
//! API's from its Go module, [`crate::capi_crds`]), and helpers that play CAPI's controllers:
//! ownerReferences ([`crate::fixtures::owned_config`]), infrastructure readiness,
//! ControlPlaneInitialized and nodeRef are written by the test, not by Cluster API's manager.
//! The controller runs under the ClusterRole shipped in `deploy/rbac`, impersonating its
//! ServiceAccount, so every test also proves the role suffices.
//!
//! This environment is for scenarios that need a Cluster or Machine held in one state at a
//! moment the test chooses (a fault injected precisely, a state Cluster API would not produce);
//! each test module using it says which. Scenarios that need no such fault run under the real
//! Cluster API manager ([`crate::capi`]).

use std::path::PathBuf;
use std::time::Duration;

use crd_types::capi::{Cluster, Machine};
use crd_types::{
    BootplateConfig, ClusterBootstrapTemplate, ClusterBootstrapTemplateSpec, TemplateKind,
    TemplateRef,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::controller::ControllerProcess;
use crate::{ApiServer, configs, fixtures};

/// The namespace the tests' clusters live in.
pub const NS: &str = "team-a";
/// How long a test waits for the controller.
pub const WAIT: Duration = Duration::from_secs(60);

/// Two apiservers and clients for them.
pub struct Env {
    /// The management cluster.
    pub management: ApiServer,
    /// The workload cluster.
    pub workload: ApiServer,
    /// Admin client of the management cluster.
    pub client: Client,
    /// Admin client of the workload cluster.
    pub workload_client: Client,
    controller_kubeconfig: PathBuf,
}

/// Starts both clusters, installs the CRDs and the controller's RBAC, creates [`NS`].
pub async fn env() -> Env {
    let (management, workload) = tokio::join!(ApiServer::start(), ApiServer::start());
    let (management, workload) = (
        management.expect("management apiserver"),
        workload.expect("workload apiserver"),
    );
    with_clusters(management, workload).await
}

/// [`env`] over apiservers the caller started (for example a workload cluster machines
/// authenticate to with bootstrap tokens, [`ApiServer::start_for_joins`]).
pub async fn with_clusters(management: ApiServer, workload: ApiServer) -> Env {
    let client = management.client().await.unwrap();
    let workload_client = workload.client().await.unwrap();
    crate::install_bootplate_crds(&client).await.unwrap();
    crate::install_capi_crds(&client).await.unwrap();
    fixtures::namespace(&client, NS).await.unwrap();
    let controller_kubeconfig = crate::rbac::install(&management)
        .await
        .expect("deploy/rbac applies");
    Env {
        management,
        workload,
        client,
        workload_client,
        controller_kubeconfig,
    }
}

impl Env {
    /// The kubeconfig `bootplate run` uses: the ServiceAccount of deploy/rbac.
    pub fn controller_kubeconfig(&self) -> &std::path::Path {
        &self.controller_kubeconfig
    }

    /// Starts `bootplate run` as the ServiceAccount of deploy/rbac.
    pub async fn controller(&self, extra: &[&str]) -> ControllerProcess {
        self.controller_logging_to("controller.log", extra).await
    }

    /// Starts `bootplate run` as the ServiceAccount of deploy/rbac, logging to `log` in the
    /// management apiserver's directory.
    pub async fn controller_logging_to(&self, log: &str, extra: &[&str]) -> ControllerProcess {
        let log = self.management.dir().join(log);
        ControllerProcess::start(&self.controller_kubeconfig, &log, extra)
            .await
            .unwrap()
    }

    pub async fn cluster(&self, name: &str, paused: bool) {
        let mut cluster = fixtures::cluster(NS, name);
        cluster.spec.paused = Some(paused);
        Api::<Cluster>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap();
        let value = self.workload.kubeconfig_yaml().to_owned();
        let kubeconfig = fixtures::cluster_secret(NS, name, "kubeconfig", [("value", value)]);
        Api::<Secret>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &kubeconfig)
            .await
            .unwrap();
    }

    /// A Cluster whose control plane is up, as workers find it: infrastructure provisioned,
    /// control plane initialized, CA Secret present (and its kubeconfig Secret, as for any).
    pub async fn initialized_cluster(&self, name: &str) {
        self.cluster(name, false).await;
        self.set_cluster_status(name, true, true).await;
        self.cluster_ca(name).await;
    }

    /// The cluster CA Secret, as a control-plane provider (or the init machine) leaves it.
    pub async fn cluster_ca(&self, name: &str) {
        let ca = bootplate::pki::generate_ca("kubernetes").unwrap();
        let data = [("tls.crt", ca.cert), ("tls.key", ca.key)];
        let secret = fixtures::cluster_secret(NS, name, "ca", data);
        Api::<Secret>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    pub async fn set_cluster_status(&self, name: &str, infrastructure: bool, initialized: bool) {
        let mut status = json!({"initialization": {"infrastructureProvisioned": infrastructure, "controlPlaneInitialized": initialized}});
        if initialized {
            status["conditions"] = json!([{"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized",
                "message": "control plane initialized", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        }
        let patch =
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "status": status});
        Api::<Cluster>::namespaced(self.client.clone(), NS)
            .patch_status(
                name,
                &PatchParams::apply("capi-cluster-controller").force(),
                &Patch::Apply(&patch),
            )
            .await
            .unwrap();
    }

    /// Creates a Machine and its owned config.
    pub async fn machine(
        &self,
        cluster: &str,
        name: &str,
        control_plane: bool,
        template: TemplateRef,
    ) {
        let machine = fixtures::machine(NS, name, cluster, control_plane, name);
        let machine = Api::<Machine>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
        let config = fixtures::owned_config(&machine, template);
        Api::<BootplateConfig>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
    }

    pub async fn set_node_ref(&self, machine: &str) {
        let patch = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "status": {"nodeRef": {"name": machine}}});
        Api::<Machine>::namespaced(self.client.clone(), NS)
            .patch_status(
                machine,
                &PatchParams::apply("capi-machine-controller").force(),
                &Patch::Apply(&patch),
            )
            .await
            .unwrap();
    }

    pub async fn config(&self, name: &str) -> BootplateConfig {
        configs::config(&self.client, NS, name).await
    }

    pub async fn secret(&self, name: &str) -> Option<Secret> {
        configs::secret(&self.client, NS, name).await
    }

    pub async fn user_data(&self, name: &str) -> String {
        configs::user_data(&self.client, NS, name).await
    }

    pub async fn tokens(&self) -> Vec<Secret> {
        Api::<Secret>::namespaced(self.workload_client.clone(), "kube-system")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| s.type_.as_deref() == Some("bootstrap.kubernetes.io/token"))
            .collect()
    }

    pub async fn wait_ready(&self, name: &str) -> BootplateConfig {
        configs::wait_ready(&self.client, NS, name, WAIT).await
    }

    /// Returns once `controller` has reconciled config `name` as it is now
    /// ([`configs::settled`]).
    pub async fn settled(&self, controller: &ControllerProcess, name: &str) {
        configs::settled(&self.client, controller, NS, name, WAIT).await
    }

    pub async fn wait_reason(&self, name: &str, reason: &str) -> String {
        configs::wait_reason(&self.client, NS, (name, reason), WAIT).await
    }
}

/// A reference to a ClusterBootstrapTemplate.
pub fn cluster_template(name: &str) -> TemplateRef {
    TemplateRef {
        kind: TemplateKind::ClusterBootstrapTemplate,
        name: name.into(),
        namespace: None,
    }
}

/// Publishes (server-side apply) a ClusterBootstrapTemplate with the probe body.
pub async fn publish_cluster_template(client: &Client, name: &str, marker: &str) {
    let template = ClusterBootstrapTemplate::new(
        name,
        ClusterBootstrapTemplateSpec(fixtures::probe_template_spec(marker)),
    );
    let api: Api<ClusterBootstrapTemplate> = Api::all(client.clone());
    let patch = serde_json::to_value(&template).unwrap();
    api.patch(
        name,
        &PatchParams::apply("platform-team").force(),
        &Patch::Apply(&patch),
    )
    .await
    .unwrap();
}

/// The value of a `key=value` line of rendered user-data.
pub fn field(user_data: &str, key: &str) -> Option<String> {
    user_data
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_owned))
}
