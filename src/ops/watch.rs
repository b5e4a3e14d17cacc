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

use crate::spec::states::RunState;
use crate::storage::ledger::{Ledger, RunRow};
use crate::pipeline::record::fmt_secs;

/// How `watch` polls; the defaults suit a person, tests shorten them.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// How often to look for new bytes (and at the ledger when there are none).
    pub poll: Duration,
    /// After the ledger says the run ended, how long the log must stay quiet before
    /// watch returns without having seen a `run_end` line.
    pub settle: Duration,
    /// While the ledger says the run is live but no live process is named by its
    /// `daemon.pid`, how long to wait before concluding the daemon died.
    pub gone_grace: Duration,
    /// Draw the progress bar (human mode only; indicatif also hides it when stderr
    /// is not a terminal).
    pub progress: bool,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            poll: Duration::from_millis(250),
            settle: Duration::from_secs(1),
            gone_grace: Duration::from_secs(3),
            progress: std::io::stderr().is_terminal(),
        }
    }
}

/// How a watch ended.
#[derive(Debug, Clone)]
pub struct WatchEnd {
    /// The run's ledger row once its log was read to the end.
    pub run: RunRow,
    /// The log's `run_end` line was seen.
    pub saw_run_end: bool,
    /// The ledger still says the run is live, but its daemon is gone (killed, or the
    /// machine rebooted): `optimizerd resume` continues it.
    pub daemon_gone: bool,
}

/// Follow run `run` (default: the most recent) from the ledger `ledger`, whose run
/// folders are under `runs_dir`, printing to `out`, until the run has ended (or its
/// daemon is gone) and its log is read to the end.
pub async fn watch<W: Write>(
    ledger: &Ledger,
    runs_dir: &Path,
    run: Option<&str>,
    json: bool,
    mut out: W,
    opts: &WatchOptions,
) -> anyhow::Result<WatchEnd> {
    let mut row = find_run(ledger, run, runs_dir).await?;
    let log_path = log_path(runs_dir, &row);
    let mut view = View::new(&row, json, opts.progress);

    let mut file: Option<tokio::fs::File> = None;
    let mut offset: u64 = 0;
    let mut pending: Vec<u8> = Vec::new();
    let mut saw_end = false;
    let mut last_growth = Instant::now();
    // When this watch first saw the ledger say the run is over, and whether it ended
    // long enough ago that its log cannot still grow.
    let mut ended: Option<(Instant, bool)> = (!row.state.recorded.is_live()).then(|| (Instant::now(), ended_long_ago(&row, opts.settle)));
    // Since when no live daemon was found for a run the ledger calls live.
    let mut gone_since: Option<Instant> = None;
    let mut daemon_gone = false;

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
                    // A resumed run's log goes on past an earlier session's run_end.
                    Ok(Some(is_end)) => saw_end = is_end,
                    Ok(None) => {}
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

        // Nothing new: the log is read to its end for now.
        row = ledger.run_or_group(Some(&row.id), runs_dir).await.with_context(|| format!("cannot read run {} from the ledger", row.id))?;
        view.ledger(&row);
        if row.state.recorded.is_live() {
            // Resumed while watched (or never ended).
            ended = None;
        } else {
            if saw_end && file.is_some() {
                break;
            }
            if ended.is_none() {
                ended = Some((Instant::now(), ended_long_ago(&row, opts.settle)));
            }
        }
        if let Some((seen, long_ago)) = ended {
            if file.is_some() && (long_ago || (seen.elapsed() >= opts.settle && last_growth.elapsed() >= opts.settle)) {
                break;
            }
        } else if daemon_alive(&log_path) {
            gone_since = None;
        } else {
            let since = *gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= opts.gone_grace && last_growth.elapsed() >= opts.gone_grace {
                daemon_gone = true;
                break;
            }
        }
        view.redraw();
        tokio::time::sleep(opts.poll).await;
    }

    // A last line without its newline (a writer that died mid-line).
    if !pending.is_empty() {
        let line = std::mem::take(&mut pending);
        match view.line(&line, &mut out) {
            Ok(Some(is_end)) => saw_end = is_end,
            Ok(None) => {}
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {}
            Err(e) => return Err(e).context("cannot write the output"),
        }
    }
    let row = ledger.run_or_group(Some(&row.id), runs_dir).await.with_context(|| format!("cannot read run {} from the ledger", row.id))?;
    if daemon_gone {
        let _ = view.daemon_gone(&row, &mut out);
    } else if !saw_end {
        // The log ended without a run_end line (an older log, or a daemon that died).
        let _ = view.end_from_ledger(&row, &mut out);
    }
    let _ = view.finish(&mut out);
    let _ = out.flush();
    Ok(WatchEnd { run: row, saw_run_end: saw_end, daemon_gone })
}

