//! The device buffers a check or a timing launches on: Q, K, V, O tensor sets uploaded in
//! the element type, the fp32 split-KV partials (with the split semaphores after the
//! LSEs), and the NaN/pattern fills that poison them before a launch.

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DriverError};

use super::error::{api, Failure, Stage};
use super::CudaBackend;
use crate::spec::protocol::{Shape, TensorName, ViewStrides};
use crate::worker::reference;

/// One set of Q, K, V, O in the element type (as raw 16-bit patterns), laid out by `view`
/// (the strides the kernels get). A padded view's gaps hold NaN in Q, K, V.
pub(super) struct TensorSet {
    pub(super) q: CudaSlice<u16>,
    pub(super) k: CudaSlice<u16>,
    pub(super) v: CudaSlice<u16>,
    pub(super) o: CudaSlice<u16>,
    pub(super) view: ViewStrides,
}

/// The fp32 split-KV scratch buffers. `lse` holds `(n_splits + 1) * rows` 4-byte words:
/// the per-split LSEs, then `rows` split semaphores (u32) that the ABI requires to be zero
/// before a plan's launches and after them.
pub(super) struct Partials {
    pub(super) o: CudaSlice<f32>,
    pub(super) lse: CudaSlice<f32>,
    /// Index in `lse` of the first semaphore word (`n_splits * rows`).
    pub(super) sem_at: usize,
}

impl Partials {
    /// Read the split semaphores back (as u32; the buffer is typed f32 for the ABI),
    /// after the stream's earlier work; the caller synchronises before using the words.
    pub(super) fn read_semaphores(&self, stream: &Arc<CudaStream>) -> Result<Vec<u32>, DriverError> {
        let words: Vec<f32> = stream.clone_dtoh(&self.lse.slice(self.sem_at..))?;
        Ok(words.into_iter().map(f32::to_bits).collect())
    }
}

/// The raw device address of a buffer, for kernel parameters and driver calls.
pub(super) fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> sys::CUdeviceptr {
    // Event tracking is off for this context, so the SyncOnDrop guard does nothing.
    let (p, _guard) = s.device_ptr(stream);
    p
}

impl CudaBackend {
    /// Upload Q, K, V (their element type's bit patterns in logical order, see
    /// `reference::randn_inputs`) into buffers laid out by `view`,
    /// and allocate O the same way; `what` names the request.
    pub(super) fn upload_set(&self, shape: &Shape, view: ViewStrides, [q, k, v]: [&[u16]; 3], what: &str) -> Result<TensorSet, Failure> {
        let stream = &self.stream;
        let nan = reference::nan_bits(shape.dtype);
        let up = |x: &[u16], t: TensorName| {
            let bits = reference::scatter(shape, &view, t, x, nan);
            let mib = bits.len() as f64 * 2.0 / (1 << 20) as f64;
            api(stream.clone_htod(bits.as_ref()), || format!("{what}: uploading {} ({mib:.1} MiB)", t.as_str().to_uppercase()))
        };
        let q = up(q, TensorName::Q)?;
        let k = up(k, TensorName::K)?;
        let v = up(v, TensorName::V)?;
        let n_o = view.extent(shape, TensorName::O) as usize;
        let o = api(stream.alloc_zeros::<u16>(n_o), || {
            format!("{what}: allocating O ({:.1} MiB)", n_o as f64 * 2.0 / (1 << 20) as f64)
        })?;
        Ok(TensorSet { q, k, v, o, view })
    }

