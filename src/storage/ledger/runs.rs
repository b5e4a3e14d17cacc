//! The `runs` table: one row per run, its state, budget, device and what it was started with.

use serde::Serialize;

use super::{now, q, Ledger, LedgerError, Result};
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

const RUN_COLUMNS: &str = "r.id, r.state, r.started_at, r.finished_at, r.budget_s, r.used_s, r.stage, r.run_dir, r.gpu_name, r.message,
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

    pub async fn finish_run(&self, run_id: &str, state: RunState, message: &str, used_s: f64) -> Result<()> {
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

    /// Change a run's state (and pid), e.g. `waiting_for_gpu` or `running` again on resume.
    pub async fn set_state(&self, run_id: &str, state: RunState, message: Option<&str>, pid: Option<u32>) -> Result<()> {
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
        let json: Option<Option<String>> = sqlx::query_scalar("SELECT device_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("read device"))?;
        Ok(json.flatten().and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// The plan file and configuration source a run was started with.
    pub async fn run_origin(&self, run_id: &str) -> Result<(String, String)> {
        sqlx::query_as("SELECT plan_path, config_source FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("read run"))?
            .ok_or_else(|| LedgerError::NoSuchRun(run_id.to_string()))
    }

    pub async fn runs(&self) -> Result<Vec<RunRow>> {
        sqlx::query_as(&format!("SELECT {RUN_COLUMNS} FROM runs r ORDER BY started_at DESC, id DESC"))
            .fetch_all(&self.pool)
            .await
            .map_err(q("list runs"))
    }

    /// `id`, or the most recent run when None.
    pub async fn run(&self, id: Option<&str>) -> Result<RunRow> {
        let runs = self.runs().await?;
        match id {
            Some(id) => runs.into_iter().find(|r| r.id == id).ok_or_else(|| LedgerError::NoSuchRun(id.to_string())),
            None => runs.into_iter().next().ok_or(LedgerError::NoRuns),
        }
    }

    /// What a run was started with: its effective configuration, its workload shapes (in
    /// workload order) and the device it found.
    pub async fn run_setup(&self, run_id: &str) -> Result<RunSetup> {
        let row: SetupRow = sqlx::query_as("SELECT config_json, workload_json, device_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("read run setup"))?
            .ok_or_else(|| LedgerError::NoSuchRun(run_id.to_string()))?;
        Ok(RunSetup {
            config: serde_json::from_str(&row.config_json).unwrap_or_default(),
            workload: serde_json::from_str(&row.workload_json).unwrap_or_default(),
            device: row.device_json.and_then(|j| serde_json::from_str(&j).ok()),
        })
    }
}
