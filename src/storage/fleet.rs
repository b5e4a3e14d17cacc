//! A fleet's shared database: PostgreSQL (`--ledger postgres://...`), for several machines
//! running one group. It holds what the machines must share, and nothing else: the groups
//! and their queues (`run_groups`, `work_items`: an item is taken with `FOR UPDATE SKIP
//! LOCKED` and held under a lease its coordinator renews, so a machine that dies releases
//! its item when the lease runs out) and the memory across runs (`fleet_memory`: what each
//! machine's finished runs measured, keyed by the device description). Each machine keeps
//! its runs, iterations and kernels in its own SQLite ledger, as without a fleet.
//!
//! Its schema is `migrations/0010_gpu_groups.sql`, the same text the SQLite ledger applies
//! as its migration 10: one source of truth for both backends.

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::PgPool;
use sqlx::Row;

use super::ledger::{now, GroupRow, ItemRow, NewGroup};
use super::queue_sql::{self as sql, numbered};
use crate::spec::states::{ItemState, RunState};

/// The fleet tables' DDL, shared with the SQLite ledger.
const SCHEMA: &str = include_str!("../../migrations/0010_gpu_groups.sql");

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("cannot connect to the fleet database {url}: {source}; check the URL (postgres://USER:PASSWORD@HOST:PORT/DB), that the server runs and that this machine may connect (pg_hba.conf)")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot create the fleet tables in {url}: {source}; the database user needs CREATE on its schema")]
    Migrate {
        url: String,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("fleet database: cannot {what}: {source}")]
    Query {
        what: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("no group `{0}` in the fleet database")]
    NoSuchGroup(String),
    #[error("the fleet database holds an unreadable {what}: {why}")]
    Unreadable { what: String, why: String },
}

type Result<T> = std::result::Result<T, FleetError>;

fn q(what: &'static str) -> impl FnOnce(sqlx::Error) -> FleetError {
    move |source| FleetError::Query { what, source }
}

/// The URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The columns of `fleet_memory`, in the order [`bind_memory!`] binds them.
pub const MEMORY_COLUMNS: &str = "run_id, seq, shape, template, params_json, source_hash, shape_json, median_us, device_json, started_at, machine";

/// Bind one [`MemoryRow`] to an INSERT of [`MEMORY_COLUMNS`] (either backend).
macro_rules! bind_memory {
    ($query:expr, $m:expr) => {{
        let m = $m;
        $query
            .bind(&m.run_id)
            .bind(m.seq)
            .bind(&m.shape)
            .bind(&m.template)
            .bind(&m.params_json)
            .bind(&m.source_hash)
            .bind(&m.shape_json)
            .bind(m.median_us)
            .bind(&m.device_json)
            .bind(&m.started_at)
            .bind(&m.machine)
    }};
}
pub(crate) use bind_memory;

/// One remembered measurement as the fleet shares it (a row `storage::memory` reads).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MemoryRow {
    pub run_id: String,
    pub seq: i64,
    pub shape: String,
    pub template: String,
    pub params_json: String,
    pub source_hash: String,
    pub shape_json: String,
    pub median_us: f64,
    pub device_json: String,
    pub started_at: String,
    pub machine: String,
}

#[derive(Clone)]
pub struct Fleet {
    pool: PgPool,
    url: String,
}

fn state<T: std::str::FromStr>(what: &str, s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse::<T>().map_err(|e| FleetError::Unreadable { what: what.to_string(), why: e.to_string() })
}

fn group_of(r: &sqlx::postgres::PgRow) -> Result<GroupRow> {
    let get = |e: sqlx::Error| FleetError::Unreadable { what: "group".into(), why: e.to_string() };
    let gpus_json: String = r.try_get("gpus_json").map_err(get)?;
    Ok(GroupRow {
        id: r.try_get("id").map_err(get)?,
        state: state::<RunState>("group state", &r.try_get::<String, _>("state").map_err(get)?)?,
        started_at: r.try_get("started_at").map_err(get)?,
        finished_at: r.try_get("finished_at").map_err(get)?,
        budget_s: r.try_get("budget_s").map_err(get)?,
        used_s: r.try_get("used_s").map_err(get)?,
        gpus: serde_json::from_str(&gpus_json).map_err(|e| FleetError::Unreadable { what: "group's GPUs".into(), why: e.to_string() })?,
        config_source: r.try_get("config_source").map_err(get)?,
        plan_path: r.try_get("plan_path").map_err(get)?,
        options_json: r.try_get("options_json").map_err(get)?,
        pid: r.try_get("pid").map_err(get)?,
        message: r.try_get("message").map_err(get)?,
    })
}

