//! Sliding-window attention on the CPU (scripted worker): a workload of Gemma-style local
//! layers (a causal `window`) beside a shape without one. The baseline and the templates
//! whose spec says `windows = true` plan the windowed shapes; a stage whose template does
//! not implement the window runs on the other shapes only, or is skipped saying why; the
//! window reaches the kernel ABI's plans and the ledger's keys.

mod common;

use std::time::Duration;

use common::{h100, Project};
use optimizerd::engine::RunEnd;
use optimizerd::pipeline::gate;
use optimizerd::spec::protocol::{DType, Layout, Shape};
use optimizerd::spec::template::Template;
use optimizerd::storage::ledger::Ledger;
use serde_json::json;

fn template(file: &str) -> Template {
    Template::load(&common::repo_root().join("kernel-templates"), file)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Baseline, the decode template, and the Hopper prefill template (no window in it yet).
const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "decode"
template = "decode.cu"
search = "exhaustive"
space = { BLOCK_N = [16], NUM_WARPS = [4], STAGES = [3], SPLIT_WAVES = [1], MIN_SPLIT_TILES = [2], FUSED_COMBINE = [0, 1], WARP_LOADS = [0], M_TILES = [1], K_FIRST = [0] }

[[stage]]
name = "hopper"
template = "wgmma_tma.cu"
search = "exhaustive"
max_candidates = 1

[open_phase]
enabled = false
"#;

/// Gemma-3-style local layers: decode and prefill with a 1024-key window, and the global
/// layers' decode without one.
const GEMMA: &str = "shapes = [ { b = 4, hq = 8, hkv = 4, sq = 1, sk = 8192, d = 128, causal = true, window = 1024 }, \
     { b = 4, hq = 8, hkv = 4, sq = 1, sk = 8192, d = 128, causal = true }, \
     { b = 1, hq = 8, hkv = 4, s = 4096, d = 128, causal = true, window = 1024 } ]";

#[test]
fn the_gate_plans_a_window_only_on_templates_that_implement_it() {
    let local = Shape {
        b: 4,
        hq: 8,
        hkv: 4,
        sq: 1,
        sk: 8192,
        d: 128,
        causal: true,
        window: Some(1024),
        dtype: DType::Bf16,
        layout: Layout::Bhsd,
    };
    let global = Shape {
        window: None,
        ..local
    };
    for file in [
        "baseline.cu",
        "decode.cu",
        "decode_cluster.cu",
        "wgmma_tma.cu",
    ] {
        let t = template(file);
        let each = gate::check_each(&t, &t.default_params(), &[local, global], &h100(), "1")
            .unwrap_or_else(|e| panic!("{file}: {}", e.0));
        let why = each
            .refused
            .iter()
            .find(|(k, _)| k == &local.key())
            .map(|(_, why)| why.clone());
        if t.meta.windows {
            assert_eq!(why, None, "{file}");
            let plan = each
                .plans
                .iter()
                .find(|p| p.shape == local)
                .unwrap_or_else(|| panic!("{file}: no plan for the window"));
            assert_eq!(
                plan.shape.abi_window(),
                1024,
                "{file}: the plan carries the window to the ABI"
            );
        } else {
            let why =
                why.unwrap_or_else(|| panic!("{file} has no `windows` and must refuse the window"));
            assert!(
                why.contains("does not implement a sliding window")
                    && why.contains("window = 1024"),
                "{file}: {why}"
            );
            assert!(
                each.plans.iter().all(|p| p.shape.window.is_none()),
                "{file}"
            );
        }
    }
    assert!(
        template("baseline.cu").meta.windows,
        "the run's first candidate serves every shape, windows included"
    );
}

fn rules() -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["template `decode-split`"], "behaviour": { "ok": { "us": 10.0 } } }
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_windowed_workload_runs_each_stage_on_the_shapes_its_template_serves() {
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 50.0 } }));
    p.set_workload(GEMMA);
    assert_eq!(
        p.run("gemma", Duration::from_secs(600)).await,
        RunEnd::Finished("plan exhausted".into())
    );
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("gemma").await.unwrap();
    let keys = |stage: &str| -> Vec<Vec<String>> {
        its.iter()
            .filter(|i| i.stage == stage)
            .map(|i| {
                i.shapes
                    .iter()
                    .filter(|s| s.gated.is_none())
                    .map(|s| s.shape.clone())
                    .collect()
            })
            .collect()
    };
    assert_eq!(
        keys("baseline"),
        [[
            "b4hq8hkv4sq1sk8192d128-causal-w1024",
            "b4hq8hkv4sq1sk8192d128-causal",
            "b1hq8hkv4s4096d128-causal-w1024"
        ]],
        "the baseline serves every shape"
    );
    let decode = keys("decode");
    assert_eq!(decode.len(), 2, "both points of the decode stage");
    for k in &decode {
        assert_eq!(
            k,
            &[
                "b4hq8hkv4sq1sk8192d128-causal-w1024",
                "b4hq8hkv4sq1sk8192d128-causal"
            ],
            "decode.cu serves the windowed decode too"
        );
    }
    // The decode kernels win both decode shapes; the windowed prefill keeps the baseline
    // unless the Hopper template serves windows.
    let best = ledger.best("gemma").await.unwrap();
    assert_eq!(best.len(), 3);
    for b in &best {
        let it = its.iter().find(|i| i.seq == b.seq).unwrap();
        if b.shape.contains("sq1") {
            assert_eq!(it.stage, "decode", "{}", b.shape);
        }
    }
    // A run with a windowed shape builds the window's code (a run without leaves it out:
    // open_phase.rs, builds_hold_the_head_dims_of_the_run_and_no_others).
    let log = std::fs::read_to_string(p.path().join("runs/gemma/worker.log")).unwrap();
    let loads: Vec<&str> = log.lines().filter(|l| l.contains("scripted worker: load ")).collect();
    assert!(!loads.is_empty() && loads.iter().all(|l| l.ends_with("head dims [128]")), "{loads:?}");
    // A template without the window never sees the windowed shapes: not offered, not gated.
    if !template("wgmma_tma.cu").meta.windows {
        let hopper: Vec<_> = its.iter().filter(|i| i.stage == "hopper").collect();
        assert!(
            !hopper.is_empty(),
            "the hopper stage runs on the shape without a window"
        );
        for it in hopper {
            let keys: Vec<&str> = it.shapes.iter().map(|s| s.shape.as_str()).collect();
            assert!(
                keys.iter().all(|k| !k.contains("-w1024")),
                "iteration {}: {keys:?}",
                it.seq
            );
        }
    }
}

/// A workload of windowed shapes only: a stage whose template lacks the window is skipped,
/// and the event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_whose_template_lacks_the_window_is_skipped_saying_so() {
    if template("wgmma_tma.cu").meta.windows {
        return;
    }
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 50.0 } }));
    p.set_workload(
        "shapes = [ { b = 1, hq = 8, hkv = 4, s = 4096, d = 128, causal = true, window = 1024 } ]",
    );
    assert_eq!(
        p.run("local", Duration::from_secs(600)).await,
        RunEnd::Finished("plan exhausted".into())
    );
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let events = ledger.events("local").await.unwrap();
    let skipped: Vec<&String> = events
        .iter()
        .filter(|e| e.kind.as_str() == "stage_skipped")
        .map(|e| &e.message)
        .collect();
    assert!(
        skipped
            .iter()
            .any(|m| m.contains("stage hopper skipped (wgmma_tma.cu)")
                && m.contains("sliding window")),
        "{skipped:?}"
    );
}
