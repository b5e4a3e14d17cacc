/******************************************************************************
 * memory: the kv-split kernel on the CUDA cores, with its data movement
 * tuned: 16-byte vectorized loads, a cp.async K/V ring, a swizzled K tile.
 *
 * The computation is kv-split's (kv_split.cu), unchanged, so that this
 * template measures what the memory techniques buy and nothing else:
 *
 *   - one CTA per (query block of BLOCK_M rows, b * HQ + h, KV split z);
 *     NUM_WARPS warps, each owning R = BLOCK_M / NUM_WARPS consecutive rows;
 *     keys and values of KV head optd_kv_head(h) (grouped-query attention:
 *     the G = HQ / HKV query heads of one KV head are neighbours in gridDim.y
 *     and re-read its tiles from L2);
 *   - keys in tiles of 32, split z covering tiles [z * tps, (z + 1) * tps)
 *     with tps = cdiv(cdiv(SK, 32), n_splits);
 *   - Q staged once per CTA in shared memory as fp32, pre-multiplied by
 *     softmax_scale * log2(e) so that scores are in the log2 domain and the
 *     softmax uses exp2f;
 *   - scores lane-per-key: lane j computes q_r . k_j for the warp's R rows,
 *     q read as fp32 broadcasts, k_j as 16-byte chunks of the K tile;
 *   - masking (key >= SK, row >= SQ, causal key > row + SK - SQ, the
 *     bottom-right diagonal: common/mask.cuh's KeyMask), one
 *     warp-shuffle row max per row per tile, p = exp2(s - m), the accumulator
 *     rescaled once per tile, a per-lane partial row sum reduced once at the
 *     end (common/online_softmax.cuh, exp2f);
 *   - O += P V with lane l owning dims 2l + 64i, 2l + 64i + 1 (D / 32 dims),
 *     p_j broadcast from lane j by __shfl_sync;
 *   - n_splits > 1: each split writes its normalized O_z and natural-log LSE
 *     to the fp32 partial buffers, and the combine kernel merges them:
 *       lse = log(sum_z exp(lse_z)),   O = sum_z exp(lse_z - lse) * O_z
 *     (o_partial[z][b][h][i][:], lse_partial[z][b][h][i], contiguous, see
 *     common/split_combine.cuh; a split with no unmasked key for a row writes
 *     lse = -inf, O = 0, and gets weight 0). With n_splits == 1 the forward
 *     kernel writes O and combine is skipped.
 * Causal: key tiles wholly above the CTA's last row (keys > last row + SK -
 * SQ) are not loaded, a warp skips the math (never the barriers) of tiles
 * wholly above its own rows, and the diagonal tile is masked per element.
 * Window W (causal only), as kv-split: a block's key range starts at its first
 * row's first key (keys_from), so it loads at most W + BLOCK_M - 1 keys plus
 * alignment, and the splits divide that range; a warp skips the math of tiles
 * left of its rows' windows, and sees() masks the left edge per element.
 *
 * Addressing (kernel ABI v2): every global row goes through the strides
 * (either layout, padded views); only the shared-memory tiles are dense.
 * Each thread copies the same column granule (16 bytes, or one element with
 * VEC_LOADS = CP_ASYNC = 0) of key rows kj, kj + RPI, ... of every K/V tile:
 * the KV head's base pointers (warp-uniform) and the thread's offset to its
 * granule of row kj are computed once per CTA, and a copy adds the uniform
 * (kv0 + i * RPI) row strides: no per-copy offsets stay live across the key
 * loop. b and h are re-derived from blockIdx for the epilogue rather than
 * kept live through it.
 *
 * What this template changes, each behind a knob:
 *
 * VEC_LOADS  1: global loads of Q (and of K, V when CP_ASYNC = 0) are 16-byte
 *            uint4 loads, 8 elements per thread per load, consecutive threads
 *            on consecutive 16-byte chunks of a row (a warp reads 512
 *            contiguous bytes); the K/V loads of a tile, and a thread's Q
 *            loads, are all issued before the first shared-memory store.
 *            0: one 2-byte element per thread per load (a warp reads 64
 *            contiguous bytes), the naive form.
 *            With CP_ASYNC = 1 the K/V copies are 16-byte cp.async whatever
 *            VEC_LOADS says; only the Q load then depends on it.
 * CP_ASYNC   1: K and V tiles go global -> shared with cp.async.cg 16-byte
 *            copies into a ring of STAGES tiles. The prologue puts tiles
 *            0 .. STAGES - 2 of the split in flight (one commit group each),
 *            then Q is loaded (its global loads overlap those copies). Tile i
 *            of the loop: cp.async.wait_group(STAGES - 2) (tile i has landed,
 *            for this thread's copies), __syncthreads (for everyone's; and
 *            nobody still reads slot (i - 1) % STAGES), issue tile
 *            i + STAGES - 1 into that slot, commit (an empty group past the
 *            end keeps the count uniform), compute on slot i % STAGES. One
 *            barrier per tile; the copies of the next STAGES - 1 tiles run
 *            under this tile's math. Keys >= SK are zero-filled by the
 *            src-size-0 form of cp.async (nothing is read) and masked.
 *            0: synchronous loads into a single K/V buffer, two barriers per
 *            tile (as kv-split); STAGES is then unused.
 * STAGES     ring depth with CP_ASYNC = 1: 2 (double) or 3 (triple buffering).
 * SWIZZLE    1: 16-byte chunk c of key j of the K tile is stored at chunk
 *            c ^ (j % 8) of row j (rows of 2 * D bytes). In the score loop
 *            the lanes of a quarter warp (8 consecutive keys, one LDS.128
 *            phase) read the same logical chunk, which lands in 8 distinct
 *            16-byte bank groups.
 *            0: K rows padded to 2 * D + 16 bytes, which spreads the same
 *            reads over the bank groups by the row stride instead.
 *            V needs neither: in P V the lanes read consecutive 4-byte words
 *            of one row, so the V tile is plain row-major, 2 * D bytes a row.
 * Always on: exp2f on log2-domain scores, warp-shuffle max / sum reductions.
 *
 * Knobs:   BLOCK_M     query rows per CTA                      16, 32, 64
 *          NUM_WARPS   warps per CTA (R = BLOCK_M / NUM_WARPS)  4, 8
 *          MAX_SPLITS  cap on n_splits (launch formulas only)   1, 4, 8, 16
 *          VEC_LOADS   16-byte global loads / 2-byte loads       1, 0
 *          CP_ASYNC    cp.async ring / synchronous loads         1, 0
 *          STAGES      ring depth (CP_ASYNC = 1 only)            2, 3
 *          SWIZZLE     XOR-swizzled K tile / padded K rows       1, 0
 * Shared (dynamic, bytes; Layout<D>::TOTAL, checked against the spec's smem
 * formula at compile time by OPTD_CHECK_SMEM), with ring = CP_ASYNC ? STAGES : 1:
 *          4 * BLOCK_M * D                          Q, fp32
 *        + ring * 32 * (2 * D + 16 * (1 - SWIZZLE)) K tiles
 *        + ring * 32 * 2 * D                        V tiles
 *          from 12 KiB (BLOCK_M 16, D 64, one buffer, swizzled) to 81.5 KiB
 *          (BLOCK_M 64, D 128, 3 stages, padded): every combination fits
 *          the 99 KiB opt-in of sm_86 / sm_89 (the worker opts in above
 *          48 KiB). D 256: from 48 KiB (BLOCK_M 16, one buffer, swizzled) to
 *          161.5 KiB (BLOCK_M 64, 3 stages, padded: 64 + 49.5 + 48), e.g.
 *          80 KiB at the defaults (BLOCK_M 16, 2 stages, swizzled); all fit
 *          sm_80's 163 KiB and sm_90's 227 KiB, and the gate refuses those
 *          over 99 KiB on sm_86 / sm_89 (3 stages, and BLOCK_M 64 with 2).
 * CTAs:    fwd      cdiv(SQ, BLOCK_M) x (B * HQ) x n_splits, NUM_WARPS * 32
 *                   threads (B * HQ <= 65535)
 *          combine  cdiv(B * HQ * SQ, 4) x 1 x 1, 128 threads (one warp per
 *                   output row), only when n_splits > 1
 * n_splits: as kv-split: 1 when B * HQ * cdiv(SQ, BLOCK_M) already fills 80%
 *          of the SMs, else min(MAX_SPLITS, cdiv(SMS, that), cdiv(SK, 32)),
 *          then lowered to the smallest count with the same tiles per split,
 *          so that without causal masking no split is left without a tile.
 *          Windowed: the splits divide each block's own range (kv-split).
 * Registers: R * (D / 32 + 3) fp32 per thread plus a K chunk and addressing
 *          (two 64-bit K/V row offsets per thread); __launch_bounds__(threads,
 *          1), as kv-split, so that ptxas keeps the accumulators of BLOCK_M
 *          64 / 4 warps in registers, except D 64 at 128 threads: 3 CTAs per
 *          SM, at most 168 registers (see the kernels at the end).
 *          D 256 (sm_90): R = 2 / 4 / 8 rows take 90-128 / 120-168 /
 *          172-219 registers, no spills; R = 16 (BLOCK_M 64, 4 warps: 128
 *          fp32 of accumulators alone) reaches 254-255, and its swizzled
 *          builds spill (24-400 bytes of spill traffic, most with CP_ASYNC).
 * Head dims: 64, 128, 256 (D a multiple of 64: lanes own pairs of dims, 64
 *          dims per step, and the K swizzle permutes 8 of the D / 8 chunks).
 *          Not 96. D 256 is Gemma 2/3's; there, one-element copies (VEC_LOADS
 *          = CP_ASYNC = 0) with 128 threads copy two elements of each key row
 *          per thread (KvCopy::COLS), a row having 256 of them.
 * Window:  the block's key range starts at its first row's first key and the
 *          splits divide that range (about W + BLOCK_M keys, whatever SK);
 *          left-edge masking is sees()'s third compare, per element.
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "memory"
description = "kv-split on the CUDA cores with its data movement tuned: 16-byte vectorized loads, cp.async K/V ring (2-3 stages), XOR-swizzled or padded K tile"
min_cc = 80
head_dims = [64, 128, 256]
windows = true

[knobs]
BLOCK_M = [16, 32, 64]
NUM_WARPS = [4, 8]
MAX_SPLITS = [1, 4, 8, 16]
VEC_LOADS = [1, 0]
CP_ASYNC = [1, 0]
STAGES = [2, 3]
SWIZZLE = [1, 0]

[derived]
m_blocks = "cdiv(SQ, BLOCK_M)"
# Key tiles a split range spans: [0, SK), or windowed at most W + BLOCK_M - 1 keys (+1 tile
# for the alignment), the range the kernel's splits divide (as kv-split).
kv_tiles = "cdiv(SK, 32) if WINDOW == 0 else min(cdiv(SK, 32), cdiv(WINDOW + BLOCK_M - 1, 32) + 1)"
base_ctas = "B * HQ * m_blocks"
want_splits = "1 if 5 * base_ctas >= 4 * SMS else max(1, min(MAX_SPLITS, cdiv(SMS, base_ctas), kv_tiles))"
tiles_per_split = "cdiv(kv_tiles, want_splits)"
splits = "cdiv(kv_tiles, tiles_per_split)"
ring = "1 + (STAGES - 1) * CP_ASYNC"
k_row_bytes = "ELEM_BYTES * D + 16 * (1 - SWIZZLE)"
smem_bytes = "4 * BLOCK_M * D + ring * 32 * (k_row_bytes + ELEM_BYTES * D)"

[[launch]]
kernel = "fwd"
grid = ["m_blocks", "B * HQ", "splits"]
block = ["NUM_WARPS * 32", "1", "1"]
smem = "smem_bytes"

[[launch]]
kernel = "combine"
when = "splits > 1"
grid = ["cdiv(B * HQ * SQ, 4)", "1", "1"]
block = ["128", "1", "1"]
smem = "0"
*/

