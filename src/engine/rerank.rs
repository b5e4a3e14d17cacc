//! The sustained re-rank, the first step of the closing comparison (`timing.sustained_ms` >
//! 0 and `timing.rerank_top` > 1): candidates are timed in ~2 ms samples, at boost clocks;
//! inside a model step attention runs back to back for hundreds of milliseconds, 12-18%
//! slower, and a kernel that wins a short burst need not win there. So each shape's top
//! `timing.rerank_top` distinct correct kernels (the best and the next by their recorded
//! time, corrected for clock drift between iterations through the incumbent timed beside
//! each) are timed together in one sustained timing; one faster than the best by more than
//! max(`timing.rerank_min_gain`, the noise) becomes the best through the path every win takes (an iteration
//! of stage [`RERANK_STAGE`], incumbents, ledger, git), recorded before the comparison goes on.

use std::collections::BTreeMap;

use crate::pipeline::decide::{self, Stats};
use crate::pipeline::outcome::Verdict;
use crate::pipeline::{compile, record, timing};
use crate::spec::protocol::{ShapePlan, TimeCase};
use crate::spec::template::{Params, Template};
use crate::storage::ledger::{EventKind, IterationRecord, ShapeRecord};

use super::closing::sustained_timeout;
use super::incumbents::Module;
use super::Engine;

/// Stage name of the re-rank's iterations.
pub const RERANK_STAGE: &str = crate::strategy::plan::RESERVED_RERANK;

/// Salt of the re-rank's timing seed (distinct inputs from every iteration's).
const SALT_RERANK: u64 = 0xC105_E5A5;

/// A correct kernel of this run, other than the best, re-timed for one shape.
#[derive(Debug, Clone)]
struct Contender {
    /// The iteration that measured it.
    seq: i64,
    /// Its module id in the worker (not `it<seq>`: that iteration's module may be an
    /// incumbent's for other shapes, loaded with other plans).
    id: String,
    template: String,
    params: Params,
    source: String,
    arch: String,
    kernels: Vec<String>,
    /// The source's hash as its iteration recorded it.
    source_hash: Option<String>,
    plan: ShapePlan,
    /// Its recorded median on this shape (what ranked it).
    recorded_us: f64,
    /// Its row for this shape in that iteration (the check's figures are carried over).
    row: ShapeRecord,
}

