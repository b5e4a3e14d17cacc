//! The closing comparison: when a run finishes, each shape's best kernel is timed, SDPA
//! (and FlashAttention-4, where it imports) is measured afresh, and the best kernels are
//! timed again. The SDPA figures taken at the start of a run come from a cool GPU; after
//! many minutes of sustained load the clocks are lower, so the end-of-run best and the
//! start-of-run SDPA are not comparable. Bracketing a fresh measurement between two
//! timings of ours compares both at the same clocks; the speedup a user reads at the end
//! comes from here. Decode shapes are also given in effective K/V bandwidth.
//!
//! Sustained timing (`timing.sustained_ms` > 0): the re-rank (`rerank.rs`) runs first and
//! may change a shape's best; the comparison then reports both figures: ours burst and
//! sustained (before and after the baselines), SDPA's and FA4's both ways.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::pipeline::timing;
use crate::spec::protocol::{TimeCase, TimingSpec};
use crate::storage::ledger::{self, ClosingRow, Event, EventKind, RerankTime};
use crate::storage::sdpa::Versions;

use super::{reserve, Engine};

/// Salts of the closing's timing seeds (distinct inputs from every iteration's).
const SALT_BEFORE: u64 = 0xC105_E001;
const SALT_AFTER: u64 = 0xC105_E002;

/// One burst and (when asked) one sustained median per shape key.
type Timings = BTreeMap<String, (f64, Option<f64>)>;

/// A closing that did all it set out to: what it measured of itself for the record.
pub(super) struct Complete {
    /// How long the sustained re-rank took, where one ran.
    rerank: Option<Duration>,
}

impl Engine {
    /// Run the closing comparison; a failure is recorded as an event and the run still
    /// finishes (the comparison adds figures, it decides nothing). The sustained re-rank
    /// before it does decide: its wins are recorded like any other. Some when all it set out
    /// to do was done (its time is then what later runs keep for theirs), with what its
    /// re-rank took.
    pub(super) async fn closing_comparison(&mut self) -> anyhow::Result<Option<Complete>> {
        self.fit_closing().await?;
        let mut complete = true;
        let mut measured = false;
        let mut rerank = None;
        if self.closing.rerank && !self.incumbents.is_empty() {
            // A run resumed after (part of) its re-rank does not re-rank those shapes again:
            // its closing then takes less than a whole one, and is not recorded as one.
            let before = self.ledger.events(&self.run_id).await?.iter().any(|e| e.kind == EventKind::Rerank)
                || self.ledger.iterations(&self.run_id).await?.iter().any(|i| i.stage == super::rerank::RERANK_STAGE);
            let started = std::time::Instant::now();
            match self.sustained_rerank().await? {
                Ok(()) => {
                    measured = true;
                    complete = !before;
                    rerank = Some(started.elapsed());
                }
                Err(why) => {
                    complete = false;
                    let msg = format!("sustained re-rank not made: {why}");
                    self.ledger.event(&self.run_id, EventKind::ClosingFailed, &msg).await?;
                    tracing::warn!(kind = "closing_failed", "{msg}");
                }
            }
        }
        let done = Complete { rerank };
        if !self.cfg.baseline.sdpa || self.incumbents.is_empty() || self.ledger.sdpa(&self.run_id).await?.is_empty() {
            return Ok((complete && measured).then_some(done));
        }
        match self.closing_rows().await {
            Ok((rows, versions)) => {
                let parts: Vec<String> =
                    rows.iter().map(|r| r.summary(self.shapes.iter().find(|s| s.key() == r.shape))).collect();
                for r in &rows {
                    self.ledger.closing_record(&self.run_id, r).await?;
                }
                let absent = versions.fa4_absent().map(|why| format!("; {why}")).unwrap_or_default();
                let msg = format!(
                    "closing comparison (best kernels timed before and after a fresh measurement of the baselines): {}{absent}",
                    parts.join(", ")
                );
                self.ledger.event(&self.run_id, EventKind::Closing, &msg).await?;
                tracing::info!(kind = "closing", "{msg}");
                Ok(complete.then_some(done))
            }
            Err(why) => {
                let msg = format!("closing comparison not made: {why}");
                self.ledger.event(&self.run_id, EventKind::ClosingFailed, &msg).await?;
                tracing::warn!(kind = "closing_failed", "{msg}");
                Ok(None)
            }
        }
    }

