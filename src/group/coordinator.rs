//! The group's coordinator: the queue of shape classes, one daemon per GPU, the budget.
//!
//! Each daemon is a child process (`optimizerd start|resume --foreground --gpu N --group G`)
//! that sees only its GPU (`CUDA_VISIBLE_DEVICES`), in a session of its own (a terminal's
//! Ctrl-C reaches the coordinator, which passes it on once) and killed with its parent
//! (`PR_SET_PDEATHSIG`: SIGTERM, so it stops as after `optimizerd stop`). Its stderr is
//! relayed into the group's log, prefixed with its GPU. A daemon that dies (kill -9, OOM)
//! puts its item back in the queue; the next GPU to take it resumes the same run, so no
//! iteration is lost. The loop polls: nothing it waits for is faster than a candidate.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use super::gpus::{self, GpuSelection};
use super::share::{budget_share, DEFAULT_OVERHEAD};
use super::store::{self, Queue};
use crate::storage::fleet::Fleet;
use crate::daemon::lock::{self, GpuLock};
use crate::daemon::shutdown::Shutdown;
use crate::spec::config::Config;
use crate::spec::states::{ItemState, RunState};
use crate::storage::ledger::{GpuSlot, GroupRow, ItemRow, Ledger, LedgerError, NewGroup, NewItem};
use crate::strategy::open::classify;

/// Times an item may be taken before the group gives up on it (its daemon died each time).
const MAX_ATTEMPTS: i64 = 3;
/// How often the loop looks at its daemons and the signals.
const TICK: Duration = Duration::from_millis(200);
/// How often the budget used is written to the ledger while nothing else happens.
const PERSIST_EVERY: Duration = Duration::from_secs(5);

/// What every run of the group is started with, kept in the ledger for `resume`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupOptions {
    /// The `--config` the group was started with (its runs get the same).
    pub config_path: Option<PathBuf>,
    pub plan_path: PathBuf,
    pub fresh: bool,
    /// The group's seed; item N's run gets seed + N.
    pub seed: Option<u64>,
    /// Test double: the scripted worker every run drives.
    pub worker_script: Option<PathBuf>,
    /// The queue is in a fleet's database (`--ledger`; its URL is not kept: resume needs it again).
    #[serde(default)]
    pub fleet: bool,
}

/// How a group ended, for the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEnd {
    Finished(String),
    Stopped,
}

struct Daemon {
    item: ItemRow,
    /// When it started and the budget it was given: its overhead is the difference.
    since: Instant,
    share: Duration,
    /// A resumed run keeps its own budget: its overhead is not measured.
    resumed: bool,
    proc: tokio::process::Child,
    /// The relay of its stderr; yields its last line (why it exited, if it failed).
    relay: tokio::task::JoinHandle<String>,
}

struct Coordinator {
    id: String,
    /// This machine's ledger: the runs.
    ledger: Ledger,
    /// The group and its queue (this ledger, or a fleet's database).
    queue: Queue,
    /// This machine's name, and this coordinator's (`machine:pid`) for leases.
    machine: String,
    holder: String,
    lease: Duration,
    gpus: Vec<GpuSlot>,
    opts: GroupOptions,
    budget: Duration,
    used_before: Duration,
    started: Instant,
    shutdown: Shutdown,
    daemons: BTreeMap<u32, Daemon>,
    /// Wall time beyond their budget of the runs that ended (setup and closing).
    overheads: Vec<Duration>,
    _lock: GpuLock,
}

fn runs_dir(config: &Config) -> PathBuf {
    config.resolve(&config.run.runs_dir)
}

/// Refuse GPUs another daemon holds, before anything is recorded.
fn check_free(config: &Config, gpus: &[GpuSlot]) -> anyhow::Result<()> {
    for g in gpus {
        if let Some((run_id, pid)) = lock::holder(&runs_dir(config), g.index) {
            return Err(lock::LockError::Held { run_id, pid, what: format!("GPU {}", g.index) }.into());
        }
    }
    Ok(())
}

fn describe_gpus(gpus: &[GpuSlot]) -> String {
    let ids: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
    let first = gpus.first().map(|g| g.device.name.as_str()).unwrap_or("?");
    format!("{} GPU(s) {} ({first})", gpus.len(), ids.join(", "))
}

