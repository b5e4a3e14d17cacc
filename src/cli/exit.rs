//! Exit codes, as named constants with one meaning each (the table in README.md and in
//! `optimizerd --help` is [`TABLE`]), which error gets which, and how an error is said:
//! once, as `error: what: why`, each cause once. A closed output pipe (`| head`) is no
//! error: the command stops quietly.

use std::io::Write;
use std::process::ExitCode;

use crate::daemon::lock::LockError;
use crate::daemon::supervisor::WorkerFailure;
use crate::engine::SetupError;
use crate::spec::assets::AssetError;
use crate::nvrtc::NvrtcError;
use crate::spec::config::ConfigError;
use crate::spec::hf_config::HfConfigError;
use crate::storage::ledger::LedgerError;
use crate::strategy::plan::PlanError;

/// Done; also when a reader such as `head` closed the output early.
pub const SUCCESS: u8 = 0;
/// The command failed for a reason below none of the other codes; the message says why.
pub const FAILURE: u8 = 1;
/// The command line is wrong: an unknown option, a bad value (budget, seed, run id, verdict).
pub const USAGE: u8 = 2;
/// The run stopped before its end and can be resumed: the GPU stayed away past
/// `worker.gpu_wait_limit`, or the ledger could not be written.
pub const INTERRUPTED: u8 = 3;
/// `watch`: the run's daemon died without ending the run; `optimizerd resume` continues it.
pub const DAEMON_GONE: u8 = 4;
/// The run ended `failed`: it could not go on (see its message).
pub const RUN_FAILED: u8 = 5;
/// `doctor`: at least one check failed.
pub const CHECKS_FAILED: u8 = 6;
/// Another run holds this GPU (`--allow-concurrent` runs anyway).
pub const BUSY: u8 = 7;
/// The configuration, the plan or a template is wrong; the message names the file and key.
pub const CONFIG: u8 = 8;
/// The ledger cannot be used: damaged, empty, read-only for a command that writes, or
/// from another release; the message says what to do.
pub const LEDGER: u8 = 9;
/// No usable GPU: the worker could not start (driver, device, NVRTC); nothing was recorded.
pub const NO_GPU: u8 = 10;
/// No such run, no run yet, or no ledger yet.
pub const NOT_FOUND: u8 = 11;
/// The run cannot be resumed or forgotten as asked: it finished, failed, or is running.
pub const NOT_RESUMABLE: u8 = 12;

/// Every code with its name and meaning, for `--help` and README.md (a test keeps them equal).
pub const TABLE: [(u8, &str, &str); 13] = [
    (SUCCESS, "SUCCESS", "done (also when a reader such as `head` closes the output early)"),
    (FAILURE, "FAILURE", "failed for another reason; the message says why and what to do"),
    (USAGE, "USAGE", "the command line is wrong: unknown option, bad budget, seed, run id or verdict"),
    (INTERRUPTED, "INTERRUPTED", "the run stopped before its end and is resumable (GPU gone past its wait limit, ledger unwritable)"),
    (DAEMON_GONE, "DAEMON_GONE", "`watch`: the run's daemon died without ending it; `optimizerd resume` continues it"),
    (RUN_FAILED, "RUN_FAILED", "the run ended `failed`"),
    (CHECKS_FAILED, "CHECKS_FAILED", "`doctor`: at least one check failed"),
    (BUSY, "BUSY", "another run holds this GPU"),
    (CONFIG, "CONFIG", "the configuration, the plan or a template is wrong"),
    (LEDGER, "LEDGER", "the ledger is damaged, empty, read-only for a command that writes, or from another release"),
    (NO_GPU, "NO_GPU", "no usable GPU (driver, device, NVRTC); nothing was recorded"),
    (NOT_FOUND, "NOT_FOUND", "no such run, no run yet, or no ledger yet"),
    (NOT_RESUMABLE, "NOT_RESUMABLE", "the run cannot be resumed or forgotten as asked (finished, failed, running)"),
];

/// The table as `--help` shows it.
pub fn help_table() -> String {
    let mut out = String::from("Exit status:\n");
    for (code, _, meaning) in TABLE {
        out.push_str(&format!("  {code:>2}  {meaning}\n"));
    }
    out
}

/// A command's refusal with its own exit code (e.g. a run that is not resumable).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub code: u8,
    pub message: String,
}

pub fn refuse(code: u8, message: impl Into<String>) -> anyhow::Error {
    Refusal { code, message: message.into() }.into()
}

/// The output closed under us (`optimizerd history | head -1`).
fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

fn ledger_code(e: &LedgerError) -> u8 {
    match e {
        LedgerError::NoSuchRun(_) | LedgerError::NoRuns | LedgerError::NotFound { .. } => NOT_FOUND,
        LedgerError::Live { .. } => NOT_RESUMABLE,
        LedgerError::Query { .. } | LedgerError::Encode(_) => FAILURE,
        _ => LEDGER,
    }
}

/// The exit code of an error: the first cause in its chain that has one of its own.
pub fn code_of(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(r) = cause.downcast_ref::<Refusal>() {
            return r.code;
        }
        if let Some(l) = cause.downcast_ref::<LedgerError>() {
            return ledger_code(l);
        }
        if let Some(s) = cause.downcast_ref::<SetupError>() {
            return match s {
                SetupError::NoGpu { .. } | SetupError::NoGpuToResume { .. } => NO_GPU,
                SetupError::Finished { .. } | SetupError::Failed { .. } => NOT_RESUMABLE,
                SetupError::OtherGpu { .. } => FAILURE,
                SetupError::Plan { .. } => CONFIG,
                SetupError::Ledger { source } => ledger_code(source),
            };
        }
        if matches!(cause.downcast_ref::<LockError>(), Some(LockError::Held { .. })) {
            return BUSY;
        }
        if matches!(cause.downcast_ref::<WorkerFailure>(), Some(WorkerFailure::Start(_))) {
            return NO_GPU;
        }
        // A model's config.json (`workload --from-hf`) is configuration too.
        if cause.is::<ConfigError>() || cause.is::<PlanError>() || cause.is::<AssetError>() || cause.is::<HfConfigError>() {
            return CONFIG;
        }
        // `export --python` without NVRTC: as `start` without it.
        if cause.is::<NvrtcError>() {
            return NO_GPU;
        }
    }
    FAILURE
}

/// End the process the way `result` says: its code, and for an error the message once
/// on stderr.
pub fn finish(result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if is_closed_pipe(&e) => ExitCode::from(SUCCESS),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {}", crate::error_text::join(e.chain()));
            ExitCode::from(code_of(&e))
        }
    }
}
