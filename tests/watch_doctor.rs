//! `watch` and `doctor` on a CPU machine: `watch` replays and follows real `run.log`
//! files of runs recorded in a real SQLite ledger; `doctor` checks a real config,
//! runs folder, plan and NVRTC, and starts the scripted worker process as its GPU.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use optimizerd::ops::doctor::{self, DoctorOptions, Status};
use optimizerd::storage::ledger::{Ledger, NewRun};
use optimizerd::daemon::supervisor::WorkerCommand;
use optimizerd::ops::watch::{self, WatchOptions};
use serde_json::{json, Value};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------
// watch

fn fast() -> WatchOptions {
    WatchOptions {
        poll: Duration::from_millis(20),
        settle: Duration::from_secs(1),
        gone_grace: Duration::from_millis(300),
        progress: false,
    }
}

/// A log line as tracing-subscriber's JSON formatter writes it.
fn line(level: &str, fields: Value) -> String {
    json!({
        "timestamp": "2026-11-21T18:16:39.628787Z",
        "level": level,
        "fields": fields,
        "target": "optimizerd::engine",
    })
    .to_string()
}

fn device_line() -> String {
    line("INFO", json!({"message": "GPU NVIDIA H100 (sm_90), 132 SMs", "kind": "device", "gpu": "NVIDIA H100", "cc": 90, "sms": 132}))
}

fn stage_line(stage: &str) -> String {
    line("INFO", json!({"message": format!("stage {stage}: split the KV sequence (coordinate search over kv_split.cu)"), "kind": "stage", "stage": stage}))
}

fn iteration_line(seq: i64, stage: &str, verdict: &str, reason: &str, score: Option<f64>, best: Option<f64>) -> String {
    let mut f = json!({
        "message": format!("#{seq} {stage} {verdict}"),
        "kind": "iteration",
        "seq": seq,
        "stage": stage,
        "template": "kv_split.cu",
        "params": format!("{{\"BLOCK_M\":16,\"MAX_SPLITS\":{seq}}}"),
        "verdict": verdict,
        "reason": reason,
        "used_s": seq as f64 * 2.0,
        "budget_s": 60.0,
    });
    if let Some(s) = score {
        f["score_us"] = json!(s);
    }
    if let Some(b) = best {
        f["best_speedup"] = json!(b);
    }
    line("INFO", f)
}

/// A line as the engine logs an event with an explicit `message` field besides its
/// formatted message: tracing writes both keys, the formatted one first.
fn line_with_two_messages(level: &str, formatted: &str, fields: Value, message: &str) -> String {
    let rest = fields.to_string();
    let rest = &rest[1..rest.len() - 1];
    format!(
        "{{\"timestamp\":\"2026-11-21T18:16:40.000000Z\",\"level\":\"{level}\",\"fields\":{{\"message\":{},{rest},\"message\":{}}},\"target\":\"optimizerd::engine\"}}",
        json!(formatted),
        json!(message)
    )
}

fn run_end_line(id: &str, state: &str, message: &str) -> String {
    line_with_two_messages(
        "INFO",
        &format!("run {id} {state}: {message}"),
        json!({"kind": "run_end", "run": id, "state": state}),
        message,
    )
}

async fn ledger_with_run(runs: &Path, id: &str) -> Ledger {
    let ledger = Ledger::open(&runs.join("optimizer.db")).await.expect("ledger opens");
    ledger
        .create_run(&NewRun {
            id: id.into(),
            started_at: optimizerd::storage::ledger::now(),
            budget_s: 60.0,
            run_dir: runs.join(id).display().to_string(),
            config_source: "agent.toml".into(),
            plan_path: "strategies/default.toml".into(),
            config_json: "{}".into(),
            workload_json: "[]".into(),
            pid: std::process::id(),
        })
        .await
        .expect("run created");
    ledger
}

