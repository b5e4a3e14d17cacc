//! Setting a run up: a new run (ledger row, workspace, worker, device), or a resumed
//! one (interrupted iteration marked, workspace aligned with the ledger, same GPU
//! checked, incumbents rebuilt and re-validated); and the SDPA baseline.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::spec::states::RunState;
use crate::storage::ledger::{self, Event, EventKind, Ledger, LedgerError, NewRun, RunRow};
use crate::daemon::lock::GpuLock;
use crate::strategy::plan::{Plan, PlanError};
use crate::spec::config::Config;
use crate::spec::protocol::{Shape, ShapePlan, TimeCase};
use crate::daemon::supervisor::{Supervisor, WorkerFailure};
use crate::spec::template::Template;
use crate::storage::workspace::Workspace;
use crate::pipeline::{check, record, timing};

use super::incumbents::{DispatchEntry, Incumbent, Module};
use super::{dedup, new_run_id, Engine, Mode, RunOptions};
use crate::daemon::shutdown::Shutdown;

/// Why a run could not be set up. Nothing of a new run is recorded when setting it up
/// fails, and a resumed run is left as it was until its plan and GPU are checked.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot start a run: the GPU is not usable, and nothing was recorded; `optimizerd doctor` checks the driver, the GPU and NVRTC")]
    NoGpu {
        #[source]
        source: WorkerFailure,
    },
    #[error("cannot resume run {run_id}: the GPU is not usable; the run is unchanged, resume it when the GPU is back (`optimizerd doctor` checks the driver, the GPU and NVRTC)")]
    NoGpuToResume {
        run_id: String,
        #[source]
        source: WorkerFailure,
    },
    #[error("run {run_id} already finished ({message}); nothing to resume: start a new run with `optimizerd start --budget 5m`")]
    Finished { run_id: String, message: String },
    #[error("run {run_id} failed ({message}) and cannot be resumed: a failed run never got going (no GPU, a broken plan); start a new run with `optimizerd start --budget 5m`, and `optimizerd forget {run_id}` removes this one")]
    Failed { run_id: String, message: String },
    #[error("run {run_id} was measured on {before} (sm_{before_cc}) and this GPU is {now} (sm_{now_cc}): its timings would not compare. Resume on the original GPU, or pass --rebaseline to re-time the incumbents here")]
    OtherGpu { run_id: String, before: String, before_cc: u32, now: String, now_cc: u32 },
    #[error(transparent)]
    Ledger {
        #[from]
        source: LedgerError,
    },
    #[error("the plan {} of run {run_id} cannot be loaded; the run is unchanged", .path.display())]
    Plan {
        run_id: String,
        path: PathBuf,
        #[source]
        source: PlanError,
    },
}

/// Whether run `row` can be resumed: not finished, not failed, and its plan still loads
/// (from `templates_dir`); its plan if so. Asked by `resume` before it starts a daemon,
/// and by the daemon before it changes anything.
pub async fn resumable(ledger: &Ledger, row: &RunRow, templates_dir: &Path) -> Result<Plan, SetupError> {
    let (run_id, message) = (row.id.clone(), row.message.clone().unwrap_or_default());
    match row.state.recorded {
        RunState::Finished => return Err(SetupError::Finished { run_id, message }),
        RunState::Failed => return Err(SetupError::Failed { run_id, message }),
        _ => {}
    }
    let path = match ledger.run_origin(&row.id).await {
        Ok((plan_path, _)) => PathBuf::from(plan_path),
        Err(source) => return Err(SetupError::Ledger { source }),
    };
    Plan::load(&path, templates_dir).map_err(|source| SetupError::Plan { run_id, path, source })
}

/// The shapes a run optimizes: the workload's, or those `only` names (each must be one of
/// them). A resumed run of a `--gpus` group keeps the shapes it was started with.
async fn select_shapes(cfg: &Config, resumed: Option<(&Ledger, &RunRow)>, only: Option<&[String]>) -> anyhow::Result<Vec<Shape>> {
    let all = cfg.shapes();
    let only: Option<Vec<String>> = match (only, resumed) {
        (Some(keys), _) => Some(keys.to_vec()),
        (None, Some((ledger, row))) if row.group_id.is_some() => Some(ledger.run_setup(&row.id).await?.workload.iter().map(Shape::key).collect()),
        (None, _) => None,
    };
    let Some(keys) = only else { return Ok(all) };
    let known: Vec<String> = all.iter().map(Shape::key).collect();
    if let Some(k) = keys.iter().find(|k| !known.contains(k)) {
        anyhow::bail!("shape {k} is not in the workload of {}; its shapes are: {}", cfg.source.display(), known.join(", "));
    }
    Ok(all.into_iter().filter(|s| keys.contains(&s.key())).collect())
}

