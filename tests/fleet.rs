//! Several machines, one group: two projects (each its own folder, ledger and scripted
//! GPU, standing for two machines) start the same group id against one real PostgreSQL
//! server (started by the test, Debian's package installed by scripts/setup.sh).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::bin;
use common::postgres::Postgres;
use common::{h100, kv_split_plan, kv_split_rules, Project};
use optimizerd::spec::states::{ItemState, RunState};
use optimizerd::storage::fleet::Fleet;
use optimizerd::storage::ledger::Ledger;

/// A machine named `name` with one scripted H100, three shape classes, and the fleet `url`.
fn machine(name: &str, url: &str, step_delay_ms: u64) -> Project {
    let p = Project::new(&kv_split_plan("1, 8, 16"), kv_split_rules(), serde_json::json!({ "ok": { "us": 200.0 } }));
    p.set_workload(r#"shapes = [ { b = 1, h = 1, s = 128, d = 64 }, { b = 2, h = 8, s = 512, d = 128, causal = true }, { b = 1, h = 4, s = 256, d = 128 } ]"#);
    p.set_device(&h100());
    p.set_step_delay_ms(step_delay_ms);
    p.append_config(&format!("\n[fleet]\nledger = \"{url}\"\nlease = \"10s\"\nmachine = \"{name}\"\n"));
    p
}

fn start(p: &Project, group: &str, budget: &str) -> Child {
    Command::new(bin())
        .current_dir(p.path())
        .args(["--config", "agent.toml", "start", "--gpus", "all", "--budget", budget, "--run-id", group, "--foreground", "--worker-script", "script.json"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(c: Child) -> String {
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{}: {err}", o.status);
    err
}

async fn local_runs(p: &Path) -> Vec<String> {
    match Ledger::open_read_only(&p.join("runs/optimizer.db")).await {
        Ok(l) => l.runs().await.unwrap().into_iter().map(|r| r.id).collect(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test]
async fn two_machines_share_a_group_and_its_memory_without_duplicates() {
    let pg = Postgres::start();
    let (a, b) = (machine("a", &pg.url(), 60), machine("b", &pg.url(), 60));
    let (ca, cb) = (start(&a, "fleet1", "2m"), start(&b, "fleet1", "2m"));
    let (ea, eb) = (finish(ca), finish(cb));
    assert!(ea.contains("group fleet1") && eb.contains("group fleet1"), "{ea}\n{eb}");
    let fleet = Fleet::connect(&pg.url()).await.unwrap();
    let g = fleet.group("fleet1").await.unwrap();
    assert_eq!(g.state, RunState::Finished, "{:?}", g.message);
    let items = fleet.items("fleet1").await.unwrap();
    assert_eq!(items.len(), 3);
    let (runs_a, runs_b) = (local_runs(a.path()).await, local_runs(b.path()).await);
    let mut machines = Vec::new();
    for it in &items {
        assert_eq!((it.state, it.attempts), (ItemState::Done, 1), "{it:?}");
        let holder = it.holder.clone().unwrap();
        machines.push(holder.split(':').next().unwrap().to_string());
        // Its run is on the machine that held it, and only there.
        let (here, there) = if holder.starts_with("a:") { (&runs_a, &runs_b) } else { (&runs_b, &runs_a) };
        assert!(here.contains(&it.run_id) && !there.contains(&it.run_id), "{} ran twice or nowhere", it.run_id);
    }
    machines.sort();
    machines.dedup();
    assert_eq!(machines, ["a", "b"], "both machines took items");
    // Each machine shared what its finished runs measured.
    let shared_a = fleet.memory_of_others("b").await.unwrap();
    let shared_b = fleet.memory_of_others("a").await.unwrap();
    assert!(!shared_a.is_empty() && !shared_b.is_empty());
    assert!(shared_a.iter().all(|m| m.machine == "a" && runs_a.contains(&m.run_id)));

    // Each machine's own tools know the group: its queue read from the fleet database.
    let status = common::cli::run_in(a.path(), &["--config", "agent.toml", "status", "fleet1"]);
    assert!(status.stdout.contains("group fleet1 (finished") && status.stdout.contains("latency-d128-causal"), "{}", status.text());
    let watch = common::cli::run_in(b.path(), &["--config", "agent.toml", "watch", "fleet1"]);
    assert_eq!(watch.code, Some(0), "{}", watch.text());
    assert!(common::cli::run_in(b.path(), &["--config", "agent.toml", "runs"]).stdout.contains("  fleet1  finished"));

    // A second group on machine b alone: the classes machine a optimized start from what a
    // measured (memory across runs, through the fleet), re-checked and re-timed on b.
    let from_a: Vec<String> = items.iter().filter(|i| i.holder.as_deref().is_some_and(|h| h.starts_with("a:"))).map(|i| i.class.clone()).collect();
    finish(start(&b, "fleet2", "1m"));
    let lb = Ledger::open_read_only(&b.path().join("runs/optimizer.db")).await.unwrap();
    for class in &from_a {
        let run = format!("fleet2-{class}");
        let its = lb.iterations(&run).await.unwrap();
        assert!(its.iter().any(|i| i.stage == "warm-start"), "{run} did not warm-start from machine a's memory: {:?}", its.iter().map(|i| &i.stage).collect::<Vec<_>>());
    }
}

#[tokio::test]
async fn a_machine_that_dies_releases_its_item_by_lease_and_another_finishes_it() {
    let pg = Postgres::start();
    let (a, b) = (machine("a", &pg.url(), 150), machine("b", &pg.url(), 20));
    // A long budget for the machine that dies: each item gets a third of it, and on a loaded
    // CI machine (every test of this file at once, NVRTC compiling for five daemons) the
    // first iteration must land before the item's budget could end its run.
    let mut ca = start(&a, "fleet3", "15m");
    // Machine a takes the first item; once its run has an iteration, the machine dies:
    // its coordinator and its daemon killed at once.
    let victim = "fleet3-latency-d64";
    let t0 = Instant::now();
    loop {
        if let Ok(l) = Ledger::open_read_only(&a.path().join("runs/optimizer.db")).await {
            if l.run(Some(victim)).await.is_ok_and(|r| r.iterations >= 1) {
                break;
            }
        }
        let exited = ca.try_wait().unwrap();
        if exited.is_some() || t0.elapsed() > Duration::from_secs(300) {
            let _ = ca.kill();
            let o = ca.wait_with_output().unwrap();
            let log = std::fs::read_to_string(a.path().join("runs").join(victim).join("run.log")).unwrap_or_default();
            panic!(
                "machine a recorded no iteration of {victim} in {:?} (coordinator {}):\n{}\n--- run.log:\n{log}",
                t0.elapsed(),
                exited.map_or("still running".to_string(), |s| s.to_string()),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let daemon: i32 = std::fs::read_to_string(a.path().join("runs").join(victim).join("daemon.pid")).unwrap().trim().parse().unwrap();
    // SAFETY: kill(2) of processes this test started.
    unsafe {
        libc::kill(ca.id() as i32, libc::SIGKILL);
        libc::kill(daemon, libc::SIGKILL);
    }
    let _ = ca.wait_with_output();
    let fleet = Fleet::connect(&pg.url()).await.unwrap();
    let held = fleet.items("fleet3").await.unwrap().into_iter().find(|i| i.run_id == victim).unwrap();
    assert_eq!(held.state, ItemState::Running);
    assert!(held.holder.as_deref().unwrap().starts_with("a:"));
    // Machine b joins: the other items at once, a's item once its lease has run out.
    let t1 = Instant::now();
    let err = finish(start(&b, "fleet3", "3m"));
    assert!(err.contains("joined group fleet3"), "{err}");
    let items = fleet.items("fleet3").await.unwrap();
    for it in &items {
        assert_eq!(it.state, ItemState::Done, "{it:?}");
        assert!(it.holder.as_deref().unwrap().starts_with("b:"), "{it:?}");
    }
    let retaken = items.iter().find(|i| i.run_id == victim).unwrap();
    assert_eq!(retaken.attempts, 2);
    assert!(t1.elapsed() >= Duration::from_secs(5), "taken before its lease could have passed");
    assert_eq!(fleet.group("fleet3").await.unwrap().state, RunState::Finished);
    assert!(local_runs(b.path()).await.contains(&victim.to_string()));
}

#[tokio::test]
async fn a_machine_with_another_gpu_model_cannot_join() {
    let pg = Postgres::start();
    let a = machine("a", &pg.url(), 0);
    finish(start(&a, "fleet4", "20s"));
    let b = machine("b", &pg.url(), 0);
    b.set_device(&common::l4());
    let o = start(&b, "fleet4", "20s").wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("results are kept per GPU model") && err.contains("NVIDIA L4"), "{err}");
}