async fn watch_to_string(ledger: &Ledger, runs: &Path, run: Option<&str>, json: bool) -> anyhow::Result<String> {
    Ok(watch_end(ledger, runs, run, json).await?.1)
}

async fn watch_end(ledger: &Ledger, runs: &Path, run: Option<&str>, json: bool) -> anyhow::Result<(watch::WatchEnd, String)> {
    let mut out = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(30), watch::watch(ledger, runs, run, json, &mut out, &fast()))
        .await
        .expect("watch returns within 30 s")?;
    Ok((end, String::from_utf8(out).expect("utf-8 output")))
}

/// The run folder with `daemon.pid` naming a live process (this test), as a running daemon leaves it.
fn live_daemon(runs: &Path, id: &str) {
    std::fs::create_dir_all(runs.join(id)).unwrap();
    std::fs::write(runs.join(id).join("daemon.pid"), format!("{}\n", std::process::id())).unwrap();
}

fn finished_log(id: &str) -> String {
    let lines = [
        line("DEBUG", json!({"message": "worker started", "generation": 1})),
        device_line(),
        stage_line("baseline"),
        iteration_line(1, "baseline", "baseline", "first correct kernel: the incumbent for every shape", Some(120.0), Some(1.0)),
        stage_line("kv-split"),
        iteration_line(2, "kv-split", "accepted", "won b1h1s32d64 1.09x, b1h1s64d64 2.30x", Some(35.3), Some(11.12)),
        line("WARN", json!({"message": "worker start failed: scripted", "attempt": 0})),
        iteration_line(3, "kv-split", "compile_error", "NVRTC rejected the program", None, Some(11.12)),
        iteration_line(4, "kv-split", "rejected", "faster on no shape beyond noise (best b1h1s32d64 1.01x, needed > 1.02x)", Some(36.0), Some(11.12)),
        run_end_line(id, "finished", "budget spent"),
    ];
    lines.iter().map(|l| format!("{l}\n")).collect()
}

#[tokio::test]
async fn watch_replays_a_finished_run() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let ledger = ledger_with_run(&runs, "r1").await;
    std::fs::create_dir_all(runs.join("r1")).unwrap();
    let log = finished_log("r1");
    std::fs::write(runs.join("r1/run.log"), &log).unwrap();
    ledger.finish_run("r1", optimizerd::spec::states::RunState::Finished, "budget spent", 9.0).await.unwrap();

    let started = Instant::now();
    let text = watch_to_string(&ledger, &runs, Some("r1"), false).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "a finished run is replayed, not waited on");
    let lines: Vec<&str> = text.lines().collect();
    let find = |prefix: &str| lines.iter().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line {prefix:?} in:\n{text}"));
    assert!(find("#1 ").contains("baseline"), "{text}");
    let l2 = find("#2 ");
    for want in ["kv-split", "accepted", "{\"BLOCK_M\":16,\"MAX_SPLITS\":2}", "35.3 us", "best 11.12x", "won b1h1s32d64 1.09x"] {
        assert!(l2.contains(want), "iteration 2 line lacks {want:?}: {l2}");
    }
    assert!(find("#3 ").contains("compile_error"), "{text}");
    assert!(find("#4 ").contains("rejected"), "{text}");
    assert!(text.contains("== stage kv-split: split the KV sequence"), "{text}");
    assert!(text.contains("GPU NVIDIA H100 (sm_90), 132 SMs"), "{text}");
    assert!(text.contains("warning: worker start failed: scripted"), "{text}");
    assert!(text.contains("run r1 finished: budget spent"), "{text}");
    assert!(!text.contains("worker started"), "debug lines are left out of the human view: {text}");
    assert!(text.trim_end().ends_with("4 iterations (26.7 per minute), best 11.12x over the baseline kernel, 9s of 1m00s budget used"), "{text}");
    // Iterations in order.
    let pos = |p: &str| lines.iter().position(|l| l.starts_with(p)).unwrap();
    assert!(pos("#1 ") < pos("#2 ") && pos("#2 ") < pos("#3 ") && pos("#3 ") < pos("#4 "));

    // --json: the raw lines, unchanged (the latest run is the default).
    let raw = watch_to_string(&ledger, &runs, None, true).await.unwrap();
    assert_eq!(raw, log);
}

