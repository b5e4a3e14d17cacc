//! Screen: a brief timing before the check and the full timing, so that a hopeless
//! candidate costs a fraction of a second, not the seconds of an fp32 reference check
//! and a full timing.
//!
//! A compiled candidate is timed beside the incumbent on one shape of each class it is
//! judged on (the shape whose incumbent is fastest: the cheapest to time; and the slowest
//! too where the class spans a wide range, see [`choose`]), with four samples, one per round. When it is slower than the incumbent there by more than
//! `timing.early_reject` (and beyond the measured noise) on every screened shape, it is
//! rejected without the check or the full timing: a kernel that slow is never accepted,
//! so its correctness does not matter (and it is never remembered: memory across runs
//! takes only checked rows). Otherwise the brief numbers are dropped and the candidate is
//! checked and timed as usual; the worker keeps the screened shapes' inputs for that
//! timing (same seed). Classes are screened separately because a candidate can
//! lose badly on one class and win another (a split-KV kernel on small and large shapes).

use crate::spec::protocol::{Shape, ShapePlan, Timed, TimingSpec};

use super::decide::Stats;
use super::timing;

/// Samples per kernel of the brief timing: a median of four, taken one per round where the
/// run's timing has four rounds (each sample next to the incumbent's, both orders twice).
const SAMPLES: u32 = 4;

/// Incumbent times this far apart within a class make its fastest shape a poor stand-in
/// for its slowest: a latency-bound class spans S 32 to 512, where the kernel that wins at
/// S 512 (more KV warps) loses at S 32. Such a class is screened on both ends.
const SPAN_FOR_TWO: f64 = 2.0;

