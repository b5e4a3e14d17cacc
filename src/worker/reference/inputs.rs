//! The check's inputs and their encodings: seeded standard-normal values rounded to the
//! element type and kept as their fp16/bf16 bit patterns (deterministic whatever the thread
//! count), widening to f32 and narrowing back, and the NaN patterns that poison outputs.
//!
//! Inputs stay 16-bit from generation to upload: a decode shape's K and V are 537M values,
//! 1 GB as bit patterns, and an f32 copy of them (2 GB, written and read once more to
//! narrow it) was most of a check's CPU time. The reference widens the K/V rows it reads.
//!
//! The values are drawn straight as bit patterns from the distribution of a standard normal
//! rounded to the element type ([`Sampler`]: Walker's alias method over the type's patterns),
//! not as f32 normals rounded one by one: the same distribution (each pattern's probability
//! to within 2^-30), ~4x fewer CPU cycles per value. A check draws its inputs twice per
//! shape (the rerun probe's are new), and at Llama-3's B 64 decode that was 1.07G values,
//! most of a decode candidate's ~2.7 s check on the H200 (2026-11-30).

use std::sync::OnceLock;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

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
/// (xoshiro256++): these are test inputs, not secrets.
pub fn randn_bits(len: usize, dtype: DType, seed: u64, stream: u64) -> Vec<u16> {
    let mut out = vec![0u16; len];
    randn_fill(&mut out, dtype, seed, stream);
    out
}

/// [`randn_bits`] into `out` (whatever it held): the same values for the same length.
pub fn randn_fill(out: &mut [u16], dtype: DType, seed: u64, stream: u64) {
    let base = mix_seed(seed, stream);
    let sampler = Sampler::of(dtype);
    par_chunks(out, GEN_CHUNK, |i, c| {
        let mut rng = SmallRng::seed_from_u64(mix_seed(base, i as u64));
        sampler.fill(&mut rng, c);
    });
}

/// Bit patterns drawn from the distribution of `round(x)`, x standard normal, rounded to
/// nearest (even) in the element type: Walker's alias method over the type's patterns.
///
/// Every finite pattern whose rounding interval holds at least [`MIN_MASS`] of the normal's
/// probability gets it (bf16: 11,250 patterns, |x| up to ~8; fp16 ~39,000), the rest is
/// renormalised away (~1e-11 in all). The table has a power-of-two number of buckets, each
/// holding one pattern's probability up to 1 / buckets and another's for the rest, so a draw
/// is a uniform bucket index and a 16-bit threshold: two draws per 64-bit random word, one
/// table read each. Each bucket's split is rounded to 1 / 65536 of its share, so the table's
/// distribution is within 2^-17 of the exact one in total variation (tested): far below
/// anything a check's sample of values could show.
pub(crate) struct Sampler {
    /// Per bucket: the threshold under which the low 16 bits keep `own`, then `own` and
    /// `alias` (bit patterns); 8 bytes, one read.
    buckets: Vec<[u16; 4]>,
    /// log2 of the bucket count (at most 16: the index is the high bits of a 32-bit draw
    /// above the 16 threshold bits).
    log2: u32,
}

/// Patterns of less probability than this are left out: those beyond ~8 sigma (the normal's
/// mass out there is ~1e-15 in all).
const MIN_MASS: f64 = 1e-15;