#include "common/optd.cuh"

#include "common/async_copy.cuh"
#include "common/online_softmax.cuh"
#include "common/mask.cuh"
#include "common/split_combine.cuh"

#ifndef BLOCK_M
#error "BLOCK_M must be defined"
#endif
#ifndef NUM_WARPS
#error "NUM_WARPS must be defined"
#endif
#ifndef VEC_LOADS
#error "VEC_LOADS must be defined"
#endif
#ifndef CP_ASYNC
#error "CP_ASYNC must be defined"
#endif
#ifndef STAGES
#error "STAGES must be defined"
#endif
#ifndef SWIZZLE
#error "SWIZZLE must be defined"
#endif
#if BLOCK_M % NUM_WARPS != 0 || BLOCK_M < NUM_WARPS
#error "BLOCK_M must be a positive multiple of NUM_WARPS"
#endif
#if NUM_WARPS < 1 || NUM_WARPS > 8
#error "NUM_WARPS must be in 1..8 (K/V tile chunks must split evenly over the threads)"
#endif
#if (VEC_LOADS != 0 && VEC_LOADS != 1) || (CP_ASYNC != 0 && CP_ASYNC != 1) || (SWIZZLE != 0 && SWIZZLE != 1)
#error "VEC_LOADS, CP_ASYNC and SWIZZLE are 0 or 1"
#endif
#if STAGES < 2
#error "STAGES must be at least 2"
#endif

