//! The worker's compile pool: the builds the engine expects to load next, compiled by a few
//! threads, soonest-needed first.
//!
//! The engine asks for a list of builds at a time, soonest needed first (the candidate about
//! to be loaded, the search's guesses, the next stage's start; or the closing re-rank's
//! contenders in loading order), and each list replaces the one before: a build no longer
//! asked for that has not started is dropped, one already compiling finishes and is kept
//! while there is room. A `take` of a build still queued compiles it on the caller's thread
//! at once (nothing is needed sooner); of one compiling, waits for it.
//!
//! Why a pool, and a small one: until 2026-12-01 every ask started its own thread, up to
//! eight NVRTC builds at once beside the check's fp32 reference on the H200 host's 16
//! cores, so a Hopper build that takes ~3.5 s alone took 4-10 s, and the next candidate's
//! build, asked for with the others, finished no sooner than they did (a 4-minute run's
//! loads waited 90 s in all, docs/BENCHMARKS.md (39)). A few threads taking the most urgent
//! build first finish it in about its own time.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// A build's work: run once, by a pool thread or by the `take` that needs it first.
pub type Work<T> = Box<dyn FnOnce() -> T + Send>;

/// A pool of `threads` compile threads over the builds asked for (see the module doc).
pub struct CompilePool<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    threads: usize,
    /// How many builds are kept: asked for, plus finished or compiling ones no longer asked
    /// for (a search may come back to them), those the list before needed soonest kept first.
    keep: usize,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Signalled when a build is queued, when one finishes, and on shutdown.
    changed: Condvar,
}

struct State<T> {
    /// Soonest needed first: the last list asked for, in its order, then builds no longer
    /// asked for that had started.
    jobs: Vec<Job<T>>,
    shutdown: bool,
}

struct Job<T> {
    key: String,
    status: Status<T>,
}

enum Status<T> {
    Queued(Work<T>),
    Compiling,
    Done(T),
}

/// What [`CompilePool::take`] found.
pub struct Taken<T> {
    pub value: T,
    /// Whether a pool thread had started (or finished) it before it was taken; false: it was
    /// still queued and the caller compiled it.
    pub ahead: bool,
}

/// Compile threads for a host of `cores` when the config leaves it to the worker (0): a
/// quarter of them, at least 2 and at most 8 (the H200's 16-core host: 4), leaving the rest
/// to the check's fp32 reference and the worker's own thread.
pub fn auto_threads(cores: usize) -> usize {
    (cores / 4).clamp(2, 8)
}

