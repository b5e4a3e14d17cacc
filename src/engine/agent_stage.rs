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

use std::collections::VecDeque;
use std::time::Instant;

use crate::agent::client::{parse_reply, ChatClient};
use crate::agent::{anticheat, edits, prompt};
use crate::pipeline::outcome::{Failure, Verdict};
use crate::spec::template::{Params, Template};
use crate::storage::agent_log::{ProposalRow, ReplyCost, RequestStatus};
use crate::storage::ledger::{EventKind, Event, StageHistory};
use crate::strategy::plan::Stage;

use super::candidate::{Candidate, Policy};
use super::phase::{Next, Proposer};
use super::{Engine, Outcome, RunEnd};

/// An agent stage's source of candidates: replies already stored, then new requests.
struct AgentProposer {
    stage: Stage,
    client: ChatClient,
    /// The knob values every edit is rendered with.
    params: Params,
    /// The template text edits apply to: the stage's, or its last accepted edit.
    base_text: String,
    /// Replies' choices not yet evaluated: (request id, choice, text).
    queue: VecDeque<(i64, usize, String)>,
    /// Proposals evaluated in this stage so far (against `max_candidates`).
    evaluated: u32,
    /// The last request's number within the run.
    ordinal: i64,
}

impl Proposer for AgentProposer {
    async fn next(&mut self, engine: &mut Engine) -> anyhow::Result<Next> {
        let name = self.stage.spec.name.clone();
        let max = self.stage.spec.max_candidates;
        if self.evaluated >= max {
            engine.agent_end(&name, &format!("max_candidates ({max}) proposals evaluated")).await?;
            return Ok(Next::Done);
        }
        if let Some((request_id, choice, text)) = self.queue.pop_front() {
            self.evaluated += 1;
            return self.proposal(engine, request_id, choice, &text).await;
        }
        // Nothing left to evaluate: ask for more (recorded before sending, so a resumed run
        // never pays twice for one request).
        let messages = engine.agent_prompt(&self.stage, &self.base_text, &self.params).await?;
        let body = ChatClient::body(&engine.cfg.agent, &messages);
        let usage = engine.ledger.agent_usage(&engine.run_id).await?;
        if let Some(why) = usage.refuse(&engine.cfg.agent, body.to_string().len()) {
            engine.agent_end(&name, &format!("limit reached: {why}")).await?;
            return Ok(Next::Done);
        }
        self.ordinal += 1;
        let ordinal = self.ordinal;
        let hash = prompt::hash(&body);
        let model = engine.cfg.agent.model.clone();
        let id = engine
            .ledger
            .agent_request_begin(&engine.run_id, &name, ordinal, self.client.url(), &model, &hash, &serde_json::to_string(&messages)?)
            .await?;
        crate::failpoint::hit("agent-request-sent");
        tracing::info!(kind = "agent_request", stage = %name, request = ordinal, prompt_hash = %hash, "agent request {ordinal} to {} ({model})", self.client.url());
        let t0 = Instant::now();
        let reply = self.client.complete(&body).await;
        let latency_ms = t0.elapsed().as_secs_f64() * 1e3;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                engine.ledger.agent_request_failed(id, &e.to_string(), latency_ms).await?;
                engine.agent_end(&name, &format!("request {ordinal} failed: {e}")).await?;
                return Ok(Next::Done);
            }
        };
        let cost = ReplyCost {
            prompt_tokens: reply.prompt_tokens,
            completion_tokens: reply.completion_tokens,
            tokens_estimated: reply.tokens_estimated,
            latency_ms,
            attempts: reply.attempts,
            cost_usd: engine.cfg.agent.cost(reply.prompt_tokens, reply.completion_tokens),
        };
        engine.ledger.agent_request_replied(id, &cost, &reply.body).await?;
        crate::failpoint::hit("agent-reply-stored");
        tracing::info!(
            kind = "agent_reply", stage = %name, request = ordinal, prompt_tokens = cost.prompt_tokens, completion_tokens = cost.completion_tokens,
            cost_usd = cost.cost_usd, latency_ms, "agent reply {ordinal}: {} choice(s), {} + {} tokens, ${:.4}, {:.1} s",
            reply.choices.len(), cost.prompt_tokens, cost.completion_tokens, cost.cost_usd, latency_ms / 1e3
        );
        self.queue.extend(reply.choices.into_iter().enumerate().map(|(ci, text)| (id, ci, text)));
        Ok(Next::Recorded)
    }

    async fn report(&mut self, _engine: &mut Engine, c: &Candidate, outcome: Outcome) -> anyhow::Result<()> {
        // Edits build on each other: an accepted one is what the next applies to.
        if outcome.won {
            self.base_text = c.stage.template.text.clone();
        }
        Ok(())
    }
}