#define KV_TILE 32                         // keys per tile: one per lane
#define FWD_THREADS (NUM_WARPS * 32)
#define ROWS_PER_WARP (BLOCK_M / NUM_WARPS)
#define RING (CP_ASYNC ? STAGES : 1)       // K/V tiles resident in shared memory

// ---------------------------------------------------------------------------
// Shared-memory layout (bytes from the dynamic base, all multiples of 16):
//   [0, Q_BYTES)                         Q, fp32, BLOCK_M x D, row-major
//   [K_BASE, K_BASE + RING * K_TILE)     K tiles, 32 rows of K_ROW bytes
//   [V_BASE, V_BASE + RING * V_TILE)     V tiles, 32 rows of 2 * D bytes
// ---------------------------------------------------------------------------
template <int D>
struct Layout {
    static constexpr int CHUNKS = D / 8;                          // 16-byte chunks per K/V row
    static constexpr int K_ROW = 2 * D + (SWIZZLE ? 0 : 16);      // bytes per K row
    static constexpr int V_ROW = 2 * D;                           // bytes per V row
    static constexpr int K_TILE = KV_TILE * K_ROW;
    static constexpr int V_TILE = KV_TILE * V_ROW;
    static constexpr int Q_BYTES = 4 * BLOCK_M * D;
    static constexpr int K_BASE = Q_BYTES;
    static constexpr int V_BASE = K_BASE + RING * K_TILE;
    static constexpr int TOTAL = V_BASE + RING * V_TILE;          // the spec's smem_bytes (checked)
};

