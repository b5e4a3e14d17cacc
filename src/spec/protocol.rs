//! The wire contract between the daemon and its GPU worker process.
//!
//! The daemon writes one JSON [`Request`] per line to the worker's stdin and reads
//! one JSON [`Response`] per line from its stdout. Everything the worker needs to
//! launch a kernel (grid, block, dynamic shared memory, split count) is computed by
//! the daemon from the template's declared formulas, so the worker stays generic
//! and the CTA check can compare what ran against what was planned.
//!
//! Kernel ABI shared by every template (see kernel-templates/common/optd.cuh):
//! `(q, k, v, o, o_partial, lse_partial, batch, heads, seq_len, n_splits,
//!   softmax_scale, causal, cta_counter)`, tensors in [B,H,S,D] layout, followed by
//! one 128-byte `CUtensorMap` (by value, 64-byte aligned) per [`TensorMap`] of the
//! plan, in declaration order (templates with `[[tensor_map]]`, see [`TensorMap`]).

use serde::{Deserialize, Serialize};

/// Element type of Q, K, V and O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Fp16,
    Bf16,
}

impl DType {
    pub fn as_str(self) -> &'static str {
        match self {
            DType::Fp16 => "fp16",
            DType::Bf16 => "bf16",
        }
    }
}

/// One attention problem: Q,K,V,O in [B,H,S,D].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub b: u32,
    pub h: u32,
    pub s: u32,
    pub d: u32,
    pub causal: bool,
    pub dtype: DType,
}

impl Shape {
    /// Stable, human-readable key, e.g. `b2h8s128d64` or `b4h16s1024d64-causal`.
    pub fn key(&self) -> String {
        let mut k = format!("b{}h{}s{}d{}", self.b, self.h, self.s, self.d);
        if self.causal {
            k.push_str("-causal");
        }
        if self.dtype != DType::Fp16 {
            k.push('-');
            k.push_str(self.dtype.as_str());
        }
        k
    }

    /// Elements in one of Q, K, V or O.
    pub fn elems(&self) -> u64 {
        self.b as u64 * self.h as u64 * self.s as u64 * self.d as u64
    }

    /// FLOPs of the forward pass: 4*B*H*S*S*D, halved when causal.
    pub fn flops(&self) -> f64 {
        let f = 4.0 * self.b as f64 * self.h as f64 * (self.s as f64).powi(2) * self.d as f64;
        if self.causal {
            f / 2.0
        } else {
            f
        }
    }
}

/// One kernel launch of a candidate on one shape, fully resolved by the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// Exported function name, e.g. `optd_fwd_d64`.
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dyn_smem: u32,
}

impl Launch {
    pub fn ctas(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }
}

/// All launches of a candidate for one shape, in order, plus the scalars they share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapePlan {
    pub shape: Shape,
    /// KV splits: sizes the fp32 partial buffers (`n_splits*B*H*S*D` and `n_splits*B*H*S`).
    pub n_splits: u32,
    pub launches: Vec<Launch>,
    /// TMA tensor maps appended, in this order, to the parameters of every launch.
    /// Absent in older ledgers and for templates without `[[tensor_map]]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_maps: Vec<TensorMap>,
}

/// Parameters of the shared ABI before any tensor map: a map's kernel parameter index is
/// `ABI_PARAMS + its position in [`ShapePlan::tensor_maps`]`.
pub const ABI_PARAMS: usize = 13;

/// Which ABI tensor a tensor map describes (its global address is that tensor's pointer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorName {
    Q,
    K,
    V,
    O,
}

impl TensorName {
    pub fn as_str(self) -> &'static str {
        match self {
            TensorName::Q => "q",
            TensorName::K => "k",
            TensorName::V => "v",
            TensorName::O => "o",
        }
    }
}

/// One TMA tensor map of a plan, resolved for its shape: which tensor, how many rows a
/// box holds, and the swizzle. Everything else follows from the shape by a fixed
/// convention, computed in one place: [`TensorMap::geometry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMap {
    pub tensor: TensorName,
    pub box_rows: u32,
    /// Swizzle span in bytes: 32, 64 or 128.
    pub swizzle: u32,
}

/// Arguments of `cuTensorMapEncodeTiled` (besides the address and the enums, which are
/// fixed: UINT16 data, no interleave, L2 promotion 128B, OOB fill none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TensorMapGeometry {
    /// Elements per swizzle panel: `swizzle / 2`.
    pub panel: u32,
    /// Innermost first: {P, S, D/P, B*H}.
    pub dims: [u64; 4],
    /// Byte strides of dims 1..3 (dim 0 is contiguous): {D*2, P*2, S*D*2}.
    pub strides_bytes: [u64; 3],
    /// {P, box_rows, D/P, 1}.
    pub box_dims: [u32; 4],
    pub element_strides: [u32; 4],
}

