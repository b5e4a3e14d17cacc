//! Failpoints: named places where a test can make the daemon die abruptly.
//!
//! `OPTIMIZERD_FAILPOINT=<name>@<iteration>` aborts the process (no cleanup, like
//! `kill -9`) when execution reaches `<name>` during iteration `<iteration>`. The
//! crash drills use it to hit exact moments such as the middle of a ledger
//! transaction or a git commit. Unset, it costs one cached lookup.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;

/// The iteration in progress, so that deep code (git, SQLite) can name failpoints.
static ITERATION: AtomicI64 = AtomicI64::new(0);

pub fn set_iteration(seq: i64) {
    ITERATION.store(seq, Ordering::Relaxed);
}

pub const ENV: &str = "OPTIMIZERD_FAILPOINT";

fn armed() -> Option<&'static (String, i64)> {
    static ARMED: OnceLock<Option<(String, i64)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let v = std::env::var(ENV).ok()?;
            let (name, seq) = v.split_once('@')?;
            Some((name.to_string(), seq.parse().ok()?))
        })
        .as_ref()
}

/// Abort here if the failpoint `name` is armed for the iteration in progress.
pub fn hit(name: &str) {
    let seq = ITERATION.load(Ordering::Relaxed);
    if let Some((n, s)) = armed() {
        if n == name && *s == seq {
            eprintln!("failpoint {name}@{seq}: aborting");
            std::process::abort();
        }
    }
}
