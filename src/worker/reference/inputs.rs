//! The check's inputs and their encodings: seeded standard-normal values rounded to the
//! element type (deterministic whatever the thread count), their fp16/bf16 bit patterns
//! for upload and back, and the NaN patterns that poison outputs.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::parallel::par_chunks;
use crate::spec::protocol::{DType, Shape};

/// Elements per independently seeded chunk of generated input.
const GEN_CHUNK: usize = 1 << 16;

/// SplitMix64 finalizer: a good 64-bit mix for deriving independent seeds.
pub fn mix_seed(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Round an f32 to the nearest value representable in `dtype` (round-to-nearest-even).
pub fn round_to_dtype(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::Fp16 => half::f16::from_f32(x).to_f32(),
        DType::Bf16 => half::bf16::from_f32(x).to_f32(),
    }
}

/// Bit patterns of `values` in `dtype`, ready for upload (in parallel: a large shape's
/// Q, K and V are 100M values).
pub fn to_bits(values: &[f32], dtype: DType) -> Vec<u16> {
    let mut out = vec![0u16; values.len()];
    par_chunks(&mut out, GEN_CHUNK, |i, c| {
        let src = &values[i * GEN_CHUNK..][..c.len()];
        match dtype {
            DType::Fp16 => c.iter_mut().zip(src).for_each(|(b, &x)| *b = half::f16::from_f32(x).to_bits()),
            DType::Bf16 => c.iter_mut().zip(src).for_each(|(b, &x)| *b = half::bf16::from_f32(x).to_bits()),
        }
    });
    out
}

/// Values of `dtype` bit patterns as f32 (exact; in parallel).
pub fn from_bits(bits: &[u16], dtype: DType) -> Vec<f32> {
    let mut out = vec![0f32; bits.len()];
    par_chunks(&mut out, GEN_CHUNK, |i, c| {
        let src = &bits[i * GEN_CHUNK..][..c.len()];
        match dtype {
            DType::Fp16 => c.iter_mut().zip(src).for_each(|(x, &b)| *x = half::f16::from_bits(b).to_f32()),
            DType::Bf16 => c.iter_mut().zip(src).for_each(|(x, &b)| *x = half::bf16::from_bits(b).to_f32()),
        }
    });
    out
}

/// The quiet-NaN bit pattern used to poison outputs before a launch.
pub fn nan_bits(dtype: DType) -> u16 {
    match dtype {
        DType::Fp16 => 0x7E00,
        DType::Bf16 => 0x7FC0,
    }
}

/// The quiet-NaN bit pattern of an f32, used to poison fp32 partial buffers.
pub const NAN_BITS_F32: u32 = 0x7FC0_0000;

/// Standard-normal values rounded to `dtype`, deterministic in (`seed`, `stream`).
pub fn randn_rounded(len: usize, dtype: DType, seed: u64, stream: u64) -> Vec<f32> {
    let mut out = vec![0f32; len];
    let base = mix_seed(seed, stream);
    par_chunks(&mut out, GEN_CHUNK, |i, c| {
        let mut rng = StdRng::seed_from_u64(mix_seed(base, i as u64));
        for x in c.iter_mut() {
            *x = round_to_dtype(rng.sample::<f32, _>(StandardNormal), dtype);
        }
    });
    out
}

/// Fresh Q, K, V for `shape` in [B,H,S,D] layout: standard normal, rounded to the element type.
pub fn randn_inputs(shape: &Shape, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    // Logical [B,HQ,SQ,D] for Q and [B,HKV,SK,D] for K and V, whatever the layout:
    // the worker scatters them into the layout's strides when it uploads.
    let (nq, nkv) = (shape.q_elems() as usize, shape.kv_elems() as usize);
    let q = randn_rounded(nq, shape.dtype, seed, 1);
    let k = randn_rounded(nkv, shape.dtype, seed, 2);
    let v = randn_rounded(nkv, shape.dtype, seed, 3);
    (q, k, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::reference::test_shape as shape;

    #[test]
    fn inputs_are_rounded_deterministic_and_distinct() {
        let sh = shape(1, 2, 300, 64, false, DType::Fp16);
        let (q, k, v) = randn_inputs(&sh, 11);
        assert_eq!(q.len(), 300 * 2 * 64);
        for x in q.iter().chain(&k).chain(&v) {
            assert_eq!(*x, round_to_dtype(*x, DType::Fp16));
        }
        assert_ne!(q, k);
        assert_ne!(k, v);
        let (q2, _, _) = randn_inputs(&sh, 11);
        assert_eq!(q, q2);
        let (q3, _, _) = randn_inputs(&sh, 12);
        assert_ne!(q, q3);
        // Roughly standard normal.
        let n = q.len() as f64;
        let mean = q.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = q.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.05,
            "mean {mean} var {var}"
        );
        // bf16 rounding too.
        let big = randn_rounded(1000, DType::Bf16, 1, 1);
        assert!(big.iter().all(|&x| x == round_to_dtype(x, DType::Bf16)));
    }

    #[test]
    fn generation_is_independent_of_thread_count_boundaries() {
        // Chunks are seeded by index, so a longer tensor starts with the shorter one.
        let a = randn_rounded(GEN_CHUNK * 3 + 5, DType::Fp16, 9, 1);
        let b = randn_rounded(GEN_CHUNK * 5, DType::Fp16, 9, 1);
        assert_eq!(&a[..GEN_CHUNK * 3], &b[..GEN_CHUNK * 3]);
    }

    #[test]
    fn bits_round_trip_and_nan_patterns() {
        let vals = [0.0f32, -1.5, 3.25, 1024.0];
        for dt in [DType::Fp16, DType::Bf16] {
            assert_eq!(from_bits(&to_bits(&vals, dt), dt), vals.to_vec());
            assert!(from_bits(&[nan_bits(dt)], dt)[0].is_nan());
        }
        assert!(f32::from_bits(NAN_BITS_F32).is_nan());
        assert_eq!(to_bits(&[1.0], DType::Fp16), vec![0x3C00]);
        assert_eq!(to_bits(&[1.0], DType::Bf16), vec![0x3F80]);
    }


    #[test]
    fn seeds_mix() {
        assert_ne!(mix_seed(1, 0), mix_seed(1, 1));
        assert_ne!(mix_seed(1, 0), mix_seed(2, 0));
        assert_eq!(mix_seed(42, 3), mix_seed(42, 3));
    }
}
