//! Gate: static checks before anything is compiled.
//!
//! The template's declared formulas are evaluated for every workload shape; a
//! candidate is rejected when the shape is outside the template's regime (`max_sq`: a
//! decode template refuses prefill shapes), when a launch would ask for more shared
//! memory than the device allows, an impossible block or grid, or when its first launch would put
//! fewer CTAs on the GPU than the stage demands (a (1,1,1) grid by mistake, or a
//! split that leaves most SMs idle). It also refuses a template the device cannot run
//! (compute capability below `min_cc`, or an arch-specific template such as wgmma-tma's
//! sm_90a on another cc) and tensor maps the TMA cannot encode for a shape.
//!
//! The engine gates per shape ([`check_each`]): a candidate is refused only for the
//! shapes it does not fit, and goes on with the others. One check waits for the compile
//! ([`check_loaded`]): the kernel's static shared memory, which only the built function
//! knows, counts against the same per-block limit as the dynamic bytes.

use crate::spec::protocol::{DeviceInfo, Loaded, Shape, ShapePlan, ViewStrides};
use crate::spec::template::{eval_int_expr, shape_vars, Params, Template};

/// Why a candidate failed the gate, in words for the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateFailure(pub String);

/// What the gate decided for each shape: the launch plans of the shapes the candidate
/// fits, and why it does not fit the others (shape key, reason).
#[derive(Debug, Clone)]
pub struct PerShape {
    pub plans: Vec<ShapePlan>,
    pub refused: Vec<(String, String)>,
}

/// Evaluate the launch plan of every shape and check it against the device; a
/// candidate that does not fit one shape fails as a whole.
pub fn check(
    template: &Template,
    params: &Params,
    shapes: &[Shape],
    device: &DeviceInfo,
    min_ctas: &str,
) -> Result<Vec<ShapePlan>, GateFailure> {
    let each = check_each(template, params, shapes, device, min_ctas)?;
    match each.refused.into_iter().next() {
        Some((_, why)) => Err(GateFailure(why)),
        None => Ok(each.plans),
    }
}

/// Per-shape gating: a candidate that does not fit some shapes (shared memory, the CTA
/// floor, a tensor map) is still planned for the shapes it fits. Err only when the
/// device cannot run the template at all or no shape is left.
pub fn check_each(
    template: &Template,
    params: &Params,
    shapes: &[Shape],
    device: &DeviceInfo,
    min_ctas: &str,
) -> Result<PerShape, GateFailure> {
    template.meta.target_arch(device).map_err(GateFailure)?;
    let mut out = PerShape { plans: Vec::with_capacity(shapes.len()), refused: Vec::new() };
    for shape in shapes {
        match check_shape(template, params, shape, device, min_ctas) {
            Ok(plan) => out.plans.push(plan),
            Err(GateFailure(why)) => out.refused.push((shape.key(), why)),
        }
    }
    if out.plans.is_empty() {
        let why: Vec<&str> = out.refused.iter().map(|(_, w)| w.as_str()).collect();
        return Err(GateFailure(why.join("; ")));
    }
    Ok(out)
}

fn check_shape(template: &Template, params: &Params, shape: &Shape, device: &DeviceInfo, min_ctas: &str) -> Result<ShapePlan, GateFailure> {
    let key = shape.key();
    // The template's regime (`max_sq`: decode templates refuse prefill shapes).
    template.meta.admits(shape).map_err(|why| GateFailure(format!("{key}: {why}")))?;
    let plan = template.plan(params, shape, device).map_err(|e| GateFailure(format!("{key}: {e}")))?;
    check_tensor_maps(template, &plan)?;
    let first = plan.launches.first().ok_or_else(|| GateFailure(format!("{key}: no launch planned")))?;
    for l in &plan.launches {
        let threads: u32 = l.block.iter().product();
        if threads == 0 || threads > 1024 || !threads.is_multiple_of(32) {
            return Err(GateFailure(format!("{key}: {} block {:?} = {threads} threads (allowed: 32..=1024, a multiple of 32)", l.kernel, l.block)));
        }
        if l.grid.contains(&0) || l.grid[1] > 65535 || l.grid[2] > 65535 || l.grid[0] > i32::MAX as u32 {
            return Err(GateFailure(format!("{key}: {} grid {:?} is outside the device's grid limits", l.kernel, l.grid)));
        }
        if l.dyn_smem > device.smem_optin {
            return Err(GateFailure(format!(
                "{key}: {} needs {} B of dynamic shared memory, device allows {} B per block",
                l.kernel, l.dyn_smem, device.smem_optin
            )));
        }
    }
    let vars = shape_vars(shape, device);
    let need = eval_int_expr(min_ctas, &vars).map_err(|e| GateFailure(format!("stage min_ctas \"{min_ctas}\": {e}")))?;
    let ctas = first.ctas();
    if (ctas as i64) < need {
        return Err(GateFailure(format!(
            "{key}: {} launches {ctas} CTAs (grid {:?}); the stage needs at least {need} to fill the GPU",
            first.kernel, first.grid
        )));
    }
    Ok(plan)
}

