//! How the CUDA backend's failures are classified and worded: why the backend could not
//! start ([`InitError`]), whether a driver error leaves the context unusable (sticky) or
//! was a benign rejection, and the [`Failure`] every request path returns, which becomes
//! the reply (`CudaError`, `BadRequest` or `CompileError`).

use cudarc::driver::DriverError;

use crate::nvrtc::{self, CompileFailure};
use crate::spec::protocol::Response;

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(
        "no CUDA driver found (libcuda.so.1 not loadable): this needs a machine with an NVIDIA GPU \
         and its driver installed"
    )]
    NoDriver,
    #[error(transparent)]
    Nvrtc(#[from] nvrtc::NvrtcError),
    #[error("CUDA initialisation failed during {step}: {message}")]
    Cuda { step: &'static str, message: String },
    #[error("CUDA initialisation panicked: {0}")]
    Panic(String),
}

/// Where in a request a CUDA error happened, which decides whether it is sticky.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// An ordinary API call (allocation, copy, module load, attribute query).
    Api,
    /// `cuLaunchKernel` itself returned the error.
    Launch,
    /// A synchronisation or any call after launches were queued.
    AfterLaunch,
}

/// Codes that always poison the context (see the CUDA driver API's error list).
fn always_sticky(code: u32) -> bool {
    matches!(
        code,
        3 | 4 // NOT_INITIALIZED, DEINITIALIZED
        | 46 // DEVICE_UNAVAILABLE
        | 201 // INVALID_CONTEXT
        | 214 | 220 // ECC_UNCORRECTABLE, NVLINK_UNCORRECTABLE
        | 700 // ILLEGAL_ADDRESS
        | 702 // LAUNCH_TIMEOUT
        | 709 // CONTEXT_IS_DESTROYED
        | 710 // ASSERT (device-side assert / trap)
        | 714
            ..=719 // HARDWARE_STACK_ERROR, ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS,
                    // INVALID_ADDRESS_SPACE, INVALID_PC, LAUNCH_FAILED
        | 999 // UNKNOWN
    )
}

/// Errors `cuLaunchKernel` returns synchronously for a bad configuration, leaving the
/// context intact: INVALID_VALUE (block/smem limits), OUT_OF_MEMORY, INVALID_HANDLE,
/// LAUNCH_OUT_OF_RESOURCES (registers), COOPERATIVE_LAUNCH_TOO_LARGE, INVALID_CLUSTER_SIZE.
fn benign_launch_error(code: u32) -> bool {
    matches!(code, 1 | 2 | 400 | 701 | 720 | 912)
}

fn is_sticky(err: DriverError, stage: Stage) -> bool {
    let code = err.0 as u32;
    match stage {
        Stage::Api => always_sticky(code),
        Stage::Launch => !benign_launch_error(code),
        // Be conservative: after kernels ran, anything we cannot vouch for restarts the worker.
        Stage::AfterLaunch => true,
    }
}

/// `CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered`.
pub fn describe(err: DriverError) -> String {
    let name = err
        .error_name()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", err.0));
    match err.error_string() {
        Ok(s) => format!("{name}: {}", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// A request that could not be completed, already classified for the reply.
#[derive(Debug)]
pub(super) enum Failure {
    Cuda {
        during: String,
        message: String,
        sticky: bool,
    },
    Bad(String),
    Compile(String),
}

impl Failure {
    pub(super) fn cuda(during: impl Into<String>, err: DriverError, stage: Stage) -> Self {
        Failure::Cuda {
            during: during.into(),
            message: describe(err),
            sticky: is_sticky(err, stage),
        }
    }

    pub(super) fn into_response(self) -> Response {
        match self {
            Failure::Cuda {
                during,
                message,
                sticky,
            } => Response::CudaError {
                during,
                message,
                sticky,
            },
            Failure::Bad(message) => Response::BadRequest { message },
            Failure::Compile(log) => Response::CompileError { log },
        }
    }
}

/// Shorthand: map a driver error at an API call (not a launch).
pub(super) fn api<T>(r: Result<T, DriverError>, during: impl FnOnce() -> String) -> Result<T, Failure> {
    r.map_err(|e| Failure::cuda(during(), e, Stage::Api))
}

/// Shorthand: map a driver error after launches were queued (sticky).
pub(super) fn after<T>(r: Result<T, DriverError>, during: impl FnOnce() -> String) -> Result<T, Failure> {
    r.map_err(|e| Failure::cuda(during(), e, Stage::AfterLaunch))
}

/// The text of a caught panic.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// NVRTC's failure as the reply: the program's fault is a `CompileError`, the request's a
/// `BadRequest`, anything else a non-sticky `CudaError` (nothing ran on the GPU).
pub(super) fn compile_failure(e: CompileFailure, prefix: &str, timeout_ms: u64) -> Failure {
    match e {
        CompileFailure::Rejected { log } => Failure::Compile(format!("{prefix}{log}")),
        CompileFailure::TimedOut { log, .. } => Failure::Compile(format!(
            "{prefix}compilation exceeded the {timeout_ms} ms compile timeout and was cancelled{}{log}",
            if log.is_empty() { "" } else { "\n" }
        )),
        e if e.is_internal_compiler_error() => Failure::Compile(format!("{prefix}NVRTC internal compiler error: {e}")),
        e if e.is_bad_input() => Failure::Bad(format!("{prefix}{e}")),
        e => Failure::Cuda { during: "compile".to_string(), message: format!("{prefix}{e}"), sticky: false },
    }
}

/// An error magnitude (max_abs, rel_l2) as failure reasons print it.
pub(super) fn fmt_err(x: f64) -> String {
    if (1e-3..1e4).contains(&x) {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys;

    #[test]
    fn sticky_classification() {
        use sys::CUresult as R;
        let e = |r: R| DriverError(r);
        assert!(is_sticky(e(R::CUDA_ERROR_ILLEGAL_ADDRESS), Stage::Api));
        assert!(is_sticky(e(R::CUDA_ERROR_LAUNCH_FAILED), Stage::Api));
        assert!(is_sticky(e(R::CUDA_ERROR_ASSERT), Stage::Api));
        assert!(is_sticky(
            e(R::CUDA_ERROR_MISALIGNED_ADDRESS),
            Stage::Launch
        ));
        assert!(!is_sticky(e(R::CUDA_ERROR_OUT_OF_MEMORY), Stage::Api));
        assert!(!is_sticky(e(R::CUDA_ERROR_INVALID_VALUE), Stage::Launch));
        assert!(!is_sticky(
            e(R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
            Stage::Launch
        ));
        assert!(is_sticky(e(R::CUDA_ERROR_NOT_READY), Stage::Launch));
        assert!(is_sticky(
            e(R::CUDA_ERROR_INVALID_VALUE),
            Stage::AfterLaunch
        ));
    }

    #[test]
    fn compile_failures_map_to_responses() {
        let r = compile_failure(
            CompileFailure::Rejected {
                log: "a.cu(3): error".into(),
            },
            "",
            0,
        )
        .into_response();
        assert_eq!(
            r,
            Response::CompileError {
                log: "a.cu(3): error".into()
            }
        );
        let r = compile_failure(
            CompileFailure::TimedOut {
                limit_ms: 5,
                log: String::new(),
            },
            "",
            5,
        )
        .into_response();
        assert!(matches!(r, Response::CompileError { log } if log.contains("5 ms")));
        let r = compile_failure(CompileFailure::InvalidInput("x".into()), "", 0).into_response();
        assert!(matches!(r, Response::BadRequest { .. }));
    }
}
