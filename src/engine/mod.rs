//! The run loop: walk the strategy plan until the budget or the plan runs out, and
//! take every candidate through render -> gate -> compile -> check -> time ->
//! decide -> record. Each stage lives in its own module; this file only sequences
//! them and keeps the run's state (incumbent per shape, budget, workspace).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::daemon::lock::GpuLock;
use crate::daemon::shutdown::Shutdown;
use crate::daemon::supervisor::{Supervisor, WorkerCommand};
use crate::pipeline::{record, render};
use crate::spec::config::Config;
use crate::spec::protocol::{DeviceInfo, Shape};
use crate::spec::states::RunState;
use crate::spec::template::Template;
use crate::storage::ledger::{IterationRecord, Ledger, LedgerError, StageHistory};
use crate::storage::workspace::Workspace;
use crate::strategy::plan::Plan;
use crate::strategy::search::Canonical;

/// The shortest wait for a candidate's worker request that the budget's end imposes.
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

mod agent_stage;
mod candidate;
mod closing;
mod rerank;
mod reserve;
mod gpu_wait;
mod incumbents;
mod open_phase;
mod paired_score;
mod phase;
mod plan_stage;
mod setup;
mod warm_start;

use incumbents::{Incumbent, Module};
pub use setup::{resumable, SetupError};

/// What `optimizerd start` asks for.
pub struct RunOptions {
    pub config: Config,
    pub plan_path: PathBuf,
    pub budget: Duration,
    pub worker: WorkerCommand,
    /// Fixed run id (tests); None makes one from the clock.
    pub run_id: Option<String>,
    /// Seed for input generation; None draws one.
    pub seed: Option<u64>,
    /// A new run, or the continuation of one the ledger holds.
    pub mode: Mode,
    /// Skip the one-run-per-GPU lock.
    pub allow_concurrent: bool,
    /// Ignore the memory of earlier runs (`start --fresh`): measure everything again.
    pub fresh: bool,
    /// Which GPU of the host, which group, which shapes (default: GPU 0, no group, all).
    pub placement: Placement,
}

/// Where a run sits on a host with several GPUs (`start --gpus`), and which shapes it takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The host GPU index this run owns (its lock; recorded). None: the default device.
    pub gpu: Option<u32>,
    /// The group that started it (recorded).
    pub group: Option<String>,
    /// Only these workload shapes (keys). None: every shape of the workload; on resume,
    /// a group's run keeps the shapes it was started with.
    pub only_shapes: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    New,
    /// Continue `run_id` with its remaining budget, plan position and incumbents.
    /// `rebaseline` allows a different GPU: the incumbents are re-timed there.
    Resume { rebaseline: bool },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Plan exhausted or budget spent.
    Finished(String),
    /// Stopped by a signal / `stop`.
    Stopped,
    /// The worker could not be (re)started.
    Failed(String),
    /// The GPU stayed unavailable past the wait limit; resumable.
    Interrupted(String),
}

pub struct Engine {
    cfg: Config,
    ledger: Ledger,
    run_id: String,
    run_dir: PathBuf,
    ws: Workspace,
    sup: Supervisor,
    device: DeviceInfo,
    shapes: Vec<Shape>,
    plan: Plan,
    incumbents: BTreeMap<String, Incumbent>,
    /// The searches' scores: every recorded iteration's times chained through its paired
    /// incumbent timings (paired_score.rs).
    paired: paired_score::PairedScores,
    baseline_us: BTreeMap<String, f64>,
    /// Sources of every incumbent's module, to reload after a worker restart.
    modules: HashMap<String, Module>,
    loaded_generation: u64,
    loaded: Vec<String>,
    seq: i64,
    started: Instant,
    /// Budget already used before this process took over (resume).
    used_before: Duration,
    /// Time spent waiting for the GPU: not charged to the budget.
    paused: Duration,
    budget: Duration,
    /// The end of the budget kept for the closing comparison (`reserve.rs`): the search
    /// stops this much before the budget.
    closing_reserve: Duration,
    /// The closing's cost model (`reserve.rs`), learned when the run is created.
    closing_model: Option<reserve::Model>,
    /// What the closing does: the configured closing until it starts, then what fits.
    closing: reserve::Closing,
    seed: u64,
    shutdown: Shutdown,
    /// What earlier runs measured on this kind of GPU (None: `--fresh`, or nothing there).
    memory: Option<crate::storage::memory::Memory>,
    /// Shapes whose remembered best failed this run's re-check: their memory is not used.
    stale: std::collections::BTreeSet<String>,
    /// The first candidate of the plan's next stage that would run, compiled ahead while the
    /// current stage runs (`plan_stage::next_stage_guess`); None in the open phase.
    next_stage: Option<(crate::strategy::plan::Stage, crate::spec::template::Params, Vec<Shape>)>,
    /// Held while the run is alive; released on drop or death.
    _lock: Option<GpuLock>,
}

