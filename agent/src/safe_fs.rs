//! The node's paths, opened without following symbolic links, through directories only root
//! can change.
//!
//! The agent runs as root and writes, chmods, chowns and removes where a payload says. If a
//! directory on the way could be changed by another user, that user could put a link where a
//! directory or a file is expected (or a file where the agent's temporary file will be) and make
//! root write, chmod or chown a file of their choosing. So:
//!
//! - every path is walked one component at a time from the root with
//!   `openat(O_NOFOLLOW | O_DIRECTORY)`; a link anywhere on it is refused, not followed;
//! - each directory on it (the root included) must be owned by root (or by the user the agent
//!   runs as, for a test's root) and writable by no group and no other user, or nothing is done
//!   in it;
//! - a new file is created with `O_CREAT | O_EXCL | O_NOFOLLOW` under a random name in its
//!   directory, chowned then chmodded through its descriptor (chown clears setuid and setgid
//!   bits, so the mode comes last), synced, and renamed over the target with `renameat` on the
//!   same directory descriptor;
//! - a link at the target itself is refused (neither followed nor replaced): it is not what the
//!   payload wrote, and someone should look at it.
//!
//! The directories above the root (`--root`, `/` on a node) are the operator's choice and are
//! not checked. rustix gives these system calls with owned descriptors and no `unsafe`; it is
//! already in the build (tempfile uses it) and calls the kernel directly, which suits the static
//! agent.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why a path was not used.
#[derive(Debug, thiserror::Error)]
pub enum UnsafePath {
    /// A link where a directory or the file was expected.
    #[error("`{path}` is a symbolic link: the agent neither follows nor replaces links")]
    Symlink { path: String },
    /// Something else than a directory on the path.
    #[error("`{path}` is not a directory")]
    NotADirectory { path: String },
    /// A directory another user could change.
    #[error(
        "directory `{path}` can be changed by others than root (owner uid {uid}, group gid {gid}, \
         mode {mode:04o}): the agent writes only through directories that only root can change"
    )]
    Writable {
        path: String,
        uid: u32,
        gid: u32,
        mode: u32,
    },
    /// A file the agent reads is larger than it accepts.
    #[error("`{path}` is larger than {limit} bytes")]
    TooLarge { path: String, limit: u64 },
    /// Any other failure of a system call.
    #[error("`{path}`: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

fn io_error(path: &str, source: impl Into<std::io::Error>) -> UnsafePath {
    UnsafePath::Io {
        path: path.to_owned(),
        source: source.into(),
    }
}

/// What a file should be: content, mode (permission bits, setuid/setgid/sticky included) and
/// owner.
#[derive(Clone, Copy, Debug)]
pub struct FileSpec<'a> {
    pub content: &'a [u8],
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The node's root directory, opened and checked.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    /// The user the agent runs as: may own directories besides root.
    agent_uid: u32,
}

impl Root {
    /// Opens the directory `path` (the node's `/`) and checks it as any directory below it.
    pub fn open(path: &Path) -> Result<Root, UnsafePath> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| io_error("/", e))?;
        let root = Root {
            fd,
            agent_uid: rustix::process::geteuid().as_raw(),
        };
        root.check_dir(&root.fd, "/")?;
        Ok(root)
    }

    /// The owner of the root directory.
    pub fn owner(&self) -> Result<(u32, u32), UnsafePath> {
        let stat = rustix::fs::fstat(&self.fd).map_err(|e| io_error("/", e))?;
        Ok((stat.st_uid, stat.st_gid))
    }

    /// Refuses a directory another user could change.
    fn check_dir(&self, fd: impl AsFd, path: &str) -> Result<(), UnsafePath> {
        let stat = rustix::fs::fstat(fd).map_err(|e| io_error(path, e))?;
        let mode = stat.st_mode & 0o7777;
        let owner_trusted = stat.st_uid == 0 || stat.st_uid == self.agent_uid;
        if !owner_trusted || mode & 0o022 != 0 {
            return Err(UnsafePath::Writable {
                path: path.to_owned(),
                uid: stat.st_uid,
                gid: stat.st_gid,
                mode,
            });
        }
        Ok(())
    }

    /// The directory `dir` (a node path: `` for the root, `/a/b`), walked from the root one
    /// component at a time without following links, each directory checked. Missing ones are
    /// created (mode 0755) when `create`, else the answer is `None`.
    fn walk(&self, dir: &str, create: bool) -> Result<Option<OwnedFd>, UnsafePath> {
        let mut current = self.fd.try_clone().map_err(|e| io_error("/", e))?;
        let mut walked = String::new();
        for name in dir.split('/').filter(|s| !s.is_empty()) {
            walked.push('/');
            walked.push_str(name);
            let next = match open_dir(&current, name) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&current, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => open_dir(&current, name),
                        Err(e) => return Err(io_error(&walked, e)),
                    }
                }
                Err(Errno::NOENT) => return Ok(None),
                other => other,
            };
            let next = next.map_err(|e| not_followed(&current, name, &walked, e))?;
            self.check_dir(&next, &walked)?;
            current = next;
        }
        Ok(Some(current))
    }

    /// Writes `spec` at the node path `path` unless the file there already is exactly that; the
    /// directories on the way are created. A reader (or a crash) sees the old file or the new
    /// one, never a part. Returns whether it wrote.
    pub fn write_if_different(&self, path: &str, spec: FileSpec) -> Result<bool, UnsafePath> {
        let (dir_path, name) = split(path);
        let dir = (self.walk(dir_path, true)?).expect("walk creates what is missing");
        if is_current(&dir, name, path, &spec)? {
            return Ok(false);
        }
        let (temp, file) = create_temp(&dir, dir_path)?;
        let written = fill(file, &spec)
            .and_then(|()| rustix::fs::renameat(&dir, &temp, &dir, name).map_err(Into::into))
            .and_then(|()| rustix::fs::fsync(&dir).map_err(Into::into));
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&dir, &temp, AtFlags::empty());
        }
        written.map(|()| true).map_err(|e| io_error(path, e))
    }

    /// Removes the file at the node path `path`; returns whether there was one. A missing
    /// directory on the way means there is nothing to remove; a link at `path` is removed itself
    /// (removing a link changes nothing else).
    pub fn remove(&self, path: &str) -> Result<bool, UnsafePath> {
        let (dir_path, name) = split(path);
        let Some(dir) = self.walk(dir_path, false)? else {
            return Ok(false);
        };
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(io_error(path, e)),
        }
    }

    /// The content of the file at the node path `path`, at most `limit` bytes (`None`: no such
    /// file).
    pub fn read(&self, path: &str, limit: u64) -> Result<Option<Vec<u8>>, UnsafePath> {
        let (dir_path, name) = split(path);
        let Some(dir) = self.walk(dir_path, false)? else {
            return Ok(None);
        };
        let file = match open_file(&dir, name) {
            Err(Errno::NOENT) => return Ok(None),
            other => other.map_err(|e| not_followed(&dir, name, path, e))?,
        };
        let size = rustix::fs::fstat(&file)
            .map_err(|e| io_error(path, e))?
            .st_size;
        if u64::try_from(size).unwrap_or(u64::MAX) > limit {
            return Err(UnsafePath::TooLarge {
                path: path.to_owned(),
                limit,
            });
        }
        let mut bytes = Vec::new();
        (File::from(file).take(limit + 1))
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(path, e))?;
        if bytes.len() as u64 > limit {
            return Err(UnsafePath::TooLarge {
                path: path.to_owned(),
                limit,
            });
        }
        Ok(Some(bytes))
    }
}

