//! Where a group's queue lives: the local SQLite ledger (one machine), or a fleet's
//! PostgreSQL database (several machines, `--ledger postgres://...`). The same operations
//! either way; the runs themselves are always in the local ledger.

use crate::spec::states::{ItemState, RunState};
use crate::storage::fleet::{Fleet, MemoryRow};
use crate::storage::ledger::{GroupRow, ItemRow, Ledger, NewGroup};

#[derive(Clone)]
pub enum Queue {
    Local(Ledger),
    Fleet(Fleet),
}

impl Queue {
    pub fn is_fleet(&self) -> bool {
        matches!(self, Queue::Fleet(_))
    }

    /// Where it is, for messages.
    pub fn describe(&self) -> String {
        match self {
            Queue::Local(l) => format!("the ledger {}", l.path().display()),
            Queue::Fleet(f) => format!("the fleet database {}", f.url()),
        }
    }

    /// Create the group; in a fleet, join it when another machine created it first.
    /// Returns it as recorded and whether this call created it.
    pub async fn create_or_join(&self, g: &NewGroup) -> anyhow::Result<(GroupRow, bool)> {
        Ok(match self {
            Queue::Local(l) => {
                l.create_group(g).await?;
                (l.group(&g.id).await?, true)
            }
            Queue::Fleet(f) => f.create_or_join(g).await?,
        })
    }

    pub async fn group(&self, id: &str) -> anyhow::Result<GroupRow> {
        Ok(match self {
            Queue::Local(l) => l.group(id).await?,
            Queue::Fleet(f) => f.group(id).await?,
        })
    }

    pub async fn items(&self, group: &str) -> anyhow::Result<Vec<ItemRow>> {
        Ok(match self {
            Queue::Local(l) => l.items(group).await?,
            Queue::Fleet(f) => f.items(group).await?,
        })
    }

    pub async fn claim_item(&self, group: &str, gpu: u32, budget_s: f64, holder: &str, lease_until: &str) -> anyhow::Result<Option<ItemRow>> {
        Ok(match self {
            Queue::Local(l) => l.claim_item(group, gpu, budget_s, holder, lease_until).await?,
            Queue::Fleet(f) => f.claim_item(group, gpu, budget_s, holder, lease_until).await?,
        })
    }

    pub async fn renew_leases(&self, group: &str, holder: &str, lease_until: &str) -> anyhow::Result<()> {
        match self {
            Queue::Local(l) => l.renew_leases(group, holder, lease_until).await?,
            Queue::Fleet(f) => f.renew_leases(group, holder, lease_until).await?,
        }
        Ok(())
    }

    pub async fn set_item_state(&self, group: &str, seq: i64, state: ItemState, message: &str) -> anyhow::Result<()> {
        match self {
            Queue::Local(l) => l.set_item_state(group, seq, state, message).await?,
            Queue::Fleet(f) => f.set_item_state(group, seq, state, message).await?,
        }
        Ok(())
    }

    /// Items a resumed coordinator takes again: in the local ledger every running or
    /// stopped one; in a fleet the stopped ones and those this machine ran.
    pub async fn requeue_items(&self, group: &str, machine: &str) -> anyhow::Result<u64> {
        Ok(match self {
            Queue::Local(l) => l.requeue_items(group).await?,
            Queue::Fleet(f) => f.requeue_items(group, machine).await?,
        })
    }

    pub async fn set_group_used(&self, id: &str, used_s: f64) -> anyhow::Result<()> {
        match self {
            Queue::Local(l) => l.set_group_used(id, used_s).await?,
            Queue::Fleet(f) => f.set_group_used(id, used_s).await?,
        }
        Ok(())
    }

    pub async fn set_group_state(&self, id: &str, state: RunState, message: Option<&str>, used_s: f64) -> anyhow::Result<()> {
        match self {
            Queue::Local(l) => l.set_group_state(id, state, message, used_s).await?,
            Queue::Fleet(f) => f.set_group_state(id, state, message, used_s).await?,
        }
        Ok(())
    }

    /// Share a finished run's measurements with the fleet (nothing to do locally).
    pub async fn publish_memory(&self, rows: &[MemoryRow]) -> anyhow::Result<u64> {
        Ok(match self {
            Queue::Local(_) => 0,
            Queue::Fleet(f) => f.publish_memory(rows).await?,
        })
    }

    /// What the fleet's other machines measured (nothing locally).
    pub async fn memory_of_others(&self, machine: &str) -> anyhow::Result<Vec<MemoryRow>> {
        Ok(match self {
            Queue::Local(_) => Vec::new(),
            Queue::Fleet(f) => f.memory_of_others(machine).await?,
        })
    }
}

/// This machine's name in a fleet: `fleet.machine`, else the host name.
pub fn machine_name(configured: Option<&str>) -> String {
    if let Some(m) = configured.filter(|m| !m.trim().is_empty()) {
        return m.trim().to_string();
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname(2) writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        if let Ok(s) = std::str::from_utf8(&buf[..end]) {
            if !s.is_empty() {
                return s.to_string();
            }
        }
    }
    "localhost".to_string()
}
