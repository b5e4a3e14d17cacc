//! The `iterations`, `iteration_shapes` and `best` tables: every candidate, what it did on
//! each shape, and the best kernel per shape, written together in one transaction.

use serde::Serialize;
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, Row};

use super::{now, Ledger, LedgerError, Result};
use crate::spec::states::Verdict;

/// One iteration, as recorded.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct IterationRecord {
    pub run_id: String,
    pub seq: i64,
    pub stage: String,
    pub template: String,
    pub params_json: String,
    pub source_hash: Option<String>,
    pub git_commit: Option<String>,
    pub verdict: Verdict,
    pub reason: String,
    pub compile_ms: Option<f64>,
    /// How long its load waited for the compiler (0: the look-ahead's build was ready).
    pub compile_wait_ms: Option<f64>,
    pub registers: Option<i64>,
    pub local_bytes: Option<i64>,
    pub static_smem: Option<i64>,
    pub resources_json: Option<String>,
    pub score_us: Option<f64>,
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: String,
    /// Budget used (seconds) when the iteration was recorded.
    pub used_s: Option<f64>,
    /// NVRTC target it was compiled for (`sm_90`, `sm_90a`); None when not compiled.
    pub arch: Option<String>,
    /// Wall milliseconds of the correctness check and of the timing.
    pub check_ms: Option<f64>,
    pub time_ms: Option<f64>,
    #[sqlx(skip)]
    pub shapes: Vec<ShapeRecord>,
}

impl Default for IterationRecord {
    fn default() -> Self {
        IterationRecord {
            run_id: String::new(),
            seq: 0,
            stage: String::new(),
            template: String::new(),
            params_json: String::new(),
            source_hash: None,
            git_commit: None,
            verdict: Verdict::Running,
            reason: String::new(),
            compile_ms: None,
            compile_wait_ms: None,
            registers: None,
            local_bytes: None,
            static_smem: None,
            resources_json: None,
            score_us: None,
            error: None,
            started_at: String::new(),
            finished_at: String::new(),
            used_s: None,
            arch: None,
            check_ms: None,
            time_ms: None,
            shapes: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, sqlx::FromRow)]
pub struct ShapeRecord {
    pub shape: String,
    pub shape_json: String,
    pub n_splits: Option<i64>,
    pub ctas: Option<i64>,
    pub waves: Option<f64>,
    pub check_passed: Option<bool>,
    pub max_abs: Option<f64>,
    pub rel_l2: Option<f64>,
    pub ctas_ran: Option<i64>,
    pub median_us: Option<f64>,
    pub p10_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub samples: Option<i64>,
    pub incumbent_us: Option<f64>,
    pub speedup_vs_incumbent: Option<f64>,
    pub speedup_vs_baseline: Option<f64>,
    pub threshold: Option<f64>,
    pub tflops: Option<f64>,
    pub won: bool,
    /// Input sets rotated through while timing this shape.
    pub input_sets: Option<i64>,
    /// Why the gate refused the candidate for this shape (it went on with the others).
    pub gated: Option<String>,
    /// The timing samples behind the decision, as JSON (`{"candidate": [..], "incumbent": [..]}`,
    /// in the order taken): in the ledger for re-judging the accept rule, not in `history --json`.
    #[serde(skip)]
    pub timing_samples: Option<String>,
}

/// An iteration whose row cannot be decoded (e.g. a verdict of a newer release): its
/// number and why.
#[derive(Debug, Clone, Serialize)]
pub struct UnreadableIteration {
    pub seq: i64,
    pub why: String,
}

/// A per-shape row and the iteration it belongs to.
#[derive(sqlx::FromRow)]
struct ShapeRow {
    seq: i64,
    #[sqlx(flatten)]
    shape: ShapeRecord,
}

/// The best kernel for one shape, updated in the same transaction as its iteration.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct BestRow {
    pub shape: String,
    pub seq: i64,
    pub median_us: f64,
    pub baseline_us: Option<f64>,
    pub source_path: String,
    pub git_commit: Option<String>,
}

