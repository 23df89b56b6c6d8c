//! Measurements of processes (CPU seconds, resident memory) and of API requests (audit logs).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

/// `part / whole`, NaN for an empty whole.
pub fn per(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { f64::NAN }
}

/// Prints the machine's cores, memory, CPU model and load average.
pub fn machine_line() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = mem
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    println!(
        "machine: {} cores, {:.0} GiB, {model}; load average at start {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_kib / 1048576.0,
        load_average()
    );
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The length of a file, 0 when it does not exist yet.
pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// CPU seconds (user + system) process `pid` has used so far, from /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> f64 {
    static TICKS_PER_SECOND: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let ticks_per_second = *TICKS_PER_SECOND.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it start with the state
    // (field 3), so utime and stime (fields 14 and 15) are the 12th and 13th after it.
    let after_name: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| after_name.get(i).and_then(|v| v.parse::<f64>().ok());
    match (field(11), field(12)) {
        (Some(user), Some(system)) => (user + system) / ticks_per_second,
        _ => f64::NAN,
    }
}

/// A field of /proc/PID/status in KiB (VmHWM: peak resident set; VmRSS: current).
pub fn rss_kib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// API requests by (cluster, verb, resource), counted from audit logs.
#[derive(Default)]
pub struct Requests {
    pub by_kind: BTreeMap<(&'static str, String, String), u64>,
    seen: HashSet<String>,
}

impl Requests {
    /// Adds the requests in the audit log at `path` after byte `offset` that `select` picks
    /// (it gets each audit event), counted once per audit ID (a watch logs two events).
    pub fn add_from(
        &mut self,
        cluster: &'static str,
        path: &Path,
        offset: u64,
        select: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<()> {
        let text = std::fs::read(path)?;
        let Some(text) = text.get(offset as usize..) else {
            anyhow::bail!(
                "{} is shorter than when counting started: rotated?",
                path.display()
            );
        };
        let text = String::from_utf8_lossy(text);
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if !select(&event) {
                continue;
            }
            let id = event["auditID"].as_str().unwrap_or_default().to_owned();
            if !self.seen.insert(id) {
                continue;
            }
            let object = &event["objectRef"];
            let mut resource = object["resource"].as_str().unwrap_or("-").to_owned();
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            let verb = event["verb"].as_str().unwrap_or_default().to_owned();
            *self.by_kind.entry((cluster, verb, resource)).or_default() += 1;
        }
        Ok(())
    }

    /// The user a request was made as: the impersonated one where there is one.
    pub fn user(event: &Value) -> Option<&str> {
        event["impersonatedUser"]["username"]
            .as_str()
            .or(event["user"]["username"].as_str())
    }

    pub fn count(&self, f: impl Fn(&str) -> bool) -> u64 {
        self.by_kind
            .iter()
            .filter(|((_, verb, _), _)| f(verb))
            .map(|(_, n)| n)
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.count(|_| true)
    }

