/******************************************************************************
 * decode-wgmma: flash-decoding for wide query groups on Hopper. One warpgroup
 * per CTA holds every packed query row of its (b, kv head, row tile) in ONE
 * wgmma accumulator, so a KV split ends with no merge of key warps; K and V
 * come by TMA from a producer warp; the CLUSTER splits of a group combine
 * through distributed shared memory as decode-cluster's scatter (COMBINE 3).
 *
 * Why: decode-cluster (mma.sync) splits each tile's keys over 4-8 warps,
 * each with its own fp32 copy of the CTA's O rows; after the last tile those
 * copies are summed in shared memory before the cluster's combine. At MQA
 * (B 8 x 32 query heads on one KV head, 32 packed rows, SK 4096) that merge
 * and its barriers are ~0.5-0.9 us of the ~3 us between the last K/V byte
 * and the call's end (scripts/decode_timeline.py, BENCHMARKS (16), (19),
 * (33)), and one warp alone cannot keep up with the stream (mma.sync runs on
 * one SM sub-partition's tensor core: NUM_WARPS 2 at MQA was 30% slower).
 * A wgmma m64nN spans the four sub-partitions: one warpgroup streams all of
 * a split's keys at the SM's full tensor rate, S = Q K^T reads K from the
 * TMA's tile once (not once per row tile), and O has one owner.
 *
 * The cost: the m64 tile has 64 rows whatever the group's G x SQ (MQA: 32,
 * Llama-3 GQA decode: 4). The padding rows' tensor work is wasted (at most a
 * split's 64 x keys x D x 4 FLOPs, ~2 us of the SM's tensor time for 512
 * keys at D 128, under a ~5 us stream), and a warp whose 16 rows are all
 * padding skips the softmax (warp-uniform).
 *
 * Measured (H200, BENCHMARKS (45), (46)): where the groups are many and wide
 * it streams the cache ~2x faster than decode-cluster (speculative decoding,
 * B 8 x SQ 16 x 4 heads per KV head: 39.7 us against 77.9, 3.4 TB/s, 1.22x
 * FlashAttention-4 sustained; B 1 x SQ 16 12.6 against 14.6); at MQA (8
 * groups of 32 rows, 64 CTAs) 10.05 us against decode-cluster's 10.45, at
 * batch 1 x SQ 1 (4 rows) decode-cluster stays ahead (9.07 against 9.49).
 * The plan runs it where G x SQ > 16: decode-wgmma's stage from clusters of
 * 2, decode-wgmma-few's from MQA's point (128 keys, clusters of 8).
 *
 * Per CTA (blockIdx.x = rank z in the cluster = the split, blockIdx.y =
 * b * HKV + kv head, blockIdx.z = row tile of ROWS packed rows r = gi * SQ + s):
 *   - warp 4 (the producer), lane 0: for each key tile of the split, waits for
 *     its ring slot to be empty, then loads K's and V's BLOCK_N rows by TMA,
 *     each completing on its own mbarrier (so S and the softmax wait for K
 *     only, as decode-cluster's K_FIRST); it initialises the ring's
 *     mbarriers and issues the first STAGES tiles first thing, before the
 *     CTA barrier;
 *   - warps 0-3 (the consumer warpgroup): Q's packed rows into shared memory
 *     (128-byte swizzle, zero past the valid rows), then per tile:
 *     S = Q K^T (wgmma, both operands in shared memory), mask (ragged SK,
 *     causal's bottom-right diagonal), online softmax in registers, O += P V
 *     (wgmma, P from registers); tile i's P V runs while tile i + 1's K is
 *     waited for and its S issued, and the slot is released once both are
 *     done.
 *   - the combine (COMBINE 3 of decode-cluster): each rank stages its
 *     normalized fp32 rows in chunk order, sends every other rank its share
 *     (and its row LSEs) by bulk copies counted on that rank's mbarrier, and
 *     combines its own share of the rows over the CLUSTER splits into O.
 *
 * Knobs:   BLOCK_N  keys per tile (the wgmma's N for S, its K-steps for P V)  128, 64
 *          STAGES   K/V tiles in the TMA ring                                  2, 3, 4
 *          CLUSTER  splits per group = CTAs per cluster                        8, 4, 2
 *          ROWS     packed rows per CTA: 32 (MQA's G = 32 at SQ 1; the        32, 64
 *                   receive area holds 32 rows) or 64 (the whole m64 tile)
 * Shared (dynamic, bytes): 1024 (alignment of the swizzled tiles) + Q 64 x 2 D
 *          + K and V rings 2 x STAGES x BLOCK_N x 2 D + the receive area
 *          (CLUSTER - 1) x (cdiv(ROWS x D / 4, CLUSTER) x 16 + ROWS x 4) + 128
 *          (mbarriers); the staged rows (ROWS x D x 4) go over the K ring once
 *          it is drained (2 x BLOCK_N x ... >= ROWS x D x 4 at every knob value).
 * CTAs:    CLUSTER x (B * HKV) x cdiv(G * SQ, ROWS), 160 threads (a consumer
 *          warpgroup and a producer warp), clusters of CLUSTER x 1 x 1.
 * Registers: the consumer's S (BLOCK_N / 2 fp32), O (D / 2 fp32), P
 *          (BLOCK_N / 4 b32) and the softmax's 4 per thread; __launch_bounds__(160, 1).
 * Head dims: 64 and 128 (128-byte swizzled panels of 64 columns).
 * Needs:   sm_90a (wgmma), max_sq 16 as the other decode templates; no window.
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "decode-wgmma"
description = "flash-decoding for wide query groups on Hopper: one wgmma warpgroup holds a KV split's packed rows (up to 64) in one accumulator, K/V by TMA, splits combined through distributed shared memory (sm_90a)"
min_cc = 90
head_dims = [64, 128]
arch_specific = true
max_sq = 16

[knobs]
BLOCK_N = [128, 64]
STAGES = [3, 2, 4]
CLUSTER = [8, 4, 2]
ROWS = [32, 64]

[derived]
row_tiles = "cdiv(G * SQ, ROWS)"
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["CLUSTER", "B * HKV", "row_tiles"]
block = ["160", "1", "1"]
smem = "1024 + ELEM_BYTES * D * 64 + 2 * STAGES * ELEM_BYTES * D * BLOCK_N + (CLUSTER - 1) * (cdiv(ROWS * D // 4, CLUSTER) * 16 + ROWS * 4) + 128"

[[tensor_map]]
tensor = "k"
box_rows = "BLOCK_N"
swizzle = "128"

[[tensor_map]]
tensor = "v"
box_rows = "BLOCK_N"
swizzle = "128"
*/

