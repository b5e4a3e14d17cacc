//! The ledger: `runs/optimizer.db`, SQLite in WAL mode, schema from `migrations/`.
//!
//! Every iteration is written in one transaction before the next one starts, so a
//! crash loses at most the iteration in flight.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::spec::protocol::DeviceInfo;

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
    #[error("no run `{0}` in the ledger")]
    NoSuchRun(String),
    #[error("the ledger has no runs yet; start one with `optimizerd start --budget 5m`")]
    NoRuns,
}

type Result<T> = std::result::Result<T, LedgerError>;

fn q(what: &'static str) -> impl FnOnce(sqlx::Error) -> LedgerError {
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

/// A run as created by `start`.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub id: String,
    pub started_at: String,
    pub budget_s: f64,
    pub run_dir: String,
    pub config_source: String,
    pub plan_path: String,
    pub config_json: String,
    pub workload_json: String,
    pub pid: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: String,
    pub state: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub budget_s: f64,
    pub used_s: f64,
    pub stage: Option<String>,
    pub run_dir: String,
    pub gpu_name: Option<String>,
    pub message: Option<String>,
    pub iterations: i64,
}

/// One iteration, as recorded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IterationRecord {
    pub run_id: String,
    pub seq: i64,
    pub stage: String,
    pub template: String,
    pub params_json: String,
    pub source_hash: Option<String>,
    pub git_commit: Option<String>,
    pub verdict: String,
    pub reason: String,
    pub compile_ms: Option<f64>,
    pub registers: Option<i64>,
    pub local_bytes: Option<i64>,
    pub static_smem: Option<i64>,
    pub resources_json: Option<String>,
    pub score_us: Option<f64>,
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: String,
    /// Budget used (seconds) when the iteration was recorded.
    pub used_s: Option<f64>,
    /// NVRTC target it was compiled for (`sm_90`, `sm_90a`); None when not compiled.
    pub arch: Option<String>,
    /// Wall milliseconds of the correctness check and of the timing.
    pub check_ms: Option<f64>,
    pub time_ms: Option<f64>,
    pub shapes: Vec<ShapeRecord>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ShapeRecord {
    pub shape: String,
    pub shape_json: String,
    pub n_splits: Option<i64>,
    pub ctas: Option<i64>,
    pub waves: Option<f64>,
    pub check_passed: Option<bool>,
    pub max_abs: Option<f64>,
    pub rel_l2: Option<f64>,
    pub ctas_ran: Option<i64>,
    pub median_us: Option<f64>,
    pub p10_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub samples: Option<i64>,
    pub incumbent_us: Option<f64>,
    pub speedup_vs_incumbent: Option<f64>,
    pub speedup_vs_baseline: Option<f64>,
    pub threshold: Option<f64>,
    pub tflops: Option<f64>,
    pub won: bool,
    /// Input sets rotated through while timing this shape.
    pub input_sets: Option<i64>,
    /// Why the gate refused the candidate for this shape (it went on with the others).
    pub gated: Option<String>,
}

/// The best kernel for one shape, updated in the same transaction as its iteration.
#[derive(Debug, Clone, Serialize)]
pub struct BestRow {
    pub shape: String,
    pub seq: i64,
    pub median_us: f64,
    pub baseline_us: Option<f64>,
    pub source_path: String,
    pub git_commit: Option<String>,
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

    pub async fn create_run(&self, r: &NewRun) -> Result<()> {
        sqlx::query(
            "INSERT INTO runs (id, state, started_at, budget_s, run_dir, config_source, plan_path, config_json, workload_json, pid)
             VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.id)
        .bind(&r.started_at)
        .bind(r.budget_s)
        .bind(&r.run_dir)
        .bind(&r.config_source)
        .bind(&r.plan_path)
        .bind(&r.config_json)
        .bind(&r.workload_json)
        .bind(r.pid as i64)
        .execute(&self.pool)
        .await
        .map_err(q("create run"))?;
        Ok(())
    }