#[tokio::test]
async fn watch_replays_a_run_that_ended_without_a_run_end_line() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let ledger = ledger_with_run(&runs, "old").await;
    std::fs::create_dir_all(runs.join("old")).unwrap();
    // An older log: no `kind` fields at all, as the engine wrote them before.
    let mut it = serde_json::from_str::<Value>(&iteration_line(1, "baseline", "baseline", "first correct kernel", Some(50.0), None)).unwrap();
    it["fields"].as_object_mut().unwrap().remove("kind");
    let log = format!("{}\n{}\n", device_line(), it);
    std::fs::write(runs.join("old/run.log"), &log).unwrap();
    ledger.finish_run("old", optimizerd::spec::states::RunState::Failed, "worker could not start", 1.0).await.unwrap();

    let text = watch_to_string(&ledger, &runs, Some("old"), false).await.unwrap();
    assert!(text.lines().any(|l| l.starts_with("#1 ") && l.contains("baseline") && l.contains("50.0 us")), "{text}");
    assert!(text.contains("run old failed: worker could not start"), "the end comes from the ledger: {text}");
    assert_eq!(watch_to_string(&ledger, &runs, Some("old"), true).await.unwrap(), log);
}

/// Appends `lines` to the run's log over time, one of them in two writes, then ends
/// the run in the ledger (and in the log when `run_end` is given).
async fn write_live(ledger: Ledger, runs: PathBuf, id: &str, lines: Vec<String>, run_end: Option<String>) {
    tokio::time::sleep(Duration::from_millis(150)).await;
    let path = runs.join(id).join("run.log");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
    for (i, l) in lines.iter().enumerate() {
        if i == 2 {
            // A partial line: the watcher must hold it back until its newline arrives.
            let (a, b) = l.split_at(l.len() / 2);
            f.write_all(a.as_bytes()).unwrap();
            f.flush().unwrap();
            tokio::time::sleep(Duration::from_millis(80)).await;
            f.write_all(format!("{b}\n").as_bytes()).unwrap();
        } else {
            f.write_all(format!("{l}\n").as_bytes()).unwrap();
        }
        f.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    // As the engine does: the ledger first, then the last log line.
    ledger.finish_run(id, optimizerd::spec::states::RunState::Finished, "budget spent", 12.0).await.unwrap();
    if let Some(end) = run_end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        f.write_all(format!("{end}\n").as_bytes()).unwrap();
        f.flush().unwrap();
    }
}

fn live_lines() -> Vec<String> {
    let mut lines = vec![device_line(), stage_line("kv-split")];
    for seq in 1..=6 {
        let verdict = if seq % 2 == 0 { "accepted" } else { "rejected" };
        lines.push(iteration_line(seq, "kv-split", verdict, "won b1h1s32d64 1.09x", Some(40.0 - seq as f64), Some(1.0 + seq as f64)));
    }
    lines.insert(
        4,
        line_with_two_messages(
            "WARN",
            "waiting for the GPU (attempt 1 failed, next in 250ms; the budget is paused): device busy",
            json!({"kind": "waiting_for_gpu", "attempt": 1}),
            "device busy",
        ),
    );
    lines.insert(5, line("INFO", json!({"message": "the GPU answered again at attempt 2; the run continues", "kind": "gpu_back", "attempt": 2})));
    lines
}

