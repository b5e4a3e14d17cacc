//! The GPU lock: one optimization run per GPU at a time.
//!
//! A running daemon holds an exclusive `flock` on `<runs>/gpu.lock` and writes its
//! run id and pid into it. The kernel drops the lock when the process dies, even on
//! `kill -9`, so a stale pid file can never block a new run, and "is this run alive?"
//! is answered by the lock rather than by trusting a pid.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("run {run_id} (pid {pid}) is already optimizing on this GPU; watch it with `optimizerd watch {run_id}`, stop it with `optimizerd stop {run_id}`, or pass --allow-concurrent")]
    Held { run_id: String, pid: u32 },
    #[error("cannot use the lock file {path}; the runs folder must be writable (`optimizerd doctor` checks it)")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Held for the daemon's lifetime; released on drop or process death.
pub struct GpuLock {
    _file: File,
}

pub fn lock_path(runs_dir: &Path) -> PathBuf {
    runs_dir.join("gpu.lock")
}

fn open(path: &Path) -> Result<File, LockError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| LockError::Io { path: path.to_path_buf(), source })
}

fn try_flock(file: &File, op: i32) -> bool {
    // SAFETY: flock(2) on a descriptor we own; no memory is shared.
    unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) == 0 }
}

impl GpuLock {
    /// Take the lock for `run_id`, or say which run holds it.
    pub fn acquire(runs_dir: &Path, run_id: &str) -> Result<GpuLock, LockError> {
        let path = lock_path(runs_dir);
        let mut file = open(&path)?;
        if !try_flock(&file, libc::LOCK_EX) {
            let (run_id, pid) = read_owner(&mut file).unwrap_or_else(|| ("<unknown>".into(), 0));
            return Err(LockError::Held { run_id, pid });
        }
        let io = |source| LockError::Io { path: path.clone(), source };
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{run_id} {}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(GpuLock { _file: file })
    }
}

/// The run holding the lock right now, if any: (run id, pid).
pub fn holder(runs_dir: &Path) -> Option<(String, u32)> {
    let path = lock_path(runs_dir);
    let mut file = File::open(&path).ok()?;
    if try_flock(&file, libc::LOCK_SH) {
        // Nobody holds it (we just got it shared); dropping the file releases it.
        return None;
    }
    read_owner(&mut file).or(Some(("<unknown>".into(), 0)))
}

fn read_owner(file: &mut File) -> Option<(String, u32)> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    let mut parts = text.split_whitespace();
    let run = parts.next()?.to_string();
    let pid = parts.next()?.parse().ok()?;
    Some((run, pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_acquire_names_the_holder_and_drop_releases() {
        let dir = tempfile::tempdir().unwrap();
        assert!(holder(dir.path()).is_none());
        let lock = GpuLock::acquire(dir.path(), "run-a").unwrap();
        // flock locks belong to the open file description: a second open conflicts even in-process.
        match GpuLock::acquire(dir.path(), "run-b") {
            Err(LockError::Held { run_id, pid }) => {
                assert_eq!(run_id, "run-a");
                assert_eq!(pid, std::process::id());
            }
            other => panic!("expected Held, got {:?}", other.map(|_| ())),
        }
        assert_eq!(holder(dir.path()).map(|h| h.0), Some("run-a".into()));
        drop(lock);
        assert!(holder(dir.path()).is_none());
        assert!(GpuLock::acquire(dir.path(), "run-b").is_ok());
    }
}
