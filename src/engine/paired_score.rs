//! The score a search steers by: a candidate's times chained through the paired timings of
//! the incumbents it was timed beside, instead of its raw medians.
//!
//! Every candidate is timed in step with each shape's incumbent (the accept rule reads the
//! paired samples), but the searches compared the candidates' own medians across requests.
//! Those drift between requests: the first decode candidate of the 2026-12-01 Llama-3 run,
//! timed beside the naive baseline kernel, read 1.19x (up to 1.43x) its time when the very
//! next candidate re-timed it as the incumbent; every decode point after it then "beat" it
//! by score while losing to it sample by sample, and the coordinate search moved to them.
//!
//! Chained: a shape's best kernel has a chained time `c`; a candidate timed at `m` beside an
//! incumbent that read `i` in the same request is taken as `m * c / i` (its paired ratio
//! times the incumbent's chained time), and when it wins the shape that becomes the shape's
//! `c`. A shape without an incumbent timed beside it takes `m` as it is. The score is the
//! geometric mean of these over the candidate's shapes (None: it failed, or the gate
//! refused one of its shapes). Everything comes from the ledger's rows, in order, so a
//! resumed run replays exactly the scores the live run steered by. The closing's re-rank
//! orders each shape's contenders by the same chained times (`rerank.rs`).

use std::collections::{BTreeMap, HashMap};

use crate::pipeline::decide::geomean;
use crate::storage::ledger::IterationRecord;

/// Chained times per shape and the score of every iteration seen, in ledger order.
#[derive(Debug, Default, Clone)]
pub(crate) struct PairedScores {
    /// Shape key -> the chained time of its best kernel so far.
    best: HashMap<String, f64>,
    /// Iteration seq -> its score.
    scores: HashMap<i64, Option<f64>>,
    /// Shape key -> iteration seq -> that iteration's chained time there.
    chained: BTreeMap<String, BTreeMap<i64, f64>>,
}

impl PairedScores {
    /// Every iteration of a run, taken in seq order (the order they were recorded).
    pub(crate) fn from_iterations<'a>(its: impl IntoIterator<Item = &'a IterationRecord>) -> Self {
        let mut order: Vec<&IterationRecord> = its.into_iter().collect();
        order.sort_by_key(|i| i.seq);
        let mut out = PairedScores::default();
        for it in order {
            out.observe(it);
        }
        out
    }

    /// Take in a recorded iteration (after the shapes it won were decided); its score.
    pub(crate) fn observe(&mut self, it: &IterationRecord) -> Option<f64> {
        let mut chained = Vec::with_capacity(it.shapes.len());
        for s in &it.shapes {
            let Some(m) = s.median_us.filter(|m| m.is_finite() && *m > 0.0) else { continue };
            let factor = match (s.incumbent_us.filter(|i| i.is_finite() && *i > 0.0), self.best.get(&s.shape)) {
                (Some(i), Some(&c)) => c / i,
                _ => 1.0,
            };
            let t = m * factor;
            chained.push(t);
            self.chained.entry(s.shape.clone()).or_default().insert(it.seq, t);
            if s.won {
                self.best.insert(s.shape.clone(), t);
            }
        }
        let partial = it.shapes.iter().any(|s| s.gated.is_some());
        let score = if it.score_us.is_none() || partial { None } else { geomean(chained) };
        self.scores.insert(it.seq, score);
        score
    }

    /// Every iteration's chained time on shape `key`, by seq.
    pub(crate) fn chained_on(&self, key: &str) -> BTreeMap<i64, f64> {
        self.chained.get(key).cloned().unwrap_or_default()
    }

    /// The score of iteration `seq` (None: failed, partial, or not seen).
    pub(crate) fn score(&self, seq: i64) -> Option<f64> {
        self.scores.get(&seq).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ledger::ShapeRecord;

    fn it(seq: i64, rows: &[(&str, f64, Option<f64>, bool)]) -> IterationRecord {
        let shapes = rows
            .iter()
            .map(|&(shape, m, inc, won)| ShapeRecord { shape: shape.into(), median_us: Some(m), incumbent_us: inc, won, ..Default::default() })
            .collect();
        IterationRecord { seq, score_us: Some(1.0), shapes, ..Default::default() }
    }

    #[test]
    fn a_kernel_measured_slow_once_is_still_the_bar_its_paired_losers_fail() {
        let mut p = PairedScores::default();
        // The baseline, then the first real kernel: read at 8.6 us beside the baseline's 500.
        let near = |x: Option<f64>, y: f64| x.is_some_and(|x| (x - y).abs() < 1e-9);
        assert!(near(p.observe(&it(1, &[("a", 500.0, None, true)])), 500.0));
        assert!(near(p.observe(&it(2, &[("a", 8.6, Some(500.0), true)])), 8.6));
        // The next candidate reads 6.6 us beside it, the incumbent 6.05 in the same request:
        // 9% slower, paired; raw medians would have put it 23% ahead.
        let s3 = p.observe(&it(3, &[("a", 6.6, Some(6.05), false)])).unwrap();
        assert!((s3 - 6.6 * 8.6 / 6.05).abs() < 1e-9 && s3 > 8.6, "{s3}");
        // A winner chains on: 0.9x the incumbent is 0.9 x 8.6, and the next is judged against that.
        let s4 = p.observe(&it(4, &[("a", 5.4, Some(6.0), true)])).unwrap();
        assert!((s4 - 0.9 * 8.6).abs() < 1e-9, "{s4}");
        let s5 = p.observe(&it(5, &[("a", 5.0, Some(5.2), false)])).unwrap();
        assert!((s5 - 5.0 / 5.2 * s4).abs() < 1e-9 && s5 < s4, "{s5}");
        assert_eq!(p.score(3), Some(s3));
        // Replayed from the rows, the same scores.
        let rows = [
            it(1, &[("a", 500.0, None, true)]),
            it(2, &[("a", 8.6, Some(500.0), true)]),
            it(3, &[("a", 6.6, Some(6.05), false)]),
            it(4, &[("a", 5.4, Some(6.0), true)]),
            it(5, &[("a", 5.0, Some(5.2), false)]),
        ];
        let replay = PairedScores::from_iterations(&rows);
        assert_eq!((1..=5).map(|s| replay.score(s)).collect::<Vec<_>>(), (1..=5).map(|s| p.score(s)).collect::<Vec<_>>());
    }

    #[test]
    fn geometric_mean_over_shapes_and_no_score_for_failed_or_partial_candidates() {
        let mut p = PairedScores::default();
        p.observe(&it(1, &[("a", 4.0, None, true), ("b", 9.0, None, true)]));
        // a: 2 x 4 / 2 = 4; b: no incumbent timed beside it, 9 as read.
        let s = p.observe(&it(2, &[("a", 2.0, Some(2.0), false), ("b", 9.0, None, false)])).unwrap();
        assert!((s - 6.0).abs() < 1e-9, "{s}");
        let mut failed = it(3, &[("a", 1.0, Some(2.0), false)]);
        failed.score_us = None;
        assert_eq!(p.observe(&failed), None);
        let mut partial = it(4, &[("a", 1.0, Some(2.0), true)]);
        partial.shapes.push(ShapeRecord { shape: "b".into(), gated: Some("too much shared memory".into()), ..Default::default() });
        assert_eq!(p.observe(&partial), None);
        // What a partial candidate won still counts: a's bar is now 1 x 4 / 2 = 2.
        let s = p.observe(&it(5, &[("a", 3.0, Some(3.0), false)])).unwrap();
        assert!((s - 2.0).abs() < 1e-9, "{s}");
        assert_eq!(p.score(99), None);
    }
}
