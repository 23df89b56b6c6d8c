//! `bootplate-agent`: flags, the client with the node's identity, the loop.

use std::path::PathBuf;
use std::time::Duration;

use agent::Node;
use agent::identity::Identity;
use agent::watch::Agent;
use clap::Parser;

/// Applies this node's `InPlace` template parts (files, systemd units, commands) from its
/// payload Secret in the workload cluster, reports the applied revision on its Node, and puts
/// them back at every interval when they drift.
#[derive(Parser, Debug)]
#[command(version)]
struct Flags {
    /// This node's name (its Node object; the payload Secret is kube-system/bootplate-node-<name>).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// A kubeconfig with the node's identity (system:node:<name>), usually the kubelet's. It and
    /// the files it names are read again before each pass: a rotated certificate is used.
    #[arg(
        long,
        env = "KUBECONFIG",
        default_value = "/etc/kubernetes/kubelet.conf"
    )]
    kubeconfig: PathBuf,
    /// The directory the node's paths are under (a directory other than / is for tests and
    /// image builds).
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// How often the payload is read and applied again (drift is put back at this interval).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// The systemctl program.
    #[arg(long, default_value = "systemctl")]
    systemctl: PathBuf,
    /// The shell that runs the parts' commands (`SHELL -c COMMAND`).
    #[arg(long, default_value = "sh")]
    shell: PathBuf,
    /// How long one command or systemctl call may run; then its whole process group is killed
    /// and the step is reported as timed out.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    command_timeout: Duration,
    /// Apply once and exit (non-zero when the pass failed).
    #[arg(long)]
    once: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let flags = Flags::parse();
    let agent = Agent {
        identity: Identity::kubeconfig(&flags.kubeconfig),
        node_name: flags.node_name,
        node: Node {
            root: flags.root,
            systemctl: flags.systemctl.into(),
            shell: flags.shell.into(),
            command_timeout: flags.command_timeout,
        },
    };
    // A kubeconfig that does not load stops the agent at once; later it is read before each
    // pass (a rotated certificate is picked up).
    agent.identity.client().await?;
    if flags.once {
        match agent.pass().await? {
            agent::watch::Pass::Failed(message) => anyhow::bail!(message),
            pass => tracing::info!(?pass, "pass done"),
        }
        return Ok(());
    }
    agent.run(flags.interval).await;
    Ok(())
}