#include "common/optd.cuh"
#include "common/quad_softmax.cuh"
#include "common/hopper.cuh"
#include "common/wgmma_ops.cuh"
#include "common/cluster.cuh"

#ifndef BLOCK_N
#error "BLOCK_N must be defined"
#endif
#ifndef STAGES
#error "STAGES must be defined"
#endif
#ifndef CLUSTER
#error "CLUSTER must be defined"
#endif
#ifndef ROWS
#error "ROWS must be defined"
#endif
#if BLOCK_N != 64 && BLOCK_N != 128
#error "BLOCK_N must be 64 or 128"
#endif
#if CLUSTER < 2 || CLUSTER > 8
#error "CLUSTER must be in 2..8 (the portable cluster size)"
#endif
#if ROWS != 32 && ROWS != 64
#error "ROWS must be 32 or 64"
#endif
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "decode-wgmma needs sm_90a (wgmma)"
#endif

#define DW_THREADS 160
#define DW_CONSUMERS 128

// Dynamic shared memory, from a 1024-byte aligned base (the TMA's 128-byte swizzle
// repeats every 1024 bytes, and wgmma's descriptors assume atoms from such a base).
template <int D>
struct DwSmem {
    static constexpr int PANEL_ROW = 128;                       // bytes of a row of a 64-column panel
    static constexpr int PANELS = D / 64;
    static constexpr int Q = 0;                                 // 64 rows, PANELS panels of 64 x 128 bytes
    static constexpr int Q_BYTES = 64 * 2 * D;
    static constexpr int KV_BYTES = BLOCK_N * 2 * D;            // one K (or V) tile: PANELS panels of BLOCK_N rows
    static constexpr int K = Q + Q_BYTES;
    static constexpr int V = K + STAGES * KV_BYTES;
    static constexpr int C4 = D / 4;                            // 16-byte fp32 chunks per row
    static constexpr int PER = (ROWS * C4 + CLUSTER - 1) / CLUSTER;  // most chunks a rank owns
    static constexpr int RX = V + STAGES * KV_BYTES;
    static constexpr int RX_LSE = RX + (CLUSTER - 1) * PER * 16;
    static constexpr int MBAR = RX_LSE + (CLUSTER - 1) * ROWS * 4;
    static constexpr int BYTES = MBAR + 128;                    // + the 1024 of alignment: the spec's formula
    static constexpr int STAGE = K;                             // the staged fp32 rows, over the drained K ring
    static constexpr int LSE = Q;                               // the rows' LSEs, over Q once S is done
    static_assert(ROWS * D * 4 <= STAGES * KV_BYTES, "the staged rows fit in the K ring");
    static_assert((3 * STAGES + 1) * 8 <= 128, "the mbarriers fit in their 128 bytes");
    static_assert(RX % 16 == 0 && RX_LSE % 16 == 0 && MBAR % 8 == 0, "aligned areas");
};

