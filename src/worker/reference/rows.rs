//! Which output rows the reference computes and the check compares (all of them for small
//! shapes, a stratified seeded sample beyond), and where a row sits in the logical
//! [B,HQ,SQ,D] (Q, O) or [B,HKV,SK,D] (K, V) tensors the reference reads.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::inputs::mix_seed;
use crate::spec::protocol::Shape;

/// One output row: (batch, query head, query index).
pub type Row = (u32, u32, u32);

/// Compare every row when the shape has at most this many rows (B*HQ*SQ).
pub const ALL_ROWS_LIMIT: u64 = 16384;
/// Beyond [`ALL_ROWS_LIMIT`], sample one row from each block of this many consecutive rows.
pub const SAMPLE_BLOCK: u32 = 16;
/// The rows to compare: all of them for small shapes (B*HQ*SQ <= 16384); otherwise, for
/// every (b, h), one random row from each block of 16 consecutive rows plus rows 0 and
/// SQ-1. Sorted, without duplicates, deterministic in `seed`.
pub fn select_rows(shape: &Shape, seed: u64) -> Vec<Row> {
    let (b, h, s) = (shape.b, shape.hq, shape.sq);
    let total = b as u64 * h as u64 * s as u64;
    let mut rows = Vec::new();
    if total <= ALL_ROWS_LIMIT {
        rows.reserve(total as usize);
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..s {
                    rows.push((bi, hi, i));
                }
            }
        }
        return rows;
    }
    let mut rng = StdRng::seed_from_u64(mix_seed(seed, 0x524F_5753));
    let mut per_head = Vec::with_capacity((s / SAMPLE_BLOCK + 3) as usize);
    for bi in 0..b {
        for hi in 0..h {
            per_head.clear();
            per_head.push(0);
            let mut start = 0u32;
            while start < s {
                let end = start.saturating_add(SAMPLE_BLOCK).min(s);
                per_head.push(rng.random_range(start..end));
                start = end;
            }
            per_head.push(s - 1);
            per_head.sort_unstable();
            per_head.dedup();
            rows.extend(per_head.iter().map(|&i| (bi, hi, i)));
        }
    }
    rows
}

/// Offset of the first element of `row` in the logical [B,HQ,SQ,D] Q or O.
pub fn row_offset(shape: &Shape, row: Row) -> usize {
    let (b, h, i) = row;
    (((b as usize * shape.hq as usize) + h as usize) * shape.sq as usize + i as usize)
        * shape.d as usize
}

/// Offset of key 0 of the KV head that query head `h` of batch `b` reads, in the
/// logical [B,HKV,SK,D] K or V (grouped-query: KV head h / (HQ / HKV)).
pub fn kv_head_offset(shape: &Shape, b: u32, h: u32) -> usize {
    let kvh = h / shape.group().max(1);
    ((b as usize * shape.hkv as usize) + kvh as usize) * shape.sk as usize * shape.d as usize
}

/// Keys query row `i` sees, `lo..hi`: all SK, or causal up to `i + SK - SQ` (the query
/// rows are the last SQ positions), and with a sliding window only the last `window` of
/// those ([`Shape::visible_range`]).
pub fn visible_keys(shape: &Shape, i: u32) -> std::ops::Range<usize> {
    shape.visible_range(i)
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::DType;
    use crate::worker::reference::test_shape as shape;

    #[test]
    fn row_selection_small_and_sampled() {
        let small = shape(2, 2, 4096, 64, false, DType::Fp16);
        assert_eq!(select_rows(&small, 1).len(), 16384);

        let big = shape(2, 4, 3000, 64, true, DType::Fp16);
        let rows = select_rows(&big, 5);
        assert!(rows == select_rows(&big, 5), "deterministic");
        assert!(rows != select_rows(&big, 6), "seed-dependent");
        for bi in 0..2 {
            for hi in 0..4 {
                let mine: Vec<u32> = rows
                    .iter()
                    .filter(|r| r.0 == bi && r.1 == hi)
                    .map(|r| r.2)
                    .collect();
                assert!(mine.windows(2).all(|w| w[0] < w[1]), "sorted, unique");
                assert_eq!(mine[0], 0);
                assert_eq!(*mine.last().unwrap(), 2999);
                for block in 0..3000u32.div_ceil(16) {
                    let lo = block * 16;
                    let hi = (lo + 16).min(3000);
                    assert!(
                        mine.iter().any(|&i| i >= lo && i < hi),
                        "block {block} sampled"
                    );
                }
                assert!(mine.len() <= 188 + 2);
            }
        }
    }

}
