//! The part of a run's budget kept for its closing comparison (`run.budget_covers_closing`),
//! and what that closing does to fit in it.
//!
//! A finished run re-ranks each shape's top kernels under sustained timing and measures the
//! baselines afresh (`closing.rs`, `rerank.rs`). On the H200 that took 184 s for the LLM
//! workload's 11 shapes (2026-11-29) and 79-84 s for Llama-3-8B's 9 (2026-11-30, of a 2- and a
//! 4-minute budget). So the search ends early by what the closing is expected to take, and
//! `--budget` is the run's length. The expectation is a cost model, learned: a fixed start-up
//! ([`START_S`]: SDPA's script starting and importing torch and FA4, whatever the shape count),
//! plus per shape a fixed part (builds, burst timings, graph captures) and the sustained
//! windows (each `sustained_ms` of back-to-back replays: the re-rank's contenders and our best
//! before and after the baselines, [`sustained_rounds`] windows each; SDPA's default backend
//! and FA4, [`BASELINE_WINDOWS`] each) and the re-rank's loads and burst timings per contender.
//! Every closing records its length, its windows and what its re-rank took
//! (`Event::ClosingTime`); a run on a GPU of the same name keeps the slowest fixed part of the
//! last few, or [`DEFAULT_FIXED_S_PER_SHAPE`] (and [`DEFAULT_FA4_S_PER_SHAPE`]) before any, and
//! the slowest re-rank per contender among them, or [`RERANK_S_PER_CONTENDER`] before any.
//! Before any, a run that measured its baselines afresh at its start also bounds the fixed part
//! by what that measurement took per shape: the closing measures the same baselines again (and
//! FA4 no longer compiles), so on a fast machine a first short run keeps its sustained windows.
//!
//! At most a quarter of the budget is kept ([`MAX_SHARE`]): a short run still searches. Where
//! the whole closing needs more, it is cut to fit rather than run past the budget (2026-11-30:
//! 2-, 4- and 6-minute runs ended 53, 25 and 29 s late), in this order: shorter sustained
//! windows (down to [`MIN_SUSTAINED_MS`]: even a 6-35 ms burst of the large shapes reaches the
//! board's power cap, HOPPER.md), then no re-rank (its windows again as long as they fit), then
//! burst timing only. The cut is decided again when the closing starts, from the time then
//! left, so a search that ends early (its plan exhausted) gives the closing everything it
//! asked for. Only where even burst timing does not fit does the closing run past the budget.

use std::time::Duration;

use crate::spec::protocol::sustained_rounds;
use crate::storage::ledger::{Event, RerankTime};

/// Seconds of every closing whatever its shape count: the SDPA script's start-up (a Python
/// process importing torch, creating its CUDA context, importing FA4 where it is installed).
/// A closing of 2 shapes with burst timing took 10.6 s on the H200 (2026-11-29, FA4 beside),
/// one of the 10 benchmark shapes about 10 s on an H100 without FA4 (README): most of a short
/// closing is this term, so a per-shape figure alone undershoots small runs and, learned from
/// one, overshoots large ones.
pub(crate) const START_S: f64 = 6.0;
/// Seconds per shape beyond [`START_S`] and the sustained windows, before any closing was
/// measured on this GPU, without FA4: builds, burst timings (longer for long kernels), graph
/// captures. On the H200 (2026-11-30) burst-only closings of Llama-3-8B's 9 shapes and the LLM
/// workload's 11 left 0.7-1.3 s per shape, sustained ones 1.1-1.3 beyond their windows and
/// re-rank, the closings before this model (every SDPA backend with windows) 2.7-3.2; two large
/// shapes of 0.5- and 1.5-ms kernels 3.3 and 5.1 s (2026-11-29: 12.5 and 16.2 s, burst). A first
/// run keeps the older closings' figure: a short first run still gets sustained windows, and
/// one of long kernels may end a few seconds late, once.
pub(crate) const DEFAULT_FIXED_S_PER_SHAPE: f64 = 3.0;
/// What FA4 adds to that per shape where it was measured at the run's start (its compile per
/// shape and configuration): the benchmark's 10 shapes left 7.6 s per shape with FA4 on the H200
/// (2026-11-29: 142.4 s, less 30 windows of 200 ms each), the LLM workload's 11.9 (before the
/// re-rank's builds were shared).
pub(crate) const DEFAULT_FA4_S_PER_SHAPE: f64 = 5.0;
/// The re-rank's own time per shape and contender besides its windows (loading the contender's
/// module, its burst samples), before a re-rank was recorded on the GPU (each closing records
/// its re-rank's time since 2026-11-30 (36), and later runs keep the slowest of the last few):
/// on the H200 the re-rank of a 4-minute Llama-3-8B run took 22.0 s for 9 shapes and 2
/// contenders each, 13.5 s of it 167-ms windows (2026-11-30): 0.47 s; the LLM workload's, whose
/// contenders include 50-230-us prefill kernels, about 0.7 if the rest of its closing was as
/// modelled (that closing took 5 s longer than expected; its re-rank's own time was not recorded).
pub(crate) const RERANK_S_PER_CONTENDER: f64 = 0.5;
/// How much longer a sustained window lasts than asked: its replay count is sized from the burst
/// time, and back-to-back replays run 12-18% slower (the power cap). On the H200 a 4-minute
/// Llama-3-8B closing of 162 windows of 156 ms took 4.7 s more than the windows at their
/// length and the rest of the model (2026-11-30).
pub(crate) const WINDOW_STRETCH: f64 = 1.15;
/// Sustained windows per baseline and shape: scripts/sdpa_baseline.py's SUSTAINED_WINDOWS.
pub(crate) const BASELINE_WINDOWS: u32 = 3;
/// The shortest sustained window a closing is cut to.
pub(crate) const MIN_SUSTAINED_MS: f64 = 100.0;
/// The largest share of the budget kept back.
pub(crate) const MAX_SHARE: f64 = 0.25;
/// How many recorded closings (newest first) a run learns from.
pub(crate) const HISTORY: u32 = 3;

