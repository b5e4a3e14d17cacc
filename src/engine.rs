//! The run loop: walk the strategy plan until the budget or the plan runs out, and
//! take every candidate through render -> gate -> compile -> check -> time ->
//! decide -> record. Each stage lives in its own module; this file only sequences
//! them and keeps the run's state (incumbent per shape, budget, workspace).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::Config;
use crate::decide::{self, geomean, Stats};
use crate::ledger::{self, BestRow, IterationRecord, Ledger, NewRun, ShapeRecord};
use crate::outcome::{Failure, Verdict};
use crate::plan::{Plan, Stage};
use crate::lock::GpuLock;
use crate::protocol::{DeviceInfo, Launch, Loaded, Shape, ShapePlan, TimeCase};
use crate::search::Search;
use crate::shutdown::Shutdown;
use crate::supervisor::{Supervisor, WorkerCommand};
use crate::template::Params;
use crate::workspace::Workspace;
use crate::{check, compile, gate, record, render, timing};

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

/// The current best kernel for one shape.
#[derive(Debug, Clone)]
struct Incumbent {
    seq: i64,
    id: String,
    template: String,
    params: Params,
    plan: ShapePlan,
    median_us: f64,
    source_path: String,
}

/// One row of `kernels/dispatch.json`: which kernel serves a shape and how to launch it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct DispatchEntry {
    iteration: i64,
    template: String,
    params: Params,
    source: String,
    median_us: f64,
    n_splits: u32,
    launches: Vec<Launch>,
}

/// A compiled module the current worker holds: (id, source, kernels, plans for occupancy).
#[derive(Debug, Clone)]
struct Module {
    source: String,
    kernels: Vec<String>,
    plans: Vec<ShapePlan>,
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
    engine.finish(&end).await?;
    Ok((engine.run_id.clone(), end))
}

