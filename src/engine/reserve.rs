//! The part of a run's budget kept for its closing comparison (`run.budget_covers_closing`).
//!
//! A finished run re-ranks each shape's top kernels under sustained timing and measures the
//! baselines afresh (`closing.rs`, `rerank.rs`). On the H200 that took 184 s for the LLM
//! workload's 11 shapes (2026-11-29, 200-ms windows, FA4 beside SDPA; before the re-rank's
//! builds were shared): an 8-minute run ended after 11. So the search ends early by what the closing is expected to take, and
//! `--budget` is the run's length. The expectation is learned: every closing records how
//! long it took (`Event::ClosingTime`), and a run on a GPU of the same name keeps a fixed
//! start-up ([`START_S`]: SDPA's script starting and importing torch and FA4, whatever the
//! shape count) plus the slowest per-shape rest of the last few closings (same timing mode)
//! times its shape count. A first run on a GPU uses the figures below. The reserve never
//! exceeds a quarter of the budget: a short run still searches, and its closing then runs past
//! the budget (status shows both).

use std::time::Duration;

use crate::storage::ledger::Event;

/// Seconds of every closing whatever its shape count: the SDPA script's start-up (a Python
/// process importing torch, creating its CUDA context, importing FA4 where it is installed).
/// A closing of 2 shapes with burst timing took 10.6 s on the H200 (2026-11-29, FA4 beside),
/// one of the 10 benchmark shapes about 10 s on an H100 without FA4 (README): most of a short
/// closing is this term, so a per-shape figure alone undershoots small runs and, learned from
/// one, overshoots large ones.
pub(crate) const START_S: f64 = 6.0;
/// Seconds per shape beyond [`START_S`] of a closing with sustained timing, before any was
/// measured on this GPU. On the H200 (2026-11-29) the 10 benchmark shapes' took 142.4 s (13.6 s
/// per shape beyond the start-up), the LLM run's 16.8 s per shape (89 s re-rank, 95 s closing,
/// 11 shapes, before the re-rank's builds were shared), most of it each kernel's and baseline's
/// 200-ms windows and FA4's compile per shape.
pub(crate) const DEFAULT_SUSTAINED_S_PER_SHAPE: f64 = 12.0;
/// The same with burst timing only (no re-rank, no sustained windows). The 2-shape closing above
/// left 2.3 s per shape beyond [`START_S`]; two more of the large shapes (0.5 and 1.5 ms
/// kernels, FA4 not installed) took 12.5 and 16.2 s on the H200 (2026-11-29, session 25), 3.3
/// and 5.1 s per shape: above the slowest of the three, so a first run keeps what its closing takes.
pub(crate) const DEFAULT_BURST_S_PER_SHAPE: f64 = 5.5;
/// The largest share of the budget kept back.
pub(crate) const MAX_SHARE: f64 = 0.25;
/// How many recorded closings (newest first) a run learns from.
pub(crate) const HISTORY: u32 = 3;

/// What the closing will do, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ClosingWork {
    /// `timing.sustained_ms` (0: burst timing only).
    pub(crate) sustained_ms: f64,
    /// Whether the sustained re-rank runs (`timing.rerank_top` > 1 under sustained timing).
    pub(crate) rerank: bool,
    /// Whether the baselines are measured (`baseline.sdpa`).
    pub(crate) sdpa: bool,
}

impl ClosingWork {
    fn any(&self) -> bool {
        self.sdpa || (self.sustained_ms > 0.0 && self.rerank)
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
    /// Nothing recorded on this GPU in this timing mode: the built-in figure.
    Default,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reserve {
    pub(crate) seconds: f64,
    /// Seconds per shape beyond [`START_S`].
    pub(crate) per_shape_s: f64,
    pub(crate) basis: Basis,
    /// The estimate was larger than [`MAX_SHARE`] of the budget and was cut to it.
    pub(crate) capped: bool,
}

impl Reserve {
    pub(crate) fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds.max(0.0))
    }