// Byte offset of 16-byte chunk c of key j within a K tile.
template <int D>
__device__ __forceinline__ int k_off(int j, int c) {
    return j * Layout<D>::K_ROW + ((SWIZZLE ? (c ^ (j & 7)) : c) << 4);
}

// ---------------------------------------------------------------------------
// K/V tile loads: keys kv0 .. kv0 + 31 into K tile ks and V tile vs (byte
// pointers into shared memory); keys >= seq_k are zero-filled so that 0 * V
// is 0. The thread copies granule kc (GRANULE elements) of key rows
// kj + i * RPI of the KV head at kh / vh (warp-uniform pointers); koff / voff
// locate that granule of row kj (KvCopy<D>::offset, once per CTA) and k_s /
// v_s are the row strides, so a copy adds the uniform (kv0 + i * RPI) * k_s.
// ---------------------------------------------------------------------------
template <int D>
struct KvCopy {
    static constexpr int GRANULE = (CP_ASYNC || VEC_LOADS) ? 8 : 1;  // elements per copy
    static constexpr int PER_ROW = D / GRANULE;                      // copies per key row
    // Granules per thread per key row: 1, except one element at a time at D 256 with
    // 128 threads, where a row has 256 of them and a thread copies granules kc and
    // kc + FWD_THREADS of it.
    static constexpr int COLS = PER_ROW > FWD_THREADS ? PER_ROW / FWD_THREADS : 1;
    static constexpr int RPI = COLS > 1 ? 1 : FWD_THREADS / PER_ROW;  // key rows per step
    static constexpr int ITERS = KV_TILE / RPI;                      // steps per tile
    static_assert(FWD_THREADS * COLS % PER_ROW == 0 && KV_TILE % RPI == 0 && ITERS >= 1,
                  "K/V copies must split evenly over the threads");
    static_assert(COLS == 1 || GRANULE == 1, "several granules per row only for one-element copies");
    int kj, kc;  // this thread's first key row and granule
    __device__ __forceinline__ explicit KvCopy(int tid) : kj(tid / PER_ROW), kc(tid % PER_ROW) {}
    // Offset of the thread's granule of key row kj, rows `row_stride` apart.
    __device__ __forceinline__ long long offset(long long row_stride) const {
        return kj * row_stride + kc * GRANULE;
    }
};

