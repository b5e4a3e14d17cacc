//! The open-ended phase: after the plan, keep improving each class of shapes until the
//! budget is spent or every class has converged.
//!
//! Shapes are grouped by what limits them ([`classify`]): decode shapes (SQ <= 16, bound by
//! the KV cache's bandwidth), latency-bound shapes (too few 128-row tiles to give each SM
//! two) and compute-bound ones, and within each by head dimension (and, but for decode,
//! causality), so a candidate is timed only on shapes that pull the
//! search the same way. Each class has its own [`ClassSearch`] over the full knob space
//! of every template the plan uses that is for its shapes ([`class_templates`]: a decode
//! template only for decode classes, and a decode class only with it when there is one): mostly one or two knob mutations of the best point
//! of a focus template, some uniform random points so the plan's choices do not trap
//! it, and a restart on another template after `restart_after` candidates without a
//! better score. A class has converged after `patience` candidates in a row that won no
//! shape beyond noise, or when no unmeasured point is left. Everything is deterministic
//! given the reported outcomes, so a resumed run replays to exactly the same point.
//!
//! Templates are a bandit per class ([`ClassSearch::weights`]): each has a weight from
//! its elite (its best class score) against the class's best elite,
//! `exp(-(ratio - 1) / 0.1)` but never under `exploration_floor`; a template with fewer
//! than [`MIN_TRIES`] tries (plan points included) weighs 1 (it is still being explored),
//! and one with that many tries but no score at all weighs the floor. The weights pick
//! the template of a random point and the focus after a restart (the focus itself at half
//! its weight; an unexplored template first), and a focus whose weight is `w` restarts
//! after `ceil(restart_after * w)` stale candidates: a template 3x slower than the
//! class's best gets one candidate at a time, now and then, but never none.
//!
//! Points are compared as kernels: each template's [`Canonical`] (the engine's, from its
//! `[inert]` knobs on the class's shapes) maps a point to its representative before the
//! "seen" check, so a class never measures two points that differ only in knobs that
//! change nothing on its shapes, and primed plan points count in their canonical form.

use std::collections::{BTreeMap, BTreeSet};

use rand::{Rng, SeedableRng};
use serde::Deserialize;

use crate::spec::protocol::Shape;
use crate::spec::template::Params;
use crate::strategy::search::Canonical;

/// `[open_phase]` in a plan file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OpenPhaseSpec {
    /// Keep searching after the plan's last stage while budget is left (false: the run
    /// ends "plan exhausted" as soon as the stages are done).
    pub enabled: bool,
    /// A class has converged after this many candidates in a row won none of its shapes.
    pub patience: u32,
    /// Candidates without a better class score before the search moves to another template.
    pub restart_after: u32,
    /// Share of candidates drawn uniformly from a template's whole knob space.
    pub random_fraction: f64,
    /// Template files to search; empty: every template of the plan except the first
    /// stage's (the reference kernel speedups are measured from).
    pub templates: Vec<String>,
    /// The least weight of a template in a class (the best template weighs 1): a template
    /// far slower than the class's best, or that never scored, is still drawn this often.
    pub exploration_floor: f64,
}

impl Default for OpenPhaseSpec {
    fn default() -> Self {
        OpenPhaseSpec { enabled: true, patience: 40, restart_after: 12, random_fraction: 0.25, templates: Vec::new(), exploration_floor: 0.02 }
    }
}

/// Tries a template gets (plan points included) before its evidence decides its weight.
pub const MIN_TRIES: u32 = 3;

/// How fast a template's weight falls with its elite's ratio to the class's best:
/// 1.1x weighs 0.37, 1.2x 0.14, 1.5x 0.007 (the floor).
const TEMPERATURE: f64 = 0.1;

/// The focus template's weight in the draw of a restart is this share of its own.
const STAY: f64 = 0.5;

impl OpenPhaseSpec {
    pub fn validate(&self) -> Result<(), String> {
        if self.patience == 0 {
            return Err("open_phase.patience must be at least 1".into());
        }
        if self.restart_after == 0 {
            return Err("open_phase.restart_after must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.random_fraction) {
            return Err(format!("open_phase.random_fraction = {} must be within 0.0..=1.0", self.random_fraction));
        }
        if !(self.exploration_floor > 0.0 && self.exploration_floor <= 1.0) {
            return Err(format!(
                "open_phase.exploration_floor = {} must be above 0.0 and at most 1.0 (0 would never draw a slow template again)",
                self.exploration_floor
            ));
        }
        Ok(())
    }
}

/// Shapes that are searched together.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeClass {
    /// e.g. `compute-d64-causal`, `latency-d64`.
    pub name: String,
    pub shapes: Vec<Shape>,
}

/// Compute-bound when the shape has at least two 128-row query tiles per SM (the tile
/// of the tensor-core templates): the GPU is full and the tensor pipe is what limits it.
/// Below that, launch latency and filling the GPU dominate.
pub fn is_compute_bound(shape: &Shape, sm_count: u32) -> bool {
    let tiles = shape.b as u64 * shape.hq as u64 * (shape.sq as u64).div_ceil(128);
    tiles >= 2 * sm_count as u64
}