// Where chunk c4 (4 columns) of packed row `pr` (of the group) goes in O.
__device__ __forceinline__ elem_t* dw_out_chunk(elem_t* o, const optd_strides& strides, int b, int kvh, int pr, int c4,
                                                int group, int seq_q) {
    const int hq = kvh * group + pr / seq_q, s = pr % seq_q;
    return o + optd_head_off(strides.o_b, strides.o_h, b, hq) + (long long)s * strides.o_s + 4 * c4;
}

template <int D>
__device__ __forceinline__ void decode_wgmma_fwd(OPTD_ARGS, const optd_tensor_map* tm_k, const optd_tensor_map* tm_v) {
    using L = DwSmem<D>;
    OPTD_CHECK_SMEM(FWD, D, 1024 + L::BYTES);
    (void)o_partial;
    (void)lse_partial;
    (void)n_splits;
    (void)batch;
    (void)window;
    constexpr int C4 = L::C4;
    constexpr int NT = BLOCK_N / 8;   // n8 blocks of S per thread
    constexpr int PK = BLOCK_N / 16;  // k-steps of P V
    constexpr int QK = D / 16;        // k-steps of Q K^T
    extern __shared__ __align__(1024) unsigned char dw_raw[];
    unsigned char* smem = dw_raw + ((1024 - (smem_addr(dw_raw) & 1023)) & 1023);
    const unsigned base = smem_addr(smem);
    const unsigned mbar = base + L::MBAR;  // [0, STAGES) full K, [STAGES, 2 STAGES) full V, then empty, then combine
    auto full_k = [&](int s) { return mbar + 8u * (unsigned)s; };
    auto full_v = [&](int s) { return mbar + 8u * (unsigned)(STAGES + s); };
    auto empty = [&](int s) { return mbar + 8u * (unsigned)(2 * STAGES + s); };
    const unsigned cbar = mbar + 8u * (unsigned)(3 * STAGES);

    const int split = blockIdx.x;
    const int b = (int)blockIdx.y / heads_kv, kvh = (int)blockIdx.y % heads_kv;
    const int group = heads_q / heads_kv;
    const int row0 = (int)blockIdx.z * ROWS;  // the CTA's first packed row
    const int rows_valid = min(ROWS, group * seq_q - row0);
    const int n_tiles = (seq_k + BLOCK_N - 1) / BLOCK_N;
    const int tps = (n_tiles + CLUSTER - 1) / CLUSTER;
    const int t_begin = min(n_tiles, split * tps);
    const int t_end = min(n_tiles, t_begin + tps);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    // The scatter's shares: rank r owns chunks [r per, (r + 1) per) of the valid rows.
    const int total = rows_valid * C4;
    const int per = (total + CLUSTER - 1) / CLUSTER;
    const int own_begin = min(total, split * per);
    const int own_end = min(total, own_begin + per);

    // K/V tile i of the split (t_begin + i) -> ring slot i % STAGES, K and V each completing on
    // their own mbarrier (S and the softmax wait for K only).
    const int my_tiles = t_end - t_begin;
    auto issue = [&](int i) {
        const int s = i % STAGES, t = t_begin + i;
        mbar_arrive_expect_tx(full_k(s), (unsigned)L::KV_BYTES);
        tma_load_5d(base + L::K + (unsigned)(s * L::KV_BYTES), tm_k, full_k(s), 0, t * BLOCK_N, 0, kvh, b);
        mbar_arrive_expect_tx(full_v(s), (unsigned)L::KV_BYTES);
        tma_load_5d(base + L::V + (unsigned)(s * L::KV_BYTES), tm_v, full_v(s), 0, t * BLOCK_N, 0, kvh, b);
    };
    // The producer starts the stream first thing: the maps' prefetch, the ring's mbarriers and the
    // first STAGES tiles (fresh slots: nothing to wait for) before the CTA barrier, so the maps'
    // fetch overlaps the init and neither waits for the other warps. With thread 0 initialising
    // every mbarrier, then the barrier, then the prefetches, the first TMA left 0.74 us (1200
    // cycles) after the CTA's entry (scripts/decode_timeline.py, H200, 2026-12-02).
    if (warp == 4 && lane == 0) {
        tma_prefetch_map(tm_k);
        tma_prefetch_map(tm_v);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_k(s), 1);
            mbar_init(full_v(s), 1);
            mbar_init(empty(s), 4);  // one arrive per consumer warp
        }
        mbar_fence_init();  // before the TMA's complete_tx on them
        for (int i = 0; i < min(STAGES, my_tiles); ++i) issue(i);
    }

    // Consumers: every load of the thread's Q chunks is issued before any of them is stored: the
    // compiler cannot tell the global q from the shared tile apart (both generic pointers),
    // so a load-store loop runs one global round trip per chunk. That was the CTA's first
    // K tile "landing" 2 us late at MQA (4 chunks a thread) and 6.5 us late at 64 rows
    // (8 chunks), against 1.2 us with one chunk (scripts/decode_timeline.py, H200, 2026-12-02).
    // Issued before the CTA barrier too: their latency overlaps the init.
    constexpr int CH = D / 8;                    // 16-byte chunks of a row
    constexpr int QI = 64 * CH / DW_CONSUMERS;   // of the m64 tile, per consumer thread
    static_assert(DW_CONSUMERS % CH == 0 && 64 % (DW_CONSUMERS / CH) == 0, "whole chunk columns per thread");
    constexpr int RS = DW_CONSUMERS / CH;        // rows between a thread's chunks (one chunk column)
    const int ch = tid % CH, r0 = tid / CH;
    uint4 qv[QI];
    if (warp < 4) {
        const elem_t* qg = q + optd_head_off(strides.q_b, strides.q_h, b, kvh * group) + 8 * ch;  // the group's first head
#pragma unroll
        for (int i = 0; i < QI; ++i) {
            const int r = r0 + i * RS;
            qv[i] = make_uint4(0u, 0u, 0u, 0u);
            if (r < rows_valid) {
                const int pr = row0 + r;  // packed row: head pr / SQ of the group, query row pr % SQ
                const int hi = seq_q == 1 ? pr : pr / seq_q, s = pr - hi * seq_q;
                qv[i] = __ldg(reinterpret_cast<const uint4*>(qg + (long long)hi * strides.q_h + (long long)s * strides.q_s));
            }
        }
    }

    if (tid == 0) {
        // The combine's mbarrier: this rank's own arrive and every byte the others send it.
        mbar_init(cbar, 1);
        mbar_arrive_expect_tx(cbar, (unsigned)((CLUSTER - 1) * (rows_valid * 4 + (own_end - own_begin) * 16)));
        mbar_fence_init();
    }
    __syncthreads();
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");

    // Online softmax state of the thread's rows g and g + 8 of its warp's 16.
    OnlineSoftmax<2, false, Exp2Approx> sm;
    sm.init();
    float acc_o[D / 2];  // O's accumulators (the ABI's o is the output)
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc_o[i] = 0.f;

    if (warp == 4) {
        // Producer: the rest of the split's tiles, each once its slot is released.
        if (lane == 0) {
            for (int i = STAGES; i < my_tiles; ++i) {
                mbar_wait(empty(i % STAGES), (unsigned)(i / STAGES - 1) & 1u);
                issue(i);
            }
        }
        __syncwarp();
    } else {
        // Consumer warpgroup: Q's packed rows -> the swizzled Q tile (zero past the valid rows,
        // and rows ROWS..63 of the m64 tile).
        const int g = lane / 4, tq = lane % 4;
        const int panel = ch / 8, cc = ch % 8;
#pragma unroll
        for (int i = 0; i < QI; ++i) {
            const int r = r0 + i * RS;
            *reinterpret_cast<uint4*>(smem + L::Q + panel * 64 * L::PANEL_ROW + r * L::PANEL_ROW + ((cc ^ (r & 7)) << 4)) = qv[i];
        }
        fence_proxy_async_smem();  // the Q tile is read by wgmma (the async proxy)
        named_bar_sync(1, DW_CONSUMERS);

        const float sl2 = softmax_scale * OPTD_LOG2E;
        const bool active = warp * 16 < rows_valid;  // warp-uniform: a warp of padding rows skips the softmax
        // The thread's rows' query positions (causal: row at position s sees keys <= s + SK - SQ).
        const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), 0);
        int lim_base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int pr = row0 + warp * 16 + g + 8 * h;
            lim_base[h] = mask.limit(pr % seq_q) - 2 * tq;
        }
        // Tiles from here on need masking: past the smallest row limit.
        const int mask_from = causal ? seq_k - seq_q + 1 : seq_k;

        const unsigned long long dq = smem_desc_kmajor<128>(base + L::Q);
        float s_acc[BLOCK_N / 2];
        unsigned p[PK][4];
