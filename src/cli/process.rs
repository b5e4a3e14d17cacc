//! Process control: running the daemon in this process (pid file, logs, signals, the
//! engine, the exit code of how the run ended), detaching it into its own session and
//! waiting until it has found its GPU or said why not, stopping it through the GPU lock,
//! and a run's live state (the ledger's, or `interrupted (daemon gone)`).

use std::ffi::OsString;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::exit;
use super::Out;
use crate::daemon::supervisor::WorkerCommand;
use crate::daemon::{lock, shutdown};
use crate::engine::{self, Mode, RunEnd, RunOptions};
use crate::ops::report;
use crate::spec::config::Config;
use crate::spec::states::{RunState, ShownState};
use crate::storage::ledger::{Ledger, LedgerError, RunRow};

pub fn runs_dir(config: &Config) -> PathBuf {
    config.resolve(&config.run.runs_dir)
}

pub fn ledger_path(config: &Config) -> PathBuf {
    runs_dir(config).join("optimizer.db")
}

/// The worker the daemon starts: this executable's `worker`, or the scripted test double.
pub fn worker_command(worker_script: Option<&Path>) -> anyhow::Result<WorkerCommand> {
    let mut w = WorkerCommand::current_exe().context("cannot find this executable to start the worker")?;
    if let Some(script) = worker_script {
        w.args = vec!["worker".into(), "--script".into(), script.display().to_string()];
    }
    Ok(w)
}

/// A run's state as the user should see it: `running` with no daemon means it was killed.
pub fn live_state(r: &RunRow, holders: &[(String, u32)]) -> ShownState {
    let alive = holders.iter().any(|h| h.0 == r.id);
    ShownState { recorded: r.state.recorded, daemon_gone: !alive }
}