/// Group the workload's shapes into classes, in order of first appearance. Decode
/// shapes (SQ <= 16, [`Shape::is_decode`]) form their own class per head dim,
/// `decode-d{D}`: they read the whole KV cache for a handful of query rows, so what
/// limits them is HBM bandwidth and latency, whatever their causality (a causal decode
/// row masks only the last few keys). Shapes with a sliding window get a class of their own
/// (`...-window`): fewer templates serve them, and each row's work is the window, not SK.
pub fn classify(shapes: &[Shape], sm_count: u32) -> Vec<ShapeClass> {
    let mut classes: Vec<ShapeClass> = Vec::new();
    for s in shapes {
        let mut name = if s.is_decode() {
            format!("decode-d{}", s.d)
        } else {
            let bound = if is_compute_bound(s, sm_count) { "compute" } else { "latency" };
            let mut name = format!("{bound}-d{}", s.d);
            if s.causal {
                name.push_str("-causal");
            }
            name
        };
        if s.window.is_some() {
            name.push_str("-window");
        }
        match classes.iter_mut().find(|c| c.name == name) {
            Some(c) => c.shapes.push(*s),
            None => classes.push(ShapeClass { name, shapes: vec![*s] }),
        }
    }
    classes
}

/// A template the open phase may propose: its name and full knob space.
#[derive(Debug, Clone)]
pub struct Candidates {
    pub template: String,
    pub space: Vec<(String, Vec<i64>)>,
    /// Where to begin when the template has no measured point in the class.
    pub start: Params,
    /// The template's regime: the most query rows it is for (`max_sq` of its spec).
    pub max_sq: Option<u32>,
    /// The head dims its kernels are written for (`head_dims` of its spec).
    pub head_dims: Vec<u32>,
    /// Its points as the kernels they run on the class's shapes (identity until the engine
    /// sets it for a class: [`class_templates`] hands out the same candidates to every class).
    pub canon: Canonical,
}

/// The templates a class is searched with, in plan order: those whose regime admits
/// every shape of the class (a decode template never gets a prefill class, a template
/// without D 256 kernels never a D 256 class); and for a
/// decode class, only the templates made for decode when the plan has one that runs
/// here (the prefill templates would spend 15 of 16 rows of their tiles on padding:
/// correct, and measured by the plan's own stages, but not where the class's gains are).
pub fn class_templates(class: &ShapeClass, all: &[Candidates]) -> Vec<Candidates> {
    let admitted: Vec<Candidates> =
        all.iter()
            .filter(|c| class.shapes.iter().all(|s| c.max_sq.is_none_or(|m| s.sq <= m) && c.head_dims.contains(&s.d)))
            .cloned()
            .collect();
    let decode = !class.shapes.is_empty() && class.shapes.iter().all(Shape::is_decode);
    if decode && admitted.iter().any(|c| c.max_sq.is_some()) {
        return admitted.into_iter().filter(|c| c.max_sq.is_some()).collect();
    }
    admitted
}

/// One proposal: a template and its knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub template: String,
    pub params: Params,
}

/// Why a class stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Converged {
    /// `patience` candidates in a row won no shape.
    NoGain(u32),
    /// Every point of every template was measured.
    Exhausted,
}

impl std::fmt::Display for Converged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Converged::NoGain(n) => write!(f, "{n} candidates in a row without a gain beyond noise"),
            Converged::Exhausted => write!(f, "every point of every template measured"),
        }
    }
}

/// What a class knows of one of its templates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Arm {
    /// Points measured (primed plan points and the phase's candidates).
    tries: u32,
    /// Of those, the ones without a class score (failed, gated, or lost before being timed on every shape).
    unscored: u32,
}

/// The search of one class.
#[derive(Clone)]
pub struct ClassSearch {
    pub class: ShapeClass,
    templates: Vec<Candidates>,
    spec: OpenPhaseSpec,
    seen: BTreeSet<String>,
    /// Best (score, params) per template within this class.
    elites: BTreeMap<String, (f64, Params)>,
    /// Evidence per template, in the order of `templates`.
    arms: Vec<Arm>,
    /// Templates whose weight was at the floor when [`ClassSearch::floor_changes`] last looked.
    floored: BTreeSet<String>,
    /// Index into `templates` of the template mutations start from.
    focus: usize,
    /// Candidates since the focus template's elite last improved.
    stale: u32,
    /// Candidates since the last one that won a shape.
    without_gain: u32,
    converged: Option<Converged>,
    rng: rand::rngs::StdRng,
}

fn key(template: &str, params: &Params) -> String {
    format!("{template} {}", serde_json::to_string(params).unwrap_or_default())
}

impl ClassSearch {
    /// `templates` in plan order; the search is seeded from the class name so that two
    /// classes do not walk in lockstep, and identically on every replay.
    pub fn new(class: ShapeClass, templates: Vec<Candidates>, spec: OpenPhaseSpec) -> Self {
        let seed = class.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        ClassSearch {
            class,
            arms: vec![Arm::default(); templates.len()],
            templates,
            spec,
            seen: BTreeSet::new(),
            elites: BTreeMap::new(),
            floored: BTreeSet::new(),
            focus: 0,
            stale: 0,
            without_gain: 0,
            converged: None,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
        }
    }

