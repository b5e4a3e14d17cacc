//! What the report shows, extracted from the ledger alone: the speedup curves, the
//! throughput per shape against every SDPA backend and FlashAttention-4 (TFLOPS, or K/V
//! bandwidth for decode shapes), the gain each stage bought, the
//! verdicts per stage, the best kernel per shape and the environment. No drawing here.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ops::run_report::decimate;
use crate::ops::run_report::peak;
use crate::spec::protocol::{DeviceInfo, KernelResources, OccupancyResult, Shape};
use crate::spec::states::{ShownState, Verdict};
use crate::storage::ledger::{EventKind, IterationRecord, Ledger, LedgerError, RunRow, SdpaRow};

/// A shape of at least this many FLOPs per call is compared in TFLOPS; below it the time
/// is launch-bound and microseconds say more.
pub const LARGE_FLOPS: f64 = 1e9;

/// Points kept per curve at most (the figure is ~800 px wide: more would not show).
pub const MAX_CURVE_POINTS: usize = 400;

/// The baselines in the order the figures and tables show them: SDPA's backends, then
/// FlashAttention-4 ([`crate::storage::sdpa::FA4`], where it was measured).
pub const BASELINES: [&str; 5] = ["default", "flash", "cudnn", "efficient", crate::storage::sdpa::FA4];