/// What the closing is configured to do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ClosingWork {
    /// `timing.sustained_ms` (0: burst timing only).
    pub(crate) sustained_ms: f64,
    /// `timing.rerank_top` (the re-rank runs when > 1 under sustained timing).
    pub(crate) rerank_top: u32,
    /// Sustained windows per entry of our kernels ([`sustained_rounds`] of the run's timing).
    pub(crate) rounds: u32,
    /// Whether the baselines are measured (`baseline.sdpa`, and measured at the run's start).
    pub(crate) sdpa: bool,
    /// Whether FA4 was measured at the run's start (a second baseline with windows).
    pub(crate) fa4: bool,
    /// The re-rank's seconds per contender and shape besides its windows: the built-in
    /// [`RERANK_S_PER_CONTENDER`], or what the re-ranks recorded on this GPU took
    /// ([`Model::learn`]).
    pub(crate) rerank_s_per_contender: f64,
}

impl ClosingWork {
    pub(crate) fn new(cfg: &crate::spec::config::Config, sdpa: bool, fa4: bool) -> ClosingWork {
        let t = &cfg.timing;
        ClosingWork {
            sustained_ms: t.sustained_ms,
            rerank_top: t.rerank_top,
            rounds: sustained_rounds(&cfg.timing_spec()),
            sdpa,
            fa4,
            rerank_s_per_contender: RERANK_S_PER_CONTENDER,
        }
    }

    /// The whole closing as configured.
    pub(crate) fn configured(&self) -> Closing {
        let rerank = self.sustained_ms > 0.0 && self.rerank_top > 1;
        self.closing(self.sustained_ms, rerank, Trim::None)
    }

    fn closing(&self, sustained_ms: f64, rerank: bool, trim: Trim) -> Closing {
        let rerank_s_per_shape = if rerank { self.rerank_s_per_contender * f64::from(self.contenders()) } else { 0.0 };
        let window_s_per_shape = f64::from(self.windows(rerank)) * sustained_ms.max(0.0) / 1000.0 * WINDOW_STRETCH;
        Closing { sustained_ms, rerank, window_s_per_shape, rerank_s_per_shape, trim }
    }

    /// The re-rank's contenders per shape besides the incumbent.
    pub(crate) fn contenders(&self) -> u32 {
        self.rerank_top.saturating_sub(1)
    }

    /// Seconds of the re-rank's own sustained windows per shape, at `sustained_ms` (its
    /// `rerank_top` entries, `rounds` windows each; stretched as every window).
    pub(crate) fn rerank_window_s(&self, sustained_ms: f64) -> f64 {
        f64::from(self.rerank_top * self.rounds) * sustained_ms.max(0.0) / 1000.0 * WINDOW_STRETCH
    }

    fn any(&self) -> bool {
        self.sdpa || self.configured().rerank
    }

    /// Sustained windows per shape: the re-rank's contenders (the best among them) and, with
    /// the baselines, our best before and after them, `rounds` each; SDPA's default and FA4.
    fn windows(&self, rerank: bool) -> u32 {
        let ours = if rerank { self.rerank_top } else { 0 } + if self.sdpa { 2 } else { 0 };
        let baselines = if self.sdpa { BASELINE_WINDOWS * (1 + u32::from(self.fa4)) } else { 0 };
        ours * self.rounds + baselines
    }
}

/// How a closing was cut to fit the time it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trim {
    /// As configured.
    None,
    /// Sustained windows shorter than `timing.sustained_ms`, the re-rank kept.
    ShortWindows,
    /// No re-rank; sustained windows as long as fit.
    NoRerank,
    /// Burst timing only: no sustained windows, no re-rank.
    BurstOnly,
}