/// The group's queue: one item per shape class; while there are fewer items than GPUs, the
/// item with the most shapes is split in two (its shapes in workload order), so that no GPU
/// idles from the start. Each item's run id is the group's id and its class (and part).
fn work_items(group: &str, classes: &[crate::strategy::open::ShapeClass], gpus: usize) -> Vec<NewItem> {
    let mut parts: Vec<(String, Vec<String>)> = classes.iter().map(|c| (c.name.clone(), c.shapes.iter().map(|s| s.key()).collect())).collect();
    while parts.len() < gpus {
        let Some((i, _)) = parts.iter().enumerate().filter(|(_, p)| p.1.len() > 1).max_by_key(|(i, p)| (p.1.len(), std::cmp::Reverse(*i))) else { break };
        let (class, shapes) = parts[i].clone();
        let (a, b) = shapes.split_at(shapes.len().div_ceil(2));
        parts[i] = (class.clone(), a.to_vec());
        parts.insert(i + 1, (class, b.to_vec()));
    }
    let mut out = Vec::new();
    for (i, (class, shapes)) in parts.iter().enumerate() {
        let split = parts.iter().filter(|p| &p.0 == class).count();
        let run_id = if split > 1 {
            let k = parts[..=i].iter().filter(|p| &p.0 == class).count();
            format!("{group}-{class}-{k}of{split}")
        } else {
            format!("{group}-{class}")
        };
        out.push(NewItem { class: class.clone(), shapes: shapes.clone(), run_id });
    }
    out
}

/// Where the group's queue is: the local ledger, or the fleet database at `url`.
async fn open_queue(ledger: &Ledger, url: Option<&str>) -> anyhow::Result<Queue> {
    Ok(match url {
        Some(u) => Queue::Fleet(Fleet::connect(u).await?),
        None => Queue::Local(ledger.clone()),
    })
}

/// When the fleet's group started, as time already used (a machine joining late).
fn used_since(started_at: &str) -> Duration {
    chrono::DateTime::parse_from_rfc3339(started_at)
        .ok()
        .and_then(|t| (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).to_std().ok())
        .unwrap_or(Duration::ZERO)
}

/// Start group `id` on the GPUs `selection` names (in a fleet: create it, or join it when
/// another machine did), and drive it to its end.
pub async fn start(
    config: &Config,
    id: &str,
    budget: Duration,
    selection: &GpuSelection,
    opts: GroupOptions,
    fleet_url: Option<&str>,
    shutdown: Shutdown,
) -> anyhow::Result<GroupEnd> {
    let runs = runs_dir(config);
    std::fs::create_dir_all(&runs).with_context(|| format!("cannot create runs folder {}", runs.display()))?;
    let devices = gpus::list_devices(opts.worker_script.as_deref(), config.worker.hello_timeout).await?;
    let gpus = gpus::select(selection, &devices)?;
    check_free(config, &gpus)?;
    let lock = GpuLock::acquire_at(&lock::group_lock_path(&runs, id), id)?;
    let shapes = config.shapes();
    let sms = gpus.first().map(|g| g.device.sm_count).unwrap_or(1);
    let items = work_items(id, &classify(&shapes, sms), gpus.len());
    let ledger = Ledger::open(&runs.join("optimizer.db")).await?;
    let queue = open_queue(&ledger, fleet_url).await?;
    let new = NewGroup {
        id: id.to_string(),
        budget_s: budget.as_secs_f64(),
        gpus: gpus.clone(),
        config_source: config.source.display().to_string(),
        plan_path: opts.plan_path.display().to_string(),
        options_json: serde_json::to_string(&GroupOptions { fleet: fleet_url.is_some(), ..opts.clone() })?,
        items,
    };
    let (g, created) = queue.create_or_join(&new).await?;
    if queue.is_fleet() {
        ledger.mirror_group(&GroupRow { state: RunState::Running, pid: None, message: None, finished_at: None, ..g.clone() }).await?;
    }
    let (budget, used_before) = if created {
        (budget, Duration::ZERO)
    } else {
        // Joining a fleet's group: its GPU model, workload and budget are the group's.
        if let (Some(theirs), Some(ours)) = (g.gpus.first(), gpus.first()) {
            if theirs.device.name != ours.device.name || theirs.device.cc() != ours.device.cc() {
                anyhow::bail!(
                    "group {id} in {} runs on {} (sm_{}); this machine's GPUs are {} (sm_{}): results are kept per GPU model, so start a group of its own here",
                    queue.describe(), theirs.device.name, theirs.device.cc(), ours.device.name, ours.device.cc()
                );
            }
        }
        let mut ours: Vec<String> = new.items.iter().flat_map(|i| i.shapes.clone()).collect();
        let mut theirs: Vec<String> = queue.items(id).await?.into_iter().flat_map(|i| i.shapes).collect();
        ours.sort();
        theirs.sort();
        if ours != theirs {
            anyhow::bail!("group {id} in {} optimizes the shapes {}; this machine's workload has {}: join with the same workload", queue.describe(), theirs.join(", "), ours.join(", "));
        }
        if matches!(g.state, RunState::Finished | RunState::Failed) {
            anyhow::bail!("group {id} in {} {}: {}; nothing to join", queue.describe(), g.state, g.message.unwrap_or_default());
        }
        tracing::info!(kind = "joined", run = %id, "joined group {id} in {} (started {} by another machine)", queue.describe(), g.started_at);
        (Duration::from_secs_f64(g.budget_s), used_since(&g.started_at).max(Duration::from_secs_f64(g.used_s)))
    };
    let c = Coordinator::new(config, id, ledger, queue, gpus, opts, budget, used_before, shutdown, lock);
    c.announce().await?;
    c.drive().await
}