/// `/a/b/c` → (`/a/b`, `c`); the path is absolute and normalised (the payload check).
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn open_dir(dir: impl AsFd, name: &str) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(dir, name, flags, Mode::empty())
}

/// Opens a file for reading without following a link and without blocking on a FIFO.
fn open_file(dir: impl AsFd, name: &str) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty())
}

/// Names an `openat` failure: a link (refused), not a directory, or another error.
fn not_followed(dir: impl AsFd, name: &str, path: &str, e: Errno) -> UnsafePath {
    if matches!(e, Errno::LOOP | Errno::NOTDIR) {
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) if FileType::from_raw_mode(s.st_mode) == FileType::Symlink => {
                return UnsafePath::Symlink {
                    path: path.to_owned(),
                };
            }
            Ok(_) if e == Errno::NOTDIR => {
                return UnsafePath::NotADirectory {
                    path: path.to_owned(),
                };
            }
            _ => {}
        }
    }
    io_error(path, e)
}

/// Whether the file `name` in `dir` already is `spec`: a regular file with its mode, owner and
/// content (read no further than the expected length).
fn is_current(dir: impl AsFd, name: &str, path: &str, spec: &FileSpec) -> Result<bool, UnsafePath> {
    let file = match open_file(&dir, name) {
        Err(Errno::NOENT) => return Ok(false),
        other => other.map_err(|e| not_followed(&dir, name, path, e))?,
    };
    let stat = rustix::fs::fstat(&file).map_err(|e| io_error(path, e))?;
    let same_meta = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
        && stat.st_mode & 0o7777 == spec.mode
        && (stat.st_uid, stat.st_gid) == (spec.uid, spec.gid)
        && u64::try_from(stat.st_size).ok() == Some(spec.content.len() as u64);
    if !same_meta {
        return Ok(false);
    }
    let mut bytes = Vec::with_capacity(spec.content.len());
    (File::from(file).take(spec.content.len() as u64 + 1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, e))?;
    Ok(bytes == spec.content)
}

/// A new, empty file in `dir` under a random name no one can have prepared (`O_EXCL`: an
/// existing name, link or not, is never opened).
fn create_temp(dir: impl AsFd, dir_path: &str) -> Result<(String, File), UnsafePath> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut last = Errno::EXIST;
    for _ in 0..4 {
        let mut random = [0u8; 8];
        rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| io_error(dir_path, e))?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!(".{hex}.bootplate-tmp");
        match rustix::fs::openat(&dir, name.as_str(), flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => return Ok((name, File::from(fd))),
            Err(Errno::EXIST) => last = Errno::EXIST,
            Err(e) => {
                last = e;
                break;
            }
        }
    }
    Err(io_error(&format!("{dir_path}/"), last))
}

/// Content, owner, then mode (chown clears setuid and setgid bits), then synced.
fn fill(mut file: File, spec: &FileSpec) -> std::io::Result<()> {
    file.write_all(spec.content)?;
    let stat = rustix::fs::fstat(&file)?;
    if (stat.st_uid, stat.st_gid) != (spec.uid, spec.gid) {
        let uid = rustix::fs::Uid::from_raw(spec.uid);
        let gid = rustix::fs::Gid::from_raw(spec.gid);
        rustix::fs::fchown(&file, Some(uid), Some(gid))?;
    }
    rustix::fs::fchmod(&file, Mode::from_raw_mode(spec.mode))?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_directory_and_name() {
        assert_eq!(split("/etc/a.conf"), ("/etc", "a.conf"));
        assert_eq!(split("/a"), ("", "a"));
        assert_eq!(split("/a/b/c"), ("/a/b", "c"));
    }
}
