//! A ledger written by the previous release resumes after this release's migration.
//!
//! `tests/fixtures/ledger-719c150.tar.gz` is the `runs/` folder of a run made by the
//! release at commit 719c150 (schema version 7; events carried their data only in the
//! message text), killed by `OPTIMIZERD_FAILPOINT=iteration-begun@5` in the middle of its
//! `kv-split` stage (its WAL not yet checkpointed). Made with `common::PLAN` and
//! `common::kv_split_rules` (and `[baseline] sdpa = false`):
//! `optimizerd start --budget 10m --foreground --run-id prev --seed 7 --worker-script script.json`.

mod common;

use std::process::Command;

use common::{kv_split_rules, Project, PLAN};
use optimizerd::storage::ledger::{Event, Ledger, LedgerError};
use serde_json::json;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::ConnectOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_of_the_previous_release_resumes_after_the_migration() {
    let p = Project::new(PLAN, kv_split_rules(), json!({ "ok": { "us": 500.0 } }));
    p.append_config("\n[baseline]\nsdpa = false\n");
    p.without_screening(); // the expected verdicts include a slow kernel's check failure
    let fixture = common::repo_root().join("tests/fixtures/ledger-719c150.tar.gz");
    let o = Command::new("tar").arg("xzf").arg(&fixture).current_dir(p.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // The file as the old release left it: schema 7, and the run's plan where it was made
    // (moved here, as a user moving a project would have it).
    {
        let mut conn = SqliteConnectOptions::new().filename(p.db()).connect().await.unwrap();
        let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations").fetch_one(&mut conn).await.unwrap();
        assert_eq!(version, 7, "the fixture predates the typed events");
        let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info('events')").fetch_all(&mut conn).await.unwrap();
        assert!(!columns.contains(&"data_json".to_string()), "{columns:?}");
        sqlx::query("UPDATE runs SET plan_path = ?, config_source = ?")
            .bind(p.path().join("plan.toml").display().to_string())
            .bind(p.path().join("agent.toml").display().to_string())
            .execute(&mut conn)
            .await
            .unwrap();
    }

    let o = Command::new(env!("CARGO_BIN_EXE_optimizerd"))
        .current_dir(p.path())
        .args(["resume", "prev", "--foreground", "--worker-script"])
        .arg(p.path().join("script.json"))
        .env_remove(optimizerd::failpoint::ENV)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "resume: {text}");

    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("prev").await.unwrap();
    let got: Vec<(i64, &str, &str)> = its.iter().map(|i| (i.seq, i.stage.as_str(), i.verdict.as_str())).collect();
    assert_eq!(
        got,
        vec![
            (1, "baseline", "baseline"),
            (2, "planted-oob-write", "crashed"),
            (3, "kv-split", "rejected"),
            (4, "kv-split", "compile_error"),
            (5, "kv-split", "interrupted"),
            (6, "kv-split", "incorrect"),
            (7, "kv-split", "accepted"),
            (8, "kv-split-deep", "accepted"),
        ],
        "the resumed run continues the stage where the old release stopped"
    );
    assert_eq!(ledger.run(Some("prev")).await.unwrap().state.to_string(), "finished");

    // The old free-text `stage_start` events were converted, and resume read them: the
    // kv-split stage did not start (and record its start) a second time.
    let events = ledger.events("prev").await.unwrap();
    let starts: Vec<&Event> = events.iter().filter_map(|e| e.data.as_ref()).filter(|d| matches!(d, Event::StageStart { .. })).collect();
    let kv_split: Vec<&&Event> = starts.iter().filter(|e| matches!(e, Event::StageStart { stage, .. } if stage == "kv-split")).collect();
    assert_eq!(kv_split.len(), 1, "{events:#?}");
    let Event::StageStart { start, .. } = kv_split[0] else { unreachable!() };
    assert_eq!(serde_json::to_value(start).unwrap(), json!({ "BLOCK_M": 32, "MAX_SPLITS": 1, "NUM_WARPS": 4 }));
    assert!(starts.iter().any(|e| matches!(e, Event::StageStart { stage, .. } if stage == "kv-split-deep")), "{events:#?}");
}

/// A daemon creating its ledger and a command opening the same file meanwhile (`status` in a
/// loop, or a test waiting for the first iteration) both find migrations to apply: they must
/// not apply the same one twice. CI once saw a coordinator exit with LEDGER 173 ms after its
/// start while its test polled the ledger read-only (which upgrades an older file in place).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opening_a_ledger_while_it_is_created_applies_each_migration_once() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..40 {
        let path = dir.path().join(format!("race{i}.db"));
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let p = path.clone();
                tokio::spawn(async move { Ledger::open(&p).await.map(|_| ()) })
            })
            .collect();
        // A reader polling until the file is a ledger, as `status` or a test would.
        let reader = {
            let p = path.clone();
            tokio::spawn(async move {
                for _ in 0..200 {
                    match Ledger::open_read_only(&p).await {
                        Ok(_) => return Ok(()),
                        Err(LedgerError::NotFound { .. } | LedgerError::Empty { .. }) => tokio::task::yield_now().await,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
        };
        for w in writers {
            w.await.unwrap().unwrap_or_else(|e| panic!("round {i}: a writer failed: {e}: {e:?}"));
        }
        reader.await.unwrap().unwrap_or_else(|e| panic!("round {i}: the reader failed: {e}"));
    }
}
