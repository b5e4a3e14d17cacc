//! The open-ended phase's driver: after the plan's last stage, one search per class of
//! shapes ([`crate::strategy::open`]) until the budget is spent or every class has
//! converged. A candidate is gated, checked and timed on its class's shapes only, and
//! recorded under the stage name `open/<class>`; a resumed run primes the searches from
//! the plan's iterations and replays the phase's own, so it stands where it stopped.
//! Every outcome (the plan's, as primed points, and the phase's) is evidence for the
//! class's bandit over templates; a template whose weight comes down to the floor is
//! said in a tracing line (`kind = "open_floor"`).

use crate::pipeline::decide::geomean;
use crate::spec::template::Params;
use crate::storage::ledger::{EventKind, IterationRecord};
use crate::strategy::open::{class_templates, classify, Candidates, ClassSearch, OpenSearch, Proposal, ShapeClass};
use crate::strategy::plan::{Stage, StageSpec};
use crate::strategy::search::{Canonical, SearchKind};

use super::candidate::{Candidate, Policy};
use super::phase::{Guesses, Next, Proposer};
use super::{Engine, Outcome, RunEnd};

/// Stage names of the open phase's iterations: `open/<class>`.
pub const OPEN_PREFIX: &str = crate::strategy::plan::RESERVED_OPEN_PREFIX;

/// A class score for an iteration: the geometric-mean time over the class's shapes, if
/// it was timed on every one of them.
fn class_score(it: &IterationRecord, class: &ShapeClass) -> Option<f64> {
    let mut times = Vec::with_capacity(class.shapes.len());
    for s in &class.shapes {
        let row = it.shapes.iter().find(|r| r.shape == s.key())?;
        if row.gated.is_some() {
            return None;
        }
        times.push(row.median_us?);
    }
    geomean(times)
}

/// The open phase's searches, one per shape class, as a proposer of candidates.
struct OpenProposer {
    open: OpenSearch,
    /// One stage per template the phase searches.
    stages: Vec<Stage>,
    /// The proposal in flight: its class and point.
    pending: Option<(usize, Proposal)>,
}

impl OpenProposer {
    /// `p` as a candidate on class `ci`'s shapes, recorded under `open/<class>`.
    fn candidate(&self, ci: usize, p: &Proposal) -> anyhow::Result<Candidate> {
        let Some(base) = self.stages.iter().find(|s| s.template.name() == p.template) else {
            anyhow::bail!("open phase proposed template {}, which the plan does not use", p.template);
        };
        let class = &self.open.classes[ci].class;
        let mut stage = base.clone();
        stage.spec.name = format!("{OPEN_PREFIX}{}", class.name);
        Ok(Candidate { stage, params: p.params.clone(), shapes: class.shapes.clone(), policy: Policy::search(), begun: None })
    }
}

impl Proposer for OpenProposer {
    async fn next(&mut self, engine: &mut Engine) -> anyhow::Result<Next> {
        let Some((ci, p)) = self.open.next() else { return Ok(Next::Done) };
        let c = self.candidate(ci, &p)?;
        engine.ledger.set_progress(&engine.run_id, Some(&c.stage.spec.name), engine.used().as_secs_f64()).await?;
        self.pending = Some((ci, p));
        Ok(Next::Run(Box::new(c)))
    }

    fn ahead(&self, _current: &Candidate, depth: usize) -> Guesses {
        let Some((ci, p)) = self.pending.as_ref() else { return Guesses::default() };
        let guess = |(cj, q): (usize, Proposal)| {
            let stage = self.stages.iter().find(|s| s.template.name() == q.template)?;
            Some((stage.clone(), q.params, self.open.classes.get(cj)?.class.shapes.clone()))
        };
        let (loss, win) = self.open.ahead(*ci, p, depth);
        // A proposal of a template the phase has no stage for ends the guesses there.
        Guesses { loss: loss.into_iter().map_while(guess).collect(), win: win.and_then(guess) }
    }

    async fn report(&mut self, engine: &mut Engine, _c: &Candidate, outcome: Outcome) -> anyhow::Result<()> {
        let Some((ci, p)) = self.pending.take() else { return Ok(()) };
        self.open.report(ci, &p, outcome.score, outcome.won);
        log_floor_changes(&mut self.open.classes[ci]);
        if let Some(why) = self.open.classes[ci].converged() {
            let name = &self.open.classes[ci].class.name;
            let msg = format!("{name}: converged: {why}");
            engine.ledger.event(&engine.run_id, EventKind::ClassConverged, &msg).await?;
            tracing::info!(kind = "converged", class = %name, "class {msg}");
        }
        Ok(())
    }
}

/// A tracing line for each template of the class whose weight came down to the floor.
fn log_floor_changes(cs: &mut ClassSearch) {
    for line in cs.floor_changes() {
        tracing::info!(kind = "open_floor", class = %cs.class.name, "{line}");
    }
}

