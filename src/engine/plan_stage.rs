//! One stage of the strategy plan: decide whether it runs (its target on this GPU, the
//! workload shapes in its template's regime, the diagnosis for stages with `when`), where its search starts (recorded when it first
//! began, so a resumed run replays from the same point), replay what the ledger holds of it,
//! then propose its search's points to [`Engine::run_phase`].

use crate::spec::protocol::{DeviceInfo, Shape};
use crate::spec::template::{eval_bool_expr, shape_vars, Params};
use crate::storage::ledger::{Event, EventKind, StageHistory};
use crate::storage::ledger::IterationRecord;
use crate::strategy::plan::Stage;
use crate::strategy::search::{Search, SearchKind};

use super::candidate::{Candidate, Policy};
use super::phase::{Guesses, Next, Proposer};
use super::{Engine, Incumbent, Outcome, RunEnd};

/// A plan stage's search over its template's knobs, on every workload shape.
struct StageSearch {
    stage: Stage,
    search: Search,
    shapes: Vec<Shape>,
}

impl Proposer for StageSearch {
    async fn next(&mut self, _engine: &mut Engine) -> anyhow::Result<Next> {
        Ok(match self.search.next() {
            Some(params) => Next::Run(Box::new(Candidate {
                stage: self.stage.clone(),
                params,
                shapes: self.shapes.clone(),
                policy: Policy::search(),
                begun: None,
            })),
            None => Next::Done,
        })
    }

    fn ahead(&self, current: &Candidate, depth: usize) -> Guesses {
        let guess = |p: Params| (self.stage.clone(), p, self.shapes.clone());
        let ahead = self.search.ahead(&current.params, depth);
        Guesses { loss: ahead.loss.into_iter().map(guess).collect(), win: ahead.win.map(guess) }
    }

    async fn report(&mut self, _engine: &mut Engine, c: &Candidate, outcome: Outcome) -> anyhow::Result<()> {
        self.search.report(&c.params, outcome.score);
        Ok(())
    }
}

/// The workload shapes a stage is for, in workload order: those its template admits (its
/// `max_sq`) where the stage's `shapes` expression holds. Err: the expression failed on a
/// shape (the plan's load evaluated it once, so only a value it cannot take does this).
pub(super) fn stage_shapes(stage: &Stage, shapes: &[Shape], device: &DeviceInfo) -> Result<Vec<Shape>, String> {
    let mut out = Vec::new();
    for s in shapes.iter().filter(|s| stage.template.meta.admits(s).is_ok()) {
        if stage.spec.shapes.is_empty() || eval_bool_expr(&stage.spec.shapes, &shape_vars(s, device))? {
            out.push(*s);
        }
    }
    Ok(out)
}

impl Engine {
    /// Run one plan stage to its end. Some(end) when the run must end.
    pub(super) async fn plan_stage(&mut self, stage: &Stage, recorded: &[IterationRecord], history: &StageHistory) -> anyhow::Result<Option<RunEnd>> {
        if let Some(end) = self.must_end() {
            return Ok(Some(end));
        }
        // Too old a GPU, or an arch-specific template (sm_90a) on another cc.
        if let Err(why) = stage.template.meta.target_arch(&self.device) {
            let msg = format!("stage {} skipped ({}): {why}", stage.spec.name, stage.spec.template);
            tracing::warn!(kind = "stage_skipped", stage = %stage.spec.name, "{msg}");
            self.ledger.event(&self.run_id, EventKind::StageSkipped, &msg).await?;
            return Ok(None);
        }
        // A template made for one regime (`max_sq`: decode) runs on the shapes it admits
        // only: gated on the others, every candidate would score nothing.
        let shapes = stage_shapes(stage, &self.shapes, &self.device)
            .map_err(|e| anyhow::anyhow!("stage {}: shapes = \"{}\": {e}", stage.spec.name, stage.spec.shapes))?;
        if shapes.is_empty() {
            let msg = if self.shapes.iter().any(|s| stage.template.meta.admits(s).is_ok()) {
                format!("stage {} skipped ({}): no workload shape in its template's regime has {}", stage.spec.name, stage.spec.template, stage.spec.shapes)
            } else {
                let why = self.shapes.first().and_then(|s| stage.template.meta.admits(s).err()).unwrap_or_default();
                format!("stage {} skipped ({}): no workload shape is in its template's regime ({why})", stage.spec.name, stage.spec.template)
            };
            tracing::info!(kind = "stage_skipped", stage = %stage.spec.name, "{msg}");
            self.ledger.event_once(&self.run_id, EventKind::StageSkipped, &msg).await?;
            return Ok(None);
        }
        if !stage.spec.when.is_empty() {
            // Stages the diagnosis found unnecessary before a restart stay skipped.
            if history.not_needed(&stage.spec.name) {
                return Ok(None);
            }
            if history.start(&stage.spec.name).is_none() && !self.needed(stage, &shapes).await? {
                return Ok(None);
            }
        }
        match stage.spec.search {
            SearchKind::Agent => return self.agent_stage(stage).await,
            SearchKind::AgentTuning => match self.agent_tuning_stage(stage).await? {
                // The same stage over the latest accepted agent edit of its template.
                Some(edited) => self.search_stage(&edited, shapes, recorded, history).await,
                None => Ok(None),
            },
            _ => self.search_stage(stage, shapes, recorded, history).await,
        }
    }