impl<T: Send + 'static> CompilePool<T> {
    /// A pool that starts its `threads` (at least one) on the first [`expect`](Self::expect).
    pub fn new(threads: usize, keep: usize) -> Self {
        CompilePool {
            shared: Arc::new(Shared { state: Mutex::new(State { jobs: Vec::new(), shutdown: false }), changed: Condvar::new() }),
            threads: 0,
            keep: keep.max(1),
        }
        .with_threads(threads.max(1))
    }

    fn with_threads(mut self, threads: usize) -> Self {
        self.grow(threads);
        self
    }

    /// At least `threads` compile threads from now on (a pool never shrinks: a thread ends
    /// only with the pool).
    pub fn grow(&mut self, threads: usize) {
        while self.threads < threads {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new().name(format!("compile-{}", self.threads)).spawn(move || compile_loop(&shared));
            if let Err(e) = spawned {
                // The builds still happen: a `take` compiles what no thread started.
                tracing::warn!(error = %e, "compile thread not started");
                return;
            }
            self.threads += 1;
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The builds the engine expects to load next, soonest first, each with the work that
    /// compiles it (unused for a build already asked for). Replaces the list before: its
    /// builds not asked for again are dropped if not started. Returns, per build asked for,
    /// whether it was new (queued now) rather than kept.
    pub fn expect(&self, asks: Vec<(String, Work<T>)>) -> Vec<bool> {
        let mut st = self.lock();
        let mut old = std::mem::take(&mut st.jobs);
        let mut fresh = Vec::with_capacity(asks.len());
        for (key, work) in asks.into_iter().take(self.keep) {
            if st.jobs.iter().any(|j| j.key == key) {
                fresh.push(false);  // asked twice in one list: the first place counts
                continue;
            }
            match old.iter().position(|j| j.key == key) {
                Some(i) => {
                    st.jobs.push(old.remove(i));
                    fresh.push(false);
                }
                None => {
                    st.jobs.push(Job { key, status: Status::Queued(work) });
                    fresh.push(true);
                }
            }
        }
        // Not asked for any more: dropped if not started; kept after the list otherwise, in
        // the old list's order, while there is room (a thread still compiling one finishes it
        // and is kept whatever the room: its result is stored under its key).
        old.retain(|j| !matches!(j.status, Status::Queued(_)));
        let room = self.keep.saturating_sub(st.jobs.len());
        let compiling = old.iter().filter(|j| matches!(j.status, Status::Compiling)).count();
        let mut done_room = room.saturating_sub(compiling);
        for j in old {
            match j.status {
                Status::Compiling => st.jobs.push(j),
                Status::Done(_) if done_room > 0 => {
                    done_room -= 1;
                    st.jobs.push(j);
                }
                _ => {}
            }
        }
        drop(st);
        self.shared.changed.notify_all();
        fresh
    }

    /// The build under `key`: finished, or waited for while a thread compiles it, or (still
    /// queued) compiled now on this thread. None if it was never asked for, was dropped, or
    /// its build panicked.
    pub fn take(&self, key: &str) -> Option<Taken<T>> {
        let mut st = self.lock();
        loop {
            let i = st.jobs.iter().position(|j| j.key == key)?;
            match &st.jobs[i].status {
                Status::Compiling => {
                    st = self.shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                Status::Done(_) | Status::Queued(_) => {
                    let job = st.jobs.remove(i);
                    drop(st);
                    return Some(match job.status {
                        Status::Done(value) => Taken { value, ahead: true },
                        Status::Queued(work) => Taken { value: work(), ahead: false },
                        Status::Compiling => unreachable!("matched above"),
                    });
                }
            }
        }
    }

    /// The keys held, soonest needed first, each with its state (`queued`, `compiling`,
    /// `done`): for logs and tests.
    pub fn snapshot(&self) -> Vec<(String, &'static str)> {
        self.lock()
            .jobs
            .iter()
            .map(|j| {
                let s = match j.status {
                    Status::Queued(_) => "queued",
                    Status::Compiling => "compiling",
                    Status::Done(_) => "done",
                };
                (j.key.clone(), s)
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A poisoned lock means a build panicked inside NVRTC's wrapper; the list itself
        // is still consistent (every change is made under the lock in one step).
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: Send + 'static> Drop for CompilePool<T> {
    fn drop(&mut self) {
        // Threads end after the build they are on (not joined: an NVRTC build cannot be
        // interrupted, and the worker process exits right after anyway).
        self.lock().shutdown = true;
        self.shared.changed.notify_all();
    }
}

/// A compile thread: the first queued build in the list (the soonest needed), compiled, its
/// result stored under its key if it is still held.
fn compile_loop<T: Send + 'static>(shared: &Shared<T>) {
    let lock = || shared.state.lock().unwrap_or_else(|p| p.into_inner());
    let mut st = lock();
    loop {
        if st.shutdown {
            return;
        }
        let Some(i) = st.jobs.iter().position(|j| matches!(j.status, Status::Queued(_))) else {
            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        let key = st.jobs[i].key.clone();
        let Status::Queued(work) = std::mem::replace(&mut st.jobs[i].status, Status::Compiling) else {
            unreachable!("found queued above")
        };
        drop(st);
        let started = Instant::now();
        // A build that panics (NVRTC's wrapper) is dropped, not left compiling: a `take`
        // waiting for it then finds nothing and compiles on its own thread, and this thread
        // lives on for the next build.
        let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        tracing::debug!(key = %key.lines().next().unwrap_or(""), ms = started.elapsed().as_secs_f64() * 1e3, ok = value.is_ok(), "pool build finished");
        st = lock();
        if let Some(i) = st.jobs.iter().position(|j| j.key == key && matches!(j.status, Status::Compiling)) {
            match value {
                Ok(value) => st.jobs[i].status = Status::Done(value),
                Err(_) => {
                    st.jobs.remove(i);
                }
            }
        }
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Work that reports when it starts and then waits for `go` before returning its key.
    fn gated(key: &str, started: &mpsc::Sender<String>, go: &Arc<(Mutex<bool>, Condvar)>) -> (String, Work<String>) {
        let (k, tx, go) = (key.to_string(), started.clone(), go.clone());
        (
            key.to_string(),
            Box::new(move || {
                let _ = tx.send(k.clone());
                let (m, c) = &*go;
                let mut open = m.lock().unwrap();
                while !*open {
                    open = c.wait(open).unwrap();
                }
                k
            }),
        )
    }

    fn open(go: &Arc<(Mutex<bool>, Condvar)>) {
        *go.0.lock().unwrap() = true;
        go.1.notify_all();
    }

    #[test]
    fn threads_take_the_soonest_needed_build_first_and_a_new_list_drops_what_has_not_started() {
        let pool = CompilePool::new(1, 8);
        let (tx, rx) = mpsc::channel();
        let go = Arc::new((Mutex::new(false), Condvar::new()));
        assert_eq!(pool.expect(vec![gated("a", &tx, &go), gated("b", &tx, &go), gated("c", &tx, &go)]), [true, true, true]);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "a", "the first asked for is compiled first");
        // A new list: c first now, a (compiling) no longer asked for, b dropped unstarted.
        assert_eq!(pool.expect(vec![gated("c", &tx, &go), gated("d", &tx, &go)]), [false, true]);
        assert_eq!(pool.snapshot(), [("c".to_string(), "queued"), ("d".into(), "queued"), ("a".into(), "compiling")]);
        open(&go);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "c");
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "d");
        assert!(pool.take("b").is_none(), "b was dropped before it started");
        let a = pool.take("a").expect("a finished and was kept");
        assert_eq!((a.value.as_str(), a.ahead), ("a", true));
        let d = pool.take("d").unwrap();
        assert_eq!((d.value.as_str(), d.ahead), ("d", true), "a take of a build compiling waits for it");
        assert!(pool.take("d").is_none(), "taken once");
    }

    #[test]
    fn a_take_of_a_queued_build_compiles_it_on_the_callers_thread() {
        let pool = CompilePool::new(1, 8);
        let (tx, rx) = mpsc::channel();
        let go = Arc::new((Mutex::new(false), Condvar::new()));
        pool.expect(vec![gated("slow", &tx, &go), ("next".to_string(), Box::new(|| "next".to_string()))]);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "slow");
        // The one thread is busy: the load of "next" does not wait behind it.
        let next = pool.take("next").unwrap();
        assert_eq!((next.value.as_str(), next.ahead), ("next", false));
        open(&go);
        assert_eq!(pool.take("slow").unwrap().value, "slow");
    }

    #[test]
    fn finished_builds_no_longer_asked_for_are_kept_while_there_is_room() {
        let pool: CompilePool<String> = CompilePool::new(2, 3);
        let done = |k: &str| -> (String, Work<String>) {
            let k2 = k.to_string();
            (k.to_string(), Box::new(move || k2))
        };
        pool.expect(vec![done("a"), done("b")]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.snapshot().iter().any(|(_, s)| *s != "done") {
            assert!(Instant::now() < deadline, "{:?}", pool.snapshot());
            std::thread::sleep(Duration::from_millis(5));
        }
        // Two new ones and room for three: one of a and b stays, the first of the old list.
        pool.expect(vec![done("c"), done("d")]);
        let keys: Vec<String> = pool.snapshot().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["c", "d", "a"]);
        // Asked for twice in one list: once, at its first place.
        assert_eq!(pool.expect(vec![done("x"), done("x")]), [true, false]);
    }

    #[test]
    fn a_build_that_panics_is_dropped_and_its_thread_goes_on() {
        let pool: CompilePool<String> = CompilePool::new(1, 8);
        let (tx, rx) = mpsc::channel();
        let go = Arc::new((Mutex::new(false), Condvar::new()));
        let boom: Work<String> = Box::new(|| panic!("a build that panics"));
        pool.expect(vec![gated("first", &tx, &go), ("boom".to_string(), boom), gated("after", &tx, &go)]);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "first");
        open(&go);
        // The load of the panicking build does not hang: it finds nothing (and compiles itself).
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.snapshot().iter().any(|(k, _)| k == "boom") {
            assert!(Instant::now() < deadline, "{:?}", pool.snapshot());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(pool.take("boom").is_none());
        assert_eq!(pool.take("after").unwrap().value, "after", "the thread went on to the next build");
    }

    #[test]
    fn the_workers_default_is_a_quarter_of_the_cores_between_two_and_eight() {
        assert_eq!([1, 2, 8, 16, 32, 64, 128].map(auto_threads), [2, 2, 2, 4, 8, 8, 8]);
    }
}