impl AgentProposer {
    /// One proposal (choice `choice` of request `request_id`): an iteration of its own from
    /// the start, refused here if it does not parse, apply or pass the static anti-cheat
    /// check (never compiled), else a candidate with the agent's policy.
    async fn proposal(&mut self, engine: &mut Engine, request_id: i64, choice: usize, reply: &str) -> anyhow::Result<Next> {
        let stage = &self.stage;
        // Each edit is a template of its own: `mma-fa2+agent#12` (the iteration that made it).
        let agent_name = format!("{}+agent#{}", stage.template.name(), engine.seq + 1);
        let rec = engine.begin(&stage.spec.name, &agent_name, &self.params).await?;
        let mut row = ProposalRow { seq: rec.seq, request_id, choice: choice as i64, summary: "(unparsable reply)".into(), diff: None, template_text: None };
        let reject = |why: String| Failure::new(Verdict::RejectedProposal, why);

        let proposal = match edits::parse(reply) {
            Ok(p) => p,
            Err(why) => {
                engine.ledger.agent_proposal(&engine.run_id, &row).await?;
                engine.conclude(rec, None, reject(format!("reply: {why}")), vec![]).await?;
                return Ok(Next::Recorded);
            }
        };
        row.summary = proposal.summary.clone();
        let edited = match edits::apply(&self.base_text, &proposal) {
            Ok(t) => t,
            Err(why) => {
                engine.ledger.agent_proposal(&engine.run_id, &row).await?;
                engine.conclude(rec, None, reject(format!("edit \"{}\": does not apply: {why}", proposal.summary)), vec![]).await?;
                return Ok(Next::Recorded);
            }
        };
        let diff = edits::diff(&self.base_text, &edited, &stage.spec.template);
        row.diff = Some(diff.clone());
        row.template_text = Some(edited.clone());
        engine.ledger.agent_proposal(&engine.run_id, &row).await?;
        let base_template = Template::parse(&stage.spec.template, self.base_text.clone())?;
        if let Err(why) = anticheat::check(&base_template, &edited, &engine.cfg.agent.allowed_headers) {
            engine.conclude(rec, None, reject(format!("edit \"{}\": anti-cheat: {why}", proposal.summary)), vec![]).await?;
            return Ok(Next::Recorded);
        }
        let mut template = match Template::parse(&stage.spec.template, edited) {
            Ok(t) => t,
            Err(e) => {
                let reason = format!("edit \"{}\": the template no longer parses: {e}", proposal.summary);
                engine.conclude(rec, None, reject(reason), vec![]).await?;
                return Ok(Next::Recorded);
            }
        };
        template.meta.name = agent_name;
        let mut edited_stage = stage.clone();
        edited_stage.template = template;
        Ok(Next::Run(Box::new(Candidate {
            stage: edited_stage,
            params: self.params.clone(),
            shapes: engine.shapes.clone(),
            policy: Policy::agent(&proposal.summary, &diff),
            begun: Some(rec),
        })))
    }
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
            self.ledger.event_once(&self.run_id, EventKind::StageSkipped, &msg).await?;
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
            let msg = format!("{name}: {interrupted} request(s) in flight when the daemon died are asked again");
            self.ledger.event(&self.run_id, EventKind::AgentResumed, &msg).await?;
        }
        self.ledger.set_progress(&self.run_id, Some(&name), self.used().as_secs_f64()).await?;

        // Where the stage starts: its params (recorded once), and the template text of
        // its last accepted proposal (edits build on each other).
        let history = StageHistory::of(&self.ledger.events(&self.run_id).await?);
        let params = match history.start(&name) {
            Some(p) => p.clone(),
            None => {
                let p = self.best_params_for(stage, &[]).unwrap_or_else(|| stage.start.clone());
                let msg = format!("{name} start {}", serde_json::to_string(&p)?);
                self.ledger.record_event(&self.run_id, &Event::StageStart { stage: name.clone(), start: p.clone() }, &msg).await?;
                tracing::info!(kind = "stage", stage = %name, "stage {name}: {} (agent edits of {} via {})", stage.spec.description, stage.spec.template, client.url());
                p
            }
        };
        let iterations = self.ledger.iterations(&self.run_id).await?;
        let finished = |seq: i64| iterations.iter().any(|i| i.seq == seq && i.verdict.is_final());
        let proposals: Vec<ProposalRow> = self.ledger.agent_proposals(&self.run_id).await?;
        let requests: Vec<_> = self.ledger.agent_requests(&self.run_id).await?.into_iter().filter(|r| r.stage == name).collect();
        let mut base_text = stage.template.text.clone();
        for p in &proposals {
            let in_stage = requests.iter().any(|r| r.id == p.request_id);
            let accepted = iterations.iter().any(|i| i.seq == p.seq && i.verdict.is_acceptance());
            if in_stage && accepted {
                if let Some(t) = &p.template_text {
                    base_text = t.clone();
                }
            }
        }
        let evaluated = proposals.iter().filter(|p| requests.iter().any(|r| r.id == p.request_id) && finished(p.seq)).count() as u32;
        // Replies already in the ledger (a resumed run): what is left of them comes first.
        let mut queue = VecDeque::new();
        for req in requests.iter().filter(|r| r.status == RequestStatus::Replied) {
            let Some(body) = &req.reply_text else { continue };
            let Ok((choices, _)) = parse_reply(body) else { continue };
            for (ci, text) in choices.into_iter().enumerate() {
                let done = proposals.iter().any(|p| p.request_id == req.id && p.choice == ci as i64 && finished(p.seq));
                if !done {
                    queue.push_back((req.id, ci, text));
                }
            }
        }
        let ordinal = requests.iter().map(|r| r.ordinal).max().unwrap_or(0);
        let mut proposer = AgentProposer { stage: stage.clone(), client, params, base_text, queue, evaluated, ordinal };
        self.run_phase(&mut proposer).await
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
            .filter(|i| i.verdict == Verdict::Accepted)
            .filter_map(|i| i.template.strip_prefix(&prefix).and_then(|n| n.parse::<i64>().ok()).map(|e| (i.seq, e)))
            .max()
            .map(|(_, e)| e);
        let proposal = match edit_seq {
            Some(e) => self.ledger.agent_proposals(&self.run_id).await?.into_iter().find(|p| p.seq == e),
            None => None,
        };
        let (Some(e), Some(text)) = (edit_seq, proposal.and_then(|p| p.template_text)) else {
            let msg = format!("stage {} skipped: no accepted agent edit of {} to tune", stage.spec.name, stage.spec.template);
            self.ledger.event_once(&self.run_id, EventKind::StageSkipped, &msg).await?;
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
        self.ledger.event(&self.run_id, EventKind::AgentStageEnd, &msg).await?;
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
}