#if CP_ASYNC
template <int D>
__device__ __forceinline__ void load_kv_tile(unsigned char* ks, unsigned char* vs, const elem_t* kh,
                                             const elem_t* vh, long long koff, long long voff, long long k_s,
                                             long long v_s, const KvCopy<D>& cp, int kv0, int seq_k) {
    using C = KvCopy<D>;
    const unsigned ks32 = smem_u32(ks), vs32 = smem_u32(vs);
#pragma unroll
    for (int i = 0; i < C::ITERS; ++i) {
        const int j = cp.kj + i * C::RPI;
        const bool ok = kv0 + j < seq_k;
        // Rows counted from row kj. An out-of-range key copies 0 bytes from a
        // valid address, the head's row 0 (row kj itself may lie past the tensor).
        const int src_row = ok ? kv0 + i * C::RPI : -cp.kj;
        cp_async16(ks32 + k_off<D>(j, cp.kc), kh + src_row * k_s + koff, ok);
        cp_async16(vs32 + j * Layout<D>::V_ROW + cp.kc * 16, vh + src_row * v_s + voff, ok);
    }
}
#elif VEC_LOADS
template <int D>
__device__ __forceinline__ void load_kv_tile(unsigned char* ks, unsigned char* vs, const elem_t* kh,
                                             const elem_t* vh, long long koff, long long voff, long long k_s,
                                             long long v_s, const KvCopy<D>& cp, int kv0, int seq_k) {
    using C = KvCopy<D>;
    uint4 kr[C::ITERS], vr[C::ITERS];
    // All global loads first, then the shared stores: ITERS * 2 loads in flight.
#pragma unroll
    for (int i = 0; i < C::ITERS; ++i) {
        kr[i] = make_uint4(0u, 0u, 0u, 0u);
        vr[i] = kr[i];
        if (kv0 + cp.kj + i * C::RPI < seq_k) {
            const int src_row = kv0 + i * C::RPI;
            kr[i] = *reinterpret_cast<const uint4*>(kh + src_row * k_s + koff);
            vr[i] = *reinterpret_cast<const uint4*>(vh + src_row * v_s + voff);
        }
    }
#pragma unroll
    for (int i = 0; i < C::ITERS; ++i) {
        const int j = cp.kj + i * C::RPI;
        *reinterpret_cast<uint4*>(ks + k_off<D>(j, cp.kc)) = kr[i];
        *reinterpret_cast<uint4*>(vs + j * Layout<D>::V_ROW + cp.kc * 16) = vr[i];
    }
}
#else
template <int D>
__device__ __forceinline__ void load_kv_tile(unsigned char* ks, unsigned char* vs, const elem_t* kh,
                                             const elem_t* vh, long long koff, long long voff, long long k_s,
                                             long long v_s, const KvCopy<D>& cp, int kv0, int seq_k) {
    using C = KvCopy<D>;
    const unsigned short* k16 = reinterpret_cast<const unsigned short*>(kh);
    const unsigned short* v16 = reinterpret_cast<const unsigned short*>(vh);
#pragma unroll 8
    for (int i = 0; i < C::ITERS; ++i) {
        const int j = cp.kj + i * C::RPI;
#pragma unroll
        for (int c = 0; c < C::COLS; ++c) {
            const int d = cp.kc + c * FWD_THREADS;  // one element per copy
            unsigned short kx = 0, vx = 0;
            if (kv0 + j < seq_k) {
                const int src_row = kv0 + i * C::RPI;
                kx = k16[src_row * k_s + koff + c * FWD_THREADS];
                vx = v16[src_row * v_s + voff + c * FWD_THREADS];
            }
            *reinterpret_cast<unsigned short*>(ks + k_off<D>(j, d >> 3) + 2 * (d & 7)) = kx;
            *reinterpret_cast<unsigned short*>(vs + j * Layout<D>::V_ROW + 2 * d) = vx;
        }
    }
}
#endif