#pragma unroll
        for (int kk = 0; kk < PK; ++kk) p[kk][0] = p[kk][1] = p[kk][2] = p[kk][3] = 0u;

        int prev_slot = -1;
        for (int t = t_begin, i = 0; t < t_end; ++t, ++i) {
            const int slot = i % STAGES;
            const unsigned ph = (unsigned)(i / STAGES) & 1u;
            mbar_wait(full_k(slot), ph);
            const unsigned long long dk = smem_desc_kmajor<128>(base + L::K + (unsigned)(slot * L::KV_BYTES));
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < QK; ++kk) {
                const unsigned off_q = (kk / 4) * 64 * 128 + (kk % 4) * 32;
                const unsigned off_k = (kk / 4) * BLOCK_N * 128 + (kk % 4) * 32;
                wgmma_ss<BLOCK_N>(s_acc, desc_advance(dq, off_q), desc_advance(dk, off_k), kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();  // this S, and the previous tile's P V
            reg_fence(s_acc);
            reg_fence(acc_o);
            if (prev_slot >= 0) {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty(prev_slot));
            }
            if (active) {
                const int kv0 = t * BLOCK_N;
                if (kv0 + BLOCK_N > mask_from) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int lim = lim_base[h] - kv0;
#pragma unroll
                        for (int j = 0; j < NT; ++j) {
#pragma unroll
                            for (int e = 0; e < 2; ++e)
                                if (j * 8 + e >= lim) s_acc[4 * j + 2 * h + e] = OPTD_NEG_INF;
                        }
                    }
                }
                auto s_at = [&](int, int j, int e) -> float& { return s_acc[4 * j + e]; };
                auto o_at = [&](int, int j, int e) -> float& { return acc_o[4 * j + e]; };
                float mx[2], bias[2], corr[2];
                m16n8_row_max<1, NT>(s_at, sm.m, mx);
                sm.rescale(mx, sl2, bias, corr);
                m16n8_exp2<1, NT>(s_at, sm, sl2, bias);
                m16n8_scale_rows<1, D / 8>(o_at, corr);
