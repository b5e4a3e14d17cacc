//! The commands beside a run: those that read the ledger (`runs`, `history`, `status`,
//! `watch`, `report`, `export`; they open it read-only, so they work on a read-only file
//! or folder), `doctor`, `workload` (a model's config as a workload), and the two that remove runs (`forget`, `runs --prune`). Each
//! calls its library module and prints its result; a row that cannot be read is shown as
//! such while the rest print normally.

use std::path::Path;

use anyhow::Context;

use super::args::{DoctorArgs, ExportArgs, ForgetArgs, HistoryArgs, ReportArgs, RunArgs, RunsArgs, WatchArgs, WorkloadArgs};
use super::exit;
use super::process::{ledger_path, live_state, runs_dir};
use super::{note, Out};
use crate::daemon::lock;
use crate::ops::{prune, report};
use crate::spec::config::Config;
use crate::storage::ledger::Ledger;

/// The configuration and its ledger, opened for reading.
async fn read_ledger(config_path: Option<&Path>) -> anyhow::Result<(Config, Ledger)> {
    let config = Config::load(config_path)?;
    let ledger = Ledger::open_read_only(&ledger_path(&config)).await?;
    Ok((config, ledger))
}

fn best_speedup(best: &[crate::storage::ledger::BestRow]) -> Option<f64> {
    best.iter().filter_map(|b| b.baseline_us.map(|x| x / b.median_us)).fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))))
}

pub async fn runs(args: RunsArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    if args.prune {
        return prune_runs(args.json, config_path, out).await;
    }
    let (config, ledger) = read_ledger(config_path).await?;
    let holder = lock::holders(&runs_dir(&config));
    let mut lines: Vec<report::RunLine> = Vec::new();
    for entry in ledger.run_list().await? {
        lines.push(match entry {
            Ok(r) => Ok((live_state(&r, &holder), best_speedup(&ledger.best(&r.id).await?), r)),
            Err(u) => Err(u),
        });
    }
    if args.json {
        let v: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| match l {
                Ok((state, speedup, r)) => serde_json::json!({ "run": r, "live_state": state, "best_speedup": speedup }),
                Err(u) => serde_json::json!({ "id": u.id, "error": u.why }),
            })
            .collect();
        out.json(&v)?;
    } else {
        out.text(&report::runs_text(&lines))?;
        // `--gpus` groups: one line each (their runs are listed above).
        let groups = ledger.groups().await.unwrap_or_default();
        if !groups.is_empty() {
            out.line("\ngroups (`optimizerd status GROUP`):")?;
            for g in groups {
                let live = holder.iter().any(|h| h.0 == g.id);
                let state = if g.state.is_live() && !live { "interrupted (coordinator gone)".to_string() } else { g.state.to_string() };
                let ids: Vec<String> = g.gpus.iter().map(|x| x.index.to_string()).collect();
                out.line(&format!("  {}  {state}  GPUs {}  started {}", g.id, ids.join(","), g.started_at))?;
            }
        }
    }
    Ok(exit::SUCCESS)
}

async fn prune_runs(json: bool, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let config = Config::load(config_path)?;
    let ledger = Ledger::open(&ledger_path(&config)).await?;
    let removed = prune::prune(&ledger, &runs_dir(&config)).await?;
    if json {
        out.json(&removed)?;
    } else if removed.is_empty() {
        out.line("nothing to prune: no failed run, no run that never started")?;
    } else {
        for r in &removed {
            let folder = r.folder.as_ref().map(|f| format!(" and {}", f.display())).unwrap_or_default();
            out.line(&format!("removed {} ({}): {} ledger rows{folder}", r.run, r.why, r.rows))?;
        }
    }
    Ok(exit::SUCCESS)
}

pub async fn forget(args: ForgetArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let config = Config::load(config_path)?;
    let ledger = Ledger::open(&ledger_path(&config)).await?;
    for id in &args.runs {
        let r = prune::forget(&ledger, &runs_dir(&config), id, "asked").await?;
        let folder = r.folder.as_ref().map(|f| format!(" and {}", f.display())).unwrap_or_default();
        out.line(&format!("forgot run {}: {} ledger rows{folder}", r.run, r.rows))?;
    }
    Ok(exit::SUCCESS)
}