impl Engine {
    pub(super) async fn create(opts: RunOptions, shutdown: Shutdown) -> anyhow::Result<Engine> {
        let cfg = opts.config;
        let runs_dir = cfg.resolve(&cfg.run.runs_dir);
        std::fs::create_dir_all(&runs_dir).with_context(|| format!("cannot create runs folder {}", runs_dir.display()))?;
        let resuming = matches!(opts.mode, Mode::Resume { .. });
        let run_id = match (&opts.run_id, resuming) {
            (Some(id), _) => id.clone(),
            (None, false) => new_run_id(),
            (None, true) => anyhow::bail!("resume needs a run id"),
        };
        let placement = opts.placement.clone();
        let lock = if opts.allow_concurrent { None } else { Some(GpuLock::acquire(&runs_dir, placement.gpu.unwrap_or(0), &run_id)?) };
        let run_dir = runs_dir.join(&run_id);
        let templates_dir = cfg.resolve(&cfg.run.templates_dir);

        let seed = opts.seed.unwrap_or_else(rand::random);
        let mut sup = Supervisor::new(opts.worker, cfg.worker.hello_timeout, Some(run_dir.join("worker.log")));
        sup.set_abort(shutdown.clone());

        let (ws, device, plan, budget, used_before, ledger, shapes) = match opts.mode {
            Mode::New => {
                // The plan and the GPU are checked before anything is recorded: a start
                // that fails here leaves no run in the ledger (`optimizerd start` also removes
                // the folder it made for the worker's log).
                let plan = Plan::load(&opts.plan_path, &templates_dir)?;
                let shapes = select_shapes(&cfg, None, placement.only_shapes.as_deref()).await?;
                std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
                let device = sup.ensure_started().await.map_err(|source| SetupError::NoGpu { source })?;
                let ledger = Ledger::open(&runs_dir.join("optimizer.db")).await?;
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
                ledger.set_run_gpu(&run_id, placement.gpu, placement.group.as_deref()).await?;
                let ws = Workspace::init(
                    &run_dir.join("workspace"),
                    &[("README.md", &readme), ("workload.json", &serde_json::to_string_pretty(&shapes)?)],
                )?;
                ledger.set_device(&run_id, &device).await?;
                (ws, device, plan, opts.budget, Duration::ZERO, ledger, shapes)
            }
            Mode::Resume { rebaseline } => {
                let ledger = Ledger::open(&runs_dir.join("optimizer.db")).await?;
                let row = ledger.run(Some(&run_id)).await?;
                let shapes = select_shapes(&cfg, Some((&ledger, &row)), placement.only_shapes.as_deref()).await?;
                // The plan and the GPU first: a resume that cannot go on leaves the run as it was.
                let plan = resumable(&ledger, &row, &templates_dir).await?;
                let device = match sup.ensure_started().await {
                    Ok(d) => d,
                    Err(source) => return Err(SetupError::NoGpuToResume { run_id, source }.into()),
                };
                if let Some(b) = ledger.device(&run_id).await? {
                    if (b.name != device.name || b.cc() != device.cc()) && !rebaseline {
                        sup.shutdown().await;
                        return Err(SetupError::OtherGpu { run_id, before: b.name.clone(), before_cc: b.cc(), now: device.name.clone(), now_cc: device.cc() }.into());
                    }
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
                    .and_then(|c: String| git2::Oid::from_str(&c).ok());
                if ws.align_best(recorded_tip)? {
                    ledger.event(&run_id, EventKind::WorkspaceAligned, "best moved back to the ledger's last recorded acceptance").await?;
                }
                ledger.set_state(&run_id, RunState::Running, None, Some(std::process::id())).await?;
                ledger.set_device(&run_id, &device).await?;
                if placement.gpu.is_some() || placement.group.is_some() {
                    ledger.set_run_gpu(&run_id, placement.gpu, placement.group.as_deref().or(row.group_id.as_deref())).await?;
                }
                let msg = format!(
                    "resumed with {} of budget left{}",
                    record::fmt_dur(Duration::from_secs_f64((row.budget_s - row.used_s).max(0.0))),
                    if interrupted > 0 { format!("; {interrupted} iteration(s) marked interrupted") } else { String::new() }
                );
                ledger.event(&run_id, EventKind::Resumed, &msg).await?;
                tracing::info!(kind = "resumed", run = %run_id, detail = %msg, "run {run_id} {msg}");
                (ws, device, plan, Duration::from_secs_f64(row.budget_s), Duration::from_secs_f64(row.used_s), ledger, shapes)
            }
        };
        let memory = load_memory(&ledger, &run_id, &device, resuming, opts.fresh).await?;
        tracing::info!(
            kind = "device", run = %run_id, gpu = %device.name, cc = device.cc(), sms = device.sm_count, smem_optin = device.smem_optin,
            l2_bytes = device.l2_bytes, driver = device.driver_version, nvrtc = ?device.nvrtc_version,
            "GPU {} (sm_{}), {} SMs, {} KiB smem/block, {} MiB L2, driver {}, NVRTC {}.{}",
            device.name, device.cc(), device.sm_count, device.smem_optin / 1024, device.l2_bytes >> 20,
            device.driver_version, device.nvrtc_version.0, device.nvrtc_version.1
        );
        let generation = sup.generation();
        let closing = super::reserve::ClosingWork::new(&cfg, false, false).configured();
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
            paired: Default::default(),
            baseline_us: BTreeMap::new(),
            modules: HashMap::new(),
            loaded_generation: generation,
            loaded: Vec::new(),
            seq: 0,
            started: Instant::now(),
            used_before,
            paused: Duration::ZERO,
            next_stage: None,
            budget,
            closing_reserve: Duration::ZERO,
            closing_model: None,
            closing,
            seed,
            shutdown,
            memory,
            stale: Default::default(),
            _lock: lock,
        };
        let baselines_s = engine.measure_sdpa().await?;
        engine.decide_closing_reserve(resuming, baselines_s).await?;
        // The SDPA measurement is a fixed, cached overhead: it is not charged to the budget.
        engine.started = Instant::now();
        if resuming {
            engine.paired = super::paired_score::PairedScores::from_iterations(&engine.ledger.iterations(&engine.run_id).await?);
            engine.restore_incumbents().await?;
        }
        Ok(engine)
    }