    /// The first candidate of the first of `later` stages that would run here (its template
    /// runs on this GPU and admits some workload shape; not an agent stage), for the
    /// look-ahead to compile while the stage before it runs: each stage's first build was
    /// a wait for NVRTC (H200, Llama-3-8B, 2 minutes: 9 stage starts, 1-4 s each, with the
    /// rest of the look-ahead hitting). A guess: a stage the diagnosis then skips (`when`),
    /// or one starting from the best point found by then, costs only CPU time.
    pub(super) fn next_stage_guess(&self, later: &[Stage]) -> Option<(Stage, Params, Vec<Shape>)> {
        for stage in later {
            if matches!(stage.spec.search, SearchKind::Agent | SearchKind::AgentTuning) {
                return None;
            }
            if stage.template.meta.target_arch(&self.device).is_err() {
                continue;
            }
            let Ok(shapes) = stage_shapes(stage, &self.shapes, &self.device) else { continue };
            if shapes.is_empty() {
                continue;
            }
            let start = if stage.spec.start_from_best { self.best_params_for(stage, &shapes) } else { None };
            return Some((stage.clone(), start.unwrap_or_else(|| stage.start.clone()), shapes));
        }
        None
    }

    /// A stage whose candidates come from a knob search, on `shapes` (the workload's
    /// shapes its template admits).
    async fn search_stage(&mut self, stage: &Stage, shapes: Vec<Shape>, recorded: &[IterationRecord], history: &StageHistory) -> anyhow::Result<Option<RunEnd>> {
        let name = &stage.spec.name;
        // Points compared, proposed and recorded as the kernels they run on the stage's shapes.
        let canon = self.canonical(&stage.template, &shapes);
        let mut search = Search::new(stage.spec.search, stage.space.clone(), stage.start.clone(), stage.spec.max_candidates).with_canonical(canon.clone());
        let recorded_start = history.start(name).cloned();
        let start = match recorded_start.clone() {
            Some(p) => p,
            None if stage.spec.start_from_best => self.best_params_for(stage, &shapes).unwrap_or_else(|| stage.start.clone()),
            None => stage.start.clone(),
        };
        search.set_start(start.clone());
        if stage.spec.start_from_best {
            // Points earlier stages measured with this template are not proposed again,
            // and the start point's score is known: go straight to its neighbours.
            // The ledger as it is now: earlier stages of this very process count too.
            // Compared as kernels: a point recorded with other values of knobs inert on these
            // shapes (an older run, another stage's shapes) is the start point all the same.
            let start_canonical = canon.apply(&start);
            let now = self.ledger.iterations(&self.run_id).await?;
            // Not the closing's re-rank: it comes after every stage (see open_phase).
            let earlier = now.iter().filter(|i| &i.stage != name && i.stage != super::rerank::RERANK_STAGE && i.template == stage.template.name());
            let mut start_score = None;
            for it in earlier {
                let Ok(p) = serde_json::from_str::<Params>(&it.params_json) else { continue };
                if canon.apply(&p) == start_canonical {
                    start_score = Outcome::of_record(it, &self.paired).score.or(start_score);
                } else {
                    search.mark_seen(&p);
                }
            }
            if let Some(score) = start_score {
                search.prime(&start, score);
            }
        }
        let done: Vec<&IterationRecord> = recorded.iter().filter(|i| &i.stage == name && i.verdict.is_final()).collect();
        for it in &done {
            let Some(p) = search.next() else { break };
            let recorded_params: Params = serde_json::from_str(&it.params_json).unwrap_or_default();
            if p != recorded_params {
                anyhow::bail!(
                    "the plan changed since iteration {} (stage {name} now proposes {}, the ledger has {}); resume with the plan the run started with",
                    it.seq,
                    serde_json::to_string(&p).unwrap_or_default(),
                    it.params_json
                );
            }
            search.report(&p, Outcome::of_record(it, &self.paired).score);
        }
        self.ledger.set_progress(&self.run_id, Some(name), self.used().as_secs_f64()).await?;
        if recorded_start.is_none() {
            let msg = format!("{name} start {}", serde_json::to_string(&start)?);
            self.ledger.record_event(&self.run_id, &Event::StageStart { stage: name.clone(), start }, &msg).await?;
        }
        if done.is_empty() {
            tracing::info!(kind = "stage", stage = %name, "stage {name}: {} ({} search over {})", stage.spec.description,
                format!("{:?}", stage.spec.search).to_lowercase(), stage.spec.template);
        } else {
            tracing::info!(kind = "stage", stage = %name, "stage {name}: continuing after {} recorded candidate(s)", done.len());
        }
        let mut proposer = StageSearch { stage: stage.clone(), search, shapes };
        self.run_phase(&mut proposer).await
    }

