#!/usr/bin/env python3
"""How fast can any schedule stream a decode-sized KV cache from HBM (issue 17's 2.9 TB/s bar)?

A read-only kernel with decode's memory side and nothing else: one thread per CTA streams
fixed-size chunks into a ring of STAGES shared-memory slots with TMA bulk copies
(cp.async.bulk, completion counted in bytes on an mbarrier per slot), and waits for each. The
chunks go to the CTAs either statically (CTA c takes chunks [c n / N, (c + 1) n / N), as
decode-cluster's fixed splits do) or dynamically (each CTA claims its next chunk from a global
counter STAGES chunks ahead, so an SM that streams slowly takes fewer). Printed per (bytes,
schedule, CTAs, chunk size, stages): the median time of a CUDA graph of back-to-back calls over
rotating buffers (cold L2) and the effective bandwidth. decode_floors.py's grid-stride `__ldg`
read reached 2.89 TB/s on 134 MB only with 1056 CTAs; B 64 decode reads 1.07 GB at 3.07 TB/s.

    python3 scripts/decode_hbm_floor.py [--mb 134,17] [--ctas 64,128]   (CTAs: default SMs - 4, SMs, 2 x SMs)
"""
import sys

cp = None  # cupy, imported by main(): the source below compiles without a GPU (python/kernel_tests)

# The stages of the ring are a compile-time constant (-DSTAGES=n): `live` is an array per slot.
SRC = r'''
extern "C" __global__ void stream_read(const char* __restrict__ p, long long n_chunks, int chunk_bytes,
                                       int dynamic, unsigned* counter, unsigned* sink) {
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ __align__(8) unsigned long long bars[STAGES];
    if (threadIdx.x != 0) return;
    const unsigned N = gridDim.x;
    long long next_static = (long long)blockIdx.x * n_chunks / N;
    const long long end_static = (long long)(blockIdx.x + 1) * n_chunks / N;
    // The next chunk of this CTA, or -1: static ranges, or claims (every CTA's last claim fails;
    // the one that draws n_chunks + N - 1 is the launch's last and resets the counter).
    // A CTA stops claiming at its first failed claim, so that every CTA fails exactly once.
    bool exhausted = false;
    auto next_chunk = [&]() -> long long {
        if (!dynamic) return next_static < end_static ? next_static++ : -1;
        if (exhausted) return -1;
        const unsigned c = atomicAdd(counter, 1u);
        if (c == (unsigned)(n_chunks + N - 1)) atomicExch(counter, 0u);
        exhausted = c >= n_chunks;
        return exhausted ? -1 : (long long)c;
    };
    const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);
    const unsigned bar_s = (unsigned)__cvta_generic_to_shared(bars);
    for (int s = 0; s < STAGES; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_s + 8 * s));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    auto issue = [&](int s, long long c) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_s + 8 * s), "r"(chunk_bytes) : "memory");
        const char* src = p + c * (long long)chunk_bytes;
        for (int off = 0; off < chunk_bytes; off += 16384) {
            const int bytes = min(16384, chunk_bytes - off);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(ring_s + s * chunk_bytes + off), "l"(src + off), "r"(bytes), "r"(bar_s + 8 * s) : "memory");
        }
    };
    long long live[STAGES];
    for (int s = 0; s < STAGES; ++s) {
        live[s] = next_chunk();
        if (live[s] >= 0) issue(s, live[s]);
    }
    unsigned acc = 0;
    for (long long i = 0;; ++i) {
        const int s = (int)(i % STAGES);
        if (live[s] < 0) break;  // chunks are claimed in slot order: the first empty slot ends it
        const unsigned phase = (unsigned)((i / STAGES) & 1);
        unsigned done = 0;
        while (!done) {
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(bar_s + 8 * s), "r"(phase) : "memory");
        }
        acc ^= *reinterpret_cast<volatile unsigned*>(ring + s * chunk_bytes);
        live[s] = next_chunk();
        if (live[s] >= 0) issue(s, live[s]);
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}
'''
_mods = {}


def kernel(stages):
    if stages not in _mods:
        _mods[stages] = cp.RawModule(code=SRC, options=("-std=c++17", f"-DSTAGES={stages}")).get_function("stream_read")
    return _mods[stages]


def main():
    global cp
    import cupy
    import decode_cold as DC  # its CUDA-graph timer: the decode kernels' cold figures are timed the same way
    cp = cupy
    DC.init()
    mbs = [int(x) for x in sys.argv[sys.argv.index("--mb") + 1].split(",")] if "--mb" in sys.argv else [134, 17]
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grids = [int(x) for x in sys.argv[sys.argv.index("--ctas") + 1].split(",")] if "--ctas" in sys.argv else [sms - 4, sms, 2 * sms]
    counter = cp.zeros(1, dtype=cp.uint32)
    sink = cp.zeros(1, dtype=cp.uint32)
    rows = []
    for mb in mbs:
        nbuf = max(2, min(12, 150 // mb))
        for chunk_kb in (32, 64, 16):
            chunk = chunk_kb * 1024
            n = mb * 1000000 // chunk
            bytes_read = n * chunk
            bufs = [cp.ones(bytes_read // 4, dtype=cp.uint32) for _ in range(nbuf)]
            for stages in (3, 4, 6):
                k = kernel(stages)
                smem = stages * chunk
                if smem > 227 * 1024:
                    continue
                k.max_dynamic_shared_size_bytes = smem
                for dynamic in (0, 1):
                    for ctas in grids:
                        if ctas > sms and smem > 113 * 1024:
                            continue
                        us = DC.graph_us(lambda r: k((ctas,), (32,), (bufs[r % nbuf], cp.int64(n), cp.int32(chunk), cp.int32(dynamic), counter, sink),
                                                     shared_mem=smem), reps=2 * nbuf, samples=25)
                        assert int(counter.get()[0]) == 0, "the claim counter was not reset"
                        tbs = bytes_read / us / 1e6
                        rows.append((mb, tbs, us, "dynamic" if dynamic else "static", ctas, chunk_kb, stages))
                        print(f"{mb:4} MB  {'dynamic' if dynamic else 'static ':7}  {ctas:4} CTAs  chunk {chunk_kb:3} KB  {stages} stages  "
                              f"{us:8.2f} us  {tbs:5.2f} TB/s", flush=True)
            del bufs
    print("\nbest per size and schedule:")
    for mb in mbs:
        for sched in ("static", "dynamic"):
            for ctas in grids:
                sel = [r for r in rows if r[0] == mb and r[3] == sched and r[4] == ctas]
                if sel:
                    b = max(sel)
                    print(f"  {mb:4} MB {sched:7} {ctas:4} CTAs: {b[1]:5.2f} TB/s ({b[2]:.2f} us; chunk {b[5]} KB, {b[6]} stages)")


if __name__ == "__main__":
    main()