pub async fn watch(args: WatchArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let (config, ledger) = read_ledger(config_path).await?;
    let opts = crate::ops::watch::WatchOptions::default();
    let end = crate::ops::watch::watch(&ledger, &runs_dir(&config), args.run.as_deref(), args.json, out.raw(), &opts).await?;
    if end.daemon_gone {
        if args.json {
            note(&format!("run {}: its daemon is gone; continue it with `optimizerd resume {}`", end.run.id, end.run.id));
        }
        return Ok(exit::DAEMON_GONE);
    }
    Ok(exit::SUCCESS)
}

pub async fn doctor(args: DoctorArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let report = crate::ops::doctor::doctor(&crate::ops::doctor::DoctorOptions::new(config_path.map(Path::to_path_buf))?).await;
    if args.json {
        out.json(&report)?;
    } else {
        out.text(&report.text())?;
    }
    Ok(if report.failed() { exit::CHECKS_FAILED } else { exit::SUCCESS })
}

pub async fn export(args: ExportArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let (_, ledger) = read_ledger(config_path).await?;
    let run = ledger.run(args.run.as_deref()).await?;
    // NVRTC first: without it nothing is written.
    let toolchain = match &args.python {
        Some(_) => Some(crate::nvrtc::locate().map_err(anyhow::Error::new).context(
            "export --python compiles each kernel to a cubin with NVRTC (a CUDA toolkit's works too: set CUDA_HOME to it; \
             or export with --out only: sources and manifest, no cubins)",
        )?),
        None => None,
    };
    let plain = match &args.out {
        Some(dir) => Some(crate::ops::export::export_with(&ledger, &run.id, dir, &Default::default()).await?),
        None => None,
    };
    let package = match (&args.python, toolchain) {
        (Some(dir), Some(tc)) => Some(crate::ops::python_package::export_python(&ledger, &run.id, dir, &args.package_name, tc).await?),
        _ => None,
    };
    if args.json {
        out.json(&serde_json::json!({ "run": run.id, "out": plain, "python": package }))?;
        return Ok(exit::SUCCESS);
    }
    if let Some(e) = &plain {
        out.line(&format!("exported the best kernels of run {} to {} ({} kernels)", run.id, e.dir.display(), e.kernels.len()))?;
        out.line(&format!("  manifest: {}", e.manifest.display()))?;
        for n in &e.notes {
            out.line(&format!("  note:     {n}"))?;
        }
        out.line(&format!("  try it:   python3 examples/run_exported.py {}", e.dir.display()))?;
    }
    if let Some(p) = &package {
        let k = &p.kernels;
        let dir = p.dir.display();
        let name = &p.package;
        out.line(&format!(
            "{} the Python package {name} {} in {dir}: {} kernels of run {}, {} cubins ({})",
            if p.replaced { "replaced" } else { "wrote" },
            p.version,
            k.kernels.len(),
            run.id,
            k.cubins.len(),
            if k.archs.is_empty() { "none".to_string() } else { k.archs.join(", ") },
        ))?;
        for n in &k.notes {
            out.line(&format!("  note:     {n}"))?;
        }
        out.line(&format!("  manifest: {}", k.manifest.display()))?;
        out.line(&format!("  install:  pip install {dir}"))?;
        out.line(&format!("  use:      import {name}; o = {name}.attention(q, k, v, causal=True)      # [B, H, S, D] tensors, or layout=\"bshd\""))?;
        out.line(&format!("  model:    {name}.register_transformers()  then  attn_implementation=\"optimizerd\" in from_pretrained / from_config"))?;
        out.line(&format!("  which:    {name}.explain(q, k, v, causal=True)  says which kernel (or SDPA) a call runs"))?;
    }
    Ok(exit::SUCCESS)
}

