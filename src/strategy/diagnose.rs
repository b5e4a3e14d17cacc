//! Diagnose: read the incumbents' figures the way an expert would before choosing
//! the next technique, so the plan runs a stage only when its symptom is present.
//!
//! - `under_filled`: the first launch puts fewer CTAs on the GPU than 90% of its SMs
//!   (fill the GPU first: split the KV sequence; [`UNDER_FILLED_SHARE`] says why not all);
//! - `spills`: local memory per thread (registers spilled: smaller tiles);
//! - `low_occupancy`: fewer than 8 warps resident per SM;
//! - `compute_gap`: a shape with real work (>= 1 GFLOP) runs at under half the
//!   attention throughput SDPA demonstrated on this GPU in this run (tensor cores).
//!
//! The figures behind every decision are recorded in the ledger. Without an SDPA
//! measurement `compute_gap` cannot be judged and is not reported.

use serde::{Deserialize, Serialize};

/// The share of the SMs a first launch must fill not to be `under_filled`. With 128 of 132
/// SMs busy a split can buy at most 3%, less than its partials and combine cost: the LLM
/// workload's chunked prefill (Hopper tiles, 128 CTAs on an H200) ran six kv-split candidates
/// 11 s into a 6-minute run and none won (2026-11-30, run 20261130-094941-92cd).
pub const UNDER_FILLED_SHARE: f64 = 0.9;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Symptom {
    UnderFilled,
    Spills,
    LowOccupancy,
    ComputeGap,
}

/// What is known about the incumbent of one shape.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub shape: String,
    pub ctas: u64,
    pub sm_count: u32,
    pub flops: f64,
    pub median_us: f64,
    pub local_bytes: Option<u32>,
    /// Resident warps per SM for the first launch (occupancy API), when known.
    pub warps_per_sm: Option<u32>,
    /// The best attention throughput SDPA showed on this GPU in this run, TFLOPS.
    pub demonstrated_tflops: Option<f64>,
}

impl Figures {
    pub fn tflops(&self) -> f64 {
        self.flops / (self.median_us * 1e-6) / 1e12
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    pub shape: String,
    pub symptom: Symptom,
    pub detail: String,
}

pub fn diagnose(f: &Figures) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut push = |symptom, detail: String| out.push(Finding { shape: f.shape.clone(), symptom, detail });
    if (f.ctas as f64) < UNDER_FILLED_SHARE * f64::from(f.sm_count) {
        push(Symptom::UnderFilled, format!("{} CTAs for {} SMs", f.ctas, f.sm_count));
    }
    if let Some(b) = f.local_bytes.filter(|b| *b > 0) {
        push(Symptom::Spills, format!("{b} B of local memory per thread"));
    }
    if let Some(w) = f.warps_per_sm.filter(|w| *w < 8) {
        push(Symptom::LowOccupancy, format!("{w} warps resident per SM"));
    }
    if let Some(d) = f.demonstrated_tflops {
        let t = f.tflops();
        if f.flops >= 1e9 && t < 0.5 * d {
            push(Symptom::ComputeGap, format!("{t:.1} TFLOPS; SDPA showed {d:.1} TFLOPS on this GPU"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> Figures {
        Figures {
            shape: "s".into(),
            ctas: 264,
            sm_count: 132,
            flops: 1.4e11,
            median_us: 500.0,
            local_bytes: Some(0),
            warps_per_sm: Some(16),
            demonstrated_tflops: Some(500.0),
        }
    }

    #[test]
    fn a_healthy_kernel_has_no_symptom() {
        let mut f = figures();
        f.median_us = 400.0; // 350 TFLOPS
        assert!(diagnose(&f).is_empty(), "{:?}", diagnose(&f));
    }

    #[test]
    fn each_symptom_names_its_figures() {
        let mut f = figures();
        f.ctas = 8;
        f.local_bytes = Some(96);
        f.warps_per_sm = Some(4);
        f.median_us = 5000.0; // 28 TFLOPS
        let d = diagnose(&f);
        let kinds: Vec<Symptom> = d.iter().map(|x| x.symptom).collect();
        assert_eq!(kinds, vec![Symptom::UnderFilled, Symptom::Spills, Symptom::LowOccupancy, Symptom::ComputeGap]);
        assert!(d[0].detail.contains("8 CTAs for 132 SMs"));
        assert!(d[3].detail.contains("28.0 TFLOPS") && d[3].detail.contains("500.0"));
    }

    #[test]
    fn a_grid_short_of_a_wave_by_a_few_ctas_is_not_under_filled() {
        let under = |ctas| {
            let mut f = figures();
            f.ctas = ctas;
            diagnose(&f).iter().any(|x| x.symptom == Symptom::UnderFilled)
        };
        // 132 SMs: 128 CTAs (97%) and 119 (90.2%) leave too little to split for; 118 (89.4%) do not.
        assert!(!under(128) && !under(119) && !under(132));
        assert!(under(118) && under(64) && under(1));
    }

    #[test]
    fn tiny_problems_and_unknown_anchors_raise_no_compute_gap() {
        let mut f = figures();
        f.flops = 1e6;
        f.median_us = 5.0;
        assert!(!diagnose(&f).iter().any(|x| x.symptom == Symptom::ComputeGap));
        let mut f = figures();
        f.median_us = 50_000.0;
        f.demonstrated_tflops = None;
        assert!(!diagnose(&f).iter().any(|x| x.symptom == Symptom::ComputeGap));
    }
}
