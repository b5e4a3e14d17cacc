//! Compile: have the worker build a candidate with NVRTC (one build, checked and
//! timed: it counts its CTAs when the launch gives it a counter), load it, and report
//! its resource usage.
//!
//! The target is the caller's: the device's `sm_<cc>`, or `sm_<cc>a` for arch-specific
//! templates (see [`crate::spec::template::Meta::target_arch`]); the ledger records which.

use std::time::Duration;

use crate::pipeline::outcome::Failure;
use crate::spec::protocol::{BuildAsk, BuildScope, Loaded, OccupancyQuery, Request, Response, ShapePlan};
use crate::daemon::supervisor::Supervisor;

/// Compile and load `source` as module `id` for `arch` (e.g. `sm_90`, `sm_90a`), its builds
/// holding what the run's `scope` says (its head dims' kernels, the window's code or not).
#[allow(clippy::too_many_arguments)]
pub async fn load(
    sup: &mut Supervisor,
    id: &str,
    source: &str,
    arch: &str,
    scope: &BuildScope,
    kernels: Vec<String>,
    plans: &[ShapePlan],
    timeout: Duration,
) -> Result<Loaded, Failure> {
    let arch = arch.to_string();
    let mut occupancy: Vec<OccupancyQuery> = Vec::new();
    for l in plans.iter().flat_map(|p| &p.launches) {
        let q = OccupancyQuery { kernel: l.kernel.clone(), block_threads: l.block.iter().product(), dyn_smem: l.dyn_smem };
        if !occupancy.contains(&q) {
            occupancy.push(q);
        }
    }
    let request = Request::Load {
        id: id.to_string(),
        source: source.to_string(),
        arch,
        kernels,
        occupancy,
        // The worker cancels NVRTC a little before the hard limit so that a slow compile is
        // reported as a compile timeout rather than a killed worker.
        compile_timeout_ms: (timeout.as_millis() as u64) * 4 / 5,
        head_dims: scope.head_dims.clone(),
        windows: scope.windows,
    };
    match sup.request(&request, timeout).await {
        Ok(Response::Loaded(l)) => Ok(l),
        Ok(other) => Err(Failure::from_response("compile", other)),
        Err(e) => Err(Failure::from_worker("compile", e)),
    }
}

/// Have the worker compile `builds` (soonest needed first, at most
/// [`PRECOMPILE_SLOTS`](crate::spec::protocol::PRECOMPILE_SLOTS); `windows`: the run's
/// [`BuildScope::windows`]) on `threads` background threads (0: the worker's choice) and
/// return at once (the look-ahead); the list replaces the one asked for before, and a later
/// [`load`] of one of them takes its result. A failure here loses only the guesses: the
/// caller logs it and goes on.
pub async fn precompile(sup: &mut Supervisor, builds: Vec<BuildAsk>, threads: u32, windows: bool, timeout: Duration) -> Result<(), String> {
    let request = Request::Precompile { builds, compile_timeout_ms: (timeout.as_millis() as u64) * 4 / 5, threads, windows };
    match sup.request(&request, Duration::from_secs(10)).await {
        Ok(Response::Precompiling) => Ok(()),
        Ok(other) => Err(format!("unexpected answer to precompile: {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Waves of the first launch: CTAs over what the whole GPU holds at once.
pub fn waves(plan: &ShapePlan, loaded: &Loaded, sm_count: u32) -> Option<f64> {
    let first = plan.launches.first()?;
    let threads: u32 = first.block.iter().product();
    let per_sm = loaded
        .occupancy
        .iter()
        .find(|o| o.kernel == first.kernel && o.block_threads == threads && o.dyn_smem == first.dyn_smem)?
        .blocks_per_sm;
    if per_sm == 0 {
        return None;
    }
    Some(first.ctas() as f64 / (per_sm as f64 * sm_count as f64))
}
