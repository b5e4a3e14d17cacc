//! The loop every phase of a run drives: ask a [`Proposer`] for the next candidate, stop on
//! a stop request or a spent budget, compile the likely next candidate ahead, take this one
//! down its path ([`Engine::iterate`]), tell the proposer how it went, and restart the
//! worker if the candidate killed it. The plan's stages, the open phase, the warm start
//! and the agent differ only in how they propose and what they learn.

use crate::spec::protocol::Shape;
use crate::spec::template::Params;
use crate::storage::ledger::EventKind;
use crate::strategy::plan::Stage;

use super::candidate::Candidate;
use super::gpu_wait::{wait_for_gpu, WaitEnd};
use super::{render, Engine, Outcome, RunEnd};
use crate::pipeline::{compile, gate};

/// What a proposer offers next.
pub(crate) enum Next {
    /// A candidate to take down the path.
    Run(Box<Candidate>),
    /// The proposer recorded an iteration of its own that needs no GPU (an agent reply that
    /// was refused before compiling); ask again.
    Recorded,
    /// Nothing more from this proposer.
    Done,
}

/// A source of candidates: a plan stage's search, the open phase, the warm start, the agent.
pub(crate) trait Proposer {
    /// The next candidate. May read and write the ledger (the agent asks its endpoint here).
    async fn next(&mut self, engine: &mut Engine) -> anyhow::Result<Next>;

    /// What `next` would offer, up to `depth` candidates in order, if `current` and each of
    /// them does not win (most do not): the look-ahead compiles them while `current` is
    /// checked and timed. Empty: no guess.
    fn after_loss(&self, _current: &Candidate, _depth: usize) -> Vec<(Stage, Params, Vec<Shape>)> {
        Vec::new()
    }

    /// Learn from `c`'s outcome.
    async fn report(&mut self, engine: &mut Engine, c: &Candidate, outcome: Outcome) -> anyhow::Result<()>;
}

impl Engine {
    /// Drive `proposer` until it is done (None) or the run must end (Some).
    pub(crate) async fn run_phase(&mut self, proposer: &mut impl Proposer) -> anyhow::Result<Option<RunEnd>> {
        loop {
            if self.shutdown.requested() {
                return Ok(Some(RunEnd::Stopped));
            }
            if !self.budget_left() {
                return Ok(Some(RunEnd::Finished("budget spent".into())));
            }
            let candidate = match proposer.next(self).await? {
                Next::Run(c) => c,
                Next::Recorded => continue,
                Next::Done => return Ok(None),
            };
            if self.cfg.worker.lookahead && self.sup.is_running() {
                for (stage, params, shapes) in proposer.after_loss(&candidate, self.cfg.worker.lookahead_depth as usize) {
                    self.lookahead(&stage, &params, &shapes).await;
                }
                // Asked again with every candidate: the worker keeps an asked-again build
                // among its newest, so the guesses above do not push it out.
                if let Some((stage, params, shapes)) = self.next_stage.clone() {
                    self.lookahead(&stage, &params, &shapes).await;
                }
            }
            let outcome = self.iterate(&candidate).await?;
            if self.shutdown.now_requested() {
                return Ok(Some(RunEnd::Stopped));
            }
            proposer.report(self, &candidate, outcome).await?;
            if let Some(end) = self.recover_worker().await {
                return Ok(Some(end));
            }
        }
    }

    /// Have the worker compile this candidate in the background, if it would be compiled at
    /// all (not remembered, not refused by the gate on every shape; the worker starts a source
    /// once however often it is asked). Best effort: a lost or wrong guess changes nothing but
    /// CPU time; the ledger's order does not depend on it.
    async fn lookahead(&mut self, stage: &Stage, params: &Params, shapes: &[Shape]) {
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);
        let Ok(rendered) = render::render(&stage.template, params, self.cfg.workload.dtype, &templates_dir) else { return };
        if self.remembered(&rendered.hash, shapes).is_some() || gate::check_each(&stage.template, params, shapes, &self.device, &stage.spec.min_ctas).is_err() {
            return;
        }
        let Ok(arch) = stage.template.meta.target_arch(&self.device) else { return };
        let scope = self.build_scope();
        if let Err(e) = compile::precompile(&mut self.sup, &rendered.source, &arch, &scope, self.cfg.worker.load_timeout).await {
            tracing::debug!(error = %e, "look-ahead compile not started");
        }
        crate::failpoint::hit("lookahead-sent");
    }

    /// After a candidate that killed the worker (crash, hang, lost device): wait for
    /// the GPU and restart it. Some(end) when the run cannot go on.
    async fn recover_worker(&mut self) -> Option<RunEnd> {
        if self.sup.is_running() {
            return None;
        }
        let mut paused = self.paused;
        let r = wait_for_gpu(&mut self.sup, &self.ledger, &self.run_id, &self.cfg, &self.shutdown, &mut paused).await;
        self.paused = paused;
        match r {
            Ok(_) => {
                let _ = self.ledger.event(&self.run_id, EventKind::WorkerRestart, &format!("worker generation {}", self.sup.generation())).await;
                None
            }
            Err(WaitEnd::Stopped) => Some(RunEnd::Stopped),
            Err(WaitEnd::GaveUp(m)) => Some(RunEnd::Interrupted(m)),
        }
    }
}