    /// A point measured before the phase (a plan stage): never proposed again, and its
    /// class score (if it was timed on every shape of the class) seeds the elites.
    pub fn prime(&mut self, template: &str, params: &Params, score: Option<f64>) {
        // A plan point is measured for this class as the kernel it runs on the class's
        // shapes: its canonical form is what is seen, and what a mutation starts from.
        let params = &self.canonical(template, params);
        if self.seen.insert(key(template, params)) {
            self.count(template, score);
        }
        if let Some(s) = score {
            self.improve(template, params, s);
        }
    }

    /// `params` of `template` as the kernel it runs on this class's shapes.
    fn canonical(&self, template: &str, params: &Params) -> Params {
        match self.templates.iter().find(|c| c.template == template) {
            Some(c) => c.canon.apply(params),
            None => params.clone(),
        }
    }

    fn count(&mut self, template: &str, score: Option<f64>) {
        if let Some(i) = self.templates.iter().position(|c| c.template == template) {
            self.arms[i].tries += 1;
            self.arms[i].unscored += u32::from(score.is_none());
        }
    }

    /// The weight of each template (in the order they were given): 1 while it has fewer
    /// than [`MIN_TRIES`] tries; then `exp(-(elite / best - 1) / 0.1)` with `best` the
    /// best elite of the class's templates, or the floor if it has no score at all; never
    /// under `exploration_floor`.
    pub fn weights(&self) -> Vec<f64> {
        let floor = self.spec.exploration_floor;
        let best = self.templates.iter().filter_map(|c| self.elites.get(&c.template).map(|e| e.0)).fold(f64::INFINITY, f64::min);
        self.templates
            .iter()
            .zip(&self.arms)
            .map(|(c, arm)| match self.elites.get(&c.template) {
                _ if arm.tries < MIN_TRIES => 1.0,
                None => floor,
                Some((s, _)) if best > 0.0 && best.is_finite() => (-(s / best - 1.0) / TEMPERATURE).exp().max(floor),
                Some(_) => 1.0,
            })
            .collect()
    }

    /// An index drawn in proportion to `w` (every weight is positive).
    fn draw(&mut self, w: &[f64]) -> usize {
        let total: f64 = w.iter().sum();
        let mut x = self.rng.random_range(0.0..total);
        for (i, wi) in w.iter().enumerate() {
            if x < *wi {
                return i;
            }
            x -= wi;
        }
        w.len() - 1
    }

    /// Stale candidates before the focus moves: `restart_after` for a template as good as
    /// the class's best, fewer the further it is behind (at least 1).
    fn restart_limit(&self) -> u32 {
        let w = self.weights().get(self.focus).copied().unwrap_or(1.0);
        ((self.spec.restart_after as f64 * w).ceil() as u32).clamp(1, self.spec.restart_after)
    }

    /// Move the focus: to the next template still being explored (fewer than
    /// [`MIN_TRIES`] tries), else to a template drawn by weight, the focus itself at
    /// half its weight (a restart rarely stays, unless there is no other template).
    fn restart(&mut self) {
        self.stale = 0;
        let n = self.templates.len();
        if n <= 1 {
            return;
        }
        if let Some(i) = (1..n).map(|k| (self.focus + k) % n).find(|&i| self.arms[i].tries < MIN_TRIES) {
            self.focus = i;
            return;
        }
        let mut w = self.weights();
        w[self.focus] *= STAY;
        self.focus = self.draw(&w);
    }

    /// Lines for the templates whose weight came down to the floor since the last call
    /// (the ones that left it are forgotten, and said again if they come back).
    pub fn floor_changes(&mut self) -> Vec<String> {
        let floor = self.spec.exploration_floor;
        if floor >= 1.0 {
            return Vec::new();
        }
        let w = self.weights();
        let best = self.templates.iter().filter_map(|c| self.elites.get(&c.template).map(|e| e.0)).fold(f64::INFINITY, f64::min);
        let mut out = Vec::new();
        for (i, c) in self.templates.iter().enumerate() {
            if w[i] > floor {
                self.floored.remove(&c.template);
                continue;
            }
            if self.floored.insert(c.template.clone()) {
                let arm = self.arms[i];
                let why = match self.elites.get(&c.template) {
                    Some((s, _)) => format!("its best is {:.2}x the class's best", s / best),
                    None => "no score".to_string(),
                };
                out.push(format!(
                    "{}: {} drawn at the floor weight {floor} from now on: {why} after {} tries ({} without a score)",
                    self.class.name, c.template, arm.tries, arm.unscored
                ));
            }
        }
        out
    }

