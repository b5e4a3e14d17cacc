//! The run loop driven by a scripted worker process: accept, revert (with the git
//! state checked), compile errors, wrong results, CTA mismatches, crashes,
//! timeouts and the budget's end, and what the ledger holds afterwards.

mod common;

use std::time::Duration;

use common::Project;
use optimizerd::engine::RunEnd;
use optimizerd::storage::ledger::Ledger;
use optimizerd::storage::workspace::{Workspace, BEST};
use serde_json::json;

const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "planted-oob-write"
template = "testing/oob_write.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "planted-infinite-loop"
template = "testing/infinite_loop.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [1, 2, 4, 8, 16] }

# These tests are about the plan: the run ends when its stages are done.
[open_phase]
enabled = false
"#;

fn rules() -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["template `test-oob-write`"], "behaviour": { "crash": { "step": "check" } } },
        { "source_contains": ["template `test-infinite-loop`"], "behaviour": { "hang": { "step": "time" } } },
        // kv-split: splits=1 is no faster; 2 fails to compile; 4 is wrong; 8 wins everywhere;
        // 16 wins only on the small shape.
        { "source_contains": ["#define MAX_SPLITS 1\n"], "behaviour": { "ok": { "us": 99.0 } } },
        { "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "compile_error": { "log": "kernel.cu(12): error: expected a \";\"" } } },
        { "source_contains": ["#define MAX_SPLITS 4\n"], "behaviour": "wrong" },
        { "source_contains": ["#define MAX_SPLITS 8\n"], "behaviour": { "ok": { "us": 40.0 } } },
        { "source_contains": ["#define MAX_SPLITS 16\n"], "behaviour": { "ok": { "us": 60.0, "per_shape": { "b1h1s128d64": 20.0 } } } }
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_records_every_outcome_and_keeps_the_workspace_on_best() {
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 500.0 } }));
    p.without_screening();
    let end = p.run("drill", Duration::from_secs(600)).await;
    assert_eq!(end, RunEnd::Finished("plan exhausted".into()));

    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("drill").await.unwrap();
    let verdicts: Vec<(&str, &str)> = its.iter().map(|i| (i.stage.as_str(), i.verdict.as_str())).collect();
    assert_eq!(
        verdicts,
        vec![
            ("baseline", "baseline"),
            ("planted-oob-write", "crashed"),
            ("planted-infinite-loop", "timeout"),
            ("kv-split", "rejected"),
            ("kv-split", "compile_error"),
            ("kv-split", "incorrect"),
            ("kv-split", "accepted"),
            ("kv-split", "accepted"),
        ]
    );
    // The crash says the worker died; the compile error keeps NVRTC's log.
    assert!(its[1].reason.contains("worker died"), "{}", its[1].reason);
    assert!(its[1].error.as_deref().unwrap_or("").contains("signal"), "{:?}", its[1].error);
    assert!(its[2].reason.contains("no answer within"), "{}", its[2].reason);
    assert!(its[4].error.as_deref().unwrap().contains("expected a"));
    assert!(its[5].reason.contains("max_abs"), "{}", its[5].reason);

    // Per-shape: 16 splits only beat 8 splits on the small shape.
    let last = &its[7];
    let won: Vec<&str> = last.shapes.iter().filter(|s| s.won).map(|s| s.shape.as_str()).collect();
    assert_eq!(won, vec!["b1h1s128d64"]);
    let best = ledger.best("drill").await.unwrap();
    let by_shape: Vec<(String, i64, f64)> = best.iter().map(|b| (b.shape.clone(), b.seq, b.median_us)).collect();
    assert_eq!(by_shape.len(), 2);
    assert!(by_shape.iter().any(|(s, seq, us)| s == "b1h1s128d64" && *seq == 8 && (*us - 20.0).abs() < 0.5));
    assert!(by_shape.iter().any(|(s, seq, us)| s == "b2h8s512d128-causal" && *seq == 7 && (*us - 40.0).abs() < 0.5));
    for b in &best {
        let base = b.baseline_us.unwrap();
        assert!((base - 100.0).abs() < 1.0, "baseline time of {}: {base}", b.shape);
    }
    // Speedups vs the incumbent and the baseline are recorded per shape.
    let s7 = its[6].shapes.iter().find(|s| s.shape == "b1h1s128d64").unwrap();
    assert!((s7.speedup_vs_incumbent.unwrap() - 2.5).abs() < 0.05);
    assert!((s7.speedup_vs_baseline.unwrap() - 2.5).abs() < 0.05);
    assert_eq!(s7.check_passed, Some(true));
    assert_eq!(s7.input_sets, Some(1), "the timing's input-set rotation is recorded");
    assert!(s7.ctas.unwrap() > 0 && s7.waves.unwrap() > 0.0);

    // Workspace: HEAD on best, clean, lineage = accepted iterations, rejects kept aside.
    let ws = Workspace::open(&p.workspace("drill")).unwrap();
    assert_eq!(ws.head_ref().unwrap(), BEST);
    assert!(ws.is_clean().unwrap());
    let log = ws.best_log().unwrap();
    assert!(log[0].starts_with("best: iteration 8"), "{log:?}");
    assert!(log.iter().any(|l| l.starts_with("best: iteration 7")));
    assert!(log.iter().any(|l| l.starts_with("best: iteration 1")));
    assert!(!log.iter().any(|l| l.starts_with("iteration 4:")), "a rejected candidate is on best: {log:?}");
    let repo = git2::Repository::open(p.workspace("drill")).unwrap();
    for seq in [2, 3, 4, 5, 6] {
        assert!(repo.refname_to_id(&format!("refs/rejected/{seq}")).is_ok(), "refs/rejected/{seq} missing");
    }
    // `git log best` must not be ambiguous: no path in the workspace is named `best`.
    assert!(!p.workspace("drill").join("best").exists());
    let dispatch: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.workspace("drill").join("kernels/dispatch.json")).unwrap()).unwrap();
    assert_eq!(dispatch["b1h1s128d64"]["iteration"], 8);
    assert_eq!(dispatch["b2h8s512d128-causal"]["iteration"], 7);
    let src = std::fs::read_to_string(p.workspace("drill").join("kernels/b1h1s128d64.cu")).unwrap();
    assert!(src.contains("#define MAX_SPLITS 16"));

    // The run row: finished, device recorded, budget accounted.
    let run = ledger.run(Some("drill")).await.unwrap();
    assert_eq!(run.state.to_string(), "finished");
    assert_eq!(run.iterations, 8);
    assert!(run.gpu_name.unwrap().contains("H100"));
    assert!(run.used_s > 0.0 && run.used_s < 600.0);
    let events = ledger.events("drill").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "worker_restart"));
}