impl Engine {
    /// The sustained re-rank (see the module's doc). Ok(Err): the timing could not be made
    /// (recorded as an event by the caller; the best kernels stay as they are). A shape the
    /// ledger already holds a re-rank iteration for (a run resumed during its closing) is
    /// not re-ranked again, and once a `rerank` event is recorded nothing is.
    pub(super) async fn sustained_rerank(&mut self) -> anyhow::Result<Result<(), String>> {
        let events = self.ledger.events(&self.run_id).await?;
        if events.iter().any(|e| e.kind == EventKind::Rerank) {
            tracing::info!(kind = "rerank", "sustained re-rank already made before the resume");
            return Ok(Ok(()));
        }
        if let Err(f) = self.ensure_incumbents_loaded().await {
            return Ok(Err(f.reason));
        }
        let its = self.ledger.iterations(&self.run_id).await?;
        let top = self.cfg.timing.rerank_top as usize;
        let mut cases = Vec::new();
        let mut contenders: BTreeMap<String, Vec<Contender>> = BTreeMap::new();
        let mut notes = Vec::new();
        let keys: Vec<String> = self.shapes.iter().map(|s| s.key()).filter(|k| self.incumbents.contains_key(k)).collect();
        let done = |key: &str| its.iter().any(|i| i.stage == RERANK_STAGE && i.verdict.is_final() && i.shapes.iter().any(|s| s.shape == key));
        // Each shape's contenders (iteration and row), ranked before any is loaded.
        let plan: BTreeMap<String, Ranked> = keys
            .iter()
            .filter(|k| !done(k.as_str()))
            .filter_map(|k| self.incumbents.get(k).map(|inc| (k.clone(), ranked(&its, k, inc.seq, top.saturating_sub(1)))))
            .collect();
        let loading_order = keys.iter().filter_map(|k| plan.get(k).map(|r| (k, r))).flat_map(|(k, r)| r.iter().map(move |(seq, _)| (*seq, k.clone())));
        self.precompile_contenders(&its, loading_order).await;
        for key in keys {
            if done(&key) {
                notes.push(format!("{key} re-ranked before the resume"));
                continue;
            }
            let Some(inc) = self.incumbents.get(&key).cloned() else { continue };
            let mut found = Vec::new();
            for (seq, row) in plan.get(&key).cloned().unwrap_or_default() {
                match self.contender(&its, seq, row).await {
                    Ok(c) => found.push(c),
                    // A kernel that cannot be rebuilt now is left out; the others are still ranked.
                    Err(why) => {
                        tracing::warn!(kind = "rerank", "{key}: iteration {seq} left out of the re-rank: {why}");
                        notes.push(format!("{key}: iteration {seq} left out ({why})"));
                    }
                }
            }
            if found.is_empty() {
                continue;
            }
            let mut entries = vec![timing::entry(&inc.id, &inc.plan)];
            entries.extend(found.iter().map(|c| timing::entry(&c.id, &c.plan)));
            cases.push(TimeCase { shape: inc.plan.shape, entries });
            contenders.insert(key, found);
        }
        if !cases.is_empty() {
            // One request: every shape's contenders interleaved with its best, at one seed.
            let spec = self.closing_spec();
            let timeout = sustained_timeout(self.cfg.worker.time_timeout, &spec, &cases);
            let timed = match timing::run(&mut self.sup, cases, spec, self.seed ^ SALT_RERANK, timeout).await {
                Ok(t) => t,
                Err(f) => {
                    self.unload_contenders(&contenders).await;
                    return Ok(Err(f.reason));
                }
            };
            for case in &timed.cases {
                let key = case.shape.key();
                let (Some(inc), Some(found)) = (self.incumbents.get(&key).cloned(), contenders.get(&key)) else { continue };
                let (Some(inc_s), Some(inc_b)) = (timing::sustained_of(case, &inc.id), timing::stats_of(case, &inc.id)) else {
                    notes.push(format!("{key}: no sustained samples for the best kernel"));
                    continue;
                };
                // The fastest contender under sustained timing, and whether it beats the best.
                let best = found
                    .iter()
                    .filter_map(|c| Some((c, timing::sustained_of(case, &c.id)?, timing::stats_of(case, &c.id)?)))
                    .min_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us));
                let Some((c, c_s, c_b)) = best else { continue };
                // Paired window by window where there are enough windows (else their medians).
                let gain = self.cfg.timing.rerank_min_gain;
                let d = timing::sustained_samples_of(case, &c.id)
                    .zip(timing::sustained_samples_of(case, &inc.id))
                    .and_then(|(c_w, i_w)| decide::decide_samples(c_w, i_w, gain))
                    .unwrap_or_else(|| decide::decide_shape(&c_s, &inc_s, gain));
                if !d.wins {
                    notes.push(format!(
                        "{key} kept #{} ({:.2} us sustained; next #{} {:.2} us, recorded {:.2} us burst; {:.3}x, needed > {:.3}x)",
                        inc.seq,
                        inc_s.median_us,
                        c.seq,
                        c_s.median_us,
                        c.recorded_us,
                        d.speedup,
                        1.0 + d.threshold
                    ));
                    continue;
                }
                let why = format!(
                    "re-ranked under sustained timing: #{} {:.2} us vs incumbent #{} {:.2} us over {:.0} ms back to back ({:.3}x, needed > {:.3}x; burst {:.2} vs {:.2} us; checked correct in iteration {})",
                    c.seq,
                    c_s.median_us,
                    inc.seq,
                    inc_s.median_us,
                    self.closing.sustained_ms,
                    d.speedup,
                    1.0 + d.threshold,
                    c_b.median_us,
                    inc_b.median_us,
                    c.seq
                );
                let seq = self.record_rerank(c, &c_b, &inc_b, &d, case.input_sets, &why).await?;
                notes.push(format!("{key} #{} -> #{} (iteration {seq})", inc.seq, c.seq));
            }
        }
        self.unload_contenders(&contenders).await;
        // The marker a resumed run reads: the re-rank is done, whatever it changed.
        let msg = format!(
            "sustained re-rank (top {top} per shape, {:.0} ms back to back): {}",
            self.closing.sustained_ms,
            if notes.is_empty() { "nothing to re-rank (no other correct kernel)".to_string() } else { notes.join("; ") }
        );
        self.ledger.event(&self.run_id, EventKind::Rerank, &msg).await?;
        tracing::info!(kind = "rerank", "{msg}");
        Ok(Ok(()))
    }

    /// Ask the worker for the builds of these iterations' kernels (each once), in loading
    /// order, before any is loaded: compiled one after the other as each shape loaded its
    /// contenders, they were most of the re-rank's time (81 s for 8 shapes on the H200,
    /// 2026-11-29: 16 loads of ~4.6 s). A kernel that contends for several shapes is then
    /// compiled once per head dim (the worker keeps the builds it loaded). The first
    /// [`PRECOMPILE_SLOTS`](crate::spec::protocol::PRECOMPILE_SLOTS) are asked for, the
    /// first loaded first; a build that is not ready costs nothing but the guess: the load
    /// compiles it.
    async fn precompile_contenders(&mut self, its: &[IterationRecord], contenders: impl Iterator<Item = (i64, String)>) {
        if !self.cfg.worker.lookahead {
            return;  // no background builds asked of this worker
        }
        let mut builds: Vec<crate::spec::protocol::BuildAsk> = Vec::new();
        for (seq, key) in contenders {
            if builds.len() == crate::spec::protocol::PRECOMPILE_SLOTS {
                break;
            }
            // Loaded for one shape: a build of its head dim (one per head dim a kernel contends at).
            let Some(d) = self.shapes.iter().find(|s| s.key() == key).map(|s| s.d) else { continue };
            let Ok((_, source, template)) = self.source_of(its, seq) else { continue };
            let Ok(arch) = template.meta.target_arch(&self.device) else { continue };
            let build = crate::spec::protocol::BuildAsk { source, arch, head_dims: vec![d] };
            if !builds.contains(&build) {
                builds.push(build);
            }
        }
        let windows = self.build_scope([]).windows;
        if let Err(why) = compile::precompile(&mut self.sup, builds, self.cfg.worker.compile_threads, windows, self.cfg.worker.load_timeout).await {
            tracing::debug!(kind = "rerank", "contenders' builds not started ahead: {why}");
        }
    }

    /// Iteration `seq`'s record, its source (from its commit) and that source's template.
    fn source_of<'a>(&self, its: &'a [IterationRecord], seq: i64) -> Result<(&'a IterationRecord, String, Template), String> {
        let it = its.iter().find(|i| i.seq == seq).ok_or("not in the ledger")?;
        let commit = it.git_commit.as_deref().ok_or("no commit")?;
        let source = self
            .ws
            .read_at(commit, "candidate.cu")
            .map_err(|e| crate::error_text::chain(&e))?
            .ok_or_else(|| format!("commit {commit} has no candidate.cu"))?;
        let template = Template::parse("candidate.cu", source.clone()).map_err(|e| e.to_string())?;
        Ok((it, source, template))
    }

    /// Rebuild iteration `seq`'s kernel for one shape and load it: its source from its
    /// commit, its plan from the spec the source carries (as a resumed run rebuilds its
    /// incumbents), checked against what that iteration recorded.
    async fn contender(&mut self, its: &[IterationRecord], seq: i64, row: ShapeRecord) -> Result<Contender, String> {
        let (it, source, template) = self.source_of(its, seq)?;
        let params: Params = serde_json::from_str(&it.params_json).map_err(|e| format!("params {}: {e}", it.params_json))?;
        let shape = self.shapes.iter().find(|s| s.key() == row.shape).copied().ok_or("shape not in the workload")?;
        let plan = template.plan(&params, &shape, &self.device).map_err(|e| e.to_string())?;
        if row.n_splits.is_some_and(|n| n != plan.n_splits as i64) {
            return Err(format!("its plan now has {} splits, {} were timed", plan.n_splits, row.n_splits.unwrap_or(0)));
        }
        let arch = template.meta.target_arch(&self.device)?;
        let mut kernels: Vec<String> = Vec::new();
        for l in &plan.launches {
            if !kernels.contains(&l.kernel) {
                kernels.push(l.kernel.clone());
            }
        }
        let id = format!("rerank{seq}-{}", row.shape);
        let loaded = self.load(&id, &source, &arch, kernels.clone(), std::slice::from_ref(&plan)).await.map_err(|f| f.reason)?;
        self.modules.insert(id.clone(), Module { loaded: Some(loaded), source: source.clone(), arch: arch.clone(), kernels: kernels.clone(), plans: vec![plan.clone()], head_dims: vec![plan.shape.d] });
        let recorded_us = row.median_us.unwrap_or(f64::INFINITY);
        Ok(Contender { seq, id, template: it.template.clone(), params, source, arch, kernels, source_hash: it.source_hash.clone(), plan, recorded_us, row })
    }

    /// A contender that won under sustained timing becomes the shape's best the way every
    /// win does: an iteration (stage [`RERANK_STAGE`]) begun, its kernel committed on `best`,
    /// promoted (incumbent, `kernels/`, dispatch table) and recorded with its best row in one
    /// transaction, before the closing goes on. Returns the iteration's number.
    async fn record_rerank(
        &mut self,
        c: &Contender,
        burst: &Stats,
        incumbent_burst: &Stats,
        d: &decide::ShapeDecision,
        input_sets: u32,
        why: &str,
    ) -> anyhow::Result<i64> {
        let mut rec = self.begin(RERANK_STAGE, &c.template, &c.params).await?;
        let seq = rec.seq;
        let meta = serde_json::json!({
            "iteration": seq, "stage": RERANK_STAGE, "template": c.template, "params": c.params,
            "dtype": self.cfg.workload.dtype, "rerank_of": c.seq, "shape": c.plan.shape.key(),
        });
        let meta_text = serde_json::to_string_pretty(&meta)?;
        let message = format!("iteration {seq}: {RERANK_STAGE} of iteration {} for {}", c.seq, c.plan.shape.key());
        let commit = self.ws.commit_candidate(&[("candidate.cu", &c.source), ("candidate.json", &meta_text)], &message)?;
        rec.git_commit = Some(commit.to_string());
        rec.source_hash = c.source_hash.clone();
        rec.arch = Some(c.arch.clone());
        let key = c.plan.shape.key();
        // The row as the iteration that measured it left it (plan, check), with this timing:
        // the medians are the burst ones, as every row's; the decision is the sustained one.
        let mut rows = vec![ShapeRecord { won: false, ..c.row.clone() }];
        let baseline = self.baseline_us.get(&key).copied();
        record::timed(&mut rows, &key, burst, Some(incumbent_burst), Some(d), baseline, true, input_sets);
        rec.score_us = Some(burst.median_us);
        // Promoting an earlier shape's contender dropped the modules of no incumbent: this one
        // must be known again to be reloaded after a worker restart.
        self.modules.insert(
            c.id.clone(),
            Module { loaded: None, source: c.source.clone(), arch: c.arch.clone(), kernels: c.kernels.clone(), plans: vec![c.plan.clone()], head_dims: vec![c.plan.shape.d] },
        );
        let best_rows = self.promote(seq, &c.id, &c.template, &c.params, &c.source, commit, &[(c.plan.clone(), burst.median_us)]).await?;
        crate::failpoint::hit("rerank-promoted");
        self.conclude_success(rec, commit, Verdict::Accepted, why.to_string(), rows, best_rows).await?;
        tracing::info!(kind = "rerank", shape = %key, "{key}: {why}");
        crate::failpoint::hit("rerank-recorded");
        Ok(seq)
    }

    /// Drop the contenders' modules that did not become a best kernel.
    async fn unload_contenders(&mut self, contenders: &BTreeMap<String, Vec<Contender>>) {
        for c in contenders.values().flatten() {
            self.unload_if_unused(&c.id).await;
        }
    }
}

