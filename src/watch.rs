//! `optimizerd watch [RUN] [--json]`: follow a run's `run.log` as it is written.
//!
//! It replays the log from its first line, then tails it (polling for new bytes,
//! holding back a partial last line until its newline arrives) until the run has
//! ended and the file is fully read: a `run_end` line was seen, or the ledger says
//! the run is no longer live and no new bytes came for a short settle time. A run
//! that ended earlier is replayed and the command returns. `--json` passes the raw
//! JSON lines through unchanged; the human view prints one line per iteration, stage
//! headers, GPU waits and the end, with a progress bar below them (budget used,
//! stage, best speedup) that indicatif draws on stderr when it is a terminal.

use std::io::{ErrorKind, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::ledger::{Ledger, LedgerError, RunRow};
use crate::record::fmt_dur;

/// How `watch` polls; the defaults suit a person, tests shorten them.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// How often to look for new bytes (and at the ledger when there are none).
    pub poll: Duration,
    /// After the ledger says the run ended, how long the log must stay quiet before
    /// watch returns without having seen a `run_end` line.
    pub settle: Duration,
    /// Draw the progress bar (human mode only; indicatif also hides it when stderr
    /// is not a terminal).
    pub progress: bool,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions { poll: Duration::from_millis(250), settle: Duration::from_secs(1), progress: std::io::stderr().is_terminal() }
    }
}

/// A run is live (its log may still grow) in these ledger states.
pub fn is_live(state: &str) -> bool {
    matches!(state, "running" | "waiting_for_gpu")
}

/// Follow run `run` (default: the most recent) from the ledger `ledger`, whose run
/// folders are under `runs_dir`, printing to `out`. Returns the run's ledger row as
/// it stands when the log has been read to its end.
pub async fn watch<W: Write>(
    ledger: &Ledger,
    runs_dir: &Path,
    run: Option<&str>,
    json: bool,
    mut out: W,
    opts: &WatchOptions,
) -> anyhow::Result<RunRow> {
    let mut row = find_run(ledger, runs_dir, run).await?;
    let log_path = log_path(runs_dir, &row);
    let mut view = View::new(&row, json, opts.progress);

    let mut file: Option<tokio::fs::File> = None;
    let mut offset: u64 = 0;
    let mut pending: Vec<u8> = Vec::new();
    let mut saw_end = false;
    let mut last_growth = Instant::now();
    // When this watch first saw the ledger say the run is over, and whether it ended
    // long enough ago that its log cannot still grow.
    let mut ended: Option<(Instant, bool)> = (!is_live(&row.state)).then(|| (Instant::now(), ended_long_ago(&row, opts.settle)));

    'follow: loop {
        if file.is_none() {
            match tokio::fs::File::open(&log_path).await {
                Ok(f) => file = Some(f),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    if ended.is_some() {
                        anyhow::bail!(
                            "run {} ({}) has no log at {}; `optimizerd status {}` shows what the ledger recorded",
                            row.id,
                            row.state,
                            log_path.display(),
                            row.id
                        );
                    }
                    view.waiting_for_log(&log_path);
                }
                Err(e) => return Err(e).with_context(|| format!("cannot open {}", log_path.display())),
            }
        }

        let mut got = 0;
        if let Some(f) = file.as_mut() {
            let len = f.metadata().await.with_context(|| format!("cannot read {}", log_path.display()))?.len();
            if len < offset {
                // Truncated or replaced under us: start again from its beginning.
                f.seek(std::io::SeekFrom::Start(0)).await.with_context(|| format!("cannot read {}", log_path.display()))?;
                offset = 0;
                pending.clear();
            }
            let mut buf = Vec::new();
            got = f.read_to_end(&mut buf).await.with_context(|| format!("cannot read {}", log_path.display()))?;
            offset += got as u64;
            pending.extend_from_slice(&buf);
        }

        if got > 0 {
            last_growth = Instant::now();
            let mut start = 0;
            while let Some(nl) = pending[start..].iter().position(|&b| b == b'\n') {
                let line = &pending[start..start + nl];
                start += nl + 1;
                match view.line(line, &mut out) {
                    Ok(is_end) => saw_end |= is_end,
                    Err(e) if e.kind() == ErrorKind::BrokenPipe => break 'follow,
                    Err(e) => return Err(e).context("cannot write the output"),
                }
            }
            pending.drain(..start);
            match out.flush() {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::BrokenPipe => break 'follow,
                Err(e) => return Err(e).context("cannot write the output"),
            }
            continue;
        }

        // Nothing new: read to the end for now.
        if saw_end && file.is_some() {
            break;
        }
        row = ledger.run(Some(&row.id)).await.with_context(|| format!("cannot read run {} from the ledger", row.id))?;
        view.ledger(&row);
        if ended.is_none() && !is_live(&row.state) {
            ended = Some((Instant::now(), ended_long_ago(&row, opts.settle)));
        }
        if let Some((seen, long_ago)) = ended {
            if file.is_some() && (long_ago || (seen.elapsed() >= opts.settle && last_growth.elapsed() >= opts.settle)) {
                break;
            }
        }
        view.tick();
        tokio::time::sleep(opts.poll).await;
    }

    // A last line without its newline (a writer that died mid-line).
    if !pending.is_empty() {
        let line = std::mem::take(&mut pending);
        match view.line(&line, &mut out) {
            Ok(is_end) => saw_end |= is_end,
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {}
            Err(e) => return Err(e).context("cannot write the output"),
        }
    }
    let row = ledger.run(Some(&row.id)).await.with_context(|| format!("cannot read run {} from the ledger", row.id))?;
    if !saw_end {
        // The log ended without a run_end line (an older log, or a daemon that died).
        let _ = view.end_from_ledger(&row, &mut out);
    }
    view.finish();
    let _ = out.flush();
    Ok(row)
}

