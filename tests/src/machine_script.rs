//! A machine whose boot fails, for the boot channel's scenarios: a `script` template whose
//! `join` part prints the machine's token and exits 7, and the machine itself, which is the
//! rendered script run by bash with its paths moved under a temporary directory (its reporter
//! sends to the workload apiserver with curl, the token and the CA from the render).

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

/// The status the failing template's `join` part exits with.
pub const FAILING_STATUS: i32 = 7;

/// A ClusterBootstrapTemplate `name` (script format, boot reports on) whose `install` part
/// succeeds and whose `join` part prints `kubeadm join --token <token>: preflight failed` to
/// standard error and exits [`FAILING_STATUS`].
pub fn failing_join_template(name: &str) -> Value {
    json!({
        "apiVersion": "bootstrap.bootplate.dev/v1alpha1",
        "kind": "ClusterBootstrapTemplate",
        "metadata": {"name": name},
        "spec": {
            "os": {"name": "linux"},
            "format": "script",
            "parts": [
                {"name": "install", "commands": ["echo installing"]},
                {"name": "join", "roles": ["control-plane-join", "worker"], "commands": [
                    format!("echo \"kubeadm join --token {{{{join.token}}}}: preflight failed\" >&2; exit {FAILING_STATUS}"),
                    "echo never",
                ]},
            ],
        },
    })
}

/// Runs the rendered `script` user-data as the machine would, with its paths under `root`
/// (at most 60 s); its exit status.
pub fn run_script(user_data: &str, root: &Path) -> Option<i32> {
    let root = root.to_string_lossy();
    let script = user_data
        .replace("/etc/bootplate/", &format!("{root}/etc/bootplate/"))
        .replace("/run/", &format!("{root}/run/"));
    let path = format!("{root}/user-data.sh");
    std::fs::write(&path, script).unwrap();
    let status = Command::new("timeout")
        .args(["60", "bash", &path])
        .status()
        .expect("bash runs");
    status.code()
}
