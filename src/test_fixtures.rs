//! Values the unit tests of several modules share (compiled for tests only): the H100's
//! description, a Llama-3-8B decode shape, and a closing-comparison row.

use crate::spec::protocol::{DType, DeviceInfo, Layout, Shape};
use crate::storage::ledger::ClosingRow;

/// An H100 SXM as the worker describes it.
pub fn h100() -> DeviceInfo {
    DeviceInfo {
        name: "H100 (test)".into(),
        cc_major: 9,
        cc_minor: 0,
        sm_count: 132,
        smem_optin: 232448,
        smem_per_sm: 233472,
        l2_bytes: 50 << 20,
        max_threads_per_sm: 2048,
        driver_version: 13000,
        nvrtc_version: (13, 0),
        arch: "sm_90".into(),
    }
}

/// Llama-3-8B decode: B 8, 32 query heads over 8 KV heads, one row against 4096 keys, bf16.
pub fn llama_decode() -> Shape {
    Shape { b: 8, hq: 32, hkv: 8, sq: 1, sk: 4096, d: 128, causal: true, window: None, dtype: DType::Bf16, layout: Layout::Bhsd }
}

/// A closing-comparison row of iteration 9: ours `ours` us before and after, SDPA default
/// `sdpa` us (cuDNN), the baselines' per-backend JSON `backends`.
pub fn closing_row(shape: &str, ours: f64, sdpa: f64, backends: serde_json::Value) -> ClosingRow {
    ClosingRow {
        shape: shape.into(),
        seq: 9,
        ours_before_us: ours,
        ours_after_us: ours,
        sdpa_default_us: Some(sdpa),
        sdpa_picked: Some("cudnn".into()),
        sdpa_backends: backends,
        measured_at: "2026-11-24T10:00:00.000Z".into(),
        ours_sustained_before_us: None,
        ours_sustained_after_us: None,
        sdpa_default_sustained_us: None,
        sustained_ms: None,
    }
}
