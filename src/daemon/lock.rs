//! The locks: one optimization run per GPU at a time, and one coordinator per group.
//!
//! A running daemon holds an exclusive `flock` on its GPU's lock file and writes its run
//! id and pid into it: `<runs>/gpu.lock` for GPU 0 (the default device, and the only lock
//! before several GPUs were supported), `<runs>/gpu-N.lock` for GPU N of the host. A
//! multi-GPU group's coordinator holds `<runs>/group-<id>.lock` the same way. The kernel
//! drops a lock when its process dies, even on `kill -9`, so a stale pid file can never
//! block a new run, and "is this run alive?" is answered by the locks rather than by
//! trusting a pid.
//!
//! One catch: a lock belongs to the open file description, and a child forked by any thread of
//! this process shares every descriptor until it execs (close-on-exec acts only then). So right
//! after a run of this process releases its lock, a fork elsewhere in the process (a worker being
//! started) can hold it for that window. An acquire that finds the lock held by this very pid,
//! while this process holds no lock on that path, waits briefly for such a child instead of
//! refusing (seen in the test suite, where runs of different tests start workers concurrently).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The lock paths this process holds (acquired and not yet dropped).
static HELD: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// How long an acquire waits out a lock held by a forked child of this process.
const FORK_WINDOW: Duration = Duration::from_secs(3);

fn held_here(path: &Path) -> bool {
    HELD.lock().map(|h| h.as_ref().is_some_and(|set| set.contains(path))).unwrap_or(false)
}

