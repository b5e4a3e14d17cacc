//! Export: each per-shape best kernel of a run as a standalone `.cu` plus a
//! `manifest.json` that says everything a CUDA host needs to launch it (CuPy
//! RawModule, a torch extension, the driver API): kernel names, argument order and
//! types (kernel ABI v2: GQA heads, SQ/SK, element strides), launch geometry as formulas
//! of (B, HQ, HKV, SQ, SK, D), dynamic shared memory, the
//! softmax-scale convention, dtype, causal, and the measured time. Kernels of Hopper
//! templates also carry their NVRTC target (`arch`, e.g. `sm_90a`) and their TMA tensor
//! maps: as formulas per kernel, and resolved per exported shape (one geometry,
//! [`crate::spec::protocol::TensorMap::geometry`], shared with the gate and the worker).
//!
//! With [`ExportOptions::cubins`] each kernel is also compiled to `<file>.cubin` for its
//! `arch`, with the options of the measured build less its CTA count (compiled in there,
//! untaken while timing), so a
//! runtime can load it without a compiler; `export --python` uses that
//! ([`crate::ops::python_package`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::nvrtc::Toolchain;
use crate::storage::ledger::Ledger;
use crate::spec::protocol::{source_abi, DeviceInfo, Shape, TensorMap, TensorMapGeometry, TensorName, ViewStrides, ABI_PARAMS, ABI_VERSION};
use crate::spec::template::{Template, TensorMapSpec};
use crate::storage::workspace::Workspace;

#[derive(Debug, Serialize)]
pub struct Manifest {
    /// The kernel ABI: 3 since the sliding window (`window` after `causal`), 2 since
    /// grouped-query heads and strides (format 1: `(.., batch, heads, seq_len, ..)`,
    /// [B,H,S,D] only).
    pub format: u32,
    pub run: String,
    pub gpu: Option<String>,
    /// The GPU the kernels were tuned and timed on (a runtime compares it with its own).
    pub device: DeviceEntry,
    /// The Python package these kernels are part of (`export --python` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<PackageInfo>,
    pub abi: Abi,
    pub kernels: Vec<KernelEntry>,
}

/// The manifest's `device`: what a runtime needs to decide whether a kernel runs on its
/// GPU (cc), and whether the launch formulas it evaluates are those of the GPU the run
/// timed (SMS and SMEM_OPTIN appear in them). Fields are null when the ledger has no
/// device for the run (a run that never reached the GPU).
#[derive(Debug, Clone, Serialize)]
pub struct DeviceEntry {
    pub name: Option<String>,
    /// major * 10 + minor, e.g. 90.
    pub cc: Option<u32>,
    pub sms: Option<u32>,
    /// Largest dynamic shared memory per block after opt-in, in bytes.
    pub smem_optin: Option<u32>,
}

impl DeviceEntry {
    fn new(device: Option<&DeviceInfo>, gpu_name: Option<&str>) -> Self {
        DeviceEntry {
            name: device.map(|d| d.name.clone()).or_else(|| gpu_name.map(str::to_string)),
            cc: device.map(DeviceInfo::cc),
            sms: device.map(|d| d.sm_count),
            smem_optin: device.map(|d| d.smem_optin),
        }
    }
}

/// The manifest's `package`: the Python package name (also its torch op namespace) and
/// the optimizerd release that wrote it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PackageInfo {
    pub name: String,
    pub optimizerd: String,
}

