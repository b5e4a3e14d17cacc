//! Search: which knob values to try next within a stage.
//!
//! `exhaustive` walks every combination in declared order; `coordinate` changes one
//! knob at a time from a start point and keeps the best value of each knob before
//! moving on (the "one variable at a time" method). Scores are reported back after
//! each candidate; lower is better (geometric-mean time), `None` means it failed.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::template::Params;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchKind {
    Exhaustive,
    Coordinate,
}

pub struct Search {
    kind: SearchKind,
    space: Vec<(String, Vec<i64>)>,
    max: u32,
    proposed: u32,
    seen: BTreeSet<String>,
    /// Exhaustive: index into the cartesian product.
    cursor: usize,
    /// Coordinate: the current point, the knob being swept, the next value to try,
    /// and the best (score, value) found for that knob so far.
    point: Params,
    knob: usize,
    value: usize,
    best: Option<(f64, i64)>,
    started: bool,
}

impl Search {
    pub fn new(kind: SearchKind, space: Vec<(String, Vec<i64>)>, start: Params, max_candidates: u32) -> Self {
        Search {
            kind,
            space,
            max: max_candidates,
            proposed: 0,
            seen: BTreeSet::new(),
            cursor: 0,
            point: start,
            knob: 0,
            value: 0,
            best: None,
            started: false,
        }
    }

    /// The next candidate, or None when the stage is exhausted.
    pub fn next(&mut self) -> Option<Params> {
        while self.proposed < self.max {
            let candidate = match self.kind {
                SearchKind::Exhaustive => self.next_exhaustive()?,
                SearchKind::Coordinate => self.next_coordinate()?,
            };
            let key = serde_json::to_string(&candidate).unwrap_or_default();
            if self.seen.insert(key) {
                self.proposed += 1;
                return Some(candidate);
            }
        }
        None
    }

    /// Feed back the outcome of `params` (lower score is better; None = failed).
    pub fn report(&mut self, params: &Params, score: Option<f64>) {
        if self.kind != SearchKind::Coordinate {
            return;
        }
        let Some(score) = score else { return };
        let Some((name, _)) = self.space.get(self.knob) else { return };
        let Some(&v) = params.get(name) else { return };
        // Only points that differ from the current point in the swept knob (or the start) count.
        let same_elsewhere = self.point.iter().all(|(k, pv)| k == name || params.get(k) == Some(pv));
        if same_elsewhere && self.best.is_none_or(|(s, _)| score < s) {
            self.best = Some((score, v));
        }
    }

    fn next_exhaustive(&mut self) -> Option<Params> {
        let total: usize = self.space.iter().map(|(_, v)| v.len()).product();
        if self.cursor >= total {
            return None;
        }
        let mut rem = self.cursor;
        let mut p = Params::new();
        // Last knob varies fastest.
        for (name, values) in self.space.iter().rev() {
            p.insert(name.clone(), values[rem % values.len()]);
            rem /= values.len();
        }
        self.cursor += 1;
        Some(p)
    }

    fn next_coordinate(&mut self) -> Option<Params> {
        if !self.started {
            self.started = true;
            return Some(self.point.clone());
        }
        loop {
            let (name, values) = self.space.get(self.knob)?.clone();
            if self.value < values.len() {
                let v = values[self.value];
                self.value += 1;
                let mut p = self.point.clone();
                p.insert(name.clone(), v);
                if self.seen.contains(&serde_json::to_string(&p).unwrap_or_default()) {
                    continue;
                }
                return Some(p);
            }
            // Knob swept: keep its best value, move to the next knob.
            if let Some((_, v)) = self.best.take() {
                self.point.insert(name.clone(), v);
            }
            self.knob += 1;
            self.value = 0;
            // The start point's score carries over as the baseline for the next knob.
        }
    }

    /// The point a coordinate search currently stands on (for the log).
    pub fn point(&self) -> &Params {
        &self.point
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> Vec<(String, Vec<i64>)> {
        vec![("A".into(), vec![1, 2, 3]), ("B".into(), vec![10, 20])]
    }

    fn params(a: i64, b: i64) -> Params {
        [("A".to_string(), a), ("B".to_string(), b)].into_iter().collect()
    }

    #[test]
    fn exhaustive_walks_every_combination_once() {
        let mut s = Search::new(SearchKind::Exhaustive, space(), params(1, 10), 100);
        let mut got = Vec::new();
        while let Some(p) = s.next() {
            got.push((p["A"], p["B"]));
        }
        assert_eq!(got, vec![(1, 10), (1, 20), (2, 10), (2, 20), (3, 10), (3, 20)]);
    }

    #[test]
    fn exhaustive_respects_max_candidates() {
        let mut s = Search::new(SearchKind::Exhaustive, space(), params(1, 10), 2);
        assert!(s.next().is_some());
        assert!(s.next().is_some());
        assert!(s.next().is_none());
    }

    #[test]
    fn coordinate_keeps_best_value_of_each_knob_before_the_next() {
        // Score: lower is better; A=3 is best, then B=20 is best given A=3.
        let score = |p: &Params| (10 - p["A"]) as f64 * 100.0 + if p["B"] == 20 { 0.0 } else { 1.0 };
        let mut s = Search::new(SearchKind::Coordinate, space(), params(1, 10), 100);
        let mut order = Vec::new();
        while let Some(p) = s.next() {
            order.push((p["A"], p["B"]));
            s.report(&p, Some(score(&p)));
        }
        assert_eq!(order, vec![(1, 10), (2, 10), (3, 10), (3, 20)]);
        assert_eq!(s.point(), &params(3, 20));
    }

    #[test]
    fn coordinate_ignores_failed_candidates() {
        let mut s = Search::new(SearchKind::Coordinate, space(), params(1, 10), 100);
        let mut order = Vec::new();
        while let Some(p) = s.next() {
            order.push((p["A"], p["B"]));
            // A=2 would be best but it failed; the start's score must stand.
            let score = if p["A"] == 2 { None } else { Some(p["A"] as f64) };
            s.report(&p, score);
        }
        assert_eq!(s.point()["A"], 1);
        assert_eq!(order[..3], [(1, 10), (2, 10), (3, 10)]);
    }
}