/// Create (or resume) the run and drive it to its end.
pub async fn run(opts: RunOptions, shutdown: Shutdown) -> anyhow::Result<(String, RunEnd)> {
    let mut engine = Engine::create(opts, shutdown).await?;
    let end = match engine.drive().await {
        Ok(e) => e,
        // A ledger that cannot be written (a full disk) is no fault of the run: it can be
        // resumed once there is space.
        Err(e) if e.chain().any(|c| matches!(c.downcast_ref::<LedgerError>(), Some(LedgerError::Unwritable { .. } | LedgerError::ReadOnly { .. }))) => {
            RunEnd::Interrupted(crate::error_text::join(e.chain()))
        }
        Err(e) => RunEnd::Failed(crate::error_text::join(e.chain())),
    };
    if matches!(end, RunEnd::Finished(_)) {
        let started = Instant::now();
        if let Some(done) = engine.closing_comparison().await? {
            engine.record_closing_time(started.elapsed(), done).await?;
        }
    }
    engine.finish(&end).await?;
    Ok((engine.run_id.clone(), end))
}

impl Engine {

    fn used(&self) -> Duration {
        (self.used_before + self.started.elapsed()).saturating_sub(self.paused)
    }

    /// A candidate's worker request waits at most `configured`, and no later than the
    /// budget's end (at least [`MIN_REQUEST_TIMEOUT`], so that a request started just
    /// before it can still answer). Why: a kernel that hangs near the end held a 2-minute
    /// run for its whole 3-minute `worker.time_timeout` (3m14s used, H200, 2026-11-30).
    fn request_timeout(&self, configured: Duration) -> Duration {
        // Whole seconds: the reason prints it ("1m 57s", not down to the nanosecond).
        let left = Duration::from_secs(self.budget.saturating_sub(self.used()).as_secs_f64().ceil() as u64);
        configured.min(left.max(MIN_REQUEST_TIMEOUT))
    }

    /// Whether the search may go on: the budget less what the closing keeps.
    fn budget_left(&self) -> bool {
        self.used() + self.closing_reserve < self.budget
    }

    /// Stop requested, or the budget spent: how the run ends now. None: go on.
    fn must_end(&self) -> Option<RunEnd> {
        if self.shutdown.requested() {
            Some(RunEnd::Stopped)
        } else if !self.budget_left() {
            Some(RunEnd::Finished("budget spent".into()))
        } else {
            None
        }
    }

    /// The run's phases in order: warm start, the plan's stages, the open phase.
    async fn drive(&mut self) -> anyhow::Result<RunEnd> {
        // Iterations already recorded (a resumed run) are replayed through each stage's
        // search, which is deterministic, so the run stands exactly where it stopped.
        let recorded = self.ledger.iterations(&self.run_id).await?;
        self.seq = recorded.iter().map(|i| i.seq).max().unwrap_or(0);
        let history = StageHistory::of(&self.ledger.events(&self.run_id).await?);
        if let Some(end) = self.warm_start(&recorded).await? {
            return Ok(end);
        }
        let stages = self.plan.stages.clone();
        for (i, stage) in stages.iter().enumerate() {
            self.next_stage = self.next_stage_guess(&stages[i + 1..]);
            if let Some(end) = self.plan_stage(stage, &recorded, &history).await? {
                return Ok(end);
            }
        }
        self.next_stage = None;
        if let Some(end) = self.must_end() {
            return Ok(end);
        }
        if !self.plan.open_phase.enabled {
            return Ok(RunEnd::Finished("plan exhausted".into()));
        }
        self.open_phase().await
    }

