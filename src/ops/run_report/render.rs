//! The report's pages: one self-contained `report.html` (figures inline as SVG, CSS inline,
//! no script, no network) and `report.md` (figures as the `.svg` files beside it), both
//! from the same [`View`]: numbers are formatted once, so both pages show the same cells.

use minijinja::{context, Environment, Value};
use serde::Serialize;

use crate::ops::run_report::data::{backend_label, RunData, BASELINES};
use crate::ops::run_report::figures::{fmt_x, Figure};

const HTML: &str = include_str!("report.html.j2");
const MD: &str = include_str!("report.md.j2");

/// A table as the pages print it: a header and rows of cells, all text.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub id: &'static str,
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct FigureView {
    file: &'static str,
    title: String,
    /// The data behind the figure, as a table under it.
    data: Table,
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "-".into())
}

fn us(x: f64) -> String {
    format!("{x:.2}")
}

/// The best kernel per shape with its resources and launch figures.
pub fn best_table(d: &RunData) -> Table {
    let head = [
        "shape", "iter", "stage", "template", "knobs", "best µs", "TFLOPS", "KV TB/s", "vs baseline kernel", "vs SDPA default", "regs", "spill B",
        "smem KiB", "CTAs", "waves", "arch", "best reached at",
    ];
    let rows = d
        .best
        .iter()
        .map(|b| {
            vec![
                b.shape.clone(),
                b.seq.to_string(),
                b.stage.clone(),
                b.template.clone(),
                b.knobs.clone(),
                us(b.us),
                opt(b.tflops, |t| format!("{t:.1}")),
                opt(b.kv_tbps, |t| format!("{t:.2}")),
                opt(b.baseline_us, |x| fmt_x(x / b.us)),
                opt(b.sdpa_default_us, |x| fmt_x(x / b.us)),
                b.registers.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
                b.spill_bytes.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
                opt(b.smem_bytes.map(|s| s as f64), |s| format!("{:.1}", s / 1024.0)),
                b.ctas.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
                opt(b.waves, |w| if w >= 0.1 { format!("{w:.2}") } else { format!("{w:.3}") }),
                b.arch.clone().unwrap_or_else(|| "-".into()),
                reached_at(d, &b.shape, b.seq),
            ]
        })
        .collect();
    Table { id: "best", head: head.iter().map(|s| s.to_string()).collect(), rows }
}

/// Budget time when `shape`'s final best (iteration `seq`) was first reached; "-" when
/// the iterations hold no budget figure for it or disagree with the best table.
fn reached_at(d: &RunData, shape: &str, seq: i64) -> String {
    let at = d.time_to_best.shape(shape).filter(|x| x.seq == seq).and_then(|x| x.first_reached_best_s);
    opt(at, |t| format!("{t:.1} s"))
}

/// The run's time-to-best figures in one table: budget on candidates that lost by more
/// than 20% and on those that failed before timing, and waiting for the compiler, with counts and
/// shares of the budget used.
pub fn time_to_best_table(d: &RunData) -> Table {
    let t = &d.time_to_best;
    let used = d.run.used_s;
    let share = |x: f64| if used > 0.0 { format!("{:.1}%", 100.0 * x / used) } else { "-".into() };
    let rows = vec![
        vec![
            // Only a finished run's bests are final; a live or stopped one's are the bests so far.
            format!("every shape's {} best reached", if d.state.recorded == crate::spec::states::RunState::Finished { "final" } else { "current" }),
            opt(t.last_reached_s(), |x| format!("{x:.1} s")),
            "-".into(),
            opt(t.last_reached_s(), share),
        ],
        vec!["candidates losing by >20%".into(), format!("{:.1} s", t.budget_s_on_losers_20pct), t.losers_20pct.to_string(), share(t.budget_s_on_losers_20pct)],
        vec!["candidates that failed before timing".into(), format!("{:.1} s", t.budget_s_on_failed), t.failed.to_string(), share(t.budget_s_on_failed)],
        vec!["waiting for the compiler".into(), format!("{:.1} s", t.budget_s_waiting_for_compiler), "-".into(), share(t.budget_s_waiting_for_compiler)],
        vec!["all candidates".into(), format!("{:.1} s", t.budget_s_on_candidates), "-".into(), share(t.budget_s_on_candidates)],
    ];
    Table {
        id: "time-to-best",
        head: ["", "budget", "candidates", "of budget used"].iter().map(|s| s.to_string()).collect(),
        rows,
    }
}

fn speedup_table(d: &RunData) -> Table {
    let rows = d
        .curves
        .iter()
        .map(|c| {
            let first = c.points.first();
            let reached = c.points.iter().find(|p| p.speedup >= 1.0);
            vec![
                c.shape.clone(),
                us(c.reference_us),
                opt(first.map(|p| p.speedup), fmt_x),
                fmt_x(c.last),
                c.points.len().to_string(),
                match reached {
                    Some(p) => format!("{:.0} s (#{})", p.t_s, p.seq),
                    None => "not reached".into(),
                },
            ]
        })
        .collect();
    let r = d.reference.label();
    Table {
        id: "speedup-data",
        head: vec!["shape".into(), format!("{r} µs"), "first".into(), "final".into(), "improvements".into(), "1.0x reached at".into()],
        rows,
    }
}

