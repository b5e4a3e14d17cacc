//! The loop every phase of a run drives: ask a [`Proposer`] for the next candidate, stop on
//! a stop request or a spent budget, compile the likely next candidate ahead, take this one
//! down its path ([`Engine::iterate`]), tell the proposer how it went, and restart the
//! worker if the candidate killed it. The plan's stages, the open phase, the warm start
//! and the agent differ only in how they propose and what they learn.

use crate::spec::protocol::{BuildAsk, Shape, PRECOMPILE_SLOTS};
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

/// A candidate the look-ahead may compile: its stage, knob point and shapes.
pub(crate) type Guess = (Stage, Params, Vec<Shape>);

/// A proposer's guesses of what comes after the candidate in flight ([`Proposer::ahead`]).
#[derive(Default)]
pub(crate) struct Guesses {
    /// If the candidate and every one after it lose, in order.
    pub(crate) loss: Vec<Guess>,
    /// The first candidate after a win that `loss` does not hold.
    pub(crate) win: Option<Guess>,
}

impl Guesses {
    /// What to compile, at most `room` builds: the loss branch's first ones, then the win
    /// branch's point (a sweep that ends on a win starts the next knob from the winner: until
    /// 2026-12-01 that build was a miss after every win), then the rest of the loss branch.
    fn to_compile(self, room: usize) -> Vec<Guess> {
        compile_order(self.loss, self.win, room)
    }
}

fn compile_order<T>(mut loss: Vec<T>, win: Option<T>, room: usize) -> Vec<T> {
    let Some(win) = win else {
        loss.truncate(room);
        return loss;
    };
    loss.truncate(room.saturating_sub(1));
    let at = loss.len().min(2);
    loss.insert(at, win);
    loss.truncate(room);
    loss
}

/// A source of candidates: a plan stage's search, the open phase, the warm start, the agent.
pub(crate) trait Proposer {
    /// The next candidate. May read and write the ledger (the agent asks its endpoint here).
    async fn next(&mut self, engine: &mut Engine) -> anyhow::Result<Next>;

    /// What `next` would offer after `current`: up to `depth` candidates in order if it and
    /// each of them does not win (most do not), and the first one it would offer if `current`
    /// won that those do not hold. The look-ahead compiles them while `current` is checked
    /// and timed. Empty: no guess.
    fn ahead(&self, _current: &Candidate, _depth: usize) -> Guesses {
        Guesses::default()
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
                self.send_guesses(proposer, &candidate).await;
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

    /// Have the worker compile, in the background, what `proposer` would offer after
    /// `candidate` ([`Proposer::ahead`]) and the next stage's first candidate. Best effort: a
    /// lost or wrong guess changes nothing but CPU time; the ledger's order does not depend on it.
    ///
    /// One list, soonest needed first: the candidate itself (its build, asked for as a guess
    /// before and perhaps not started yet, is needed at once), the guesses, and the next
    /// stage's start, needed when this stage ends. The worker's compile pool builds them in
    /// that order and drops the unstarted builds of the list before (`worker::compile_pool`):
    /// nothing the engine still expects is pushed out by a new guess, and a new guess never
    /// runs before the build the next load needs. (Until 2026-12-01 every ask started its
    /// own thread, up to eight at once; under that contention the next candidate's build
    /// finished no sooner than the deepest guess's.)
    async fn send_guesses(&mut self, proposer: &impl Proposer, candidate: &Candidate) {
        let depth = self.cfg.worker.lookahead_depth as usize;
        // Room for the candidate itself and the next stage's start beside the guesses.
        let room = (depth + 1).min(PRECOMPILE_SLOTS - 1 - usize::from(self.next_stage.is_some()));
        let mut guesses = proposer.ahead(candidate, depth);
        // A candidate the gate refuses on every shape cannot win: no win branch.
        let stage = &candidate.stage;
        if gate::check_each(&stage.template, &candidate.params, &candidate.shapes, &self.device, &stage.spec.min_ctas).is_err() {
            guesses.win = None;
        }
        let mut wanted = vec![(candidate.stage.clone(), candidate.params.clone(), candidate.shapes.clone())];
        wanted.extend(guesses.to_compile(room));
        wanted.extend(self.next_stage.clone());
        let mut builds: Vec<BuildAsk> = Vec::with_capacity(wanted.len());
        for (stage, params, shapes) in &wanted {
            if let Some(b) = self.guess_build(stage, params, shapes) {
                if !builds.contains(&b) {
                    builds.push(b);
                }
            }
        }
        let windows = self.build_scope([]).windows;
        if let Err(e) = compile::precompile(&mut self.sup, builds, self.cfg.worker.compile_threads, windows, self.cfg.worker.load_timeout).await {
            tracing::debug!(error = %e, "look-ahead compile not started");
        }
        crate::failpoint::hit("lookahead-sent");
    }

    /// The build a guess would need, if it would be compiled at all (not remembered, not
    /// refused by the gate on every shape, a target this GPU runs): the head dims of the
    /// shapes the gate plans, as the candidate's load will name them.
    fn guess_build(&self, stage: &Stage, params: &Params, shapes: &[Shape]) -> Option<BuildAsk> {
        let templates_dir = self.cfg.resolve(&self.cfg.run.templates_dir);
        let rendered = render::render(&stage.template, params, self.cfg.workload.dtype, &templates_dir).ok()?;
        if self.remembered(&rendered.hash, shapes).is_some() {
            return None;
        }
        let gated = gate::check_each(&stage.template, params, shapes, &self.device, &stage.spec.min_ctas).ok()?;
        let arch = stage.template.meta.target_arch(&self.device).ok()?;
        let scope = self.build_scope(gated.plans.iter().map(|p| p.shape.d));
        Some(BuildAsk { source: rendered.source, arch, head_dims: scope.head_dims })
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

#[cfg(test)]
mod tests {
    use super::compile_order;

    #[test]
    fn the_win_guess_comes_third_and_everything_fits_the_room() {
        assert_eq!(compile_order(vec![1, 2, 3, 4], Some(9), 5), [1, 2, 9, 3, 4]);
        assert_eq!(compile_order(vec![1, 2, 3, 4, 5, 6], Some(9), 5), [1, 2, 9, 3, 4]);
        assert_eq!(compile_order(vec![1], Some(9), 2), [1, 9]);
        assert_eq!(compile_order(vec![1, 2, 3], None, 2), [1, 2]);
        assert_eq!(compile_order(Vec::new(), Some(9), 1), [9]);
        assert_eq!(compile_order(vec![1, 2], Some(9), 0), Vec::<i32>::new());
    }
}
