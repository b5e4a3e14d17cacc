//! Memory across runs: what earlier runs in this ledger measured on the same kind of GPU.
//!
//! A result is remembered for a (rendered source, shape) pair. The rendered source's sha256
//! covers the template's content, its knob values and the dtype, so a template whose source
//! changed has a new hash and is measured again. "The same kind of GPU" is the GPU model,
//! compute capability, SM count, driver and NVRTC version. Only correct, timed results count.
//! Memory never decides on its own: the engine re-checks and re-times the remembered best of
//! each shape before it uses the memory to skip points (`engine::warm_start`).
//!
//! Transfer: a shape nothing is remembered for borrows the best kernels of the most similar
//! remembered shapes ([`Memory::similar`], [`distance`]): the same head dim, causality, GQA
//! ratio and regime (decode or prefill), nearest in log(SQ), log(SK) and log(B*HQ), the same
//! dtype before the other 16-bit one. Only the template and its knobs transfer; the kernel is
//! rendered, checked and timed again on this run's shapes (stage `transfer`).

use std::collections::{BTreeMap, HashMap};

use crate::spec::protocol::{DeviceInfo, Shape};
use crate::storage::ledger::{Ledger, LedgerError};

/// One remembered measurement.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Remembered {
    pub run_id: String,
    pub seq: i64,
    pub template: String,
    pub params_json: String,
    pub source_hash: String,
    pub median_us: f64,
}

/// What earlier runs measured on this kind of GPU.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// (source hash, shape key) -> the fastest measurement of that source on that shape.
    measured: HashMap<(String, String), Remembered>,
    /// Shape key -> the fastest remembered kernel for it.
    best: BTreeMap<String, Remembered>,
    /// Shape key -> the remembered shape's dimensions (from its stored JSON), for transfer.
    shapes: BTreeMap<String, Shape>,
    /// Runs the memory comes from, oldest first.
    pub runs: Vec<String>,
}

/// Same kind of GPU: model, compute capability, SMs, driver and NVRTC.
/// One remembered measurement and the device it was taken on.
#[derive(sqlx::FromRow)]
struct MemoryRow {
    #[sqlx(flatten)]
    rem: Remembered,
    shape: String,
    shape_json: String,
    device_json: String,
}

/// A remembered best kernel offered to a shape nothing is remembered for.
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    /// The remembered shape it was the best kernel of.
    pub from: String,
    pub rem: Remembered,
    /// [`distance`] from the target shape to `from`.
    pub distance: f64,
}

/// How much farther a remembered shape of the other 16-bit dtype is (fp16 <-> bf16): about
/// a 7x difference in one dimension, so the same dtype is preferred unless it is much farther.
pub const DTYPE_PENALTY: f64 = 2.0;

/// How similar remembered shape `b` is to target shape `a`: None when a kernel tuned for `b`
/// says nothing about `a` (another head dim, causality, GQA ratio, regime, or a dtype that is
/// not the same or the other 16-bit one); else the Euclidean distance on log(SQ), log(SK)
/// and log(B*HQ) (the work per launch), plus [`DTYPE_PENALTY`] for the other dtype. The
/// layout does not count: the same problem in another layout is at distance 0.
pub fn distance(a: &Shape, b: &Shape) -> Option<f64> {
    let gqa_equal = a.hq as u64 * b.hkv as u64 == b.hq as u64 * a.hkv as u64;
    if a.d != b.d || a.causal != b.causal || !gqa_equal || a.is_decode() != b.is_decode() {
        return None;
    }
    // Both dtypes are 16-bit today; a wider one would not transfer.
    let penalty = if a.dtype == b.dtype { 0.0 } else { DTYPE_PENALTY };
    let ln = |x: u64| (x.max(1) as f64).ln();
    let dq = ln(a.sq as u64) - ln(b.sq as u64);
    let dk = ln(a.sk as u64) - ln(b.sk as u64);
    let dw = ln(a.b as u64 * a.hq as u64) - ln(b.b as u64 * b.hq as u64);
    Some((dq * dq + dk * dk + dw * dw).sqrt() + penalty)
}

