//! Trust boundaries, each tested from the side of the one who crosses it: a tenant that owns its
//! namespace (configs, Secrets, the `<cluster>-kubeconfig`), a node that owns its files, and
//! anything in the cluster that reaches bootplate's ports. `docs/security.md` holds the threat
//! model; every boundary it names has a module here or a named test elsewhere.
//!
//! One module per boundary, so each stays readable on its own.
mod kubeconfig;
mod rbac_namespaced;

mod servers;

mod generator_access;
mod node_payload;

mod node_agent;

mod render_budget;

mod boot_report;
mod fetch_delivery;
mod lint_cluster;
mod lint_decoding;
mod report_policy;
