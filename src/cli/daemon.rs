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
use crate::engine::{self, Mode, Placement, RunOptions};
use crate::group;
use crate::spec::config::Config;
use crate::spec::states::RunState;
use crate::storage::ledger::Ledger;
use crate::strategy::plan::Plan;

/// Another run holds the GPU: refused unless `--allow-concurrent`.
fn check_lock(runs: &Path, gpu: Option<u32>, allow_concurrent: bool) -> anyhow::Result<()> {
    let gpu = gpu.unwrap_or(0);
    match lock::holder(runs, gpu) {
        Some((run_id, pid)) if !allow_concurrent => Err(lock::LockError::Held { run_id, pid, what: format!("GPU {gpu}") }.into()),
        _ => Ok(()),
    }
}

fn placement(daemon: &super::args::DaemonArgs, only_shapes: Option<Vec<String>>) -> Placement {
    Placement { gpu: daemon.gpu, group: daemon.group.clone(), only_shapes }
}

pub async fn start(args: StartArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let config = Config::load(config_path)?;
    let runs = runs_dir(&config);
    let run_id = args.run_id.clone().unwrap_or_else(engine::new_run_id);
    if args.gpus.is_none() {
        check_lock(&runs, args.daemon.gpu, args.daemon.allow_concurrent)?;
    }
    let plan_path = args.plan.clone().unwrap_or_else(|| config.resolve(&config.run.plan));
    // A bad plan is said here, before a folder is made or a daemon started.
    Plan::load(&plan_path, &config.resolve(&config.run.templates_dir))?;
    if let Some(keys) = &args.shapes {
        let known: Vec<String> = config.shapes().iter().map(|s| s.key()).collect();
        if let Some(k) = keys.iter().find(|k| !known.contains(k)) {
            return Err(refuse(exit::USAGE, format!("--shapes: {k} is not a shape of the workload in {}; its shapes are: {}", config.source.display(), known.join(", "))));
        }
    }
    let fleet_url = args.daemon.ledger.clone().or_else(|| config.fleet.ledger.clone());
    if args.gpus.is_none() && args.daemon.ledger.is_some() {
        return Err(refuse(exit::USAGE, "--ledger shares a group's queue between machines: use it with --gpus (e.g. --gpus all --ledger postgres://...)"));
    }
    if let Some(gpus) = &args.gpus {
        if args.shapes.is_some() {
            return Err(refuse(exit::USAGE, "--shapes and --gpus go separately: a group splits the whole workload by shape class; list the shapes in the workload instead"));
        }
        if !args.daemon.foreground {
            return detach(args.child_argv(&run_id, config_path), &config, &run_id, out).await;
        }
        let opts = group::GroupOptions {
            config_path: config_path.map(Path::to_path_buf),
            plan_path,
            fresh: args.fresh,
            seed: args.daemon.seed,
            worker_script: args.daemon.worker_script.clone(),
            fleet: fleet_url.is_some(),
        };
        let (budget, gpus, cfg, id) = (args.budget, gpus.clone(), config.clone(), run_id.clone());
        return group_foreground(&config, &run_id, fleet_url.clone(), |sd| async move { group::start(&cfg, &id, budget, &gpus, opts, fleet_url.as_deref(), sd).await }).await;
    }
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
        placement: placement(&args.daemon, args.shapes.clone()),
    };
    run_foreground(opts, &config, &run_id).await
}

pub async fn resume(args: ResumeArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let config = Config::load(config_path)?;
    let runs = runs_dir(&config);
    let ledger = Ledger::open_read_only(&ledger_path(&config)).await?;
    if let Some(id) = args.run.as_deref() {
        let fleet_url = args.daemon.ledger.clone().or_else(|| config.fleet.ledger.clone());
        if ledger.is_group(id).await || group::in_fleet(fleet_url.as_deref(), id).await {
            ledger.close().await;
            return resume_group(args, config, config_path, out).await;
        }
    }
    let live: Vec<String> = lock::holders(&runs).into_iter().map(|h| h.0).collect();
    let row = match &args.run {
        Some(id) => ledger.run(Some(id)).await?,
        None => ledger
            .runs()
            .await?
            .into_iter()
            .find(|r| !matches!(r.state.recorded, RunState::Finished | RunState::Failed) && !live.contains(&r.id))
            .ok_or_else(|| refuse(exit::NOT_FOUND, "no run to resume (every run finished or failed); `optimizerd runs` lists them"))?,
    };
    let run_id = row.id.clone();
    // What the daemon would refuse at once is refused here, before anything is started.
    engine::resumable(&ledger, &row, &config.resolve(&config.run.templates_dir)).await?;
    ledger.close().await;
    if let Some(pid) = lock::holder_of(&runs, &run_id) {
        return Err(refuse(
            exit::NOT_RESUMABLE,
            format!("run {run_id} is running (pid {pid}); nothing to resume. Watch it with `optimizerd watch {run_id}`"),
        ));
    }
    check_lock(&runs, args.daemon.gpu, args.daemon.allow_concurrent)?;
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
        placement: placement(&args.daemon, None),
    };
    run_foreground(opts, &config, &run_id).await
}

/// `resume GROUP`: the coordinator again, in this process or detached.
async fn resume_group(args: ResumeArgs, config: Config, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let id = args.run.clone().unwrap_or_default();
    if let Some(pid) = lock::holder_of(&runs_dir(&config), &id) {
        return Err(refuse(exit::NOT_RESUMABLE, format!("group {id} is running (pid {pid}); nothing to resume. Watch it with `optimizerd watch {id}`")));
    }
    if !args.daemon.foreground {
        return detach(args.child_argv(&id, config_path), &config, &id, out).await;
    }
    let (script, cfg, gid) = (args.daemon.worker_script.clone(), config.clone(), id.clone());
    let fleet_url = args.daemon.ledger.clone().or_else(|| config.fleet.ledger.clone());
    group_foreground(&config, &id, fleet_url.clone(), |sd| async move { group::resume(&cfg, &gid, script, fleet_url.as_deref(), sd).await }).await
}

/// A group's coordinator in this process: its log, signals, the group, then its status.
async fn group_foreground<F, Fut>(config: &Config, id: &str, fleet_url: Option<String>, drive: F) -> anyhow::Result<u8>
where
    F: FnOnce(crate::daemon::shutdown::Shutdown) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<group::GroupEnd>>,
{
    let dir = runs_dir(config).join(id);
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create the group's folder {}: {e}", dir.display()))?;
    crate::daemon::logging::init(Some(&dir.join("run.log")))?;
    // `watch` tells a live coordinator from a dead one by this file, as for a daemon.
    let pid_file = dir.join("daemon.pid");
    std::fs::write(&pid_file, format!("{}\n", std::process::id())).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", pid_file.display()))?;
    let (tx, sd) = crate::daemon::shutdown::channel();
    crate::daemon::shutdown::spawn_signal_handler(tx);
    let ended = drive(sd).await;
    let _ = std::fs::remove_file(&pid_file);
    ended?;
    let ledger = Ledger::open_read_only(&ledger_path(config)).await?;
    let live = lock::holder_of(&runs_dir(config), id).is_some();
    let queue = group::queue_of(&ledger, fleet_url.as_deref(), id).await?;
    let s = group::status(&queue, &ledger, id, live).await?;
    super::note(&format!("\n{}", group::status_text(&s)));
    Ok(exit::SUCCESS)
}