/// Continue group `id`: its queue as recorded, items cut off taken again (their runs resumed).
pub async fn resume(config: &Config, id: &str, worker_script: Option<PathBuf>, fleet_url: Option<&str>, shutdown: Shutdown) -> anyhow::Result<GroupEnd> {
    let runs = runs_dir(config);
    let ledger = Ledger::open(&runs.join("optimizer.db")).await?;
    let queue = super::queue_of(&ledger, fleet_url, id).await?;
    let g = queue.group(id).await?;
    if matches!(g.state, RunState::Finished | RunState::Failed) {
        anyhow::bail!("group {id} {}: {}; nothing to resume (`optimizerd status {id}` shows it)", g.state, g.message.unwrap_or_default());
    }
    let mut opts: GroupOptions = serde_json::from_str(&g.options_json).with_context(|| format!("the options of group {id} in {} are unreadable", queue.describe()))?;
    if worker_script.is_some() {
        opts.worker_script = worker_script;
    }
    let devices = gpus::list_devices(opts.worker_script.as_deref(), config.worker.hello_timeout).await?;
    let gpus = gpus::select(&GpuSelection::Indices(g.gpus.iter().map(|s| s.index).collect()), &devices)?;
    if let (Some(before), Some(now)) = (g.gpus.first(), gpus.first()) {
        if before.device.name != now.device.name {
            anyhow::bail!("group {id} ran on {}; GPU {} is now {}: start a new group on this GPU model", before.device.name, now.index, now.device.name);
        }
    }
    check_free(config, &gpus)?;
    let lock = GpuLock::acquire_at(&lock::group_lock_path(&runs, id), id)?;
    let machine = store::machine_name(config.fleet.machine.as_deref());
    let requeued = queue.requeue_items(id, &machine).await?;
    queue.set_group_state(id, RunState::Running, None, g.used_s).await?;
    if queue.is_fleet() {
        ledger.mirror_group(&GroupRow { state: RunState::Running, message: None, finished_at: None, ..g.clone() }).await?;
    }
    let used_before = if queue.is_fleet() { used_since(&g.started_at).max(Duration::from_secs_f64(g.used_s)) } else { Duration::from_secs_f64(g.used_s) };
    let c = Coordinator::new(config, id, ledger, queue, gpus, opts, Duration::from_secs_f64(g.budget_s), used_before, shutdown, lock);
    tracing::info!(kind = "resumed", run = %id, "group {id} resumed with {} of budget left; {requeued} item(s) taken again", fmt(c.left()));
    c.announce().await?;
    c.drive().await
}

/// The CPUs daemon `position` of `n` may use: this process's CPUs in `n` contiguous shares
/// (None with one GPU, or when the CPUs cannot be read or are fewer than the GPUs).
fn cpu_share(position: usize, n: usize) -> Option<libc::cpu_set_t> {
    if n <= 1 {
        return None;
    }
    // SAFETY: sched_getaffinity fills a cpu_set_t we own; CPU_* only read and write it.
    unsafe {
        let mut mine: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut mine) != 0 {
            return None;
        }
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &mine)).collect();
        if allowed.len() < n {
            return None;
        }
        let per = allowed.len() / n;
        let take = if position + 1 == n { &allowed[position * per..] } else { &allowed[position * per..(position + 1) * per] };
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in take {
            libc::CPU_SET(c, &mut set);
        }
        Some(set)
    }
}

