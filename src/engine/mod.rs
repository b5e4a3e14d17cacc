//! The run loop: walk the strategy plan until the budget or the plan runs out, and
//! take every candidate through render -> gate -> compile -> check -> time ->
//! decide -> record. Each stage lives in its own module; this file only sequences
//! them and keeps the run's state (incumbent per shape, budget, workspace).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::spec::config::Config;
use crate::pipeline::decide::{self, geomean, Stats};
use crate::storage::ledger::{self, BestRow, IterationRecord, Ledger, ShapeRecord};
use crate::pipeline::outcome::{Failure, Verdict};
use crate::strategy::plan::{Plan, Stage};
use crate::daemon::lock::GpuLock;
use crate::spec::protocol::{DeviceInfo, Shape, ShapePlan};
use crate::strategy::search::Search;
use crate::daemon::shutdown::Shutdown;
use crate::daemon::supervisor::{Supervisor, WorkerCommand};
use crate::spec::template::Params;
use crate::storage::workspace::Workspace;
use crate::pipeline::{check, compile, gate, record, render, timing};

mod agent_stage;
mod closing;
mod gpu_wait;
mod incumbents;
mod open_phase;
mod setup;
mod warm_start;

use gpu_wait::{wait_for_gpu, WaitEnd};
use incumbents::{Incumbent, Module};

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
    seed: u64,
    shutdown: Shutdown,
    /// What earlier runs measured on this kind of GPU (None: `--fresh`, or nothing there).
    memory: Option<crate::storage::memory::Memory>,
    /// Shapes whose remembered best failed this run's re-check: their memory is not used.
    stale: std::collections::BTreeSet<String>,
    /// Held while the run is alive; released on drop or death.
    _lock: Option<GpuLock>,
}

/// Create (or resume) the run and drive it to its end.
pub async fn run(opts: RunOptions, shutdown: Shutdown) -> anyhow::Result<(String, RunEnd)> {
    let mut engine = Engine::create(opts, shutdown).await?;
    let end = match engine.drive().await {
        Ok(e) => e,
        Err(e) => RunEnd::Failed(format!("{e:#}")),
    };
    if matches!(end, RunEnd::Finished(_)) {
        engine.closing_comparison().await?;
    }
    engine.finish(&end).await?;
    Ok((engine.run_id.clone(), end))
}

impl Engine {

    fn used(&self) -> Duration {
        (self.used_before + self.started.elapsed()).saturating_sub(self.paused)
    }

    fn budget_left(&self) -> bool {
        self.used() < self.budget
    }

