//! A scripted worker backend: the test double at the GPU boundary.
//!
//! It speaks the real protocol from a real child process, so the daemon's
//! supervisor, ledger, git and search are exercised unchanged on a CPU machine.
//! A JSON script says, per candidate (matched by substrings of its rendered
//! source), whether it compiles, is correct, how fast it is, or whether it crashes
//! or hangs the worker at a given step, or how an anti-cheat probe catches it. With
//! `nvrtc = true` every source is first compiled by the real NVRTC.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::spec::protocol::{
    BuildAsk, Checked, DeviceInfo, KernelResources, Loaded, OccupancyResult, Request, Response, ShapeCheck, Timed, TimedCase, TimedEntry,
};
use crate::worker::Backend;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub device: DeviceInfo,
    /// The GPUs this script stands for (`worker --list-devices`; default: `device` alone).
    /// A worker started with `CUDA_VISIBLE_DEVICES=N` (as a group's daemon on GPU N starts
    /// it) says it is `gpus[N]`, so tests can give one host several GPUs, or a mix of models.
    #[serde(default)]
    pub gpus: Vec<DeviceInfo>,
    /// First matching rule wins; a candidate matching none uses `default`.
    #[serde(default)]
    pub rules: Vec<Rule>,
    pub default: Behaviour,
    /// Worker starts (1-based, counted across processes in `state_file`) that fail
    /// at Hello as if the GPU were gone.
    #[serde(default)]
    pub fail_starts: Vec<u32>,
    #[serde(default)]
    pub state_file: Option<std::path::PathBuf>,
    /// Milliseconds each load/check/time request takes, to make runs last.
    #[serde(default)]
    pub step_delay_ms: u64,
    /// Compile every loaded source with the real NVRTC for its target first: a source
    /// NVRTC rejects answers `compile_error` with NVRTC's own log, whatever the rules say.
    #[serde(default)]
    pub nvrtc: bool,
    /// Milliseconds a load waits for its build unless the look-ahead asked for it before
    /// the previous load (then it had a candidate's time to compile), reported as the
    /// load's `waited_ms`.
    #[serde(default)]
    pub compile_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Every string must occur in the rendered source (e.g. "#define MAX_SPLITS 8").
    pub source_contains: Vec<String>,
    pub behaviour: Behaviour,
    /// Static shared memory the loaded functions report (bytes; default 0), as a real
    /// build's mbarriers and `__shared__` arrays would.
    #[serde(default)]
    pub static_smem: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Behaviour {
    /// Correct; each launch plan takes `us` microseconds (per shape key in `per_shape`, if listed).
    /// Under sustained timing each takes `sustained` times that (per shape key in
    /// `sustained_per_shape`, if listed), so tests can make ranks differ there.
    Ok {
        us: f64,
        #[serde(default)]
        per_shape: HashMap<String, f64>,
        #[serde(default = "one")]
        sustained: f64,
        #[serde(default)]
        sustained_per_shape: HashMap<String, f64>,
    },
    CompileError { log: String },
    /// Check reports a large error.
    Wrong,
    /// Check reports fewer CTAs than planned (an early exit).
    CtaShort,
    /// The worker process aborts at `step` ("load", "check" or "time").
    Crash { step: String },
    /// The worker stops answering at `step`.
    Hang { step: String },
    /// A sticky CUDA error reply at `step`, after which the worker exits.
    Sticky { step: String },
    /// A cheating kernel: correct under the plain check and `us` fast, but caught by the
    /// anti-cheat probe `probe` when a check runs probes: `guard` (writes past O),
    /// `inputs` (writes Q/K/V), `rerun` (stale O on the second-stream rerun: skips work
    /// when O looks written), `recheck` (caches results: wrong after timing on fresh
    /// inputs at other addresses; only the after-timing check sees it).
    Cheat {
        probe: String,
        #[serde(default = "fast_us")]
        us: f64,
        /// What the probe reports (default: a canned report worded like the CUDA worker's).
        #[serde(default)]
        detail: Option<String>,
    },
}

fn fast_us() -> f64 {
    1.0
}

