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
//!
//! Transfer: a shape nothing is remembered for is seeded from the best kernels of the
//! nearest similar remembered shapes ([`Memory::similar`]): each such configuration is run
//! as a candidate (stage `transfer`, rendered for this run's dtype) on the shapes it was
//! transferred to and on every other shape of their classes ([`classify`]), so the open
//! phase can prime its class searches with it. It is trusted no more than any candidate: an
//! incorrect or slow one just loses, and nothing is marked stale for it.

use crate::pipeline::decide::geomean;
use crate::pipeline::render;
use crate::spec::protocol::Shape;
use crate::spec::states::Verdict;
use crate::spec::template::Params;
use crate::storage::ledger::{self, EventKind, IterationRecord};
use crate::storage::memory::{Memory, Remembered, Transfer};
use crate::strategy::open::classify;

use super::candidate::{Candidate, Policy};
use super::phase::{Next, Proposer};
use super::{Engine, Outcome, RunEnd};

/// Stage name of the warm start's iterations.
pub const MEMORY_STAGE: &str = crate::strategy::plan::RESERVED_WARM_START;

/// Stage name of the iterations that try kernels remembered for similar shapes.
pub const TRANSFER_STAGE: &str = crate::strategy::plan::RESERVED_TRANSFER;

/// How many distinct configurations a shape nothing is remembered for borrows: the best
/// kernels of its nearest similar remembered shapes.
pub const TRANSFER_CONFIGS: usize = 2;

/// How much slower than remembered a re-timed kernel may be (machines of one kind differ
/// by a few percent) before its memory is called stale.
pub const MEMORY_TOLERANCE: f64 = 0.10;

/// A configuration transferred from similar shapes: the shapes it is run on (those it was
/// transferred to, and the rest of their classes), and where it came from.
struct Transferred {
    /// A representative remembered measurement (template and knobs are what transfer).
    rem: Remembered,
    shapes: Vec<Shape>,
    /// (target shape key, what it was transferred from), in workload order.
    from: Vec<(String, Transfer)>,
}

impl Transferred {
    /// "b2h8s1024d64 <- b1h8s512d64 (run one #5), ...".
    fn sources(&self) -> String {
        let parts: Vec<String> = self.from.iter().map(|(to, t)| format!("{to} <- {} (run {} #{})", t.from, t.rem.run_id, t.rem.seq)).collect();
        parts.join(", ")
    }
}

/// The remembered best kernels, one candidate per configuration (with the shapes it was
/// best for), in workload order; then the configurations transferred from similar shapes.
struct WarmStart {
    mem: Memory,
    configs: std::vec::IntoIter<(Remembered, Vec<Shape>)>,
    transfers: std::vec::IntoIter<Transferred>,
    /// This run's iterations when it started (a resumed run's warm start is already recorded).
    recorded: Vec<IterationRecord>,
    /// The configuration in flight (None for a transferred one: nothing to judge).
    pending: Option<(Remembered, Vec<Shape>)>,
}

