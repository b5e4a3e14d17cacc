//! Deterministic data parallelism for the reference's CPU work: how many threads to use,
//! and filling a buffer chunk by chunk on scoped threads.

/// The CPU threads available (at least one).
pub(super) fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(1)
}

/// Fill `out` in parallel, chunk by chunk; `f(chunk_index, chunk)` must be deterministic.
pub(super) fn par_chunks<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let n_chunks = out.len().div_ceil(chunk.max(1));
    let workers = threads().min(n_chunks).max(1);
    if workers == 1 {
        out.chunks_mut(chunk.max(1))
            .enumerate()
            .for_each(|(i, c)| f(i, c));
        return;
    }
    let per_worker = n_chunks.div_ceil(workers);
    std::thread::scope(|s| {
        for (w, group) in out.chunks_mut(per_worker * chunk).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (j, c) in group.chunks_mut(chunk).enumerate() {
                    f(w * per_worker + j, c);
                }
            });
        }
    });
}

/// How many of `xs` satisfy `f`, counted on parallel threads in chunks of `chunk`.
pub(super) fn par_count<T: Sync>(xs: &[T], chunk: usize, f: impl Fn(&T) -> bool + Sync) -> usize {
    let chunk = chunk.max(1);
    let mut counts = vec![0usize; xs.len().div_ceil(chunk).max(1)];
    par_chunks(&mut counts, 1, |i, c| {
        c[0] = xs.chunks(chunk).nth(i).map_or(0, |part| part.iter().filter(|x| f(x)).count());
    });
    counts.iter().sum()
}