impl Ledger {
    /// Record one iteration, its per-shape rows and best-kernel updates atomically.
    pub async fn record_iteration(&self, it: &IterationRecord, best: &[BestRow], used_s: f64) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(self.q("begin iteration"))?;
        // Replace the `running` placeholder written by begin_iteration.
        sqlx::query("DELETE FROM iterations WHERE run_id = ? AND seq = ?")
            .bind(&it.run_id)
            .bind(it.seq)
            .execute(&mut *tx)
            .await
            .map_err(self.q("replace iteration"))?;
        sqlx::query(
            "INSERT INTO iterations (run_id, seq, stage, template, params_json, source_hash, git_commit, verdict, reason,
                compile_ms, registers, local_bytes, static_smem, resources_json, score_us, error, started_at, finished_at, used_s, arch,
                check_ms, time_ms, compile_wait_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&it.run_id)
        .bind(it.seq)
        .bind(&it.stage)
        .bind(&it.template)
        .bind(&it.params_json)
        .bind(&it.source_hash)
        .bind(&it.git_commit)
        .bind(it.verdict)
        .bind(&it.reason)
        .bind(it.compile_ms)
        .bind(it.registers)
        .bind(it.local_bytes)
        .bind(it.static_smem)
        .bind(&it.resources_json)
        .bind(it.score_us)
        .bind(&it.error)
        .bind(&it.started_at)
        .bind(&it.finished_at)
        .bind(used_s)
        .bind(&it.arch)
        .bind(it.check_ms)
        .bind(it.time_ms)
        .bind(it.compile_wait_ms)
        .execute(&mut *tx)
        .await
        .map_err(self.q("insert iteration"))?;
        for s in &it.shapes {
            sqlx::query(
                "INSERT INTO iteration_shapes (run_id, seq, shape, shape_json, n_splits, ctas, waves, check_passed, max_abs,
                    rel_l2, ctas_ran, median_us, p10_us, p90_us, samples, incumbent_us, speedup_vs_incumbent,
                    speedup_vs_baseline, threshold, tflops, won, input_sets, gated, timing_samples)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&it.run_id)
            .bind(it.seq)
            .bind(&s.shape)
            .bind(&s.shape_json)
            .bind(s.n_splits)
            .bind(s.ctas)
            .bind(s.waves)
            .bind(s.check_passed)
            .bind(s.max_abs)
            .bind(s.rel_l2)
            .bind(s.ctas_ran)
            .bind(s.median_us)
            .bind(s.p10_us)
            .bind(s.p90_us)
            .bind(s.samples)
            .bind(s.incumbent_us)
            .bind(s.speedup_vs_incumbent)
            .bind(s.speedup_vs_baseline)
            .bind(s.threshold)
            .bind(s.tflops)
            .bind(s.won)
            .bind(s.input_sets)
            .bind(&s.gated)
            .bind(&s.timing_samples)
            .execute(&mut *tx)
            .await
            .map_err(self.q("insert iteration shape"))?;
        }
        for b in best {
            sqlx::query(
                "INSERT INTO best (run_id, shape, seq, median_us, baseline_us, source_path, git_commit) VALUES (?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT(run_id, shape) DO UPDATE SET seq = excluded.seq, median_us = excluded.median_us,
                    baseline_us = COALESCE(best.baseline_us, excluded.baseline_us), source_path = excluded.source_path,
                    git_commit = excluded.git_commit",
            )
            .bind(&it.run_id)
            .bind(&b.shape)
            .bind(b.seq)
            .bind(b.median_us)
            .bind(b.baseline_us)
            .bind(&b.source_path)
            .bind(&b.git_commit)
            .execute(&mut *tx)
            .await
            .map_err(self.q("update best"))?;
        }
        sqlx::query("UPDATE runs SET used_s = ? WHERE id = ?")
            .bind(used_s)
            .bind(&it.run_id)
            .execute(&mut *tx)
            .await
            .map_err(self.q("update budget"))?;
        crate::failpoint::hit("ledger-mid-commit");
        tx.commit().await.map_err(self.q("commit iteration"))?;
        Ok(())
    }

    /// Write a `running` row for an iteration about to start: if the daemon dies before
    /// the iteration is recorded, `resume` finds it and marks it `interrupted`.
    pub async fn begin_iteration(&self, it: &IterationRecord, used_s: f64) -> Result<()> {
        sqlx::query(
            "INSERT INTO iterations (run_id, seq, stage, template, params_json, verdict, reason, started_at, finished_at)
             VALUES (?, ?, ?, ?, ?, ?, 'in progress', ?, ?)",
        )
        .bind(&it.run_id)
        .bind(it.seq)
        .bind(&it.stage)
        .bind(&it.template)
        .bind(&it.params_json)
        .bind(Verdict::Running)
        .bind(&it.started_at)
        .bind(&it.started_at)
        .execute(&self.pool)
        .await
        .map_err(self.q("begin iteration"))?;
        self.set_progress(&it.run_id, None, used_s).await
    }

    /// Mark iterations left `running` by a daemon that died as `interrupted`; returns how many.
    pub async fn mark_interrupted(&self, run_id: &str) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE iterations SET verdict = ?, reason = 'the daemon stopped during this iteration', finished_at = ?
             WHERE run_id = ? AND verdict = ?",
        )
        .bind(Verdict::Interrupted)
        .bind(now())
        .bind(run_id)
        .bind(Verdict::Running)
        .execute(&self.pool)
        .await
        .map_err(self.q("mark interrupted"))?;
        Ok(r.rows_affected())
    }

    /// A run's iterations in order; an iteration that cannot be decoded is an error naming it.
    pub async fn iterations(&self, run_id: &str) -> Result<Vec<IterationRecord>> {
        let (its, unreadable) = self.iteration_list(run_id).await?;
        match unreadable.into_iter().next() {
            Some(u) => Err(LedgerError::UnreadableIteration { run: run_id.to_string(), seq: u.seq, why: u.why }),
            None => Ok(its),
        }
    }

    /// A run's iterations in order, each row decoded on its own: those that decode, and
    /// the ones that do not (named by their number).
    pub async fn iteration_list(&self, run_id: &str) -> Result<(Vec<IterationRecord>, Vec<UnreadableIteration>)> {
        let rows: Vec<SqliteRow> = sqlx::query("SELECT * FROM iterations WHERE run_id = ? ORDER BY seq")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list iterations"))?;
        let mut out = Vec::with_capacity(rows.len());
        let mut unreadable = Vec::new();
        for row in &rows {
            match IterationRecord::from_row(row) {
                Ok(it) => out.push(it),
                Err(e) => unreadable.push(UnreadableIteration { seq: row.try_get("seq").unwrap_or(-1), why: e.to_string() }),
            }
        }
        // Per-shape rows in slices of iterations: a 10,000-iteration run holds 80,000 of them,
        // and fetching them all at once keeps every raw row in memory at the same time.
        const SLICE: usize = 512;
        let seqs: Vec<i64> = out.iter().map(|i| i.seq).collect();
        for chunk in seqs.chunks(SLICE) {
            let (first, last) = (chunk[0], chunk[chunk.len() - 1]);
            let rows: Vec<ShapeRow> = sqlx::query_as("SELECT * FROM iteration_shapes WHERE run_id = ? AND seq BETWEEN ? AND ? ORDER BY seq, rowid")
                .bind(run_id)
                .bind(first)
                .bind(last)
                .fetch_all(&self.pool)
                .await
                .map_err(self.q("list iteration shapes"))?;
            // Rows come ordered by seq, like `out`: a binary search, not a scan per row.
            for r in rows {
                if let Ok(ix) = out.binary_search_by_key(&r.seq, |i| i.seq) {
                    out[ix].shapes.push(r.shape);
                }
            }
        }
        Ok((out, unreadable))
    }

    pub async fn best(&self, run_id: &str) -> Result<Vec<BestRow>> {
        sqlx::query_as("SELECT * FROM best WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list best"))
    }
}