#[tokio::test]
async fn watch_follows_a_live_run_until_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let ledger = ledger_with_run(&runs, "live").await;
    live_daemon(&runs, "live");
    // No run.log yet: watch waits for it, since the run is live.
    let writer = tokio::spawn(write_live(ledger.clone(), runs.clone(), "live", live_lines(), Some(run_end_line("live", "finished", "budget spent"))));

    let (human, raw) = tokio::join!(
        watch_to_string(&ledger, &runs, Some("live"), false),
        watch_to_string(&ledger, &runs, Some("live"), true)
    );
    writer.await.unwrap();
    let (human, raw) = (human.unwrap(), raw.unwrap());

    let log = std::fs::read_to_string(runs.join("live/run.log")).unwrap();
    assert_eq!(raw, log, "--json passes every line through, the last one included");
    let seqs: Vec<&str> = human.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(seqs.len(), 6, "{human}");
    for (i, l) in seqs.iter().enumerate() {
        let seq = i + 1;
        assert!(l.starts_with(&format!("#{seq} ")), "{l}");
        assert!(l.contains(if seq % 2 == 0 { "accepted" } else { "rejected" }), "{l}");
    }
    assert!(human.contains("-- waiting for the GPU (attempt 1): device busy"), "{human}");
    assert!(human.contains("-- the GPU answered again at attempt 2; the run continues"), "{human}");
    let tail: Vec<&str> = human.trim_end().lines().rev().take(2).collect();
    assert_eq!(tail[1], "run live finished: budget spent", "{human}");
    assert!(tail[0].starts_with("6 iterations (") && tail[0].contains(" per minute), best 7.00x"), "{human}");
}

#[tokio::test]
async fn watch_ends_when_the_ledger_says_the_run_ended() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let ledger = ledger_with_run(&runs, "quiet").await;
    live_daemon(&runs, "quiet");
    std::fs::write(runs.join("quiet/run.log"), format!("{}\n", device_line())).unwrap();
    // No run_end line: the ledger's state plus a quiet log end the watch.
    let writer = tokio::spawn(write_live(ledger.clone(), runs.clone(), "quiet", live_lines(), None));
    let (end, raw) = watch_end(&ledger, &runs, Some("quiet"), true).await.unwrap();
    writer.await.unwrap();
    assert_eq!(raw, std::fs::read_to_string(runs.join("quiet/run.log")).unwrap());
    assert_eq!(end.run.state.to_string(), "finished");
    assert!(!end.saw_run_end && !end.daemon_gone);
}

#[tokio::test]
async fn watch_follows_a_resumed_run_past_its_earlier_end() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    // The first session stopped; the ledger says `running` again: it was resumed.
    let ledger = ledger_with_run(&runs, "again").await;
    live_daemon(&runs, "again");
    let first = [
        device_line(),
        iteration_line(1, "baseline", "baseline", "first correct kernel", Some(50.0), Some(1.0)),
        run_end_line("again", "stopped", "stopped by request; resume with `optimizerd resume`"),
    ];
    std::fs::write(runs.join("again/run.log"), first.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let second = vec![
        line_with_two_messages(
            "INFO",
            "run again resumed with 50s of budget left",
            json!({"kind": "resumed", "run": "again"}),
            "resumed with 50s of budget left",
        ),
        iteration_line(2, "kv-split", "accepted", "won b1h1s32d64 1.50x", Some(33.0), Some(1.5)),
    ];
    let writer = tokio::spawn(write_live(ledger.clone(), runs.clone(), "again", second, Some(run_end_line("again", "finished", "budget spent"))));
    let (end, text) = watch_end(&ledger, &runs, Some("again"), false).await.unwrap();
    writer.await.unwrap();
    assert!(end.saw_run_end && !end.daemon_gone, "{text}");
    let want = ["#1 ", "run again stopped: stopped by request", "-- run again resumed with 50s of budget left", "#2 ", "run again finished: budget spent"];
    let mut at = 0;
    for w in want {
        let found = text[at..].find(w).unwrap_or_else(|| panic!("{w:?} missing or out of order in:\n{text}"));
        at += found + w.len();
    }
}