fn set_held(path: &Path, held: bool) {
    if let Ok(mut h) = HELD.lock() {
        let set = h.get_or_insert_with(HashSet::new);
        if held {
            set.insert(path.to_path_buf());
        } else {
            set.remove(path);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("run {run_id} (pid {pid}) is already optimizing on {what}; watch it with `optimizerd watch {run_id}`, stop it with `optimizerd stop {run_id}`, or pass --allow-concurrent")]
    Held { run_id: String, pid: u32, what: String },
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
    path: PathBuf,
}

impl Drop for GpuLock {
    fn drop(&mut self) {
        set_held(&self.path, false);
    }
}

/// The lock file of GPU `gpu` (an index among the host's visible GPUs).
pub fn lock_path(runs_dir: &Path, gpu: u32) -> PathBuf {
    if gpu == 0 {
        runs_dir.join("gpu.lock")
    } else {
        runs_dir.join(format!("gpu-{gpu}.lock"))
    }
}

/// The lock file a group's coordinator holds.
pub fn group_lock_path(runs_dir: &Path, group: &str) -> PathBuf {
    runs_dir.join(format!("group-{group}.lock"))
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

fn what_of(path: &Path) -> String {
    match path.file_name().and_then(|n| n.to_str()) {
        Some("gpu.lock") => "GPU 0".to_string(),
        Some(n) if n.starts_with("gpu-") => format!("GPU {}", n.trim_start_matches("gpu-").trim_end_matches(".lock")),
        Some(n) if n.starts_with("group-") => format!("group {}", n.trim_start_matches("group-").trim_end_matches(".lock")),
        _ => path.display().to_string(),
    }
}

impl GpuLock {
    /// Take GPU `gpu`'s lock for `run_id`, or say which run holds it.
    pub fn acquire(runs_dir: &Path, gpu: u32, run_id: &str) -> Result<GpuLock, LockError> {
        Self::acquire_at(&lock_path(runs_dir, gpu), run_id)
    }

    /// Take the lock file at `path` for `owner`, or say who holds it.
    pub fn acquire_at(path: &Path, owner: &str) -> Result<GpuLock, LockError> {
        let mut file = open(path)?;
        let start = Instant::now();
        while !try_flock(&file, libc::LOCK_EX) {
            let (run_id, pid) = read_owner(&mut file).unwrap_or_else(|| ("<unknown>".into(), 0));
            // Our pid but not our lock: a forked child of this process, about to exec.
            let forked_child = pid == std::process::id() && !held_here(path);
            if !forked_child || start.elapsed() >= FORK_WINDOW {
                return Err(LockError::Held { run_id, pid, what: what_of(path) });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let io = |source| LockError::Io { path: path.to_path_buf(), source };
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{owner} {}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        set_held(path, true);
        Ok(GpuLock { _file: file, path: path.to_path_buf() })
    }
}

/// Who holds the lock file at `path` right now, if anyone: (run or group id, pid).
pub fn holder_at(path: &Path) -> Option<(String, u32)> {
    let mut file = File::open(path).ok()?;
    if try_flock(&file, libc::LOCK_SH) {
        // Nobody holds it (we just got it shared); dropping the file releases it.
        return None;
    }
    read_owner(&mut file).or(Some(("<unknown>".into(), 0)))
}

/// The run holding GPU `gpu`'s lock right now, if any: (run id, pid).
pub fn holder(runs_dir: &Path, gpu: u32) -> Option<(String, u32)> {
    holder_at(&lock_path(runs_dir, gpu))
}

/// Every lock held right now (GPUs' and groups'): (run or group id, pid).
pub fn holders(runs_dir: &Path) -> Vec<(String, u32)> {
    let Ok(entries) = std::fs::read_dir(runs_dir) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".lock") && (n.starts_with("gpu") || n.starts_with("group-"))))
        .collect();
    paths.sort();
    paths.iter().filter_map(|p| holder_at(p)).collect()
}

/// The pid of the process holding a lock for `id` (a run or a group), if it is alive.
pub fn holder_of(runs_dir: &Path, id: &str) -> Option<u32> {
    holders(runs_dir).into_iter().find(|h| h.0 == id).map(|h| h.1)
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
        assert!(holder(dir.path(), 0).is_none());
        let lock = GpuLock::acquire(dir.path(), 0, "run-a").unwrap();
        // flock locks belong to the open file description: a second open conflicts even in-process.
        match GpuLock::acquire(dir.path(), 0, "run-b") {
            Err(LockError::Held { run_id, pid, what }) => {
                assert_eq!(what, "GPU 0");
                assert_eq!(run_id, "run-a");
                assert_eq!(pid, std::process::id());
            }
            other => panic!("expected Held, got {:?}", other.map(|_| ())),
        }
        assert_eq!(holder(dir.path(), 0).map(|h| h.0), Some("run-a".into()));
        drop(lock);
        assert!(holder(dir.path(), 0).is_none());
        assert!(GpuLock::acquire(dir.path(), 0, "run-b").is_ok());
    }

    #[test]
    fn a_lock_held_only_by_an_inherited_descriptor_is_waited_for() {
        // What a forked child does between fork and exec: another open file description of
        // the lock file holding the flock, while no GpuLock of this process holds it.
        let dir = tempfile::tempdir().unwrap();
        let first = GpuLock::acquire(dir.path(), 0, "run-a").unwrap();
        let path = lock_path(dir.path(), 0);
        let child = std::fs::File::open(&path).unwrap();
        drop(first);
        assert!(try_flock(&child, libc::LOCK_EX), "the stand-in child takes the lock");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(child); // the exec: close-on-exec closes it
        });
        let t0 = Instant::now();
        let second = GpuLock::acquire(dir.path(), 0, "run-b").expect("waits for the inherited descriptor");
        assert!(t0.elapsed() >= Duration::from_millis(150), "{:?}", t0.elapsed());
        release.join().unwrap();
        assert_eq!(holder(dir.path(), 0).map(|h| h.0), Some("run-b".into()));
        drop(second);
    }

    #[test]
    fn each_gpu_and_group_has_its_own_lock_and_holders_lists_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let _a = GpuLock::acquire(dir.path(), 0, "run-a").unwrap();
        let _b = GpuLock::acquire(dir.path(), 1, "run-b").unwrap();
        let _g = GpuLock::acquire_at(&group_lock_path(dir.path(), "g1"), "g1").unwrap();
        match GpuLock::acquire(dir.path(), 1, "run-c") {
            Err(LockError::Held { run_id, what, .. }) => assert_eq!((run_id.as_str(), what.as_str()), ("run-b", "GPU 1")),
            other => panic!("expected Held, got {:?}", other.map(|_| ())),
        }
        let mut ids: Vec<String> = holders(dir.path()).into_iter().map(|h| h.0).collect();
        ids.sort();
        assert_eq!(ids, ["g1", "run-a", "run-b"]);
        assert_eq!(holder_of(dir.path(), "run-b"), Some(std::process::id()));
        assert_eq!(holder_of(dir.path(), "run-c"), None);
        assert!(holder(dir.path(), 2).is_none());
    }
}
