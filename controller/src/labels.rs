//! Labels and annotations bootplate puts on the objects it writes.

/// On data Secrets: marks them as written by bootplate (value: the config's name), so the
/// controller watches only its own Secrets.
pub const DATA_SECRET: &str = "bootstrap.bootplate.dev/config";
/// On data Secrets: `<Kind>/<name>` of the template rendered.
pub const TEMPLATE: &str = "bootstrap.bootplate.dev/template";
/// On data Secrets: the template revision rendered.
pub const TEMPLATE_REVISION: &str = "bootstrap.bootplate.dev/template-revision";
/// On data Secrets: the precise output format (`cloud-config`, `ignition`, `script`,
/// `mime-multipart`); the `format` key only distinguishes cloud-config from ignition.
pub const FORMAT: &str = "bootstrap.bootplate.dev/format";
/// On data Secrets: the role rendered.
pub const ROLE: &str = "bootstrap.bootplate.dev/role";
/// On data Secrets: a digest of everything the render depended on besides the bootstrap token
/// (see `config_controller::inputs_digest`). A hint, not compared when deciding whether to
/// rewrite the Secret: a restarted controller that finds it equal to what it would render from
/// leaves the config alone without a request.
pub const INPUTS: &str = "bootstrap.bootplate.dev/inputs";
/// On data Secrets: when the bootstrap token in the user-data expires (RFC 3339), as of the
/// last write. A hint like [`INPUTS`]: a refreshed token makes it stale (earlier than the
/// truth), which only costs a restarted controller a look at the token.
pub const TOKEN_EXPIRES: &str = "bootstrap.bootplate.dev/token-expires";
/// On data Secrets of machines that fetch their render (`delivery: Fetch`): `Fetch`. The join's
/// clean-up deletes the sealed payload and its grant only where a data Secret says so, so an
/// inline machine's join costs no deletions of objects that never existed.
pub const DELIVERY: &str = "bootstrap.bootplate.dev/delivery";
/// The annotations [`crate::k8s::data_secret::is_current`] does not compare.
pub const HINTS: [&str; 2] = [INPUTS, TOKEN_EXPIRES];
/// On bootstrap token Secrets in the workload cluster: the UID of the config the token is for.
/// The controller finds a config's token by this label, never by memory, so restarts reuse it.
pub const TOKEN_CONFIG_UID: &str = "bootstrap.bootplate.dev/config-uid";
/// On bootstrap token Secrets: `<namespace>/<name>` of the config, for people.
pub const TOKEN_CONFIG: &str = "bootstrap.bootplate.dev/config";
/// On a node's payload Secret, Role and RoleBinding in the workload cluster: the UID of the
/// config whose payload it is. The config's deletion deletes them by this label. Not
/// [`TOKEN_CONFIG_UID`]: token clean-ups delete every Secret carrying that one.
pub const PAYLOAD_CONFIG_UID: &str = "bootstrap.bootplate.dev/payload-config-uid";
/// On a machine's boot report ConfigMap, Role and RoleBinding in the workload cluster: the UID
/// of its config (docs/boot-channel.md). The reports of a cluster are listed by it; whose
/// report it is comes from the name, which the machine cannot change.
pub const BOOT_REPORT_CONFIG_UID: &str = "bootstrap.bootplate.dev/boot-report-config-uid";
/// On a machine's boot report ConfigMap in the workload cluster: the UID of the management
/// Cluster it reports to. A cluster's listing selects by it, so Cluster objects that share
/// one workload apiserver each read only their own machines' reports.
pub const BOOT_REPORT_CLUSTER_UID: &str = "bootstrap.bootplate.dev/boot-report-cluster-uid";
/// On a machine's fetch payload Secret, Role and RoleBinding in the workload cluster (fetch
/// delivery, docs/boot-channel.md): the UID of its config.
pub const FETCH_CONFIG_UID: &str = "bootstrap.bootplate.dev/fetch-config-uid";
/// The field manager of every write.
pub const FIELD_MANAGER: &str = "bootplate";
