//! The GPU's peak dense fp16/bf16 tensor-core throughput, for the reference line of the
//! throughput figure: the ledger records the GPU's name, not its clocks, so the peak comes
//! from the vendor's datasheet figure for that product.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Peak {
    pub tflops: f64,
    /// Which product the figure is for, and where it is from.
    pub source: String,
}

/// (substring of the device name, dense FP16/BF16 tensor TFLOPS with FP32 accumulate,
/// product). More specific names first: "H100 PCIe" before "H100".
const KNOWN: &[(&str, f64, &str)] = &[
    ("H100 PCIe", 756.0, "H100 PCIe"),
    ("H100 NVL", 835.0, "H100 NVL"),
    ("GH200", 989.0, "GH200"),
    ("H200", 989.0, "H200 SXM"),
    ("H100", 989.0, "H100 SXM5"),
    ("H800", 989.0, "H800 SXM5"),
    ("A100", 312.0, "A100"),
    ("L40S", 362.0, "L40S"),
    ("L4", 121.0, "L4"),
];

/// The peak for a device name as the driver reports it (e.g. `NVIDIA H100 80GB HBM3`).
pub fn lookup(name: &str) -> Option<Peak> {
    KNOWN
        .iter()
        .find(|(pat, _, _)| name.contains(pat))
        .map(|(_, tflops, product)| Peak { tflops: *tflops, source: format!("NVIDIA datasheet, {product}, dense") })
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
    }
}
