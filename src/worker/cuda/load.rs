//! Compiling and loading a candidate: its one build (CTA counting compiled in, checked and
//! timed), the look-ahead's builds asked for by `Precompile` (compiled by the worker's
//! [`CompilePool`], soonest needed first) and taken by a later `Load` of the same source,
//! and loading the cubin with its kernels' resources and the occupancy queries answered.

use std::time::{Duration, Instant};

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::nvrtc::Ptx;

use super::device::occupancy_of;
use super::error::{after, api, compile_failure, Failure, Stage};
use super::kernels::{Build, Candidate};
use super::CudaBackend;
use crate::nvrtc::{self, CompileFailure, Compiled, Toolchain};
use crate::spec::protocol::{BuildAsk, BuildScope, KernelResources, Loaded, OccupancyQuery, OccupancyResult, Response, PRECOMPILE_SLOTS};
use crate::worker::compile_pool::{auto_threads, CompilePool, Work};

/// The macro that compiles CTA counting in (counting when the launch passes a counter).
pub const COUNT_CTAS_DEFINE: &str = "OPTD_COUNT_CTAS";

/// The one build of a source (checked and timed: see [`compile_build`]), and how long
/// compiling it took.
pub(super) type Builds = (Result<Compiled, CompileFailure>, f64);

/// How many successful builds the worker keeps after loading them.
const MAX_CACHED: usize = 8;

/// The builds of the last few sources loaded, newest last: a `Load` of a source loaded
/// moments ago (the re-rank loads a kernel once per shape it contends for, under one id per
/// shape) takes its cubin instead of compiling it again. Bounded; a source
/// used again moves to the back.
pub(super) struct BuildCache<T> {
    entries: Vec<(String, T)>,
    cap: usize,
}

impl<T: Clone> BuildCache<T> {
    pub(super) fn new(cap: usize) -> Self {
        BuildCache { entries: Vec::new(), cap }
    }

    pub(super) fn get(&mut self, key: &str) -> Option<T> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        let entry = self.entries.remove(i);
        let value = entry.1.clone();
        self.entries.push(entry);
        Some(value)
    }

    pub(super) fn put(&mut self, key: String, value: T) {
        self.entries.retain(|(k, _)| *k != key);
        if self.cap == 0 {
            return;
        }
        if self.entries.len() >= self.cap {
            self.entries.remove(0);
        }
        self.entries.push((key, value));
    }
}

impl Default for BuildCache<Compiled> {
    fn default() -> Self {
        BuildCache::new(MAX_CACHED)
    }
}

/// Compile `source`'s one build, holding what `scope` says (its head dims' kernels only,
/// empty: all; the window's code or not), with CTA counting compiled in
/// (`-DOPTD_COUNT_CTAS=1`): its kernels count into `cta_counter` when it is not null, so the
/// check (a zeroed counter) and the timing (null) run the same binary. Until 2026-11-30 a
/// second build with the define was checked while the first was timed: twice the NVRTC time
/// per candidate (2.7-6 s for a Hopper one on the H200's host, against 0.1-0.9 s for its
/// check and timing: the search waited on the compiler), and the binary checked was not the
/// one timed.
fn compile_build(tc: &Toolchain, source: &str, name: &str, arch: &str, scope: &BuildScope, timeout: Option<Duration>) -> Builds {
    let started = Instant::now();
    let mut defines = scope.defines();
    defines.push((COUNT_CTAS_DEFINE, "1".to_string()));
    let build = nvrtc::compile_with_timeout(tc, source, name, arch, &defines, timeout);
    (build, started.elapsed().as_secs_f64() * 1e3)
}

/// What a build is keyed by: the same source built for another scope is another build.
fn pending_key(arch: &str, scope: &BuildScope, source: &str) -> String {
    format!("{arch} {:?} windows {}\n{source}", scope.head_dims, scope.windows)
}

impl CudaBackend {
    /// The builds the engine expects to load next, soonest first: the pool compiles them in
    /// that order on `threads` threads (0: a quarter of the host's cores, 2 to 8; the pool
    /// is made on the first ask and only grows), dropping the last list's unstarted builds.
    pub(super) fn precompile(&mut self, builds: Vec<BuildAsk>, threads: u32, windows: bool, compile_timeout_ms: u64) {
        let threads = match threads {
            0 => auto_threads(std::thread::available_parallelism().map_or(8, |n| n.get())),
            n => n as usize,
        };
        let pool = self.pool.get_or_insert_with(|| CompilePool::new(threads, PRECOMPILE_SLOTS));
        pool.grow(threads);
        let timeout = (compile_timeout_ms > 0).then(|| Duration::from_millis(compile_timeout_ms));
        let asks: Vec<(String, Work<Builds>)> = builds
            .into_iter()
            .map(|BuildAsk { source, arch, head_dims }| {
                let scope = BuildScope { head_dims, windows };
                let key = pending_key(&arch, &scope, &source);
                let tc = self.toolchain.clone();
                let work: Work<Builds> = Box::new(move || compile_build(&tc, &source, "candidate.cu", &arch, &scope, timeout));
                (key, work)
            })
            .collect();
        let fresh = pool.expect(asks);
        tracing::debug!(asked = fresh.len(), new = fresh.iter().filter(|&&f| f).count(), threads = pool.threads(), "precompile");
    }