/// Each iteration's median on shape `key` corrected for drift between iterations, by seq: a
/// kernel's median measures the clocks of its own timing as much as the kernel (the same
/// kernel measured 161.9 and 170.9 us on one shape in one run), but the incumbent it was
/// timed against, interleaved, drifted with it. So each median is expressed in the frame of
/// the shape's first kernel: its chained time (paired_score.rs, which the searches steer by).
/// A row timed with no incumbent (the first kernel) or against one whose win is not in the
/// ledger keeps its raw median.
fn drift_corrected(its: &[IterationRecord], key: &str) -> BTreeMap<i64, f64> {
    super::paired_score::PairedScores::from_iterations(its).chained_on(key)
}

/// The next `n` distinct correct kernels for shape `key` by their drift-corrected median
/// ([`drift_corrected`]), other than the best (iteration `best_seq`, and any iteration with
/// its source): (seq, its row). Correct: checked correct and timed in full on this shape, by
/// an iteration whose verdict says it ran to the end (accepted, rejected, baseline); flagged
/// or cheating ones never.
/// A shape's contenders in rank order: iteration and its row on that shape.
type Ranked = Vec<(i64, ShapeRecord)>;

fn ranked(its: &[IterationRecord], key: &str, best_seq: i64, n: usize) -> Ranked {
    let corrected = drift_corrected(its, key);
    let best_hash = its.iter().find(|i| i.seq == best_seq).and_then(|i| i.source_hash.clone());
    let mut rows: Vec<(i64, Option<String>, ShapeRecord)> = its
        .iter()
        .filter(|i| matches!(i.verdict, Verdict::Accepted | Verdict::Rejected | Verdict::Baseline) && i.stage != RERANK_STAGE)
        .filter(|i| i.seq != best_seq && i.git_commit.is_some())
        .filter(|i| best_hash.is_none() || i.source_hash != best_hash)
        .filter_map(|i| {
            let row = i.shapes.iter().find(|s| s.shape == key && s.check_passed == Some(true) && s.gated.is_none())?;
            row.median_us.filter(|m| m.is_finite() && *m > 0.0)?;
            Some((i.seq, i.source_hash.clone(), row.clone()))
        })
        .collect();
    let time = |seq: i64, row: &ShapeRecord| corrected.get(&seq).copied().or(row.median_us).unwrap_or(f64::INFINITY);
    rows.sort_by(|a, b| time(a.0, &a.2).total_cmp(&time(b.0, &b.2)).then(a.0.cmp(&b.0)));
    let mut seen: Vec<Option<String>> = Vec::new();
    let mut out = Vec::new();
    for (seq, hash, row) in rows {
        if out.len() == n {
            break;
        }
        if hash.is_some() && seen.contains(&hash) {
            continue;
        }
        seen.push(hash);
        out.push((seq, row));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(seq: i64, verdict: Verdict, hash: &str, shapes: &[(&str, f64, bool)]) -> IterationRecord {
        IterationRecord {
            seq,
            verdict,
            source_hash: Some(hash.into()),
            git_commit: Some(format!("{seq:040}")),
            shapes: shapes
                .iter()
                .map(|(k, us, ok)| ShapeRecord { shape: (*k).into(), check_passed: Some(*ok), median_us: Some(*us), ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn contenders_are_the_next_distinct_correct_kernels_by_recorded_time() {
        let its = vec![
            it(1, Verdict::Baseline, "a", &[("s", 30.0, true)]),
            it(2, Verdict::Accepted, "b", &[("s", 20.0, true)]), // the best
            it(3, Verdict::Rejected, "c", &[("s", 21.0, true)]),
            it(4, Verdict::Rejected, "c", &[("s", 20.5, true)]), // same source as 3: once
            it(5, Verdict::Flagged, "d", &[("s", 10.0, true)]),  // never
            it(6, Verdict::Incorrect, "e", &[("s", 11.0, false)]),
            it(7, Verdict::Rejected, "b", &[("s", 20.1, true)]), // the best's source again
            it(8, Verdict::Rejected, "f", &[("other", 1.0, true)]),
        ];
        let got: Vec<i64> = ranked(&its, "s", 2, 2).into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, vec![4, 1], "3 and 4 are one kernel (its faster record ranks it); 5, 6, 7, 8 are not contenders");
    }

    /// Rows of shape "s": (seq, verdict, hash, median, the incumbent's median in the same timing, won).
    fn timed(rows: &[(i64, Verdict, &str, f64, Option<f64>, bool)]) -> Vec<IterationRecord> {
        rows.iter()
            .map(|&(seq, verdict, hash, us, inc, won)| {
                let mut i = it(seq, verdict, hash, &[("s", us, true)]);
                i.shapes[0].incumbent_us = inc;
                i.shapes[0].won = won;
                i
            })
            .collect()
    }

    #[test]
    fn contenders_are_ranked_by_their_time_against_the_incumbent_beside_them() {
        // Issue 20's 4m run, S 577: #46 measured 167.59 us while the incumbent (#11, 161.86 us
        // when it won) measured 170.94 us beside it: a slow stretch of clocks, and in fact the
        // fastest kernel. #14 and #52 were timed at the incumbent's usual clocks.
        let its = timed(&[
            (1, Verdict::Baseline, "a", 617.0, None, true),
            (11, Verdict::Accepted, "b", 161.86, Some(616.96), true),
            (14, Verdict::Rejected, "c", 163.58, Some(163.33), false),
            (46, Verdict::Accepted, "d", 167.59, Some(170.94), false),
            (52, Verdict::Rejected, "e", 164.88, Some(163.55), false),
        ]);
        let c = drift_corrected(&its, "s");
        assert!((c[&11] - 617.0 * 161.86 / 616.96).abs() < 1e-9, "{c:?}");
        assert!((c[&46] - c[&11] * 167.59 / 170.94).abs() < 1e-9, "{c:?}");
        let got: Vec<i64> = ranked(&its, "s", 11, 2).into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, vec![46, 14], "by raw medians it would be 14, 52");
        // A win moves the frame: a later row is measured against the new incumbent's time.
        let its = timed(&[
            (1, Verdict::Baseline, "a", 100.0, None, true),
            (2, Verdict::Accepted, "b", 50.0, Some(100.0), true),
            (3, Verdict::Rejected, "c", 60.0, Some(55.0), false),
        ]);
        let c = drift_corrected(&its, "s");
        assert!((c[&3] - 50.0 * 60.0 / 55.0).abs() < 1e-9, "{c:?}");
        assert!(ranked(&its, "s", 2, 0).is_empty(), "rerank_top = 1: nothing");
        assert!(ranked(&its, "missing", 2, 2).is_empty());
    }
}
