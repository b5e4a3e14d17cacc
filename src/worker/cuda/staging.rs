//! Host memory for the inputs a check or a timing draws: kept across requests and
//! page-locked, within a cap.
//!
//! A large decode shape's Q, K and V are ~1 GB of bit patterns (Llama-3 B 64 x SK 4096),
//! drawn afresh for every candidate's check. Into a new allocation each time, most of the
//! drawing went to faulting its pages in (1 GB on two local cores: 264 ms fresh, 28 ms into
//! pages already there), and the upload from pageable memory ran through the driver's
//! staging copies (146 ms for that shape on the H200, ~7 GB/s). Kept and page-locked, the
//! pages are faulted once per worker and each upload is one DMA at the link's rate, which
//! may still be reading when the call returns: every draw first waits for the stream, so
//! no copy can read a buffer while it is rewritten.
//!
//! The cap ([`pin_limit_bytes`]: an eighth of the host's memory, at most 4 GiB, since a host
//! with several GPUs runs a worker for each) bounds what one worker locks; a shape beyond
//! it, or a host that refuses to lock memory, draws into ordinary memory as before (freed
//! on another thread afterwards: giving back 1 GB took 65 ms on the H200's host).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, PinnedHostSlice};

use super::error::{after, Failure};
use crate::spec::protocol::Shape;
use crate::worker::reference;

/// Page-locked memory grows in steps of this many elements (64 MiB), so that shapes of
/// nearly the same size do not each reallocate it.
const GROW_STEP: usize = 32 << 20;

/// The most page-locked memory one worker keeps for inputs, from the host's total memory
/// (`None`: unknown, 1 GiB).
pub(super) fn pin_limit_bytes(host_memory: Option<u64>) -> u64 {
    host_memory.map_or(1 << 30, |m| (m / 8).min(4 << 30))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
pub(super) fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// The host's total memory (Linux), if it can be read.
fn host_memory() -> Option<u64> {
    mem_total(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// Where the current draw lives.
enum Held {
    None,
    /// The first `lens` elements of the page-locked buffer, Q then K then V.
    Pinned([usize; 3]),
    /// Ordinary memory, for a draw over the cap or after the host refused to lock memory.
    Owned([Vec<u16>; 3]),
}

/// The worker's input buffers (see the module's documentation).
pub(super) struct InputStaging {
    pinned: Option<Pinned>,
    held: Held,
    limit_elems: usize,
    /// Set once locking memory failed: the worker draws into ordinary memory from then on.
    refused: bool,
}

impl InputStaging {
    pub(super) fn new() -> Self {
        let limit = pin_limit_bytes(host_memory());
        InputStaging { pinned: None, held: Held::None, limit_elems: (limit / 2) as usize, refused: false }
    }

    /// Draw `shape`'s inputs for `seed` (`reference::randn_inputs`' values), replacing the
    /// last draw; read them with [`InputStaging::inputs`].
    pub(super) fn draw(&mut self, ctx: &Arc<CudaContext>, stream: &CudaStream, shape: &Shape, seed: u64, what: &str) -> Result<(), Failure> {
        // An earlier upload from these pages may still be in flight.
        after(stream.synchronize(), || format!("{what}: before drawing new inputs"))?;
        self.release();
        let lens = reference::input_lens(shape);
        let need: usize = lens.iter().sum();
        if let Some(buf) = self.pinned_for(ctx, need, what) {
            // SAFETY: the buffer holds at least `need` elements, all initialised (zeroed
            // when allocated), and no copy reads it: the stream was synchronised above.
            let all = unsafe { std::slice::from_raw_parts_mut(buf.ptr, need) };
            let (q, rest) = all.split_at_mut(lens[0]);
            let (k, v) = rest.split_at_mut(lens[1]);
            reference::randn_inputs_into(shape, seed, [q, k, v]);
            self.held = Held::Pinned(lens);
        } else {
            self.held = Held::Owned(reference::randn_inputs(shape, seed));
        }
        Ok(())
    }

    /// The last draw's Q, K, V (empty before the first).
    pub(super) fn inputs(&self) -> [&[u16]; 3] {
        match (&self.held, &self.pinned) {
            (Held::Pinned([nq, nk, nv]), Some(buf)) => {
                // SAFETY: `draw` wrote these `nq + nk + nv` elements; the buffer is not
                // written again before the next `draw`, which needs `&mut self`.
                let all = unsafe { std::slice::from_raw_parts(buf.ptr, nq + nk + nv) };
                let (q, rest) = all.split_at(*nq);
                let (k, v) = rest.split_at(*nk);
                [q, k, &v[..*nv]]
            }
            (Held::Owned([q, k, v]), _) => [q, k, v],
            _ => [&[], &[], &[]],
        }
    }

    /// Let the last draw go; ordinary memory is freed on another thread.
    pub(super) fn release(&mut self) {
        if let Held::Owned(bits) = std::mem::replace(&mut self.held, Held::None) {
            // (Builder: if no thread can be started, the closure and the inputs drop here.)
            let _ = std::thread::Builder::new().name("free-inputs".into()).spawn(move || drop(bits));
        }
    }

    /// The page-locked buffer, grown to hold `need` elements, unless that is over the cap
    /// or the host refused to lock memory.
    fn pinned_for(&mut self, ctx: &Arc<CudaContext>, need: usize, what: &str) -> Option<&Pinned> {
        if self.refused || need > self.limit_elems {
            return None;
        }
        if self.pinned.as_ref().is_some_and(|b| b.buf.len() >= need) {
            return self.pinned.as_ref();
        }
        // The old buffer first: both at once could be twice the cap.
        self.pinned = None;
        let len = need.div_ceil(GROW_STEP).saturating_mul(GROW_STEP).min(self.limit_elems).max(need);
        match Pinned::zeroed(ctx, len) {
            Ok(p) => self.pinned = Some(p),
            Err(e) => {
                self.refused = true;
                tracing::warn!(
                    "{what}: could not page-lock {} MiB of host memory for inputs ({}); drawing them into ordinary memory from now on (slower uploads)",
                    len * 2 >> 20,
                    super::describe(e)
                );
            }
        }
        self.pinned.as_ref()
    }
}

/// A page-locked buffer and its address, taken once (cudarc's accessors wait on an event
/// per call; this context never records it, event tracking being off).
struct Pinned {
    buf: PinnedHostSlice<u16>,
    ptr: *mut u16,
}

impl Pinned {
    /// `len` elements of page-locked memory (not write-combined: the reference reads it),
    /// zeroed so that every slice made of it is initialised.
    fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        // SAFETY: the memory is zeroed below before any slice of it is made.
        let mut buf = unsafe { ctx.alloc_pinned_with_flags::<u16>(len, 0) }?;
        let ptr = buf.as_mut_ptr()?;
        // SAFETY: `len` u16 elements were just allocated at `ptr`.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(Pinned { buf, ptr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_cap_is_an_eighth_of_the_host_at_most_4_gib() {
        assert_eq!(pin_limit_bytes(None), 1 << 30);
        assert_eq!(pin_limit_bytes(Some(16 << 30)), 2 << 30);
        assert_eq!(pin_limit_bytes(Some(2 << 40)), 4 << 30);
    }

    #[test]
    fn mem_total_reads_proc_meminfo() {
        let text = "MemTotal:       131912260 kB\nMemFree:         1234 kB\n";
        assert_eq!(mem_total(text), Some(131_912_260 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots kB\n"), None);
        assert_eq!(mem_total("MemTotal: 5 MB\n"), None);
    }
}
