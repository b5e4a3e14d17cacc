//! The command line: argument definitions and a thin dispatch to the library.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::spec::config::Config;
use crate::engine::{self, Mode, RunEnd, RunOptions};
use crate::spec::states::{RunState, ShownState};
use crate::storage::ledger::{Ledger, RunRow};
use crate::daemon::supervisor::WorkerCommand;
use crate::daemon::{lock, shutdown};
use crate::ops::report;

#[derive(Debug, Parser)]
#[command(
    name = "optimizerd",
    version,
    about = "Optimize CUDA attention kernels on this machine's GPU, unattended.",
    long_about = "optimizerd walks a strategy plan (baseline -> kv-split -> ...), renders kernel templates, compiles \
each candidate with NVRTC, rejects anything incorrect (fp32 reference, poisoned outputs) or launched on the wrong grid, \
times survivors against the best kernel so far for every workload shape, keeps improvements as git commits and records \
every iteration in SQLite (runs/optimizer.db). A run survives crashes: `optimizerd resume` continues it.",
    after_help = "Examples:\n  optimizerd doctor\n  optimizerd start --budget 90m\n  optimizerd watch\n  optimizerd stop\n  optimizerd resume\n  optimizerd history --verdict accepted\n  optimizerd report --out docs/report"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start an optimization run (detaches unless --foreground).
    Start(StartArgs),
    /// Continue a stopped, interrupted or killed run where it stopped.
    Resume(ResumeArgs),
    /// Follow a run live: one line per iteration under a progress bar.
    Watch(WatchArgs),
    /// Stop a run gracefully (after the candidate in flight), or at once with --now.
    Stop(StopArgs),
    /// List runs with state, GPU, budget and best speedup.
    Runs(JsonArgs),
    /// Print a run's iterations from the ledger (filter by stage or verdict; CSV or JSON).
    History(HistoryArgs),
    /// Print a run's state, stage, iterations, best kernel per shape and budget.
    Status(RunArgs),
    /// Check the driver, GPU, NVRTC, headers, python/torch, the runs folder and the config.
    Doctor(JsonArgs),
    /// Write each shape's best kernel as a standalone .cu plus manifest.json (launch recipe).
    Export(ExportArgs),
    /// Draw a run as pictures: report.html (self-contained), report.md and SVG figures.
    #[command(
        long_about = "Draw a run as pictures, from the ledger alone: a finished, stopped, interrupted or still running run.\n\n\
Writes into one folder (default runs/<run>/report):\n  \
report.html      one self-contained page (inline SVG and CSS, no script, opens offline)\n  \
report.md        the same for a pull request; it links the .svg files beside it\n  \
speedup.svg      1. speedup over SDPA default vs budget used, per shape, stages marked\n  \
throughput.svg   2. best kernel vs each SDPA backend (TFLOPS or us), the GPU's peak\n  \
stages.svg       3. the gain each stage bought, per shape\n  \
verdicts.svg     4. how each stage's candidates ended\n\n\
and a table of the best kernel per shape (template, knobs, registers, spills, shared memory, CTAs, waves) \
with the environment (GPU, driver, NVRTC, torch, cuDNN, timing method). Without SDPA in the run, speedups are \
over the run's baseline kernel and the page says so.",
        after_help = "Examples:\n  optimizerd report                               # the latest run, into runs/<run>/report\n  \
optimizerd report 20261121-184149-4b49 --out docs/report\n  \
optimizerd report --json                        # what was written, for scripts\n\n\
See it as a browser does (headless Chromium, to a PNG):\n  \
bash scripts/report_png.sh docs/report/report.html docs/report/report.png"
    )]
    Report(ReportArgs),
    /// Serve GPU requests on stdin/stdout (started by the daemon; not for direct use).
    #[command(hide = true)]
    Worker {
        /// Use a scripted backend (tests): a JSON file describing each candidate's behaviour.
        #[arg(long)]
        script: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, clap::Args)]
