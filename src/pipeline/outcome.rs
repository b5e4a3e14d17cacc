//! How an iteration ended: the verdict recorded in the ledger, and the failure
//! type every stage of a candidate's life returns.

pub use crate::spec::states::Verdict;
use crate::spec::protocol::Response;
use crate::daemon::supervisor::WorkerFailure;

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
