//! The correctness check of a candidate's check build, shape by shape (smallest first,
//! stopping at the first failure): fresh random inputs, O and the partials poisoned with
//! NaN, the launches run while the CPU computes the fp32 reference, then unwritten
//! outputs, the error against the tolerance and the CTAs counted against the plan. With
//! probes on, the anti-cheat probes of [`super::probe`] run too.

use super::abi::Abi;
use super::buffers::{dptr, memset16, poison_u16};
use super::error::{after, api, fmt_err, Failure, Stage};
use super::kernels::{resolve, Resolved};
use super::plan::validate_plan;
use super::{probe, CudaBackend};
use crate::spec::protocol::{Checked, Probes, Response, ShapeCheck, ShapePlan, Tolerance};
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
        let _spacer = if probes.after_timing { Some(probe::spacer(stream, seed, &key)?) } else { None };
        let (q, k, v) = reference::randn_inputs(&shape, seed);
        let set = self.upload_set(&shape, &q, &k, &v, &format!("check {key}"))?;
        // Probes: O sits between two guard regions filled with a known pattern.
        let guarded = if probes.on { Some(probe::guarded_o(stream, n, &key)?) } else { None };
        let o_at = guarded.as_ref().map(|g| probe::guarded_o_ptr(g, stream));
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
            Some(g) => probe::read_guarded_o(stream, g, n, &key)?,
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
            probe_failures.push(format!("guard: {guards_bad} elements of the {}-element guard regions around O were written", probe::GUARD_ELEMS));
        }
        if let Some(sent) = &sent {
            probe_failures.extend(probe::changed_inputs(stream, &set, sent, &key)?);
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
}