/// What an export writes beyond the `.cu` files and the manifest.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Compile each kernel to `<file>.cubin` with this NVRTC; None: `cubin` is null.
    pub cubins: Option<Toolchain>,
    pub package: Option<PackageInfo>,
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct Exported {
    pub run: String,
    pub dir: PathBuf,
    pub manifest: PathBuf,
    /// The `.cu` files, one per kernel (a kernel can be the best for several shapes).
    pub kernels: Vec<String>,
    /// The `.cubin` files written, beside their `.cu`.
    pub cubins: Vec<String>,
    /// Each cubin's target, e.g. `sm_90` or `sm_90a`, sorted and without repeats.
    pub archs: Vec<String>,
    /// What a reader should know (a kernel left without a cubin, and why).
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Abi {
    /// In order; `T` is `__half` (fp16) or `__nv_bfloat16` (bf16), see each kernel's dtype.
    pub args: Vec<(&'static str, &'static str, &'static str)>,
    pub layout: &'static str,
    /// The `strides` argument: a struct of 12 int64 by value.
    pub strides: &'static str,
    pub gqa: &'static str,
    pub softmax_scale: &'static str,
    pub causal: &'static str,
    pub window: &'static str,
    pub compile: &'static str,
    /// Parameters after `args`, for kernels with `tensor_maps`.
    pub tensor_maps: &'static str,
}

#[derive(Debug, Serialize)]
pub struct KernelEntry {
    pub file: String,
    pub iteration: i64,
    pub template: String,
    pub params: serde_json::Value,
    pub dtype: String,
    /// Formulas over B, HQ, HKV, G (= HQ / HKV), SQ, SK, D, CAUSAL, BSHD, SMS (SM count), SMEM_OPTIN, CC and the knobs
    /// (fixed as #defines in the file); minijinja/Jinja2 expressions with cdiv, min, max.
    pub derived: Vec<(String, String)>,
    /// `{when, why}`: where `when` (same names, after `derived`) holds, the kernel cannot run
    /// the shape (the template's `[[refuse]]`); a loader passes the shape over. Empty for most.
    pub refuse: Vec<crate::spec::template::RefuseSpec>,
    pub launches: Vec<LaunchFormula>,
    /// NVRTC/nvcc target it was compiled and timed for: the GPU's `sm_<cc>`, or
    /// `sm_<cc>a` (e.g. `sm_90a`) when `arch_specific`, which runs only on that exact cc.
    pub arch: Option<String>,
    pub arch_specific: bool,
    /// The smallest compute capability the source compiles and runs on (the template's
    /// `min_cc`; for an arch-specific kernel the only one).
    pub min_cc: u32,
    /// The most query rows (SQ) the kernel is written for (the template's `max_sq`, e.g.
    /// 16 for decode); null: any SQ.
    pub max_sq: Option<u32>,
    /// Whether the kernel implements the sliding window (its template's `windows`, and its
    /// run had a windowed shape: otherwise it was built and exported without the window's
    /// code, `#define OPTD_BUILD_WINDOW 0`): a loader runs a call with a window only on a
    /// kernel that says true.
    pub windows: bool,
    /// `<file>.cubin`: the source compiled for `arch` as it was timed; null when the
    /// export compiled no cubins (`export --out`) or the run recorded no arch.
    pub cubin: Option<String>,
    /// TMA tensor maps passed by value after the 17 ABI arguments, as formulas of the
    /// shape, the `strides` argument and the knobs; each shape lists them resolved.
    pub tensor_maps: Vec<TensorMapEntry<String>>,
    /// The shapes this kernel is the best for, with their resolved launches and times.
    pub shapes: Vec<serde_json::Value>,
}

/// One tensor map, as `cuTensorMapEncodeTiled` takes it. `T` is a formula string in a
/// kernel's entry and a number in each resolved shape.
#[derive(Debug, Serialize)]
pub struct TensorMapEntry<T> {
    /// Kernel parameter index (0-based): 16 + position among the kernel's maps.
    pub param_index: usize,
    /// `q`, `k`, `v` or `o`: the global address is that tensor's pointer (16-byte aligned).
    pub tensor: &'static str,
    /// CU_TENSOR_MAP_DATA_TYPE_UINT16: the 16-bit patterns of fp16 or bf16.
    pub data_type: &'static str,
    pub rank: u32,
    /// globalDim, innermost first: {P, rows, D/P, heads, B} with P = swizzle_bytes / 2
    /// (rows, heads: SQ, HQ for q and o; SK, HKV for k and v).
    pub dims: Vec<T>,
    /// globalStrides of dims 1..rank-1 in bytes (dim 0 is contiguous):
    /// {row stride * 2, P*2, head stride * 2, batch stride * 2}, from the `strides` argument.
    pub strides_bytes: Vec<T>,
    /// boxDim: {P, box_rows, box_panels (the template's formula; D/P where it has none), 1, 1}.
    #[serde(rename = "box")]
    pub box_dims: Vec<T>,
    pub element_strides: [u32; 5],
    /// CU_TENSOR_MAP_SWIZZLE_32B / 64B / 128B: bytes, or (formula entries of a template whose
    /// swizzle depends on the head dim) a formula giving them.
    pub swizzle_bytes: SwizzleBytes,
    pub interleave: &'static str,
    pub l2_promotion: &'static str,
    /// `none`: rows past the tensor's rows read as zeros.
    pub oob_fill: &'static str,
}

/// A map's swizzle in the manifest: resolved entries always hold bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SwizzleBytes {
    Bytes(u32),
    Formula(String),
}

impl<T> TensorMapEntry<T> {
    fn new(index: usize, tensor: &'static str, swizzle: SwizzleBytes, dims: Vec<T>, strides_bytes: Vec<T>, box_dims: Vec<T>) -> Self {
        TensorMapEntry {
            param_index: ABI_PARAMS + index,
            tensor,
            data_type: "uint16",
            rank: TensorMapGeometry::RANK,
            dims,
            strides_bytes,
            box_dims,
            element_strides: [1; 5],
            swizzle_bytes: swizzle,
            interleave: "none",
            l2_promotion: "128B",
            oob_fill: "none",
        }
    }
}

/// A declared map as formulas (the convention of `TensorMap::geometry`, written out). A
/// swizzle given as a formula (one per head dim) is written as that formula, and the panel
/// width P in the other formulas as `(formula) // 2`.
fn map_formulas(index: usize, spec: &TensorMapSpec) -> TensorMapEntry<String> {
    let (swizzle, p) = match spec.swizzle.trim().parse::<u32>() {
        Ok(w) => (SwizzleBytes::Bytes(w), (w / 2).to_string()),
        Err(_) => (SwizzleBytes::Formula(spec.swizzle.clone()), format!("(({}) // 2)", spec.swizzle)),
    };
    let t = spec.tensor.as_str();
    let (rows, heads) = match spec.tensor {
        TensorName::Q | TensorName::O => ("SQ", "HQ"),
        TensorName::K | TensorName::V => ("SK", "HKV"),
    };
    TensorMapEntry::new(
        index,
        t,
        swizzle.clone(),
        // `//`: integer division, as in the launch formulas (minijinja / Jinja2).
        vec![p.clone(), rows.into(), format!("D // {p}"), heads.into(), "B".into()],
        vec![
            format!("strides.{t}_s * 2"),
            match &swizzle {
                SwizzleBytes::Bytes(w) => w.to_string(),
                SwizzleBytes::Formula(f) => format!("({f})"),
            },
            format!("strides.{t}_h * 2"),
            format!("strides.{t}_b * 2"),
        ],
        vec![p.clone(), spec.box_rows.clone(), spec.box_panels.clone().unwrap_or_else(|| format!("D // {p}")), "1".into(), "1".into()],
    )
}

/// A resolved map of one shape.
fn map_resolved(index: usize, map: &TensorMap, shape: &Shape) -> anyhow::Result<TensorMapEntry<u64>> {
    let g = map
        .geometry(shape, &ViewStrides::contiguous(shape))
        .map_err(|why| anyhow::anyhow!("tensor_map[{index}] ({}) of {}: {why}", map.tensor.as_str(), shape.key()))?;
    Ok(TensorMapEntry::new(
        index,
        map.tensor.as_str(),
        SwizzleBytes::Bytes(map.swizzle),
        g.dims.to_vec(),
        g.strides_bytes.to_vec(),
        g.box_dims.iter().map(|&b| b as u64).collect(),
    ))
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
            ("q", "const T*", "B x HQ x SQ rows of D elements, addressed through strides.q_*"),
            ("k", "const T*", "B x HKV x SK rows of D elements, through strides.k_*"),
            ("v", "const T*", "B x HKV x SK rows of D elements, through strides.v_*"),
            ("o", "T*", "B x HQ x SQ rows of D elements, through strides.o_*, written"),
            ("o_partial", "float*", "n_splits*B*HQ*SQ*D floats of contiguous scratch (>= 1 element)"),
            ("lse_partial", "float*", "(n_splits + 1)*B*HQ*SQ 4-byte words, contiguous: n_splits*B*HQ*SQ float LSEs of scratch, then B*HQ*SQ split semaphores (unsigned 32-bit, from word n_splits*B*HQ*SQ) that must be zero before a plan's first launch and that every execution of the plan's launches leaves zero (zero them once per reused workspace, or each call for a fresh one)"),
            ("batch", "int", "B"),
            ("heads_q", "int", "HQ, query heads"),
            ("heads_kv", "int", "HKV, key/value heads (HQ % HKV == 0; 1: multi-query)"),
            ("seq_q", "int", "SQ, query rows (>= 1)"),
            ("seq_k", "int", "SK, keys (SK >= SQ)"),
            ("n_splits", "int", "the `splits` derived value"),
            ("softmax_scale", "float", "1/sqrt(D)"),
            ("causal", "int", "0 or 1"),
            ("window", "int", "0 (none) or W >= 1 with causal: a sliding window of W keys"),
            ("strides", "struct optd_strides (by value)", "12 int64 element strides: q_b, q_h, q_s, k_b, k_h, k_s, v_b, v_h, v_s, o_b, o_h, o_s"),
            ("cta_counter", "unsigned int*", "null or a valid device pointer (built with -DOPTD_COUNT_CTAS=1, a kernel adds its finished CTAs to it when not null; built without, never touched)"),
        ],
        layout: "each row of D elements contiguous and 16-byte aligned; rows addressed as base + b * stride_b + h * stride_h + s * stride_s (elements), so [B,H,S,D], [B,S,H,D] and views with a unit last stride (each stride a multiple of 8 elements) need no copy",
        strides: "struct optd_strides { long long q_b, q_h, q_s, k_b, k_h, k_s, v_b, v_h, v_s, o_b, o_h, o_s; } passed by value (96 bytes, 8-byte aligned); for [B,H,S,D] contiguous: _b = H*S*D, _h = S*D, _s = D; for [B,S,H,D]: _b = S*H*D, _h = D, _s = H*D (H, S of that tensor)",
        gqa: "query head h reads key/value head h / (HQ / HKV)",
        softmax_scale: "softmax(Q K^T * softmax_scale) V with softmax_scale = 1/sqrt(D), passed by the caller",
        causal: "when causal != 0, key j is masked for query row i if j > i + SK - SQ (the query rows are the last SQ positions: FlashAttention >= 2.1, SDPA's bottom-right causal)",
        window: "when window > 0 (only with causal), key j is also masked for query row i if j <= i + SK - SQ - window: each row sees at most `window` keys, its own position included (Hugging Face's sliding_window = W, FlashAttention's window_size = (W - 1, 0)); only kernels whose entry says windows: true implement it",
        compile: "NVRTC or nvcc with -std=c++17 and the CUDA include path (a toolkit's, with crt/: the wmma template's kernels include <mma.h>, which includes crt/mma.h), for each kernel's `arch` (the GPU's real arch, e.g. sm_90, or sm_90a for arch-specific kernels); a kernel's `cubin`, when not null, is that build from NVRTC (--gpu-architecture=<arch> -std=c++17 -lineinfo, no defines), the binary the run timed less its CTA count (the run builds with -DOPTD_COUNT_CTAS=1 and times with a null cta_counter; the hot loops are the same); launches run in order on one stream",
        tensor_maps: "kernels with tensor_maps take, after the 17 args, one CUtensorMap (128 bytes, 64-byte aligned, by value: `const __grid_constant__ CUtensorMap`) per map, in param_index order, the same maps for every launch of the kernel; encode each with cuTensorMapEncodeTiled(data_type, rank, tensor pointer, dims, strides_bytes, box, element_strides, interleave, swizzle, l2_promotion, oob_fill) from the shape's resolved entry (resolved for contiguous tensors in the shape's layout; for another view use the formulas with its strides; a formula entry's swizzle_bytes is a formula string where the swizzle depends on D)",
    }
}

