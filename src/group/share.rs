//! How much of the group's budget the next item's run gets.
//!
//! The group's budget is wall-clock time, but a run's budget does not count its setup (the
//! worker, SDPA measured on its GPU), and its closing comparison may run past it (a short
//! run keeps at most a quarter of its budget for the closing and cuts the closing to what is
//! left, but even burst timing can need more: engine/reserve.rs). So the
//! shares leave room for that overhead, a run's wall time beyond its budget, measured on the
//! group's runs that ended (before any has, [`DEFAULT_OVERHEAD`]).

use std::time::Duration;

/// The shortest share worth starting a run for: less than this and the plan's first stage
/// would not finish, so the item stays queued (a resumed group with more budget takes it).
pub const MIN_SHARE: Duration = Duration::from_secs(10);

/// A run's time outside its budget until one of the group's runs has ended: 2 x H200,
/// 2026-11-26 (scripts/gpus_device.sh), 40 s runs took 61-62 s of wall time.
pub const DEFAULT_OVERHEAD: Duration = Duration::from_secs(20);

/// The budget of the next item's run: the time left, less each remaining round's overhead,
/// spread evenly over the items not yet done (this one, the other queued ones, and those
/// running), `gpus` at a time, so every item gets a turn within the budget. A class that
/// converges early hands its unused time to the items taken after it. Never more than the
/// time left less one overhead; None when that is under [`MIN_SHARE`].
pub fn budget_share(left: Duration, gpus: usize, queued: usize, running: usize, overhead: Duration) -> Option<Duration> {
    let last = left.checked_sub(overhead)?;
    if last < MIN_SHARE {
        return None;
    }
    let gpus = gpus.max(1);
    let waiting = (queued + running).max(1);
    let rounds = waiting.div_ceil(gpus) as u32;
    let spread = left.saturating_sub(overhead * rounds).as_secs_f64() * gpus as f64 / waiting as f64;
    Some(Duration::from_secs_f64(spread.clamp(MIN_SHARE.as_secs_f64(), last.as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn the_time_left_is_spread_over_the_items_gpus_at_a_time() {
        let none = Duration::ZERO;
        // 4 items on 2 GPUs in 10 minutes: two rounds of 5 minutes.
        assert_eq!(budget_share(s(600), 2, 4, 0, none), Some(s(300)));
        // The second GPU takes its item while the first runs: same share.
        assert_eq!(budget_share(s(600), 2, 3, 1, none), Some(s(300)));
        // More GPUs than items: each item may use all the time left.
        assert_eq!(budget_share(s(600), 4, 1, 1, none), Some(s(600)));
        // One GPU: items one after another.
        assert_eq!(budget_share(s(600), 1, 3, 0, none), Some(s(200)));
    }

    #[test]
    fn each_round_leaves_room_for_a_runs_setup_and_closing() {
        // 2 items on 1 GPU in 100 s with 20 s of overhead per run: 30 s each.
        assert_eq!(budget_share(s(100), 1, 2, 0, s(20)), Some(s(30)));
        // 2 items on 2 GPUs: one round, 80 s each.
        assert_eq!(budget_share(s(100), 2, 2, 0, s(20)), Some(s(80)));
    }

    #[test]
    fn too_little_time_starts_nothing_and_a_share_never_passes_the_time_left() {
        assert_eq!(budget_share(s(9), 2, 1, 0, Duration::ZERO), None);
        assert_eq!(budget_share(s(25), 2, 1, 0, s(20)), None);
        assert_eq!(budget_share(s(40), 1, 10, 0, s(20)), Some(MIN_SHARE));
        assert!(budget_share(s(30), 8, 1, 0, s(5)).unwrap() <= s(25));
    }
}
