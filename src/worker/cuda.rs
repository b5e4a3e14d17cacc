//! The real GPU backend of the worker: CUDA driver API through cudarc, NVRTC through
//! [`crate::nvrtc`].
//!
//! [`CudaBackend`] owns one context on device 0 and one stream, and answers every
//! [`Request`]: it describes the device, compiles candidates twice (a timed build and a
//! CTA-counting check build with `-DOPTD_COUNT_CTAS=1`) and loads them, checks a
//! candidate's check build against the fp32 reference of [`super::reference`] on fresh
//! random inputs with NaN-poisoned outputs, and times several candidates with CUDA
//! events, interleaved round by round over rotating input sets that exceed the L2 cache.
//!
//! Every CUDA failure becomes a [`Response::CudaError`]; errors that leave the context
//! unusable (faults inside a kernel, or anything unclassifiable after a launch) are
//! marked `sticky`, and `serve` exits after replying so the supervisor restarts a clean
//! process. No request path panics on purpose, and a panic that slips through is caught
//! and reported as a sticky error.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DriverError,
};
use cudarc::nvrtc::Ptx;

use super::reference;
use super::Backend;
use crate::nvrtc::{self, CompileFailure, Compiled, Toolchain};
use crate::spec::protocol::{
    Checked, DeviceInfo, KernelResources, Launch, Loaded, OccupancyQuery, OccupancyResult, Request,
    Probes, Response, Shape, ShapeCheck, ShapePlan, TensorMap, TensorName, TimeCase, Timed, TimedCase,
    TimedEntry, TimingSpec, Tolerance, ABI_PARAMS,
};

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_DYN_SMEM: u32 = 48 * 1024;
/// The macro that turns on CTA counting in the check build.
pub const COUNT_CTAS_DEFINE: &str = "OPTD_COUNT_CTAS";

// ----------------------------------------------------------------------------------------
// Errors.

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
enum Stage {
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
enum Failure {
    Cuda {
        during: String,
        message: String,
        sticky: bool,
    },
    Bad(String),
    Compile(String),
}

impl Failure {
    fn cuda(during: impl Into<String>, err: DriverError, stage: Stage) -> Self {
        Failure::Cuda {
            during: during.into(),
            message: describe(err),
            sticky: is_sticky(err, stage),
        }
    }