    /// One line for people: where the search ends and why.
    pub(crate) fn describe(&self, budget: Duration, shapes: usize) -> String {
        let fmt = |s: f64| crate::pipeline::record::fmt_dur(Duration::from_secs_f64(s.max(0.0)));
        let b = budget.as_secs_f64();
        match self.basis {
            Basis::Off => format!("the search uses the whole budget ({}); the closing comparison runs past it (run.budget_covers_closing = false)", fmt(b)),
            Basis::NoClosing => format!("the search uses the whole budget ({}): no closing comparison to keep time for", fmt(b)),
            Basis::Measured { .. } | Basis::Default => {
                let source = match self.basis {
                    Basis::Measured { runs } => format!("the slowest of the last {runs} closing(s) on this GPU"),
                    _ => "no closing measured on this GPU yet: the built-in figure".to_string(),
                };
                let cap = if self.capped { "; capped at a quarter of the budget, so the closing may run past it" } else { "" };
                format!(
                    "the search ends at {} of the {} budget, keeping {} for the closing comparison ({START_S:.0} s start-up + {shapes} shape(s) x {:.1} s, {source}{cap})",
                    fmt(b - self.seconds),
                    fmt(b),
                    fmt(self.seconds),
                    self.per_shape_s
                )
            }
        }
    }
}

