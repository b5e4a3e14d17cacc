//! Time-to-best with the scripted worker: when each shape's final best was first reached
//! and the budget spent on candidates that lost by more than 20% or failed before timing,
//! as `status` (text and JSON) and `report` show them, read from a finished run's ledger
//! opened read-only.

mod common;

use std::time::Duration;

use common::Project;
use optimizerd::engine::RunEnd;
use optimizerd::spec::states::Verdict;
use optimizerd::storage::ledger::{time_to_best, Ledger};
use serde_json::json;

const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [1, 2, 4, 8, 16] }

[open_phase]
enabled = false
"#;

/// Baseline 100 us; kv-split: 1 loses by 30% (a >20% loser), 2 does not compile and 4 is
/// wrong (failures before timing), 8 wins everywhere (the final best of the large shape),
/// 16 loses by 10% on the large shape and wins the small one (its final best).
fn rules() -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["#define MAX_SPLITS 1\n"], "behaviour": { "ok": { "us": 130.0 } } },
        { "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "compile_error": { "log": "kernel.cu(12): error: expected a \";\"" } } },
        { "source_contains": ["#define MAX_SPLITS 4\n"], "behaviour": "wrong" },
        { "source_contains": ["#define MAX_SPLITS 8\n"], "behaviour": { "ok": { "us": 40.0 } } },
        { "source_contains": ["#define MAX_SPLITS 16\n"], "behaviour": { "ok": { "us": 44.0, "per_shape": { "b1h1s128d64": 20.0 } } } }
    ])
}

const SMALL: &str = "b1h1s128d64";
const LARGE: &str = "b2h8s512d128-causal";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_report_show_when_each_best_was_reached_and_the_budget_lost_to_losers_and_failures() {
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 500.0 } }));
    p.without_screening(); // the fixture's verdicts include slow kernels that fail in the check
    p.append_config("\n[baseline]\nsdpa_command = \"python3-that-does-not-exist {script}\"\n");
    // Every worker request takes a while, so each candidate is charged a measurable budget.
    p.set_step_delay_ms(30);
    assert_eq!(p.run("ttb", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));

    // A finished run, read as `status` and `report` read it: read-only.
    let ledger = Ledger::open_read_only(&p.db()).await.unwrap();
    let its = ledger.iterations("ttb").await.unwrap();
    let verdicts: Vec<Verdict> = its.iter().map(|i| i.verdict).collect();
    use Verdict::*;
    assert_eq!(verdicts, [Baseline, Rejected, CompileError, Incorrect, Accepted, Accepted]);

    let s = optimizerd::ops::report::status(&ledger, Some("ttb")).await.unwrap();
    let t = &s.time_to_best;
    let used = |seq: i64| its.iter().find(|i| i.seq == seq).and_then(|i| i.used_s);
    // The large shape's final best is #5 (splits 8), the small one's #6 (splits 16): the
    // figures follow the best table and the budget at which those iterations were recorded.
    for b in &s.best {
        let shape = t.shape(&b.shape).unwrap_or_else(|| panic!("no time to best for {}", b.shape));
        assert_eq!(shape.seq, b.seq, "{t:?}");
        assert_eq!(shape.first_reached_best_s, used(b.seq));
    }
    assert_eq!(t.shape(LARGE).map(|x| x.seq), Some(5));
    assert_eq!(t.shape(SMALL).map(|x| x.seq), Some(6));
    // #2 lost by 30%; #6 lost by 10% on one shape but won the other: no loser.
    assert_eq!(t.losers_20pct, 1, "{t:?}");
    assert_eq!(t.failed, 2, "{t:?}");
    assert!(t.budget_s_on_losers_20pct > 0.0 && t.budget_s_on_failed > 0.0, "{t:?}");
    assert!(t.budget_s_on_losers_20pct + t.budget_s_on_failed <= t.budget_s_on_candidates + 1e-9, "{t:?}");
    assert!(t.budget_s_on_candidates <= s.run.used_s + 1e-9, "{t:?} used {}", s.run.used_s);

    // status --json: the names carry their units.
    let j = serde_json::to_value(&s).unwrap();
    let ttb = &j["time_to_best"];
    assert_eq!(ttb["losers_20pct"], 1);
    assert!(ttb["budget_s_on_losers_20pct"].as_f64().is_some() && ttb["budget_s_on_failed"].as_f64().is_some(), "{ttb}");
    let large = ttb["shapes"].as_array().unwrap().iter().find(|x| x["shape"] == LARGE).unwrap();
    assert_eq!(large["first_reached_best_s"].as_f64(), used(5));
    assert_eq!(ttb["definition"], time_to_best::DEFINITION);

    // status text: a `best at` column, the `to best` line and what they mean.
    let text = optimizerd::ops::report::status_text(&s);
    assert!(text.lines().any(|l| l.starts_with("to best") && l.contains("on 1 candidate(s) losing by >20%") && l.contains("on 2 that failed before timing")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("shape") && l.contains("best at")), "{text}");
    assert!(text.contains("losing by >20%: timed, won no shape"), "{text}");

    // The report: a column in the best table and the run's figures with their definition.
    let out = p.path().join("report");
    optimizerd::ops::run_report::write(&ledger, "ttb", &out, None).await.unwrap();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("best reached at") && md.contains("## Time to best"), "{md}");
    assert!(md.contains("| candidates losing by >20% |") && md.contains("| 1 |") && md.contains("| 2 |"), "{md}");
    assert!(md.contains("Failed before timing: timed on no shape"), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<table id=\"time-to-best\">"), "{html}");
}

