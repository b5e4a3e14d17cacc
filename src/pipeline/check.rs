//! Check: correctness against the fp32 reference, and the CTA count against the
//! planned grid, on fresh random inputs with the output poisoned before the launch.

use std::time::Duration;

use crate::pipeline::outcome::{Failure, Verdict};
use crate::spec::protocol::{Checked, Request, Response, ShapePlan, Tolerance};
use crate::daemon::supervisor::Supervisor;

/// Run the check build of `id` on every plan, smallest shape first.
pub async fn run(
    sup: &mut Supervisor,
    id: &str,
    plans: &[ShapePlan],
    tolerance: Tolerance,
    seed: u64,
    timeout: Duration,
) -> Result<Checked, (Failure, Option<Checked>)> {
    let mut ordered: Vec<ShapePlan> = plans.to_vec();
    ordered.sort_by_key(|p| (p.shape.elems() * p.shape.s as u64, p.shape.key()));
    let request = Request::Check { id: id.to_string(), plans: ordered, tolerance, seed };
    let checked = match sup.request(&request, timeout).await {
        Ok(Response::Checked(c)) => c,
        Ok(other) => return Err((Failure::from_response("check", other), None)),
        Err(e) => return Err((Failure::from_worker("check", e), None)),
    };
    if let Some(f) = checked.first_failure() {
        let verdict = if f.ctas_ran != f.ctas_planned { Verdict::CtaMismatch } else { Verdict::Incorrect };
        let failure = Failure::new(verdict, format!("{}: {}", f.shape.key(), f.reason));
        return Err((failure, Some(checked)));
    }
    if checked.shapes.len() != plans.len() {
        let failure = Failure::new(Verdict::Error, format!("worker checked {} of {} shapes", checked.shapes.len(), plans.len()));
        return Err((failure, Some(checked)));
    }
    Ok(checked)
}
