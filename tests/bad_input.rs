//! Issue 23, each bullet of its "Why" as a regression test that runs the built binary as
//! a new user on a machine without a GPU would: absurd budgets and one bad ledger row,
//! closed pipes, `resume` after a start that found no GPU, a damaged or read-only
//! ledger, a plan naming a missing template, errors said once with distinct exit codes,
//! and a command line that matches its documentation.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cli::{add_run, no_gpu_script, run_as_reader, run_in, run_into_closed_pipe, set_column, Ran};
use common::Project;
use optimizerd::cli::exit;
use optimizerd::spec::states::RunState;
use optimizerd::storage::ledger::Ledger;
use serde_json::json;

fn assert_no_panic(r: &Ran) {
    assert!(!r.text().contains("panicked"), "{}", r.text());
}

fn assert_code(r: &Ran, code: u8) {
    assert_no_panic(r);
    assert_eq!(r.code, Some(code as i32), "{}", r.text());
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

const ONE_STAGE: &str = "[[stage]]\nname = \"baseline\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\nmax_candidates = 1\n\n[open_phase]\nenabled = false\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_budget_is_refused_and_one_bad_row_never_breaks_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r = run_in(d, &["start", "--budget", "18446744073709551615s", "--foreground"]);
    assert_code(&r, exit::USAGE);
    assert!(r.stderr.contains("longer than 30 days") && r.stderr.contains("write e.g. 45s"), "{}", r.stderr);
    assert!(!d.join("runs").exists(), "a refused start leaves nothing");

    // A ledger as an older release left it: a failed run with that budget stored, and a
    // run in a state this release does not know, beside a good run.
    let db = d.join("runs/optimizer.db");
    add_run(&db, "good", RunState::Finished, 3).await;
    add_run(&db, "huge", RunState::Failed, 0).await;
    set_column(&db, "huge", "budget_s", json!(18446744073709551615.0f64)).await;
    add_run(&db, "alien", RunState::Finished, 1).await;
    set_column(&db, "alien", "state", json!("exploded")).await;

    let r = run_in(d, &["runs"]);
    assert_code(&r, exit::SUCCESS);
    let line = |id: &str| r.stdout.lines().find(|l| l.starts_with(id)).unwrap_or_else(|| panic!("no line for {id}: {}", r.stdout)).to_string();
    assert!(line("good").contains("finished") && line("good").contains("1.03x"), "{}", r.stdout);
    assert!(line("huge").contains("unreadable") && line("huge").contains("budget_s") && line("huge").contains("optimizerd forget huge"), "{}", r.stdout);
    assert!(line("alien").contains("unreadable") && line("alien").contains("exploded"), "{}", r.stdout);
    let r = run_in(d, &["runs", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let errors: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|v| v["error"].as_str().and(v["id"].as_str())).collect();
    assert_eq!(errors.len(), 2, "{listed:#}");
    assert!(listed.as_array().unwrap().iter().any(|v| v["run"]["id"] == "good"), "{listed:#}");

    for cmd in [&["status", "good"][..], &["history", "good"], &["report", "good", "--out", "rep"]] {
        assert_code(&run_in(d, cmd), exit::SUCCESS);
    }
    for cmd in [&["status", "huge"][..], &["watch", "huge"], &["report", "huge"], &["history", "alien"], &["export", "huge", "--out", "x"], &["resume", "huge"]] {
        let r = run_in(d, cmd);
        assert_code(&r, exit::LEDGER);
        assert!(r.stderr.contains("cannot be read from the ledger") && r.stderr.contains("optimizerd forget"), "{cmd:?}: {}", r.stderr);
    }
    // One iteration a newer release wrote: named in its place, the others listed.
    {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new().filename(&db).connect().await.unwrap();
        sqlx::query("UPDATE iterations SET verdict = 'transcended' WHERE run_id = 'good' AND seq = 2").execute(&mut conn).await.unwrap();
    }
    let r = run_in(d, &["history", "good"]);
    assert_code(&r, exit::SUCCESS);
    assert!(r.stdout.contains("3 iterations") && r.stdout.contains("iteration 3") && r.stdout.contains("iteration 1"), "{}", r.stdout);
    assert!(r.stdout.lines().any(|l| l.trim_start().starts_with("2  unreadable:") && l.contains("transcended")), "{}", r.stdout);
    let r = run_in(d, &["status", "good"]);
    assert_code(&r, exit::SUCCESS);
    assert!(r.stdout.contains("1 baseline, 1 accepted, 1 unreadable: #2"), "{}", r.stdout);
    let r = run_in(d, &["report", "good", "--out", "rep-unreadable", "--json"]);
    assert_code(&r, exit::SUCCESS);
    let w: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let notes = w["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("could not be read") && n.as_str().unwrap().contains("#2")), "{w}");

    let r = run_in(d, &["forget", "huge", "alien"]);
    assert_code(&r, exit::SUCCESS);
    let r = run_in(d, &["runs"]);
    assert!(!r.stdout.contains("huge") && !r.stdout.contains("alien") && r.stdout.contains("good"), "{}", r.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    add_run(&dir.path().join("runs/optimizer.db"), "r1", RunState::Finished, 40).await;
    for cmd in [&["history"][..], &["history", "--csv"], &["history", "--json"], &["runs"], &["status"], &["--help"], &["completions", "bash"], &["man"]] {
        let r = run_into_closed_pipe(dir.path(), cmd);
        assert_code(&r, exit::SUCCESS);
        assert!(r.stderr.is_empty(), "{cmd:?}: {}", r.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_checks_like_start_and_a_failed_start_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = no_gpu_script(d);
    let script = script.to_str().unwrap();
    for fg in [false, true] {
        let mut args = vec!["start", "--budget", "5m", "--worker-script", script];
        if fg {
            args.push("--foreground");
        }
        let r = run_in(d, &args);
        assert_code(&r, exit::NO_GPU);
        assert_eq!(r.text().matches("the GPU is not usable").count(), 1, "{}", r.text());
        assert!(r.text().contains("nothing was recorded") && r.text().contains("optimizerd doctor") && r.text().contains("CUDA_ERROR_NO_DEVICE"), "{}", r.text());
    }
    let left: Vec<String> = std::fs::read_dir(d.join("runs")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, vec!["gpu.lock".to_string()], "failed starts leave no run folder and no ledger");
    let r = run_in(d, &["resume", "--worker-script", script]);
    assert_code(&r, exit::NOT_FOUND);

    // A failed run (an older release recorded failed starts) is not resumable, and says why.
    let db = d.join("runs/optimizer.db");
    add_run(&db, "old", RunState::Failed, 0).await;
    let r = run_in(d, &["resume", "old", "--worker-script", script]);
    assert_code(&r, exit::NOT_RESUMABLE);
    assert!(r.stderr.contains("cannot be resumed") && r.stderr.contains("optimizerd start") && r.stderr.contains("optimizerd forget old"), "{}", r.stderr);
    let r = run_in(d, &["resume", "--worker-script", script]);
    assert_code(&r, exit::NOT_FOUND);
    assert!(r.stderr.contains("no run to resume"), "{}", r.stderr);

    // An interrupted run and no GPU: refused at once, like start, and left as it was.
    add_run(&db, "paused", RunState::Interrupted, 2).await;
    let t0 = Instant::now();
    let r = run_in(d, &["resume", "--worker-script", script]);
    assert_code(&r, exit::NO_GPU);
    assert!(t0.elapsed() < Duration::from_secs(20), "resume waited {:?} for a GPU", t0.elapsed());
    assert!(r.text().contains("cannot resume run paused: the GPU is not usable; the run is unchanged"), "{}", r.text());
    let l = Ledger::open_read_only(&db).await.unwrap();
    assert_eq!(l.run(Some("paused")).await.unwrap().state.recorded, RunState::Interrupted);
    assert_eq!(l.iterations("paused").await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_ledger_is_said_once_with_the_fix_and_doctor_opens_it() {
    let p = Project::new(ONE_STAGE, json!([]), json!({ "ok": { "us": 50.0 } }));
    let db = p.db();
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    std::fs::write(&db, "this is not a database\n".repeat(200)).unwrap();
    let script = p.path().join("script.json");
    for cmd in [&["runs"][..], &["status"], &["history"], &["watch"], &["report"], &["resume"], &["forget", "x"], &["runs", "--prune"]] {
        let r = run_in(p.path(), cmd);
        assert_code(&r, exit::LEDGER);
        let t = r.text();
        assert!(t.contains("is damaged") && t.contains("mv ") && t.contains("each run's folder"), "{cmd:?}: {t}");
        assert_eq!(t.matches("file is not a database").count(), 1, "{cmd:?}: the cause once: {t}");
        assert_eq!(t.matches("error:").count(), 1, "{cmd:?}: {t}");
    }
    let r = run_in(p.path(), &["start", "--budget", "1m", "--foreground", "--worker-script", script.to_str().unwrap()]);
    assert_code(&r, exit::LEDGER);

    // doctor opens it and runs PRAGMA quick_check: damaged, then truncated, then fine.
    let check = |p: &Project| {
        let p = p.path().to_path_buf();
        async move {
            let opts = optimizerd::ops::doctor::DoctorOptions {
                config: Some(p.join("agent.toml")),
                worker: optimizerd::daemon::supervisor::WorkerCommand {
                    program: common::cli::bin().into(),
                    args: vec!["worker".into(), "--script".into(), p.join("script.json").display().to_string()],
                    env: vec![],
                },
                gpu_timeout: Duration::from_secs(20),
                python: "python3-that-does-not-exist".into(),
                python_timeout: Duration::from_secs(5),
            };
            optimizerd::ops::doctor::doctor(&opts).await.check("ledger").cloned().expect("a ledger check")
        }
    };
    let c = check(&p).await;
    assert_eq!(c.status, optimizerd::ops::doctor::Status::Fail, "{c:?}");
    assert!(c.detail.contains("damaged") && c.fix.as_deref().unwrap_or("").contains("mv"), "{c:?}");
    std::fs::remove_file(&db).unwrap();
    add_run(&db, "r1", RunState::Finished, 200).await;
    let c = check(&p).await;
    assert_eq!(c.status, optimizerd::ops::doctor::Status::Ok, "{c:?}");
    assert!(c.detail.contains("quick_check ok") && c.detail.contains("1 run"), "{c:?}");
    let len = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&db).unwrap().set_len(len / 2).unwrap();
    let c = check(&p).await;
    assert_eq!(c.status, optimizerd::ops::doctor::Status::Fail, "a truncated ledger: {c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_ledger_serves_every_command_that_only_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    chmod(d, 0o755);
    let db = d.join("runs/optimizer.db");
    add_run(&db, "r1", RunState::Finished, 3).await;
    let out = tempfile::tempdir().unwrap();
    chmod(out.path(), 0o777);
    let report_dir = out.path().join("rep");
    // First a read-only file in a writable folder, then a read-only folder too (no `-shm`
    // can be made beside the file: it is read as it is).
    for folder_mode in [0o777, 0o555] {
        chmod(&db, 0o444);
        chmod(&d.join("runs"), folder_mode);
        for cmd in [&["runs"][..], &["status"], &["status", "r1", "--json"], &["history"], &["history", "--csv"], &["report", "--out", report_dir.to_str().unwrap()]] {
            let r = run_as_reader(d, cmd);
            assert_code(&r, exit::SUCCESS);
            assert!(!r.text().contains("readonly"), "{cmd:?}: {}", r.text());
        }
        let r = run_as_reader(d, &["forget", "r1"]);
        assert_code(&r, exit::LEDGER);
        assert_eq!(r.text().matches("read-only").count(), 1, "{}", r.text());
        assert!(r.text().contains("chmod u+w"), "{}", r.text());
    }
    chmod(&d.join("runs"), 0o755);
    chmod(&db, 0o644);
    assert_eq!(Ledger::open_read_only(&db).await.unwrap().runs().await.unwrap().len(), 1, "nothing was changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_naming_a_missing_template_names_the_plan_and_stage_and_leaves_nothing() {
    let plan = ONE_STAGE.replace("baseline.cu", "nope.cu");
    let p = Project::new(&plan, json!([]), json!({ "ok": { "us": 50.0 } }));
    let script = p.path().join("script.json");
    for fg in [false, true] {
        let mut args = vec!["start", "--budget", "1m", "--worker-script", script.to_str().unwrap()];
        if fg {
            args.push("--foreground");
        }
        let r = run_in(p.path(), &args);
        assert_code(&r, exit::CONFIG);
        let t = r.text();
        assert!(t.contains("plan.toml") && t.contains("stage `baseline`") && t.contains("nope.cu") && t.contains("fix the stage's `template`"), "{t}");
        assert_eq!(t.matches("error:").count(), 1, "{t}");
    }
    assert!(!p.path().join("runs").exists() || std::fs::read_dir(p.path().join("runs")).unwrap().all(|e| e.unwrap().file_name() == "gpu.lock"), "no run folder left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_failed_and_never_started_runs_with_their_folders() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let runs = d.join("runs");
    let db = runs.join("optimizer.db");
    add_run(&db, "good", RunState::Finished, 2).await;
    add_run(&db, "failed", RunState::Failed, 0).await;
    add_run(&db, "never", RunState::Stopped, 0).await;
    for (folder, files) in [("good", &["run.log", "workspace/x"][..]), ("failed", &["run.log", "daemon.out"]), ("leftover", &["daemon.out", "worker.log"]), ("kept", &["workspace/README.md"])] {
        for f in files {
            std::fs::create_dir_all(runs.join(folder).join(f).parent().unwrap()).unwrap();
            std::fs::write(runs.join(folder).join(f), "x").unwrap();
        }
    }
    let r = run_in(d, &["runs", "--prune"]);
    assert_code(&r, exit::SUCCESS);
    for gone in ["failed", "never", "leftover"] {
        assert!(r.stdout.contains(&format!("removed {gone} (")), "{}", r.stdout);
        assert!(!runs.join(gone).exists(), "{gone} still there");
    }
    assert!(runs.join("good").exists() && runs.join("kept/workspace").exists(), "runs with results, and folders with a workspace, stay");
    let l = Ledger::open_read_only(&db).await.unwrap();
    assert_eq!(l.runs().await.unwrap().iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), vec!["good"]);
    let r = run_in(d, &["runs", "--prune"]);
    assert!(r.stdout.contains("nothing to prune"), "{}", r.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_their_cause_once_and_distinct_outcomes_have_distinct_codes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r = run_in(d, &["--config", "nope.toml", "runs"]);
    assert_code(&r, exit::CONFIG);
    assert_eq!(r.stderr.matches("No such file").count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("nope.toml") && r.stderr.contains("check --config"), "{}", r.stderr);

    // A live run whose daemon is gone: `watch` exits DAEMON_GONE, not INTERRUPTED.
    let db = d.join("runs/optimizer.db");
    add_run(&db, "gone", RunState::Running, 1).await;
    std::fs::create_dir_all(d.join("runs/gone")).unwrap();
    std::fs::write(d.join("runs/gone/run.log"), "").unwrap();
    let r = run_in(d, &["watch", "gone"]);
    assert_code(&r, exit::DAEMON_GONE);
    assert_ne!(exit::DAEMON_GONE, exit::INTERRUPTED);
    let codes: std::collections::BTreeSet<u8> = exit::TABLE.iter().map(|(c, _, _)| *c).collect();
    assert_eq!(codes.len(), exit::TABLE.len(), "one meaning per code");

    // README's table is the binary's.
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).unwrap();
    for (code, name, meaning) in exit::TABLE {
        assert!(readme.contains(&format!("| {code} | `{name}` | {meaning} |")), "README lacks exit code {code} ({name}: {meaning})");
    }
    let r = run_in(d, &["--help"]);
    assert!(r.stdout.contains("Exit status:") && r.stdout.contains(exit::TABLE[10].2), "{}", r.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_matches_its_documentation() {
    let p = Project::new(ONE_STAGE, json!([]), json!({ "ok": { "us": 50.0 } }));
    add_run(&p.db(), "r1", RunState::Finished, 1).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let config = p.path().join("agent.toml");
    let config = config.to_str().unwrap();
    for args in [&["--config", config, "runs"][..], &["runs", "--config", config]] {
        let r = run_in(elsewhere.path(), args);
        assert_code(&r, exit::SUCCESS);
        assert!(r.stdout.contains("r1"), "{args:?}: paths in the config are relative to its folder: {}", r.text());
    }
    // Help as one line of words: wrapping depends on the terminal.
    let help = |cmd: &str| run_in(elsewhere.path(), &[cmd, "--help"]).stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help("watch").contains("JSON Lines"), "{}", help("watch"));
    for v in optimizerd::spec::states::Verdict::ALL {
        assert!(help("history").contains(v.as_str()), "history --help lacks {v}");
    }
    for cmd in ["start", "resume", "watch", "stop", "runs", "forget", "history", "status", "doctor", "export", "report", "completions", "man"] {
        let h = help(cmd);
        assert!(h.contains("Examples:") && h.contains("--config <FILE>") && h.contains("relative to its folder"), "{cmd} --help: {h}");
    }
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let r = run_in(elsewhere.path(), &["completions", shell]);
        assert_code(&r, exit::SUCCESS);
        assert!(r.stdout.contains("optimizerd") && r.stdout.contains("resume") && r.stdout.contains("budget"), "{shell}");
    }
    let r = run_in(elsewhere.path(), &["man"]);
    assert!(r.stdout.starts_with(".ie") || r.stdout.contains(".TH optimizerd"), "{}", r.stdout);
    let r = run_in(elsewhere.path(), &["man", "--out", "pages"]);
    assert_code(&r, exit::SUCCESS);
    assert!(std::fs::read_to_string(elsewhere.path().join("pages/optimizerd-start.1")).unwrap().contains("budget"));
    for (args, says) in [(&["start", "--budget", "5m", "--seed", "-5"][..], "whole number"), (&["start", "--budget", "-5m"], "negative"), (&["stop", "--wait", "-1s"], "negative")] {
        let r = run_in(elsewhere.path(), args);
        assert_code(&r, exit::USAGE);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).unwrap();
    for needed in ["JSON Lines", "relative to the folder of the config file", "optimizerd completions", "--config` goes before or after"] {
        assert!(readme.contains(needed), "README lacks {needed:?}");
    }
}