    pub async fn set_device(&self, run_id: &str, device: &DeviceInfo) -> Result<()> {
        let json = serde_json::to_string(device).unwrap_or_default();
        sqlx::query("UPDATE runs SET gpu_name = ?, device_json = ? WHERE id = ?")
            .bind(&device.name)
            .bind(json)
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(q("record device"))?;
        Ok(())
    }

    pub async fn set_progress(&self, run_id: &str, stage: Option<&str>, used_s: f64) -> Result<()> {
        sqlx::query("UPDATE runs SET stage = COALESCE(?, stage), used_s = ? WHERE id = ?")
            .bind(stage)
            .bind(used_s)
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(q("record progress"))?;
        Ok(())
    }

    pub async fn finish_run(&self, run_id: &str, state: &str, message: &str, used_s: f64) -> Result<()> {
        sqlx::query("UPDATE runs SET state = ?, message = ?, used_s = ?, finished_at = ? WHERE id = ?")
            .bind(state)
            .bind(message)
            .bind(used_s)
            .bind(now())
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(q("finish run"))?;
        Ok(())
    }

    pub async fn event(&self, run_id: &str, kind: &str, message: &str) -> Result<()> {
        sqlx::query("INSERT INTO events (run_id, at, kind, message) VALUES (?, ?, ?, ?)")
            .bind(run_id)
            .bind(now())
            .bind(kind)
            .bind(message)
            .execute(&self.pool)
            .await
            .map_err(q("record event"))?;
        Ok(())
    }

