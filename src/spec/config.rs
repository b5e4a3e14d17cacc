//! `agent.toml`: the run's configuration, parsed strictly.
//!
//! Unknown keys and bad values are errors that name the file, the line, the key and
//! what is allowed, because a typo silently falling back to a default wastes a GPU run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::spec::protocol::{DType, Layout, Shape, TimingSpec, Tolerance};

/// The default configuration, embedded so `optimizerd start` works without a file.
pub const DEFAULT_CONFIG: &str = include_str!("../../agent.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}; check --config (default: agent.toml in the current folder, else the embedded defaults)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
    #[error("{path}: `{key}` {message}")]
    Invalid { path: PathBuf, key: String, message: String },
    #[error("{path}:{line}: `{key}` {message}")]
    InvalidAt { path: PathBuf, line: usize, key: String, message: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the config came from (a path, or `<embedded agent.toml>`); relative paths resolve against its folder.
    #[serde(skip)]
    pub source: PathBuf,
    #[serde(skip)]
    pub base_dir: PathBuf,
    #[serde(default)]
    pub run: RunSection,
    #[serde(default)]
    pub workload: Workload,
    #[serde(default)]
    pub check: CheckSection,
    #[serde(default)]
    pub timing: TimingSection,
    #[serde(default)]
    pub worker: WorkerSection,
    #[serde(default)]
    pub baseline: BaselineSection,
    /// The agent (a language model proposing kernel edits); off unless `base_url` is set.
    #[serde(default)]
    pub agent: crate::spec::agent::AgentSection,
    /// Several machines sharing one group (`start --gpus ... --ledger postgres://...`).
    #[serde(default)]
    pub fleet: FleetSection,
}

/// `[fleet]`: a PostgreSQL database that several machines' groups share (the queue of
/// shape classes, memory across runs). Without it a group's queue is in the local ledger.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetSection {
    /// `postgres://USER:PASSWORD@HOST:PORT/DB` (`--ledger` overrides it).
    pub ledger: Option<String>,
    /// How long a machine's hold on a work item lasts without renewal: a machine that dies
    /// releases its items this long after its last renewal (renewed every 5 s).
    #[serde(deserialize_with = "duration")]
    pub lease: Duration,
    /// This machine's name in the fleet (default: the host name).
    pub machine: Option<String>,
}

impl Default for FleetSection {
    fn default() -> Self {
        Self { ledger: None, lease: Duration::from_secs(60), machine: None }
    }
}

/// The PyTorch SDPA baseline measured in every run.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BaselineSection {
    /// Measure SDPA at the start of a run (skipped, with a note, when torch is missing).
    pub sdpa: bool,
    /// The command; `{script}` is scripts/sdpa_baseline.py (or its embedded copy).
    pub sdpa_command: String,
    #[serde(deserialize_with = "duration")]
    pub sdpa_timeout: Duration,
}

impl Default for BaselineSection {
    fn default() -> Self {
        Self { sdpa: true, sdpa_command: "python3 {script}".into(), sdpa_timeout: Duration::from_secs(600) }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    pub runs_dir: PathBuf,
    pub plan: PathBuf,
    pub templates_dir: PathBuf,
    /// The budget covers the closing comparison (the sustained re-rank and the baselines
    /// measured afresh): the search ends early by the closing's expected length, so that a
    /// `--budget 90m` run ends about 90 minutes after it started, the closing cut to fit the
    /// time left where it must (engine/reserve.rs). false: the search uses the whole budget and
    /// the whole closing runs past it (the behaviour before 2026-11-29).
    pub budget_covers_closing: bool,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            runs_dir: "runs".into(),
            plan: "strategies/default.toml".into(),
            templates_dir: "kernel-templates".into(),
            budget_covers_closing: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workload {
    pub dtype: DType,
    /// Memory layout of Q, K, V and O: "bhsd" ([B,H,S,D], the default) or "bshd".
    pub layout: Layout,
    pub shapes: Vec<ShapeEntry>,
}

/// One `[[workload.shapes]]` entry. Heads: `h` (MHA, HQ = HKV = h) or `hq` with `hkv`
/// (grouped-query; `hkv = 1` is MQA). Rows: `s` (SQ = SK = s) or `sq` with `sk` (a
/// chunk of queries, or decode's few, against a longer KV cache).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeEntry {
    pub b: u32,
    pub h: Option<u32>,
    pub hq: Option<u32>,
    pub hkv: Option<u32>,
    pub s: Option<u32>,
    pub sq: Option<u32>,
    pub sk: Option<u32>,
    pub d: u32,
    #[serde(default)]
    pub causal: bool,
    /// Sliding window (causal only): each query row sees at most this many keys, ending at
    /// its own position (Hugging Face's `sliding_window`; Gemma's local layers, Mistral).
    #[serde(default)]
    pub window: Option<u32>,
}

impl ShapeEntry {
    /// The shape this entry is in `workload` (its dtype and layout), from its resolved
    /// (HQ, HKV, SQ, SK).
    fn shape(&self, (hq, hkv, sq, sk): (u32, u32, u32, u32), workload: &Workload) -> Shape {
        Shape { b: self.b, hq, hkv, sq, sk, d: self.d, causal: self.causal, window: self.window, dtype: workload.dtype, layout: workload.layout }
    }

