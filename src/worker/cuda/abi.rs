//! The shared kernel ABI: the launch arguments of a plan on one tensor set (pointers,
//! sizes, softmax scale, causal flag, tensor maps) and queuing one launch with them.

use std::ffi::c_void;

use cudarc::driver::sys;
use cudarc::driver::{result, CudaFunction, CudaStream, DriverError};

use super::buffers::{dptr, Partials, TensorSet};
use super::error::Failure;
use super::tensor_map::encode_tensor_map;
use crate::spec::protocol::{Launch, ShapePlan, TensorName, ABI_PARAMS};
use crate::worker::reference;

/// Arguments of the shared kernel ABI v3 (the CTA counter is passed per launch):
/// `(q, k, v, o, o_partial, lse_partial, batch, heads_q, heads_kv, seq_q, seq_k, n_splits,
/// softmax_scale, causal, window, strides, cta_counter)`, then one encoded `CUtensorMap` per tensor
/// map of the plan, passed by value.
pub(super) struct Abi {
    q: sys::CUdeviceptr,
    k: sys::CUdeviceptr,
    v: sys::CUdeviceptr,
    /// Where O is: read back directly by the rerun probe.
    pub(super) o: sys::CUdeviceptr,
    o_partial: sys::CUdeviceptr,
    lse_partial: sys::CUdeviceptr,
    batch: i32,
    heads_q: i32,
    heads_kv: i32,
    seq_q: i32,
    seq_k: i32,
    n_splits: i32,
    softmax_scale: f32,
    causal: i32,
    /// The sliding window's keys, 0 for none.
    window: i32,
    /// `struct optd_strides` of optd.cuh: 12 int64 element strides, passed by value.
    strides: AbiStrides,
    /// Encoded against this tensor set's pointers. `CUtensorMap` is 128-byte aligned (the
    /// kernel needs 64), and the Vec's buffer stays put while the Abi lives, so the
    /// parameter pointers into it are valid through every launch (and graph capture,
    /// which copies them) made from this Abi.
    maps: Vec<sys::CUtensorMap>,
}

/// `struct optd_strides` (kernel-templates/common/optd.cuh): q_b, q_h, q_s, k_b, .., o_s.
#[repr(C)]
struct AbiStrides([i64; 12]);

impl Abi {
    /// The launch arguments of `plan` on one tensor set; `what` names the request for
    /// a tensor-map encoding failure.
    pub(super) fn new(plan: &ShapePlan, set: &TensorSet, partials: &Partials, stream: &CudaStream, what: &str) -> Result<Self, Failure> {
        Self::with_o(plan, set, partials, stream, what, None)
    }

    /// As [`Abi::new`], with O at `o` instead of `set.o` (inside a guarded buffer).
    pub(super) fn with_o(
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
            heads_q: s.hq as i32,
            heads_kv: s.hkv as i32,
            seq_q: s.sq as i32,
            seq_k: s.sk as i32,
            n_splits: plan.n_splits as i32,
            softmax_scale: reference::softmax_scale(s),
            causal: i32::from(s.causal),
            window: s.abi_window() as i32,
            strides: AbiStrides(set.view.abi()),
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
                encode_tensor_map(i, m, s, &set.view, ptr).map_err(|f| match f {
                    Failure::Cuda { during, message, sticky } => Failure::Cuda { during: format!("{what}: {during}"), message, sticky },
                    Failure::Bad(m) => Failure::Bad(format!("{what}: {m}")),
                    other => other,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(abi)
    }

    /// Queue one launch on `stream`.
    pub(super) fn launch(
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
            &self.heads_q as *const _ as *mut c_void,
            &self.heads_kv as *const _ as *mut c_void,
            &self.seq_q as *const _ as *mut c_void,
            &self.seq_k as *const _ as *mut c_void,
            &self.n_splits as *const _ as *mut c_void,
            &self.softmax_scale as *const _ as *mut c_void,
            &self.causal as *const _ as *mut c_void,
            &self.window as *const _ as *mut c_void,
            &self.strides as *const _ as *mut c_void,
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
        // candidate is only dropped by Unload, after we synchronise). `params` holds 17
        // pointers to live values matching the ABI's 17 parameters (device pointers are
        // 64-bit, scalars i32/f32, the strides a #[repr(C)] struct of 12 i64 laid out as
        // `struct optd_strides`), then one pointer per tensor map to a 128-byte
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
