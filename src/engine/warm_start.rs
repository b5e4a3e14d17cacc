//! Warm start from the memory of earlier runs ([`crate::storage::memory`]).
//!
//! Before the plan, each shape's remembered best kernel is run again as a candidate
//! (stage `warm-start`): rendered from today's template (a changed template has another hash
//! and is not trusted), gated, checked and timed like any other. A shape whose remembered
//! kernel is now incorrect, or slower than remembered beyond `MEMORY_TOLERANCE`, is marked
//! stale: its memory is not used, and the plan measures its points again. For the other
//! shapes the memory skips what was already measured: a candidate whose exact source an
//! earlier run timed on all of its shapes is recorded `remembered`, with the remembered
//! score, instead of being run.

use crate::pipeline::decide::geomean;
use crate::pipeline::outcome::Verdict;
use crate::pipeline::render;
use crate::spec::protocol::Shape;
use crate::spec::template::Params;
use crate::storage::ledger::{self, IterationRecord};
use crate::storage::memory::Remembered;

use super::{Engine, Outcome, RunEnd};

/// Stage name of the warm start's iterations.
pub const MEMORY_STAGE: &str = crate::strategy::plan::RESERVED_WARM_START;

/// How much slower than remembered a re-timed kernel may be (machines of one kind differ
/// by a few percent) before its memory is called stale.
pub const MEMORY_TOLERANCE: f64 = 0.10;

impl Engine {
    /// Re-validate each shape's remembered best kernel; `recorded` are this run's iterations
    /// (a resumed run replays the ones it has). Some(end) if the run must end here.
    pub(super) async fn warm_start(&mut self, recorded: &[IterationRecord]) -> anyhow::Result<Option<RunEnd>> {
        let Some(mem) = self.memory.clone() else { return Ok(None) };
        // The shapes grouped by their remembered best kernel, in workload order.
        let mut configs: Vec<(Remembered, Vec<Shape>)> = Vec::new();
        for shape in &self.shapes {
            let Some(r) = mem.best().get(&shape.key()) else { continue };
            match configs.iter_mut().find(|(c, _)| c.template == r.template && c.params_json == r.params_json) {
                Some((_, v)) => v.push(*shape),
                None => configs.push((r.clone(), vec![*shape])),
            }
        }
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);
        for (rem, shapes) in configs {
            if self.shutdown.requested() {
                return Ok(Some(RunEnd::Stopped));
            }
            if !self.budget_left() {
                return Ok(Some(RunEnd::Finished("budget spent".into())));
            }
            let keys: Vec<String> = shapes.iter().map(|s| s.key()).collect();
            let params: Params = serde_json::from_str(&rem.params_json)?;
            let base = self.plan.stages.iter().find(|s| s.template.name() == rem.template && s.template.meta.target_arch(&self.device).is_ok());
            let same_source = base.and_then(|b| render::render(&b.template, &params, self.cfg.workload.dtype, &templates_dir).ok()).map(|r| r.hash);
            let Some(base) = base.filter(|_| same_source.as_deref() == Some(rem.source_hash.as_str())) else {
                let why = if base.is_none() { "is not in this plan (or cannot run on this GPU)" } else { "changed since (a new source hash)" };
                self.mark_stale(&keys, &format!("{} {} {why}: measured again", rem.template, rem.params_json)).await?;
                continue;
            };
            let mut stage = base.clone();
            stage.spec.name = MEMORY_STAGE.into();
            let done = recorded.iter().find(|i| {
                i.stage == MEMORY_STAGE && i.template == rem.template && i.params_json == rem.params_json && i.verdict != "interrupted" && i.verdict != "running"
            });
            let it = match done {
                Some(it) => it.clone(),
                None => {
                    self.ledger.set_progress(&self.run_id, Some(MEMORY_STAGE), self.used().as_secs_f64()).await?;
                    self.iterate(&stage, &params, &shapes).await?;
                    if self.shutdown.now_requested() {
                        return Ok(Some(RunEnd::Stopped));
                    }
                    let seq = self.seq;
                    let its = self.ledger.iterations(&self.run_id).await?;
                    let Some(it) = its.into_iter().find(|i| i.seq == seq) else { anyhow::bail!("iteration {seq} was not recorded") };
                    if let Some(end) = self.recover_worker().await {
                        return Ok(Some(end));
                    }
                    it
                }
            };
            for key in &keys {
                let now = it.shapes.iter().find(|s| &s.shape == key && s.check_passed == Some(true)).and_then(|s| s.median_us);
                let was = mem.best().get(key).map(|r| r.median_us).unwrap_or(rem.median_us);
                match now {
                    Some(now) if now <= was * (1.0 + MEMORY_TOLERANCE) => {}
                    Some(now) => {
                        let why = format!("{key}: remembered {was:.2} us (run {} #{}), now {now:.2} us: measured again", rem.run_id, rem.seq);
                        self.mark_stale(std::slice::from_ref(key), &why).await?;
                    }
                    None => {
                        let why = format!("{key}: remembered kernel (run {} #{}) is now {} ({}): measured again", rem.run_id, rem.seq, it.verdict, it.reason);
                        self.mark_stale(std::slice::from_ref(key), &why).await?;
                    }
                }
            }
        }
        Ok(None)
    }

    async fn mark_stale(&mut self, keys: &[String], why: &str) -> anyhow::Result<()> {
        for k in keys {
            self.stale.insert(k.clone());
        }
        // A resumed run re-derives the same decision; record it once.
        let msg = format!("memory not used for {}: {why}", keys.join(", "));
        let seen = self.ledger.events(&self.run_id).await?.into_iter().any(|(_, kind, m)| kind == "memory_stale" && m == msg);
        if !seen {
            self.ledger.event(&self.run_id, "memory_stale", &msg).await?;
            tracing::info!(kind = "memory_stale", "{msg}");
        }
        Ok(())
    }

    /// What earlier runs measured of this exact source on every shape of `shapes`, if the
    /// memory may be used for all of them (each has an incumbent in this run and is not stale).
    pub(super) fn remembered(&self, source_hash: &str, shapes: &[Shape]) -> Option<Vec<(String, Remembered)>> {
        let mem = self.memory.as_ref()?;
        shapes
            .iter()
            .map(|s| {
                let k = s.key();
                if self.stale.contains(&k) || !self.incumbents.contains_key(&k) {
                    return None;
                }
                mem.measured(source_hash, &k).cloned().map(|r| (k, r))
            })
            .collect()
    }

    /// Record a candidate the memory answers for: not run, scored with what was remembered.
    pub(super) async fn conclude_remembered(&mut self, mut rec: IterationRecord, hits: Vec<(String, Remembered)>) -> anyhow::Result<Outcome> {
        let parts: Vec<String> = hits.iter().map(|(k, r)| format!("{k} {:.2} us (run {} #{})", r.median_us, r.run_id, r.seq)).collect();
        rec.verdict = Verdict::Remembered.as_str().into();
        rec.reason = format!("measured before on this kind of GPU: {}; not run again", parts.join(", "));
        rec.score_us = geomean(hits.iter().map(|(_, r)| r.median_us));
        rec.finished_at = ledger::now();
        self.ledger.record_iteration(&rec, &[], self.used().as_secs_f64()).await?;
        self.log_iteration(&rec);
        Ok(Outcome { score: rec.score_us, won: false })
    }
}
