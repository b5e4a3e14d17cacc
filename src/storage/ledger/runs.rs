//! The `runs` table: one row per run, its state, budget, device and what it was started with.
//! Rows are decoded one by one: a row that cannot be decoded (an unknown state, a budget
//! no duration can hold) is listed as unreadable with its id, and the others list
//! normally. `forget_run` removes a run and every row that belongs to it.

use serde::Serialize;
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, Row};

use super::{now, Ledger, LedgerError, Result};
use crate::spec::protocol::DeviceInfo;
use crate::spec::states::{RunState, ShownState};

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

/// A run as listed: its row and how many iterations it recorded.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RunRow {
    pub id: String,
    /// The ledger's state (`daemon_gone` is for the caller who knows the GPU lock to set).
    #[sqlx(try_from = "RunState")]
    pub state: ShownState,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub budget_s: f64,
    pub used_s: f64,
    pub stage: Option<String>,
    pub run_dir: String,
    pub gpu_name: Option<String>,
    pub message: Option<String>,
    pub iterations: i64,
    /// The host GPU index the run used (`start --gpus`); None: the default device.
    pub gpu: Option<i64>,
    /// The multi-GPU group that started it, if any.
    pub group_id: Option<String>,
}

/// A run's configuration, workload and device, as recorded when it started.
#[derive(Debug, Clone)]
pub struct RunSetup {
    /// `Config::effective()`; `Null` if unreadable.
    pub config: serde_json::Value,
    pub workload: Vec<crate::spec::protocol::Shape>,
    pub device: Option<DeviceInfo>,
}

#[derive(sqlx::FromRow)]
struct SetupRow {
    config_json: String,
    workload_json: String,
    device_json: Option<String>,
}

/// The largest budget or time used (seconds) a stored run may hold: a thousand years.
/// Larger values (or negative ones) come from a damaged row, which is then named as
/// unreadable rather than turned into a duration that cannot exist.
pub const MAX_STORED_SECS: f64 = 1000.0 * 365.25 * 86400.0;

/// A run whose row cannot be decoded: its id (or `rowid N` when even that is unreadable) and why.
#[derive(Debug, Clone, Serialize)]
pub struct UnreadableRun {
    pub id: String,
    pub why: String,
}

/// Every run, newest first, each decoded on its own.
pub type RunListing = Vec<std::result::Result<RunRow, UnreadableRun>>;

impl RunRow {
    /// Decode one row of [`RUN_COLUMNS`], checking what the types cannot: the budget and
    /// the time used are seconds a `Duration` can hold.
    fn decode(row: &SqliteRow) -> std::result::Result<RunRow, UnreadableRun> {
        let id = row.try_get::<String, _>("id").unwrap_or_else(|_| format!("rowid {}", row.try_get::<i64, _>("rowid_").unwrap_or(-1)));
        let bad = |why: String| UnreadableRun { id: id.clone(), why };
        let r = RunRow::from_row(row).map_err(|e| bad(match e {
            sqlx::Error::ColumnDecode { index, source } => format!("column {index}: {source}"),
            e => e.to_string(),
        }))?;
        for (column, v) in [("budget_s", r.budget_s), ("used_s", r.used_s)] {
            if !(0.0..=MAX_STORED_SECS).contains(&v) {
                return Err(bad(format!("{column} = {v} s is not a duration (0 to {MAX_STORED_SECS:.0} s)")));
            }
        }
        Ok(r)
    }
}

/// Every table with a `run_id` column, children before parents (foreign keys).
const RUN_TABLES: [&str; 8] = ["iteration_shapes", "agent_proposals", "agent_requests", "iterations", "best", "events", "sdpa", "closing"];

const RUN_COLUMNS: &str = "r.rowid AS rowid_, r.id, r.state, r.started_at, r.finished_at, r.budget_s, r.used_s, r.stage, r.run_dir, r.gpu_name, r.message, r.gpu, r.group_id,
     (SELECT COUNT(*) FROM iterations i WHERE i.run_id = r.id) AS iterations";

