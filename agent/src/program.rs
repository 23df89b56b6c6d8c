//! Running a program for a step (a command, a systemctl call) with a deadline.
//!
//! A command that hangs must not stop the agent for good: each program runs in its own process
//! group, and when it outlives its timeout the whole group (the shell and whatever it started)
//! is killed. Only the end of its error output is kept (a bounded ring, read on a thread so a
//! chatty program never blocks on a full pipe), and only a redacted tail of that is reported
//! (`redact`); its standard output is discarded.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::redact;

/// How much of the error output is kept (its end) before the redacted tail is taken.
const KEPT_BYTES: usize = 4096;
/// How long the error output may stay open after the program ended (a daemon it started may
/// hold it): what arrived by then is used.
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// Why a program did not succeed; the message is safe to report.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Failure {
    /// It could not be started.
    #[error("cannot run {program}: {message}")]
    Spawn { program: String, message: String },
    /// It ran longer than the timeout; its process group was killed.
    #[error("timed out after {}: its process group was killed", humantime::format_duration(*.0))]
    TimedOut(Duration),
    /// It ended with a failure status; `tail` is its redacted last line of error output.
    #[error("{status}{}", suffix(.tail))]
    Failed { status: String, tail: String },
}

/// `: tail`, or nothing for an empty tail.
fn suffix(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {tail}")
    }
}

/// Runs `command` (its stdin and stdout are set to null, its stderr captured) and waits for it
/// at most `timeout`.
pub fn run(command: &mut Command, timeout: Duration) -> Result<(), Failure> {
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| Failure::Spawn {
            program,
            message: e.to_string(),
        })?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let (sender, output) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(keep_end(stderr));
    });
    let status = match wait(&mut child, timeout) {
        Some(status) => status,
        None => {
            let group = rustix::process::Pid::from_child(&child);
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            let _ = child.wait();
            return Err(Failure::TimedOut(timeout));
        }
    };
    if status.success() {
        return Ok(());
    }
    let kept = output.recv_timeout(OUTPUT_GRACE).unwrap_or_default();
    Err(Failure::Failed {
        status: status.to_string(),
        tail: redact::tail(&String::from_utf8_lossy(&kept)),
    })
}

/// The child's status once it ends, or `None` when `timeout` passes first.
fn wait(child: &mut std::process::Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            // Not ours to wait for any more: treat as a failure to end in time.
            Err(_) => return None,
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Reads `from` to its end, keeping the last `KEPT_BYTES`.
fn keep_end(mut from: impl Read) -> Vec<u8> {
    let mut kept = Vec::with_capacity(KEPT_BYTES * 2);
    let mut buf = [0u8; 4096];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > KEPT_BYTES {
                    kept.drain(..kept.len() - KEPT_BYTES);
                }
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_end_of_a_long_output_is_kept() {
        let mut long = vec![b'a'; 100_000];
        long.extend_from_slice(b"the end");
        let kept = keep_end(&long[..]);
        assert_eq!(kept.len(), KEPT_BYTES);
        assert!(kept.ends_with(b"the end"));
    }

    #[test]
    fn failures_read_as_their_cause() {
        let failed = Failure::Failed {
            status: "exit status: 3".into(),
            tail: "no such file".into(),
        };
        assert_eq!(failed.to_string(), "exit status: 3: no such file");
        let quiet = Failure::Failed {
            status: "exit status: 1".into(),
            tail: String::new(),
        };
        assert_eq!(quiet.to_string(), "exit status: 1");
        assert_eq!(
            Failure::TimedOut(Duration::from_secs(600)).to_string(),
            "timed out after 10m: its process group was killed"
        );
    }
}