impl Sampler {
    /// The sampler of `dtype`, built once per process (~40k patterns' masses: milliseconds).
    pub(crate) fn of(dtype: DType) -> &'static Sampler {
        static FP16: OnceLock<Sampler> = OnceLock::new();
        static BF16: OnceLock<Sampler> = OnceLock::new();
        match dtype {
            DType::Fp16 => FP16.get_or_init(|| Sampler::build(&rounded_normal_masses(DType::Fp16))),
            DType::Bf16 => BF16.get_or_init(|| Sampler::build(&rounded_normal_masses(DType::Bf16))),
        }
    }

    /// Walker's construction over `(pattern, probability)` (probabilities summing to 1).
    fn build(masses: &[(u16, f64)]) -> Sampler {
        let log2 = masses.len().next_power_of_two().trailing_zeros().max(1);
        assert!(log2 <= 16, "{} patterns do not fit 16-bit bucket indices", masses.len());
        let n = 1usize << log2;
        // Scaled so that a bucket holds 1: buckets past the patterns start empty.
        let mut scaled: Vec<f64> = (0..n).map(|i| masses.get(i).map_or(0.0, |m| m.1 * n as f64)).collect();
        let own: Vec<u16> = (0..n).map(|i| masses.get(i).map_or(0, |m| m.0)).collect();
        let mut alias: Vec<usize> = (0..n).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| scaled[i] < 1.0);
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            alias[s] = l;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // What is left on either list holds 1 up to rounding: it keeps its own pattern.
        for i in small.into_iter().chain(large) {
            debug_assert!((scaled[i] - 1.0).abs() < 1e-6, "bucket {i} left with {}", scaled[i]);
            scaled[i] = 1.0;
            alias[i] = i;
        }
        let buckets = (0..n)
            .map(|i| {
                // A bucket keeps its own pattern when the 16 threshold bits are below this; a
                // full bucket aliases itself, so its threshold does not matter.
                let t = if alias[i] == i { u16::MAX } else { (scaled[i] * 65536.0).round().min(65535.0) as u16 };
                [t, own[i], own[alias[i]], 0]
            })
            .collect();
        Sampler { buckets, log2 }
    }

    /// Fill `out` with draws, two per 64-bit word of `rng`.
    pub(crate) fn fill(&self, rng: &mut impl RngCore, out: &mut [u16]) {
        let shift = 32 - self.log2;
        let draw = |w: u32| {
            let b = self.buckets[(w >> shift) as usize];
            if (w as u16) < b[0] {
                b[1]
            } else {
                b[2]
            }
        };
        let mut pairs = out.chunks_exact_mut(2);
        for pair in &mut pairs {
            let z = rng.next_u64();
            pair[0] = draw(z as u32);
            pair[1] = draw((z >> 32) as u32);
        }
        if let [last] = pairs.into_remainder() {
            *last = draw(rng.next_u32());
        }
    }

    /// Each pattern's probability as the table gives it (for tests): the sum over buckets
    /// of its share of each.
    #[cfg(test)]
    fn probabilities(&self) -> std::collections::HashMap<u16, f64> {
        let mut p = std::collections::HashMap::new();
        let n = self.buckets.len() as f64;
        for b in &self.buckets {
            let keep = if b[1] == b[2] { 1.0 } else { f64::from(b[0]) / 65536.0 };
            *p.entry(b[1]).or_insert(0.0) += keep / n;
            *p.entry(b[2]).or_insert(0.0) += (1.0 - keep) / n;
        }
        p
    }
}

/// Every finite pattern of `dtype` with its probability under round-to-nearest of a standard
/// normal (the mass of the interval between its midpoints with its neighbours: ties have
/// measure zero), those of at least [`MIN_MASS`], renormalised.
fn rounded_normal_masses(dtype: DType) -> Vec<(u16, f64)> {
    let (value, max_finite): (fn(u16) -> f64, u16) = match dtype {
        DType::Fp16 => (|b| f64::from(half::f16::from_bits(b).to_f32()), 0x7BFF),
        DType::Bf16 => (|b| f64::from(half::bf16::from_bits(b).to_f32()), 0x7F7F),
    };
    let mut out = Vec::new();
    for b in 0..=max_finite {
        let x = value(b);
        let lo = if b == 0 { 0.0 } else { (value(b - 1) + x) / 2.0 };
        // The largest finite value keeps everything above it that rounds to it; the normal's
        // mass there is nil.
        let hi = if b == max_finite { x } else { (x + value(b + 1)) / 2.0 };
        let mass = normal_mass(lo, hi);
        if mass >= MIN_MASS {
            // Positive patterns, and their negatives (the sign bit) with the mirrored interval.
            out.push((b, mass));
            out.push((b | 0x8000, mass));
        }
    }
    let total: f64 = out.iter().map(|m| m.1).sum();
    out.iter_mut().for_each(|m| m.1 /= total);
    out
}

