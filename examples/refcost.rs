//! The CPU cost of checking one large shape: generating Q, K, V, the fp32 reference of the
//! sampled rows, and converting the inputs to fp16 bits, for the benchmark workload's four
//! large shapes. The worker does this for every candidate on every shape, so it bounds how
//! many candidates a minute the daemon can check.
//!
//!     cargo build --release --example refcost && ./target/release/examples/refcost
//!
//! Carry `target/release/examples/refcost` to the GPU machine to measure it on its cores
//! (docs/device-runs/2026-11-23-h100-causal-lpt.txt).

use std::time::Instant;

use optimizerd::spec::protocol::{DType, Shape};
use optimizerd::worker::reference as r;

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{threads} threads");
    for (b, h, s, d, causal) in [(2, 16, 8192, 128, false), (2, 16, 8192, 128, true), (4, 16, 4096, 64, false), (4, 16, 4096, 64, true)] {
        let shape = Shape::mha(b, h, s, d, causal, DType::Fp16);
        let t = Instant::now();
        let (q, k, v) = r::randn_inputs(&shape, 7);
        let generated = t.elapsed();
        let rows = r::select_rows(&shape, 7);
        let reference = r::reference_rows(&shape, &q, &k, &v, &rows);
        let referenced = t.elapsed();
        let bits = [&q, &k, &v].map(|x| r::to_bits(x, shape.dtype));
        let converted = t.elapsed();
        println!(
            "{}: randn {:?}, reference {:?} ({} rows, {} values), to_bits {:?} ({} values)",
            shape.key(),
            generated,
            referenced - generated,
            rows.len(),
            reference.len(),
            converted - referenced,
            bits.iter().map(Vec::len).sum::<usize>()
        );
    }
}