    /// Compile (or take the pending build of) `source`, load it under `id`,
    /// and report the kernels' resources and the occupancy queries' answers.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load(
        &mut self,
        id: String,
        source: &str,
        arch: &str,
        scope: &BuildScope,
        kernels: &[String],
        occupancy: &[OccupancyQuery],
        compile_timeout_ms: u64,
    ) -> Result<Response, Failure> {
        let timeout = (compile_timeout_ms > 0).then(|| Duration::from_millis(compile_timeout_ms));
        let name = format!("{}.cu", id.replace(['\0', '/'], "_"));
        // A source loaded moments ago: its cubins. One asked for ahead: the pool's build
        // (usually done; still queued, compiled here at once) instead of compiling again.
        let key = pending_key(arch, scope, source);
        let waited = Instant::now();
        let mut ahead = false;
        let (build, compile_ms) = match self.built.get(&key) {
            Some(build) => (Ok(build), 0.0),
            None => {
                match self.pool.as_ref().and_then(|p| p.take(&key)) {
                    Some(taken) => {
                        ahead = taken.ahead;
                        taken.value
                    }
                    None => compile_build(&self.toolchain, source, &name, arch, scope, timeout),
                }
            }
        };
        let build = build.map_err(|e| compile_failure(e, "", compile_timeout_ms))?;
        // `waited_ms`: how long this load waited for the compiler (a build the look-ahead
        // started and finished in time: ~0).
        let waited_ms = waited.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(%id, compile_ms, ahead, waited_ms, bytes = build.cubin.len(), "compiled");
        self.built.put(key, build.clone());

        let Compiled { cubin, log, .. } = build;
        let module = api(self.ctx.load_module(Ptx::from_binary(cubin)), || "load: loading the CUBIN".into())?;
        let mut cand = Candidate { build: Build::new(module) };

        let mut resources = Vec::with_capacity(kernels.len());
        for k in kernels {
            let missing = || {
                Failure::Compile(format!(
                    "kernel `{k}` not found in the build (built for head dims {}): the source must define \
                     it as extern \"C\" __global__ void {k}(...) (without C++ name mangling), under \
                     `#if OPTD_BUILD_D<d>` for its head dim{}{log}",
                    if scope.head_dims.is_empty() { "all".to_string() } else { format!("{:?}", scope.head_dims) },
                    if log.is_empty() { "" } else { "\n" }
                ))
            };
            let f = api(cand.build.function(k), || {
                format!("load: resolving kernel {k}")
            })?
            .ok_or_else(missing)?;
            let attr = |a: CUfunction_attribute| {
                api(f.get_attribute(a), || {
                    format!("load: reading attributes of {k}")
                })
                .map(|v| v.max(0) as u32)
            };
            resources.push(KernelResources {
                kernel: k.clone(),
                registers: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
                static_smem: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
                local_bytes: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
                max_threads: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            });
        }

        let mut occ = Vec::with_capacity(occupancy.len());
        for q in occupancy {
            let f = api(cand.build.function(&q.kernel), || {
                format!("load: resolving kernel {}", q.kernel)
            })?
            .ok_or_else(|| {
                Failure::Bad(format!(
                    "occupancy query names kernel `{}`, which the module does not define",
                    q.kernel
                ))
            })?;
            let blocks = occupancy_of(&mut cand.build, &f, q).map_err(|e| {
                Failure::cuda(
                    format!(
                        "load: occupancy of {} ({} threads, {} B smem)",
                        q.kernel, q.block_threads, q.dyn_smem
                    ),
                    e,
                    Stage::Api,
                )
            })?;
            occ.push(OccupancyResult {
                kernel: q.kernel.clone(),
                block_threads: q.block_threads,
                dyn_smem: q.dyn_smem,
                blocks_per_sm: blocks,
            });
        }

        if self.candidates.contains_key(&id) {
            // Replacing a loaded candidate: none of its kernels may still be running.
            after(self.stream.synchronize(), || {
                format!("load {id}: replacing the loaded candidate")
            })?;
        }
        self.candidates.insert(id, cand);
        Ok(Response::Loaded(Loaded {
            compile_ms,
            waited_ms,
            kernels: resources,
            occupancy: occ,
            log,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::BuildCache;

    #[test]
    fn the_build_cache_keeps_the_last_few_and_moves_a_reused_one_back() {
        let mut c = BuildCache::new(2);
        c.put("a".into(), 1);
        c.put("b".into(), 2);
        assert_eq!(c.get("a"), Some(1), "a is now the newest");
        c.put("c".into(), 3);
        assert_eq!((c.get("b"), c.get("a"), c.get("c")), (None, Some(1), Some(3)), "b, the oldest, went");
        c.put("a".into(), 4);
        assert_eq!(c.get("a"), Some(4), "a key put again holds the new value once");
        assert_eq!(c.entries.len(), 2);
        let mut off = BuildCache::new(0);
        off.put("a".into(), 1);
        assert_eq!(off.get("a"), None);
    }
}
