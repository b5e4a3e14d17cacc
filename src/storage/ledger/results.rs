//! The tables of what a run is compared against: SDPA as measured for the run (`sdpa`),
//! the cache of SDPA measurements per device and versions (`sdpa_cache`), and the closing
//! comparison (`closing`). The measuring itself is [`crate::storage::sdpa`]'s.

use serde::Serialize;

use super::{now, Ledger, Result};
use crate::spec::protocol::Shape;
use crate::storage::sdpa::FA4;

/// SDPA as recorded for one shape of a run.
#[derive(Debug, Clone, Serialize)]
pub struct SdpaRow {
    pub shape: String,
    pub default_graph_us: Option<f64>,
    pub default_eager_us: Option<f64>,
    pub picked: Option<String>,
    pub backends: serde_json::Value,
    pub versions: serde_json::Value,
    pub cached: bool,
}

#[derive(sqlx::FromRow)]
struct RawSdpa {
    shape: String,
    default_graph_us: Option<f64>,
    default_eager_us: Option<f64>,
    picked: Option<String>,
    result_json: String,
    versions_json: String,
    cached: bool,
}

/// SDPA on one shape, to record with a run.
#[derive(Debug, Clone)]
pub struct NewSdpa<'a> {
    pub shape: &'a str,
    /// The default backend's CUDA-graph and eager time per call.
    pub default_graph_us: Option<f64>,
    pub default_eager_us: Option<f64>,
    /// The backend the default dispatched to.
    pub picked: Option<String>,
    /// Every backend's timings, as JSON.
    pub backends_json: String,
    pub versions_json: &'a str,
    /// Taken from the cache rather than measured now.
    pub cached: bool,
}

/// One shape of the closing comparison: the best kernel timed just before and just after
/// a fresh SDPA measurement, so both are compared at the same clocks.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClosingRow {
    pub shape: String,
    /// The best kernel's iteration.
    pub seq: i64,
    pub ours_before_us: f64,
    pub ours_after_us: f64,
    pub sdpa_default_us: Option<f64>,
    pub sdpa_picked: Option<String>,
    /// Every backend's timing, as the SDPA script reported it.
    pub sdpa_backends: serde_json::Value,
    pub measured_at: String,
    /// Sustained timing (`timing.sustained_ms`): our median per-execution time over
    /// back-to-back windows of `sustained_ms`, before and after the baselines; SDPA
    /// default's the same way (FA4's is in `sdpa_backends`). None: not measured.
    pub ours_sustained_before_us: Option<f64>,
    pub ours_sustained_after_us: Option<f64>,
    pub sdpa_default_sustained_us: Option<f64>,
    pub sustained_ms: Option<f64>,
}

#[derive(sqlx::FromRow)]
struct RawClosing {
    shape: String,
    seq: i64,
    ours_before_us: f64,
    ours_after_us: f64,
    sdpa_default_us: Option<f64>,
    sdpa_picked: Option<String>,
    sdpa_json: String,
    measured_at: String,
    ours_sustained_before_us: Option<f64>,
    ours_sustained_after_us: Option<f64>,
    sdpa_default_sustained_us: Option<f64>,
    sustained_ms: Option<f64>,
}

impl ClosingRow {
    /// Our time: the mean of the medians before and after SDPA (drift cancels to first order).
    pub fn ours_us(&self) -> f64 {
        0.5 * (self.ours_before_us + self.ours_after_us)
    }

    /// SDPA default's time over ours (> 1: ours is faster).
    pub fn vs_default(&self) -> Option<f64> {
        self.sdpa_default_us.map(|d| d / self.ours_us())
    }

    /// A backend's CUDA-graph time as the script reported it (None: not measured, or failed).
    pub fn backend_us(&self, name: &str) -> Option<f64> {
        self.sdpa_backends.get(name)?.get("graph_us")?.as_f64()
    }

