//! Export: each per-shape best kernel of a run as a standalone `.cu` plus a
//! `manifest.json` that says everything a CUDA host needs to launch it (CuPy
//! RawModule, a torch extension, the driver API): kernel names, argument order and
//! types, launch geometry as formulas of (B, H, S, D), dynamic shared memory, the
//! softmax-scale convention, dtype, causal, and the measured time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::ledger::Ledger;
use crate::template::Template;
use crate::workspace::Workspace;

#[derive(Debug, Serialize)]
pub struct Manifest {
    pub format: u32,
    pub run: String,
    pub gpu: Option<String>,
    pub abi: Abi,
    pub kernels: Vec<KernelEntry>,
}

#[derive(Debug, Serialize)]
pub struct Abi {
    /// In order; `T` is `__half` (fp16) or `__nv_bfloat16` (bf16), see each kernel's dtype.
    pub args: Vec<(&'static str, &'static str, &'static str)>,
    pub layout: &'static str,
    pub softmax_scale: &'static str,
    pub causal: &'static str,
    pub compile: &'static str,
}

#[derive(Debug, Serialize)]
pub struct KernelEntry {
    pub file: String,
    pub iteration: i64,
    pub template: String,
    pub params: serde_json::Value,
    pub dtype: String,
    /// Formulas over B, H, S, D, CAUSAL, SMS (SM count), SMEM_OPTIN, CC and the knobs
    /// (fixed as #defines in the file); minijinja/Jinja2 expressions with cdiv, min, max.
    pub derived: Vec<(String, String)>,
    pub launches: Vec<LaunchFormula>,
    /// The shapes this kernel is the best for, with their resolved launches and times.
    pub shapes: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct LaunchFormula {
    /// `optd_<role>_d{D}`.
    pub kernel: String,
    pub grid: [String; 3],
    pub block: [String; 3],
    pub dyn_smem: String,
    pub when: Option<String>,
}

fn abi() -> Abi {
    Abi {
        args: vec![
            ("q", "const T*", "[B,H,S,D] contiguous"),
            ("k", "const T*", "[B,H,S,D] contiguous"),
            ("v", "const T*", "[B,H,S,D] contiguous"),
            ("o", "T*", "[B,H,S,D] contiguous, written"),
            ("o_partial", "float*", "n_splits*B*H*S*D floats of scratch (>= 1 element)"),
            ("lse_partial", "float*", "n_splits*B*H*S floats of scratch (>= 1 element)"),
            ("batch", "int", "B"),
            ("heads", "int", "H"),
            ("seq_len", "int", "S (any S >= 1)"),
            ("n_splits", "int", "the `splits` derived value"),
            ("softmax_scale", "float", "1/sqrt(D)"),
            ("causal", "int", "0 or 1"),
            ("cta_counter", "unsigned int*", "any valid device pointer (counts CTAs only when built with -DOPTD_COUNT_CTAS=1)"),
        ],
        layout: "Q, K, V, O in [B, H, S, D], contiguous, 16-byte aligned",
        softmax_scale: "softmax(Q K^T * softmax_scale) V with softmax_scale = 1/sqrt(D), passed by the caller",
        causal: "when causal != 0, key j is masked for query i if j > i",
        compile: "NVRTC or nvcc with -std=c++17 and the CUDA include path, for the GPU's real arch (e.g. sm_90); launches run in order on one stream",
    }
}

/// Write the run's best kernels into `out`; returns the manifest path.
pub async fn export(ledger: &Ledger, run_id: &str, out: &Path) -> anyhow::Result<PathBuf> {
    let run = ledger.run(Some(run_id)).await?;
    let best = ledger.best(&run.id).await?;
    anyhow::ensure!(!best.is_empty(), "run {} has no correct kernel yet: nothing to export", run.id);
    let ws = Workspace::open(&Path::new(&run.run_dir).join("workspace"))?;
    let dispatch: BTreeMap<String, serde_json::Value> = serde_json::from_str(
        &ws.read_best("kernels/dispatch.json")?.context("the workspace's best has no kernels/dispatch.json")?,
    )?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let iterations = ledger.iterations(&run.id).await?;
    let mut kernels: Vec<KernelEntry> = Vec::new();
    for b in &best {
        let source = ws.read_best(&b.source_path)?.with_context(|| format!("{} is not on best", b.source_path))?;
        let entry = dispatch.get(&b.shape).with_context(|| format!("kernels/dispatch.json has no {}", b.shape))?;
        let shape_json: serde_json::Value = iterations
            .iter()
            .find(|i| i.seq == b.seq)
            .and_then(|i| i.shapes.iter().find(|s| s.shape == b.shape))
            .and_then(|s| serde_json::from_str(&s.shape_json).ok())
            .unwrap_or_default();
        let measured = serde_json::json!({
            "key": b.shape, "shape": shape_json, "median_us": b.median_us, "baseline_us": b.baseline_us,
            "n_splits": entry["n_splits"], "launches": entry["launches"],
        });
        if let Some(k) = kernels.iter_mut().find(|k| k.iteration == b.seq) {
            k.shapes.push(measured);
            continue;
        }
        let template = Template::parse(&b.source_path, source.clone())?;
        let file = format!("it{}-{}.cu", b.seq, template.name());
        std::fs::write(out.join(&file), &source).with_context(|| format!("cannot write {}", out.join(&file).display()))?;
        let dtype = if source.contains("#define OPTD_BF16 1") { "bf16" } else { "fp16" };
        kernels.push(KernelEntry {
            file,
            iteration: b.seq,
            template: template.name().to_string(),
            params: entry["params"].clone(),
            dtype: dtype.into(),
            derived: template.derived.clone(),
            launches: template
                .launches
                .iter()
                .map(|l| LaunchFormula {
                    kernel: format!("optd_{}_d{{D}}", l.kernel),
                    grid: l.grid.clone(),
                    block: l.block.clone(),
                    dyn_smem: l.smem.clone(),
                    when: l.when.clone(),
                })
                .collect(),
            shapes: vec![measured],
        });
    }
    let manifest = Manifest { format: 1, run: run.id.clone(), gpu: run.gpu_name.clone(), abi: abi(), kernels };
    let path = out.join("manifest.json");
    std::fs::write(&path, serde_json::to_string_pretty(&manifest)?).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
