//! Transfer across shapes (scripted worker, real SQLite, git and templates): a run whose
//! shapes nothing is remembered for tries first the best kernels that earlier runs on this
//! kind of GPU found for the most similar shapes (stage `transfer`), re-checked and re-timed
//! like any candidate; an incorrect or slow one just loses; nothing transfers across head
//! dims, causality, GQA ratios or regimes, but fp16 transfers to bf16; a resumed run replays
//! its transfers instead of running them again.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use common::Project;
use optimizerd::engine::RunEnd;
use optimizerd::storage::ledger::{IterationRecord, Ledger};
use serde_json::json;

fn plan() -> String {
    common::kv_split_plan("1, 2, 4, 8")
}

/// Run one's shapes (fp16, the project's default): the small one is best with 8 splits
/// (iteration 5), the causal one with 4 (iteration 4).
const SMALL: &str = "b1h1s128d64";
const CAUSAL: &str = "b2h8s512d128-causal";
/// Run two's (bf16): near SMALL and near CAUSAL, no exact match.
const SMALL2: &str = "b1h1s256d64-bf16";
const CAUSAL2: &str = "b4h8s1024d128-causal-bf16";
const WORKLOAD2: &str = "shapes = [ { b = 1, h = 1, s = 256, d = 64 }, { b = 4, h = 8, s = 1024, d = 128, causal = true } ]";

fn splits(n: u32) -> String {
    format!("#define MAX_SPLITS {n}\n")
}

/// What the worker answers: `four` and `eight` for the kernels with 4 and 8 splits.
fn rules(four: serde_json::Value, eight: serde_json::Value) -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": [splits(4)], "behaviour": four },
        { "source_contains": [splits(8)], "behaviour": eight }
    ])
}

fn fast_on(us: f64, shapes: &[&str]) -> serde_json::Value {
    let per: serde_json::Map<String, serde_json::Value> = shapes.iter().map(|s| (s.to_string(), json!(us))).collect();
    json!({ "ok": { "us": 50.0, "per_shape": per } })
}

