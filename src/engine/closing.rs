//! The closing comparison: when a run finishes, each shape's best kernel is timed, SDPA
//! (and FlashAttention-4, where it imports) is measured afresh, and the best kernels are
//! timed again. The SDPA figures taken at the start of a run come from a cool GPU; after
//! many minutes of sustained load the clocks are lower, so the end-of-run best and the
//! start-of-run SDPA are not comparable. Bracketing a fresh measurement between two
//! timings of ours compares both at the same clocks; the speedup a user reads at the end
//! comes from here. Decode shapes are also given in effective K/V bandwidth.

use crate::spec::protocol::TimeCase;
use crate::storage::ledger::{self, ClosingRow, EventKind};
use crate::storage::sdpa::Versions;
use crate::pipeline::timing;

use super::Engine;

impl Engine {
    /// Run the closing comparison; a failure is recorded as an event and the run still
    /// finishes (the comparison adds figures, it decides nothing).
    pub(super) async fn closing_comparison(&mut self) -> anyhow::Result<()> {
        if !self.cfg.baseline.sdpa || self.incumbents.is_empty() || self.ledger.sdpa(&self.run_id).await?.is_empty() {
            return Ok(());
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
            }
            Err(why) => {
                let msg = format!("closing comparison not made: {why}");
                self.ledger.event(&self.run_id, EventKind::ClosingFailed, &msg).await?;
                tracing::warn!(kind = "closing_failed", "{msg}");
            }
        }
        Ok(())
    }

    async fn closing_rows(&mut self) -> Result<(Vec<ClosingRow>, Versions), String> {
        self.ensure_incumbents_loaded().await.map_err(|f| f.reason)?;
        let shapes: Vec<_> = self.shapes.iter().filter(|s| self.incumbents.contains_key(&s.key())).copied().collect();
        let before = self.time_incumbents(0xC105_E001).await?;
        let (sdpa, versions) = crate::storage::sdpa::measure_fresh(&self.cfg, &self.run_dir, &shapes).await?;
        let after = self.time_incumbents(0xC105_E002).await?;
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
                ours_before_us: *b,
                ours_after_us: *a,
                sdpa_default_us: default.graph_us,
                sdpa_picked: default.picked,
                sdpa_backends: serde_json::to_value(&sd.backends).unwrap_or_default(),
                measured_at: measured_at.clone(),
            });
        }
        Ok((rows, versions))
    }

    /// Each shape's incumbent alone, timed as candidates are: median per shape key.
    async fn time_incumbents(&mut self, salt: u64) -> Result<std::collections::BTreeMap<String, f64>, String> {
        let cases: Vec<TimeCase> = self
            .shapes
            .iter()
            .filter_map(|s| self.incumbents.get(&s.key()))
            .map(|inc| TimeCase { shape: inc.plan.shape, entries: vec![timing::entry(&inc.id, &inc.plan)] })
            .collect();
        let timed = timing::run(&mut self.sup, cases, self.cfg.timing_spec(), self.seed ^ salt, self.cfg.worker.time_timeout)
            .await
            .map_err(|f| f.reason)?;
        Ok(timed
            .cases
            .iter()
            .filter_map(|c| Some((c.shape.key(), timing::stats_of(c, &c.entries.first()?.id)?.median_us)))
            .collect())
    }
}
