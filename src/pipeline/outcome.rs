//! How an iteration ended: the verdict recorded in the ledger, and the failure
//! type every stage of a candidate's life returns.

use std::fmt;

use serde::Serialize;

use crate::spec::protocol::Response;
use crate::daemon::supervisor::WorkerFailure;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The first correct kernel: every shape's starting incumbent.
    Baseline,
    /// Faster than the incumbent beyond noise on at least one shape.
    Accepted,
    /// Correct, but faster on no shape.
    Rejected,
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
}

impl Verdict {
    /// Every verdict, for lists that must name them all (history filters, report legends).
    pub const ALL: [Verdict; 15] = [
        Verdict::Baseline,
        Verdict::Accepted,
        Verdict::Rejected,
        Verdict::Gated,
        Verdict::CompileError,
        Verdict::Incorrect,
        Verdict::CtaMismatch,
        Verdict::Crashed,
        Verdict::Timeout,
        Verdict::Error,
        Verdict::Interrupted,
        Verdict::Remembered,
        Verdict::RejectedProposal,
        Verdict::Cheating,
        Verdict::Flagged,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Baseline => "baseline",
            Verdict::Accepted => "accepted",
            Verdict::Rejected => "rejected",
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
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A candidate stopped at some stage: the verdict, a one-line reason, and the full error text.
#[derive(Debug, Clone)]
pub struct Failure {
    pub verdict: Verdict,
    pub reason: String,
    pub error: Option<String>,
}

impl Failure {
    pub fn new(verdict: Verdict, reason: impl Into<String>) -> Self {
        Failure { verdict, reason: reason.into(), error: None }
    }

    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    /// The worker went away or hung while `during`.
    pub fn from_worker(during: &str, e: WorkerFailure) -> Self {
        match e {
            WorkerFailure::Timeout(d) => Failure::new(Verdict::Timeout, format!("{during}: no answer within {}", humantime::format_duration(d))),
            WorkerFailure::Crashed(m) => Failure::new(Verdict::Crashed, format!("{during}: worker died")).with_error(m),
            WorkerFailure::Start(m) => Failure::new(Verdict::Error, format!("{during}: worker could not start")).with_error(m),
            WorkerFailure::Aborted => Failure::new(Verdict::Interrupted, format!("{during}: abandoned by an immediate stop")),
        }
    }

    /// The worker answered something other than what `during` expects.
    pub fn from_response(during: &str, r: Response) -> Self {
        match r {
            Response::CudaError { during: d, message, sticky: true } => {
                Failure::new(Verdict::Crashed, format!("{during}: {message}")).with_error(format!("{d}: {message}"))
            }
            Response::CudaError { during: d, message, sticky: false } => {
                Failure::new(Verdict::Error, format!("{during}: {message}")).with_error(format!("{d}: {message}"))
            }
            Response::CompileError { log } => {
                Failure::new(Verdict::CompileError, first_error_line(&log)).with_error(log)
            }
            Response::BadRequest { message } => {
                Failure::new(Verdict::Error, format!("{during}: worker rejected the request")).with_error(message)
            }
            other => Failure::new(Verdict::Error, format!("{during}: unexpected reply")).with_error(format!("{other:?}")),
        }
    }
}

fn first_error_line(log: &str) -> String {
    log.lines()
        .find(|l| l.contains("error"))
        .or_else(|| log.lines().next())
        .unwrap_or("compile failed")
        .trim()
        .to_string()
}
