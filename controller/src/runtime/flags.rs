//! Flags of `bootplate run`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::core::token::{LONGEST_TTL, SHORTEST_TTL};
use crate::reconcile::context::Settings;

/// Flags of `bootplate run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Kubeconfig of the management cluster. Default: in-cluster config, then $KUBECONFIG,
    /// then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Watch only this namespace (configs, Machines, Clusters, BootstrapTemplates).
    /// ClusterBootstrapTemplates are always watched. Default: all namespaces.
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconcile only configs, Machines and Clusters whose `cluster.x-k8s.io/watch-filter`
    /// label has this value, so several instances can share a management cluster.
    #[arg(long, value_name = "VALUE")]
    pub watch_filter: Option<String>,
    /// Reconcile only the configs matching this label selector (for example
    /// `bootplate.dev/shard=a` or `shard in (a,b)`): one shard of the configs, so several
    /// deployments can split a management cluster's configs. Machines, Clusters and templates
    /// are still read in full. With --leader-elect, each shard gets a Lease of its own (see
    /// --leader-elect-lease-name).
    #[arg(long, value_name = "SELECTOR", value_parser = parse_selector)]
    pub shard_selector: Option<String>,
    /// How many configs are reconciled at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Lifetime of bootstrap tokens (for example 15m, 1h), from 30s to 7d. Tokens are extended
    /// while their Machine has not joined, and deleted once it has; a MachinePool's token is
    /// rotated instead. Both happen when half of the lifetime is left.
    #[arg(long, default_value = "15m", value_parser = parse_token_ttl)]
    pub bootstrap_token_ttl: Duration,
    /// Timeout of each request to a workload cluster.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub workload_timeout: Duration,
    /// How often the boot reports of a cluster's machines that have not joined are read (one
    /// listing per cluster, shared by its configs), and the least time between two progress
    /// reports a machine sends (its failure and its end are sent at once). See
    /// docs/boot-channel.md.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub boot_report_interval: Duration,
    /// A Machine whose infrastructure is provisioned and that has not reported its boot for
    /// this long gets `Ready=False`, reason `BootNotStarted` (templates with boot reports).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub boot_not_started_after: Duration,
    /// Normal Events (`Rendered`, `TokenCreated`, ...) published per second on average; past
    /// it they are dropped and counted (`bootplate_events_total{result="limited"}`). 0: no
    /// limit. Warnings are never limited. See docs/operations.md.
    #[arg(long, default_value_t = 5.0, value_name = "QPS", value_parser = parse_event_qps)]
    pub event_qps: f64,
    /// How many Normal Events may be published at once after a quiet time (at least 1).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub event_burst: u32,
    /// Address serving Prometheus metrics on /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    pub metrics_addr: std::net::SocketAddr,
    /// Address serving /healthz and /readyz (may equal --metrics-addr).
    #[arg(long, default_value = "0.0.0.0:8081", value_name = "ADDR")]
    pub health_addr: std::net::SocketAddr,
    /// Serve the validating admission webhook (HTTPS, path /validate) on this address, for
    /// example 0.0.0.0:9443. Every replica serves it, leader or not. Off when unset.
    #[arg(long, value_name = "ADDR")]
    pub webhook_addr: Option<std::net::SocketAddr>,
    /// Directory holding the webhook's `tls.crt` and `tls.key` (for example a cert-manager
    /// Secret mounted there); new files are picked up within seconds, without a restart.
    #[arg(
        long,
        default_value = "/tmp/k8s-webhook-server/serving-certs",
        value_name = "DIR"
    )]
    pub webhook_cert_dir: PathBuf,
    /// Serve Cluster API's Runtime SDK (HTTPS: discovery and the in-place update hooks
    /// CanUpdateMachineSet, CanUpdateMachine, UpdateMachine) on this address, for example
    /// 0.0.0.0:9444; an ExtensionConfig points Cluster API at it (deploy/extension). Every
    /// replica serves it, leader or not. Off when unset.
    #[arg(long, value_name = "ADDR")]
    pub extension_addr: Option<std::net::SocketAddr>,
    /// Directory holding the extension's `tls.crt` and `tls.key`; default: --webhook-cert-dir
    /// (one certificate naming both Services).
    #[arg(long, value_name = "DIR")]
    pub extension_cert_dir: Option<PathBuf>,
    /// PEM file of the CA that signs Cluster API's client certificate (its manager's
    /// --runtime-extension-client-cert-file): the extension answers only callers presenting a
    /// certificate from this CA, and refuses every other one in the TLS handshake. Required
    /// with --extension-addr: the hooks read Clusters, templates and Secrets with the
    /// controller's rights. Reloaded when the file changes.
    #[arg(long, value_name = "FILE", requires = "extension_addr")]
    pub extension_client_ca: Option<PathBuf>,
    /// Directory holding `tls.crt` and `tls.key` of a client certificate that bootplate
    /// presents on every call to a BootstrapGenerator, so a generator can require it (mutual
    /// TLS: `bootplate generator serve --client-ca`); new files are picked up within seconds.
    /// Default: no client certificate.
    #[arg(long, value_name = "DIR")]
    pub generator_client_cert_dir: Option<PathBuf>,
    /// Elect a leader among replicas with a coordination.k8s.io/v1 Lease; only the leader
    /// reconciles. Standbys take over when the leader dies or releases the Lease on SIGTERM.
    #[arg(long)]
    pub leader_elect: bool,
    /// Name of the leader-election Lease. Default: `bootplate-leader`; with --shard-selector,
    /// `bootplate-leader-` followed by the selector in lower-case letters, digits and dashes
    /// and a hash of it, so every shard elects its own leader.
    #[arg(long, value_name = "NAME")]
    pub leader_elect_lease_name: Option<String>,
    /// Namespace of the leader-election Lease. Default: $POD_NAMESPACE, else `default`.
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "default",
        value_name = "NAMESPACE"
    )]
    pub leader_elect_namespace: String,
    /// How long the Lease stays valid after the leader's last renewal: the longest a standby
    /// waits when the leader dies without releasing it.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops reconciling and exits.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and standbys try to acquire the Lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level or filter (overrides RUST_LOG), for example `info` or `bootplate=debug`.
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
}

