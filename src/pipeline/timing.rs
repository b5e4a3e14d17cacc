//! Time: the candidate and each shape's incumbent, interleaved in one worker
//! process with CUDA events, summarized per kernel and shape.

use std::time::Duration;

use crate::pipeline::decide::Stats;
use crate::pipeline::outcome::{Failure, Verdict};
use crate::spec::protocol::{Request, Response, TimeCase, TimeEntry, Timed, TimingSpec};
use crate::daemon::supervisor::Supervisor;

pub async fn run(sup: &mut Supervisor, cases: Vec<TimeCase>, spec: TimingSpec, seed: u64, timeout: Duration) -> Result<Timed, Failure> {
    let expected: Vec<Vec<String>> = cases.iter().map(|c| c.entries.iter().map(|e| e.id.clone()).collect()).collect();
    match sup.request(&Request::Time { cases, spec, seed }, timeout).await {
        Ok(Response::Timed(t)) => {
            let got: Vec<Vec<String>> = t.cases.iter().map(|c| c.entries.iter().map(|e| e.id.clone()).collect()).collect();
            if got != expected {
                return Err(Failure::new(Verdict::Error, "worker timed other kernels than asked"));
            }
            Ok(t)
        }
        Ok(other) => Err(Failure::from_response("time", other)),
        Err(e) => Err(Failure::from_worker("time", e)),
    }
}

/// Entry `id`'s burst samples in one timed case, in the order they were taken.
pub fn samples_of<'a>(case: &'a crate::spec::protocol::TimedCase, id: &str) -> Option<&'a [f64]> {
    case.entries.iter().find(|e| e.id == id).map(|e| e.samples_us.as_slice())
}

/// Entry `id`'s sustained windows in one timed case, in the order they were taken.
pub fn sustained_samples_of<'a>(case: &'a crate::spec::protocol::TimedCase, id: &str) -> Option<&'a [f64]> {
    case.entries.iter().find(|e| e.id == id).map(|e| e.sustained_us.as_slice())
}

/// Stats of entry `id` in one timed case.
pub fn stats_of(case: &crate::spec::protocol::TimedCase, id: &str) -> Option<Stats> {
    samples_of(case, id).and_then(Stats::from_samples)
}

/// Stats of entry `id`'s sustained windows in one timed case (None: not timed sustained).
pub fn sustained_of(case: &crate::spec::protocol::TimedCase, id: &str) -> Option<Stats> {
    sustained_samples_of(case, id).and_then(Stats::from_samples)
}

pub fn entry(id: &str, plan: &crate::spec::protocol::ShapePlan) -> TimeEntry {
    TimeEntry { id: id.to_string(), plan: plan.clone() }
}
