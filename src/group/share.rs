//! How much of the group's budget the next item's run gets.

use std::time::Duration;

/// The shortest share worth starting a run for: less than this and the plan's first stage
/// would not finish, so the item stays queued (a resumed group with more budget takes it).
pub const MIN_SHARE: Duration = Duration::from_secs(10);

/// The budget of the next item's run: the time left spread evenly over the items not yet
/// done (this one, the other queued ones, and those running), `gpus` at a time, so every
/// item gets a turn within the budget. A class that converges early hands its unused time
/// to the items taken after it. Never more than the time left; None when less than
/// [`MIN_SHARE`] is left.
pub fn budget_share(left: Duration, gpus: usize, queued: usize, running: usize) -> Option<Duration> {
    if left < MIN_SHARE {
        return None;
    }
    let waiting = (queued + running).max(1) as f64;
    let share = left.as_secs_f64() * gpus.max(1) as f64 / waiting;
    Some(Duration::from_secs_f64(share.clamp(MIN_SHARE.as_secs_f64(), left.as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn the_time_left_is_spread_over_the_items_gpus_at_a_time() {
        // 4 items on 2 GPUs in 10 minutes: two rounds of 5 minutes.
        assert_eq!(budget_share(s(600), 2, 4, 0), Some(s(300)));
        // The second GPU takes its item while the first runs: same share.
        assert_eq!(budget_share(s(600), 2, 3, 1), Some(s(300)));
        // More GPUs than items: each item may use all the time left.
        assert_eq!(budget_share(s(600), 4, 1, 1), Some(s(600)));
        // One GPU: items one after another.
        assert_eq!(budget_share(s(600), 1, 3, 0), Some(s(200)));
    }

    #[test]
    fn too_little_time_starts_nothing_and_a_share_never_passes_the_time_left() {
        assert_eq!(budget_share(s(9), 2, 1, 0), None);
        assert_eq!(budget_share(s(12), 1, 10, 0), Some(MIN_SHARE));
        assert!(budget_share(s(30), 8, 1, 0).unwrap() <= s(30));
    }
}
