//! The PyTorch SDPA baseline: run `scripts/sdpa_baseline.py` on the workload shapes,
//! cache the result per device, driver, torch, cuDNN and FlashAttention-4 version, and
//! record it with the run, so every run says how its kernels compare with SDPA (and with
//! FlashAttention-4, where `flash_attn.cute` imports) on the same GPU.
//!
//! Backends are kept by name, as the script reports them (SDPA's `default`, `flash`,
//! `cudnn`, `efficient`, and [`FA4`]): the ledger stores them as JSON, so a new backend
//! needs no schema change.
//!
//! It is optional: without python3 and torch the run goes on, says so, and reports
//! speedups over its own baseline kernel only; without FlashAttention-4 everything else
//! is measured and the run says FA4 was not measured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::spec::config::Config;
use crate::storage::ledger::{Ledger, NewSdpa};
use crate::spec::protocol::{DeviceInfo, Shape};

/// The embedded copy, used when the repository's script is not on disk.
const SCRIPT: &str = include_str!("../../scripts/sdpa_baseline.py");

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Versions {
    pub torch: Option<String>,
    pub cuda: Option<String>,
    pub cudnn: Option<i64>,
    pub device: Option<String>,
    pub cc: Option<String>,
    /// FlashAttention-4's version; None when `flash_attn.cute` does not import (or the
    /// script predates FA4).
    #[serde(default)]
    pub fa4: Option<String>,
    /// Why FA4 was not measured (the import error), when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fa4_error: Option<String>,
}

/// The backend name of FlashAttention-4 in the script's results and the ledger.
pub const FA4: &str = "fa4";

impl Versions {
    /// "FA4 not measured (why)" when FlashAttention-4 was absent; None when it was measured.
    pub fn fa4_absent(&self) -> Option<String> {
        self.fa4.is_none().then(|| match &self.fa4_error {
            Some(why) => format!("FA4 not measured: {why}"),
            None => "FA4 not measured".to_string(),
        })
    }
}

/// One backend's timings for one shape, per call, in microseconds, and how it ran.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct BackendTiming {
    pub graph_us: Option<f64>,
    pub eager_us: Option<f64>,
    /// `default` only: the backend SDPA dispatched to.
    pub picked: Option<String>,
    pub error: Option<String>,
    /// The backend whose kernels ran (cudnn, flash, efficient, math; fa4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<String>,
    /// How K/V reached it: `mha`, `gqa` (enable_gqa) or `repeated` (repeat_interleave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<String>,
    /// How causality reached it: `none`, `is_causal`, `lower_right` or `explicit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
    /// What the backend refused before the form that ran (enable_gqa, the lower-right mask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Per call under sustained load (`--sustained-ms`: the graph replayed back to back for at
    /// least that long, the median of the script's windows). None: not asked for (the run's
    /// start, older cached entries) or the backend did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sustained_us: Option<f64>,
}

/// SDPA on one shape, as recorded for a run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ShapeBaseline {
    pub shape: String,
    pub backends: BTreeMap<String, BackendTiming>,
    pub cached: bool,
}

impl ShapeBaseline {
    pub fn default_backend(&self) -> Option<&BackendTiming> {
        self.backends.get("default")
    }

    /// FlashAttention-4 on this shape; None when it was not measured.
    pub fn fa4(&self) -> Option<&BackendTiming> {
        self.backends.get(FA4)
    }
}

#[derive(Debug, Deserialize)]
struct ScriptOutput {
    versions: Versions,
    results: Vec<serde_json::Value>,
}

