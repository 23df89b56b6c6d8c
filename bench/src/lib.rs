//! What the benchmark programs share: reading a process's CPU time and memory from /proc,
//! the machine line every run prints, and counting one user's API requests in an audit log.

pub mod measure;

/// What every benchmark program does first: pick rustls' crypto provider (kube's clients need
/// one) and print the machine line.
pub fn start() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    measure::machine_line();
}
