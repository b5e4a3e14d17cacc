//! Reports read from the ledger: the iteration history, a run's status, and the
//! end-of-run summary of the best kernel per shape.

use std::fmt::Write;

use serde::Serialize;

use crate::spec::protocol::Shape;
use crate::spec::states::{RunState, ShownState, Verdict};
use crate::storage::ledger::{kv_rate, BestRow, ClosingRow, IterationRecord, Ledger, LedgerError, RunRow, SdpaRow, UnreadableIteration, UnreadableRun};
use crate::storage::sdpa::FA4;
use crate::pipeline::record::fmt_secs;
use crate::storage::ledger::time_to_best::{self, TimeToBest};

#[derive(Debug, Serialize)]
pub struct Status {
    pub run: RunRow,
    pub budget_left_s: f64,
    /// The end of the budget the run keeps for its closing comparison (its search stops that
    /// much earlier); None for runs recorded before the reserve existed.
    pub closing_reserve_s: Option<f64>,
    pub best: Vec<BestRow>,
    pub verdicts: Vec<(Verdict, i64)>,
    /// Iterations whose rows cannot be decoded (named; the others are counted normally).
    pub unreadable: Vec<UnreadableIteration>,
    /// The run's workload (decode shapes are judged in K/V bandwidth).
    pub workload: Vec<Shape>,
    /// PyTorch SDPA (and FlashAttention-4, backend `fa4`) on each shape (empty when it was unavailable).
    pub sdpa: Vec<SdpaRow>,
    /// The closing comparison (a finished run): best kernels and SDPA re-timed back to back.
    /// Each row also carries its derived figures (`ours_us`, `vs_default`, `vs_fa4`, and
    /// under sustained timing `ours_sustained_us`, `fa4_sustained_us`, `sustained_vs_default`,
    /// `sustained_vs_fa4`), so `status --json` readers need not recompute them.
    #[serde(serialize_with = "closing_json")]
    pub closing: Vec<ClosingRow>,
    /// What the agent used of its limits; None when the run's agent was off and idle.
    pub agent: Option<AgentStatus>,
    /// When each shape's final best was first reached, and the budget spent on candidates
    /// that lost by more than 20% or failed before timing (from the iterations alone).
    pub time_to_best: TimeToBest,
}