/// Remove the folder of a run the ledger does not hold (a start that failed before its
/// run was recorded): a failed start leaves nothing behind.
async fn remove_unrecorded_run(config: &Config, run_id: &str) {
    let dir = runs_dir(config).join(run_id);
    let recorded = match Ledger::open_read_only(&ledger_path(config)).await {
        Ok(l) => {
            let known = !matches!(l.run(Some(run_id)).await, Err(LedgerError::NoSuchRun(_)));
            l.close().await;
            known
        }
        Err(LedgerError::NotFound { .. } | LedgerError::Empty { .. }) => false,
        Err(_) => true, // cannot tell: keep it
    };
    if !recorded {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Run in this process: pid file, logs, signals, the engine, then the summary; the exit
/// code says how the run ended.
pub async fn run_foreground(opts: RunOptions, config: &Config, run_id: &str) -> anyhow::Result<u8> {
    let new_run = opts.mode == Mode::New;
    let run_dir = runs_dir(config).join(run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
    crate::daemon::logging::init(Some(&run_dir.join("run.log")))?;
    let pid_file = run_dir.join("daemon.pid");
    std::fs::write(&pid_file, format!("{}\n", std::process::id())).with_context(|| format!("cannot write {}", pid_file.display()))?;
    let (tx, sd) = shutdown::channel();
    shutdown::spawn_signal_handler(tx);
    let result = engine::run(opts, sd).await;
    let _ = std::fs::remove_file(&pid_file);
    let (run_id, end) = match result {
        Ok(r) => r,
        Err(e) => {
            if new_run {
                remove_unrecorded_run(config, run_id).await;
            }
            return Err(e);
        }
    };
    let ledger = Ledger::open_read_only(&ledger_path(config)).await?;
    let s = report::status(&ledger, Some(&run_id)).await?;
    super::note(&format!("\n{}", report::status_text(&s)));
    Ok(match end {
        RunEnd::Finished(_) | RunEnd::Stopped => exit::SUCCESS,
        RunEnd::Failed(m) => {
            super::note(&format!("error: run {run_id} failed: {m}"));
            exit::RUN_FAILED
        }
        RunEnd::Interrupted(m) => {
            super::note(&format!("run {run_id} interrupted: {m}\nresume it with: optimizerd resume {run_id}"));
            exit::INTERRUPTED
        }
    })
}

/// Re-run `argv` (a `--foreground` command line) in its own session, its output in the
/// run folder; wait until the daemon has found its GPU, and report a daemon that exits
/// at once (no GPU, a bad plan) with its reason and exit code instead of detaching.
pub async fn detach(argv: Vec<OsString>, config: &Config, run_id: &str, out: &mut Out) -> anyhow::Result<u8> {
    use std::os::unix::process::CommandExt;
    let run_dir = runs_dir(config).join(run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
    let out_path = run_dir.join("daemon.out");
    // Kept open here: a start that fails removes its folder, and its output is read from this handle.
    let mut daemon_out = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&out_path)
        .with_context(|| format!("cannot create {}", out_path.display()))?;
    let start_of_this = daemon_out.metadata().map(|m| m.len()).unwrap_or(0);
    let mut cmd = std::process::Command::new(std::env::current_exe().context("cannot find this executable")?);
    cmd.args(&argv).stdin(std::process::Stdio::null()).stdout(daemon_out.try_clone()?).stderr(daemon_out.try_clone()?);
    // SAFETY: setsid() is async-signal-safe; it detaches the child from our terminal and session.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the daemon process")?;
    // Wait until the daemon reports its GPU (the `device` log line), so that a run that
    // cannot start at all says so here rather than in a log nobody reads.
    let log = run_dir.join("run.log");
    // A resumed run's log already holds lines of earlier processes: look past them.
    let skip = std::fs::metadata(&log).map(|m| m.len() as usize).unwrap_or(0);
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let mut text = String::new();
            daemon_out.seek(std::io::SeekFrom::Start(start_of_this))?;
            daemon_out.read_to_string(&mut text)?;
            // Its own error is its last line: say it once, as this command's error.
            let code = status.code().and_then(|c| u8::try_from(c).ok()).filter(|c| *c != exit::SUCCESS).unwrap_or(exit::FAILURE);
            let shown: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = &shown[shown.len().saturating_sub(15)..];
            // The daemon removes the folder of a start it could not record; if it died too
            // early for that, this does.
            remove_unrecorded_run(config, run_id).await;
            let kept = if run_dir.exists() { format!("; its output is in {}", out_path.display()) } else { String::new() };
            super::note(&tail.join("\n"));
            super::note(&format!("the daemon for run {run_id} exited at once ({status}){kept}"));
            return Ok(code);
        }
        if std::fs::read(&log).is_ok_and(|t| t.get(skip..).is_some_and(|new| String::from_utf8_lossy(new).contains("\"kind\":\"device\""))) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            super::note(&format!("note: the daemon has not reported its GPU yet (see `optimizerd watch {run_id}`)"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out.line(&format!("run {run_id} started in the background (pid {})", child.id()))?;
    out.line(&format!("  watch:   optimizerd watch {run_id}"))?;
    out.line(&format!("  stop:    optimizerd stop {run_id}"))?;
    out.line(&format!("  output:  {}", out_path.display()))?;
    Ok(exit::SUCCESS)
}

fn send(pid: u32, sig: i32) -> anyhow::Result<()> {
    // SAFETY: kill(2) sends a signal; no memory is involved.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        anyhow::bail!("cannot signal pid {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// `optimizerd stop`: signal the daemon (or a group's coordinator) found through the
/// locks, and wait for it.
pub async fn stop(config: &Config, run: Option<&str>, now: bool, wait: Duration, out: &mut Out) -> anyhow::Result<u8> {
    let runs = runs_dir(config);
    let holders = lock::holders(&runs);
    let run_id = match (run, holders.as_slice()) {
        (Some(id), _) => id.to_string(),
        (None, [(id, _)]) => id.clone(),
        (None, []) => return Err(exit::refuse(exit::NOT_FOUND, "no run is running (`optimizerd runs` lists them)")),
        (None, many) => {
            let ids: Vec<&str> = many.iter().map(|h| h.0.as_str()).collect();
            return Err(exit::refuse(exit::USAGE, format!("{} runs are running ({}); say which: `optimizerd stop RUN`", ids.len(), ids.join(", "))));
        }
    };
    let pid = match holders.iter().find(|h| h.0 == run_id) {
        Some((_, pid)) => *pid,
        None if crate::group::is_group(config, &run_id).await => {
            return Err(exit::refuse(exit::NOT_RESUMABLE, format!("group {run_id} is not running; continue it with `optimizerd resume {run_id}`")));
        }
        None => {
            let ledger = Ledger::open_read_only(&ledger_path(config)).await?;
            let row = ledger.run(Some(&run_id)).await?;
            let what = if row.state.recorded == RunState::Finished {
                "nothing to stop".to_string()
            } else {
                format!("its daemon is gone; continue it with `optimizerd resume {run_id}`")
            };
            return Err(exit::refuse(exit::NOT_RESUMABLE, format!("run {run_id} is not running (ledger state: {}); {what}", row.state)));
        }
    };
    // The pid file is a convenience; the lock is the truth. Say when they disagree.
    let pid_file = runs.join(&run_id).join("daemon.pid");
    let is_group = crate::group::is_group(config, &run_id).await;
    match std::fs::read_to_string(&pid_file).ok().map(|t| t.trim().parse::<u32>()) {
        Some(Ok(p)) if p == pid => {}
        Some(Ok(p)) => super::note(&format!("note: {} says pid {p}, the GPU lock says {pid}; using {pid}", pid_file.display())),
        Some(Err(_)) => super::note(&format!("note: {} is corrupt; using pid {pid} from the GPU lock", pid_file.display())),
        None => super::note(&format!("note: {} is missing; using pid {pid} from the GPU lock", pid_file.display())),
    }
    send(pid, libc::SIGTERM)?;
    if now {
        tokio::time::sleep(Duration::from_millis(300)).await;
        send(pid, libc::SIGTERM)?;
        out.line(&format!("stopping run {run_id} now (pid {pid}): the candidate in flight is abandoned"))?;
    } else {
        out.line(&format!("stopping run {run_id} (pid {pid}) after the candidate in flight; `optimizerd stop --now` abandons it"))?;
    }
    let t0 = Instant::now();
    while lock::holder_of(&runs, &run_id).is_some() {
        if t0.elapsed() > wait {
            anyhow::bail!("run {run_id} still running after {}; try `optimizerd stop --now {run_id}`", humantime::format_duration(wait));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ledger = Ledger::open_read_only(&ledger_path(config)).await?;
    if is_group {
        let g = ledger.group(&run_id).await?;
        out.line(&format!("group {run_id}: {}{}", g.state, g.message.map(|m| format!(" ({m})")).unwrap_or_default()))?;
        return Ok(exit::SUCCESS);
    }
    let row = ledger.run(Some(&run_id)).await?;
    out.line(&format!("run {run_id}: {}{}", row.state, row.message.map(|m| format!(" ({m})")).unwrap_or_default()))?;
    Ok(exit::SUCCESS)
}
