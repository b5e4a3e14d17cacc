//! The anti-cheat probes a check runs when asked (agent candidates): guard regions around
//! O that must stay untouched, Q/K/V compared after the run with what was sent, a rerun on
//! a second stream with new inputs in the same buffers and O not re-poisoned, and, for the
//! re-check after timing, a spacer that moves the tensors to new addresses.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaSlice, CudaStream};

use super::abi::Abi;
use super::buffers::{dptr, poison_u16, TensorSet};
use super::error::{after, api, fmt_err, Failure, Stage};
use super::kernels::Resolved;
use super::CudaBackend;
use crate::spec::protocol::{ShapePlan, TensorName, Tolerance};
use crate::worker::reference;

/// Guard regions around O in probed checks: elements each side, and their pattern.
pub(super) const GUARD_ELEMS: usize = 8192;
const GUARD_BITS: u16 = 0x5A3C;
/// Bytes allocated ahead of an after-timing check's tensors (plus a seeded extra).
const PROBE_SPACER_BYTES: usize = 3 << 20;

/// The spacer of an after-timing check: allocated before its tensors, so they land at
/// other addresses than the first check's and the timing's.
pub(super) fn spacer(stream: &Arc<CudaStream>, seed: u64, key: &str) -> Result<CudaSlice<u8>, Failure> {
    let len = PROBE_SPACER_BYTES + (seed % 13) as usize * 4096;
    api(stream.alloc_zeros::<u8>(len), || format!("check {key}: allocating the address spacer"))
}

/// A buffer for O of `n` elements between two guard regions filled with [`GUARD_BITS`].
pub(super) fn guarded_o(stream: &Arc<CudaStream>, n: usize, key: &str) -> Result<CudaSlice<u16>, Failure> {
    let g = api(stream.alloc_zeros::<u16>(n + 2 * GUARD_ELEMS), || format!("check {key}: allocating guarded O"))?;
    poison_u16(stream, &g, GUARD_BITS).map_err(|e| Failure::cuda(format!("check {key}: filling the guards"), e, Stage::Api))?;
    Ok(g)
}

/// Where O starts inside a [`guarded_o`] buffer.
pub(super) fn guarded_o_ptr(g: &CudaSlice<u16>, stream: &CudaStream) -> sys::CUdeviceptr {
    dptr(g, stream) + (GUARD_ELEMS * 2) as u64
}

/// O's `n` elements read back from a [`guarded_o`] buffer, and how many guard elements
/// no longer hold the pattern.
pub(super) fn read_guarded_o(stream: &Arc<CudaStream>, g: &CudaSlice<u16>, n: usize, key: &str) -> Result<(Vec<u16>, usize), Failure> {
    let all: Vec<u16> = after(stream.clone_dtoh(g), || format!("check {key}: reading guarded O"))?;
    let bad = all[..GUARD_ELEMS].iter().chain(&all[GUARD_ELEMS + n..]).filter(|&&b| b != GUARD_BITS).count();
    Ok((all[GUARD_ELEMS..GUARD_ELEMS + n].to_vec(), bad))
}

/// One failure per input of `set` that no longer holds the bits `sent` (Q, K, V) uploaded.
pub(super) fn changed_inputs(stream: &Arc<CudaStream>, set: &TensorSet, sent: [&[u16]; 3], key: &str) -> Result<Vec<String>, Failure> {
    let mut failures = Vec::new();
    for (name, buf, bits) in [("Q", &set.q, sent[0]), ("K", &set.k, sent[1]), ("V", &set.v, sent[2])] {
        let now: Vec<u16> = after(stream.clone_dtoh(buf), || format!("check {key}: reading {name} back"))?;
        let changed = now.iter().zip(bits.iter()).filter(|(a, b)| a != b).count();
        if changed > 0 {
            failures.push(format!("inputs: {name} changed during the launch ({changed} elements differ)"));
        }
    }
    Ok(failures)
}

impl CudaBackend {
    /// The rerun probe: new inputs written into the same buffers, O left as the first run
    /// wrote it (not re-poisoned), the launches on a second stream. A kernel that skips
    /// work when O looks written, or keys a cache on addresses, returns stale output.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rerun_probe(
        &mut self,
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
        // The first run's work (and its reads) must be over before the buffers change.
        after(stream.synchronize(), || format!("check {key}: rerun probe: after the first run"))?;
        self.staging.draw(&self.ctx, stream, &shape, seed2, &format!("check {key}: rerun probe"))?;
        let [q, k, v] = self.staging.inputs();
        let nan = reference::nan_bits(shape.dtype);
        for (t, host, dev) in [(TensorName::Q, q, &set.q), (TensorName::K, k, &set.k), (TensorName::V, v, &set.v)] {
            let name = t.as_str().to_uppercase();
            let bits = reference::scatter(&shape, &set.view, t, host, nan);
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
        let want = reference::reference_rows(&shape, q, k, v, &rows);
        after(second.synchronize(), || format!("check {key}: rerun probe: running on the second stream"))?;
        let n = set.o.len();
        let mut out_bits = vec![0u16; n];
        // SAFETY: `abi.o` addresses the n elements of O (in `set.o` or the guarded buffer,
        // both alive here); the copy is synchronous and the second stream has finished.
        unsafe { sys::cuMemcpyDtoH_v2(out_bits.as_mut_ptr() as *mut c_void, abi.o, n * 2) }
            .result()
            .map_err(|e| Failure::cuda(format!("check {key}: rerun probe: reading O"), e, Stage::AfterLaunch))?;
        let o = reference::gather(&shape, &set.view, TensorName::O, &out_bits, nan);
        let cmp = reference::compare(&shape, &o.logical, &rows, &want);
        let bad = cmp.max_abs > tol.atol || cmp.max_abs.is_nan() || cmp.rel_l2 > tol.rtol_l2 || cmp.rel_l2.is_nan() || cmp.unwritten > 0;
        Ok(bad.then(|| {
            format!(
                "rerun: on a second stream with new inputs in the same buffers and O not re-poisoned, max_abs {} rel_l2 {} (stale or skipped output)",
                fmt_err(cmp.max_abs),
                fmt_err(cmp.rel_l2)
            )
        }))
    }
}
