//! The PyTorch SDPA baseline: run `scripts/sdpa_baseline.py` on the workload shapes,
//! cache the result per device, driver, torch and cuDNN version, and record it with
//! the run, so every run says how its kernels compare with SDPA on the same GPU.
//!
//! It is optional: without python3 and torch the run goes on, says so, and reports
//! speedups over its own baseline kernel only.

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
}

/// One backend's timings for one shape, per call, in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct BackendTiming {
    pub graph_us: Option<f64>,
    pub eager_us: Option<f64>,
    pub picked: Option<String>,
    pub error: Option<String>,
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

/// Keyed by what changes the answer: device, driver, torch, cuDNN, the shape, and the
/// length of a timed graph (sized like a candidate's sample).
fn cache_key(device: &DeviceInfo, v: &Versions, shape: &Shape, target_us: f64) -> String {
    format!(
        "{}|sm_{}|driver {}|torch {}|cudnn {}|graph {}us|{}",
        device.name,
        device.cc(),
        device.driver_version,
        v.torch.as_deref().unwrap_or("?"),
        v.cudnn.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
        target_us,
        shape.key()
    )
}

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
async fn run_shapes(cfg: &Config, cmd: &str, run_dir: &Path, shapes: &[Shape]) -> Result<ScriptOutput, String> {
    let file = run_dir.join("sdpa_shapes.json");
    let list: Vec<serde_json::Value> = shapes
        .iter()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .collect();
    std::fs::write(&file, serde_json::to_string(&list).unwrap_or_default()).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    // Graphs as long as a candidate's timed sample, so both run at the same clocks.
    let args = format!("--shapes {} --target-us {}", shell_quote(&file.display().to_string()), cfg.timing.sample_target_us);
    let text = run_script(cmd, &args, cfg.baseline.sdpa_timeout).await?;
    let parsed: ScriptOutput = serde_json::from_str(&text).map_err(|e| format!("unexpected SDPA script output: {e}"))?;
    if parsed.results.len() != shapes.len() {
        return Err(format!("the SDPA script answered {} results for {} shapes", parsed.results.len(), shapes.len()));
    }
    Ok(parsed)
}

/// Measure SDPA on `shapes` now, bypassing the cache (the closing comparison: SDPA at the
/// clocks of the end of a run). Results in the order of `shapes`.
pub async fn measure_fresh(cfg: &Config, run_dir: &Path, shapes: &[Shape]) -> Result<Vec<ShapeBaseline>, String> {
    let cmd = command(cfg, run_dir).map_err(|e| format!("cannot write the SDPA script into {}: {e}", run_dir.display()))?;
    let parsed = run_shapes(cfg, &cmd, run_dir, shapes).await?;
    Ok(shapes.iter().zip(&parsed.results).map(|(s, e)| parse_entry(s, e, false)).collect())
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
        let parsed = run_shapes(cfg, &cmd, run_dir, &missing).await?;
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
