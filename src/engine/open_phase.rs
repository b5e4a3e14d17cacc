//! The open-ended phase's driver: after the plan's last stage, one search per class of
//! shapes ([`crate::strategy::open`]) until the budget is spent or every class has
//! converged. A candidate is gated, checked and timed on its class's shapes only, and
//! recorded under the stage name `open/<class>`; a resumed run primes the searches from
//! the plan's iterations and replays the phase's own, so it stands where it stopped.

use crate::spec::protocol::Shape;
use crate::spec::template::Params;
use crate::storage::ledger::IterationRecord;
use crate::strategy::open::{classify, Candidates, ClassSearch, OpenSearch, ShapeClass};
use crate::strategy::plan::{Stage, StageSpec};
use crate::strategy::search::SearchKind;

use super::{Engine, Outcome, RunEnd};
use crate::pipeline::decide::geomean;

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

fn finished(it: &IterationRecord) -> bool {
    it.verdict != "interrupted" && it.verdict != "running"
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
            stages.iter().map(|s| Candidates { template: s.template.name().to_string(), space: s.space.clone(), start: s.start.clone() }).collect();
        let classes = classify(&self.shapes, self.device.sm_count);
        let mut searches = Vec::with_capacity(classes.len());
        for class in classes {
            let mut cs = ClassSearch::new(class.clone(), candidates.clone(), spec.clone());
            for it in recorded.iter().filter(|i| !i.stage.starts_with(OPEN_PREFIX) && finished(i)) {
                if let Ok(p) = serde_json::from_str::<Params>(&it.params_json) {
                    cs.prime(&it.template, &p, class_score(it, &class));
                }
            }
            cs.focus_best();
            searches.push(cs);
        }
        let mut open = OpenSearch::new(searches);

        // Replay what this phase already recorded (a resumed run).
        let done: Vec<&IterationRecord> = recorded.iter().filter(|i| i.stage.starts_with(OPEN_PREFIX) && finished(i)).collect();
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
            let o = Outcome::of_record(it);
            open.report(ci, &p, o.score, o.won);
        }
        if done.is_empty() {
            let names: Vec<String> = open.classes.iter().map(|c| format!("{} ({} shapes)", c.class.name, c.class.shapes.len())).collect();
            let msg = format!(
                "plan done with budget left: searching {} class(es) until converged (patience {}): {}",
                open.classes.len(),
                spec.patience,
                names.join(", ")
            );
            self.ledger.event(&self.run_id, "open_phase", &msg).await?;
            tracing::info!(kind = "stage", stage = "open", "{msg}");
        }

        loop {
            if self.shutdown.requested() {
                return Ok(RunEnd::Stopped);
            }
            if !self.budget_left() {
                return Ok(RunEnd::Finished("budget spent".into()));
            }
            let Some((ci, p)) = open.next() else { break };
            let class = open.classes[ci].class.clone();
            let Some(base) = stages.iter().find(|s| s.template.name() == p.template) else {
                anyhow::bail!("open phase proposed template {}, which the plan does not use", p.template);
            };
            let mut stage = base.clone();
            stage.spec.name = format!("{OPEN_PREFIX}{}", class.name);
            self.ledger.set_progress(&self.run_id, Some(&stage.spec.name), self.used().as_secs_f64()).await?;
            let shapes: Vec<Shape> = class.shapes.clone();
            // The look-ahead (see the plan's loop): compile what comes next if this one does not win.
            let mut ahead = open.clone();
            ahead.report(ci, &p, None, false);
            if let Some((cj, q)) = ahead.next() {
                if let Some(next) = stages.iter().find(|s| s.template.name() == q.template) {
                    let next_shapes = ahead.classes[cj].class.shapes.clone();
                    self.lookahead(next, &q.params, &next_shapes).await;
                }
            }
            let outcome = self.iterate(&stage, &p.params, &shapes).await?;
            if self.shutdown.now_requested() {
                return Ok(RunEnd::Stopped);
            }
            open.report(ci, &p, outcome.score, outcome.won);
            if let Some(why) = open.classes[ci].converged() {
                let msg = format!("{}: converged: {why}", class.name);
                self.ledger.event(&self.run_id, "class_converged", &msg).await?;
                tracing::info!(kind = "converged", class = %class.name, "class {msg}");
            }
            if let Some(end) = self.recover_worker().await {
                return Ok(end);
            }
        }
        Ok(RunEnd::Finished(format!("converged: {}", open.summary())))
    }
}