/// The reserve for a run of `shapes` shapes and `budget`, given the closings recorded on
/// its GPU (newest first; other events are ignored) and whether the budget covers the closing.
pub(crate) fn plan(budget: Duration, shapes: usize, work: ClosingWork, covers_closing: bool, history: &[Event]) -> Reserve {
    let none = |basis| Reserve { seconds: 0.0, per_shape_s: 0.0, basis, capped: false };
    if !covers_closing {
        return none(Basis::Off);
    }
    if !work.any() || shapes == 0 {
        return none(Basis::NoClosing);
    }
    let sustained = work.sustained_ms > 0.0;
    // Only closings in the same timing mode: one with sustained windows takes ~9x one without.
    // Each one's time beyond the start-up, per shape (never below zero: a closing quicker than
    // the start-up term says only that the shapes cost little).
    let measured: Vec<f64> = history
        .iter()
        .filter_map(|e| match e {
            Event::ClosingTime { seconds, shapes, sustained_ms } if *shapes > 0 && (*sustained_ms > 0.0) == sustained && seconds.is_finite() => {
                Some(((seconds - START_S) / f64::from(*shapes)).max(0.0))
            }
            _ => None,
        })
        .take(HISTORY as usize)
        .collect();
    let (per_shape_s, basis) = if measured.is_empty() {
        (if sustained { DEFAULT_SUSTAINED_S_PER_SHAPE } else { DEFAULT_BURST_S_PER_SHAPE }, Basis::Default)
    } else {
        (measured.iter().copied().fold(0.0, f64::max), Basis::Measured { runs: measured.len() })
    };
    let want = START_S + per_shape_s * shapes as f64;
    let cap = budget.as_secs_f64() * MAX_SHARE;
    Reserve { seconds: want.min(cap), per_shape_s, basis, capped: want > cap }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUSTAINED: ClosingWork = ClosingWork { sustained_ms: 200.0, rerank: true, sdpa: true };
    const BURST: ClosingWork = ClosingWork { sustained_ms: 0.0, rerank: true, sdpa: true };

    fn time(seconds: f64, shapes: u32, sustained_ms: f64) -> Event {
        Event::ClosingTime { seconds, shapes, sustained_ms }
    }

    #[test]
    fn a_first_run_keeps_the_start_up_and_the_built_in_figure_per_shape() {
        let r = plan(Duration::from_secs(20 * 60), 10, SUSTAINED, true, &[]);
        assert_eq!(r, Reserve { seconds: 126.0, per_shape_s: 12.0, basis: Basis::Default, capped: false });
        let r = plan(Duration::from_secs(20 * 60), 10, BURST, true, &[]);
        assert_eq!((r.seconds, r.basis), (61.0, Basis::Default));
        // The 2-shape burst closings measured on the H200 (10.6, 12.5 and 16.2 s) are covered
        // from the first run.
        let r = plan(Duration::from_secs(10 * 60), 2, BURST, true, &[]);
        assert!(r.seconds >= 16.2, "{}", r.seconds);
    }

    #[test]
    fn recorded_closings_of_the_same_mode_decide_the_slowest_of_the_last_three() {
        // Newest first, per shape beyond the 6-s start-up: 11 shapes in 116 s (10 s each), 4 in
        // 66 s (15), a burst closing (ignored), 10 in 56 s (5), and a fourth sustained one (past the three).
        let history = [time(116.0, 11, 200.0), time(66.0, 4, 200.0), time(9.0, 10, 0.0), time(56.0, 10, 200.0), time(900.0, 10, 200.0)];
        let r = plan(Duration::from_secs(3600), 6, SUSTAINED, true, &history);
        assert_eq!(r, Reserve { seconds: 96.0, per_shape_s: 15.0, basis: Basis::Measured { runs: 3 }, capped: false });
        // The burst run learns only from the burst closing: (9 - 6) / 10 s per shape.
        let r = plan(Duration::from_secs(3600), 6, BURST, true, &history);
        assert_eq!(r.basis, Basis::Measured { runs: 1 });
        assert!((r.per_shape_s - 0.3).abs() < 1e-9 && (r.seconds - 7.8).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn a_small_closing_learned_from_does_not_inflate_a_large_run() {
        // 2 shapes in 10.6 s is mostly start-up: a 10-shape run keeps 6 + 10 x 2.3 s, not 10 x 5.3.
        let r = plan(Duration::from_secs(20 * 60), 10, BURST, true, &[time(10.6, 2, 0.0)]);
        assert!((r.seconds - 29.0).abs() < 1e-9, "{r:?}");
        // A closing quicker than the start-up term counts as no time per shape, never negative.
        let r = plan(Duration::from_secs(20 * 60), 10, BURST, true, &[time(4.0, 10, 0.0)]);
        assert_eq!((r.per_shape_s, r.seconds), (0.0, START_S));
    }

    #[test]
    fn the_reserve_is_capped_at_a_quarter_of_the_budget() {
        // 6 s + 11 shapes x 12 s = 138 s against 480 s: 120 s kept, the rest of the closing runs past.
        let r = plan(Duration::from_secs(480), 11, SUSTAINED, true, &[]);
        assert_eq!((r.seconds, r.capped), (120.0, true));
        assert!(r.describe(Duration::from_secs(480), 11).contains("capped at a quarter of the budget"), "{}", r.describe(Duration::from_secs(480), 11));
    }

    #[test]
    fn nothing_is_kept_when_off_or_when_there_is_no_closing() {
        let d = Duration::from_secs(600);
        assert_eq!(plan(d, 4, SUSTAINED, false, &[]).basis, Basis::Off);
        assert_eq!(plan(d, 4, SUSTAINED, false, &[]).seconds, 0.0);
        let none = ClosingWork { sustained_ms: 200.0, rerank: false, sdpa: false };
        assert_eq!(plan(d, 4, none, true, &[]).basis, Basis::NoClosing);
        // The re-rank alone is a closing.
        assert_eq!(plan(d, 4, ClosingWork { sdpa: false, ..SUSTAINED }, true, &[]).seconds, 54.0);
    }

    #[test]
    fn the_line_says_where_the_search_ends() {
        let r = plan(Duration::from_secs(20 * 60), 10, SUSTAINED, true, &[time(106.0, 10, 200.0)]);
        assert_eq!(
            r.describe(Duration::from_secs(20 * 60), 10),
            "the search ends at 18m14s of the 20m00s budget, keeping 1m46s for the closing comparison (6 s start-up + 10 shape(s) x 10.0 s, the slowest of the last 1 closing(s) on this GPU)"
        );
    }
}