/// The shapes to screen on: per class (in order of first appearance), the planned shape
/// whose incumbent is fastest (the cheapest to time), and also the one whose incumbent is
/// slowest when the two are [`SPAN_FOR_TWO`] or more apart. None when some class has no
/// shape with an incumbent: the candidate could become that shape's first kernel, so it
/// must be checked and timed in full.
pub fn choose(plans: &[ShapePlan], class_of: impl Fn(&Shape) -> String, incumbent_us: impl Fn(&Shape) -> Option<f64>) -> Option<Vec<ShapePlan>> {
    // Per class: (fastest, slowest) incumbent, each with its plan.
    type Ends<'a> = Option<((f64, &'a ShapePlan), (f64, &'a ShapePlan))>;
    let mut classes: Vec<(String, Ends<'_>)> = Vec::new();
    for p in plans {
        let class = class_of(&p.shape);
        let i = match classes.iter().position(|(c, _)| *c == class) {
            Some(i) => i,
            None => {
                classes.push((class, None));
                classes.len() - 1
            }
        };
        if let Some(t) = incumbent_us(&p.shape) {
            let ends = &mut classes[i].1;
            *ends = Some(match *ends {
                None => ((t, p), (t, p)),
                Some((lo, hi)) => (if t < lo.0 { (t, p) } else { lo }, if t > hi.0 { (t, p) } else { hi }),
            });
        }
    }
    let mut out = Vec::new();
    for (_, ends) in classes {
        let (lo, hi) = ends?;
        out.push(lo.1.clone());
        if hi.0 >= SPAN_FOR_TWO * lo.0 {
            out.push(hi.1.clone());
        }
    }
    Some(out)
}

/// The brief timing: the run's timing cut to four samples per kernel, one per round where
/// the run has four rounds (fewer rounds take more samples each, never more than the run's).
pub fn brief(full: &TimingSpec) -> TimingSpec {
    let rounds = SAMPLES.min(full.rounds.max(1));
    let samples_per_round = SAMPLES.div_ceil(rounds).min(full.samples_per_round.max(1));
    TimingSpec { rounds, samples_per_round, sustained_ms: 0.0, ..*full }
}

/// One screened shape: the candidate's and the incumbent's brief timings.
#[derive(Debug, Clone)]
pub struct Screened {
    pub shape: Shape,
    pub input_sets: u32,
    pub candidate: Stats,
    pub incumbent: Stats,
}

impl Screened {
    /// How many times slower than the incumbent (above 1: slower).
    pub fn ratio(&self) -> f64 {
        self.candidate.median_us / self.incumbent.median_us
    }

    /// Slower by more than `margin`, and beyond half the p10-p90 spread of the noisier
    /// of the two (as a win must be beyond it, a loss must be too).
    pub fn hopeless(&self, margin: f64) -> bool {
        let noise = 0.5 * self.candidate.rel_spread().max(self.incumbent.rel_spread());
        self.ratio() > 1.0 + margin.max(noise)
    }
}

/// The screened shapes of a brief timing, candidate `id` against each case's other entry.
/// None when some case lacks samples of either (then the full timing decides).
pub fn results(timed: &Timed, id: &str) -> Option<Vec<Screened>> {
    timed
        .cases
        .iter()
        .map(|case| {
            let candidate = timing::stats_of(case, id)?;
            let other = case.entries.iter().find(|e| e.id != id)?;
            let incumbent = Stats::from_samples(&other.samples_us)?;
            Some(Screened { shape: case.shape, input_sets: case.input_sets, candidate, incumbent })
        })
        .collect()
}

/// Reject when every screened shape is hopeless (see [`Screened::hopeless`]); 0 = never.
pub fn rejects(screened: &[Screened], margin: f64) -> bool {
    margin > 0.0 && !screened.is_empty() && screened.iter().all(|s| s.hopeless(margin))
}

/// The reason recorded for a rejected candidate: both numbers per screened shape.
pub fn reason(screened: &[Screened], margin: f64) -> String {
    let parts: Vec<String> = screened
        .iter()
        .map(|s| format!("{} {:.2} us vs the incumbent's {:.2} us ({:.2}x slower)", s.shape.key(), s.candidate.median_us, s.incumbent.median_us, s.ratio()))
        .collect();
    format!(
        "rejected early: {}; brief timing ({SAMPLES} samples per kernel), beyond timing.early_reject = {margin} on every class screened; not checked or timed in full",
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{DType, TimedCase, TimedEntry};

    fn plan(b: u32, s: u32, d: u32) -> ShapePlan {
        ShapePlan { shape: Shape::mha(b, 16, s, d, false, DType::Fp16), n_splits: 1, launches: vec![], tensor_maps: vec![] }
    }

    fn class(s: &Shape) -> String {
        format!("d{}", s.d)
    }

    #[test]
    fn one_shape_per_class_the_one_with_the_fastest_incumbent() {
        let plans = [plan(4, 4096, 64), plan(1, 1024, 64), plan(2, 8192, 128)];
        let inc = |s: &Shape| Some(s.d as f64 + s.b as f64);
        let got = choose(&plans, class, inc).unwrap();
        let keys: Vec<String> = got.iter().map(|p| p.shape.key()).collect();
        assert_eq!(keys, [plans[1].shape.key(), plans[2].shape.key()]);
    }

    #[test]
    fn a_class_whose_incumbents_span_a_wide_range_is_screened_at_both_ends() {
        // S 32 .. 512 in one class: 3 us and 9 us incumbents.
        let plans = [plan(1, 32, 64), plan(1, 128, 64), plan(1, 512, 64)];
        let inc = |s: &Shape| Some(3.0 * (s.sq as f64 / 32.0).powf(0.4));
        let keys: Vec<u32> = choose(&plans, class, inc).unwrap().iter().map(|p| p.shape.sq).collect();
        assert_eq!(keys, [32, 512]);
        // Within 2x: the fastest alone.
        let inc = |s: &Shape| Some(3.0 + s.sq as f64 / 512.0);
        let keys: Vec<u32> = choose(&plans, class, inc).unwrap().iter().map(|p| p.shape.sq).collect();
        assert_eq!(keys, [32]);
    }

    #[test]
    fn no_screening_when_a_class_has_no_incumbent() {
        let plans = [plan(4, 4096, 64), plan(2, 8192, 128)];
        let inc = |s: &Shape| (s.d == 64).then_some(10.0);
        assert!(choose(&plans, class, inc).is_none(), "the d128 shape has no incumbent: the candidate could be its first kernel");
        // A class with an incumbent on one of its shapes screens on that one.
        let plans = [plan(4, 4096, 64), plan(1, 1024, 64)];
        let inc = |s: &Shape| (s.b == 4).then_some(10.0);
        assert_eq!(choose(&plans, class, inc).unwrap()[0].shape.b, 4);
    }

    fn case(b: u32, cand: &[f64], inc: &[f64]) -> TimedCase {
        TimedCase {
            shape: plan(b, 1024, 64).shape,
            input_sets: 3,
            entries: vec![
                TimedEntry { id: "it9".into(), samples_us: cand.to_vec(), sustained_us: vec![] },
                TimedEntry { id: "it2".into(), samples_us: inc.to_vec(), sustained_us: vec![] },
            ],
        }
    }

    #[test]
    fn rejects_only_when_every_class_loses_beyond_margin_and_noise() {
        let slow = case(1, &[30.0, 30.0, 30.5, 30.2], &[10.0, 10.1, 10.0, 10.05]);
        let close = case(2, &[11.0, 11.0, 11.1, 11.0], &[10.0, 10.1, 10.0, 10.05]);
        let s = results(&Timed { cases: vec![slow.clone()] }, "it9").unwrap();
        assert!((s[0].ratio() - 3.0).abs() < 0.05, "{}", s[0].ratio());
        assert!(rejects(&s, 0.25));
        assert!(!rejects(&s, 0.0), "0 turns screening off");
        let reason = reason(&s, 0.25);
        assert!(reason.contains("30.") && reason.contains("10.") && reason.contains("timing.early_reject = 0.25"), "{reason}");
        // 10% slower on one class: not hopeless, so the candidate goes on to its full timing.
        let s = results(&Timed { cases: vec![slow, close] }, "it9").unwrap();
        assert!(!rejects(&s, 0.25));
        // Noisy samples widen the margin: 1.4x slower but a p10-p90 band wider than its median is no verdict.
        let noisy = case(3, &[14.0, 3.0, 30.0, 14.0, 14.0], &[10.0, 10.0, 10.0, 10.0]);
        let s = results(&Timed { cases: vec![noisy] }, "it9").unwrap();
        assert!(!rejects(&s, 0.25), "ratio {} within the noise", s[0].ratio());
    }

    #[test]
    fn missing_samples_leave_the_decision_to_the_full_timing() {
        let empty = case(1, &[], &[10.0]);
        assert!(results(&Timed { cases: vec![empty] }, "it9").is_none());
    }

    #[test]
    fn brief_keeps_the_method_and_takes_four_samples_one_per_round() {
        let full = crate::spec::config::TimingSection::default();
        let cfg = TimingSpec {
            warmup: full.warmup,
            rounds: full.rounds,
            samples_per_round: full.samples_per_round,
            launches_per_sample: full.launches_per_sample,
            l2_multiple: full.l2_multiple,
            max_input_sets: full.max_input_sets,
            graph: true,
            sample_target_us: full.sample_target_us,
            max_entry_ms: full.max_entry_ms,
            sustained_ms: 200.0,
        };
        let b = brief(&cfg);
        assert_eq!(b.sustained_ms, 0.0, "a screen is never a sustained timing");
        assert_eq!((b.rounds, b.samples_per_round, b.graph, b.launches_per_sample), (4, 1, true, cfg.launches_per_sample));
        // A config with few rounds of many samples keeps four samples, as many per round as needed.
        let few = brief(&TimingSpec { rounds: 2, samples_per_round: 10, ..cfg });
        assert_eq!((few.rounds, few.samples_per_round), (2, 2));
        let one = brief(&TimingSpec { rounds: 1, samples_per_round: 3, ..cfg });
        assert_eq!((one.rounds, one.samples_per_round), (1, 3), "never more samples per round than the run's");
    }
}
