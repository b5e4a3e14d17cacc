//! Why NVRTC could not be found or loaded: every message says what was tried and how to
//! fix it.

use std::path::PathBuf;

const FIX_HINT: &str = "run scripts/setup.sh (installs NVRTC and the CUDA headers into .deps/), \
or set OPTIMIZERD_NVRTC_LIB=/path/to/libnvrtc.so.13 and OPTIMIZERD_CUDA_INCLUDE=/path/to/cuda/include";

/// Why NVRTC could not be found or loaded. Every message says what was tried and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvrtcError {
    #[error("{var}={path} does not name an existing file; {FIX_HINT}")]
    EnvLibMissing { var: &'static str, path: PathBuf },
    #[error("{var}={path} is not a directory containing cuda_fp16.h; {FIX_HINT}")]
    EnvIncludeInvalid { var: &'static str, path: PathBuf },
    #[error("NVRTC (libnvrtc) not found; searched:\n{searched}\nTo fix: {FIX_HINT}")]
    LibNotFound { searched: String },
    #[error(
        "CUDA headers (cuda_fp16.h) not found for NVRTC at {lib}; searched:\n{searched}\nTo fix: {FIX_HINT}"
    )]
    IncludeNotFound { lib: PathBuf, searched: String },
    #[error("could not load NVRTC from {path}: {reason}; {FIX_HINT}")]
    LoadFailed { path: PathBuf, reason: String },
    #[error("{path} is not a usable NVRTC: missing symbol {symbol}; {FIX_HINT}")]
    MissingSymbol { path: PathBuf, symbol: &'static str },
    #[error("NVRTC at {path} failed to report its version: {message}")]
    Version { path: PathBuf, message: String },
}