fn one() -> f64 {
    1.0
}

/// What a probe reports when it catches a scripted cheat (worded like the CUDA worker's).
fn probe_report(probe: &str) -> String {
    match probe {
        "guard" => "guard: 32 elements of the 8192-element guard regions around O were written".into(),
        "inputs" => "inputs: K changed during the launch (2 elements differ)".into(),
        "rerun" => "rerun: on a second stream with new inputs in the same buffers and O not re-poisoned, max_abs 2.31 rel_l2 0.98 (stale or skipped output)".into(),
        "recheck" => "after_timing: max_abs 1.87 > atol 0.02 on fresh inputs at other addresses (an earlier result reused?)".into(),
        other => format!("{other}: scripted probe failure"),
    }
}

pub struct ScriptedBackend {
    script: Script,
    modules: HashMap<String, Behaviour>,
    /// The look-ahead's builds waiting for their `Load`: the last `Precompile`'s list, as
    /// the GPU worker's compile pool keeps it, so the log can say whether a load had its build.
    /// Each with the number of loads served when it was first asked for: a build asked for
    /// only just before its own load is still compiling (it waits `compile_ms`), one asked for
    /// before an earlier load had a candidate's time to finish.
    pending: Vec<(String, usize)>,
    /// Loads served so far.
    loads: usize,
}

impl ScriptedBackend {
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let mut script: Script = serde_json::from_str(&text)?;
        // A daemon on GPU N starts its worker with `CUDA_VISIBLE_DEVICES=N`: be that GPU.
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok().and_then(|v| v.trim().parse::<usize>().ok());
        if let Some(d) = visible.and_then(|n| script.gpus.get(n)) {
            script.device = d.clone();
        }
        Ok(ScriptedBackend { script, modules: HashMap::new(), pending: Vec::new(), loads: 0 })
    }

    /// The GPUs the script stands for (`worker --list-devices`).
    pub fn devices(&self) -> Vec<DeviceInfo> {
        if self.script.gpus.is_empty() {
            vec![self.script.device.clone()]
        } else {
            self.script.gpus.clone()
        }
    }

    fn static_smem_for(&self, source: &str) -> u32 {
        self.script.rules.iter().find(|r| r.source_contains.iter().all(|s| source.contains(s.as_str()))).map_or(0, |r| r.static_smem)
    }

    fn behaviour_for(&self, source: &str) -> Behaviour {
        self.script
            .rules
            .iter()
            .find(|r| r.source_contains.iter().all(|s| source.contains(s.as_str())))
            .map(|r| r.behaviour.clone())
            .unwrap_or_else(|| self.script.default.clone())
    }

    /// Crash, hang or fail here if the behaviour says so for `step`.
    fn trip(&self, b: &Behaviour, step: &str) -> Option<Response> {
        match b {
            Behaviour::Crash { step: s } if s == step => {
                eprintln!("scripted worker: aborting at {step}");
                std::process::abort();
            }
            Behaviour::Hang { step: s } if s == step => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            Behaviour::Sticky { step: s } if s == step => Some(Response::CudaError {
                during: step.into(),
                message: "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered (scripted)".into(),
                sticky: true,
            }),
            _ => None,
        }
    }
}