    async fn drive(&mut self) -> anyhow::Result<RunEnd> {
        // Iterations already recorded (a resumed run) are replayed through each stage's
        // search, which is deterministic, so the run stands exactly where it stopped.
        let recorded = self.ledger.iterations(&self.run_id).await?;
        self.seq = recorded.iter().map(|i| i.seq).max().unwrap_or(0);
        let stage_starts: BTreeMap<String, Params> = self
            .ledger
            .events(&self.run_id)
            .await?
            .into_iter()
            .filter(|(_, kind, _)| kind == "stage_start")
            .filter_map(|(_, _, m)| {
                let (name, json) = m.split_once(" start ")?;
                Some((name.to_string(), serde_json::from_str(json).ok()?))
            })
            .collect();
        // Stages the diagnosis found unnecessary before a restart stay skipped.
        let not_needed: Vec<String> = self
            .ledger
            .events(&self.run_id)
            .await?
            .into_iter()
            .filter(|(_, kind, _)| kind == "stage_not_needed")
            .filter_map(|(_, _, m)| m.split_once(':').map(|(name, _)| name.to_string()))
            .collect();
        if let Some(end) = self.warm_start(&recorded).await? {
            return Ok(end);
        }
        let stages = self.plan.stages.clone();
        for stage in &stages {
            if self.shutdown.requested() {
                return Ok(RunEnd::Stopped);
            }
            if !self.budget_left() {
                return Ok(RunEnd::Finished("budget spent".into()));
            }
            // Too old a GPU, or an arch-specific template (sm_90a) on another cc.
            if let Err(why) = stage.template.meta.target_arch(&self.device) {
                let msg = format!("stage {} skipped ({}): {why}", stage.spec.name, stage.spec.template);
                tracing::warn!(kind = "stage_skipped", stage = %stage.spec.name, "{msg}");
                self.ledger.event(&self.run_id, "stage_skipped", &msg).await?;
                continue;
            }
            if !stage.spec.when.is_empty() {
                if not_needed.contains(&stage.spec.name) {
                    continue;
                }
                if !stage_starts.contains_key(&stage.spec.name) && !self.needed(stage).await? {
                    continue;
                }
            }
            if stage.spec.search == crate::strategy::search::SearchKind::Agent {
                match self.agent_stage(stage).await? {
                    Some(end) => return Ok(end),
                    None => continue,
                }
            }
            // agent-tuning: the same stage over the latest accepted agent edit of its template.
            let edited;
            let stage = if stage.spec.search == crate::strategy::search::SearchKind::AgentTuning {
                match self.agent_tuning_stage(stage).await? {
                    Some(s) => {
                        edited = s;
                        &edited
                    }
                    None => continue,
                }
            } else {
                stage
            };
            let mut search = Search::new(stage.spec.search, stage.space.clone(), stage.start.clone(), stage.spec.max_candidates);
            // Where this stage starts: recorded when it first began (so a resumed run
            // replays from the same point), else chosen now.
            let recorded_start = stage_starts.get(&stage.spec.name).cloned();
            let start = match recorded_start.clone() {
                Some(p) => p,
                None if stage.spec.start_from_best => self.best_params_for(stage).unwrap_or_else(|| stage.start.clone()),
                None => stage.start.clone(),
            };
            search.set_start(start.clone());
            if stage.spec.start_from_best {
                // Points earlier stages measured with this template are not proposed again,
                // and the start point's score is known: go straight to its neighbours.
                let start_json = serde_json::to_string(&start)?;
                let earlier: Vec<IterationRecord> = self
                    .ledger
                    .iterations(&self.run_id)
                    .await?
                    .into_iter()
                    .filter(|i| i.stage != stage.spec.name && i.template == stage.template.name())
                    .collect();
                for it in &earlier {
                    if let Ok(p) = serde_json::from_str::<Params>(&it.params_json) {
                        if it.params_json != start_json {
                            search.mark_seen(&p);
                        }
                    }
                }
                if let Some(score) = earlier.iter().filter(|i| i.params_json == start_json).filter_map(|i| Outcome::of_record(i).score).next_back() {
                    search.prime(&start, score);
                }
            }
            let done: Vec<&IterationRecord> = recorded
                .iter()
                .filter(|i| i.stage == stage.spec.name && i.verdict != "interrupted" && i.verdict != "running")
                .collect();
            for it in &done {
                let Some(p) = search.next() else { break };
                let recorded_params: Params = serde_json::from_str(&it.params_json).unwrap_or_default();
                if p != recorded_params {
                    anyhow::bail!(
                        "the plan changed since iteration {} (stage {} now proposes {}, the ledger has {}); resume with the plan the run started with",
                        it.seq,
                        stage.spec.name,
                        serde_json::to_string(&p).unwrap_or_default(),
                        it.params_json
                    );
                }
                search.report(&p, Outcome::of_record(it).score);
            }
            self.ledger.set_progress(&self.run_id, Some(&stage.spec.name), self.used().as_secs_f64()).await?;
            if recorded_start.is_none() {
                let msg = format!("{} start {}", stage.spec.name, serde_json::to_string(&start)?);
                self.ledger.event(&self.run_id, "stage_start", &msg).await?;
            }
            if done.is_empty() {
                tracing::info!(kind = "stage", stage = %stage.spec.name, "stage {}: {} ({} search over {})", stage.spec.name, stage.spec.description,
                    format!("{:?}", stage.spec.search).to_lowercase(), stage.spec.template);
            } else {
                tracing::info!(kind = "stage", stage = %stage.spec.name, "stage {}: continuing after {} recorded candidate(s)", stage.spec.name, done.len());
            }
            while let Some(params) = search.next() {
                if self.shutdown.requested() {
                    return Ok(RunEnd::Stopped);
                }
                if !self.budget_left() {
                    return Ok(RunEnd::Finished("budget spent".into()));
                }
                let shapes = self.shapes.clone();
                // The look-ahead: the point the search proposes next if this one does not
                // win (most do not) is compiled while this one is checked and timed.
                let mut ahead = search.clone();
                ahead.report(&params, None);
                if let Some(next) = ahead.next() {
                    self.lookahead(stage, &next, &shapes).await;
                }
                let outcome = self.iterate(stage, &params, &shapes).await?;
                if self.shutdown.now_requested() {
                    return Ok(RunEnd::Stopped);
                }
                search.report(&params, outcome.score);
                if let Some(end) = self.recover_worker().await {
                    return Ok(end);
                }
            }
        }
        if !self.plan.open_phase.enabled {
            return Ok(RunEnd::Finished("plan exhausted".into()));
        }
        self.open_phase().await
    }