impl TensorMapGeometry {
    pub const RANK: u32 = 4;

    /// Bytes one box brings into shared memory (the mbarrier transaction count).
    pub fn box_bytes(&self) -> u64 {
        self.box_dims.iter().map(|&b| b as u64).product::<u64>() * ELEM_BYTES
    }
}

/// Q, K, V and O hold 2-byte elements (fp16 or bf16).
pub const ELEM_BYTES: u64 = 2;

impl TensorMap {
    /// The map of this tensor for `shape`, by the fixed convention: the tensor is
    /// [B,H,S,D] contiguous with 2-byte elements; with swizzle W bytes a panel holds
    /// P = W/2 elements, so D splits into D/P panels and the map is rank 4,
    /// dims (innermost first) {P, S, D/P, B*H}, byte strides of dims 1..3
    /// {D*2, P*2, S*D*2}, box {P, box_rows, D/P, 1}, element strides all 1. A box is a
    /// [D/P panels][box_rows rows][P elements] block in shared memory, each panel row W
    /// bytes, swizzled; rows past S read as zeros.
    ///
    /// Err: why the map cannot be encoded (the TMA's limits), in words.
    pub fn geometry(&self, shape: &Shape) -> Result<TensorMapGeometry, String> {
        if !matches!(self.swizzle, 32 | 64 | 128) {
            return Err(format!("swizzle = {} bytes; allowed: 32, 64, 128", self.swizzle));
        }
        let panel = self.swizzle / ELEM_BYTES as u32;
        let d = shape.d as u64;
        if shape.d == 0 || !d.is_multiple_of(panel as u64) {
            return Err(format!(
                "D = {} is not a multiple of the {panel}-element panel of a {}-byte swizzle (D % {panel} must be 0)",
                shape.d, self.swizzle
            ));
        }
        let panels = d / panel as u64;
        if panels > 256 {
            return Err(format!("D / {panel} = {panels} panels; a box dimension holds at most 256"));
        }
        if !(1..=256).contains(&self.box_rows) {
            return Err(format!("box_rows = {}; a box dimension holds 1..=256", self.box_rows));
        }
        let (s, bh) = (shape.s as u64, shape.b as u64 * shape.h as u64);
        if s == 0 || bh == 0 {
            return Err(format!("shape {} has an empty dimension", shape.key()));
        }
        let dims = [panel as u64, s, panels, bh];
        let strides_bytes = [d * ELEM_BYTES, panel as u64 * ELEM_BYTES, s * d * ELEM_BYTES];
        // cuTensorMapEncodeTiled: dims up to 2^32, strides multiples of 16 below 2^40.
        if let Some(bad) = dims.iter().find(|&&x| x > 1 << 32) {
            return Err(format!("a dimension of {bad} exceeds the TMA's 2^32"));
        }
        if let Some(bad) = strides_bytes.iter().find(|&&x| x >= 1 << 40 || !x.is_multiple_of(16)) {
            return Err(format!("a stride of {bad} bytes is not a multiple of 16 below 2^40"));
        }
        Ok(TensorMapGeometry {
            panel,
            dims,
            strides_bytes,
            box_dims: [panel, self.box_rows, panels as u32, 1],
            element_strides: [1; 4],
        })
    }
}

/// Correctness tolerance: pass when `max_abs <= atol` and `rel_l2 <= rtol_l2`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol_l2: f64,
}

/// Timing method knobs, sent with every `Time` request so the ledger can say how it was timed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimingSpec {
    /// Untimed launches per kernel before sampling.
    pub warmup: u32,
    /// Interleaved rounds; each round samples every kernel `samples_per_round` times.
    pub rounds: u32,
    pub samples_per_round: u32,
    /// Back-to-back launches between one pair of CUDA events; the sample is their mean.
    pub launches_per_sample: u32,
    /// Rotate input sets until they span this multiple of the L2 size (capped by `max_input_sets`).
    pub l2_multiple: f64,
    pub max_input_sets: u32,
    /// Capture `launches_per_sample` executions in a CUDA graph and time its replays
    /// (GPU time, as SDPA's baseline is timed); false: launch them one by one.
    #[serde(default)]
    pub graph: bool,
    /// Long kernels need no averaging over many launches: a case whose slowest entry
    /// takes T us per execution (one timed warm-up execution each) uses
    /// `clamp(ceil(sample_target_us / T), 1, launches_per_sample)` launches per sample
    /// and at most as many warm-ups. 0 keeps `launches_per_sample` for every case.
    #[serde(default)]
    pub sample_target_us: f64,
    /// Long kernels need fewer samples too: an entry's samples in one case may take at
    /// most this much GPU time, so a case gets `rounds_for` rounds (at least 2, so every
    /// entry is sampled in both orders; at most `rounds`). 0: always `rounds`.
    #[serde(default)]
    pub max_entry_ms: f64,
}

