//! The wire contract between the daemon and its GPU worker process.
//!
//! The daemon writes one JSON [`Request`] per line to the worker's stdin and reads
//! one JSON [`Response`] per line from its stdout. Everything the worker needs to
//! launch a kernel (grid, block, dynamic shared memory, split count) is computed by
//! the daemon from the template's declared formulas, so the worker stays generic
//! and the CTA check can compare what ran against what was planned.
//!
//! Kernel ABI v2, shared by every template (see kernel-templates/common/optd.cuh):
//! `(q, k, v, o, o_partial, lse_partial, batch, heads_q, heads_kv, seq_q, seq_k,
//!   n_splits, softmax_scale, causal, strides, cta_counter)`: Q and O hold
//! B x heads_q x seq_q rows, K and V B x heads_kv x seq_k rows, each row D contiguous
//! elements, addressed through `strides` (12 int64 element strides: batch, head, row of
//! q, k, v, o; see [`ViewStrides`]), so either [`Layout`] and non-contiguous views run
//! without copies. Followed by one 128-byte `CUtensorMap` (by value, 64-byte aligned)
//! per [`TensorMap`] of the plan, in declaration order (templates with `[[tensor_map]]`).

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

/// How Q, K, V and O are laid out in memory (the last dimension, D, is always contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// [B, H, S, D]: PyTorch's SDPA and Hugging Face's attention functions.
    #[default]
    Bhsd,
    /// [B, S, H, D]: FlashAttention, vLLM, and the output of a fused QKV projection.
    Bshd,
}

