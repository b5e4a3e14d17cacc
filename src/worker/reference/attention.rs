//! The fp32 reference attention itself: `softmax(q kᵀ / sqrt(D)) v` with an optional
//! causal mask, rows of one head in blocks of eight, the same operations on every CPU
//! (AVX2 chosen at run time when present), spread over the CPU's threads.

use super::inputs::widen;
use super::parallel::threads;
use super::rows::{kv_head_offset, row_offset, visible_keys, Row};
use crate::spec::protocol::Shape;

/// The softmax scale the kernels receive: `1/sqrt(D)` as f32.
pub fn softmax_scale(shape: &Shape) -> f32 {
    1.0 / (shape.d as f32).sqrt()
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent lanes so the compiler can vectorize; D is a small multiple of 8.
    let mut acc = [0f32; 8];
    let (ca, ra) = a.split_at(a.len() - a.len() % 8);
    let (cb, rb) = b.split_at(ca.len());
    for (x, y) in ca.chunks_exact(8).zip(cb.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

/// Rows of one (batch, head) computed together: each K and V row is read once per block
/// instead of once per row (a large head's K and V are megabytes: one row at a time the
/// reference waited on memory).
const ROW_BLOCK: usize = 8;

/// What every block of one [`reference_rows`] call reads: the shape, the full logical
/// tensors as bit patterns of the shape's element type (Q [B,HQ,SQ,D], K and V
/// [B,HKV,SK,D]) and the softmax scale.
#[derive(Clone, Copy)]
struct Operands<'a> {
    shape: &'a Shape,
    q: &'a [u16],
    k: &'a [u16],
    v: &'a [u16],
    scale: f32,
}

/// A thread's buffers, reused from block to block: the scores, the P V accumulators, the
/// block's Q rows widened to f32, and the K and V rows of the last KV head it read, widened
/// (the first `kv_done` keys of the head at `kv_at`). Rows come sorted by (batch, head, row),
/// so a thread's consecutive blocks are mostly one head's, or one GQA group's: each K/V
/// element is widened about once per thread that reads it, not once per block.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    acc: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    kv_at: Option<usize>,
    kv_done: usize,
}

impl Scratch {
    /// Widen keys `kv_done..kv_max` of the KV head at `head_base` (its first after a
    /// change of head), so `self.k` and `self.v` hold at least its first `kv_max` rows.
    fn widen_kv(&mut self, x: &Operands<'_>, head_base: usize, kv_max: usize) {
        let d = x.shape.d as usize;
        if self.kv_at != Some(head_base) {
            self.kv_at = Some(head_base);
            self.kv_done = 0;
        }
        if self.kv_done >= kv_max {
            return;
        }
        let (from, to) = (self.kv_done * d, kv_max * d);
        if self.k.len() < to {
            self.k.resize(to, 0.0);
            self.v.resize(to, 0.0);
        }
        widen(&x.k[head_base + from..head_base + to], x.shape.dtype, &mut self.k[from..to]);
        widen(&x.v[head_base + from..head_base + to], x.shape.dtype, &mut self.v[from..to]);
        self.kv_done = kv_max;
    }
}