/// Launches per sample for a case whose slowest entry took `slowest_us` per execution.
pub fn launches_for(spec: &TimingSpec, slowest_us: f64) -> u32 {
    let max = spec.launches_per_sample.max(1);
    if spec.sample_target_us <= 0.0 || !slowest_us.is_finite() || slowest_us <= 0.0 {
        return max;
    }
    ((spec.sample_target_us / slowest_us).ceil() as u32).clamp(1, max)
}

/// Rounds for a case whose slowest entry took `slowest_us` per execution, sampled with
/// `per_sample` executions per sample.
pub fn rounds_for(spec: &TimingSpec, slowest_us: f64, per_sample: u32) -> u32 {
    let max = spec.rounds.max(1);
    let per_round_us = slowest_us * per_sample.max(1) as f64 * spec.samples_per_round.max(1) as f64;
    if spec.max_entry_ms <= 0.0 || !per_round_us.is_finite() || per_round_us <= 0.0 {
        return max;
    }
    let fit = (spec.max_entry_ms * 1000.0 / per_round_us).floor();
    (fit.min(max as f64) as u32).max(2.min(max))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Describe the device. First request on every (re)started worker.
    Hello,
    /// Compile `source` twice (timed build, and a check build with `-DOPTD_COUNT_CTAS=1`),
    /// load both, and report the resources of the timed build's `kernels`.
    Load {
        id: String,
        source: String,
        /// NVRTC target, e.g. `sm_90`, or `sm_90a` for arch-specific templates.
        arch: String,
        kernels: Vec<String>,
        /// Occupancy queries: (kernel, threads per block, dynamic smem bytes).
        occupancy: Vec<OccupancyQuery>,
        compile_timeout_ms: u64,
    },
    /// Run the check build on fresh random inputs, smallest shape first, stop at the first failure.
    Check {
        id: String,
        plans: Vec<ShapePlan>,
        tolerance: Tolerance,
        seed: u64,
        /// Anti-cheat probes on top of the check (agent candidates): guard regions around
        /// O, Q/K/V compared after the run, and a rerun on a second stream with new inputs
        /// in the same buffers and O not re-poisoned.
        #[serde(default)]
        probes: Probes,
    },
    /// Time several loaded kernels on each shape, interleaved.
    Time {
        cases: Vec<TimeCase>,
        spec: TimingSpec,
        seed: u64,
    },
    /// Start compiling `source` (both builds) on background threads and answer at once: a
    /// later `Load` of the same source and arch takes the result instead of compiling. The
    /// engine sends the candidate it expects next while the current one is checked and timed.
    Precompile {
        source: String,
        arch: String,
        compile_timeout_ms: u64,
    },
    /// Drop a loaded module.
    Unload { id: String },
    Shutdown,
}

/// Which anti-cheat probes a check runs (see [`Request::Check`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probes {
    /// Guard regions, input comparison, second-stream rerun.
    #[serde(default)]
    pub on: bool,
    /// The re-check after timing: inputs allocated behind a spacer, so at addresses
    /// other than the first check's and the timing's.
    #[serde(default)]
    pub after_timing: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OccupancyQuery {
    pub kernel: String,
    pub block_threads: u32,
    pub dyn_smem: u32,
}