/// How long loads waited for the compiler: with the look-ahead off every load waits for its
/// build (the scripted worker's `compile_ms`), with it on only those it did not ask for ahead
/// (the run's first); the ledger keeps each iteration's wait, and `status` sums them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_to_best_line_says_how_long_loads_waited_for_the_compiler() {
    let mut waits = Vec::new();
    for lookahead in [false, true] {
        let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 500.0 } }));
        p.without_screening();
        p.append_config("\n[baseline]\nsdpa_command = \"python3-that-does-not-exist {script}\"\n");
        p.set_compile_ms(60);
        if !lookahead {
            let text = std::fs::read_to_string(p.path().join("agent.toml")).unwrap();
            std::fs::write(p.path().join("agent.toml"), text.replace("[worker]\n", "[worker]\nlookahead = false\n")).unwrap();
        }
        assert_eq!(p.run("wait", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
        let ledger = Ledger::open_read_only(&p.db()).await.unwrap();
        let its = ledger.iterations("wait").await.unwrap();
        // Every candidate that reached its load (all but the one that does not compile,
        // which the scripted worker refuses before answering) has its wait recorded.
        let loaded: Vec<f64> = its.iter().filter(|i| i.compile_ms.is_some()).map(|i| i.compile_wait_ms.unwrap()).collect();
        assert_eq!(loaded.len(), 5, "{its:?}");
        if lookahead {
            assert_eq!(loaded.iter().filter(|&&w| w > 0.0).count(), 1, "only the baseline's build was asked for just before its own load: {loaded:?}");
        } else {
            assert!(loaded.iter().all(|&w| w == 60.0), "{loaded:?}");
        }
        let s = optimizerd::ops::report::status(&ledger, Some("wait")).await.unwrap();
        let t = &s.time_to_best;
        let sum: f64 = loaded.iter().sum::<f64>() / 1e3;
        assert!((t.budget_s_waiting_for_compiler - sum).abs() < 1e-9, "{t:?} {loaded:?}");
        let text = optimizerd::ops::report::status_text(&s);
        assert!(text.lines().any(|l| l.starts_with("to best") && l.ends_with("waiting for the compiler")), "{text}");
        waits.push(t.budget_s_waiting_for_compiler);
    }
    assert!(waits[1] < waits[0], "{waits:?}");
}