impl Engine {
    async fn create(opts: RunOptions, shutdown: Shutdown) -> anyhow::Result<Engine> {
        let cfg = opts.config;
        let runs_dir = cfg.resolve(&cfg.run.runs_dir);
        std::fs::create_dir_all(&runs_dir).with_context(|| format!("cannot create runs folder {}", runs_dir.display()))?;
        let resuming = matches!(opts.mode, Mode::Resume { .. });
        let run_id = match (&opts.run_id, resuming) {
            (Some(id), _) => id.clone(),
            (None, false) => new_run_id(),
            (None, true) => anyhow::bail!("resume needs a run id"),
        };
        let lock = if opts.allow_concurrent { None } else { Some(GpuLock::acquire(&runs_dir, &run_id)?) };
        let run_dir = runs_dir.join(&run_id);
        std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
        let ledger = Ledger::open(&runs_dir.join("optimizer.db")).await?;
        let templates_dir = cfg.resolve(&cfg.run.templates_dir);
        let shapes = cfg.shapes();
        let seed = opts.seed.unwrap_or_else(rand::random);
        let mut sup = Supervisor::new(opts.worker, cfg.worker.hello_timeout, Some(run_dir.join("worker.log")));
        sup.set_abort(shutdown.clone());

        let (ws, device, plan_path, budget, used_before) = match opts.mode {
            Mode::New => {
                // Fail on a bad plan before anything is recorded.
                Plan::load(&opts.plan_path, &templates_dir)?;
                ledger
                    .create_run(&NewRun {
                        id: run_id.clone(),
                        started_at: ledger::now(),
                        budget_s: opts.budget.as_secs_f64(),
                        run_dir: run_dir.display().to_string(),
                        config_source: cfg.source.display().to_string(),
                        plan_path: opts.plan_path.display().to_string(),
                        config_json: serde_json::to_string(&cfg.effective())?,
                        workload_json: serde_json::to_string(&shapes)?,
                        pid: std::process::id(),
                    })
                    .await?;
                let readme = format!(
                    "# optimizerd workspace for run {run_id}\n\n`candidate.cu` is the kernel under test; `kernels/<shape>.cu` the best kernel per\n\
                     workload shape and `kernels/dispatch.json` how to launch each. `git log best` is the lineage\n\
                     of improvements; rejected candidates are kept under refs/rejected/<iteration>.\n"
                );
                let ws = Workspace::init(
                    &run_dir.join("workspace"),
                    &[("README.md", &readme), ("workload.json", &serde_json::to_string_pretty(&shapes)?)],
                )?;
                // A machine that never showed a GPU for this run fails fast, with the reason.
                let device = match sup.ensure_started().await {
                    Ok(d) => d,
                    Err(e) => {
                        let msg = e.to_string();
                        ledger.finish_run(&run_id, "failed", &msg, 0.0).await?;
                        anyhow::bail!("run {run_id}: {msg}");
                    }
                };
                ledger.set_device(&run_id, &device).await?;
                (ws, device, opts.plan_path.clone(), opts.budget, Duration::ZERO)
            }
            Mode::Resume { rebaseline } => {
                let row = ledger.run(Some(&run_id)).await?;
                if row.state == "finished" {
                    anyhow::bail!("run {run_id} already finished ({}); nothing to resume", row.message.unwrap_or_default());
                }
                let interrupted = ledger.mark_interrupted(&run_id).await?;
                let ws = Workspace::open(&run_dir.join("workspace"))?;
                ws.recover()?;
                // The ledger is the truth: `best` goes back to its last recorded acceptance.
                let recorded_tip = ledger
                    .best(&run_id)
                    .await?
                    .into_iter()
                    .max_by_key(|b| b.seq)
                    .and_then(|b| b.git_commit)
                    .and_then(|c| git2::Oid::from_str(&c).ok());
                if ws.align_best(recorded_tip)? {
                    ledger.event(&run_id, "workspace_aligned", "best moved back to the ledger's last recorded acceptance").await?;
                }
                ledger.set_state(&run_id, "running", None, Some(std::process::id())).await?;
                let (plan_path, _) = ledger.run_origin(&run_id).await?;
                let before = ledger.device(&run_id).await?;
                let mut waited = Duration::ZERO;
                let device = match wait_for_gpu(&mut sup, &ledger, &run_id, &cfg, &shutdown, &mut waited).await {
                    Ok(d) => d,
                    Err(e) => {
                        ledger.finish_run(&run_id, "interrupted", &e.to_string(), row.used_s).await?;
                        anyhow::bail!("run {run_id}: {e}");
                    }
                };
                if let Some(b) = &before {
                    if (b.name != device.name || b.cc() != device.cc()) && !rebaseline {
                        sup.shutdown().await;
                        ledger.finish_run(&run_id, "interrupted", "resume refused: different GPU", row.used_s).await?;
                        anyhow::bail!(
                            "run {run_id} was measured on {} (sm_{}) and this GPU is {} (sm_{}): its timings would not compare. \
                             Resume on the original GPU, or pass --rebaseline to re-time the incumbents here",
                            b.name,
                            b.cc(),
                            device.name,
                            device.cc()
                        );
                    }
                }
                ledger.set_device(&run_id, &device).await?;
                let msg = format!(
                    "resumed with {} of budget left{}",
                    record::fmt_dur(Duration::from_secs_f64((row.budget_s - row.used_s).max(0.0))),
                    if interrupted > 0 { format!("; {interrupted} iteration(s) marked interrupted") } else { String::new() }
                );
                ledger.event(&run_id, "resumed", &msg).await?;
                tracing::info!(kind = "resumed", run = %run_id, detail = %msg, "run {run_id} {msg}");
                (ws, device, PathBuf::from(plan_path), Duration::from_secs_f64(row.budget_s), Duration::from_secs_f64(row.used_s))
            }
        };
        let plan = Plan::load(&plan_path, &templates_dir)?;
        tracing::info!(
            kind = "device", run = %run_id, gpu = %device.name, cc = device.cc(), sms = device.sm_count, smem_optin = device.smem_optin,
            l2_bytes = device.l2_bytes, driver = device.driver_version, nvrtc = ?device.nvrtc_version,
            "GPU {} (sm_{}), {} SMs, {} KiB smem/block, {} MiB L2, driver {}, NVRTC {}.{}",
            device.name, device.cc(), device.sm_count, device.smem_optin / 1024, device.l2_bytes >> 20,
            device.driver_version, device.nvrtc_version.0, device.nvrtc_version.1
        );
        let generation = sup.generation();
        let mut engine = Engine {
            cfg,
            ledger,
            run_id,
            run_dir,
            ws,
            sup,
            device,
            shapes,
            plan,
            incumbents: BTreeMap::new(),
            baseline_us: BTreeMap::new(),
            modules: HashMap::new(),
            loaded_generation: generation,
            loaded: Vec::new(),
            seq: 0,
            started: Instant::now(),
            used_before,
            paused: Duration::ZERO,
            budget,
            seed,
            shutdown,
            _lock: lock,
        };
        engine.measure_sdpa().await?;
        // The SDPA measurement is a fixed, cached overhead: it is not charged to the budget.
        engine.started = Instant::now();
        if resuming {
            engine.restore_incumbents().await?;
        }
        Ok(engine)
    }