pub fn same_kind(a: &DeviceInfo, b: &DeviceInfo) -> bool {
    a.name == b.name && a.cc() == b.cc() && a.sm_count == b.sm_count && a.driver_version == b.driver_version && a.nvrtc_version == b.nvrtc_version
}

impl Memory {
    /// Everything runs other than `run_id`, started before `before` (RFC 3339), measured on
    /// a GPU of the same kind as `device`. The cut-off keeps a resumed run's memory the same
    /// as when it started, so its replay is deterministic.
    pub async fn load(ledger: &Ledger, device: &DeviceInfo, run_id: &str, before: &str) -> Result<Memory, LedgerError> {
        let rows: Vec<MemoryRow> = sqlx::query_as(
            // This ledger's runs, then what other machines of a fleet measured (imported by
            // the group's coordinator into `fleet_memory`; a run this ledger holds is read
            // from its own rows).
            "SELECT run_id, seq, template, params_json, source_hash, shape, shape_json, median_us, device_json FROM (
               SELECT i.run_id, i.seq, i.template, i.params_json, i.source_hash, s.shape, s.shape_json, s.median_us, r.device_json, r.started_at AS at
               FROM iteration_shapes s
               JOIN iterations i ON i.run_id = s.run_id AND i.seq = s.seq
               JOIN runs r ON r.id = i.run_id
               WHERE i.run_id != ? AND r.started_at < ? AND r.device_json IS NOT NULL
                 AND i.source_hash IS NOT NULL AND s.check_passed = 1 AND s.median_us IS NOT NULL
               UNION ALL
               SELECT f.run_id, f.seq, f.template, f.params_json, f.source_hash, f.shape, f.shape_json, f.median_us, f.device_json, f.started_at AS at
               FROM fleet_memory f
               WHERE f.run_id != ? AND f.started_at < ? AND f.run_id NOT IN (SELECT id FROM runs)
             ) ORDER BY at, run_id, seq",
        )
        .bind(run_id)
        .bind(before)
        .bind(run_id)
        .bind(before)
        .fetch_all(ledger.pool())
        .await
        .map_err(|source| LedgerError::Query { what: "read the memory of earlier runs", source })?;
        let mut m = Memory::default();
        let mut kinds: HashMap<String, bool> = HashMap::new();
        for MemoryRow { rem, shape, shape_json, device_json } in rows {
            let same = *kinds
                .entry(device_json.clone())
                .or_insert_with(|| serde_json::from_str::<DeviceInfo>(&device_json).map(|d| same_kind(&d, device)).unwrap_or(false));
            if !same {
                continue;
            }
            // A shape whose JSON does not parse is still remembered by its key, only not
            // offered to similar shapes.
            m.remember(rem, shape, serde_json::from_str::<Shape>(&shape_json).ok());
        }
        Ok(m)
    }

    /// What run `run_id` measured, as a fleet shares it: the rows [`Memory::load`] reads.
    pub async fn rows_of_run(ledger: &Ledger, run_id: &str, machine: &str) -> Result<Vec<crate::storage::fleet::MemoryRow>, LedgerError> {
        sqlx::query_as(
            "SELECT i.run_id, i.seq, s.shape, i.template, i.params_json, i.source_hash, s.shape_json, s.median_us, r.device_json, r.started_at, ? AS machine
             FROM iteration_shapes s
             JOIN iterations i ON i.run_id = s.run_id AND i.seq = s.seq
             JOIN runs r ON r.id = i.run_id
             WHERE i.run_id = ? AND r.device_json IS NOT NULL
               AND i.source_hash IS NOT NULL AND s.check_passed = 1 AND s.median_us IS NOT NULL
             ORDER BY i.seq",
        )
        .bind(machine)
        .bind(run_id)
        .fetch_all(ledger.pool())
        .await
        .map_err(|source| LedgerError::Query { what: "read a run's measurements for the fleet", source })
    }

    /// Keep what other machines of a fleet measured, for [`Memory::load`]. Returns how many rows were new.
    pub async fn import(ledger: &Ledger, rows: &[crate::storage::fleet::MemoryRow]) -> Result<u64, LedgerError> {
        let mut n = 0;
        for m in rows {
            let sql = format!("INSERT OR IGNORE INTO fleet_memory ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", crate::storage::fleet::MEMORY_COLUMNS);
            n += crate::storage::fleet::bind_memory!(sqlx::query(&sql), m)
            .execute(ledger.pool())
            .await
            .map_err(|source| LedgerError::Query { what: "keep the fleet's memory", source })?
            .rows_affected();
        }
        Ok(n)
    }

    /// Add one measurement (in the order the runs made them).
    fn remember(&mut self, rem: Remembered, shape: String, dims: Option<Shape>) {
        if !self.runs.contains(&rem.run_id) {
            self.runs.push(rem.run_id.clone());
        }
        if let Some(d) = dims {
            self.shapes.entry(shape.clone()).or_insert(d);
        }
        let key = (rem.source_hash.clone(), shape.clone());
        if self.measured.get(&key).is_none_or(|old| rem.median_us < old.median_us) {
            self.measured.insert(key, rem.clone());
        }
        if self.best.get(&shape).is_none_or(|old| rem.median_us < old.median_us) {
            self.best.insert(shape, rem);
        }
    }

    /// For a shape nothing is remembered for: the best kernels of the nearest similar
    /// remembered shapes ([`distance`]), nearest first, at most `n` distinct configurations
    /// (template and knobs); ties go to the smaller shape key, so the answer is deterministic.
    /// Empty when the shape itself is remembered, or nothing similar is.
    pub fn similar(&self, target: &Shape, n: usize) -> Vec<Transfer> {
        if self.best.contains_key(&target.key()) {
            return Vec::new();
        }
        let mut near: Vec<(f64, &String)> = self.shapes.iter().filter_map(|(k, s)| distance(target, s).map(|d| (d, k))).collect();
        near.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        let mut out: Vec<Transfer> = Vec::new();
        for (d, k) in near {
            if out.len() >= n {
                break;
            }
            let Some(rem) = self.best.get(k) else { continue };
            if out.iter().any(|t| t.rem.template == rem.template && t.rem.params_json == rem.params_json) {
                continue;
            }
            out.push(Transfer { from: k.clone(), rem: rem.clone(), distance: d });
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.best.is_empty()
    }

    /// The remembered measurement of this rendered source on this shape.
    pub fn measured(&self, source_hash: &str, shape: &str) -> Option<&Remembered> {
        self.measured.get(&(source_hash.to_string(), shape.to_string()))
    }

    /// The fastest remembered kernel per shape.
    pub fn best(&self) -> &BTreeMap<String, Remembered> {
        &self.best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{DType, Layout};

    fn shape(b: u32, hq: u32, hkv: u32, sq: u32, sk: u32, d: u32, causal: bool, dtype: DType) -> Shape {
        Shape { b, hq, hkv, sq, sk, d, causal, window: None, dtype, layout: Layout::default() }
    }

    fn rem(run: &str, seq: i64, params: &str, us: f64) -> Remembered {
        Remembered {
            run_id: run.into(),
            seq,
            template: "kv_split.cu".into(),
            params_json: params.into(),
            source_hash: format!("h{seq}"),
            median_us: us,
        }
    }

    #[test]
    fn distance_requires_head_dim_causality_gqa_ratio_and_regime() {
        let a = shape(1, 16, 16, 1024, 1024, 128, true, DType::Fp16);
        assert_eq!(distance(&a, &a), Some(0.0));
        assert_eq!(distance(&a, &shape(1, 16, 16, 1024, 1024, 64, true, DType::Fp16)), None, "head dim");
        assert_eq!(distance(&a, &shape(1, 16, 16, 1024, 1024, 128, false, DType::Fp16)), None, "causality");
        assert_eq!(distance(&a, &shape(1, 16, 4, 1024, 1024, 128, true, DType::Fp16)), None, "GQA ratio");
        assert_eq!(distance(&a, &shape(1, 16, 16, 1, 1024, 128, true, DType::Fp16)), None, "regime");
        // The same GQA ratio with other head counts, and the other layout, are similar.
        let g = shape(2, 32, 8, 512, 512, 128, false, DType::Bf16);
        assert!(distance(&g, &shape(2, 64, 16, 512, 512, 128, false, DType::Bf16)).is_some());
        let bshd = Shape { layout: Layout::Bshd, ..a };
        assert_eq!(distance(&a, &bshd), Some(0.0));
    }

    #[test]
    fn distance_grows_with_log_size_and_the_other_dtype() {
        let a = shape(1, 16, 16, 1024, 1024, 128, false, DType::Bf16);
        let twice_s = distance(&a, &shape(1, 16, 16, 2048, 2048, 128, false, DType::Bf16)).unwrap();
        let half_s = distance(&a, &shape(1, 16, 16, 512, 512, 128, false, DType::Bf16)).unwrap();
        assert!((twice_s - half_s).abs() < 1e-12 && (twice_s - 2f64.ln() * 2f64.sqrt()).abs() < 1e-12, "{twice_s} {half_s}");
        let twice_work = distance(&a, &shape(2, 16, 16, 1024, 1024, 128, false, DType::Bf16)).unwrap();
        assert!((twice_work - 2f64.ln()).abs() < 1e-12);
        // Same dims in fp16: allowed, farther than a 2x difference in the same dtype.
        let fp16 = distance(&a, &shape(1, 16, 16, 1024, 1024, 128, false, DType::Fp16)).unwrap();
        assert_eq!(fp16, DTYPE_PENALTY);
        assert!(fp16 > twice_s);
    }

    #[test]
    fn similar_offers_the_nearest_remembered_bests_as_distinct_configurations() {
        let mut m = Memory::default();
        let small = shape(1, 16, 16, 512, 512, 64, false, DType::Fp16);
        let big = shape(4, 16, 16, 8192, 8192, 64, false, DType::Fp16);
        let mid = shape(1, 16, 16, 2048, 2048, 64, false, DType::Fp16);
        let causal = shape(1, 16, 16, 1024, 1024, 64, true, DType::Fp16);
        m.remember(rem("one", 1, r#"{"MAX_SPLITS":1}"#, 30.0), small.key(), Some(small));
        m.remember(rem("one", 2, r#"{"MAX_SPLITS":8}"#, 300.0), big.key(), Some(big));
        m.remember(rem("one", 3, r#"{"MAX_SPLITS":1}"#, 90.0), mid.key(), Some(mid));
        m.remember(rem("one", 4, r#"{"MAX_SPLITS":4}"#, 40.0), causal.key(), Some(causal));
        // A slower measurement of `small` does not replace its best.
        m.remember(rem("one", 5, r#"{"MAX_SPLITS":2}"#, 35.0), small.key(), Some(small));

        let target = shape(1, 16, 16, 1024, 1024, 64, false, DType::Bf16);
        let got = m.similar(&target, 1);
        assert_eq!(got.len(), 1);
        // small and mid are equally near (a factor 2 either way): the smaller key wins the tie.
        assert_eq!(got[0].from, mid.key().min(small.key()));
        assert_eq!(got[0].rem.params_json, r#"{"MAX_SPLITS":1}"#);
        // Two distinct configurations: the second nearest shape has the same one, so `big` comes next;
        // the causal shape never does.
        let two = m.similar(&target, 2);
        assert_eq!(two.iter().map(|t| t.from.clone()).collect::<Vec<_>>(), [got[0].from.clone(), big.key()]);
        assert_eq!(two[1].rem.params_json, r#"{"MAX_SPLITS":8}"#);
        assert!(two[0].distance < two[1].distance);

        // A remembered shape gets no transfer, nor one that nothing similar is remembered for.
        assert!(m.similar(&small, 2).is_empty());
        assert!(m.similar(&shape(1, 16, 16, 1, 1024, 64, false, DType::Fp16), 2).is_empty());
        // A remembered key without dimensions (unparsable JSON) is never offered.
        let mut n = Memory::default();
        n.remember(rem("one", 1, "{}", 1.0), small.key(), None);
        assert!(n.similar(&target, 2).is_empty());
    }
}
