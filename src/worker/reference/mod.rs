//! The CPU side of the correctness check: random inputs, an fp32 reference, and the comparison.
//!
//! Inputs are drawn, with a seeded generator, from the distribution of a standard normal
//! rounded to the element type (fp16 or bf16), as its bit patterns; the reference
//! widens exactly those to f32, so it computes on the values the GPU sees. The reference
//! is plain softmax attention, `softmax(q kᵀ / sqrt(D)) v` with grouped-query heads (query
//! head h reads KV head h / (HQ / HKV)) and an optional causal mask (key `j > i + SK - SQ`
//! masked), computed
//! with max subtraction in fp32 (f64 for the softmax denominator), vectorized (AVX2 where
//! the CPU has it, chosen at run time), for a chosen set of output rows: every row for
//! small shapes, a stratified random sample beyond (one row from each block of 16 plus the
//! first and last row of every (batch, head)). [`compare()`] counts outputs the kernel never
//! wrote (still NaN-poisoned, or otherwise non-finite) over the whole tensor, and measures
//! the maximum absolute error and the relative L2 error over the compared rows.
//!
//! All work here is deterministic in the seed, whatever the number of threads.
//!
//! One file per job: `inputs` (generation, bit patterns), `rows` (which rows, where),
//! `attention` (the reference kernels), `compare` (the comparison), `layout` (logical
//! tensors to and from the strided buffers the kernels see), `parallel` (threads).

mod attention;
mod compare;
mod inputs;
mod layout;
mod parallel;
mod rows;

pub use self::attention::{reference_rows, softmax_scale};
pub use self::compare::{compare, Comparison};
pub use self::inputs::{
    from_bits, input_lens, mix_seed, nan_bits, randn_inputs, randn_inputs_into, to_bits, NAN_BITS_F32,
};
pub use self::layout::{gather, pitched_copy, scatter, Gathered, Pitched};
pub use self::rows::{kv_head_offset, row_offset, select_rows, visible_keys, Row, ALL_ROWS_LIMIT, SAMPLE_BLOCK};

/// A shape for the tests of this folder.
#[cfg(test)]
fn test_shape(b: u32, h: u32, s: u32, d: u32, causal: bool, dtype: crate::spec::protocol::DType) -> crate::spec::protocol::Shape {
    crate::spec::protocol::Shape::mha(b, h, s, d, causal, dtype)
}
