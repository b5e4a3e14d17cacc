//! Several GPUs of one host (`start --gpus`): a scripted host of two GPUs (one worker
//! script standing for both; each daemon's worker is told its GPU by
//! `CUDA_VISIBLE_DEVICES`), the real coordinator, daemons, ledger and git.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::{bin, run_in};
use common::{h100, kv_split_plan, kv_split_rules, l4, Project};
use optimizerd::spec::states::{ItemState, RunState};
use optimizerd::storage::ledger::{EventKind, Ledger};

/// Three shape classes (latency-d64, latency-d128-causal, latency-d128) on two GPUs.
fn two_gpu_project(step_delay_ms: u64) -> Project {
    let p = Project::new(&kv_split_plan("1, 8, 16"), kv_split_rules(), serde_json::json!({ "ok": { "us": 200.0 } }));
    p.set_workload(r#"shapes = [ { b = 1, h = 1, s = 128, d = 64 }, { b = 2, h = 8, s = 512, d = 128, causal = true }, { b = 1, h = 4, s = 256, d = 128 } ]"#);
    let mut second = h100();
    second.name = "NVIDIA H100 80GB HBM3 (scripted)".into();
    let path = p.path().join("script.json");
    let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    script["gpus"] = serde_json::json!([h100(), second]);
    script["step_delay_ms"] = serde_json::json!(step_delay_ms);
    std::fs::write(&path, serde_json::to_string_pretty(&script).unwrap()).unwrap();
    p
}

fn start_args<'a>(group: &'a str, budget: &'a str) -> Vec<&'a str> {
    vec!["--config", "agent.toml", "start", "--gpus", "all", "--budget", budget, "--run-id", group, "--foreground", "--worker-script", "script.json", "--seed", "5"]
}

/// How long a test waits for a run's first iteration: seconds when idle, but a CI machine
/// running every test of a file at once (and NVRTC for each daemon) has taken over a minute.
const FIRST_ITERATION: Duration = Duration::from_secs(300);

/// A run's log, for a failure message (empty when it has none yet).
fn run_log(p: &Project, run: &str) -> String {
    std::fs::read_to_string(p.path().join("runs").join(run).join("run.log")).unwrap_or_default()
}

async fn ledger(p: &Project) -> Ledger {
    Ledger::open_read_only(&p.db()).await.expect("ledger")
}

#[tokio::test]
async fn a_group_splits_the_workload_by_class_over_two_gpus_without_duplicates() {
    let p = two_gpu_project(0);
    let ran = run_in(p.path(), &start_args("g1", "2m"));
    assert_eq!(ran.code, Some(0), "{}", ran.text());
    let l = ledger(&p).await;
    let g = l.group("g1").await.unwrap();
    assert_eq!(g.state, RunState::Finished, "{:?}", g.message);
    assert_eq!(g.gpus.iter().map(|s| s.index).collect::<Vec<_>>(), [0, 1]);
    let items = l.items("g1").await.unwrap();
    assert_eq!(items.iter().map(|i| i.class.as_str()).collect::<Vec<_>>(), ["latency-d64", "latency-d128-causal", "latency-d128"]);
    let mut seen: Vec<String> = Vec::new();
    let mut gpus_used: Vec<u32> = Vec::new();
    for it in &items {
        assert_eq!(it.state, ItemState::Done, "item {} {:?}", it.seq, it.message);
        assert_eq!(it.attempts, 1);
        let run = l.run(Some(&it.run_id)).await.unwrap();
        assert_eq!(run.state.recorded, RunState::Finished);
        assert_eq!(run.group_id.as_deref(), Some("g1"));
        assert_eq!(run.gpu, it.gpu.map(i64::from));
        assert!(run.iterations > 0);
        gpus_used.push(it.gpu.unwrap());
        // Each run optimized exactly its class's shapes.
        let workload: Vec<String> = l.run_setup(&it.run_id).await.unwrap().workload.iter().map(|s| s.key()).collect();
        assert_eq!(workload, it.shapes);
        seen.extend(workload);
        // Its worker was the GPU it was given: the scripted device list's entry.
        assert!(run.gpu_name.is_some());
    }
    // Every shape once, and both GPUs worked.
    let mut all = seen.clone();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), seen.len(), "a shape was optimized twice: {seen:?}");
    assert_eq!(seen.len(), 3);
    gpus_used.sort();
    gpus_used.dedup();
    assert_eq!(gpus_used, [0, 1]);
    // The group's log relays every daemon's lines, prefixed with its GPU; status sums them.
    let log = std::fs::read_to_string(p.path().join("runs/g1/run.log")).unwrap();
    assert!(log.contains("[gpu 0]") && log.contains("[gpu 1]"));
    let status = run_in(p.path(), &["--config", "agent.toml", "status", "g1", "--json"]);
    assert_eq!(status.code, Some(0), "{}", status.text());
    let s: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert!(s["iterations"].as_i64().unwrap() >= 3 && s["per_minute"].as_f64().unwrap() > 0.0, "{s}");
    let text = run_in(p.path(), &["--config", "agent.toml", "status", "g1"]).stdout;
    assert!(text.contains("per minute") && text.contains("latency-d128-causal"), "{text}");
    let runs = run_in(p.path(), &["--config", "agent.toml", "runs"]).stdout;
    assert!(runs.contains("g1-latency-d64") && runs.contains("groups (") && runs.contains("  g1  finished  GPUs 0,1"), "{runs}");
    // report GROUP: every item's run reported, and an index naming their GPUs.
    let report = run_in(p.path(), &["--config", "agent.toml", "report", "g1"]);
    assert_eq!(report.code, Some(0), "{}", report.text());
    let index = std::fs::read_to_string(p.path().join("runs/g1/report/index.md")).unwrap();
    for it in &items {
        assert!(index.contains(&format!("| {} | {} | {} | done | {} |", it.seq, it.class, it.gpu.unwrap(), it.run_id)), "{index}");
        assert!(p.path().join("runs/g1/report").join(&it.run_id).join("report.html").exists());
    }
    // A GPU's lock is free again; a second group may start, but not under the same id.
    assert!(optimizerd::daemon::lock::holders(&p.path().join("runs")).is_empty());
    let again = run_in(p.path(), &start_args("g1", "2m"));
    assert_ne!(again.code, Some(0));
    assert!(again.text().contains("a group `g1` exists already; continue it with `optimizerd resume g1`"), "{}", again.text());
}