#[tokio::test]
async fn watch_stops_when_the_daemon_of_a_live_run_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let ledger = ledger_with_run(&runs, "dead").await;
    std::fs::create_dir_all(runs.join("dead")).unwrap();
    let log = format!("{}\n{}\n", device_line(), iteration_line(1, "baseline", "baseline", "first correct kernel", Some(50.0), None));
    std::fs::write(runs.join("dead/run.log"), &log).unwrap();
    // The daemon was killed: its pid file names a process that has exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    std::fs::write(runs.join("dead/daemon.pid"), format!("{pid}\n")).unwrap();

    let (end, text) = watch_end(&ledger, &runs, Some("dead"), false).await.unwrap();
    assert!(end.daemon_gone, "{text}");
    assert_eq!(end.run.state.to_string(), "running");
    assert!(text.lines().any(|l| l.starts_with("#1 ")), "{text}");
    assert!(text.contains("optimizerd resume dead"), "{text}");
    let (end, raw) = watch_end(&ledger, &runs, Some("dead"), true).await.unwrap();
    assert!(end.daemon_gone);
    assert_eq!(raw, log, "--json prints only the log's lines");
}

#[tokio::test]
async fn watch_names_an_unknown_run_and_a_missing_log() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let ledger = ledger_with_run(&runs, "r1").await;
    let err = watch_to_string(&ledger, &runs, Some("nope"), false).await.unwrap_err().to_string();
    assert!(err.contains("nope") && err.contains("optimizerd runs"), "{err}");

    ledger.finish_run("r1", optimizerd::spec::states::RunState::Failed, "no GPU", 0.0).await.unwrap();
    let err = watch_to_string(&ledger, &runs, Some("r1"), false).await.unwrap_err().to_string();
    assert!(err.contains("r1") && err.contains("run.log"), "{err}");
}

// ---------------------------------------------------------------------------------------
// doctor

fn h100(driver_version: i32) -> Value {
    json!({
        "name": "NVIDIA H100 80GB HBM3 (scripted)",
        "cc_major": 9, "cc_minor": 0, "sm_count": 132,
        "smem_optin": 232448, "smem_per_sm": 233472, "l2_bytes": 52428800u64,
        "max_threads_per_sm": 2048, "driver_version": driver_version,
        "nvrtc_version": [13, 0], "arch": "sm_90"
    })
}

/// A project folder: `agent.toml` with `runs_dir`, the repository's plan and templates,
/// and a worker script whose device reports `driver_version`.
fn project(runs_dir: &str, driver_version: i32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = repo_root();
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "[run]\nruns_dir = \"{runs_dir}\"\nplan = \"{}\"\ntemplates_dir = \"{}\"\n",
            root.join("strategies/default.toml").display(),
            root.join("kernel-templates").display()
        ),
    )
    .unwrap();
    let script = json!({ "device": h100(driver_version), "default": { "ok": { "us": 10.0 } } });
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    dir
}

fn options(dir: &Path, script: &Path) -> DoctorOptions {
    DoctorOptions {
        config: Some(dir.join("agent.toml")),
        worker: WorkerCommand {
            program: PathBuf::from(env!("CARGO_BIN_EXE_optimizerd")),
            args: vec!["worker".into(), "--script".into(), script.display().to_string()],
            env: vec![],
        },
        gpu_timeout: Duration::from_secs(20),
        python: "python3-optimizerd-test-absent".into(),
        python_timeout: Duration::from_secs(20),
    }
}

fn status_of(report: &doctor::Report, name: &str) -> Status {
    report.check(name).unwrap_or_else(|| panic!("no check {name}")).status
}

