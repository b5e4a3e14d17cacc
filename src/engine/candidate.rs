//! A candidate's one path, whatever proposed it: render -> (memory) -> commit -> gate ->
//! compile -> (screen) -> check -> time -> decide -> record. What differs between proposers (the plan's
//! searches, the open phase, the warm start, the agent) is a [`Policy`], not a second copy
//! of this path.

use std::time::{Duration, Instant};

use crate::pipeline::decide::{self, geomean, ShapeDecision, Stats};
use crate::pipeline::outcome::{Failure, Verdict};
use crate::pipeline::{check, gate, record, render, screen, timing};
use crate::spec::protocol::{Probes, Shape, ShapePlan, Timed};
use crate::spec::template::Params;
use crate::storage::ledger::{self, BestRow, IterationRecord, ShapeRecord};
use crate::strategy::plan::Stage;

use super::incumbents::Module;
use super::{dedup, Engine, Outcome};

/// How a proposer's candidates are treated on the common path.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Answer from the memory of earlier runs when this exact source was timed there on every
    /// shape. Off for the warm start (its job is to re-measure) and for agent edits.
    pub(crate) use_memory: bool,
    /// Run the worker's anti-cheat probes in the check, and check again after timing on
    /// fresh inputs at other addresses (a kernel that caches or skips work fails there).
    pub(crate) probes: bool,
    /// Flag, never accept, a gain beyond `agent.suspicious_speedup` or a throughput beyond
    /// `agent.suspicious_peak_factor` x what SDPA demonstrated on this GPU.
    pub(crate) plausibility: bool,
    /// Screen before the full timing ([`screen`]): a brief timing against the incumbent on one
    /// shape per class rejects a candidate that is far slower everywhere (`timing.early_reject`).
    /// Off for the warm start (it re-measures remembered kernels in full) and agent edits
    /// (probed, re-checked after the full timing).
    pub(crate) screen: bool,
    /// The agent's edit: named in every reason and committed beside the candidate.
    pub(crate) edit: Option<EditNote>,
    /// Where a candidate's configuration came from, when not from this run's search (a
    /// transfer names the similar shapes it was remembered for); leads every reason.
    pub(crate) origin: Option<String>,
}

/// An agent edit, as the workspace commit and the ledger's reasons show it.
#[derive(Debug, Clone)]
pub(crate) struct EditNote {
    pub(crate) summary: String,
    pub(crate) diff: String,
}

impl Policy {
    /// The plan's stages and the open phase.
    pub(crate) fn search() -> Policy {
        Policy { use_memory: true, probes: false, plausibility: false, screen: true, edit: None, origin: None }
    }

    /// The warm start: remembered kernels are run again, not answered from memory.
    pub(crate) fn warm_start() -> Policy {
        Policy { use_memory: false, screen: false, ..Policy::search() }
    }

    /// A configuration transferred from similar shapes: re-checked and re-timed in full like
    /// the warm start, its reasons saying where it came from.
    pub(crate) fn transfer(origin: String) -> Policy {
        Policy { origin: Some(origin), ..Policy::warm_start() }
    }

    /// A language model's edit: probed, re-checked after timing, plausibility-bounded.
    pub(crate) fn agent(summary: &str, diff: &str) -> Policy {
        Policy {
            use_memory: false,
            probes: true,
            plausibility: true,
            screen: false,
            edit: Some(EditNote { summary: summary.to_string(), diff: diff.to_string() }),
            origin: None,
        }
    }

    /// A reason as recorded: prefixed with the edit it concerns, if any.
    fn reason(&self, why: impl std::fmt::Display) -> String {
        match (&self.edit, &self.origin) {
            (Some(e), _) => format!("edit \"{}\": {why}", e.summary),
            (None, Some(o)) => format!("{o}: {why}"),
            (None, None) => why.to_string(),
        }
    }

