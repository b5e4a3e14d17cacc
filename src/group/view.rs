//! A group as `status` shows it: its GPUs, its queue, each item's run and best speedup,
//! and the candidates per minute of wall time the group reached on all its GPUs.

use serde::Serialize;

use super::store::Queue;
use crate::storage::ledger::{GroupRow, ItemRow, Ledger, LedgerError, RunRow};

#[derive(Debug, Clone, Serialize)]
pub struct ItemView {
    pub item: ItemRow,
    /// Its run, once one was recorded.
    pub run: Option<RunRow>,
    /// The largest speedup of a best kernel over the run's first correct kernel (`baseline`),
    /// as `runs` shows it; the comparison with SDPA is the run's (`status RUN`).
    pub best_speedup: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupStatus {
    pub group: GroupRow,
    /// Whether its coordinator is alive (its lock is held).
    pub live: bool,
    pub items: Vec<ItemView>,
    /// Candidates recorded by all its runs.
    pub iterations: i64,
    /// Candidates per minute of the group's wall-clock budget used, all GPUs together.
    pub per_minute: Option<f64>,
}

/// Group `id` from `queue`, its items' runs from this machine's `ledger` (a fleet's items
/// that ran on other machines have no run here).
pub async fn status(queue: &Queue, ledger: &Ledger, id: &str, live: bool) -> anyhow::Result<GroupStatus> {
    let group = queue.group(id).await?;
    let mut items = Vec::new();
    let mut iterations = 0;
    for item in queue.items(id).await? {
        let run = match ledger.run(Some(&item.run_id)).await {
            Ok(r) => Some(r),
            Err(LedgerError::NoSuchRun(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let best_speedup = match &run {
            Some(r) => {
                iterations += r.iterations;
                ledger.best(&r.id).await?.iter().filter_map(|b| b.baseline_us.map(|x| x / b.median_us)).fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))))
            }
            None => None,
        };
        items.push(ItemView { item, run, best_speedup });
    }
    let minutes = group.used_s / 60.0;
    let per_minute = (minutes > 0.0).then(|| iterations as f64 / minutes);
    Ok(GroupStatus { group, live, items, iterations, per_minute })
}

/// "N candidates in T of wall time on K GPUs: X per minute".
pub fn rate_line(s: &GroupStatus) -> String {
    let t = crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(s.group.used_s.max(0.0)));
    match s.per_minute {
        Some(r) => format!("{} candidates in {t} of wall time on {} GPU(s): {r:.1} per minute", s.iterations, s.group.gpus.len()),
        None => format!("{} candidates on {} GPU(s)", s.iterations, s.group.gpus.len()),
    }
}

pub fn status_text(s: &GroupStatus) -> String {
    let g = &s.group;
    let state = if g.state.is_live() && !s.live { format!("{} (coordinator gone; `optimizerd resume {}`)", g.state, g.id) } else { g.state.to_string() };
    let model = g.gpus.first().map(|x| x.device.name.as_str()).unwrap_or("?");
    let ids: Vec<String> = g.gpus.iter().map(|x| x.index.to_string()).collect();
    let mut out = format!(
        "group {} ({state}{})\n  GPUs:   {} ({model})\n  budget: {} of {} used\n  {}\n\n",
        g.id,
        g.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default(),
        ids.join(", "),
        crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(g.used_s.max(0.0))),
        crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(g.budget_s.max(0.0))),
        rate_line(s),
    );
    out.push_str(&format!("{:>4}  {:<24} {:<12} {:>4}  {:<8} {:>6} {:>8}  {:<9} {}\n", "item", "class", "machine", "gpu", "state", "iters", "gain", "budget", "run"));
    for v in &s.items {
        let it = &v.item;
        out.push_str(&format!(
            "{:>4}  {:<24} {:<12} {:>4}  {:<8} {:>6} {:>8}  {:<9} {}\n",
            it.seq,
            it.class,
            it.holder.as_deref().and_then(|h| h.rsplit_once(':')).map(|(m, _)| m).unwrap_or("-"),
            it.gpu.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            it.state.as_str(),
            v.run.as_ref().map(|r| r.iterations.to_string()).unwrap_or_else(|| "-".into()),
            v.best_speedup.map(|x| format!("{x:.2}x")).unwrap_or_else(|| "-".into()),
            it.budget_s.map(|b| crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(b))).unwrap_or_else(|| "-".into()),
            it.run_id,
        ));
    }
    out.push_str("\ngain: the best kernel's speedup over the run's first correct kernel. Each item is a run of its own:\n`optimizerd status RUN` shows its kernels against SDPA on its GPU, `optimizerd export RUN` exports them.\n");
    out
}