// Q rows m0 .. m0 + BLOCK_M - 1 of the head at qh (rows q_s apart) -> fp32, times
// scale_log2; rows >= seq_q are zero.
template <int D>
__device__ __forceinline__ void load_q(float* q_s, const elem_t* qh, long long q_stride, int m0, int seq_q,
                                       float scale_log2, int tid) {
#if VEC_LOADS
    // The thread's chunks c = tid + i * FWD_THREADS are all loaded before the first is stored:
    // in a load-store loop the compiler kept each chunk's load behind the previous chunk's
    // shared store (q and q_s are both generic pointers), one global round trip per chunk.
    constexpr int CH = D / 8;
    constexpr int Q_CH = BLOCK_M * CH;
    constexpr int Q_ITERS = (Q_CH + FWD_THREADS - 1) / FWD_THREADS;  // 1 to 16
    constexpr bool Q_PARTIAL = Q_CH % FWD_THREADS != 0;  // BLOCK_M 16, D 64, 256 threads: half idle
    uint4 qv[Q_ITERS];
#pragma unroll
    for (int i = 0; i < Q_ITERS; ++i) {
        const int c = tid + i * FWD_THREADS;
        const int r = c / CH, cc = c % CH;
        qv[i] = make_uint4(0u, 0u, 0u, 0u);
        if ((!Q_PARTIAL || c < Q_CH) && m0 + r < seq_q)
            qv[i] = __ldg(reinterpret_cast<const uint4*>(qh + (m0 + r) * q_stride + cc * 8));
    }
#pragma unroll
    for (int i = 0; i < Q_ITERS; ++i) {
        const int c = tid + i * FWD_THREADS;
        if (Q_PARTIAL && c >= Q_CH) break;
        const int r = c / CH, cc = c % CH;
        float f[8];
        unpack8(qv[i], f);
        float4* dst = reinterpret_cast<float4*>(&q_s[r * D + cc * 8]);
        dst[0] = make_float4(f[0] * scale_log2, f[1] * scale_log2, f[2] * scale_log2, f[3] * scale_log2);
        dst[1] = make_float4(f[4] * scale_log2, f[5] * scale_log2, f[6] * scale_log2, f[7] * scale_log2);
    }
#else
#pragma unroll 4
    for (int e = tid; e < BLOCK_M * D; e += FWD_THREADS) {
        const int r = e / D, d = e % D;
        q_s[e] = m0 + r < seq_q ? to_f32(qh[(m0 + r) * q_stride + d]) * scale_log2 : 0.f;
    }
#endif
}

// ---------------------------------------------------------------------------
// Forward: one (query block, head, split) per CTA.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void memory_fwd(OPTD_ARGS) {
    using L = Layout<D>;
    OPTD_CHECK_SMEM(FWD, D, L::TOTAL);
    static_assert(D % 64 == 0, "lanes own pairs of dims, 64 dims per step");
    static_assert(sizeof(elem_t) == 2, "16-bit elements");
    static_assert(!SWIZZLE || L::CHUNKS >= 8, "the K swizzle permutes 8 chunks");
    constexpr int R = ROWS_PER_WARP;
    constexpr int CHUNKS = L::CHUNKS;  // 16-byte chunks per row of K, V (8, 16 or 32)
    constexpr int DP = D / 64;         // dim pairs per lane (1, 2 or 4)

    extern __shared__ __align__(16) unsigned char mem_smem[];
    float* q_s = reinterpret_cast<float*>(mem_smem);
    unsigned char* k_s = mem_smem + L::K_BASE;
    unsigned char* v_s = mem_smem + L::V_BASE;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int bh = blockIdx.y;  // b * HQ + h
    const int b = bh / heads_q, h = bh - b * heads_q;
    const int hkv = optd_kv_head(h, heads_q, heads_kv);
    const int split = blockIdx.z;
    const int m0 = blockIdx.x * BLOCK_M;
    const int row0 = m0 + warp * R;  // this warp's first row
    const long long k_stride = strides.k_s, v_stride = strides.v_s;
    const KvCopy<D> cp(tid);
    const elem_t* kh = k + optd_head_off(strides.k_b, strides.k_h, b, hkv);
    const elem_t* vh = v + optd_head_off(strides.v_b, strides.v_h, b, hkv);
    const long long koff = cp.offset(k_stride), voff = cp.offset(v_stride);

    // This split's key tiles (mask.cuh's split_tiles: [0, SK) divided, or a window's range);
    // under causal masking none past the block's last visible key.
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), optd_window(window));
    const KeyMask::TileRange tiles = mask.split_tiles(m0, BLOCK_M, KV_TILE, n_splits, split);
    const int t_begin = tiles.begin, t_end = tiles.end;
    const int n_local = t_end - t_begin;  // may be <= 0: nothing to do but write the empty result