    /// Our sustained time: the mean of the figures before and after the baselines (either
    /// alone when only one was taken); None when not measured.
    pub fn ours_sustained_us(&self) -> Option<f64> {
        match (self.ours_sustained_before_us, self.ours_sustained_after_us) {
            (Some(b), Some(a)) => Some(0.5 * (b + a)),
            (b, a) => b.or(a),
        }
    }

    /// SDPA default's sustained time over ours (> 1: ours is faster under sustained load).
    pub fn sustained_vs_default(&self) -> Option<f64> {
        Some(self.sdpa_default_sustained_us? / self.ours_sustained_us()?)
    }

    /// FlashAttention-4's sustained time; None when not measured.
    pub fn fa4_sustained_us(&self) -> Option<f64> {
        self.sdpa_backends.get(FA4)?.get("sustained_us")?.as_f64()
    }

    /// FA4's sustained time over ours.
    pub fn sustained_vs_fa4(&self) -> Option<f64> {
        Some(self.fa4_sustained_us()? / self.ours_sustained_us()?)
    }

    /// FlashAttention-4's time; None when it was not measured or could not run the shape.
    pub fn fa4_us(&self) -> Option<f64> {
        self.backend_us(FA4)
    }

    /// FA4's time over ours (> 1: ours is faster).
    pub fn vs_fa4(&self) -> Option<f64> {
        self.fa4_us().map(|f| f / self.ours_us())
    }

    /// FA4 was run on this shape (timed, or it failed with an error).
    pub fn fa4_measured(&self) -> bool {
        self.sdpa_backends.get(FA4).is_some_and(|v| v.is_object())
    }

    /// The closing comparison of this shape in one line, as the run's event says it:
    /// `KEY 25.00 us vs SDPA default 50.00 us = 2.00x, FA4 40.00 us = 1.60x`. A decode
    /// shape (`shape`, when known, [`Shape::is_decode`]) is judged in bytes/s: each time is
    /// followed by the effective K/V bandwidth it stands for.
    pub fn summary(&self, shape: Option<&Shape>) -> String {
        let decode = shape.filter(|s| s.is_decode());
        let rate = |us: f64| decode.map(|s| format!(" ({})", kv_rate(s, us))).unwrap_or_default();
        let ours = self.ours_us();
        let sdpa = match self.sdpa_default_us {
            Some(d) => format!("{d:.2} us{}", rate(d)),
            None => "-".into(),
        };
        let vs = self.vs_default().map(|x| format!("{x:.2}x")).unwrap_or_else(|| "-".into());
        let mut line = format!("{} {ours:.2} us{} vs SDPA default {sdpa} = {vs}", self.shape, rate(ours));
        if self.fa4_measured() {
            match self.fa4_us() {
                Some(f) => line.push_str(&format!(", FA4 {f:.2} us{} = {:.2}x", rate(f), f / ours)),
                None => line.push_str(", FA4 could not run it"),
            }
        }
        if let Some(ours) = self.ours_sustained_us() {
            let window = self.sustained_ms.map(|ms| format!(" over {ms:.0} ms")).unwrap_or_default();
            let sdpa = match (self.sdpa_default_sustained_us, self.sustained_vs_default()) {
                (Some(d), Some(x)) => format!("SDPA default {d:.2} us = {x:.2}x"),
                _ => "SDPA default -".into(),
            };
            line.push_str(&format!("; sustained{window}: {ours:.2} us{} vs {sdpa}", rate(ours)));
            if let (Some(f), Some(x)) = (self.fa4_sustained_us(), self.sustained_vs_fa4()) {
                line.push_str(&format!(", FA4 {f:.2} us = {x:.2}x"));
            }
        }
        line
    }
}

/// Effective K/V bandwidth of a call of `us` microseconds on `shape`: the bytes of K and V
/// it must read ([`Shape::kv_bytes`]) over the time, in TB/s.
pub fn kv_tbps(shape: &Shape, us: f64) -> f64 {
    shape.kv_bytes() as f64 / (us * 1e-6) / 1e12
}