    /// PyTorch SDPA on the workload, once per run (cached across runs on the same stack).
    async fn measure_sdpa(&mut self) -> anyhow::Result<()> {
        if !self.cfg.baseline.sdpa || !self.ledger.sdpa(&self.run_id).await?.is_empty() {
            return Ok(());
        }
        match crate::sdpa::measure(&self.cfg, &self.ledger, &self.run_id, &self.run_dir, &self.device, &self.shapes).await {
            Ok(rows) => {
                let parts: Vec<String> = rows
                    .iter()
                    .map(|b| {
                        let d = b.default_backend().cloned().unwrap_or_default();
                        format!(
                            "{} {} us ({}{})",
                            b.shape,
                            d.graph_us.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
                            d.picked.as_deref().unwrap_or("?"),
                            if b.cached { ", cached" } else { "" }
                        )
                    })
                    .collect();
                let msg = format!("SDPA default, CUDA-graph time per call: {}", parts.join(", "));
                self.ledger.event(&self.run_id, "sdpa", &msg).await?;
                tracing::info!(kind = "sdpa", "{msg}");
            }
            Err(e) => {
                let msg = format!("SDPA baseline unavailable ({e}); speedups are reported over the baseline kernel only");
                self.ledger.event(&self.run_id, "sdpa_unavailable", &msg).await?;
                tracing::warn!(kind = "sdpa_unavailable", "{msg}");
            }
        }
        Ok(())
    }