/// Log output format.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration =
        humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 90s, 15m, 1h)"))?;
    if duration.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(duration)
}

/// Normal Events per second: a finite number, 0 or more (0: no limit).
fn parse_event_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps >= 0.0 => Ok(qps),
        _ => Err(format!(
            "{text:?} is not a number of Events per second (0 or more, for example 5 or 0.5; 0: no limit)"
        )),
    }
}

/// A bootstrap token lifetime: from [`SHORTEST_TTL`] to [`LONGEST_TTL`] (see there why).
fn parse_token_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if ttl > LONGEST_TTL {
        return Err(format!(
            "{text} is longer than a bootstrap token may live ({})",
            humantime::format_duration(LONGEST_TTL)
        ));
    }
    if ttl < SHORTEST_TTL {
        return Err(format!(
            "{text} is shorter than a bootstrap token may live ({}): its token would be extended every few seconds",
            humantime::format_duration(SHORTEST_TTL)
        ));
    }
    Ok(ttl)
}

/// A non-empty label selector; the apiserver checks its syntax when `bootplate run` starts.
fn parse_selector(text: &str) -> Result<String, String> {
    let selector = text.trim();
    if selector.is_empty() {
        return Err("must not be empty (example: bootplate.dev/shard=a)".into());
    }
    Ok(selector.to_owned())
}

/// The Lease name used without --leader-elect-lease-name and --shard-selector.
const DEFAULT_LEASE: &str = "bootplate-leader";

impl RunArgs {
    /// The leader-election Lease: the one named, else the default of this shard.
    pub fn lease_name(&self) -> String {
        match &self.leader_elect_lease_name {
            Some(name) => name.clone(),
            None => crate::core::shard::lease_name(DEFAULT_LEASE, self.shard_selector.as_deref()),
        }
    }