    /// The entry's (HQ, HKV, SQ, SK), or the key at fault and what to write instead.
    fn resolve(&self) -> Result<(u32, u32, u32, u32), (&'static str, String)> {
        let heads = match (self.h, self.hq, self.hkv) {
            (Some(h), None, None) => (h, h),
            (None, Some(hq), Some(hkv)) => (hq, hkv),
            (None, Some(hq), None) => return Err(("hkv", format!("is missing; with hq = {hq} give hkv too (hkv = {hq} for multi-head attention, fewer for grouped-query, 1 for multi-query)"))),
            (None, None, Some(_)) => return Err(("hq", "is missing; with hkv give hq too (the query heads), or write h for multi-head attention".into())),
            (Some(_), _, _) => return Err(("h", "is given with hq/hkv; use h alone (HQ = HKV = h) or hq and hkv".into())),
            (None, None, None) => return Err(("h", "is missing; give h (multi-head) or hq and hkv (grouped-query)".into())),
        };
        let rows = match (self.s, self.sq, self.sk) {
            (Some(s), None, None) => (s, s),
            (None, Some(sq), Some(sk)) => (sq, sk),
            (None, Some(sq), None) => return Err(("sk", format!("is missing; with sq = {sq} give sk too (the keys in the KV cache, sk >= sq)"))),
            (None, None, Some(_)) => return Err(("sq", "is missing; with sk give sq too (query rows: 1 for decode), or write s when they are equal".into())),
            (Some(_), _, _) => return Err(("s", "is given with sq/sk; use s alone (SQ = SK = s) or sq and sk".into())),
            (None, None, None) => return Err(("s", "is missing; give s (SQ = SK) or sq and sk".into())),
        };
        Ok((heads.0, heads.1, rows.0, rows.1))
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckSection {
    pub atol: f64,
    pub rtol_l2: f64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingSection {
    pub warmup: u32,
    pub rounds: u32,
    pub samples_per_round: u32,
    pub launches_per_sample: u32,
    pub l2_multiple: f64,
    pub max_input_sets: u32,
    /// Fewer launches per sample for long kernels (see protocol::TimingSpec); 0: never.
    pub sample_target_us: f64,
    /// Fewer rounds for long kernels: GPU time one kernel's samples may take per shape
    /// (at least 2 rounds); 0: always `rounds`.
    pub max_entry_ms: f64,
    pub min_gain: f64,
    /// Screening: before its check and full timing, a candidate is timed briefly beside the
    /// incumbent on one shape per class; slower there by more than this fraction on every
    /// class, it is recorded `rejected_early` without them. 0: every candidate is checked and
    /// timed in full.
    pub early_reject: f64,
    /// "graph": replay a CUDA graph of the launches (GPU time, like the SDPA baseline);
    /// "events": launch them one by one between the events (includes launch gaps).
    pub method: TimingMethod,
    /// The closing comparison's sustained timing: each best kernel and the baselines also
    /// replayed back to back for at least this long (ms), and each shape's top `rerank_top`
    /// correct kernels re-ranked under it. 0: no sustained timing (burst figures only).
    pub sustained_ms: f64,
    /// How many distinct correct kernels per shape (the best and the next by their recorded
    /// time) the closing re-ranks under sustained timing; 1: figures only, no re-rank.
    pub rerank_top: u32,
    /// The re-rank's floor: a contender replaces the best when faster by more than
    /// max(this, the noise). Lower than `min_gain` because nothing churns: the kernels are
    /// all correct, timed together in one paired timing, and the choice is the run's last;
    /// with `min_gain` a kernel 1.5% faster was left behind (issue 20's 4m run).
    pub rerank_min_gain: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimingMethod {
    Graph,
    Events,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSection {
    #[serde(deserialize_with = "duration")]
    pub hello_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub load_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub check_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub time_timeout: Duration,
    /// How long a run waits for the GPU to come back (driver reset, device lost) before
    /// it ends as `interrupted`, resumable later. The budget does not burn meanwhile.
    #[serde(deserialize_with = "duration")]
    pub gpu_wait_limit: Duration,
    /// Longest pause between two attempts to restart the worker (backoff doubles up to it).
    #[serde(deserialize_with = "duration")]
    pub gpu_retry_max: Duration,
    /// Compile the candidate the search expects next while the current one is checked and
    /// timed (the worker compiles on background threads). Order and results are unchanged:
    /// a wrong guess only costs CPU time.
    pub lookahead: bool,
    /// How many candidates ahead the look-ahead compiles (one NVRTC build each, one thread):
    /// a Hopper build takes ~3.5 s of NVRTC where a candidate's check and timing take
    /// 0.1-0.9 s. On the H200's 16-core host a 2-minute LLM run checked 95 candidates three
    /// ahead and 125 six ahead (2026-11-30, docs/BENCHMARKS.md (38)); on a host with few cores
    /// per GPU the builds compete with the check's reference for them: fewer.
    pub lookahead_depth: u32,
    /// How many threads compile the look-ahead's builds, the soonest needed first
    /// (`worker::compile_pool`); 0: a quarter of the host's cores, 2 to 8. More threads
    /// finish more guesses but slow each build and the check's fp32 reference, which share
    /// the cores.
    pub compile_threads: u32,
}

/// The longest duration any key takes.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// A duration as people write it (`"45s"`, `"5m"`, `"1h30m"`), at most [`MAX_DURATION`].
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    let how = "write e.g. \"45s\", \"5m\", \"1h30m\" (at most 30 days)";
    let v = humantime::parse_duration(&text).map_err(|e| serde::de::Error::custom(format!("invalid duration {text:?} ({e}); {how}")))?;
    if v > MAX_DURATION {
        return Err(serde::de::Error::custom(format!("{text:?} is longer than 30 days; {how}")));
    }
    Ok(v)
}

// Defaults: the same values as the embedded agent.toml (a test keeps them equal).
impl Default for Workload {
    fn default() -> Self {
        let shape = |b, h, s, d, causal| ShapeEntry {
            b,
            h: Some(h),
            hq: None,
            hkv: None,
            s: Some(s),
            sq: None,
            sk: None,
            d,
            causal,
            window: None,
        };
        Self {
            dtype: DType::Fp16,
            layout: Layout::Bhsd,
            shapes: vec![
                shape(1, 1, 32, 64, false),
                shape(1, 1, 64, 64, false),
                shape(1, 1, 128, 64, false),
                shape(1, 1, 256, 64, false),
                shape(1, 1, 512, 64, false),
                shape(2, 8, 128, 64, false),
                shape(4, 16, 1024, 64, true),
                shape(2, 16, 4096, 128, true),
            ],
        }
    }
}

impl Default for CheckSection {
    fn default() -> Self {
        Self { atol: 0.02, rtol_l2: 0.01 }
    }
}

impl Default for TimingSection {
    fn default() -> Self {
        Self {
            warmup: 5,
            rounds: 4,
            samples_per_round: 10,
            launches_per_sample: 10,
            l2_multiple: 3.0,
            max_input_sets: 32,
            sample_target_us: 2000.0,
            max_entry_ms: 300.0,
            min_gain: 0.02,
            early_reject: 0.25,
            method: TimingMethod::Graph,
            sustained_ms: 200.0,
            rerank_top: 3,
            rerank_min_gain: 0.01,
        }
    }
}

impl Default for WorkerSection {
    fn default() -> Self {
        Self {
            hello_timeout: Duration::from_secs(60),
            load_timeout: Duration::from_secs(90),
            check_timeout: Duration::from_secs(60),
            time_timeout: Duration::from_secs(180),
            gpu_wait_limit: Duration::from_secs(600),
            gpu_retry_max: Duration::from_secs(30),
            lookahead: true,
            lookahead_depth: 6,
            compile_threads: 0,
        }
    }
}

/// Supported head dimensions: each template instantiates those of them its spec lists
/// (`head_dims`), and baseline.cu all of them, so every shape has a correct kernel.
/// 96: Phi-3-mini; 256: Gemma 2 and 3 (their 9B/12B/27B-class models, Gemma 3's 4B).
pub const HEAD_DIMS: [u32; 4] = [64, 96, 128, 256];

impl Config {
    /// Load `path`, or the embedded default when `path` is None and `agent.toml` is absent.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            Some(p) => Self::load_file(p),
            None if Path::new("agent.toml").exists() => Self::load_file(Path::new("agent.toml")),
            None => Self::parse(DEFAULT_CONFIG, Path::new("<embedded agent.toml>"), Path::new(".")),
        }
    }

    pub fn load_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Self::parse(&text, path, base)
    }

    /// Parse `text` as if read from `path`; defaults fill what the file leaves out.
    pub fn parse(text: &str, path: &Path, base_dir: &Path) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| parse_error(path, text, &e))?;
        config.source = path.to_path_buf();
        config.base_dir = base_dir.to_path_buf();
        config.validate()?;
        if let Err((key, message)) = config.agent.validate() {
            let line = crate::spec::agent::key_line(text, key.trim_start_matches("agent."));
            return Err(ConfigError::InvalidAt { path: path.to_path_buf(), line, key, message });
        }
        Ok(config)
    }

    fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { path: self.source.clone(), key: key.to_string(), message: message.into() }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.workload.shapes.is_empty() {
            return Err(self.invalid("workload.shapes", "is empty; list at least one { b, h, s, d } (or { b, hq, hkv, sq, sk, d }) shape"));
        }
        let mut keys = std::collections::BTreeMap::new();
        for (i, s) in self.workload.shapes.iter().enumerate() {
            let at = |k: &str| format!("workload.shapes[{i}].{k}");
            if !HEAD_DIMS.contains(&s.d) {
                return Err(self.invalid(
                    &at("d"),
                    format!("is {}; allowed values: {:?} (the head dims the kernel templates are written for)", s.d, HEAD_DIMS),
                ));
            }
            let (hq, hkv, sq, sk) = s.resolve().map_err(|(k, m)| self.invalid(&at(k), m))?;
            let h_key = if s.h.is_some() { "h" } else { "hq" };
            let s_key = if s.s.is_some() { "s" } else { "sq" };
            for (k, v) in [("b", s.b), (h_key, hq), ("hkv", hkv), (s_key, sq), ("sk", sk)] {
                if v == 0 {
                    return Err(self.invalid(&at(k), "must be at least 1"));
                }
            }
            if !hq.is_multiple_of(hkv) {
                return Err(self.invalid(
                    &at("hq"),
                    format!("is {hq}, not a multiple of hkv = {hkv}; every KV head serves the same number of query heads (e.g. hq = {}, hkv = {hkv})", hq.div_ceil(hkv) * hkv),
                ));
            }
            if sq > sk {
                return Err(self.invalid(
                    &at("sq"),
                    format!("is {sq}, more than sk = {sk}; the query rows are the last sq of the sk positions, so sq <= sk (decode: sq = 1)"),
                ));
            }
            match s.window {
                Some(0) => return Err(self.invalid(&at("window"), "is 0; a sliding window holds at least 1 key (its own position); remove `window` for none")),
                Some(w) if !s.causal => {
                    return Err(self.invalid(
                        &at("window"),
                        format!("is {w} on a shape that is not causal; a sliding window looks back from each row's own position: set causal = true (or remove `window`)"),
                    ))
                }
                _ => {}
            }
            let shape = s.shape((hq, hkv, sq, sk), &self.workload);
            let elements = shape.max_elems() as u128;
            if elements > i32::MAX as u128 {
                return Err(self.invalid(
                    &format!("workload.shapes[{i}]"),
                    format!("has {elements} elements in its largest tensor; at most {} fit the kernels' i32 indices", i32::MAX),
                ));
            }
            if let Some(j) = keys.insert(shape.key(), i) {
                return Err(self.invalid(&format!("workload.shapes[{i}]"), format!("is the same shape as workload.shapes[{j}] ({}); list each shape once", shape.key())));
            }
        }
        let t = &self.timing;
        for (k, v) in [
            ("timing.rounds", t.rounds),
            ("timing.samples_per_round", t.samples_per_round),
            ("timing.launches_per_sample", t.launches_per_sample),
            ("timing.max_input_sets", t.max_input_sets),
        ] {
            if v == 0 {
                return Err(self.invalid(k, "must be at least 1"));
            }
        }
        for (k, v, max) in [
            ("timing.warmup", t.warmup, 100_000),
            ("timing.rounds", t.rounds, 10_000),
            ("timing.samples_per_round", t.samples_per_round, 100_000),
            ("timing.launches_per_sample", t.launches_per_sample, 100_000),
            ("timing.max_input_sets", t.max_input_sets, 4096),
        ] {
            if v > max {
                return Err(self.invalid(k, format!("is {v}; at most {max}")));
            }
        }
        for (k, v, max) in [("timing.l2_multiple", t.l2_multiple, 1000.0), ("timing.sample_target_us", t.sample_target_us, 1e7), ("timing.max_entry_ms", t.max_entry_ms, 1e7)] {
            if !v.is_nan() && v > max {
                return Err(self.invalid(k, format!("is {v}; at most {max}")));
            }
        }
        if !(0.0..1.0).contains(&t.min_gain) {
            return Err(self.invalid("timing.min_gain", format!("is {}; allowed: 0 <= min_gain < 1 (0.02 = 2%)", t.min_gain)));
        }
        if !(0.0..1.0).contains(&t.rerank_min_gain) {
            return Err(self.invalid("timing.rerank_min_gain", format!("is {}; allowed: 0 <= rerank_min_gain < 1 (0.01 = 1%)", t.rerank_min_gain)));
        }
        if !(0.0..=10.0).contains(&t.early_reject) {
            return Err(self.invalid("timing.early_reject", format!("is {}; allowed: 0 (off) to 10 (0.25 = rejected when 25% slower in the brief timing)", t.early_reject)));
        }
        if t.l2_multiple.is_nan() || t.l2_multiple < 0.0 {
            return Err(self.invalid("timing.l2_multiple", "must be >= 0"));
        }
        if t.sample_target_us.is_nan() || t.sample_target_us < 0.0 {
            return Err(self.invalid("timing.sample_target_us", "must be >= 0 (0: always launches_per_sample)"));
        }
        if t.max_entry_ms.is_nan() || t.max_entry_ms < 0.0 {
            return Err(self.invalid("timing.max_entry_ms", "must be >= 0 (0: always `rounds`)"));
        }
        if !(0.0..=10_000.0).contains(&t.sustained_ms) {
            return Err(self.invalid("timing.sustained_ms", format!("is {}; allowed: 0 (off) to 10000 (200 = 200 ms back to back)", t.sustained_ms)));
        }
        if !(1..=16).contains(&t.rerank_top) {
            return Err(self.invalid("timing.rerank_top", format!("is {}; allowed: 1 (no re-rank) to 16", t.rerank_top)));
        }
        let slots = crate::spec::protocol::PRECOMPILE_SLOTS as u32;
        if !(1..=slots).contains(&self.worker.lookahead_depth) {
            return Err(self.invalid(
                "worker.lookahead_depth",
                format!("is {}; allowed: 1 to {slots} (the builds a worker keeps waiting; to compile nothing ahead, set worker.lookahead = false)", self.worker.lookahead_depth),
            ));
        }
        if self.worker.compile_threads > 64 {
            return Err(self.invalid(
                "worker.compile_threads",
                format!("is {}; allowed: 0 (a quarter of the host's cores, 2 to 8) or 1 to 64", self.worker.compile_threads),
            ));
        }
        for (k, v) in [("check.atol", self.check.atol), ("check.rtol_l2", self.check.rtol_l2)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(self.invalid(k, format!("is {v}; must be a number > 0 (e.g. 0.02)")));
            }
        }
        if let Some(url) = &self.fleet.ledger {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(self.invalid("fleet.ledger", "must be a PostgreSQL URL, postgres://USER:PASSWORD@HOST:PORT/DB (without it a group's queue is in the local ledger)"));
            }
        }
        if self.fleet.lease < Duration::from_secs(10) || self.fleet.lease > Duration::from_secs(24 * 3600) {
            return Err(self.invalid("fleet.lease", "must be from 10s to 24h (a machine that dies releases its items this long after its last renewal)"));
        }
        Ok(())
    }

    /// Resolve a configured path against the config file's folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    pub fn shapes(&self) -> Vec<Shape> {
        self.workload
            .shapes
            .iter()
            .filter_map(|s| {
                // validate() refused every entry that does not resolve.
                Some(s.shape(s.resolve().ok()?, &self.workload))
            })
            .collect()
    }

    /// The effective configuration as JSON, for the ledger (durations in words).
    pub fn effective(&self) -> serde_json::Value {
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let w = &self.worker;
        let t = &self.timing;
        serde_json::json!({
            "source": self.source.display().to_string(),
            "run": { "runs_dir": self.run.runs_dir, "plan": self.run.plan, "templates_dir": self.run.templates_dir,
                     "budget_covers_closing": self.run.budget_covers_closing },
            "workload": { "dtype": self.workload.dtype, "layout": self.workload.layout, "shapes": self.shapes() },
            "check": { "atol": self.check.atol, "rtol_l2": self.check.rtol_l2 },
            "timing": { "warmup": t.warmup, "rounds": t.rounds, "samples_per_round": t.samples_per_round,
                        "launches_per_sample": t.launches_per_sample, "l2_multiple": t.l2_multiple,
                        "max_input_sets": t.max_input_sets, "sample_target_us": t.sample_target_us, "max_entry_ms": t.max_entry_ms,
                        "min_gain": t.min_gain, "early_reject": t.early_reject, "method": t.method,
                        "sustained_ms": t.sustained_ms, "rerank_top": t.rerank_top, "rerank_min_gain": t.rerank_min_gain },
            "worker": { "hello_timeout": d(w.hello_timeout), "load_timeout": d(w.load_timeout), "check_timeout": d(w.check_timeout),
                        "time_timeout": d(w.time_timeout), "gpu_wait_limit": d(w.gpu_wait_limit), "gpu_retry_max": d(w.gpu_retry_max), "lookahead": w.lookahead, "lookahead_depth": w.lookahead_depth, "compile_threads": w.compile_threads },
            "baseline": { "sdpa": self.baseline.sdpa, "sdpa_command": self.baseline.sdpa_command, "sdpa_timeout": d(self.baseline.sdpa_timeout) },
            "agent": self.agent.effective(),
        })
    }

    pub fn tolerance(&self) -> Tolerance {
        Tolerance { atol: self.check.atol, rtol_l2: self.check.rtol_l2 }
    }

    pub fn timing_spec(&self) -> TimingSpec {
        let t = &self.timing;
        TimingSpec {
            warmup: t.warmup,
            rounds: t.rounds,
            samples_per_round: t.samples_per_round,
            launches_per_sample: t.launches_per_sample,
            l2_multiple: t.l2_multiple,
            max_input_sets: t.max_input_sets,
            graph: t.method == TimingMethod::Graph,
            sample_target_us: t.sample_target_us,
            max_entry_ms: t.max_entry_ms,
            // Candidates are timed in bursts; only the closing comparison asks for sustained.
            sustained_ms: 0.0,
        }
    }

    /// The closing comparison's timing: the run's, plus `timing.sustained_ms` windows.
    pub fn sustained_spec(&self) -> TimingSpec {
        TimingSpec { sustained_ms: self.timing.sustained_ms, ..self.timing_spec() }
    }
}

fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line, column) = e
        .span()
        .map(|span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            (line, column)
        })
        .unwrap_or((0, 0));
    ConfigError::Parse { path: path.to_path_buf(), line, column, message: e.message().to_string() }
}
