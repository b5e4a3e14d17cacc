//! Shutdown requests: the first signal asks the run to stop after the candidate in
//! flight; a second (or `stop --now`) abandons the candidate at once.

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    Run,
    /// Finish the candidate in flight, then stop.
    Graceful,
    /// Kill the worker, record the candidate as interrupted, stop.
    Now,
}

/// The receiving side, cloned into whoever must react (the run loop, the supervisor).
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<Signal>,
}

pub fn channel() -> (watch::Sender<Signal>, Shutdown) {
    let (tx, rx) = watch::channel(Signal::Run);
    (tx, Shutdown { rx })
}

impl Shutdown {
    /// A receiver that never fires (tests, one-shot commands).
    pub fn never() -> Shutdown {
        let (tx, rx) = watch::channel(Signal::Run);
        // Keep the sender alive forever so `now()` pends instead of erroring.
        std::mem::forget(tx);
        Shutdown { rx }
    }

    pub fn requested(&self) -> bool {
        *self.rx.borrow() != Signal::Run
    }

    pub fn now_requested(&self) -> bool {
        *self.rx.borrow() == Signal::Now
    }

    /// Resolves when an immediate stop is requested (pends forever otherwise).
    pub async fn now(&mut self) {
        if self.rx.wait_for(|s| *s == Signal::Now).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Escalate on each SIGINT/SIGTERM: first Graceful, then Now.
pub fn spawn_signal_handler(tx: watch::Sender<Signal>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
            let next = if *tx.borrow() == Signal::Run { Signal::Graceful } else { Signal::Now };
            match next {
                Signal::Graceful => tracing::warn!(kind = "stop_requested", "stop requested: finishing the candidate in flight (signal again to abandon it)"),
                _ => tracing::warn!(kind = "stop_requested", "stop now: abandoning the candidate in flight"),
            }
            let _ = tx.send(next);
        }
    });
}