impl Proposer for WarmStart {
    async fn next(&mut self, engine: &mut Engine) -> anyhow::Result<Next> {
        let templates_dir = engine.cfg.resolve(&engine.cfg.run.templates_dir);
        for (rem, shapes) in self.configs.by_ref() {
            let keys: Vec<String> = shapes.iter().map(|s| s.key()).collect();
            let params: Params = serde_json::from_str(&rem.params_json)?;
            let base = engine.plan.stages.iter().find(|s| s.template.name() == rem.template && s.template.meta.target_arch(&engine.device).is_ok());
            let same_source = base.and_then(|b| render::render(&b.template, &params, engine.cfg.workload.dtype, &templates_dir).ok()).map(|r| r.hash);
            let Some(base) = base.filter(|_| same_source.as_deref() == Some(rem.source_hash.as_str())) else {
                let why = if base.is_none() { "is not in this plan (or cannot run on this GPU)" } else { "changed since (a new source hash)" };
                engine.mark_stale(&keys, &format!("{} {} {why}: measured again", rem.template, rem.params_json)).await?;
                continue;
            };
            let mut stage = base.clone();
            stage.spec.name = MEMORY_STAGE.into();
            let done = self.recorded.iter().find(|i| {
                i.stage == MEMORY_STAGE && i.template == rem.template && i.params_json == rem.params_json && i.verdict.is_final()
            });
            if let Some(it) = done.cloned() {
                engine.judge_memory(&self.mem, &rem, &keys, &it).await?;
                continue;
            }
            engine.ledger.set_progress(&engine.run_id, Some(MEMORY_STAGE), engine.used().as_secs_f64()).await?;
            let c = Candidate { stage, params, shapes: shapes.clone(), policy: Policy::warm_start(), begun: None };
            self.pending = Some((rem, shapes));
            return Ok(Next::Run(Box::new(c)));
        }
        for t in self.transfers.by_ref() {
            // Only runnable configurations were kept (`Engine::transfers`).
            let Some(base) = engine.plan.stages.iter().find(|s| s.template.name() == t.rem.template && s.template.meta.target_arch(&engine.device).is_ok()) else {
                continue;
            };
            let params: Params = serde_json::from_str(&t.rem.params_json)?;
            let mut stage = base.clone();
            stage.spec.name = TRANSFER_STAGE.into();
            let done = self.recorded.iter().any(|i| {
                i.stage == TRANSFER_STAGE && i.template == t.rem.template && i.params_json == t.rem.params_json && i.verdict.is_final()
            });
            if done {
                continue;
            }
            engine.ledger.set_progress(&engine.run_id, Some(TRANSFER_STAGE), engine.used().as_secs_f64()).await?;
            tracing::info!(kind = "memory", "transfer: trying {} {} from {}", t.rem.template, t.rem.params_json, t.sources());
            let origin = format!("transfer: {}", t.sources());
            let c = Candidate { stage, params, shapes: t.shapes, policy: Policy::transfer(origin), begun: None };
            return Ok(Next::Run(Box::new(c)));
        }
        Ok(Next::Done)
    }

