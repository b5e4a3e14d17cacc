//! The check's inputs and their encodings: seeded standard-normal values rounded to the
//! element type and kept as their fp16/bf16 bit patterns (deterministic whatever the thread
//! count), widening to f32 and narrowing back, and the NaN patterns that poison outputs.
//!
//! Inputs stay 16-bit from generation to upload: a decode shape's K and V are 537M values,
//! 1 GB as bit patterns, and an f32 copy of them (2 GB, written and read once more to
//! narrow it) was most of a check's CPU time. The reference widens the K/V rows it reads.

use rand::rngs::SmallRng;
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

/// Widen `bits` (patterns of `dtype`) into `out` as f32, exactly; `out.len() == bits.len()`.
/// bf16 is the high half of an f32; fp16 goes through `half`'s slice conversion (F16C
/// where the CPU has it).
pub fn widen(bits: &[u16], dtype: DType, out: &mut [f32]) {
    debug_assert_eq!(bits.len(), out.len());
    match dtype {
        DType::Fp16 => {
            use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
            bits.reinterpret_cast::<half::f16>().convert_to_f32_slice(out);
        }
        DType::Bf16 => out.iter_mut().zip(bits).for_each(|(x, &b)| *x = f32::from_bits((b as u32) << 16)),
    }
}

/// Values of `dtype` bit patterns as f32 (exact; in parallel).
pub fn from_bits(bits: &[u16], dtype: DType) -> Vec<f32> {
    let mut out = vec![0f32; bits.len()];
    par_chunks(&mut out, GEN_CHUNK, |i, c| widen(&bits[i * GEN_CHUNK..][..c.len()], dtype, c));
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

/// Standard-normal values rounded to `dtype`, as its bit patterns, deterministic in
/// (`seed`, `stream`). Each chunk of [`GEN_CHUNK`] values has its own generator seeded by
/// its index, so the values do not depend on how many threads fill them. SmallRng
/// (xoshiro256++): a third faster per value than the ChaCha-based StdRng, and these are
/// test inputs, not secrets.
pub fn randn_bits(len: usize, dtype: DType, seed: u64, stream: u64) -> Vec<u16> {
    let mut out = vec![0u16; len];
    let base = mix_seed(seed, stream);
    par_chunks(&mut out, GEN_CHUNK, |i, c| {
        let mut rng = SmallRng::seed_from_u64(mix_seed(base, i as u64));
        match dtype {
            DType::Fp16 => c.iter_mut().for_each(|b| *b = half::f16::from_f32(rng.sample(StandardNormal)).to_bits()),
            DType::Bf16 => c.iter_mut().for_each(|b| *b = half::bf16::from_f32(rng.sample(StandardNormal)).to_bits()),
        }
    });
    out
}

/// Fresh Q, K, V for `shape` as bit patterns of its element type: standard normal, rounded.
pub fn randn_inputs(shape: &Shape, seed: u64) -> [Vec<u16>; 3] {
    // Logical [B,HQ,SQ,D] for Q and [B,HKV,SK,D] for K and V, whatever the layout:
    // the worker scatters them into the layout's strides when it uploads.
    let (nq, nkv) = (shape.q_elems() as usize, shape.kv_elems() as usize);
    [(nq, 1), (nkv, 2), (nkv, 3)].map(|(n, stream)| randn_bits(n, shape.dtype, seed, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::reference::test_shape as shape;

    #[test]
    fn inputs_are_deterministic_distinct_and_standard_normal() {
        for dt in [DType::Fp16, DType::Bf16] {
            let sh = shape(1, 2, 300, 64, false, dt);
            let [q, k, v] = randn_inputs(&sh, 11);
            assert_eq!(q.len(), 300 * 2 * 64);
            assert_eq!(k.len(), v.len());
            assert_ne!(q, k);
            assert_ne!(k, v);
            let [q2, _, _] = randn_inputs(&sh, 11);
            assert_eq!(q, q2);
            let [q3, _, _] = randn_inputs(&sh, 12);
            assert_ne!(q, q3);
            // Every pattern is a finite value of the type, and the values are roughly N(0, 1).
            let x = from_bits(&q, dt);
            assert!(x.iter().all(|v| v.is_finite()));
            assert_eq!(to_bits(&x, dt), q, "widening and narrowing round-trips the patterns");
            let n = x.len() as f64;
            let mean = x.iter().map(|&x| x as f64).sum::<f64>() / n;
            let var = x.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
            assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "{dt:?}: mean {mean} var {var}");
        }
    }

    #[test]
    fn generation_is_independent_of_thread_count_boundaries() {
        // Chunks are seeded by index, so a longer tensor starts with the shorter one.
        let a = randn_bits(GEN_CHUNK * 3 + 5, DType::Fp16, 9, 1);
        let b = randn_bits(GEN_CHUNK * 5, DType::Fp16, 9, 1);
        assert_eq!(&a[..GEN_CHUNK * 3], &b[..GEN_CHUNK * 3]);
    }

    /// `widen` is exact for every one of the 65536 patterns of both types (NaNs stay NaN),
    /// and agrees with `half`'s scalar conversion.
    #[test]
    fn widen_is_exact_for_every_pattern() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for dt in [DType::Fp16, DType::Bf16] {
            let mut out = vec![0f32; all.len()];
            widen(&all, dt, &mut out);
            for (&b, &x) in all.iter().zip(&out) {
                let want = match dt {
                    DType::Fp16 => half::f16::from_bits(b).to_f32(),
                    DType::Bf16 => half::bf16::from_bits(b).to_f32(),
                };
                assert!(x.to_bits() == want.to_bits() || (x.is_nan() && want.is_nan()), "{dt:?} {b:#06x}: {x} vs {want}");
            }
        }
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
