//! Crash drills: the real binary as a detached daemon driving a scripted worker,
//! with real SQLite, git and processes. Each drill ends by checking that the ledger
//! and the workspace are consistent and that no recorded iteration was lost.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::Project;
use optimizerd::storage::ledger::{IterationRecord, Ledger};
use optimizerd::storage::workspace::{Workspace, BEST};
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
space = { BLOCK_M = [32], NUM_WARPS = [4, 8], MAX_SPLITS = [1, 2, 4, 8, 16, 32] }

# These tests are about the plan: the run ends when its stages are done.
[open_phase]
enabled = false
"#;

fn rules() -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["#define MAX_SPLITS 1\n"], "behaviour": { "ok": { "us": 90.0 } } },
        { "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "ok": { "us": 95.0 } } },
        { "source_contains": ["#define MAX_SPLITS 4\n"], "behaviour": { "ok": { "us": 60.0, "per_shape": { "b2h8s512d128-causal": 80.0 } } } },
        { "source_contains": ["#define MAX_SPLITS 8\n"], "behaviour": { "ok": { "us": 60.0 } } },
        { "source_contains": ["#define MAX_SPLITS 16\n"], "behaviour": { "ok": { "us": 70.0, "per_shape": { "b1h1s128d64": 30.0 } } } },
        { "source_contains": ["#define MAX_SPLITS 32\n"], "behaviour": { "ok": { "us": 65.0 } } }
    ])
}

/// A project whose worker takes `delay_ms` per request, so runs last a few seconds.
fn project(delay_ms: u64, extra: serde_json::Value) -> Project {
    project_with(PLAN, delay_ms, extra)
}

fn project_with(plan: &str, delay_ms: u64, extra: serde_json::Value) -> Project {
    let p = Project::new(plan, rules(), json!({ "ok": { "us": 100.0 } }));
    let path = p.path().join("script.json");
    let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    script["step_delay_ms"] = json!(delay_ms);
    script["state_file"] = json!(p.path().join("starts.count"));
    if let serde_json::Value::Object(m) = extra {
        for (k, v) in m {
            script[k] = v;
        }
    }
    std::fs::write(&path, serde_json::to_string_pretty(&script).unwrap()).unwrap();
    p
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_optimizerd")
}

