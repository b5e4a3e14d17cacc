//! The correctness check of a candidate's build, shape by shape (smallest first,
//! stopping at the first failure): fresh random inputs, O and the partials poisoned with
//! NaN, the launches run while the CPU computes the fp32 reference, then unwritten
//! outputs, the error against the tolerance, the CTAs counted against the plan and the
//! split semaphores (lse_partial's tail) left zero as the ABI requires. The
//! launches run twice: on the shape's layout contiguous (what timing uses), then on padded
//! views (rows further apart than D, the gaps NaN, writes into them counted; the inputs
//! copied there from the contiguous ones on the device), so a kernel must honour the ABI's
//! strides. With probes on, the anti-cheat probes of
//! [`super::probe`] run on the first.

use super::abi::Abi;
use super::buffers::{dptr, memset16, poison_u16, Partials, TensorSet};
use super::error::{after, api, fmt_err, Failure, Stage};
use super::kernels::{resolve, Resolved};
use super::plan::validate_plan;
use super::{probe, CudaBackend};
use crate::spec::protocol::{Checked, Probes, Response, ShapeCheck, ShapePlan, TensorName, Tolerance, ViewStrides};
use crate::worker::reference;

impl CudaBackend {
    pub(super) fn check(
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
                &mut cand.build,
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
        &mut self,
        plan: &ShapePlan,
        fns: &[Resolved<'_>],
        tol: Tolerance,
        seed: u64,
        probes: Probes,
    ) -> Result<ShapeCheck, Failure> {
        let shape = plan.shape;
        let key = shape.key();

        // After timing, a spacer allocated first puts this check's tensors at addresses
        // other than the first check's and the timing's.
        let _spacer = if probes.after_timing { Some(probe::spacer(&self.stream, seed, &key)?) } else { None };
        // Bit patterns from the start, for both views and the reference (a decode shape's
        // K and V are 537M values: no f32 copy of them is made).
        let t0 = std::time::Instant::now();
        self.staging.draw(&self.ctx, &self.stream, &shape, seed, &format!("check {key}"))?;
        let t_inputs = t0.elapsed();
        let logical = self.staging.inputs();
        // The contiguous view first (what timing launches on), with the probes when asked;
        // the padded view's inputs copied from it on the device before its launches run.
        let what = format!("check {key}");
        let set = self.upload_set(&shape, ViewStrides::contiguous(&shape), logical, &what)?;
        let padded_set = self.copy_set(&shape, &set, ViewStrides::padded(&shape), &what)?;
        let first = self.launch_view(plan, fns, set, probes.on, &key)?;
        let t_launch = t0.elapsed();

        // The reference runs on the CPU while the GPU works.
        let rows = reference::select_rows(&shape, seed);
        let want = reference::reference_rows(&shape, logical[0], logical[1], logical[2], &rows);
        let t_reference = t0.elapsed();
        // What the input probe expects to read back: the inputs themselves where the view is
        // the logical order (borrowed, no copy), else as laid out.
        let sent = probes.on.then(|| {
            [(logical[0], TensorName::Q), (logical[1], TensorName::K), (logical[2], TensorName::V)]
                .map(|(x, t)| reference::scatter(&shape, &first.set.view, t, x, reference::nan_bits(shape.dtype)))
        });
        let seen = self.finish_view(&first, fns, &rows, &want, tol, &key)?;
        let t_results = t0.elapsed();
        let mut reasons = seen.reasons.clone();

        // The same inputs on padded views (rows VIEW_PAD elements apart beyond D, the gaps
        // NaN): a kernel that assumes contiguous tensors, or writes past a row, fails here.
        if reasons.is_empty() {
            let padded_set = match padded_set {
                Some(s) => s,
                None => self.upload_set(&shape, ViewStrides::padded(&shape), logical, &what)?,
            };
            let padded = self.launch_view(plan, fns, padded_set, false, &key)?;
            let p = self.finish_view(&padded, fns, &rows, &want, tol, &key)?;
            reasons.extend(p.reasons.iter().map(|r| format!("padded view: {r}")));
        }
        let t_padded = t0.elapsed();

        let mut probe_failures = Vec::new();
        if probes.after_timing && !reasons.is_empty() {
            probe_failures.push(format!("after_timing: {} on fresh inputs at other addresses (an earlier result reused?)", reasons.join("; ")));
        }
        if seen.guards_bad > 0 {
            probe_failures.push(format!("guard: {} elements of the {}-element guard regions around O were written", seen.guards_bad, probe::GUARD_ELEMS));
        }
        if let Some(sent) = &sent {
            probe_failures.extend(probe::changed_inputs(&self.stream, &first.set, [&sent[0], &sent[1], &sent[2]], &key)?);
        }
        // The rerun probe draws new inputs in their place.
        drop(sent);
        if probes.on && reasons.is_empty() && probe_failures.is_empty() {
            if let Some(why) = self.rerun_probe(plan, fns, &first.set, &first.abi, first.counter_base, tol, seed)? {
                probe_failures.push(why);
            }
        }
        self.staging.release();
        // Where a check's time goes (RUST_LOG=optimizerd::worker=debug in the worker's log):
        // on decode shapes the inputs are ~1 GB and the check, not the timing, is most of a
        // candidate's cost.
        let ms = |a: std::time::Duration, b: std::time::Duration| (b.saturating_sub(a)).as_secs_f64() * 1e3;
        tracing::debug!(
            "check {key}: {:.0} ms: inputs drawn {:.0}, uploaded and launched {:.0}, reference {:.0}, results {:.0}, padded view {:.0}, probes {:.0}",
            t0.elapsed().as_secs_f64() * 1e3,
            ms(Default::default(), t_inputs),
            ms(t_inputs, t_launch),
            ms(t_launch, t_reference),
            ms(t_reference, t_results),
            ms(t_results, t_padded),
            ms(t_padded, t0.elapsed()),
        );
        for p in &probe_failures {
            if !reasons.contains(p) {
                reasons.push(p.clone());
            }
        }
        Ok(ShapeCheck {
            shape,
            passed: reasons.is_empty(),
            max_abs: seen.cmp.max_abs,
            rel_l2: seen.cmp.rel_l2,
            unwritten: seen.cmp.unwritten,
            rows_compared: seen.cmp.rows_compared,
            ctas_ran: seen.ctas_ran,
            ctas_planned: fns.iter().map(|r| r.launch.ctas()).collect(),
            reason: reasons.join("; "),
            probe_failures,
        })
    }

    /// Poison `set`'s O (inside a guarded buffer when `guard`) and the partials, and queue
    /// the plan's launches on `set`.
    fn launch_view(
        &self,
        plan: &ShapePlan,
        fns: &[Resolved<'_>],
        set: TensorSet,
        guard: bool,
        key: &str,
    ) -> Result<ViewRun, Failure> {
        let shape = plan.shape;
        let stream = &self.stream;
        let n_o = set.o.len();
        // Probes: O sits between two guard regions filled with a known pattern.
        let guarded = if guard { Some(probe::guarded_o(stream, n_o, key)?) } else { None };
        let o_at = guarded.as_ref().map(|g| probe::guarded_o_ptr(g, stream));
        let nan = reference::nan_bits(shape.dtype);
        match o_at {
            Some(p) => memset16(stream, p, nan, n_o),
            None => poison_u16(stream, &set.o, nan),
        }
        .map_err(|e| Failure::cuda(format!("check {key}: poisoning O"), e, Stage::Api))?;
        let partials = self.alloc_partials(&shape, plan.n_splits, true, &format!("check {key}"))?;
        let counters = api(stream.alloc_zeros::<u32>(fns.len()), || format!("check {key}: allocating CTA counters"))?;
        let counter_base = dptr(&counters, stream);
        let abi = Abi::with_o(plan, &set, &partials, stream, &format!("check {key}"), o_at)?;
        for (i, r) in fns.iter().enumerate() {
            r.function_launch(&abi, counter_base + 4 * i as u64, stream)
                .map_err(|e| Failure::cuda(format!("check {key}: launch {i} ({})", r.launch.kernel), e, Stage::Launch))?;
        }
        Ok(ViewRun { shape, set, guarded, partials, counters, counter_base, abi })
    }

    /// Wait for a [`launch_view`]'s launches, read O back through its view and compare it
    /// with the reference rows; the reasons it fails, if any.
    fn finish_view(
        &self,
        run: &ViewRun,
        fns: &[Resolved<'_>],
        rows: &[reference::Row],
        want: &[f32],
        tol: Tolerance,
        key: &str,
    ) -> Result<ViewSeen, Failure> {
        let stream = &self.stream;
        let shape = run.shape;
        after(stream.synchronize(), || format!("check {key}: running the launches"))?;
        let ran: Vec<u32> = after(stream.clone_dtoh(&run.counters), || format!("check {key}: reading CTA counters"))?;
        let n_o = run.set.o.len();
        let (buffer, guards_bad) = match &run.guarded {
            Some(g) => probe::read_guarded_o(stream, g, n_o, key)?,
            None => (after(stream.clone_dtoh(&run.set.o), || format!("check {key}: reading O"))?, 0),
        };
        let sems = after(run.partials.read_semaphores(stream), || format!("check {key}: reading the split semaphores"))?;
        after(stream.synchronize(), || format!("check {key}: reading results"))?;
        let nan = reference::nan_bits(shape.dtype);
        let o = reference::gather(&shape, &run.set.view, TensorName::O, &buffer, nan);
        let cmp = reference::compare(&shape, &o.logical, rows, want);

        let ctas_ran: Vec<u64> = ran.iter().map(|&c| c as u64).collect();
        let mut reasons = Vec::new();
        if cmp.unwritten > 0 {
            reasons.push(format!("{} of {} outputs unwritten (NaN)", cmp.unwritten, o.logical.len()));
        }
        if o.outside_written > 0 {
            reasons.push(format!("{} elements of O's buffer outside its view were written (rows assumed contiguous?)", o.outside_written));
        }
        if cmp.max_abs > tol.atol || cmp.max_abs.is_nan() {
            reasons.push(format!("max_abs {} > atol {}", fmt_err(cmp.max_abs), tol.atol));
        }
        if cmp.rel_l2 > tol.rtol_l2 || cmp.rel_l2.is_nan() {
            reasons.push(format!("rel_l2 {} > rtol_l2 {}", fmt_err(cmp.rel_l2), tol.rtol_l2));
        }
        reasons.extend(semaphores_left(&sems, run.partials.sem_at));
        for (i, (r, &got)) in fns.iter().zip(&ctas_ran).enumerate() {
            let planned = r.launch.ctas();
            if got != planned {
                reasons.push(format!("launch {i} ({}): {got} CTAs ran, {planned} planned", r.launch.kernel));
            }
        }
        Ok(ViewSeen { cmp, ctas_ran, guards_bad, reasons })
    }
}

/// Why a plan fails the split-semaphore rule, if it does: `sems` are lse_partial's last
/// B*HQ*SQ words after the launches, starting at index `sem_at`. A later execution of the
/// plan (timing, the rerun probe, an exported caller reusing its workspace) starts from
/// these words, so every one must be back to zero.
fn semaphores_left(sems: &[u32], sem_at: usize) -> Option<String> {
    let (i, w) = sems.iter().enumerate().find(|(_, &w)| w != 0)?;
    let nonzero = sems.iter().filter(|&&w| w != 0).count();
    Some(format!(
        "left split semaphores nonzero (lse_partial[{}] = {w}, {nonzero} of {} words): the ABI requires every plan to leave lse_partial's last B*HQ*SQ words zero",
        sem_at + i,
        sems.len()
    ))
}

/// One view's launches in flight: what [`CudaBackend::finish_view`] reads back, and what
/// the probes reuse.
struct ViewRun {
    shape: crate::spec::protocol::Shape,
    set: TensorSet,
    guarded: Option<cudarc::driver::CudaSlice<u16>>,
    /// Kept alive until the launches are done; its semaphore words are read back after.
    partials: Partials,
    counters: cudarc::driver::CudaSlice<u32>,
    counter_base: cudarc::driver::sys::CUdeviceptr,
    abi: Abi,
}

/// What one view's run showed.
struct ViewSeen {
    cmp: reference::Comparison,
    ctas_ran: Vec<u64>,
    guards_bad: usize,
    reasons: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::semaphores_left;

    #[test]
    fn nonzero_split_semaphores_fail_with_the_first_index_and_the_count() {
        assert_eq!(semaphores_left(&[0, 0, 0], 6), None);
        let why = semaphores_left(&[0, 3, 0, 1], 8).expect("nonzero semaphores fail");
        assert!(why.starts_with("left split semaphores nonzero (lse_partial[9] = 3, 2 of 4 words)"), "{why}");
        assert!(why.contains("last B*HQ*SQ words zero"), "{why}");
    }
}