    /// Record how long a complete closing took, and its re-rank, for later runs on this GPU
    /// to keep as much.
    pub(super) async fn record_closing_time(&self, took: Duration, done: Complete) -> anyhow::Result<()> {
        let shapes = self.incumbents.len() as u32;
        let seconds = took.as_secs_f64();
        let c = &self.closing;
        let work = self.closing_model.as_ref().map(|m| m.work);
        let rerank = done.rerank.zip(work).filter(|_| c.rerank).map(|(t, w)| RerankTime {
            seconds: t.as_secs_f64(),
            window_s_per_shape: w.rerank_window_s(c.sustained_ms),
            contenders: w.contenders(),
        });
        let event = Event::ClosingTime {
            seconds,
            shapes,
            sustained_ms: c.sustained_ms,
            window_s_per_shape: Some(c.window_s_per_shape),
            rerank_s_per_shape: Some(c.rerank_s_per_shape),
            rerank,
        };
        let of_which = rerank.map(|r| format!("; the re-rank {:.1} s of it", r.seconds)).unwrap_or_default();
        let msg = format!("closing comparison took {seconds:.1} s for {shapes} shape(s) ({:.1} s each{of_which})", seconds / f64::from(shapes.max(1)));
        self.ledger.record_event(&self.run_id, &event, &msg).await?;
        tracing::info!(kind = "closing_time", seconds, shapes, "{msg}");
        Ok(())
    }

    /// What this run keeps of its budget for the closing: decided once when the run is
    /// created and recorded; a resumed run reads it back. The closing's cost model is learned
    /// either way (`reserve.rs`), from `baselines_s` too: how long this run's start took to
    /// measure the baselines of every shape afresh, where it did.
    pub(super) async fn decide_closing_reserve(&mut self, resuming: bool, baselines_s: Option<f64>) -> anyhow::Result<()> {
        // The baselines are measured again at the closing only where they were at the start.
        let sdpa_rows = if self.cfg.baseline.sdpa { self.ledger.sdpa(&self.run_id).await? } else { Vec::new() };
        // FA4 counts where it ran at the start (a shape it refused has no graph time).
        let fa4 = sdpa_rows.iter().any(|r| r.backends.get(crate::storage::sdpa::FA4).and_then(|b| b.get("graph_us")).is_some_and(serde_json::Value::is_f64));
        let work = reserve::ClosingWork::new(&self.cfg, !sdpa_rows.is_empty(), fa4);
        let history = self.ledger.closing_times(&self.device.name, reserve::HISTORY * 4).await?;
        let model = reserve::Model::learn(work, self.shapes.len(), self.cfg.run.budget_covers_closing, &history, baselines_s);
        self.closing = model.work.configured();
        if resuming {
            let kept = self.ledger.closing_reserve(&self.run_id).await?;
            self.closing_reserve = Duration::from_secs_f64(kept.unwrap_or(0.0).max(0.0));
        } else {
            let r = reserve::plan(self.budget, &model);
            let msg = r.describe(&model, self.budget);
            self.ledger.record_event(&self.run_id, &Event::ClosingReserve { seconds: r.seconds }, &msg).await?;
            tracing::info!(kind = "closing_reserve", seconds = r.seconds, "{msg}");
            self.closing_reserve = r.duration();
        }
        self.closing_model = Some(model);
        Ok(())
    }

    /// What the closing does, from the time left of the budget (`reserve::Model::fit`): the
    /// whole closing where it fits, cut where it does not; a cut is recorded and logged.
    async fn fit_closing(&mut self) -> anyhow::Result<()> {
        let Some(model) = &self.closing_model else { return Ok(()) };
        let left = self.budget.saturating_sub(self.used()).as_secs_f64();
        self.closing = model.fit(left);
        if let Some(cut) = self.closing.cut(model.work.sustained_ms) {
            let msg = format!(
                "closing comparison cut to fit the {} left of the budget (expected {:.0} s): {cut}; a longer budget, or run.budget_covers_closing = false, keeps the whole closing",
                crate::pipeline::record::fmt_dur(Duration::from_secs_f64(left)),
                model.seconds(&self.closing)
            );
            self.ledger.event(&self.run_id, EventKind::ClosingCut, &msg).await?;
            tracing::info!(kind = "closing_cut", "{msg}");
        }
        Ok(())
    }

