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

/// Connection-pool options with no sqlx maintenance task (no idle timeout, no lifetime, no
/// minimum), for the ledger and the fleet: sqlx 0.8's reaper can drive its idle count below
/// zero and then sweep ~2^64 times without yielding, at 100% CPU, which hangs the process when
/// its runtime shuts down (launchbadge/sqlx#3645, fixed upstream after 0.8.6). Seen on this
/// project's CI: `optimizerd history` printed its table and then spun for 15 minutes at exit.
/// A ledger is a local file and the fleet a few connections: nothing needs reaping, and a
/// connection that died is replaced when it is next acquired (sqlx tests it first).
pub(crate) fn pool_options<DB: sqlx::Database>() -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new().idle_timeout(None).max_lifetime(None).min_connections(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn pools_have_no_maintenance_task() {
        let o = super::pool_options::<sqlx::Sqlite>();
        // sqlx spawns its reaper only when one of these is set (sqlx-core pool/inner.rs).
        assert_eq!((o.get_idle_timeout(), o.get_max_lifetime(), o.get_min_connections()), (None, None, 0));
        let o = super::pool_options::<sqlx::Postgres>();
        assert_eq!((o.get_idle_timeout(), o.get_max_lifetime(), o.get_min_connections()), (None, None, 0));
    }
}