    /// Rebuild each shape's incumbent from the ledger's best table and the workspace's
    /// `kernels/`, then re-validate it on this GPU: correctness, and a fresh timing
    /// that replaces the recorded one.
    async fn restore_incumbents(&mut self) -> anyhow::Result<()> {
        let best = self.ledger.best(&self.run_id).await?;
        if best.is_empty() {
            return Ok(());
        }
        let dispatch_path = self.ws.dir().join("kernels/dispatch.json");
        let dispatch: BTreeMap<String, DispatchEntry> = serde_json::from_str(
            &std::fs::read_to_string(&dispatch_path).with_context(|| format!("cannot read {}", dispatch_path.display()))?,
        )
        .with_context(|| format!("{} is not a dispatch table", dispatch_path.display()))?;
        for b in &best {
            let entry = dispatch
                .get(&b.shape)
                .with_context(|| format!("{} has no entry for {} (best iteration {})", dispatch_path.display(), b.shape, b.seq))?;
            let shape = self
                .shapes
                .iter()
                .find(|s| s.key() == b.shape)
                .copied()
                .with_context(|| format!("shape {} of the ledger is not in the workload", b.shape))?;
            let source_path = self.ws.dir().join(&b.source_path);
            let source = std::fs::read_to_string(&source_path).with_context(|| format!("cannot read {}", source_path.display()))?;
            let id = format!("it{}", b.seq);
            let plan = ShapePlan { shape, n_splits: entry.n_splits, launches: entry.launches.clone() };
            let module = self.modules.entry(id.clone()).or_insert_with(|| Module { source, kernels: vec![], plans: vec![] });
            for l in &plan.launches {
                if !module.kernels.contains(&l.kernel) {
                    module.kernels.push(l.kernel.clone());
                }
            }
            module.plans.push(plan.clone());
            if let Some(base) = b.baseline_us {
                self.baseline_us.insert(b.shape.clone(), base);
            }
            self.incumbents.insert(
                b.shape.clone(),
                Incumbent {
                    seq: b.seq,
                    id,
                    template: entry.template.clone(),
                    params: entry.params.clone(),
                    plan,
                    median_us: b.median_us,
                    source_path: b.source_path.clone(),
                },
            );
        }
        // Re-validate: load, check and time every incumbent module on this GPU.
        self.ensure_incumbents_loaded().await.map_err(|f| anyhow::anyhow!("re-validating the incumbents: {}", f.reason))?;
        let ids: Vec<String> = dedup(self.incumbents.values().map(|i| i.id.clone()));
        let mut notes = Vec::new();
        for id in ids {
            let plans: Vec<ShapePlan> = self.incumbents.values().filter(|i| i.id == id).map(|i| i.plan.clone()).collect();
            let seed = self.seed ^ 0x5EED;
            if let Err((f, _)) = check::run(&mut self.sup, &id, &plans, self.cfg.tolerance(), seed, self.cfg.worker.check_timeout).await {
                anyhow::bail!("incumbent {id} failed re-validation on this GPU: {} ({})", f.reason, f.verdict);
            }
            let cases: Vec<TimeCase> = plans.iter().map(|p| TimeCase { shape: p.shape, entries: vec![timing::entry(&id, p)] }).collect();
            let timed = timing::run(&mut self.sup, cases, self.cfg.timing_spec(), seed, self.cfg.worker.time_timeout)
                .await
                .map_err(|f| anyhow::anyhow!("re-timing incumbent {id}: {}", f.reason))?;
            for case in &timed.cases {
                let key = case.shape.key();
                if let (Some(st), Some(inc)) = (timing::stats_of(case, &id), self.incumbents.get_mut(&key)) {
                    notes.push(format!("{key} {:.2} us (recorded {:.2})", st.median_us, inc.median_us));
                    inc.median_us = st.median_us;
                }
            }
        }
        let msg = format!("incumbents re-validated (correct) and re-timed: {}", notes.join(", "));
        self.ledger.event(&self.run_id, "incumbents_revalidated", &msg).await?;
        tracing::info!(kind = "revalidated", "{msg}");
        Ok(())
    }

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
        let stages = self.plan.stages.clone();
        for stage in &stages {
            if self.shutdown.requested() {
                return Ok(RunEnd::Stopped);
            }
            if !self.budget_left() {
                return Ok(RunEnd::Finished("budget spent".into()));
            }
            if self.device.cc() < stage.template.meta.min_cc {
                let msg = format!(
                    "stage {} skipped: template {} needs compute capability {} and the device has {}",
                    stage.spec.name,
                    stage.spec.template,
                    stage.template.meta.min_cc,
                    self.device.cc()
                );
                tracing::warn!(kind = "stage_skipped", stage = %stage.spec.name, "{msg}");
                self.ledger.event(&self.run_id, "stage_skipped", &msg).await?;
                continue;
            }
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
                if let Some(score) = earlier.iter().filter(|i| i.params_json == start_json).filter_map(|i| i.score_us).last() {
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
                search.report(&p, it.score_us);
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
                let score = self.iterate(stage, &params).await?;
                if self.shutdown.now_requested() {
                    return Ok(RunEnd::Stopped);
                }
                search.report(&params, score);
                if !self.sup.is_running() {
                    let mut paused = self.paused;
                    let r = wait_for_gpu(&mut self.sup, &self.ledger, &self.run_id, &self.cfg, &self.shutdown, &mut paused).await;
                    self.paused = paused;
                    match r {
                        Ok(_) => {
                            let _ = self.ledger.event(&self.run_id, "worker_restart", &format!("worker generation {}", self.sup.generation())).await;
                        }
                        Err(WaitEnd::Stopped) => return Ok(RunEnd::Stopped),
                        Err(WaitEnd::GaveUp(m)) => return Ok(RunEnd::Interrupted(m)),
                    }
                }
            }
        }
        Ok(RunEnd::Finished("plan exhausted".into()))
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

    /// One candidate's whole life. Returns its search score (None if it failed).
    async fn iterate(&mut self, stage: &Stage, params: &Params) -> anyhow::Result<Option<f64>> {
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
        crate::failpoint::set_iteration(seq);
        self.ledger.begin_iteration(&rec, self.used().as_secs_f64()).await?;
        crate::failpoint::hit("iteration-begun");
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);

        // render
        let rendered = match render::render(&stage.template, params, self.cfg.workload.dtype, &templates_dir) {
            Ok(r) => r,
            Err(e) => return self.conclude(rec, None, Err(Failure::new(Verdict::Error, e.to_string())), vec![]).await,
        };
        rec.source_hash = Some(rendered.hash.clone());
        let meta = serde_json::json!({
            "iteration": seq, "stage": stage.spec.name, "template": stage.template.name(),
            "file": stage.template.file, "params": params, "dtype": self.cfg.workload.dtype, "source_sha256": rendered.hash,
        });
        let commit = self.ws.commit_candidate(
            &[("candidate.cu", &rendered.source), ("candidate.json", &serde_json::to_string_pretty(&meta)?)],
            &format!("iteration {seq}: {} {}", stage.template.name(), rec.params_json),
        )?;
        rec.git_commit = Some(commit.to_string());
        crate::failpoint::hit("candidate-committed");