#[tokio::test]
async fn a_daemon_killed_mid_item_is_resumed_and_the_group_loses_no_iteration() {
    let p = two_gpu_project(120);
    // A budget well past what the runs need (they end by convergence): on a loaded CI machine
    // the first iteration must land before an item's share of the budget could end its run.
    let mut coord = Command::new(bin())
        .current_dir(p.path())
        .args(start_args("g2", "10m"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first item's run has recorded an iteration, then kill its daemon.
    let victim = "g2-latency-d64";
    let pid_file = p.path().join("runs").join(victim).join("daemon.pid");
    let t0 = Instant::now();
    let before = loop {
        let exited = coord.try_wait().unwrap();
        assert!(
            exited.is_none() && t0.elapsed() < FIRST_ITERATION,
            "the first item recorded no iteration in {:?} (coordinator {exited:?}); its run.log:\n{}",
            t0.elapsed(),
            run_log(&p, victim)
        );
        if let (Ok(l), Ok(pid)) = (Ledger::open_read_only(&p.db()).await, std::fs::read_to_string(&pid_file)) {
            if let Ok(r) = l.run(Some(victim)).await {
                if r.iterations >= 1 && r.state.recorded == RunState::Running {
                    // SAFETY: kill(2) of the daemon this test's coordinator started.
                    unsafe { libc::kill(pid.trim().parse::<i32>().unwrap(), libc::SIGKILL) };
                    break r.iterations;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = coord.wait().unwrap();
    assert!(status.success(), "{status}");
    let l = ledger(&p).await;
    assert_eq!(l.group("g2").await.unwrap().state, RunState::Finished);
    let items = l.items("g2").await.unwrap();
    let it = items.iter().find(|i| i.run_id == victim).unwrap();
    assert_eq!((it.state, it.attempts), (ItemState::Done, 2), "{:?}", it.message);
    let run = l.run(Some(victim)).await.unwrap();
    assert_eq!(run.state.recorded, RunState::Finished);
    assert!(run.iterations >= before, "{} < {before}", run.iterations);
    // The resumed run went on from where it was: one run, its iterations numbered on.
    let its = l.iterations(victim).await.unwrap();
    let seqs: Vec<i64> = its.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    assert!(l.events(victim).await.unwrap().iter().any(|e| e.kind == EventKind::Resumed));
    for other in items.iter().filter(|i| i.run_id != victim) {
        assert_eq!((other.state, other.attempts), (ItemState::Done, 1));
    }
}

#[tokio::test]
async fn gpus_of_two_models_are_refused_before_anything_is_recorded() {
    let p = two_gpu_project(0);
    let path = p.path().join("script.json");
    let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    script["gpus"] = serde_json::json!([h100(), l4()]);
    std::fs::write(&path, serde_json::to_string_pretty(&script).unwrap()).unwrap();
    let ran = run_in(p.path(), &start_args("g3", "1m"));
    assert_ne!(ran.code, Some(0));
    let text = ran.text();
    assert!(text.contains("not one model") && text.contains("1 = NVIDIA L4 (scripted) (sm_89)") && text.contains("--gpus 0"), "{text}");
    // A GPU that is not there is named with the ones that are.
    let mut args = start_args("g4", "1m");
    args[4] = "0,5";
    let ran = run_in(p.path(), &args);
    assert!(ran.text().contains("GPU 5 is not among the 2 visible GPUs (0 to 1)"), "{}", ran.text());
    if p.db().exists() {
        assert!(ledger(&p).await.groups().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_stopped_group_resumes_its_queue_and_finishes() {
    let p = two_gpu_project(100);
    // Detached, as a user starts it; then stopped after its first iteration.
    let mut args = start_args("g5", "10m");
    args.retain(|a| *a != "--foreground");
    let ran = run_in(p.path(), &args);
    assert_eq!(ran.code, Some(0), "{}", ran.text());
    assert!(ran.stdout.contains("started in the background"), "{}", ran.stdout);
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < FIRST_ITERATION, "no iteration recorded in {:?}; the first item's run.log:\n{}", t0.elapsed(), run_log(&p, "g5-latency-d64"));
        if let Ok(l) = Ledger::open_read_only(&p.db()).await {
            if l.runs().await.unwrap_or_default().iter().any(|r| r.iterations >= 1) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stop = run_in(p.path(), &["--config", "agent.toml", "stop", "g5", "--wait", "60s"]);
    assert_eq!(stop.code, Some(0), "{}", stop.text());
    assert!(stop.stdout.contains("group g5: stopped"), "{}", stop.stdout);
    let l = ledger(&p).await;
    let stopped = l.items("g5").await.unwrap();
    assert!(stopped.iter().any(|i| i.state == ItemState::Stopped), "{stopped:?}");
    assert!(stopped.iter().all(|i| i.state != ItemState::Running));
    l.close().await;
    let ran = run_in(p.path(), &["--config", "agent.toml", "resume", "g5", "--foreground"]);
    assert_eq!(ran.code, Some(0), "{}", ran.text());
    let l = ledger(&p).await;
    assert_eq!(l.group("g5").await.unwrap().state, RunState::Finished);
    for it in l.items("g5").await.unwrap() {
        assert_eq!(it.state, ItemState::Done, "{:?}", it.message);
        assert_eq!(l.run(Some(&it.run_id)).await.unwrap().state.recorded, RunState::Finished);
    }
    // `watch` follows the group's log to its end.
    let w = run_in(p.path(), &["--config", "agent.toml", "watch", "g5"]);
    assert_eq!(w.code, Some(0), "{}", w.text());
    assert!(w.stdout.contains("group g5 finished"), "{}", w.stdout);
}