impl Engine {
    /// One stage per template the phase searches (`open_phase.templates`, or every
    /// template of the plan but the first stage's) that this device runs, over its whole knob
    /// space; its CTA floor and start point are those of the first plan stage naming it.
    fn open_templates(&self) -> Vec<Stage> {
        let mut out: Vec<Stage> = Vec::new();
        let chosen = &self.plan.open_phase.templates;
        let reference = self.plan.stages.first().map(|s| s.spec.template.clone());
        for st in &self.plan.stages {
            let wanted = if chosen.is_empty() { Some(&st.spec.template) != reference.as_ref() } else { chosen.contains(&st.spec.template) };
            if !wanted || st.template.meta.testing || st.template.meta.target_arch(&self.device).is_err() {
                continue;
            }
            if out.iter().any(|o| o.template.name() == st.template.name()) {
                continue;
            }
            let space = st.template.knobs.clone();
            let mut start = st.start.clone();
            for (k, values) in &space {
                start.entry(k.clone()).or_insert(values[0]);
            }
            let spec = StageSpec {
                name: String::new(),
                description: format!("open-ended search over {}", st.spec.template),
                template: st.spec.template.clone(),
                search: SearchKind::Evolve,
                space: Default::default(),
                start: Default::default(),
                start_from_best: false,
                when: Vec::new(),
                min_ctas: st.spec.min_ctas.clone(),
                // The class decides the shapes (a plan stage's filter narrowed only that stage).
                shapes: String::new(),
                max_candidates: 0,
            };
            out.push(Stage { spec, template: st.template.clone(), space, start });
        }
        out
    }

    pub(super) async fn open_phase(&mut self) -> anyhow::Result<RunEnd> {
        // The plan's iterations prime the searches; the phase's own (a resumed run) replay.
        let recorded = self.ledger.iterations(&self.run_id).await?;
        let spec = self.plan.open_phase.clone();
        let stages = self.open_templates();
        let candidates: Vec<Candidates> =
            stages.iter().map(|s| Candidates { template: s.template.name().to_string(), space: s.space.clone(), start: s.start.clone(), max_sq: s.template.meta.max_sq, head_dims: s.template.meta.head_dims.clone(), canon: Canonical::identity() }).collect();
        let classes = classify(&self.shapes, self.device.sm_count);
        let mut searches = Vec::with_capacity(classes.len());
        for class in classes {
            let mut templates = class_templates(&class, &candidates);
            // Each template's points as the kernels they run on this class's shapes.
            for c in &mut templates {
                if let Some(st) = stages.iter().find(|s| s.template.name() == c.template) {
                    c.canon = self.canonical(&st.template, &class.shapes);
                }
            }
            let mut cs = ClassSearch::new(class.clone(), templates, spec.clone());
            // The closing's re-rank comes after this phase: a resume during the closing must
            // prime the searches as the run did, without it.
            for it in recorded.iter().filter(|i| !i.stage.starts_with(OPEN_PREFIX) && i.stage != super::rerank::RERANK_STAGE && i.verdict.is_final()) {
                if let Ok(p) = serde_json::from_str::<Params>(&it.params_json) {
                    cs.prime(&it.template, &p, class_score(it, &class));
                }
            }
            cs.focus_best();
            log_floor_changes(&mut cs);
            searches.push(cs);
        }
        let mut open = OpenSearch::new(searches);

        // Replay what this phase already recorded (a resumed run).
        let done: Vec<&IterationRecord> = recorded.iter().filter(|i| i.stage.starts_with(OPEN_PREFIX) && i.verdict.is_final()).collect();
        for it in &done {
            let Some((ci, p)) = open.next() else {
                anyhow::bail!("iteration {} ({}) was recorded after the open phase converged; resume with the plan the run started with", it.seq, it.stage);
            };
            let stage = format!("{OPEN_PREFIX}{}", open.classes[ci].class.name);
            let recorded_params: Params = serde_json::from_str(&it.params_json).unwrap_or_default();
            if stage != it.stage || p.template != it.template || p.params != recorded_params {
                anyhow::bail!(
                    "the plan changed since iteration {} (the open phase now proposes {stage} {} {}, the ledger has {} {} {}); resume with the plan the run started with",
                    it.seq,
                    p.template,
                    serde_json::to_string(&p.params).unwrap_or_default(),
                    it.stage,
                    it.template,
                    it.params_json
                );
            }
            let o = Outcome::of_record(it, &self.paired);
            open.report(ci, &p, o.score, o.won);
            log_floor_changes(&mut open.classes[ci]);
        }
        if done.is_empty() {
            let names: Vec<String> = open.classes.iter().map(|c| format!("{} ({} shapes)", c.class.name, c.class.shapes.len())).collect();
            let msg = format!(
                "plan done with budget left: searching {} class(es) until converged (patience {}): {}",
                open.classes.len(),
                spec.patience,
                names.join(", ")
            );
            self.ledger.event(&self.run_id, EventKind::OpenPhase, &msg).await?;
            tracing::info!(kind = "stage", stage = "open", "{msg}");
        }

        let mut proposer = OpenProposer { open, stages, pending: None };
        if let Some(end) = self.run_phase(&mut proposer).await? {
            return Ok(end);
        }
        let open = proposer.open;
        Ok(RunEnd::Finished(format!("converged: {}", open.summary())))
    }
}