    /// Checks relations between flags that clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.leader_elect {
            crate::runtime::leader::check_timing(&self.leader_timing())?;
        }
        if self.extension_addr.is_some() && self.extension_client_ca.is_none() {
            return Err("--extension-addr needs --extension-client-ca: the extension answers only Cluster API, known by its client certificate (docs/operations.md)".into());
        }
        Ok(())
    }

    /// The leader-election timing these flags describe.
    pub fn leader_timing(&self) -> crate::runtime::leader::Timing {
        crate::runtime::leader::Timing {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        }
    }

    /// The controller settings these flags describe.
    pub fn settings(&self) -> Settings {
        Settings {
            namespace: self.namespace.clone(),
            watch_filter: self.watch_filter.clone(),
            shard_selector: self.shard_selector.clone(),
            bootstrap_token_ttl: self.bootstrap_token_ttl,
            workload_timeout: self.workload_timeout,
            boot_report_interval: self.boot_report_interval,
            boot_not_started_after: self.boot_not_started_after,
            concurrency: self.concurrency,
            event_pace: crate::core::pace::EventPace {
                per_second: self.event_qps,
                burst: self.event_burst,
            },
            build: String::new(),
            generator_client_cert: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    fn ttl(flag: &str) -> Result<Duration, String> {
        Run::try_parse_from(["run", &format!("--bootstrap-token-ttl={flag}")])
            .map(|run| run.args.bootstrap_token_ttl)
            .map_err(|e| e.to_string())
    }

    fn run(flags: &[&str]) -> RunArgs {
        let argv = std::iter::once("run").chain(flags.iter().copied());
        Run::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn each_shard_leads_on_its_own_lease_unless_one_is_named() {
        assert_eq!(run(&[]).lease_name(), "bootplate-leader");
        let a = run(&["--shard-selector", "shard=a"]).lease_name();
        let b = run(&["--shard-selector", "shard=b"]).lease_name();
        assert!(a.starts_with("bootplate-leader-shard-a-"), "{a}");
        assert!(b.starts_with("bootplate-leader-shard-b-"), "{b}");
        let named = [
            "--shard-selector",
            "shard=a",
            "--leader-elect-lease-name",
            "mine",
        ];
        assert_eq!(run(&named).lease_name(), "mine");
    }

    #[test]
    fn the_extension_is_served_only_with_a_client_ca() {
        // (flags, the error names)
        let cases: [(&[&str], Option<&str>); 3] = [
            (
                &["--extension-addr=127.0.0.1:9444"],
                Some("--extension-client-ca"),
            ),
            (
                &[
                    "--extension-addr=127.0.0.1:9444",
                    "--extension-client-ca=ca.crt",
                ],
                None,
            ),
            (&[], None),
        ];
        for (flags, error) in cases {
            let found = run(flags).validate().err();
            match (error, found) {
                (None, None) => {}
                (Some(flag), Some(message)) => assert!(message.contains(flag), "{message}"),
                (expected, found) => panic!("{flags:?}: expected {expected:?}, got {found:?}"),
            }
        }
    }

    #[test]
    fn the_event_pace_is_a_finite_rate_of_zero_or_more() {
        let pace = |flags: &[&str]| run(flags).settings().event_pace;
        assert_eq!(pace(&[]), crate::core::pace::EventPace::default());
        let set = pace(&["--event-qps=0.5", "--event-burst=7"]);
        assert_eq!((set.per_second, set.burst), (0.5, 7));
        assert_eq!(pace(&["--event-qps=0"]).per_second, 0.0);
        for bad in ["-1", "NaN", "inf", "fast"] {
            let error = Run::try_parse_from(["run", &format!("--event-qps={bad}")])
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains("--event-qps"), "{error}");
            assert!(error.contains("Events per second"), "{error}");
        }
    }

    #[test]
    fn an_empty_shard_selector_is_refused() {
        let error = Run::try_parse_from(["run", "--shard-selector", " "])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("--shard-selector"), "{error}");
        assert!(error.contains("must not be empty"), "{error}");
    }

    #[test]
    fn bootstrap_token_ttl_20000y_is_refused_with_a_clear_error() {
        let error = ttl("20000y").unwrap_err();
        assert!(error.contains("--bootstrap-token-ttl"), "{error}");
        assert!(
            error.contains("20000y is longer than a bootstrap token may live"),
            "{error}"
        );
        assert!(ttl("0s").unwrap_err().contains("must be more than zero"));
    }

    #[test]
    fn bootstrap_token_ttl_is_at_least_30_seconds_and_at_most_7_days() {
        // (flag, accepted lifetime or the words of the refusal)
        let cases: [(&str, Result<Duration, &str>); 7] = [
            ("15m", Ok(Duration::from_secs(900))),
            ("30s", Ok(SHORTEST_TTL)),
            ("7d", Ok(LONGEST_TTL)),
            (
                "1s",
                Err("1s is shorter than a bootstrap token may live (30s)"),
            ),
            (
                "29s",
                Err("29s is shorter than a bootstrap token may live (30s)"),
            ),
            (
                "8d",
                Err("8d is longer than a bootstrap token may live (7days)"),
            ),
            (
                "366days",
                Err("366days is longer than a bootstrap token may live"),
            ),
        ];
        for (flag, expected) in cases {
            match (ttl(flag), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{flag}"),
                (Err(error), Err(words)) => {
                    assert!(error.contains("--bootstrap-token-ttl"), "{error}");
                    assert!(error.contains(words), "{flag}: {error}");
                }
                (got, _) => panic!("{flag}: {got:?}"),
            }
        }
    }

    #[test]
    fn leader_flags_that_let_two_leaders_overlap_are_refused_at_startup() {
        let leader = |lease: &str, renew: &str, retry: &str| {
            run(&[
                "--leader-elect",
                "--leader-elect-lease-duration",
                lease,
                "--leader-elect-renew-deadline",
                renew,
                "--leader-elect-retry-period",
                retry,
            ])
            .validate()
        };
        assert_eq!(run(&["--leader-elect"]).validate(), Ok(()), "the defaults");
        assert_eq!(leader("20s", "15s", "1s"), Ok(()));
        let error = leader("15s", "14s", "2s").unwrap_err();
        assert!(
            error.contains("--leader-elect-lease-duration (15s)")
                && error.contains("--leader-elect-renew-deadline (14s)")
                && error.contains("--leader-elect-retry-period (2s)"),
            "{error}"
        );
        // Without --leader-elect the timing flags are not used, and not checked.
        let unused = ["--leader-elect-lease-duration", "1s"];
        assert_eq!(run(&unused).validate(), Ok(()));
    }
}
