//! optimizerd: a daemon that optimizes CUDA attention kernels on the GPU it runs on.
//!
//! A candidate's life, one module per stage ([`pipeline`]): render -> gate -> compile
//! -> check -> timing -> decide -> record, sequenced by [`engine`] from what the
//! [`strategy`] proposes. GPU work happens in a child process ([`worker`]) watched by
//! the supervisor ([`daemon`]) and spoken to over the protocol ([`spec`]). See
//! docs/ARCHITECTURE.md.
//!
//! Folders, lowest first, each using only folders before it: [`spec`], [`agent`]
//! (the language-model proposer: client, prompt, edits, anti-cheat, limits), [`daemon`],
//! [`storage`], [`strategy`], [`pipeline`], [`engine`]. Beside the run, [`ops`] (the
//! operator's tools) uses all of them but [`engine`]; [`nvrtc`] and [`worker`] are the
//! worker process's side (the worker uses [`spec`] and [`nvrtc`]); [`cli`] dispatches
//! to all of them.

pub mod agent;
pub mod cli;
pub mod daemon;
pub mod failpoint;
pub mod engine;
pub mod group;
pub mod error_text;
pub mod nvrtc;
pub mod ops;
pub mod pipeline;
pub mod spec;
pub mod storage;
pub mod strategy;
pub mod worker;
#[cfg(test)]
mod test_fixtures;