/// The agent's requests, tokens and estimated cost against the run's limits.
#[derive(Debug, Serialize)]
pub struct AgentStatus {
    pub model: String,
    pub base_url: String,
    pub usage: crate::spec::agent::Usage,
    pub max_requests: Option<u64>,
    pub max_total_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

pub async fn status(ledger: &Ledger, run: Option<&str>) -> Result<Status, LedgerError> {
    let run = ledger.run(run).await?;
    let best = ledger.best(&run.id).await?;
    let (its, unreadable) = ledger.iteration_list(&run.id).await?;
    let mut verdicts: Vec<(Verdict, i64)> = Vec::new();
    for it in &its {
        match verdicts.iter_mut().find(|(v, _)| *v == it.verdict) {
            Some((_, n)) => *n += 1,
            None => verdicts.push((it.verdict, 1)),
        }
    }
    let sdpa = ledger.sdpa(&run.id).await?;
    let closing = ledger.closing(&run.id).await?;
    let workload = ledger.run_setup(&run.id).await?.workload;
    let usage = ledger.agent_usage(&run.id).await?;
    let cfg = ledger.run_agent_config(&run.id).await?;
    let enabled = cfg.as_ref().and_then(|c| c["base_url"].as_str()).is_some_and(|u| !u.trim().is_empty());
    let agent = (enabled || usage.requests > 0).then(|| {
        let c = cfg.unwrap_or_default();
        AgentStatus {
            model: c["model"].as_str().unwrap_or("-").to_string(),
            base_url: c["base_url"].as_str().unwrap_or("-").to_string(),
            usage,
            max_requests: c["max_requests"].as_u64(),
            max_total_tokens: c["max_total_tokens"].as_u64(),
            max_cost_usd: c["max_cost_usd"].as_f64(),
        }
    });
    let time_to_best = time_to_best::compute(&its);
    let closing_reserve_s = ledger.closing_reserve(&run.id).await?;
    Ok(Status { budget_left_s: (run.budget_s - run.used_s).max(0.0), closing_reserve_s, run, best, verdicts, unreadable, workload, sdpa, closing, agent, time_to_best })
}

/// Candidates per minute of budget used (None before a minute's worth of data).
pub fn per_minute(iterations: i64, used_s: f64) -> Option<f64> {
    (used_s >= 1.0 && iterations > 0).then(|| iterations as f64 * 60.0 / used_s)
}

pub fn status_text(s: &Status) -> String {
    let r = &s.run;
    let mut out = String::new();
    let _ = writeln!(out, "run        {}", r.id);
    let _ = writeln!(out, "state      {}{}", r.state, r.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default());
    let _ = writeln!(out, "gpu        {}", r.gpu_name.as_deref().unwrap_or("-"));
    let _ = writeln!(out, "stage      {}", r.stage.as_deref().unwrap_or("-"));
    let mut verdicts: Vec<String> = s.verdicts.iter().map(|(v, n)| format!("{n} {v}")).collect();
    if !s.unreadable.is_empty() {
        let seqs: Vec<String> = s.unreadable.iter().map(|u| format!("#{}", u.seq)).collect();
        verdicts.push(format!("{} unreadable: {}", s.unreadable.len(), seqs.join(" ")));
    }
    let rate = per_minute(r.iterations, r.used_s).map(|x| format!(", {x:.1} per minute of budget")).unwrap_or_default();
    let _ = writeln!(out, "iterations {}{}{rate}", r.iterations, if verdicts.is_empty() { String::new() } else { format!(" ({})", verdicts.join(", ")) });
    let kept = match s.closing_reserve_s {
        Some(k) if k > 0.0 => format!(" (the last {} kept for the closing comparison)", fmt_secs(k)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "budget     {} used of {}, {} left{kept}",
        fmt_secs(r.used_s),
        fmt_secs(r.budget_s),
        fmt_secs(s.budget_left_s)
    );
    if !s.time_to_best.shapes.is_empty() || s.time_to_best.budget_s_on_candidates > 0.0 {
        let _ = writeln!(out, "to best    {}", s.time_to_best.summary_line(r.used_s, r.state.recorded == RunState::Finished, fmt_ttb));
    }
    if let Some(a) = &s.agent {
        let of = |x: Option<String>| x.map(|x| format!(" of {x}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "agent      {} requests{}, {} tokens{}, ${:.4}{} ({} at {})",
            a.usage.requests,
            of(a.max_requests.map(|m| m.to_string())),
            a.usage.tokens(),
            of(a.max_total_tokens.map(|m| m.to_string())),
            a.usage.cost_usd,
            of(a.max_cost_usd.map(|m| format!("${m:.2}"))),
            a.model,
            a.base_url
        );
    }
    let _ = writeln!(out, "folder     {}", r.run_dir);
    out.push('\n');
    out.push_str(&best_table(&s.best, &s.sdpa, &r.run_dir, Some(&s.time_to_best)));
    if !s.best.is_empty() {
        let _ = writeln!(out, "{TIME_TO_BEST_NOTE}");
    }
    out.push_str(&closing_table(&s.closing, &s.workload));
    if let Some(v) = s.sdpa.first().map(|x| &x.versions) {
        let _ = writeln!(
            out,
            "\nsdpa: PyTorch {} (cuDNN {}), default backend, CUDA-graph GPU time per call (candidates: as set by timing.method)",
            v["torch"].as_str().unwrap_or("?"),
            v["cudnn"].as_i64().map(|c| c.to_string()).unwrap_or_else(|| "-".into())
        );
        let _ = writeln!(out, "{}", fa4_line(v));
    }
    out
}

/// What the `fa4` columns are, or why there are none.
fn fa4_line(versions: &serde_json::Value) -> String {
    match (versions["fa4"].as_str(), versions["fa4_error"].as_str()) {
        (Some(v), _) => format!("fa4:  FlashAttention-4 {v} (flash_attn.cute, [B,S,H,D] inputs), CUDA-graph GPU time per call"),
        (None, Some(why)) => format!("fa4:  FA4 not measured: {why}"),
        (None, None) => "fa4:  FA4 not measured".into(),
    }
}

/// A backend's CUDA-graph time in a stored backends object (None: absent or failed).
fn backend_us(backends: &serde_json::Value, name: &str) -> Option<f64> {
    backends.get(name)?.get("graph_us")?.as_f64()
}

fn cell(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "-".into())
}

fn closing_json<S: serde::Serializer>(rows: &[ClosingRow], ser: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = ser.serialize_seq(Some(rows.len()))?;
    for r in rows {
        let mut v = serde_json::to_value(r).map_err(serde::ser::Error::custom)?;
        if let Some(o) = v.as_object_mut() {
            for (k, x) in [
                ("ours_us", Some(r.ours_us())),
                ("vs_default", r.vs_default()),
                ("vs_fa4", r.vs_fa4()),
                ("ours_sustained_us", r.ours_sustained_us()),
                ("fa4_sustained_us", r.fa4_sustained_us()),
                ("sustained_vs_default", r.sustained_vs_default()),
                ("sustained_vs_fa4", r.sustained_vs_fa4()),
            ] {
                o.insert(k.into(), x.into());
            }
        }
        seq.serialize_element(&v)?;
    }
    seq.end()
}

/// The closing comparison, when the run has one: the figures to quote, since ours and the
/// baselines' were taken back to back at the end, at the same clocks. FA4's columns appear
/// when it was measured; a decode shape of `workload` also gets its effective K/V bandwidth.
pub fn closing_table(rows: &[ClosingRow], workload: &[Shape]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let fa4 = rows.iter().any(|r| r.fa4_measured());
    let sustained = rows.iter().any(|r| r.ours_sustained_us().is_some());
    let _ = writeln!(out, "\nclosing comparison ({}; best kernel timed before and after a fresh measurement of the baselines):", rows[0].measured_at);
    if sustained {
        let ms = rows.iter().find_map(|r| r.sustained_ms).map(|m| format!("{m:.0} ms")).unwrap_or_else(|| "-".into());
        let _ = writeln!(out, "(burst: ~2 ms samples, each a CUDA graph replay as the baselines' are; sus: each replayed back to back for at least {ms}, as in a model step)");
    }
    let mut head = format!("{:<40} {:>5} {:>11} {:>11} {:>16} {:>8}", "shape", "iter", "best us", "(before)", "sdpa us", "vs sdpa");
    if fa4 {
        let _ = write!(head, " {:>11} {:>8}", "fa4 us", "vs fa4");
    }
    if sustained {
        let _ = write!(head, " {:>11} {:>11} {:>8}", "best sus us", "sdpa sus us", "vs sdpa");
        if fa4 {
            let _ = write!(head, " {:>11} {:>8}", "fa4 sus us", "vs fa4");
        }
    }
    let decode = |key: &str| workload.iter().find(|s| s.key() == key && s.is_decode());
    if rows.iter().any(|r| decode(&r.shape).is_some()) {
        head.push_str("  best (decode: K/V bandwidth)");
    }
    let _ = writeln!(out, "{}", head.trim_end());
    for r in rows {
        let sdpa = r.sdpa_default_us.map(|t| format!("{t:.2} {}", r.sdpa_picked.as_deref().unwrap_or(""))).unwrap_or_else(|| "-".into());
        let vs = cell(r.vs_default(), |x| format!("{x:.2}x"));
        let mut line = format!("{:<40} {:>5} {:>11.2} {:>11.2} {:>16} {:>8}", r.shape, r.seq, r.ours_us(), r.ours_before_us, sdpa, vs);
        if fa4 {
            let us = if r.fa4_measured() { cell(r.fa4_us(), |x| format!("{x:.2}")) } else { "-".into() };
            let _ = write!(line, " {:>11} {:>8}", if r.fa4_measured() && r.fa4_us().is_none() { "failed".into() } else { us }, cell(r.vs_fa4(), |x| format!("{x:.2}x")));
        }
        if sustained {
            let f = |x: Option<f64>| cell(x, |x| format!("{x:.2}"));
            let _ = write!(line, " {:>11} {:>11} {:>8}", f(r.ours_sustained_us()), f(r.sdpa_default_sustained_us), cell(r.sustained_vs_default(), |x| format!("{x:.2}x")));
            if fa4 {
                let _ = write!(line, " {:>11} {:>8}", f(r.fa4_sustained_us()), cell(r.sustained_vs_fa4(), |x| format!("{x:.2}x")));
            }
        }
        if let Some(s) = decode(&r.shape) {
            let _ = write!(line, "  {}", kv_rate(s, r.ours_us()));
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// What the status text's `best at` column and `to best` line mean, in short; the full
/// definition is [`time_to_best::DEFINITION`] (in `status --json` and the report).
/// Seconds for the time-to-best figures: tenths under a minute (a short run's candidates
/// cost fractions of a second), otherwise as the budget is written.
fn fmt_ttb(s: f64) -> String {
    if s < 60.0 { format!("{s:.1}s") } else { fmt_secs(s) }
}

pub const TIME_TO_BEST_NOTE: &str = "best at: budget time when the shape's final best kernel was recorded (its last win); \
losing by >20%: timed, won no shape, time >1.2x the incumbents' (geometric mean over its timed shapes; rejected_early ones were timed briefly); \
failed before timing: gated, compile_error, incorrect, cta_mismatch, crashed, timeout, error, cheating, rejected_proposal";

/// The best kernel per shape: time, speedup over the baseline kernel, over SDPA and (when
/// it was measured) over FlashAttention-4, and its source; with `ttb`, when each shape's
/// final best was first reached (`best at`, budget time) beside its iteration.
pub fn best_table(best: &[BestRow], sdpa: &[SdpaRow], run_dir: &str, ttb: Option<&TimeToBest>) -> String {
    let mut out = String::new();
    if best.is_empty() {
        out.push_str("no correct kernel yet\n");
        return out;
    }
    let fa4 = sdpa.iter().any(|s| s.backends.get(FA4).is_some_and(|v| v.is_object()));
    let mut head = format!("{:<40} {:>5}", "shape", "iter");
    if ttb.is_some() {
        let _ = write!(head, " {:>8}", "best at");
    }
    let _ = write!(head, " {:>11} {:>12} {:>8} {:>16} {:>8}", "best us", "baseline us", "speedup", "sdpa us", "vs sdpa");
    if fa4 {
        let _ = write!(head, " {:>11} {:>8}", "fa4 us", "vs fa4");
    }
    let _ = writeln!(out, "{head}  source");
    for b in best {
        let speedup = cell(b.baseline_us, |x| format!("{:.2}x", x / b.median_us));
        let s = sdpa.iter().find(|s| s.shape == b.shape);
        let sdpa_us = s
            .and_then(|s| s.default_graph_us.map(|t| format!("{t:.2} {}", s.picked.as_deref().unwrap_or(""))))
            .unwrap_or_else(|| "-".into());
        let vs = cell(s.and_then(|s| s.default_graph_us), |t| format!("{:.2}x", t / b.median_us));
        let mut line = format!("{:<40} {:>5}", b.shape, b.seq);
        if let Some(t) = ttb {
            // "-" where the iterations hold no budget figure for the win (old rows), or name
            // another iteration than the best table does (never expected: both follow wins).
            let at = t.shape(&b.shape).filter(|x| x.seq == b.seq).and_then(|x| x.first_reached_best_s).map(fmt_ttb).unwrap_or_else(|| "-".into());
            let _ = write!(line, " {at:>8}");
        }
        let _ = write!(
            line,
            " {:>11.2} {:>12} {:>8} {:>16} {:>8}",
            b.median_us,
            cell(b.baseline_us, |x| format!("{x:.2}")),
            speedup,
            sdpa_us,
            vs,
        );
        if fa4 {
            let f = s.and_then(|s| backend_us(&s.backends, FA4));
            let _ = write!(line, " {:>11} {:>8}", cell(f, |x| format!("{x:.2}")), cell(f, |x| format!("{:.2}x", x / b.median_us)));
        }
        let _ = writeln!(out, "{line}  {}/workspace/{}", run_dir, b.source_path);
    }
    out
}

/// Every verdict the ledger holds, by name: the pipeline's, and `running` for the
/// iteration in flight (in the order lists and legends show them).
pub const VERDICTS: [&str; Verdict::ALL.len()] = {
    let mut names = [""; Verdict::ALL.len()];
    let mut i = 0;
    while i < Verdict::ALL.len() {
        names[i] = Verdict::ALL[i].as_str();
        i += 1;
    }
    names
};

/// Which iterations `history` shows; an empty list lets everything through.
#[derive(Debug, Default, Clone)]
pub struct HistoryFilter {
    /// Stage names; one ending in `*` is a prefix (`open/*`: every open-phase class).
    pub stages: Vec<String>,
    pub verdicts: Vec<Verdict>,
}

impl HistoryFilter {
    /// Parses the verdicts, so a typo is an error rather than an empty list.
    pub fn new(stages: Vec<String>, verdicts: Vec<String>) -> Result<Self, String> {
        let verdicts = verdicts
            .iter()
            .map(|v| v.parse::<Verdict>().map_err(|_| format!("unknown verdict `{v}` for --verdict; one of: {}", VERDICTS.join(", "))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HistoryFilter { stages, verdicts })
    }

    pub fn matches(&self, it: &IterationRecord) -> bool {
        let stage_ok = self.stages.is_empty()
            || self.stages.iter().any(|s| match s.strip_suffix('*') {
                Some(prefix) => it.stage.starts_with(prefix),
                None => it.stage == *s,
            });
        stage_ok && (self.verdicts.is_empty() || self.verdicts.contains(&it.verdict))
    }

    /// Stage filters that match no iteration of `its`, to name them to the user.
    pub fn unmatched_stages<'a>(&'a self, its: &[IterationRecord]) -> Vec<&'a str> {
        let one = |s: &String| HistoryFilter { stages: vec![s.clone()], verdicts: vec![] };
        self.stages.iter().filter(|s| !its.iter().any(|it| one(s).matches(it))).map(|s| s.as_str()).collect()
    }
}

/// `history --csv`: one row per iteration, then each shape's median time (`us:<shape>`,
/// empty where it was not timed) and whether it won (`won:<shape>`), shapes in `shapes` order.
pub fn history_csv(its: &[IterationRecord], shapes: &[String]) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut head: Vec<String> = [
        "iter", "stage", "template", "verdict", "params", "geomean_us", "registers", "spill_bytes", "static_smem", "arch", "compile_ms",
        "check_ms", "time_ms", "budget_used_s", "started_at", "finished_at", "reason",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    head.extend(shapes.iter().map(|s| format!("us:{s}")));
    head.extend(shapes.iter().map(|s| format!("won:{s}")));
    w.write_record(&head)?;
    let num = |x: Option<f64>| x.map(|v| format!("{v:.3}")).unwrap_or_default();
    let int = |x: Option<i64>| x.map(|v| v.to_string()).unwrap_or_default();
    for it in its {
        let mut row = vec![
            it.seq.to_string(),
            it.stage.clone(),
            it.template.clone(),
            it.verdict.to_string(),
            it.params_json.clone(),
            num(it.score_us),
            int(it.registers),
            int(it.local_bytes),
            int(it.static_smem),
            it.arch.clone().unwrap_or_default(),
            num(it.compile_ms),
            num(it.check_ms),
            num(it.time_ms),
            num(it.used_s),
            it.started_at.clone(),
            it.finished_at.clone(),
            it.reason.clone(),
        ];
        let row_of = |s: &String| it.shapes.iter().find(|r| r.shape == *s);
        row.extend(shapes.iter().map(|s| num(row_of(s).and_then(|r| r.median_us))));
        row.extend(shapes.iter().map(|s| row_of(s).map(|r| if r.won { "1" } else { "0" }.to_string()).unwrap_or_default()));
        w.write_record(&row)?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

pub fn history_text(its: &[IterationRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4}  {:<22} {:<13} {:<50} {:>10} {:>6} {:<7} {:>5}  reason",
        "iter", "stage", "verdict", "params", "geomean us", "regs", "arch", "won"
    );
    for it in its {
        let won = it.shapes.iter().filter(|s| s.won).count();
        let _ = writeln!(
            out,
            "{:>4}  {:<22} {:<13} {:<50} {:>10} {:>6} {:<7} {:>5}  {}",
            it.seq,
            it.stage,
            it.verdict,
            it.params_json,
            it.score_us.map(|s| format!("{s:.2}")).unwrap_or_else(|| "-".into()),
            it.registers.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
            it.arch.as_deref().unwrap_or("-"),
            if it.shapes.is_empty() { "-".to_string() } else { format!("{won}/{}", it.shapes.len()) },
            it.reason
        );
    }
    out
}

/// One line of `optimizerd runs`: a run as the user sees it (its live state and best
/// speedup), or a row that cannot be read.
pub type RunLine = Result<(ShownState, Option<f64>, RunRow), UnreadableRun>;

/// `optimizerd runs`: one line per run, newest first; a row that cannot be read is named
/// in its place with the way to remove it.
pub fn runs_text(rows: &[RunLine]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<22} {:<26} {:<24} {:>17} {:>6} {:>8}", "run", "state", "gpu", "budget used", "iters", "best");
    for line in rows {
        let (state, speedup, r) = match line {
            Ok(l) => l,
            Err(u) => {
                let _ = writeln!(out, "{:<22} unreadable: {}; `optimizerd forget {}` removes it", u.id, u.why, u.id);
                continue;
            }
        };
        let budget = format!("{} / {}", fmt_secs(r.used_s), fmt_secs(r.budget_s));
        let _ = writeln!(
            out,
            "{:<22} {:<26} {:<24} {:>17} {:>6} {:>8}",
            r.id,
            state,
            r.gpu_name.as_deref().unwrap_or("-").chars().take(24).collect::<String>(),
            budget,
            r.iterations,
            speedup.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into())
        );
    }
    out
}

/// The lines `history` prints for iterations that cannot be read, in place of their rows.
pub fn unreadable_iterations_text(bad: &[UnreadableIteration]) -> String {
    let mut out = String::new();
    for u in bad {
        let _ = writeln!(out, "{:>4}  unreadable: {}", u.seq, u.why);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_verdict_is_listed() {
        for v in crate::spec::states::Verdict::ALL {
            assert!(super::VERDICTS.contains(&v.as_str()), "{v} missing from VERDICTS");
        }
        assert_eq!(super::VERDICTS.len(), crate::spec::states::Verdict::ALL.len());
        assert!(super::VERDICTS.contains(&"running"));
    }
}

#[cfg(test)]
mod baseline_tables {
    use super::*;
    use crate::spec::protocol::{DType, Layout};
    use serde_json::json;

    use crate::test_fixtures::{closing_row as closing, llama_decode as decode};


    fn prefill() -> Shape {
        Shape { b: 4, hq: 32, hkv: 8, sq: 1024, sk: 1024, d: 128, causal: true, window: None, dtype: DType::Bf16, layout: Layout::Bshd }
    }

    fn line<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
        text.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no line for {key} in\n{text}")).split_whitespace().collect()
    }

    #[test]
    fn the_closing_table_has_fa4_columns_when_fa4_was_measured_and_bandwidth_for_decode() {
        let rows = [
            closing(&decode().key(), 44.0, 51.93, json!({"fa4": {"graph_us": 50.18}})),
            closing(&prefill().key(), 80.0, 85.0, json!({"fa4": {"error": "RuntimeError: no"}})),
        ];
        let text = closing_table(&rows, &[decode(), prefill()]);
        let head = text.lines().nth(2).unwrap();
        assert!(head.contains("fa4 us") && head.contains("vs fa4") && head.contains("best (decode: K/V bandwidth)"), "{text}");
        assert_eq!(line(&text, "b8hq32hkv8"), ["b8hq32hkv8sq1sk4096d128-causal-bf16", "9", "44.00", "44.00", "51.93", "cudnn", "1.18x", "50.18", "1.14x", "3.05", "TB/s", "KV"]);
        assert_eq!(line(&text, "b4hq32hkv8"), ["b4hq32hkv8s1024d128-causal-bf16-bshd", "9", "80.00", "80.00", "85.00", "cudnn", "1.06x", "failed", "-"]);
    }

    #[test]
    fn the_closing_table_shows_sustained_figures_beside_the_burst_ones() {
        let mut with = closing(&decode().key(), 44.0, 51.93, json!({"fa4": {"graph_us": 50.18, "sustained_us": 57.0}}));
        (with.ours_sustained_before_us, with.ours_sustained_after_us, with.sdpa_default_sustained_us, with.sustained_ms) = (Some(50.0), Some(52.0), Some(61.2), Some(200.0));
        let rows = [with, closing(&prefill().key(), 80.0, 85.0, json!({"fa4": {"error": "RuntimeError: no"}}))];
        let text = closing_table(&rows, &[decode(), prefill()]);
        assert!(text.contains("back to back for at least 200 ms"), "{text}");
        let head = text.lines().nth(3).unwrap();
        assert!(head.contains("best sus us") && head.contains("sdpa sus us") && head.contains("fa4 sus us"), "{text}");
        assert_eq!(
            line(&text, "b8hq32hkv8"),
            ["b8hq32hkv8sq1sk4096d128-causal-bf16", "9", "44.00", "44.00", "51.93", "cudnn", "1.18x", "50.18", "1.14x", "51.00", "61.20", "1.20x", "57.00", "1.12x", "3.05", "TB/s", "KV"]
        );
        // A row without sustained figures (not measured for that shape): dashes, burst as before.
        assert_eq!(line(&text, "b4hq32hkv8")[9..], ["-", "-", "-", "-", "-"]);
        // status --json: the derived figures beside the stored ones.
        let v = serde_json::to_value(Wrapper { closing: rows.to_vec() }).unwrap();
        assert_eq!(v["closing"][0]["ours_sustained_us"], json!(51.0));
        assert_eq!(v["closing"][0]["sustained_vs_default"], json!(1.2));
        assert_eq!(v["closing"][0]["sustained_vs_fa4"].as_f64().map(|x| (x * 1000.0).round()), Some(1118.0));
        assert_eq!(v["closing"][1]["ours_sustained_us"], json!(null));
        assert_eq!(v["closing"][1]["ours_us"], json!(80.0));
    }

    #[derive(serde::Serialize)]
    struct Wrapper {
        #[serde(serialize_with = "closing_json")]
        closing: Vec<ClosingRow>,
    }

    #[test]
    fn without_fa4_the_tables_keep_their_columns_and_status_says_why() {
        let rows = [closing(&prefill().key(), 80.0, 85.0, json!({"default": {"graph_us": 85.0}}))];
        let text = closing_table(&rows, &[prefill()]);
        assert!(!text.contains("fa4") && !text.contains("TB/s"), "{text}");
        assert_eq!(line(&text, "b4hq32hkv8")[4..7], ["85.00", "cudnn", "1.06x"]);
        let absent = json!({"torch": "2.11.0", "cudnn": 91900, "fa4": null, "fa4_error": "flash_attn.cute does not import (ModuleNotFoundError: No module named 'flash_attn')"});
        assert_eq!(fa4_line(&absent), "fa4:  FA4 not measured: flash_attn.cute does not import (ModuleNotFoundError: No module named 'flash_attn')");
        assert_eq!(fa4_line(&json!({"torch": "2.9.0"})), "fa4:  FA4 not measured");
        assert!(fa4_line(&json!({"fa4": "4.0.0b36"})).starts_with("fa4:  FlashAttention-4 4.0.0b36"));
    }

    #[test]
    fn the_best_table_puts_fa4_beside_sdpa_when_measured() {
        let best = [BestRow { shape: decode().key(), seq: 9, median_us: 40.0, baseline_us: Some(400.0), source_path: "kernels/x.cu".into(), git_commit: None }];
        let sdpa = |backends: serde_json::Value| SdpaRow {
            shape: decode().key(),
            default_graph_us: Some(50.0),
            default_eager_us: Some(60.0),
            picked: Some("cudnn".into()),
            backends,
            versions: json!({}),
            cached: false,
        };
        let with = best_table(&best, &[sdpa(json!({"default": {"graph_us": 50.0}, "fa4": {"graph_us": 48.0}}))], "runs/r", None);
        assert!(with.lines().next().unwrap().contains("fa4 us"), "{with}");
        assert_eq!(line(&with, "b8hq32hkv8")[2..11], ["40.00", "400.00", "10.00x", "50.00", "cudnn", "1.25x", "48.00", "1.20x", "runs/r/workspace/kernels/x.cu"]);
        let without = best_table(&best, &[sdpa(json!({"default": {"graph_us": 50.0}}))], "runs/r", None);
        assert!(!without.contains("fa4"), "{without}");
        assert_eq!(line(&without, "b8hq32hkv8")[2..9], ["40.00", "400.00", "10.00x", "50.00", "cudnn", "1.25x", "runs/r/workspace/kernels/x.cu"]);
    }
}
