//! Opening the ledger three ways: read-write with the migrations applied (the daemon,
//! `forget`), read-only for the commands that only read (they work on a read-only file
//! or folder, and never change the file), and `doctor`'s check, which opens the file as
//! it is and runs `PRAGMA quick_check`. A damaged file, a read-only one, an empty one and
//! one from a newer release are each said as such, with the fix.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::SqlitePool;

use super::{is_corrupt, sqlite_code, Ledger, LedgerError, Result};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The schema this release writes: the newest migration's version.
fn known_schema() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// What `doctor` reports of a ledger that passed its check.
#[derive(Debug, Clone)]
pub struct Health {
    pub runs: i64,
    /// The schema the file is at, and the one this release writes.
    pub schema: i64,
    pub known_schema: i64,
}

/// A failed open, said as what is wrong with the file.
fn open_error(path: &Path, source: sqlx::Error) -> LedgerError {
    let path = path.to_path_buf();
    match sqlite_code(&source) {
        _ if is_corrupt(&source) => LedgerError::Corrupt { path, source },
        Some(8) => LedgerError::ReadOnly { path, source },
        _ => LedgerError::Open { path, source },
    }
}

fn migrate_error(path: &Path, source: MigrateError) -> LedgerError {
    match source {
        MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) if is_corrupt(&e) || sqlite_code(&e) == Some(8) => open_error(path, e),
        source => LedgerError::Migrate { path: path.to_path_buf(), source },
    }
}

/// The version of the newest migration applied to the file; None when it has none
/// (an empty file, or a database that is no ledger).
async fn schema(pool: &SqlitePool, path: &Path) -> Result<Option<i64>> {
    let has: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
        .fetch_one(pool)
        .await
        .map_err(|e| open_error(path, e))?;
    if has == 0 {
        return Ok(None);
    }
    sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
        .map_err(|e| open_error(path, e))
}

/// Open `path` read-only and read its schema version. A WAL ledger in a folder this user
/// cannot write (no `-shm` file can be made beside it) is read as an immutable file: no
/// daemon of this user can be writing it there.
async fn connect_read_only(path: &Path) -> Result<(SqlitePool, Option<i64>)> {
    if !path.exists() {
        return Err(LedgerError::NotFound { path: path.to_path_buf() });
    }
    if !path.is_file() {
        return Err(LedgerError::NotAFile { path: path.to_path_buf() });
    }
    let opts = SqliteConnectOptions::new().filename(path).read_only(true).create_if_missing(false).busy_timeout(Duration::from_secs(10));
    let attempt = |opts: SqliteConnectOptions| async move {
        let pool = crate::storage::pool_options::<sqlx::Sqlite>().max_connections(2).connect_with(opts).await.map_err(|e| open_error(path, e))?;
        match schema(&pool, path).await {
            Ok(v) => Ok((pool, v)),
            Err(e) => {
                pool.close().await;
                Err(e)
            }
        }
    };
    match attempt(opts.clone()).await {
        Err(LedgerError::ReadOnly { .. } | LedgerError::Open { .. }) => attempt(opts.immutable(true)).await,
        other => other,
    }
}

/// An exclusive lock on `<ledger>.migrate.lock` beside the file, held while a writer opens
/// and migrates it (released when dropped). Its folder is the ledger's, which a writer can write (the WAL
/// needs it too). The wait is on a blocking thread: another process's migrations take
/// milliseconds, but the runtime's workers must not stall meanwhile.
async fn migration_lock(path: &Path) -> Result<std::fs::File> {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".migrate.lock");
    let lock_path = path.with_file_name(name);
    let io_error = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            LedgerError::ReadOnly { path: path.to_path_buf(), source: sqlx::Error::Io(e) }
        }
        _ => LedgerError::Open { path: path.to_path_buf(), source: sqlx::Error::Io(e) },
    };
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io_error)?;
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .map_err(|e| io_error(std::io::Error::other(e)))?
        .map_err(io_error)
}

impl Ledger {
    /// Open (creating if needed) the ledger at `path` and apply pending migrations.
    pub async fn open(path: &Path) -> Result<Self> {
        if path.exists() && !path.is_file() {
            return Err(LedgerError::NotAFile { path: path.to_path_buf() });
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| LedgerError::Open { path: path.to_path_buf(), source: sqlx::Error::Io(e) })?;
        }
        // One opener at a time per file, across processes, from creating it to its last
        // migration: a daemon creating its ledger and a command upgrading it on open
        // (`open_read_only`) would otherwise both apply the same migration, and the second
        // fails ("table already exists"; seen on CI as a coordinator exiting LEDGER while its
        // test polled the new file), and two first connections switching a new file to WAL
        // at once get "database is locked" past the busy timeout.
        let lock = migration_lock(path).await?;
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a committed iteration survives power loss, not only a process crash.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = crate::storage::pool_options::<sqlx::Sqlite>().max_connections(4).connect_with(opts).await.map_err(|e| open_error(path, e))?;
        let known = known_schema();
        let have = schema(&pool, path).await?;
        if let Some(have) = have.filter(|h| *h > known) {
            pool.close().await;
            return Err(LedgerError::Newer { path: path.to_path_buf(), have, know: known });
        }
        let migrated = MIGRATOR.run(&pool).await.map_err(|e| migrate_error(path, e));
        drop(lock);
        migrated?;
        Ok(Ledger { pool, path: Arc::from(path) })
    }

    /// Open the ledger at `path` for reading only: the file is never changed, and a
    /// read-only file or folder is fine. A ledger of an older release is upgraded first
    /// when it can be written, and said to need it when it cannot.
    pub async fn open_read_only(path: &Path) -> Result<Self> {
        let (pool, have) = connect_read_only(path).await?;
        let known = known_schema();
        match have {
            None => {
                pool.close().await;
                Err(LedgerError::Empty { path: path.to_path_buf() })
            }
            Some(have) if have > known => {
                pool.close().await;
                Err(LedgerError::Newer { path: path.to_path_buf(), have, know: known })
            }
            Some(have) if have < known => {
                pool.close().await;
                match Ledger::open(path).await {
                    Err(LedgerError::ReadOnly { .. } | LedgerError::Unwritable { .. }) => {
                        Err(LedgerError::Outdated { path: path.to_path_buf(), have, need: known })
                    }
                    other => other,
                }
            }
            Some(_) => Ok(Ledger { pool, path: Arc::from(path) }),
        }
    }

    /// `doctor`'s check: open the file as it is (read-only, nothing upgraded), run
    /// `PRAGMA quick_check` and count the runs.
    pub async fn check(path: &Path) -> Result<Health> {
        let (pool, have) = connect_read_only(path).await?;
        let result = async {
            let Some(schema) = have else { return Err(LedgerError::Empty { path: path.to_path_buf() }) };
            let problems: Vec<String> = sqlx::query_scalar("PRAGMA quick_check").fetch_all(&pool).await.map_err(|e| open_error(path, e))?;
            if problems.iter().any(|p| p != "ok") {
                let source = sqlx::Error::Protocol(format!("quick_check: {}", problems.join("; ")));
                return Err(LedgerError::Corrupt { path: path.to_path_buf(), source });
            }
            let known = known_schema();
            if schema > known {
                return Err(LedgerError::Newer { path: path.to_path_buf(), have: schema, know: known });
            }
            let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM runs").fetch_one(&pool).await.map_err(|e| open_error(path, e))?;
            Ok(Health { runs, schema, known_schema: known })
        }
        .await;
        pool.close().await;
        result
    }
}