/// Figure 2's data: per shape the best kernel (TFLOPS, or K/V bandwidth for decode shapes)
/// and every baseline measured (FA4's column only where it was).
fn throughput_table(d: &RunData) -> Table {
    let mut head = vec!["shape".to_string(), "GFLOP".into(), "best µs".into(), "best TFLOPS".into(), "best KV TB/s".into()];
    let shown: Vec<&str> = BASELINES
        .into_iter()
        .filter(|b| *b != crate::storage::sdpa::FA4 || d.throughput.iter().any(|t| t.sdpa.iter().any(|(n, _, _)| n == b)))
        .collect();
    for b in &shown {
        head.push(format!("{} µs", backend_label(b)));
    }
    head.push("SDPA default ran".into());
    let rows = d
        .throughput
        .iter()
        .map(|t| {
            let mut row = vec![
                t.shape.clone(),
                format!("{:.3}", t.flops / 1e9),
                opt(t.best_us, us),
                opt(t.best_us.filter(|_| !t.decode), |x| format!("{:.1}", t.tflops(x))),
                opt(t.best_us.filter(|_| t.decode), |x| format!("{:.2}", t.kv_tbps(x))),
            ];
            for b in &shown {
                row.push(match t.sdpa.iter().find(|(n, _, _)| n == b) {
                    Some((_, Some(x), _)) => us(*x),
                    Some((_, None, Some(e))) => format!("n/a: {}", e.chars().take(60).collect::<String>()),
                    _ => "-".into(),
                });
            }
            row.push(t.picked.clone().unwrap_or_else(|| "-".into()));
            row
        })
        .collect();
    Table { id: "throughput-data", head, rows }
}

fn gains_table(d: &RunData) -> Table {
    let stages: Vec<&String> = d.stages.iter().filter(|s| d.gains.iter().any(|g| g.by_stage.iter().any(|(x, _)| x == *s))).collect();
    let mut head = vec!["shape".to_string(), "first kernel from".into()];
    head.extend(stages.iter().map(|s| s.to_string()));
    head.push("total".into());
    let rows = d
        .gains
        .iter()
        .map(|g| {
            let mut row = vec![g.shape.clone(), g.start_stage.clone().unwrap_or_else(|| "-".into())];
            for s in &stages {
                row.push(g.by_stage.iter().find(|(x, _)| x == *s).map(|(_, v)| fmt_x(*v)).unwrap_or_else(|| "-".into()));
            }
            row.push(fmt_x(g.total));
            row
        })
        .collect();
    Table { id: "stages-data", head, rows }
}

fn verdicts_table(d: &RunData) -> Table {
    let totals = crate::ops::run_report::data::verdict_totals(&d.verdicts);
    let mut head = vec!["stage".to_string()];
    head.extend(totals.iter().map(|(v, _)| v.to_string()));
    head.push("total".into());
    let mut rows: Vec<Vec<String>> = d
        .verdicts
        .iter()
        .map(|s| {
            let mut row = vec![s.stage.clone()];
            for (v, _) in &totals {
                row.push(s.counts.iter().find(|(x, _)| x == v).map(|(_, n)| n.to_string()).unwrap_or_else(|| "0".into()));
            }
            row.push(s.total.to_string());
            row
        })
        .collect();
    let mut all = vec!["all stages".to_string()];
    all.extend(totals.iter().map(|(_, n)| n.to_string()));
    all.push(totals.iter().map(|(_, n)| n).sum::<usize>().to_string());
    rows.push(all);
    Table { id: "verdicts-data", head, rows }
}

fn figure_data(d: &RunData, file: &str) -> Table {
    match file {
        "speedup.svg" => speedup_table(d),
        "throughput.svg" => throughput_table(d),
        "stages.svg" => gains_table(d),
        _ => verdicts_table(d),
    }
}

/// Roughly how tall the page renders at 1400 px wide, for a screenshot of all of it.
fn page_height(d: &RunData, figures: &[Figure]) -> u32 {
    let svg_h: u32 = figures
        .iter()
        .filter_map(|f| f.svg.split("height=\"").nth(1).and_then(|s| s.split('"').next()).and_then(|h| h.parse::<u32>().ok()))
        .sum();
    let rows = d.best.len() + d.env.len() + d.notes.len() * 2;
    svg_h + 100 * figures.len() as u32 + 30 * rows as u32 + 360
}

fn env() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    // Names end in .html / .md: HTML-escaped and left alone respectively.
    env.add_template("report.html", HTML)?;
    env.add_template("report.md", MD)?;
    env.add_filter("md_cell", |s: String| s.replace('|', "\\|").replace('\n', " "));
    Ok(env)
}

/// `report.html` and `report.md` for `d` with `figures` (inline in the HTML, linked from
/// the Markdown by file name).
pub fn pages(d: &RunData, figures: &[Figure]) -> Result<(String, String), minijinja::Error> {
    let views: Vec<FigureView> = figures.iter().map(|f| FigureView { file: f.file, title: f.title.clone(), data: figure_data(d, f.file) }).collect();
    let svgs: Vec<Value> = figures.iter().map(|f| Value::from_safe_string(f.svg.clone())).collect();
    let ctx = context! {
        run => &d.run,
        state => &d.state,
        gpu => d.device.as_ref().map(|x| x.name.clone()).or_else(|| d.run.gpu_name.clone()).unwrap_or_else(|| "-".into()),
        iterations => d.iterations,
        notes => &d.notes,
        figures => views,
        svgs => svgs,
        best => best_table(d),
        ttb => time_to_best_table(d),
        ttb_definition => d.time_to_best.definition,
        env => &d.env,
        page_height => page_height(d, figures),
        generated => crate::storage::ledger::now(),
    };
    let env = env()?;
    let html = env.get_template("report.html")?.render(&ctx)?;
    let md = env.get_template("report.md")?.render(&ctx)?;
    Ok((html, md))
}
