//! The daemon's plumbing: one run per GPU ([`lock`]), stop requests ([`shutdown`]),
//! [`logging`], and the [`supervisor`] of the GPU worker
//! process (spawn, request with timeout, kill, crash report). Depends only on
//! [`crate::spec`]; the storage, the pipeline and the engine build on it.

pub mod lock;
pub mod logging;
pub mod shutdown;
pub mod supervisor;