    /// Q, K, V of `src` copied on the device into new buffers laid out by `view` (gaps NaN,
    /// as [`upload_set`] leaves them), O allocated the same way; `None` when some tensor's
    /// two views are not one pitched 2D copy apart (`reference::pitched_copy`). Queued on
    /// the stream, so it reads `src` before anything queued after it. Why: the check's
    /// padded view is the same inputs laid out again; built on the host it was a second
    /// upload of ~1.5 GB for a large decode shape (half of that shape's check).
    pub(super) fn copy_set(&self, shape: &Shape, src: &TensorSet, view: ViewStrides, what: &str) -> Result<Option<TensorSet>, Failure> {
        let copies = [TensorName::Q, TensorName::K, TensorName::V].map(|t| reference::pitched_copy(shape, &src.view, &view, t));
        let [Some(cq), Some(ck), Some(cv)] = copies else {
            return Ok(None);
        };
        let stream = &self.stream;
        let nan = reference::nan_bits(shape.dtype);
        let copy = |from: &CudaSlice<u16>, t: TensorName, p: reference::Pitched| {
            let n = view.extent(shape, t) as usize;
            let name = t.as_str().to_uppercase();
            let to = api(stream.alloc_zeros::<u16>(n), || format!("{what}: allocating {name} ({:.1} MiB)", n as f64 * 2.0 / (1 << 20) as f64))?;
            poison_u16(stream, &to, nan).map_err(|e| Failure::cuda(format!("{what}: filling {name}'s gaps"), e, Stage::Api))?;
            let desc = sys::CUDA_MEMCPY2D {
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcDevice: dptr(from, stream),
                srcPitch: p.src_pitch as usize * 2,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstDevice: dptr(&to, stream),
                dstPitch: p.dst_pitch as usize * 2,
                WidthInBytes: p.width as usize * 2,
                Height: p.height as usize,
                srcXInBytes: 0,
                srcY: 0,
                srcHost: std::ptr::null(),
                srcArray: std::ptr::null_mut(),
                dstXInBytes: 0,
                dstY: 0,
                dstHost: std::ptr::null_mut(),
                dstArray: std::ptr::null_mut(),
            };
            // SAFETY: both pointers address live allocations of this context that hold
            // `height` rows at their pitches (`pitched_copy` derived them from the views'
            // extents); both outlive the asynchronous copy, since every request
            // synchronises the stream before its buffers are freed.
            unsafe { sys::cuMemcpy2DAsync_v2(&desc, stream.cu_stream()) }
                .result()
                .map_err(|e| Failure::cuda(format!("{what}: copying {name} into another view on the device"), e, Stage::Api))?;
            Ok::<_, Failure>(to)
        };
        let q = copy(&src.q, TensorName::Q, cq)?;
        let k = copy(&src.k, TensorName::K, ck)?;
        let v = copy(&src.v, TensorName::V, cv)?;
        let n_o = view.extent(shape, TensorName::O) as usize;
        let o = api(stream.alloc_zeros::<u16>(n_o), || {
            format!("{what}: allocating O ({:.1} MiB)", n_o as f64 * 2.0 / (1 << 20) as f64)
        })?;
        Ok(Some(TensorSet { q, k, v, o, view }))
    }

    /// Allocate the split-KV partials for `n_splits`, zeroed; when `poison`, o_partial and
    /// the LSE words are NaN-poisoned but the semaphore words stay zero (the ABI's
    /// precondition for a plan's first launch).
    pub(super) fn alloc_partials(
        &self,
        shape: &Shape,
        n_splits: u32,
        poison: bool,
        what: &str,
    ) -> Result<Partials, Failure> {
        let stream = &self.stream;
        let splits = n_splits.max(1) as u64;
        let rows = shape.q_rows();
        let o_len = (splits * rows * shape.d as u64).max(1) as usize;
        let sem_at = (splits * rows) as usize;
        // The LSEs, then one semaphore word per row (ABI v2's compatible extension).
        let lse_len = ((splits + 1) * rows).max(1) as usize;
        let o = api(stream.alloc_zeros::<f32>(o_len), || {
            format!("{what}: allocating o_partial ({o_len} floats)")
        })?;
        let lse = api(stream.alloc_zeros::<f32>(lse_len), || {
            format!("{what}: allocating lse_partial ({lse_len} words: LSEs and split semaphores)")
        })?;
        if poison {
            poison_f32(stream, dptr(&o, stream), o.len()).map_err(|e| {
                Failure::cuda(format!("{what}: poisoning o_partial"), e, Stage::Api)
            })?;
            poison_f32(stream, dptr(&lse, stream), sem_at.min(lse.len())).map_err(|e| {
                Failure::cuda(format!("{what}: poisoning lse_partial's LSE words"), e, Stage::Api)
            })?;
        }
        Ok(Partials { o, lse, sem_at })
    }
}

/// Fill `len` 16-bit elements at `p` with `bits`.
pub(super) fn memset16(stream: &CudaStream, p: sys::CUdeviceptr, bits: u16, len: usize) -> Result<(), DriverError> {
    // SAFETY: callers pass `p` addressing `len` u16 elements inside a live allocation that
    // outlives the asynchronous memset (every request synchronises before returning).
    unsafe { sys::cuMemsetD16Async(p, bits, len, stream.cu_stream()) }.result()
}

/// Fill all of `buf` with the 16-bit pattern `bits`.
pub(super) fn poison_u16(stream: &CudaStream, buf: &CudaSlice<u16>, bits: u16) -> Result<(), DriverError> {
    let p = dptr(buf, stream);
    // SAFETY: `p` addresses `buf.len()` u16 elements owned by `buf`, which outlives the
    // asynchronous memset because every request synchronises the stream before returning.
    unsafe { sys::cuMemsetD16Async(p, bits, buf.len(), stream.cu_stream()) }.result()
}

/// Fill `len` 32-bit elements at `p` with the fp32 quiet NaN.
fn poison_f32(stream: &CudaStream, p: sys::CUdeviceptr, len: usize) -> Result<(), DriverError> {
    // SAFETY: as in poison_u16: callers pass `p` addressing at least `len` 32-bit elements
    // of a live buffer that outlives the asynchronous memset.
    unsafe { sys::cuMemsetD32Async(p, reference::NAN_BITS_F32, len, stream.cu_stream()) }.result()
}
