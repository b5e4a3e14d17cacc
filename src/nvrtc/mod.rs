//! Locating and calling NVRTC, NVIDIA's runtime CUDA C++ compiler.
//!
//! NVRTC ships as a shared library (`libnvrtc.so.13`) plus the CUDA headers; neither
//! is linked at build time. [`locate`] finds both (environment overrides first, then
//! the project's `.deps/` installed by `scripts/setup.sh`, then `$CUDA_HOME`,
//! `$CUDA_PATH` and `/usr/local/cuda`), loads the library by absolute path with
//! `RTLD_NOW | RTLD_GLOBAL` and keeps it loaded for the life of the process. Because
//! the library is then resident under its soname, cudarc's own `dlopen("libnvrtc.so.13")`
//! resolves to the same copy instead of panicking. This module itself calls NVRTC
//! through function pointers resolved from that handle, so it never depends on which
//! copy the dynamic loader would pick by name.
//!
//! [`compile`] turns one CUDA C++ source into a CUBIN for a real architecture
//! (`sm_90`, ..., or an arch-specific one such as `sm_90a`, whose cubin runs only on
//! that exact compute capability but may use wgmma and setmaxnreg), keeping NVRTC's
//! log as plain text so it can be shown to a person.
//!
//! One file per job: `error` (why NVRTC is unusable), `ffi` (the C API resolved from our
//! own handle), `locate` (the search, loading) and `compile` (options, compiling, budget).

mod compile;
mod error;
mod ffi;
mod locate;

pub use self::compile::{base_options, compile, compile_with_timeout, CompileFailure, Compiled};
pub use self::error::NvrtcError;
pub use self::locate::{locate, Toolchain, ENV_CUDA_INCLUDE, ENV_NVRTC_LIB};