    async fn report(&mut self, engine: &mut Engine, _c: &Candidate, _outcome: Outcome) -> anyhow::Result<()> {
        let Some((rem, shapes)) = self.pending.take() else { return Ok(()) };
        let seq = engine.seq;
        let its = engine.ledger.iterations(&engine.run_id).await?;
        let Some(it) = its.into_iter().find(|i| i.seq == seq) else { anyhow::bail!("iteration {seq} was not recorded") };
        let keys: Vec<String> = shapes.iter().map(|s| s.key()).collect();
        engine.judge_memory(&self.mem, &rem, &keys, &it).await
    }
}

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
        let transfers = self.transfers(&mem).await?;
        let mut warm = WarmStart { mem, configs: configs.into_iter(), transfers: transfers.into_iter(), recorded: recorded.to_vec(), pending: None };
        self.run_phase(&mut warm).await
    }

    /// What the shapes nothing is remembered for borrow from similar remembered shapes,
    /// grouped by configuration in workload order, each with the shapes of its targets'
    /// classes; recorded once as a `memory` event. Configurations whose template is not in
    /// the plan, cannot run on this GPU or no longer takes these knobs are left out.
    async fn transfers(&mut self, mem: &Memory) -> anyhow::Result<Vec<Transferred>> {
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);
        let mut out: Vec<Transferred> = Vec::new();
        let mut skipped: Vec<String> = Vec::new();
        for shape in &self.shapes {
            for mut t in mem.similar(shape, TRANSFER_CONFIGS) {
                // A configuration remembered before a knob was added runs with the knob at
                // its first value (the kernel as it was), and is named so from here on.
                let base = self.plan.stages.iter().find(|s| s.template.name() == t.rem.template && s.template.meta.target_arch(&self.device).is_ok());
                let params = serde_json::from_str::<Params>(&t.rem.params_json).ok().map(|p| base.map_or(p.clone(), |b| b.template.with_defaults(&p)));
                if let Some(json) = params.as_ref().and_then(|p| serde_json::to_string(p).ok()) {
                    t.rem.params_json = json;
                }
                if let Some(g) = out.iter_mut().find(|g| g.rem.template == t.rem.template && g.rem.params_json == t.rem.params_json) {
                    g.from.push((shape.key(), t));
                    continue;
                }
                let runnable = params.is_some_and(|p| base.is_some_and(|b| render::render(&b.template, &p, self.cfg.workload.dtype, &templates_dir).is_ok()));
                if !runnable {
                    let what = format!("{} {}", t.rem.template, t.rem.params_json);
                    if !skipped.contains(&what) {
                        skipped.push(what);
                    }
                    continue;
                }
                out.push(Transferred { rem: t.rem.clone(), shapes: Vec::new(), from: vec![(shape.key(), t)] });
            }
        }
        if out.is_empty() && skipped.is_empty() {
            return Ok(out);
        }
        // Each configuration is timed on every shape of its targets' classes: the open phase
        // primes a class's search only from iterations timed on all of the class's shapes.
        let classes = classify(&self.shapes, self.device.sm_count);
        for g in &mut out {
            let targeted = |c: &&crate::strategy::open::ShapeClass| c.shapes.iter().any(|s| g.from.iter().any(|(to, _)| *to == s.key()));
            let in_class: Vec<Shape> = classes.iter().filter(targeted).flat_map(|c| c.shapes.iter().copied()).collect();
            g.shapes = self.shapes.iter().filter(|s| in_class.contains(s)).copied().collect();
        }
        let mut lines: Vec<String> =
            out.iter().map(|g| format!("{} {} for {} (run on {} shape(s))", g.rem.template, g.rem.params_json, g.sources(), g.shapes.len())).collect();
        if !skipped.is_empty() {
            lines.push(format!("not transferred (template not in this plan, not for this GPU, or knobs it no longer takes): {}", skipped.join(", ")));
        }
        let msg = format!(
            "transfer: {} configuration(s) remembered for similar shapes, re-checked and re-timed first (stage `{TRANSFER_STAGE}`): {}",
            out.len(),
            lines.join("; ")
        );
        // A resumed run derives the same transfers from the same memory; record them once.
        if self.ledger.event_once(&self.run_id, EventKind::Memory, &msg).await? {
            tracing::info!(kind = "memory", "{msg}");
        }
        Ok(out)
    }

    /// Compare a re-run remembered kernel (iteration `it`) with what was remembered, per
    /// shape: slower beyond [`MEMORY_TOLERANCE`], or no longer correct, makes it stale.
    async fn judge_memory(&mut self, mem: &Memory, rem: &Remembered, keys: &[String], it: &IterationRecord) -> anyhow::Result<()> {
        for key in keys {
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
        Ok(())
    }

    async fn mark_stale(&mut self, keys: &[String], why: &str) -> anyhow::Result<()> {
        for k in keys {
            self.stale.insert(k.clone());
        }
        // A resumed run re-derives the same decision; record it once.
        let msg = format!("memory not used for {}: {why}", keys.join(", "));
        if self.ledger.event_once(&self.run_id, EventKind::MemoryStale, &msg).await? {
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
        rec.verdict = Verdict::Remembered;
        rec.reason = format!("measured before on this kind of GPU: {}; not run again", parts.join(", "));
        rec.score_us = geomean(hits.iter().map(|(_, r)| r.median_us));
        rec.finished_at = ledger::now();
        self.ledger.record_iteration(&rec, &[], self.used().as_secs_f64()).await?;
        self.paired.observe(&rec);
        self.log_iteration(&rec);
        Ok(Outcome { score: rec.score_us, won: false })
    }
}