/// One shape, timed for each (loaded id, plan) entry, interleaved round by round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeCase {
    pub shape: Shape,
    pub entries: Vec<TimeEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeEntry {
    pub id: String,
    pub plan: ShapePlan,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Response {
    Hello(DeviceInfo),
    Loaded(Loaded),
    /// NVRTC rejected the source; the log is kept as text.
    CompileError { log: String },
    Checked(Checked),
    Timed(Timed),
    Unloaded,
    /// A `Precompile` was started.
    Precompiling,
    /// A CUDA error. `sticky` errors leave the context unusable: the worker exits after replying.
    CudaError { during: String, message: String, sticky: bool },
    /// The request itself was wrong (unknown id, bad plan): a bug in the daemon, not the candidate.
    BadRequest { message: String },
    Bye,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub cc_major: u32,
    pub cc_minor: u32,
    pub sm_count: u32,
    /// Max dynamic shared memory per block after opt-in (cudaDevAttrMaxSharedMemoryPerBlockOptin).
    pub smem_optin: u32,
    pub smem_per_sm: u32,
    pub l2_bytes: u64,
    pub max_threads_per_sm: u32,
    /// e.g. 13000 for CUDA 13.0 (cuDriverGetVersion).
    pub driver_version: i32,
    /// (major, minor) of NVRTC.
    pub nvrtc_version: (i32, i32),
    /// e.g. `sm_90`.
    pub arch: String,
}

impl DeviceInfo {
    pub fn cc(&self) -> u32 {
        self.cc_major * 10 + self.cc_minor
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Loaded {
    pub compile_ms: f64,
    pub kernels: Vec<KernelResources>,
    pub occupancy: Vec<OccupancyResult>,
    /// NVRTC's log for the timed build (warnings), possibly empty.
    pub log: String,
}

/// From cuFuncGetAttribute on the loaded function (timed build).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelResources {
    pub kernel: String,
    pub registers: u32,
    pub static_smem: u32,
    /// Local memory per thread: non-zero means register spills (or a stack array).
    pub local_bytes: u32,
    pub max_threads: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OccupancyResult {
    pub kernel: String,
    pub block_threads: u32,
    pub dyn_smem: u32,
    /// cuOccupancyMaxActiveBlocksPerMultiprocessor.
    pub blocks_per_sm: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checked {
    /// One entry per shape checked, in order; stops after the first failure.
    pub shapes: Vec<ShapeCheck>,
}

impl Checked {
    pub fn first_failure(&self) -> Option<&ShapeCheck> {
        self.shapes.iter().find(|s| !s.passed)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeCheck {
    pub shape: Shape,
    pub passed: bool,
    pub max_abs: f64,
    pub rel_l2: f64,
    /// Output elements still NaN-poisoned or non-finite after the launch.
    pub unwritten: u64,
    /// Output rows compared with the fp32 reference (all rows for small shapes, a stratified sample beyond).
    pub rows_compared: u64,
    /// CTAs counted per launch (check build), in launch order.
    pub ctas_ran: Vec<u64>,
    /// CTAs planned per launch (grid product), in launch order.
    pub ctas_planned: Vec<u64>,
    /// Why it failed, in words; empty when passed.
    pub reason: String,
    /// Anti-cheat probes that failed (`guard`, `inputs`, `rerun`, ...), each with what it saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe_failures: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timed {
    pub cases: Vec<TimedCase>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedCase {
    pub shape: Shape,
    pub input_sets: u32,
    /// Same order as the request's entries.
    pub entries: Vec<TimedEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedEntry {
    pub id: String,
    /// Per-launch microseconds of every sample, in the order taken.
    pub samples_us: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(launches: u32, target_us: f64) -> TimingSpec {
        TimingSpec {
            warmup: 5,
            rounds: 4,
            samples_per_round: 10,
            launches_per_sample: launches,
            l2_multiple: 3.0,
            max_input_sets: 32,
            graph: true,
            sample_target_us: target_us,
            max_entry_ms: 0.0,
        }
    }

    #[test]
    fn long_kernels_get_fewer_rounds_but_at_least_two() {
        let s = TimingSpec { max_entry_ms: 500.0, ..spec(10, 2000.0) };
        assert_eq!(rounds_for(&s, 5.0, 10), 4, "5 us x 10 launches x 10 samples: 0.5 ms a round");
        assert_eq!(rounds_for(&s, 12_000.0, 1), 4, "120 ms a round: four fit in 500 ms");
        assert_eq!(rounds_for(&s, 16_000.0, 1), 3, "160 ms a round: three fit");
        assert_eq!(rounds_for(&s, 58_000.0, 1), 2, "580 ms a round: still two, one in each order");
        assert_eq!(rounds_for(&spec(10, 2000.0), 58_000.0, 1), 4, "0 disables the adaptation");
        assert_eq!(rounds_for(&s, f64::NAN, 1), 4);
        assert_eq!(rounds_for(&TimingSpec { rounds: 1, ..s.clone() }, 58_000.0, 1), 1, "never more than rounds");
    }

    #[test]
    fn long_kernels_get_fewer_launches_per_sample_and_short_ones_the_configured_count() {
        let s = spec(10, 2000.0);
        assert_eq!(launches_for(&s, 5.0), 10, "a 5 us kernel: capped at launches_per_sample");
        assert_eq!(launches_for(&s, 500.0), 4, "2000 / 500");
        assert_eq!(launches_for(&s, 450.0), 5, "ceil(2000 / 450)");
        assert_eq!(launches_for(&s, 40_000.0), 1, "a 40 ms kernel: one launch per sample");
        assert_eq!(launches_for(&spec(10, 0.0), 40_000.0), 10, "0 disables the adaptation");
        assert_eq!(launches_for(&s, f64::NAN), 10);
        assert_eq!(launches_for(&spec(0, 2000.0), 5.0), 1, "never zero launches");
    }

    #[test]
    fn a_timing_spec_without_sample_target_still_parses() {
        let json = r#"{"warmup":5,"rounds":4,"samples_per_round":10,"launches_per_sample":10,"l2_multiple":3.0,"max_input_sets":32}"#;
        let s: TimingSpec = serde_json::from_str(json).unwrap();
        assert_eq!((s.sample_target_us, s.graph, s.max_entry_ms), (0.0, false, 0.0));
    }
}
