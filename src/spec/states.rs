//! The states the ledger records, as types: a candidate's [`Verdict`] and a run's
//! [`RunState`]. They are stored as their snake_case names (sqlx `TEXT`), the same strings
//! older ledgers hold; everything else compares the enums, never the strings.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum Verdict {
    /// The first correct kernel: every shape's starting incumbent.
    Baseline,
    /// Faster than the incumbent beyond noise on at least one shape.
    Accepted,
    /// Correct, but faster on no shape.
    Rejected,
    /// Correct, but a brief timing on one shape per class found it slower than the incumbent
    /// by more than `timing.early_reject`: not given the full timing.
    RejectedEarly,
    /// Failed a static check (shared memory, grid, CTA minimum) before compiling.
    Gated,
    CompileError,
    /// Wrong output (vs the fp32 reference) or unwritten elements.
    Incorrect,
    /// The CTAs that ran differ from the planned grid.
    CtaMismatch,
    /// Killed the worker (illegal address, trap, abort).
    Crashed,
    /// Ran past its limit; the worker was killed.
    Timeout,
    /// Anything else (a non-sticky CUDA error at launch, a daemon-side problem).
    Error,
    /// The daemon stopped (killed, or `stop --now`) while this candidate was in flight.
    Interrupted,
    /// Not run: an earlier run on the same kind of GPU measured this exact source on these
    /// shapes (memory across runs), and this run's re-check of the memory held.
    Remembered,
    /// An agent reply that does not parse or apply, changes the ABI/spec, includes other
    /// headers or declares persistent state: never compiled.
    RejectedProposal,
    /// An anti-cheat probe failed (writes outside O or to Q/K/V, stale or cached results).
    Cheating,
    /// Faster than is plausible on this GPU: re-verified and never accepted.
    Flagged,
    /// In flight: written before a candidate starts, replaced when it is recorded (a daemon
    /// that died leaves it, and `resume` marks it `interrupted`).
    Running,
}

impl Verdict {
    /// Every verdict the ledger can hold, for lists that must name them all (history
    /// filters, report legends): successes first, then each kind of failure, then the
    /// iteration in flight.
    pub const ALL: [Verdict; 17] = [
        Verdict::Baseline,
        Verdict::Accepted,
        Verdict::Rejected,
        Verdict::RejectedEarly,
        Verdict::Remembered,
        Verdict::Gated,
        Verdict::CompileError,
        Verdict::Incorrect,
        Verdict::CtaMismatch,
        Verdict::Crashed,
        Verdict::Timeout,
        Verdict::Error,
        Verdict::Interrupted,
        Verdict::RejectedProposal,
        Verdict::Cheating,
        Verdict::Flagged,
        Verdict::Running,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Baseline => "baseline",
            Verdict::Accepted => "accepted",
            Verdict::Rejected => "rejected",
            Verdict::RejectedEarly => "rejected_early",
            Verdict::Gated => "gated",
            Verdict::CompileError => "compile_error",
            Verdict::Incorrect => "incorrect",
            Verdict::CtaMismatch => "cta_mismatch",
            Verdict::Crashed => "crashed",
            Verdict::Timeout => "timeout",
            Verdict::Error => "error",
            Verdict::Interrupted => "interrupted",
            Verdict::Remembered => "remembered",
            Verdict::RejectedProposal => "rejected_proposal",
            Verdict::Cheating => "cheating",
            Verdict::Flagged => "flagged",
            Verdict::Running => "running",
        }
    }

    /// Recorded for good: not `running`, and not `interrupted` (which a resumed run runs again).
    pub fn is_final(self) -> bool {
        !matches!(self, Verdict::Running | Verdict::Interrupted)
    }

    /// Became (or stayed) a best kernel: the first correct kernel, or a win.
    pub fn is_acceptance(self) -> bool {
        matches!(self, Verdict::Baseline | Verdict::Accepted)
    }
}

impl FromStr for Verdict {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Verdict::ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| UnknownState::new("verdict", s, Verdict::ALL.iter().map(|v| v.as_str())))
    }
}


impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}


/// A run's state in the `runs` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum RunState {
    /// A daemon is driving it (or died while it did: the GPU lock tells which).
    Running,
    /// The daemon waits for the GPU to come back; the budget clock is paused.
    WaitingForGpu,
    /// Budget spent, converged, or the plan exhausted: nothing left to resume.
    Finished,
    /// Stopped by a signal or `optimizerd stop`; resumable.
    Stopped,
    /// The GPU stayed away past the wait limit, or a resume was refused; resumable.
    Interrupted,
    /// The daemon could not go on (no worker, a failing ledger).
    Failed,
}