/// How a baseline is named in the figures and tables: `SDPA cuDNN`, `FA4`.
pub fn backend_label(name: &str) -> String {
    match name {
        crate::storage::sdpa::FA4 => "FA4".into(),
        "cudnn" => "SDPA cuDNN".into(),
        b => format!("SDPA {b}"),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunData {
    pub run: RunRow,
    /// The state as the user should read it (the caller knows whether the daemon lives).
    pub state: ShownState,
    pub device: Option<DeviceInfo>,
    pub shapes: Vec<ShapeInfo>,
    /// Iterations recorded (including one `running` in flight).
    pub iterations: usize,
    /// What figure 1's speedups are over.
    pub reference: Reference,
    pub curves: Vec<Curve>,
    pub throughput: Vec<Throughput>,
    pub peak: Option<peak::Peak>,
    /// Stages in the order the run reached them.
    pub stages: Vec<String>,
    pub gains: Vec<ShapeGains>,
    pub verdicts: Vec<StageVerdicts>,
    pub best: Vec<BestKernel>,
    pub env: Vec<(String, String)>,
    /// Things the reader must know before trusting a figure (run in progress, no SDPA, ...).
    pub notes: Vec<String>,
    /// Budget axis end (seconds): the budget while running, what was used once ended.
    pub budget_s: f64,
    /// Each iteration's stage and the budget seconds when it was recorded (stage bands).
    #[serde(skip)]
    pub stage_times: Vec<(String, f64)>,
    /// When each shape's final best was first reached; budget on losers and failures.
    pub time_to_best: crate::storage::ledger::time_to_best::TimeToBest,
}

impl RunData {
    /// The run is still going (or waiting for its GPU): figures end at "now".
    pub fn in_progress(&self) -> bool {
        self.state.is_live()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ShapeInfo {
    pub key: String,
    pub shape: Shape,
    pub large: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    /// PyTorch SDPA's default backend, CUDA-graph time, measured in the run.
    SdpaDefault,
    /// The run's own first correct kernel (SDPA was not measured).
    BaselineKernel,
}

impl Reference {
    pub fn label(self) -> &'static str {
        match self {
            Reference::SdpaDefault => "SDPA default",
            Reference::BaselineKernel => "the baseline kernel",
        }
    }
}

/// One shape's best-so-far as a step function of budget time.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub shape: String,
    /// Reference time (us) the speedups divide.
    pub reference_us: f64,
    /// Each time the shape's best kernel changed (decimated to [`MAX_CURVE_POINTS`]).
    pub points: Vec<CurvePoint>,
    /// Budget seconds the step line runs to (the end of the run, or now).
    pub end_s: f64,
    /// Speedup at the end.
    pub last: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    pub t_s: f64,
    pub speedup: f64,
    pub us: f64,
    pub seq: i64,
    pub stage: String,
}

/// One shape's best kernel next to every baseline, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub shape: String,
    pub flops: f64,
    pub large: bool,
    /// A decode shape ([`Shape::is_decode`]): judged by the K/V bytes it reads per second.
    pub decode: bool,
    /// Bytes of K and V one call reads ([`Shape::kv_bytes`]).
    pub kv_bytes: f64,
    pub best_us: Option<f64>,
    /// The run's first correct kernel (shown when SDPA is missing).
    pub baseline_us: Option<f64>,
    /// Backend name -> graph time; None where the backend could not run (error kept).
    pub sdpa: Vec<(String, Option<f64>, Option<String>)>,
    /// The backend SDPA's default dispatched to.
    pub picked: Option<String>,
}

impl Throughput {
    pub fn tflops(&self, us: f64) -> f64 {
        self.flops / (us * 1e-6) / 1e12
    }

    /// Effective K/V bandwidth of a call of `us` microseconds, TB/s.
    pub fn kv_tbps(&self, us: f64) -> f64 {
        self.kv_bytes / (us * 1e-6) / 1e12
    }
}

/// Per shape: the multiplicative gain each stage contributed, from the ledger's
/// acceptances (the stage's winners' medians against the best before them).
#[derive(Debug, Clone, Serialize)]
pub struct ShapeGains {
    pub shape: String,
    /// (stage, gain), stages in run order; only stages that moved this shape.
    pub by_stage: Vec<(String, f64)>,
    /// Product of the gains: the first correct kernel's time over the best.
    pub total: f64,
    /// The stage whose kernel was the first correct one for this shape.
    pub start_stage: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StageVerdicts {
    pub stage: String,
    /// Verdict -> count, in [`Verdict::ALL`]'s order.
    pub counts: Vec<(Verdict, usize)>,
    pub total: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct BestKernel {
    pub shape: String,
    pub seq: i64,
    pub stage: String,
    pub template: String,
    pub knobs: String,
    pub us: f64,
    pub baseline_us: Option<f64>,
    pub sdpa_default_us: Option<f64>,
    /// Large shapes other than decode.
    pub tflops: Option<f64>,
    /// Decode shapes: effective K/V bandwidth, TB/s.
    pub kv_tbps: Option<f64>,
    pub registers: Option<i64>,
    pub spill_bytes: Option<i64>,
    /// Static + dynamic shared memory of the first kernel, bytes.
    pub smem_bytes: Option<i64>,
    pub ctas: Option<i64>,
    pub waves: Option<f64>,
    pub arch: Option<String>,
}

/// Read everything the report needs for `run_id`. `state` is the state to show.
pub async fn load(ledger: &Ledger, run_id: &str, state: Option<ShownState>) -> Result<RunData, LedgerError> {
    let run = ledger.run(Some(run_id)).await?;
    let setup = ledger.run_setup(run_id).await?;
    // An iteration this release cannot decode (a newer one wrote it) is left out and named.
    let (its, unreadable) = ledger.iteration_list(run_id).await?;
    let best_rows = ledger.best(run_id).await?;
    let sdpa = ledger.sdpa(run_id).await?;
    let events = ledger.events(run_id).await?;

    let mut shapes: Vec<ShapeInfo> =
        setup.workload.iter().map(|s| ShapeInfo { key: s.key(), shape: *s, large: s.flops() >= LARGE_FLOPS }).collect();
    // Older or odd ledgers: shapes seen in iterations but not in the workload.
    for it in &its {
        for r in &it.shapes {
            if !shapes.iter().any(|s| s.key == r.shape) {
                if let Ok(shape) = serde_json::from_str::<Shape>(&r.shape_json) {
                    shapes.push(ShapeInfo { key: r.shape.clone(), shape, large: shape.flops() >= LARGE_FLOPS });
                }
            }
        }
    }

    let state = state.unwrap_or(run.state);
    // A run still going is drawn against its whole budget (how far along it is); an ended
    // one against what it used, so a plan exhausted early does not squeeze into a corner.
    let budget_s = if state.is_live() { run.budget_s.max(run.used_s) } else { run.used_s * 1.03 };
    let end_s = run.used_s;
    let sdpa_default: BTreeMap<&str, f64> =
        sdpa.iter().filter_map(|r| r.default_graph_us.map(|us| (r.shape.as_str(), us))).collect();
    let reference = if sdpa_default.is_empty() { Reference::BaselineKernel } else { Reference::SdpaDefault };

    let mut notes = Vec::new();
    if !unreadable.is_empty() {
        let which: Vec<String> = unreadable.iter().map(|u| format!("#{} ({})", u.seq, u.why)).collect();
        notes.push(format!("{} iteration(s) could not be read and are left out of the figures: {}", unreadable.len(), which.join("; ")));
    }
    if state.is_live() {
        notes.push(format!(
            "run in progress ({state}): this report shows the ledger as of {} ({} of budget used); run `optimizerd report {}` again for more",
            crate::storage::ledger::now(),
            crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(run.used_s)),
            run.id
        ));
    } else if state.is_interrupted() {
        notes.push(format!("the run was interrupted; continue it with `optimizerd resume {}`", run.id));
    }
    if sdpa.is_empty() {
        let why = events.iter().find(|e| e.kind == EventKind::SdpaUnavailable).map(|e| e.message.clone());
        notes.push(format!(
            "PyTorch SDPA was not measured in this run{}: speedups are over the run's baseline kernel, and the throughput figure shows no SDPA bars",
            why.map(|w| format!(" ({w})")).unwrap_or_default()
        ));
    } else {
        let missing: Vec<&str> = shapes.iter().filter(|s| !sdpa_default.contains_key(s.key.as_str())).map(|s| s.key.as_str()).collect();
        if !missing.is_empty() {
            notes.push(format!("SDPA default has no time for {}: those shapes are left out of figure 1", missing.join(", ")));
        }
    }
    for e in events.iter().filter(|e| e.kind == EventKind::StageSkipped) {
        notes.push(format!("stage skipped: {}", e.message));
    }

    let curves = curves(&its, &shapes, reference, &sdpa_default, end_s);
    let stage_times: Vec<(String, f64)> = its.iter().zip(times(&its)).map(|(i, t)| (i.stage.clone(), t)).collect();
    let gains = gains(&its, &shapes);
    let (stages, verdicts) = verdicts(&its);

    let throughput: Vec<Throughput> = shapes
        .iter()
        .map(|s| {
            let b = best_rows.iter().find(|b| b.shape == s.key);
            let row = sdpa.iter().find(|r| r.shape == s.key);
            Throughput {
                shape: s.key.clone(),
                flops: s.shape.flops(),
                large: s.large,
                decode: s.shape.is_decode(),
                kv_bytes: s.shape.kv_bytes() as f64,
                best_us: b.map(|b| b.median_us),
                baseline_us: b.and_then(|b| b.baseline_us),
                sdpa: row.map(sdpa_backends).unwrap_or_default(),
                picked: row.and_then(|r| r.picked.clone()),
            }
        })
        .collect();

    let best: Vec<BestKernel> = shapes
        .iter()
        .filter_map(|s| {
            let b = best_rows.iter().find(|b| b.shape == s.key)?;
            let it = its.iter().find(|i| i.seq == b.seq);
            let row = it.and_then(|i| i.shapes.iter().find(|r| r.shape == s.key));
            let own = it.and_then(|i| shape_resources(i, s.shape.d));
            Some(BestKernel {
                shape: s.key.clone(),
                seq: b.seq,
                stage: it.map(|i| i.stage.clone()).unwrap_or_default(),
                template: it.map(|i| i.template.clone()).unwrap_or_default(),
                knobs: it.map(|i| knobs(&i.params_json)).unwrap_or_default(),
                us: b.median_us,
                baseline_us: b.baseline_us,
                sdpa_default_us: sdpa_default.get(s.key.as_str()).copied(),
                tflops: (s.large && !s.shape.is_decode()).then(|| s.shape.flops() / (b.median_us * 1e-6) / 1e12),
                kv_tbps: s.shape.is_decode().then(|| crate::storage::ledger::kv_tbps(&s.shape, b.median_us)),
                registers: own.as_ref().map_or(it.and_then(|i| i.registers), |r| Some(r.registers)),
                spill_bytes: own.as_ref().map_or(it.and_then(|i| i.local_bytes), |r| Some(r.spill_bytes)),
                smem_bytes: own.as_ref().map_or_else(|| it.and_then(smem_bytes), |r| Some(r.smem_bytes)),
                ctas: row.and_then(|r| r.ctas),
                waves: row.and_then(|r| r.waves),
                arch: it.and_then(|i| i.arch.clone()),
            })
        })
        .collect();

    if !its.is_empty() && best.is_empty() {
        let failed: Vec<String> = verdict_totals(&verdicts).into_iter().map(|(v, n)| format!("{n} {v}")).collect();
        notes.push(format!(
            "no correct kernel in this run: every candidate failed ({}); figures 1-3 are empty. `optimizerd history {} --verdict incorrect,crashed` lists them",
            failed.join(", "),
            run.id
        ));
    }

    let peak = setup.device.as_ref().and_then(|d| peak::lookup(&d.name));
    let env = environment(&run, &state, setup.device.as_ref(), &setup.config, &sdpa, peak.as_ref());
    let time_to_best = crate::storage::ledger::time_to_best::compute(&its);
    Ok(RunData {
        time_to_best,
        iterations: its.len(),
        run,
        state,
        device: setup.device,
        shapes,
        reference,
        curves,
        throughput,
        peak,
        stages,
        gains,
        verdicts,
        best,
        env,
        notes,
        budget_s,
        stage_times,
    })
}

/// Budget seconds at which each iteration was recorded; older rows without it carry the
/// last known value forward.
fn times(its: &[IterationRecord]) -> Vec<f64> {
    let mut last = 0.0;
    its.iter()
        .map(|i| {
            if let Some(t) = i.used_s {
                last = t;
            }
            last
        })
        .collect()
}

fn curves(its: &[IterationRecord], shapes: &[ShapeInfo], reference: Reference, sdpa: &BTreeMap<&str, f64>, end_s: f64) -> Vec<Curve> {
    let t = times(its);
    let mut out = Vec::new();
    for s in shapes {
        let mut steps: Vec<CurvePoint> = Vec::new();
        let mut reference_us = match reference {
            Reference::SdpaDefault => match sdpa.get(s.key.as_str()) {
                Some(&us) => Some(us),
                None => continue,
            },
            Reference::BaselineKernel => None,
        };
        for (i, it) in its.iter().enumerate() {
            let Some(us) = it.shapes.iter().find(|r| r.shape == s.key && r.won).and_then(|r| r.median_us).filter(|us| *us > 0.0) else {
                continue;
            };
            let reference_us = *reference_us.get_or_insert(us);
            steps.push(CurvePoint { t_s: t[i], speedup: reference_us / us, us, seq: it.seq, stage: it.stage.clone() });
        }
        let (Some(reference_us), Some(last)) = (reference_us, steps.last().map(|p| p.speedup)) else { continue };
        let end_s = end_s.max(steps.last().map(|p| p.t_s).unwrap_or(0.0));
        let points = decimate::steps(steps, MAX_CURVE_POINTS, |p| p.t_s);
        out.push(Curve { shape: s.key.clone(), reference_us, points, end_s, last });
    }
    out
}

fn gains(its: &[IterationRecord], shapes: &[ShapeInfo]) -> Vec<ShapeGains> {
    let mut out = Vec::new();
    for s in shapes {
        let mut current: Option<f64> = None;
        let mut start_stage = None;
        let mut by_stage: Vec<(String, f64)> = Vec::new();
        for it in its {
            let Some(us) = it.shapes.iter().find(|r| r.shape == s.key && r.won).and_then(|r| r.median_us).filter(|us| *us > 0.0) else {
                continue;
            };
            match current {
                None => start_stage = Some(it.stage.clone()),
                Some(prev) => {
                    let g = prev / us;
                    match by_stage.iter_mut().find(|(st, _)| *st == it.stage) {
                        Some((_, acc)) => *acc *= g,
                        None => by_stage.push((it.stage.clone(), g)),
                    }
                }
            }
            current = Some(us);
        }
        if current.is_none() {
            continue;
        }
        let total = by_stage.iter().map(|(_, g)| g).product();
        out.push(ShapeGains { shape: s.key.clone(), by_stage, total, start_stage });
    }
    out
}

fn verdicts(its: &[IterationRecord]) -> (Vec<String>, Vec<StageVerdicts>) {
    let mut stages: Vec<String> = Vec::new();
    let mut counts: BTreeMap<(usize, Verdict), usize> = BTreeMap::new();
    for it in its {
        let ix = match stages.iter().position(|s| *s == it.stage) {
            Some(i) => i,
            None => {
                stages.push(it.stage.clone());
                stages.len() - 1
            }
        };
        *counts.entry((ix, it.verdict)).or_default() += 1;
    }
    let out = stages
        .iter()
        .enumerate()
        .map(|(ix, stage)| {
            let mut c: Vec<(Verdict, usize)> = counts.iter().filter(|((i, _), _)| *i == ix).map(|((_, v), n)| (*v, *n)).collect();
            c.sort_by_key(|(v, _)| order(*v));
            StageVerdicts { stage: stage.clone(), total: c.iter().map(|(_, n)| n).sum(), counts: c }
        })
        .collect();
    (stages, out)
}

/// Where a verdict stands in the figure's stacks and legend: successes first, then each
/// kind of failure, then the iteration in flight ([`Verdict::ALL`]'s order).
fn order(v: Verdict) -> usize {
    Verdict::ALL.iter().position(|o| *o == v).unwrap_or(Verdict::ALL.len())
}

/// Verdict -> count over all stages, in [`Verdict::ALL`]'s order.
pub fn verdict_totals(v: &[StageVerdicts]) -> Vec<(Verdict, usize)> {
    let mut out: Vec<(Verdict, usize)> = Vec::new();
    for s in v {
        for (verdict, n) in &s.counts {
            match out.iter_mut().find(|(x, _)| x == verdict) {
                Some((_, m)) => *m += n,
                None => out.push((*verdict, *n)),
            }
        }
    }
    out.sort_by_key(|(v, _)| order(*v));
    out
}

fn sdpa_backends(row: &SdpaRow) -> Vec<(String, Option<f64>, Option<String>)> {
    BASELINES
        .iter()
        .filter_map(|b| {
            let v = row.backends.get(*b)?;
            Some((b.to_string(), v.get("graph_us").and_then(|x| x.as_f64()), v.get("error").and_then(|x| x.as_str()).map(String::from)))
        })
        .collect()
}

/// `{"BLOCK_M":32,"NUM_WARPS":4}` -> `BLOCK_M=32 NUM_WARPS=4`.
pub fn knobs(params_json: &str) -> String {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(params_json) {
        Ok(m) if m.is_empty() => "-".into(),
        Ok(m) => m.iter().map(|(k, v)| format!("{k}={}", v.as_str().map(String::from).unwrap_or_else(|| v.to_string()))).collect::<Vec<_>>().join(" "),
        Err(_) => params_json.to_string(),
    }
}

/// Static plus dynamic shared memory of the first kernel (the one `registers` describes).
/// The resources of the kernels a shape of head dim `d` launches, from the iteration's
/// resources_json. A module holds one function per head dim (`optd_<role>_d64`,
/// `optd_<role>_d128`), and the iteration-wide figures are the first function's registers
/// and every function's largest spill: a D 64 shape was shown the D 128 function's spill and
/// shared memory (224 bytes, 177 KiB for a kernel with none and 91 KiB). Largest over the
/// shape's launches (registers, local bytes, static + dynamic shared memory); None when the
/// record names no such function (older ledgers: the iteration-wide figures are shown).
struct ShapeResources {
    registers: i64,
    spill_bytes: i64,
    smem_bytes: i64,
}

fn shape_resources(it: &IterationRecord, d: u32) -> Option<ShapeResources> {
    #[derive(serde::Deserialize)]
    struct Resources {
        kernels: Vec<KernelResources>,
        #[serde(default)]
        occupancy: Vec<OccupancyResult>,
    }
    let r: Resources = serde_json::from_str(it.resources_json.as_deref()?).ok()?;
    let suffix = format!("_d{d}");
    let mine: Vec<_> = r.kernels.iter().filter(|k| k.kernel.ends_with(&suffix)).collect();
    if mine.is_empty() {
        return None;
    }
    let smem = |k: &KernelResources| {
        let dynamic = r.occupancy.iter().filter(|o| o.kernel == k.kernel).map(|o| o.dyn_smem).max().unwrap_or(0);
        i64::from(k.static_smem) + i64::from(dynamic)
    };
    Some(ShapeResources {
        registers: mine.iter().map(|k| i64::from(k.registers)).max().unwrap_or(0),
        spill_bytes: mine.iter().map(|k| i64::from(k.local_bytes)).max().unwrap_or(0),
        smem_bytes: mine.iter().map(|k| smem(k)).max().unwrap_or(0),
    })
}

fn smem_bytes(it: &IterationRecord) -> Option<i64> {
    let stat = it.static_smem?;
    let dynamic = it
        .resources_json
        .as_deref()
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
        .and_then(|v| v["occupancy"][0]["dyn_smem"].as_i64())
        .unwrap_or(0);
    Some(stat + dynamic)
}

fn environment(
    run: &RunRow,
    state: &ShownState,
    device: Option<&DeviceInfo>,
    config: &serde_json::Value,
    sdpa: &[SdpaRow],
    peak: Option<&peak::Peak>,
) -> Vec<(String, String)> {
    let mut env = vec![("run".to_string(), run.id.clone())];
    env.push((
        "state".into(),
        format!("{state}{}", run.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default()),
    ));
    env.push((
        "budget".into(),
        format!(
            "{} used of {}",
            crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(run.used_s)),
            crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(run.budget_s))
        ),
    ));
    env.push(("started".into(), run.started_at.clone()));
    if let Some(f) = &run.finished_at {
        env.push(("finished".into(), f.clone()));
    }
    match device {
        Some(d) => {
            env.push((
                "GPU".into(),
                format!("{}, {} (cc {}.{}), {} SMs, {} KiB shared memory per block, {} MiB L2", d.name, d.arch, d.cc_major, d.cc_minor, d.sm_count, d.smem_optin / 1024, d.l2_bytes >> 20),
            ));
            env.push((
                "driver".into(),
                format!("supports CUDA {}.{} (cuDriverGetVersion {})", d.driver_version / 1000, (d.driver_version % 1000) / 10, d.driver_version),
            ));
            env.push(("NVRTC".into(), format!("{}.{}", d.nvrtc_version.0, d.nvrtc_version.1)));
        }
        None => env.push(("GPU".into(), run.gpu_name.clone().unwrap_or_else(|| "- (not recorded)".into()))),
    }
    match sdpa.first().map(|r| &r.versions) {
        Some(v) => {
            env.push(("torch".into(), format!("{} (CUDA {})", v["torch"].as_str().unwrap_or("?"), v["cuda"].as_str().unwrap_or("?"))));
            env.push(("cuDNN".into(), v["cudnn"].as_i64().map(|c| c.to_string()).unwrap_or_else(|| "-".into())));
        }
        None => env.push(("torch".into(), "- (SDPA not measured)".into())),
    }
    if let Some(v) = sdpa.first().map(|r| &r.versions) {
        env.push((
            "FA4".into(),
            match (v["fa4"].as_str(), v["fa4_error"].as_str()) {
                (Some(version), _) => format!("FlashAttention-4 {version} (flash_attn.cute, [B,S,H,D] inputs, CUDA-graph replay like SDPA)"),
                (None, Some(why)) => format!("not measured: {why}"),
                (None, None) => "not measured".into(),
            },
        ));
    }
    let t = &config["timing"];
    let method = t["method"].as_str().unwrap_or("?");
    env.push((
        "timing".into(),
        format!(
            "candidates: {method} (CUDA events; samples sized to {} us, {} rounds x {} samples, min gain {}); SDPA: CUDA-graph replay in the same run",
            t["sample_target_us"].as_f64().map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
            t["rounds"].as_u64().map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
            t["samples_per_round"].as_u64().map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
            t["min_gain"].as_f64().map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
        ),
    ));
    env.push(("dtype".into(), config["workload"]["dtype"].as_str().unwrap_or("?").to_string()));
    env.push(("plan".into(), config["run"]["plan"].as_str().unwrap_or("?").to_string()));
    env.push(("config".into(), config["source"].as_str().unwrap_or("?").to_string()));
    env.push((
        "peak".into(),
        match peak {
            Some(p) => format!("{:.0} TFLOPS dense fp16/bf16 tensor ({})", p.tflops, p.source),
            None => "unknown for this GPU (no reference line)".into(),
        },
    ));
    env.push(("TFLOPS".into(), "4*B*HQ*D per visible (query, key) pair / time (S*S, about half for causal)".into()));
    env.push(("TB/s".into(), format!("decode shapes (SQ <= {}): bytes of K and V read (2*B*HKV*SK*D*2) / time", crate::spec::protocol::DECODE_MAX_SQ)));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resources_json of a wgmma-tma candidate as the worker records it (H100, the S 577
    /// kernel of the unseen run): both head dims' functions in one module.
    fn wgmma_record() -> IterationRecord {
        IterationRecord {
            registers: Some(128),
            local_bytes: Some(224),
            static_smem: Some(80),
            resources_json: Some(
                serde_json::json!({
                    "kernels": [
                        {"kernel": "optd_fwd_d64", "registers": 128, "static_smem": 80, "local_bytes": 0, "max_threads": 512},
                        {"kernel": "optd_fwd_d128", "registers": 128, "static_smem": 80, "local_bytes": 224, "max_threads": 512},
                    ],
                    "occupancy": [
                        {"kernel": "optd_fwd_d64", "block_threads": 512, "dyn_smem": 91136, "blocks_per_sm": 1},
                        {"kernel": "optd_fwd_d128", "block_threads": 512, "dyn_smem": 181248, "blocks_per_sm": 1},
                    ],
                })
                .to_string(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_shape_is_shown_the_resources_of_its_own_head_dims_function() {
        let it = wgmma_record();
        let d64 = shape_resources(&it, 64).expect("the module has optd_fwd_d64");
        assert_eq!((d64.registers, d64.spill_bytes, d64.smem_bytes), (128, 0, 80 + 91136));
        let d128 = shape_resources(&it, 128).expect("the module has optd_fwd_d128");
        assert_eq!((d128.registers, d128.spill_bytes, d128.smem_bytes), (128, 224, 80 + 181248));
    }

    #[test]
    fn a_record_without_the_shapes_function_falls_back_to_the_iteration_figures() {
        let it = wgmma_record();
        assert!(shape_resources(&it, 256).is_none());
        let older = IterationRecord { resources_json: None, ..wgmma_record() };
        assert!(shape_resources(&older, 64).is_none());
    }
}