async fn find_run(ledger: &Ledger, runs_dir: &Path, run: Option<&str>) -> anyhow::Result<RunRow> {
    match ledger.run(run).await {
        Ok(r) => Ok(r),
        Err(LedgerError::NoSuchRun(id)) => anyhow::bail!(
            "no run `{id}` in the ledger {}; `optimizerd runs` lists the runs",
            runs_dir.join("optimizer.db").display()
        ),
        Err(e @ LedgerError::NoRuns) => Err(e.into()),
        Err(e) => Err(e).context("cannot read the ledger"),
    }
}

/// `<runs>/<id>/run.log`, or the run folder the ledger recorded when only that one has it.
fn log_path(runs_dir: &Path, row: &RunRow) -> PathBuf {
    let primary = runs_dir.join(&row.id).join("run.log");
    let recorded = Path::new(&row.run_dir).join("run.log");
    if !primary.exists() && !row.run_dir.is_empty() && recorded.exists() {
        recorded
    } else {
        primary
    }
}

/// Whether the run's recorded end is older than `settle`, so its log is complete.
fn ended_long_ago(row: &RunRow, settle: Duration) -> bool {
    let Some(at) = row.finished_at.as_deref().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return false;
    };
    let age = chrono::Utc::now().signed_duration_since(at.with_timezone(&chrono::Utc));
    age.to_std().is_ok_and(|a| a > settle)
}

/// What a log line is, from its `fields.kind`, or inferred for logs written before
/// the engine tagged its lines.
fn kind_of<'a>(level: &str, fields: &'a Map<String, Value>) -> Option<&'a str> {
    if let Some(k) = fields.get("kind").and_then(Value::as_str) {
        return Some(k);
    }
    let msg = fields.get("message").and_then(Value::as_str).unwrap_or("");
    if fields.contains_key("seq") && fields.contains_key("verdict") {
        Some("iteration")
    } else if level == "INFO" && fields.contains_key("state") && fields.contains_key("run") && msg.starts_with("run ") {
        Some("run_end")
    } else if level == "INFO" && fields.contains_key("stage") && fields.len() == 2 && msg.starts_with("stage ") {
        Some("stage")
    } else if level == "INFO" && fields.contains_key("gpu") && fields.contains_key("sms") {
        Some("device")
    } else {
        None
    }
}

