//! The agent stage (`search = "agent"` in a plan): ask the configured chat endpoint for
//! edits of the stage's template, and take each proposal through the same gate, compile,
//! check, timing, decision and revert path as any candidate, plus the anti-cheat probes
//! (static refusal first; guard regions, input comparison and a second-stream rerun in
//! the check; a re-check on fresh inputs at other addresses after timing; implausible
//! speed flagged, never accepted).
//!
//! Every request is in the ledger before it is sent and its reply before any proposal of
//! it is evaluated, so a resumed run evaluates what is left of stored replies without
//! asking again, and only re-asks a request whose reply never arrived. A failing
//! endpoint, or a reached limit, ends the stage with the reason recorded; the plan goes on.

use std::time::Instant;

use crate::agent::client::{parse_reply, ChatClient};
use crate::agent::{anticheat, edits, prompt};
use crate::pipeline::decide::{self, geomean, Stats};
use crate::pipeline::outcome::{Failure, Verdict};
use crate::pipeline::{check, gate, record, render, timing};
use crate::spec::protocol::{Probes, ShapePlan};
use crate::spec::template::{Params, Template};
use crate::storage::agent_log::{ProposalRow, ReplyCost};
use crate::storage::ledger::{self, IterationRecord};
use crate::strategy::plan::Stage;

use super::incumbents::Module;
use super::{dedup, Engine, RunEnd};

/// How the stage's loop goes on after one proposal.
enum Next {
    Continue,
    End(RunEnd),
}

