//! Timing candidates: per case, enough input sets to spill L2 (kept by shape for later
//! requests: `TimingInputs`), each entry's launch count
//! per sample from its first warm-up, CUDA graphs of one sample each, as many per entry as
//! its samples need to read every set in turn (graph mode: `rotation_graphs`), and
//! samples taken round by round with the entries' order alternating, timed with events;
//! with `sustained_ms`, once every case's samples are taken, one back-to-back window per
//! entry and round (each case prepared again: its kept sets, new graphs).
//!
//! Why every burst sample comes before any sustained window: a sustained window holds the
//! GPU at its power cap for `sustained_ms` (an H200 drops from 1980 MHz to 1500-1785), and
//! the clocks take a while to come back. Timed case by case, the next case's short samples
//! ran at the capped clocks the previous case's windows left: in a closing of the LLM
//! workload a prefill kernel the search timed at ~70 us read 80 us "burst" there. The same
//! holds across requests (the closing times our kernels right after the re-rank's windows),
//! so a request's samples also wait until `COOL_DOWN` has passed since the worker's last
//! window: the clocks read full again within half a second, but the power limiter still
//! held a B 4 x S 1024 prefill at 77 us (69 at full speed) for about a second more. The
//! pause is not the whole story: a closing's first timing read a few percent slow even
//! with no window before it, at the same clocks (docs/device-runs/2026-12-01-session41,
//! call 7); most of that gap came from short samples, which the closing no longer takes
//! (see `engine::closing`).

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use cudarc::driver::sys;
use cudarc::driver::{CudaEvent, DriverError};

use super::abi::Abi;
use super::buffers::{Partials, TensorSet};
use super::error::{after, api, Failure, Stage};
use super::kernels::{resolve, Resolved};
use super::plan::{validate_plan, validate_shape};
use super::CudaBackend;
use crate::spec::protocol::{Response, TimeCase, Timed, TimedCase, TimedEntry, TimingSpec, ViewStrides, COOL_DOWN};
use crate::worker::reference;

/// Input sets kept between `Time` requests, by shape, for the rest of the worker's life:
/// drawing a shape's sets on the CPU and uploading them cost more than timing a candidate
/// on it for a large decode shape (B 64 x S_k 4096: ~1 GB of K/V per set), and every
/// iteration times the same shapes again. Correctness does not rest on them: every check
/// draws fresh inputs. Nor does keeping them open a way to cheat that a request did not
/// already have, since within one request each set is launched on many times.
///
/// Bounded: at most an eighth of the device's memory (checked against its size when the
/// backend starts), the least recently used shapes freed first, so a check's own sets and
/// a large timing still find room.
pub(super) type TimingInputs = Kept<Vec<TensorSet>>;

/// Values by key within a byte budget, the least recently kept freed first.
pub(super) struct Kept<V> {
    /// Key -> (value, its bytes, the `clock` when it was kept).
    map: HashMap<String, (V, u64, u64)>,
    /// Bytes held by `map`.
    bytes: u64,
    /// The most `map` may hold.
    cap_bytes: u64,
    /// Values kept so far, for least-recently-kept order.
    clock: u64,
}

impl<V> Kept<V> {
    /// Keep at most `cap_bytes`.
    pub(super) fn new(cap_bytes: u64) -> Self {
        Kept { map: HashMap::new(), bytes: 0, cap_bytes, clock: 0 }
    }

    /// Take `key`'s value out (to give it back with `keep` after use).
    fn take(&mut self, key: &str) -> Option<V> {
        let (v, b, _) = self.map.remove(key)?;
        self.bytes -= b;
        Some(v)
    }

    /// Keep `value` of `bytes` for `key`, freeing the least recently kept others beyond the
    /// cap; a value larger than the cap alone is freed at once.
    fn keep(&mut self, key: String, value: V, bytes: u64) {
        self.clock += 1;
        if let Some((_, b, _)) = self.map.remove(&key) {
            self.bytes -= b;
        }
        if bytes > self.cap_bytes {
            return;
        }
        while self.bytes + bytes > self.cap_bytes {
            let Some(oldest) = self.map.iter().min_by_key(|(_, (_, _, at))| *at).map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some((_, b, _)) = self.map.remove(&oldest) {
                self.bytes -= b;
            }
        }
        self.bytes += bytes;
        self.map.insert(key, (value, bytes, self.clock));
    }
}

/// Device bytes of some tensor sets.
fn sets_bytes(sets: &[TensorSet]) -> u64 {
    sets.iter().map(|s| 2 * (s.q.len() + s.k.len() + s.v.len() + s.o.len()) as u64).sum()
}