fn item_of(r: &sqlx::postgres::PgRow) -> Result<ItemRow> {
    let get = |e: sqlx::Error| FleetError::Unreadable { what: "work item".into(), why: e.to_string() };
    let shapes_json: String = r.try_get("shapes_json").map_err(get)?;
    let gpu: Option<i64> = r.try_get("gpu").map_err(get)?;
    Ok(ItemRow {
        group_id: r.try_get("group_id").map_err(get)?,
        seq: r.try_get("seq").map_err(get)?,
        class: r.try_get("class").map_err(get)?,
        shapes: serde_json::from_str(&shapes_json).map_err(|e| FleetError::Unreadable { what: "work item's shapes".into(), why: e.to_string() })?,
        state: state::<ItemState>("work item state", &r.try_get::<String, _>("state").map_err(get)?)?,
        gpu: gpu.and_then(|g| u32::try_from(g).ok()),
        run_id: r.try_get::<Option<String>, _>("run_id").map_err(get)?.unwrap_or_default(),
        budget_s: r.try_get("budget_s").map_err(get)?,
        attempts: r.try_get("attempts").map_err(get)?,
        claimed_at: r.try_get("claimed_at").map_err(get)?,
        finished_at: r.try_get("finished_at").map_err(get)?,
        message: r.try_get("message").map_err(get)?,
        holder: r.try_get("holder").map_err(get)?,
        lease_until: r.try_get("lease_until").map_err(get)?,
    })
}

const ITEM_COLUMNS: &str = super::ledger::ITEM_COLUMNS;

