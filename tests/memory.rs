//! Memory across runs (scripted worker, real SQLite, git and templates): a second run on
//! the same kind of GPU warm-starts from the first run's best kernels, re-checked and
//! re-timed first, and skips the sources already measured; `--fresh` ignores the memory;
//! a remembered kernel that is now incorrect or slower, or whose template changed, is not
//! trusted and its points are measured again; another kind of GPU remembers nothing.

mod common;

use std::time::Duration;

use common::Project;
use optimizerd::engine::RunEnd;
use optimizerd::storage::ledger::{IterationRecord, Ledger};
use serde_json::json;

fn plan() -> String {
    common::kv_split_plan("1, 2, 4, 8")
}

const BEST: &str = "#define MAX_SPLITS 8\n";

fn rules(best: serde_json::Value) -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": [BEST], "behaviour": best }
    ])
}

fn project() -> Project {
    Project::new(&plan(), rules(json!({ "ok": { "us": 20.0 } })), json!({ "ok": { "us": 50.0 } }))
}

async fn iterations(p: &Project, run: &str) -> Vec<IterationRecord> {
    Ledger::open(&p.db()).await.unwrap().iterations(run).await.unwrap()
}

fn verdicts(its: &[IterationRecord]) -> Vec<(String, String)> {
    its.iter().map(|i| (i.stage.clone(), i.verdict.to_string())).collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

async fn best_us(p: &Project, run: &str) -> Vec<(String, f64)> {
    Ledger::open(&p.db()).await.unwrap().best(run).await.unwrap().into_iter().map(|b| (b.shape, b.median_us)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_warm_starts_from_the_best_kernels_and_skips_what_was_measured() {
    let p = project();
    assert_eq!(p.run("one", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    assert_eq!(iterations(&p, "one").await.len(), 5);
    assert_eq!(p.run("two", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));

    let its = iterations(&p, "two").await;
    // First the remembered best (one kernel serves both shapes), re-checked and re-timed on
    // this run; then every plan point is answered by the memory instead of the GPU.
    assert_eq!(
        verdicts(&its),
        pairs(&[("warm-start", "baseline"), ("baseline", "remembered"), ("kv-split", "remembered"), ("kv-split", "remembered"), ("kv-split", "remembered"), ("kv-split", "remembered")])
    );
    assert!(its[0].params_json.contains("\"MAX_SPLITS\":8"), "{}", its[0].params_json);
    assert_eq!(its[0].shapes.iter().filter(|s| s.check_passed == Some(true) && s.median_us == Some(20.0)).count(), 2);
    assert!(its[1].reason.contains("b1h1s128d64 100.00 us (run one #1)"), "{}", its[1].reason);
    assert!((its[1].score_us.unwrap() - 100.0).abs() < 1e-9, "{:?}", its[1].score_us);
    assert!(its[1..].iter().all(|i| i.shapes.is_empty() && i.compile_ms.is_none()), "remembered points are not run");
    assert_eq!(best_us(&p, "two").await, best_us(&p, "one").await);

    let ledger = Ledger::open(&p.db()).await.unwrap();
    let events = ledger.events("two").await.unwrap();
    let memory = events.iter().find(|e| e.kind.as_str() == "memory").expect("a memory event");
    assert!(memory.message.contains("warm start: best kernels remembered for 2 shape(s) from run(s) one"), "{}", memory.message);
    let text = optimizerd::ops::report::history_text(&its);
    assert!(text.contains("warm-start") && text.contains("remembered"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_ignores_the_memory() {
    let p = project();
    p.run("one", Duration::from_secs(600)).await;
    assert_eq!(p.run_with("fresh", Duration::from_secs(600), true).await, RunEnd::Finished("plan exhausted".into()));
    let its = iterations(&p, "fresh").await;
    assert_eq!(verdicts(&its), verdicts(&iterations(&p, "one").await));
    assert!(its.iter().all(|i| i.stage != "warm-start" && i.verdict.as_str() != "remembered"));
    let events = Ledger::open(&p.db()).await.unwrap().events("fresh").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "memory" && e.message.contains("--fresh")), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_kernel_that_is_now_incorrect_is_not_trusted() {
    let p = project();
    p.run("one", Duration::from_secs(600)).await;
    p.set_rules(rules(json!("wrong")));
    assert_eq!(p.run("two", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = iterations(&p, "two").await;
    // The re-check fails: both shapes are stale, so the whole plan is measured again (the
    // now-wrong kernel, slower than the new incumbent, is screened out before its check).
    assert_eq!(
        verdicts(&its),
        pairs(&[("warm-start", "incorrect"), ("baseline", "baseline"), ("kv-split", "accepted"), ("kv-split", "rejected"), ("kv-split", "rejected"), ("kv-split", "rejected_early")])
    );
    let events = Ledger::open(&p.db()).await.unwrap().events("two").await.unwrap();
    let stale: Vec<&String> = events.iter().filter(|e| e.kind.as_str() == "memory_stale").map(|e| &e.message).collect();
    assert_eq!(stale.len(), 2, "{stale:?}");
    assert!(stale[0].contains("b1h1s128d64: remembered kernel (run one #5) is now incorrect"), "{stale:?}");
    assert_eq!(best_us(&p, "two").await.iter().map(|(_, us)| *us).collect::<Vec<_>>(), [50.0, 50.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_kernel_that_is_now_slower_is_measured_again_for_that_shape_only() {
    let p = project();
    p.run("one", Duration::from_secs(600)).await;
    // Now 2.5x slower on the small shape (20 -> 50 us), unchanged on the other.
    p.set_rules(rules(json!({ "ok": { "us": 20.0, "per_shape": { "b1h1s128d64": 50.0 } } })));
    p.run("two", Duration::from_secs(600)).await;
    let its = iterations(&p, "two").await;
    assert_eq!(its[0].stage, "warm-start");
    // The small shape is stale, so no plan point is answered by the memory (each covers both shapes).
    assert!(its[1..].iter().all(|i| i.verdict.as_str() != "remembered"), "{:?}", verdicts(&its));
    let events = Ledger::open(&p.db()).await.unwrap().events("two").await.unwrap();
    let stale: Vec<&String> = events.iter().filter(|e| e.kind.as_str() == "memory_stale").map(|e| &e.message).collect();
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert!(stale[0].contains("b1h1s128d64: remembered 20.00 us (run one #5), now 50.00 us"), "{stale:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_template_or_another_gpu_is_measured_again() {
    // Another kind of GPU (fewer SMs): nothing remembered.
    let p = project();
    p.run("one", Duration::from_secs(600)).await;
    let mut other = common::h100();
    other.sm_count = 114;
    p.set_device(&other);
    p.run("pcie", Duration::from_secs(600)).await;
    let its = iterations(&p, "pcie").await;
    assert!(its.iter().all(|i| i.stage != "warm-start" && i.verdict.as_str() != "remembered"), "{:?}", verdicts(&its));
    let events = Ledger::open(&p.db()).await.unwrap().events("pcie").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "memory" && e.message.contains("nothing remembered")), "{events:?}");

    // The same GPU, but kv_split.cu's source changed: a new hash, so its remembered best is
    // not re-used; the baseline template is unchanged and stays remembered.
    let q = project();
    q.run("one", Duration::from_secs(600)).await;
    let templates = q.path().join("templates");
    copy_dir(&common::repo_root().join("kernel-templates"), &templates);
    let kv = templates.join("kv_split.cu");
    let text = std::fs::read_to_string(&kv).unwrap();
    std::fs::write(&kv, format!("{text}\n// edited after run one\n")).unwrap();
    let config = std::fs::read_to_string(q.path().join("agent.toml")).unwrap();
    let config: String = config
        .lines()
        .map(|l| if l.starts_with("templates_dir") { format!("templates_dir = \"{}\"", templates.display()) } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(q.path().join("agent.toml"), config).unwrap();
    q.run("edited", Duration::from_secs(600)).await;
    let its = iterations(&q, "edited").await;
    assert!(its.iter().all(|i| i.stage != "warm-start"), "{:?}", verdicts(&its));
    assert_eq!(its.iter().filter(|i| i.verdict.as_str() == "remembered").count(), 0, "no incumbent yet when the baseline comes: {:?}", verdicts(&its));
    let events = Ledger::open(&q.db()).await.unwrap().events("edited").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "memory_stale" && e.message.contains("changed since")), "{events:?}");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let e = entry.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Grouped-query, decode and layout are part of what a run and its memory are keyed by: a
/// GQA decode workload runs through the plan with its own shape keys, a second run warm-starts
/// from it, and the same heads in the other layout (or with another KV head count) are new
/// shapes that nothing is remembered for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gqa_decode_shapes_are_run_and_remembered_by_their_own_keys() {
    let p = project();
    p.set_workload(
        "shapes = [ { b = 8, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true }, \
         { b = 1, hq = 32, hkv = 8, sq = 512, sk = 2048, d = 128, causal = true } ]",
    );
    assert_eq!(p.run("gqa", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = iterations(&p, "gqa").await;
    let keys: std::collections::BTreeSet<String> = its.iter().flat_map(|i| i.shapes.iter().map(|s| s.shape.clone())).collect();
    assert_eq!(
        keys.into_iter().collect::<Vec<_>>(),
        ["b1hq32hkv8sq512sk2048d128-causal", "b8hq32hkv8sq1sk4096d128-causal"],
    );
    // What the worker was sent is the v2 shape: the stored JSON reads back with its GQA fields.
    let stored: optimizerd::spec::protocol::Shape = serde_json::from_str(&its[0].shapes[0].shape_json).unwrap();
    assert_eq!((stored.hq, stored.hkv), (32, 8));
    assert_eq!(best_us(&p, "gqa").await.len(), 2);

    assert_eq!(p.run("again", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let again = iterations(&p, "again").await;
    assert_eq!(again[0].stage, "warm-start", "{:?}", verdicts(&again));

    // The same problem in [B,S,H,D], and the decode shape with MQA: new keys, no memory.
    p.set_workload(
        "layout = \"bshd\"\nshapes = [ { b = 8, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true }, \
         { b = 8, hq = 32, hkv = 1, sq = 1, sk = 4096, d = 128, causal = true } ]",
    );
    assert_eq!(p.run("bshd", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let bshd = iterations(&p, "bshd").await;
    assert!(bshd.iter().all(|i| i.stage != "warm-start" && i.verdict.as_str() != "remembered"), "{:?}", verdicts(&bshd));
    let keys: std::collections::BTreeSet<String> = bshd.iter().flat_map(|i| i.shapes.iter().map(|s| s.shape.clone())).collect();
    assert!(keys.contains("b8hq32hkv8sq1sk4096d128-causal-bshd") && keys.contains("b8hq32hkv1sq1sk4096d128-causal-bshd"), "{keys:?}");
}
