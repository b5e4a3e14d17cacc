//! Between the reference's logical tensors ([B,HQ,SQ,D] for Q and O, [B,HKV,SK,D] for K
//! and V, contiguous) and the strided buffers a kernel is launched on (either layout, or a
//! padded view into a wider tensor; see `ViewStrides`). Elements of a buffer that no view
//! index reaches (a padded view's gaps) hold a fill pattern: NaN in inputs, so a kernel
//! that reads them produces NaN; in O, a write there is caught by [`gather`].

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::parallel::{par_chunks, par_count};
use crate::spec::protocol::{Shape, TensorName, ViewStrides};

/// Calls `f(logical offset, buffer offset)` for the first element of every row of
/// tensor `t` (each row is D contiguous elements in both).
fn for_each_row(shape: &Shape, view: &ViewStrides, t: TensorName, mut f: impl FnMut(usize, usize)) {
    let st = view.of(t);
    let (heads, rows) = shape.dims_of(t);
    let d = shape.d as usize;
    let mut logical = 0usize;
    for b in 0..shape.b as u64 {
        for h in 0..heads as u64 {
            let head = (b * st.b + h * st.h) as usize;
            for i in 0..rows as u64 {
                f(logical, head + (i * st.s) as usize);
                logical += d;
            }
        }
    }
}

/// Whether `view` lays tensor `t` out exactly as the logical tensor (no copy needed).
fn is_logical(shape: &Shape, view: &ViewStrides, t: TensorName) -> bool {
    let st = view.of(t);
    let (heads, rows) = shape.dims_of(t);
    let d = shape.d as u64;
    st.s == d && st.h == rows as u64 * d && st.b == heads as u64 * rows as u64 * d
}

/// The buffer of tensor `t` under `view`: `logical` (16-bit patterns, logical order)
/// placed at its strided positions, every other element `fill`. A view that is the logical
/// layout borrows `logical` (a decode shape's K is 268M elements: no copy). Batches whose
/// rows stay inside their own `stride_b` elements, as in every view the worker builds, are
/// filled on parallel threads.
pub fn scatter<'a>(shape: &Shape, view: &ViewStrides, t: TensorName, logical: &'a [u16], fill: u16) -> Cow<'a, [u16]> {
    if is_logical(shape, view, t) {
        return Cow::Borrowed(logical);
    }
    let d = shape.d as usize;
    let st = view.of(t);
    let (heads, rows) = shape.dims_of(t);
    let extent = view.extent(shape, t) as usize;
    let per_batch = heads as usize * rows as usize * d;
    let batch_span = (heads as u64 - 1) * st.h + (rows as u64 - 1) * st.s + d as u64;
    if shape.b > 1 && st.b >= batch_span {
        // Zeroed pages come lazily from the allocator; each thread fills its own batches
        // (gaps included) and so touches their pages itself: for a decode shape's 1-GB
        // padded K, one thread's fill of the whole buffer was as slow as the copy.
        let mut out = vec![0u16; extent];
        par_chunks(&mut out, st.b as usize, |b, batch| {
            batch.fill(fill);
            let logical = &logical[b * per_batch..][..per_batch];
            let mut from = 0usize;
            for h in 0..heads as u64 {
                for i in 0..rows as u64 {
                    let to = (h * st.h + i * st.s) as usize;
                    batch[to..to + d].copy_from_slice(&logical[from..from + d]);
                    from += d;
                }
            }
        });
        Cow::Owned(out)
    } else {
        let mut out = vec![fill; extent];
        for_each_row(shape, view, t, |from, to| out[to..to + d].copy_from_slice(&logical[from..from + d]));
        Cow::Owned(out)
    }
}

/// A copy of one tensor from a buffer laid out by one view into a buffer laid out by
/// another, as a single pitched 2D copy (the worker's cuMemcpy2D on the device): `height`
/// rows of `width` elements, `src_pitch` and `dst_pitch` elements apart. In elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pitched {
    pub width: u64,
    pub height: u64,
    pub src_pitch: u64,
    pub dst_pitch: u64,
}

/// Tensor `t` under strides `st` as `(width, pitch, height)` rows in one of two forms, both
/// enumerating the view's rows in the same (b, h, i) order: form 0, one row per (b, h, i)
/// of D elements, every head's rows one pitch apart and the heads and batches back to back
/// (bhsd and its padded view); form 1, one row per (b, i) holding every head's D elements
/// side by side (bshd and its padded view).
fn pitched_rows(shape: &Shape, view: &ViewStrides, t: TensorName, form: u8) -> Option<(u64, u64, u64)> {
    let st = view.of(t);
    let (heads, rows) = shape.dims_of(t);
    let (b, h, s, d) = (shape.b as u64, heads as u64, rows as u64, shape.d as u64);
    match form {
        0 if st.s >= d && st.h == s * st.s && st.b == h * st.h => Some((d, st.s, b * h * s)),
        1 if st.h == d && st.s >= h * d && st.b == s * st.s => Some((h * d, st.s, b * s)),
        _ => None,
    }
}