/// Run the CLI in the project folder with the scripted worker.
fn cli(p: &Project, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
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

fn start_detached(p: &Project, run_id: &str, budget: &str, env: &[(&str, &str)]) {
    let o = cli(p, &["start", "--budget", budget, "--run-id", run_id, "--seed", "3"], env);
    assert!(o.status.success(), "start failed: {}", text(&o));
    assert!(text(&o).contains(&format!("run {run_id} started")), "{}", text(&o));
}

fn runs_dir(p: &Project) -> PathBuf {
    p.path().join("runs")
}

fn daemon_pid(p: &Project, run_id: &str) -> Option<u32> {
    optimizerd::daemon::lock::holder(&runs_dir(p), 0).filter(|h| h.0 == run_id).map(|h| h.1)
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill9(pid: u32) {
    // SAFETY: kill(2) with a pid we own in this test.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
}

async fn iterations(p: &Project, run_id: &str) -> Vec<IterationRecord> {
    let l = Ledger::open(&p.db()).await.unwrap();
    let its = l.iterations(run_id).await.unwrap();
    l.close().await;
    its
}

/// Wait until an iteration with seq >= `min_seq` is in flight.
async fn wait_for_in_flight(p: &Project, run_id: &str, min_seq: i64) {
    let t0 = Instant::now();
    loop {
        if iterations(p, run_id).await.iter().any(|i| i.verdict.as_str() == "running" && i.seq >= min_seq) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no iteration in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Best params per shape of a finished run, from the workspace's dispatch table.
fn best_params(p: &Project, run_id: &str) -> BTreeMap<String, serde_json::Value> {
    let d: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(p.workspace(run_id).join("kernels/dispatch.json")).unwrap()).unwrap();
    d.into_iter().map(|(k, v)| (k, v["params"].clone())).collect()
}

/// The invariants every drill ends with.
async fn assert_consistent(p: &Project, run_id: &str, before: &[IterationRecord], max_interrupted: usize) {
    let l = Ledger::open(&p.db()).await.unwrap();
    let run = l.run(Some(run_id)).await.unwrap();
    assert_eq!(run.state.to_string(), "finished", "run {run_id}: {:?}", run.message);
    let its = l.iterations(run_id).await.unwrap();
    // Sequence numbers are contiguous and nothing is left in flight.
    let seqs: Vec<i64> = its.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, (1..=its.len() as i64).collect::<Vec<_>>(), "gaps in {seqs:?}");
    assert!(its.iter().all(|i| i.verdict.as_str() != "running"));
    let interrupted = its.iter().filter(|i| i.verdict.as_str() == "interrupted").count();
    assert!(interrupted <= max_interrupted, "{interrupted} interrupted iterations");
    // No recorded iteration was lost or rewritten.
    for b in before.iter().filter(|b| b.verdict.as_str() != "running") {
        let after = its.iter().find(|i| i.seq == b.seq).unwrap_or_else(|| panic!("iteration {} lost", b.seq));
        assert_eq!((after.verdict.as_str(), after.params_json.as_str()), (b.verdict.as_str(), b.params_json.as_str()), "iteration {} changed", b.seq);
    }
    // Best rows point at winning iterations whose sources are on `best`.
    let best = l.best(run_id).await.unwrap();
    assert_eq!(best.len(), 2);
    let dispatch: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(p.workspace(run_id).join("kernels/dispatch.json")).unwrap()).unwrap();
    for b in &best {
        let it = its.iter().find(|i| i.seq == b.seq).unwrap();
        assert!(it.verdict.as_str() == "accepted" || it.verdict.as_str() == "baseline", "best {} -> iteration {} {}", b.shape, b.seq, it.verdict);
        assert!(p.workspace(run_id).join(&b.source_path).exists());
        assert_eq!(dispatch[&b.shape]["iteration"], json!(b.seq), "dispatch.json disagrees with the ledger for {}", b.shape);
    }
    // The workspace is on `best`, clean, and its lineage is exactly the winning iterations.
    let ws = Workspace::open(&p.workspace(run_id)).unwrap();
    assert_eq!(ws.head_ref().unwrap(), BEST);
    assert!(ws.is_clean().unwrap());
    let mut accepted_in_git: Vec<i64> = ws
        .best_log()
        .unwrap()
        .iter()
        .filter_map(|m| m.strip_prefix("best: iteration ")?.split_whitespace().next()?.parse().ok())
        .collect();
    accepted_in_git.sort();
    let mut accepted_in_ledger: Vec<i64> =
        its.iter().filter(|i| i.verdict.as_str() == "accepted" || i.verdict.as_str() == "baseline").map(|i| i.seq).collect();
    accepted_in_ledger.sort();
    assert_eq!(accepted_in_git, accepted_in_ledger);
    // SQLite agrees the file is sound.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", p.db().display())).await.unwrap();
    let ok: (String,) = sqlx::query_as("PRAGMA integrity_check").fetch_one(&pool).await.unwrap();
    assert_eq!(ok.0, "ok");
    pool.close().await;
    l.close().await;
}

/// The result an uninterrupted run reaches, to compare the drills with.
async fn reference() -> BTreeMap<String, serde_json::Value> {
    let p = project(0, json!({}));
    assert_eq!(p.run("ref", Duration::from_secs(600)).await, optimizerd::engine::RunEnd::Finished("plan exhausted".into()));
    best_params(&p, "ref")
}

/// One kill drill: start detached, kill -9 (after `delay`, or at a failpoint), resume, check.
async fn kill_drill(label: String, delay: Option<Duration>, failpoint: Option<String>, expect: BTreeMap<String, serde_json::Value>) {
    let p = project(120, json!({}));
    let run_id = "drill";
    let env: Vec<(&str, &str)> = failpoint.as_deref().map(|f| vec![(optimizerd::failpoint::ENV, f)]).unwrap_or_default();
    start_detached(&p, run_id, "10m", &env);
    let runs = runs_dir(&p);
    match delay {
        Some(d) => {
            tokio::time::sleep(d).await;
            if let Some(pid) = daemon_pid(&p, run_id) {
                kill9(pid);
            }
        }
        // The failpoint aborts the daemon itself.
        None => wait_until(&format!("{label}: daemon to die at the failpoint"), Duration::from_secs(30), || optimizerd::daemon::lock::holder(&runs, 0).is_none()),
    }
    wait_until(&format!("{label}: lock release"), Duration::from_secs(10), || optimizerd::daemon::lock::holder(&runs, 0).is_none());
    let before = iterations(&p, run_id).await;
    let o = cli(&p, &["resume", run_id, "--foreground"], &[]);
    assert!(o.status.success(), "{label}: resume failed: {}", text(&o));
    assert_consistent(&p, run_id, &before, 1).await;
    assert_eq!(best_params(&p, run_id), expect, "{label}: a different result than the uninterrupted run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_minus_nine_at_seeded_points_then_resume_loses_nothing() {
    let expect = reference().await;
    // 20 seeded random moments over the run, plus exact moments via failpoints,
    // among them the middle of a ledger transaction and of a git commit.
    let mut seed: u64 = 0x0D15_EA5E;
    let mut drills: Vec<(String, Option<Duration>, Option<String>)> = (0..20)
        .map(|i| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let ms = 50 + (seed >> 33) % 3000;
            (format!("random #{i} at {ms} ms"), Some(Duration::from_millis(ms)), None)
        })
        .collect();
    for fp in ["ledger-mid-commit@3", "git-mid-commit@4", "candidate-committed@2", "before-accept@5", "iteration-begun@2", "ledger-mid-commit@2"] {
        drills.push((format!("failpoint {fp}"), None, Some(fp.to_string())));
    }
    // A few at a time: each drill is mostly waiting on its scripted worker.
    for chunk in drills.chunks(4) {
        let handles: Vec<_> = chunk
            .iter()
            .cloned()
            .map(|(label, delay, fp)| tokio::spawn(kill_drill(label, delay, fp, expect.clone())))
            .collect();
        for h in handles {
            h.await.expect("drill panicked");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_fails_to_start_three_times_is_waited_for_without_burning_budget() {
    // Start 1 is fine; MAX_SPLITS 2 crashes the worker; starts 2..4 fail as if the GPU were gone.
    let p = project(0, json!({ "fail_starts": [2, 3, 4] }));
    p.without_screening();
    let path = p.path().join("script.json");
    let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    script["rules"].as_array_mut().unwrap().insert(0, json!({ "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "crash": { "step": "check" } } }));
    std::fs::write(&path, serde_json::to_string(&script).unwrap()).unwrap();
    let t0 = Instant::now();
    let o = cli(&p, &["start", "--budget", "10m", "--foreground", "--run-id", "gpu"], &[]);
    let wall = t0.elapsed().as_secs_f64();
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.matches("waiting for the GPU").count() >= 3, "{out}");
    assert!(out.contains("the GPU answered again"), "{out}");
    let l = Ledger::open(&p.db()).await.unwrap();
    let run = l.run(Some("gpu")).await.unwrap();
    assert_eq!(run.state.to_string(), "finished");
    // Three retries 200 ms apart (gpu_retry_max) were spent waiting: not charged to the budget.
    assert!(run.used_s < wall - 0.5, "used {:.2}s of a {wall:.2}s run", run.used_s);
    let events = l.events("gpu").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "waited_for_gpu" && e.message.contains("attempts")), "{events:?}");
    let its = l.iterations("gpu").await.unwrap();
    assert_eq!(its.iter().filter(|i| i.verdict.as_str() == "crashed").count(), 2, "both MAX_SPLITS=2 candidates crash");
    assert_eq!(its.len(), 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_gone_for_good_ends_the_run_interrupted_and_resumable() {
    let p = project(0, json!({ "fail_starts": [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20] }));
    p.without_screening();
    let path = p.path().join("script.json");
    let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    script["rules"].as_array_mut().unwrap().insert(0, json!({ "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "crash": { "step": "check" } } }));
    std::fs::write(&path, serde_json::to_string(&script).unwrap()).unwrap();
    let o = cli(&p, &["start", "--budget", "10m", "--foreground", "--run-id", "gone"], &[]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("optimizerd resume gone"), "{}", text(&o));
    let before = iterations(&p, "gone").await;
    let l = Ledger::open(&p.db()).await.unwrap();
    assert_eq!(l.run(Some("gone")).await.unwrap().state.to_string(), "interrupted");
    l.close().await;
    // The GPU comes back: resume finishes the run.
    std::fs::write(p.path().join("starts.count"), "100").unwrap();
    let o = cli(&p, &["resume", "--foreground"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("re-validated"), "{}", text(&o));
    assert_consistent(&p, "gone", &before, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_candidate_in_flight_and_stop_now_abandons_it() {
    let p = project(150, json!({}));
    start_detached(&p, "term", "10m", &[]);
    // Wait until a kv-split candidate is in flight, then ask for a graceful stop.
    wait_for_in_flight(&p, "term", 2).await;
    let in_flight = iterations(&p, "term").await.iter().find(|i| i.verdict.as_str() == "running").map(|i| i.seq).unwrap();
    let o = cli(&p, &["stop", "term"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("run term: stopped"), "{}", text(&o));
    let its = iterations(&p, "term").await;
    let it = its.iter().find(|i| i.seq == in_flight).unwrap();
    assert!(it.verdict.as_str() != "running" && it.verdict.as_str() != "interrupted", "in-flight iteration ended {}", it.verdict);
    assert_eq!(its.len() as i64, in_flight, "no iteration started after the stop");
    let ws = Workspace::open(&p.workspace("term")).unwrap();
    assert_eq!(ws.head_ref().unwrap(), BEST);
    assert!(ws.is_clean().unwrap());

    // Resume detached, then stop --now: the candidate in flight is abandoned and recorded.
    let o = cli(&p, &["resume", "term"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    wait_for_in_flight(&p, "term", 1).await;
    let o = cli(&p, &["stop", "--now", "term"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let its = iterations(&p, "term").await;
    assert_eq!(its.iter().filter(|i| i.verdict.as_str() == "interrupted").count(), 1, "{:?}", its.iter().map(|i| &i.verdict).collect::<Vec<_>>());
    let before = its.clone();
    let o = cli(&p, &["resume", "--foreground", "term"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_consistent(&p, "term", &before, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_is_refused_and_pid_file_damage_does_not_matter() {
    let p = project(150, json!({}));
    start_detached(&p, "first", "10m", &[]);
    let o = cli(&p, &["start", "--budget", "1m", "--run-id", "second"], &[]);
    assert!(!o.status.success());
    assert!(text(&o).contains("run first (pid") && text(&o).contains("--allow-concurrent"), "{}", text(&o));
    let o = cli(&p, &["start", "--budget", "1m", "--foreground", "--run-id", "second"], &[]);
    assert!(!o.status.success() && text(&o).contains("run first"), "{}", text(&o));
    // Corrupt pid file: stop still finds the daemon through the GPU lock.
    let pid_file = runs_dir(&p).join("first/daemon.pid");
    std::fs::write(&pid_file, "not a pid\n").unwrap();
    let o = cli(&p, &["stop", "first"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("is corrupt"), "{}", text(&o));
    // Missing pid file on the resumed daemon: same.
    let o = cli(&p, &["resume", "first"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    wait_until("pid file", Duration::from_secs(10), || runs_dir(&p).join("first/daemon.pid").exists());
    std::fs::remove_file(runs_dir(&p).join("first/daemon.pid")).unwrap();
    let o = cli(&p, &["stop", "first"], &[]);
    assert!(o.status.success() && text(&o).contains("is missing"), "{}", text(&o));
    // A stale pid file of a dead daemon does not block a new start.
    std::fs::write(&pid_file, "999999\n").unwrap();
    let before = iterations(&p, "first").await;
    let o = cli(&p, &["resume", "--foreground", "first"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_consistent(&p, "first", &before, 1).await;
    let o = cli(&p, &["runs"], &[]);
    assert!(text(&o).contains("first") && text(&o).contains("finished"), "{}", text(&o));
}

/// Limit the size of any file the process writes (RLIMIT_FSIZE): a full disk that
/// even root cannot ignore. SIGXFSZ is ignored so writes fail with EFBIG instead.
fn start_with_file_limit(p: &Project, bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin());
    cmd.current_dir(p.path())
        .args(["start", "--budget", "10m", "--foreground", "--run-id", "full", "--worker-script"])
        .arg(p.path().join("script.json"));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    cmd.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_clearly_without_corrupting_anything() {
    // Find a file-size limit that lets the run start and then runs out mid-run: the
    // ledger and repository sizes vary a little with versions, so grow it until then.
    for kib in [96u64, 128, 160, 224, 320, 448, 640] {
        let p = project(0, json!({}));
        let o = start_with_file_limit(&p, kib * 1024);
        if o.status.success() {
            panic!("the run finished within a {kib} KiB file limit: the limits tried are too large");
        }
        let before = iterations(&p, "full").await;
        if before.is_empty() {
            continue; // too small to even start; try a larger limit
        }
        let out = text(&o);
        assert!(out.contains("full") || out.contains("too large") || out.contains("read-only"), "unclear error at {kib} KiB: {out}");
        assert!(!out.contains("panicked"), "{out}");
        // With space again, the run resumes and ends consistent.
        let o = cli(&p, &["resume", "--foreground", "full"], &[]);
        assert!(o.status.success(), "{}", text(&o));
        assert_consistent(&p, "full", &before, 1).await;
        return;
    }
    panic!("no file limit between 96 KiB and 640 KiB failed the run mid-way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_in_an_evolutionary_stage_resumes_to_the_same_result() {
    let plan = format!("{PLAN}\n[[stage]]\nname = \"tuning\"\ntemplate = \"kv_split.cu\"\nsearch = \"evolve\"\nstart_from_best = true\nspace = {{ BLOCK_M = [16, 32], NUM_WARPS = [4, 8] }}\nmax_candidates = 6\n");
    let reference = project_with(&plan, 0, json!({}));
    assert_eq!(reference.run("ref", Duration::from_secs(600)).await, optimizerd::engine::RunEnd::Finished("plan exhausted".into()));
    let expect = best_params(&reference, "ref");
    let ref_tuning: Vec<String> = iterations(&reference, "ref").await.iter().filter(|i| i.stage == "tuning").map(|i| i.params_json.clone()).collect();

    // Iterations 1..13 are baseline and kv-split; die in the middle of recording tuning's second candidate.
    let p = project_with(&plan, 0, json!({}));
    let o = cli(&p, &["start", "--budget", "10m", "--foreground", "--run-id", "evo"], &[(optimizerd::failpoint::ENV, "ledger-mid-commit@15")]);
    assert!(!o.status.success());
    let before = iterations(&p, "evo").await;
    let o = cli(&p, &["resume", "--foreground", "evo"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_consistent(&p, "evo", &before, 1).await;
    assert_eq!(best_params(&p, "evo"), expect);
    // The tuning stage proposed the same candidates as the uninterrupted run (the interrupted one again).
    let tuning: Vec<String> = iterations(&p, "evo").await.iter().filter(|i| i.stage == "tuning" && i.verdict.as_str() != "interrupted").map(|i| i.params_json.clone()).collect();
    assert_eq!(tuning, ref_tuning);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_crash_and_a_worker_hang_leave_everything_consistent() {
    let p = project(0, json!({}));
    p.without_screening();
    let path = p.path().join("script.json");
    let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let rules = script["rules"].as_array_mut().unwrap();
    rules.insert(0, json!({ "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "crash": { "step": "check" } } }));
    rules.insert(0, json!({ "source_contains": ["#define MAX_SPLITS 32\n"], "behaviour": { "hang": { "step": "time" } } }));
    std::fs::write(&path, serde_json::to_string(&script).unwrap()).unwrap();
    start_detached(&p, "faults", "10m", &[]);
    wait_until("the run to end", Duration::from_secs(60), || optimizerd::daemon::lock::holder(&runs_dir(&p), 0).is_none());
    let its = iterations(&p, "faults").await;
    assert_eq!(its.iter().filter(|i| i.verdict.as_str() == "crashed").count(), 2, "{:?}", its.iter().map(|i| &i.verdict).collect::<Vec<_>>());
    assert_eq!(its.iter().filter(|i| i.verdict.as_str() == "timeout").count(), 2);
    assert_consistent(&p, "faults", &its, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_in_the_open_phase_resumes_to_the_same_point() {
    killed_in_the_open_phase_resumes_to_the_same_point("ledger-mid-commit@17").await;
}

/// Killed right after the look-ahead asked the worker to compile the next candidate (iteration
/// 16 recorded, 17's source compiling in the worker's background threads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_during_a_pipelined_compile_resumes_to_the_same_point() {
    killed_in_the_open_phase_resumes_to_the_same_point("lookahead-sent@16").await;
}

async fn killed_in_the_open_phase_resumes_to_the_same_point(failpoint: &str) {
    let plan = PLAN.replace("[open_phase]\nenabled = false\n", "[open_phase]\npatience = 5\nrestart_after = 3\n");
    assert_ne!(plan, PLAN);
    let open_iterations = |its: Vec<IterationRecord>| -> Vec<(String, String, String)> {
        its.into_iter().filter(|i| i.stage.starts_with("open/") && i.verdict.as_str() != "interrupted").map(|i| (i.stage, i.template, i.params_json)).collect()
    };
    let reference = project_with(&plan, 0, json!({}));
    let end = reference.run("ref", Duration::from_secs(600)).await;
    assert!(matches!(&end, optimizerd::engine::RunEnd::Finished(m) if m.starts_with("converged")), "{end:?}");
    let expect = best_params(&reference, "ref");
    let ref_open = open_iterations(iterations(&reference, "ref").await);
    assert!(ref_open.len() >= 10, "{ref_open:?}");

    // Iterations 1..13 are the plan's; die while recording the open phase's fourth candidate.
    let p = project_with(&plan, 0, json!({}));
    let o = cli(&p, &["start", "--budget", "10m", "--foreground", "--run-id", "open"], &[(optimizerd::failpoint::ENV, failpoint)]);
    assert!(!o.status.success());
    assert!(text(&o).contains(&format!("failpoint {failpoint}: aborting")), "{}", text(&o));
    let before = iterations(&p, "open").await;
    assert!(before.iter().any(|i| i.stage.starts_with("open/")), "killed inside the open phase");
    let o = cli(&p, &["resume", "--foreground", "open"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    // Killed mid-commit, the iteration in flight is marked interrupted; killed between two
    // iterations (after a look-ahead), none is.
    assert_consistent(&p, "open", &before, usize::from(failpoint.starts_with("ledger-mid-commit"))).await;
    assert_eq!(best_params(&p, "open"), expect);
    // The same candidates in the same order as the uninterrupted run (the interrupted one again).
    assert_eq!(open_iterations(iterations(&p, "open").await), ref_open);
    let l = Ledger::open(&p.db()).await.unwrap();
    assert!(l.run(Some("open")).await.unwrap().message.unwrap().starts_with("converged"));
}