impl Layout {
    pub const ALL: [Layout; 2] = [Layout::Bhsd, Layout::Bshd];

    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Bhsd => "bhsd",
            Layout::Bshd => "bshd",
        }
    }

    /// Element strides (batch, head, row) of a tensor of `heads` x `seq` rows of `d` in this
    /// layout, each row `pitch` elements apart in the row's own dimension (`pitch = d`:
    /// contiguous; larger: a view into a wider tensor, as [`ViewStrides::padded`]).
    fn strides(self, heads: u32, seq: u32, d: u32, pad: u32) -> Strides {
        let (h, s, d, pad) = (heads as u64, seq as u64, d as u64, pad as u64);
        match self {
            // Rows of one head are `d + pad` apart: a view of the first D columns of a wider head.
            Layout::Bhsd => Strides { b: h * s * (d + pad), h: s * (d + pad), s: d + pad },
            // A row holds every head: `pad` extra elements per row, like Q inside a fused QKV row.
            Layout::Bshd => Strides { b: s * (h * d + pad), h: d, s: h * d + pad },
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Element strides of one tensor's batch, head and row dimensions (D's stride is 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Strides {
    pub b: u64,
    pub h: u64,
    pub s: u64,
}

/// The element strides of Q, K, V and O that one launch gets (kernel ABI v2's `strides`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewStrides {
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
    pub o: Strides,
}

/// Extra elements per row of a padded view: 64 keeps every row 128-byte aligned (TMA's
/// 16-byte stride rule and the 128-byte swizzle both hold) while no contiguous kernel
/// could get away with assuming `stride == D`.
pub const VIEW_PAD: u32 = 64;

impl ViewStrides {
    /// Q, K, V and O contiguous in the shape's layout.
    pub fn contiguous(shape: &Shape) -> Self {
        Self::with_pad(shape, 0)
    }

    /// Q, K, V and O as views into wider tensors (each row [`VIEW_PAD`] elements longer than
    /// it needs): the check runs every candidate on such a view too, so a kernel that
    /// assumes contiguous tensors fails instead of reading the wrong rows in a model.
    pub fn padded(shape: &Shape) -> Self {
        Self::with_pad(shape, VIEW_PAD)
    }

    fn with_pad(shape: &Shape, pad: u32) -> Self {
        let l = shape.layout;
        let q = l.strides(shape.hq, shape.sq, shape.d, pad);
        let kv = l.strides(shape.hkv, shape.sk, shape.d, pad);
        ViewStrides { q, k: kv, v: kv, o: q }
    }

    /// The strides of one tensor.
    pub fn of(&self, t: TensorName) -> Strides {
        match t {
            TensorName::Q => self.q,
            TensorName::K => self.k,
            TensorName::V => self.v,
            TensorName::O => self.o,
        }
    }

    /// Elements a buffer must hold for tensor `t` of `shape` under these strides (one past
    /// the last element any view index reaches).
    pub fn extent(&self, shape: &Shape, t: TensorName) -> u64 {
        let st = self.of(t);
        let (heads, seq) = shape.dims_of(t);
        (shape.b as u64 - 1) * st.b + (heads as u64 - 1) * st.h + (seq as u64 - 1) * st.s + shape.d as u64
    }

    /// The 12 strides in ABI order (q, k, v, o; each batch, head, row).
    pub fn abi(&self) -> [i64; 12] {
        let mut out = [0i64; 12];
        for (i, st) in [self.q, self.k, self.v, self.o].iter().enumerate() {
            out[3 * i] = st.b as i64;
            out[3 * i + 1] = st.h as i64;
            out[3 * i + 2] = st.s as i64;
        }
        out
    }
}

/// Query rows at most this many make a decode shape (one new token, or a few under
/// speculative decoding): the regime of the split-KV decode template and its plan stage.
pub const DECODE_MAX_SQ: u32 = 16;

/// One attention problem: B batches of HQ query heads with SQ rows each, attending to
/// HKV key/value heads of SK rows (query head h reads KV head h / (HQ / HKV): grouped-query
/// attention; HKV = 1 is multi-query), head dim D, in `layout`. Causal with SQ < SK: the
/// query rows are the last SQ positions, row i sees keys 0 ..= i + SK - SQ (FlashAttention
/// >= 2.1, SDPA's bottom-right causal). A causal shape may also have a sliding `window` of W
/// keys: row i (position p = i + SK - SQ) sees keys p - W < j <= p (Hugging Face's
/// `sliding_window = W`, FlashAttention's `window_size = (W - 1, 0)`).
///
/// Serialized with all fields (`window` only when there is one); deserialized also from the version-1 form
/// `{b, h, s, d, causal, dtype}` (hq = hkv = h, sq = sk = s, layout bhsd) that older
/// ledgers, memories and manifests hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "ShapeWire")]
pub struct Shape {
    pub b: u32,
    pub hq: u32,
    pub hkv: u32,
    pub sq: u32,
    pub sk: u32,
    pub d: u32,
    pub causal: bool,
    /// Sliding window (causal only): each row sees at most this many keys, ending at its
    /// diagonal. None: every key up to the diagonal (or every key, not causal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    pub dtype: DType,
    pub layout: Layout,
}

/// What a stored shape may look like: version 1 (`h`, `s`) or version 2.
#[derive(Deserialize)]
struct ShapeWire {
    b: u32,
    h: Option<u32>,
    hq: Option<u32>,
    hkv: Option<u32>,
    s: Option<u32>,
    sq: Option<u32>,
    sk: Option<u32>,
    d: u32,
    #[serde(default)]
    causal: bool,
    #[serde(default)]
    window: Option<u32>,
    dtype: DType,
    #[serde(default)]
    layout: Layout,
}

impl TryFrom<ShapeWire> for Shape {
    type Error = String;
    fn try_from(w: ShapeWire) -> Result<Self, String> {
        let hq = w.hq.or(w.h).ok_or("a shape needs `hq` (or `h`)")?;
        let hkv = w.hkv.or(w.h).unwrap_or(hq);
        let sq = w.sq.or(w.s).ok_or("a shape needs `sq` (or `s`)")?;
        let sk = w.sk.or(w.s).unwrap_or(sq);
        if w.window.is_some() && !w.causal {
            return Err("a shape with a `window` must be causal".into());
        }
        if w.window == Some(0) {
            return Err("a shape's `window` is at least 1 key".into());
        }
        Ok(Shape {
            b: w.b,
            hq,
            hkv,
            sq,
            sk,
            d: w.d,
            causal: w.causal,
            window: w.window,
            dtype: w.dtype,
            layout: w.layout,
        })
    }
}

impl Shape {
    /// Multi-head attention with SQ = SK in [B,H,S,D]: version 1's only kind of shape.
    pub fn mha(b: u32, h: u32, s: u32, d: u32, causal: bool, dtype: DType) -> Shape {
        Shape {
            b,
            hq: h,
            hkv: h,
            sq: s,
            sk: s,
            d,
            causal,
            window: None,
            dtype,
            layout: Layout::Bhsd,
        }
    }

    /// The same shape with a sliding window of `w` keys (causal only; see [`Shape::window`]).
    pub fn with_window(self, w: Option<u32>) -> Shape {
        Shape { window: w, ..self }
    }

    /// The kernel ABI's `window` argument: the window's keys, 0 for none.
    pub fn abi_window(&self) -> u32 {
        self.window.unwrap_or(0)
    }

    /// Stable, human-readable key. Heads print as `h8` when HQ = HKV, else `hq32hkv8`;
    /// rows as `s128` when SQ = SK, else `sq1sk4096`; then `-causal`, `-w1024` for a
    /// sliding window, the dtype unless fp16, and `-bshd` for that layout. A version-1 shape keeps its version-1 key
    /// (`b2h8s128d64`, `b4h16s1024d64-causal-bf16`), so older ledgers and memories match.
    pub fn key(&self) -> String {
        use std::fmt::Write;
        let mut k = format!("b{}", self.b);
        if self.hq == self.hkv {
            let _ = write!(k, "h{}", self.hq);
        } else {
            let _ = write!(k, "hq{}hkv{}", self.hq, self.hkv);
        }
        if self.sq == self.sk {
            let _ = write!(k, "s{}", self.sq);
        } else {
            let _ = write!(k, "sq{}sk{}", self.sq, self.sk);
        }
        let _ = write!(k, "d{}", self.d);
        if self.causal {
            k.push_str("-causal");
        }
        if let Some(w) = self.window {
            let _ = write!(k, "-w{w}");
        }
        if self.dtype != DType::Fp16 {
            k.push('-');
            k.push_str(self.dtype.as_str());
        }
        if self.layout != Layout::Bhsd {
            k.push('-');
            k.push_str(self.layout.as_str());
        }
        k
    }

    /// Query heads per KV head (1: MHA; HQ: MQA).
    pub fn group(&self) -> u32 {
        self.hq / self.hkv.max(1)
    }

    /// Causal only: how far the diagonal is shifted right (row i sees keys <= i + offset).
    pub fn causal_offset(&self) -> u32 {
        self.sk.saturating_sub(self.sq)
    }

    /// A decode shape: at most [`DECODE_MAX_SQ`] query rows.
    pub fn is_decode(&self) -> bool {
        self.sq <= DECODE_MAX_SQ
    }

    /// (heads, rows) of tensor `t`: Q and O have HQ x SQ, K and V HKV x SK.
    pub fn dims_of(&self, t: TensorName) -> (u32, u32) {
        match t {
            TensorName::Q | TensorName::O => (self.hq, self.sq),
            TensorName::K | TensorName::V => (self.hkv, self.sk),
        }
    }

    /// Elements in Q (or O).
    pub fn q_elems(&self) -> u64 {
        self.b as u64 * self.hq as u64 * self.sq as u64 * self.d as u64
    }

    /// Elements in K (or V).
    pub fn kv_elems(&self) -> u64 {
        self.b as u64 * self.hkv as u64 * self.sk as u64 * self.d as u64
    }

    /// Elements in the largest of Q, K, V, O (what one tensor's i32 indices must cover).
    pub fn max_elems(&self) -> u64 {
        self.q_elems().max(self.kv_elems())
    }

    /// Query rows of all heads: B * HQ * SQ.
    pub fn q_rows(&self) -> u64 {
        self.b as u64 * self.hq as u64 * self.sq as u64
    }

    /// Bytes of K and V one forward pass must read at least once: the decode figure of merit.
    /// A sliding window leaves the keys before the first row's window unread.
    pub fn kv_bytes(&self) -> u64 {
        let read = self.sk as u64 - self.visible_range(0).start as u64;
        2 * self.b as u64 * self.hkv as u64 * read * self.d as u64 * ELEM_BYTES
    }

    /// The keys query row `i` sees: `lo..hi` (all SK; causal up to its diagonal; with a
    /// window, the last `window` of those).
    pub fn visible_range(&self, i: u32) -> std::ops::Range<usize> {
        let sk = self.sk as usize;
        if !self.causal {
            return 0..sk;
        }
        let hi = (i as usize + self.causal_offset() as usize + 1).min(sk);
        let lo = self.window.map_or(0, |w| hi.saturating_sub(w as usize));
        lo..hi
    }

    /// Keys each query head's rows see in total: SQ * SK, or causal the unmasked part.
    pub fn visible_pairs(&self) -> f64 {
        let (sq, sk) = (self.sq as f64, self.sk as f64);
        if let Some(w) = self.window {
            // Row i sees min(i + SK - SQ + 1, W) keys: sum the rows before the window fills
            // (an arithmetic series) and W for the rest.
            let (off, w) = (sk - sq, w as f64);
            let full_from = (w - off - 1.0).clamp(0.0, sq); // rows i < full_from see fewer than W
            let partial = full_from * (off + 1.0) + full_from * (full_from - 1.0) / 2.0;
            return partial + (sq - full_from) * w.min(sk);
        }
        if self.causal {
            // Row i sees min(SK, i + SK - SQ + 1) keys; SQ <= SK, so never more than SK.
            sq * (sk - sq) + sq * (sq + 1.0) / 2.0
        } else {
            sq * sk
        }
    }

    /// FLOPs of the forward pass: 4 * B * HQ * D per visible (query, key) pair.
    pub fn flops(&self) -> f64 {
        4.0 * self.b as f64 * self.hq as f64 * self.d as f64 * self.visible_pairs()
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
    /// KV splits: sizes the fp32 partial buffers (`n_splits*B*HQ*SQ*D` and
    /// `(n_splits + 1)*B*HQ*SQ` 4-byte words, contiguous in that order whatever the
    /// layout). lse_partial's last B*HQ*SQ words (from `n_splits*B*HQ*SQ`) are split
    /// semaphores (u32): zero before the plan's first launch, and left zero by every
    /// execution of its launches (a kernel that counts arrivals resets its counter).
    pub n_splits: u32,
    pub launches: Vec<Launch>,
    /// TMA tensor maps appended, in this order, to the parameters of every launch.
    /// Absent in older ledgers and for templates without `[[tensor_map]]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_maps: Vec<TensorMap>,
}

/// Parameters of the shared ABI before any tensor map: a map's kernel parameter index is
/// `ABI_PARAMS + its position in [`ShapePlan::tensor_maps`]`.
pub const ABI_PARAMS: usize = 17;

/// The kernel ABI's version (`export`'s manifest says it): 2 since GQA, SQ != SK and
/// strides, 3 since the sliding window (`int window` after `int causal`).
pub const ABI_VERSION: u32 = 3;

/// The kernel ABI a rendered source was written for: 3 when its argument list has the
/// sliding window after `causal` (common/optd.cuh's OPTD_ARGS since v3), 2 when it declares
/// `optd_strides` (grouped-query heads and strides), else 1.
pub fn source_abi(source: &str) -> u32 {
    let has_window = source.find("int causal,").is_some_and(|at| {
        let rest = source[at + "int causal,".len()..]
            .trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
        rest.starts_with("int window")
    });
    if has_window {
        3
    } else if source.contains("struct optd_strides") {
        2
    } else {
        1
    }
}

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
/// box holds, how many of D's panels, and the swizzle. Everything else follows from the
/// shape by a fixed convention, computed in one place: [`TensorMap::geometry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMap {
    pub tensor: TensorName,
    pub box_rows: u32,
    /// Swizzle span in bytes: 32, 64 or 128.
    pub swizzle: u32,
    /// Panels of D per box; None: all D/P (every plan before the key existed). A kernel
    /// that lays a box's rows out per panel (wgmma-tma's packed query heads at D 128)
    /// loads one panel at a time, at panel coordinate 0..D/P.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub box_panels: Option<u32>,
}

/// Arguments of `cuTensorMapEncodeTiled` (besides the address and the enums, which are
/// fixed: UINT16 data, no interleave, L2 promotion 128B, OOB fill none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TensorMapGeometry {
    /// Elements per swizzle panel: `swizzle / 2`.
    pub panel: u32,
    /// Innermost first: {P, rows, D/P, heads, B}.
    pub dims: [u64; 5],
    /// Byte strides of dims 1..4 (dim 0 is contiguous): {row, P*2, head, batch}.
    pub strides_bytes: [u64; 4],
    /// {P, box_rows, box_panels (default D/P), 1, 1}.
    pub box_dims: [u32; 5],
    pub element_strides: [u32; 5],
}