struct DaemonArgs {
    /// Configuration file; default agent.toml in the current folder, else the embedded defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Stay attached to the terminal (systemd, containers, CI). Without it the run detaches.
    #[arg(long)]
    foreground: bool,
    /// Run even if another run holds this GPU (timings will disturb each other).
    #[arg(long)]
    allow_concurrent: bool,
    /// Seed for the random inputs (default: drawn fresh).
    #[arg(long)]
    seed: Option<u64>,
    /// Test double: drive a scripted worker instead of the GPU.
    #[arg(long, hide = true)]
    worker_script: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct StartArgs {
    /// How long to optimize, e.g. 45s, 5m, 1h30m. The candidate in flight finishes past it.
    #[arg(long, value_parser = parse_budget)]
    budget: Duration,
    /// Strategy plan; default: `run.plan` from the configuration (strategies/default.toml).
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Ignore what earlier runs measured on this kind of GPU. By default a run warm-starts
    /// each shape from the best kernel an earlier run found (re-checked and re-timed first)
    /// and skips the exact sources already measured; --fresh measures everything again.
    #[arg(long)]
    fresh: bool,
    #[command(flatten)]
    daemon: DaemonArgs,
    /// Run id to use (default: made from the clock).
    #[arg(long, hide = true)]
    run_id: Option<String>,
}

#[derive(Debug, clap::Args)]
struct ResumeArgs {
    /// Run id (default: the most recent unfinished run).
    run: Option<String>,
    /// Allow resuming on a different GPU model: the incumbents are re-timed there.
    #[arg(long)]
    rebaseline: bool,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Debug, clap::Args)]