impl RunState {
    pub const ALL: [RunState; 6] =
        [RunState::Running, RunState::WaitingForGpu, RunState::Finished, RunState::Stopped, RunState::Interrupted, RunState::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::WaitingForGpu => "waiting_for_gpu",
            RunState::Finished => "finished",
            RunState::Stopped => "stopped",
            RunState::Interrupted => "interrupted",
            RunState::Failed => "failed",
        }
    }

    /// A daemon is (or should be) driving the run.
    pub fn is_live(self) -> bool {
        matches!(self, RunState::Running | RunState::WaitingForGpu)
    }
}

/// A work item's state in a multi-GPU group's queue (`work_items.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum ItemState {
    /// Waiting for a GPU (never taken, or its run was cut off and is to be resumed).
    Queued,
    /// A daemon on one GPU is optimizing its shapes.
    Running,
    /// Its run finished (budget share spent, converged, or the plan exhausted).
    Done,
    /// Its run was stopped by request; a resumed group takes it again.
    Stopped,
    /// Its run failed, or was cut off too often: the group goes on without it.
    Failed,
}

impl ItemState {
    pub const ALL: [ItemState; 5] = [ItemState::Queued, ItemState::Running, ItemState::Done, ItemState::Stopped, ItemState::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            ItemState::Queued => "queued",
            ItemState::Running => "running",
            ItemState::Done => "done",
            ItemState::Stopped => "stopped",
            ItemState::Failed => "failed",
        }
    }
}

impl FromStr for ItemState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ItemState::ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| UnknownState::new("work item state", s, ItemState::ALL.iter().map(|v| v.as_str())))
    }
}

impl fmt::Display for ItemState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for RunState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunState::ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| UnknownState::new("run state", s, RunState::ALL.iter().map(|v| v.as_str())))
    }
}

/// A run's state as a user should see it: the ledger's, except that a live state whose
/// daemon is gone (killed, the machine rebooted) reads `interrupted (daemon gone)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShownState {
    pub recorded: RunState,
    /// No daemon holds the run's GPU lock.
    pub daemon_gone: bool,
}

impl ShownState {
    /// The ledger's state, with no knowledge of the daemon.
    pub fn recorded(state: RunState) -> Self {
        ShownState { recorded: state, daemon_gone: false }
    }

    /// A daemon is driving the run (its log may still grow).
    pub fn is_live(self) -> bool {
        self.recorded.is_live() && !self.daemon_gone
    }

    /// Stopped before its end and resumable: interrupted, or live with its daemon gone.
    pub fn is_interrupted(self) -> bool {
        self.recorded == RunState::Interrupted || (self.recorded.is_live() && self.daemon_gone)
    }
}

impl From<RunState> for ShownState {
    fn from(s: RunState) -> Self {
        ShownState::recorded(s)
    }
}

impl fmt::Display for ShownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.recorded.is_live() && self.daemon_gone {
            f.pad("interrupted (daemon gone)")
        } else {
            f.pad(self.recorded.as_str())
        }
    }
}

impl Serialize for ShownState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A name that is no verdict or run state (a typo in a filter, or a ledger from a newer release).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{given}` (one of: {allowed})")]
pub struct UnknownState {
    pub what: &'static str,
    pub given: String,
    pub allowed: String,
}

impl UnknownState {
    fn new<'a>(what: &'static str, given: &str, allowed: impl Iterator<Item = &'a str>) -> Self {
        UnknownState { what, given: given.to_string(), allowed: allowed.collect::<Vec<_>>().join(", ") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_typos_are_named() {
        for v in Verdict::ALL {
            assert_eq!(v.as_str().parse::<Verdict>(), Ok(v));
            assert_eq!(serde_json::to_value(v).unwrap(), serde_json::Value::from(v.as_str()));
        }
        for s in RunState::ALL {
            assert_eq!(s.as_str().parse::<RunState>(), Ok(s));
        }
        let e = "acepted".parse::<Verdict>().unwrap_err();
        assert!(e.to_string().contains("unknown verdict `acepted`") && e.to_string().contains("accepted"), "{e}");
        assert!(!Verdict::Running.is_final() && !Verdict::Interrupted.is_final() && Verdict::Gated.is_final());
    }
}
