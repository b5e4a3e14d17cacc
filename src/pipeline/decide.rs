//! Decide: from interleaved timing samples, is the candidate faster than the
//! incumbent beyond the measured noise?
//!
//! Samples come from one worker process, candidate and incumbent alternating in
//! order round by round, so drift hits both. The noise estimate is the relative
//! spread (p10..p90 over the median) of the noisier of the two; a gain must exceed
//! both it and the configured floor (`min_gain`, ~2%: results within that flip
//! between fresh processes).

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
    /// incumbent median / candidate median (> 1 means the candidate is faster).
    pub speedup: f64,
    /// The gain the candidate had to beat: max(min_gain, noise).
    pub threshold: f64,
    pub wins: bool,
}

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

    #[test]
    fn geomean_of_values() {
        assert!((geomean([1.0, 4.0]).unwrap() - 2.0).abs() < 1e-12);
        assert!(geomean([]).is_none());
    }
}