/// The standard normal's probability of [lo, hi] (0 <= lo <= hi): composite Simpson over the
/// density. A pattern's rounding interval is narrow (bf16's widest is 1/128 of its value, at
/// most 0.03 where the mass is not negligible) and the density smooth across it: 16 panels
/// leave a relative error far below the table's 2^-17.
fn normal_mass(lo: f64, hi: f64) -> f64 {
    if hi <= lo || lo > 40.0 {
        return 0.0;
    }
    let hi = hi.min(40.0);
    let pdf = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    const PANELS: usize = 16;
    let h = (hi - lo) / PANELS as f64;
    let inner: f64 = (1..PANELS).map(|i| pdf(lo + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum();
    (pdf(lo) + pdf(hi) + inner) * h / 3.0
}

/// Fresh Q, K, V for `shape` as bit patterns of its element type: standard normal, rounded.
pub fn randn_inputs(shape: &Shape, seed: u64) -> [Vec<u16>; 3] {
    // Logical [B,HQ,SQ,D] for Q and [B,HKV,SK,D] for K and V, whatever the layout:
    // the worker scatters them into the layout's strides when it uploads.
    let (nq, nkv) = (shape.q_elems() as usize, shape.kv_elems() as usize);
    [(nq, 1), (nkv, 2), (nkv, 3)].map(|(n, stream)| randn_bits(n, shape.dtype, seed, stream))
}

/// How many elements [`randn_inputs`] draws for Q, K and V of `shape`.
pub fn input_lens(shape: &Shape) -> [usize; 3] {
    let (nq, nkv) = (shape.q_elems() as usize, shape.kv_elems() as usize);
    [nq, nkv, nkv]
}

/// [`randn_inputs`] into buffers the caller keeps (of [`input_lens`]' lengths): the same
/// values, without faulting in a gigabyte of fresh pages per draw.
pub fn randn_inputs_into(shape: &Shape, seed: u64, [q, k, v]: [&mut [u16]; 3]) {
    debug_assert_eq!([q.len(), k.len(), v.len()], input_lens(shape));
    for (out, stream) in [(q, 1), (k, 2), (v, 3)] {
        randn_fill(out, shape.dtype, seed, stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::reference::test_shape as shape;

    #[test]
    fn inputs_drawn_into_kept_buffers_are_the_fresh_draw() {
        // A kept buffer holds the last draw (here a larger shape's, then garbage): what
        // is drawn into it must not depend on that.
        let (big, small) = (shape(2, 4, 600, 64, true, DType::Bf16), shape(1, 2, 300, 64, false, DType::Bf16));
        let mut store = vec![0xABCDu16; input_lens(&big).iter().sum()];
        for (sh, seed) in [(big, 3), (small, 4), (big, 5)] {
            let [nq, nk, _] = input_lens(&sh);
            let (q, rest) = store.split_at_mut(nq);
            let (k, rest) = rest.split_at_mut(nk);
            randn_inputs_into(&sh, seed, [q, k, &mut rest[..nk]]);
            let fresh = randn_inputs(&sh, seed);
            assert_eq!(&store[..nq], fresh[0].as_slice());
            assert_eq!(&store[nq..nq + nk], fresh[1].as_slice());
            assert_eq!(&store[nq + nk..nq + 2 * nk], fresh[2].as_slice());
        }
    }

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


    /// Each pattern's mass is the normal's probability of its rounding interval: the patterns
    /// of |x| <= 1 together hold erf((1 + step / 2) / sqrt 2), step the spacing above 1.0
    /// (values from Python's math.erf); and the alias table gives every pattern its mass to
    /// within 2^-17 in total variation.
    #[test]
    fn the_sampler_gives_each_pattern_the_rounded_normal_probability() {
        for (dt, within_one) in [(DType::Bf16, 0.6845761962515293), (DType::Fp16, 0.6829257339824351)] {
            let masses = rounded_normal_masses(dt);
            let total: f64 = masses.iter().map(|m| m.1).sum();
            assert!((total - 1.0).abs() < 1e-12, "{dt:?}: {total}");
            let value = |b: u16| from_bits(&[b], dt)[0];
            let inside: f64 = masses.iter().filter(|m| value(m.0).abs() <= 1.0).map(|m| m.1).sum();
            assert!((inside - within_one).abs() < 1e-9, "{dt:?}: {inside} vs {within_one}");
            assert!(masses.iter().all(|m| value(m.0).is_finite()));
            let table = Sampler::of(dt).probabilities();
            let tv = 0.5 * masses.iter().map(|m| (table.get(&m.0).copied().unwrap_or(0.0) - m.1).abs()).sum::<f64>();
            assert!(tv < 2f64.powi(-17), "{dt:?}: total variation {tv}");
            let known: std::collections::HashSet<u16> = masses.iter().map(|m| m.0).collect();
            assert!(table.iter().all(|(b, p)| known.contains(b) || *p == 0.0), "{dt:?}: a pattern outside the distribution");
        }
    }

    /// Drawn values have the normal's tails: P(|x| > 3) = 0.0027, and values beyond 4.5
    /// sigma (6.8e-6 of them) do occur.
    #[test]
    fn drawn_values_have_the_normal_tails() {
        let n = 1 << 23;
        for dt in [DType::Bf16, DType::Fp16] {
            let x = from_bits(&randn_bits(n, dt, 5, 1), dt);
            let frac = |t: f32| x.iter().filter(|v| v.abs() > t).count() as f64 / n as f64;
            // Rounding moves the threshold by at most half a step (bf16: 2^-7 at 3).
            assert!((frac(3.0) - 0.0026998).abs() < 0.0003, "{dt:?}: {}", frac(3.0));
            let far = x.iter().filter(|v| v.abs() > 4.5).count();
            assert!((20..120).contains(&far), "{dt:?}: {far} values beyond 4.5 (57 expected)");
        }
    }

    #[test]
    fn seeds_mix() {
        assert_ne!(mix_seed(1, 0), mix_seed(1, 1));
        assert_ne!(mix_seed(1, 0), mix_seed(2, 0));
        assert_eq!(mix_seed(42, 3), mix_seed(42, 3));
    }
}
