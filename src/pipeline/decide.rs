//! Decide: from interleaved timing samples, is the candidate faster than the
//! incumbent beyond the measured noise?
//!
//! Samples come from one worker process, candidate and incumbent alternating in
//! order round by round (worker/cuda/timing.rs), so sample i of one and sample i of
//! the other were taken moments apart, in the same round. The decision is paired:
//! the speedup is the median of the per-pair ratios incumbent_i / candidate_i, and
//! the noise half their p10..p90 band over that median. Drift that moves both
//! kernels alike (a GPU warming from idle into its power cap while the samples are
//! taken) cancels in each ratio; judged from each kernel's own spread, it made the
//! large shapes' noise 4-8% in a 20-minute run, so a 3% gain there never counted
//! (scripts/decide_noise.py, BENCHMARKS 2026-11-29 (23)). A gain must exceed both the
//! noise and the configured floor (`min_gain`, ~2%: results within that flip between
//! fresh processes). Samples that cannot be paired (unequal counts, too few) are
//! compared by their medians, each kernel's spread as the noise.

use serde::{Deserialize, Serialize};

/// Summary of one kernel's samples on one shape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub samples: usize,
}

impl Stats {
    /// None when there are no finite samples.
    pub fn from_samples(samples: &[f64]) -> Option<Stats> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Stats { median_us: quantile(&v, 0.5), p10_us: quantile(&v, 0.1), p90_us: quantile(&v, 0.9), samples: v.len() })
    }

    /// (p90 - p10) / median.
    pub fn rel_spread(&self) -> f64 {
        (self.p90_us - self.p10_us) / self.median_us
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ShapeDecision {
    /// How many times faster the candidate is (> 1: faster): the median of the paired
    /// ratios incumbent_i / candidate_i, or the ratio of the medians where samples do not pair.
    pub speedup: f64,
    /// The gain the candidate had to beat: max(min_gain, noise).
    pub threshold: f64,
    pub wins: bool,
}

/// The fewest pairs a paired decision is made from (the screen's brief timing has 4).
const MIN_PAIRS: usize = 4;

/// Is the candidate faster than the incumbent beyond noise, from their interleaved
/// samples (paired where they pair, see the module's doc)? None when either has no
/// finite sample.
pub fn decide_samples(candidate: &[f64], incumbent: &[f64], min_gain: f64) -> Option<ShapeDecision> {
    if let Some(ratios) = paired_ratios(candidate, incumbent) {
        let r = Stats::from_samples(&ratios)?;
        let threshold = min_gain.max(0.5 * r.rel_spread());
        return Some(ShapeDecision { speedup: r.median_us, threshold, wins: r.median_us > 1.0 + threshold });
    }
    Some(decide_shape(&Stats::from_samples(candidate)?, &Stats::from_samples(incumbent)?, min_gain))
}

/// incumbent_i / candidate_i over the pairs where both are valid times; None when the
/// two were not sampled in step (different counts) or fewer than MIN_PAIRS pairs remain.
fn paired_ratios(candidate: &[f64], incumbent: &[f64]) -> Option<Vec<f64>> {
    if candidate.len() != incumbent.len() {
        return None;
    }
    let ok = |x: f64| x.is_finite() && x > 0.0;
    let ratios: Vec<f64> = candidate.iter().zip(incumbent).filter(|(c, i)| ok(**c) && ok(**i)).map(|(c, i)| i / c).collect();
    (ratios.len() >= MIN_PAIRS).then_some(ratios)
}

/// The unpaired decision from two kernels' summaries: the ratio of their medians against
/// half the p10..p90 band of the noisier one.
pub fn decide_shape(candidate: &Stats, incumbent: &Stats, min_gain: f64) -> ShapeDecision {
    let speedup = incumbent.median_us / candidate.median_us;
    // Half the p10..p90 band of the noisier kernel: a one-sided bound on how far a
    // median can move between identical kernels.
    let noise = 0.5 * candidate.rel_spread().max(incumbent.rel_spread());
    let threshold = min_gain.max(noise);
    ShapeDecision { speedup, threshold, wins: speedup > 1.0 + threshold }
}

/// Geometric mean of positive values (the search's score across shapes).
pub fn geomean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.into_iter().filter(|v| *v > 0.0).fold((0.0, 0usize), |(s, n), v| (s + v.ln(), n + 1));
    (n > 0).then(|| (sum / n as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(samples: &[f64]) -> Stats {
        Stats::from_samples(samples).unwrap()
    }

    #[test]
    fn median_and_spread() {
        let s = stats(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.median_us, 3.0);
        assert!((s.p10_us - 1.4).abs() < 1e-9);
        assert!((s.p90_us - 4.6).abs() < 1e-9);
        assert_eq!(s.samples, 5);
    }

    #[test]
    fn non_finite_samples_are_dropped() {
        assert!(Stats::from_samples(&[f64::NAN, 0.0]).is_none());
        assert_eq!(stats(&[f64::INFINITY, 2.0]).median_us, 2.0);
    }

    #[test]
    fn clear_win_is_accepted() {
        let inc = stats(&[10.0, 10.1, 9.9, 10.0]);
        let cand = stats(&[5.0, 5.1, 4.9, 5.0]);
        let d = decide_shape(&cand, &inc, 0.02);
        assert!(d.wins);
        assert!((d.speedup - 2.0).abs() < 1e-9);
    }

    #[test]
    fn gain_inside_noise_is_rejected() {
        // 5% faster median but the incumbent's samples spread over +-30%.
        let inc = stats(&[7.0, 10.0, 13.0, 10.0, 8.0, 12.0]);
        let cand = stats(&[9.5, 9.5, 9.5, 9.5, 9.5, 9.5]);
        let d = decide_shape(&cand, &inc, 0.02);
        assert!(d.speedup > 1.0);
        assert!(!d.wins, "{d:?}");
    }

    #[test]
    fn gain_under_floor_is_rejected() {
        let inc = stats(&[10.0; 8]);
        let cand = stats(&[9.9; 8]);
        assert!(!decide_shape(&cand, &inc, 0.02).wins);
    }

    /// A GPU that slows 10% half way through the samples (warming into its power cap),
    /// both kernels alike: each kernel's own band is wide, the pairs' is not.
    fn drifting(us: f64, n: usize) -> Vec<f64> {
        (0..n).map(|i| if i < n / 2 { us } else { us * 1.10 } * (1.0 + 0.002 * (i % 3) as f64)).collect()
    }

    #[test]
    fn paired_samples_see_a_gain_through_common_drift() {
        let inc = drifting(100.0, 20);
        let cand = drifting(97.0, 20);
        // Unpaired, the drift is the noise: a 3% gain is not counted.
        let unpaired = decide_shape(&stats(&cand), &stats(&inc), 0.02);
        assert!(!unpaired.wins, "{unpaired:?}");
        assert!(unpaired.threshold > 0.04, "{unpaired:?}");
        let d = decide_samples(&cand, &inc, 0.02).unwrap();
        assert!(d.wins, "{d:?}");
        assert!((d.speedup - 100.0 / 97.0).abs() < 1e-9, "{d:?}");
        assert!((d.threshold - 0.02).abs() < 1e-9, "the floor decides once the drift cancels: {d:?}");
    }

    #[test]
    fn paired_identical_kernels_do_not_win() {
        let inc = drifting(100.0, 20);
        let mut cand = drifting(100.0, 20);
        cand.reverse(); // the same times, taken in the other half of the drift
        let d = decide_samples(&cand, &inc, 0.02).unwrap();
        assert!(!d.wins, "{d:?}");
        // Out of step, the pairs' band is the drift again.
        assert!(d.threshold > 0.04, "{d:?}");
    }

    #[test]
    fn paired_ratios_skip_bad_pairs_and_need_enough_of_them() {
        let d = decide_samples(&[5.0, f64::NAN, 5.0, 5.0, 5.0], &[10.0, 10.0, 10.0, 10.0, 10.0], 0.02).unwrap();
        assert!((d.speedup - 2.0).abs() < 1e-9 && d.wins, "four good pairs: {d:?}");
        // Unequal counts or too few pairs: the medians decide.
        let d = decide_samples(&[5.0, 5.0, 5.0], &[10.0, 10.0, 10.0, 10.0], 0.02).unwrap();
        assert!((d.speedup - 2.0).abs() < 1e-9 && d.wins, "{d:?}");
        let d = decide_samples(&[9.0, 11.0, 10.0], &[10.0, 10.0, 10.0], 0.02).unwrap();
        assert_eq!(d, decide_shape(&stats(&[9.0, 11.0, 10.0]), &stats(&[10.0; 3]), 0.02));
        assert!(decide_samples(&[], &[1.0, 2.0], 0.02).is_none());
    }

    #[test]
    fn geomean_of_values() {
        assert!((geomean([1.0, 4.0]).unwrap() - 2.0).abs() < 1e-12);
        assert!(geomean([]).is_none());
    }
}