    /// Have the worker compile this candidate in the background, if it would be compiled at
    /// all (not remembered, not refused by the gate on every shape). Best effort: a lost or
    /// wrong guess changes nothing but CPU time; the ledger's order does not depend on it.
    async fn lookahead(&mut self, stage: &Stage, params: &Params, shapes: &[Shape]) {
        if !self.cfg.worker.lookahead || !self.sup.is_running() {
            return;
        }
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);
        let Ok(rendered) = render::render(&stage.template, params, self.cfg.workload.dtype, &templates_dir) else { return };
        if self.remembered(&rendered.hash, shapes).is_some() || gate::check_each(&stage.template, params, shapes, &self.device, &stage.spec.min_ctas).is_err() {
            return;
        }
        let Ok(arch) = stage.template.meta.target_arch(&self.device) else { return };
        if let Err(e) = compile::precompile(&mut self.sup, &rendered.source, &arch, self.cfg.worker.load_timeout).await {
            tracing::debug!(error = %e, "look-ahead compile not started");
        }
        crate::daemon::failpoint::hit("lookahead-sent");
    }

    /// After a candidate that killed the worker (crash, hang, lost device): wait for
    /// the GPU and restart it. Some(end) when the run cannot go on.
    async fn recover_worker(&mut self) -> Option<RunEnd> {
        if self.sup.is_running() {
            return None;
        }
        let mut paused = self.paused;
        let r = wait_for_gpu(&mut self.sup, &self.ledger, &self.run_id, &self.cfg, &self.shutdown, &mut paused).await;
        self.paused = paused;
        match r {
            Ok(_) => {
                let _ = self.ledger.event(&self.run_id, "worker_restart", &format!("worker generation {}", self.sup.generation())).await;
                None
            }
            Err(WaitEnd::Stopped) => Some(RunEnd::Stopped),
            Err(WaitEnd::GaveUp(m)) => Some(RunEnd::Interrupted(m)),
        }
    }

    /// Does the diagnosis of the incumbents show a symptom this stage treats? The
    /// decision and the figures behind it go in the ledger either way.
    async fn needed(&mut self, stage: &Stage) -> anyhow::Result<bool> {
        if self.incumbents.is_empty() {
            return Ok(true);
        }
        let (figures, findings) = self.diagnose().await?;
        let relevant: Vec<String> = findings
            .iter()
            .filter(|f| stage.spec.when.contains(&f.symptom))
            .map(|f| format!("{} {}", f.shape, f.detail))
            .collect();
        // Without an SDPA measurement there is no anchor to judge a compute gap by:
        // a stage that treats it runs rather than being skipped on no evidence.
        let unjudged = stage.spec.when.contains(&crate::strategy::diagnose::Symptom::ComputeGap)
            && figures.iter().all(|f| f.demonstrated_tflops.is_none());
        let mut relevant = relevant;
        if unjudged {
            relevant.push("compute_gap cannot be judged (no SDPA measurement): running".into());
        }
        let run = !relevant.is_empty();
        let record = serde_json::json!({
            "stage": stage.spec.name, "when": stage.spec.when, "run": run, "findings": findings, "figures": figures,
        });
        self.ledger.event(&self.run_id, "diagnosis", &record.to_string()).await?;
        let when: Vec<String> = stage.spec.when.iter().map(|w| serde_json::to_value(w).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()).collect();
        if run {
            tracing::info!(kind = "diagnosis", stage = %stage.spec.name, "diagnosis for {}: {}", stage.spec.name, relevant.join("; "));
        } else {
            let msg = format!("{}: not needed: no shape shows {}", stage.spec.name, when.join(" or "));
            self.ledger.event(&self.run_id, "stage_not_needed", &msg).await?;
            tracing::info!(kind = "stage_skipped", stage = %stage.spec.name, "stage {msg}");
        }
        Ok(run)
    }

    /// The params of this stage's template that serve the most shapes now, restricted
    /// to the stage's space (knobs outside it keep the stage's start value).
    fn best_params_for(&self, stage: &Stage) -> Option<Params> {
        let mut counts: Vec<(Params, usize)> = Vec::new();
        for inc in self.incumbents.values().filter(|i| i.template == stage.template.name()) {
            match counts.iter_mut().find(|(p, _)| *p == inc.params) {
                Some((_, n)) => *n += 1,
                None => counts.push((inc.params.clone(), 1)),
            }
        }
        let (best, _) = counts.into_iter().max_by_key(|(_, n)| *n)?;
        let mut start = stage.start.clone();
        for (knob, values) in &stage.space {
            if let Some(v) = best.get(knob).filter(|v| values.contains(v)) {
                start.insert(knob.clone(), *v);
            }
        }
        Some(start)
    }

    /// One candidate's whole life on `shapes_in`. Returns its outcome for the search.
    async fn iterate(&mut self, stage: &Stage, params: &Params, shapes_in: &[Shape]) -> anyhow::Result<Outcome> {
        self.seq += 1;
        let seq = self.seq;
        let mut rec = IterationRecord {
            run_id: self.run_id.clone(),
            seq,
            stage: stage.spec.name.clone(),
            template: stage.template.name().to_string(),
            params_json: serde_json::to_string(params)?,
            started_at: ledger::now(),
            ..Default::default()
        };
        crate::daemon::failpoint::set_iteration(seq);
        self.ledger.begin_iteration(&rec, self.used().as_secs_f64()).await?;
        crate::daemon::failpoint::hit("iteration-begun");
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);

        // render
        let rendered = match render::render(&stage.template, params, self.cfg.workload.dtype, &templates_dir) {
            Ok(r) => r,
            Err(e) => return self.conclude(rec, None, Err(Failure::new(Verdict::Error, e.to_string())), vec![]).await,
        };
        rec.source_hash = Some(rendered.hash.clone());
        // Measured before on this kind of GPU (and the memory held this run's re-check).
        if stage.spec.name != warm_start::MEMORY_STAGE {
            if let Some(hits) = self.remembered(&rendered.hash, shapes_in) {
                return self.conclude_remembered(rec, hits).await;
            }
        }
        let meta = serde_json::json!({
            "iteration": seq, "stage": stage.spec.name, "template": stage.template.name(),
            "file": stage.template.file, "params": params, "dtype": self.cfg.workload.dtype, "source_sha256": rendered.hash,
        });
        let commit = self.ws.commit_candidate(
            &[("candidate.cu", &rendered.source), ("candidate.json", &serde_json::to_string_pretty(&meta)?)],
            &format!("iteration {seq}: {} {}", stage.template.name(), rec.params_json),
        )?;
        rec.git_commit = Some(commit.to_string());
        crate::daemon::failpoint::hit("candidate-committed");

        // gate (per shape: the candidate goes on with the shapes it fits)
        let gated = match gate::check_each(&stage.template, params, shapes_in, &self.device, &stage.spec.min_ctas) {
            Ok(g) => g,
            Err(g) => return self.conclude(rec, Some(commit), Err(Failure::new(Verdict::Gated, g.0)), vec![]).await,
        };
        let plans = gated.plans;
        let mut shapes = record::planned_shapes(&plans);
        record::refused(&mut shapes, shapes_in, &gated.refused);

        // compile (the gate has already refused a target this device cannot run)
        let arch = match stage.template.meta.target_arch(&self.device) {
            Ok(a) => a,
            Err(why) => return self.conclude(rec, Some(commit), Err(Failure::new(Verdict::Gated, why)), shapes).await,
        };
        rec.arch = Some(arch.clone());
        let id = format!("it{seq}");
        let head_dims: Vec<u32> = dedup(plans.iter().map(|p| p.shape.d));
        let kernels = stage.template.kernel_names(&head_dims);
        let loaded = match self.load(&id, &rendered.source, &arch, kernels.clone(), &plans).await {
            Ok(l) => l,
            Err(f) => return self.conclude(rec, Some(commit), Err(f), shapes).await,
        };
        record::resources(&mut rec, &loaded);
        record::waves(&mut shapes, &plans, &loaded, self.device.sm_count);
        self.modules.insert(id.clone(), Module { source: rendered.source.clone(), arch, kernels, plans: plans.clone(), loaded: Some(loaded.clone()) });

        // check
        let seed = self.seed ^ (seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let check_started = Instant::now();
        let checked = check::run(&mut self.sup, &id, &plans, self.cfg.tolerance(), seed, self.cfg.worker.check_timeout).await;
        rec.check_ms = Some(check_started.elapsed().as_secs_f64() * 1e3);
        match checked {
            Ok(checked) => record::checked(&mut shapes, &checked),
            Err((f, checked)) => {
                if let Some(c) = checked {
                    record::checked(&mut shapes, &c);
                }
                return self.conclude(rec, Some(commit), Err(f), shapes).await;
            }
        }

        // time (candidate and each shape's incumbent, interleaved)
        if let Err(f) = self.ensure_incumbents_loaded().await {
            return self.conclude(rec, Some(commit), Err(f), shapes).await;
        }
        let cases = self.against_incumbents(&id, &plans);
        let time_started = Instant::now();
        let timed = timing::run(&mut self.sup, cases, self.cfg.timing_spec(), seed, self.cfg.worker.time_timeout).await;
        rec.time_ms = Some(time_started.elapsed().as_secs_f64() * 1e3);
        let timed = match timed {
            Ok(t) => t,
            Err(f) => return self.conclude(rec, Some(commit), Err(f), shapes).await,
        };

        // decide
        let mut won: Vec<(ShapePlan, f64)> = Vec::new();
        let mut medians = Vec::new();
        let first_ever = self.incumbents.is_empty();
        for (case, plan) in timed.cases.iter().zip(&plans) {
            let key = case.shape.key();
            let Some(cand) = timing::stats_of(case, &id) else {
                return self.conclude(rec, Some(commit), Err(Failure::new(Verdict::Error, format!("{key}: no valid timing samples"))), shapes).await;
            };
            medians.push(cand.median_us);
            let inc_stats: Option<Stats> = self.incumbents.get(&key).and_then(|inc| timing::stats_of(case, &inc.id));
            let decision = inc_stats.map(|inc| decide::decide_shape(&cand, &inc, self.cfg.timing.min_gain));
            let wins = match decision {
                Some(d) => d.wins,
                None => first_ever || !self.incumbents.contains_key(&key),
            };
            let baseline = self.baseline_us.get(&key).copied();
            record::timed(&mut shapes, &key, &cand, inc_stats.as_ref(), decision.as_ref(), baseline, wins, case.input_sets);
            if wins {
                won.push((plan.clone(), cand.median_us));
            }
        }
        rec.score_us = geomean(medians.iter().copied());
        let outcome = Outcome { score: if gated.refused.is_empty() { rec.score_us } else { None }, won: !won.is_empty() };
        let verdict = if first_ever {
            Verdict::Baseline
        } else if won.is_empty() {
            Verdict::Rejected
        } else {
            Verdict::Accepted
        };
        let reason = record::decision_reason(verdict, &shapes);
        let best_rows = if won.is_empty() {
            vec![]
        } else {
            self.promote(seq, &id, stage, params, &rendered.source, commit, &won).await?
        };
        self.conclude_success(rec, commit, verdict, reason, shapes, best_rows).await?;
        Ok(outcome)
    }

    async fn conclude_success(
        &mut self,
        mut rec: IterationRecord,
        commit: git2::Oid,
        verdict: Verdict,
        reason: String,
        shapes: Vec<ShapeRecord>,
        best: Vec<BestRow>,
    ) -> anyhow::Result<()> {
        if best.is_empty() {
            self.ws.revert(commit, rec.seq)?;
        }
        rec.verdict = verdict.as_str().into();
        rec.reason = reason;
        rec.shapes = shapes;
        rec.finished_at = ledger::now();
        self.ledger.record_iteration(&rec, &best, self.used().as_secs_f64()).await?;
        self.log_iteration(&rec);
        self.unload_if_unused(&format!("it{}", rec.seq)).await;
        Ok(())
    }

    /// Record a candidate that stopped at some stage; revert the workspace.
    async fn conclude(
        &mut self,
        mut rec: IterationRecord,
        commit: Option<git2::Oid>,
        outcome: Result<(), Failure>,
        shapes: Vec<ShapeRecord>,
    ) -> anyhow::Result<Outcome> {
        let f = outcome.err().unwrap_or_else(|| Failure::new(Verdict::Error, "no outcome"));
        if let Some(c) = commit {
            self.ws.revert(c, rec.seq)?;
        }
        rec.verdict = f.verdict.as_str().into();
        rec.reason = f.reason;
        rec.error = f.error;
        rec.shapes = shapes;
        rec.finished_at = ledger::now();
        self.ledger.record_iteration(&rec, &[], self.used().as_secs_f64()).await?;
        self.log_iteration(&rec);
        self.unload_if_unused(&format!("it{}", rec.seq)).await;
        Ok(Outcome::FAILED)
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
            RunEnd::Finished(m) => ("finished", m.clone()),
            RunEnd::Stopped => ("stopped", "stopped by request; resume with `optimizerd resume`".to_string()),
            RunEnd::Failed(m) => ("failed", m.clone()),
            RunEnd::Interrupted(m) => ("interrupted", format!("{m}; resume with `optimizerd resume`")),
        };
        let _ = self.ws.reset_to_best();
        self.ledger.finish_run(&self.run_id, state, &message, self.used().as_secs_f64()).await?;
        tracing::info!(kind = "run_end", run = %self.run_id, state, detail = %message, "run {} {state}: {message}", self.run_id);
        Ok(())
    }

}

/// What a search learns from one candidate: its score (geometric-mean time over the
/// shapes it was searched on; None when it failed or the gate refused one of them) and
/// whether it became the best kernel of any shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) score: Option<f64>,
    pub(crate) won: bool,
}

impl Outcome {
    const FAILED: Outcome = Outcome { score: None, won: false };

    /// The outcome as the ledger holds it, for replaying a resumed run.
    pub(crate) fn of_record(it: &IterationRecord) -> Outcome {
        let partial = it.shapes.iter().any(|s| s.gated.is_some());
        Outcome { score: if partial { None } else { it.score_us }, won: it.shapes.iter().any(|s| s.won) }
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