impl Fleet {
    /// Connect and create (or upgrade) the fleet tables.
    pub async fn connect(url: &str) -> Result<Fleet> {
        let shown = redact(url);
        let pool = crate::storage::pool_options::<sqlx::Postgres>()
            .max_connections(4)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|source| FleetError::Connect { url: shown.clone(), source })?;
        let migrator = Migrator {
            migrations: Cow::Owned(vec![Migration::new(10, Cow::Borrowed("gpu groups"), MigrationType::Simple, Cow::Borrowed(SCHEMA), false)]),
            ..Migrator::DEFAULT
        };
        migrator.run(&pool).await.map_err(|source| FleetError::Migrate { url: shown.clone(), source })?;
        Ok(Fleet { pool, url: shown })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Create group `g` with its queue, or, when a machine already created it, join it:
    /// returns the group as recorded and whether this call created it.
    pub async fn create_or_join(&self, g: &NewGroup) -> Result<(GroupRow, bool)> {
        let mut tx = self.pool.begin().await.map_err(q("begin group"))?;
        let created = sqlx::query(&numbered(sql::INSERT_GROUP))
        .bind(&g.id)
        .bind(RunState::Running.as_str())
        .bind(now())
        .bind(g.budget_s)
        .bind(serde_json::to_string(&g.gpus).unwrap_or_default())
        .bind(&g.config_source)
        .bind(&g.plan_path)
        .bind(&g.options_json)
        .bind(std::process::id() as i64)
        .execute(&mut *tx)
        .await
        .map_err(q("create group"))?
        .rows_affected()
            == 1;
        if created {
            for (i, item) in g.items.iter().enumerate() {
                sqlx::query(&numbered(sql::INSERT_ITEM))
                    .bind(&g.id)
                    .bind(i as i64 + 1)
                    .bind(&item.class)
                    .bind(serde_json::to_string(&item.shapes).unwrap_or_default())
                    .bind(ItemState::Queued.as_str())
                    .bind(&item.run_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(q("create work item"))?;
            }
        }
        tx.commit().await.map_err(q("commit group"))?;
        Ok((self.group(&g.id).await?, created))
    }

    pub async fn group(&self, id: &str) -> Result<GroupRow> {
        let row = sqlx::query("SELECT * FROM run_groups WHERE id = $1").bind(id).fetch_optional(&self.pool).await.map_err(q("read group"))?;
        group_of(&row.ok_or_else(|| FleetError::NoSuchGroup(id.to_string()))?)
    }

    pub async fn items(&self, group: &str) -> Result<Vec<ItemRow>> {
        let rows = sqlx::query(&numbered(&sql::select_items(ITEM_COLUMNS)))
            .bind(group)
            .fetch_all(&self.pool)
            .await
            .map_err(q("list work items"))?;
        rows.iter().map(item_of).collect()
    }

    /// Take the oldest item of `group` that is queued, or running under a lease that has
    /// passed (its machine died), for GPU `gpu` of `holder`. `FOR UPDATE SKIP LOCKED`: a
    /// row another machine is taking is skipped, not waited for, and never taken twice.
    pub async fn claim_item(&self, group: &str, gpu: u32, budget_s: f64, holder: &str, lease_until: &str) -> Result<Option<ItemRow>> {
        let at = now();
        let row = sqlx::query(&numbered(&sql::claim(ITEM_COLUMNS, "FOR UPDATE SKIP LOCKED")))
        .bind(ItemState::Running.as_str())
        .bind(gpu as i64)
        .bind(budget_s)
        .bind(&at)
        .bind(holder)
        .bind(lease_until)
        .bind(group)
        .bind(group)
        .bind(ItemState::Queued.as_str())
        .bind(ItemState::Running.as_str())
        .bind(&at)
        .fetch_optional(&self.pool)
        .await
        .map_err(q("claim work item"))?;
        row.as_ref().map(item_of).transpose()
    }

    pub async fn renew_leases(&self, group: &str, holder: &str, lease_until: &str) -> Result<()> {
        sqlx::query(&numbered(sql::RENEW_LEASES))
            .bind(lease_until)
            .bind(group)
            .bind(holder)
            .bind(ItemState::Running.as_str())
            .execute(&self.pool)
            .await
            .map_err(q("renew work item leases"))?;
        Ok(())
    }

    pub async fn set_item_state(&self, group: &str, seq: i64, state: ItemState, message: &str) -> Result<()> {
        let finished = (!matches!(state, ItemState::Queued | ItemState::Running)).then(now);
        sqlx::query(&numbered(sql::SET_ITEM_STATE))
            .bind(state.as_str())
            .bind(message)
            .bind(finished)
            .bind(group)
            .bind(seq)
            .execute(&self.pool)
            .await
            .map_err(q("set work item state"))?;
        Ok(())
    }

    /// A resumed coordinator takes back what it held (running or stopped items of `holder`'s machine).
    pub async fn requeue_items(&self, group: &str, machine: &str) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE work_items SET state = $1, message = 'taken again by a resumed group', holder = NULL, lease_until = NULL
             WHERE group_id = $2 AND (state = $3 OR (state = $4 AND holder LIKE $5))",
        )
        .bind(ItemState::Queued.as_str())
        .bind(group)
        .bind(ItemState::Stopped.as_str())
        .bind(ItemState::Running.as_str())
        .bind(format!("{machine}:%"))
        .execute(&self.pool)
        .await
        .map_err(q("requeue work items"))?;
        Ok(r.rows_affected())
    }

    /// The group's wall-clock budget used: the largest any of its machines has seen.
    pub async fn set_group_used(&self, id: &str, used_s: f64) -> Result<()> {
        sqlx::query("UPDATE run_groups SET used_s = GREATEST(used_s, $1) WHERE id = $2")
            .bind(used_s)
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(q("set group progress"))?;
        Ok(())
    }

    pub async fn set_group_state(&self, id: &str, state: RunState, message: Option<&str>, used_s: f64) -> Result<()> {
        let finished = (!state.is_live()).then(now);
        sqlx::query("UPDATE run_groups SET state = $1, message = $2, used_s = GREATEST(used_s, $3), finished_at = $4, pid = $5 WHERE id = $6")
            .bind(state.as_str())
            .bind(message)
            .bind(used_s)
            .bind(finished)
            .bind(std::process::id() as i64)
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(q("set group state"))?;
        Ok(())
    }

    /// Share what a finished run measured (rows already shared are kept).
    pub async fn publish_memory(&self, rows: &[MemoryRow]) -> Result<u64> {
        let mut n = 0;
        let mut tx = self.pool.begin().await.map_err(q("begin memory"))?;
        for m in rows {
            let sql = format!("INSERT INTO fleet_memory ({MEMORY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING");
            n += bind_memory!(sqlx::query(&sql), m)
            .execute(&mut *tx)
            .await
            .map_err(q("publish memory"))?
            .rows_affected();
        }
        tx.commit().await.map_err(q("commit memory"))?;
        Ok(n)
    }

    /// What the other machines' runs measured.
    pub async fn memory_of_others(&self, machine: &str) -> Result<Vec<MemoryRow>> {
        sqlx::query_as("SELECT * FROM fleet_memory WHERE machine != $1 ORDER BY started_at, run_id, seq")
            .bind(machine)
            .fetch_all(&self.pool)
            .await
            .map_err(q("read the fleet's memory"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_password() {
        assert_eq!(redact("postgres://optd:s3cret@db:5432/fleet"), "postgres://optd:***@db:5432/fleet");
        assert_eq!(redact("postgres://db/fleet"), "postgres://db/fleet");
        assert_eq!(redact("postgres://optd@db/fleet"), "postgres://optd@db/fleet");
    }
}
