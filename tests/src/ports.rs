//! TCP ports for the processes a test starts (apiservers, etcd, managers, webhooks).
//!
//! A port found by binding port 0 comes from the kernel's ephemeral range, the same range every
//! outgoing connection takes its local port from. Between the harness asking and the process
//! binding it, a connection of any of the tiers running beside it could take that port, and the
//! process then fails with "address already in use" (a Cluster API manager did, in a CI run).
//! So ports here come from below the ephemeral range, where the kernel never assigns one on its
//! own, and each is claimed with a lock file held for the life of the test process, so that two
//! test processes running at once never hand out the same one.

use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, bail};

/// The lowest port handed out: above the Kubernetes components' fixed defaults (10248–10259)
/// and the registry's 5000.
const LOWEST: u16 = 20000;

/// The lock files of the ports this process claimed; dropped (unlocked) when it exits.
static CLAIMED: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A TCP port that no other test process holds and that binds on every interface now, outside
/// the ephemeral range: free for this process to bind later.
pub fn claim() -> anyhow::Result<u16> {
    let (lowest, end) = range()?;
    let span = u32::from(end - lowest);
    let start = (RandomState::new().hash_one(std::process::id()) % u64::from(span)) as u32;
    let dir = lock_dir();
    for step in 0..span {
        let port = lowest + ((start + step) % span) as u16;
        let Some(lock) = try_lock(&dir, port)? else {
            continue;
        };
        if bindable(port) {
            CLAIMED.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
            return Ok(port);
        }
    }
    bail!("no port in {lowest}..{end} is free and unclaimed")
}

/// `LOWEST` up to the first ephemeral port (`/proc/sys/net/ipv4/ip_local_port_range`).
fn range() -> anyhow::Result<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .context("reading the ephemeral port range")?;
    let first: u16 = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("the ephemeral port range {text:?} is not two numbers"))?;
    if first < LOWEST + 1000 {
        bail!(
            "the ephemeral port range starts at {first}, leaving fewer than 1000 ports above {LOWEST}"
        );
    }
    Ok((LOWEST, first))
}

/// Where the ports' lock files are (created with the first of them).
fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("bootplate-test-ports")
}

/// The lock of `port`'s file, or None when another process holds it.
fn try_lock(dir: &std::path::Path, port: u16) -> anyhow::Result<Option<File>> {
    let path = dir.join(port.to_string());
    let file = crate::lock_file::open(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Whether `port` binds on all interfaces (as `--webhook-port` does) and on loopback.
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok()
        && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_ports_are_distinct_below_the_ephemeral_range_and_bindable() {
        let (_, end) = range().unwrap();
        let ports: Vec<u16> = (0..50).map(|_| claim().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port was claimed twice: {ports:?}"
        );
        for port in ports {
            assert!(
                (LOWEST..end).contains(&port),
                "{port} is outside {LOWEST}..{end}"
            );
            assert!(bindable(port), "{port} was claimed but does not bind");
        }
    }

    #[test]
    fn a_port_whose_lock_another_holder_has_is_not_claimed() {
        let dir = lock_dir();
        let port = claim().unwrap();
        // A second open file description of the same lock file is another holder.
        assert!(
            try_lock(&dir, port).unwrap().is_none(),
            "{port}'s lock was taken twice"
        );
    }
}