/// Reference attention for up to [`ROW_BLOCK`] rows of one (batch, head) into `out`
/// (`rows.len() * D` values). fp32 throughout (the
/// products, the exponentials, the P V accumulation), the softmax denominator in f64.
/// Every row sees the same operations in the same order as if computed alone, on every
/// CPU (no fused multiply-add), so results depend neither on the blocking nor on the ISA.
#[inline(always)]
fn reference_block_impl(x: &Operands<'_>, rows: &[Row], scratch: &mut Scratch, out: &mut [f32]) {
    let shape = x.shape;
    let d = shape.d as usize;
    let n = rows.len().min(ROW_BLOCK);
    let head_base = kv_head_offset(shape, rows[0].0, rows[0].1);
    // Each row's keys lo..hi (a sliding window starts them after 0).
    let mut kv_lo = [0usize; ROW_BLOCK];
    let mut kv_len = [0usize; ROW_BLOCK];
    for ((lo, len), row) in kv_lo.iter_mut().zip(kv_len.iter_mut()).zip(&rows[..n]) {
        let r = visible_keys(shape, row.2);
        (*lo, *len) = (r.start, r.end);
    }
    let kv_max = kv_len[..n].iter().copied().max().unwrap_or(0);
    let kv_min = kv_lo[..n].iter().copied().min().unwrap_or(0);
    scratch.widen_kv(x, head_base, kv_max);
    scratch.q.resize(ROW_BLOCK * d, 0.0);
    for (r, row) in rows[..n].iter().enumerate() {
        widen(&x.q[row_offset(shape, *row)..][..d], shape.dtype, &mut scratch.q[r * d..][..d]);
    }
    let Scratch { scores, acc, q, k, v, .. } = scratch;
    let (k, v, scale) = (&k[..kv_max * d], &v[..kv_max * d], x.scale);
    let qrows: [&[f32]; ROW_BLOCK] = std::array::from_fn(|r| &q[r.min(n - 1) * d..][..d]);

    scores.clear();
    scores.resize(n * kv_max, 0.0);
    let mut max = [f32::NEG_INFINITY; ROW_BLOCK];
    for (j, krow) in k.chunks_exact(d).enumerate().skip(kv_min) {
        for r in 0..n {
            if kv_lo[r] <= j && j < kv_len[r] {
                let sc = dot(qrows[r], krow) * scale;
                max[r] = max[r].max(sc);
                scores[r * kv_max + j] = sc;
            }
        }
    }
    acc.clear();
    acc.resize(n * d, 0.0);
    let mut denom = [0f64; ROW_BLOCK];
    for (j, vrow) in v.chunks_exact(d).enumerate().skip(kv_min) {
        for r in 0..n {
            if kv_lo[r] <= j && j < kv_len[r] {
                let p = (scores[r * kv_max + j] - max[r]).exp();
                denom[r] += p as f64;
                for (a, &x) in acc[r * d..][..d].iter_mut().zip(vrow) {
                    *a += p * x;
                }
            }
        }
    }
    for r in 0..n {
        for (o, a) in out[r * d..][..d].iter_mut().zip(&acc[r * d..][..d]) {
            *o = (*a as f64 / denom[r]) as f32;
        }
    }
}

type BlockFn = fn(&Operands<'_>, &[Row], &mut Scratch, &mut [f32]);

/// [`reference_block_impl`] compiled for AVX2 (8-wide f32; the binary's baseline is SSE2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reference_block_avx2(x: &Operands<'_>, rows: &[Row], scratch: &mut Scratch, out: &mut [f32]) {
    reference_block_impl(x, rows, scratch, out)
}

/// The fastest [`reference_block_impl`] this CPU runs.
fn block_fn() -> BlockFn {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        fn avx2(x: &Operands<'_>, rows: &[Row], scratch: &mut Scratch, out: &mut [f32]) {
            // SAFETY: chosen only after the CPU was seen to support AVX2.
            unsafe { reference_block_avx2(x, rows, scratch, out) }
        }
        return avx2;
    }
    reference_block_impl
}