    pub fn writes(&self) -> u64 {
        self.count(|v| {
            matches!(
                v,
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
        })
    }

    pub fn reads(&self) -> u64 {
        self.count(|v| matches!(v, "get" | "list"))
    }

    pub fn watches(&self) -> u64 {
        self.count(|v| v == "watch")
    }

    /// Prints the totals per `n` configs and one line per (cluster, verb, resource).
    pub fn print(&self, phase: &str, n: usize) {
        let total = self.total();
        println!(
            "{phase}: API requests {total} ({:.2} per config): writes {} ({:.2}/config), reads {} ({:.2}/config), watches {}",
            per(total as f64, n as f64),
            self.writes(),
            per(self.writes() as f64, n as f64),
            self.reads(),
            per(self.reads() as f64, n as f64),
            self.watches()
        );
        for ((cluster, verb, resource), count) in &self.by_kind {
            println!(
                "  {cluster:<10} {verb:<7} {resource:<34} {count:>7}  ({:.3}/config)",
                per(*count as f64, n as f64)
            );
        }
    }
}

/// A provider's updates of bootstrap token Secrets (expiry extensions) after a restart, split
/// by whether the token was due: `due`, the token had half of `--bootstrap-token-ttl` or less
/// left at the update, by the expiry it had when the old process stopped, so a process that
/// kept running would have extended it by then too; `early`, it had more, so the restart
/// brought the extension forward.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TokenUpdates {
    pub due: u64,
    pub early: u64,
    seen: HashSet<String>,
}

impl TokenUpdates {
    /// Adds the token Secret updates in the audit log at `path` after byte `offset` that
    /// `select` picks. `expiries`: each token Secret's expiry (by name) when the old process
    /// stopped; `ttl`: the tokens' lifetime.
    pub fn add_from(
        &mut self,
        path: &Path,
        offset: u64,
        select: impl Fn(&Value) -> bool,
        expiries: &BTreeMap<String, Timestamp>,
        ttl: SignedDuration,
    ) -> anyhow::Result<()> {
        let text = std::fs::read(path)?;
        let text = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            self.add(&event, &select, expiries, ttl);
        }
        Ok(())
    }

    /// Counts `event` when it is a token Secret update `select` picks (once per audit ID).
    pub fn add(
        &mut self,
        event: &Value,
        select: impl Fn(&Value) -> bool,
        expiries: &BTreeMap<String, Timestamp>,
        ttl: SignedDuration,
    ) {
        let object = &event["objectRef"];
        let name = object["name"].as_str().unwrap_or_default();
        let update = matches!(event["verb"].as_str(), Some("update" | "patch"));
        let token = object["resource"] == "secrets"
            && object["namespace"] == "kube-system"
            && name.starts_with("bootstrap-token-");
        if !update || !token || !select(event) {
            return;
        }
        let id = event["auditID"].as_str().unwrap_or_default().to_owned();
        if !self.seen.insert(id) {
            return;
        }
        let at = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok());
        let due = match (expiries.get(name), at) {
            (Some(expires), Some(at)) => at >= *expires - ttl / 2,
            // A token without a known expiry never expires: due at any time.
            (None, _) => true,
            (Some(_), None) => false,
        };
        if due {
            self.due += 1;
        } else {
            self.early += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_token_update_counts_as_due_from_half_its_lifetime() {
        let ttl = SignedDuration::from_mins(15);
        let stop: Timestamp = "2026-12-01T07:00:00Z".parse().unwrap();
        let expiries = BTreeMap::from([
            // 10 minutes left at the stop: due 2.5 minutes after it.
            (
                "bootstrap-token-aaaaaa".to_owned(),
                stop + SignedDuration::from_mins(10),
            ),
            // 5 minutes left: due already.
            (
                "bootstrap-token-bbbbbb".to_owned(),
                stop + SignedDuration::from_mins(5),
            ),
        ]);
        let update = |id: &str, name: &str, verb: &str, seconds_after: i64| {
            json!({
                "auditID": id,
                "verb": verb,
                "requestReceivedTimestamp": (stop + SignedDuration::from_secs(seconds_after)).to_string(),
                "objectRef": {"resource": "secrets", "namespace": "kube-system", "name": name},
            })
        };
        let mut counted = TokenUpdates::default();
        for event in [
            update("1", "bootstrap-token-aaaaaa", "patch", 20),
            update("2", "bootstrap-token-aaaaaa", "patch", 150),
            update("3", "bootstrap-token-bbbbbb", "update", 20),
            update("3", "bootstrap-token-bbbbbb", "update", 20),
            update("4", "bootstrap-token-bbbbbb", "get", 20),
            update("5", "bootstrap-token-cccccc", "create", 20),
            update("6", "kubeadm-config", "patch", 20),
        ] {
            counted.add(&event, |_| true, &expiries, ttl);
        }
        assert_eq!((counted.due, counted.early), (2, 1));
    }
}
