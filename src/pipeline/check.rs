//! Check: correctness against the fp32 reference, and the CTA count against the
//! planned grid, on fresh random inputs with the output poisoned before the launch;
//! for agent candidates also the worker's anti-cheat probes, before and after timing.

use std::time::Duration;

use crate::pipeline::outcome::{Failure, Verdict};
use crate::spec::protocol::{Checked, Probes, Request, Response, ShapePlan, Tolerance};
use crate::daemon::supervisor::Supervisor;

/// Check `id` on every plan, smallest shape first.
pub async fn run(
    sup: &mut Supervisor,
    id: &str,
    plans: &[ShapePlan],
    tolerance: Tolerance,
    seed: u64,
    timeout: Duration,
) -> Result<Checked, (Failure, Option<Checked>)> {
    run_probed(sup, id, plans, tolerance, seed, timeout, Probes::default()).await
}

/// [`run`] with anti-cheat probes; a failed probe is the verdict `cheating`.
pub async fn run_probed(
    sup: &mut Supervisor,
    id: &str,
    plans: &[ShapePlan],
    tolerance: Tolerance,
    seed: u64,
    timeout: Duration,
    probes: Probes,
) -> Result<Checked, (Failure, Option<Checked>)> {
    let mut ordered: Vec<ShapePlan> = plans.to_vec();
    ordered.sort_by_key(|p| (p.shape.q_rows() * p.shape.sk as u64 * p.shape.d as u64, p.shape.key()));
    let request = Request::Check { id: id.to_string(), plans: ordered, tolerance, seed, probes };
    let checked = match sup.request(&request, timeout).await {
        Ok(Response::Checked(c)) => c,
        Ok(other) => return Err((Failure::from_response("check", other), None)),
        Err(e) => return Err((Failure::from_worker("check", e), None)),
    };
    if let Some(f) = checked.first_failure() {
        let verdict = if !f.probe_failures.is_empty() {
            Verdict::Cheating
        } else if f.ctas_ran != f.ctas_planned {
            Verdict::CtaMismatch
        } else {
            Verdict::Incorrect
        };
        let when = if probes.after_timing { " (re-check after timing, fresh inputs at other addresses)" } else { "" };
        let failure = Failure::new(verdict, format!("{}{when}: {}", f.shape.key(), f.reason));
        return Err((failure, Some(checked)));
    }
    if checked.shapes.len() != plans.len() {
        let failure = Failure::new(Verdict::Error, format!("worker checked {} of {} shapes", checked.shapes.len(), plans.len()));
        return Err((failure, Some(checked)));
    }
    Ok(checked)
}