impl Engine {
    /// Run one agent stage. Some(end) when the run itself must end (stop, budget).
    pub(super) async fn agent_stage(&mut self, stage: &Stage) -> anyhow::Result<Option<RunEnd>> {
        let name = stage.spec.name.clone();
        if !self.cfg.agent.enabled() {
            let msg = format!(
                "stage {name} skipped: the agent is off (no [agent] base_url in {}); set agent.base_url and agent.model to use it",
                self.cfg.source.display()
            );
            self.agent_event_once("stage_skipped", &msg).await?;
            tracing::info!(kind = "stage_skipped", stage = %name, "{msg}");
            return Ok(None);
        }
        let client = match ChatClient::new(&self.cfg.agent) {
            Ok(c) => c,
            Err(e) => {
                self.agent_end(&name, &format!("cannot start: {e}")).await?;
                return Ok(None);
            }
        };
        let interrupted = self.ledger.agent_mark_interrupted(&self.run_id).await?;
        if interrupted > 0 {
            self.ledger
                .event(&self.run_id, "agent_resumed", &format!("{name}: {interrupted} request(s) in flight when the daemon died are asked again"))
                .await?;
        }
        self.ledger.set_progress(&self.run_id, Some(&name), self.used().as_secs_f64()).await?;

        // Where the stage starts: its params (recorded once), and the template text of
        // its last accepted proposal (edits build on each other).
        let start_key = format!("{name} start ");
        let recorded_start = self
            .ledger
            .events(&self.run_id)
            .await?
            .into_iter()
            .filter(|(_, kind, _)| kind == "stage_start")
            .find_map(|(_, _, m)| m.strip_prefix(&start_key).and_then(|j| serde_json::from_str::<Params>(j).ok()));
        let params = match recorded_start {
            Some(p) => p,
            None => {
                let p = self.best_params_for(stage).unwrap_or_else(|| stage.start.clone());
                self.ledger.event(&self.run_id, "stage_start", &format!("{start_key}{}", serde_json::to_string(&p)?)).await?;
                tracing::info!(kind = "stage", stage = %name, "stage {name}: {} (agent edits of {} via {})", stage.spec.description, stage.spec.template, client.url());
                p
            }
        };
        let iterations = self.ledger.iterations(&self.run_id).await?;
        let finished = |seq: i64| iterations.iter().any(|i| i.seq == seq && i.verdict != "running" && i.verdict != "interrupted");
        let proposals: Vec<ProposalRow> = self.ledger.agent_proposals(&self.run_id).await?;
        let requests: Vec<_> = self.ledger.agent_requests(&self.run_id).await?.into_iter().filter(|r| r.stage == name).collect();
        let mut base_text = stage.template.text.clone();
        for p in &proposals {
            let in_stage = requests.iter().any(|r| r.id == p.request_id);
            let accepted = iterations.iter().any(|i| i.seq == p.seq && (i.verdict == "accepted" || i.verdict == "baseline"));
            if in_stage && accepted {
                if let Some(t) = &p.template_text {
                    base_text = t.clone();
                }
            }
        }
        let mut evaluated = proposals.iter().filter(|p| requests.iter().any(|r| r.id == p.request_id) && finished(p.seq)).count() as u32;

        // Replies already in the ledger (a resumed run): evaluate what is left of them.
        for req in requests.iter().filter(|r| r.status == "replied") {
            let Some(body) = &req.reply_text else { continue };
            let Ok((choices, _)) = parse_reply(body) else { continue };
            for (ci, text) in choices.iter().enumerate() {
                let done = proposals.iter().any(|p| p.request_id == req.id && p.choice == ci as i64 && finished(p.seq));
                if done {
                    continue;
                }
                if evaluated >= stage.spec.max_candidates {
                    break;
                }
                if let Next::End(end) = self.agent_proposal(stage, &mut base_text, &params, req.id, ci, text).await? {
                    return Ok(Some(end));
                }
                evaluated += 1;
            }
        }

        let mut ordinal = requests.iter().map(|r| r.ordinal).max().unwrap_or(0);
        loop {
            if evaluated >= stage.spec.max_candidates {
                self.agent_end(&name, &format!("max_candidates ({}) proposals evaluated", stage.spec.max_candidates)).await?;
                return Ok(None);
            }
            if self.shutdown.requested() {
                return Ok(Some(RunEnd::Stopped));
            }
            if !self.budget_left() {
                return Ok(Some(RunEnd::Finished("budget spent".into())));
            }
            let messages = self.agent_prompt(stage, &base_text, &params).await?;
            let body = ChatClient::body(&self.cfg.agent, &messages);
            let usage = self.ledger.agent_usage(&self.run_id).await?;
            if let Some(why) = usage.refuse(&self.cfg.agent, body.to_string().len()) {
                self.agent_end(&name, &format!("limit reached: {why}")).await?;
                return Ok(None);
            }
            ordinal += 1;
            let hash = prompt::hash(&body);
            let id = self
                .ledger
                .agent_request_begin(&self.run_id, &name, ordinal, client.url(), &self.cfg.agent.model, &hash, &serde_json::to_string(&messages)?)
                .await?;
            crate::daemon::failpoint::hit("agent-request-sent");
            tracing::info!(kind = "agent_request", stage = %name, request = ordinal, prompt_hash = %hash, "agent request {ordinal} to {} ({})", client.url(), self.cfg.agent.model);
            let t0 = Instant::now();
            let reply = client.complete(&body).await;
            let latency_ms = t0.elapsed().as_secs_f64() * 1e3;
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    self.ledger.agent_request_failed(id, &e.to_string(), latency_ms).await?;
                    self.agent_end(&name, &format!("request {ordinal} failed: {e}")).await?;
                    return Ok(None);
                }
            };
            let cost = ReplyCost {
                prompt_tokens: reply.prompt_tokens,
                completion_tokens: reply.completion_tokens,
                tokens_estimated: reply.tokens_estimated,
                latency_ms,
                attempts: reply.attempts,
                cost_usd: self.cfg.agent.cost(reply.prompt_tokens, reply.completion_tokens),
            };
            self.ledger.agent_request_replied(id, &cost, &reply.body).await?;
            crate::daemon::failpoint::hit("agent-reply-stored");
            tracing::info!(
                kind = "agent_reply", stage = %name, request = ordinal, prompt_tokens = cost.prompt_tokens, completion_tokens = cost.completion_tokens,
                cost_usd = cost.cost_usd, latency_ms, "agent reply {ordinal}: {} choice(s), {} + {} tokens, ${:.4}, {:.1} s",
                reply.choices.len(), cost.prompt_tokens, cost.completion_tokens, cost.cost_usd, latency_ms / 1e3
            );
            for (ci, text) in reply.choices.iter().enumerate() {
                if evaluated >= stage.spec.max_candidates {
                    break;
                }
                if let Next::End(end) = self.agent_proposal(stage, &mut base_text, &params, id, ci, text).await? {
                    return Ok(Some(end));
                }
                evaluated += 1;
            }
        }
    }

    /// An `agent-tuning` stage: `stage` with its template replaced by the latest accepted
    /// agent edit of it in this run (named like the iteration that made it, so the search
    /// starts from that kernel's knobs and score). None (recorded) when there is none.
    pub(super) async fn agent_tuning_stage(&mut self, stage: &Stage) -> anyhow::Result<Option<Stage>> {
        let prefix = format!("{}+agent#", stage.template.name());
        // The edit behind the newest acceptance of any `<name>+agent#<seq>` template (an
        // agent iteration itself, or a tuning of it): `<seq>` names the proposal.
        let edit_seq = self
            .ledger
            .iterations(&self.run_id)
            .await?
            .into_iter()
            .filter(|i| i.verdict == "accepted")
            .filter_map(|i| i.template.strip_prefix(&prefix).and_then(|n| n.parse::<i64>().ok()).map(|e| (i.seq, e)))
            .max()
            .map(|(_, e)| e);
        let proposal = match edit_seq {
            Some(e) => self.ledger.agent_proposals(&self.run_id).await?.into_iter().find(|p| p.seq == e),
            None => None,
        };
        let (Some(e), Some(text)) = (edit_seq, proposal.and_then(|p| p.template_text)) else {
            let msg = format!("stage {} skipped: no accepted agent edit of {} to tune", stage.spec.name, stage.spec.template);
            self.agent_event_once("stage_skipped", &msg).await?;
            tracing::info!(kind = "stage_skipped", stage = %stage.spec.name, "{msg}");
            return Ok(None);
        };
        let mut template = Template::parse(&stage.spec.template, text)?;
        template.meta.name = format!("{prefix}{e}");
        let mut tuned = stage.clone();
        tuned.template = template;
        Ok(Some(tuned))
    }

    /// The stage ended early or normally: say why, in the ledger and the log.
    async fn agent_end(&mut self, stage: &str, why: &str) -> anyhow::Result<()> {
        let msg = format!("{stage}: {why}; the plan goes on");
        tracing::warn!(kind = "agent_stage_end", stage = %stage, "agent stage {msg}");
        self.ledger.event(&self.run_id, "agent_stage_end", &msg).await?;
        Ok(())
    }

    async fn agent_event_once(&mut self, kind: &str, msg: &str) -> anyhow::Result<()> {
        let seen = self.ledger.events(&self.run_id).await?.into_iter().any(|(_, k, m)| k == kind && m == msg);
        if !seen {
            self.ledger.event(&self.run_id, kind, msg).await?;
        }
        Ok(())
    }

    /// What the model is told: diagnosis, history, GPU, the template to edit.
    async fn agent_prompt(&self, stage: &Stage, base_text: &str, params: &Params) -> anyhow::Result<Vec<crate::agent::client::Message>> {
        let (figures, findings) = self.diagnose().await?;
        let sdpa = self.ledger.sdpa(&self.run_id).await?;
        let mut diagnosis = Vec::new();
        for f in &figures {
            let inc = self.incumbents.get(&f.shape);
            let sdpa_us = sdpa
                .iter()
                .find(|r| r.shape == f.shape)
                .and_then(|r| r.backends.as_object().map(|b| b.iter().filter_map(|(k, v)| v.get("graph_us").and_then(|t| t.as_f64()).map(|t| format!("{k} {t:.1} us"))).collect::<Vec<_>>()))
                .filter(|v| !v.is_empty())
                .map(|v| format!("SDPA {}", v.join(", ")))
                .unwrap_or_else(|| "SDPA not measured".into());
            let regs = inc.and_then(|i| self.modules.get(&i.id)).and_then(|m| m.loaded.as_ref()).and_then(|l| l.kernels.first()).map(|k| {
                format!("{} registers, {} B static shared, {} B local (spills)", k.registers, k.static_smem, k.local_bytes)
            });
            let found: Vec<String> = findings.iter().filter(|x| x.shape == f.shape).map(|x| x.detail.clone()).collect();
            diagnosis.push(format!(
                "{}: best {:.1} us by {} {} = {:.1} TFLOPS{}; {sdpa_us}; {} CTAs on {} SMs ({:.2} waves of one CTA per SM){}{}{}",
                f.shape,
                f.median_us,
                inc.map_or("?", |i| i.template.as_str()),
                inc.map(|i| serde_json::to_string(&i.params).unwrap_or_default()).unwrap_or_default(),
                f.tflops(),
                f.demonstrated_tflops.map(|d| format!(" (SDPA demonstrated {d:.1} TFLOPS on this GPU)")).unwrap_or_default(),
                f.ctas,
                f.sm_count,
                f.ctas as f64 / f.sm_count.max(1) as f64,
                f.warps_per_sm.map(|w| format!(", {w} warps per SM")).unwrap_or_default(),
                regs.map(|r| format!(", {r}")).unwrap_or_default(),
                if found.is_empty() { String::new() } else { format!("; symptoms: {}", found.join(", ")) }
            ));
        }
        if diagnosis.is_empty() {
            diagnosis.push("no kernel has been measured yet".into());
        }
        // The target: the shapes furthest from what the GPU has shown it can do.
        let mut slow: Vec<(f64, String)> = figures
            .iter()
            .map(|f| (f.tflops() / f.demonstrated_tflops.unwrap_or(f.tflops().max(1e-9)), f.shape.clone()))
            .collect();
        slow.sort_by(|a, b| a.0.total_cmp(&b.0));
        let target = if slow.is_empty() {
            "every workload shape".to_string()
        } else {
            format!("every workload shape, above all {}", slow.iter().take(3).map(|(_, s)| s.as_str()).collect::<Vec<_>>().join(", "))
        };
        let proposals = self.ledger.agent_proposals(&self.run_id).await?;
        let its = self.ledger.iterations(&self.run_id).await?;
        let n = self.cfg.agent.history_lines as usize;
        let history: Vec<String> = its
            .iter()
            .skip(its.len().saturating_sub(n))
            .map(|i| {
                let edit = proposals.iter().find(|p| p.seq == i.seq).map(|p| format!(" edit \"{}\"", p.summary)).unwrap_or_default();
                let reason: String = i.reason.chars().take(160).collect();
                format!(
                    "#{} {} {} {}{edit}: {} ({}){}",
                    i.seq,
                    i.stage,
                    i.template,
                    i.params_json,
                    i.verdict,
                    i.score_us.map(|s| format!("{s:.1} us geomean")).unwrap_or_else(|| "-".into()),
                    if reason.is_empty() { String::new() } else { format!(": {reason}") }
                )
            })
            .collect();
        let input = prompt::PromptInput {
            template_file: &stage.spec.template,
            template_text: base_text,
            params,
            dtype: self.cfg.workload.dtype.as_str(),
            device: &self.device,
            target,
            diagnosis,
            history,
            allowed_headers: &self.cfg.agent.allowed_headers,
        };
        Ok(prompt::messages(&input))
    }

    /// One proposal (choice `choice` of request `request_id`): an iteration of its own.
    async fn agent_proposal(
        &mut self,
        stage: &Stage,
        base_text: &mut String,
        params: &Params,
        request_id: i64,
        choice: usize,
        reply: &str,
    ) -> anyhow::Result<Next> {
        if self.shutdown.requested() {
            return Ok(Next::End(RunEnd::Stopped));
        }
        if !self.budget_left() {
            return Ok(Next::End(RunEnd::Finished("budget spent".into())));
        }
        self.seq += 1;
        let seq = self.seq;
        // Each edit is a template of its own: `mma-fa2+agent#12` (the iteration that made it).
        let agent_name = format!("{}+agent#{seq}", stage.template.name());
        let rec = IterationRecord {
            run_id: self.run_id.clone(),
            seq,
            stage: stage.spec.name.clone(),
            template: agent_name.clone(),
            params_json: serde_json::to_string(params)?,
            started_at: ledger::now(),
            ..Default::default()
        };
        crate::daemon::failpoint::set_iteration(seq);
        self.ledger.begin_iteration(&rec, self.used().as_secs_f64()).await?;
        let mut row = ProposalRow { seq, request_id, choice: choice as i64, summary: "(unparsable reply)".into(), diff: None, template_text: None };

        // Parse, apply, refuse statically: none of this compiles anything.
        let reject = |why: String| Failure::new(Verdict::RejectedProposal, why);
        let proposal = match edits::parse(reply) {
            Ok(p) => p,
            Err(why) => {
                self.ledger.agent_proposal(&self.run_id, &row).await?;
                self.conclude(rec, None, Err(reject(format!("reply: {why}"))), vec![]).await?;
                return Ok(Next::Continue);
            }
        };
        row.summary = proposal.summary.clone();
        let edited = match edits::apply(base_text, &proposal) {
            Ok(t) => t,
            Err(why) => {
                self.ledger.agent_proposal(&self.run_id, &row).await?;
                let reason = format!("edit \"{}\": does not apply: {why}", proposal.summary);
                self.conclude(rec, None, Err(reject(reason)), vec![]).await?;
                return Ok(Next::Continue);
            }
        };
        row.diff = Some(edits::diff(base_text, &edited, &stage.spec.template));
        row.template_text = Some(edited.clone());
        self.ledger.agent_proposal(&self.run_id, &row).await?;
        let base_template = Template::parse(&stage.spec.template, base_text.clone())?;
        if let Err(why) = anticheat::check(&base_template, &edited, &self.cfg.agent.allowed_headers) {
            let reason = format!("edit \"{}\": anti-cheat: {why}", proposal.summary);
            self.conclude(rec, None, Err(reject(reason)), vec![]).await?;
            return Ok(Next::Continue);
        }
        let mut template = match Template::parse(&stage.spec.template, edited.clone()) {
            Ok(t) => t,
            Err(e) => {
                let reason = format!("edit \"{}\": the template no longer parses: {e}", proposal.summary);
                self.conclude(rec, None, Err(reject(reason)), vec![]).await?;
                return Ok(Next::Continue);
            }
        };
        template.meta.name = agent_name;
        let mut edited_stage = stage.clone();
        edited_stage.template = template;
        let diff = row.diff.clone().unwrap_or_default();
        let accepted = self.agent_iterate(&edited_stage, params, rec, &proposal.summary, &diff).await?;
        if accepted {
            *base_text = edited;
        }
        if let Some(end) = self.recover_worker().await {
            return Ok(Next::End(end));
        }
        Ok(Next::Continue)
    }

    /// The candidate's life with probes: like `Engine::iterate`, plus the probed check,
    /// the re-check after timing, and the plausibility flag. True when it was accepted.
    async fn agent_iterate(&mut self, stage: &Stage, params: &Params, mut rec: IterationRecord, summary: &str, diff: &str) -> anyhow::Result<bool> {
        let seq = rec.seq;
        let shapes_in = self.shapes.clone();
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);
        let edit = format!("edit \"{summary}\"");
        let fail = |v: Verdict, why: String| Failure::new(v, format!("{edit}: {why}"));

        let rendered = match render::render(&stage.template, params, self.cfg.workload.dtype, &templates_dir) {
            Ok(r) => r,
            Err(e) => {
                self.conclude(rec, None, Err(fail(Verdict::RejectedProposal, e.to_string())), vec![]).await?;
                return Ok(false);
            }
        };
        rec.source_hash = Some(rendered.hash.clone());
        let meta = serde_json::json!({
            "iteration": seq, "stage": stage.spec.name, "template": stage.template.name(), "file": stage.template.file,
            "params": params, "dtype": self.cfg.workload.dtype, "source_sha256": rendered.hash, "agent_summary": summary,
        });
        let agent_file = format!("agent/{}", stage.spec.template);
        let commit = self.ws.commit_candidate(
            &[
                ("candidate.cu", &rendered.source),
                ("candidate.json", &serde_json::to_string_pretty(&meta)?),
                (&agent_file, &stage.template.text),
                ("agent/edit.diff", diff),
            ],
            &format!("iteration {seq}: agent edit of {}: {summary}\n\n{diff}", stage.spec.template),
        )?;
        rec.git_commit = Some(commit.to_string());

        let gated = match gate::check_each(&stage.template, params, &shapes_in, &self.device, &stage.spec.min_ctas) {
            Ok(g) => g,
            Err(g) => {
                self.conclude(rec, Some(commit), Err(fail(Verdict::Gated, g.0)), vec![]).await?;
                return Ok(false);
            }
        };
        let plans = gated.plans;
        let mut shapes = record::planned_shapes(&plans);
        record::refused(&mut shapes, &shapes_in, &gated.refused);
        let arch = match stage.template.meta.target_arch(&self.device) {
            Ok(a) => a,
            Err(why) => {
                self.conclude(rec, Some(commit), Err(fail(Verdict::Gated, why)), shapes).await?;
                return Ok(false);
            }
        };
        rec.arch = Some(arch.clone());
        let id = format!("it{seq}");
        let head_dims: Vec<u32> = dedup(plans.iter().map(|p| p.shape.d));
        let kernels = stage.template.kernel_names(&head_dims);
        let loaded = match self.load(&id, &rendered.source, &arch, kernels.clone(), &plans).await {
            Ok(l) => l,
            Err(f) => {
                let f = Failure { reason: format!("{edit}: {}", f.reason), ..f };
                self.conclude(rec, Some(commit), Err(f), shapes).await?;
                return Ok(false);
            }
        };
        record::resources(&mut rec, &loaded);
        record::waves(&mut shapes, &plans, &loaded, self.device.sm_count);
        self.modules.insert(id.clone(), Module { source: rendered.source.clone(), arch, kernels, plans: plans.clone(), loaded: Some(loaded.clone()) });

        // Check with the probes.
        let seed = self.seed ^ (seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let t0 = Instant::now();
        let probes = Probes { on: true, after_timing: false };
        let checked = check::run_probed(&mut self.sup, &id, &plans, self.cfg.tolerance(), seed, self.cfg.worker.check_timeout, probes).await;
        rec.check_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        match checked {
            Ok(c) => record::checked(&mut shapes, &c),
            Err((f, c)) => {
                if let Some(c) = c {
                    record::checked(&mut shapes, &c);
                }
                let f = Failure { reason: format!("{edit}: {}", f.reason), ..f };
                self.conclude(rec, Some(commit), Err(f), shapes).await?;
                return Ok(false);
            }
        }

        // Time against the incumbents.
        if let Err(f) = self.ensure_incumbents_loaded().await {
            self.conclude(rec, Some(commit), Err(f), shapes).await?;
            return Ok(false);
        }
        let cases = self.against_incumbents(&id, &plans);
        let t0 = Instant::now();
        let timed = timing::run(&mut self.sup, cases, self.cfg.timing_spec(), seed, self.cfg.worker.time_timeout).await;
        rec.time_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        let timed = match timed {
            Ok(t) => t,
            Err(f) => {
                self.conclude(rec, Some(commit), Err(f), shapes).await?;
                return Ok(false);
            }
        };

        // Re-check after timing on fresh inputs at other addresses: a kernel that caches
        // or skips work once it has run fails here.
        let after = Probes { on: true, after_timing: true };
        let t0 = Instant::now();
        let rechecked = check::run_probed(&mut self.sup, &id, &plans, self.cfg.tolerance(), seed ^ 0x5EED_AF7E_4C4E_C4ED, self.cfg.worker.check_timeout, after).await;
        rec.check_ms = Some(rec.check_ms.unwrap_or(0.0) + t0.elapsed().as_secs_f64() * 1e3);
        if let Err((f, _)) = rechecked {
            let verdict = if f.verdict == Verdict::Incorrect { Verdict::Cheating } else { f.verdict };
            let f = Failure { verdict, reason: format!("{edit}: {}", f.reason), ..f };
            self.conclude(rec, Some(commit), Err(f), shapes).await?;
            return Ok(false);
        }

        // Decide, with a plausibility bound on the gain.
        let (figures, _) = self.diagnose().await?;
        let demonstrated = figures.iter().filter_map(|f| f.demonstrated_tflops).fold(None::<f64>, |m, t| Some(m.map_or(t, |m| m.max(t))));
        let mut won: Vec<(ShapePlan, f64)> = Vec::new();
        let mut medians = Vec::new();
        let mut implausible: Vec<String> = Vec::new();
        let first_ever = self.incumbents.is_empty();
        for (case, plan) in timed.cases.iter().zip(&plans) {
            let key = case.shape.key();
            let Some(cand) = timing::stats_of(case, &id) else {
                self.conclude(rec, Some(commit), Err(fail(Verdict::Error, format!("{key}: no valid timing samples"))), shapes).await?;
                return Ok(false);
            };
            medians.push(cand.median_us);
            let inc_stats: Option<Stats> = self.incumbents.get(&key).and_then(|inc| timing::stats_of(case, &inc.id));
            let decision = inc_stats.map(|inc| decide::decide_shape(&cand, &inc, self.cfg.timing.min_gain));
            let tflops = case.shape.flops() / (cand.median_us * 1e-6) / 1e12;
            if let Some(d) = decision.filter(|d| d.speedup > self.cfg.agent.suspicious_speedup) {
                implausible.push(format!("{key} {:.1}x the incumbent (agent.suspicious_speedup = {})", d.speedup, self.cfg.agent.suspicious_speedup));
            }
            if let Some(peak) = demonstrated.filter(|p| tflops > p * self.cfg.agent.suspicious_peak_factor) {
                implausible.push(format!("{key} {tflops:.0} TFLOPS, over {}x the {peak:.0} SDPA demonstrated", self.cfg.agent.suspicious_peak_factor));
            }
            let wins = match decision {
                Some(d) => d.wins,
                None => first_ever || !self.incumbents.contains_key(&key),
            };
            let baseline = self.baseline_us.get(&key).copied();
            record::timed(&mut shapes, &key, &cand, inc_stats.as_ref(), decision.as_ref(), baseline, wins, case.input_sets);
            if wins {
                won.push((plan.clone(), cand.median_us));
            }
        }
        rec.score_us = geomean(medians.iter().copied());
        if !implausible.is_empty() {
            for s in &mut shapes {
                s.won = false;
            }
            let why = format!(
                "implausibly fast ({}); re-verified correct on fresh inputs after timing, yet not accepted: a gain this large is a measurement or kernel bug until a person looks",
                implausible.join("; ")
            );
            self.conclude(rec, Some(commit), Err(fail(Verdict::Flagged, why)), shapes).await?;
            return Ok(false);
        }
        let verdict = if first_ever {
            Verdict::Baseline
        } else if won.is_empty() {
            Verdict::Rejected
        } else {
            Verdict::Accepted
        };
        let reason = format!("{edit}: {}", record::decision_reason(verdict, &shapes));
        let best_rows = if won.is_empty() { vec![] } else { self.promote(seq, &id, stage, params, &rendered.source, commit, &won).await? };
        let accepted = !best_rows.is_empty();
        self.conclude_success(rec, commit, verdict, reason, shapes, best_rows).await?;
        Ok(accepted)
    }
}
