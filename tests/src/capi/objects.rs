//! The objects a platform team and an app team write (Cluster API v1beta2, bootplate, the test
//! providers' kinds), as JSON: only specs, the way a user applies them.

use kube::api::ApiResource;
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use super::NS;
use super::cloud::{self, CONTROL_PLANE_GROUP, INFRA_GROUP, VERSION, capi_resource};

/// The Kubernetes version of the scenarios' machines.
pub const KUBERNETES_VERSION: &str = "v1.34.2";
/// The bootplate API group.
pub const BOOTPLATE_GROUP: &str = "bootstrap.bootplate.dev";

pub fn cluster_resource() -> ApiResource {
    capi_resource("Cluster", "clusters")
}
pub fn machine_resource() -> ApiResource {
    capi_resource("Machine", "machines")
}
pub fn machine_deployment_resource() -> ApiResource {
    capi_resource("MachineDeployment", "machinedeployments")
}
pub fn machine_health_check_resource() -> ApiResource {
    capi_resource("MachineHealthCheck", "machinehealthchecks")
}
pub fn machine_pool_resource() -> ApiResource {
    capi_resource("MachinePool", "machinepools")
}
pub fn cluster_class_resource() -> ApiResource {
    capi_resource("ClusterClass", "clusterclasses")
}

pub fn dev_cluster_resource() -> ApiResource {
    cloud::resource(INFRA_GROUP, "DevCluster")
}
pub fn dev_machine_resource() -> ApiResource {
    cloud::resource(INFRA_GROUP, "DevMachine")
}
pub fn dev_machine_pool_resource() -> ApiResource {
    cloud::resource(INFRA_GROUP, "DevMachinePool")
}
pub fn dev_machine_template_resource() -> ApiResource {
    cloud::resource(INFRA_GROUP, "DevMachineTemplate")
}
pub fn dev_cluster_template_resource() -> ApiResource {
    cloud::resource(INFRA_GROUP, "DevClusterTemplate")
}
pub fn dev_control_plane_resource() -> ApiResource {
    cloud::resource(CONTROL_PLANE_GROUP, "DevControlPlane")
}
pub fn dev_control_plane_template_resource() -> ApiResource {
    cloud::resource(CONTROL_PLANE_GROUP, "DevControlPlaneTemplate")
}

/// bootplate's kinds as dynamic resources.
pub fn bootplate_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(BOOTPLATE_GROUP, "v1alpha1", kind),
        plural,
    )
}

fn meta(name: &str) -> Value {
    json!({"name": name, "namespace": NS})
}

fn ref_to(group: &str, kind: &str, name: &str) -> Value {
    json!({"apiGroup": group, "kind": kind, "name": name})
}

/// A Cluster on a DevCluster, with a DevControlPlane when `control_plane` is set.
pub fn cluster(name: &str, control_plane: Option<&str>, paused: bool) -> Value {
    let mut spec = json!({
        "clusterNetwork": {
            "pods": {"cidrBlocks": ["192.168.0.0/16"]},
            "services": {"cidrBlocks": ["10.96.0.0/12"]},
            "serviceDomain": "cluster.local",
        },
        "infrastructureRef": ref_to(INFRA_GROUP, "DevCluster", name),
    });
    if let Some(plane) = control_plane {
        spec["controlPlaneRef"] = ref_to(CONTROL_PLANE_GROUP, "DevControlPlane", plane);
    }
    if paused {
        spec["paused"] = json!(true);
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": meta(name), "spec": spec})
}

/// The cloud's view of a cluster: nothing to say up front, the cloud fills in the endpoint.
pub fn dev_cluster(name: &str) -> Value {
    json!({"apiVersion": format!("{INFRA_GROUP}/{VERSION}"), "kind": "DevCluster", "metadata": meta(name), "spec": {}})
}

/// A control-plane provider object at `version`.
pub fn dev_control_plane(name: &str, version: &str) -> Value {
    json!({
        "apiVersion": format!("{CONTROL_PLANE_GROUP}/{VERSION}"),
        "kind": "DevControlPlane",
        "metadata": meta(name),
        "spec": {"version": version},
    })
}

/// An infrastructure machine (its spec is the cloud's: empty until provisioned).
pub fn dev_machine(name: &str) -> Value {
    json!({"apiVersion": format!("{INFRA_GROUP}/{VERSION}"), "kind": "DevMachine", "metadata": meta(name), "spec": {}})
}

/// A DevMachineTemplate; `flavor` distinguishes templates (a machine size, say).
pub fn dev_machine_template(name: &str, flavor: &str) -> Value {
    json!({
        "apiVersion": format!("{INFRA_GROUP}/{VERSION}"),
        "kind": "DevMachineTemplate",
        "metadata": meta(name),
        "spec": {"template": {"spec": {"flavor": flavor}}},
    })
}

/// A BootplateConfig using the ClusterBootstrapTemplate `template`.
pub fn bootplate_config(name: &str, template: &str) -> Value {
    json!({
        "apiVersion": format!("{BOOTPLATE_GROUP}/v1alpha1"),
        "kind": "BootplateConfig",
        "metadata": meta(name),
        "spec": {"templateRef": {"kind": "ClusterBootstrapTemplate", "name": template}},
    })
}

/// A BootplateConfigTemplate using the ClusterBootstrapTemplate `template`.
pub fn bootplate_config_template(name: &str, template: &str) -> Value {
    json!({
        "apiVersion": format!("{BOOTPLATE_GROUP}/v1alpha1"),
        "kind": "BootplateConfigTemplate",
        "metadata": meta(name),
        "spec": {"template": {"spec": {
            "templateRef": {"kind": "ClusterBootstrapTemplate", "name": template},
        }}},
    })
}

/// A control-plane Machine of `cluster` on the DevMachine and BootplateConfig named `name`.
pub fn control_plane_machine(name: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {"cluster.x-k8s.io/control-plane": "", "cluster.x-k8s.io/cluster-name": cluster},
        },
        "spec": {
            "clusterName": cluster,
            "version": KUBERNETES_VERSION,
            "bootstrap": {"configRef": ref_to(BOOTPLATE_GROUP, "BootplateConfig", name)},
            "infrastructureRef": ref_to(INFRA_GROUP, "DevMachine", name),
        },
    })
}

