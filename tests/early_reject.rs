//! Early rejection through the run loop (scripted worker, real SQLite and git): a compiled
//! candidate is first timed briefly beside the incumbent on one shape per class; far
//! slower on every class, it is recorded `rejected_early` with both times and is neither
//! checked nor timed in full. A close loser still gets the full timing, and `timing.early_reject = 0`
//! turns the screen off.

mod common;

use std::time::Duration;

use common::Project;
use optimizerd::spec::states::Verdict;
use optimizerd::storage::ledger::{IterationRecord, Ledger};
use serde_json::json;

fn plan() -> String {
    common::kv_split_plan("1, 2, 8")
}

/// The baseline takes 100 us on both shapes; kv-split is 10% slower with one split, 3x
/// slower with eight, and 3x slower on one class but faster on the other with two.
fn rules() -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["#define MAX_SPLITS 1\n"], "behaviour": { "ok": { "us": 110.0 } } },
        { "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "ok": { "us": 300.0, "per_shape": { "b1h1s128d64": 50.0 } } } },
        { "source_contains": ["#define MAX_SPLITS 8\n"], "behaviour": { "ok": { "us": 300.0 } } }
    ])
}

fn with_splits(its: &[IterationRecord], n: i64) -> &IterationRecord {
    its.iter().find(|i| i.template == "kv-split" && i.params_json.contains(&format!("\"MAX_SPLITS\":{n}"))).expect("the plan ran that point")
}

/// Samples the scripted worker took per kernel: rounds x samples_per_round of the request.
const FULL_SAMPLES: i64 = 2 * 5;
const BRIEF_SAMPLES: i64 = 2 * 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_far_slower_on_every_class_is_rejected_after_a_brief_timing() {
    let p = Project::new(&plan(), rules(), json!({ "ok": { "us": 100.0 } }));
    p.run("early", Duration::from_secs(600)).await;
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("early").await.unwrap();

    // 3x slower on both classes: rejected early, both numbers kept, no full timing.
    let hopeless = with_splits(&its, 8);
    assert_eq!(hopeless.verdict, Verdict::RejectedEarly, "{}", hopeless.reason);
    // (Two splits ran before and became the small shape's incumbent at 50 us.)
    assert!(hopeless.reason.contains("b2h8s512d128-causal 299.70 us vs the incumbent's 99.90 us (3.00x slower)"), "{}", hopeless.reason);
    assert!(hopeless.reason.contains("b1h1s128d64 299.70 us vs the incumbent's 49.95 us (6.00x slower)"), "{}", hopeless.reason);
    assert!(hopeless.reason.contains("timing.early_reject = 0.25"), "{}", hopeless.reason);
    assert_eq!(hopeless.score_us, None, "no class score without the full timing");
    assert!(hopeless.time_ms.is_some(), "the brief timing's cost is recorded");
    assert_eq!(hopeless.check_ms, None, "not checked");
    assert!(hopeless.shapes.iter().all(|s| s.check_passed.is_none()), "no check result: never remembered as correct");
    assert_eq!(hopeless.shapes.len(), 2);
    for s in &hopeless.shapes {
        assert_eq!(s.samples, Some(BRIEF_SAMPLES), "{}: timed briefly", s.shape);
        let incumbent = if s.shape == "b1h1s128d64" { 50.0 } else { 100.0 };
        assert_eq!((s.median_us.map(f64::round), s.incumbent_us.map(f64::round)), (Some(300.0), Some(incumbent)), "{}", s.shape);
        assert!(!s.won);
    }

    // 10% slower: within the margin, so it is timed in full and rejected as usual.
    let close = with_splits(&its, 1);
    assert_eq!(close.verdict, Verdict::Rejected, "{}", close.reason);
    assert!(close.shapes.iter().all(|s| s.samples == Some(FULL_SAMPLES)), "{:?}", close.shapes);

    // Hopeless on one class but 2x faster on the other: timed in full, and it wins there.
    let mixed = with_splits(&its, 2);
    assert_eq!(mixed.verdict, Verdict::Accepted, "{}", mixed.reason);
    assert!(mixed.shapes.iter().all(|s| s.samples == Some(FULL_SAMPLES)), "{:?}", mixed.shapes);

    // The samples behind each full timing's decision are in the ledger, in the order taken,
    // and re-judging them reproduces what was recorded (min_gain: the default, 0.02).
    for s in close.shapes.iter().chain(&mixed.shapes) {
        let v: serde_json::Value = serde_json::from_str(s.timing_samples.as_deref().expect("samples recorded")).unwrap();
        let series = |k: &str| -> Vec<f64> { v[k].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
        let (cand, inc) = (series("candidate"), series("incumbent"));
        assert_eq!((cand.len() as i64, inc.len() as i64), (FULL_SAMPLES, FULL_SAMPLES), "{}", s.shape);
        let d = optimizerd::pipeline::decide::decide_samples(&cand, &inc, 0.02).unwrap();
        assert_eq!((Some(d.speedup), Some(d.threshold), d.wins), (s.speedup_vs_incumbent, s.threshold, s.won), "{}", s.shape);
    }
    assert!(hopeless.shapes.iter().all(|s| s.timing_samples.is_none()), "the screen's brief timing keeps only its summary");

    // The baseline had no incumbent to be screened against.
    let first = its.iter().find(|i| i.template == "baseline").unwrap();
    assert_eq!(first.verdict, Verdict::Baseline);

    // Time-to-best counts the early rejection among the losers by more than 20%.
    let ttb = optimizerd::storage::ledger::time_to_best::compute(&its);
    assert!(ttb.losers_20pct >= 1, "{ttb:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_reject_zero_times_every_candidate_in_full() {
    let p = Project::new(&plan(), rules(), json!({ "ok": { "us": 100.0 } }));
    let path = p.path().join("agent.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace("samples_per_round = 5\n", "samples_per_round = 5\nearly_reject = 0\n");
    std::fs::write(&path, text).unwrap();
    p.run("full", Duration::from_secs(600)).await;
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("full").await.unwrap();
    assert!(its.iter().all(|i| i.verdict != Verdict::RejectedEarly));
    let hopeless = with_splits(&its, 8);
    assert_eq!(hopeless.verdict, Verdict::Rejected, "{}", hopeless.reason);
    assert!(hopeless.shapes.iter().all(|s| s.samples == Some(FULL_SAMPLES)), "{:?}", hopeless.shapes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_the_screen_is_the_candidates_and_the_run_goes_on() {
    let mut r = rules();
    r.as_array_mut().unwrap().insert(0, json!({ "source_contains": ["#define MAX_SPLITS 8\n"], "behaviour": { "crash": { "step": "time" } } }));
    let p = Project::new(&plan(), r, json!({ "ok": { "us": 100.0 } }));
    p.run("crash", Duration::from_secs(600)).await;
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("crash").await.unwrap();
    let crashed = with_splits(&its, 8);
    assert_eq!(crashed.verdict, Verdict::Crashed, "{}", crashed.reason);
    assert_eq!(crashed.check_ms, None, "it crashed in the screen, before any check");
    // The others were judged as without the crash.
    assert_eq!(with_splits(&its, 2).verdict, Verdict::Accepted);
    assert_eq!(with_splits(&its, 1).verdict, Verdict::Rejected);
}
