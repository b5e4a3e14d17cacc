//! Time-to-best: how soon a run reached its final best per shape, and how much of its
//! budget went to candidates that could not have won. Computed here, once, from the
//! ledger's iterations alone, so it holds for old ledgers and for finished runs read
//! read-only; `status` (text and `--json`), the end-of-run summary and `report` all show
//! this one [`TimeToBest`]. It lives beside the rows it reads so that the engine (the
//! run's closing log line) and `ops/` (status, report) share it without `engine/`
//! depending on `ops/`.

use serde::Serialize;

use crate::spec::states::Verdict;
use super::IterationRecord;

/// A candidate "lost by more than 20%" when its time over the shapes it was timed on is
/// more than this many times the incumbents' it was timed against.
pub const LOSER_RATIO: f64 = 1.2;

/// The definition, said once, for every place that shows the figures.
pub const DEFINITION: &str = "best reached at: budget seconds into the run when the iteration that became the shape's final best \
(its last win) was recorded. A candidate's budget: its own wall time (start to record), capped at what the run's budget counter \
grew since the previous recorded iteration (GPU waits are not charged); time between candidates is charged to none. \
Lost by >20%: timed, won no shape, and the geometric mean over its timed shapes of (its median / the incumbent's median, \
timed beside it) is above 1.20. Failed before timing: timed on no shape and verdict gated, compile_error, incorrect, \
cta_mismatch, crashed, timeout, error, cheating or rejected_proposal; counted apart from the losers. \
Waiting for the compiler: the seconds candidates' loads waited for their builds (none when the look-ahead had a build ready), \
within those candidates' budgets; raise worker.compile_threads or worker.lookahead_depth where the host has idle cores. \
Iterations without a recorded budget (interrupted, in flight) are charged to neither.";

/// When one shape's final best was first reached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShapeTimeToBest {
    pub shape: String,
    /// The iteration that became the final best (the shape's last win).
    pub seq: i64,
    /// Budget seconds into the run when that iteration was recorded (None: an old row
    /// without a budget figure).
    pub first_reached_best_s: Option<f64>,
}

/// The run-level figures; see [`DEFINITION`].
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct TimeToBest {
    /// Per shape, in the order shapes first appear in the iterations.
    pub shapes: Vec<ShapeTimeToBest>,
    /// Budget seconds charged to candidates that lost by more than 20%.
    pub budget_s_on_losers_20pct: f64,
    pub losers_20pct: usize,
    /// Budget seconds charged to candidates that failed before any timing.
    pub budget_s_on_failed: f64,
    pub failed: usize,
    /// Budget seconds candidates' loads waited for their builds (0 in ledgers from before
    /// `compile_wait_ms` was recorded).
    pub budget_s_waiting_for_compiler: f64,
    /// Budget seconds charged to every candidate (the denominator for shares).
    pub budget_s_on_candidates: f64,
    pub definition: &'static str,
}

/// Verdicts of a candidate that stopped before its timing produced a number.
fn fails_before_timing(v: Verdict) -> bool {
    matches!(
        v,
        Verdict::Gated
            | Verdict::CompileError
            | Verdict::Incorrect
            | Verdict::CtaMismatch
            | Verdict::Crashed
            | Verdict::Timeout
            | Verdict::Error
            | Verdict::Cheating
            | Verdict::RejectedProposal
    )
}

/// Wall seconds from `started_at` to `finished_at` (RFC 3339, as the ledger writes them);
/// None when either does not parse (hand-edited or very old rows).
fn wall_s(it: &IterationRecord) -> Option<f64> {
    let a = chrono::DateTime::parse_from_rfc3339(&it.started_at).ok()?;
    let b = chrono::DateTime::parse_from_rfc3339(&it.finished_at).ok()?;
    Some(((b - a).num_milliseconds() as f64 / 1e3).max(0.0))
}