    /// The closing's timing: the run's, with the closing's sustained windows and burst samples
    /// as long as the SDPA script's (`closing_sample`).
    pub(super) fn closing_spec(&self) -> TimingSpec {
        closing_sample(TimingSpec { sustained_ms: self.closing.sustained_ms, ..self.cfg.timing_spec() })
    }

    async fn closing_rows(&mut self) -> Result<(Vec<ClosingRow>, Versions), String> {
        self.ensure_incumbents_loaded().await.map_err(|f| f.reason)?;
        let shapes: Vec<_> = self.shapes.iter().filter(|s| self.incumbents.contains_key(&s.key())).copied().collect();
        let sustained_ms = self.closing.sustained_ms;
        let before = self.time_incumbents(SALT_BEFORE).await?;
        let (sdpa, versions) = crate::storage::sdpa::measure_fresh(&self.cfg, &self.run_dir, &shapes, sustained_ms).await?;
        if sustained_ms > 0.0 {
            // The script's last act was its sustained windows, and the worker's own pause
            // only follows the worker's windows: without this one the "after" bursts ran at
            // the power limit those windows left (an H200's B 4 x S 1024 prefill read 79.8 us
            // after, 69.0 before: docs/device-runs/2026-12-01-session42). The script starts
            // cool by itself: importing torch takes longer than the pause.
            tracing::debug!(wait_ms = crate::spec::protocol::COOL_DOWN.as_millis() as u64, "the closing's second timing waits for the baselines' windows' power to settle");
            tokio::time::sleep(crate::spec::protocol::COOL_DOWN).await;
        }
        let after = self.time_incumbents(SALT_AFTER).await?;
        let measured_at = ledger::now();
        let mut rows = Vec::new();
        for (shape, sd) in shapes.iter().zip(sdpa) {
            let key = shape.key();
            let (Some(b), Some(a), Some(inc)) = (before.get(&key), after.get(&key), self.incumbents.get(&key)) else {
                return Err(format!("{key}: no valid timing samples for the best kernel"));
            };
            let default = sd.default_backend().cloned().unwrap_or_default();
            rows.push(ClosingRow {
                shape: key,
                seq: inc.seq,
                ours_before_us: b.0,
                ours_after_us: a.0,
                sdpa_default_us: default.graph_us,
                sdpa_picked: default.picked,
                sdpa_backends: serde_json::to_value(&sd.backends).unwrap_or_default(),
                measured_at: measured_at.clone(),
                ours_sustained_before_us: b.1,
                ours_sustained_after_us: a.1,
                sdpa_default_sustained_us: default.sustained_us,
                sustained_ms: (sustained_ms > 0.0).then_some(sustained_ms),
            });
        }
        Ok((rows, versions))
    }

    /// Each shape's incumbent alone, timed as candidates are (and sustained when
    /// `timing.sustained_ms` > 0): medians per shape key.
    async fn time_incumbents(&mut self, salt: u64) -> Result<Timings, String> {
        let cases: Vec<TimeCase> = self
            .shapes
            .iter()
            .filter_map(|s| self.incumbents.get(&s.key()))
            .map(|inc| TimeCase { shape: inc.plan.shape, entries: vec![timing::entry(&inc.id, &inc.plan)] })
            .collect();
        let spec = self.closing_spec();
        let timeout = sustained_timeout(self.cfg.worker.time_timeout, &spec, &cases);
        let timed = timing::run(&mut self.sup, cases, spec, self.seed ^ salt, timeout).await.map_err(|f| f.reason)?;
        Ok(timed
            .cases
            .iter()
            .filter_map(|c| {
                let id = &c.entries.first()?.id;
                let burst = timing::stats_of(c, id)?.median_us;
                Some((c.shape.key(), (burst, timing::sustained_of(c, id).map(|s| s.median_us))))
            })
            .collect())
    }

}