        // gate
        let plans = match gate::check(&stage.template, params, &self.shapes, &self.device, &stage.spec.min_ctas) {
            Ok(p) => p,
            Err(g) => return self.conclude(rec, Some(commit), Err(Failure::new(Verdict::Gated, g.0)), vec![]).await,
        };
        let mut shapes = record::planned_shapes(&plans);

        // compile
        let id = format!("it{seq}");
        let head_dims: Vec<u32> = dedup(self.shapes.iter().map(|s| s.d));
        let kernels = stage.template.kernel_names(&head_dims);
        let loaded = match self.load(&id, &rendered.source, kernels.clone(), &plans).await {
            Ok(l) => l,
            Err(f) => return self.conclude(rec, Some(commit), Err(f), shapes).await,
        };
        record::resources(&mut rec, &loaded);
        record::waves(&mut shapes, &plans, &loaded, self.device.sm_count);
        self.modules.insert(id.clone(), Module { source: rendered.source.clone(), kernels, plans: plans.clone() });

        // check
        let seed = self.seed ^ (seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        match check::run(&mut self.sup, &id, &plans, self.cfg.tolerance(), seed, self.cfg.worker.check_timeout).await {
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
        let cases: Vec<TimeCase> = plans
            .iter()
            .map(|p| {
                let mut entries = vec![timing::entry(&id, p)];
                if let Some(inc) = self.incumbents.get(&p.shape.key()) {
                    entries.push(timing::entry(&inc.id, &inc.plan));
                }
                TimeCase { shape: p.shape, entries }
            })
            .collect();
        let timed = match timing::run(&mut self.sup, cases, self.cfg.timing_spec(), seed, self.cfg.worker.time_timeout).await {
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
        let score = rec.score_us;
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
        Ok(score)
    }

    /// Compile+load a module, then reload nothing else: incumbents are reloaded lazily.
    async fn load(&mut self, id: &str, source: &str, kernels: Vec<String>, plans: &[ShapePlan]) -> Result<Loaded, Failure> {
        self.sync_generation();
        let l = compile::load(&mut self.sup, id, source, kernels, plans, self.cfg.worker.load_timeout).await?;
        self.loaded.push(id.to_string());
        Ok(l)
    }

    fn sync_generation(&mut self) {
        if self.sup.generation() != self.loaded_generation {
            self.loaded.clear();
            self.loaded_generation = self.sup.generation();
        }
    }

    /// After a worker restart, the incumbents' modules are gone: load them again.
    async fn ensure_incumbents_loaded(&mut self) -> Result<(), Failure> {
        self.sync_generation();
        let ids: Vec<String> = dedup(self.incumbents.values().map(|i| i.id.clone()));
        for id in ids {
            if self.loaded.contains(&id) {
                continue;
            }
            let Some(m) = self.modules.get(&id).cloned() else { continue };
            compile::load(&mut self.sup, &id, &m.source, m.kernels, &m.plans, self.cfg.worker.load_timeout)
                .await
                .map_err(|f| Failure::new(Verdict::Error, format!("reloading incumbent {id}: {}", f.reason)))?;
            self.loaded.push(id);
        }
        Ok(())
    }

    /// The candidate becomes the incumbent for the shapes it won; `best` advances.
    async fn promote(
        &mut self,
        seq: i64,
        id: &str,
        stage: &Stage,
        params: &Params,
        source: &str,
        commit: git2::Oid,
        won: &[(ShapePlan, f64)],
    ) -> anyhow::Result<Vec<BestRow>> {
        let mut best_rows = Vec::new();
        for (plan, median) in won {
            let key = plan.shape.key();
            let source_path = format!("kernels/{key}.cu");
            if !self.baseline_us.contains_key(&key) {
                self.baseline_us.insert(key.clone(), *median);
            }
            self.incumbents.insert(
                key.clone(),
                Incumbent {
                    seq,
                    id: id.to_string(),
                    template: stage.template.name().to_string(),
                    params: params.clone(),
                    plan: plan.clone(),
                    median_us: *median,
                    source_path: source_path.clone(),
                },
            );
            best_rows.push(BestRow {
                shape: key.clone(),
                seq,
                median_us: *median,
                baseline_us: self.baseline_us.get(&key).copied(),
                source_path,
                git_commit: None,
            });
        }
        let dispatch = self.dispatch_json();
        let mut files: Vec<(String, String)> = won.iter().map(|(p, _)| (format!("kernels/{}.cu", p.shape.key()), source.to_string())).collect();
        files.push(("kernels/dispatch.json".into(), dispatch));
        let refs: Vec<(&str, &str)> = files.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let keys: Vec<String> = won.iter().map(|(p, _)| p.shape.key()).collect();
        crate::failpoint::hit("before-accept");
        let accept = self.ws.accept(commit, &refs, &format!("best: iteration {seq} ({}) for {}", stage.template.name(), keys.join(", ")))?;
        for b in &mut best_rows {
            b.git_commit = Some(accept.to_string());
        }
        // Modules no incumbent uses any more can be dropped from the reload set.
        let live: Vec<String> = self.incumbents.values().map(|i| i.id.clone()).collect();
        self.modules.retain(|k, _| live.contains(k));
        Ok(best_rows)
    }

    fn dispatch_json(&self) -> String {
        let table: BTreeMap<&String, DispatchEntry> = self
            .incumbents
            .iter()
            .map(|(k, i)| {
                (
                    k,
                    DispatchEntry {
                        iteration: i.seq,
                        template: i.template.clone(),
                        params: i.params.clone(),
                        source: i.source_path.clone(),
                        median_us: i.median_us,
                        n_splits: i.plan.n_splits,
                        launches: i.plan.launches.clone(),
                    },
                )
            })
            .collect();
        serde_json::to_string_pretty(&table).unwrap_or_default()
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
    ) -> anyhow::Result<Option<f64>> {
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
        Ok(None)
    }

    async fn unload_if_unused(&mut self, id: &str) {
        if self.incumbents.values().any(|i| i.id == id) || !self.loaded.iter().any(|l| l == id) || !self.sup.is_running() {
            return;
        }
        self.loaded.retain(|l| l != id);
        let _ = self.sup.request(&crate::protocol::Request::Unload { id: id.to_string() }, Duration::from_secs(30)).await;
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
            reason = %rec.reason, score_us = rec.score_us, error = rec.error.as_deref().unwrap_or(""), "{line}"
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

/// Why waiting for the GPU ended without a worker.
#[derive(Debug)]
enum WaitEnd {
    Stopped,
    GaveUp(String),
}

impl std::fmt::Display for WaitEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitEnd::Stopped => f.write_str("stopped while waiting for the GPU"),
            WaitEnd::GaveUp(m) => f.write_str(m),
        }
    }
}

/// Start the worker; while it cannot start, the run is `waiting_for_gpu`: retry with
/// backoff, log each attempt, and add the time spent to `paused` (not charged to the
/// budget). Gives up after `worker.gpu_wait_limit`.
async fn wait_for_gpu(
    sup: &mut Supervisor,
    ledger: &Ledger,
    run_id: &str,
    cfg: &Config,
    shutdown: &Shutdown,
    paused: &mut Duration,
) -> Result<DeviceInfo, WaitEnd> {
    let mut last = match sup.ensure_started().await {
        Ok(d) => return Ok(d),
        Err(e) => e,
    };
    let began = Instant::now();
    let mut delay = Duration::from_millis(250).min(cfg.worker.gpu_retry_max);
    let _ = ledger.set_state(run_id, "waiting_for_gpu", Some(&last.to_string()), None).await;
    let mut attempt = 1u32;
    let result = loop {
        tracing::warn!(
            kind = "waiting_for_gpu", attempt, detail = %last,
            "waiting for the GPU (attempt {attempt} failed, next in {}; the budget is paused): {last}",
            humantime::format_duration(delay)
        );
        if began.elapsed() >= cfg.worker.gpu_wait_limit {
            break Err(WaitEnd::GaveUp(format!(
                "GPU unavailable for {} ({attempt} attempts): {last}",
                humantime::format_duration(Duration::from_secs(began.elapsed().as_secs()))
            )));
        }
        let mut sd = shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {},
            _ = sd.now() => break Err(WaitEnd::Stopped),
        }
        if shutdown.requested() {
            break Err(WaitEnd::Stopped);
        }
        attempt += 1;
        match sup.ensure_started().await {
            Ok(d) => {
                tracing::info!(kind = "gpu_back", attempt, "the GPU answered again at attempt {attempt}; the run continues");
                let _ = ledger.set_state(run_id, "running", None, None).await;
                break Ok(d);
            }
            Err(e) => last = e,
        }
        delay = (delay * 2).min(cfg.worker.gpu_retry_max);
    };
    *paused += began.elapsed();
    let _ = ledger
        .event(run_id, "waited_for_gpu", &format!("{attempt} attempts over {:.1}s (not charged to the budget)", began.elapsed().as_secs_f64()))
        .await;
    result
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