/// The candidate's time vs its incumbents' over the shapes where both were timed
/// (geometric mean of the ratios, as the search's score is a geometric mean); None when
/// no shape has both (the baseline, a shape with no incumbent yet, a failure).
fn ratio_vs_incumbent(it: &IterationRecord) -> Option<f64> {
    let logs: Vec<f64> = it
        .shapes
        .iter()
        .filter_map(|s| match (s.median_us, s.incumbent_us) {
            (Some(m), Some(i)) if m > 0.0 && i > 0.0 => Some((m / i).ln()),
            _ => None,
        })
        .collect();
    (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp())
}

/// Time-to-best over a run's iterations (in `seq` order, as the ledger lists them).
pub fn compute(its: &[IterationRecord]) -> TimeToBest {
    let mut out = TimeToBest { definition: DEFINITION, ..TimeToBest::default() };
    let mut prev_used: f64 = 0.0;
    for it in its {
        // Per shape, the last win is the final best: a baseline wins every shape it is
        // timed on, and every later change of incumbent is a win on that shape.
        for s in it.shapes.iter().filter(|s| s.won) {
            let row = ShapeTimeToBest { shape: s.shape.clone(), seq: it.seq, first_reached_best_s: it.used_s };
            match out.shapes.iter_mut().find(|x| x.shape == s.shape) {
                Some(x) => *x = row,
                None => out.shapes.push(row),
            }
        }
        // An iteration without a budget figure (interrupted, in flight) is charged nothing:
        // its wall time may span the daemon being down.
        let Some(used) = it.used_s else { continue };
        let grew = (used - prev_used).max(0.0);
        prev_used = prev_used.max(used);
        let cost = wall_s(it).map_or(grew, |w| w.min(grew));
        out.budget_s_on_candidates += cost;
        out.budget_s_waiting_for_compiler += it.compile_wait_ms.map_or(0.0, |ms| (ms / 1e3).clamp(0.0, cost));
        let timed = it.shapes.iter().any(|s| s.median_us.is_some());
        let won = it.shapes.iter().any(|s| s.won);
        if !timed && fails_before_timing(it.verdict) {
            out.budget_s_on_failed += cost;
            out.failed += 1;
        } else if timed && !won && ratio_vs_incumbent(it).is_some_and(|r| r > LOSER_RATIO) {
            out.budget_s_on_losers_20pct += cost;
            out.losers_20pct += 1;
        }
    }
    out
}

impl TimeToBest {
    pub fn shape(&self, key: &str) -> Option<&ShapeTimeToBest> {
        self.shapes.iter().find(|s| s.shape == key)
    }

    /// The latest `first_reached_best_s` over the shapes: when the whole workload had its
    /// final kernels.
    pub fn last_reached_s(&self) -> Option<f64> {
        self.shapes.iter().filter_map(|s| s.first_reached_best_s).fold(None, |m, t| Some(m.map_or(t, |m: f64| m.max(t))))
    }