struct WatchArgs {
    /// Run id (default: the most recent run).
    run: Option<String>,
    /// Pass the run's JSON log lines through unchanged.
    #[arg(long)]
    json: bool,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct StopArgs {
    /// Run id (default: the run holding the GPU).
    run: Option<String>,
    /// Abandon the candidate in flight (recorded as interrupted) instead of finishing it.
    #[arg(long)]
    now: bool,
    /// How long to wait for the daemon to exit.
    #[arg(long, value_parser = parse_budget, default_value = "10m")]
    wait: Duration,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Run id (default: the most recent run).
    run: Option<String>,
    /// Configuration file, to find the runs folder.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct HistoryArgs {
    /// Run id (default: the most recent run).
    run: Option<String>,
    /// Configuration file, to find the runs folder.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Machine-readable output (the full records, per-shape rows included).
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// One CSV row per iteration, with each shape's median time and whether it won.
    #[arg(long)]
    csv: bool,
    /// Only these stages (repeat or separate with commas); `open/*` matches every open-phase class.
    #[arg(long, value_delimiter = ',', value_name = "STAGE")]
    stage: Vec<String>,
    /// Only these verdicts, e.g. `--verdict incorrect,crashed` (baseline, accepted, rejected, gated,
    /// compile_error, incorrect, cta_mismatch, crashed, timeout, error, interrupted, running).
    #[arg(long, value_delimiter = ',', value_name = "VERDICT")]
    verdict: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct ReportArgs {
    /// Run id (default: the most recent run).
    run: Option<String>,
    /// Folder to write into (created if needed; default: runs/<run>/report).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Configuration file, to find the runs folder.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print what was written (paths, notes) as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ExportArgs {
    /// Run id (default: the most recent run).
    run: Option<String>,
    /// Folder to write the kernels and manifest.json into.
    #[arg(long)]
    out: PathBuf,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct JsonArgs {
    /// Configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

fn parse_budget(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e}; write e.g. 45s, 5m, 1h30m"))?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

pub fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Worker { script } => worker(script),
        Command::Start(args) => runtime()?.block_on(start(args)),
        Command::Resume(args) => runtime()?.block_on(resume(args)),
        Command::Watch(args) => runtime()?.block_on(watch(args)),
        Command::Stop(args) => runtime()?.block_on(stop(args)),
        Command::Runs(args) => runtime()?.block_on(runs(args)),
        Command::History(args) => runtime()?.block_on(history(args)),
        Command::Status(args) => runtime()?.block_on(status(args)),
        Command::Doctor(args) => runtime()?.block_on(doctor(args)),
        Command::Export(args) => runtime()?.block_on(export(args)),
        Command::Report(args) => runtime()?.block_on(run_report(args)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn worker(script: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    // A worker must not outlive its daemon: an orphan would hold the GPU.
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    match script {
        Some(path) => {
            let mut backend = crate::worker::scripted::ScriptedBackend::from_file(&path)
                .with_context(|| format!("cannot load worker script {}", path.display()))?;
            crate::worker::serve(&mut backend)?;
        }
        None => crate::worker::cuda::run_cuda_worker()?,
    }
    Ok(ExitCode::SUCCESS)
}

fn worker_command(d: &DaemonArgs) -> anyhow::Result<WorkerCommand> {
    let mut w = WorkerCommand::current_exe().context("cannot find this executable to start the worker")?;
    if let Some(script) = &d.worker_script {
        w.args = vec!["worker".into(), "--script".into(), script.display().to_string()];
    }
    Ok(w)
}

fn runs_dir(config: &Config) -> PathBuf {
    config.resolve(&config.run.runs_dir)
}

async fn start(args: StartArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.daemon.config.as_deref())?;
    let runs = runs_dir(&config);
    let run_id = args.run_id.clone().unwrap_or_else(engine::new_run_id);
    if !args.daemon.allow_concurrent {
        if let Some((other, pid)) = lock::holder(&runs) {
            return Err(lock::LockError::Held { run_id: other, pid }.into());
        }
    }
    let plan_path = args.plan.clone().unwrap_or_else(|| config.resolve(&config.run.plan));
    if !args.daemon.foreground {
        let mut argv: Vec<OsString> = vec!["start".into(), "--run-id".into(), run_id.clone().into()];
        argv.push("--budget".into());
        argv.push(humantime::format_duration(args.budget).to_string().into());
        if let Some(p) = &args.plan {
            argv.push("--plan".into());
            argv.push(p.into());
        }
        if args.fresh {
            argv.push("--fresh".into());
        }
        return detach(argv, &args.daemon, &runs, &run_id);
    }
    let opts = RunOptions {
        config: config.clone(),
        plan_path,
        budget: args.budget,
        worker: worker_command(&args.daemon)?,
        run_id: Some(run_id.clone()),
        seed: args.daemon.seed,
        mode: Mode::New,
        allow_concurrent: args.daemon.allow_concurrent,
        fresh: args.fresh,
    };
    run_foreground(opts, &config, &run_id).await
}

async fn resume(args: ResumeArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.daemon.config.as_deref())?;
    let runs = runs_dir(&config);
    let ledger = open_ledger(&config).await?;
    let run_id = match &args.run {
        Some(id) => ledger.run(Some(id)).await?.id,
        None => {
            let all = ledger.runs().await?;
            let live = lock::holder(&runs).map(|h| h.0);
            all.into_iter()
                .find(|r| r.state.recorded != RunState::Finished && Some(&r.id) != live.as_ref())
                .map(|r| r.id)
                .context("no unfinished run to resume; `optimizerd runs` lists them")?
        }
    };
    ledger.close().await;
    if let Some((holder, pid)) = lock::holder(&runs) {
        if holder == run_id {
            anyhow::bail!("run {run_id} is running (pid {pid}); nothing to resume. Watch it with `optimizerd watch {run_id}`");
        }
        if !args.daemon.allow_concurrent {
            return Err(lock::LockError::Held { run_id: holder, pid }.into());
        }
    }
    if !args.daemon.foreground {
        let mut argv: Vec<OsString> = vec!["resume".into(), run_id.clone().into()];
        if args.rebaseline {
            argv.push("--rebaseline".into());
        }
        return detach(argv, &args.daemon, &runs, &run_id);
    }
    let opts = RunOptions {
        config: config.clone(),
        plan_path: PathBuf::new(),
        budget: Duration::ZERO,
        worker: worker_command(&args.daemon)?,
        run_id: Some(run_id.clone()),
        seed: args.daemon.seed,
        mode: Mode::Resume { rebaseline: args.rebaseline },
        allow_concurrent: args.daemon.allow_concurrent,
        fresh: false,
    };
    run_foreground(opts, &config, &run_id).await
}

/// Run in this process: pid file, logs, signals, the engine, then the summary.
async fn run_foreground(opts: RunOptions, config: &Config, run_id: &str) -> anyhow::Result<ExitCode> {
    let run_dir = runs_dir(config).join(run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
    crate::daemon::logging::init(Some(&run_dir.join("run.log")))?;
    let pid_file = run_dir.join("daemon.pid");
    std::fs::write(&pid_file, format!("{}\n", std::process::id())).with_context(|| format!("cannot write {}", pid_file.display()))?;
    let (tx, sd) = shutdown::channel();
    shutdown::spawn_signal_handler(tx);
    let result = engine::run(opts, sd).await;
    let _ = std::fs::remove_file(&pid_file);
    let (run_id, end) = result?;
    let ledger = open_ledger(config).await?;
    let s = report::status(&ledger, Some(&run_id)).await?;
    eprintln!("\n{}", report::status_text(&s));
    Ok(match end {
        RunEnd::Finished(_) | RunEnd::Stopped => ExitCode::SUCCESS,
        RunEnd::Failed(m) => {
            eprintln!("error: run {run_id} failed: {m}");
            ExitCode::from(2)
        }
        RunEnd::Interrupted(m) => {
            eprintln!("run {run_id} interrupted: {m}\nresume it with: optimizerd resume {run_id}");
            ExitCode::from(3)
        }
    })
}

/// Re-run `argv --foreground` in its own session, output to the run folder; report
/// an immediate failure (no GPU, bad plan) instead of detaching silently.
fn detach(mut argv: Vec<OsString>, d: &DaemonArgs, runs: &Path, run_id: &str) -> anyhow::Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    argv.push("--foreground".into());
    if let Some(c) = &d.config {
        argv.push("--config".into());
        argv.push(c.into());
    }
    if d.allow_concurrent {
        argv.push("--allow-concurrent".into());
    }
    if let Some(s) = d.seed {
        argv.push("--seed".into());
        argv.push(s.to_string().into());
    }
    if let Some(w) = &d.worker_script {
        argv.push("--worker-script".into());
        argv.push(w.into());
    }
    let run_dir = runs.join(run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
    let out_path = run_dir.join("daemon.out");
    let out = std::fs::OpenOptions::new().create(true).append(true).open(&out_path)?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(&argv).stdin(std::process::Stdio::null()).stdout(out.try_clone()?).stderr(out);
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
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
            eprintln!("{}", tail.join("\n"));
            anyhow::bail!("the daemon for run {run_id} exited at once ({status}); full output in {}", out_path.display());
        }
        if std::fs::read(&log).is_ok_and(|t| t.get(skip..).is_some_and(|new| String::from_utf8_lossy(new).contains("\"kind\":\"device\""))) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            eprintln!("note: the daemon has not reported its GPU yet; it may be waiting for it (see `optimizerd watch {run_id}`)");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("run {run_id} started in the background (pid {})", child.id());
    println!("  watch:   optimizerd watch {run_id}");
    println!("  stop:    optimizerd stop {run_id}");
    println!("  output:  {}", out_path.display());
    Ok(ExitCode::SUCCESS)
}

async fn open_ledger(config: &Config) -> anyhow::Result<Ledger> {
    let db = runs_dir(config).join("optimizer.db");
    if !db.exists() {
        anyhow::bail!("no ledger at {}; start a run first: optimizerd start --budget 5m", db.display());
    }
    Ok(Ledger::open(&db).await?)
}

async fn stop(args: StopArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let runs = runs_dir(&config);
    let holder = lock::holder(&runs);
    let run_id = match (&args.run, &holder) {
        (Some(id), _) => id.clone(),
        (None, Some((id, _))) => id.clone(),
        (None, None) => anyhow::bail!("no run is running on this GPU (`optimizerd runs` lists them)"),
    };
    let pid = match &holder {
        Some((id, pid)) if *id == run_id => *pid,
        _ => {
            let ledger = open_ledger(&config).await?;
            let row = ledger.run(Some(&run_id)).await?;
            anyhow::bail!(
                "run {run_id} is not running (ledger state: {}); {}",
                row.state,
                if row.state.recorded == RunState::Finished { "nothing to stop".to_string() } else { format!("its daemon is gone; continue it with `optimizerd resume {run_id}`") }
            );
        }
    };
    // The pid file is a convenience; the lock is the truth. Say when they disagree.
    let pid_file = runs.join(&run_id).join("daemon.pid");
    match std::fs::read_to_string(&pid_file).ok().map(|t| t.trim().parse::<u32>()) {
        Some(Ok(p)) if p == pid => {}
        Some(Ok(p)) => eprintln!("note: {} says pid {p}, the GPU lock says {pid}; using {pid}", pid_file.display()),
        Some(Err(_)) => eprintln!("note: {} is corrupt; using pid {pid} from the GPU lock", pid_file.display()),
        None => eprintln!("note: {} is missing; using pid {pid} from the GPU lock", pid_file.display()),
    }
    send(pid, libc::SIGTERM)?;
    if args.now {
        tokio::time::sleep(Duration::from_millis(300)).await;
        send(pid, libc::SIGTERM)?;
        println!("stopping run {run_id} now (pid {pid}): the candidate in flight is abandoned");
    } else {
        println!("stopping run {run_id} (pid {pid}) after the candidate in flight; `optimizerd stop --now` abandons it");
    }
    let t0 = Instant::now();
    while lock::holder(&runs).is_some_and(|h| h.0 == run_id) {
        if t0.elapsed() > args.wait {
            anyhow::bail!("run {run_id} still running after {}; try `optimizerd stop --now {run_id}`", humantime::format_duration(args.wait));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ledger = open_ledger(&config).await?;
    let row = ledger.run(Some(&run_id)).await?;
    println!("run {run_id}: {}{}", row.state, row.message.map(|m| format!(" ({m})")).unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}

fn send(pid: u32, sig: i32) -> anyhow::Result<()> {
    // SAFETY: kill(2) sends a signal; no memory is involved.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        anyhow::bail!("cannot signal pid {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// A run's state as the user should see it: `running` with no daemon means it was killed.
fn live_state(r: &RunRow, holder: &Option<(String, u32)>) -> ShownState {
    let alive = holder.as_ref().is_some_and(|h| h.0 == r.id);
    ShownState { recorded: r.state.recorded, daemon_gone: !alive }
}

async fn runs(args: JsonArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let ledger = open_ledger(&config).await?;
    let holder = lock::holder(&runs_dir(&config));
    let mut rows = Vec::new();
    for r in ledger.runs().await? {
        let best = ledger.best(&r.id).await?;
        let speedup = best.iter().filter_map(|b| b.baseline_us.map(|x| x / b.median_us)).fold(None::<f64>, |m, s| Some(m.map_or(s, |m| m.max(s))));
        rows.push((live_state(&r, &holder), speedup, r));
    }
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(state, speedup, r)| serde_json::json!({ "run": r, "live_state": state, "best_speedup": speedup }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", report::runs_text(&rows));
    }
    Ok(ExitCode::SUCCESS)
}

async fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let ledger = open_ledger(&config).await?;
    let opts = crate::ops::watch::WatchOptions::default();
    let end = crate::ops::watch::watch(&ledger, &runs_dir(&config), args.run.as_deref(), args.json, std::io::stdout(), &opts).await?;
    if end.daemon_gone {
        if args.json {
            eprintln!("run {}: its daemon is gone; continue it with `optimizerd resume {}`", end.run.id, end.run.id);
        }
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

async fn doctor(args: JsonArgs) -> anyhow::Result<ExitCode> {
    let report = crate::ops::doctor::doctor(&crate::ops::doctor::DoctorOptions::new(args.config.clone())?).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(if report.failed() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

async fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let ledger = open_ledger(&config).await?;
    let run = ledger.run(args.run.as_deref()).await?;
    let manifest = crate::ops::export::export(&ledger, &run.id, &args.out).await?;
    println!("exported the best kernels of run {} to {}", run.id, args.out.display());
    println!("  manifest: {}", manifest.display());
    println!("  try it:   python3 examples/run_exported.py {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

async fn history(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let filter = report::HistoryFilter::new(args.stage.clone(), args.verdict.clone()).map_err(anyhow::Error::msg)?;
    let config = Config::load(args.config.as_deref())?;
    let ledger = open_ledger(&config).await?;
    let run = ledger.run(args.run.as_deref()).await?;
    let all = ledger.iterations(&run.id).await?;
    let unmatched = filter.unmatched_stages(&all);
    if !unmatched.is_empty() {
        let mut stages: Vec<&str> = Vec::new();
        for it in &all {
            if !stages.contains(&it.stage.as_str()) {
                stages.push(&it.stage);
            }
        }
        eprintln!("note: no iteration of stage {} in run {}; its stages: {}", unmatched.join(", "), run.id, stages.join(", "));
    }
    let its: Vec<_> = all.iter().filter(|it| filter.matches(it)).cloned().collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&its)?);
    } else if args.csv {
        let shapes: Vec<String> = ledger.run_setup(&run.id).await?.workload.iter().map(|s| s.key()).collect();
        print!("{}", report::history_csv(&its, &shapes).context("cannot write CSV")?);
    } else {
        let shown = if its.len() == all.len() { format!("{} iterations", all.len()) } else { format!("{} of {} iterations", its.len(), all.len()) };
        println!("run {} ({}, {shown})\n", run.id, run.state);
        print!("{}", report::history_text(&its));
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let ledger = open_ledger(&config).await?;
    let run = ledger.run(args.run.as_deref()).await?;
    let out = args.out.clone().unwrap_or_else(|| runs_dir(&config).join(&run.id).join("report"));
    let state = live_state(&run, &lock::holder(&runs_dir(&config)));
    let w = crate::ops::run_report::write(&ledger, &run.id, &out, Some(state)).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&w)?);
        return Ok(ExitCode::SUCCESS);
    }
    if w.iterations == 0 {
        println!("run {} ({}) has no recorded iterations yet: the report holds its environment and no figures", w.run, w.state);
    } else {
        println!("report of run {} ({}, {} iterations, {} figures)", w.run, w.state, w.iterations, w.figures.len());
    }
    for n in &w.notes {
        println!("  note: {n}");
    }
    println!("  html:     {}", w.html.display());
    println!("  markdown: {}", w.markdown.display());
    for f in &w.figures {
        println!("  figure:   {}", f.display());
    }
    println!("  as PNG:   bash scripts/report_png.sh {} {}", w.html.display(), out.join("report.png").display());
    Ok(ExitCode::SUCCESS)
}

async fn status(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let ledger = open_ledger(&config).await?;
    let mut s = report::status(&ledger, args.run.as_deref()).await?;
    s.run.state = live_state(&s.run, &lock::holder(&runs_dir(&config)));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", report::status_text(&s));
    }
    Ok(ExitCode::SUCCESS)
}
