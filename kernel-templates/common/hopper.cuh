/******************************************************************************
 * hopper.cuh: sm_90 building blocks for warp-specialized kernels.
 *
 *   optd_tensor_map           a CUtensorMap as passed by value
 *                             (`const __grid_constant__ optd_tensor_map`);
 *                             the worker encodes it (cuTensorMapEncodeTiled)
 *                             from the template's [[tensor_map]] declaration
 *   mbar_*                    mbarriers in shared memory (init, arrive,
 *                             expect_tx, parity wait)
 *   tma_load_5d()             cp.async.bulk.tensor.5d: one box global -> shared,
 *                             completing on an mbarrier (transaction bytes)
 *   tma_store_5d(), bulk_*    one box shared -> global in a bulk group; commit,
 *                             wait for its reads of shared memory or its end
 *   wgmma_fence/commit/wait   wgmma ordering (sm_90a)
 *   smem_desc_*()             wgmma shared-memory matrix descriptors for the
 *                             128-byte swizzle that the TMA writes
 *   reg_alloc/reg_dealloc     setmaxnreg (sm_90a)
 *   named_bar_sync/arrive     bar.sync / bar.arrive with an id and a count
 *   fence_proxy_async_smem()  orders this thread's shared-memory accesses
 *                             before later TMA (async proxy) writes there
 *
 * Tensor-map geometry (the daemon's convention, TensorMap::geometry in
 * src/spec/protocol.rs): a tensor of B x heads x rows x D 2-byte elements with
 * any (batch, head, row) strides ([B,H,S,D], [B,S,H,D], padded views), swizzle
 * W bytes, P = W / 2: rank 5, dims {P, rows, D / P, heads, B} (Q, O: HQ heads
 * of SQ rows; K, V: HKV heads of SK rows), byte strides {row, 2 P, head,
 * batch}; a box {P, box rows, D / P, 1, 1} at coordinates (0, row, 0, head, b)
 * lands in shared memory as D / P panels of `box rows` rows of W bytes, rows
 * past the head's last zero-filled. With W = 128, 16-byte chunk c of row r of a
 * panel sits at chunk c ^ (r % 8), relative to a 1024-byte aligned panel base:
 * exactly wgmma's 128-byte swizzle mode.
 ******************************************************************************/
#ifndef OPTD_HOPPER_CUH
#define OPTD_HOPPER_CUH

struct __align__(64) optd_tensor_map {
    unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// --- mbarriers ---------------------------------------------------------------
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Make the initialised barriers visible to the async proxy (TMA) as well.
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive and announce `bytes` of TMA transactions for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Wait until the phase with parity `parity` has completed. A fresh barrier is
// in phase 0, so waiting on parity 1 returns at once (the producer's first pass
// over its empty slots relies on that). The try-wait carries a suspend-time hint
// (OPTD_MBAR_SUSPEND_NS, 10 ms, the value of CUTLASS's ClusterBarrier::wait and of
// FA4's SASS): ptxas then puts a NANOSLEEP.SYNCS, woken by the barrier's update, in
// the retry path instead of re-polling, so a warp that waits long (the producer
// for a free slot, while the consumers compute on the same sub-partitions) takes
// fewer of their issue slots. It bounds one sleep, not the wait.
#ifndef OPTD_MBAR_SUSPEND_NS
#define OPTD_MBAR_SUSPEND_NS 0x989680
#endif
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity), "r"(OPTD_MBAR_SUSPEND_NS)
        : "memory");
}

// --- TMA ---------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_map(const optd_tensor_map* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
// Box at coordinates (c0, c1, c2, c3, c4) (innermost first; the convention
// above: (0, row, 0, head, b)) -> shared `dst`.
__device__ __forceinline__ void tma_load_5d(unsigned dst, const optd_tensor_map* map, unsigned bar, int c0, int c1,
                                            int c2, int c3, int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}

// Shared `src` -> the box at (c0, .., c4) of the map's tensor (a TMA store: elements
// past the tensor's bounds are not written), in this thread's current bulk group.
__device__ __forceinline__ void tma_store_5d(const optd_tensor_map* map, unsigned src, int c0, int c1, int c2,
                                             int c3, int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group"
        " [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(reinterpret_cast<unsigned long long>(map)),
        "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's bulk groups still read their shared source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until at most N of this thread's bulk groups are incomplete (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// This thread's shared-memory accesses (generic proxy) ordered before later TMA
// (async proxy) accesses of the same bytes: a TMA load overwriting what it read,
// a TMA store reading what it wrote.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// --- wgmma ordering ----------------------------------------------------------
// Before the first wgmma of a batch: registers written by ordinary
// instructions (accumulators, A fragments) become visible to it.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The compiler does not know that a wgmma writes its accumulators
// asynchronously: tie every register of `d` to this point so that no read is
// moved above the wait that precedes it (and no write below the issue).
template <int R>
__device__ __forceinline__ void reg_fence(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// --- shared-memory matrix descriptors (128- or 64-byte swizzle) -------------
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride
// byte offset >> 4, 62-63 layout (1 = 128-byte swizzle, 2 = 64-byte). Start
// addresses inside a swizzle atom (k-steps of 32 bytes) are plain byte offsets:
// the hardware applies the XOR on the final address bits. SW is the swizzle
// width in bytes, i.e. one panel row: 64 columns of 2-byte elements at 128, 32
// at 64 (head dim 96, which is no multiple of 64); an atom is 8 such rows.
template <int SW = 128>
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    static_assert(SW == 128 || SW == 64, "smem_desc: 128- or 64-byte swizzle");
    constexpr unsigned long long layout = SW == 128 ? 1ull : 2ull;
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (layout << 62);
}
// K-major tile (rows of SW bytes, 8-row atoms of 8 SW bytes); LBO unused.
template <int SW = 128>
__device__ __forceinline__ unsigned long long smem_desc_kmajor(unsigned addr) { return smem_desc<SW>(addr, 16, 8 * SW); }
// MN-major tile: N in panels of SW / 2 elements `panel_bytes` apart, K rows of SW
// bytes in 8-row atoms of 8 SW bytes.
template <int SW = 128>
__device__ __forceinline__ unsigned long long smem_desc_mnmajor(unsigned addr, unsigned panel_bytes) {
    return smem_desc<SW>(addr, panel_bytes, 8 * SW);
}
// The descriptor of the same tile `bytes` further on: one 64-bit add of a
// constant instead of rebuilding the descriptor (the start-address field
// cannot carry out: shared-memory addresses are below 2^18).
__device__ __forceinline__ unsigned long long desc_advance(unsigned long long desc, unsigned bytes) {
    return desc + (bytes >> 4);
}

// --- registers and named barriers --------------------------------------------
template <int N>
__device__ __forceinline__ void reg_alloc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void reg_dealloc() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif  // OPTD_HOPPER_CUH