impl TensorMapGeometry {
    pub const RANK: u32 = 5;

    /// Bytes one box brings into shared memory (the mbarrier transaction count).
    pub fn box_bytes(&self) -> u64 {
        self.box_dims.iter().map(|&b| b as u64).product::<u64>() * ELEM_BYTES
    }
}

/// Q, K, V and O hold 2-byte elements (fp16 or bf16).
pub const ELEM_BYTES: u64 = 2;

impl TensorMap {
    /// The map of this tensor for `shape` viewed through `strides`, by the fixed
    /// convention: with swizzle W bytes a panel holds P = W/2 elements, so D splits into
    /// D/P panels and the map is rank 5, dims (innermost first) {P, rows, D/P, heads, B}
    /// (rows and heads of this tensor: SQ and HQ for Q and O, SK and HKV for K and V), byte
    /// strides of dims 1..4 {row, P*2, head, batch} from `strides`, box
    /// {P, box_rows, box_panels, 1, 1} (box_panels: D/P unless the plan says fewer),
    /// element strides all 1. A box is a [box_panels][box_rows rows][P elements] block in
    /// shared memory, each panel row W bytes, swizzled; rows past the tensor's rows read as
    /// zeros. A kernel addresses a box by (0, row, first panel, head, batch).
    ///
    /// Err: why the map cannot be encoded (the TMA's limits), in words.
    pub fn geometry(&self, shape: &Shape, strides: &ViewStrides) -> Result<TensorMapGeometry, String> {
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
        let box_panels = self.box_panels.unwrap_or(panels as u32);
        if !(1..=panels).contains(&(box_panels as u64)) {
            return Err(format!("box_panels = {box_panels}; D / {panel} = {panels} panels, so 1..={panels}"));
        }
        let (heads, rows) = shape.dims_of(self.tensor);
        if rows == 0 || heads == 0 || shape.b == 0 {
            return Err(format!("shape {} has an empty dimension", shape.key()));
        }
        let st = strides.of(self.tensor);
        let dims = [panel as u64, rows as u64, panels, heads as u64, shape.b as u64];
        let strides_bytes = [st.s * ELEM_BYTES, panel as u64 * ELEM_BYTES, st.h * ELEM_BYTES, st.b * ELEM_BYTES];
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
            box_dims: [panel, self.box_rows, box_panels, 1, 1],
            element_strides: [1; 5],
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
    /// Interleaved rounds; each round samples every kernel `samples_per_round` times. Where
    /// one kernel's samples in a round would last longer than `sample_target_us`, the case
    /// takes fewer per round and more rounds, the same count in all ([`sample_plan`]).
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
    /// most this much GPU time, so a case gets fewer rounds ([`sample_plan`]: at least 2, so
    /// every entry is sampled in both orders). 0: no cut.
    #[serde(default)]
    pub max_entry_ms: f64,
    /// Sustained timing (the closing comparison): after the samples, each entry's graph is
    /// replayed back to back until at least this much GPU time has passed, one window per
    /// entry per round, entries interleaved as the samples are; the window's time over its
    /// executions is the entry's [`TimedEntry::sustained_us`] for that round. Short samples
    /// run at boost clocks; a model step runs attention for hundreds of milliseconds, 12-18%
    /// slower, and not every kernel slows alike. 0: off (every candidate's timing).
    #[serde(default)]
    pub sustained_ms: f64,
}

/// How long burst samples wait after sustained windows, whoever ran them: a window holds the
/// GPU at its power limit, and the limiter keeps the clocks down for about a second after it
/// ends (the worker's own windows: `worker::cuda::timing`; the SDPA script's, which end right
/// before the closing times our kernels again: `engine::closing`).
pub const COOL_DOWN: std::time::Duration = std::time::Duration::from_secs(2);

/// Sustained windows per entry: both orders and a third for a median, never more than the
/// spec's rounds. Each costs `sustained_ms` of GPU time per entry.
pub fn sustained_rounds(spec: &TimingSpec) -> u32 {
    spec.rounds.clamp(1, 3)
}

/// Graph replays one sustained window needs so that it lasts at least `sustained_ms`, from a
/// replay's burst time (`replay_us`): sustained clocks are lower, so the window only grows.
pub fn sustained_replays(sustained_ms: f64, replay_us: f64) -> u32 {
    if !(replay_us.is_finite() && replay_us > 0.0) {
        return 1;
    }
    ((sustained_ms * 1000.0 / replay_us).ceil() as u32).clamp(1, 1_000_000)
}

/// Launches per sample for a case whose slowest entry took `slowest_us` per execution.
pub fn launches_for(spec: &TimingSpec, slowest_us: f64) -> u32 {
    let max = spec.launches_per_sample.max(1);
    if spec.sample_target_us <= 0.0 || !slowest_us.is_finite() || slowest_us <= 0.0 {
        return max;
    }
    ((spec.sample_target_us / slowest_us).ceil() as u32).clamp(1, max)
}

/// How a case is sampled: executions per sample, samples of each entry per round, rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplePlan {
    pub per_sample: u32,
    pub samples_per_round: u32,
    pub rounds: u32,
}