    /// Begin with the template of the best primed point.
    pub fn focus_best(&mut self) {
        let best = self.elites.iter().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(t, _)| t.clone());
        if let Some(i) = best.and_then(|t| self.templates.iter().position(|c| c.template == t)) {
            self.focus = i;
        }
    }

    fn improve(&mut self, template: &str, params: &Params, score: f64) -> bool {
        let better = self.elites.get(template).is_none_or(|(s, _)| score < *s);
        if better {
            self.elites.insert(template.to_string(), (score, params.clone()));
        }
        better
    }

    pub fn converged(&self) -> Option<&Converged> {
        self.converged.as_ref()
    }

    /// The next point to measure, or None once the class has converged.
    pub fn next(&mut self) -> Option<Proposal> {
        if self.converged.is_some() {
            return None;
        }
        if self.templates.is_empty() {
            self.converged = Some(Converged::Exhausted);
            return None;
        }
        let p = if self.rng.random_bool(self.spec.random_fraction) { self.random_point() } else { None };
        let p = p.or_else(|| self.mutation()).or_else(|| self.random_point()).or_else(|| self.first_unseen());
        match p {
            Some(p) => {
                self.seen.insert(key(&p.template, &p.params));
                Some(p)
            }
            None => {
                self.converged = Some(Converged::Exhausted);
                None
            }
        }
    }

    /// Feed back a proposal's outcome: its class score (None: failed or not timed on
    /// every shape of the class) and whether it won any shape.
    pub fn report(&mut self, p: &Proposal, score: Option<f64>, won: bool) {
        self.count(&p.template, score);
        let improved = score.is_some_and(|s| self.improve(&p.template, &p.params, s));
        let focus = self.templates.get(self.focus).map(|c| c.template.as_str());
        if improved && focus == Some(p.template.as_str()) {
            self.stale = 0;
        } else {
            self.stale += 1;
        }
        if self.stale >= self.restart_limit() {
            // Restart: another template (by weight), from its own best point in this class.
            self.restart();
        }
        self.without_gain = if won { 0 } else { self.without_gain + 1 };
        if self.without_gain >= self.spec.patience {
            self.converged = Some(Converged::NoGain(self.spec.patience));
        }
    }

    /// One or two knobs of the focus template's best point (or its start), changed.
    fn mutation(&mut self) -> Option<Proposal> {
        let c = self.templates.get(self.focus)?.clone();
        let base = self.elites.get(&c.template).map(|(_, p)| p.clone()).unwrap_or_else(|| c.canon.apply(&c.start));
        if !self.seen.contains(&key(&c.template, &base)) {
            return Some(Proposal { template: c.template, params: base });
        }
        let mutable: Vec<usize> = (0..c.space.len()).filter(|&i| c.space[i].1.len() > 1).collect();
        if mutable.is_empty() {
            return None;
        }
        for _ in 0..128 {
            let mut p = base.clone();
            let changes = if mutable.len() > 1 && self.rng.random_bool(0.3) { 2 } else { 1 };
            for _ in 0..changes {
                let (name, values) = &c.space[mutable[self.rng.random_range(0..mutable.len())]];
                let current = p.get(name).copied();
                let others: Vec<i64> = values.iter().copied().filter(|v| Some(*v) != current).collect();
                p.insert(name.clone(), others[self.rng.random_range(0..others.len())]);
            }
            let p = c.canon.apply(&p);
            if !self.seen.contains(&key(&c.template, &p)) {
                return Some(Proposal { template: c.template, params: p });
            }
        }
        None
    }

    /// A uniform point of a template drawn by weight.
    fn random_point(&mut self) -> Option<Proposal> {
        let w = self.weights();
        for _ in 0..64 {
            let i = self.draw(&w);
            let c = &self.templates[i];
            let p: Params = c.space.iter().map(|(k, v)| (k.clone(), v[self.rng.random_range(0..v.len())])).collect();
            let p = c.canon.apply(&p);
            if !self.seen.contains(&key(&c.template, &p)) {
                return Some(Proposal { template: c.template.clone(), params: p });
            }
        }
        None
    }

    /// The first unmeasured point in declaration order (the spaces are nearly exhausted).
    fn first_unseen(&self) -> Option<Proposal> {
        for c in &self.templates {
            let total: usize = c.space.iter().map(|(_, v)| v.len()).product();
            for i in 0..total {
                let mut rem = i;
                let mut p = Params::new();
                for (name, values) in c.space.iter().rev() {
                    p.insert(name.clone(), values[rem % values.len()]);
                    rem /= values.len();
                }
                let p = c.canon.apply(&p);
                if !self.seen.contains(&key(&c.template, &p)) {
                    return Some(Proposal { template: c.template.clone(), params: p });
                }
            }
        }
        None
    }
}

/// Round-robin over the classes that have not converged.
#[derive(Clone)]
pub struct OpenSearch {
    pub classes: Vec<ClassSearch>,
    turn: usize,
}

impl OpenSearch {
    pub fn new(classes: Vec<ClassSearch>) -> Self {
        OpenSearch { classes, turn: 0 }
    }

    /// (class index, proposal), or None when every class has converged.
    pub fn next(&mut self) -> Option<(usize, Proposal)> {
        for _ in 0..self.classes.len() {
            let i = self.turn % self.classes.len();
            self.turn += 1;
            if let Some(p) = self.classes[i].next() {
                return Some((i, p));
            }
        }
        None
    }

    pub fn report(&mut self, class: usize, p: &Proposal, score: Option<f64>, won: bool) {
        if let Some(c) = self.classes.get_mut(class) {
            c.report(p, score, won);
        }
    }

