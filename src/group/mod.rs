//! Several GPUs of one host (`start --gpus all|0,2`): a *group*. The coordinator splits the
//! workload into work items, one per shape class (`strategy::open::classify`), queues them
//! in the ledger, and keeps one daemon per GPU busy: each idle GPU takes the next queued
//! item and optimizes its shapes as an ordinary run (`optimizerd start --gpu N --shapes ..`,
//! a child process that sees only that GPU), with a share of the group's remaining budget.
//! A class that converges early frees its GPU for the next item, and later items get the
//! time it left. Everything a run has (its worker's crash isolation, SDPA measured on its
//! own GPU, the closing comparison, resume) is the run's; the group adds the queue, the
//! GPUs, the budget and one id for `watch`, `status`, `stop` and `resume`.
//!
//! Depends on `spec/`, `daemon/` (locks, logging, shutdown), `storage/` (the ledger's
//! `run_groups` and `work_items`) and `strategy/` (shape classes); only `cli` uses it.

mod coordinator;
mod gpus;
mod share;
mod store;
mod view;

pub use coordinator::{resume, start, GroupEnd, GroupOptions};
pub use gpus::{list_devices, parse_gpus, select, visible_id, GpuError, GpuSelection};
pub use share::budget_share;
pub use store::{machine_name, Queue};
pub use view::{rate_line, status, status_text, GroupStatus, ItemView};

use crate::spec::config::Config;

/// Whether `id` names a group in the ledger of `config` (false when there is no ledger).
pub async fn is_group(config: &Config, id: &str) -> bool {
    let path = config.resolve(&config.run.runs_dir).join("optimizer.db");
    match crate::storage::ledger::Ledger::open_read_only(&path).await {
        Ok(l) => {
            let yes = l.is_group(id).await;
            l.close().await;
            yes
        }
        Err(_) => false,
    }
}

/// Whether the fleet database at `url` (if any) holds group `id`.
pub async fn in_fleet(url: Option<&str>, id: &str) -> bool {
    match url {
        Some(u) => match crate::storage::fleet::Fleet::connect(u).await {
            Ok(f) => f.group(id).await.is_ok(),
            Err(_) => false,
        },
        None => false,
    }
}

/// Where group `id`'s queue is: this machine's ledger, or (a fleet group, which this ledger
/// only mirrors, or one it does not know) the fleet database at `url`.
pub async fn queue_of(ledger: &crate::storage::ledger::Ledger, url: Option<&str>, id: &str) -> anyhow::Result<Queue> {
    let local = ledger.group(id).await.ok();
    let fleet = local.as_ref().is_none_or(|g| serde_json::from_str::<GroupOptions>(&g.options_json).is_ok_and(|o| o.fleet));
    if !fleet {
        return Ok(Queue::Local(ledger.clone()));
    }
    match url {
        Some(u) => Ok(Queue::Fleet(crate::storage::fleet::Fleet::connect(u).await?)),
        None if local.is_some() => anyhow::bail!(
            "group {id} is a fleet's: its queue is in a PostgreSQL database; pass --ledger postgres://... or set `ledger` under [fleet] in the configuration"
        ),
        None => Err(crate::storage::ledger::LedgerError::NoSuchRun(id.to_string()).into()),
    }
}