    /// `template`'s points as the kernels they run on `shapes` ([`Template::canonical`]),
    /// for a search over those shapes to compare and propose. An expression that fails to
    /// evaluate (the parse checked its names, so rarely) is said once and the point kept
    /// as drawn: the search then measures what it would have without `[inert]`.
    fn canonical(&self, template: &Template, shapes: &[Shape]) -> Canonical {
        if template.inert.is_empty() {
            return Canonical::identity();
        }
        let (template, shapes, device) = (template.clone(), shapes.to_vec(), self.device.clone());
        let warned = std::sync::atomic::AtomicBool::new(false);
        // Not remembered per point: an exhaustive stage over wgmma-tma's whole space asks
        // once for each of its thousands of points, and a memo of them all was 20 MB of
        // daemon memory (tests/soak.rs); an answer costs a few formula evaluations per
        // shape and value of an inert knob (well under a millisecond in a release build).
        Canonical::new(move |params| match template.canonical(params, &shapes, &device) {
            Ok(p) => p,
            Err(e) => {
                if !warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(kind = "inert", template = %template.name(), "{e}; its [inert] knobs are searched as if they mattered");
                }
                params.clone()
            }
        })
    }

    fn log_iteration(&self, rec: &IterationRecord) {
        let best = self
            .incumbents
            .iter()
            .filter_map(|(k, i)| self.baseline_us.get(k).map(|b| b / i.median_us))
            .fold(None::<f64>, |m, s| Some(m.map_or(s, |m| m.max(s))));
        let line = record::human_line(rec, best, self.used(), self.budget);
        tracing::info!(
            kind = "iteration", best_speedup = best, used_s = self.used().as_secs_f64(), budget_s = self.budget.as_secs_f64(),
            seq = rec.seq, stage = %rec.stage, template = %rec.template, params = %rec.params_json, verdict = %rec.verdict,
            reason = %rec.reason, score_us = rec.score_us, error = rec.error.as_deref().unwrap_or(""),
            arch = rec.arch.as_deref().unwrap_or(""), "{line}"
        );
    }

    async fn finish(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        self.sup.shutdown().await;
        let (state, message) = match end {
            RunEnd::Finished(m) => (RunState::Finished, m.clone()),
            RunEnd::Stopped => (RunState::Stopped, "stopped by request; resume with `optimizerd resume`".to_string()),
            RunEnd::Failed(m) => (RunState::Failed, m.clone()),
            RunEnd::Interrupted(m) => (RunState::Interrupted, format!("{m}; resume with `optimizerd resume`")),
        };
        let _ = self.ws.reset_to_best();
        self.ledger.finish_run(&self.run_id, state, &message, self.used().as_secs_f64()).await?;
        // The summary's time-to-best line (the same figures `status` shows), from the ledger
        // as recorded, before `run_end`: `watch` stops at that line. It reports, it decides
        // nothing, so a failed read is a warning only.
        match self.ledger.iteration_list(&self.run_id).await {
            Ok((its, _)) => {
                let t = crate::storage::ledger::time_to_best::compute(&its);
                tracing::info!(
                    kind = "time_to_best", last_reached_s = t.last_reached_s(), budget_s_on_losers_20pct = t.budget_s_on_losers_20pct,
                    budget_s_on_failed = t.budget_s_on_failed, "time to best: {}", t.summary_line(self.used().as_secs_f64(), state == RunState::Finished, record::fmt_secs)
                );
            }
            Err(e) => tracing::warn!(kind = "time_to_best", "time to best not computed: cannot read the iterations: {e}"),
        }
        tracing::info!(kind = "run_end", run = %self.run_id, state = %state, detail = %message, "run {} {state}: {message}", self.run_id);
        Ok(())
    }

}

/// What a search learns from one candidate: its score (geometric-mean time over the
/// shapes it was searched on, chained through the incumbents timed beside it:
/// paired_score.rs; None when it failed or the gate refused one of them) and
/// whether it became the best kernel of any shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) score: Option<f64>,
    pub(crate) won: bool,
}

impl Outcome {
    pub(crate) const FAILED: Outcome = Outcome { score: None, won: false };

    /// The outcome as the ledger holds it, for replaying a resumed run: the score the live
    /// run steered by (`paired` has seen every iteration of the run).
    pub(crate) fn of_record(it: &IterationRecord, paired: &paired_score::PairedScores) -> Outcome {
        Outcome { score: paired.score(it.seq), won: it.shapes.iter().any(|s| s.won) }
    }
}

pub fn new_run_id() -> String {
    let now = chrono::Utc::now().format("%Y%m%d-%H%M%S");
    format!("{now}-{:04x}", rand::random::<u16>())
}

fn dedup<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}
