//! Waiting for the GPU: while the worker cannot start (driver reset, device lost),
//! the run is `waiting_for_gpu`, retries with backoff, logs each attempt and does not
//! charge the time to the budget.

use std::time::{Duration, Instant};

use crate::spec::config::Config;
use crate::spec::states::RunState;
use crate::storage::ledger::{EventKind, Ledger};
use crate::spec::protocol::DeviceInfo;
use crate::daemon::shutdown::Shutdown;
use crate::daemon::supervisor::Supervisor;

/// Why waiting for the GPU ended without a worker.
#[derive(Debug)]
pub(super) enum WaitEnd {
    Stopped,
    GaveUp(String),
}

impl std::fmt::Display for WaitEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitEnd::Stopped => f.write_str("stopped while waiting for the GPU"),
            WaitEnd::GaveUp(m) => f.write_str(m),
        }
    }
}

/// Start the worker; while it cannot start, the run is `waiting_for_gpu`: retry with
/// backoff, log each attempt, and add the time spent to `paused` (not charged to the
/// budget). Gives up after `worker.gpu_wait_limit`.
pub(super) async fn wait_for_gpu(
    sup: &mut Supervisor,
    ledger: &Ledger,
    run_id: &str,
    cfg: &Config,
    shutdown: &Shutdown,
    paused: &mut Duration,
) -> Result<DeviceInfo, WaitEnd> {
    let mut last = match sup.ensure_started().await {
        Ok(d) => return Ok(d),
        Err(e) => e,
    };
    let began = Instant::now();
    let mut delay = Duration::from_millis(250).min(cfg.worker.gpu_retry_max);
    let _ = ledger.set_state(run_id, RunState::WaitingForGpu, Some(&last.to_string()), None).await;
    let mut attempt = 1u32;
    let result = loop {
        tracing::warn!(
            kind = "waiting_for_gpu", attempt, detail = %last,
            "waiting for the GPU (attempt {attempt} failed, next in {}; the budget is paused): {last}",
            humantime::format_duration(delay)
        );
        if began.elapsed() >= cfg.worker.gpu_wait_limit {
            break Err(WaitEnd::GaveUp(format!(
                "GPU unavailable for {} ({attempt} attempts): {last}",
                humantime::format_duration(Duration::from_secs(began.elapsed().as_secs()))
            )));
        }
        let mut sd = shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {},
            _ = sd.now() => break Err(WaitEnd::Stopped),
        }
        if shutdown.requested() {
            break Err(WaitEnd::Stopped);
        }
        attempt += 1;
        match sup.ensure_started().await {
            Ok(d) => {
                tracing::info!(kind = "gpu_back", attempt, "the GPU answered again at attempt {attempt}; the run continues");
                let _ = ledger.set_state(run_id, RunState::Running, None, None).await;
                break Ok(d);
            }
            Err(e) => last = e,
        }
        delay = (delay * 2).min(cfg.worker.gpu_retry_max);
    };
    *paused += began.elapsed();
    let _ = ledger
        .event(run_id, EventKind::WaitedForGpu, &format!("{attempt} attempts over {:.1}s (not charged to the budget)", began.elapsed().as_secs_f64()))
        .await;
    result
}