/// Write the run's best kernels into `out`; returns the manifest path.
pub async fn export(ledger: &Ledger, run_id: &str, out: &Path) -> anyhow::Result<PathBuf> {
    Ok(export_with(ledger, run_id, out, &ExportOptions::default()).await?.manifest)
}

/// [`export`], with cubins and the package entry as `opts` asks.
pub async fn export_with(ledger: &Ledger, run_id: &str, out: &Path, opts: &ExportOptions) -> anyhow::Result<Exported> {
    let run = ledger.run(Some(run_id)).await?;
    let best = ledger.best(&run.id).await?;
    anyhow::ensure!(!best.is_empty(), "run {} has no correct kernel yet: nothing to export", run.id);
    let ws = Workspace::open(&Path::new(&run.run_dir).join("workspace"))?;
    let dispatch: BTreeMap<String, serde_json::Value> = serde_json::from_str(
        &ws.read_best("kernels/dispatch.json")?.context("the workspace's best has no kernels/dispatch.json")?,
    )?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let iterations = ledger.iterations(&run.id).await?;
    let device = ledger.device(&run.id).await?;
    // The closing comparison (a finished run): the runtime package prefers SDPA on a shape
    // where SDPA was faster than the best kernel at the same clocks.
    let closing = ledger.closing(&run.id).await?;
    let mut kernels: Vec<KernelEntry> = Vec::new();
    // The exact source of each entry of `kernels`, for the cubins.
    let mut sources: Vec<String> = Vec::new();
    // A run without a windowed shape built its kernels without the window's code
    // (`protocol::BuildScope`): the exported files say so, so that the .cu and its cubin are
    // the build that was timed, and the manifest says those kernels take no window.
    let run_windows = best.iter().any(|b| {
        iterations
            .iter()
            .filter(|i| i.seq == b.seq)
            .flat_map(|i| &i.shapes)
            .filter(|s| s.shape == b.shape)
            .any(|s| serde_json::from_str::<Shape>(&s.shape_json).is_ok_and(|sh| sh.window.is_some()))
    });
    for b in &best {
        let source = ws.read_best(&b.source_path)?.with_context(|| format!("{} is not on best", b.source_path))?;
        let entry = dispatch.get(&b.shape).with_context(|| format!("kernels/dispatch.json has no {}", b.shape))?;
        let iteration = iterations.iter().find(|i| i.seq == b.seq);
        let shape_json: serde_json::Value = iteration
            .and_then(|i| i.shapes.iter().find(|s| s.shape == b.shape))
            .and_then(|s| serde_json::from_str(&s.shape_json).ok())
            .unwrap_or_default();
        let maps: Vec<TensorMap> = match entry.get("tensor_maps") {
            Some(m) => serde_json::from_value(m.clone()).with_context(|| format!("kernels/dispatch.json: tensor_maps of {}", b.shape))?,
            None => Vec::new(),
        };
        let resolved_maps = if maps.is_empty() {
            Vec::new()
        } else {
            let shape: Shape = serde_json::from_value(shape_json.clone())
                .with_context(|| format!("the ledger has no shape for {} to resolve its tensor maps", b.shape))?;
            maps.iter().enumerate().map(|(i, m)| map_resolved(i, m, &shape)).collect::<anyhow::Result<Vec<_>>>()?
        };
        let closing = closing.iter().find(|c| c.shape == b.shape && c.seq == b.seq).map(|c| {
            serde_json::json!({
                "ours_us": c.ours_us(), "sdpa_default_us": c.sdpa_default_us, "sdpa_picked": c.sdpa_picked,
                "fa4_us": c.fa4_us(), "measured_at": c.measured_at,
                // Sustained (`timing.sustained_ms` back to back); null when not measured.
                "ours_sustained_us": c.ours_sustained_us(), "sdpa_default_sustained_us": c.sdpa_default_sustained_us,
                "fa4_sustained_us": c.fa4_sustained_us(), "sustained_ms": c.sustained_ms,
            })
        });
        let measured = serde_json::json!({
            "key": b.shape, "shape": shape_json, "median_us": b.median_us, "baseline_us": b.baseline_us,
            "closing": closing,
            "n_splits": entry["n_splits"], "launches": entry["launches"], "tensor_maps": resolved_maps,
        });
        if let Some(k) = kernels.iter_mut().find(|k| k.iteration == b.seq) {
            k.shapes.push(measured);
            continue;
        }
        anyhow::ensure!(
            source_abi(&source) == ABI_VERSION,
            "{}: the best kernel of {} was tuned with kernel ABI v{} (before {}), which a format-{ABI_VERSION} \
             manifest cannot describe; export the run with the optimizerd release that tuned it, or tune the workload again with \
             `optimizerd start` (this release's kernels are ABI v{ABI_VERSION})",
            b.source_path,
            b.shape,
            source_abi(&source),
            if source_abi(&source) == 1 { "grouped-query heads and strides" } else { "the sliding-window argument" }
        );
        let template = Template::parse(&b.source_path, source.clone())?;
        let file = format!("it{}-{}.cu", b.seq, template.name());
        let source = if run_windows {
            source
        } else {
            format!("// Built without the sliding window's code, as it was timed (no shape of its run has a window).\n#define OPTD_BUILD_WINDOW 0\n{source}")
        };
        std::fs::write(out.join(&file), &source).with_context(|| format!("cannot write {}", out.join(&file).display()))?;
        let dtype = if source.contains("#define OPTD_BF16 1") { "bf16" } else { "fp16" };
        // As recorded when compiled; older ledgers: what the target would be on the run's GPU.
        let arch = iteration
            .and_then(|i| i.arch.clone())
            .or_else(|| device.as_ref().and_then(|d| template.meta.target_arch(d).ok()));
        kernels.push(KernelEntry {
            file,
            iteration: b.seq,
            template: template.name().to_string(),
            params: entry["params"].clone(),
            dtype: dtype.into(),
            derived: template.derived.clone(),
            refuse: template.refusals.clone(),
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
            arch,
            arch_specific: template.meta.arch_specific,
            min_cc: template.meta.min_cc,
            max_sq: template.meta.max_sq,
            windows: template.meta.windows && run_windows,
            cubin: None,
            tensor_maps: template.tensor_maps.iter().enumerate().map(|(i, m)| map_formulas(i, m)).collect(),
            shapes: vec![measured],
        });
        sources.push(source);
    }
    let mut notes = sdpa_faster_notes(&closing, &best);
    if let Some(tc) = &opts.cubins {
        notes.extend(write_cubins(tc, &mut kernels, &sources, out, device.as_ref())?);
    }
    let exported = Exported {
        run: run.id.clone(),
        dir: out.to_path_buf(),
        manifest: out.join("manifest.json"),
        kernels: kernels.iter().map(|k| k.file.clone()).collect(),
        cubins: kernels.iter().filter_map(|k| k.cubin.clone()).collect(),
        archs: kernels
            .iter()
            .filter(|k| k.cubin.is_some())
            .filter_map(|k| k.arch.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        notes,
    };
    let manifest = Manifest {
        format: ABI_VERSION,
        run: run.id.clone(),
        device: DeviceEntry::new(device.as_ref(), run.gpu_name.as_deref()),
        gpu: run.gpu_name.clone(),
        package: opts.package.clone(),
        abi: abi(),
        kernels,
    };
    let path = &exported.manifest;
    std::fs::write(path, serde_json::to_string_pretty(&manifest)?).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(exported)
}

/// A note per exported shape whose kernel lost to SDPA's default in the run's closing
/// comparison (a short run can end with a shape still on an early stage's kernel): the manifest
/// carries those figures, but a reader launching kernels from it alone should hear it here.
fn sdpa_faster_notes(closing: &[crate::storage::ledger::ClosingRow], best: &[crate::storage::ledger::BestRow]) -> Vec<String> {
    closing
        .iter()
        .filter(|c| best.iter().any(|b| b.shape == c.shape && b.seq == c.seq))
        .filter_map(|c| {
            let sdpa = c.sdpa_default_us.filter(|s| *s < c.ours_us())?;
            Some(format!(
                "{}: SDPA's default{} took {sdpa:.2} us against the kernel's {:.2} us in the run's closing comparison; \
                 the Python package (export --python) calls SDPA for it, and so should a caller of this manifest",
                c.shape,
                c.sdpa_picked.as_deref().map(|b| format!(" ({b})")).unwrap_or_default(),
                c.ours_us()
            ))
        })
        .collect()
}

/// Compile each kernel to `<file>.cubin` for its `arch` and record it in its entry;
/// returns notes on the kernels left without one. The options are those of the daemon's
/// build less `OPTD_COUNT_CTAS` (compiled in there for the check; timing passes a null
/// counter, so the branch is never taken): the binary that was measured, given the same
/// NVRTC, without the count. Kernels compile
/// side by side: each is one NVRTC call of a few seconds.
fn write_cubins(tc: &Toolchain, kernels: &mut [KernelEntry], sources: &[String], out: &Path, device: Option<&DeviceInfo>) -> anyhow::Result<Vec<String>> {
    let results: Vec<Option<anyhow::Result<Vec<u8>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = kernels
            .iter()
            .zip(sources)
            .map(|(k, source)| {
                let arch = k.arch.clone();
                let file = k.file.clone();
                s.spawn(move || arch.map(|arch| compile_cubin(tc, source, &file, &arch, device)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Some(Err(anyhow::anyhow!("the NVRTC compile thread panicked")))))
            .collect()
    });
    let mut notes = Vec::new();
    for (k, result) in kernels.iter_mut().zip(results) {
        let Some(result) = result else {
            notes.push(format!(
                "{}: no cubin: the ledger records no target arch for it (a run from before archs were recorded, without a device); \
                 a runtime compiles the .cu itself",
                k.file
            ));
            continue;
        };
        let cubin = format!("{}.cubin", k.file.trim_end_matches(".cu"));
        let path = out.join(&cubin);
        std::fs::write(&path, result?).with_context(|| format!("cannot write {}", path.display()))?;
        k.cubin = Some(cubin);
    }
    Ok(notes)
}

fn compile_cubin(tc: &Toolchain, source: &str, file: &str, arch: &str, device: Option<&DeviceInfo>) -> anyhow::Result<Vec<u8>> {
    crate::nvrtc::compile(tc, source, file, arch, &[]).map(|c| c.cubin).map_err(|e| {
        let run_nvrtc = device.map(|d| format!(" (the run used NVRTC {}.{})", d.nvrtc_version.0, d.nvrtc_version.1)).unwrap_or_default();
        anyhow::anyhow!(
            "{file}: NVRTC {}.{} at {} cannot compile it for {arch}, although the run compiled and timed this exact source{run_nvrtc}: {e}\n\
             To fix: export with the NVRTC the run used (scripts/setup.sh installs the pinned one into .deps/, or set OPTIMIZERD_NVRTC_LIB \
             and OPTIMIZERD_CUDA_INCLUDE), or export with --out only (sources and manifest, no cubins)",
            tc.version.0,
            tc.version.1,
            tc.lib.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run resumed across the upgrade can hold kernels of the old ABI: they are told
    /// apart by what their inlined optd.cuh declares.
    #[test]
    fn a_source_says_which_kernel_abi_it_was_written_for() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel-templates");
        let optd = crate::spec::assets::read(&dir, "common/optd.cuh").unwrap();
        assert_eq!(source_abi(&optd), 3, "this release's kernels");
        let v2 = "struct optd_strides { long long q_b; };\n#define OPTD_ARGS ... float softmax_scale, int causal, const optd_strides strides, \\\n unsigned int* cta_counter";
        assert_eq!(source_abi(v2), 2);
        let v1 = "#define OPTD_ARGS const elem_t* __restrict__ q, ..., int batch, int heads, int seq_len, int n_splits, ...";
        assert_eq!(source_abi(v1), 1);
    }

    /// The manifest's box formula takes the template's `box_panels` where it has one (a box
    /// per panel), else every panel of D; for wgmma-tma's q and o that is the packed-heads rule.
    #[test]
    fn a_maps_box_formula_follows_its_box_panels() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel-templates");
        let t = crate::spec::template::Template::load(&dir, "wgmma_tma.cu").unwrap();
        let boxes: Vec<(String, Vec<String>)> = t
            .tensor_maps
            .iter()
            .enumerate()
            .map(|(i, m)| (m.tensor.as_str().to_string(), map_formulas(i, m).box_dims))
            .collect();
        let p = "((64 if D == 96 else 128) // 2)";
        let with = |rows: &str, panels: &str| vec![p.to_string(), rows.into(), panels.into(), "1".into(), "1".into()];
        let all = format!("D // {p}");
        assert_eq!(
            boxes,
            vec![
                ("q".into(), with("64 // pack", "1 if pack > 1 else D // (32 if D == 96 else 64)")),
                ("k".into(), with("BLOCK_N", &all)),
                ("v".into(), with("BLOCK_N", &all)),
                ("o".into(), with("64 // pack", "1 if pack > 1 else D // (32 if D == 96 else 64)")),
            ]
        );
    }

    /// The formulas a manifest writes for wgmma-tma's maps (its swizzle a formula of D)
    /// evaluate, at every head dim, to the entry the export resolves for that shape.
    #[test]
    fn a_maps_formulas_give_its_resolved_entry_at_every_head_dim() {
        use crate::spec::template::{eval_int_expr, shape_vars};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel-templates");
        let t = crate::spec::template::Template::load(&dir, "wgmma_tma.cu").unwrap();
        let dev = crate::test_fixtures::h100();
        for d in [64, 96, 128, 256] {
            for (hq, hkv, pack) in [(16, 16, 0), (16, 4, 1)] {
                let shape = Shape {
                    b: 2,
                    hq,
                    hkv,
                    sq: 1000,
                    sk: 1000,
                    d,
                    causal: true,
                    window: None,
                    dtype: crate::spec::protocol::DType::Bf16,
                    layout: crate::spec::protocol::Layout::Bshd,
                };
                let mut params = t.default_params();
                params.insert("PACK_GQA".into(), pack);
                let mut vars = shape_vars(&shape, &dev);
                vars.extend(params.iter().map(|(k, v)| (k.clone(), *v)));
                for (name, expr) in &t.derived {
                    let v = eval_int_expr(expr, &vars).unwrap();
                    vars.insert(name.clone(), v);
                }
                let plan = t.plan(&params, &shape, &dev).unwrap();
                for (i, (spec, map)) in t.tensor_maps.iter().zip(&plan.tensor_maps).enumerate() {
                    let f = map_formulas(i, spec);
                    let r = map_resolved(i, map, &shape).unwrap();
                    let eval = |xs: &[String]| -> Vec<u64> { xs.iter().map(|x| eval_int_expr(x, &vars).unwrap() as u64).collect() };
                    let at = format!("D {d} G {} {}", hq / hkv, spec.tensor.as_str());
                    assert_eq!(eval(&f.dims), r.dims, "{at}");
                    assert_eq!(eval(&f.box_dims), r.box_dims, "{at}");
                    assert_eq!(eval_int_expr(&f.strides_bytes[1], &vars).unwrap() as u64, r.strides_bytes[1], "{at}: the panel stride");
                    let SwizzleBytes::Formula(sw) = &f.swizzle_bytes else { panic!("{at}: a literal swizzle") };
                    assert_eq!(SwizzleBytes::Bytes(eval_int_expr(sw, &vars).unwrap() as u32), r.swizzle_bytes, "{at}");
                }
            }
        }
    }
}