pub fn workload(args: WorkloadArgs, out: &mut Out) -> anyhow::Result<u8> {
    let model = crate::spec::hf_config::ModelAttention::load(&args.from_hf, args.dtype)?;
    let lengths = crate::ops::workload::Lengths {
        prefill: args.prefill,
        decode_context: args.decode_context,
        chunk: args.chunk,
        draft: args.draft,
        batch: args.batch,
    };
    let text = crate::ops::workload::workload_toml(&model, &lengths, args.layout, &command_line())?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("cannot write {}", path.display()))?;
            let shapes = text.lines().filter(|l| l.trim_start().starts_with("{ b =")).count();
            out.line(&format!("wrote the [workload] of {} ({shapes} shapes) to {}", args.from_hf.display(), path.display()))?;
            out.line(&format!("  tune it:  optimizerd --config {} start --budget 20m", path.display()))?;
            out.line("  or paste it over the [workload] of agent.toml")?;
        }
        None => out.text(&text)?,
    }
    Ok(exit::SUCCESS)
}

/// This process's command line as a shell would take it back (for a file's header).
fn command_line() -> String {
    let quote = |a: String| {
        if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./,=:+@".contains(c)) {
            a
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        }
    };
    std::iter::once("optimizerd".to_string()).chain(std::env::args().skip(1).map(quote)).collect::<Vec<_>>().join(" ")
}

pub async fn history(args: HistoryArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let filter = report::HistoryFilter { stages: args.stage.clone(), verdicts: args.verdict.clone() };
    let (_, ledger) = read_ledger(config_path).await?;
    let run = ledger.run(args.run.as_deref()).await?;
    let (all, unreadable) = ledger.iteration_list(&run.id).await?;
    let unmatched = filter.unmatched_stages(&all);
    if !unmatched.is_empty() {
        let mut stages: Vec<&str> = Vec::new();
        for it in &all {
            if !stages.contains(&it.stage.as_str()) {
                stages.push(&it.stage);
            }
        }
        note(&format!("note: no iteration of stage {} in run {}; its stages: {}", unmatched.join(", "), run.id, stages.join(", ")));
    }
    if !unreadable.is_empty() && (args.json || args.csv) {
        let seqs: Vec<String> = unreadable.iter().map(|u| format!("{} ({})", u.seq, u.why)).collect();
        note(&format!("note: iterations left out, they cannot be read from the ledger: {}", seqs.join(", ")));
    }
    let its: Vec<_> = all.iter().filter(|it| filter.matches(it)).cloned().collect();
    if args.json {
        out.json(&its)?;
    } else if args.csv {
        let shapes: Vec<String> = ledger.run_setup(&run.id).await?.workload.iter().map(|s| s.key()).collect();
        out.text(&report::history_csv(&its, &shapes).map_err(|e| anyhow::anyhow!(e).context("cannot write CSV"))?)?;
    } else {
        let total = all.len() + unreadable.len();
        let shown = if its.len() == total { format!("{total} iterations") } else { format!("{} of {total} iterations", its.len()) };
        out.line(&format!("run {} ({}, {shown})\n", run.id, run.state))?;
        out.text(&report::history_text(&its))?;
        out.text(&report::unreadable_iterations_text(&unreadable))?;
    }
    Ok(exit::SUCCESS)
}

pub async fn run_report(args: ReportArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let (config, ledger) = read_ledger(config_path).await?;
    if let Some(id) = args.run.as_deref() {
        if ledger.is_group(id).await {
            return group_report(&config, &ledger, id, &args, out).await;
        }
    }
    let run = ledger.run(args.run.as_deref()).await?;
    let dir = args.out.clone().unwrap_or_else(|| runs_dir(&config).join(&run.id).join("report"));
    let state = live_state(&run, &lock::holders(&runs_dir(&config)));
    let w = crate::ops::run_report::write(&ledger, &run.id, &dir, Some(state)).await?;
    if args.json {
        out.json(&w)?;
        return Ok(exit::SUCCESS);
    }
    if w.iterations == 0 {
        out.line(&format!("run {} ({}) has no recorded iterations yet: the report holds its environment and no figures", w.run, w.state))?;
    } else {
        out.line(&format!("report of run {} ({}, {} iterations, {} figures)", w.run, w.state, w.iterations, w.figures.len()))?;
    }
    for n in &w.notes {
        out.line(&format!("  note: {n}"))?;
    }
    out.line(&format!("  html:     {}", w.html.display()))?;
    out.line(&format!("  markdown: {}", w.markdown.display()))?;
    for f in &w.figures {
        out.line(&format!("  figure:   {}", f.display()))?;
    }
    out.line(&format!("  as PNG:   bash scripts/report_png.sh {} {}", w.html.display(), dir.join("report.png").display()))?;
    Ok(exit::SUCCESS)
}