/// The seed a case's input sets are drawn from when none are kept: from the request's seed
/// and the shape, not the case's position in the request.
fn case_seed(seed: u64, key: &str) -> u64 {
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    reference::mix_seed(seed, h)
}

impl CudaBackend {
    pub(super) fn time(
        &mut self,
        cases: &[TimeCase],
        spec: &TimingSpec,
        seed: u64,
    ) -> Result<Response, Failure> {
        // Validate the whole request before touching the GPU.
        for (ci, case) in cases.iter().enumerate() {
            validate_shape(&case.shape)
                .map_err(|m| Failure::Bad(format!("time case {ci}: {m}")))?;
            for e in &case.entries {
                if e.plan.shape != case.shape {
                    return Err(Failure::Bad(format!(
                        "time case {ci}: entry {} plans shape {} but the case is {}",
                        e.id,
                        e.plan.shape.key(),
                        case.shape.key()
                    )));
                }
                validate_plan(&e.plan)
                    .map_err(|m| Failure::Bad(format!("time case {ci}, entry {}: {m}", e.id)))?;
                if !self.candidates.contains_key(&e.id) {
                    return Err(Failure::Bad(format!(
                        "time: no candidate loaded with id {:?}",
                        e.id
                    )));
                }
            }
        }
        // Only closings and re-ranks time windows, so the search never waits.
        if let Some(wait) = self.windows_ended.and_then(|t| COOL_DOWN.checked_sub(t.elapsed())) {
            tracing::debug!(wait_ms = wait.as_millis() as u64, "burst samples wait for the last sustained window's power to settle");
            std::thread::sleep(wait);
        }
        let mut out = Vec::with_capacity(cases.len());
        for case in cases {
            out.push(self.time_case(case, spec, case_seed(seed, &case.shape.key()), Pass::Burst)?);
        }
        if spec.sustained_ms > 0.0 {
            for (case, timed) in cases.iter().zip(out.iter_mut()) {
                let burst_us: Vec<f64> = timed.entries.iter().map(|e| median(&e.samples_us)).collect();
                let windows = self.time_case(case, spec, case_seed(seed, &case.shape.key()), Pass::Sustained { burst_us: &burst_us })?;
                for (entry, sus) in timed.entries.iter_mut().zip(windows.entries) {
                    entry.sustained_us = sus.sustained_us;
                }
            }
            self.windows_ended = Some(std::time::Instant::now());
        }
        Ok(Response::Timed(Timed { cases: out }))
    }

