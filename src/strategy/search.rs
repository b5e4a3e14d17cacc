//! Search: which knob values to try next within a stage.
//!
//! `exhaustive` walks every combination in declared order; `coordinate` changes one
//! knob at a time from a start point and keeps the best value of each knob before
//! moving on (the "one variable at a time" method); `evolve` mutates one or two knobs
//! of the best point so far, at random from a fixed seed; `agent` stages propose
//! source edits instead (see `engine/agent_stage.rs`) and get nothing from here;
//! `agent-tuning` evolves the knobs of an accepted agent edit. Scores are reported back
//! after each candidate; lower is better (geometric-mean time), `None` means it
//! failed. Every kind is deterministic given the scores, so a resumed run replays the
//! recorded iterations and stands exactly where it stopped.
//!
//! Points are compared as the kernels they run: a [`Canonical`] (built by the engine from
//! the template's `[inert]` knobs, the stage's shapes and the device) maps each point to
//! its representative before the "seen" check, so two points that differ only in knobs
//! inert on every shape are one candidate, proposed (and counted against
//! `max_candidates`) once, in its canonical form. The search itself knows nothing of
//! templates or shapes; without `[inert]` the canonicalizer is the identity.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Deserialize;

use crate::spec::template::Params;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchKind {
    Exhaustive,
    Coordinate,
    Evolve,
    /// A language model proposes edits of the template (engine/agent_stage.rs); no knob search.
    Agent,
    /// `evolve` over the knobs of the latest accepted agent edit of the template.
    #[serde(rename = "agent-tuning")]
    AgentTuning,
}

/// Maps a knob point to the representative of the points that run the same kernel on
/// the shapes searched (knobs inert there at their first declared value:
/// [`crate::spec::template::Template::canonical`]). Idempotent and deterministic, so that
/// a resumed run replays the same proposals.
#[derive(Clone, Default)]
pub struct Canonical(Option<Arc<CanonicalFn>>);

type CanonicalFn = dyn Fn(&Params) -> Params + Send + Sync;

impl Canonical {
    /// Every point is its own representative (no `[inert]` knobs).
    pub fn identity() -> Self {
        Canonical(None)
    }

    pub fn new(f: impl Fn(&Params) -> Params + Send + Sync + 'static) -> Self {
        Canonical(Some(Arc::new(f)))
    }

    pub fn apply(&self, params: &Params) -> Params {
        match &self.0 {
            Some(f) => f(params),
            None => params.clone(),
        }
    }
}

impl std::fmt::Debug for Canonical {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Canonical(inert knobs)" } else { "Canonical(identity)" })
    }
}

fn key(params: &Params) -> String {
    serde_json::to_string(params).unwrap_or_default()
}

/// The points a search expects to propose next ([`Search::ahead`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Ahead {
    /// If the current point and every one after it lose, in order.
    pub loss: Vec<Params>,
    /// The first point proposed if the current point wins that `loss` does not hold.
    pub win: Option<Params>,
}