/// Tensor `t` copied from its buffer under `from` into a buffer under `to` (whose gaps
/// already hold the fill) as one pitched 2D copy, when both views have the same form of
/// rows (the contiguous and the padded view of one layout always do).
pub fn pitched_copy(shape: &Shape, from: &ViewStrides, to: &ViewStrides, t: TensorName) -> Option<Pitched> {
    (0..2).find_map(|form| {
        let (w, sp, n) = pitched_rows(shape, from, t, form)?;
        let (w2, dp, n2) = pitched_rows(shape, to, t, form)?;
        (w == w2 && n == n2).then_some(Pitched { width: w, height: n, src_pitch: sp, dst_pitch: dp })
    })
}

/// Tensor `t` read back from its strided buffer.
pub struct Gathered<'a> {
    /// The tensor in logical order (the buffer itself where the view is the logical layout).
    pub logical: Cow<'a, [u16]>,
    /// Elements outside the view (a padded view's gaps) that no longer hold the fill.
    pub outside_written: usize,
}

/// The logical tensor `t` out of `buffer` (laid out by `view`), and how many elements
/// outside the view changed from `fill`, on parallel threads: rows are copied in chunks,
/// and the changed gaps are the buffer's elements other than `fill` less those inside the
/// view (the views the worker builds never overlap themselves). Why parallel: a padded
/// view's O at Llama-3-8B prefill (B 1) is 25M elements, read back twice per check.
pub fn gather<'a>(shape: &Shape, view: &ViewStrides, t: TensorName, buffer: &'a [u16], fill: u16) -> Gathered<'a> {
    if is_logical(shape, view, t) {
        return Gathered { logical: Cow::Borrowed(buffer), outside_written: 0 };
    }
    let d = shape.d as usize;
    let st = view.of(t);
    let (heads, rows) = shape.dims_of(t);
    let (heads, rows) = (heads as usize, rows as usize);
    let mut logical = vec![0u16; shape.b as usize * heads * rows * d];
    let rows_per_chunk = (GATHER_CHUNK / d.max(1)).max(1);
    let inside_changed = AtomicUsize::new(0);
    par_chunks(&mut logical, rows_per_chunk * d.max(1), |c, out| {
        let mut changed = 0;
        for (j, row) in out.chunks_mut(d.max(1)).enumerate() {
            let r = c * rows_per_chunk + j;
            let (b, h, i) = (r / (heads * rows), r / rows % heads, r % rows);
            let from = b * st.b as usize + h * st.h as usize + i * st.s as usize;
            row.copy_from_slice(&buffer[from..from + d]);
            changed += row.iter().filter(|&&x| x != fill).count();
        }
        inside_changed.fetch_add(changed, Ordering::Relaxed);
    });
    let outside_written = par_count(buffer, GATHER_CHUNK, |&x| x != fill).saturating_sub(inside_changed.into_inner());
    Gathered { logical: Cow::Owned(logical), outside_written }
}

