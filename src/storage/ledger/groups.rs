//! The multi-GPU tables: `run_groups` (one row per `start --gpus` group: its GPUs, wall
//! budget and state) and `work_items` (the group's queue: one item per shape class, taken
//! by one GPU's daemon at a time). Taking an item is one `UPDATE ... RETURNING` on the
//! oldest queued row, so two coordinators sharing a ledger can never take the same item.

use serde::{Deserialize, Serialize};

use super::{now, Ledger, LedgerError, Result};
use crate::storage::queue_sql as sql;
use crate::spec::protocol::DeviceInfo;
use crate::spec::states::{ItemState, RunState};

/// One GPU of a group: its index among the host's visible devices, and what it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSlot {
    pub index: u32,
    pub device: DeviceInfo,
}

/// A group as `start --gpus` creates it, with its queue.
#[derive(Debug, Clone)]
pub struct NewGroup {
    pub id: String,
    pub budget_s: f64,
    pub gpus: Vec<GpuSlot>,
    pub config_source: String,
    pub plan_path: String,
    /// What each of its runs is started with (`GroupOptions` of `group::coordinator`).
    pub options_json: String,
    /// The queue, in the order it is to be taken.
    pub items: Vec<NewItem>,
}

#[derive(Debug, Clone)]
pub struct NewItem {
    pub class: String,
    pub shapes: Vec<String>,
    /// The run that optimizes it (made when the group is, so a retry resumes it).
    pub run_id: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupRow {
    pub id: String,
    pub state: RunState,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub budget_s: f64,
    pub used_s: f64,
    pub gpus: Vec<GpuSlot>,
    pub config_source: String,
    pub plan_path: String,
    pub options_json: String,
    pub pid: Option<i64>,
    pub message: Option<String>,
}

impl GroupRow {
    /// The group seen as a run, for what follows a run's log (`watch`): its state, budget
    /// and folder; its candidates are its runs'.
    pub fn as_run(&self, run_dir: &std::path::Path) -> super::RunRow {
        super::RunRow {
            id: self.id.clone(),
            state: self.state.into(),
            started_at: self.started_at.clone(),
            finished_at: self.finished_at.clone(),
            budget_s: self.budget_s,
            used_s: self.used_s,
            stage: None,
            run_dir: run_dir.display().to_string(),
            gpu_name: self.gpus.first().map(|g| g.device.name.clone()),
            message: self.message.clone(),
            iterations: 0,
            gpu: None,
            group_id: None,
        }
    }
}

#[derive(sqlx::FromRow)]
struct GroupSql {
    id: String,
    state: RunState,
    started_at: String,
    finished_at: Option<String>,
    budget_s: f64,
    used_s: f64,
    gpus_json: String,
    config_source: String,
    plan_path: String,
    options_json: String,
    pid: Option<i64>,
    message: Option<String>,
}

impl GroupSql {
    fn decode(self) -> Result<GroupRow> {
        let gpus = serde_json::from_str(&self.gpus_json)
            .map_err(|e| LedgerError::Unreadable { id: self.id.clone(), why: format!("gpus_json: {e}") })?;
        Ok(GroupRow {
            id: self.id,
            state: self.state,
            started_at: self.started_at,
            finished_at: self.finished_at,
            budget_s: self.budget_s,
            used_s: self.used_s,
            gpus,
            config_source: self.config_source,
            plan_path: self.plan_path,
            options_json: self.options_json,
            pid: self.pid,
            message: self.message,
        })
    }
}

/// A work item as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct ItemRow {
    pub group_id: String,
    pub seq: i64,
    pub class: String,
    pub shapes: Vec<String>,
    pub state: ItemState,
    pub gpu: Option<u32>,
    pub run_id: String,
    pub budget_s: Option<f64>,
    pub attempts: i64,
    pub claimed_at: Option<String>,
    pub finished_at: Option<String>,
    pub message: Option<String>,
    /// Who runs it (`host:pid` of its coordinator), while it runs.
    pub holder: Option<String>,
    /// Until when its holder's lease runs; past it, any coordinator may take the item.
    pub lease_until: Option<String>,
}

#[derive(sqlx::FromRow)]
struct ItemSql {
    group_id: String,
    seq: i64,
    class: String,
    shapes_json: String,
    state: ItemState,
    gpu: Option<i64>,
    run_id: Option<String>,
    budget_s: Option<f64>,
    attempts: i64,
    claimed_at: Option<String>,
    finished_at: Option<String>,
    message: Option<String>,
    holder: Option<String>,
    lease_until: Option<String>,
}