#[tokio::test]
async fn doctor_passes_with_the_scripted_worker() {
    let dir = project("runs", 13000);
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    let text = report.text();
    for name in ["config", "runs", "plan", "nvrtc", "gpu", "versions"] {
        assert_eq!(status_of(&report, name), Status::Ok, "{name}:\n{text}");
    }
    assert!(dir.path().join("runs").is_dir(), "the runs folder is created");
    assert!(text.contains("NVIDIA H100 80GB HBM3 (scripted)"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("ok   gpu") && l.contains("132 SMs") && l.contains("driver 13.0")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("ok   config") && l.contains("8 shapes")), "{text}");
    assert!(text.contains("NVRTC 13.0 <= driver CUDA 13.0"), "{text}");
    // No python with torch under that name: a warning, not a failure.
    let torch = report.check("torch").unwrap();
    assert_eq!(torch.status, Status::Warn, "{text}");
    assert!(torch.fix.as_deref().unwrap_or("").contains("optional"), "{text}");
    assert!(!report.failed(), "{text}");

    let v: Value = serde_json::to_value(&report).unwrap();
    let gpu = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "gpu").unwrap();
    assert_eq!(gpu["status"], "ok");
    assert_eq!(v["device"]["sm_count"], 132);
}

#[tokio::test]
async fn doctor_fails_gpu_when_the_worker_cannot_start() {
    let dir = project("runs", 13000);
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("no-such-script.json"))).await;
    let text = report.text();
    let gpu = report.check("gpu").unwrap();
    assert_eq!(gpu.status, Status::Fail, "{text}");
    assert!(gpu.fix.as_deref().is_some_and(|f| f.contains("nvidia-smi")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("FAIL gpu")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("     fix: ")), "{text}");
    assert_eq!(status_of(&report, "versions"), Status::Skip, "{text}");
    assert_eq!(status_of(&report, "nvrtc"), Status::Ok, "NVRTC is found on its own: {text}");
    assert!(report.failed());
}

#[tokio::test]
async fn doctor_fails_an_unwritable_runs_folder() {
    let dir = project("a-file/runs", 13000);
    std::fs::write(dir.path().join("a-file"), "not a folder").unwrap();
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    let text = report.text();
    let runs = report.check("runs").unwrap();
    assert_eq!(runs.status, Status::Fail, "{text}");
    assert!(runs.detail.contains("a-file"), "{text}");
    assert!(runs.fix.as_deref().is_some_and(|f| f.contains("run.runs_dir")), "{text}");
    assert!(report.failed());
}

#[tokio::test]
async fn doctor_fails_nvrtc_newer_than_the_driver() {
    let dir = project("runs", 12080);
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    let text = report.text();
    let v = report.check("versions").unwrap();
    assert_eq!(v.status, Status::Fail, "{text}");
    assert!(v.detail.contains("NVRTC 13.0 is newer than the driver's CUDA 12.8"), "{text}");
    assert!(v.fix.as_deref().is_some_and(|f| f.contains("driver")), "{text}");
}

#[tokio::test]
async fn doctor_reports_a_broken_config_and_skips_what_needs_it() {
    let dir = project("runs", 13000);
    std::fs::write(dir.path().join("agent.toml"), "[run]\nrunz_dir = \"x\"\n").unwrap();
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    let text = report.text();
    let config = report.check("config").unwrap();
    assert_eq!(config.status, Status::Fail, "{text}");
    assert!(config.detail.contains("runz_dir"), "{text}");
    assert_eq!(status_of(&report, "runs"), Status::Skip);
    assert_eq!(status_of(&report, "plan"), Status::Skip);
    assert_eq!(status_of(&report, "gpu"), Status::Ok, "the GPU check does not need the config: {text}");
}