/// A plan of two kv-split candidates, every one of which hangs the worker in its check.
fn hanging_checks() -> Project {
    let plan = r#"
[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4] }

[open_phase]
enabled = false
"#;
    Project::new(plan, json!([]), json!({ "hang": { "step": "check" } }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_ends_the_run_between_iterations() {
    // Every kv-split candidate hangs until its 2 s timeout; a 3 s budget allows two of them.
    let p = hanging_checks();
    let end = p.run("budget", Duration::from_secs(3)).await;
    assert_eq!(end, RunEnd::Finished("budget spent".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("budget").await.unwrap();
    assert_eq!(its.len(), 2, "{:?}", its.iter().map(|i| &i.verdict).collect::<Vec<_>>());
    assert!(its.iter().all(|i| i.verdict.as_str() == "timeout"));
    let run = ledger.run(Some("budget")).await.unwrap();
    assert_eq!(run.state.to_string(), "finished");
    assert_eq!(run.message.as_deref(), Some("budget spent"));
    assert!(ledger.best("budget").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_candidate_waits_no_later_than_the_budgets_end() {
    // worker.check_timeout is 60 s, the budget 3 s: the hung check is given up at the
    // budget's end (5 s at least), not a minute later, and the reason says why so soon.
    let p = hanging_checks();
    let path = p.path().join("agent.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("check_timeout = \"2s\"\n"), "the fixture's [worker] table moved");
    std::fs::write(&path, text.replace("check_timeout = \"2s\"\n", "check_timeout = \"60s\"\n")).unwrap();
    let started = std::time::Instant::now();
    let end = p.run("cut", Duration::from_secs(3)).await;
    let took = started.elapsed();
    assert_eq!(end, RunEnd::Finished("budget spent".into()));
    assert!(took < Duration::from_secs(30), "the run took {took:?}: the 60-s timeout was not cut at the budget's end");
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("cut").await.unwrap();
    assert_eq!(its.len(), 1, "{:?}", its.iter().map(|i| &i.verdict).collect::<Vec<_>>());
    assert_eq!(its[0].verdict.as_str(), "timeout");
    assert!(its[0].reason.contains("no answer within 5s (the budget's end; worker.check_timeout is 1m)"), "{}", its[0].reason);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_whose_ctas_exit_early_is_caught_and_a_sticky_error_restarts_the_worker() {
    let plan = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [8, 16, 32] }

[open_phase]
enabled = false
"#;
    let rules = json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["#define MAX_SPLITS 8\n"], "behaviour": "cta_short" },
        { "source_contains": ["#define MAX_SPLITS 16\n"], "behaviour": { "sticky": { "step": "check" } } },
        { "source_contains": ["#define MAX_SPLITS 32\n"], "behaviour": { "ok": { "us": 50.0 } } }
    ]);
    let p = Project::new(plan, rules, json!({ "ok": { "us": 100.0 } }));
    p.without_screening();
    assert_eq!(p.run("cta", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("cta").await.unwrap();
    let v: Vec<&str> = its.iter().map(|i| i.verdict.as_str()).collect();
    assert_eq!(v, vec!["baseline", "cta_mismatch", "crashed", "accepted"]);
    assert!(its[1].reason.contains("CTAs ran"), "{}", its[1].reason);
    assert!(its[2].reason.contains("ILLEGAL_ADDRESS"), "{}", its[2].reason);
    // After the restart the incumbent was reloaded and timed against the winner.
    let s = &its[3].shapes[0];
    assert!((s.speedup_vs_incumbent.unwrap() - 2.0).abs() < 0.05);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_start_stops_the_run_before_anything_is_recorded() {
    let p = Project::new(PLAN, json!([]), json!({ "ok": { "us": 1.0 } }));
    let config = p.config();
    let mut worker = p.worker();
    worker.args = vec!["worker".into(), "--script".into(), "/nonexistent/script.json".into()];
    let opts = optimizerd::engine::RunOptions {
        plan_path: config.resolve(&config.run.plan),
        config,
        budget: Duration::from_secs(60),
        worker,
        run_id: Some("nostart".into()),
        seed: Some(1),
        mode: optimizerd::engine::Mode::New,
        allow_concurrent: false,
        fresh: false,
        placement: Default::default(),
    };
    let err = optimizerd::engine::run(opts, optimizerd::daemon::shutdown::Shutdown::never()).await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("the GPU is not usable, and nothing was recorded") && msg.contains("worker could not start"), "{msg}");
    assert!(matches!(err.downcast_ref::<optimizerd::engine::SetupError>(), Some(optimizerd::engine::SetupError::NoGpu { .. })), "{msg}");
    assert!(!p.db().exists(), "no ledger made for a run that never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tuning_stage_starts_from_the_best_point_so_far() {
    let plan = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [1, 8] }

[[stage]]
name = "tuning"
template = "kv_split.cu"
search = "evolve"
start_from_best = true
max_candidates = 4

[open_phase]
enabled = false
"#;
    let rules = json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["#define BLOCK_M 32\n", "#define MAX_SPLITS 8\n", "#define NUM_WARPS 4\n"], "behaviour": { "ok": { "us": 40.0 } } },
        { "source_contains": ["#define MAX_SPLITS 1\n"], "behaviour": { "ok": { "us": 90.0 } } }
    ]);
    let p = Project::new(plan, rules, json!({ "ok": { "us": 45.0 } }));
    assert_eq!(p.run("tune", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("tune").await.unwrap();
    let tuning: Vec<&str> = its.iter().filter(|i| i.stage == "tuning").map(|i| i.params_json.as_str()).collect();
    assert_eq!(tuning.len(), 4);
    // kv-split's winner was already measured: tuning goes straight to its neighbours,
    // one or two knobs away.
    let start: serde_json::Value = json!({"BLOCK_M": 32, "MAX_SPLITS": 8, "NUM_WARPS": 4});
    // Nothing kv-split already measured is measured again.
    let measured: Vec<&str> = its.iter().filter(|i| i.stage == "kv-split").map(|i| i.params_json.as_str()).collect();
    assert!(tuning.iter().all(|t| !measured.contains(t)), "tuning re-measured {tuning:?} (kv-split had {measured:?})");
    for t in &tuning {
        let p: serde_json::Value = serde_json::from_str(t).unwrap();
        let changed = ["BLOCK_M", "MAX_SPLITS", "NUM_WARPS"].iter().filter(|k| p[**k] != start[**k]).count();
        assert!((1..=2).contains(&changed), "{t} is not a neighbour of the start");
    }
    let events = ledger.events("tune").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "stage_start" && e.message.starts_with("tuning start {\"BLOCK_M\":32,\"MAX_SPLITS\":8")), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_run_only_when_the_diagnosis_shows_their_symptom() {
    let plan = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [8] }
when = ["under_filled"]

[[stage]]
name = "smaller-tiles"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [16], NUM_WARPS = [4], MAX_SPLITS = [8] }
when = ["spills", "low_occupancy"]

[open_phase]
enabled = false
"#;
    let p = Project::new(plan, json!([]), json!({ "ok": { "us": 50.0 } }));
    assert_eq!(p.run("diag", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let stages: Vec<String> = ledger.iterations("diag").await.unwrap().iter().map(|i| i.stage.clone()).collect();
    assert_eq!(stages, vec!["baseline", "kv-split"]);
    let events = ledger.events("diag").await.unwrap();
    let diagnoses: Vec<serde_json::Value> =
        events.iter().filter(|e| e.kind.as_str() == "diagnosis").map(|e| serde_json::from_str(&e.message).unwrap()).collect();
    assert_eq!(diagnoses.len(), 2);
    // The baseline's 32 CTAs on (1,1,128,64) cannot fill 132 SMs: kv-split runs.
    assert_eq!(diagnoses[0]["stage"], "kv-split");
    assert_eq!(diagnoses[0]["run"], true);
    assert!(diagnoses[0]["findings"].as_array().unwrap().iter().any(|f| f["symptom"] == "under_filled"
        && f["shape"] == "b1h1s128d64" && f["detail"].as_str().unwrap().contains("32 CTAs for 132 SMs")));
    // The scripted kernels spill nothing and keep 4 blocks of 128 threads (16 warps) per SM.
    assert_eq!(diagnoses[1]["stage"], "smaller-tiles");
    assert_eq!(diagnoses[1]["run"], false);
    assert_eq!(diagnoses[1]["figures"][0]["local_bytes"], 0);
    assert!(events.iter().any(|e| e.kind.as_str() == "stage_not_needed" && e.message.starts_with("smaller-tiles: not needed")));
}