/// The sampling of a case whose slowest entry took `slowest_us` per execution.
///
/// The accept rule pairs sample i of the candidate with sample i of the incumbent (the same
/// round), and clock drift cancels in a pair only when its samples are close in time: with 5
/// samples of 2 ms per kernel and round, pairs 10-16 ms apart kept 1.3-4.7% of noise on the
/// H200's large shapes, one sample per round 0.4-0.5% (BENCHMARKS 2026-11-29 (24)). So an
/// entry's samples in one round last at most about `sample_target_us` (at least one sample):
/// long kernels take one sample per round and more rounds, the same count of samples in all.
/// Short kernels keep `samples_per_round`: a round of them lasts well under a millisecond, and
/// samples that follow another kernel's are the ones whose inputs it evicted from L2 (when an
/// entry's inputs nearly fill the L2, one sample per round read an A/A pair 6% apart where 10
/// read 1%). Rounds are then cut to `max_entry_ms` of GPU time per entry, at least 2 (one in
/// each order), never more than the plan's.
pub fn sample_plan(spec: &TimingSpec, slowest_us: f64) -> SamplePlan {
    let per_sample = launches_for(spec, slowest_us);
    let configured = spec.samples_per_round.max(1);
    let sample_us = slowest_us * per_sample as f64;
    let valid = sample_us.is_finite() && sample_us > 0.0;
    let samples_per_round = if spec.sample_target_us > 0.0 && valid {
        ((spec.sample_target_us / sample_us).floor().max(1.0) as u32).min(configured)
    } else {
        configured
    };
    // The configured count of samples, in rounds of `samples_per_round`.
    let max = spec.rounds.max(1).saturating_mul(configured).div_ceil(samples_per_round);
    let per_round_us = sample_us * samples_per_round as f64;
    let rounds = if spec.max_entry_ms <= 0.0 || !valid {
        max
    } else {
        let fit = (spec.max_entry_ms * 1000.0 / per_round_us).floor();
        (fit.min(max as f64) as u32).max(2.min(max))
    };
    SamplePlan { per_sample, samples_per_round, rounds }
}