#[derive(Clone)]
pub struct Search {
    kind: SearchKind,
    space: Vec<(String, Vec<i64>)>,
    max: u32,
    proposed: u32,
    seen: BTreeSet<String>,
    /// Exhaustive: index into the cartesian product.
    cursor: usize,
    /// Coordinate: the current point, the knob being swept, the next value to try,
    /// and the best score so far with the swept knob's value that got it (None: the
    /// current point's own value, whose score carried over from the knob before).
    point: Params,
    knob: usize,
    value: usize,
    best: Option<(f64, Option<i64>)>,
    started: bool,
    /// Evolve: the best point and score so far, and the generator of mutations.
    elite: Option<(f64, Params)>,
    rng: rand::rngs::StdRng,
    /// Points as the kernels they run; every proposal and every seen point goes through it.
    canon: Canonical,
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
            elite: None,
            rng: rand::SeedableRng::seed_from_u64(0x0E70_1DE5),
            canon: Canonical::identity(),
        }
    }

    /// Compare and propose points through `canon` (see [`Canonical`]); before the first `next`.
    pub fn with_canonical(mut self, canon: Canonical) -> Self {
        self.canon = canon;
        self
    }

    /// The next candidate, or None when the stage is exhausted.
    pub fn next(&mut self) -> Option<Params> {
        while self.proposed < self.max {
            let candidate = match self.kind {
                SearchKind::Exhaustive => self.next_exhaustive()?,
                SearchKind::Coordinate => self.next_coordinate()?,
                SearchKind::Evolve | SearchKind::AgentTuning => self.next_evolve()?,
                SearchKind::Agent => return None,
            };
            // Before the dedupe: an exhaustive product (or a start point) that differs from
            // a seen point only in inert knobs is that point, and costs no candidate.
            let candidate = self.canon.apply(&candidate);
            if self.seen.insert(key(&candidate)) {
                self.proposed += 1;
                return Some(candidate);
            }
        }
        None
    }

    /// Feed back the outcome of `params` (lower score is better; None = failed).
    pub fn report(&mut self, params: &Params, score: Option<f64>) {
        if matches!(self.kind, SearchKind::Evolve | SearchKind::AgentTuning) {
            if let Some(s) = score {
                if self.elite.as_ref().is_none_or(|(e, _)| s < *e) {
                    self.elite = Some((s, params.clone()));
                }
            }
            return;
        }
        if self.kind != SearchKind::Coordinate {
            return;
        }
        let Some(score) = score else { return };
        let Some((name, _)) = self.space.get(self.knob) else { return };
        let Some(&v) = params.get(name) else { return };
        // Only points that differ from the current point in the swept knob (or the start)
        // count; compared as kernels, since the swept value may make another knob inert
        // (the proposal then has that knob at its default, the current point may not).
        let mut swept = self.point.clone();
        swept.insert(name.clone(), v);
        let same_elsewhere = self.canon.apply(&swept) == self.canon.apply(params);
        if same_elsewhere && self.best.is_none_or(|(s, _)| score < s) {
            self.best = Some((score, Some(v)));
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
                let p = self.canon.apply(&p);
                if self.seen.contains(&key(&p)) {
                    continue;
                }
                return Some(p);
            }
            // Knob swept: keep its best value, move to the next knob. The point's score
            // stays the bar the next knob's values must beat: that knob's current value is
            // this very point, measured already and never proposed again, so without the
            // bar the better of its other values would win even when slower than the point.
            if let Some((_, Some(v))) = self.best {
                self.point.insert(name.clone(), v);
            }
            self.best = self.best.map(|(s, _)| (s, None));
            self.knob += 1;
            self.value = 0;
        }
    }

    fn next_evolve(&mut self) -> Option<Params> {
        use rand::Rng;
        if !self.started {
            self.started = true;
            return Some(self.point.clone());
        }
        let base = self.elite.as_ref().map(|(_, p)| p.clone()).unwrap_or_else(|| self.point.clone());
        let mutable: Vec<usize> = (0..self.space.len()).filter(|&i| self.space[i].1.len() > 1).collect();
        if mutable.is_empty() {
            return None;
        }
        // A bounded number of draws: in a small space every neighbour may be taken.
        for _ in 0..256 {
            let mut p = base.clone();
            let changes = if mutable.len() > 1 && self.rng.random_bool(0.3) { 2 } else { 1 };
            for _ in 0..changes {
                let (name, values) = &self.space[mutable[self.rng.random_range(0..mutable.len())]];
                let current = p.get(name).copied();
                let others: Vec<i64> = values.iter().copied().filter(|v| Some(*v) != current).collect();
                p.insert(name.clone(), others[self.rng.random_range(0..others.len())]);
            }
            // Checked in canonical form: a mutation of an inert knob alone is the base again,
            // and must count as a draw that found nothing (not loop in `next` for ever).
            let p = self.canon.apply(&p);
            if !self.seen.contains(&key(&p)) {
                return Some(p);
            }
        }
        None
    }

    /// What the search would propose after `current` (proposed, its outcome not reported
    /// yet): `loss`, up to `depth` points, if it and every point after it lose (most
    /// candidates do); `win`, the first point it would propose if `current` won instead and
    /// that `loss` does not hold (a coordinate sweep that ends on a win moves on from the
    /// winner; evolve mutates the new elite). The look-ahead compiles them while `current`
    /// is checked and timed.
    pub fn ahead(&self, current: &Params, depth: usize) -> Ahead {
        let walk = |mut s: Search, n: usize| {
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                let Some(p) = s.next() else { break };
                s.report(&p, None);
                out.push(p);
            }
            out
        };
        let mut lost = self.clone();
        lost.report(current, None);
        let loss = walk(lost, depth);
        // An exhaustive walk's order does not depend on the outcome: its win branch is the
        // loss branch (walking it again was half of a debug build's time in tests/soak.rs:
        // each step canonicalizes every product point up to the next unseen kernel).
        if matches!(self.kind, SearchKind::Exhaustive | SearchKind::Agent) {
            return Ahead { loss, win: None };
        }
        let mut won = self.clone();
        won.report(current, Some(self.winning_score()));
        let win = walk(won, depth).into_iter().find(|p| !loss.contains(p));
        Ahead { loss, win }
    }

    /// A score that beats every score the search holds (a win, for [`Search::ahead`]).
    fn winning_score(&self) -> f64 {
        let held = match self.kind {
            SearchKind::Coordinate => self.best.map(|(s, _)| s),
            SearchKind::Evolve | SearchKind::AgentTuning => self.elite.as_ref().map(|(s, _)| *s),
            SearchKind::Exhaustive | SearchKind::Agent => None,
        };
        held.map_or(1.0, |s| s * 0.5)
    }

    /// The start point was already measured (by an earlier stage): count it as seen
    /// with its score, so the search goes straight to its neighbours.
    pub fn prime(&mut self, params: &Params, score: f64) {
        let params = &self.canon.apply(params);
        self.seen.insert(key(params));
        match self.kind {
            SearchKind::Evolve | SearchKind::AgentTuning => {
                self.started = true;
                self.elite = Some((score, params.clone()));
            }
            SearchKind::Coordinate => {
                self.started = true;
                self.report(params, Some(score));
            }
            SearchKind::Exhaustive | SearchKind::Agent => {}
        }
    }

    /// Never propose `params` (or a point that runs the same kernel): an earlier stage
    /// already measured it.
    pub fn mark_seen(&mut self, params: &Params) {
        self.seen.insert(key(&self.canon.apply(params)));
    }

    /// Start somewhere else (e.g. the best point an earlier stage found), before the first `next`.
    pub fn set_start(&mut self, start: Params) {
        self.point = start;
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
    fn coordinate_stays_on_the_current_value_when_every_other_value_of_a_knob_is_slower() {
        // The start is the best point there is. Sweeping B tries 20 and 30 only (10 is the
        // current point, measured in A's sweep): both slower, so C must be swept from B = 10,
        // not from the better of the two losers.
        let space = vec![("A".to_string(), vec![1, 2]), ("B".to_string(), vec![10, 20, 30]), ("C".to_string(), vec![0, 1])];
        let score = |p: &Params| Some(if p["A"] == 1 && p["B"] == 10 && p["C"] == 0 { 1.0 } else { 2.0 + p["B"] as f64 / 100.0 + p["C"] as f64 });
        let mut s = Search::new(SearchKind::Coordinate, space, point3(1, 10, 0), 100);
        let mut got = Vec::new();
        while let Some(p) = s.next() {
            got.push((p["A"], p["B"], p["C"]));
            s.report(&p, score(&p));
        }
        assert_eq!(got, vec![(1, 10, 0), (2, 10, 0), (1, 20, 0), (1, 30, 0), (1, 10, 1)]);
        assert_eq!(s.point(), &point3(1, 10, 0));
        // A primed start (measured by an earlier stage) is a baseline as good as a measured one.
        let space = vec![("B".to_string(), vec![10, 20]), ("C".to_string(), vec![0, 1])];
        let mut s = Search::new(SearchKind::Coordinate, space, point3(1, 10, 0), 100);
        s.prime(&point3(1, 10, 0), 1.0);
        let mut got = Vec::new();
        while let Some(p) = s.next() {
            got.push((p["B"], p["C"]));
            s.report(&p, score(&p));
        }
        assert_eq!(got, vec![(20, 0), (10, 1)]);
    }

    #[test]
    fn ahead_guesses_both_ends_of_a_sweep_and_replays_as_the_search_will() {
        let space = vec![("A".to_string(), vec![1, 2]), ("B".to_string(), vec![10, 20, 30]), ("C".to_string(), vec![0, 1])];
        let mut s = Search::new(SearchKind::Coordinate, space, point3(1, 10, 0), 100);
        let start = s.next().unwrap();
        // While the start runs: nothing measured, so its winning or losing leaves A's sweep
        // as it is and B's sweep from A = 1 either way (the start is A = 1).
        let a = s.ahead(&start, 3);
        assert_eq!(a.loss, vec![point3(2, 10, 0), point3(1, 20, 0), point3(1, 30, 0)]);
        assert_eq!(a.win, None);
        s.report(&start, Some(5.0));
        let a2 = s.next().unwrap();
        assert_eq!(a2, point3(2, 10, 0));
        // A's last value: if it loses B is swept from A = 1, if it wins from A = 2.
        let a = s.ahead(&a2, 2);
        assert_eq!(a.loss, vec![point3(1, 20, 0), point3(1, 30, 0)]);
        assert_eq!(a.win, Some(point3(2, 20, 0)));
        // Each branch is what the search then proposes.
        let mut lost = s.clone();
        lost.report(&a2, Some(6.0));
        assert_eq!(lost.next(), Some(point3(1, 20, 0)));
        s.report(&a2, Some(4.0));
        assert_eq!(s.next(), Some(point3(2, 20, 0)));
        // Exhaustive: the order does not depend on the outcome; no win branch.
        let mut e = Search::new(SearchKind::Exhaustive, space_ab(), point3(1, 10, 0), 100);
        let first = e.next().unwrap();
        assert_eq!(e.ahead(&first, 2), Ahead { loss: vec![params(1, 20), params(2, 10)], win: None });
        // Evolve: a win moves the elite, so the win branch mutates the current point.
        let mut v = Search::new(SearchKind::Evolve, space_ab(), params(1, 10), 100);
        let first = v.next().unwrap();
        v.report(&first, Some(3.0));
        let second = v.next().unwrap();
        let a = v.ahead(&second, 1);
        let changed = |p: &Params, from: &Params| p.iter().filter(|(k, x)| from[*k] != **x).count();
        assert!((1..=2).contains(&changed(&a.loss[0], &first)), "{a:?}");
        if let Some(w) = &a.win {
            assert!((1..=2).contains(&changed(w, &second)), "{a:?}");
        }
    }

    fn space_ab() -> Vec<(String, Vec<i64>)> {
        vec![("A".into(), vec![1, 2, 3]), ("B".into(), vec![10, 20])]
    }

    fn point3(a: i64, b: i64, c: i64) -> Params {
        [("A".to_string(), a), ("B".to_string(), b), ("C".to_string(), c)].into_iter().collect()
    }

    #[test]
    fn evolve_mutates_the_best_point_and_replays_identically() {
        let space = vec![("A".to_string(), vec![1, 2, 3, 4]), ("B".to_string(), vec![10, 20, 30])];
        let score = |p: &Params| ((p["A"] - 3).abs() * 10 + (p["B"] - 20).abs()) as f64;
        let walk = || {
            let mut s = Search::new(SearchKind::Evolve, space.clone(), params(1, 10), 8);
            let mut seen = Vec::new();
            while let Some(p) = s.next() {
                seen.push((p["A"], p["B"]));
                s.report(&p, Some(score(&p)));
            }
            seen
        };
        let a = walk();
        assert_eq!(a.len(), 8);
        assert_eq!(a[0], (1, 10), "starts at the start point");
        let unique: std::collections::BTreeSet<_> = a.iter().collect();
        assert_eq!(unique.len(), a.len(), "never proposes a point twice");
        assert_eq!(a, walk(), "deterministic given the scores");
        // It moved towards the optimum (A=3, B=20).
        let best = a.iter().map(|&(x, y)| score(&params(x, y))).fold(f64::MAX, f64::min);
        assert!(best < score(&params(1, 10)));
    }

    #[test]
    fn evolve_stops_when_the_space_is_exhausted() {
        let space = vec![("A".to_string(), vec![1, 2]), ("B".to_string(), vec![10])];
        let mut s = Search::new(SearchKind::Evolve, space, params(1, 10), 100);
        let mut n = 0;
        while let Some(p) = s.next() {
            n += 1;
            s.report(&p, Some(1.0));
        }
        assert_eq!(n, 2);
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

    /// A, B as in `space()`, and X in {0, 1}, which matters only at A = 3 (inert elsewhere):
    /// the canonical point has X = 0 unless A = 3.
    fn inert_space() -> Vec<(String, Vec<i64>)> {
        vec![("A".into(), vec![1, 2, 3]), ("B".into(), vec![10, 20]), ("X".into(), vec![0, 1])]
    }

    fn inert_x() -> Canonical {
        Canonical::new(|p: &Params| {
            let mut p = p.clone();
            if p.get("A") != Some(&3) {
                p.insert("X".into(), 0);
            }
            p
        })
    }

    fn point(a: i64, b: i64, x: i64) -> Params {
        [("A".to_string(), a), ("B".to_string(), b), ("X".to_string(), x)].into_iter().collect()
    }

    fn walk(s: &mut Search, score: impl Fn(&Params) -> Option<f64>) -> Vec<(i64, i64, i64)> {
        let mut got = Vec::new();
        while let Some(p) = s.next() {
            got.push((p["A"], p["B"], p["X"]));
            s.report(&p, score(&p));
        }
        got
    }

    #[test]
    fn exhaustive_proposes_each_distinct_kernel_once_and_spends_no_candidate_on_an_inert_variant() {
        let mut s = Search::new(SearchKind::Exhaustive, inert_space(), point(1, 10, 0), 100).with_canonical(inert_x());
        let got = walk(&mut s, |_| Some(1.0));
        // 12 points in the product, 8 distinct kernels: X varies at A = 3 only.
        assert_eq!(got, vec![(1, 10, 0), (1, 20, 0), (2, 10, 0), (2, 20, 0), (3, 10, 0), (3, 10, 1), (3, 20, 0), (3, 20, 1)]);
        // max_candidates counts distinct kernels: 4 candidates reach A = 2 (without the
        // canonical form, the first 4 are A = 1's raw points, two of them inert variants).
        let mut s = Search::new(SearchKind::Exhaustive, inert_space(), point(1, 10, 0), 4).with_canonical(inert_x());
        assert_eq!(walk(&mut s, |_| Some(1.0)), vec![(1, 10, 0), (1, 20, 0), (2, 10, 0), (2, 20, 0)]);
        // The identity leaves the product as it was.
        let mut s = Search::new(SearchKind::Exhaustive, inert_space(), point(1, 10, 0), 4);
        assert_eq!(walk(&mut s, |_| Some(1.0)), vec![(1, 10, 0), (1, 10, 1), (1, 20, 0), (1, 20, 1)]);
    }

    #[test]
    fn evolve_never_proposes_an_inert_variant_of_a_measured_point() {
        // Best at A = 2 (where X is inert), so mutations keep coming back to X.
        let score = |p: &Params| Some(((p["A"] - 2).abs() * 10 + (p["B"] - 20).abs() / 10) as f64);
        let mut s = Search::new(SearchKind::Evolve, inert_space(), point(1, 10, 1), 100).with_canonical(inert_x());
        let got = walk(&mut s, score);
        assert_eq!(got[0], (1, 10, 0), "the start point, proposed in canonical form");
        let unique: BTreeSet<_> = got.iter().collect();
        assert_eq!(unique.len(), got.len(), "no kernel twice: {got:?}");
        assert!(got.iter().all(|&(a, _, x)| a == 3 || x == 0), "only canonical points: {got:?}");
        assert!(got.len() <= 8, "at most the 8 distinct kernels: {got:?}");
        // A space whose only mutable knob is inert everywhere is exhausted after the start
        // point (it does not spin on mutations that are all the start point again).
        let space = vec![("A".to_string(), vec![1]), ("B".to_string(), vec![10]), ("X".to_string(), vec![0, 1])];
        let mut s = Search::new(SearchKind::Evolve, space, point(1, 10, 0), 100).with_canonical(inert_x());
        assert_eq!(walk(&mut s, |_| Some(1.0)), vec![(1, 10, 0)]);
    }

    #[test]
    fn a_primed_or_seen_point_is_seen_with_every_inert_variant() {
        // The start measured by an earlier stage with X = 1 (an older run, say): X = 0 is it.
        let mut s = Search::new(SearchKind::Evolve, inert_space(), point(1, 10, 1), 100).with_canonical(inert_x());
        s.prime(&point(1, 10, 1), 5.0);
        s.mark_seen(&point(1, 20, 1));
        let got = walk(&mut s, |_| Some(9.0));
        assert!(!got.contains(&(1, 10, 0)) && !got.contains(&(1, 20, 0)), "{got:?}");
        assert!(got.iter().all(|&(a, _, x)| a == 3 || x == 0), "{got:?}");
    }

    #[test]
    fn coordinate_skips_inert_values_and_scores_a_sweep_point_whose_canonical_form_differs() {
        // Start at A = 3, X = 1 (X matters). Sweeping A to 1 or 2 makes X inert: those
        // proposals have X = 0, yet they are A's sweep points and their scores count.
        let space = vec![("A".to_string(), vec![3, 1, 2]), ("X".to_string(), vec![0, 1]), ("B".to_string(), vec![10, 20])];
        let score = |p: &Params| Some(if p["A"] == 2 { 1.0 } else { 5.0 } + if p["B"] == 20 { 0.0 } else { 0.5 });
        let mut s = Search::new(SearchKind::Coordinate, space, point(3, 10, 1), 100).with_canonical(inert_x());
        let got = walk(&mut s, score);
        // A: 3 (start), 1, 2 -> 2 is best; X is inert at A = 2 (no sweep point left); B: 20.
        assert_eq!(got, vec![(3, 10, 1), (1, 10, 0), (2, 10, 0), (2, 20, 0)]);
        assert_eq!(s.point()["A"], 2);
        assert_eq!(s.point()["B"], 20);
    }
}