/// Elements per thread's share when gathering.
const GATHER_CHUNK: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{DType, Layout};

    fn gqa(layout: Layout) -> Shape {
        Shape { b: 2, hq: 4, hkv: 2, sq: 3, sk: 5, d: 8, causal: true, window: None, dtype: DType::Bf16, layout }
    }

    /// The device's pitched copy from the contiguous view to the padded one, done here on
    /// host buffers, gives the buffer `scatter` builds for the padded view (gaps included),
    /// in both layouts, for Q and K of a GQA shape with SQ != SK, and at B = 1, H = 1.
    #[test]
    fn a_pitched_copy_of_the_contiguous_view_is_the_padded_view() {
        let one = Shape { b: 1, hq: 1, hkv: 1, sq: 1, sk: 7, d: 16, causal: false, window: None, dtype: DType::Fp16, layout: Layout::Bhsd };
        for shape in Layout::ALL.into_iter().flat_map(|layout| [gqa(layout), Shape { layout, ..one }]) {
            let (from, to) = (ViewStrides::contiguous(&shape), ViewStrides::padded(&shape));
            for t in [TensorName::Q, TensorName::K, TensorName::V, TensorName::O] {
                let (heads, rows) = shape.dims_of(t);
                let n = (shape.b * heads * rows * shape.d) as usize;
                let logical: Vec<u16> = (1..=n as u16).collect();
                let src = scatter(&shape, &from, t, &logical, 0xFFFF);
                let p = pitched_copy(&shape, &from, &to, t).expect("the contiguous and padded views of one layout copy as 2D");
                let mut dst = vec![0xFFFFu16; to.extent(&shape, t) as usize];
                for r in 0..p.height as usize {
                    let (s, d, w) = (r * p.src_pitch as usize, r * p.dst_pitch as usize, p.width as usize);
                    dst[d..d + w].copy_from_slice(&src[s..s + w]);
                }
                assert_eq!(dst, scatter(&shape, &to, t, &logical, 0xFFFF).into_owned(), "{shape:?} {t:?}");
            }
        }
        // Views of different forms do not copy as one 2D copy.
        let s = gqa(Layout::Bhsd);
        let bshd = ViewStrides::contiguous(&Shape { layout: Layout::Bshd, ..s });
        assert_eq!(pitched_copy(&s, &ViewStrides::contiguous(&s), &bshd, TensorName::K), None);
    }

    /// Every layout and view round-trips, puts row (b, h, i) where the strides say, and
    /// fills the gaps.
    #[test]
    fn scatter_gather_round_trip_in_every_view() {
        for layout in Layout::ALL {
            let shape = gqa(layout);
            for view in [ViewStrides::contiguous(&shape), ViewStrides::padded(&shape)] {
                for t in [TensorName::Q, TensorName::K] {
                    let (heads, rows) = shape.dims_of(t);
                    let n = (shape.b * heads * rows * shape.d) as usize;
                    let logical: Vec<u16> = (0..n as u16).collect();
                    let buf = scatter(&shape, &view, t, &logical, 0xFFFF);
                    assert_eq!(buf.len() as u64, view.extent(&shape, t));
                    let st = view.of(t);
                    // Row (1, heads - 1, rows - 1) starts at its strided offset.
                    let last_row = (shape.b * heads * rows - 1) as usize * shape.d as usize;
                    let at = (st.b + (heads as u64 - 1) * st.h + (rows as u64 - 1) * st.s) as usize;
                    assert_eq!(buf[at], logical[last_row], "{layout} {t:?}");
                    let back = gather(&shape, &view, t, &buf, 0xFFFF);
                    assert_eq!(back.logical, logical, "{layout} {t:?}");
                    assert_eq!(back.outside_written, 0);
                    let gaps = buf.iter().filter(|&&x| x == 0xFFFF).count();
                    assert_eq!(gaps as u64, view.extent(&shape, t) - n as u64, "everything else is fill");
                }
            }
        }
    }

    /// The batches filled on parallel threads land exactly where one row after the other
    /// puts them, in every layout and view, batch counts that do not divide the threads
    /// included.
    #[test]
    fn batches_scattered_in_parallel_match_one_row_after_the_other() {
        for layout in Layout::ALL {
            for b in [2, 3, 7] {
                let shape = Shape { b, hq: 6, hkv: 3, sq: 5, sk: 9, d: 16, causal: false, window: None, dtype: DType::Fp16, layout };
                for view in [ViewStrides::contiguous(&shape), ViewStrides::padded(&shape)] {
                    for t in [TensorName::Q, TensorName::K, TensorName::O] {
                        let (heads, rows) = shape.dims_of(t);
                        let n = (shape.b * heads * rows * shape.d) as usize;
                        let logical: Vec<u16> = (0..n).map(|i| (i % 65_521) as u16).collect();
                        let mut want = vec![0xABCDu16; view.extent(&shape, t) as usize];
                        let d = shape.d as usize;
                        for_each_row(&shape, &view, t, |from, to| want[to..to + d].copy_from_slice(&logical[from..from + d]));
                        assert_eq!(scatter(&shape, &view, t, &logical, 0xABCD).as_ref(), want.as_slice(), "{layout} b {b} {t:?}");
                        // Gathered back on parallel threads: the rows, and the gaps written.
                        let mut inside = vec![false; want.len()];
                        for_each_row(&shape, &view, t, |_, to| inside[to..to + d].iter_mut().for_each(|x| *x = true));
                        let gaps: Vec<usize> = (0..want.len()).filter(|&i| !inside[i]).collect();
                        for &g in gaps.iter().step_by(7) {
                            want[g] = 1;
                        }
                        // An element inside the view that holds the fill is no gap written.
                        let first_row = (0..want.len()).find(|&i| inside[i]).unwrap();
                        want[first_row] = 0xABCD;
                        let back = gather(&shape, &view, t, &want, 0xABCD);
                        assert_eq!(back.outside_written, gaps.iter().step_by(7).count(), "{layout} b {b} {t:?}");
                        assert_eq!(back.logical[1..], logical[1..], "{layout} b {b} {t:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn writes_outside_a_padded_view_are_counted() {
        let shape = gqa(Layout::Bshd);
        let view = ViewStrides::padded(&shape);
        let n = shape.q_elems() as usize;
        let mut buf = scatter(&shape, &view, TensorName::O, &vec![1u16; n], 0x7E00).into_owned();
        let gap = buf.iter().position(|&x| x == 0x7E00).unwrap();
        buf[gap] = 3;
        assert_eq!(gather(&shape, &view, TensorName::O, &buf, 0x7E00).outside_written, 1);
    }

    /// bhsd contiguous is the logical order: no copy, nothing outside.
    #[test]
    fn contiguous_bhsd_is_the_logical_tensor() {
        let shape = gqa(Layout::Bhsd);
        let view = ViewStrides::contiguous(&shape);
        let logical: Vec<u16> = (0..shape.kv_elems() as u16).collect();
        assert!(matches!(scatter(&shape, &view, TensorName::V, &logical, 0), Cow::Borrowed(b) if b == logical.as_slice()));
        // bshd contiguous is a real permutation.
        let shape = gqa(Layout::Bshd);
        let view = ViewStrides::contiguous(&shape);
        assert_ne!(scatter(&shape, &view, TensorName::V, &logical, 0), logical);
    }
}