/// How many builds one `Precompile` asks for at most (the worker keeps that many waiting
/// for their `Load`).
pub const PRECOMPILE_SLOTS: usize = 8;

/// The defines that leave out of a build the kernels of every head dim the templates are
/// written for ([`crate::spec::config::HEAD_DIMS`]) but `head_dims` does not name:
/// `-DOPTD_BUILD_D<d>=0` (kernel-templates/common/optd.cuh). A run whose shapes share one
/// head dim compiles only its kernels per candidate (NVRTC 13.0, the Hopper template at
/// D 128 alone: 2.8 s of 4.8). Empty `head_dims`: every head dim is built.
pub fn head_dim_defines(head_dims: &[u32]) -> Vec<(&'static str, String)> {
    // One macro per head dim of HEAD_DIMS (a test checks the two lists agree).
    const MACROS: [(u32, &str); 4] = [(64, "OPTD_BUILD_D64"), (96, "OPTD_BUILD_D96"), (128, "OPTD_BUILD_D128"), (256, "OPTD_BUILD_D256")];
    if head_dims.is_empty() {
        return Vec::new();
    }
    MACROS.iter().filter(|(d, _)| !head_dims.contains(d)).map(|(_, name)| (*name, "0".to_string())).collect()
}

/// What a build holds: the kernels of the head dims of the shapes it is loaded for (empty:
/// all) and, unless no shape of the run has a sliding window, the window's code (run-wide:
/// `export` writes the run's choice into the exported sources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildScope {
    pub head_dims: Vec<u32>,
    pub windows: bool,
}

