//! The ledger: `runs/optimizer.db`, SQLite in WAL mode, schema from `migrations/`.
//! This file opens it and names its errors; one file per group of tables holds their
//! rows (as `FromRow` structs) and queries: [`runs`], [`iterations`] (with their per-shape
//! rows and the best kernel per shape), [`events`] (typed where a resume reads them), and
//! [`results`] (SDPA and the closing comparison).
//!
//! Every iteration is written in one transaction before the next one starts, so a
//! crash loses at most the iteration in flight.

mod events;
mod iterations;
mod results;
mod runs;

pub use events::{Event, EventKind, EventRow, StageHistory};
pub use iterations::{BestRow, IterationRecord, ShapeRecord};
pub use results::{ClosingRow, NewSdpa, SdpaRow};
pub use runs::{NewRun, RunRow, RunSetup};

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot write the ledger ({path}): the disk is full or read-only ({source}); free space or fix permissions, then `optimizerd resume`")]
    Unwritable {
        path: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot open ledger {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot migrate ledger {path}: {source}")]
    Migrate {
        path: String,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("ledger query failed ({what}): {source}")]
    Query {
        what: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot encode an event for the ledger")]
    Encode(#[source] serde_json::Error),
    #[error("no run `{0}` in the ledger")]
    NoSuchRun(String),
    #[error("the ledger has no runs yet; start one with `optimizerd start --budget 5m`")]
    NoRuns,
}

pub(super) type Result<T> = std::result::Result<T, LedgerError>;

pub(super) fn q(what: &'static str) -> impl FnOnce(sqlx::Error) -> LedgerError {
    move |source| {
        // SQLITE_FULL (13), SQLITE_READONLY (8), SQLITE_IOERR (10), SQLITE_CANTOPEN (14):
        // the disk, not the query; say what to do about it.
        let code = source.as_database_error().and_then(|d| d.code()).and_then(|c| c.parse::<i32>().ok());
        match code.map(|c| c & 0xff) {
            Some(8 | 10 | 13 | 14) => LedgerError::Unwritable { path: what.to_string(), source },
            _ => LedgerError::Query { what, source },
        }
    }
}

#[derive(Clone)]
pub struct Ledger {
    pool: SqlitePool,
}

impl Ledger {
    /// Open (creating if needed) the ledger at `path` and apply pending migrations.
    pub async fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| LedgerError::Open { path: shown.clone(), source: sqlx::Error::Io(e) })?;
        }
        let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(|source| LedgerError::Open { path: shown.clone(), source })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a committed iteration survives power loss, not only a process crash.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .map_err(|source| LedgerError::Open { path: shown.clone(), source })?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|source| LedgerError::Migrate { path: shown, source })?;
        Ok(Ledger { pool })
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Now, RFC 3339 UTC with milliseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
