//! The command line: argument definitions and a thin dispatch to the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::engine::{self, RunEnd, RunOptions};
use crate::ledger::Ledger;
use crate::report;
use crate::supervisor::WorkerCommand;

#[derive(Debug, Parser)]
#[command(
    name = "optimizerd",
    version,
    about = "Optimize CUDA attention kernels on this machine's GPU, unattended.",
    long_about = "optimizerd walks a strategy plan (baseline -> kv-split -> ...), renders kernel templates, compiles \
each candidate with NVRTC, rejects anything incorrect (fp32 reference, poisoned outputs) or launched on the wrong grid, \
times survivors against the incumbent, keeps improvements as git commits and records every iteration in SQLite \
(runs/optimizer.db).",
    after_help = "Examples:\n  optimizerd start --budget 5m --foreground\n  optimizerd history\n  optimizerd status --json"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start an optimization run.
    Start(StartArgs),
    /// Print a run's iterations from the ledger.
    History(RunArgs),
    /// Print a run's state, stage, iterations, best kernel per shape and budget.
    Status(RunArgs),
    /// Serve GPU requests on stdin/stdout (started by the daemon; not for direct use).
    #[command(hide = true)]
    Worker {
        /// Use a scripted backend (tests): a JSON file describing each candidate's behaviour.
        #[arg(long)]
        script: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct StartArgs {
    /// How long to optimize, e.g. 45s, 5m, 1h30m. The iteration in flight finishes past it.
    #[arg(long, value_parser = parse_budget)]
    budget: Duration,
    /// Configuration file; default agent.toml in the current folder, else the embedded defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Strategy plan; default: `run.plan` from the configuration (strategies/default.toml).
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Stay attached to the terminal (systemd, containers, CI). Without it the run detaches.
    #[arg(long)]
    foreground: bool,
    /// Seed for the random inputs (default: drawn fresh for each run).
    #[arg(long)]
    seed: Option<u64>,
    /// Run id to use (default: made from the clock).
    #[arg(long, hide = true)]
    run_id: Option<String>,
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

fn parse_budget(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e}; write e.g. 45s, 5m, 1h30m"))?;
    if d.is_zero() {
        return Err("budget must be more than zero".into());
    }
    Ok(d)
}

pub fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Worker { script } => worker(script),
        Command::Start(args) => runtime()?.block_on(start(args)),
        Command::History(args) => runtime()?.block_on(history(args)),
        Command::Status(args) => runtime()?.block_on(status(args)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn worker(script: Option<PathBuf>) -> anyhow::Result<ExitCode> {
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

async fn start(args: StartArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let plan_path = args.plan.clone().unwrap_or_else(|| config.resolve(&config.run.plan));
    let run_id = args.run_id.clone().unwrap_or_else(engine::new_run_id);
    let run_dir = config.resolve(&config.run.runs_dir).join(&run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create run folder {}", run_dir.display()))?;

    if !args.foreground {
        return detach(&args, &run_id, &run_dir);
    }

    crate::logging::init(Some(&run_dir.join("run.log")))?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::warn!("stopping after the candidate in flight (Ctrl-C)");
            let _ = tx.send(true);
        }
    });
    let opts = RunOptions {
        config: config.clone(),
        plan_path,
        budget: args.budget,
        worker: WorkerCommand::current_exe()?,
        run_id: Some(run_id.clone()),
        seed: args.seed,
    };
    let (run_id, end) = engine::run(opts, rx).await?;
    let ledger = Ledger::open(&config.resolve(&config.run.runs_dir).join("optimizer.db")).await?;
    let s = report::status(&ledger, Some(&run_id)).await?;
    eprintln!("\n{}", report::status_text(&s));
    Ok(match end {
        RunEnd::Finished(_) | RunEnd::Stopped => ExitCode::SUCCESS,
        RunEnd::Failed(m) => {
            eprintln!("error: run {run_id} failed: {m}");
            ExitCode::from(2)
        }
    })
}

/// Re-run this command with `--foreground` in its own session, output to the run folder.
fn detach(args: &StartArgs, run_id: &str, run_dir: &Path) -> anyhow::Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(run_dir.join("daemon.out"))?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("start").arg("--foreground").arg("--run-id").arg(run_id);
    cmd.arg("--budget").arg(humantime::format_duration(args.budget).to_string());
    if let Some(c) = &args.config {
        cmd.arg("--config").arg(c);
    }
    if let Some(p) = &args.plan {
        cmd.arg("--plan").arg(p);
    }
    if let Some(s) = args.seed {
        cmd.arg("--seed").arg(s.to_string());
    }
    cmd.stdin(std::process::Stdio::null()).stdout(out.try_clone()?).stderr(out);
    // SAFETY: setsid() is async-signal-safe; it detaches the child from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().context("cannot start the daemon process")?;
    std::fs::write(run_dir.join("daemon.pid"), child.id().to_string())?;
    println!("run {run_id} started (pid {})", child.id());
    println!("  log:     {}", run_dir.join("daemon.out").display());
    println!("  status:  optimizerd status {run_id}");
    println!("  history: optimizerd history {run_id}");
    Ok(ExitCode::SUCCESS)
}

async fn open_ledger(config: Option<&Path>) -> anyhow::Result<Ledger> {
    let config = Config::load(config)?;
    let db = config.resolve(&config.run.runs_dir).join("optimizer.db");
    if !db.exists() {
        anyhow::bail!("no ledger at {}; start a run first: optimizerd start --budget 5m --foreground", db.display());
    }
    Ok(Ledger::open(&db).await?)
}

async fn history(args: RunArgs) -> anyhow::Result<ExitCode> {
    let ledger = open_ledger(args.config.as_deref()).await?;
    let run = ledger.run(args.run.as_deref()).await?;
    let its = ledger.iterations(&run.id).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&its)?);
    } else {
        println!("run {} ({}, {} iterations)\n", run.id, run.state, its.len());
        print!("{}", report::history_text(&its));
    }
    Ok(ExitCode::SUCCESS)
}

async fn status(args: RunArgs) -> anyhow::Result<ExitCode> {
    let ledger = open_ledger(args.config.as_deref()).await?;
    let s = report::status(&ledger, args.run.as_deref()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", report::status_text(&s));
    }
    Ok(ExitCode::SUCCESS)
}