#if CP_ASYNC
    // Prologue: the split's first STAGES - 1 tiles in flight, one group each.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_local)
            load_kv_tile<D>(k_s + s * L::K_TILE, v_s + s * L::V_TILE, kh, vh, koff, voff, k_stride, v_stride, cp,
                            (t_begin + s) * KV_TILE, seq_k);
        cp_async_commit();
    }
#endif
    // Q, once per CTA, while those copies are in flight; published by the loop's first barrier.
    if (n_local > 0)
        load_q<D>(q_s, q + optd_head_off(strides.q_b, strides.q_h, b, h), strides.q_s, m0, seq_q,
                  softmax_scale * OPTD_LOG2E, tid);

    // Scores are in the log2 domain (Q is pre-scaled), so the softmax's scale is 1;
    // l is this lane's share of the row sum.
    OnlineSoftmax<R, false, Exp2f> sm;
    sm.init();
    float acc[R][2 * DP];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int e = 0; e < 2 * DP; ++e) acc[r][e] = 0.f;
    }

    // This lane's key row in a K tile: chunk cc at k_lane ^ (cc << 4) when swizzled
    // (K_ROW is a multiple of 128, so row * K_ROW has no bits in 4..6 and the XOR
    // of (lane & 7) << 4 with cc << 4 is the chunk swizzle), k_lane + (cc << 4) when padded.
    const int k_lane = k_off<D>(lane, 0);

    for (int i = 0; i < n_local; ++i) {
        const int t = t_begin + i;
        const int kv0 = t * KV_TILE;
#if CP_ASYNC
        cp_async_wait<STAGES - 2>();  // tile i has landed (this thread's copies)
        __syncthreads();              // ... everyone's; slot (i - 1) % STAGES is free
        if (i + STAGES - 1 < n_local) {
            const int s = (i + STAGES - 1) % STAGES;
            load_kv_tile<D>(k_s + s * L::K_TILE, v_s + s * L::V_TILE, kh, vh, koff, voff, k_stride, v_stride, cp,
                            kv0 + (STAGES - 1) * KV_TILE, seq_k);
        }
        cp_async_commit();
        const int slot = i % STAGES;
#else
        __syncthreads();  // the previous tile is no longer being read
        load_kv_tile<D>(k_s, v_s, kh, vh, koff, voff, k_stride, v_stride, cp, kv0, seq_k);
        __syncthreads();  // K, V (and Q on the first tile) are visible
        const int slot = 0;
#endif
        const unsigned char* kt = k_s + slot * L::K_TILE;
        const unsigned char* vt = v_s + slot * L::V_TILE;

        // Warp-uniform skip: all rows past SQ, or the tile lies above them (causal) or
        // left of their windows (the range's first tile, rounded down from the block's).
        if (row0 >= seq_q || mask.above(kv0, row0 + R - 1) || mask.left_of(kv0 + KV_TILE, row0)) continue;

        // Scores, lane-per-key: s[r] = q_r . k_lane (log2 domain).
        float s[R];
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] = 0.f;
#pragma unroll
        for (int cc = 0; cc < CHUNKS; ++cc) {
            float kf[8];
            const int koff = SWIZZLE ? (k_lane ^ (cc << 4)) : (k_lane + (cc << 4));
            unpack8(*reinterpret_cast<const uint4*>(kt + koff), kf);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                // Same address in every lane: a broadcast, no bank conflict.
                const float4* qp = reinterpret_cast<const float4*>(&q_s[(warp * R + r) * D + cc * 8]);
                const float4 a = qp[0], b = qp[1];
                float x = s[r];
                x = fmaf(a.x, kf[0], x); x = fmaf(a.y, kf[1], x);
                x = fmaf(a.z, kf[2], x); x = fmaf(a.w, kf[3], x);
                x = fmaf(b.x, kf[4], x); x = fmaf(b.y, kf[5], x);
                x = fmaf(b.z, kf[6], x); x = fmaf(b.w, kf[7], x);
                s[r] = x;
            }
        }

        // Mask, then online softmax with one max reduction per row per tile.
        // Rows past SQ are masked whole (the warp's last rows of a ragged tile).
        const int key = kv0 + lane;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = row0 + r;
            if (row >= seq_q || !mask.sees(row, key)) s[r] = OPTD_NEG_INF;
            float mx = fmaxf(sm.m[r], warp_max(s[r])), bias, corr;
            bool moved;  // always, without the lazy max
            sm.rescale_row(r, mx, 1.f, bias, corr, moved);
            s[r] = sm.prob(s[r], r, 1.f, bias);