/// Resolve `{script}` in the configured command: the repository's script, else the
/// embedded copy written into the run folder.
fn command(cfg: &Config, run_dir: &Path) -> std::io::Result<String> {
    let on_disk = cfg.resolve(Path::new("scripts/sdpa_baseline.py"));
    let script: PathBuf = if on_disk.exists() {
        on_disk
    } else {
        let p = run_dir.join("sdpa_baseline.py");
        std::fs::write(&p, SCRIPT)?;
        p
    };
    Ok(cfg.baseline.sdpa_command.replace("{script}", &shell_quote(&script.display().to_string())))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

async fn run_script(cmd: &str, args: &str, timeout: Duration) -> Result<String, String> {
    let mut c = tokio::process::Command::new("sh");
    c.arg("-c").arg(format!("{cmd} {args}")).kill_on_drop(true);
    let out = match tokio::time::timeout(timeout, c.output()).await {
        Err(_) => return Err(format!("`{cmd} {args}` gave no answer within {}", humantime::format_duration(timeout))),
        Ok(Err(e)) => return Err(format!("cannot run `{cmd}`: {e}")),
        Ok(Ok(o)) => o,
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(format!("`{cmd} {args}` failed ({}): {}", out.status, tail.join(" | ")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Keyed by what changes the answer: device, driver, torch, cuDNN, FA4 (installing it adds
/// a backend), the shape, and the length of a timed graph (sized like a candidate's sample,
/// by GPU time: `GRAPH_SIZING` keeps out the entries of the script that sized it by eager
/// time, whose decode graphs were a tenth as long).
/// The most calls scripts/sdpa_baseline.py captures in one graph (`calls_for`: as many as
/// last `timing.sample_target_us`, at most this); the closing sizes our samples the same way
/// (engine/closing.rs `closing_sample`).
pub const MAX_CALLS_PER_GRAPH: u32 = 1000;

/// How scripts/sdpa_baseline.py sizes its graphs (`calls_for`), in the cache key.
const GRAPH_SIZING: &str = "by gpu time";

fn cache_key(device: &DeviceInfo, v: &Versions, shape: &Shape, target_us: f64) -> String {
    format!(
        "{}|sm_{}|driver {}|torch {}|cudnn {}|fa4 {}|graph {}us {GRAPH_SIZING}|{}",
        device.name,
        device.cc(),
        device.driver_version,
        v.torch.as_deref().unwrap_or("?"),
        v.cudnn.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
        v.fa4.as_deref().unwrap_or("-"),
        target_us,
        shape.key()
    )
}

/// One shape's result object: every member that is an object is a backend (by name, so a
/// backend the script adds needs nothing here), except the echoed `shape`.
fn parse_entry(shape: &Shape, entry: &serde_json::Value, cached: bool) -> ShapeBaseline {
    let mut backends = BTreeMap::new();
    if let Some(obj) = entry.as_object() {
        for (k, v) in obj {
            if let Ok(t) = serde_json::from_value::<BackendTiming>(v.clone()) {
                if v.is_object() && k != "shape" {
                    backends.insert(k.clone(), t);
                }
            }
        }
    }
    ShapeBaseline { shape: shape.key(), backends, cached }
}

/// Run the script on `shapes` (no cache).
async fn run_shapes(cfg: &Config, cmd: &str, run_dir: &Path, shapes: &[Shape], sustained_ms: f64) -> Result<ScriptOutput, String> {
    let file = run_dir.join("sdpa_shapes.json");
    let list: Vec<serde_json::Value> = shapes
        .iter()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .collect();
    std::fs::write(&file, serde_json::to_string(&list).unwrap_or_default()).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    // Graphs as long as a candidate's timed sample, so both run at the same clocks.
    let mut args = format!("--shapes {} --target-us {}", shell_quote(&file.display().to_string()), cfg.timing.sample_target_us);
    if sustained_ms > 0.0 {
        // Only the closing comparison asks: it compares sustained figures with ours.
        args.push_str(&format!(" --sustained-ms {sustained_ms}"));
    }
    let text = run_script(cmd, &args, cfg.baseline.sdpa_timeout).await?;
    let parsed: ScriptOutput = serde_json::from_str(&text).map_err(|e| format!("unexpected SDPA script output: {e}"))?;
    if parsed.results.len() != shapes.len() {
        return Err(format!("the SDPA script answered {} results for {} shapes", parsed.results.len(), shapes.len()));
    }
    Ok(parsed)
}

/// Measure SDPA (and FA4) on `shapes` now, bypassing the cache (the closing comparison:
/// the baselines at the clocks of the end of a run). Results in the order of `shapes`,
/// with the versions that measured them (whether FA4 was there). `sustained_ms` > 0 also
/// times each backend sustained (`BackendTiming::sustained_us`).
pub async fn measure_fresh(cfg: &Config, run_dir: &Path, shapes: &[Shape], sustained_ms: f64) -> Result<(Vec<ShapeBaseline>, Versions), String> {
    let cmd = command(cfg, run_dir).map_err(|e| format!("cannot write the SDPA script into {}: {e}", run_dir.display()))?;
    let parsed = run_shapes(cfg, &cmd, run_dir, shapes, sustained_ms).await?;
    Ok((shapes.iter().zip(&parsed.results).map(|(s, e)| parse_entry(s, e, false)).collect(), parsed.versions))
}

/// Measure (or take from the cache) SDPA for every shape and record it with the run.
/// An error means the baseline is unavailable; the caller notes it and goes on.
pub async fn measure(
    cfg: &Config,
    ledger: &Ledger,
    run_id: &str,
    run_dir: &Path,
    device: &DeviceInfo,
    shapes: &[Shape],
) -> Result<Vec<ShapeBaseline>, String> {
    let cmd = command(cfg, run_dir).map_err(|e| format!("cannot write the SDPA script into {}: {e}", run_dir.display()))?;
    let v: Versions = serde_json::from_str(&run_script(&cmd, "--versions", Duration::from_secs(120)).await?)
        .map_err(|e| format!("unexpected --versions output: {e}"))?;
    let versions_json = serde_json::to_string(&v).unwrap_or_default();
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for shape in shapes {
        match ledger.sdpa_cached(&cache_key(device, &v, shape, cfg.timing.sample_target_us)).await.map_err(|e| crate::error_text::chain(&e))? {
            Some(json) => out.push(parse_entry(shape, &serde_json::from_str(&json).unwrap_or_default(), true)),
            None => missing.push(*shape),
        }
    }
    if !missing.is_empty() {
        let parsed = run_shapes(cfg, &cmd, run_dir, &missing, 0.0).await?;
        for (shape, entry) in missing.iter().zip(&parsed.results) {
            ledger
                .sdpa_cache_put(&cache_key(device, &parsed.versions, shape, cfg.timing.sample_target_us), &entry.to_string())
                .await
                .map_err(|e| crate::error_text::chain(&e))?;
            out.push(parse_entry(shape, entry, false));
        }
    }
    // Workload order.
    out.sort_by_key(|b| shapes.iter().position(|s| s.key() == b.shape));
    for b in &out {
        let d = b.default_backend();
        let row = NewSdpa {
            shape: &b.shape,
            default_graph_us: d.and_then(|t| t.graph_us),
            default_eager_us: d.and_then(|t| t.eager_us),
            picked: d.and_then(|t| t.picked.clone()),
            backends_json: serde_json::to_string(&b.backends).unwrap_or_default(),
            versions_json: &versions_json,
            cached: b.cached,
        };
        ledger.sdpa_record(run_id, &row).await.map_err(|e| crate::error_text::chain(&e))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{DType, Layout};
    use serde_json::json;

    fn decode() -> Shape {
        Shape { b: 8, hq: 32, hkv: 8, sq: 1, sk: 4096, d: 128, causal: true, window: None, dtype: DType::Bf16, layout: Layout::Bhsd }
    }

    #[test]
    fn an_fa4_entry_is_a_backend_beside_sdpas_with_how_each_ran() {
        let entry = json!({
            "input_sets": 1,
            "default": {"graph_us": 50.8, "eager_us": 60.0, "calls": 40, "picked": "cudnn", "ran": "cudnn", "kv": "gqa", "mask": "none"},
            "efficient": {"graph_us": 90.0, "ran": "efficient", "kv": "repeated", "mask": "none",
                          "fallback": "enable_gqa with mask none: RuntimeError: No available kernel"},
            "flash": {"error": "enable_gqa with mask none: ran cudnn's kernels instead"},
            "fa4": {"graph_us": 47.5, "eager_us": 70.0, "calls": 42, "ran": "fa4", "kv": "gqa", "mask": "none", "layout": "bshd copy"},
            "shape": {"b": 8, "hq": 32, "hkv": 8, "sq": 1, "sk": 4096, "d": 128, "causal": true, "dtype": "bf16", "layout": "bhsd"}
        });
        let b = parse_entry(&decode(), &entry, false);
        assert_eq!(b.shape, "b8hq32hkv8sq1sk4096d128-causal-bf16");
        assert_eq!(b.backends.keys().map(String::as_str).collect::<Vec<_>>(), ["default", "efficient", "fa4", "flash"], "`shape` and scalars are no backends");
        let fa4 = b.fa4().expect("fa4 parsed as a backend");
        assert_eq!((fa4.graph_us, fa4.ran.as_deref(), fa4.kv.as_deref()), (Some(47.5), Some("fa4"), Some("gqa")));
        let eff = &b.backends["efficient"];
        assert_eq!(eff.kv.as_deref(), Some("repeated"));
        assert!(eff.fallback.as_deref().unwrap().contains("No available kernel"));
        assert_eq!(b.backends["flash"].graph_us, None);
        assert_eq!(b.default_backend().and_then(|d| d.picked.as_deref()), Some("cudnn"));
        // Stored as the ledger stores it and read back: nothing lost, no nulls for the new fields.
        let stored = serde_json::to_value(&b.backends).unwrap();
        assert_eq!(stored["fa4"]["graph_us"], json!(47.5));
        assert!(stored["default"].get("fallback").is_none());
    }

    #[test]
    fn sustained_figures_parse_when_present_and_are_none_in_older_entries() {
        let entry = json!({
            "default": {"graph_us": 50.0, "picked": "cudnn", "sustained_us": 59.0, "sustained_ms": 236.0, "sustained_replays": 100},
            "fa4": {"graph_us": 45.0, "ran": "fa4", "sustained_us": 53.0, "sustained_ms": 238.0, "sustained_replays": 102},
            "flash": {"error": "no"}
        });
        let b = parse_entry(&decode(), &entry, false);
        assert_eq!(b.default_backend().and_then(|d| d.sustained_us), Some(59.0));
        assert_eq!(b.fa4().and_then(|f| f.sustained_us), Some(53.0));
        assert_eq!(b.backends["flash"].sustained_us, None);
        // A cached entry from before (no sustained fields, no FA4) parses, with None.
        let old = parse_entry(&decode(), &json!({"default": {"graph_us": 50.0, "eager_us": 60.0, "picked": "cudnn"}}), true);
        assert_eq!(old.default_backend().map(|d| (d.graph_us, d.sustained_us)), Some((Some(50.0), None)));
        assert!(old.fa4().is_none());
        // Stored without a null for the absent figure.
        assert!(serde_json::to_value(&old.backends).unwrap()["default"].get("sustained_us").is_none());
    }

    #[test]
    fn versions_say_whether_fa4_was_measured_and_older_answers_still_parse() {
        let old: Versions = serde_json::from_str(r#"{"torch":"2.11.0","cuda":"13.0","cudnn":91900,"device":"H100","cc":"9.0"}"#).unwrap();
        assert_eq!(old.fa4, None);
        assert_eq!(old.fa4_absent().as_deref(), Some("FA4 not measured"));
        let absent: Versions = serde_json::from_str(
            r#"{"torch":"2.11.0","cuda":"13.0","cudnn":91900,"device":"H100","cc":"9.0","fa4":null,"fa4_error":"flash_attn.cute does not import (ModuleNotFoundError: No module named 'flash_attn')"}"#,
        )
        .unwrap();
        assert_eq!(absent.fa4_absent().as_deref(), Some("FA4 not measured: flash_attn.cute does not import (ModuleNotFoundError: No module named 'flash_attn')"));
        let present: Versions = serde_json::from_str(r#"{"torch":"2.11.0","cuda":"13.0","cudnn":91900,"device":"H100","cc":"9.0","fa4":"4.0.0b36"}"#).unwrap();
        assert_eq!(present.fa4_absent(), None);
        // Installing FA4 changes what a measurement holds: a cached one without it is not reused.
        let dev = crate::test_fixtures::h100();
        assert_ne!(cache_key(&dev, &absent, &decode(), 2000.0), cache_key(&dev, &present, &decode(), 2000.0));
        assert!(cache_key(&dev, &present, &decode(), 2000.0).contains("|fa4 4.0.0b36|"));
        // An entry of the script that sized its graphs by eager time is not reused.
        assert!(cache_key(&dev, &present, &decode(), 2000.0).contains("|graph 2000us by gpu time|"));
    }
}