/// What a closing does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Closing {
    /// Length of each sustained window, ms (0: burst timing only).
    pub(crate) sustained_ms: f64,
    /// Whether the sustained re-rank runs.
    pub(crate) rerank: bool,
    /// Seconds of sustained windows per shape (stretched: [`WINDOW_STRETCH`]).
    pub(crate) window_s_per_shape: f64,
    /// The re-rank's time per shape besides its windows ([`RERANK_S_PER_CONTENDER`]).
    pub(crate) rerank_s_per_shape: f64,
    pub(crate) trim: Trim,
}

impl Closing {
    /// What was left out, for people; None when nothing was.
    pub(crate) fn cut(&self, configured_ms: f64) -> Option<String> {
        let ms = self.sustained_ms;
        match self.trim {
            Trim::None => None,
            Trim::ShortWindows => Some(format!("{ms:.0}-ms sustained windows instead of {configured_ms:.0}")),
            Trim::NoRerank if ms < configured_ms => Some(format!("no sustained re-rank and {ms:.0}-ms windows instead of {configured_ms:.0}")),
            Trim::NoRerank => Some("no sustained re-rank".to_string()),
            Trim::BurstOnly => Some("burst timing only (no sustained windows, no re-rank)".to_string()),
        }
    }
}

/// Where the per-shape figure came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Basis {
    /// `run.budget_covers_closing = false`.
    Off,
    /// The run makes no closing comparison (no baselines, no re-rank).
    NoClosing,
    /// The slowest of `runs` closings recorded on this GPU.
    Measured { runs: usize },
    /// Nothing recorded on this GPU, and this run's start measured its baselines afresh in
    /// `seconds`, less per shape than the built-in figure: that.
    RunStart { seconds: f64 },
    /// Nothing recorded on this GPU: the built-in figure.
    Default,
}

/// The cost model of one run's closings: learned once, when the run is created.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Model {
    pub(crate) work: ClosingWork,
    pub(crate) shapes: usize,
    /// Seconds per shape beyond [`START_S`] and the windows.
    pub(crate) fixed_s_per_shape: f64,
    pub(crate) basis: Basis,
}

impl Model {
    /// The model for a run of `shapes` shapes, given the closings recorded on its GPU (newest
    /// first; other events are ignored) and, where this run's start measured the baselines of
    /// every shape afresh, how long that took (`baselines_s`).
    pub(crate) fn learn(mut work: ClosingWork, shapes: usize, covers_closing: bool, history: &[Event], baselines_s: Option<f64>) -> Model {
        // Each closing's time beyond the start-up, its windows and its re-rank, per shape (never
        // below zero: a closing quicker than the start-up term says only that the shapes cost
        // little). One recorded before windows were (None) counts whole: an overestimate,
        // for at most HISTORY runs. Where the re-rank was measured, what it took comes off
        // whole; before that, as it was modelled.
        let closings: Vec<(f64, f64, Option<RerankTime>)> = history
            .iter()
            .filter_map(|e| match e {
                Event::ClosingTime { seconds, shapes, window_s_per_shape, rerank_s_per_shape, rerank, .. } if *shapes > 0 && seconds.is_finite() => {
                    let n = f64::from(*shapes);
                    let fixed = match rerank {
                        Some(r) => (seconds - START_S - r.seconds) / n - (window_s_per_shape.unwrap_or(0.0) - r.window_s_per_shape),
                        None => (seconds - START_S) / n - window_s_per_shape.unwrap_or(0.0) - rerank_s_per_shape.unwrap_or(0.0),
                    };
                    Some((fixed.max(0.0), n, *rerank))
                }
                _ => None,
            })
            .take(HISTORY as usize)
            .collect();
        let measured: Vec<f64> = closings.iter().map(|c| c.0).collect();
        // The re-rank's own cost per contender: the slowest of those measured among the same
        // closings (a re-rank's loads and burst timings grow with its kernels' length: Llama-3
        // decode ~0.5 s on the H200, 2026-11-30; the LLM workload's prefill contenders more).
        let rerank_costs = closings.iter().filter_map(|&(_, n, r)| {
            let r = r.filter(|r| r.contenders > 0 && r.seconds.is_finite())?;
            Some(((r.seconds / n - r.window_s_per_shape) / f64::from(r.contenders)).max(0.0))
        });
        if let Some(slowest) = rerank_costs.reduce(f64::max) {
            work.rerank_s_per_contender = slowest;
        }
        let (fixed_s_per_shape, basis) = if !covers_closing {
            (0.0, Basis::Off)
        } else if !work.any() || shapes == 0 {
            (0.0, Basis::NoClosing)
        } else if measured.is_empty() {
            // The start's measurement (the SDPA script's start-up twice, every backend, FA4's
            // first compile) is an upper bound of the closing's fixed part: on the H200 the LLM
            // workload's 11 shapes took 45.7 and 46.0 s at the start (2026-12-01 and -02) and
            // 2.5 and 1.7 s per shape at the closing (full, and burst only), where the built-in
            // figure with FA4 is 8 and had cut the second closing to burst timing with 105 s
            // left. It only lowers the built-in figure: a slow start (a long first FA4 compile
            // the closing does not repeat) does not raise the reserve.
            let default = DEFAULT_FIXED_S_PER_SHAPE + if work.fa4 { DEFAULT_FA4_S_PER_SHAPE } else { 0.0 };
            match baselines_s.filter(|s| s.is_finite() && work.sdpa) {
                Some(seconds) if (seconds - START_S).max(0.0) / (shapes as f64) < default => {
                    ((seconds - START_S).max(0.0) / shapes as f64, Basis::RunStart { seconds })
                }
                _ => (default, Basis::Default),
            }
        } else {
            (measured.iter().copied().fold(0.0, f64::max), Basis::Measured { runs: measured.len() })
        };
        Model { work, shapes, fixed_s_per_shape, basis }
    }

