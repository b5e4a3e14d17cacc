//! The ledger: `runs/optimizer.db`, SQLite in WAL mode, schema from `migrations/`.
//! This file names its errors (each with what to do about it) and holds the handle;
//! [`open`] opens it (read-write with migrations for the daemon, read-only for the
//! commands that only read, and `doctor`'s integrity check); one file per group of
//! tables holds their rows (as `FromRow` structs) and queries: [`runs`], [`iterations`]
//! (with their per-shape rows and the best kernel per shape), [`events`] (typed where
//! a resume reads them), and [`results`] (SDPA and the closing comparison);
//! [`time_to_best`] reads a run's iterations into its time-to-best figures.
//!
//! Every iteration is written in one transaction before the next one starts, so a
//! crash loses at most the iteration in flight. Reads decode each row on its own: a row
//! that cannot be decoded is named (run id, iteration) instead of failing the listing.

mod events;
mod groups;
mod iterations;
mod open;
mod results;
mod runs;
pub mod time_to_best;

pub use events::{Event, EventKind, EventRow, RerankTime, StageHistory};
pub use groups::{GpuSlot, GroupRow, ItemRow, NewGroup, NewItem};
pub(crate) use groups::ITEM_COLUMNS;
pub use iterations::{BestRow, IterationRecord, ShapeRecord, UnreadableIteration};
pub use open::Health;
pub use results::{kv_rate, kv_tbps, ClosingRow, NewSdpa, SdpaRow};
pub use runs::{NewRun, RunListing, RunRow, RunSetup, UnreadableRun, MAX_STORED_SECS};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sqlx::SqlitePool;

/// What to do with a damaged ledger, and what goes with it (the run folders stay).
const CORRUPT_FIX: &str = "move it aside (e.g. `mv {path} {path}.damaged`) and the next `optimizerd start` makes a new one; \
moved aside, the list of runs, their history, status, reports, `resume` and the memory of earlier runs go with it, \
while each run's folder (its git workspace with the best kernels, run.log) stays; `optimizerd doctor` checks a ledger";

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot write the ledger ({path}): the disk is full or read-only; free space or fix permissions, then `optimizerd resume`")]
    Unwritable {
        path: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("no ledger at {}; start a run first (`optimizerd start --budget 5m`), or point --config at the project whose runs folder holds it", .path.display())]
    NotFound { path: PathBuf },
    #[error("the ledger {} is damaged (not a SQLite database, or corrupt pages): {}", .path.display(), damaged_fix(.path))]
    Corrupt {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error("{} is not a file; the ledger is a SQLite file there: move what is there aside, and the next `optimizerd start` makes a new one", .path.display())]
    NotAFile { path: PathBuf },
    #[error("{} holds no optimizerd ledger (no tables); move it aside or remove it, and the next `optimizerd start` makes a new one", .path.display())]
    Empty { path: PathBuf },
    #[error("the ledger {} is read-only for this user and this command writes to it; run it as the ledger's owner, or make the file and its folder writable (chmod u+w)", .path.display())]
    ReadOnly {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error("the ledger {} is from an older release (schema {have}, this one reads {need}) and cannot be upgraded because it is read-only; make it writable once (chmod u+w on the file and its folder) or run any command as its owner", .path.display())]
    Outdated { path: PathBuf, have: i64, need: i64 },
    #[error("the ledger {} was written by a newer release of optimizerd (schema {have}; this one knows up to {know}); use that release", .path.display())]
    Newer { path: PathBuf, have: i64, know: i64 },
    #[error("cannot open the ledger {}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot upgrade the ledger {} to this release's schema", .path.display())]
    Migrate {
        path: PathBuf,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("ledger query failed ({what})")]
    Query {
        what: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot encode an event for the ledger")]
    Encode(#[source] serde_json::Error),
    #[error("no run `{0}` in the ledger; `optimizerd runs` lists them")]
    NoSuchRun(String),
    #[error("a group `{0}` exists already; continue it with `optimizerd resume {0}`, or start another with a new --run-id")]
    GroupExists(String),
    #[error("the ledger has no runs yet; start one with `optimizerd start --budget 5m`")]
    NoRuns,
    #[error("run {id} cannot be read from the ledger ({why}); name another run (`optimizerd runs` lists them) or remove this one with `optimizerd forget {id}`")]
    Unreadable { id: String, why: String },
    #[error("iteration {seq} of run {run} cannot be read from the ledger ({why})")]
    UnreadableIteration { run: String, seq: i64, why: String },
    #[error("run {id} is running (pid {pid}); stop it first (`optimizerd stop {id}`)")]
    Live { id: String, pid: u32 },
}

/// What to do about a damaged ledger at `path`, and what goes with it.
pub fn damaged_fix(path: &Path) -> String {
    CORRUPT_FIX.replace("{path}", &path.display().to_string())
}

pub(super) type Result<T> = std::result::Result<T, LedgerError>;

/// SQLite's primary result code of a database error (`SQLITE_CORRUPT` = 11, ...).
fn sqlite_code(e: &sqlx::Error) -> Option<i32> {
    e.as_database_error().and_then(|d| d.code()).and_then(|c| c.parse::<i32>().ok()).map(|c| c & 0xff)
}

/// SQLITE_CORRUPT (11) or SQLITE_NOTADB (26): the file, not the query. SQLITE_READONLY
/// (8): the file or its folder cannot be written by this user.
fn is_corrupt(e: &sqlx::Error) -> bool {
    matches!(sqlite_code(e), Some(11 | 26))
}

#[derive(Clone)]
pub struct Ledger {
    pool: SqlitePool,
    path: Arc<Path>,
}

impl Ledger {
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The file this ledger was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// How a failed query of `what` is reported: a damaged file, a full disk or a
    /// read-only file are said as such, with the fix; anything else names the query.
    pub(crate) fn q(&self, what: &'static str) -> impl FnOnce(sqlx::Error) -> LedgerError + '_ {
        move |source| match sqlite_code(&source) {
            Some(11 | 26) => LedgerError::Corrupt { path: self.path.to_path_buf(), source },
            Some(8) => LedgerError::ReadOnly { path: self.path.to_path_buf(), source },
            // SQLITE_FULL (13), SQLITE_IOERR (10), SQLITE_CANTOPEN (14).
            Some(10 | 13 | 14) => LedgerError::Unwritable { path: what.to_string(), source },
            _ => LedgerError::Query { what, source },
        }
    }
}

/// Now, RFC 3339 UTC with milliseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
