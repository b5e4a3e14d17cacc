//! Gate: static checks before anything is compiled.
//!
//! The template's declared formulas are evaluated for every workload shape; a
//! candidate is rejected when a launch would ask for more shared memory than the
//! device allows, an impossible block or grid, or when its first launch would put
//! fewer CTAs on the GPU than the stage demands (a (1,1,1) grid by mistake, or a
//! split that leaves most SMs idle).

use crate::protocol::{DeviceInfo, Shape, ShapePlan};
use crate::template::{eval_int_expr, shape_vars, Params, Template};

/// Why a candidate failed the gate, in words for the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateFailure(pub String);

/// Evaluate the launch plan of every shape and check it against the device.
pub fn check(
    template: &Template,
    params: &Params,
    shapes: &[Shape],
    device: &DeviceInfo,
    min_ctas: &str,
) -> Result<Vec<ShapePlan>, GateFailure> {
    let mut plans = Vec::with_capacity(shapes.len());
    for shape in shapes {
        let key = shape.key();
        let plan = template.plan(params, shape, device).map_err(|e| GateFailure(format!("{key}: {e}")))?;
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
        plans.push(plan);
    }
    Ok(plans)
}