impl BuildScope {
    /// The NVRTC defines of this scope: [`head_dim_defines`], and `-DOPTD_BUILD_WINDOW=0`
    /// without windows (kernel-templates/common/optd.cuh: the window's tests fold away, and
    /// unwindowed calls run the code from before windows, 1-4% faster at some points).
    pub fn defines(&self) -> Vec<(&'static str, String)> {
        let mut d = head_dim_defines(&self.head_dims);
        if !self.windows {
            d.push(("OPTD_BUILD_WINDOW", "0".to_string()));
        }
        d
    }
}

/// A request from a daemon that predates windows builds the window's code (the default).
fn with_windows() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Describe the device. First request on every (re)started worker.
    Hello,
    /// Compile `source` (one build, CTA counting compiled in with `-DOPTD_COUNT_CTAS=1`:
    /// the kernels count when given a counter, which the check does and timing does not),
    /// load it, and report the resources of its `kernels`.
    Load {
        id: String,
        source: String,
        /// NVRTC target, e.g. `sm_90`, or `sm_90a` for arch-specific templates.
        arch: String,
        kernels: Vec<String>,
        /// Occupancy queries: (kernel, threads per block, dynamic smem bytes).
        occupancy: Vec<OccupancyQuery>,
        compile_timeout_ms: u64,
        /// The head dims whose kernels the build holds: those of the shapes it is loaded for
        /// (a candidate of one head dim compiles half the code of a run's two); empty: all
        /// ([`head_dim_defines`]).
        #[serde(default)]
        head_dims: Vec<u32>,
        /// Whether the builds hold the sliding window's code ([`BuildScope`]).
        #[serde(default = "with_windows")]
        windows: bool,
    },
    /// Run the candidate on fresh random inputs, counting its CTAs, smallest shape first; stop at the first failure.
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
    /// The builds the engine expects to `Load` next, soonest needed first (the candidate
    /// about to be loaded, the search's guesses, the next stage's start; the closing's
    /// re-rank: its contenders in loading order), at most [`PRECOMPILE_SLOTS`]. The worker
    /// answers at once and compiles them on a few threads, the soonest needed first; a later
    /// `Load` of the same source, arch and scope takes the result instead of compiling. Each
    /// list replaces the one before: a build no longer asked for is dropped if it has not
    /// started (`worker::compile_pool`).
    Precompile {
        builds: Vec<BuildAsk>,
        compile_timeout_ms: u64,
        /// Compile threads (`worker.compile_threads`; 0: the worker's choice,
        /// `worker::compile_pool::auto_threads`). A worker's pool only grows.
        #[serde(default)]
        threads: u32,
        /// As in `Load`: a later `Load` takes one of these builds only if it names the same
        /// head dims (the build's) and windows.
        #[serde(default = "with_windows")]
        windows: bool,
    },
    /// Drop a loaded module.
    Unload { id: String },
    Shutdown,
}

/// One build a [`Request::Precompile`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildAsk {
    pub source: String,
    /// NVRTC target, as in `Load`.
    pub arch: String,
    /// The head dims whose kernels the build holds, as the `Load` that takes it will name
    /// them (the shapes the candidate is loaded for).
    pub head_dims: Vec<u32>,
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
    /// How long the build took NVRTC (on a compile thread when the look-ahead asked for it;
    /// 0: built moments before and kept).
    pub compile_ms: f64,
    /// How long this load waited for its build: 0 when the look-ahead's was ready, the
    /// rest of it when still compiling, the whole build when it was not asked for ahead.
    #[serde(default)]
    pub waited_ms: f64,
    pub kernels: Vec<KernelResources>,
    pub occupancy: Vec<OccupancyResult>,
    /// NVRTC's log for the build (warnings), possibly empty.
    pub log: String,
}

