/******************************************************************************
 * kv-split: shared-memory K/V tiles, and the KV sequence split across CTAs.
 *
 * Small problems (few heads, short sequences) give B * HQ * cdiv(SQ, BLOCK_M)
 * CTAs, far fewer than the GPU has SMs. This template also splits the keys:
 * gridDim.z = n_splits CTAs share one query block, split z covering key tiles
 * [z * tps, (z + 1) * tps) with tps = cdiv(cdiv(SK, 32), n_splits). Each split
 * runs its own online softmax and writes a normalized partial output plus its
 * log-sum-exp; a second kernel (combine) merges the splits:
 *
 *   lse = log(sum_z exp(lse_z)),   O = sum_z exp(lse_z - lse) * O_z
 *
 * With n_splits == 1 the forward kernel writes O directly and combine is not
 * launched.
 *
 * Forward CTA: BLOCK_M query rows of head (b, h) (blockIdx.y = b * HQ + h),
 * NUM_WARPS warps, each warp owning R = BLOCK_M / NUM_WARPS consecutive rows.
 * Its keys and values are those of KV head optd_kv_head(h) (grouped-query
 * attention: the G = HQ / HKV query heads of a KV head are neighbours in
 * gridDim.y, so their CTAs re-read the same K/V tiles from L2). Rows are
 * addressed through the ABI's strides (any layout, padded views); only the
 * shared-memory tiles are dense. A thread copies the same 16-byte chunk of
 * key rows kj, kj + RPI, ... of every K/V tile: the KV head's base pointers
 * (warp-uniform) and its offset to row kj are computed once per CTA, and a
 * copy adds the uniform (kv0 + i * RPI) row strides.
 * Per key tile of 32 keys:
 *   1. all threads stage K and V (32 x D, elem_t) in shared memory; K's
 *      16-byte chunks are XOR-swizzled by key so that the per-key reads in 2.
 *      hit distinct banks without padding;
 *   2. scores, lane-per-key: lane j computes q_r . k_j for the warp's R rows,
 *      q read from shared memory as fp32 broadcasts (Q is staged once per CTA,
 *      pre-scaled by softmax_scale * log2 e, so scores are in the log2 domain);
 *   3. masking (key >= SK, row >= SQ, causal key > row + SK - SQ, the
 *      bottom-right diagonal: common/mask.cuh's KeyMask) and one
 *      warp-shuffle row max per row per tile; p = exp2(s - m), the accumulator
 *      is rescaled once per tile (common/online_softmax.cuh, exp2f). Each lane
 *      keeps a partial row sum l, reduced once at the end;
 *   4. O += P V with lane l owning dims 2l + 64i, 2l + 64i + 1 (D / 32 dims),
 *      p_j broadcast from lane j by __shfl_sync.
 * Causal: tiles entirely above the CTA's last row (keys > last row + SK - SQ)
 * are not visited, and a warp skips the compute (not the __syncthreads) of
 * tiles above its own rows.
 * Window W (causal only): row i also loses keys <= i + SK - SQ - W, so a block
 * sees at most W + BLOCK_M - 1 keys, from keys_from(first row); the splits
 * divide the tiles of that range, not [0, SK) (see n_splits), a warp skips
 * the compute of tiles left of its rows' windows, and KeyMask::sees masks
 * the left edge per element in the same test as the right.
 *
 * Partial results (n_splits > 1), fp32, contiguous (common/split_combine.cuh):
 *   o_partial[z][b][h][i][:]  = O_z (normalized by the split's own sum), and
 *   lse_partial[z][b][h][i]   = natural-log LSE of the split's scaled scores,
 *                               m + log(l) with scores = softmax_scale * q.k
 *                               (FlashAttention's softmax_lse convention).
 * A split that has no unmasked key for a row writes lse = -inf and O = 0;
 * combine gives it weight 0.
 *
 * Combine: one warp per output row (lane owns the same dims as above), 4 rows
 * per 128-thread CTA, O written through strides.o.
 *
 * Knobs:   BLOCK_M     query rows per CTA              16, 32, 64
 *          NUM_WARPS   warps per CTA (R = BLOCK_M / NUM_WARPS rows each)
 *          MAX_SPLITS  cap on n_splits (only used by the launch formulas)
 * Head dims: 64, 128, 256 (D a multiple of 64: lanes own pairs of dims, 64
 *          dims per step, and the K swizzle permutes 8 of the D / 8 chunks).
 *          Not 96. D 256 is Gemma 2/3's.
 * Shared:  4 * BLOCK_M * D  (Q, fp32)  +  2 * 2 * 32 * D  (K, V) bytes.
 *          D 64 / 128: static, at most 48 KiB (BLOCK_M 64, D 128); no dynamic
 *          shared memory (smem = "0"). D 256: the same layout in dynamic shared
 *          memory, since static shared memory stops at 48 KiB and it takes
 *          48 / 64 / 96 KiB at BLOCK_M 16 / 32 / 64 (the spec's smem formula gives
 *          those bytes at D 256 and 0 below; the worker opts in above 48 KiB;
 *          all three fit the 99 KiB opt-in of sm_86 / sm_89).
 *          Checked against the formula by OPTD_CHECK_SMEM.
 * CTAs:    fwd      cdiv(SQ, BLOCK_M) x (B * HQ) x n_splits   (B * HQ <= 65535)
 *          combine  cdiv(B * HQ * SQ, 4), only when n_splits > 1
 * n_splits: 1 when B * HQ * cdiv(SQ, BLOCK_M) already fills 80% of the SMs,
 *          else min(MAX_SPLITS, cdiv(SMS, that), cdiv(SK, 32)), then lowered to
 *          the smallest count with the same tiles per split, so that without
 *          causal masking no split is left without a tile. Windowed, cdiv(SK,
 *          32) there is the most tiles a block's range spans, min(cdiv(SK, 32),
 *          cdiv(W + BLOCK_M - 1, 32) + 1): the splits divide each block's range.
 * Registers: R * (D / 32 + 3) fp32 per thread (accumulators, m, l, a score)
 *          plus a K chunk and addressing (two 64-bit K/V row offsets);
 *          __launch_bounds__(threads, 1), except D 64 at 128 threads: 3 CTAs
 *          per SM, at most 168 registers (see the kernels at the end).
 *          D 256 (sm_90): R = 2 / 4 / 8 rows take 124 / 148-154 /
 *          196-205 registers, no spills; R = 16 (BLOCK_M 64, 4 warps: 176
 *          fp32 of accumulators, m, l and scores) hits 255 and spills
 *          32-80 bytes.
 * Window:  the block's key range starts at its first row's first key and the
 *          splits divide that range (about W + BLOCK_M keys, whatever SK);
 *          left-edge masking is sees()'s third compare, per element.
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "kv-split"
description = "K/V tiles in shared memory, lane-per-key scores, KV sequence split over gridDim.z with an LSE combine"
min_cc = 80
head_dims = [64, 128, 256]
windows = true

[knobs]
BLOCK_M = [16, 32, 64]
NUM_WARPS = [4, 8]
MAX_SPLITS = [1, 2, 4, 8, 16, 32]

[derived]
m_blocks = "cdiv(SQ, BLOCK_M)"
# Key tiles a split range spans: [0, SK), or windowed at most W + BLOCK_M - 1 keys (+1 tile
# for the alignment), the range the kernel's splits divide.
kv_tiles = "cdiv(SK, 32) if WINDOW == 0 else min(cdiv(SK, 32), cdiv(WINDOW + BLOCK_M - 1, 32) + 1)"
base_ctas = "B * HQ * m_blocks"
want_splits = "1 if 5 * base_ctas >= 4 * SMS else max(1, min(MAX_SPLITS, cdiv(SMS, base_ctas), kv_tiles))"
tiles_per_split = "cdiv(kv_tiles, want_splits)"
splits = "cdiv(kv_tiles, tiles_per_split)"

[[launch]]
kernel = "fwd"
grid = ["m_blocks", "B * HQ", "splits"]
block = ["NUM_WARPS * 32", "1", "1"]
smem = "0 if D <= 128 else 4 * BLOCK_M * D + 2 * 32 * ELEM_BYTES * D"

[[launch]]
kernel = "combine"
when = "splits > 1"
grid = ["cdiv(B * HQ * SQ, 4)", "1", "1"]
block = ["128", "1", "1"]
smem = "0"
*/

