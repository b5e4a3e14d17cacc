//! Between the reference's logical tensors ([B,HQ,SQ,D] for Q and O, [B,HKV,SK,D] for K
//! and V, contiguous) and the strided buffers a kernel is launched on (either layout, or a
//! padded view into a wider tensor; see `ViewStrides`). Elements of a buffer that no view
//! index reaches (a padded view's gaps) hold a fill pattern: NaN in inputs, so a kernel
//! that reads them produces NaN; in O, a write there is caught by [`gather`].

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
/// placed at its strided positions, every other element `fill`.
pub fn scatter(shape: &Shape, view: &ViewStrides, t: TensorName, logical: &[u16], fill: u16) -> Vec<u16> {
    if is_logical(shape, view, t) {
        return logical.to_vec();
    }
    let d = shape.d as usize;
    let mut out = vec![fill; view.extent(shape, t) as usize];
    for_each_row(shape, view, t, |from, to| out[to..to + d].copy_from_slice(&logical[from..from + d]));
    out
}

/// Tensor `t` read back from its strided buffer.
pub struct Gathered {
    /// The tensor in logical order.
    pub logical: Vec<u16>,
    /// Elements outside the view (a padded view's gaps) that no longer hold the fill.
    pub outside_written: usize,
}

/// The logical tensor `t` out of `buffer` (laid out by `view`), and how many elements
/// outside the view changed from `fill`.
pub fn gather(shape: &Shape, view: &ViewStrides, t: TensorName, buffer: &[u16], fill: u16) -> Gathered {
    if is_logical(shape, view, t) {
        return Gathered { logical: buffer.to_vec(), outside_written: 0 };
    }
    let d = shape.d as usize;
    let (heads, rows) = shape.dims_of(t);
    let mut logical = vec![0u16; shape.b as usize * heads as usize * rows as usize * d];
    let mut inside = vec![false; buffer.len()];
    for_each_row(shape, view, t, |to, from| {
        logical[to..to + d].copy_from_slice(&buffer[from..from + d]);
        inside[from..from + d].iter_mut().for_each(|x| *x = true);
    });
    let outside_written = buffer.iter().zip(&inside).filter(|(&x, &inside)| !inside && x != fill).count();
    Gathered { logical, outside_written }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{DType, Layout};

    fn gqa(layout: Layout) -> Shape {
        Shape { b: 2, hq: 4, hkv: 2, sq: 3, sk: 5, d: 8, causal: true, dtype: DType::Bf16, layout }
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

    #[test]
    fn writes_outside_a_padded_view_are_counted() {
        let shape = gqa(Layout::Bshd);
        let view = ViewStrides::padded(&shape);
        let n = shape.q_elems() as usize;
        let mut buf = scatter(&shape, &view, TensorName::O, &vec![1u16; n], 0x7E00);
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
        assert_eq!(scatter(&shape, &view, TensorName::V, &logical, 0), logical);
        // bshd contiguous is a real permutation.
        let shape = gqa(Layout::Bshd);
        let view = ViewStrides::contiguous(&shape);
        assert_ne!(scatter(&shape, &view, TensorName::V, &logical, 0), logical);
    }
}
