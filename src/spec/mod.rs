//! The shared vocabulary: what is run and how it is described. The daemon <-> worker
//! [`protocol`] (and the kernel ABI's launch description), the run's configuration
//! ([`config`], `agent.toml`, its `[agent]` table in [`agent`]), kernel [`template`]s and their formulas, and the
//! [`assets`] they are read from (disk or the copies embedded in the binary), and a model's
//! attention as a transformers config describes it ([`hf_config`]). Nothing
//! here depends on any other folder; everything else builds on it.

pub mod agent;
pub mod assets;
pub mod config;
pub mod hf_config;
pub mod protocol;
pub mod states;
pub mod template;
