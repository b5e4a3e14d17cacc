//! Removing runs: `forget` one run (its rows in the ledger and its folder), and
//! `runs --prune`: failed runs, runs that never started (no GPU recorded, nothing
//! measured), and run folders the ledger does not know that hold only logs (left by
//! failed starts of earlier releases). A running run is never removed, and neither is a
//! folder with a workspace in it: that holds kernels.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::daemon::lock;
use crate::spec::states::RunState;
use crate::storage::ledger::{Ledger, LedgerError};

/// What a run folder that never got past its start holds.
const LOG_ONLY: [&str; 6] = ["run.log", "daemon.out", "daemon.pid", "worker.log", "sdpa_baseline.py", "sdpa_shapes.json"];

/// One removed run.
#[derive(Debug, Clone, Serialize)]
pub struct Removed {
    pub run: String,
    /// Why it was removed (`failed`, `never started`, `folder unknown to the ledger`, `asked`).
    pub why: String,
    /// Rows removed from the ledger (0 for a folder the ledger did not know).
    pub rows: u64,
    /// The folder removed with it, if there was one.
    pub folder: Option<PathBuf>,
}

fn remove_folder(runs_dir: &Path, id: &str) -> Option<PathBuf> {
    let dir = runs_dir.join(id);
    (dir.is_dir() && std::fs::remove_dir_all(&dir).is_ok()).then_some(dir)
}

/// Remove run `id` from the ledger, and its folder. Refused while it runs.
pub async fn forget(ledger: &Ledger, runs_dir: &Path, id: &str, why: &str) -> Result<Removed, LedgerError> {
    if let Some(pid) = lock::holder_of(runs_dir, id) {
        return Err(LedgerError::Live { id: id.to_string(), pid });
    }
    let rows = ledger.forget_run(id).await?;
    Ok(Removed { run: id.to_string(), why: why.to_string(), rows, folder: remove_folder(runs_dir, id) })
}

/// A folder under the runs folder that the ledger does not know and that holds only logs.
fn is_leftover(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let names: Vec<String> = entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    !names.is_empty() && names.iter().all(|n| LOG_ONLY.contains(&n.as_str()))
}

/// `runs --prune`: failed runs, runs that never started, leftover folders.
pub async fn prune(ledger: &Ledger, runs_dir: &Path) -> Result<Vec<Removed>, LedgerError> {
    let live: Vec<String> = lock::holders(runs_dir).into_iter().map(|h| h.0).collect();
    let listing = ledger.run_list().await?;
    let mut removed = Vec::new();
    for r in listing.iter().flatten() {
        if live.contains(&r.id) {
            continue;
        }
        let why = if r.state.recorded == RunState::Failed {
            "failed"
        } else if r.gpu_name.is_none() && r.iterations == 0 && !r.state.recorded.is_live() {
            "never started"
        } else {
            continue;
        };
        removed.push(forget(ledger, runs_dir, &r.id, why).await?);
    }
    let mut known: Vec<String> = listing.iter().map(|r| r.as_ref().map_or_else(|u| u.id.clone(), |r| r.id.clone())).collect();
    // A `--gpus` group's folder holds only its coordinator's log: it is not a leftover.
    known.extend(ledger.groups().await.unwrap_or_default().into_iter().map(|g| g.id));
    let Ok(entries) = std::fs::read_dir(runs_dir) else { return Ok(removed) };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if known.contains(&name) || live.contains(&name) || !is_leftover(&e.path()) {
            continue;
        }
        if let Some(folder) = remove_folder(runs_dir, &name) {
            removed.push(Removed { run: name, why: "a folder the ledger does not know (a start that never got going)".into(), rows: 0, folder: Some(folder) });
        }
    }
    Ok(removed)
}