impl ItemSql {
    fn decode(self) -> Result<ItemRow> {
        let bad = |why: String| LedgerError::Unreadable { id: format!("{} item {}", self.group_id, self.seq), why };
        let shapes = serde_json::from_str(&self.shapes_json).map_err(|e| bad(format!("shapes_json: {e}")))?;
        let run_id = self.run_id.clone().ok_or_else(|| bad("no run id".into()))?;
        Ok(ItemRow {
            group_id: self.group_id,
            seq: self.seq,
            class: self.class,
            shapes,
            state: self.state,
            gpu: self.gpu.and_then(|g| u32::try_from(g).ok()),
            run_id,
            budget_s: self.budget_s,
            attempts: self.attempts,
            claimed_at: self.claimed_at,
            finished_at: self.finished_at,
            message: self.message,
            holder: self.holder,
            lease_until: self.lease_until,
        })
    }
}

pub(crate) const ITEM_COLUMNS: &str = "group_id, seq, class, shapes_json, state, gpu, run_id, budget_s, attempts, claimed_at, finished_at, message, holder, lease_until";

impl Ledger {
    /// Record a new group and its queue in one transaction.
    pub async fn create_group(&self, g: &NewGroup) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(self.q("begin group"))?;
        let gpus = serde_json::to_string(&g.gpus).map_err(|e| LedgerError::Unreadable { id: g.id.clone(), why: e.to_string() })?;
        let created = sqlx::query(sql::INSERT_GROUP)
        .bind(&g.id)
        .bind(RunState::Running)
        .bind(now())
        .bind(g.budget_s)
        .bind(gpus)
        .bind(&g.config_source)
        .bind(&g.plan_path)
        .bind(&g.options_json)
        .bind(std::process::id() as i64)
        .execute(&mut *tx)
        .await
        .map_err(self.q("create group"))?
        .rows_affected();
        if created == 0 {
            return Err(LedgerError::GroupExists(g.id.clone()));
        }
        for (i, item) in g.items.iter().enumerate() {
            sqlx::query(sql::INSERT_ITEM)
                .bind(&g.id)
                .bind(i as i64 + 1)
                .bind(&item.class)
                .bind(serde_json::to_string(&item.shapes).unwrap_or_default())
                .bind(ItemState::Queued)
                .bind(&item.run_id)
                .execute(&mut *tx)
                .await
                .map_err(self.q("create work item"))?;
        }
        tx.commit().await.map_err(self.q("commit group"))?;
        Ok(())
    }

    /// Keep a fleet group's row here too (its queue stays in the fleet's database), so that
    /// this machine's `watch`, `runs` and `status` know the group: replaced on every join.
    pub async fn mirror_group(&self, g: &GroupRow) -> Result<()> {
        let gpus = serde_json::to_string(&g.gpus).map_err(|e| LedgerError::Unreadable { id: g.id.clone(), why: e.to_string() })?;
        sqlx::query(
            "INSERT OR REPLACE INTO run_groups (id, state, started_at, finished_at, budget_s, used_s, gpus_json, config_source, plan_path, options_json, pid, message)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&g.id)
        .bind(g.state)
        .bind(&g.started_at)
        .bind(&g.finished_at)
        .bind(g.budget_s)
        .bind(g.used_s)
        .bind(gpus)
        .bind(&g.config_source)
        .bind(&g.plan_path)
        .bind(&g.options_json)
        .bind(std::process::id() as i64)
        .bind(&g.message)
        .execute(&self.pool)
        .await
        .map_err(self.q("keep a fleet group"))?;
        Ok(())
    }

    pub async fn group(&self, id: &str) -> Result<GroupRow> {
        let row: Option<GroupSql> = sqlx::query_as("SELECT * FROM run_groups WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.q("read group"))?;
        row.ok_or_else(|| LedgerError::NoSuchRun(id.to_string()))?.decode()
    }

    /// Run `id`, or group `id` seen as a run ([`GroupRow::as_run`]); None: the latest run.
    pub async fn run_or_group(&self, id: Option<&str>, runs_dir: &std::path::Path) -> Result<super::RunRow> {
        match id {
            Some(id) if self.is_group(id).await => Ok(self.group(id).await?.as_run(&runs_dir.join(id))),
            _ => self.run(id).await,
        }
    }

    /// Whether `id` names a group (false on a ledger older than groups).
    pub async fn is_group(&self, id: &str) -> bool {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM run_groups WHERE id = ?")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .is_ok_and(|n| n > 0)
    }

    /// Every group, newest first.
    pub async fn groups(&self) -> Result<Vec<GroupRow>> {
        let rows: Vec<GroupSql> = sqlx::query_as("SELECT * FROM run_groups ORDER BY started_at DESC, id DESC")
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list groups"))?;
        rows.into_iter().map(GroupSql::decode).collect()
    }

    /// A group's items in queue order.
    pub async fn items(&self, group: &str) -> Result<Vec<ItemRow>> {
        let rows: Vec<ItemSql> = sqlx::query_as(&sql::select_items(ITEM_COLUMNS))
            .bind(group)
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list work items"))?;
        rows.into_iter().map(ItemSql::decode).collect()
    }

    /// Take the oldest queued item of `group` (or one whose holder's lease passed) for GPU
    /// `gpu` with a budget share of `budget_s`, as `holder` until `lease_until`, atomically:
    /// one statement, so no two takers get the same item.
    pub async fn claim_item(&self, group: &str, gpu: u32, budget_s: f64, holder: &str, lease_until: &str) -> Result<Option<ItemRow>> {
        let at = now();
        let row: Option<ItemSql> = sqlx::query_as(&sql::claim(ITEM_COLUMNS, ""))
        .bind(ItemState::Running)
        .bind(gpu as i64)
        .bind(budget_s)
        .bind(&at)
        .bind(holder)
        .bind(lease_until)
        .bind(group)
        .bind(group)
        .bind(ItemState::Queued)
        .bind(ItemState::Running)
        .bind(&at)
        .fetch_optional(&self.pool)
        .await
        .map_err(self.q("claim work item"))?;
        row.map(ItemSql::decode).transpose()
    }

    /// Extend the leases of the items `holder` runs.
    pub async fn renew_leases(&self, group: &str, holder: &str, lease_until: &str) -> Result<()> {
        sqlx::query(sql::RENEW_LEASES)
            .bind(lease_until)
            .bind(group)
            .bind(holder)
            .bind(ItemState::Running)
            .execute(&self.pool)
            .await
            .map_err(self.q("renew work item leases"))?;
        Ok(())
    }

    /// An item's end (or its return to the queue: `Queued`): its lease ends; its holder
    /// stays, to say where it ran.
    pub async fn set_item_state(&self, group: &str, seq: i64, state: ItemState, message: &str) -> Result<()> {
        let finished = (!matches!(state, ItemState::Queued | ItemState::Running)).then(now);
        sqlx::query(sql::SET_ITEM_STATE)
            .bind(state)
            .bind(message)
            .bind(finished)
            .bind(group)
            .bind(seq)
            .execute(&self.pool)
            .await
            .map_err(self.q("set work item state"))?;
        Ok(())
    }

    /// Items a dead coordinator left `running` (or a stop left `stopped`) go back to the
    /// queue, so a resumed group takes them again (their runs are resumed). Returns how many.
    pub async fn requeue_items(&self, group: &str) -> Result<u64> {
        let r = sqlx::query("UPDATE work_items SET state = ?, message = 'taken again by a resumed group' WHERE group_id = ? AND state IN (?, ?)")
            .bind(ItemState::Queued)
            .bind(group)
            .bind(ItemState::Running)
            .bind(ItemState::Stopped)
            .execute(&self.pool)
            .await
            .map_err(self.q("requeue work items"))?;
        Ok(r.rows_affected())
    }

    pub async fn set_group_used(&self, id: &str, used_s: f64) -> Result<()> {
        sqlx::query("UPDATE run_groups SET used_s = ? WHERE id = ?")
            .bind(used_s)
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(self.q("set group progress"))?;
        Ok(())
    }

    pub async fn set_group_state(&self, id: &str, state: RunState, message: Option<&str>, used_s: f64) -> Result<()> {
        let finished = (!state.is_live()).then(now);
        sqlx::query("UPDATE run_groups SET state = ?, message = ?, used_s = ?, finished_at = ?, pid = ? WHERE id = ?")
            .bind(state)
            .bind(message)
            .bind(used_s)
            .bind(finished)
            .bind(std::process::id() as i64)
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(self.q("set group state"))?;
        Ok(())
    }

    /// Which GPU a run used and which group started it.
    pub async fn set_run_gpu(&self, run_id: &str, gpu: Option<u32>, group: Option<&str>) -> Result<()> {
        sqlx::query("UPDATE runs SET gpu = ?, group_id = ? WHERE id = ?")
            .bind(gpu.map(i64::from))
            .bind(group)
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(self.q("set run gpu"))?;
        Ok(())
    }
}
