//! Memory across runs: what earlier runs in this ledger measured on the same kind of GPU.
//!
//! A result is remembered for a (rendered source, shape) pair. The rendered source's sha256
//! covers the template's content, its knob values and the dtype, so a template whose source
//! changed has a new hash and is measured again. "The same kind of GPU" is the GPU model,
//! compute capability, SM count, driver and NVRTC version. Only correct, timed results count.
//! Memory never decides on its own: the engine re-checks and re-times the remembered best of
//! each shape before it uses the memory to skip points (`engine::warm_start`).

use std::collections::{BTreeMap, HashMap};


use crate::spec::protocol::DeviceInfo;
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
    device_json: String,
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
            "SELECT i.run_id, i.seq, i.template, i.params_json, i.source_hash, s.shape, s.median_us, r.device_json
             FROM iteration_shapes s
             JOIN iterations i ON i.run_id = s.run_id AND i.seq = s.seq
             JOIN runs r ON r.id = i.run_id
             WHERE i.run_id != ? AND r.started_at < ? AND r.device_json IS NOT NULL
               AND i.source_hash IS NOT NULL AND s.check_passed = 1 AND s.median_us IS NOT NULL
             ORDER BY r.started_at, i.seq",
        )
        .bind(run_id)
        .bind(before)
        .fetch_all(ledger.pool())
        .await
        .map_err(|source| LedgerError::Query { what: "read the memory of earlier runs", source })?;
        let mut m = Memory::default();
        let mut kinds: HashMap<String, bool> = HashMap::new();
        for MemoryRow { rem, shape, device_json } in rows {
            let same = *kinds
                .entry(device_json.clone())
                .or_insert_with(|| serde_json::from_str::<DeviceInfo>(&device_json).map(|d| same_kind(&d, device)).unwrap_or(false));
            if !same {
                continue;
            }
            if !m.runs.contains(&rem.run_id) {
                m.runs.push(rem.run_id.clone());
            }
            let key = (rem.source_hash.clone(), shape.clone());
            if m.measured.get(&key).is_none_or(|old| rem.median_us < old.median_us) {
                m.measured.insert(key, rem.clone());
            }
            if m.best.get(&shape).is_none_or(|old| rem.median_us < old.median_us) {
                m.best.insert(shape, rem);
            }
        }
        Ok(m)
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