/// A project whose plan has an arch-specific (sm_90a) stage, on a GPU of compute capability `cc`.
fn hopper_project(cc: (u32, u32)) -> tempfile::TempDir {
    let dir = project("runs", 13000);
    let plan = "[[stage]]\nname = \"baseline\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\n\n\
                [[stage]]\nname = \"hopper\"\ntemplate = \"testing/tensor_map_probe.cu\"\nsearch = \"exhaustive\"\n";
    std::fs::write(dir.path().join("plan.toml"), plan).unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        format!("[run]\nruns_dir = \"runs\"\nplan = \"plan.toml\"\ntemplates_dir = \"{}\"\n", repo_root().join("kernel-templates").display()),
    )
    .unwrap();
    let mut device = h100(13000);
    device["cc_major"] = json!(cc.0);
    device["cc_minor"] = json!(cc.1);
    device["arch"] = json!(format!("sm_{}{}", cc.0, cc.1));
    let script = json!({ "device": device, "default": { "ok": { "us": 10.0 } } });
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    dir
}

#[tokio::test]
async fn doctor_compiles_for_sm_90a_on_hopper_and_names_the_templates_using_it() {
    let dir = hopper_project((9, 0));
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    let text = report.text();
    let arch = report.check("arch").unwrap_or_else(|| panic!("no arch check:\n{text}"));
    assert_eq!(arch.status, Status::Ok, "{text}");
    assert!(arch.detail.contains("NVRTC compiles for sm_90a") && arch.detail.contains("test-tensor-map-probe"), "{text}");
    assert!(arch.detail.contains("the others sm_90"), "{text}");
    assert!(!report.failed(), "{text}");
}

#[tokio::test]
async fn doctor_says_hopper_templates_are_skipped_on_an_sm_89_gpu() {
    let dir = hopper_project((8, 9));
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    let text = report.text();
    let arch = report.check("arch").unwrap();
    assert_eq!(arch.status, Status::Ok, "{text}");
    assert!(arch.detail.contains("skipped") && arch.detail.contains("test-tensor-map-probe needs sm_90a (compute capability 9.0); this GPU is sm_89"), "{text}");
    // No GPU at all: nothing to say about targets.
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("no-such-script.json"))).await;
    assert_eq!(status_of(&report, "arch"), Status::Skip);
}

/// A plan whose exhaustive stage has more points than it tries (a knob its `space` leaves open):
/// doctor warns, naming the plan file, the stage, the unpinned knob and the fix.
#[tokio::test]
async fn doctor_warns_of_an_exhaustive_stage_that_stops_before_its_space_ends() {
    let dir = hopper_project((9, 0));
    let plan = "[[stage]]\nname = \"baseline\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\n\n\
                [[stage]]\nname = \"hopper\"\ntemplate = \"wgmma_tma.cu\"\nsearch = \"exhaustive\"\nmax_candidates = 16\n\
                space = { BLOCK_N = [128, 192], STAGES = [2], CONSUMERS = [3, 2], PINGPONG = [1], OVERLAP = [1, 0], PERSISTENT = [1, 0], LAZY_RESCALE = [1], EPI_TMA = [0], PACK_GQA = [0], STREAM_K = [0], LPT_MIB = [8], DYNAMIC = [0], Q_STAGES = [1], PV_WAIT = [1], CLUSTER_SPLIT = [0] }\n";
    std::fs::write(dir.path().join("plan.toml"), plan).unwrap();
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    let text = report.text();
    let check = report.check("plan").unwrap();
    assert_eq!(check.status, Status::Warn, "{text}");
    assert!(check.detail.contains("plan.toml") && check.detail.contains("stage `hopper`"), "{text}");
    assert!(check.detail.contains("32 points") && check.detail.contains("first 16") && check.detail.contains("unpinned: TAIL_SPLIT"), "{text}");
    assert!(check.fix.as_deref().unwrap_or("").contains("max_candidates"), "{text}");
    assert!(!report.failed(), "{text}");

    // Pinned: the plan is fine again.
    std::fs::write(dir.path().join("plan.toml"), plan.replace("LAZY_RESCALE = [1],", "LAZY_RESCALE = [1], TAIL_SPLIT = [1],")).unwrap();
    let report = doctor::doctor(&options(dir.path(), &dir.path().join("script.json"))).await;
    assert_eq!(status_of(&report, "plan"), Status::Ok, "{}", report.text());
}