/// fp32 reference output for `rows`, concatenated (`rows.len() * D` values), computed in
/// parallel over rows. `q` is the full logical [B,HQ,SQ,D] tensor, `k` and `v` [B,HKV,SK,D],
/// all as bit patterns of `shape.dtype` (what the kernels read; widened here as needed).
pub fn reference_rows(shape: &Shape, q: &[u16], k: &[u16], v: &[u16], rows: &[Row]) -> Vec<f32> {
    let d = shape.d as usize;
    let mut out = vec![0f32; rows.len() * d];
    if rows.is_empty() || d == 0 {
        return out;
    }
    let x = Operands { shape, q, k, v, scale: softmax_scale(shape) };
    let block = block_fn();
    // Small tasks dealt round-robin, so the unequal cost of causal rows evens out.
    let workers = threads();
    let per_task = rows.len().div_ceil(workers * 8).max(1);
    let mut queues: Vec<Vec<(&mut [f32], &[Row])>> = (0..workers).map(|_| Vec::new()).collect();
    for (t, task) in out
        .chunks_mut(per_task * d)
        .zip(rows.chunks(per_task))
        .enumerate()
    {
        queues[t % workers].push(task);
    }
    std::thread::scope(|sc| {
        for queue in queues.into_iter().filter(|q| !q.is_empty()) {
            sc.spawn(move || {
                let mut scratch = Scratch::default();
                for (mut chunk_out, mut chunk_rows) in queue {
                    // Blocks of consecutive rows of one (batch, head).
                    while let Some(&(b, h, _)) = chunk_rows.first() {
                        let n = chunk_rows.iter().take(ROW_BLOCK).take_while(|r| (r.0, r.1) == (b, h)).count();
                        let (block_rows, rest_rows) = chunk_rows.split_at(n);
                        let (block_out, rest_out) = std::mem::take(&mut chunk_out).split_at_mut(n * d);
                        block(&x, block_rows, &mut scratch, block_out);
                        chunk_rows = rest_rows;
                        chunk_out = rest_out;
                    }
                }
            });
        }
    });
    out
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::DType;
    use crate::worker::reference::inputs::{from_bits, randn_inputs, to_bits};
    use crate::worker::reference::rows::select_rows;
    use crate::worker::reference::test_shape as shape;

    /// Straightforward per-row attention in f64 for cross-checking, on the widened inputs.
    fn naive(shape: &Shape, q: &[u16], k: &[u16], v: &[u16], row: Row) -> Vec<f64> {
        let [q, k, v] = [q, k, v].map(|x| from_bits(x, shape.dtype));
        let d = shape.d as usize;
        let base = kv_head_offset(shape, row.0, row.1);
        let qi = row_offset(shape, row);
        let keys = visible_keys(shape, row.2);
        let scale = 1.0 / (d as f64).sqrt();
        let s: Vec<f64> = keys
            .clone()
            .map(|j| {
                (0..d)
                    .map(|t| q[qi + t] as f64 * k[base + j * d + t] as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = p.iter().sum();
        (0..d)
            .map(|t| {
                keys.clone()
                    .enumerate()
                    .map(|(i, j)| p[i] * v[base + j * d + t] as f64)
                    .sum::<f64>()
                    / z
            })
            .collect()
    }

    #[test]
    fn hand_computed_two_keys() {
        // D = 1, S = 2: scores = q*k/1 = [0, 1.5]; softmax = [1, e^1.5] / (1 + e^1.5).
        let sh = shape(1, 1, 2, 1, false, DType::Fp16);
        let bits = |x: &[f32]| to_bits(x, DType::Fp16);
        let (q, k, v) = (bits(&[1.0, 0.0]), bits(&[0.0, 1.5]), bits(&[4.0, 8.0]));
        let out = reference_rows(&sh, &q, &k, &v, &[(0, 0, 0), (0, 0, 1)]);
        let e = 1.5f64.exp();
        assert!((out[0] as f64 - (4.0 + 8.0 * e) / (1.0 + e)).abs() < 1e-5, "{out:?}");
        // Row 1 has q = 0: uniform weights.
        assert!((out[1] - 6.0).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn causal_row_zero_equals_v0_and_matches_naive() {
        let sh = shape(2, 3, 37, 16, true, DType::Bf16);
        let [q, k, v] = randn_inputs(&sh, 7);
        let rows = select_rows(&sh, 7);
        assert_eq!(rows.len(), 2 * 3 * 37);
        let out = reference_rows(&sh, &q, &k, &v, &rows);
        for (r, &row) in out.chunks(16).zip(&rows) {
            let want = naive(&sh, &q, &k, &v, row);
            for (a, b) in r.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "{row:?}: {a} vs {b}");
            }
            if row.2 == 0 {
                let off = kv_head_offset(&sh, row.0, row.1);
                assert_eq!(r, &from_bits(&v[off..off + 16], sh.dtype)[..], "causal row 0 must equal v[0]");
            }
        }
    }

    #[test]
    fn non_causal_matches_naive() {
        let sh = shape(1, 2, 50, 64, false, DType::Fp16);
        let [q, k, v] = randn_inputs(&sh, 3);
        let rows = vec![(0, 0, 0), (0, 1, 49), (0, 1, 17)];
        let out = reference_rows(&sh, &q, &k, &v, &rows);
        for (r, &row) in out.chunks(64).zip(&rows) {
            let want = naive(&sh, &q, &k, &v, row);
            for (a, b) in r.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "{row:?}: {a} vs {b}");
            }
        }
    }

    /// Grouped heads, a causal offset (SQ < SK) and both element types: the K/V a thread
    /// widened for one block (another head of the group, shorter causal rows before longer
    /// ones, a new head after) give every row exactly what it gets alone, and match f64.
    #[test]
    fn grouped_rows_reuse_widened_kv_exactly() {
        for dt in [DType::Fp16, DType::Bf16] {
            let sh = Shape { hkv: 2, sq: 40, sk: 300, ..shape(2, 8, 300, 32, true, dt) };
            let [q, k, v] = randn_inputs(&sh, 21);
            let rows = select_rows(&sh, 4);
            assert_eq!(rows.len(), 2 * 8 * 40);
            let all = reference_rows(&sh, &q, &k, &v, &rows);
            for (i, &row) in rows.iter().enumerate().step_by(7) {
                let alone = reference_rows(&sh, &q, &k, &v, &[row]);
                assert_eq!(alone, all[i * 32..][..32], "{dt:?} {row:?} alone vs among the others");
                for (a, b) in alone.iter().zip(&naive(&sh, &q, &k, &v, row)) {
                    assert!((*a as f64 - b).abs() < 1e-5, "{dt:?} {row:?}: {a} vs {b}");
                }
            }
            // Reversed order: every block changes head, or starts shorter than the last.
            let back: Vec<Row> = rows.iter().rev().copied().collect();
            let rev = reference_rows(&sh, &q, &k, &v, &back);
            for (i, r) in rev.chunks(32).enumerate() {
                assert_eq!(r, &all[(rows.len() - 1 - i) * 32..][..32], "{dt:?} reversed row {i}");
            }
        }
    }

    /// A sliding window: each row's keys start W - 1 before its position (bottom-right, so a
    /// chunk's first row already has a full window), blocks of rows whose windows differ
    /// give each row what it gets alone, and every row matches f64 over its own keys.
    #[test]
    fn windowed_rows_see_only_their_window() {
        for (sq, sk, w) in [(200, 200, 17), (40, 300, 64), (3, 300, 1), (50, 60, 1000)] {
            let sh = Shape {
                hkv: 2,
                sq,
                sk,
                ..shape(1, 4, sk, 32, true, DType::Bf16)
            }
            .with_window(Some(w));
            let [q, k, v] = randn_inputs(&sh, 33);
            let rows = select_rows(&sh, 4);
            let all = reference_rows(&sh, &q, &k, &v, &rows);
            for (i, &row) in rows.iter().enumerate().step_by(5) {
                let alone = reference_rows(&sh, &q, &k, &v, &[row]);
                assert_eq!(
                    alone,
                    all[i * 32..][..32],
                    "w {w} {row:?} alone vs in a block"
                );
                for (a, b) in alone.iter().zip(&naive(&sh, &q, &k, &v, row)) {
                    assert!((*a as f64 - b).abs() < 1e-5, "w {w} {row:?}: {a} vs {b}");
                }
            }
        }
        // A window of one key: the row is its own position's V.
        let sh = shape(1, 1, 16, 32, true, DType::Fp16).with_window(Some(1));
        let [q, k, v] = randn_inputs(&sh, 2);
        let out = reference_rows(&sh, &q, &k, &v, &[(0, 0, 9)]);
        assert_eq!(out, from_bits(&v[9 * 32..10 * 32], DType::Fp16));
    }

    /// Long rows (fp32 accumulation over thousands of keys) stay within 1e-5 of the f64
    /// reference, and a row computed inside a block of eight is bit-identical to the row
    /// computed alone (blocking changes nothing but speed).
    #[test]
    fn long_rows_match_naive_and_blocking_is_exact() {
        for causal in [false, true] {
            let sh = shape(1, 2, 3000, 128, causal, DType::Bf16);
            let [q, k, v] = randn_inputs(&sh, 5);
            let rows = select_rows(&sh, 9);
            assert!(rows.len() > 300);
            let all = reference_rows(&sh, &q, &k, &v, &rows);
            for (i, &row) in rows.iter().enumerate().step_by(37) {
                let alone = reference_rows(&sh, &q, &k, &v, &[row]);
                assert_eq!(alone, all[i * 128..][..128], "{row:?} alone vs in a block");
                let want = naive(&sh, &q, &k, &v, row);
                for (a, b) in alone.iter().zip(&want) {
                    assert!((*a as f64 - b).abs() < 1e-5, "causal {causal} {row:?}: {a} vs {b}");
                }
            }
        }
    }

}
