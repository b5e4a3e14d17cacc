//! Running the built binary as a user would, and ledgers made without a GPU: runs with
//! iterations written through the library, a worker script that finds no GPU, a closed
//! output pipe, and another user (for read-only files when the tests run as root).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use optimizerd::spec::states::RunState;
use optimizerd::storage::ledger::{BestRow, IterationRecord, Ledger, NewRun, ShapeRecord};
use serde_json::json;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_optimizerd")
}

/// What a command did: its exit code (None: killed by a signal) and its output.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

fn finish(mut cmd: Command) -> Ran {
    let o = cmd.env_remove(optimizerd::failpoint::ENV).env_remove("RUST_BACKTRACE").output().expect("run optimizerd");
    Ran { code: o.status.code(), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

/// `optimizerd ARGS` in folder `dir`.
pub fn run_in(dir: &Path, args: &[&str]) -> Ran {
    let mut cmd = Command::new(bin());
    cmd.current_dir(dir).args(args).stdin(Stdio::null());
    finish(cmd)
}

/// `optimizerd ARGS` in `dir` writing into a pipe whose reader is already gone.
pub fn run_into_closed_pipe(dir: &Path, args: &[&str]) -> Ran {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors we own; the reader is closed at once.
    let writer = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1])
    };
    let mut cmd = Command::new(bin());
    cmd.current_dir(dir).args(args).stdin(Stdio::null()).stdout(Stdio::from(writer)).stderr(Stdio::piped());
    let o = cmd.env_remove(optimizerd::failpoint::ENV).output().expect("run optimizerd");
    Ran { code: o.status.code(), stdout: String::new(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

/// Whether this process can run commands as `nobody` (it is root, where file modes do
/// not stop writes): then read-only files are tried as that user.
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) only reads.
    unsafe { libc::geteuid() == 0 }
}

/// `optimizerd ARGS` in `dir` as a user for whom files of mode 0444 are read-only:
/// `nobody` when the tests run as root, else the current user.
pub fn run_as_reader(dir: &Path, args: &[&str]) -> Ran {
    let mut cmd = Command::new(bin());
    cmd.current_dir(dir).args(args).stdin(Stdio::null()).env("HOME", dir);
    if is_root() {
        // SAFETY: setgid/setuid between fork and exec, nothing else.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    finish(cmd)
}

/// A worker script (for `--worker-script`) that never finds a GPU: every start fails.
pub fn no_gpu_script(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("no-gpu.json");
    let script = json!({ "device": super::h100(), "rules": [], "default": "wrong",
        "state_file": dir.join("no-gpu.count"), "fail_starts": (1..=100).collect::<Vec<u32>>() });
    std::fs::write(&path, script.to_string()).unwrap();
    path
}

/// Add run `id` to the ledger at `db` as a finished (or `state`) run with `iterations`
/// recorded iterations, in well under a second.
pub async fn add_run(db: &Path, id: &str, state: RunState, iterations: i64) {
    let ledger = Ledger::open(db).await.unwrap();
    let shape = optimizerd::spec::protocol::Shape::mha(1, 1, 128, 64, false, optimizerd::spec::protocol::DType::Fp16);
    ledger
        .create_run(&NewRun {
            id: id.into(),
            started_at: optimizerd::storage::ledger::now(),
            budget_s: 300.0,
            run_dir: db.parent().unwrap().join(id).display().to_string(),
            config_source: "agent.toml".into(),
            plan_path: "strategies/default.toml".into(),
            config_json: "{}".into(),
            workload_json: serde_json::to_string(&[shape]).unwrap(),
            pid: 1,
        })
        .await
        .unwrap();
    if iterations > 0 {
        ledger.set_device(id, &super::h100()).await.unwrap();
    }
    for seq in 1..=iterations {
        let us = 100.0 - seq as f64;
        let best = [BestRow { shape: shape.key(), seq, median_us: us, baseline_us: Some(100.0), source_path: "kernels/k.cu".into(), git_commit: None }];
        let rec = IterationRecord {
            run_id: id.into(),
            seq,
            stage: "baseline".into(),
            template: "baseline".into(),
            params_json: json!({ "WARPS_PER_CTA": 4 }).to_string(),
            verdict: if seq == 1 { "baseline" } else { "accepted" }.parse().unwrap(),
            reason: format!("iteration {seq}"),
            started_at: optimizerd::storage::ledger::now(),
            finished_at: optimizerd::storage::ledger::now(),
            shapes: vec![ShapeRecord { shape: shape.key(), shape_json: serde_json::to_string(&shape).unwrap(), median_us: Some(us), won: true, ..Default::default() }],
            ..Default::default()
        };
        ledger.record_iteration(&rec, &best, seq as f64).await.unwrap();
    }
    if state != RunState::Running {
        ledger.finish_run(id, state, "as the test made it", iterations as f64).await.unwrap();
    }
    ledger.close().await;
}

/// Change one column of run `id` behind the library's back, as a damaged or foreign row.
pub async fn set_column(db: &Path, id: &str, column: &str, value: serde_json::Value) {
    use sqlx::ConnectOptions;
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new().filename(db).connect().await.unwrap();
    let sql = format!("UPDATE runs SET {column} = ? WHERE id = ?");
    let q = sqlx::query(&sql);
    let q = match value {
        serde_json::Value::String(s) => q.bind(s),
        serde_json::Value::Number(n) => q.bind(n.as_f64().unwrap()),
        other => q.bind(other.to_string()),
    };
    q.bind(id).execute(&mut conn).await.unwrap();
}
