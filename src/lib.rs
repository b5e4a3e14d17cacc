//! optimizerd: a daemon that optimizes CUDA attention kernels on the GPU it runs on.
//!
//! A candidate's life, one module per stage: [`render`] -> [`gate`] -> [`compile`]
//! -> [`check`] -> [`timing`] -> [`decide`] -> [`record`], sequenced by [`engine`].
//! GPU work happens in a child process ([`worker`]) watched by [`supervisor`] and
//! spoken to over [`protocol`]. See docs/ARCHITECTURE.md.

pub mod assets;
pub mod check;
pub mod cli;
pub mod compile;
pub mod config;
pub mod decide;
pub mod diagnose;
pub mod doctor;
pub mod engine;
pub mod export;
pub mod failpoint;
pub mod gate;
pub mod ledger;
pub mod lock;
pub mod logging;
pub mod nvrtc;
pub mod outcome;
pub mod plan;
pub mod protocol;
pub mod record;
pub mod render;
pub mod report;
pub mod sdpa;
pub mod search;
pub mod shutdown;
pub mod supervisor;
pub mod template;
pub mod timing;
pub mod watch;
pub mod worker;
pub mod workspace;
