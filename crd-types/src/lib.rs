//! API types of bootplate (`bootstrap.bootplate.dev/v1alpha1`) and the subset of Cluster API
//! types the controller reads.
//!
//! Doc comments on fields become the CRD descriptions that `kubectl explain` shows, so they are
//! written for the people who write these objects.

pub mod capi;
pub mod conditions;
pub mod config;
pub mod crds;
pub mod generator;
pub mod network;
pub mod payload;
pub mod reference;
pub mod schema;
pub mod secret_ref;
pub mod strict;
pub mod template;

pub use config::{
    BootStatus, BootplateConfig, BootplateConfigSpec, BootplateConfigStatus,
    BootplateConfigTemplate, BootplateConfigTemplateResource, BootplateConfigTemplateSpec,
    ConfigFile, ConfigInitialization, FileSource, InPlaceStatus, ObjectMetaTemplate, TemplateKind,
    TemplateRef,
};
pub use generator::{
    BootstrapGenerator, ClientConfig, GeneratorSecrets, GeneratorSpec, ServiceReference,
};
pub use network::NetworkConfig;
pub use secret_ref::SecretKeyRef;
pub use template::{
    BootReports, BootstrapTemplate, BootstrapTemplateStatus, ClusterBootstrapTemplate,
    ClusterBootstrapTemplateSpec, Compression, Delivery, DropIn, FileEncoding, ItemSchema, OsInfo,
    OutputFormat, Part, PartGenerator, Role, TemplateFile, TemplateSpec, Unit, UpdatePolicy,
    UpdateStrategy, ValueType, VariableDecl, VariableSchema,
};

/// API group of every bootplate kind.
pub const GROUP: &str = "bootstrap.bootplate.dev";
/// The one served (and stored) version.
pub const VERSION: &str = "v1alpha1";