    /// Expected seconds of `closing`.
    pub(crate) fn seconds(&self, closing: &Closing) -> f64 {
        if matches!(self.basis, Basis::Off | Basis::NoClosing) {
            return 0.0;
        }
        START_S + self.shapes as f64 * (self.fixed_s_per_shape + closing.window_s_per_shape + closing.rerank_s_per_shape)
    }

    /// The fullest closing expected to end within `limit_s`, cut in the module's order; the
    /// cheapest one (burst timing only) where none does. With `run.budget_covers_closing =
    /// false`, or burst timing configured (nothing to cut), the closing is the configured one
    /// whatever the time.
    pub(crate) fn fit(&self, limit_s: f64) -> Closing {
        let w = &self.work;
        let full = w.configured();
        if matches!(self.basis, Basis::Off | Basis::NoClosing) || w.sustained_ms <= 0.0 || self.seconds(&full) <= limit_s {
            return full;
        }
        // The window length that fits with or without the re-rank, if any of at least the minimum.
        let fitting_ms = |rerank: bool| {
            let windows = f64::from(w.windows(rerank));
            let per_shape = (limit_s - START_S) / self.shapes as f64 - self.fixed_s_per_shape - w.closing(0.0, rerank, Trim::None).rerank_s_per_shape;
            let ms = (per_shape / (windows * WINDOW_STRETCH) * 1000.0).floor().min(w.sustained_ms);
            (windows > 0.0 && ms >= MIN_SUSTAINED_MS).then_some(ms)
        };
        if full.rerank {
            if let Some(ms) = fitting_ms(true) {
                return w.closing(ms, true, Trim::ShortWindows);
            }
            if w.sdpa {
                if let Some(ms) = fitting_ms(false) {
                    return w.closing(ms, false, Trim::NoRerank);
                }
            }
        } else if let Some(ms) = fitting_ms(false) {
            return w.closing(ms, false, Trim::ShortWindows);
        }
        w.closing(0.0, false, Trim::BurstOnly)
    }
}

/// What a run keeps of its budget for the closing, decided when it is created.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reserve {
    pub(crate) seconds: f64,
    /// The closing expected at the end of the search (the one that fits in the reserve).
    pub(crate) closing: Closing,
    /// Even the cheapest closing is expected to take more than [`MAX_SHARE`] of the budget.
    pub(crate) capped: bool,
}

impl Reserve {
    pub(crate) fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds.max(0.0))
    }

    /// One line for people: where the search ends and why.
    pub(crate) fn describe(&self, model: &Model, budget: Duration) -> String {
        let fmt = |s: f64| crate::pipeline::record::fmt_dur(Duration::from_secs_f64(s.max(0.0)));
        let b = budget.as_secs_f64();
        let shapes = model.shapes;
        match model.basis {
            Basis::Off => format!("the search uses the whole budget ({}); the closing comparison runs past it (run.budget_covers_closing = false)", fmt(b)),
            Basis::NoClosing => format!("the search uses the whole budget ({}): no closing comparison to keep time for", fmt(b)),
            Basis::Measured { .. } | Basis::RunStart { .. } | Basis::Default => {
                let source = match model.basis {
                    Basis::Measured { runs } => format!("the slowest of the last {runs} closing(s) on this GPU"),
                    Basis::RunStart { seconds } => format!(
                        "no closing measured on this GPU yet: as long per shape as this run's start took to measure the baselines ({seconds:.1} s), less the start-up"
                    ),
                    _ => "no closing measured on this GPU yet: the built-in figure".to_string(),
                };
                let c = &self.closing;
                let mut windows = String::new();
                if c.window_s_per_shape > 0.0 {
                    windows += &format!(" + {:.1} s of sustained windows", c.window_s_per_shape);
                }
                if c.rerank_s_per_shape > 0.0 {
                    windows += &format!(" + {:.1} s of re-rank", c.rerank_s_per_shape);
                }
                let cut = match self.closing.cut(model.work.sustained_ms) {
                    Some(cut) => format!(
                        "; to fit a quarter of the budget: {cut}, unless the search ends sooner (a longer budget, or run.budget_covers_closing = false, keeps the whole closing)"
                    ),
                    None => String::new(),
                };
                let cap = if self.capped { "; even so more than a quarter of the budget: the closing may run past it" } else { "" };
                format!(
                    "the search ends at {} of the {} budget, keeping {} for the closing comparison ({START_S:.0} s start-up + {shapes} shape(s) x ({:.1} s{windows}), {source}{cut}{cap})",
                    fmt(b - self.seconds),
                    fmt(b),
                    fmt(self.seconds),
                    model.fixed_s_per_shape,
                )
            }
        }
    }
}

