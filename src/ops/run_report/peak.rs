//! The GPU's peak dense fp16/bf16 tensor-core throughput and memory bandwidth, for the
//! reference lines of the throughput figure: the ledger records the GPU's name, not its
//! clocks, so the peaks come from the vendor's datasheet figures for that product.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Peak {
    pub tflops: f64,
    /// Datasheet memory bandwidth, TB/s (decode's bound); None where the name does not say
    /// which memory the product has (A100 40/80 GB, GH200 HBM3/HBM3e).
    pub hbm_tbps: Option<f64>,
    /// Which product the figure is for, and where it is from.
    pub source: String,
}

/// (substring of the device name, dense FP16/BF16 tensor TFLOPS with FP32 accumulate,
/// memory TB/s, product). More specific names first: "H100 PCIe" before "H100".
const KNOWN: &[(&str, f64, Option<f64>, &str)] = &[
    ("H100 PCIe", 756.0, Some(2.0), "H100 PCIe"),
    ("H100 NVL", 835.0, Some(3.9), "H100 NVL"),
    ("GH200", 989.0, None, "GH200"),
    ("H200", 989.0, Some(4.8), "H200 SXM"),
    ("H100", 989.0, Some(3.35), "H100 SXM5"),
    ("H800", 989.0, Some(3.35), "H800 SXM5"),
    ("A100", 312.0, None, "A100"),
    ("L40S", 362.0, Some(0.864), "L40S"),
    ("L4", 121.0, Some(0.3), "L4"),
];

/// The peak for a device name as the driver reports it (e.g. `NVIDIA H100 80GB HBM3`).
pub fn lookup(name: &str) -> Option<Peak> {
    KNOWN
        .iter()
        .find(|(pat, _, _, _)| name.contains(pat))
        .map(|(_, tflops, hbm_tbps, product)| Peak { tflops: *tflops, hbm_tbps: *hbm_tbps, source: format!("NVIDIA datasheet, {product}, dense") })
}

#[cfg(test)]
mod tests {
    use super::lookup;

    #[test]
    fn the_most_specific_product_wins() {
        assert_eq!(lookup("NVIDIA H100 80GB HBM3").map(|p| p.tflops), Some(989.0));
        assert_eq!(lookup("NVIDIA H100 PCIe").map(|p| p.tflops), Some(756.0));
        assert_eq!(lookup("NVIDIA L40S").map(|p| p.tflops), Some(362.0));
        assert_eq!(lookup("NVIDIA L4").map(|p| p.tflops), Some(121.0));
        assert!(lookup("NVIDIA GeForce RTX 3060").is_none());
        assert_eq!(lookup("NVIDIA H100 80GB HBM3").and_then(|p| p.hbm_tbps), Some(3.35));
        assert_eq!(lookup("NVIDIA A100-SXM4-40GB").and_then(|p| p.hbm_tbps), None, "A100s differ in memory: no line");
    }
}