/// After the compile: a launch fits only if its dynamic shared memory plus its kernel's static
/// shared memory (mbarriers, `__shared__` arrays: known from the built function) stays within
/// the device's opt-in limit. The formula-only check above passes a launch whose dynamic
/// bytes land exactly on the limit; the driver then refuses it (CUDA_ERROR_INVALID_VALUE), a
/// crash instead of a reason. Returns the plans that fit and, per shape that does not, why.
pub fn check_loaded(plans: Vec<ShapePlan>, loaded: &Loaded, device: &DeviceInfo) -> PerShape {
    let mut out = PerShape { plans: Vec::new(), refused: Vec::new() };
    for plan in plans {
        let over = plan.launches.iter().find_map(|l| {
            let stat = loaded.kernels.iter().find(|k| k.kernel == l.kernel)?.static_smem;
            let total = u64::from(l.dyn_smem) + u64::from(stat);
            (total > u64::from(device.smem_optin)).then(|| {
                format!(
                    "{}: {} needs {} B of dynamic plus {stat} B of static shared memory = {total} B, device allows {} B \
                     per block; fix: knobs with less shared memory (fewer STAGES, a smaller BLOCK_N), or a template \
                     formula that counts the static bytes",
                    plan.shape.key(),
                    l.kernel,
                    l.dyn_smem,
                    device.smem_optin
                )
            })
        });
        match over {
            Some(why) => out.refused.push((plan.shape.key(), why)),
            None => out.plans.push(plan),
        }
    }
    out
}

/// Every tensor map of the plan must be encodable by the TMA for its shape (the same
/// geometry the worker encodes and the export describes).
fn check_tensor_maps(template: &Template, plan: &ShapePlan) -> Result<(), GateFailure> {
    for (i, m) in plan.tensor_maps.iter().enumerate() {
        // The check runs contiguous and padded views: both must encode.
        let views = [ViewStrides::contiguous(&plan.shape), ViewStrides::padded(&plan.shape)];
        if let Some(why) = views.iter().find_map(|v| m.geometry(&plan.shape, v).err()) {
            let spec = template.tensor_maps.get(i);
            return Err(GateFailure(format!(
                "{}: template {}, tensor_map[{i}] ({}, box_rows \"{}\" = {}, swizzle {}): {why}; fix: choose knobs or a swizzle \
                 for which D is a multiple of swizzle / 2, box_rows is in 1..=256 and box_panels in 1..=D / (swizzle / 2), \
                 or drop this shape",
                plan.shape.key(),
                template.name(),
                m.tensor.as_str(),
                spec.map_or("?", |s| s.box_rows.as_str()),
                m.box_rows,
                m.swizzle
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{KernelResources, Launch};
    use crate::test_fixtures::{h100, llama_decode};

    fn plan(shape: Shape, kernel: &str, dyn_smem: u32) -> ShapePlan {
        ShapePlan {
            shape,
            n_splits: 1,
            launches: vec![Launch { kernel: kernel.into(), grid: [132, 1, 1], block: [384, 1, 1], dyn_smem }],
            tensor_maps: vec![],
        }
    }

    fn loaded(static_smem: u32) -> Loaded {
        Loaded {
            compile_ms: 1.0,
            waited_ms: 1.0,
            kernels: vec![KernelResources { kernel: "optd_fwd_d128".into(), registers: 168, static_smem, local_bytes: 0, max_threads: 384 }],
            occupancy: vec![],
            log: String::new(),
        }
    }

    #[test]
    fn static_shared_memory_counts_against_the_limit_after_the_compile() {
        let dev = h100();
        let small = Shape { sk: 1024, ..llama_decode() };
        // Dynamic bytes exactly at the opt-in limit pass the formula check; with 104 B of
        // mbarriers the launch cannot run, and only that shape is refused.
        let plans = vec![plan(llama_decode(), "optd_fwd_d128", dev.smem_optin), plan(small, "optd_fwd_d128", 200_000)];
        let out = check_loaded(plans, &loaded(104), &dev);
        assert_eq!(out.plans.len(), 1);
        assert_eq!(out.plans[0].shape, small);
        assert_eq!(out.refused.len(), 1);
        let (key, why) = &out.refused[0];
        assert_eq!(key, &llama_decode().key());
        assert!(why.contains("232448 B of dynamic plus 104 B of static shared memory = 232552 B"), "{why}");
        assert!(why.contains("B per block; fix: knobs with less shared memory"), "{why}");
    }

    #[test]
    fn a_launch_within_the_limit_or_of_an_unknown_kernel_is_kept() {
        let dev = h100();
        let plans = vec![plan(llama_decode(), "optd_fwd_d128", dev.smem_optin - 104)];
        assert_eq!(check_loaded(plans.clone(), &loaded(104), &dev).plans.len(), 1);
        // No resources for the kernel (an older worker): nothing to add, the formula check stands.
        let other = vec![plan(llama_decode(), "optd_fwd_d64", dev.smem_optin)];
        assert!(check_loaded(other, &loaded(104), &dev).refused.is_empty());
    }
}