#pragma unroll
            for (int e = 0; e < 2 * DP; ++e) acc[r][e] *= corr;
        }

        // O += P V. Keys past SK, or (causal) past the last key the warp's last
        // row sees, have p = 0 for every row of the warp: stop before them.
        const int j_end = min(KV_TILE, mask.keys_before(row0 + R) - kv0);
        const elem2_t* v2 = reinterpret_cast<const elem2_t*>(vt);
#pragma unroll 4
        for (int j = 0; j < j_end; ++j) {
            float vf[2 * DP];
#pragma unroll
            for (int d2 = 0; d2 < DP; ++d2) {
                const float2 t2 = to_f32x2(v2[j * (D / 2) + lane + 32 * d2]);
                vf[2 * d2] = t2.x;
                vf[2 * d2 + 1] = t2.y;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float p = __shfl_sync(0xffffffffu, s[r], j);
#pragma unroll
                for (int e = 0; e < 2 * DP; ++e) acc[r][e] = fmaf(p, vf[e], acc[r][e]);
            }
        }
    }
#if CP_ASYNC
    cp_async_wait<0>();  // only empty groups can be pending; drain them anyway
#endif

    // Epilogue: rows past SQ write nothing; lane l writes dims 2l + 64i, +1.
    if (row0 >= seq_q) return;
    elem_t* oh = o + optd_head_off(strides.o_b, strides.o_h, blockIdx.y / heads_q, blockIdx.y % heads_q);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = row0 + r;
        if (row >= seq_q) break;  // warp-uniform
        const float l = warp_sum(sm.l[r]);
        const float inv_l = l > 0.f ? 1.f / l : 0.f;  // l == 0: no unmasked key in this split
        if (n_splits == 1) {
            elem2_t* orow = reinterpret_cast<elem2_t*>(oh + row * strides.o_s);
#pragma unroll
            for (int d2 = 0; d2 < DP; ++d2)
                orow[lane + 32 * d2] = from_f32x2(acc[r][2 * d2] * inv_l, acc[r][2 * d2 + 1] * inv_l);
        } else {
            const size_t prow = optd_split_partial_row(blockIdx.z, blockIdx.y, row, batch, heads_q, seq_q);
            float2* orow = reinterpret_cast<float2*>(o_partial + prow * D);
#pragma unroll
            for (int d2 = 0; d2 < DP; ++d2)
                orow[lane + 32 * d2] = make_float2(acc[r][2 * d2] * inv_l, acc[r][2 * d2 + 1] * inv_l);
            if (lane == 0) lse_partial[prow] = l > 0.f ? (sm.m[r] + log2f(l)) * OPTD_LN2 : OPTD_NEG_INF;
        }
    }
}

// minBlocks = 1 (D 128, and D 64 at 256 threads) leaves ptxas free to keep the
// R x D/32 accumulators in registers; with the default it caps 256-thread builds
// at 64 registers and spills. D 64 at 128 threads asks for 3 CTAs per SM (at most
// 168 registers): BLOCK_M 64's R = 16 rows of accumulators fit there, while
// without the bound ABI v2's addressing took ptxas to 169-184 registers, 2 CTAs
// per SM, 5-11% slower on b4h16s1024d64 (H100). kv-split's BLOCK_M 64 build then
// spills 8 bytes on sm_90 and is still as fast as its ABI v1 build.
#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(FWD_THREADS, FWD_THREADS == 128 ? 3 : 1) optd_fwd_d64(OPTD_ARGS) {
    memory_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(FWD_THREADS, 1) optd_fwd_d128(OPTD_ARGS) {
    memory_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

// D 256: R x 8 accumulators per thread (up to 128 at BLOCK_M 64 / 4 warps), so no
// minimum of resident CTAs either: ptxas may use up to 255 registers.
#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(FWD_THREADS, 1) optd_fwd_d256(OPTD_ARGS) {
    memory_fwd<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(OPTD_COMBINE_ROWS * 32) optd_combine_d64(OPTD_ARGS) {
    optd_split_combine<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(OPTD_COMBINE_ROWS * 32) optd_combine_d128(OPTD_ARGS) {
    optd_split_combine<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(OPTD_COMBINE_ROWS * 32) optd_combine_d256(OPTD_ARGS) {
    optd_split_combine<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