    fn time_case(
        &mut self,
        case: &TimeCase,
        spec: &TimingSpec,
        seed: u64,
        pass: Pass<'_>,
    ) -> Result<TimedCase, Failure> {
        let case_started = std::time::Instant::now();
        let shape = case.shape;
        let key = shape.key();
        let what = format!("time {key}");

        // Resolve every entry's kernels in its build.
        let mut entries: Vec<Vec<Resolved<'_>>> = Vec::with_capacity(case.entries.len());
        for e in &case.entries {
            let cand = self.candidates.get_mut(&e.id).ok_or_else(|| {
                Failure::Bad(format!("time: no candidate loaded with id {:?}", e.id))
            })?;
            entries.push(resolve(
                &mut cand.build,
                &e.plan,
                &format!("{what} ({})", e.id),
            )?);
        }

        // Enough input sets to spill L2, so every execution reads from HBM.
        let set_bytes = ((shape.q_elems() * 2 + shape.kv_elems() * 2) * 2).max(1) as f64;
        let want = (spec.l2_multiple * self.device.l2_bytes as f64 / set_bytes).ceil();
        let cap = spec.max_input_sets.max(1);
        let n_sets = if want.is_finite() && want >= 1.0 {
            (want.min(cap as f64)) as u32
        } else {
            1
        }
        .clamp(1, cap);

        // Kept sets of another count (another rotation asked) are freed and drawn again.
        let sets = match self.timing_inputs.take(&key).filter(|s| s.len() == n_sets as usize) {
            Some(kept) => kept,
            None => {
                self.staging.draw(&self.ctx, &self.stream, &shape, seed, &what)?;
                let mut sets = Vec::with_capacity(n_sets as usize);
                for s in 0..n_sets {
                    sets.push(self.upload_set(
                        &shape,
                        ViewStrides::contiguous(&shape),
                        self.staging.inputs(),
                        &format!("{what}: input set {s} of {n_sets}"),
                    )?);
                }
                self.staging.release();
                sets
            }
        };
        // One zeroed Partials per distinct n_splits: the split semaphores sit right after
        // the LSEs (at n_splits * rows), so an entry with more splits would write its LSEs
        // over the semaphores of an entry with fewer if they shared a buffer. Entries with
        // the same n_splits share one, since each execution leaves the semaphores zero.
        let mut partials: HashMap<u32, Partials> = HashMap::new();
        for e in &case.entries {
            if let Entry::Vacant(slot) = partials.entry(e.plan.n_splits) {
                slot.insert(self.alloc_partials(&shape, e.plan.n_splits, false, &format!("{what} ({})", e.id))?);
            }
        }
        let stream = &self.stream;
        // No CTA counter: the build counts only when given one (the check's), so what is
        // timed is the kernel as exported, less one untaken branch per CTA.
        let counter: sys::CUdeviceptr = 0;

        // Per entry and set: the launch arguments, built once (tensor maps encoded against
        // that set's buffers), before any capture: a captured graph keeps copies of them.
        let abis: Vec<Vec<Abi>> = case
            .entries
            .iter()
            .map(|e| {
                let what = format!("{what} ({})", e.id);
                let partials = partials
                    .get(&e.plan.n_splits)
                    .ok_or_else(|| Failure::Bad(format!("{what}: no partials for n_splits {}", e.plan.n_splits)))?;
                sets.iter()
                    .map(|set| Abi::new(&e.plan, set, partials, stream, &what))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<_, _>>()?;
        let mut cursor = 0usize;
        let execute = |ei: usize, cursor: &mut usize| -> Result<(), Failure> {
            let abi = &abis[ei][*cursor % sets.len()];
            *cursor += 1;
            for (i, r) in entries[ei].iter().enumerate() {
                r.function_launch(abi, counter, stream).map_err(|e| {
                    Failure::cuda(
                        format!(
                            "{what}: entry {} launch {i} ({})",
                            case.entries[ei].id, r.launch.kernel
                        ),
                        e,
                        Stage::Launch,
                    )
                })?;
            }
            Ok(())
        };

        let start = api(
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
            || format!("{what}: creating events"),
        )?;
        let end = api(
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
            || format!("{what}: creating events"),
        )?;
        // The first warm-up execution of each entry is timed: how long the slowest one
        // runs decides how many launches a sample needs and how samples form rounds
        // (protocol::sample_plan).
        let mut slowest_us = 0f64;
        for ei in 0..case.entries.len() {
            after(start.record(stream), || format!("{what}: recording the start event"))?;
            execute(ei, &mut cursor)?;
            after(end.record(stream), || format!("{what}: recording the end event"))?;
            let ms = elapsed(&start, &end).map_err(|e| {
                Failure::cuda(format!("{what}: entry {} warmup", case.entries[ei].id), e, Stage::AfterLaunch)
            })?;
            slowest_us = slowest_us.max(ms as f64 * 1000.0);
        }
        let crate::spec::protocol::SamplePlan { per_sample, samples_per_round, rounds } = crate::spec::protocol::sample_plan(spec, slowest_us);
        let warmup = spec.warmup.min(per_sample.max(2)).saturating_sub(1);
        for ei in 0..case.entries.len() {
            for _ in 0..warmup {
                execute(ei, &mut cursor)?;
            }
        }
        after(stream.synchronize(), || format!("{what}: warmup"))?;
        // Graph mode: capture each entry's executions in graphs of `per_sample` each; a
        // sample is one replay, so the CPU's launch cost drops out and the time is the GPU's.
        // Several graphs per entry, replayed in turn, when one sample reads fewer sets than
        // the case has: one graph replayed sample after sample would read the same few sets
        // again and again, from L2 for a small decode cache (B 1 x S_k 1024: 5 sets of 4 MB
        // timed at 4.4 us where a rotation over all 16 read 4.98).
        let n_graphs = rotation_graphs(sets.len(), per_sample as usize);
        let mut graphs: Vec<Vec<_>> = Vec::new();
        if spec.graph {
            for ei in 0..case.entries.len() {
                let mut own = Vec::with_capacity(n_graphs);
                for _ in 0..n_graphs {
                    api(
                        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                        || format!("{what}: beginning graph capture"),
                    )?;
                    let mut captured = Ok(());
                    for _ in 0..per_sample {
                        if let Err(e) = execute(ei, &mut cursor) {
                            captured = Err(e);
                            break;
                        }
                    }
                    // End the capture whatever happened, so the stream is usable again.
                    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                    captured?;
                    let graph = api(graph, || format!("{what}: instantiating the graph of {}", case.entries[ei].id))?
                        .ok_or_else(|| Failure::Bad(format!("{what}: captured an empty graph")))?;
                    api(graph.upload(), || format!("{what}: uploading the graph"))?;
                    after(graph.launch(), || format!("{what}: warming the graph of {}", case.entries[ei].id))?;
                    own.push(graph);
                }
                graphs.push(own);
            }
            after(stream.synchronize(), || format!("{what}: graph warmup"))?;
        }
        // The next graph each entry replays.
        let mut next_graph = vec![0usize; case.entries.len()];
        // One timed window: `replays` back-to-back replays of entry `ei`'s graphs, in turn
        // (without graphs, `per_sample` executions each) between one pair of events; the
        // result is per execution. A sample is a window of one replay; a sustained window is many.
        let mut window = |ei: usize, replays: u32, cursor: &mut usize| -> Result<f64, Failure> {
            let id = &case.entries[ei].id;
            after(start.record(stream), || format!("{what}: recording the start event"))?;
            for _ in 0..replays {
                match graphs.get(ei) {
                    Some(own) => {
                        let g = &own[next_graph[ei] % own.len()];
                        next_graph[ei] += 1;
                        after(g.launch(), || format!("{what}: replaying the graph of {id}"))?
                    }
                    None => {
                        for _ in 0..per_sample {
                            execute(ei, cursor)?;
                        }
                    }
                }
            }
            after(end.record(stream), || format!("{what}: recording the end event"))?;
            let ms = elapsed(&start, &end)
                .map_err(|e| Failure::cuda(format!("{what}: entry {id} sample"), e, Stage::AfterLaunch))?;
            Ok(ms as f64 * 1000.0 / (per_sample as f64 * replays.max(1) as f64))
        };
        let mut samples: Vec<Vec<f64>> = case
            .entries
            .iter()
            .map(|_| Vec::with_capacity((rounds * samples_per_round) as usize))
            .collect();
        let n_entries = case.entries.len();
        // Alternate the order round by round so that no entry always runs first.
        let order = |round: u32, j: usize| if round.is_multiple_of(2) { j } else { n_entries - 1 - j };
        let burst_rounds = if matches!(pass, Pass::Burst) { rounds } else { 0 };
        for round in 0..burst_rounds {
            for j in 0..n_entries {
                let ei = order(round, j);
                for _ in 0..samples_per_round {
                    samples[ei].push(window(ei, 1, &mut cursor)?);
                }
            }
        }
        // Sustained: per round, each entry replayed back to back for at least `sustained_ms`
        // (entries interleaved like the samples, so each sees the same power state in turn),
        // windows sized from the burst pass's medians.
        let mut sustained: Vec<Vec<f64>> = vec![Vec::new(); n_entries];
        if let Pass::Sustained { burst_us } = pass {
            let replay_us = |us: f64| us * per_sample as f64;
            let mut replays: Vec<u32> = (0..n_entries)
                .map(|ei| crate::spec::protocol::sustained_replays(spec.sustained_ms, replay_us(burst_us.get(ei).copied().unwrap_or(0.0))))
                .collect();
            for round in 0..crate::spec::protocol::sustained_rounds(spec) {
                for j in 0..n_entries {
                    let ei = order(round, j);
                    let mut us = window(ei, replays[ei], &mut cursor)?;
                    // Sized from the burst median, the window is normally longer than asked
                    // (sustained clocks are lower); when it was not, size it from what this
                    // window measured and take it again, so every window lasts the time asked.
                    if replay_us(us) * (replays[ei] as f64) < spec.sustained_ms * 1000.0 {
                        replays[ei] = crate::spec::protocol::sustained_replays(spec.sustained_ms, replay_us(us)).max(replays[ei] + 1);
                        us = window(ei, replays[ei], &mut cursor)?;
                    }
                    sustained[ei].push(us);
                }
            }
        }
        after(stream.synchronize(), || format!("{what}: finishing"))?;
        // With timestamps, these lines let a clock log (nvidia-smi) be read against each case.
        tracing::debug!(
            shape = %key,
            pass = if matches!(pass, Pass::Burst) { "burst" } else { "sustained" },
            entries = n_entries,
            ms = case_started.elapsed().as_secs_f64() * 1000.0,
            medians_us = ?samples.iter().map(|s| (median(s) * 100.0).round() / 100.0).collect::<Vec<_>>(),
            "timed case"
        );
        drop(graphs);
        drop(abis);
        let bytes = sets_bytes(&sets);
        self.timing_inputs.keep(key, sets, bytes);

        Ok(TimedCase {
            shape,
            input_sets: n_sets,
            entries: case
                .entries
                .iter()
                .zip(samples.into_iter().zip(sustained))
                .map(|(e, (s, sus))| TimedEntry {
                    id: e.id.clone(),
                    samples_us: s,
                    sustained_us: sus,
                })
                .collect(),
        })
    }
}

/// Which part of a case's timing a pass over it takes (see the module's comment).
#[derive(Clone, Copy)]
enum Pass<'a> {
    /// The interleaved short samples (`samples_us`).
    Burst,
    /// The back-to-back windows (`sustained_us`), each sized from its entry's burst median.
    Sustained { burst_us: &'a [f64] },
}

/// How many graphs of `per_sample` executions an entry's samples rotate through so that,
/// replayed in turn, they read the case's `n_sets` input sets in one unbroken rotation:
/// the executions of lcm(n_sets, per_sample) / per_sample graphs end where the first began.
/// One graph where that would capture more than `MAX_ROTATION_LAUNCHES` executions (a
/// sample of hundreds of launches already reads every set, and only the few launches
/// around a replay's end read a set again soon).
fn rotation_graphs(n_sets: usize, per_sample: usize) -> usize {
    if n_sets <= 1 || per_sample == 0 {
        return 1;
    }
    let (mut a, mut b) = (n_sets, per_sample);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let graphs = n_sets / a;
    if graphs * per_sample > MAX_ROTATION_LAUNCHES.max(per_sample) {
        1
    } else {
        graphs
    }
}

/// The most executions an entry's rotation of graphs captures (above one graph's own):
/// with at most 32 sets and a sample shorter than that, lcm(n_sets, per_sample) stays
/// within 32 x 31 launches, so small samples always rotate.
const MAX_ROTATION_LAUNCHES: usize = 1024;

/// The median of some samples (0 when there are none: one replay per sustained window).
fn median(samples: &[f64]) -> f64 {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds between two recorded events, once `end` has completed.
fn elapsed(start: &CudaEvent, end: &CudaEvent) -> Result<f32, DriverError> {
    end.synchronize()?;
    start.elapsed_ms(end)
}

#[cfg(test)]
mod tests {
    use super::{rotation_graphs, Kept};

    #[test]
    fn samples_rotate_through_every_input_set_without_a_seam() {
        // 16 sets, 5 launches per sample: 16 graphs (80 executions, 5 rotations).
        assert_eq!(rotation_graphs(16, 5), 16);
        // A sample that reads half the sets: two graphs.
        assert_eq!(rotation_graphs(16, 8), 2);
        assert_eq!(rotation_graphs(16, 16), 1);
        assert_eq!(rotation_graphs(1, 5), 1);
        // Longer samples than sets rotate while lcm stays small ...
        assert_eq!(rotation_graphs(16, 20), 4);
        // ... and take one graph where lcm would be thousands of launches.
        assert_eq!(rotation_graphs(16, 437), 1);
        // Whatever the counts, the graphs' executions end on a whole number of rotations.
        for n in 1..=32usize {
            for p in 1..=40usize {
                let g = rotation_graphs(n, p);
                assert!(g >= 1 && g <= n);
                if p < n {
                    assert_eq!((g * p) % n, 0, "{n} sets, {p} per sample: {g} graphs leave a seam");
                }
            }
        }
    }

    #[test]
    fn kept_values_stay_within_the_cap_least_recently_kept_freed_first() {
        let mut k = Kept::new(100);
        k.keep("a".into(), 'a', 40);
        k.keep("b".into(), 'b', 40);
        // Using "a" again makes "b" the oldest.
        let a = k.take("a").unwrap();
        k.keep("a".into(), a, 40);
        k.keep("c".into(), 'c', 40);
        assert_eq!(k.take("b"), None, "the least recently kept is freed");
        assert_eq!(k.bytes, 80);
        assert_eq!(k.take("a"), Some('a'));
        assert_eq!(k.take("c"), Some('c'));
        assert_eq!(k.bytes, 0);
        // Larger than the cap alone: not kept, and nothing else freed for it.
        k.keep("d".into(), 'd', 10);
        k.keep("huge".into(), 'h', 101);
        assert_eq!(k.take("huge"), None);
        assert_eq!(k.take("d"), Some('d'));
        // Keeping a key again replaces its value and its bytes.
        k.keep("e".into(), 'e', 60);
        k.keep("e".into(), 'E', 30);
        assert_eq!(k.bytes, 30);
        assert_eq!(k.take("e"), Some('E'));
    }
}
