//! The controller's RBAC from `deploy/rbac`, applied to a test apiserver, and a kubeconfig that
//! impersonates its ServiceAccount: tests then run the controller with exactly the rights a
//! cluster admin grants it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::ApiServer;

/// The namespace and name of the controller's ServiceAccount in `deploy/rbac`.
pub const SERVICE_ACCOUNT: (&str, &str) = ("bootplate-system", "bootplate-manager");

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin.unwrap_or_default().as_bytes())?;
    drop(input);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies `deploy/rbac` (and its namespace) and returns a kubeconfig that acts as the
/// controller's ServiceAccount.
pub async fn install(server: &ApiServer) -> anyhow::Result<PathBuf> {
    let admin = server.kubeconfig_path()?;
    let rbac_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rbac");
    let (namespace, name) = SERVICE_ACCOUNT;
    kubectl(&admin, &["create", "namespace", namespace], None)?;
    let manifests = kubectl(
        &admin,
        &["kustomize", rbac_dir.to_str().context("UTF-8 path")?],
        None,
    )?;
    kubectl(&admin, &["apply", "-f", "-"], Some(&manifests))?;
    impersonating_kubeconfig(server, namespace, name, "controller-kubeconfig")
}

/// Writes a kubeconfig (file `file` in the server's directory) with which the admin acts as
/// ServiceAccount `namespace/name`: a process run with it has exactly that account's rights.
pub fn impersonating_kubeconfig(
    server: &ApiServer,
    namespace: &str,
    name: &str,
    file: &str,
) -> anyhow::Result<PathBuf> {
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let impersonating = server.kubeconfig_yaml().replace(
        "    token: ",
        &format!(
            "    as: {user}\n    as-groups: [system:serviceaccounts, \"system:serviceaccounts:{namespace}\", system:authenticated]\n    token: "
        ),
    );
    let path = server.dir().join(file);
    std::fs::write(&path, impersonating)?;
    Ok(path)
}