/// The worker's time limit for a timing with sustained windows: the configured limit plus
/// twice the GPU time the windows take (each entry, each round, `sustained_ms`).
/// `spec` with each burst sample lasting `sample_target_us`, as a replay of the SDPA script's
/// graph does (scripts/sdpa_baseline.py's `calls_for`: round(target / one call), at most
/// `sdpa::MAX_CALLS_PER_GRAPH`): the run's `launches_per_sample` cap lifted to that. A sample
/// is one graph replay between two events, and the GPU waits between the start event and the
/// replay's first kernel for the CPU to submit it (~0.5 us); the search's samples, capped at
/// a few launches (5 in the benchmark workloads: a Llama-3 B 1 decode sample is 22 us), carry
/// that wait into every execution's time (~2.5% there), SDPA's 2-ms graphs did not. The
/// search compares candidates sample against sample, both carrying it, so only the closing,
/// which sets ours against SDPA and FA4, needs the same length as theirs. Without a target
/// (`sample_target_us` 0) the script also falls back to fixed calls: unchanged.
pub(super) fn closing_sample(spec: TimingSpec) -> TimingSpec {
    if spec.sample_target_us > 0.0 {
        TimingSpec { launches_per_sample: spec.launches_per_sample.max(crate::storage::sdpa::MAX_CALLS_PER_GRAPH), ..spec }
    } else {
        spec
    }
}

pub(super) fn sustained_timeout(base: Duration, spec: &TimingSpec, cases: &[TimeCase]) -> Duration {
    let windows: usize = cases.iter().map(|c| c.entries.len()).sum::<usize>() * crate::spec::protocol::sustained_rounds(spec) as usize;
    base + Duration::from_secs_f64(2.0 * windows as f64 * spec.sustained_ms.max(0.0) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::ShapePlan;

    #[test]
    fn the_time_limit_grows_with_the_sustained_windows() {
        let spec = TimingSpec {
            warmup: 5,
            rounds: 4,
            samples_per_round: 10,
            launches_per_sample: 10,
            l2_multiple: 3.0,
            max_input_sets: 32,
            graph: true,
            sample_target_us: 2000.0,
            max_entry_ms: 300.0,
            sustained_ms: 200.0,
        };
        let shape = crate::test_fixtures::llama_decode();
        let plan = ShapePlan { shape, n_splits: 1, launches: vec![], tensor_maps: vec![] };
        let case = TimeCase { shape, entries: vec![timing::entry("a", &plan), timing::entry("b", &plan), timing::entry("c", &plan)] };
        // 3 entries x 3 rounds x 200 ms = 1.8 s of windows: 3.6 s more.
        assert_eq!(sustained_timeout(Duration::from_secs(180), &spec, std::slice::from_ref(&case)), Duration::from_millis(183_600));
        assert_eq!(sustained_timeout(Duration::from_secs(180), &TimingSpec { sustained_ms: 0.0, ..spec }, &[case]), Duration::from_secs(180));
    }

    #[test]
    fn a_closing_sample_lasts_as_long_as_the_sdpa_scripts_graph() {
        let run = TimingSpec {
            warmup: 5,
            rounds: 4,
            samples_per_round: 5,
            launches_per_sample: 5,
            l2_multiple: 3.0,
            max_input_sets: 32,
            graph: true,
            sample_target_us: 2000.0,
            max_entry_ms: 300.0,
            sustained_ms: 0.0,
        };
        // A Llama-3 B 1 decode call of 4.4 us: the search's samples are 5 calls (22 us), the
        // closing's as many as fill the 2-ms target, as the script's graph of round(2000 / 4.4).
        let search = crate::spec::protocol::sample_plan(&run, 4.4);
        assert_eq!(search.per_sample, 5);
        let closing = crate::spec::protocol::sample_plan(&closing_sample(run), 4.4);
        assert_eq!(closing.per_sample, 455);
        assert!(4.4 * f64::from(closing.per_sample) >= 2000.0);
        // The same number of samples in all (rounds x samples per round), one per round.
        assert_eq!((closing.samples_per_round, closing.rounds), (1, 20));
        // A long call is one per sample either way; the script's cap holds for tiny ones.
        assert_eq!(crate::spec::protocol::sample_plan(&closing_sample(run), 3000.0).per_sample, 1);
        assert_eq!(crate::spec::protocol::sample_plan(&closing_sample(run), 0.5).per_sample, crate::storage::sdpa::MAX_CALLS_PER_GRAPH);
        // No target: the script times fixed calls, and so does the closing, as the run does.
        let fixed = TimingSpec { sample_target_us: 0.0, ..run };
        assert_eq!(closing_sample(fixed).launches_per_sample, 5);
    }
}
