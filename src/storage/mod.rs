//! What a run keeps on disk: the SQLite [`ledger`] (runs, iterations, best per shape,
//! events), the agent's requests and proposals ([`agent_log`]), the run's git
//! [`workspace`] (candidate commits, `best`, rejected refs), the [`memory`] of earlier runs
//! on the same kind of GPU, and the PyTorch [`sdpa`] baseline, cached per device and
//! recorded with each run (the ledger holds its tables; [`sdpa`] measures and uses the
//! ledger, never the reverse). Depends on [`crate::spec`] and [`crate::failpoint`] alone.

pub mod agent_log;
pub mod fleet;
pub mod ledger;
pub mod memory;
pub mod queue_sql;
pub mod sdpa;
pub mod workspace;