    /// PyTorch SDPA on the workload, once per run (cached across runs on the same stack).
    /// Returns how long the measurement took where it measured every shape afresh (none from
    /// the cache): the closing measures the same baselines again, so a first run on a GPU can
    /// size its closing from it (`reserve::Model::learn`).
    pub(super) async fn measure_sdpa(&mut self) -> anyhow::Result<Option<f64>> {
        if !self.cfg.baseline.sdpa || !self.ledger.sdpa(&self.run_id).await?.is_empty() {
            return Ok(None);
        }
        let t0 = Instant::now();
        match crate::storage::sdpa::measure(&self.cfg, &self.ledger, &self.run_id, &self.run_dir, &self.device, &self.shapes).await {
            Ok(rows) => {
                let took = t0.elapsed().as_secs_f64();
                let fresh = !rows.is_empty() && rows.iter().all(|b| !b.cached);
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
                self.ledger.event(&self.run_id, EventKind::Sdpa, &msg).await?;
                tracing::info!(kind = "sdpa", "{msg}");
                Ok(fresh.then_some(took))
            }
            Err(e) => {
                let msg = format!("SDPA baseline unavailable ({e}); speedups are reported over the baseline kernel only");
                self.ledger.event(&self.run_id, EventKind::SdpaUnavailable, &msg).await?;
                tracing::warn!(kind = "sdpa_unavailable", "{msg}");
                Ok(None)
            }
        }
    }