fn str_field<'a>(fields: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    fields.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn f64_field(fields: &Map<String, Value>, key: &str) -> Option<f64> {
    match fields.get(key)? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// One human line for an iteration:
/// `#12   kv-split        accepted       {"BLOCK_M":16,...}   35.3 us  best 11.12x  won b1h1s32d64 1.09x, ...`
pub fn iteration_line(fields: &Map<String, Value>) -> String {
    let seq = fields.get("seq").map(|v| v.to_string()).unwrap_or_else(|| "?".into());
    let stage = str_field(fields, "stage").unwrap_or("-");
    let verdict = str_field(fields, "verdict").unwrap_or("-");
    let params = str_field(fields, "params").unwrap_or("{}");
    let time = f64_field(fields, "score_us").map(|t| format!("{t:.1} us")).unwrap_or_else(|| "-".into());
    let best = f64_field(fields, "best_speedup").map(|s| format!("best {s:.2}x")).unwrap_or_else(|| "best -".into());
    let reason = str_field(fields, "reason").unwrap_or("");
    let line = format!("#{:<4} {:<16} {:<13} {:<40} {:>9}  {:<12} {}", seq, stage, verdict, params, time, best, reason);
    line.trim_end().to_string()
}

/// The printed lines and the progress bar.
struct View {
    json: bool,
    run_id: String,
    bar: ProgressBar,
    stage: Option<String>,
    best: Option<f64>,
    iterations: u64,
    budget_s: f64,
    used_s: f64,
    /// When `used_s` was last reported, and whether the run's clock is running, to
    /// advance the bar between iterations.
    used_at: Instant,
    clock_running: bool,
    told_waiting: bool,
}

const BAR_TEMPLATE: &str = "{bar:32.cyan/blue} {msg}";