impl Ledger {
    pub async fn create_run(&self, r: &NewRun) -> Result<()> {
        sqlx::query(
            "INSERT INTO runs (id, state, started_at, budget_s, run_dir, config_source, plan_path, config_json, workload_json, pid)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.id)
        .bind(RunState::Running)
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
        .map_err(self.q("create run"))?;
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
            .map_err(self.q("record device"))?;
        Ok(())
    }

    pub async fn set_progress(&self, run_id: &str, stage: Option<&str>, used_s: f64) -> Result<()> {
        sqlx::query("UPDATE runs SET stage = COALESCE(?, stage), used_s = ? WHERE id = ?")
            .bind(stage)
            .bind(used_s)
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(self.q("record progress"))?;
        Ok(())
    }

    pub async fn finish_run(&self, run_id: &str, state: RunState, message: &str, used_s: f64) -> Result<()> {
        sqlx::query("UPDATE runs SET state = ?, message = ?, used_s = ?, finished_at = ? WHERE id = ?")
            .bind(state)
            .bind(message)
            .bind(used_s)
            .bind(now())
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(self.q("finish run"))?;
        Ok(())
    }

    /// Change a run's state (and pid), e.g. `waiting_for_gpu` or `running` again on resume.
    pub async fn set_state(&self, run_id: &str, state: RunState, message: Option<&str>, pid: Option<u32>) -> Result<()> {
        sqlx::query("UPDATE runs SET state = ?, message = ?, pid = COALESCE(?, pid), finished_at = NULL WHERE id = ?")
            .bind(state)
            .bind(message)
            .bind(pid.map(|p| p as i64))
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(self.q("set run state"))?;
        Ok(())
    }

    /// The device the run was started on, as recorded.
    pub async fn device(&self, run_id: &str) -> Result<Option<DeviceInfo>> {
        let json: Option<Option<String>> = sqlx::query_scalar("SELECT device_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.q("read device"))?;
        Ok(json.flatten().and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// The plan file and configuration source a run was started with.
    pub async fn run_origin(&self, run_id: &str) -> Result<(String, String)> {
        sqlx::query_as("SELECT plan_path, config_source FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.q("read run"))?
            .ok_or_else(|| LedgerError::NoSuchRun(run_id.to_string()))
    }

    /// Every run, newest first, each row decoded on its own.
    pub async fn run_list(&self) -> Result<RunListing> {
        let rows: Vec<SqliteRow> = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs r ORDER BY r.started_at DESC, r.id DESC"))
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list runs"))?;
        Ok(rows.iter().map(RunRow::decode).collect())
    }

    /// The runs that can be read, newest first (`run_list` names the others).
    pub async fn runs(&self) -> Result<Vec<RunRow>> {
        Ok(self.run_list().await?.into_iter().filter_map(|r| r.ok()).collect())
    }

    /// `id`, or the most recent run when None; a row that cannot be read is an error naming it.
    pub async fn run(&self, id: Option<&str>) -> Result<RunRow> {
        let mut runs = self.run_list().await?.into_iter();
        let found = match id {
            Some(id) => runs.find(|r| match r {
                Ok(r) => r.id == id,
                Err(u) => u.id == id,
            }),
            None => runs.next(),
        };
        match found {
            Some(Ok(r)) => Ok(r),
            Some(Err(u)) => Err(LedgerError::Unreadable { id: u.id, why: u.why }),
            None => Err(id.map_or(LedgerError::NoRuns, |id| LedgerError::NoSuchRun(id.to_string()))),
        }
    }

    /// Remove run `id` and every row of it (iterations, best kernels, events, SDPA, the
    /// closing comparison, the agent's requests) in one transaction; the caller removes
    /// its folder. Returns how many rows went.
    pub async fn forget_run(&self, id: &str) -> Result<u64> {
        let mut tx = self.pool.begin().await.map_err(self.q("begin forgetting a run"))?;
        let mut removed = 0;
        for table in RUN_TABLES {
            let sql = format!("DELETE FROM {table} WHERE run_id = ?");
            removed += sqlx::query(&sql).bind(id).execute(&mut *tx).await.map_err(self.q("forget a run's rows"))?.rows_affected();
        }
        let run = sqlx::query("DELETE FROM runs WHERE id = ?").bind(id).execute(&mut *tx).await.map_err(self.q("forget a run"))?.rows_affected();
        if run == 0 {
            return Err(LedgerError::NoSuchRun(id.to_string()));
        }
        tx.commit().await.map_err(self.q("commit forgetting a run"))?;
        Ok(removed + run)
    }

    /// What a run was started with: its effective configuration, its workload shapes (in
    /// workload order) and the device it found.
    pub async fn run_setup(&self, run_id: &str) -> Result<RunSetup> {
        let row: SetupRow = sqlx::query_as("SELECT config_json, workload_json, device_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.q("read run setup"))?
            .ok_or_else(|| LedgerError::NoSuchRun(run_id.to_string()))?;
        Ok(RunSetup {
            config: serde_json::from_str(&row.config_json).unwrap_or_default(),
            workload: serde_json::from_str(&row.workload_json).unwrap_or_default(),
            device: row.device_json.and_then(|j| serde_json::from_str(&j).ok()),
        })
    }
}
