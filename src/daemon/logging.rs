//! Logging: JSON lines to the run's `run.log`, and one readable line per event on stderr.

use std::fmt;
use std::path::Path;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer};

/// Prints only the event's message (plus WARN/ERROR level): the stderr view for humans.
struct MessageOnly;

impl<S, N> FormatEvent<S, N> for MessageOnly
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        struct Msg<'a, 'b>(&'a mut Writer<'b>);
        impl tracing::field::Visit for Msg<'_, '_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
                if field.name() == "message" {
                    let _ = write!(self.0, "{value:?}");
                }
            }
        }
        let level = *event.metadata().level();
        if level <= tracing::Level::WARN {
            write!(w, "{}: ", level.as_str().to_lowercase())?;
        }
        event.record(&mut Msg(&mut w));
        writeln!(w)
    }
}

/// Human lines on stderr; JSON lines in `json_log` when given. `RUST_LOG` overrides the level.
pub fn init(json_log: Option<&Path>) -> anyhow::Result<()> {
    let stderr = tracing_subscriber::fmt::layer()
        .event_format(MessageOnly)
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")));
    let json = match json_log {
        Some(path) => {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
            Some(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(false)
                    .with_writer(std::sync::Mutex::new(file))
                    .with_filter(EnvFilter::new("debug,sqlx=warn")),
            )
        }
        None => None,
    };
    // Records of the `log` crate (sqlx's, reqwest's) reach tracing through a LogTracer
    // that passes warnings and errors only. Why not the default bridge: with per-layer
    // filters, a `log` "is this level enabled?" query that tracing answers "no" makes the
    // next tracing event on that thread vanish (tokio-rs/tracing#2519); sqlx's PostgreSQL
    // driver asks it for every server notice, and the line after a fleet database call was
    // lost. Below warnings, `log`'s own max level now answers without asking tracing.
    tracing_log::LogTracer::init_with_filter(log::LevelFilter::Warn)?;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(stderr).with(json))?;
    Ok(())
}

/// A worker process's logging: timestamped lines on its stderr, which the daemon keeps as
/// the run's `worker.log` (stdout carries the protocol). `RUST_LOG` sets the level
/// (`optimizerd::worker=debug`: where each check's time goes); info by default.
pub fn init_worker() -> anyhow::Result<()> {
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_filter(EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new("info")));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(stderr))?;
    Ok(())
}