/// `2.64 TB/s KV`: how decode times are judged.
pub fn kv_rate(shape: &Shape, us: f64) -> String {
    format!("{:.2} TB/s KV", kv_tbps(shape, us))
}

impl Ledger {
    pub async fn sdpa_cached(&self, key: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT result_json FROM sdpa_cache WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.q("read SDPA cache"))
    }

    pub async fn sdpa_cache_put(&self, key: &str, json: &str) -> Result<()> {
        sqlx::query("INSERT OR REPLACE INTO sdpa_cache (key, measured_at, result_json) VALUES (?, ?, ?)")
            .bind(key)
            .bind(now())
            .bind(json)
            .execute(&self.pool)
            .await
            .map_err(self.q("write SDPA cache"))?;
        Ok(())
    }

    pub async fn sdpa_record(&self, run_id: &str, s: &NewSdpa<'_>) -> Result<()> {
        sqlx::query(
            "INSERT OR REPLACE INTO sdpa (run_id, shape, default_graph_us, default_eager_us, picked, result_json, versions_json, cached)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run_id)
        .bind(s.shape)
        .bind(s.default_graph_us)
        .bind(s.default_eager_us)
        .bind(&s.picked)
        .bind(&s.backends_json)
        .bind(s.versions_json)
        .bind(s.cached)
        .execute(&self.pool)
        .await
        .map_err(self.q("record SDPA"))?;
        Ok(())
    }

    /// SDPA as recorded for each shape of a run, in workload order.
    pub async fn sdpa(&self, run_id: &str) -> Result<Vec<SdpaRow>> {
        let rows: Vec<RawSdpa> = sqlx::query_as("SELECT * FROM sdpa WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list SDPA"))?;
        Ok(rows
            .into_iter()
            .map(|r| SdpaRow {
                shape: r.shape,
                default_graph_us: r.default_graph_us,
                default_eager_us: r.default_eager_us,
                picked: r.picked,
                backends: serde_json::from_str(&r.result_json).unwrap_or_default(),
                versions: serde_json::from_str(&r.versions_json).unwrap_or_default(),
                cached: r.cached,
            })
            .collect())
    }

    /// Record one shape of the closing comparison (replaces an earlier one).
    pub async fn closing_record(&self, run_id: &str, c: &ClosingRow) -> Result<()> {
        sqlx::query(
            "INSERT OR REPLACE INTO closing (run_id, shape, seq, ours_before_us, ours_after_us, sdpa_default_us, sdpa_picked, sdpa_json, measured_at,
                                             ours_sustained_before_us, ours_sustained_after_us, sdpa_default_sustained_us, sustained_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run_id)
        .bind(&c.shape)
        .bind(c.seq)
        .bind(c.ours_before_us)
        .bind(c.ours_after_us)
        .bind(c.sdpa_default_us)
        .bind(&c.sdpa_picked)
        .bind(c.sdpa_backends.to_string())
        .bind(&c.measured_at)
        .bind(c.ours_sustained_before_us)
        .bind(c.ours_sustained_after_us)
        .bind(c.sdpa_default_sustained_us)
        .bind(c.sustained_ms)
        .execute(&self.pool)
        .await
        .map_err(self.q("record the closing comparison"))?;
        Ok(())
    }

    /// The closing comparison of a run, in workload order (empty until it finished).
    pub async fn closing(&self, run_id: &str) -> Result<Vec<ClosingRow>> {
        let rows: Vec<RawClosing> = sqlx::query_as("SELECT * FROM closing WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list the closing comparison"))?;
        Ok(rows
            .into_iter()
            .map(|r| ClosingRow {
                shape: r.shape,
                seq: r.seq,
                ours_before_us: r.ours_before_us,
                ours_after_us: r.ours_after_us,
                sdpa_default_us: r.sdpa_default_us,
                sdpa_picked: r.sdpa_picked,
                sdpa_backends: serde_json::from_str(&r.sdpa_json).unwrap_or_default(),
                measured_at: r.measured_at,
                ours_sustained_before_us: r.ours_sustained_before_us,
                ours_sustained_after_us: r.ours_sustained_after_us,
                sdpa_default_sustained_us: r.sdpa_default_sustained_us,
                sustained_ms: r.sustained_ms,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::DType;
    use serde_json::json;

    use crate::test_fixtures::{closing_row as row, llama_decode as decode};


    #[test]
    fn a_prefill_line_without_fa4_reads_as_before() {
        let r = row("b2h8s512d128-causal", 25.0, 50.0, json!({"default": {"graph_us": 50.0}}));
        let s = Shape::mha(2, 8, 512, 128, true, DType::Fp16);
        assert_eq!(r.summary(Some(&s)), "b2h8s512d128-causal 25.00 us vs SDPA default 50.00 us = 2.00x");
        assert_eq!((r.fa4_us(), r.vs_fa4(), r.fa4_measured()), (None, None, false));
    }

    #[test]
    fn a_decode_line_gives_each_time_its_kv_bandwidth_and_fa4_beside_sdpa() {
        // 8 * 8 * 4096 * 128 * 2 (K, V) * 2 bytes = 134,217,728 bytes: at 50 us 2.68 TB/s.
        assert_eq!(decode().kv_bytes(), 134_217_728);
        let r = row(&decode().key(), 44.0, 51.93, json!({"default": {"graph_us": 51.93}, "fa4": {"graph_us": 50.18, "ran": "fa4"}}));
        assert_eq!(
            r.summary(Some(&decode())),
            "b8hq32hkv8sq1sk4096d128-causal-bf16 44.00 us (3.05 TB/s KV) vs SDPA default 51.93 us (2.58 TB/s KV) = 1.18x, FA4 50.18 us (2.67 TB/s KV) = 1.14x"
        );
        assert_eq!(r.vs_fa4().map(|x| (x * 1000.0).round()), Some(1140.0));
        assert!((kv_tbps(&decode(), 50.0) - 2.684).abs() < 1e-3);
    }

    #[test]
    fn sustained_figures_follow_the_burst_ones_with_their_ratios() {
        let mut r = row("b2h8s512d128-causal", 25.0, 50.0, json!({"default": {"graph_us": 50.0, "sustained_us": 57.0}, "fa4": {"graph_us": 40.0, "sustained_us": 48.0}}));
        assert_eq!((r.ours_sustained_us(), r.sustained_vs_default(), r.sustained_vs_fa4()), (None, None, None), "not measured: no figures");
        assert!(!r.summary(None).contains("sustained"));
        r.ours_sustained_before_us = Some(29.0);
        r.ours_sustained_after_us = Some(31.0);
        r.sdpa_default_sustained_us = Some(57.0);
        r.sustained_ms = Some(200.0);
        assert_eq!(r.ours_sustained_us(), Some(30.0));
        assert_eq!(r.sustained_vs_default(), Some(1.9));
        assert_eq!(r.sustained_vs_fa4(), Some(1.6));
        assert_eq!(
            r.summary(None),
            "b2h8s512d128-causal 25.00 us vs SDPA default 50.00 us = 2.00x, FA4 40.00 us = 1.60x; sustained over 200 ms: 30.00 us vs SDPA default 57.00 us = 1.90x, FA4 48.00 us = 1.60x"
        );
        // Only one of ours (a failed second timing): that one.
        r.ours_sustained_after_us = None;
        assert_eq!(r.ours_sustained_us(), Some(29.0));
    }

    #[test]
    fn fa4_that_could_not_run_a_shape_is_said_so() {
        let r = row("b1h2s128d96", 5.0, 6.0, json!({"default": {"graph_us": 6.0}, "fa4": {"error": "NotImplementedError: head dim 96"}}));
        assert!(r.fa4_measured());
        assert_eq!(r.fa4_us(), None);
        assert_eq!(r.summary(None), "b1h2s128d96 5.00 us vs SDPA default 6.00 us = 1.20x, FA4 could not run it");
    }
}