    fn failure(&self, verdict: Verdict, why: impl std::fmt::Display) -> Failure {
        Failure::new(verdict, self.reason(why))
    }

    fn prefixed(&self, f: Failure) -> Failure {
        Failure { reason: self.reason(&f.reason), ..f }
    }
}

/// One candidate: a stage's template (perhaps an agent's edit of it) at one knob point, on
/// the shapes it is judged on.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) stage: Stage,
    pub(crate) params: Params,
    pub(crate) shapes: Vec<Shape>,
    pub(crate) policy: Policy,
    /// The iteration's `running` row, when the proposer had to write it earlier (an agent
    /// proposal is an iteration from the moment its reply is parsed).
    pub(crate) begun: Option<IterationRecord>,
}

/// The seed of an iteration's inputs: the run's seed mixed with the sequence number.
fn iteration_seed(run_seed: u64, seq: i64) -> u64 {
    run_seed ^ (seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Mixed into the seed of the check after timing, so its inputs differ from the first check's.
const RECHECK_SEED: u64 = 0x5EED_AF7E_4C4E_C4ED;

impl Engine {
    /// Write the `running` row of the next iteration (see `Ledger::begin_iteration`).
    pub(crate) async fn begin(&mut self, stage: &str, template: &str, params: &Params) -> anyhow::Result<IterationRecord> {
        self.seq += 1;
        let rec = IterationRecord {
            run_id: self.run_id.clone(),
            seq: self.seq,
            stage: stage.to_string(),
            template: template.to_string(),
            params_json: serde_json::to_string(params)?,
            started_at: ledger::now(),
            ..Default::default()
        };
        crate::failpoint::set_iteration(rec.seq);
        self.ledger.begin_iteration(&rec, self.used().as_secs_f64()).await?;
        crate::failpoint::hit("iteration-begun");
        Ok(rec)
    }

    /// One candidate's whole life. Returns its outcome for the search that proposed it.
    pub(crate) async fn iterate(&mut self, c: &Candidate) -> anyhow::Result<Outcome> {
        let (stage, params, policy) = (&c.stage, &c.params, &c.policy);
        let mut rec = match &c.begun {
            Some(r) => r.clone(),
            None => self.begin(&stage.spec.name, stage.template.name(), params).await?,
        };
        let seq = rec.seq;
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);

        // render (an edit that does not render was never a kernel)
        let rendered = match render::render(&stage.template, params, self.cfg.workload.dtype, &templates_dir) {
            Ok(r) => r,
            Err(e) => {
                let verdict = if policy.edit.is_some() { Verdict::RejectedProposal } else { Verdict::Error };
                return self.conclude(rec, None, policy.failure(verdict, e), vec![]).await;
            }
        };
        rec.source_hash = Some(rendered.hash.clone());
        if policy.use_memory {
            if let Some(hits) = self.remembered(&rendered.hash, &c.shapes) {
                return self.conclude_remembered(rec, hits).await;
            }
        }
        let commit = self.commit_candidate(c, seq, &rendered)?;
        rec.git_commit = Some(commit.to_string());
        crate::failpoint::hit("candidate-committed");

        // gate (per shape: the candidate goes on with the shapes it fits)
        let gated = match gate::check_each(&stage.template, params, &c.shapes, &self.device, &stage.spec.min_ctas) {
            Ok(g) => g,
            Err(g) => return self.conclude(rec, Some(commit), policy.failure(Verdict::Gated, g.0), vec![]).await,
        };
        let mut plans = gated.plans;
        let mut shapes = record::planned_shapes(&plans);
        record::refused(&mut shapes, &c.shapes, &gated.refused);

        // compile (the gate has already refused a target this device cannot run)
        let arch = match stage.template.meta.target_arch(&self.device) {
            Ok(a) => a,
            Err(why) => return self.conclude(rec, Some(commit), policy.failure(Verdict::Gated, why), shapes).await,
        };
        rec.arch = Some(arch.clone());
        let id = format!("it{seq}");
        let head_dims = dedup(plans.iter().map(|p| p.shape.d));
        let kernels = stage.template.kernel_names(&head_dims);
        let loaded = match self.load(&id, &rendered.source, &arch, kernels.clone(), &plans).await {
            Ok(l) => l,
            Err(f) => return self.conclude(rec, Some(commit), policy.prefixed(f), shapes).await,
        };
        record::resources(&mut rec, &loaded);
        // The gate's last word, now that the built kernels' static shared memory is known.
        let fits = gate::check_loaded(plans, &loaded, &self.device);
        if !fits.refused.is_empty() {
            record::gated_after_compile(&mut shapes, &fits.refused);
            if fits.plans.is_empty() {
                let why: Vec<&str> = fits.refused.iter().map(|(_, w)| w.as_str()).collect();
                return self.conclude(rec, Some(commit), policy.failure(Verdict::Gated, why.join("; ")), shapes).await;
            }
        }
        plans = fits.plans;
        record::waves(&mut shapes, &plans, &loaded, self.device.sm_count);
        self.modules.insert(id.clone(), Module { source: rendered.source.clone(), arch, kernels, plans: plans.clone(), head_dims, loaded: Some(loaded) });

        // screen (search candidates): before the check, whose fp32 reference costs more than a
        // brief timing. A kernel far slower than the incumbents is never accepted, so whether
        // it is correct does not matter; one that passes is checked before its full timing.
        let seed = iteration_seed(self.seed, seq);
        if let Err(f) = self.ensure_incumbents_loaded().await {
            return self.conclude(rec, Some(commit), policy.prefixed(f), shapes).await;
        }
        let mut screen_ms = 0.0;
        if policy.screen {
            let t0 = Instant::now();
            let screened = self.screen(&id, &plans, seed, &mut shapes).await;
            screen_ms = t0.elapsed().as_secs_f64() * 1e3;
            if let Err(f) = screened {
                rec.time_ms = Some(screen_ms);
                return self.conclude(rec, Some(commit), policy.prefixed(f), shapes).await;
            }
        }

        // check
        let probes = Probes { on: policy.probes, after_timing: false };
        let check_started = Instant::now();
        let (timeout, configured) = (self.request_timeout(self.cfg.worker.check_timeout), self.cfg.worker.check_timeout);
        let checked = check::run_probed(&mut self.sup, &id, &plans, self.cfg.tolerance(), seed, timeout, probes)
            .await
            .map_err(|(f, c)| (budget_cut(f, timeout, configured, "worker.check_timeout"), c));
        rec.check_ms = Some(check_started.elapsed().as_secs_f64() * 1e3);
        match checked {
            Ok(checked) => record::checked(&mut shapes, &checked),
            Err((f, checked)) => {
                if let Some(c) = checked {
                    record::checked(&mut shapes, &c);
                }
                return self.conclude(rec, Some(commit), policy.prefixed(f), shapes).await;
            }
        }

        // time (candidate and each shape's incumbent, interleaved; the worker keeps each
        // shape's timing inputs from one request to the next)
        if let Err(f) = self.ensure_incumbents_loaded().await {
            return self.conclude(rec, Some(commit), policy.prefixed(f), shapes).await;
        }
        let time_started = Instant::now();
        let cases = self.against_incumbents(&id, &plans);
        let (timeout, configured) = (self.request_timeout(self.cfg.worker.time_timeout), self.cfg.worker.time_timeout);
        let timed = timing::run(&mut self.sup, cases, self.cfg.timing_spec(), seed, timeout)
            .await
            .map_err(|f| budget_cut(f, timeout, configured, "worker.time_timeout"));
        rec.time_ms = Some(screen_ms + time_started.elapsed().as_secs_f64() * 1e3);
        let timed = match timed {
            Ok(t) => t,
            Err(f) => return self.conclude(rec, Some(commit), policy.prefixed(f), shapes).await,
        };

        if policy.probes {
            let after = Probes { on: true, after_timing: true };
            let t0 = Instant::now();
            let (timeout, configured) = (self.request_timeout(self.cfg.worker.check_timeout), self.cfg.worker.check_timeout);
            let rechecked = check::run_probed(&mut self.sup, &id, &plans, self.cfg.tolerance(), seed ^ RECHECK_SEED, timeout, after)
                .await
                .map_err(|(f, c)| (budget_cut(f, timeout, configured, "worker.check_timeout"), c));
            rec.check_ms = Some(rec.check_ms.unwrap_or(0.0) + t0.elapsed().as_secs_f64() * 1e3);
            if let Err((f, _)) = rechecked {
                // Correct on the first inputs, wrong on the second: it kept something between runs.
                let verdict = if f.verdict == Verdict::Incorrect { Verdict::Cheating } else { f.verdict };
                return self.conclude(rec, Some(commit), policy.prefixed(Failure { verdict, ..f }), shapes).await;
            }
        }

        // decide
        let decided = match self.decide(&id, &plans, &timed, policy, &mut shapes).await? {
            Ok(d) => d,
            Err(f) => return self.conclude(rec, Some(commit), f, shapes).await,
        };
        rec.score_us = decided.score_us;
        // The score is the chained one (paired_score.rs), known once the record is in: below.
        let outcome = Outcome { score: None, won: !decided.won.is_empty() };
        if !decided.implausible.is_empty() {
            for s in &mut shapes {
                s.won = false;
            }
            let why = format!(
                "implausibly fast ({}); re-verified correct on fresh inputs after timing, yet not accepted: a gain this large is a measurement or kernel bug until a person looks",
                decided.implausible.join("; ")
            );
            self.conclude(rec, Some(commit), policy.failure(Verdict::Flagged, why), shapes).await?;
            return Ok(Outcome { won: false, score: self.paired.score(seq) });
        }
        let first_ever = self.incumbents.is_empty();
        let verdict = if first_ever {
            Verdict::Baseline
        } else if decided.won.is_empty() {
            Verdict::Rejected
        } else {
            Verdict::Accepted
        };
        let reason = policy.reason(record::decision_reason(verdict, &shapes));
        let best_rows =
            if decided.won.is_empty() { vec![] } else { self.promote(seq, &id, stage.template.name(), params, &rendered.source, commit, &decided.won).await? };
        self.conclude_success(rec, commit, verdict, reason, shapes, best_rows).await?;
        Ok(Outcome { score: self.paired.score(seq), ..outcome })
    }

    /// The brief timing before the full one ([`screen`]): Err when the candidate is rejected
    /// early (the screened shapes' rows then hold both times) or the brief timing failed.
    /// Nothing is screened while some class of the candidate's shapes has no incumbent.
    async fn screen(&mut self, id: &str, plans: &[ShapePlan], seed: u64, shapes: &mut [ShapeRecord]) -> Result<(), Failure> {
        let margin = self.cfg.timing.early_reject;
        if margin <= 0.0 {
            return Ok(());
        }
        let all: Vec<Shape> = plans.iter().map(|p| p.shape).collect();
        let classes = crate::strategy::open::classify(&all, self.device.sm_count);
        let class_of = |s: &Shape| classes.iter().find(|c| c.shapes.contains(s)).map_or_else(String::new, |c| c.name.clone());
        let Some(picked) = screen::choose(plans, class_of, |s| self.incumbents.get(&s.key()).map(|i| i.median_us)) else { return Ok(()) };
        let cases = self.against_incumbents(id, &picked);
        let (timeout, configured) = (self.request_timeout(self.cfg.worker.time_timeout), self.cfg.worker.time_timeout);
        let timed = timing::run(&mut self.sup, cases, screen::brief(&self.cfg.timing_spec()), seed, timeout)
            .await
            .map_err(|f| budget_cut(f, timeout, configured, "worker.time_timeout"))?;
        let Some(screened) = screen::results(&timed, id) else { return Ok(()) };
        if !screen::rejects(&screened, margin) {
            return Ok(());
        }
        for s in &screened {
            let key = s.shape.key();
            let decision = decide::decide_shape(&s.candidate, &s.incumbent, self.cfg.timing.min_gain);
            let baseline = self.baseline_us.get(&key).copied();
            record::timed(shapes, &key, &s.candidate, Some(&s.incumbent), Some(&decision), baseline, false, s.input_sets);
        }
        Err(Failure::new(Verdict::RejectedEarly, screen::reason(&screened, margin)))
    }

    /// Commit `candidate.cu` and `candidate.json` (and an agent edit's template and diff)
    /// on top of `best`.
    fn commit_candidate(&mut self, c: &Candidate, seq: i64, rendered: &render::Rendered) -> anyhow::Result<git2::Oid> {
        let stage = &c.stage;
        let mut meta = serde_json::json!({
            "iteration": seq, "stage": stage.spec.name, "template": stage.template.name(), "file": stage.template.file,
            "params": c.params, "dtype": self.cfg.workload.dtype, "source_sha256": rendered.hash,
        });
        let meta_text;
        let agent_file = format!("agent/{}", stage.spec.template);
        let mut files: Vec<(&str, &str)> = vec![("candidate.cu", &rendered.source)];
        let message = match &c.policy.edit {
            None => {
                meta_text = serde_json::to_string_pretty(&meta)?;
                files.push(("candidate.json", &meta_text));
                format!("iteration {seq}: {} {}", stage.template.name(), serde_json::to_string(&c.params)?)
            }
            Some(edit) => {
                meta["agent_summary"] = serde_json::Value::from(edit.summary.as_str());
                meta_text = serde_json::to_string_pretty(&meta)?;
                files.extend([("candidate.json", meta_text.as_str()), (&agent_file, &stage.template.text), ("agent/edit.diff", &edit.diff)]);
                format!("iteration {seq}: agent edit of {}: {}\n\n{}", stage.spec.template, edit.summary, edit.diff)
            }
        };
        Ok(self.ws.commit_candidate(&files, &message)?)
    }

    /// Per shape: is the candidate faster than that shape's incumbent beyond noise? Fills
    /// the shapes' timing columns. The inner error is a failure to record (no samples).
    async fn decide(
        &self,
        id: &str,
        plans: &[ShapePlan],
        timed: &Timed,
        policy: &Policy,
        shapes: &mut [ShapeRecord],
    ) -> anyhow::Result<Result<Decided, Failure>> {
        let demonstrated = if policy.plausibility {
            let (figures, _) = self.diagnose().await?;
            figures.iter().filter_map(|f| f.demonstrated_tflops).fold(None::<f64>, |m, t| Some(m.map_or(t, |m| m.max(t))))
        } else {
            None
        };
        let agent = &self.cfg.agent;
        let first_ever = self.incumbents.is_empty();
        let mut out = Decided { won: Vec::new(), score_us: None, implausible: Vec::new() };
        let mut medians = Vec::new();
        for (case, plan) in timed.cases.iter().zip(plans) {
            let key = case.shape.key();
            let Some(cand) = timing::stats_of(case, id) else {
                return Ok(Err(policy.failure(Verdict::Error, format!("{key}: no valid timing samples"))));
            };
            medians.push(cand.median_us);
            let inc_stats: Option<Stats> = self.incumbents.get(&key).and_then(|inc| timing::stats_of(case, &inc.id));
            // Paired: the incumbent's samples were taken in step with the candidate's.
            let cand_samples = timing::samples_of(case, id).unwrap_or_default();
            let inc_samples = self.incumbents.get(&key).and_then(|inc| timing::samples_of(case, &inc.id));
            let decision: Option<ShapeDecision> = inc_samples.and_then(|inc| decide::decide_samples(cand_samples, inc, self.cfg.timing.min_gain));
            if policy.plausibility {
                if let Some(d) = decision.filter(|d| d.speedup > agent.suspicious_speedup) {
                    out.implausible.push(format!("{key} {:.1}x the incumbent (agent.suspicious_speedup = {})", d.speedup, agent.suspicious_speedup));
                }
                let tflops = case.shape.flops() / (cand.median_us * 1e-6) / 1e12;
                if let Some(peak) = demonstrated.filter(|p| tflops > p * agent.suspicious_peak_factor) {
                    out.implausible.push(format!("{key} {tflops:.0} TFLOPS, over {}x the {peak:.0} SDPA demonstrated", agent.suspicious_peak_factor));
                }
            }
            let wins = match decision {
                Some(d) => d.wins,
                None => first_ever || !self.incumbents.contains_key(&key),
            };
            let baseline = self.baseline_us.get(&key).copied();
            record::timed(shapes, &key, &cand, inc_stats.as_ref(), decision.as_ref(), baseline, wins, case.input_sets);
            record::samples(shapes, &key, cand_samples, inc_samples);
            if wins {
                out.won.push((plan.clone(), cand.median_us));
            }
        }
        out.score_us = geomean(medians.iter().copied());
        Ok(Ok(out))
    }

    pub(super) async fn conclude_success(
        &mut self,
        mut rec: IterationRecord,
        commit: git2::Oid,
        verdict: Verdict,
        reason: String,
        shapes: Vec<ShapeRecord>,
        best: Vec<BestRow>,
    ) -> anyhow::Result<()> {
        if best.is_empty() {
            self.ws.revert(commit, rec.seq)?;
        }
        rec.verdict = verdict;
        rec.reason = reason;
        rec.shapes = shapes;
        rec.finished_at = ledger::now();
        self.ledger.record_iteration(&rec, &best, self.used().as_secs_f64()).await?;
        self.paired.observe(&rec);
        self.log_iteration(&rec);
        self.unload_if_unused(&format!("it{}", rec.seq)).await;
        Ok(())
    }

    /// Record a candidate that stopped at some step; revert the workspace.
    pub(crate) async fn conclude(
        &mut self,
        mut rec: IterationRecord,
        commit: Option<git2::Oid>,
        f: Failure,
        shapes: Vec<ShapeRecord>,
    ) -> anyhow::Result<Outcome> {
        if let Some(c) = commit {
            self.ws.revert(c, rec.seq)?;
        }
        rec.verdict = f.verdict;
        rec.reason = f.reason;
        rec.error = f.error;
        rec.shapes = shapes;
        rec.finished_at = ledger::now();
        self.ledger.record_iteration(&rec, &[], self.used().as_secs_f64()).await?;
        self.paired.observe(&rec);
        self.log_iteration(&rec);
        self.unload_if_unused(&format!("it{}", rec.seq)).await;
        Ok(Outcome::FAILED)
    }
}

/// What the decision found over a candidate's shapes.
struct Decided {
    /// Shapes where it beat the incumbent (or had none), with its median there.
    won: Vec<(ShapePlan, f64)>,
    /// Geometric mean of its medians over the timed shapes.
    score_us: Option<f64>,
    /// Why its speed is not believable (plausibility-bounded candidates only).
    implausible: Vec<String>,
}

/// A timeout that the budget's end cut short (`Engine::request_timeout`) says so, and
/// which setting it was under: "no answer within 12s" alone reads as a hung kernel.
fn budget_cut(f: Failure, timeout: Duration, configured: Duration, key: &str) -> Failure {
    if f.verdict == Verdict::Timeout && timeout < configured {
        let reason = format!("{} (the budget's end; {key} is {})", f.reason, humantime::format_duration(configured));
        Failure { reason, ..f }
    } else {
        f
    }
}