#pragma unroll
                for (int kk = 0; kk < PK; ++kk) {
                    p[kk][0] = pack2(s_acc[8 * kk], s_acc[8 * kk + 1]);
                    p[kk][1] = pack2(s_acc[8 * kk + 2], s_acc[8 * kk + 3]);
                    p[kk][2] = pack2(s_acc[8 * kk + 4], s_acc[8 * kk + 5]);
                    p[kk][3] = pack2(s_acc[8 * kk + 6], s_acc[8 * kk + 7]);
                }
            }
            mbar_wait(full_v(slot), ph);
            const unsigned long long dv = smem_desc_mnmajor<128>(base + L::V + (unsigned)(slot * L::KV_BYTES), BLOCK_N * 128);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < PK; ++kk) wgmma_rs<D>(acc_o, p[kk], desc_advance(dv, kk * 16 * 128));
            wgmma_commit();
            prev_slot = slot;
        }
        wgmma_wait<0>();
        reg_fence(acc_o);
        // (The last slot is never refilled: no release needed.)

        // The split's rows: O / l and the LSE (natural log of the scaled scores' sum), -inf
        // and a zero row where the split saw no key of the row.
        float lse_h[2], inv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float l = quad_sum(sm.l[h]);
            inv[h] = l > 0.f ? __fdividef(1.f, l) : 0.f;
            lse_h[h] = l > 0.f ? sm.m[h] * softmax_scale + __logf(l) : OPTD_NEG_INF;
        }
        asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // every rank's mbarrier is initialised
        named_bar_sync(1, DW_CONSUMERS);  // every warp's wgmma reads of the ring and Q are done
        float* stage = reinterpret_cast<float*>(smem + L::STAGE);
        float* lse_s = reinterpret_cast<float*>(smem + L::LSE);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + g + 8 * h;
            if (r < rows_valid) {
#pragma unroll
                for (int j = 0; j < D / 8; ++j)
                    *reinterpret_cast<float2*>(stage + r * D + 8 * j + 2 * tq) =
                        make_float2(acc_o[4 * j + 2 * h] * inv[h], acc_o[4 * j + 2 * h + 1] * inv[h]);
                if (tq == 0) lse_s[r] = lse_h[h];
            }
        }
        fence_proxy_async_cta();  // the staged chunks and LSEs are read by the bulk copies
    }
    if (warp == 4) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    __syncthreads();

    // Send: thread t < CLUSTER - 1 of warp 0 sends the t-th other rank its share, warp 1 its LSEs.
    const unsigned rx = base + L::RX, rx_lse = base + L::RX_LSE;
    const float* stage = reinterpret_cast<const float*>(smem + L::STAGE);
    const float* lse_s = reinterpret_cast<const float*>(smem + L::LSE);
    const bool lse_bulk = rows_valid % 4 == 0;
    auto slot_of = [](int from, int to) { return from < to ? from : from - 1; };
    if (lane < CLUSTER - 1 && warp < 2) {
        const int owner = lane < split ? lane : lane + 1;
        const int slot = slot_of(split, owner);
        const unsigned rbar = dsmem_map(cbar, (unsigned)owner);
        if (warp == 0) {
            const int b0 = min(total, owner * per), b1 = min(total, b0 + per);
            if (b1 > b0)
                dsmem_bulk_copy(dsmem_map(rx + (unsigned)(slot * L::PER * 16), (unsigned)owner),
                                smem_addr(stage) + (unsigned)(b0 * 16), (unsigned)((b1 - b0) * 16), rbar);
        } else if (lse_bulk) {
            dsmem_bulk_copy(dsmem_map(rx_lse + (unsigned)(slot * ROWS * 4), (unsigned)owner), smem_addr(lse_s),
                            (unsigned)(rows_valid * 4), rbar);
        }
    }
    if (!lse_bulk) {
        for (int i = tid; i < (CLUSTER - 1) * rows_valid; i += DW_THREADS) {
            const int oi = i / rows_valid, row = i % rows_valid;
            const int owner = oi < split ? oi : oi + 1;
            const int slot = slot_of(split, owner);
            dsmem_st_async_f32(dsmem_map(rx_lse + (unsigned)((slot * ROWS + row) * 4), (unsigned)owner), lse_s[row],
                               dsmem_map(cbar, (unsigned)owner));
        }
    }
    cluster_mbar_wait(cbar, 0);
    // Every copy into this rank has landed, so every sender's reads of its staging copy for it
    // are done: this arrive and the wait at the end keep each CTA alive until every rank has
    // had all of its bytes.
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    const float* rxf = reinterpret_cast<const float*>(smem + L::RX);
    const float* rxl = reinterpret_cast<const float*>(smem + L::RX_LSE);
    for (int c = own_begin + tid; c < own_end; c += DW_THREADS) {
        const int row = c / C4, c4 = c % C4;
        float lse[CLUSTER];
#pragma unroll
        for (int z = 0; z < CLUSTER; ++z) lse[z] = z == split ? lse_s[row] : rxl[slot_of(z, split) * ROWS + row];
        const float4 r = cluster_combine_chunk(lse, [&](int z) {
            return z == split ? *reinterpret_cast<const float4*>(stage + 4 * c)
                              : *reinterpret_cast<const float4*>(rxf + (slot_of(z, split) * L::PER + c - own_begin) * 4);
        });
        uint2 packed;
        packed.x = pack2(r.x, r.y);
        packed.y = pack2(r.z, r.w);
        *reinterpret_cast<uint2*>(dw_out_chunk(o, strides, b, kvh, row0 + row, c4, group, seq_q)) = packed;
    }
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

#define DW_KERNEL(DIM)                                                                                        \
    extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(DW_THREADS, 1)              \
        optd_fwd_d##DIM(OPTD_ARGS, const __grid_constant__ optd_tensor_map tm_k,                              \
                        const __grid_constant__ optd_tensor_map tm_v) {                                       \
        decode_wgmma_fwd<DIM>(OPTD_ARG_NAMES, &tm_k, &tm_v);                                                  \
        OPTD_CTA_DONE();                                                                                      \
    }

#if OPTD_BUILD_D64
DW_KERNEL(64)
#endif
#if OPTD_BUILD_D128
DW_KERNEL(128)
#endif