/// The reserve of a run of `budget`: the time of the fullest closing that fits in a quarter
/// of it; that quarter where none does.
pub(crate) fn plan(budget: Duration, model: &Model) -> Reserve {
    let cap = budget.as_secs_f64() * MAX_SHARE;
    let closing = model.fit(cap);
    let want = model.seconds(&closing);
    Reserve { seconds: want.min(cap), closing, capped: want > cap }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped timing (200-ms windows, top 3, 3 windows per entry), baselines on, FA4 absent.
    const SUSTAINED: ClosingWork =
        ClosingWork { sustained_ms: 200.0, rerank_top: 3, rounds: 3, sdpa: true, fa4: false, rerank_s_per_contender: RERANK_S_PER_CONTENDER };
    const BURST: ClosingWork = ClosingWork { sustained_ms: 0.0, ..SUSTAINED };

    fn time(seconds: f64, shapes: u32, window_s_per_shape: Option<f64>) -> Event {
        Event::ClosingTime { seconds, shapes, sustained_ms: 200.0, window_s_per_shape, rerank_s_per_shape: None, rerank: None }
    }

    fn model(work: ClosingWork, shapes: usize, history: &[Event]) -> Model {
        Model::learn(work, shapes, true, history, None)
    }

    /// Llama-3-8B's 9 shapes on the H200 after its 2-minute closing (78.7 s, 27 windows of 200 ms).
    fn llama() -> Model {
        model(SUSTAINED, 9, &[time(78.7, 9, Some(5.4))])
    }

    #[test]
    fn a_closing_counts_its_windows_rounds_and_baselines() {
        // Top 3 and our best twice (before and after the baselines), 3 windows each; SDPA's default 3.
        assert_eq!(SUSTAINED.windows(true), 18);
        assert_eq!(SUSTAINED.windows(false), 9);
        // FA4 is a second baseline; without baselines only the re-rank times anything.
        assert_eq!(ClosingWork { fa4: true, ..SUSTAINED }.windows(true), 21);
        assert_eq!(ClosingWork { sdpa: false, ..SUSTAINED }.windows(true), 9);
        let c = SUSTAINED.configured();
        assert_eq!((c.sustained_ms, c.rerank, c.trim), (200.0, true, Trim::None));
        // 18 windows of 200 ms, each 15% longer than asked.
        assert!((c.window_s_per_shape - 18.0 * 0.2 * WINDOW_STRETCH).abs() < 1e-9);
        assert_eq!(c.rerank_s_per_shape, 1.0, "two contenders besides the best");
        // rerank_top 1 or burst timing: no re-rank.
        assert!(!ClosingWork { rerank_top: 1, ..SUSTAINED }.configured().rerank);
        assert_eq!(BURST.configured().window_s_per_shape, 0.0);
    }

    #[test]
    fn a_first_run_keeps_the_start_up_the_built_in_figure_and_its_windows() {
        let m = model(SUSTAINED, 10, &[]);
        assert_eq!((m.fixed_s_per_shape, &m.basis), (3.0, &Basis::Default));
        let r = plan(Duration::from_secs(20 * 60), &m);
        assert!((r.seconds - (6.0 + 10.0 * (3.0 + 4.14 + 1.0))).abs() < 1e-9, "{r:?}");
        assert_eq!((r.closing, r.capped), (SUSTAINED.configured(), false));
        let r = plan(Duration::from_secs(20 * 60), &model(BURST, 10, &[]));
        assert_eq!(r.seconds, 36.0);
        // FA4 adds its compile per shape, and its windows.
        let r = plan(Duration::from_secs(20 * 60), &model(ClosingWork { fa4: true, ..SUSTAINED }, 10, &[]));
        assert!((r.seconds - (6.0 + 10.0 * (8.0 + 21.0 * 0.2 * WINDOW_STRETCH + 1.0))).abs() < 1e-9, "{r:?}");
        // Two of the 2-shape burst closings measured on the H200 (10.6 and 12.5 s) are covered
        // from the first run; that of two 1.5-ms kernels (16.2 s) is learned from.
        assert!(plan(Duration::from_secs(10 * 60), &model(BURST, 2, &[])).seconds >= 12.0);
    }

    /// Session 46's 4-minute LLM run on the H200 (11 shapes, FA4): its start measured the
    /// baselines in 46.0 s; the built-in 8 s per shape expected 94 s even of a burst-only closing
    /// and cut the closing to that with 105 s left (it took 24.2 s). From the start's figure the
    /// same 105 s keep the re-rank and 180-ms windows; a closing recorded on the GPU still wins,
    /// and a start slower than the built-in figure leaves it.
    #[test]
    fn a_first_run_bounds_the_fixed_part_by_what_its_start_took_to_measure_the_baselines() {
        let fa4 = ClosingWork { fa4: true, ..SUSTAINED };
        let default = Model::learn(fa4, 11, true, &[], None);
        assert_eq!((default.fixed_s_per_shape, &default.basis), (8.0, &Basis::Default));
        assert_eq!(default.fit(105.0).trim, Trim::BurstOnly);
        let m = Model::learn(fa4, 11, true, &[], Some(46.0));
        assert_eq!(m.basis, Basis::RunStart { seconds: 46.0 });
        assert!((m.fixed_s_per_shape - 40.0 / 11.0).abs() < 1e-12, "{m:?}");
        let c = m.fit(105.0);
        assert_eq!((c.trim, c.rerank, c.sustained_ms), (Trim::ShortWindows, true, 180.0));
        assert!(m.seconds(&c) <= 105.0);
        let line = plan(Duration::from_secs(240), &m).describe(&m, Duration::from_secs(240));
        assert!(line.contains("no closing measured on this GPU yet: as long per shape as this run's start took to measure the baselines (46.0 s), less the start-up"), "{line}");
        // Recorded closings come first; a slow start (or a start-up longer than the measurement)
        // never raises the figure, and without baselines there is nothing to learn from.
        assert_eq!(Model::learn(fa4, 11, true, &[time(97.2, 11, Some(4.83))], Some(46.0)).basis, Basis::Measured { runs: 1 });
        assert_eq!(Model::learn(fa4, 11, true, &[], Some(400.0)).basis, Basis::Default);
        assert_eq!(Model::learn(fa4, 11, true, &[], Some(2.0)).fixed_s_per_shape, 0.0);
        assert_eq!(Model::learn(ClosingWork { sdpa: false, ..fa4 }, 11, true, &[], Some(46.0)).basis, Basis::Default);
    }

    #[test]
    fn recorded_closings_decide_the_slowest_fixed_part_of_the_last_three() {
        // Newest first, per shape beyond the start-up and the windows: 11 shapes in 116 s with
        // 3.6 s of windows each (6.4), 4 in 66 s (11.4), 10 in 56 s recorded before windows
        // were (5.0, all of it), and a fourth (past the three).
        let history = [time(116.0, 11, Some(3.6)), time(66.0, 4, Some(3.6)), time(56.0, 10, None), time(900.0, 10, Some(0.0))];
        let m = model(SUSTAINED, 6, &history);
        assert_eq!(m.basis, Basis::Measured { runs: 3 });
        assert!((m.fixed_s_per_shape - 11.4).abs() < 1e-9, "{m:?}");
        let r = plan(Duration::from_secs(3600), &m);
        assert!((r.seconds - (6.0 + 6.0 * (11.4 + 4.14 + 1.0))).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn a_small_closing_learned_from_does_not_inflate_a_large_run() {
        // 2 shapes in 10.6 s is mostly start-up: a 10-shape run keeps 6 + 10 x 2.3 s, not 10 x 5.3.
        let r = plan(Duration::from_secs(20 * 60), &model(BURST, 10, &[time(10.6, 2, Some(0.0))]));
        assert!((r.seconds - 29.0).abs() < 1e-9, "{r:?}");
        // A closing quicker than the start-up and its windows counts as no time per shape, never negative.
        let m = model(BURST, 10, &[time(4.0, 10, Some(0.2))]);
        assert_eq!((m.fixed_s_per_shape, plan(Duration::from_secs(20 * 60), &m).seconds), (0.0, START_S));
    }

    #[test]
    fn a_closing_too_long_for_a_quarter_of_the_budget_is_cut_windows_first_then_the_rerank_then_to_burst() {
        let m = llama();
        assert!((m.fixed_s_per_shape - (72.7 / 9.0 - 5.4)).abs() < 1e-9, "{m:?}");
        // 20 minutes: the whole closing (6 + 9 x (2.68 + 4.14 of windows + 1.0 of re-rank) = 76.4 s).
        let r = plan(Duration::from_secs(20 * 60), &m);
        assert_eq!((r.closing.trim, r.capped), (Trim::None, false));
        assert!((r.seconds - 76.36).abs() < 0.01, "{r:?}");
        // 4 minutes (60 s): the re-rank kept, its windows 112 ms.
        let r = plan(Duration::from_secs(240), &m);
        assert_eq!((r.closing.trim, r.closing.rerank, r.closing.sustained_ms, r.capped), (Trim::ShortWindows, true, 112.0, false));
        assert!(r.seconds <= 60.0 && r.seconds > 59.0, "{r:?}");
        // 3 minutes (45 s): the re-rank's windows would be 31 ms; without it 159 ms fit.
        let r = plan(Duration::from_secs(180), &m);
        assert_eq!((r.closing.trim, r.closing.rerank, r.closing.sustained_ms, r.capped), (Trim::NoRerank, false, 159.0, false));
        // 2 minutes (30 s): burst timing only, and even that (30.1 s) is over: capped.
        let r = plan(Duration::from_secs(120), &m);
        assert_eq!((r.closing.trim, r.closing.rerank, r.closing.sustained_ms, r.capped), (Trim::BurstOnly, false, 0.0, true));
        assert_eq!(r.seconds, 30.0);
        let line = r.describe(&m, Duration::from_secs(120));
        assert!(line.contains("to fit a quarter of the budget: burst timing only (no sustained windows, no re-rank)"), "{line}");
        assert!(line.ends_with("even so more than a quarter of the budget: the closing may run past it)"), "{line}");
    }

    #[test]
    fn the_closing_is_decided_again_from_the_time_left() {
        let m = llama();
        // A 2-minute run whose plan ended with 100 s left closes in full; with 62 s, the re-rank
        // at 122-ms windows; with 56 s, no re-rank (its windows would be 90 ms) and 200-ms
        // windows; with 40 s, no re-rank and 106-ms windows; with 10 s, burst only.
        assert_eq!(m.fit(100.0), SUSTAINED.configured());
        let c = m.fit(62.0);
        assert_eq!((c.trim, c.sustained_ms, c.rerank), (Trim::ShortWindows, 122.0, true));
        assert_eq!(c.cut(200.0).as_deref(), Some("122-ms sustained windows instead of 200"));
        let c = m.fit(56.0);
        assert_eq!((c.trim, c.sustained_ms, c.rerank), (Trim::NoRerank, 200.0, false));
        assert_eq!(c.cut(200.0).as_deref(), Some("no sustained re-rank"));
        assert_eq!(m.fit(40.0).cut(200.0).as_deref(), Some("no sustained re-rank and 106-ms windows instead of 200"));
        assert_eq!(m.fit(10.0).trim, Trim::BurstOnly);
        assert_eq!(m.fit(10.0).cut(200.0).as_deref(), Some("burst timing only (no sustained windows, no re-rank)"));
        // Without a re-rank to drop, windows are shortened and then left out.
        let m = model(ClosingWork { rerank_top: 1, ..SUSTAINED }, 9, &[time(78.7, 9, Some(5.4))]);
        assert_eq!((m.fit(40.0).trim, m.fit(40.0).sustained_ms), (Trim::ShortWindows, 106.0));
        assert_eq!(m.fit(20.0).trim, Trim::BurstOnly);
    }

    #[test]
    fn nothing_is_kept_or_cut_when_off_or_when_there_is_no_closing() {
        let d = Duration::from_secs(60);
        let off = Model::learn(SUSTAINED, 4, false, &[], Some(10.0));
        assert_eq!((off.basis.clone(), plan(d, &off).seconds), (Basis::Off, 0.0));
        // Off: the closing runs whole, past the budget, whatever the time left.
        assert_eq!(off.fit(0.0), SUSTAINED.configured());
        // Burst timing configured: nothing to cut (no closing_cut event), whatever the time left.
        let burst = model(BURST, 9, &[]);
        assert_eq!((burst.fit(0.0), burst.fit(0.0).cut(0.0)), (BURST.configured(), None));
        let none = ClosingWork { sustained_ms: 200.0, rerank_top: 1, sdpa: false, ..SUSTAINED };
        assert_eq!(model(none, 4, &[]).basis, Basis::NoClosing);
        // The re-rank alone is a closing: 6 + 4 x (3 + 9 windows x 0.2 s x 1.15 + 1.0).
        let rerank_only = model(ClosingWork { sdpa: false, ..SUSTAINED }, 4, &[]);
        assert!((plan(Duration::from_secs(600), &rerank_only).seconds - 30.28).abs() < 1e-9);
    }

    /// A closing with a measured re-rank: what the re-rank took comes off whole before the fixed
    /// part is learned, and its cost per contender beyond its windows is learned too (the
    /// slowest of the last few), so a closing learned without one keeps the built-in figure.
    /// Figures of session 36's LLM run on the H200: 11 shapes, 103-ms windows, top 3 in 3
    /// rounds, a 58.0-s closing (here: its re-rank 27.5 s).
    #[test]
    fn a_measured_rerank_is_learned_per_contender_and_leaves_the_fixed_part_alone() {
        let windows = 18.0 * 0.103 * WINDOW_STRETCH;
        let rerank_windows = SUSTAINED.rerank_window_s(103.0);
        assert!((rerank_windows - 9.0 * 0.103 * WINDOW_STRETCH).abs() < 1e-12);
        let rerank = RerankTime { seconds: 27.5, window_s_per_shape: rerank_windows, contenders: 2 };
        let with = Event::ClosingTime {
            seconds: 58.0,
            shapes: 11,
            sustained_ms: 103.0,
            window_s_per_shape: Some(windows),
            rerank_s_per_shape: Some(1.0),
            rerank: Some(rerank),
        };
        let m = model(SUSTAINED, 11, &[with.clone()]);
        let per_contender = (27.5 / 11.0 - rerank_windows) / 2.0;
        assert!((m.work.rerank_s_per_contender - per_contender).abs() < 1e-12, "{m:?}");
        let fixed = (58.0 - START_S - 27.5) / 11.0 - (windows - rerank_windows);
        assert!((m.fixed_s_per_shape - fixed).abs() < 1e-12, "{m:?}");
        // The whole closing again at the same windows: what it took, to the second.
        let again = m.work.closing(103.0, true, Trim::ShortWindows);
        assert!((m.seconds(&again) - 58.0).abs() < 1e-9, "{}", m.seconds(&again));
        // The slowest of the recorded re-ranks; one without a re-rank leaves the figure as it is.
        let quick = Event::ClosingTime {
            seconds: 42.5,
            shapes: 11,
            sustained_ms: 103.0,
            window_s_per_shape: Some(windows),
            rerank_s_per_shape: Some(1.0),
            rerank: Some(RerankTime { seconds: 12.0, ..rerank }),
        };
        assert!((model(SUSTAINED, 11, &[quick, with.clone()]).work.rerank_s_per_contender - per_contender).abs() < 1e-12);
        let none = model(SUSTAINED, 11, &[time(39.0, 11, Some(1.84))]);
        assert_eq!(none.work.rerank_s_per_contender, RERANK_S_PER_CONTENDER);
        // Learned from a closing without the re-rank, the same run expected ~53 s and took 58.
        let before = model(SUSTAINED, 11, &[time(39.0, 11, Some(1.84))]);
        let expected = before.seconds(&before.work.closing(103.0, true, Trim::ShortWindows));
        assert!(expected < 54.0, "{expected}");
    }

    /// Ledgers written before the re-rank was measured read as before: `rerank` absent.
    #[test]
    fn a_closing_time_without_a_rerank_field_reads() {
        let old: Event = serde_json::from_str(
            r#"{"event":"closing_time","seconds":39.0,"shapes":11,"sustained_ms":178.0,"window_s_per_shape":1.84,"rerank_s_per_shape":0.0}"#,
        )
        .unwrap();
        assert!(matches!(old, Event::ClosingTime { rerank: None, .. }), "{old:?}");
        let new = Event::ClosingTime {
            seconds: 1.0,
            shapes: 1,
            sustained_ms: 100.0,
            window_s_per_shape: Some(0.5),
            rerank_s_per_shape: Some(0.5),
            rerank: Some(RerankTime { seconds: 0.4, window_s_per_shape: 0.3, contenders: 1 }),
        };
        assert_eq!(serde_json::from_str::<Event>(&serde_json::to_string(&new).unwrap()).unwrap(), new);
    }

    #[test]
    fn the_line_says_where_the_search_ends() {
        let m = model(SUSTAINED, 10, &[time(106.0, 10, Some(3.6))]);
        assert_eq!(
            plan(Duration::from_secs(20 * 60), &m).describe(&m, Duration::from_secs(20 * 60)),
            "the search ends at 17m58s of the 20m00s budget, keeping 2m01s for the closing comparison (6 s start-up + 10 shape(s) x (6.4 s + 4.1 s of sustained windows + 1.0 s of re-rank), the slowest of the last 1 closing(s) on this GPU)"
        );
        let r = plan(Duration::from_secs(240), &llama());
        assert_eq!(
            r.describe(&llama(), Duration::from_secs(240)),
            "the search ends at 3m00s of the 4m00s budget, keeping 59s for the closing comparison (6 s start-up + 9 shape(s) x (2.7 s + 2.3 s of sustained windows + 1.0 s of re-rank), the slowest of the last 1 closing(s) on this GPU; to fit a quarter of the budget: 112-ms sustained windows instead of 200, unless the search ends sooner (a longer budget, or run.budget_covers_closing = false, keeps the whole closing))"
        );
    }
}