/// `report GROUP`: each item's run reported into `<out>/<run>/` (every run is measured on its
/// own GPU against SDPA there, so there is no one figure across them), and `<out>/index.md`
/// listing the items, their GPUs and links to the runs' pages.
async fn group_report(config: &Config, ledger: &Ledger, id: &str, args: &ReportArgs, out: &mut Out) -> anyhow::Result<u8> {
    let dir = args.out.clone().unwrap_or_else(|| runs_dir(config).join(id).join("report"));
    let holders = lock::holders(&runs_dir(config));
    let mut written = Vec::new();
    let mut index = format!(
        "# Group {id}\n\nOne run per work item, each on its own GPU against SDPA on that GPU.\n\n\
         | item | class | GPU | state | run | iterations | report |\n|---|---|---|---|---|---|---|\n"
    );
    for item in ledger.items(id).await? {
        let gpu = item.gpu.map_or("-".to_string(), |g| g.to_string());
        let Ok(run) = ledger.run(Some(&item.run_id)).await else {
            index.push_str(&format!("| {} | {} | {gpu} | {} | never started | - | - |\n", item.seq, item.class, item.state.as_str()));
            continue;
        };
        let w = crate::ops::run_report::write(ledger, &run.id, &dir.join(&run.id), Some(live_state(&run, &holders))).await?;
        index.push_str(&format!(
            "| {} | {} | {gpu} | {} | {} | {} | [{}/report.html]({}/report.html) |\n",
            item.seq,
            item.class,
            item.state.as_str(),
            run.id,
            w.iterations,
            run.id,
            run.id
        ));
        written.push(w);
    }
    let index_path = dir.join("index.md");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}; choose another folder with --out", dir.display()))?;
    std::fs::write(&index_path, index).with_context(|| format!("cannot write {}; choose another folder with --out", index_path.display()))?;
    if args.json {
        out.json(&serde_json::json!({ "group": id, "index": index_path, "reports": written }))?;
        return Ok(exit::SUCCESS);
    }
    out.line(&format!("report of group {id}: {} run(s)", written.len()))?;
    out.line(&format!("  index:    {}", index_path.display()))?;
    for w in &written {
        out.line(&format!("  {}: {} ({} iterations)", w.run, w.html.display(), w.iterations))?;
    }
    Ok(exit::SUCCESS)
}

pub async fn status(args: RunArgs, config_path: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let (config, ledger) = read_ledger(config_path).await?;
    if let Some(id) = args.run.as_deref() {
        if ledger.is_group(id).await || crate::group::in_fleet(config.fleet.ledger.as_deref(), id).await {
            let live = lock::holder_of(&runs_dir(&config), id).is_some();
            let queue = crate::group::queue_of(&ledger, config.fleet.ledger.as_deref(), id).await?;
            let s = crate::group::status(&queue, &ledger, id, live).await?;
            if args.json {
                out.json(&s)?;
            } else {
                out.text(&crate::group::status_text(&s))?;
            }
            return Ok(exit::SUCCESS);
        }
    }
    let mut s = report::status(&ledger, args.run.as_deref()).await?;
    s.run.state = live_state(&s.run, &lock::holders(&runs_dir(&config)));
    if args.json {
        out.json(&s)?;
    } else {
        out.text(&report::status_text(&s))?;
    }
    Ok(exit::SUCCESS)
}