fn fmt(d: Duration) -> String {
    crate::pipeline::record::fmt_dur(d)
}

impl Coordinator {
    #[allow(clippy::too_many_arguments)]
    fn new(
        config: &Config,
        id: &str,
        ledger: Ledger,
        queue: Queue,
        gpus: Vec<GpuSlot>,
        opts: GroupOptions,
        budget: Duration,
        used_before: Duration,
        shutdown: Shutdown,
        lock: GpuLock,
    ) -> Coordinator {
        let machine = store::machine_name(config.fleet.machine.as_deref());
        Coordinator {
            id: id.to_string(),
            ledger,
            queue,
            holder: format!("{machine}:{}", std::process::id()),
            machine,
            lease: config.fleet.lease,
            gpus,
            opts,
            budget,
            used_before,
            started: Instant::now(),
            shutdown,
            daemons: BTreeMap::new(),
            overheads: Vec::new(),
            _lock: lock,
        }
    }

    /// The end of a lease taken or renewed now.
    fn lease_until(&self) -> String {
        let t = chrono::Utc::now() + chrono::Duration::from_std(self.lease).unwrap_or(chrono::Duration::seconds(60));
        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    fn used(&self) -> Duration {
        self.used_before + self.started.elapsed()
    }

    fn left(&self) -> Duration {
        self.budget.saturating_sub(self.used())
    }

    /// The overhead to leave per run: the largest seen, or the default before any.
    fn overhead(&self) -> Duration {
        self.overheads.iter().max().copied().unwrap_or(DEFAULT_OVERHEAD)
    }

    /// The `device` line (`start` waits for it before detaching) and the queue.
    async fn announce(&self) -> anyhow::Result<()> {
        let items = self.queue.items(&self.id).await?;
        let name = self.gpus.first().map(|g| g.device.name.clone()).unwrap_or_default();
        let line = format!("group {}: {}, {} item(s) (one per shape class) in {} of budget", self.id, describe_gpus(&self.gpus), items.len(), fmt(self.left()));
        tracing::info!(kind = "device", run = %self.id, gpu = %name, gpu_count = self.gpus.len() as u64, "{line}");
        for it in &items {
            tracing::info!(kind = "item", run = %self.id, seq = it.seq, class = %it.class, state = %it.state, "  item {} {} ({}): {}", it.seq, it.class, it.state, it.shapes.join(", "));
        }
        Ok(())
    }

    async fn drive(mut self) -> anyhow::Result<GroupEnd> {
        let mut signalled = 0u8; // SIGTERMs passed on to the daemons: 1 graceful, 2 now
        let mut persisted = Instant::now();
        let mut out_of_budget = false;
        loop {
            // Signals: passed on once each, as `optimizerd stop` and `stop --now` would.
            let want = if self.shutdown.now_requested() { 2 } else if self.shutdown.requested() { 1 } else { 0 };
            while signalled < want {
                signalled += 1;
                for d in self.daemons.values() {
                    if let Some(pid) = d.proc.id() {
                        // SAFETY: kill(2) on our own child's pid; no memory involved.
                        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                    }
                }
            }
            self.reap(signalled > 0).await?;
            if signalled == 0 && !out_of_budget {
                out_of_budget = self.fill().await?;
            }
            if self.daemons.is_empty() {
                let items = self.queue.items(&self.id).await?;
                let queued = items.iter().filter(|i| i.state == ItemState::Queued).count();
                // In a fleet, an item another machine runs may come back (that machine dies
                // and its lease passes): stay for it while there is budget.
                let elsewhere = items.iter().filter(|i| i.state == ItemState::Running).count();
                if signalled > 0 || queued + elsewhere == 0 || out_of_budget || self.left().is_zero() {
                    return self.finish(signalled > 0, queued).await;
                }
            }
            if persisted.elapsed() >= PERSIST_EVERY {
                self.queue.set_group_used(&self.id, self.used().as_secs_f64()).await?;
                self.queue.renew_leases(&self.id, &self.holder, &self.lease_until()).await?;
                persisted = Instant::now();
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// Give every idle GPU the next queued item. Returns true when the budget left is too
    /// short for another run.
    async fn fill(&mut self) -> anyhow::Result<bool> {
        for slot in self.gpus.clone() {
            if self.daemons.contains_key(&slot.index) {
                continue;
            }
            let items = self.queue.items(&self.id).await?;
            let now = crate::storage::ledger::now();
            // Queued, or held under a lease that has passed (its machine died).
            let queued = items
                .iter()
                .filter(|i| i.state == ItemState::Queued || (i.state == ItemState::Running && i.lease_until.as_deref().is_some_and(|l| l < now.as_str())))
                .count();
            if queued == 0 {
                return Ok(false);
            }
            let Some(share) = budget_share(self.left(), self.gpus.len(), queued, self.daemons.len(), self.overhead()) else {
                return Ok(true);
            };
            let Some(item) = self.queue.claim_item(&self.id, slot.index, share.as_secs_f64(), &self.holder, &self.lease_until()).await? else {
                return Ok(false);
            };
            match self.spawn(&slot, &item, share).await {
                Ok(d) => {
                    self.daemons.insert(slot.index, d);
                }
                Err(e) => {
                    let why = crate::error_text::join(e.chain());
                    tracing::error!(kind = "item_end", run = %self.id, seq = item.seq, gpu = slot.index, "[gpu {}] item {} {}: cannot start its daemon: {why}", slot.index, item.seq, item.class);
                    self.queue.set_item_state(&self.id, item.seq, ItemState::Failed, &format!("cannot start its daemon: {why}")).await?;
                }
            }
        }
        Ok(false)
    }

    /// Start (or, when its run exists, resume) the daemon of `item` on GPU `slot`.
    async fn spawn(&self, slot: &GpuSlot, item: &ItemRow, share: Duration) -> anyhow::Result<Daemon> {
        let resuming = match self.ledger.run(Some(&item.run_id)).await {
            Ok(_) => true,
            Err(LedgerError::NoSuchRun(_)) => false,
            Err(e) => return Err(e.into()),
        };
        if self.queue.is_fleet() {
            // What the fleet's other machines measured: this run's memory across runs.
            let rows = self.queue.memory_of_others(&self.machine).await?;
            let n = crate::storage::memory::Memory::import(&self.ledger, &rows).await?;
            if n > 0 {
                tracing::info!(kind = "memory", run = %self.id, "{n} measurement(s) of other machines' runs kept for memory across runs");
            }
        }
        let mut argv: Vec<String> = Vec::new();
        if let Some(c) = &self.opts.config_path {
            argv.extend(["--config".into(), c.display().to_string()]);
        }
        if resuming {
            argv.extend(["resume".into(), item.run_id.clone()]);
        } else {
            argv.extend(["start".into(), "--run-id".into(), item.run_id.clone(), "--budget".into(), format!("{}ms", share.as_millis().max(1))]);
            argv.extend(["--shapes".into(), item.shapes.join(",")]);
            argv.extend(["--plan".into(), self.opts.plan_path.display().to_string()]);
            if self.opts.fresh {
                argv.push("--fresh".into());
            }
            if let Some(s) = self.opts.seed {
                argv.extend(["--seed".into(), s.wrapping_add(item.seq as u64).to_string()]);
            }
        }
        argv.extend(["--foreground".into(), "--gpu".into(), slot.index.to_string(), "--group".into(), self.id.clone()]);
        if let Some(w) = &self.opts.worker_script {
            argv.extend(["--worker-script".into(), w.display().to_string()]);
        }
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let mut cmd = tokio::process::Command::new(exe);
        let visible = gpus::visible_id(slot.index, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
        cmd.args(&argv)
            .env("CUDA_VISIBLE_DEVICES", &visible)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // The host's CPUs split between the GPUs: the check's fp32 reference and NVRTC use
        // every CPU a process may run on, and daemons sharing all of them slowed each other
        // (2 x H200, 2026-11-26: a latency class made 52 candidates in 40 s beside a
        // compute class, 74 in 20 s alone).
        let position = self.gpus.iter().position(|g| g.index == slot.index).unwrap_or(0);
        let cpus = cpu_share(position, self.gpus.len());
        // SAFETY: setsid, prctl and sched_setaffinity are async-signal-safe and touch only
        // the child itself; `cpus` is a plain bit set copied into the closure.
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if let Some(set) = &cpus {
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
                }
                Ok(())
            });
        }
        let mut proc = cmd.spawn().context("cannot start the daemon process")?;
        let stderr = proc.stderr.take().context("the daemon's stderr was not captured")?;
        let (gpu, run) = (slot.index, item.run_id.clone());
        let relay = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            let mut last = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim().is_empty() {
                    continue;
                }
                tracing::info!(kind = "gpu_line", gpu, run = %run, "[gpu {gpu}] {line}");
                last = line;
            }
            last
        });
        let how = if resuming { "resumes run".to_string() } else { format!("starts run {} with {} of budget:", item.run_id, fmt(share)) };
        tracing::info!(
            kind = "item_start", run = %self.id, seq = item.seq, gpu = slot.index, class = %item.class, item_run = %item.run_id, budget_s = share.as_secs_f64(),
            "[gpu {}] item {} {} ({} shape(s)) {how}{}", slot.index, item.seq, item.class, item.shapes.len(), if resuming { format!(" {}", item.run_id) } else { String::new() }
        );
        Ok(Daemon { item: item.clone(), since: Instant::now(), share, resumed: resuming, proc, relay })
    }

    /// Settle the daemons that exited: their items done, stopped, failed, or queued again.
    async fn reap(&mut self, stopping: bool) -> anyhow::Result<()> {
        let mut ended: Vec<(u32, ExitStatus)> = Vec::new();
        for (gpu, d) in self.daemons.iter_mut() {
            if let Some(status) = d.proc.try_wait()? {
                ended.push((*gpu, status));
            }
        }
        for (gpu, status) in ended {
            let Some(d) = self.daemons.remove(&gpu) else { continue };
            let last = d.relay.await.unwrap_or_default();
            let recorded = match self.ledger.run(Some(&d.item.run_id)).await {
                Ok(r) => Some(r),
                Err(LedgerError::NoSuchRun(_)) => None,
                Err(e) => return Err(e.into()),
            };
            let cut_off = |why: String| {
                if stopping {
                    (ItemState::Stopped, format!("{why}; the group was stopping"))
                } else if d.item.attempts < MAX_ATTEMPTS {
                    (ItemState::Queued, format!("{why}; queued again (its run is resumed where it stopped)"))
                } else {
                    (ItemState::Failed, format!("{why}; given up after {} attempts", d.item.attempts))
                }
            };
            let (state, message) = match recorded.as_ref().map(|r| r.state.recorded) {
                Some(RunState::Finished) => (ItemState::Done, recorded.as_ref().and_then(|r| r.message.clone()).unwrap_or_default()),
                Some(RunState::Failed) => (ItemState::Failed, recorded.as_ref().and_then(|r| r.message.clone()).unwrap_or(last.clone())),
                Some(RunState::Stopped) => (ItemState::Stopped, "its run was stopped".to_string()),
                Some(s) => cut_off(format!("its daemon exited ({status}) with its run {s}")),
                None => cut_off(format!("its daemon exited ({status}) before recording its run: {last}")),
            };
            if state == ItemState::Done && !d.resumed {
                self.overheads.push(d.since.elapsed().saturating_sub(d.share));
            }
            let level_warn = matches!(state, ItemState::Failed | ItemState::Queued);
            let line = format!("[gpu {gpu}] item {} {} {state}: {message}", d.item.seq, d.item.class);
            if level_warn {
                tracing::warn!(kind = "item_end", run = %self.id, seq = d.item.seq, gpu, state = %state, "{line}");
            } else {
                tracing::info!(kind = "item_end", run = %self.id, seq = d.item.seq, gpu, state = %state, "{line}");
            }
            self.queue.set_item_state(&self.id, d.item.seq, state, &message).await?;
            if state == ItemState::Done && self.queue.is_fleet() {
                let rows = crate::storage::memory::Memory::rows_of_run(&self.ledger, &d.item.run_id, &self.machine).await?;
                let n = self.queue.publish_memory(&rows).await?;
                tracing::info!(kind = "memory", run = %self.id, "[gpu {gpu}] shared {n} measurement(s) of run {} with the fleet", d.item.run_id);
            }
        }
        Ok(())
    }

    async fn finish(self, stopped: bool, queued: usize) -> anyhow::Result<GroupEnd> {
        let used = self.used().as_secs_f64();
        let elsewhere = self.queue.items(&self.id).await?.iter().filter(|i| i.state == ItemState::Running).count();
        let (state, message, end) = if stopped {
            (RunState::Stopped, format!("stopped by request; resume with `optimizerd resume {}`", self.id), GroupEnd::Stopped)
        } else if queued > 0 {
            let m = format!("budget spent; {queued} item(s) never started");
            (RunState::Finished, m.clone(), GroupEnd::Finished(m))
        } else if elsewhere > 0 {
            // A fleet: other machines still run items; the last one to end closes the group.
            let m = format!("this machine's part ended; {elsewhere} item(s) still run on other machines");
            self.ledger.set_group_state(&self.id, RunState::Finished, Some(&m), used).await?;
            tracing::info!(kind = "run_end", run = %self.id, state = "finished", detail = %m, "group {} on {}: {m}", self.id, self.machine);
            return Ok(GroupEnd::Finished(m));
        } else {
            let m = "every item ended".to_string();
            (RunState::Finished, m.clone(), GroupEnd::Finished(m))
        };
        self.queue.set_group_state(&self.id, state, Some(&message), used).await?;
        if self.queue.is_fleet() {
            self.ledger.set_group_state(&self.id, state, Some(&message), used).await?;
        }
        let s = super::view::status(&self.queue, &self.ledger, &self.id, false).await?;
        tracing::info!(
            kind = "group_rate", run = %self.id, iterations = s.iterations, per_minute = s.per_minute, gpu_count = self.gpus.len() as u64,
            "{}", super::view::rate_line(&s)
        );
        tracing::info!(kind = "run_end", run = %self.id, state = %state, detail = %message, "group {} {state}: {message}", self.id);
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(set: &libc::cpu_set_t) -> Vec<usize> {
        // SAFETY: CPU_ISSET only reads the set.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, set) }).collect()
    }

    #[test]
    fn classes_are_split_while_gpus_would_idle() {
        let shapes: Vec<crate::spec::protocol::Shape> = ["b1h1s32d64", "b1h1s64d64", "b1h1s128d64", "b2h16s8192d128-causal"]
            .iter()
            .map(|k| {
                let causal = k.ends_with("-causal");
                let dims: Vec<u32> = k.trim_end_matches("-causal").split(|c: char| c.is_alphabetic()).filter(|x| !x.is_empty()).map(|x| x.parse().unwrap()).collect();
                let mut s = crate::test_fixtures::llama_decode();
                (s.b, s.hq, s.hkv, s.sq, s.sk, s.d, s.causal) = (dims[0], dims[1], dims[1], dims[2], dims[2], dims[3], causal);
                s.dtype = crate::spec::protocol::DType::Fp16;
                s
            })
            .collect();
        let classes = classify(&shapes, 132);
        assert_eq!(classes.len(), 2);
        let items = |gpus| work_items("g", &classes, gpus);
        let names = |v: Vec<NewItem>| v.iter().map(|i| format!("{}:{}", i.run_id, i.shapes.len())).collect::<Vec<_>>();
        assert_eq!(names(items(1)), ["g-latency-d64:3", "g-compute-d128-causal:1"]);
        assert_eq!(names(items(2)), ["g-latency-d64:3", "g-compute-d128-causal:1"]);
        assert_eq!(names(items(3)), ["g-latency-d64-1of2:2", "g-latency-d64-2of2:1", "g-compute-d128-causal:1"]);
        // No more than one item per shape, however many GPUs.
        assert_eq!(items(8).len(), 4);
        let mut all: Vec<String> = items(8).into_iter().flat_map(|i| i.shapes).collect();
        all.sort();
        assert_eq!(all, ["b1h1s128d64", "b1h1s32d64", "b1h1s64d64", "b2h16s8192d128-causal"]);
    }

    #[test]
    fn each_gpus_daemon_gets_its_own_share_of_the_cpus() {
        assert!(cpu_share(0, 1).is_none());
        let all = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        if all < 2 {
            assert!(cpu_share(0, 2).is_none());
            return;
        }
        let (a, b) = (cpus(&cpu_share(0, 2).unwrap()), cpus(&cpu_share(1, 2).unwrap()));
        assert!(!a.is_empty() && !b.is_empty());
        assert!(a.iter().all(|c| !b.contains(c)), "{a:?} and {b:?} overlap");
        assert_eq!(a.len() + b.len(), all);
        assert!(cpu_share(0, all + 1).is_none());
    }
}
