//! `start` and `resume`: everything that can be checked before a daemon is started is
//! checked here (the configuration, the plan, the GPU lock, whether the run can be
//! resumed at all), then the run goes to the foreground or is detached; the daemon checks
//! the GPU before it records anything, and a detached one is waited for until it has.

use std::path::Path;
use std::time::Duration;

use super::args::{ResumeArgs, StartArgs};
use super::exit::{self, refuse};
use super::process::{detach, ledger_path, run_foreground, runs_dir, worker_command};
use super::Out;
use crate::daemon::lock;
use crate::engine::{self, Mode, RunOptions};
use crate::spec::config::Config;
use crate::spec::states::RunState;
use crate::storage::ledger::Ledger;
use crate::strategy::plan::Plan;

/// Another run holds the GPU: refused unless `--allow-concurrent`.
fn check_lock(runs: &Path, allow_concurrent: bool) -> anyhow::Result<()> {
    match lock::holder(runs) {
        Some((run_id, pid)) if !allow_concurrent => Err(lock::LockError::Held { run_id, pid }.into()),
        _ => Ok(()),
    }
}

pub async fn start(args: StartArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let config = Config::load(config_path)?;
    let runs = runs_dir(&config);
    let run_id = args.run_id.clone().unwrap_or_else(engine::new_run_id);
    check_lock(&runs, args.daemon.allow_concurrent)?;
    let plan_path = args.plan.clone().unwrap_or_else(|| config.resolve(&config.run.plan));
    // A bad plan is said here, before a folder is made or a daemon started.
    Plan::load(&plan_path, &config.resolve(&config.run.templates_dir))?;
    if !args.daemon.foreground {
        return detach(args.child_argv(&run_id, config_path), &config, &run_id, out).await;
    }
    let opts = RunOptions {
        config: config.clone(),
        plan_path,
        budget: args.budget,
        worker: worker_command(args.daemon.worker_script.as_deref())?,
        run_id: Some(run_id.clone()),
        seed: args.daemon.seed,
        mode: Mode::New,
        allow_concurrent: args.daemon.allow_concurrent,
        fresh: args.fresh,
    };
    run_foreground(opts, &config, &run_id).await
}

pub async fn resume(args: ResumeArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let config = Config::load(config_path)?;
    let runs = runs_dir(&config);
    let ledger = Ledger::open_read_only(&ledger_path(&config)).await?;
    let live = lock::holder(&runs).map(|h| h.0);
    let row = match &args.run {
        Some(id) => ledger.run(Some(id)).await?,
        None => ledger
            .runs()
            .await?
            .into_iter()
            .find(|r| !matches!(r.state.recorded, RunState::Finished | RunState::Failed) && Some(&r.id) != live.as_ref())
            .ok_or_else(|| refuse(exit::NOT_FOUND, "no run to resume (every run finished or failed); `optimizerd runs` lists them"))?,
    };
    let run_id = row.id.clone();
    // What the daemon would refuse at once is refused here, before anything is started.
    engine::resumable(&ledger, &row, &config.resolve(&config.run.templates_dir)).await?;
    ledger.close().await;
    if let Some((holder, pid)) = lock::holder(&runs) {
        if holder == run_id {
            return Err(refuse(
                exit::NOT_RESUMABLE,
                format!("run {run_id} is running (pid {pid}); nothing to resume. Watch it with `optimizerd watch {run_id}`"),
            ));
        }
    }
    check_lock(&runs, args.daemon.allow_concurrent)?;
    if !args.daemon.foreground {
        return detach(args.child_argv(&run_id, config_path), &config, &run_id, out).await;
    }
    let opts = RunOptions {
        config: config.clone(),
        plan_path: Default::default(),
        budget: Duration::ZERO,
        worker: worker_command(args.daemon.worker_script.as_deref())?,
        run_id: Some(run_id.clone()),
        seed: args.daemon.seed,
        mode: Mode::Resume { rebaseline: args.rebaseline },
        allow_concurrent: args.daemon.allow_concurrent,
        fresh: false,
    };
    run_foreground(opts, &config, &run_id).await
}
