//! The run loop: walk the strategy plan until the budget or the plan runs out, and
//! take every candidate through render -> gate -> compile -> check -> time ->
//! decide -> record. Each stage lives in its own module; this file only sequences
//! them and keeps the run's state (incumbent per shape, budget, workspace).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::watch;

use crate::config::Config;
use crate::decide::{self, geomean, Stats};
use crate::ledger::{self, BestRow, IterationRecord, Ledger, NewRun, ShapeRecord};
use crate::outcome::{Failure, Verdict};
use crate::plan::{Plan, Stage};
use crate::protocol::{DeviceInfo, Loaded, Shape, ShapePlan, TimeCase};
use crate::search::Search;
use crate::supervisor::{Supervisor, WorkerCommand, WorkerFailure};
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
    budget: Duration,
    seed: u64,
}

/// Create the run (ledger row, run folder, workspace, worker) and drive it to its end.
pub async fn run(opts: RunOptions, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<(String, RunEnd)> {
    let mut engine = Engine::create(opts).await?;
    let end = engine.drive(&mut shutdown).await;
    let end = match end {
        Ok(e) => e,
        Err(e) => RunEnd::Failed(format!("{e:#}")),
    };
    engine.finish(&end).await?;
    Ok((engine.run_id.clone(), end))
}

impl Engine {
    async fn create(opts: RunOptions) -> anyhow::Result<Engine> {
        let cfg = opts.config;
        let runs_dir = cfg.resolve(&cfg.run.runs_dir);
        let run_id = opts.run_id.unwrap_or_else(new_run_id);
        let run_dir = runs_dir.join(&run_id);
        std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
        let ledger = Ledger::open(&runs_dir.join("optimizer.db")).await?;
        let templates_dir = cfg.resolve(&cfg.run.templates_dir);
        let plan = Plan::load(&opts.plan_path, &templates_dir)?;
        let shapes = cfg.shapes();
        let seed = opts.seed.unwrap_or_else(rand::random);

        ledger
            .create_run(&NewRun {
                id: run_id.clone(),
                started_at: ledger::now(),
                budget_s: opts.budget.as_secs_f64(),
                run_dir: run_dir.display().to_string(),
                config_source: cfg.source.display().to_string(),
                plan_path: opts.plan_path.display().to_string(),
                config_json: format!("{cfg:?}"),
                workload_json: serde_json::to_string(&shapes)?,
                pid: std::process::id(),
            })
            .await?;

        let readme = format!(
            "# optimizerd workspace for run {run_id}\n\n`candidate.cu` is the kernel under test; `kernels/<shape>.cu` the best kernel per\n\
             workload shape and `kernels/dispatch.json` how to launch each. `git log best` is the lineage\n\
             of improvements; rejected candidates are kept under refs/rejected/<iteration>.\n"
        );
        let ws = Workspace::init(&run_dir.join("workspace"), &[("README.md", &readme), ("workload.json", &serde_json::to_string_pretty(&shapes)?)])?;

        let mut sup = Supervisor::new(opts.worker, cfg.worker.hello_timeout, Some(run_dir.join("worker.log")));
        let device = match start_worker(&mut sup, cfg.worker.max_restarts).await {
            Ok(d) => d,
            Err(e) => {
                let msg = format!("{e}");
                ledger.finish_run(&run_id, "failed", &msg, 0.0).await?;
                anyhow::bail!("run {run_id}: {msg}");
            }
        };
        ledger.set_device(&run_id, &device).await?;
        tracing::info!(
            run = %run_id, gpu = %device.name, cc = device.cc(), sms = device.sm_count, smem_optin = device.smem_optin,
            l2_bytes = device.l2_bytes, driver = device.driver_version, nvrtc = ?device.nvrtc_version,
            "GPU {} (sm_{}), {} SMs, {} KiB smem/block, {} MiB L2, driver {}, NVRTC {}.{}",
            device.name, device.cc(), device.sm_count, device.smem_optin / 1024, device.l2_bytes >> 20,
            device.driver_version, device.nvrtc_version.0, device.nvrtc_version.1
        );
        let generation = sup.generation();
        Ok(Engine {
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
            budget: opts.budget,
            seed,
        })
    }

    fn used(&self) -> Duration {
        self.started.elapsed()
    }

    fn budget_left(&self) -> bool {
        self.used() < self.budget
    }

    async fn drive(&mut self, shutdown: &mut watch::Receiver<bool>) -> anyhow::Result<RunEnd> {
        let stages = self.plan.stages.clone();
        for stage in &stages {
            if *shutdown.borrow() {
                return Ok(RunEnd::Stopped);
            }
            if !self.budget_left() {
                return Ok(RunEnd::Finished("budget spent".into()));
            }
            if self.device.cc() < stage.template.meta.min_cc {
                let msg = format!(
                    "stage {} skipped: template {} needs compute capability {} and the device has {}",
                    stage.spec.name, stage.spec.template, stage.template.meta.min_cc, self.device.cc()
                );
                tracing::warn!(stage = %stage.spec.name, "{msg}");
                self.ledger.event(&self.run_id, "stage_skipped", &msg).await?;
                continue;
            }
            self.ledger.set_progress(&self.run_id, Some(&stage.spec.name), self.used().as_secs_f64()).await?;
            self.ledger.event(&self.run_id, "stage_start", &stage.spec.name).await?;
            tracing::info!(stage = %stage.spec.name, "stage {}: {} ({} search over {})", stage.spec.name, stage.spec.description,
                format!("{:?}", stage.spec.search).to_lowercase(), stage.spec.template);
            let mut search = Search::new(stage.spec.search, stage.space.clone(), stage.start.clone(), stage.spec.max_candidates);
            while let Some(params) = search.next() {
                if *shutdown.borrow() {
                    return Ok(RunEnd::Stopped);
                }
                if !self.budget_left() {
                    return Ok(RunEnd::Finished("budget spent".into()));
                }
                let score = self.iterate(stage, &params).await?;
                search.report(&params, score);
                if let Some(reason) = self.worker_gone().await {
                    return Ok(RunEnd::Failed(reason));
                }
            }
        }
        Ok(RunEnd::Finished("plan exhausted".into()))
    }

    /// After a crash the next request restarts the worker; if it cannot start, the run cannot go on.
    async fn worker_gone(&mut self) -> Option<String> {
        if self.sup.is_running() {
            return None;
        }
        match start_worker(&mut self.sup, self.cfg.worker.max_restarts).await {
            Ok(_) => {
                let _ = self.ledger.event(&self.run_id, "worker_restart", &format!("worker generation {}", self.sup.generation())).await;
                None
            }
            Err(e) => Some(e.to_string()),
        }
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
        let table: BTreeMap<&String, serde_json::Value> = self
            .incumbents
            .iter()
            .map(|(k, i)| {
                (k, serde_json::json!({
                    "iteration": i.seq, "template": i.template, "params": i.params, "source": i.source_path,
                    "median_us": i.median_us, "n_splits": i.plan.n_splits, "launches": i.plan.launches,
                }))
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
            seq = rec.seq, stage = %rec.stage, template = %rec.template, params = %rec.params_json, verdict = %rec.verdict,
            reason = %rec.reason, score_us = rec.score_us, error = rec.error.as_deref().unwrap_or(""), "{line}"
        );
    }

    async fn finish(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        self.sup.shutdown().await;
        let (state, message) = match end {
            RunEnd::Finished(m) => ("finished", m.clone()),
            RunEnd::Stopped => ("stopped", "stopped by request".to_string()),
            RunEnd::Failed(m) => ("failed", m.clone()),
        };
        let _ = self.ws.reset_to_best();
        self.ledger.finish_run(&self.run_id, state, &message, self.used().as_secs_f64()).await?;
        tracing::info!(run = %self.run_id, state, "run {} {state}: {message}", self.run_id);
        Ok(())
    }

    pub fn run_dir(&self) -> &PathBuf {
        &self.run_dir
    }
}

/// Start the worker, retrying up to `max_restarts` times.
async fn start_worker(sup: &mut Supervisor, max_restarts: u32) -> Result<DeviceInfo, WorkerFailure> {
    let mut last = None;
    for attempt in 0..=max_restarts {
        match sup.ensure_started().await {
            Ok(d) => return Ok(d),
            Err(e) => {
                tracing::warn!(attempt, "worker start failed: {e}");
                let fatal = matches!(&e, WorkerFailure::Start(m) if m.starts_with("init:"));
                last = Some(e);
                if fatal {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200 * (attempt as u64 + 1))).await;
            }
        }
    }
    Err(last.unwrap_or_else(|| WorkerFailure::Start("no attempt made".into())))
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
