//! The real GPU backend of the worker: CUDA driver API through cudarc, NVRTC through
//! [`crate::nvrtc`].
//!
//! [`CudaBackend`] owns one context on device 0 and one stream, and answers every
//! [`Request`]: it describes the device, compiles each candidate once (CTA counting
//! compiled in with `-DOPTD_COUNT_CTAS=1`, taken only when a launch passes a counter) and
//! loads it, checks the candidate against the fp32 reference of [`super::reference`] on fresh
//! random inputs with NaN-poisoned outputs, and times several candidates with CUDA
//! events, interleaved round by round over rotating input sets that exceed the L2 cache.
//!
//! Every CUDA failure becomes a [`Response::CudaError`]; errors that leave the context
//! unusable (faults inside a kernel, or anything unclassifiable after a launch) are
//! marked `sticky`, and `serve` exits after replying so the supervisor restarts a clean
//! process. No request path panics on purpose, and a panic that slips through is caught
//! and reported as a sticky error.
//!
//! This module holds the backend and its request dispatch; each concern lives in its own
//! file: `error` (failure classification), `plan` (request validation), `load`
//! (compiling and loading, the look-ahead's builds through `worker::compile_pool`), `kernels` (modules and
//! resolved launches), `buffers` (tensor sets, partials, poisoning), `staging` (the
//! host memory inputs are drawn into), `abi` (kernel
//! parameters), `tensor_map` (TMA descriptors), `check` (correctness), `probe`
//! (anti-cheat probes), `timing` (interleaved timing) and `device` (device facts,
//! occupancy).

mod abi;
mod buffers;
mod check;
mod device;
mod error;
mod kernels;
mod load;
mod plan;
mod probe;
mod staging;
mod tensor_map;
mod timing;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use self::device::device_info;
use self::error::{after, panic_message, Failure};
use self::kernels::Candidate;
use self::load::Builds;
use super::Backend;
use crate::nvrtc::{self, Toolchain};
use crate::spec::protocol::{DeviceInfo, Request, Response};

pub use self::error::{describe, InitError};
pub use self::load::COUNT_CTAS_DEFINE;

/// The worker's CUDA backend: one context on device 0, one stream, loaded candidates by id.
pub struct CudaBackend {
    toolchain: Toolchain,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    device: DeviceInfo,
    candidates: HashMap<String, Candidate>,
    /// The builds `Precompile` asks for, keyed by arch, scope and source (made on the first).
    pool: Option<crate::worker::compile_pool::CompilePool<Builds>>,
    /// The builds of the last few sources loaded (`load::BuildCache`).
    built: load::BuildCache<crate::nvrtc::Compiled>,
    /// Timing input sets kept by shape across requests: see `timing::TimingInputs`.
    timing_inputs: timing::TimingInputs,
    /// When this worker's last sustained window ended: the next burst samples wait out
    /// `timing::COOL_DOWN` from it.
    windows_ended: Option<std::time::Instant>,
    /// The host memory checks and timings draw their inputs into: see `staging`.
    staging: staging::InputStaging,
}

