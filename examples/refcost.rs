//! The CPU cost of checking one large shape: generating Q, K and V (as the element type's
//! bit patterns) and the fp32 reference of the sampled rows, for the benchmark workload's
//! four large shapes and the largest decode shape of the LLM workload. The worker does this
//! for every candidate on every shape (twice with the rerun probe), so it bounds how many
//! candidates a minute the daemon can check.
//!
//!     cargo build --release --example refcost && ./target/release/examples/refcost
//!
//! Carry `target/release/examples/refcost` to the GPU machine to measure it on its cores
//! (docs/device-runs/2026-11-23-h100-causal-lpt.txt).

use std::time::Instant;

use optimizerd::spec::protocol::{DType, Layout, Shape, TensorName, ViewStrides};
use optimizerd::worker::reference as r;

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{threads} threads");
    let mut shapes: Vec<Shape> = [(2, 16, 8192, 128, false), (2, 16, 8192, 128, true), (4, 16, 4096, 64, false), (4, 16, 4096, 64, true)]
        .into_iter()
        .map(|(b, h, s, d, causal)| Shape::mha(b, h, s, d, causal, DType::Fp16))
        .collect();
    // Llama-3-8B decode at B 64: K and V are 268M values each.
    shapes.push(Shape { b: 64, hq: 32, hkv: 8, sq: 1, sk: 4096, d: 128, causal: false, window: None, dtype: DType::Bf16, layout: Layout::Bhsd });
    // The LLM workload's Llama-3-8B prefill and chunked prefill.
    shapes.push(Shape { b: 1, hq: 32, hkv: 8, sq: 4096, sk: 4096, d: 128, causal: true, window: None, dtype: DType::Bf16, layout: Layout::Bhsd });
    shapes.push(Shape { b: 1, hq: 32, hkv: 8, sq: 512, sk: 4096, d: 128, causal: true, window: None, dtype: DType::Bf16, layout: Layout::Bhsd });
    for shape in shapes {
        let t = Instant::now();
        let [q, k, v] = r::randn_inputs(&shape, 7);
        let generated = t.elapsed();
        let rows = r::select_rows(&shape, 7);
        let reference = r::reference_rows(&shape, &q, &k, &v, &rows);
        let referenced = t.elapsed();
        // Reading a result back: the output (here Q's bits stand in for it) gathered from the
        // contiguous and the padded view, widened and compared, as `finish_view` does.
        let mut read = Vec::new();
        for view in [ViewStrides::contiguous(&shape), ViewStrides::padded(&shape)] {
            let buffer = r::scatter(&shape, &view, TensorName::O, &q, r::nan_bits(shape.dtype)).into_owned();
            let t = Instant::now();
            let o = r::gather(&shape, &view, TensorName::O, &buffer, r::nan_bits(shape.dtype));
            let cmp = r::compare(&shape, &o.logical, &rows, &reference);
            read.push((t.elapsed(), cmp.rows_compared));
        }
        println!(
            "{}: randn {:?} ({} values), reference {:?} ({} rows, {} values), result read back {:?} contiguous, {:?} padded",
            shape.key(),
            generated,
            q.len() + k.len() + v.len(),
            referenced - generated,
            rows.len(),
            reference.len(),
            read[0].0,
            read[1].0,
        );
    }
}