    /// Record one iteration, its per-shape rows and best-kernel updates atomically.
    pub async fn record_iteration(&self, it: &IterationRecord, best: &[BestRow], used_s: f64) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(q("begin iteration"))?;
        // Replace the `running` placeholder written by begin_iteration.
        sqlx::query("DELETE FROM iterations WHERE run_id = ? AND seq = ?")
            .bind(&it.run_id)
            .bind(it.seq)
            .execute(&mut *tx)
            .await
            .map_err(q("replace iteration"))?;
        sqlx::query(
            "INSERT INTO iterations (run_id, seq, stage, template, params_json, source_hash, git_commit, verdict, reason,
                compile_ms, registers, local_bytes, static_smem, resources_json, score_us, error, started_at, finished_at, used_s, arch,
                check_ms, time_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&it.run_id)
        .bind(it.seq)
        .bind(&it.stage)
        .bind(&it.template)
        .bind(&it.params_json)
        .bind(&it.source_hash)
        .bind(&it.git_commit)
        .bind(&it.verdict)
        .bind(&it.reason)
        .bind(it.compile_ms)
        .bind(it.registers)
        .bind(it.local_bytes)
        .bind(it.static_smem)
        .bind(&it.resources_json)
        .bind(it.score_us)
        .bind(&it.error)
        .bind(&it.started_at)
        .bind(&it.finished_at)
        .bind(used_s)
        .bind(&it.arch)
        .bind(it.check_ms)
        .bind(it.time_ms)
        .execute(&mut *tx)
        .await
        .map_err(q("insert iteration"))?;
        for s in &it.shapes {
            sqlx::query(
                "INSERT INTO iteration_shapes (run_id, seq, shape, shape_json, n_splits, ctas, waves, check_passed, max_abs,
                    rel_l2, ctas_ran, median_us, p10_us, p90_us, samples, incumbent_us, speedup_vs_incumbent,
                    speedup_vs_baseline, threshold, tflops, won, input_sets, gated)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&it.run_id)
            .bind(it.seq)
            .bind(&s.shape)
            .bind(&s.shape_json)
            .bind(s.n_splits)
            .bind(s.ctas)
            .bind(s.waves)
            .bind(s.check_passed)
            .bind(s.max_abs)
            .bind(s.rel_l2)
            .bind(s.ctas_ran)
            .bind(s.median_us)
            .bind(s.p10_us)
            .bind(s.p90_us)
            .bind(s.samples)
            .bind(s.incumbent_us)
            .bind(s.speedup_vs_incumbent)
            .bind(s.speedup_vs_baseline)
            .bind(s.threshold)
            .bind(s.tflops)
            .bind(s.won)
            .bind(s.input_sets)
            .bind(&s.gated)
            .execute(&mut *tx)
            .await
            .map_err(q("insert iteration shape"))?;
        }
        for b in best {
            sqlx::query(
                "INSERT INTO best (run_id, shape, seq, median_us, baseline_us, source_path, git_commit) VALUES (?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT(run_id, shape) DO UPDATE SET seq = excluded.seq, median_us = excluded.median_us,
                    baseline_us = COALESCE(best.baseline_us, excluded.baseline_us), source_path = excluded.source_path,
                    git_commit = excluded.git_commit",
            )
            .bind(&it.run_id)
            .bind(&b.shape)
            .bind(b.seq)
            .bind(b.median_us)
            .bind(b.baseline_us)
            .bind(&b.source_path)
            .bind(&b.git_commit)
            .execute(&mut *tx)
            .await
            .map_err(q("update best"))?;
        }
        sqlx::query("UPDATE runs SET used_s = ? WHERE id = ?")
            .bind(used_s)
            .bind(&it.run_id)
            .execute(&mut *tx)
            .await
            .map_err(q("update budget"))?;
        crate::daemon::failpoint::hit("ledger-mid-commit");
        tx.commit().await.map_err(q("commit iteration"))?;
        Ok(())
    }

    /// Write a `running` row for an iteration about to start: if the daemon dies before
    /// the iteration is recorded, `resume` finds it and marks it `interrupted`.
    pub async fn begin_iteration(&self, it: &IterationRecord, used_s: f64) -> Result<()> {
        sqlx::query(
            "INSERT INTO iterations (run_id, seq, stage, template, params_json, verdict, reason, started_at, finished_at)
             VALUES (?, ?, ?, ?, ?, 'running', 'in progress', ?, ?)",
        )
        .bind(&it.run_id)
        .bind(it.seq)
        .bind(&it.stage)
        .bind(&it.template)
        .bind(&it.params_json)
        .bind(&it.started_at)
        .bind(&it.started_at)
        .execute(&self.pool)
        .await
        .map_err(q("begin iteration"))?;
        self.set_progress(&it.run_id, None, used_s).await
    }

    /// Mark iterations left `running` by a daemon that died as `interrupted`; returns how many.
    pub async fn mark_interrupted(&self, run_id: &str) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE iterations SET verdict = 'interrupted', reason = 'the daemon stopped during this iteration', finished_at = ?
             WHERE run_id = ? AND verdict = 'running'",
        )
        .bind(now())
        .bind(run_id)
        .execute(&self.pool)
        .await
        .map_err(q("mark interrupted"))?;
        Ok(r.rows_affected())
    }

    /// Change a run's state (and pid), e.g. `waiting_for_gpu` or `running` again on resume.
    pub async fn set_state(&self, run_id: &str, state: &str, message: Option<&str>, pid: Option<u32>) -> Result<()> {
        sqlx::query("UPDATE runs SET state = ?, message = ?, pid = COALESCE(?, pid), finished_at = NULL WHERE id = ?")
            .bind(state)
            .bind(message)
            .bind(pid.map(|p| p as i64))
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(q("set run state"))?;
        Ok(())
    }

    /// The device the run was started on, as recorded.
    pub async fn device(&self, run_id: &str) -> Result<Option<DeviceInfo>> {
        let row = sqlx::query("SELECT device_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("read device"))?;
        Ok(row
            .and_then(|r| r.get::<Option<String>, _>("device_json"))
            .and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// The plan file and configuration source a run was started with.
    pub async fn run_origin(&self, run_id: &str) -> Result<(String, String)> {
        let row = sqlx::query("SELECT plan_path, config_source FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("read run"))?
            .ok_or_else(|| LedgerError::NoSuchRun(run_id.to_string()))?;
        Ok((row.get("plan_path"), row.get("config_source")))
    }

    pub async fn runs(&self) -> Result<Vec<RunRow>> {
        let rows = sqlx::query(
            "SELECT r.*, (SELECT COUNT(*) FROM iterations i WHERE i.run_id = r.id) AS n FROM runs r ORDER BY started_at DESC, id DESC",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(q("list runs"))?;
        Ok(rows.iter().map(run_row).collect())
    }

    /// `id`, or the most recent run when None.
    pub async fn run(&self, id: Option<&str>) -> Result<RunRow> {
        let runs = self.runs().await?;
        match id {
            Some(id) => runs.into_iter().find(|r| r.id == id).ok_or_else(|| LedgerError::NoSuchRun(id.to_string())),
            None => runs.into_iter().next().ok_or(LedgerError::NoRuns),
        }
    }

    pub async fn iterations(&self, run_id: &str) -> Result<Vec<IterationRecord>> {
        let rows = sqlx::query("SELECT * FROM iterations WHERE run_id = ? ORDER BY seq")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(q("list iterations"))?;
        let mut out: Vec<IterationRecord> = rows
            .iter()
            .map(|r| IterationRecord {
                run_id: r.get("run_id"),
                seq: r.get("seq"),
                stage: r.get("stage"),
                template: r.get("template"),
                params_json: r.get("params_json"),
                source_hash: r.get("source_hash"),
                git_commit: r.get("git_commit"),
                verdict: r.get("verdict"),
                reason: r.get("reason"),
                compile_ms: r.get("compile_ms"),
                registers: r.get("registers"),
                local_bytes: r.get("local_bytes"),
                static_smem: r.get("static_smem"),
                resources_json: r.get("resources_json"),
                score_us: r.get("score_us"),
                error: r.get("error"),
                started_at: r.get("started_at"),
                finished_at: r.get("finished_at"),
                used_s: r.get("used_s"),
                arch: r.get("arch"),
                check_ms: r.get("check_ms"),
                time_ms: r.get("time_ms"),
                shapes: Vec::new(),
            })
            .collect();
        drop(rows);
        // Per-shape rows in slices of iterations: a 10,000-iteration run holds 80,000 of them,
        // and fetching them all at once keeps every raw row in memory at the same time.
        const SLICE: usize = 512;
        let seqs: Vec<i64> = out.iter().map(|i| i.seq).collect();
        for chunk in seqs.chunks(SLICE) {
            let (first, last) = (chunk[0], chunk[chunk.len() - 1]);
            let shape_rows = sqlx::query("SELECT * FROM iteration_shapes WHERE run_id = ? AND seq BETWEEN ? AND ? ORDER BY seq, rowid")
                .bind(run_id)
                .bind(first)
                .bind(last)
                .fetch_all(&self.pool)
                .await
                .map_err(q("list iteration shapes"))?;
            // Rows come ordered by seq, like `out`: a binary search, not a scan per row.
            for r in &shape_rows {
                let seq: i64 = r.get("seq");
                if let Ok(ix) = out.binary_search_by_key(&seq, |i| i.seq) {
                    let it = &mut out[ix];
                    it.shapes.push(ShapeRecord {
                        shape: r.get("shape"),
                        shape_json: r.get("shape_json"),
                        n_splits: r.get("n_splits"),
                        ctas: r.get("ctas"),
                        waves: r.get("waves"),
                        check_passed: r.get("check_passed"),
                        max_abs: r.get("max_abs"),
                        rel_l2: r.get("rel_l2"),
                        ctas_ran: r.get("ctas_ran"),
                        median_us: r.get("median_us"),
                        p10_us: r.get("p10_us"),
                        p90_us: r.get("p90_us"),
                        samples: r.get("samples"),
                        incumbent_us: r.get("incumbent_us"),
                        speedup_vs_incumbent: r.get("speedup_vs_incumbent"),
                        speedup_vs_baseline: r.get("speedup_vs_baseline"),
                        threshold: r.get("threshold"),
                        tflops: r.get("tflops"),
                        won: r.get("won"),
                        input_sets: r.get("input_sets"),
                        gated: r.get("gated"),
                    });
                }
            }
        }
        Ok(out)
    }

    /// What a run was started with: its effective configuration, its workload shapes (in
    /// workload order) and the device it found.
    pub async fn run_setup(&self, run_id: &str) -> Result<RunSetup> {
        let row = sqlx::query("SELECT config_json, workload_json, device_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("read run setup"))?
            .ok_or_else(|| LedgerError::NoSuchRun(run_id.to_string()))?;
        Ok(RunSetup {
            config: serde_json::from_str(&row.get::<String, _>("config_json")).unwrap_or_default(),
            workload: serde_json::from_str(&row.get::<String, _>("workload_json")).unwrap_or_default(),
            device: row.get::<Option<String>, _>("device_json").and_then(|j| serde_json::from_str(&j).ok()),
        })
    }

    pub async fn best(&self, run_id: &str) -> Result<Vec<BestRow>> {
        let rows = sqlx::query("SELECT * FROM best WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(q("list best"))?;
        Ok(rows
            .iter()
            .map(|r| BestRow {
                shape: r.get("shape"),
                seq: r.get("seq"),
                median_us: r.get("median_us"),
                baseline_us: r.get("baseline_us"),
                source_path: r.get("source_path"),
                git_commit: r.get("git_commit"),
            })
            .collect())
    }

    pub async fn events(&self, run_id: &str) -> Result<Vec<(String, String, String)>> {
        let rows = sqlx::query("SELECT at, kind, message FROM events WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(q("list events"))?;
        Ok(rows.iter().map(|r| (r.get("at"), r.get("kind"), r.get("message"))).collect())
    }
}

impl Ledger {
    pub async fn sdpa_cached(&self, key: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT result_json FROM sdpa_cache WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("read SDPA cache"))?;
        Ok(row.map(|r| r.get("result_json")))
    }

    pub async fn sdpa_cache_put(&self, key: &str, json: &str) -> Result<()> {
        sqlx::query("INSERT OR REPLACE INTO sdpa_cache (key, measured_at, result_json) VALUES (?, ?, ?)")
            .bind(key)
            .bind(now())
            .bind(json)
            .execute(&self.pool)
            .await
            .map_err(q("write SDPA cache"))?;
        Ok(())
    }

    pub async fn sdpa_record(&self, run_id: &str, b: &crate::storage::sdpa::ShapeBaseline, versions_json: &str) -> Result<()> {
        let d = b.default_backend();
        sqlx::query(
            "INSERT OR REPLACE INTO sdpa (run_id, shape, default_graph_us, default_eager_us, picked, result_json, versions_json, cached)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run_id)
        .bind(&b.shape)
        .bind(d.and_then(|t| t.graph_us))
        .bind(d.and_then(|t| t.eager_us))
        .bind(d.and_then(|t| t.picked.clone()))
        .bind(serde_json::to_string(&b.backends).unwrap_or_default())
        .bind(versions_json)
        .bind(b.cached)
        .execute(&self.pool)
        .await
        .map_err(q("record SDPA"))?;
        Ok(())
    }

    /// Run a read query for another storage module (the memory across runs).
    pub(crate) async fn fetch_all<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        what: &'static str,
    ) -> Result<Vec<sqlx::sqlite::SqliteRow>> {
        query.fetch_all(&self.pool).await.map_err(q(what))
    }

    /// Record one shape of the closing comparison (replaces an earlier one).
    pub async fn closing_record(&self, run_id: &str, c: &ClosingRow) -> Result<()> {
        sqlx::query(
            "INSERT OR REPLACE INTO closing (run_id, shape, seq, ours_before_us, ours_after_us, sdpa_default_us, sdpa_picked, sdpa_json, measured_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run_id)
        .bind(&c.shape)
        .bind(c.seq)
        .bind(c.ours_before_us)
        .bind(c.ours_after_us)
        .bind(c.sdpa_default_us)
        .bind(&c.sdpa_picked)
        .bind(c.sdpa_backends.to_string())
        .bind(&c.measured_at)
        .execute(&self.pool)
        .await
        .map_err(q("record the closing comparison"))?;
        Ok(())
    }

    /// The closing comparison of a run, in workload order (empty until it finished).
    pub async fn closing(&self, run_id: &str) -> Result<Vec<ClosingRow>> {
        let rows = sqlx::query("SELECT * FROM closing WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(q("list the closing comparison"))?;
        Ok(rows
            .iter()
            .map(|r| ClosingRow {
                shape: r.get("shape"),
                seq: r.get("seq"),
                ours_before_us: r.get("ours_before_us"),
                ours_after_us: r.get("ours_after_us"),
                sdpa_default_us: r.get("sdpa_default_us"),
                sdpa_picked: r.get("sdpa_picked"),
                sdpa_backends: serde_json::from_str(&r.get::<String, _>("sdpa_json")).unwrap_or_default(),
                measured_at: r.get("measured_at"),
            })
            .collect())
    }

    /// Per shape: (default graph us, default eager us, picked backend, all backends JSON).
    pub async fn sdpa(&self, run_id: &str) -> Result<Vec<SdpaRow>> {
        let rows = sqlx::query("SELECT * FROM sdpa WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(q("list SDPA"))?;
        Ok(rows
            .iter()
            .map(|r| SdpaRow {
                shape: r.get("shape"),
                default_graph_us: r.get("default_graph_us"),
                default_eager_us: r.get("default_eager_us"),
                picked: r.get("picked"),
                backends: serde_json::from_str(&r.get::<String, _>("result_json")).unwrap_or_default(),
                versions: serde_json::from_str(&r.get::<String, _>("versions_json")).unwrap_or_default(),
                cached: r.get("cached"),
            })
            .collect())
    }
}

/// A run's configuration, workload and device, as recorded when it started.
#[derive(Debug, Clone)]
pub struct RunSetup {
    /// `Config::effective()`; `Null` if unreadable.
    pub config: serde_json::Value,
    pub workload: Vec<crate::spec::protocol::Shape>,
    pub device: Option<DeviceInfo>,
}

/// SDPA as recorded for one shape of a run.
#[derive(Debug, Clone, Serialize)]
pub struct SdpaRow {
    pub shape: String,
    pub default_graph_us: Option<f64>,
    pub default_eager_us: Option<f64>,
    pub picked: Option<String>,
    pub backends: serde_json::Value,
    pub versions: serde_json::Value,
    pub cached: bool,
}

/// One shape of the closing comparison: the best kernel timed just before and just after
/// a fresh SDPA measurement, so both are compared at the same clocks.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClosingRow {
    pub shape: String,
    /// The best kernel's iteration.
    pub seq: i64,
    pub ours_before_us: f64,
    pub ours_after_us: f64,
    pub sdpa_default_us: Option<f64>,
    pub sdpa_picked: Option<String>,
    /// Every backend's timing, as the SDPA script reported it.
    pub sdpa_backends: serde_json::Value,
    pub measured_at: String,
}

impl ClosingRow {
    /// Our time: the mean of the medians before and after SDPA (drift cancels to first order).
    pub fn ours_us(&self) -> f64 {
        0.5 * (self.ours_before_us + self.ours_after_us)
    }

    /// SDPA default's time over ours (> 1: ours is faster).
    pub fn vs_default(&self) -> Option<f64> {
        self.sdpa_default_us.map(|d| d / self.ours_us())
    }
}

fn run_row(r: &sqlx::sqlite::SqliteRow) -> RunRow {
    RunRow {
        id: r.get("id"),
        state: r.get("state"),
        started_at: r.get("started_at"),
        finished_at: r.get("finished_at"),
        budget_s: r.get("budget_s"),
        used_s: r.get("used_s"),
        stage: r.get("stage"),
        run_dir: r.get("run_dir"),
        gpu_name: r.get("gpu_name"),
        message: r.get("message"),
        iterations: r.get("n"),
    }
}

/// Now, RFC 3339 UTC with milliseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