impl CudaBackend {
    /// Locate NVRTC, initialise CUDA, and take device 0's primary context and a stream.
    pub fn new() -> Result<Self, InitError> {
        // SAFETY: only tries to dlopen the driver library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(InitError::NoDriver);
        }
        let toolchain = nvrtc::locate()?;
        // cudarc panics rather than erroring on a few exotic failures (e.g. a driver missing
        // a symbol): turn those into an InitError too.
        let built = std::panic::catch_unwind(|| -> Result<_, InitError> {
            let cuda = |step: &'static str| {
                move |e: DriverError| InitError::Cuda {
                    step,
                    message: describe(e),
                }
            };
            let ctx = CudaContext::new(0).map_err(cuda("creating the context on device 0"))?;
            // SAFETY: this backend uses a single stream and synchronises explicitly before
            // any host access, freeing or unloading, so cudarc's per-buffer events are
            // unnecessary (and would add work to every launch being timed).
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
            let device = device_info(&ctx, &toolchain).map_err(cuda("querying the device"))?;
            let (_, total) = ctx.mem_get_info().map_err(cuda("querying the device's memory"))?;
            Ok((ctx, stream, device, total as u64))
        });
        let (ctx, stream, device, memory) = match built {
            Ok(r) => r?,
            Err(p) => return Err(InitError::Panic(panic_message(p.as_ref()))),
        };
        tracing::info!(
            device = %device.name,
            arch = %device.arch,
            driver = device.driver_version,
            nvrtc = ?toolchain.version,
            nvrtc_lib = %toolchain.lib.display(),
            "CUDA backend ready"
        );
        Ok(CudaBackend {
            toolchain,
            ctx,
            stream,
            device,
            candidates: HashMap::new(),
            pool: None,
            built: Default::default(),
            timing_inputs: timing::TimingInputs::new(memory / 8),
            windows_ended: None,
            staging: staging::InputStaging::new(),
        })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    pub fn toolchain(&self) -> &Toolchain {
        &self.toolchain
    }

    fn dispatch(&mut self, request: Request) -> Response {
        let result = match request {
            Request::Hello => Ok(Response::Hello(self.device.clone())),
            Request::Load {
                id,
                source,
                arch,
                kernels,
                occupancy,
                compile_timeout_ms,
                head_dims,
                windows,
            } => self.load(id, &source, &arch, &crate::spec::protocol::BuildScope { head_dims, windows }, &kernels, &occupancy, compile_timeout_ms),
            Request::Precompile { builds, compile_timeout_ms, threads, windows } => {
                self.precompile(builds, threads, windows, compile_timeout_ms);
                Ok(Response::Precompiling)
            }
            Request::Check {
                id,
                plans,
                tolerance,
                seed,
                probes,
            } => self.check(&id, &plans, tolerance, seed, probes),
            Request::Time { cases, spec, seed } => self.time(&cases, &spec, seed),
            Request::Unload { id } => match self.candidates.remove(&id) {
                Some(c) => {
                    // Make sure none of its kernels can still be running, then unload.
                    after(self.stream.synchronize(), || format!("unload {id}"))
                        .map(|()| drop(c))
                        .map(|()| Response::Unloaded)
                }
                None => Err(Failure::Bad(format!(
                    "unload: no candidate loaded with id {id:?}"
                ))),
            },
            Request::Shutdown => Ok(Response::Bye),
        };
        match result {
            Ok(r) => r,
            Err(f) => self.settle(f).into_response(),
        }
    }

    /// After a failed request, wait for whatever it queued. A non-sticky failure becomes
    /// sticky if earlier launches of the request turn out to have faulted.
    fn settle(&self, failure: Failure) -> Failure {
        match failure {
            Failure::Cuda {
                during,
                message,
                sticky: false,
            } => match self.stream.synchronize() {
                Ok(()) => Failure::Cuda {
                    during,
                    message,
                    sticky: false,
                },
                Err(e) => Failure::Cuda {
                    during,
                    message: format!("{message}; then, waiting for earlier work: {}", describe(e)),
                    sticky: true,
                },
            },
            other => other,
        }
    }

}

impl Backend for CudaBackend {
    fn handle(&mut self, request: Request) -> Response {
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.dispatch(request))) {
            Ok(r) => r,
            Err(p) => Response::CudaError {
                during: "worker".to_string(),
                message: format!("the CUDA worker panicked: {}", panic_message(p.as_ref())),
                sticky: true,
            },
        }
    }
}

/// Answers every request with the init failure, so the daemon can show why.
struct FailedInit {
    message: String,
}

impl Backend for FailedInit {
    fn handle(&mut self, _request: Request) -> Response {
        Response::CudaError {
            during: "init".to_string(),
            message: self.message.clone(),
            sticky: true,
        }
    }
}

/// The worker process's main loop: build the CUDA backend and serve requests on
/// stdin/stdout. If the backend cannot be built, the first request is answered with a
/// sticky `CudaError { during: "init" }` naming the cause, and the process exits non-zero.
/// Every CUDA device this process can see (`CUDA_VISIBLE_DEVICES` applies), in ordinal
/// order, described as a worker's `Hello` would describe it: what `start --gpus` uses to
/// find the host's GPUs and refuse a mix of models.
pub fn list_cuda_devices() -> anyhow::Result<Vec<DeviceInfo>> {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err(InitError::NoDriver.into());
    }
    let toolchain = nvrtc::locate()?;
    let listed = std::panic::catch_unwind(|| -> anyhow::Result<Vec<DeviceInfo>> {
        let n = CudaContext::device_count().map_err(|e| anyhow::anyhow!("cannot count the CUDA devices: {}", describe(e)))?;
        (0..n.max(0) as usize)
            .map(|i| {
                let ctx = CudaContext::new(i).map_err(|e| anyhow::anyhow!("cannot open CUDA device {i}: {}", describe(e)))?;
                device_info(&ctx, &toolchain).map_err(|e| anyhow::anyhow!("cannot query CUDA device {i}: {}", describe(e)))
            })
            .collect()
    });
    match listed {
        Ok(r) => r,
        Err(p) => Err(InitError::Panic(panic_message(p.as_ref())).into()),
    }
}

pub fn run_cuda_worker() -> anyhow::Result<()> {
    match CudaBackend::new() {
        Ok(mut backend) => super::serve(&mut backend),
        Err(e) => {
            let message = e.to_string();
            tracing::error!(error = %message, "CUDA worker could not start");
            // `serve` exits the process after replying with a sticky error; reaching the
            // end means stdin closed before any request arrived.
            super::serve(&mut FailedInit {
                message: message.clone(),
            })?;
            Err(anyhow::anyhow!(message))
        }
    }
}