#include "common/optd.cuh"

#include "common/online_softmax.cuh"
#include "common/mask.cuh"
#include "common/split_combine.cuh"

#ifndef BLOCK_M
#error "BLOCK_M must be defined"
#endif
#ifndef NUM_WARPS
#error "NUM_WARPS must be defined"
#endif
#if BLOCK_M % NUM_WARPS != 0 || BLOCK_M < NUM_WARPS
#error "BLOCK_M must be a positive multiple of NUM_WARPS"
#endif

#define KV_TILE 32                         // keys per tile: one per lane
#define FWD_THREADS (NUM_WARPS * 32)
#define ROWS_PER_WARP (BLOCK_M / NUM_WARPS)

// ---------------------------------------------------------------------------
// Forward: one (query block, head, split) per CTA.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void kv_split_fwd(OPTD_ARGS) {
    static_assert(D % 64 == 0, "lanes own pairs of dims, 64 dims per step");
    constexpr int R = ROWS_PER_WARP;
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row of K, V (8, 16 or 32)
    constexpr int DP = D / 64;     // dim pairs per lane (1, 2 or 4)
    static_assert(CHUNKS >= 8, "the K swizzle permutes 8 chunks");

    // D 64 / 128: static shared memory, the launch gives no dynamic bytes (smem = "0").
    // D 256: the same three arrays in dynamic shared memory (Q at 0, then K, then V), as
    // static shared memory stops at 48 KiB and they take 48-96 KiB there (the launch gives
    // 4 * BLOCK_M * D + 2 * 2 * 32 * D bytes; the worker opts in above 48 KiB).
    constexpr bool DYN_SMEM = D > 128;
    constexpr int Q_BYTES = 4 * BLOCK_M * D;
    constexpr int KV_BYTES = KV_TILE * CHUNKS * 16;  // one K or V tile
    OPTD_CHECK_SMEM(FWD, D, DYN_SMEM ? Q_BYTES + 2 * KV_BYTES : 0);
    float* q_s;  // pre-scaled Q, fp32, BLOCK_M x D
    uint4* k_s;  // K tile, chunk c of key j at c ^ (j & 7)
    uint4* v_s;  // V tile, plain row-major
    if constexpr (DYN_SMEM) {
        extern __shared__ __align__(16) unsigned char kvs_smem[];
        q_s = reinterpret_cast<float*>(kvs_smem);
        k_s = reinterpret_cast<uint4*>(kvs_smem + Q_BYTES);
        v_s = reinterpret_cast<uint4*>(kvs_smem + Q_BYTES + KV_BYTES);
    } else {
        __shared__ __align__(16) float q_st[BLOCK_M * D];
        __shared__ uint4 k_st[KV_TILE * CHUNKS];
        __shared__ uint4 v_st[KV_TILE * CHUNKS];
        q_s = q_st;
        k_s = k_st;
        v_s = v_st;
    }

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int bh = blockIdx.y;  // b * HQ + h
    const int b = bh / heads_q, h = bh - b * heads_q;
    const int hkv = optd_kv_head(h, heads_q, heads_kv);
    const int split = blockIdx.z;
    const int m0 = blockIdx.x * BLOCK_M;
    const int row0 = m0 + warp * R;  // this warp's first row
    const elem_t* qh = q + optd_head_off(strides.q_b, strides.q_h, b, h);

    // K/V staging: thread tid copies 16-byte chunk kc of key rows kj + i * KV_RPI
    // (i < KV_ITERS) of every tile. The KV head's base pointers are warp-uniform
    // and the thread's offset (kj row strides + kc chunks) is computed once here;
    // a copy adds (kv0 + i * KV_RPI) row strides, a uniform multiply of kernel
    // parameters.
    constexpr int KV_RPI = FWD_THREADS / CHUNKS;            // key rows per step
    constexpr int KV_ITERS = KV_TILE * CHUNKS / FWD_THREADS;  // steps per tile
    static_assert(FWD_THREADS % CHUNKS == 0 && KV_TILE % KV_RPI == 0, "K/V chunks must split evenly over the threads");
    const int kj = tid / CHUNKS, kc = tid % CHUNKS;
    const elem_t* kh = k + optd_head_off(strides.k_b, strides.k_h, b, hkv);
    const elem_t* vh = v + optd_head_off(strides.v_b, strides.v_h, b, hkv);
    const long long koff = kj * strides.k_s + kc * 8, voff = kj * strides.v_s + kc * 8;

    // This split's key tiles (mask.cuh's split_tiles: [0, SK) divided, or a window's range);
    // under causal masking none past the block's last visible key.
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), optd_window(window));
    const KeyMask::TileRange tiles = mask.split_tiles(m0, BLOCK_M, KV_TILE, n_splits, split);
    const int t_begin = tiles.begin, t_end = tiles.end;

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

    if (t_begin < t_end) {
        // Stage Q once; rows past SQ are zero (their scores are masked anyway). The thread's
        // chunks c = tid + i * FWD_THREADS are all loaded before the first is stored: in a
        // load-store loop the compiler kept each chunk's load behind the previous chunk's
        // shared store (q and q_s are both generic pointers), one global round trip per chunk.
        constexpr int Q_CH = BLOCK_M * CHUNKS;
        constexpr int Q_ITERS = (Q_CH + FWD_THREADS - 1) / FWD_THREADS;  // 1 to 16
        constexpr bool Q_PARTIAL = Q_CH % FWD_THREADS != 0;  // BLOCK_M 16, D 64, 256 threads: half idle
        uint4 qv[Q_ITERS];
#pragma unroll
        for (int i = 0; i < Q_ITERS; ++i) {
            const int c = tid + i * FWD_THREADS;
            const int r = c / CHUNKS, cc = c % CHUNKS;
            qv[i] = make_uint4(0u, 0u, 0u, 0u);
            if ((!Q_PARTIAL || c < Q_CH) && m0 + r < seq_q)
                qv[i] = __ldg(reinterpret_cast<const uint4*>(qh + (m0 + r) * strides.q_s + cc * 8));
        }
        const float scale_log2 = softmax_scale * OPTD_LOG2E;
#pragma unroll
        for (int i = 0; i < Q_ITERS; ++i) {
            const int c = tid + i * FWD_THREADS;
            if (Q_PARTIAL && c >= Q_CH) break;
            const int r = c / CHUNKS, cc = c % CHUNKS;
            float f[8];
            unpack8(qv[i], f);
            float4* dst = reinterpret_cast<float4*>(&q_s[r * D + cc * 8]);
            dst[0] = make_float4(f[0] * scale_log2, f[1] * scale_log2, f[2] * scale_log2, f[3] * scale_log2);
            dst[1] = make_float4(f[4] * scale_log2, f[5] * scale_log2, f[6] * scale_log2, f[7] * scale_log2);
        }
    }

    for (int t = t_begin; t < t_end; ++t) {
        const int kv0 = t * KV_TILE;
        __syncthreads();  // the previous tile is no longer being read
        // Keys past SK are zero-filled: their p is 0, and 0 * V must not be NaN.
#pragma unroll
        for (int i = 0; i < KV_ITERS; ++i) {
            const int j = kj + i * KV_RPI;
            uint4 kraw = make_uint4(0u, 0u, 0u, 0u), vraw = kraw;
            if (kv0 + j < seq_k) {
                kraw = *reinterpret_cast<const uint4*>(kh + (kv0 + i * KV_RPI) * strides.k_s + koff);
                vraw = *reinterpret_cast<const uint4*>(vh + (kv0 + i * KV_RPI) * strides.v_s + voff);
            }
            k_s[j * CHUNKS + (kc ^ (j & 7))] = kraw;
            v_s[j * CHUNKS + kc] = vraw;
        }
        __syncthreads();  // K, V (and Q on the first tile) are visible

        // Warp-uniform skip: all rows past SQ, or the tile lies above them (causal) or
        // left of their windows (the range's first tile, rounded down from the block's).
        if (row0 >= seq_q || mask.above(kv0, row0 + R - 1) || mask.left_of(kv0 + KV_TILE, row0)) continue;

        // 2. Scores, lane-per-key: s[r] = q_r . k_lane (log2 domain).
        float s[R];
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] = 0.f;
#pragma unroll
        for (int cc = 0; cc < CHUNKS; ++cc) {
            float kf[8];
            unpack8(k_s[lane * CHUNKS + (cc ^ (lane & 7))], kf);
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

        // 3. Mask, then online softmax with one max reduction per row per tile.
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

        // 4. O += P V. Keys past SK, or (causal) past the last key the warp's last
        // row sees, have p = 0 for every row of the warp: stop before them.
        const int j_end = min(KV_TILE, mask.keys_before(row0 + R) - kv0);
        const elem2_t* v2 = reinterpret_cast<const elem2_t*>(v_s);
#pragma unroll 4
        for (int j = 0; j < j_end; ++j) {
            float vf[2 * DP];
#pragma unroll
            for (int i = 0; i < DP; ++i) {
                const float2 t2 = to_f32x2(v2[j * (D / 2) + lane + 32 * i]);
                vf[2 * i] = t2.x;
                vf[2 * i + 1] = t2.y;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float p = __shfl_sync(0xffffffffu, s[r], j);
#pragma unroll
                for (int e = 0; e < 2 * DP; ++e) acc[r][e] = fmaf(p, vf[e], acc[r][e]);
            }
        }
    }

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
            for (int i = 0; i < DP; ++i)
                orow[lane + 32 * i] = from_f32x2(acc[r][2 * i] * inv_l, acc[r][2 * i + 1] * inv_l);
        } else {
            const size_t prow = optd_split_partial_row(split, bh, row, batch, heads_q, seq_q);
            float2* orow = reinterpret_cast<float2*>(o_partial + prow * D);
#pragma unroll
            for (int i = 0; i < DP; ++i)
                orow[lane + 32 * i] = make_float2(acc[r][2 * i] * inv_l, acc[r][2 * i + 1] * inv_l);
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
    kv_split_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(FWD_THREADS, 1) optd_fwd_d128(OPTD_ARGS) {
    kv_split_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

// D 256: R x 8 accumulators per thread (up to 128 at BLOCK_M 64 / 4 warps), so no
// minimum of resident CTAs either: ptxas may use up to 255 registers.
#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(FWD_THREADS, 1) optd_fwd_d256(OPTD_ARGS) {
    kv_split_fwd<256>(OPTD_ARG_NAMES);
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