    /// What [`OpenSearch::next`] would propose after `p` of class `class` (proposed, its
    /// outcome not reported): up to `depth` proposals if it and every one after it lose, and
    /// the first one after a win of `p` (a new elite: the class's mutations move to it) that
    /// those do not hold. The look-ahead compiles them; see [`crate::strategy::search::Search::ahead`].
    pub fn ahead(&self, class: usize, p: &Proposal, depth: usize) -> (Vec<(usize, Proposal)>, Option<(usize, Proposal)>) {
        let walk = |mut s: OpenSearch, n: usize| {
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                let Some((c, q)) = s.next() else { break };
                s.report(c, &q, None, false);
                out.push((c, q));
            }
            out
        };
        let mut lost = self.clone();
        lost.report(class, p, None, false);
        let loss = walk(lost, depth);
        let mut won = self.clone();
        let score = self.classes.get(class).and_then(|c| c.elites.get(&p.template)).map_or(1.0, |(s, _)| s * 0.5);
        won.report(class, p, Some(score), true);
        let win = walk(won, depth).into_iter().find(|q| !loss.contains(q));
        (loss, win)
    }

    /// "converged: compute-d64: 40 candidates in a row ...; latency-d64: ..."
    pub fn summary(&self) -> String {
        let parts: Vec<String> =
            self.classes.iter().map(|c| format!("{}: {}", c.class.name, c.converged().map_or("searching".to_string(), |r| r.to_string()))).collect();
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::DType;

    fn shape(b: u32, h: u32, s: u32, d: u32, causal: bool) -> Shape {
        Shape::mha(b, h, s, d, causal, DType::Fp16)
    }

    fn space() -> Candidates {
        Candidates {
            template: "t".into(),
            space: vec![("A".into(), vec![1, 2, 3, 4]), ("B".into(), vec![10, 20, 30])],
            start: [("A".to_string(), 1), ("B".to_string(), 10)].into_iter().collect(),
            max_sq: None,
            head_dims: vec![64, 128],
            canon: Canonical::identity(),
        }
    }

    #[test]
    fn classes_split_by_bound_head_dim_and_causality() {
        let shapes = [shape(1, 1, 128, 64, false), shape(4, 16, 4096, 64, false), shape(4, 16, 4096, 64, true), shape(2, 8, 128, 64, false), shape(2, 16, 8192, 128, false)];
        let c = classify(&shapes, 132);
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["latency-d64", "compute-d64", "compute-d64-causal", "compute-d128"]);
        assert_eq!(c[0].shapes.len(), 2, "both small d64 shapes together");
    }

    fn gqa(b: u32, sq: u32, sk: u32, d: u32, causal: bool) -> Shape {
        Shape { hq: 32, hkv: 8, sq, sk, ..Shape::mha(b, 32, sk, d, causal, DType::Bf16) }
    }

    #[test]
    fn decode_shapes_have_a_class_per_head_dim_whatever_their_causality() {
        let shapes = [gqa(8, 1, 4096, 128, true), gqa(1, 4096, 4096, 128, true), gqa(1, 1, 1024, 128, false), gqa(2, 16, 2048, 64, false), gqa(2, 17, 2048, 64, false)];
        let c = classify(&shapes, 132);
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "decode-d128",
                "compute-d128-causal",
                "decode-d64",
                "latency-d64"
            ]
        );
        assert_eq!(
            c[0].shapes,
            [shapes[0], shapes[2]],
            "causal and not, together"
        );
        // A sliding window is a class of its own, decode or not.
        let local = [
            gqa(1, 1, 8192, 128, true).with_window(Some(1024)),
            gqa(1, 4096, 4096, 128, true).with_window(Some(1024)),
            shapes[0],
        ];
        let names: Vec<String> = classify(&local, 132).into_iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "decode-d128-window",
                "compute-d128-causal-window",
                "decode-d128"
            ]
        );
        assert_eq!(c[2].shapes, [shapes[3]], "SQ 16 is decode, SQ 17 is not");
    }

    #[test]
    fn a_class_gets_only_the_templates_written_for_its_head_dim() {
        let wide = Candidates { template: "baseline".into(), head_dims: vec![64, 96, 128, 256], ..space() };
        let classic = Candidates { template: "mma-fa2".into(), ..space() };
        let all = [classic, wide];
        let names = |c: Vec<Candidates>| c.into_iter().map(|c| c.template).collect::<Vec<_>>();
        let classes = classify(&[gqa(1, 2048, 2048, 256, true), gqa(1, 2048, 2048, 128, true)], 132);
        assert_eq!(classes.len(), 2, "{classes:?}");
        for c in &classes {
            let want: &[&str] = if c.shapes[0].d == 256 { &["baseline"] } else { &["mma-fa2", "baseline"] };
            assert_eq!(names(class_templates(c, &all)), want, "{}", c.name);
        }
    }

    #[test]
    fn a_decode_template_serves_decode_classes_only_and_they_search_it_alone() {
        let decode = Candidates { template: "decode-split".into(), max_sq: Some(16), ..space() };
        let other = Candidates { template: "mma-fa2".into(), ..space() };
        let all = [other.clone(), decode.clone()];
        let names = |c: Vec<Candidates>| c.into_iter().map(|c| c.template).collect::<Vec<_>>();
        let classes = classify(&[gqa(8, 1, 4096, 128, false), gqa(1, 512, 4096, 128, true)], 132);
        assert_eq!(names(class_templates(&classes[0], &all)), ["decode-split"]);
        assert_eq!(names(class_templates(&classes[1], &all)), ["mma-fa2"], "{}: the decode template does not admit SQ 512", classes[1].name);
        // Without a decode template that runs here, decode classes keep the others.
        assert_eq!(names(class_templates(&classes[0], &[other])), ["mma-fa2"]);
        // A decode template with a smaller regime than some shape of the class is left out.
        let narrow = Candidates { max_sq: Some(1), ..decode };
        let sq4 = ShapeClass { name: "decode-d128".into(), shapes: vec![gqa(8, 1, 4096, 128, false), gqa(8, 4, 4096, 128, false)] };
        assert_eq!(names(class_templates(&sq4, &all.iter().cloned().chain([narrow]).collect::<Vec<_>>())), ["decode-split"]);
    }

    #[test]
    fn converges_after_patience_candidates_without_a_win() {
        let spec = OpenPhaseSpec { patience: 5, restart_after: 3, random_fraction: 0.0, ..Default::default() };
        let mut s = ClassSearch::new(ShapeClass { name: "c".into(), shapes: vec![] }, vec![space()], spec);
        let mut n = 0;
        while let Some(p) = s.next() {
            n += 1;
            s.report(&p, Some(1.0), n == 2);
        }
        assert_eq!(n, 7, "the win at 2 resets the count, then 5 more");
        assert_eq!(s.converged(), Some(&Converged::NoGain(5)));
    }

    #[test]
    fn exhausts_a_small_space_without_repeating_a_point() {
        let spec = OpenPhaseSpec { patience: 1000, ..Default::default() };
        let mut s = ClassSearch::new(ShapeClass { name: "c".into(), shapes: vec![] }, vec![space()], spec);
        s.prime("t", &space().start, Some(5.0));
        let mut got = BTreeSet::new();
        while let Some(p) = s.next() {
            assert!(got.insert(key(&p.template, &p.params)), "repeated {p:?}");
            s.report(&p, Some(2.0), false);
        }
        assert_eq!(got.len(), 11, "12 points, the primed one skipped");
        assert_eq!(s.converged(), Some(&Converged::Exhausted));
    }

    #[test]
    fn a_class_measures_each_distinct_kernel_once_whatever_its_inert_knobs_were_drawn_at() {
        // B changes nothing on this class's shapes unless A = 4: 12 points, 6 kernels.
        let inert_b = Canonical::new(|p: &Params| {
            let mut p = p.clone();
            if p.get("A") != Some(&4) {
                p.insert("B".into(), 10);
            }
            p
        });
        let t = Candidates { canon: inert_b.clone(), ..space() };
        let spec = OpenPhaseSpec { patience: 1000, ..Default::default() };
        let mut s = ClassSearch::new(ShapeClass { name: "c".into(), shapes: vec![] }, vec![t], spec);
        // A plan point measured with B = 20 is the kernel of A = 1, B = 10 here.
        let primed: Params = [("A".to_string(), 1), ("B".to_string(), 20)].into_iter().collect();
        s.prime("t", &primed, Some(5.0));
        let mut got = BTreeSet::new();
        while let Some(p) = s.next() {
            assert_eq!(inert_b.apply(&p.params), p.params, "proposed in canonical form: {p:?}");
            assert!(got.insert(key(&p.template, &p.params)), "repeated {p:?}");
            s.report(&p, Some(2.0), false);
        }
        assert_eq!(got.len(), 5, "6 kernels, the primed one skipped: {got:?}");
        assert!(!got.contains(&key("t", &inert_b.apply(&primed))));
        assert_eq!(s.converged(), Some(&Converged::Exhausted));
    }

    #[test]
    fn deterministic_given_outcomes() {
        let walk = || {
            let spec = OpenPhaseSpec { patience: 8, ..Default::default() };
            let mut s = ClassSearch::new(ShapeClass { name: "c".into(), shapes: vec![] }, vec![space()], spec);
            let mut out = Vec::new();
            while let Some(p) = s.next() {
                let score = (p.params["A"] * 7 + p.params["B"]) as f64;
                s.report(&p, Some(score), score < 30.0);
                out.push(p);
            }
            out
        };
        assert_eq!(walk(), walk());
    }

    #[test]
    fn mutations_start_from_the_best_point() {
        let spec = OpenPhaseSpec { random_fraction: 0.0, ..Default::default() };
        let mut s = ClassSearch::new(ShapeClass { name: "c".into(), shapes: vec![] }, vec![space()], spec);
        let best: Params = [("A".to_string(), 3), ("B".to_string(), 20)].into_iter().collect();
        s.prime("t", &space().start, Some(9.0));
        s.prime("t", &best, Some(1.0));
        for _ in 0..5 {
            let p = s.next().unwrap();
            let changed = p.params.iter().filter(|(k, v)| best[*k] != **v).count();
            assert!((1..=2).contains(&changed), "{p:?} is not a neighbour of the best point");
            s.report(&p, Some(5.0), false);
        }
    }

    #[test]
    fn ahead_is_what_the_search_proposes_after_a_loss_and_after_a_win() {
        let spec = OpenPhaseSpec { random_fraction: 0.0, ..OpenPhaseSpec::default() };
        let mut open = OpenSearch::new(vec![search(vec![space()], spec)]);
        let (c, first) = open.next().unwrap();
        open.report(c, &first, Some(10.0), true);
        let (c, p) = open.next().unwrap();
        let (loss, win) = open.ahead(c, &p, 3);
        assert_eq!(loss.len(), 3);
        let mut lost = open.clone();
        lost.report(c, &p, Some(20.0), false);
        assert_eq!(lost.next().as_ref(), loss.first(), "a loss: the first guess is next");
        // A win makes `p` the elite, so what comes next mutates `p`; the guess is the first
        // such point the loss branch does not already hold.
        let win = win.expect("a win changes the mutations' base");
        assert!(!loss.contains(&win));
        let mut won = open.clone();
        won.report(c, &p, Some(5.0), true);
        let after: Vec<_> = std::iter::from_fn(|| won.next().inspect(|(c, q)| won.report(*c, q, None, false))).take(3).collect();
        assert!(after.contains(&win), "{win:?} not among {after:?}");
    }

    #[test]
    fn restarts_on_another_template() {
        let spec = OpenPhaseSpec { random_fraction: 0.0, restart_after: 2, patience: 100, ..Default::default() };
        let other = Candidates { template: "u".into(), ..space() };
        let mut s = ClassSearch::new(ShapeClass { name: "c".into(), shapes: vec![] }, vec![space(), other], spec);
        let first: Vec<String> = (0..4)
            .map(|_| {
                let p = s.next().unwrap();
                s.report(&p, None, false);
                p.template
            })
            .collect();
        assert_eq!(first, ["t", "t", "u", "u"]);
    }

    #[test]
    fn round_robin_skips_converged_classes() {
        let spec = OpenPhaseSpec { patience: 1, ..Default::default() };
        let a = ClassSearch::new(ShapeClass { name: "a".into(), shapes: vec![] }, vec![space()], spec.clone());
        let b = ClassSearch::new(ShapeClass { name: "b".into(), shapes: vec![] }, vec![space()], OpenPhaseSpec { patience: 3, ..spec });
        let mut o = OpenSearch::new(vec![a, b]);
        let mut order = Vec::new();
        while let Some((i, p)) = o.next() {
            order.push(i);
            o.report(i, &p, Some(1.0), false);
        }
        assert_eq!(order, [0, 1, 1, 1]);
        assert!(o.summary().contains("a: 1 candidates in a row"), "{}", o.summary());
    }

    /// A template with a big knob space (6^5 points), named `name`.
    fn big(name: &str) -> Candidates {
        let space: Vec<(String, Vec<i64>)> = ["A", "B", "C", "D", "E"].iter().map(|k| (k.to_string(), (1..=6).collect())).collect();
        let start = space.iter().map(|(k, v)| (k.clone(), v[0])).collect();
        Candidates { template: name.into(), space, start, max_sq: None, head_dims: vec![64, 128], canon: Canonical::identity() }
    }

    fn search(templates: Vec<Candidates>, spec: OpenPhaseSpec) -> ClassSearch {
        ClassSearch::new(ShapeClass { name: "compute-d128-causal".into(), shapes: vec![] }, templates, spec)
    }

    /// "fast" scores 10 us (a little less at higher A), "slow" 3x that, "mid" 1.1x.
    fn score_of(p: &Proposal) -> Option<f64> {
        let base = match p.template.as_str() {
            "fast" => 10.0,
            "slow" => 30.0,
            "mid" => 11.0,
            _ => return None,
        };
        Some(base - 0.01 * p.params["A"] as f64)
    }

    #[test]
    fn a_template_three_times_slower_is_starved_yet_still_sampled() {
        let spec = OpenPhaseSpec { patience: 100_000, ..Default::default() };
        let mut s = search(vec![big("fast"), big("slow")], spec.clone());
        let (mut n, mut slow, mut run, mut longest_run) = (0, 0, 0, 0);
        let mut slow_after_explored = 0;
        while n < 3000 {
            let p = s.next().unwrap();
            n += 1;
            if p.template == "slow" {
                slow += 1;
                run += 1;
                longest_run = longest_run.max(run);
                if s.arms[1].tries >= MIN_TRIES {
                    slow_after_explored += 1;
                }
            } else {
                run = 0;
            }
            s.report(&p, score_of(&p), false);
        }
        let w = s.weights();
        assert_eq!(w, [1.0, spec.exploration_floor], "slow is at the floor once its tries show it 3x slower");
        let share = slow as f64 / n as f64;
        // Drawn at weight 0.02 against 1: about 2% of the random points (most candidates,
        // once the best point's neighbours are measured) and of the restarts.
        assert!(share < 0.03, "slow got {slow} of {n} candidates ({:.1}%); the floor allows about 2%", share * 100.0);
        assert!(slow_after_explored >= 5, "slow is still drawn now and then once starved: {slow_after_explored} of {n}");
        assert!(longest_run <= MIN_TRIES, "a starved focus moves on after one candidate (longest run {longest_run})");
    }

    #[test]
    fn with_equal_weights_the_slow_template_would_get_a_third() {
        // The same walk with a floor of 1 (every template weighs the same, as random points
        // and round-robin restarts did before the bandit), for comparison with the test above.
        let spec = OpenPhaseSpec { patience: 100_000, exploration_floor: 1.0, ..Default::default() };
        let mut s = search(vec![big("fast"), big("slow")], spec);
        let mut slow = 0;
        for _ in 0..3000 {
            let p = s.next().unwrap();
            slow += usize::from(p.template == "slow");
            s.report(&p, score_of(&p), false);
        }
        assert!(slow > 900, "with equal weights slow got {slow} of 3000");
    }

    #[test]
    fn a_template_without_a_score_gets_the_floor_after_its_tries() {
        let spec = OpenPhaseSpec { exploration_floor: 0.05, ..Default::default() };
        let mut s = search(vec![big("fast"), big("broken")], spec);
        s.prime("fast", &big("fast").start, Some(10.0));
        let mut p = big("broken").start;
        for i in 0..MIN_TRIES {
            assert_eq!(s.weights()[1], 1.0, "still explored after {i} failed tries");
            p.insert("A".into(), i as i64 + 1);
            s.prime("broken", &p, None);
        }
        assert_eq!(s.weights(), [1.0, 0.05]);
        let lines = s.floor_changes();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("broken drawn at the floor weight 0.05") && lines[0].contains("no score after 3 tries (3 without a score)"), "{lines:?}");
        assert!(s.floor_changes().is_empty(), "said once");
        // A point primed twice is one try.
        s.prime("broken", &p, None);
        assert_eq!(s.arms[1], Arm { tries: 3, unscored: 3 });
    }

    #[test]
    fn weights_fall_with_the_elite_ratio_and_a_weak_focus_restarts_sooner() {
        let mut s = search(vec![big("fast"), big("mid"), big("slow")], OpenPhaseSpec::default());
        for (t, score) in [("fast", 10.0), ("mid", 11.0), ("slow", 30.0)] {
            for a in 1..=3 {
                let mut p = big(t).start;
                p.insert("A".into(), a);
                s.prime(t, &p, Some(if a == 1 { score } else { score + 5.0 }));
            }
        }
        let w = s.weights();
        assert_eq!(w[0], 1.0);
        assert!((w[1] - (-1.0f64).exp()).abs() < 1e-9, "1.1x weighs e^-1: {w:?}");
        assert_eq!(w[2], 0.02, "3x is at the floor");
        s.focus = 0;
        assert_eq!(s.restart_limit(), 12);
        s.focus = 1;
        assert_eq!(s.restart_limit(), 5, "ceil(12 * 0.37)");
        s.focus = 2;
        assert_eq!(s.restart_limit(), 1);
        // Restarts from the best go mostly to `mid`, rarely to `slow`.
        let mut to = [0; 3];
        for _ in 0..1000 {
            s.focus = 0;
            s.restart();
            to[s.focus] += 1;
        }
        assert!(to[1] > to[0] / 2 && to[2] > 0 && to[2] < 60, "restarts from fast went to {to:?}");
    }

    #[test]
    fn the_bandit_is_deterministic_given_outcomes_and_a_replay_reaches_the_same_point() {
        let spec = OpenPhaseSpec { patience: 60, ..Default::default() };
        let fresh = || {
            let mut s = search(vec![big("slow"), big("fast"), big("mid"), big("broken")], spec.clone());
            s.prime("slow", &big("slow").start, Some(31.0));
            s.prime("fast", &big("fast").start, Some(12.0));
            s.focus_best();
            s
        };
        let walk = |mut s: ClassSearch, limit: usize| {
            let mut out = Vec::new();
            while out.len() < limit {
                let Some(p) = s.next() else { break };
                let score = score_of(&p);
                s.report(&p, score, score.is_some_and(|x| x < 9.97));
                out.push(p);
            }
            (out, s)
        };
        let (all, _) = walk(fresh(), usize::MAX);
        assert_eq!(all, walk(fresh(), usize::MAX).0);
        assert!(all.iter().any(|p| p.template == "broken") && all.iter().any(|p| p.template == "slow"), "every template sampled");

        // A resumed run: replay the first 40 recorded outcomes, then go on.
        let mut s = fresh();
        for recorded in &all[..40] {
            let p = s.next().unwrap();
            assert_eq!(&p, recorded);
            // The look-ahead guesses on a clone, which leaves the search as it was.
            let mut ahead = s.clone();
            ahead.report(&p, None, false);
            let _ = ahead.next();
            let score = score_of(&p);
            s.report(&p, score, score.is_some_and(|x| x < 9.97));
        }
        let (rest, s) = walk(s, usize::MAX);
        assert_eq!(rest, all[40..]);
        assert_eq!(s.converged(), Some(&Converged::NoGain(60)));
    }

    #[test]
    fn exploration_floor_is_validated_and_the_old_keys_still_parse() {
        let spec: OpenPhaseSpec = toml::from_str("enabled = true\npatience = 5\nrestart_after = 3\nrandom_fraction = 0.1\ntemplates = [\"kv_split.cu\"]\n").unwrap();
        assert_eq!(spec.exploration_floor, 0.02);
        assert!(spec.validate().is_ok());
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            let err = OpenPhaseSpec { exploration_floor: bad, ..Default::default() }.validate().unwrap_err();
            assert!(err.starts_with(&format!("open_phase.exploration_floor = {bad} must be above 0.0 and at most 1.0")), "{err}");
        }
        assert!(OpenPhaseSpec { exploration_floor: 1.0, ..Default::default() }.validate().is_ok());
    }
}
