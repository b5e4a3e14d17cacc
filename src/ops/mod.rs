//! The operator's tools beside the run, each behind a CLI subcommand: [`watch`] a run's
//! log, [`doctor`] the environment, [`report`] the ledger as text (history, status, runs,
//! best per shape), [`run_report`] a run as pictures (HTML, Markdown, SVG figures),
//! [`export`] the best kernels (and [`python_package`], them as an installable package),
//! [`workload`] a model's config as a workload, [`prune`] runs that failed or never
//! started. They read what a run leaves behind, the machine it runs on, or a model's
//! config; nothing in the run itself depends on them.

pub mod doctor;
pub mod export;
pub mod prune;
pub mod python_package;
pub mod report;
pub mod run_report;
pub mod watch;
pub mod workload;
