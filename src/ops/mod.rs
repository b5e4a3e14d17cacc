//! The operator's tools beside the run, each behind a CLI subcommand: [`watch`] a run's
//! log, [`doctor`] the environment, [`report`] the ledger (history, status, runs, best
//! per shape), [`export`] the best kernels. They read what a run leaves behind and
//! the machine it runs on; nothing in the run itself depends on them.

pub mod doctor;
pub mod export;
pub mod report;
pub mod watch;