    /// Does the diagnosis of the incumbents show a symptom this stage treats on one of
    /// its `shapes`? The decision and the figures behind it go in the ledger either way.
    async fn needed(&mut self, stage: &Stage, shapes: &[Shape]) -> anyhow::Result<bool> {
        if self.incumbents.is_empty() {
            return Ok(true);
        }
        let (figures, findings) = self.diagnose().await?;
        let relevant: Vec<String> = findings
            .iter()
            .filter(|f| stage.spec.when.contains(&f.symptom) && shapes.iter().any(|s| s.key() == f.shape))
            .map(|f| format!("{} {}", f.shape, f.detail))
            .collect();
        // Without an SDPA measurement there is no anchor to judge a compute gap by:
        // a stage that treats it runs rather than being skipped on no evidence.
        let unjudged = stage.spec.when.contains(&crate::strategy::diagnose::Symptom::ComputeGap)
            && figures.iter().all(|f| f.demonstrated_tflops.is_none());
        let mut relevant = relevant;
        if unjudged {
            relevant.push("compute_gap cannot be judged (no SDPA measurement): running".into());
        }
        let run = !relevant.is_empty();
        let record = serde_json::json!({
            "stage": stage.spec.name, "when": stage.spec.when, "run": run, "findings": findings, "figures": figures,
        });
        self.ledger.event(&self.run_id, EventKind::Diagnosis, &record.to_string()).await?;
        let when: Vec<String> = stage.spec.when.iter().map(|w| serde_json::to_value(w).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()).collect();
        if run {
            tracing::info!(kind = "diagnosis", stage = %stage.spec.name, "diagnosis for {}: {}", stage.spec.name, relevant.join("; "));
        } else {
            let msg = format!("{}: not needed: no shape shows {}", stage.spec.name, when.join(" or "));
            self.ledger.record_event(&self.run_id, &Event::StageNotNeeded { stage: stage.spec.name.clone() }, &msg).await?;
            tracing::info!(kind = "stage_skipped", stage = %stage.spec.name, "stage {msg}");
        }
        Ok(run)
    }

    /// The params of this stage's template that serve the most of `shapes` now (every
    /// workload shape where none of those has one of its incumbents), restricted to the
    /// stage's space (knobs outside it keep the stage's start value). A stage for a few
    /// shapes (under-filled grids, say) starts from their kernel, not the majority's.
    pub(super) fn best_params_for(&self, stage: &Stage, shapes: &[Shape]) -> Option<Params> {
        let keys: std::collections::BTreeSet<String> = shapes.iter().map(Shape::key).collect();
        let all: Vec<(&String, &Incumbent)> = self.incumbents.iter().filter(|(_, i)| i.template == stage.template.name()).collect();
        let ours: Vec<&Incumbent> = all.iter().filter(|(k, _)| keys.contains(*k)).map(|(_, i)| *i).collect();
        let pool = if ours.is_empty() { all.into_iter().map(|(_, i)| i).collect() } else { ours };
        let mut counts: Vec<(Params, usize)> = Vec::new();
        for inc in pool {
            match counts.iter_mut().find(|(p, _)| *p == inc.params) {
                Some((_, n)) => *n += 1,
                None => counts.push((inc.params.clone(), 1)),
            }
        }
        let (best, _) = counts.into_iter().max_by_key(|(_, n)| *n)?;
        let mut start = stage.start.clone();
        for (knob, values) in &stage.space {
            if let Some(v) = best.get(knob).filter(|v| values.contains(v)) {
                start.insert(knob.clone(), *v);
            }
        }
        Some(start)
    }
}