    /// Rebuild each shape's incumbent from the ledger's best table and the workspace's
    /// `kernels/`, then re-validate it on this GPU: correctness, and a fresh timing
    /// that replaces the recorded one.
    pub(super) async fn restore_incumbents(&mut self) -> anyhow::Result<()> {
        let best = self.ledger.best(&self.run_id).await?;
        if best.is_empty() {
            return Ok(());
        }
        let dispatch_path = self.ws.dir().join("kernels/dispatch.json");
        let dispatch: BTreeMap<String, DispatchEntry> = serde_json::from_str(
            &std::fs::read_to_string(&dispatch_path).with_context(|| format!("cannot read {}", dispatch_path.display()))?,
        )
        .with_context(|| format!("{} is not a dispatch table", dispatch_path.display()))?;
        let mut stale_abi: Vec<String> = Vec::new();
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
            // An incumbent of an older kernel ABI (a run resumed across the upgrade) is launched
            // with this release's arguments: the re-validation below says so if it fails.
            let abi = crate::spec::protocol::source_abi(&source);
            if abi != crate::spec::protocol::ABI_VERSION {
                stale_abi.push(format!("{id} (kernel ABI v{abi})"));
            }
            // The target comes from the kernel's own spec (the rendered source keeps it):
            // an sm_90a incumbent cannot be rebuilt for another GPU.
            let template = Template::parse(&b.source_path, source.clone()).with_context(|| format!("incumbent {id} ({})", b.source_path))?;
            let tensor_maps = if entry.tensor_maps.is_empty() && !template.tensor_maps.is_empty() {
                // A dispatch table written without them: resolve them again from the spec.
                template.plan(&entry.params, &shape, &self.device).with_context(|| format!("incumbent {id}: tensor maps for {}", b.shape))?.tensor_maps
            } else {
                entry.tensor_maps.clone()
            };
            let plan = ShapePlan { shape, n_splits: entry.n_splits, launches: entry.launches.clone(), tensor_maps };
            let arch = template
                .meta
                .target_arch(&self.device)
                .map_err(|why| anyhow::anyhow!("incumbent {id} for {} cannot run on this GPU: {why}", b.shape))?;
            let module = self.modules.entry(id.clone()).or_insert_with(|| Module { source, arch, kernels: vec![], plans: vec![], head_dims: vec![], loaded: None });
            for l in &plan.launches {
                if !module.kernels.contains(&l.kernel) {
                    module.kernels.push(l.kernel.clone());
                }
            }
            if !module.head_dims.contains(&plan.shape.d) {
                module.head_dims.push(plan.shape.d);
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
                let hint = if stale_abi.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; built for an older kernel ABI than this release's v{}: {}; start a new run (`optimizerd start`), which warm-starts from this run's best knobs and renders them again",
                        crate::spec::protocol::ABI_VERSION,
                        stale_abi.join(", ")
                    )
                };
                anyhow::bail!("incumbent {id} failed re-validation on this GPU: {} ({}){hint}", f.reason, f.verdict);
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
        self.ledger.event(&self.run_id, EventKind::IncumbentsRevalidated, &msg).await?;
        tracing::info!(kind = "revalidated", "{msg}");
        Ok(())
    }
}

/// The memory of earlier runs for this run: loaded (and its use recorded as a `memory` event)
/// when a run starts; on resume, loaded again as it was then (same cut-off), or not at all if
/// the run started `--fresh`.
async fn load_memory(
    ledger: &Ledger,
    run_id: &str,
    device: &crate::spec::protocol::DeviceInfo,
    resuming: bool,
    fresh: bool,
) -> anyhow::Result<Option<crate::storage::memory::Memory>> {
    const FRESH: &str = "fresh: the memory of earlier runs is ignored (--fresh)";
    let fresh = if resuming {
        ledger.events(run_id).await?.iter().any(|e| e.data == Some(Event::MemoryOff))
    } else {
        fresh
    };
    if fresh {
        if !resuming {
            ledger.record_event(run_id, &Event::MemoryOff, FRESH).await?;
        }
        return Ok(None);
    }
    let started_at = ledger.run(Some(run_id)).await?.started_at;
    let memory = crate::storage::memory::Memory::load(ledger, device, run_id, &started_at).await?;
    if !resuming {
        let msg = if memory.is_empty() {
            "no earlier run on this kind of GPU: nothing remembered".to_string()
        } else {
            format!(
                "warm start: best kernels remembered for {} shape(s) from run(s) {}; each is re-checked and re-timed first (stage `warm-start`); `--fresh` ignores them",
                memory.best().len(),
                memory.runs.join(", ")
            )
        };
        ledger.event(run_id, EventKind::Memory, &msg).await?;
        tracing::info!(kind = "memory", "{msg}");
    }
    Ok((!memory.is_empty()).then_some(memory))
}