/// From cuFuncGetAttribute on the loaded function.
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
    /// CTAs counted per launch (through the ABI's `cta_counter`), in launch order.
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
    /// Sustained timing (`TimingSpec::sustained_ms` > 0): per-execution microseconds of each
    /// round's back-to-back window. Empty when off (and in older workers' answers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sustained_us: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sliding window's keys, its row ranges, its FLOPs and its JSON: each row sees the
    /// last W keys up to its own position, bottom-right as the causal mask is.
    #[test]
    fn a_sliding_window_in_keys_ranges_pairs_and_json() {
        let gemma = Shape {
            hq: 8,
            hkv: 4,
            sq: 4096,
            sk: 4096,
            ..Shape::mha(1, 8, 4096, 256, true, DType::Bf16)
        }
        .with_window(Some(1024));
        assert_eq!(gemma.key(), "b1hq8hkv4s4096d256-causal-w1024-bf16");
        assert_eq!(gemma.visible_range(0), 0..1);
        assert_eq!(gemma.visible_range(1023), 0..1024);
        assert_eq!(gemma.visible_range(1024), 1..1025);
        assert_eq!(gemma.visible_range(4095), 3072..4096);
        let chunk = Shape {
            sq: 300,
            sk: 1500,
            ..Shape::mha(1, 2, 1500, 64, true, DType::Fp16)
        }
        .with_window(Some(256));
        assert_eq!(
            chunk.visible_range(0),
            1200 - 255..1201,
            "row 0 is position 1200"
        );
        assert_eq!(
            Shape::mha(1, 2, 100, 64, true, DType::Fp16)
                .with_window(Some(1000))
                .visible_range(99),
            0..100,
            "W >= SK masks nothing"
        );
        let decode = Shape {
            sq: 1,
            sk: 16384,
            ..Shape::mha(8, 8, 16384, 128, true, DType::Bf16)
        };
        assert_eq!(
            decode.with_window(Some(1024)).kv_bytes() * 16,
            decode.kv_bytes(),
            "decode reads the window's keys only"
        );
        // The closed form of visible_pairs is the sum of the rows' ranges, windows or not.
        for (sq, sk, w) in [
            (4096, 4096, Some(1024)),
            (300, 1500, Some(256)),
            (300, 1500, Some(1400)),
            (1, 16384, Some(1024)),
            (7, 9, Some(1)),
            (100, 100, Some(1000)),
            (512, 4096, None),
        ] {
            let s = Shape {
                sq,
                sk,
                ..Shape::mha(1, 1, sk, 64, true, DType::Fp16)
            }
            .with_window(w);
            let sum: usize = (0..sq).map(|i| s.visible_range(i).len()).sum();
            assert_eq!(s.visible_pairs(), sum as f64, "sq {sq} sk {sk} w {w:?}");
        }
        // JSON: `window` only when there is one; a stored shape without it reads as none.
        let json = serde_json::to_value(gemma).unwrap();
        assert_eq!(json["window"], 1024);
        assert_eq!(serde_json::from_value::<Shape>(json).unwrap(), gemma);
        let plain = Shape::mha(1, 8, 128, 64, true, DType::Fp16);
        assert!(serde_json::to_value(plain).unwrap().get("window").is_none());
        let bad = |j: &str| serde_json::from_str::<Shape>(j).unwrap_err().to_string();
        assert!(
            bad(r#"{"b":1,"h":2,"s":8,"d":64,"dtype":"fp16","window":4}"#)
                .contains("must be causal")
        );
        assert!(
            bad(r#"{"b":1,"h":2,"s":8,"d":64,"causal":true,"dtype":"fp16","window":0}"#)
                .contains("at least 1")
        );
    }

    #[test]
    fn a_build_for_some_head_dims_leaves_out_the_others_and_none_named_means_all() {
        let off = |names: &[&'static str]| names.iter().map(|n| (*n, "0".to_string())).collect::<Vec<_>>();
        assert_eq!(head_dim_defines(&[128]), off(&["OPTD_BUILD_D64", "OPTD_BUILD_D96", "OPTD_BUILD_D256"]));
        assert_eq!(head_dim_defines(&[64]), off(&["OPTD_BUILD_D96", "OPTD_BUILD_D128", "OPTD_BUILD_D256"]));
        assert_eq!(head_dim_defines(&[96, 256]), off(&["OPTD_BUILD_D64", "OPTD_BUILD_D128"]));
        // A macro for every head dim the templates are written for, and no other.
        let all: Vec<String> = head_dim_defines(&[1]).into_iter().map(|(name, _)| name.to_string()).collect();
        let want: Vec<String> = crate::spec::config::HEAD_DIMS.iter().map(|d| format!("OPTD_BUILD_D{d}")).collect();
        assert_eq!(all, want);
        assert!(head_dim_defines(&[64, 96, 128, 256]).is_empty());
        assert!(head_dim_defines(&[]).is_empty());
    }

    #[test]
    fn a_load_without_head_dims_from_an_older_daemon_builds_every_head_dim() {
        let r: Request = serde_json::from_str(r#"{"op":"load","id":"a","source":"x","arch":"sm_90","kernels":[],"occupancy":[],"compile_timeout_ms":1}"#).unwrap();
        assert!(matches!(r, Request::Load { ref head_dims, windows: true, .. } if head_dims.is_empty()), "{r:?}");
        let r: Request = serde_json::from_str(r#"{"op":"precompile","builds":[{"source":"x","arch":"sm_90","head_dims":[]}],"compile_timeout_ms":1}"#).unwrap();
        assert!(matches!(r, Request::Precompile { windows: true, threads: 0, .. }), "{r:?}");
        // Without a windowed shape the builds leave the window's code out.
        let scope = BuildScope { head_dims: vec![64, 96, 128, 256], windows: false };
        assert_eq!(scope.defines(), [("OPTD_BUILD_WINDOW", "0".to_string())]);
        assert!(BuildScope { windows: true, ..scope }.defines().is_empty());
    }

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
            sustained_ms: 0.0,
        }
    }

    fn plan(s: &TimingSpec, us: f64) -> (u32, u32, u32) {
        let p = sample_plan(s, us);
        (p.per_sample, p.samples_per_round, p.rounds)
    }

    #[test]
    fn long_kernels_take_one_sample_per_round_and_fewer_rounds_but_at_least_two() {
        let s = TimingSpec { max_entry_ms: 500.0, ..spec(10, 2000.0) };
        assert_eq!(plan(&s, 5.0), (10, 10, 4), "5 us x 10 launches: 50 us a sample, the configured 4 rounds of 10");
        assert_eq!(plan(&s, 560.0), (4, 1, 40), "a 2.2-ms sample: one per round, the same 40 samples");
        assert_eq!(plan(&s, 12_000.0), (1, 1, 40), "12 ms a round: 40 fit in 500 ms");
        assert_eq!(plan(&s, 16_000.0), (1, 1, 31), "16 ms a round: 31 fit");
        assert_eq!(plan(&s, 300_000.0), (1, 1, 2), "300 ms a round: still two, one in each order");
        assert_eq!(plan(&spec(10, 2000.0), 58_000.0), (1, 1, 40), "max_entry_ms 0: no cut");
        assert_eq!(plan(&s, f64::NAN), (10, 10, 4));
        assert_eq!(plan(&TimingSpec { rounds: 1, samples_per_round: 1, ..s }, 58_000.0), (1, 1, 1), "never more than the plan's samples");
    }

    #[test]
    fn samples_per_round_shrink_until_a_round_lasts_about_the_sample_target() {
        let s = spec(10, 2000.0);
        assert_eq!(plan(&s, 50.0), (10, 4, 10), "500-us samples: 4 per round, 40 in all");
        assert_eq!(plan(&s, 27.0), (10, 7, 6), "270-us samples: 7 per round, ceil(40 / 7) rounds");
        assert_eq!(plan(&s, 150.0), (10, 1, 40), "1.5-ms samples: one per round");
        assert_eq!(plan(&spec(10, 0.0), 5000.0), (10, 10, 4), "sample_target_us 0: the configured plan");
        let one = TimingSpec { rounds: 20, samples_per_round: 1, ..s };
        assert_eq!(plan(&one, 5.0), (10, 1, 20), "never more per round than configured");
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
        assert_eq!((s.sample_target_us, s.graph, s.max_entry_ms, s.sustained_ms), (0.0, false, 0.0, 0.0));
        // A timed entry without sustained figures (an older worker) still parses, and one
        // without them is written as before.
        let e: TimedEntry = serde_json::from_str(r#"{"id":"it1","samples_us":[1.0]}"#).unwrap();
        assert!(e.sustained_us.is_empty());
        assert!(!serde_json::to_string(&e).unwrap().contains("sustained"));
    }

    #[test]
    fn a_sustained_window_lasts_at_least_the_asked_time() {
        assert_eq!(sustained_replays(200.0, 2000.0), 100, "2 ms replays: 100 make 200 ms");
        assert_eq!(sustained_replays(200.0, 3000.0), 67, "rounded up: 67 x 3 ms = 201 ms");
        assert_eq!(sustained_replays(200.0, 500_000.0), 1, "a replay longer than the window: one");
        assert_eq!(sustained_replays(200.0, f64::NAN), 1);
        assert_eq!(sustained_rounds(&spec(10, 2000.0)), 3);
        assert_eq!(sustained_rounds(&TimingSpec { rounds: 2, ..spec(10, 2000.0) }), 2);
    }
}
