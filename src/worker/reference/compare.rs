//! Comparing a GPU output with the reference: outputs never written (non-finite) counted
//! over the whole tensor, maximum absolute and relative L2 error over the compared rows.

use super::inputs::widen;
use super::parallel::par_count;
use super::rows::{row_offset, Row};
use crate::spec::protocol::{DType, Shape};

/// How a GPU output compares with the reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// Elements of the whole output that are NaN or infinite.
    pub unwritten: u64,
    /// Largest |out - ref| over the finite elements of the compared rows.
    pub max_abs: f64,
    /// ||out - ref|| / ||ref|| over the finite elements of the compared rows.
    pub rel_l2: f64,
    pub rows_compared: u64,
}

/// Compare the GPU output `out` (whole [B,H,S,D] tensor, as bit patterns of the shape's
/// element type) against `reference` (the rows of [`reference_rows`] for `rows`).
/// Non-finite outputs are counted in `unwritten` (over the whole tensor, on parallel
/// threads, from the bits) and left out of the error norms, so every field stays finite.
/// Only the compared rows are widened to f32: a prefill's O is ~17M values, its compared
/// rows ~1M.
pub fn compare(shape: &Shape, out: &[u16], rows: &[Row], reference: &[f32]) -> Comparison {
    let d = shape.d as usize;
    // Exponent all ones: infinity or NaN.
    let exp = match shape.dtype {
        DType::Fp16 => 0x7C00u16,
        DType::Bf16 => 0x7F80,
    };
    let unwritten = par_count(out, COUNT_CHUNK, |&b| b & exp == exp) as u64;
    let mut max_abs = 0f64;
    let mut err2 = 0f64;
    let mut ref2 = 0f64;
    let mut o = vec![0f32; d];
    for (r, &row) in reference.chunks(d.max(1)).zip(rows) {
        let off = row_offset(shape, row);
        let Some(bits) = out.get(off..off + d) else {
            continue;
        };
        widen(bits, shape.dtype, &mut o);
        for (&g, &want) in o.iter().zip(r) {
            let want = want as f64;
            ref2 += want * want;
            if g.is_finite() {
                let e = (g as f64 - want).abs();
                max_abs = max_abs.max(e);
                err2 += e * e;
            }
        }
    }
    let rel_l2 = if ref2 > 0.0 {
        (err2 / ref2).sqrt()
    } else {
        err2.sqrt()
    };
    Comparison {
        unwritten,
        max_abs: if max_abs.is_finite() {
            max_abs
        } else {
            f64::MAX
        },
        rel_l2: if rel_l2.is_finite() { rel_l2 } else { f64::MAX },
        rows_compared: rows.len() as u64,
    }
}

/// Elements per thread's share when counting unwritten outputs.
const COUNT_CHUNK: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::reference::test_shape as shape;
    use crate::worker::reference::to_bits;

    /// `compare` on `out` rounded to the shape's element type (every value below is exact).
    fn compare_f32(sh: &Shape, out: &[f32], rows: &[Row], reference: &[f32]) -> Comparison {
        compare(sh, &to_bits(out, sh.dtype), rows, reference)
    }

    #[test]
    fn compare_counts_nans_and_measures_errors() {
        let sh = shape(1, 1, 4, 2, false, DType::Fp16);
        let rows = vec![(0, 0, 0), (0, 0, 2)];
        let reference = vec![1.0, 2.0, 3.0, 4.0];
        let mut out = vec![f32::NAN; 8];
        // Row 0 exact, row 2 off by 0.5 in one element; rows 1 and 3 left NaN.
        out[0] = 1.0;
        out[1] = 2.0;
        out[4] = 3.5;
        out[5] = 4.0;
        let c = compare_f32(&sh, &out, &rows, &reference);
        assert_eq!(c.unwritten, 4);
        assert_eq!(c.rows_compared, 2);
        assert!((c.max_abs - 0.5).abs() < 1e-12);
        assert!((c.rel_l2 - 0.5 / 30f64.sqrt()).abs() < 1e-12);

        out[2] = f32::INFINITY;
        out[3] = 0.0;
        out[6] = 0.0;
        out[7] = 0.0;
        assert_eq!(compare_f32(&sh, &out, &rows, &reference).unwritten, 1);

        // A NaN inside a compared row keeps the norms finite (it is counted as unwritten).
        out[1] = f32::NAN;
        let c = compare_f32(&sh, &out, &rows, &reference);
        assert_eq!(c.unwritten, 2);
        assert!(c.max_abs.is_finite() && c.rel_l2.is_finite());
    }

}