/// A project with run one recorded: fp16, 8 splits best for SMALL, 4 for CAUSAL.
async fn remembered() -> Project {
    let p = Project::new(&plan(), rules(fast_on(15.0, &[CAUSAL]), fast_on(20.0, &[SMALL])), json!({ "ok": { "us": 50.0 } }));
    assert_eq!(p.run("one", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let best = Ledger::open(&p.db()).await.unwrap().best("one").await.unwrap();
    let seqs: Vec<(String, i64)> = best.into_iter().map(|b| (b.shape, b.seq)).collect();
    assert_eq!(seqs, [(SMALL.to_string(), 5), (CAUSAL.to_string(), 4)]);
    p
}

/// Switch the project to run two's workload: bf16, other sizes.
fn second_workload(p: &Project) {
    p.set_workload(WORKLOAD2);
    let path = p.path().join("agent.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(path, text.replace("dtype = \"fp16\"", "dtype = \"bf16\"")).unwrap();
}

async fn iterations(p: &Project, run: &str) -> Vec<IterationRecord> {
    Ledger::open(&p.db()).await.unwrap().iterations(run).await.unwrap()
}

fn shapes_of(it: &IterationRecord) -> Vec<String> {
    it.shapes.iter().map(|s| s.shape.clone()).collect()
}

async fn best(p: &Project, run: &str) -> Vec<(String, i64, f64)> {
    Ledger::open(&p.db()).await.unwrap().best(run).await.unwrap().into_iter().map(|b| (b.shape, b.seq, b.median_us)).collect()
}

async fn memory_events(p: &Project, run: &str) -> Vec<String> {
    let events = Ledger::open(&p.db()).await.unwrap().events(run).await.unwrap();
    events.into_iter().filter(|e| e.kind.as_str() == "memory").map(|e| e.message).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_similar_workload_starts_from_the_nearest_remembered_shapes_best_kernels() {
    let p = remembered().await;
    second_workload(&p);
    p.set_rules(rules(fast_on(12.0, &[CAUSAL2]), fast_on(18.0, &[SMALL2])));
    assert_eq!(p.run("two", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = iterations(&p, "two").await;

    // First the transferred kernels, each on the shape it was transferred to (the two shapes
    // are in different classes), rendered for bf16; then the whole plan, as nothing of these
    // exact shapes is remembered.
    let stages: Vec<&str> = its.iter().map(|i| i.stage.as_str()).collect();
    assert_eq!(stages, ["transfer", "transfer", "baseline", "kv-split", "kv-split", "kv-split", "kv-split"]);
    // Each transferred iteration's reason says where its configuration came from.
    for it in its.iter().filter(|i| i.stage == "transfer") {
        assert!(it.reason.starts_with("transfer: ") && it.reason.contains(" <- ") && it.reason.contains("(run one #"), "{}", it.reason);
    }
    assert!(its[0].params_json.contains("\"MAX_SPLITS\":8"), "{}", its[0].params_json);
    assert_eq!(shapes_of(&its[0]), [SMALL2]);
    assert!(its[1].params_json.contains("\"MAX_SPLITS\":4"), "{}", its[1].params_json);
    assert_eq!(shapes_of(&its[1]), [CAUSAL2]);
    assert!(its[..2].iter().all(|i| i.verdict.is_final() && i.shapes.iter().all(|s| s.check_passed == Some(true))));
    // The transferred kernels stay the best: the plan measures them again, and finds nothing faster.
    let b = best(&p, "two").await;
    assert_eq!(b, [(SMALL2.to_string(), 1, 18.0), (CAUSAL2.to_string(), 2, 12.0)]);

    // The memory event names what came from where; history shows the stage.
    let mem = memory_events(&p, "two").await;
    let transfer = mem.iter().find(|m| m.starts_with("transfer:")).unwrap_or_else(|| panic!("{mem:?}"));
    assert!(transfer.contains(&format!("{SMALL2} <- {SMALL} (run one #5)")), "{transfer}");
    assert!(transfer.contains(&format!("{CAUSAL2} <- {CAUSAL} (run one #4)")), "{transfer}");
    let text = optimizerd::ops::report::history_text(&its);
    assert!(text.lines().nth(1).unwrap().contains("transfer"), "{text}");
    let json = serde_json::to_value(&its).unwrap();
    assert_eq!(json[0]["stage"], "transfer");

    // A plan may not name a stage `transfer`.
    let bad = plan().replace("name = \"baseline\"", "name = \"transfer\"");
    let err = optimizerd::strategy::plan::Plan::parse(&PathBuf::from("p.toml"), &bad, &common::repo_root().join("kernel-templates")).unwrap_err().to_string();
    assert!(err.contains("the stage name `transfer` is reserved"), "{err}");
}

/// A configuration remembered before its template gained a knob (here: recorded without
/// NUM_WARPS, whose first value it ran with) still transfers, with the knob at its first value,
/// and is named so in the new run's ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_remembered_before_a_knob_was_added_still_transfers() {
    let p = remembered().await;
    {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new().filename(p.db()).connect().await.unwrap();
        let done = sqlx::query("UPDATE iterations SET params_json = json_remove(params_json, '$.NUM_WARPS') WHERE run_id = 'one' AND template = 'kv-split'")
            .execute(&mut conn)
            .await
            .unwrap();
        assert!(done.rows_affected() >= 4);
    }
    second_workload(&p);
    p.set_rules(rules(fast_on(12.0, &[CAUSAL2]), fast_on(18.0, &[SMALL2])));
    assert_eq!(p.run("two", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = iterations(&p, "two").await;
    let transfers: Vec<&IterationRecord> = its.iter().filter(|i| i.stage == "transfer").collect();
    assert_eq!(transfers.len(), 2, "{:?}", its.iter().map(|i| (&i.stage, &i.params_json)).collect::<Vec<_>>());
    assert!(transfers.iter().all(|i| i.params_json.contains("\"NUM_WARPS\":4") && i.verdict.is_final()), "{:?}", transfers);
    assert!(transfers[0].params_json.contains("\"MAX_SPLITS\":8"), "{}", transfers[0].params_json);
    let mem = memory_events(&p, "two").await;
    let transfer = mem.iter().find(|m| m.starts_with("transfer:")).unwrap_or_else(|| panic!("{mem:?}"));
    assert!(!transfer.contains("not transferred"), "{transfer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incorrect_or_slow_transferred_kernel_loses_and_the_plan_proceeds() {
    let p = remembered().await;
    second_workload(&p);
    // Eight splits are now wrong, four slow (200 us): the plan's 1 and 2 splits (50 us) win.
    p.set_rules(rules(json!({ "ok": { "us": 200.0 } }), json!("wrong")));
    assert_eq!(p.run("two", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = iterations(&p, "two").await;
    assert_eq!((its[0].stage.as_str(), its[0].verdict.as_str()), ("transfer", "incorrect"));
    assert_eq!(its[1].stage, "transfer");
    assert!(its[2..].iter().all(|i| i.stage != "transfer"));
    assert!(its.iter().any(|i| i.stage == "kv-split"), "the plan proceeds");
    let b = best(&p, "two").await;
    assert!(b.iter().all(|(_, seq, us)| *seq > 2 && *us == 50.0), "{b:?}");
    // Transfer marks nothing stale.
    let events = Ledger::open(&p.db()).await.unwrap().events("two").await.unwrap();
    assert!(!events.iter().any(|e| e.kind.as_str() == "memory_stale"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_transfers_across_head_dims_causality_gqa_ratios_or_regimes() {
    let p = remembered().await;
    // Each shape is like one of run one's but for one of the required properties (and unlike the other).
    p.set_workload(
        "shapes = [ { b = 1, h = 1, s = 128, d = 64, causal = true }, { b = 1, h = 1, s = 128, d = 128 }, \
         { b = 2, hq = 8, hkv = 2, s = 512, d = 128, causal = true }, { b = 2, h = 8, sq = 1, sk = 512, d = 128, causal = true } ]",
    );
    p.run("two", Duration::from_secs(600)).await;
    let its = iterations(&p, "two").await;
    assert!(!its.is_empty());
    assert!(its.iter().all(|i| i.stage != "transfer" && i.stage != "warm-start"), "{:?}", its.iter().map(|i| &i.stage).collect::<Vec<_>>());
    assert!(!memory_events(&p, "two").await.iter().any(|m| m.starts_with("transfer:")));
}

fn cli(p: &Project, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_optimizerd"));
    cmd.current_dir(p.path()).args(args).env_remove(optimizerd::failpoint::ENV);
    if matches!(args.first(), Some(&"start") | Some(&"resume")) {
        cmd.arg("--worker-script").arg(p.path().join("script.json"));
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run optimizerd")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

type Row = (String, String, String);

fn rows(its: &[IterationRecord]) -> Vec<Row> {
    its.iter().filter(|i| i.verdict.as_str() != "interrupted").map(|i| (i.stage.clone(), i.template.clone(), i.params_json.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_replays_its_transfers() {
    let two_rules = || rules(fast_on(12.0, &[CAUSAL2]), fast_on(18.0, &[SMALL2]));
    let reference = remembered().await;
    second_workload(&reference);
    reference.set_rules(two_rules());
    reference.run("two", Duration::from_secs(600)).await;
    let expect = rows(&iterations(&reference, "two").await);
    let expect_best = best(&reference, "two").await;

    // Killed while recording the second transferred kernel, then while recording the plan's
    // first kv-split point: each resume stands where the run stopped.
    for (failpoint, transfers_before) in [("ledger-mid-commit@2", 1), ("ledger-mid-commit@4", 2)] {
        let p = remembered().await;
        second_workload(&p);
        p.set_rules(two_rules());
        let o = cli(&p, &["start", "--budget", "10m", "--foreground", "--run-id", "two"], &[(optimizerd::failpoint::ENV, failpoint)]);
        assert!(!o.status.success() && text(&o).contains("aborting"), "{}", text(&o));
        let before = iterations(&p, "two").await;
        assert_eq!(before.iter().filter(|i| i.stage == "transfer" && i.verdict.is_final()).count(), transfers_before, "{failpoint}");
        let o = cli(&p, &["resume", "--foreground", "two"], &[]);
        assert!(o.status.success(), "{}", text(&o));
        let after = iterations(&p, "two").await;
        // What was recorded before is kept as it was, not run again; the rest follows as in the
        // uninterrupted run.
        for b in before.iter().filter(|i| i.verdict.is_final()) {
            let a = after.iter().find(|a| a.seq == b.seq).unwrap();
            assert_eq!((&a.stage, &a.params_json, &a.verdict, a.score_us), (&b.stage, &b.params_json, &b.verdict, b.score_us));
        }
        assert_eq!(rows(&after), expect, "{failpoint}");
        let got: Vec<(String, f64)> = best(&p, "two").await.into_iter().map(|(s, _, us)| (s, us)).collect();
        let want: Vec<(String, f64)> = expect_best.iter().map(|(s, _, us)| (s.clone(), *us)).collect();
        assert_eq!(got, want, "{failpoint}");
        // The transfer event is recorded once.
        assert_eq!(memory_events(&p, "two").await.iter().filter(|m| m.starts_with("transfer:")).count(), 1);
    }
}

/// A transferred kernel is timed on every shape of its target's class (here a remembered
/// one too), so the open phase can prime that class's search with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transferred_kernel_is_timed_on_its_targets_whole_class() {
    let p = remembered().await;
    p.set_workload("shapes = [ { b = 1, h = 1, s = 128, d = 64 }, { b = 1, h = 1, s = 256, d = 64 } ]");
    assert_eq!(p.run("two", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = iterations(&p, "two").await;
    // SMALL is remembered: warm start re-times its best there; the new shape (same class)
    // borrows it, and the transferred kernel runs on both.
    assert_eq!((its[0].stage.as_str(), shapes_of(&its[0])), ("warm-start", vec![SMALL.to_string()]));
    assert_eq!(its[1].stage, "transfer");
    assert!(its[1].params_json.contains("\"MAX_SPLITS\":8"), "{}", its[1].params_json);
    assert_eq!(shapes_of(&its[1]), [SMALL, "b1h1s256d64"]);
    assert!(its[1].shapes.iter().all(|s| s.median_us.is_some()));
    let mem = memory_events(&p, "two").await;
    assert!(mem.iter().any(|m| m.contains(&format!("b1h1s256d64 <- {SMALL} (run one #5)")) && m.contains("run on 2 shape(s)")), "{mem:?}");
}