/// A worker Machine of `cluster` at `version` on the DevMachine and BootplateConfig named `name`.
pub fn worker_machine(name: &str, cluster: &str, version: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {"cluster.x-k8s.io/cluster-name": cluster},
        },
        "spec": {
            "clusterName": cluster,
            "version": version,
            "bootstrap": {"configRef": ref_to(BOOTPLATE_GROUP, "BootplateConfig", name)},
            "infrastructureRef": ref_to(INFRA_GROUP, "DevMachine", name),
        },
    })
}

/// The label the Machines of a [`machine_deployment`] carry (its name), and its selector.
pub const DEPLOYMENT_LABEL: &str = "test.bootplate.dev/deployment";

/// A MachineHealthCheck `name` of `cluster` over the Machines of [`machine_deployment`]
/// `deployment`, with `checks` (its `spec.checks`).
pub fn machine_health_check(name: &str, cluster: &str, deployment: &str, checks: Value) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "clusterName": cluster,
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: deployment}},
            "checks": checks,
        },
    })
}

/// A MachineDeployment of `replicas` workers bootstrapped from the BootplateConfigTemplate
/// `config_template`, on the DevMachineTemplate `infra_template`.
pub fn machine_deployment(
    name: &str,
    cluster: &str,
    replicas: u32,
    config_template: &str,
    infra_template: &str,
    version: &str,
) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {
            "clusterName": cluster,
            "replicas": replicas,
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: name}},
            "template": {
                "metadata": {"labels": {DEPLOYMENT_LABEL: name}},
                "spec": {
                    "clusterName": cluster,
                    "version": version,
                    "bootstrap": {"configRef": ref_to(BOOTPLATE_GROUP, "BootplateConfigTemplate", config_template)},
                    "infrastructureRef": ref_to(INFRA_GROUP, "DevMachineTemplate", infra_template),
                },
            },
        },
    })
}

/// The cloud's scale set for a MachinePool (its spec is the cloud's: empty until it runs).
pub fn dev_machine_pool(name: &str) -> Value {
    json!({"apiVersion": format!("{INFRA_GROUP}/{VERSION}"), "kind": "DevMachinePool", "metadata": meta(name), "spec": {}})
}

/// A MachinePool of `replicas` instances of `cluster`, every one booting from the
/// BootplateConfig `config`, on the DevMachinePool `infra`, spread over `failure_domains`.
pub fn machine_pool(
    name: &str,
    cluster: &str,
    replicas: u32,
    (config, infra): (&str, &str),
    failure_domains: &[&str],
) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachinePool",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {
            "clusterName": cluster,
            "replicas": replicas,
            "failureDomains": failure_domains,
            "template": {
                "metadata": {"labels": {"test.bootplate.dev/pool": name}},
                "spec": {
                    "clusterName": cluster,
                    "version": KUBERNETES_VERSION,
                    "bootstrap": {"configRef": ref_to(BOOTPLATE_GROUP, "BootplateConfig", config)},
                    "infrastructureRef": ref_to(INFRA_GROUP, "DevMachinePool", infra),
                },
            },
        },
    })
}