    fn into_response(self) -> Response {
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
fn api<T>(r: Result<T, DriverError>, during: impl FnOnce() -> String) -> Result<T, Failure> {
    r.map_err(|e| Failure::cuda(during(), e, Stage::Api))
}

/// Shorthand: map a driver error after launches were queued (sticky).
fn after<T>(r: Result<T, DriverError>, during: impl FnOnce() -> String) -> Result<T, Failure> {
    r.map_err(|e| Failure::cuda(during(), e, Stage::AfterLaunch))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

// ----------------------------------------------------------------------------------------
// Loaded candidates.

/// One loaded CUBIN and the functions resolved from it so far.
struct Build {
    module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
    /// Dynamic smem limit already set per function (only set above 48 KiB).
    smem_set: HashMap<String, u32>,
}

impl Build {
    fn new(module: Arc<CudaModule>) -> Self {
        Build {
            module,
            functions: HashMap::new(),
            smem_set: HashMap::new(),
        }
    }

    /// The named kernel, or `Ok(None)` when the module has no such function.
    fn function(&mut self, name: &str) -> Result<Option<CudaFunction>, DriverError> {
        if let Some(f) = self.functions.get(name) {
            return Ok(Some(f.clone()));
        }
        if name.is_empty() || name.contains('\0') {
            return Ok(None);
        }
        match self.module.load_function(name) {
            Ok(f) => {
                self.functions.insert(name.to_string(), f.clone());
                Ok(Some(f))
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Raise the function's dynamic shared memory limit when `dyn_smem` needs opting in.
    fn allow_smem(
        &mut self,
        name: &str,
        f: &CudaFunction,
        dyn_smem: u32,
    ) -> Result<(), DriverError> {
        if dyn_smem <= DEFAULT_DYN_SMEM || self.smem_set.get(name).is_some_and(|&s| s >= dyn_smem) {
            return Ok(());
        }
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(dyn_smem).unwrap_or(i32::MAX),
        )?;
        self.smem_set.insert(name.to_string(), dyn_smem);
        Ok(())
    }
}

/// A candidate: the timed build and the CTA-counting check build of the same source.
struct Candidate {
    timed: Build,
    check: Build,
}

/// A kernel resolved for a launch, with the launch it serves.
struct Resolved<'a> {
    function: CudaFunction,
    launch: &'a Launch,
}

/// Resolve every launch of `plan` in `build`, opting in to large shared memory as needed.
fn resolve<'a>(
    build: &mut Build,
    plan: &'a ShapePlan,
    what: &str,
) -> Result<Vec<Resolved<'a>>, Failure> {
    let mut out = Vec::with_capacity(plan.launches.len());
    for (i, l) in plan.launches.iter().enumerate() {
        let f = api(build.function(&l.kernel), || {
            format!("{what}: resolving kernel {}", l.kernel)
        })?
        .ok_or_else(|| {
            Failure::Bad(format!(
                "{what}: launch {i} names kernel `{}`, which the loaded module does not define",
                l.kernel
            ))
        })?;
        api(build.allow_smem(&l.kernel, &f, l.dyn_smem), || {
            format!(
                "{what}: launch {i} ({}): allowing {} B of dynamic shared memory",
                l.kernel, l.dyn_smem
            )
        })?;
        out.push(Resolved {
            function: f,
            launch: l,
        });
    }
    Ok(out)
}

fn validate_shape(s: &Shape) -> Result<(), String> {
    if s.b == 0 || s.h == 0 || s.s == 0 || s.d == 0 {
        return Err(format!("shape {} has a zero dimension", s.key()));
    }
    if i32::try_from(s.b).is_err() || i32::try_from(s.h).is_err() || i32::try_from(s.s).is_err() {
        return Err(format!(
            "shape {} does not fit the i32 kernel arguments",
            s.key()
        ));
    }
    Ok(())
}

fn validate_plan(p: &ShapePlan) -> Result<(), String> {
    validate_shape(&p.shape)?;
    if p.launches.is_empty() {
        return Err(format!("plan for {} has no launches", p.shape.key()));
    }
    if i32::try_from(p.n_splits).is_err() {
        return Err(format!(
            "plan for {}: n_splits {} does not fit i32",
            p.shape.key(),
            p.n_splits
        ));
    }
    for (i, m) in p.tensor_maps.iter().enumerate() {
        m.geometry(&p.shape).map_err(|why| {
            format!("plan for {}: tensor_map[{i}] ({}): {why}", p.shape.key(), m.tensor.as_str())
        })?;
    }
    for (i, l) in p.launches.iter().enumerate() {
        if l.grid.contains(&0) || l.block.contains(&0) {
            return Err(format!(
                "plan for {}: launch {i} ({}) has an empty grid {:?} or block {:?}",
                p.shape.key(),
                l.kernel,
                l.grid,
                l.block
            ));
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Device buffers and the kernel ABI.

/// One set of Q, K, V, O in the element type (as raw 16-bit patterns).
struct TensorSet {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    o: CudaSlice<u16>,
}

/// The fp32 split-KV scratch buffers.
struct Partials {
    o: CudaSlice<f32>,
    lse: CudaSlice<f32>,
}

/// Arguments of the shared kernel ABI (the CTA counter is passed per launch):
/// `(q, k, v, o, o_partial, lse_partial, batch, heads, seq_len, n_splits, softmax_scale, causal, cta_counter)`,
/// then one encoded `CUtensorMap` per tensor map of the plan, passed by value.
struct Abi {
    q: sys::CUdeviceptr,
    k: sys::CUdeviceptr,
    v: sys::CUdeviceptr,
    o: sys::CUdeviceptr,
    o_partial: sys::CUdeviceptr,
    lse_partial: sys::CUdeviceptr,
    batch: i32,
    heads: i32,
    seq_len: i32,
    n_splits: i32,
    softmax_scale: f32,
    causal: i32,
    /// Encoded against this tensor set's pointers. `CUtensorMap` is 128-byte aligned (the
    /// kernel needs 64), and the Vec's buffer stays put while the Abi lives, so the
    /// parameter pointers into it are valid through every launch (and graph capture,
    /// which copies them) made from this Abi.
    maps: Vec<sys::CUtensorMap>,
}

fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> sys::CUdeviceptr {
    // Event tracking is off for this context, so the SyncOnDrop guard does nothing.
    let (p, _guard) = s.device_ptr(stream);
    p
}

impl Abi {
    /// The launch arguments of `plan` on one tensor set; `what` names the request for
    /// a tensor-map encoding failure.
    fn new(plan: &ShapePlan, set: &TensorSet, partials: &Partials, stream: &CudaStream, what: &str) -> Result<Self, Failure> {
        Self::with_o(plan, set, partials, stream, what, None)
    }

    /// As [`Abi::new`], with O at `o` instead of `set.o` (inside a guarded buffer).
    fn with_o(
        plan: &ShapePlan,
        set: &TensorSet,
        partials: &Partials,
        stream: &CudaStream,
        what: &str,
        o: Option<sys::CUdeviceptr>,
    ) -> Result<Self, Failure> {
        let s = &plan.shape;
        let mut abi = Abi {
            q: dptr(&set.q, stream),
            k: dptr(&set.k, stream),
            v: dptr(&set.v, stream),
            o: o.unwrap_or_else(|| dptr(&set.o, stream)),
            o_partial: dptr(&partials.o, stream),
            lse_partial: dptr(&partials.lse, stream),
            batch: s.b as i32,
            heads: s.h as i32,
            seq_len: s.s as i32,
            n_splits: plan.n_splits as i32,
            softmax_scale: reference::softmax_scale(s),
            causal: i32::from(s.causal),
            maps: Vec::new(),
        };
        abi.maps = plan
            .tensor_maps
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let ptr = match m.tensor {
                    TensorName::Q => abi.q,
                    TensorName::K => abi.k,
                    TensorName::V => abi.v,
                    TensorName::O => abi.o,
                };
                encode_tensor_map(i, m, s, ptr).map_err(|f| match f {
                    Failure::Cuda { during, message, sticky } => Failure::Cuda { during: format!("{what}: {during}"), message, sticky },
                    Failure::Bad(m) => Failure::Bad(format!("{what}: {m}")),
                    other => other,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(abi)
    }

    /// Queue one launch on `stream`.
    fn launch(
        &self,
        f: &CudaFunction,
        l: &Launch,
        counter: sys::CUdeviceptr,
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        let mut abi: [*mut c_void; ABI_PARAMS] = [
            &self.q as *const _ as *mut c_void,
            &self.k as *const _ as *mut c_void,
            &self.v as *const _ as *mut c_void,
            &self.o as *const _ as *mut c_void,
            &self.o_partial as *const _ as *mut c_void,
            &self.lse_partial as *const _ as *mut c_void,
            &self.batch as *const _ as *mut c_void,
            &self.heads as *const _ as *mut c_void,
            &self.seq_len as *const _ as *mut c_void,
            &self.n_splits as *const _ as *mut c_void,
            &self.softmax_scale as *const _ as *mut c_void,
            &self.causal as *const _ as *mut c_void,
            &counter as *const _ as *mut c_void,
        ];
        // Templates without tensor maps launch from the fixed array, as before; the others
        // append one pointer per encoded map.
        let mut with_maps: Vec<*mut c_void>;
        let params: &mut [*mut c_void] = if self.maps.is_empty() {
            &mut abi
        } else {
            with_maps = Vec::with_capacity(ABI_PARAMS + self.maps.len());
            with_maps.extend_from_slice(&abi);
            with_maps.extend(self.maps.iter().map(|m| m as *const sys::CUtensorMap as *mut c_void));
            &mut with_maps
        };
        // SAFETY: `f` belongs to a module that stays loaded while this request runs (the
        // candidate is only dropped by Unload, after we synchronise). `params` holds 13
        // pointers to live values matching the ABI's 13 parameters (device pointers are
        // 64-bit, scalars i32/f32), then one pointer per tensor map to a 128-byte
        // CUtensorMap owned by `self`, matching the template's `__grid_constant__` map
        // parameters in declaration order; cuLaunchKernel copies them before returning. All
        // buffers were sized by the plan's shape and n_splits. What the kernel does with
        // them is the candidate's business: faults surface as sticky errors at the next sync.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (l.grid[0], l.grid[1], l.grid[2]),
                (l.block[0], l.block[1], l.block[2]),
                l.dyn_smem,
                stream.cu_stream(),
                params,
            )
        }
    }
}

/// Encode tensor map `index` of a plan for `shape`, over the tensor at `ptr`, with the
/// geometry of [`TensorMap::geometry`] and the convention's fixed settings (UINT16
/// bit patterns, no interleave, L2 promotion 128B, out-of-bounds rows read as zeros).
fn encode_tensor_map(
    index: usize,
    map: &TensorMap,
    shape: &Shape,
    ptr: sys::CUdeviceptr,
) -> Result<sys::CUtensorMap, Failure> {
    let name = format!("tensor_map[{index}] ({})", map.tensor.as_str());
    let g = map
        .geometry(shape)
        .map_err(|why| Failure::Bad(format!("{name}: {why}")))?;
    if !ptr.is_multiple_of(16) {
        return Err(Failure::Bad(format!(
            "{name}: the tensor's address {ptr:#x} is not 16-byte aligned"
        )));
    }
    let swizzle = match map.swizzle {
        32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        other => {
            return Err(Failure::Bad(format!(
                "{name}: swizzle {other} bytes (allowed: 32, 64, 128)"
            )))
        }
    };
    let mut encoded = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: `encoded` is a writable, 128-byte-aligned CUtensorMap; the dims, strides,
    // box and element-stride arrays hold rank (4), rank - 1 (3), 4 and 4 entries as the
    // call requires; `ptr` is a live device allocation of the shape's [B,H,S,D] tensor.
    let rc = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut encoded,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            crate::spec::protocol::TensorMapGeometry::RANK,
            ptr as *mut c_void,
            g.dims.as_ptr(),
            g.strides_bytes.as_ptr(),
            g.box_dims.as_ptr(),
            g.element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    rc.result().map_err(|e| Failure::Cuda {
        during: format!(
            "encoding {name}: dims {:?}, strides {:?} B, box {:?}, swizzle {} B",
            g.dims, g.strides_bytes, g.box_dims, map.swizzle
        ),
        message: describe(e),
        // Encoding is a host-side call: nothing ran, the context is intact.
        sticky: false,
    })?;
    Ok(encoded)
}

// ----------------------------------------------------------------------------------------
// The backend.

/// The worker's CUDA backend: one context on device 0, one stream, loaded candidates by id.
pub struct CudaBackend {
    toolchain: Toolchain,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    device: DeviceInfo,
    candidates: HashMap<String, Candidate>,
    /// Builds started by `Precompile`, keyed by arch and source, oldest first.
    pending: Vec<(String, std::thread::JoinHandle<Builds>)>,
}

/// The timed and the check build of one source, and how long compiling them took.
type Builds = (Result<Compiled, CompileFailure>, Result<Compiled, CompileFailure>, f64);

/// How many precompiled sources the worker keeps waiting for a `Load` (a bounded look-ahead:
/// older guesses are dropped, their threads finish on their own).
const MAX_PENDING: usize = 2;

/// Compile both builds of `source` side by side.
fn compile_builds(tc: &Toolchain, source: &str, name: &str, arch: &str, timeout: Option<Duration>) -> Builds {
    let started = Instant::now();
    let (timed, check) = std::thread::scope(|s| {
        let check = s.spawn(|| nvrtc::compile_with_timeout(tc, source, name, arch, &[(COUNT_CTAS_DEFINE, "1".to_string())], timeout));
        let timed = nvrtc::compile_with_timeout(tc, source, name, arch, &[], timeout);
        let check = check.join().unwrap_or_else(|p| {
            Err(CompileFailure::InvalidInput(format!("check-build compile thread panicked: {}", panic_message(p.as_ref()))))
        });
        (timed, check)
    });
    (timed, check, started.elapsed().as_secs_f64() * 1e3)
}

fn pending_key(arch: &str, source: &str) -> String {
    format!("{arch}\n{source}")
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
            Ok((ctx, stream, device))
        });
        let (ctx, stream, device) = match built {
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
            pending: Vec::new(),
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
            } => self.load(id, &source, &arch, &kernels, &occupancy, compile_timeout_ms),
            Request::Precompile { source, arch, compile_timeout_ms } => {
                self.precompile(source, arch, compile_timeout_ms);
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

    // -- Load ------------------------------------------------------------------------------

    /// Start both builds of `source` on a background thread, unless already started.
    fn precompile(&mut self, source: String, arch: String, compile_timeout_ms: u64) {
        let key = pending_key(&arch, &source);
        if self.pending.iter().any(|(k, _)| *k == key) {
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        let tc = self.toolchain.clone();
        let timeout = (compile_timeout_ms > 0).then(|| Duration::from_millis(compile_timeout_ms));
        let handle = std::thread::spawn(move || compile_builds(&tc, &source, "candidate.cu", &arch, timeout));
        self.pending.push((key, handle));
    }

    fn load(
        &mut self,
        id: String,
        source: &str,
        arch: &str,
        kernels: &[String],
        occupancy: &[OccupancyQuery],
        compile_timeout_ms: u64,
    ) -> Result<Response, Failure> {
        let timeout = (compile_timeout_ms > 0).then(|| Duration::from_millis(compile_timeout_ms));
        let name = format!("{}.cu", id.replace(['\0', '/'], "_"));
        // A precompiled source: wait for its threads (usually done) instead of compiling again.
        let key = pending_key(arch, source);
        let ahead = self.pending.iter().position(|(k, _)| *k == key).map(|i| self.pending.remove(i).1);
        let (timed, check, compile_ms) = match ahead.map(|h| h.join()) {
            Some(Ok(builds)) => builds,
            _ => compile_builds(&self.toolchain, source, &name, arch, timeout),
        };
        let timed = timed.map_err(|e| compile_failure(e, "", compile_timeout_ms))?;
        let check = check.map_err(|e| {
            compile_failure(e, "check build (-DOPTD_COUNT_CTAS=1): ", compile_timeout_ms)
        })?;
        tracing::debug!(%id, compile_ms, timed_bytes = timed.cubin.len(), "compiled");

        let Compiled {
            cubin: timed_cubin,
            log,
            ..
        } = timed;
        let timed_module = api(self.ctx.load_module(Ptx::from_binary(timed_cubin)), || {
            "load: loading the timed build's CUBIN".into()
        })?;
        let check_module = api(self.ctx.load_module(Ptx::from_binary(check.cubin)), || {
            "load: loading the check build's CUBIN".into()
        })?;
        let mut cand = Candidate {
            timed: Build::new(timed_module),
            check: Build::new(check_module),
        };

        let mut resources = Vec::with_capacity(kernels.len());
        for k in kernels {
            let missing = |build: &str| {
                Failure::Compile(format!(
                    "kernel `{k}` not found in the {build} build: the source must define it as \
                     extern \"C\" __global__ void {k}(...) (without C++ name mangling){}{log}",
                    if log.is_empty() { "" } else { "\n" }
                ))
            };
            let f = api(cand.timed.function(k), || {
                format!("load: resolving kernel {k}")
            })?
            .ok_or_else(|| missing("timed"))?;
            api(cand.check.function(k), || {
                format!("load: resolving kernel {k} (check build)")
            })?
            .ok_or_else(|| missing("check"))?;
            let attr = |a: CUfunction_attribute| {
                api(f.get_attribute(a), || {
                    format!("load: reading attributes of {k}")
                })
                .map(|v| v.max(0) as u32)
            };
            resources.push(KernelResources {
                kernel: k.clone(),
                registers: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
                static_smem: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
                local_bytes: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
                max_threads: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            });
        }

        let mut occ = Vec::with_capacity(occupancy.len());
        for q in occupancy {
            let f = api(cand.timed.function(&q.kernel), || {
                format!("load: resolving kernel {}", q.kernel)
            })?
            .ok_or_else(|| {
                Failure::Bad(format!(
                    "occupancy query names kernel `{}`, which the module does not define",
                    q.kernel
                ))
            })?;
            let blocks = occupancy_of(&mut cand.timed, &f, q).map_err(|e| {
                Failure::cuda(
                    format!(
                        "load: occupancy of {} ({} threads, {} B smem)",
                        q.kernel, q.block_threads, q.dyn_smem
                    ),
                    e,
                    Stage::Api,
                )
            })?;
            occ.push(OccupancyResult {
                kernel: q.kernel.clone(),
                block_threads: q.block_threads,
                dyn_smem: q.dyn_smem,
                blocks_per_sm: blocks,
            });
        }

        if self.candidates.contains_key(&id) {
            // Replacing a loaded candidate: none of its kernels may still be running.
            after(self.stream.synchronize(), || {
                format!("load {id}: replacing the loaded candidate")
            })?;
        }
        self.candidates.insert(id, cand);
        Ok(Response::Loaded(Loaded {
            compile_ms,
            kernels: resources,
            occupancy: occ,
            log,
        }))
    }

    // -- Check -----------------------------------------------------------------------------

    fn check(
        &mut self,
        id: &str,
        plans: &[ShapePlan],
        tol: Tolerance,
        seed: u64,
        probes: Probes,
    ) -> Result<Response, Failure> {
        for p in plans {
            validate_plan(p).map_err(|m| Failure::Bad(format!("check {id}: {m}")))?;
        }
        let cand = self
            .candidates
            .get_mut(id)
            .ok_or_else(|| Failure::Bad(format!("check: no candidate loaded with id {id:?}")))?;
        let mut resolved = Vec::with_capacity(plans.len());
        for p in plans {
            resolved.push(resolve(
                &mut cand.check,
                p,
                &format!("check {}", p.shape.key()),
            )?);
        }

        let mut shapes = Vec::with_capacity(plans.len());
        for (idx, (plan, fns)) in plans.iter().zip(&resolved).enumerate() {
            let result = self.check_shape(plan, fns, tol, reference::mix_seed(seed, idx as u64), probes)?;
            let passed = result.passed;
            shapes.push(result);
            if !passed {
                break;
            }
        }
        Ok(Response::Checked(Checked { shapes }))
    }

    fn check_shape(
        &self,
        plan: &ShapePlan,
        fns: &[Resolved<'_>],
        tol: Tolerance,
        seed: u64,
        probes: Probes,
    ) -> Result<ShapeCheck, Failure> {
        let shape = plan.shape;
        let key = shape.key();
        let stream = &self.stream;
        let n = shape.elems() as usize;

        // After timing, a spacer allocated first puts this check's tensors at addresses
        // other than the first check's and the timing's.
        let _spacer = if probes.after_timing {
            let len = PROBE_SPACER_BYTES + (seed % 13) as usize * 4096;
            Some(api(stream.alloc_zeros::<u8>(len), || format!("check {key}: allocating the address spacer"))?)
        } else {
            None
        };
        let (q, k, v) = reference::randn_inputs(&shape, seed);
        let set = self.upload_set(&shape, &q, &k, &v, &format!("check {key}"))?;
        // Probes: O sits between two guard regions filled with a known pattern.
        let guarded = if probes.on {
            let g = api(stream.alloc_zeros::<u16>(n + 2 * GUARD_ELEMS), || format!("check {key}: allocating guarded O"))?;
            poison_u16(stream, &g, GUARD_BITS).map_err(|e| Failure::cuda(format!("check {key}: filling the guards"), e, Stage::Api))?;
            Some(g)
        } else {
            None
        };
        let o_at = guarded.as_ref().map(|g| dptr(g, stream) + (GUARD_ELEMS * 2) as u64);
        let nan = reference::nan_bits(shape.dtype);
        match o_at {
            Some(p) => memset16(stream, p, nan, n),
            None => poison_u16(stream, &set.o, nan),
        }
        .map_err(|e| Failure::cuda(format!("check {key}: poisoning O"), e, Stage::Api))?;
        let partials = self.alloc_partials(&shape, plan.n_splits, true, &format!("check {key}"))?;
        let counters = api(stream.alloc_zeros::<u32>(fns.len()), || {
            format!("check {key}: allocating CTA counters")
        })?;
        let counter_base = dptr(&counters, stream);

        let abi = Abi::with_o(plan, &set, &partials, stream, &format!("check {key}"), o_at)?;
        for (i, r) in fns.iter().enumerate() {
            r.function_launch(&abi, counter_base + 4 * i as u64, stream)
                .map_err(|e| {
                    Failure::cuda(
                        format!("check {key}: launch {i} ({})", r.launch.kernel),
                        e,
                        Stage::Launch,
                    )
                })?;
        }

        // The reference runs on the CPU while the GPU works.
        let rows = reference::select_rows(&shape, seed);
        let want = reference::reference_rows(&shape, &q, &k, &v, &rows);
        let sent = probes.on.then(|| {
            [&q, &k, &v].map(|x| reference::to_bits(x, shape.dtype))
        });
        drop((q, k, v));

        after(stream.synchronize(), || {
            format!("check {key}: running the launches")
        })?;
        let ran: Vec<u32> = after(stream.clone_dtoh(&counters), || {
            format!("check {key}: reading CTA counters")
        })?;
        let (out_bits, guards_bad) = match &guarded {
            Some(g) => {
                let all: Vec<u16> = after(stream.clone_dtoh(g), || format!("check {key}: reading guarded O"))?;
                let bad = all[..GUARD_ELEMS].iter().chain(&all[GUARD_ELEMS + n..]).filter(|&&b| b != GUARD_BITS).count();
                (all[GUARD_ELEMS..GUARD_ELEMS + n].to_vec(), bad)
            }
            None => (after(stream.clone_dtoh(&set.o), || format!("check {key}: reading O"))?, 0),
        };
        after(stream.synchronize(), || {
            format!("check {key}: reading results")
        })?;
        let out = reference::from_bits(&out_bits, shape.dtype);
        let cmp = reference::compare(&shape, &out, &rows, &want);

        let ctas_ran: Vec<u64> = ran.iter().map(|&c| c as u64).collect();
        let ctas_planned: Vec<u64> = fns.iter().map(|r| r.launch.ctas()).collect();
        let mut reasons = Vec::new();
        if cmp.unwritten > 0 {
            reasons.push(format!(
                "{} of {} outputs unwritten (NaN)",
                cmp.unwritten, n
            ));
        }
        if cmp.max_abs > tol.atol || cmp.max_abs.is_nan() {
            reasons.push(format!(
                "max_abs {} > atol {}",
                fmt_err(cmp.max_abs),
                tol.atol
            ));
        }
        if cmp.rel_l2 > tol.rtol_l2 || cmp.rel_l2.is_nan() {
            reasons.push(format!(
                "rel_l2 {} > rtol_l2 {}",
                fmt_err(cmp.rel_l2),
                tol.rtol_l2
            ));
        }
        for (i, (r, (&got, &planned))) in fns
            .iter()
            .zip(ctas_ran.iter().zip(&ctas_planned))
            .enumerate()
        {
            if got != planned {
                reasons.push(format!(
                    "launch {i} ({}): {got} CTAs ran, {planned} planned",
                    r.launch.kernel
                ));
            }
        }

        let mut probe_failures = Vec::new();
        if probes.after_timing && !reasons.is_empty() {
            probe_failures.push(format!("after_timing: {} on fresh inputs at other addresses (an earlier result reused?)", reasons.join("; ")));
        }
        if guards_bad > 0 {
            probe_failures.push(format!("guard: {guards_bad} elements of the {GUARD_ELEMS}-element guard regions around O were written"));
        }
        if let Some(sent) = &sent {
            for (name, buf, bits) in [("Q", &set.q, &sent[0]), ("K", &set.k, &sent[1]), ("V", &set.v, &sent[2])] {
                let now: Vec<u16> = after(stream.clone_dtoh(buf), || format!("check {key}: reading {name} back"))?;
                let changed = now.iter().zip(bits.iter()).filter(|(a, b)| a != b).count();
                if changed > 0 {
                    probe_failures.push(format!("inputs: {name} changed during the launch ({changed} elements differ)"));
                }
            }
        }
        if probes.on && reasons.is_empty() && probe_failures.is_empty() {
            if let Some(why) = self.rerun_probe(plan, fns, &set, &abi, counter_base, tol, seed)? {
                probe_failures.push(why);
            }
        }
        for p in &probe_failures {
            if !reasons.contains(p) {
                reasons.push(p.clone());
            }
        }
        Ok(ShapeCheck {
            shape,
            passed: reasons.is_empty(),
            max_abs: cmp.max_abs,
            rel_l2: cmp.rel_l2,
            unwritten: cmp.unwritten,
            rows_compared: cmp.rows_compared,
            ctas_ran,
            ctas_planned,
            reason: reasons.join("; "),
            probe_failures,
        })
    }

    /// The rerun probe: new inputs written into the same buffers, O left as the first run
    /// wrote it (not re-poisoned), the launches on a second stream. A kernel that skips
    /// work when O looks written, or keys a cache on addresses, returns stale output.
    #[allow(clippy::too_many_arguments)]
    fn rerun_probe(
        &self,
        plan: &ShapePlan,
        fns: &[Resolved<'_>],
        set: &TensorSet,
        abi: &Abi,
        counter_base: sys::CUdeviceptr,
        tol: Tolerance,
        seed: u64,
    ) -> Result<Option<String>, Failure> {
        let shape = plan.shape;
        let key = shape.key();
        let stream = &self.stream;
        let seed2 = reference::mix_seed(seed, 0x2E2E);
        // The raw driver calls below need this context current on the thread.
        api(self.ctx.bind_to_thread(), || format!("check {key}: rerun probe: binding the context"))?;
        let (q, k, v) = reference::randn_inputs(&shape, seed2);
        // The first run's work (and its reads) must be over before the buffers change.
        after(stream.synchronize(), || format!("check {key}: rerun probe: after the first run"))?;
        for (name, host, dev) in [("Q", &q, &set.q), ("K", &k, &set.k), ("V", &v, &set.v)] {
            let bits = reference::to_bits(host, shape.dtype);
            let p = dptr(dev, stream);
            // SAFETY: `p` addresses `dev.len()` == `bits.len()` u16 elements owned by `set`,
            // which outlives this call; the copy is synchronous.
            unsafe { sys::cuMemcpyHtoD_v2(p, bits.as_ptr() as *const c_void, bits.len() * 2) }
                .result()
                .map_err(|e| Failure::cuda(format!("check {key}: rerun probe: writing new {name}"), e, Stage::Api))?;
        }
        after(stream.synchronize(), || format!("check {key}: rerun probe: before the second stream"))?;
        let second = api(self.ctx.new_stream(), || format!("check {key}: rerun probe: creating a second stream"))?;
        for (i, r) in fns.iter().enumerate() {
            r.function_launch(abi, counter_base + 4 * i as u64, &second)
                .map_err(|e| Failure::cuda(format!("check {key}: rerun probe: launch {i} ({})", r.launch.kernel), e, Stage::Launch))?;
        }
        let rows = reference::select_rows(&shape, seed2);
        let want = reference::reference_rows(&shape, &q, &k, &v, &rows);
        after(second.synchronize(), || format!("check {key}: rerun probe: running on the second stream"))?;
        let n = shape.elems() as usize;
        let mut out_bits = vec![0u16; n];
        // SAFETY: `abi.o` addresses the n elements of O (in `set.o` or the guarded buffer,
        // both alive here); the copy is synchronous and the second stream has finished.
        unsafe { sys::cuMemcpyDtoH_v2(out_bits.as_mut_ptr() as *mut c_void, abi.o, n * 2) }
            .result()
            .map_err(|e| Failure::cuda(format!("check {key}: rerun probe: reading O"), e, Stage::AfterLaunch))?;
        let out = reference::from_bits(&out_bits, shape.dtype);
        let cmp = reference::compare(&shape, &out, &rows, &want);
        let bad = cmp.max_abs > tol.atol || cmp.max_abs.is_nan() || cmp.rel_l2 > tol.rtol_l2 || cmp.rel_l2.is_nan() || cmp.unwritten > 0;
        Ok(bad.then(|| {
            format!(
                "rerun: on a second stream with new inputs in the same buffers and O not re-poisoned, max_abs {} rel_l2 {} (stale or skipped output)",
                fmt_err(cmp.max_abs),
                fmt_err(cmp.rel_l2)
            )
        }))
    }

    // -- Time ------------------------------------------------------------------------------

    fn time(
        &mut self,
        cases: &[TimeCase],
        spec: &TimingSpec,
        seed: u64,
    ) -> Result<Response, Failure> {
        // Validate the whole request before touching the GPU.
        for (ci, case) in cases.iter().enumerate() {
            validate_shape(&case.shape)
                .map_err(|m| Failure::Bad(format!("time case {ci}: {m}")))?;
            for e in &case.entries {
                if e.plan.shape != case.shape {
                    return Err(Failure::Bad(format!(
                        "time case {ci}: entry {} plans shape {} but the case is {}",
                        e.id,
                        e.plan.shape.key(),
                        case.shape.key()
                    )));
                }
                validate_plan(&e.plan)
                    .map_err(|m| Failure::Bad(format!("time case {ci}, entry {}: {m}", e.id)))?;
                if !self.candidates.contains_key(&e.id) {
                    return Err(Failure::Bad(format!(
                        "time: no candidate loaded with id {:?}",
                        e.id
                    )));
                }
            }
        }
        let mut out = Vec::with_capacity(cases.len());
        for (ci, case) in cases.iter().enumerate() {
            out.push(self.time_case(case, spec, reference::mix_seed(seed, ci as u64))?);
        }
        Ok(Response::Timed(Timed { cases: out }))
    }

    fn time_case(
        &mut self,
        case: &TimeCase,
        spec: &TimingSpec,
        seed: u64,
    ) -> Result<TimedCase, Failure> {
        let shape = case.shape;
        let key = shape.key();
        let what = format!("time {key}");

        // Resolve every entry's kernels in its timed build.
        let mut entries: Vec<Vec<Resolved<'_>>> = Vec::with_capacity(case.entries.len());
        for e in &case.entries {
            let cand = self.candidates.get_mut(&e.id).ok_or_else(|| {
                Failure::Bad(format!("time: no candidate loaded with id {:?}", e.id))
            })?;
            entries.push(resolve(
                &mut cand.timed,
                &e.plan,
                &format!("{what} ({})", e.id),
            )?);
        }

        // Enough input sets to spill L2, so every execution reads from HBM.
        let set_bytes = (shape.elems() * 2 * 4).max(1) as f64;
        let want = (spec.l2_multiple * self.device.l2_bytes as f64 / set_bytes).ceil();
        let cap = spec.max_input_sets.max(1);
        let n_sets = if want.is_finite() && want >= 1.0 {
            (want.min(cap as f64)) as u32
        } else {
            1
        }
        .clamp(1, cap);

        let (q, k, v) = reference::randn_inputs(&shape, seed);
        let mut sets = Vec::with_capacity(n_sets as usize);
        for s in 0..n_sets {
            sets.push(self.upload_set(
                &shape,
                &q,
                &k,
                &v,
                &format!("{what}: input set {s} of {n_sets}"),
            )?);
        }
        drop((q, k, v));
        let max_splits = case
            .entries
            .iter()
            .map(|e| e.plan.n_splits)
            .max()
            .unwrap_or(1);
        let partials = self.alloc_partials(&shape, max_splits, false, &what)?;
        let scratch = api(self.stream.alloc_zeros::<u32>(1), || {
            format!("{what}: allocating the scratch counter")
        })?;
        let stream = &self.stream;
        let counter = dptr(&scratch, stream);

        // Per entry and set: the launch arguments, built once (tensor maps encoded against
        // that set's buffers), before any capture: a captured graph keeps copies of them.
        let abis: Vec<Vec<Abi>> = case
            .entries
            .iter()
            .map(|e| {
                sets.iter()
                    .map(|set| Abi::new(&e.plan, set, &partials, stream, &format!("{what} ({})", e.id)))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<_, _>>()?;
        let mut cursor = 0usize;
        let execute = |ei: usize, cursor: &mut usize| -> Result<(), Failure> {
            let abi = &abis[ei][*cursor % sets.len()];
            *cursor += 1;
            for (i, r) in entries[ei].iter().enumerate() {
                r.function_launch(abi, counter, stream).map_err(|e| {
                    Failure::cuda(
                        format!(
                            "{what}: entry {} launch {i} ({})",
                            case.entries[ei].id, r.launch.kernel
                        ),
                        e,
                        Stage::Launch,
                    )
                })?;
            }
            Ok(())
        };

        let start = api(
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
            || format!("{what}: creating events"),
        )?;
        let end = api(
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
            || format!("{what}: creating events"),
        )?;
        // The first warm-up execution of each entry is timed: how long the slowest one
        // runs decides how many launches a sample needs (protocol::launches_for).
        let mut slowest_us = 0f64;
        for ei in 0..case.entries.len() {
            after(start.record(stream), || format!("{what}: recording the start event"))?;
            execute(ei, &mut cursor)?;
            after(end.record(stream), || format!("{what}: recording the end event"))?;
            let ms = elapsed(&start, &end).map_err(|e| {
                Failure::cuda(format!("{what}: entry {} warmup", case.entries[ei].id), e, Stage::AfterLaunch)
            })?;
            slowest_us = slowest_us.max(ms as f64 * 1000.0);
        }
        let per_sample = crate::spec::protocol::launches_for(spec, slowest_us);
        let rounds = crate::spec::protocol::rounds_for(spec, slowest_us, per_sample);
        let warmup = spec.warmup.min(per_sample.max(2)).saturating_sub(1);
        for ei in 0..case.entries.len() {
            for _ in 0..warmup {
                execute(ei, &mut cursor)?;
            }
        }
        after(stream.synchronize(), || format!("{what}: warmup"))?;
        // Graph mode: capture `per_sample` executions of each entry once; a sample is one
        // replay, so the CPU's launch cost drops out and the time is the GPU's.
        let mut graphs = Vec::new();
        if spec.graph {
            for ei in 0..case.entries.len() {
                api(
                    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                    || format!("{what}: beginning graph capture"),
                )?;
                let mut captured = Ok(());
                for _ in 0..per_sample {
                    if let Err(e) = execute(ei, &mut cursor) {
                        captured = Err(e);
                        break;
                    }
                }
                // End the capture whatever happened, so the stream is usable again.
                let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                captured?;
                let graph = api(graph, || format!("{what}: instantiating the graph of {}", case.entries[ei].id))?
                    .ok_or_else(|| Failure::Bad(format!("{what}: captured an empty graph")))?;
                api(graph.upload(), || format!("{what}: uploading the graph"))?;
                after(graph.launch(), || format!("{what}: warming the graph of {}", case.entries[ei].id))?;
                graphs.push(graph);
            }
            after(stream.synchronize(), || format!("{what}: graph warmup"))?;
        }
        let mut samples: Vec<Vec<f64>> = case
            .entries
            .iter()
            .map(|_| Vec::with_capacity((rounds * spec.samples_per_round) as usize))
            .collect();
        let n_entries = case.entries.len();
        for round in 0..rounds {
            for j in 0..n_entries {
                // Alternate the order so that no entry always runs first.
                let ei = if round % 2 == 0 { j } else { n_entries - 1 - j };
                for _ in 0..spec.samples_per_round {
                    after(start.record(stream), || {
                        format!("{what}: recording the start event")
                    })?;
                    match graphs.get(ei) {
                        Some(g) => after(g.launch(), || format!("{what}: replaying the graph of {}", case.entries[ei].id))?,
                        None => {
                            for _ in 0..per_sample {
                                execute(ei, &mut cursor)?;
                            }
                        }
                    }
                    after(end.record(stream), || {
                        format!("{what}: recording the end event")
                    })?;
                    let ms = elapsed(&start, &end).map_err(|e| {
                        Failure::cuda(
                            format!("{what}: entry {} sample", case.entries[ei].id),
                            e,
                            Stage::AfterLaunch,
                        )
                    })?;
                    samples[ei].push(ms as f64 * 1000.0 / per_sample as f64);
                }
            }
        }
        after(stream.synchronize(), || format!("{what}: finishing"))?;

        Ok(TimedCase {
            shape,
            input_sets: n_sets,
            entries: case
                .entries
                .iter()
                .zip(samples)
                .map(|(e, s)| TimedEntry {
                    id: e.id.clone(),
                    samples_us: s,
                })
                .collect(),
        })
    }

    // -- Buffers ---------------------------------------------------------------------------

    fn upload_set(
        &self,
        shape: &Shape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        what: &str,
    ) -> Result<TensorSet, Failure> {
        let stream = &self.stream;
        let mib = shape.elems() as f64 * 2.0 / (1 << 20) as f64;
        let up = |x: &[f32], name: &str| {
            let bits = reference::to_bits(x, shape.dtype);
            api(stream.clone_htod(&bits), || {
                format!("{what}: uploading {name} ({mib:.1} MiB)")
            })
        };
        let q = up(q, "Q")?;
        let k = up(k, "K")?;
        let v = up(v, "V")?;
        let o = api(stream.alloc_zeros::<u16>(shape.elems() as usize), || {
            format!("{what}: allocating O ({mib:.1} MiB)")
        })?;
        Ok(TensorSet { q, k, v, o })
    }

    fn alloc_partials(
        &self,
        shape: &Shape,
        n_splits: u32,
        poison: bool,
        what: &str,
    ) -> Result<Partials, Failure> {
        let stream = &self.stream;
        let splits = n_splits.max(1) as u64;
        let rows = shape.b as u64 * shape.h as u64 * shape.s as u64;
        let o_len = (splits * rows * shape.d as u64).max(1) as usize;
        let lse_len = (splits * rows).max(1) as usize;
        let o = api(stream.alloc_zeros::<f32>(o_len), || {
            format!("{what}: allocating o_partial ({o_len} floats)")
        })?;
        let lse = api(stream.alloc_zeros::<f32>(lse_len), || {
            format!("{what}: allocating lse_partial ({lse_len} floats)")
        })?;
        if poison {
            poison_f32(stream, &o).map_err(|e| {
                Failure::cuda(format!("{what}: poisoning o_partial"), e, Stage::Api)
            })?;
            poison_f32(stream, &lse).map_err(|e| {
                Failure::cuda(format!("{what}: poisoning lse_partial"), e, Stage::Api)
            })?;
        }
        Ok(Partials { o, lse })
    }
}

impl Resolved<'_> {
    fn function_launch(
        &self,
        abi: &Abi,
        counter: sys::CUdeviceptr,
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        abi.launch(&self.function, self.launch, counter, stream)
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

// ----------------------------------------------------------------------------------------
// Helpers.

fn compile_failure(e: CompileFailure, prefix: &str, timeout_ms: u64) -> Failure {
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

fn fmt_err(x: f64) -> String {
    if (1e-3..1e4).contains(&x) {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}

fn elapsed(start: &CudaEvent, end: &CudaEvent) -> Result<f32, DriverError> {
    end.synchronize()?;
    start.elapsed_ms(end)
}

/// Guard regions around O in probed checks: elements each side, and their pattern.
const GUARD_ELEMS: usize = 8192;
const GUARD_BITS: u16 = 0x5A3C;
/// Bytes allocated ahead of an after-timing check's tensors (plus a seeded extra).
const PROBE_SPACER_BYTES: usize = 3 << 20;

fn memset16(stream: &CudaStream, p: sys::CUdeviceptr, bits: u16, len: usize) -> Result<(), DriverError> {
    // SAFETY: callers pass `p` addressing `len` u16 elements inside a live allocation that
    // outlives the asynchronous memset (every request synchronises before returning).
    unsafe { sys::cuMemsetD16Async(p, bits, len, stream.cu_stream()) }.result()
}

fn poison_u16(stream: &CudaStream, buf: &CudaSlice<u16>, bits: u16) -> Result<(), DriverError> {
    let p = dptr(buf, stream);
    // SAFETY: `p` addresses `buf.len()` u16 elements owned by `buf`, which outlives the
    // asynchronous memset because every request synchronises the stream before returning.
    unsafe { sys::cuMemsetD16Async(p, bits, buf.len(), stream.cu_stream()) }.result()
}

fn poison_f32(stream: &CudaStream, buf: &CudaSlice<f32>) -> Result<(), DriverError> {
    let p = dptr(buf, stream);
    // SAFETY: as in poison_u16, for `buf.len()` 32-bit elements.
    unsafe { sys::cuMemsetD32Async(p, reference::NAN_BITS_F32, buf.len(), stream.cu_stream()) }
        .result()
}

/// Blocks per SM for one occupancy query; 0 when the configuration cannot launch at all.
fn occupancy_of(
    build: &mut Build,
    f: &CudaFunction,
    q: &OccupancyQuery,
) -> Result<u32, DriverError> {
    let invalid = |e: &DriverError| e.0 == sys::CUresult::CUDA_ERROR_INVALID_VALUE;
    match build.allow_smem(&q.kernel, f, q.dyn_smem) {
        Ok(()) => {}
        // More dynamic shared memory than the device allows: it cannot run.
        Err(e) if invalid(&e) => return Ok(0),
        Err(e) => return Err(e),
    }
    match f.occupancy_max_active_blocks_per_multiprocessor(
        q.block_threads,
        q.dyn_smem as usize,
        None,
    ) {
        Ok(n) => Ok(n),
        Err(e) if invalid(&e) => Ok(0),
        Err(e) => Err(e),
    }
}

fn device_info(ctx: &Arc<CudaContext>, tc: &Toolchain) -> Result<DeviceInfo, DriverError> {
    let attr = |a: CUdevice_attribute| ctx.attribute(a).map(|v| v.max(0) as u32);
    let (major, minor) = ctx.compute_capability()?;
    let mut driver_version = 0i32;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result()?;
    Ok(DeviceInfo {
        name: ctx.name()?,
        cc_major: major.max(0) as u32,
        cc_minor: minor.max(0) as u32,
        sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        smem_optin: attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?,
        smem_per_sm: attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )?,
        l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
        max_threads_per_sm: attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
        )?,
        driver_version,
        nvrtc_version: tc.version,
        arch: format!("sm_{major}{minor}"),
    })
}

// ----------------------------------------------------------------------------------------
// Entry point.

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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn plans_are_validated() {
        let shape = Shape {
            b: 1,
            h: 1,
            s: 64,
            d: 64,
            causal: false,
            dtype: crate::spec::protocol::DType::Fp16,
        };
        let launch = Launch {
            kernel: "k".into(),
            grid: [1, 1, 1],
            block: [128, 1, 1],
            dyn_smem: 0,
        };
        let ok = ShapePlan {
            shape,
            n_splits: 1,
            launches: vec![launch.clone()],
            tensor_maps: vec![],
        };
        assert!(validate_plan(&ok).is_ok());
        let mut bad = ok.clone();
        bad.launches[0].grid = [0, 1, 1];
        assert!(validate_plan(&bad).is_err());
        let mut bad = ok.clone();
        bad.launches.clear();
        assert!(validate_plan(&bad).is_err());
        let mut bad = ok.clone();
        bad.shape.d = 0;
        assert!(validate_plan(&bad).is_err());
        // Tensor maps: validated with the same geometry the daemon's gate used.
        let mut maps = ok;
        maps.tensor_maps = vec![TensorMap { tensor: TensorName::K, box_rows: 64, swizzle: 128 }];
        assert!(validate_plan(&maps).is_ok());
        maps.tensor_maps[0].box_rows = 300;
        let err = validate_plan(&maps).unwrap_err();
        assert!(err.contains("tensor_map[0] (k)") && err.contains("box_rows = 300"), "{err}");
    }
}
