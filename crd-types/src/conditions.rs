//! Condition types and reasons bootplate writes. `docs/concepts.md` explains each reason and
//! what to do about it.

/// Config: the data Secret is written and current.
pub const READY: &str = "Ready";
/// Config: the data Secret exists.
pub const DATA_SECRET_AVAILABLE: &str = "DataSecretAvailable";
/// Config: reconciliation is paused.
pub const PAUSED: &str = "Paused";
/// Config: an in-place update of the booted machine is under way (True), or how the last one
/// ended (False).
pub const IN_PLACE_UPDATING: &str = "InPlaceUpdating";
/// Config: whether the render writes out the network input (`spec.network`) it sets; absent
/// when the config sets none.
pub const NETWORK_APPLIED: &str = "NetworkApplied";
/// Template: every template and partial compiles and renders for each role.
pub const VALID: &str = "Valid";

/// Reasons used in conditions, events and metrics.
pub mod reason {
    /// The data Secret was written.
    pub const DATA_SECRET_CREATED: &str = "DataSecretCreated";
    /// The Cluster or the config is paused.
    pub const PAUSED: &str = "Paused";
    /// Not paused.
    pub const NOT_PAUSED: &str = "NotPaused";
    /// The Cluster named by the config's label does not exist (yet).
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    /// The config has no owner Machine yet.
    pub const WAITING_FOR_MACHINE: &str = "WaitingForMachine";
    /// The Cluster's infrastructure is not provisioned yet.
    pub const WAITING_FOR_INFRASTRUCTURE: &str = "WaitingForInfrastructure";
    /// Another control-plane machine holds the init lock.
    pub const WAITING_FOR_INIT_LOCK: &str = "WaitingForInitLock";
    /// The Machine holding the init lock was handed its `init` data and is gone before the
    /// Cluster reported its control plane initialized: the lock is not handed over by itself.
    pub const INIT_HOLDER_GONE: &str = "InitHolderGone";
    /// The control plane is not initialized yet.
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlane";
    /// The config's owner asks for a role it cannot have: a MachinePool whose template carries
    /// the control-plane label (a pool's instances share one data Secret; only `worker` can be
    /// shared).
    pub const ROLE_NOT_SUPPORTED: &str = "RoleNotSupported";
    /// The config was recreated (`clusterctl move`, a restore) next to the data Secret its
    /// Machine booted from; bootplate adopts that Secret once CAPI finds the Machine's Node.
    pub const WAITING_FOR_NODE: &str = "WaitingForNode";
    /// The referenced template does not exist.
    pub const TEMPLATE_NOT_FOUND: &str = "TemplateNotFound";
    /// The referenced template is broken.
    pub const TEMPLATE_INVALID: &str = "TemplateInvalid";
    /// The reference is not allowed (for example, across namespaces).
    pub const INVALID_REFERENCE: &str = "InvalidReference";
    /// A variable is missing or has the wrong type.
    pub const INVALID_VARIABLES: &str = "InvalidVariables";
    /// Rendering failed (undefined variable, helper error, format check).
    pub const RENDER_FAILED: &str = "RenderFailed";
    /// The output exceeds the size limit.
    pub const OUTPUT_TOO_LARGE: &str = "OutputTooLarge";
    /// A `contentFrom` Secret or key is missing or not valid UTF-8.
    pub const FILE_SOURCE_ERROR: &str = "FileSourceError";
    /// The network input (mirrors, proxy, CAs, NTP, artifacts) is invalid or its Secret unreadable.
    pub const INVALID_NETWORK: &str = "InvalidNetwork";
    /// The template reads every field of the network input the config sets.
    pub const NETWORK_RENDERED: &str = "NetworkRendered";
    /// The template never reads some (or all) of the network input the config sets: the
    /// machine does not get them.
    pub const NETWORK_IGNORED: &str = "NetworkIgnored";
    /// The Cluster's certificates are missing or unreadable.
    pub const CERTIFICATES_ERROR: &str = "CertificatesError";
    /// The workload cluster could not be reached or the token could not be written.
    pub const BOOTSTRAP_TOKEN_ERROR: &str = "BootstrapTokenError";
    /// A `BootstrapGenerator` a template part names failed: unreachable, too slow, an HTTP
    /// error, a refusal, an oversized or malformed response. The message names the generator
    /// and the cause.
    pub const GENERATOR_FAILED: &str = "GeneratorFailed";
    /// The `BootstrapGenerator` a template part names does not exist (yet).
    pub const GENERATOR_NOT_FOUND: &str = "GeneratorNotFound";
    /// The `BootstrapGenerator` a template part names does not allow the config's namespace
    /// (`spec.allowedNamespaces`); it is not called.
    pub const GENERATOR_NOT_ALLOWED: &str = "GeneratorNotAllowed";
    /// The generator already has `spec.maxConcurrency` requests in flight; tried again shortly.
    pub const WAITING_FOR_GENERATOR: &str = "WaitingForGenerator";
    /// Cluster API marked the config as being updated in place; the node applies the new
    /// payload. The data Secret is not rewritten meanwhile.
    pub const IN_PLACE_UPDATING: &str = "InPlaceUpdating";
    /// The node reported that applying the payload failed; the message names the part and step.
    pub const IN_PLACE_UPDATE_FAILED: &str = "InPlaceUpdateFailed";
    /// The node applied the payload published for it.
    pub const IN_PLACE_UPDATED: &str = "InPlaceUpdated";
    /// The machine reported a failed step of its boot; the message names the part, the step
    /// and its exit status, a Warning Event carries the redacted end of its output.
    pub const BOOT_FAILED: &str = "BootFailed";
    /// The machine's infrastructure is provisioned but it has not reported its boot in time
    /// (`--boot-not-started-after`).
    pub const BOOT_NOT_STARTED: &str = "BootNotStarted";
    /// The machine wrote a boot report that cannot be read (too large, malformed); the
    /// message says why.
    pub const BOOT_REPORT_UNREADABLE: &str = "BootReportUnreadable";
    /// Template valid.
    pub const VALID: &str = "Valid";
    /// Template invalid.
    pub const INVALID: &str = "Invalid";
}
