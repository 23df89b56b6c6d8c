//! The offline commands: `bootplate render`, `bootplate lint`, `bootplate diff` and `bootplate import`. They
//! read YAML files, use the
//! render engine exactly as the controller does, and talk to no cluster (only to the generators
//! given with `--generator`, and with `lint --kubeconfig`, read-only, to the cluster that holds
//! the templates configs reference, and with `import --kubeconfig`, one `get`, to the cluster
//! that holds the KubeadmConfigTemplate to import). And `bootplate generator serve`, the reference generator.
//!
//! Exit codes: 0 success, 1 the template failed (render or lint), 2 bad usage or unreadable
//! input (clap's usage errors exit with 2 too); `diff` adds 3, a machine would be replaced.

pub mod cluster;
pub mod diagnostic;
pub mod diff;
pub mod generator;
pub mod import;
pub mod input;
pub mod lint;
pub mod objects;
pub mod references;
pub mod render;
pub mod report;
pub mod sources;
pub mod tools;
pub mod yaml11;

use std::process::ExitCode;

/// The template rendered / linted cleanly.
pub const EXIT_OK: u8 = 0;
/// Rendering failed, or lint found errors.
pub const EXIT_FAILED: u8 = 1;
/// Bad usage or unreadable input.
pub const EXIT_INPUT: u8 = 2;

fn exit(code: u8) -> ExitCode {
    ExitCode::from(code)
}