/// Whether the daemon writing the run is alive: `daemon.pid` next to its log names a
/// running process. (The GPU lock is not probed: taking it, even shared and briefly,
/// could make a daemon starting at that moment believe the GPU is taken.)
fn daemon_alive(log_path: &Path) -> bool {
    let Some(dir) = log_path.parent() else { return false };
    let Ok(text) = std::fs::read_to_string(dir.join("daemon.pid")) else { return false };
    let Ok(pid) = text.trim().parse::<i32>() else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

async fn find_run(ledger: &Ledger, run: Option<&str>, runs_dir: &Path) -> anyhow::Result<RunRow> {
    // The ledger's own errors name the run and what to do (`optimizerd runs` lists them).
    // A `--gpus` group is followed through its coordinator's log.
    Ok(ledger.run_or_group(run, runs_dir).await?)
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
    let line = format!("#{:<4} {:<16} {:<13} {:<46} {:>9}  {:<12} {}", seq, stage, verdict, params, time, best, reason);
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
    /// Shown after the status while the run's log has not appeared yet.
    note: Option<String>,
}

const BAR_TEMPLATE: &str = "{bar:30.cyan/blue} {wide_msg}";

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
            clock_running: row.state.recorded == RunState::Running,
            note: None,
        };
        v.redraw();
        v
    }

    /// Handle one raw log line. For a tagged line (one with a kind), whether it is the
    /// run's `run_end`; None for other lines.
    fn line(&mut self, raw: &[u8], out: &mut impl Write) -> std::io::Result<Option<bool>> {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let parsed: Option<Value> = serde_json::from_slice(raw).ok();
        let level = parsed.as_ref().and_then(|v| v.get("level")).and_then(Value::as_str).unwrap_or("").to_string();
        let fields = parsed.as_ref().and_then(|v| v.get("fields")).and_then(Value::as_object).cloned().unwrap_or_default();
        let kind = kind_of(&level, &fields).map(str::to_string);
        let is_end = kind.as_ref().map(|k| k == "run_end");

        if self.json {
            out.write_all(raw)?;
            out.write_all(b"\n")?;
            return Ok(is_end);
        }

        self.note = None;
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
            // The engine logs these with an explicit `message` field besides the formatted
            // one; a JSON parser keeps the last, so either may arrive here.
            Some("waiting_for_gpu") => {
                self.clock_running = false;
                let attempt = fields.get("attempt").map(|a| format!(" (attempt {a})")).unwrap_or_default();
                Some(if message.starts_with("waiting") {
                    format!("-- {message}")
                } else {
                    format!("-- waiting for the GPU{attempt}: {message}")
                })
            }
            Some("resumed") | Some("gpu_back") => {
                self.clock_running = true;
                Some(if message.starts_with("run ") || kind.as_deref() == Some("gpu_back") {
                    format!("-- {message}")
                } else if message.starts_with("resumed") {
                    format!("-- run {} {message}", self.run_id)
                } else {
                    format!("-- resumed: {message}")
                })
            }
            Some("run_end") => {
                self.clock_running = false;
                let state = str_field(&fields, "state").unwrap_or("ended");
                let run = str_field(&fields, "run").unwrap_or(&self.run_id);
                Some(if message.starts_with("run ") {
                    message.clone()
                } else if message.is_empty() {
                    format!("run {run} {state}")
                } else {
                    format!("run {run} {state}: {message}")
                })
            }
            // Other tagged events are meant for people; untagged ones only when they warn.
            k => match level.as_str() {
                "WARN" => Some(format!("warning: {message}")),
                "ERROR" => Some(format!("error: {message}")),
                "INFO" if k.is_some() && !message.is_empty() => Some(format!("-- {message}")),
                _ if parsed.is_none() => Some(String::from_utf8_lossy(raw).into_owned()),
                _ => None,
            },
        };
        self.redraw();
        if let Some(text) = text {
            self.print(out, &text)?;
        }
        Ok(is_end)
    }

    fn print(&self, out: &mut impl Write, text: &str) -> std::io::Result<()> {
        self.bar.suspend(|| -> std::io::Result<()> {
            writeln!(out, "{text}")?;
            out.flush()
        })
    }

    fn waiting_for_log(&mut self, path: &Path) {
        self.note = Some(format!("(waiting for {} to appear)", path.display()));
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
        self.clock_running = row.state.recorded == RunState::Running;
    }

    fn set_used(&mut self, used_s: f64) {
        self.used_s = used_s;
        self.used_at = Instant::now();
    }

    /// Redraw the status line; between reports the bar advances with the wall clock
    /// while the run computes.
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
        let rate = crate::ops::report::per_minute(self.iterations as i64, used).map(|r| format!(" ({r:.1}/min)")).unwrap_or_default();
        self.bar.set_message(format!(
            "{} / {}  stage {stage}  {best}  {} iterations{rate}{}",
            fmt_secs(used),
            fmt_secs(self.budget_s.max(0.0)),
            self.iterations,
            self.note.as_deref().map(|n| format!("  {n}")).unwrap_or_default()
        ));
    }

    fn end_from_ledger(&mut self, row: &RunRow, out: &mut impl Write) -> std::io::Result<()> {
        if self.json || row.state.recorded.is_live() {
            return Ok(());
        }
        let text = match row.message.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!("run {} {}: {m}", row.id, row.state),
            None => format!("run {} {}", row.id, row.state),
        };
        self.print(out, &text)
    }

    fn daemon_gone(&mut self, row: &RunRow, out: &mut impl Write) -> std::io::Result<()> {
        if self.json {
            return Ok(());
        }
        self.print(
            out,
            &format!(
                "run {} is `{}` in the ledger, but its daemon is gone (no live process in daemon.pid); \
                 `optimizerd resume {}` continues it",
                row.id, row.state, row.id
            ),
        )
    }

    /// Take the bar down and print where the run got to in its place.
    fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        self.bar.finish_and_clear();
        if self.json {
            return Ok(());
        }
        let used = self.used_s.clamp(0.0, self.budget_s.max(0.0));
        let best = self.best.map(|b| format!("best {b:.2}x over the baseline kernel")).unwrap_or_else(|| "no speedup yet".into());
        let rate = crate::ops::report::per_minute(self.iterations as i64, used).map(|r| format!(" ({r:.1} per minute)")).unwrap_or_default();
        writeln!(
            out,
            "{} iteration{}{rate}, {best}, {} of {} budget used",
            self.iterations,
            if self.iterations == 1 { "" } else { "s" },
            fmt_secs(used),
            fmt_secs(self.budget_s.max(0.0))
        )
    }
}

fn secs_to_ms(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0) as u64
    } else {
        0
    }
}