    /// One line for the status text and the end-of-run summary: `used_s` is the run's
    /// budget used, the denominator of the shares; `finished`: the run ended for good, so
    /// its bests are final (otherwise they are the bests so far); `fmt` writes seconds (the
    /// callers' `pipeline::record::fmt_secs`, which `storage/` may not use).
    pub fn summary_line(&self, used_s: f64, finished: bool, fmt: impl Fn(f64) -> String) -> String {
        let which = if finished { "final" } else { "current" };
        let share = |x: f64| if used_s > 0.0 { format!(" ({:.0}%)", 100.0 * x / used_s) } else { String::new() };
        let last = self.last_reached_s().map(|t| format!("every shape's {which} best reached by {}; ", fmt(t))).unwrap_or_default();
        // Said only where some load waited (a ledger from before it was recorded: never).
        let waits = if self.budget_s_waiting_for_compiler >= 0.05 {
            format!(", {}{} waiting for the compiler", fmt(self.budget_s_waiting_for_compiler), share(self.budget_s_waiting_for_compiler))
        } else {
            String::new()
        };
        format!(
            "{last}{}{} on {} candidate(s) losing by >20%, {}{} on {} that failed before timing{waits}",
            fmt(self.budget_s_on_losers_20pct),
            share(self.budget_s_on_losers_20pct),
            self.losers_20pct,
            fmt(self.budget_s_on_failed),
            share(self.budget_s_on_failed),
            self.failed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ledger::ShapeRecord;

    const A: &str = "shapeA";
    const B: &str = "shapeB";

    fn at(s: f64) -> String {
        let t = chrono::DateTime::parse_from_rfc3339("2026-11-24T10:00:00.000Z").unwrap() + chrono::Duration::milliseconds((s * 1e3) as i64);
        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    /// An iteration running from `start` to `end` wall seconds, recorded at `used` budget seconds.
    fn it(seq: i64, verdict: Verdict, start: f64, end: f64, used: Option<f64>, shapes: Vec<ShapeRecord>) -> IterationRecord {
        IterationRecord { seq, verdict, started_at: at(start), finished_at: at(end), used_s: used, shapes, ..Default::default() }
    }

    fn timed(shape: &str, median: f64, incumbent: Option<f64>, won: bool) -> ShapeRecord {
        ShapeRecord { shape: shape.into(), median_us: Some(median), incumbent_us: incumbent, won, ..Default::default() }
    }

    fn untimed(shape: &str) -> ShapeRecord {
        ShapeRecord { shape: shape.into(), ..Default::default() }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn best_reached_then_improved_later_and_a_shape_never_improved_after_the_baseline() {
        let its = vec![
            // Setup (the SDPA baseline) ran before: 30 s of budget charged to no candidate.
            it(1, Verdict::Baseline, 30.0, 35.0, Some(35.0), vec![timed(A, 100.0, None, true), timed(B, 50.0, None, true)]),
            it(2, Verdict::Accepted, 35.0, 40.0, Some(40.0), vec![timed(A, 80.0, Some(100.0), true), timed(B, 51.0, Some(50.0), false)]),
            it(3, Verdict::Accepted, 40.0, 50.0, Some(50.0), vec![timed(A, 70.0, Some(80.0), true), timed(B, 52.0, Some(50.0), false)]),
            it(4, Verdict::Rejected, 50.0, 55.0, Some(55.0), vec![timed(A, 75.0, Some(70.0), false), timed(B, 55.0, Some(50.0), false)]),
        ];
        let t = compute(&its);
        assert_eq!(t.shape(A), Some(&ShapeTimeToBest { shape: A.into(), seq: 3, first_reached_best_s: Some(50.0) }));
        assert_eq!(t.shape(B), Some(&ShapeTimeToBest { shape: B.into(), seq: 1, first_reached_best_s: Some(35.0) }));
        assert_eq!(t.last_reached_s(), Some(50.0));
        assert!(close(t.budget_s_on_candidates, 25.0), "{t:?}");
        assert_eq!((t.losers_20pct, t.failed), (0, 0));
    }

    #[test]
    fn losers_by_more_than_20pct_are_charged_and_closer_losers_are_not() {
        let base = it(1, Verdict::Baseline, 0.0, 2.0, Some(2.0), vec![timed(A, 100.0, None, true), timed(B, 100.0, None, true)]);
        // 1.5x and 1.0x: geometric mean 1.22 > 1.2.
        let far = it(2, Verdict::Rejected, 2.0, 6.0, Some(6.0), vec![timed(A, 150.0, Some(100.0), false), timed(B, 100.0, Some(100.0), false)]);
        // 1.19x on its one shape: lost, but by less than 20%.
        let near = it(3, Verdict::Rejected, 6.0, 9.0, Some(9.0), vec![timed(A, 119.0, Some(100.0), false)]);
        // 3x on A but won B: it changed a best, so it is no loser.
        let mixed = it(4, Verdict::Accepted, 9.0, 10.0, Some(10.0), vec![timed(A, 300.0, Some(100.0), false), timed(B, 90.0, Some(100.0), true)]);
        // The GPU was lost for 100 s of wall time, not charged: the budget grew 3 s.
        let waited = it(5, Verdict::Rejected, 10.0, 113.0, Some(13.0), vec![timed(A, 200.0, Some(100.0), false)]);
        let t = compute(&[base, far, near, mixed, waited]);
        assert_eq!(t.losers_20pct, 2, "{t:?}");
        assert!(close(t.budget_s_on_losers_20pct, 4.0 + 3.0), "{t:?}");
        assert_eq!(t.failed, 0);
        assert!(close(t.budget_s_on_candidates, 13.0), "{t:?}");
        assert_eq!(t.shape(B).map(|s| s.seq), Some(4));
    }

    #[test]
    fn failures_before_timing_are_counted_apart_and_interrupted_ones_not_at_all() {
        let its = vec![
            it(1, Verdict::Gated, 0.0, 0.5, Some(0.5), vec![]),
            it(2, Verdict::CompileError, 0.5, 3.0, Some(3.0), vec![untimed(A)]),
            it(3, Verdict::Incorrect, 3.0, 7.0, Some(7.0), vec![untimed(A)]),
            it(4, Verdict::Baseline, 7.0, 9.0, Some(9.0), vec![timed(A, 10.0, None, true)]),
            // Killed mid-iteration: no budget figure, and its wall time spans the restart.
            it(5, Verdict::Interrupted, 9.0, 500.0, None, vec![]),
            // Skipped thanks to memory: neither a loser nor a failure.
            it(6, Verdict::Remembered, 20.0, 20.1, Some(20.1), vec![]),
            // Timed, then flagged: a number exists, so it is no failure before timing.
            it(7, Verdict::Flagged, 21.0, 22.0, Some(22.0), vec![timed(A, 30.0, Some(10.0), false)]),
        ];
        let t = compute(&its);
        assert_eq!(t.failed, 3);
        assert!(close(t.budget_s_on_failed, 0.5 + 2.5 + 4.0), "{t:?}");
        assert_eq!(t.losers_20pct, 1);
        assert!(close(t.budget_s_on_losers_20pct, 1.0), "{t:?}");
        assert_eq!(t.shape(A).map(|s| s.seq), Some(4));
        let line = t.summary_line(22.0, true, |s| format!("{s:.1}s"));
        assert_eq!(line, "every shape's final best reached by 9.0s; 1.0s (5%) on 1 candidate(s) losing by >20%, 7.0s (32%) on 3 that failed before timing");
    }

    #[test]
    fn loads_waiting_for_the_compiler_are_summed_within_each_candidates_budget() {
        let waited = |mut it: IterationRecord, ms: Option<f64>| {
            it.compile_wait_ms = ms;
            it
        };
        let its = vec![
            waited(it(1, Verdict::Baseline, 0.0, 2.0, Some(2.0), vec![timed(A, 10.0, None, true)]), Some(1500.0)),
            waited(it(2, Verdict::Rejected, 2.0, 4.0, Some(4.0), vec![timed(A, 11.0, Some(10.0), false)]), Some(0.0)),
            // More than the candidate's own budget (a clock step): charged at most its 1 s.
            waited(it(3, Verdict::Rejected, 4.0, 5.0, Some(5.0), vec![timed(A, 11.0, Some(10.0), false)]), Some(9000.0)),
            // Interrupted: charged nothing.
            waited(it(4, Verdict::Interrupted, 5.0, 9.0, None, vec![]), Some(3000.0)),
            // Recorded before the column existed.
            waited(it(5, Verdict::Rejected, 5.0, 6.0, Some(6.0), vec![timed(A, 11.0, Some(10.0), false)]), None),
        ];
        let t = compute(&its);
        assert!(close(t.budget_s_waiting_for_compiler, 2.5), "{t:?}");
        let line = t.summary_line(10.0, true, |s| format!("{s:.1}s"));
        assert!(line.ends_with("that failed before timing, 2.5s (25%) waiting for the compiler"), "{line}");
        // None recorded: the line as before.
        let old: Vec<IterationRecord> = its.into_iter().map(|i| waited(i, None)).collect();
        assert!(compute(&old).summary_line(10.0, true, |s| format!("{s:.1}s")).ends_with("that failed before timing"));
    }

    #[test]
    fn an_empty_run_has_no_best_and_nothing_charged() {
        let t = compute(&[]);
        assert!(t.shapes.is_empty() && t.last_reached_s().is_none());
        assert_eq!(t.budget_s_on_candidates, 0.0);
        assert!(!t.summary_line(0.0, false, |s| format!("{s}")).contains("reached by"));
    }
}