impl Backend for ScriptedBackend {
    fn handle(&mut self, request: Request) -> Response {
        if matches!(request, Request::Load { .. } | Request::Check { .. } | Request::Time { .. }) && self.script.step_delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.script.step_delay_ms));
        }
        match request {
            Request::Hello => {
                if let Some(path) = &self.script.state_file {
                    let n = std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse::<u32>().ok()).unwrap_or(0) + 1;
                    let _ = std::fs::write(path, n.to_string());
                    if self.script.fail_starts.contains(&n) {
                        return Response::CudaError {
                            during: "init".into(),
                            message: format!("CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected (scripted start {n})"),
                            sticky: true,
                        };
                    }
                }
                Response::Hello(self.script.device.clone())
            }
            Request::Precompile { builds, windows, .. } => {
                // Logged (the worker's stderr is the run's worker.log) so tests can see the
                // look-ahead: as the GPU worker's compile pool, the list replaces the one
                // before (here every build no longer asked for is dropped: the pool keeps
                // those it had started, which a script cannot tell), soonest needed first.
                let keys: Vec<(String, &BuildAsk)> = builds.iter().map(|b| (format!("{} {:?} {windows} {}", b.arch, b.head_dims, short_hash(&b.source)), b)).collect();
                for (old, _) in &self.pending {
                    if !keys.iter().any(|(k, _)| k == old) {
                        eprintln!("scripted worker: dropped {}", old.rsplit(' ').next().unwrap_or(""));
                    }
                }
                let mut asked: Vec<(String, usize)> = Vec::with_capacity(keys.len());
                for (key, b) in keys.into_iter().take(crate::spec::protocol::PRECOMPILE_SLOTS) {
                    if asked.iter().any(|(k, _)| *k == key) {
                        continue;
                    }
                    let kept = self.pending.iter().find(|(k, _)| *k == key).map(|(_, at)| *at);
                    let started = if kept.is_some() { "kept" } else { "started" };
                    eprintln!("scripted worker: precompile {} {started} {} head dims {:?}{}", key.rsplit(' ').next().unwrap_or(""), b.arch, b.head_dims, no_window_code(windows));
                    asked.push((key, kept.unwrap_or(self.loads)));
                }
                self.pending = asked;
                Response::Precompiling
            }
            Request::Load { id, source, kernels, occupancy, arch, head_dims, windows, .. } => {
                let key = format!("{arch} {head_dims:?} {windows} {}", short_hash(&source));
                let asked_at = self.pending.iter().position(|(k, _)| *k == key).map(|i| self.pending.remove(i).1);
                let ahead = asked_at.is_some();
                let ready = asked_at.is_some_and(|at| at < self.loads);
                self.loads += 1;
                let waited_ms = if ready { 0 } else { self.script.compile_ms };
                std::thread::sleep(std::time::Duration::from_millis(waited_ms));
                eprintln!("scripted worker: load {id} {} ahead={ahead} head dims {head_dims:?}{}", short_hash(&source), no_window_code(windows));
                // The real worker builds only `head_dims`' kernels: one of another head dim
                // would not be found in its cubin.
                if let Some(k) = kernels.iter().find(|k| !head_dims.is_empty() && !head_dims.iter().any(|d| k.ends_with(&format!("_d{d}")))) {
                    return Response::CompileError { log: format!("kernel `{k}` not found: the builds hold head dims {head_dims:?} only") };
                }
                if self.script.nvrtc {
                    let tc = match crate::nvrtc::locate() {
                        Ok(tc) => tc,
                        Err(e) => return Response::BadRequest { message: format!("the script asks for NVRTC, which is missing: {e}; run scripts/setup.sh") },
                    };
                    let defines = crate::spec::protocol::BuildScope { head_dims: head_dims.clone(), windows }.defines();
                    if let Err(e) = crate::nvrtc::compile(&tc, &source, "candidate.cu", &arch, &defines) {
                        let log = if e.log().is_empty() { e.to_string() } else { e.log().to_string() };
                        return Response::CompileError { log };
                    }
                }
                let b = self.behaviour_for(&source);
                let static_smem = self.static_smem_for(&source);
                if let Some(r) = self.trip(&b, "load") {
                    return r;
                }
                if let Behaviour::CompileError { log } = &b {
                    return Response::CompileError { log: log.clone() };
                }
                self.modules.insert(id, b);
                Response::Loaded(Loaded {
                    compile_ms: 1.0,
                    waited_ms: waited_ms as f64,
                    kernels: kernels
                        .into_iter()
                        .map(|k| KernelResources { kernel: k, registers: 64, static_smem, local_bytes: 0, max_threads: 1024 })
                        .collect(),
                    occupancy: occupancy
                        .into_iter()
                        .map(|q| OccupancyResult { kernel: q.kernel, block_threads: q.block_threads, dyn_smem: q.dyn_smem, blocks_per_sm: 4 })
                        .collect(),
                    log: String::new(),
                })
            }
            Request::Check { id, plans, tolerance, probes, .. } => {
                let Some(b) = self.modules.get(&id).cloned() else {
                    return Response::BadRequest { message: format!("unknown module {id}") };
                };
                if let Some(r) = self.trip(&b, "check") {
                    return r;
                }
                let mut shapes = Vec::new();
                for p in plans {
                    let planned: Vec<u64> = p.launches.iter().map(|l| l.ctas()).collect();
                    let mut probe_failures = Vec::new();
                    let (ran, max_abs, reason) = match &b {
                        Behaviour::Wrong => (planned.clone(), 0.5, format!("max_abs 0.5 > atol {}", tolerance.atol)),
                        Behaviour::CtaShort => (vec![1; planned.len()], 0.001, format!("launch 0: 1 CTAs ran, {} planned", planned[0])),
                        Behaviour::Cheat { probe, detail, .. } if (probe == "recheck" && probes.after_timing) || (probe != "recheck" && probes.on) => {
                            let report = detail.clone().unwrap_or_else(|| probe_report(probe));
                            probe_failures.push(report.clone());
                            (planned.clone(), 0.001, report)
                        }
                        _ => (planned.clone(), 0.001, String::new()),
                    };
                    let passed = reason.is_empty();
                    shapes.push(ShapeCheck {
                        shape: p.shape,
                        passed,
                        max_abs,
                        rel_l2: max_abs / 10.0,
                        unwritten: 0,
                        rows_compared: p.shape.q_rows(),
                        ctas_ran: ran,
                        ctas_planned: planned,
                        reason,
                        probe_failures,
                    });
                    if !passed {
                        break;
                    }
                }
                Response::Checked(Checked { shapes })
            }
            Request::Time { cases, spec, .. } => {
                // When each timing began (Unix seconds), for tests of what the engine waits for.
                let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
                eprintln!("scripted worker: time {} case(s) sustained_ms {} at {at:.3}", cases.len(), spec.sustained_ms);
                let mut out = Vec::new();
                for case in cases {
                    let mut entries = Vec::new();
                    for e in case.entries {
                        let Some(b) = self.modules.get(&e.id).cloned() else {
                            return Response::BadRequest { message: format!("unknown module {}", e.id) };
                        };
                        if let Some(r) = self.trip(&b, "time") {
                            return r;
                        }
                        let key = case.shape.key();
                        let (us, factor) = match &b {
                            Behaviour::Ok { us, per_shape, sustained, sustained_per_shape } => (
                                per_shape.get(&key).copied().unwrap_or(*us),
                                sustained_per_shape.get(&key).copied().unwrap_or(*sustained),
                            ),
                            Behaviour::Cheat { us, .. } => (*us, 1.0),
                            _ => (1000.0, 1.0),
                        };
                        // Deterministic +-0.4% jitter: well inside the decision's noise floor.
                        let jitter = |us: f64, n: usize| -> Vec<f64> { (0..n).map(|i| us * (1.0 + 0.002 * ((i % 5) as f64 - 2.0))).collect() };
                        let samples_us = jitter(us, (spec.rounds * spec.samples_per_round) as usize);
                        // Sustained: one figure per round's window, as the CUDA worker gives it.
                        let sustained_us = if spec.sustained_ms > 0.0 {
                            jitter(us * factor, crate::spec::protocol::sustained_rounds(&spec) as usize)
                        } else {
                            Vec::new()
                        };
                        entries.push(TimedEntry { id: e.id, samples_us, sustained_us });
                    }
                    out.push(TimedCase { shape: case.shape, input_sets: 1, entries });
                }
                Response::Timed(Timed { cases: out })
            }
            Request::Unload { id } => {
                self.modules.remove(&id);
                Response::Unloaded
            }
            Request::Shutdown => Response::Bye,
        }
    }
}

/// How a build's log line says it leaves out the window's code (a run without windowed shapes).
fn no_window_code(windows: bool) -> &'static str {
    if windows {
        ""
    } else {
        ", no window code"
    }
}

/// The first 12 hex digits of the source's sha256 (how the scripted worker names sources in its log).
pub fn short_hash(source: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(source.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect()
}