impl View {
    fn new(row: &RunRow, json: bool, progress: bool) -> View {
        let target = if progress && !json { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(secs_to_ms(row.budget_s).max(1)), target);
        let style = ProgressStyle::with_template(BAR_TEMPLATE).unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style.progress_chars("=> "));
        let mut v = View {
            json,
            run_id: row.id.clone(),
            bar,
            stage: row.stage.clone(),
            best: None,
            iterations: 0,
            budget_s: row.budget_s,
            used_s: row.used_s,
            used_at: Instant::now(),
            clock_running: row.state == "running",
            told_waiting: false,
        };
        v.redraw();
        v
    }

    /// Handle one raw log line; true when it is the run's `run_end`.
    fn line(&mut self, raw: &[u8], out: &mut impl Write) -> std::io::Result<bool> {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(false);
        }
        let parsed: Option<Value> = serde_json::from_slice(raw).ok();
        let level = parsed.as_ref().and_then(|v| v.get("level")).and_then(Value::as_str).unwrap_or("").to_string();
        let fields = parsed.as_ref().and_then(|v| v.get("fields")).and_then(Value::as_object).cloned().unwrap_or_default();
        let kind = kind_of(&level, &fields).map(str::to_string);
        let is_end = kind.as_deref() == Some("run_end");

        if self.json {
            out.write_all(raw)?;
            out.write_all(b"\n")?;
            return Ok(is_end);
        }

        let message = str_field(&fields, "message").unwrap_or("").to_string();
        let text: Option<String> = match kind.as_deref() {
            Some("iteration") => {
                self.iterations += 1;
                if let Some(s) = str_field(&fields, "stage") {
                    self.stage = Some(s.to_string());
                }
                if let Some(b) = f64_field(&fields, "best_speedup") {
                    self.best = Some(b);
                }
                if let Some(b) = f64_field(&fields, "budget_s") {
                    self.budget_s = b;
                }
                if let Some(u) = f64_field(&fields, "used_s") {
                    self.set_used(u);
                }
                self.clock_running = true;
                Some(iteration_line(&fields))
            }
            Some("stage") => {
                let stage = str_field(&fields, "stage").unwrap_or("?").to_string();
                let header = if message.is_empty() { format!("stage {stage}") } else { message.clone() };
                self.stage = Some(stage);
                Some(format!("\n== {header}"))
            }
            Some("device") => Some(if message.is_empty() { format!("GPU {}", str_field(&fields, "gpu").unwrap_or("?")) } else { message.clone() }),
            Some("waiting_for_gpu") => {
                self.clock_running = false;
                let attempt = fields.get("attempt").map(|a| format!(" (attempt {a})")).unwrap_or_default();
                Some(format!("-- waiting for the GPU{attempt}: {message}"))
            }
            Some("resumed") => {
                self.clock_running = true;
                Some(format!("-- resumed: {message}"))
            }
            Some("run_end") => {
                self.clock_running = false;
                Some(if message.is_empty() {
                    format!("run {} {}", self.run_id, str_field(&fields, "state").unwrap_or("ended"))
                } else {
                    message.clone()
                })
            }
            _ => match level.as_str() {
                "WARN" => Some(format!("warning: {message}")),
                "ERROR" => Some(format!("error: {message}")),
                _ if parsed.is_none() => Some(String::from_utf8_lossy(raw).into_owned()),
                _ => None,
            },
        };
        if let Some(text) = text {
            self.print(out, &text)?;
        }
        self.redraw();
        Ok(is_end)
    }

    fn print(&self, out: &mut impl Write, text: &str) -> std::io::Result<()> {
        self.bar.suspend(|| -> std::io::Result<()> {
            writeln!(out, "{text}")?;
            out.flush()
        })
    }

    fn waiting_for_log(&mut self, path: &Path) {
        if !self.told_waiting && !self.json {
            self.told_waiting = true;
            self.bar.set_message(format!("waiting for {} to appear", path.display()));
        }
    }

    /// Refresh what the ledger knows: budget, time used, stage, whether it runs.
    fn ledger(&mut self, row: &RunRow) {
        self.budget_s = row.budget_s;
        if row.used_s > self.used_s {
            self.set_used(row.used_s);
        }
        if self.stage.is_none() {
            self.stage = row.stage.clone();
        }
        self.clock_running = row.state == "running";
    }

    fn set_used(&mut self, used_s: f64) {
        self.used_s = used_s;
        self.used_at = Instant::now();
    }

    /// Advance the bar with the wall clock between reports while the run computes.
    fn tick(&mut self) {
        self.redraw();
    }

    fn redraw(&mut self) {
        if self.json {
            return;
        }
        let mut used = self.used_s;
        if self.clock_running {
            used += self.used_at.elapsed().as_secs_f64();
        }
        let used = used.min(self.budget_s).max(0.0);
        self.bar.set_length(secs_to_ms(self.budget_s).max(1));
        self.bar.set_position(secs_to_ms(used));
        let stage = self.stage.as_deref().unwrap_or("-");
        let best = self.best.map(|b| format!("best {b:.2}x")).unwrap_or_else(|| "best -".into());
        self.bar.set_message(format!(
            "{} / {}  stage {stage}  {best}  {} iterations",
            fmt_dur(Duration::from_secs_f64(used)),
            fmt_dur(Duration::from_secs_f64(self.budget_s.max(0.0))),
            self.iterations
        ));
    }

    fn end_from_ledger(&mut self, row: &RunRow, out: &mut impl Write) -> std::io::Result<()> {
        if self.json || is_live(&row.state) {
            return Ok(());
        }
        let text = match row.message.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!("run {} {}: {m}", row.id, row.state),
            None => format!("run {} {}", row.id, row.state),
        };
        self.print(out, &text)
    }

    fn finish(&mut self) {
        self.clock_running = false;
        self.redraw();
        // Leave the last status line on the terminal.
        self.bar.abandon();
    }
}

fn secs_to_ms(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0) as u64
    } else {
        0
    }
}
