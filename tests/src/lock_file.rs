//! Lock files that test processes running at once share (a pod cluster's slot, a claimed port).

use std::fs::{File, OpenOptions};
use std::path::Path;

use anyhow::Context;

/// Opens the lock file `path`, creating it and its directory when missing. It is opened for
/// reading and writing and never truncated: a holder may keep something in it (a slot keeps its
/// directory), and another process opening it must not erase that.
pub fn open(path: &Path) -> anyhow::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}
