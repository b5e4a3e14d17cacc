/******************************************************************************
 * decode-cluster: flash-decoding in one launch on Hopper: the CLUSTER splits
 * of a (b, kv head, row tile) are one thread-block cluster, and they combine
 * through distributed shared memory instead of fp32 partials in global memory
 * and a second kernel.
 *
 * decode.cu (decode-split) needs two launches when it splits the KV cache:
 * the forward writes partial O rows and LSEs, a combine kernel reads them
 * back. On small caches (Llama-3 B 1, SK 1024: 4 MB) the whole call lasts a
 * few microseconds, and the second launch, its kernel boundary and the
 * partials' round trip through L2 are a large part of it. Here each split is
 * the same per-CTA work (common/decode_split.cuh: GQA group x SQ rows packed
 * into one m16 tile, a STAGES-deep cp.async K/V ring, warps splitting every
 * tile's keys, their merge), and then, in the same kernel:
 *   1. each CTA sums its warps' copies of every valid row into warp 0's
 *      (fp32, in its own shared memory) and keeps the split's row LSEs;
 *   2. cluster barrier (release / acquire: the rows are visible cluster-wide);
 *   3. the cluster's CTAs share the combine of the rows' 16-byte chunks: for
 *      each, the LSE of every split is read from its CTA (ld.shared::cluster
 *      through mapa), w_z = exp(lse_z - max_z lse_z), and
 *      O = sum_z w_z O_z / sum_z w_z, with O_z read the same way; O is stored
 *      through strides.o;
 *   4. cluster barrier: no CTA leaves while another still reads its memory.
 * The splits of one group are the cluster's CTAs (rank z = blockIdx.x, key
 * tiles t0 + [z * tps, min(n_tiles, (z + 1) * tps)), tps = cdiv(n_tiles, CLUSTER),
 * n_tiles = cdiv(SK, TILE_N) - t0, t0 = 0 or, windowed, the tile of the first
 * key a row sees: common/decode_split.cuh's dec_visible_tiles);
 * a split past the keys (n_tiles < CLUSTER) has LSE -inf and weight 0. There
 * is no global scratch: n_splits = 1 for the ABI (o_partial and lse_partial
 * are not touched).
 *
 * COMBINE = 1 (push) replaces steps 2-4: every CTA but rank 0 stores its
 * summed rows and LSEs into rank 0's shared memory (st.shared::cluster), and
 * after a CTA barrier its thread 0 arrives on rank 0's mbarrier (release,
 * cluster scope: one arrive per CTA), then it exits; rank 0
 * waits on that mbarrier (acquire), combines all CLUSTER splits and stores O.
 * The ncu profile of COMBINE = 0 at B 1, SK 1024 showed ~30% of the warps'
 * samples in the two cluster barriers: here only rank 0 waits, and only once.
 * The mbarrier is initialised, and a cluster arrive (relaxed) issued, once the
 * split's first K/V tile and Q are on their way (decode_split_tile's
 * after_first_issue); the arrive's wait comes just before the first remote store.
 *
 * COMBINE = 2 (push, asynchronous): the same receive area, but the other ranks
 * write it with st.async ... mbarrier::complete_tx::bytes, each 16-byte chunk
 * counting its bytes on rank 0's mbarrier, which rank 0 armed in the prologue for
 * every byte of every other rank (arrive.expect_tx): no CTA barrier, no release
 * fence and no arrive on the pushing side. COMBINE = 1's one release arrive per
 * CTA compiles to MEMBAR.ALL.CTA, MEMBAR.ALL.GPU, ERRBAR, CGAERRBAR before the
 * remote SYNCS.ARRIVE (SASS, NVRTC 13.0), behind a __syncthreads: the push is
 * 0.6-0.8 us of a B 1 x SK 4096 call's 2.4 us tail (scripts/decode_timeline.py).
 *
 * COMBINE = 3 (scatter, asynchronous): every rank owns a contiguous share of
 * the rows' 16-byte chunks (per = cdiv(rows * D / 4, CLUSTER), rank r chunks
 * [r * per, (r + 1) * per)) and combines only those; each rank stages its
 * summed chunks in chunk order and sends every other rank's share, and its row
 * LSEs, as bulk copies (cp.async.bulk shared::cluster) into that rank's
 * receive slot, all counted in bytes on the receiver's mbarrier (armed in the
 * prologue for exactly what it will receive); a cluster barrier keeps every
 * CTA, and so its staged copy, alive until every rank has all of its bytes.
 * With COMBINE = 2 one SM
 * receives (CLUSTER - 1) x rows x D x 4 bytes and then combines every chunk
 * alone: at MQA B 8 (16 rows per CTA) rank 0's combine took 2 us of a 13.6 us
 * call, at B 1 x SK 4096 (4 rows) 0.7 of 9.7 (scripts/decode_timeline.py,
 * H200, 2026-11-27); here each SM receives and combines 1 / CLUSTER of that.
 *
 * Cluster size is a compile-time attribute (__cluster_dims__), so a plain
 * cuLaunchKernel launches the clusters; at most 8 CTAs (the portable limit:
 * 16 needs a host-side opt-in the daemon's launcher does not make). So
 * CLUSTER * B * HKV * row tiles CTAs: for Llama-3 B 1 (8 KV heads) 64 CTAs,
 * each holding 1 / 8 of a KV head's keys; bigger batches fill the GPU alone.
 *
 * Knobs:   BLOCK_N    keys per warp per tile                      16, 32, 64
 *          NUM_WARPS  warps per CTA, splitting each tile's keys   4, 2, 8
 *          STAGES     K/V tiles in the cp.async ring              3, 2, 4
 *          CLUSTER    splits per group = CTAs per cluster         8, 4, 2
 *          COMBINE    2 push to rank 0 by st.async (bytes     2, 3, 1, 0
 *                     counted on its mbarrier), 3 scatter by
 *                     st.async (every rank combines its share),
 *                     1 push by stores and one arrive per CTA,
 *                     0 pull (two cluster barriers, every CTA
 *                     combines a share)
 *          WARP_LOADS 1 each warp copies and waits for its own     0, 1
 *                     keys, 0 the CTA copies each tile together
 *                     (common/decode_split.cuh)
 *          M_TILES    m16 row tiles per CTA (as decode.cu): 2     1, 2
 *                     puts MQA's 32 rows in one CTA, so MQA B 8
 *                     is 8 clusters of 8, one wave (as 2 x 8
 *                     clusters the second wave started 8 us in)
 *          K_FIRST    1 a tile's K copies are one cp.async group   0, 1
 *                     and its V copies the next, so Q K^T and
 *                     the softmax wait for K only: the last
 *                     tile's S runs while its V still lands
 *                     (common/decode_split.cuh)
 * Shared (dynamic, bytes), TILE_N = (NUM_WARPS / M_TILES) * BLOCK_N (as decode.cu):
 *          2 D * 16 * M_TILES + max(2 D * 2 * STAGES * TILE_N, NUM_WARPS * 16 * (D + 8) * 4)
 *          (DecSmem<D>::BYTES), plus with COMBINE = 1 or 2 rank 0's receive area
 *          (CLUSTER - 1) * 16 * M_TILES * (D + 1) * 4 (fp32 rows and LSEs) and 16 for the
 *          mbarrier (PushSmem<D>::BYTES, checked by OPTD_CHECK_SMEM); with
 *          COMBINE = 3 each rank's receive area instead: (CLUSTER - 1) x
 *          (cdiv(16 * M_TILES * D / 4, CLUSTER) * 16 + 16 * M_TILES * 4) + 16
 *          (ScatterSmem<D>::BYTES); combos
 *          over the opt-in limit are rejected by the gate.
 *          D 256: the split's layout alone is 8 KiB * M_TILES + 1 KiB * 2 * STAGES
 *          * TILE_N (200 KiB at the default BLOCK_N 16, 4 warps, 3 stages), and
 *          the push receive area (COMBINE 1, 2) 16 KiB per row tile and other rank
 *          (112 KiB at CLUSTER 8): the default point (COMBINE 2, CLUSTER 8, 312
 *          KiB) does not fit. With the other knobs at their first values, COMBINE 3
 *          (214.5 KiB: each rank receives 1 / CLUSTER of the rows), COMBINE 0 (200
 *          KiB), CLUSTER 2 (216 KiB) or NUM_WARPS 2 (216.5 KiB) do.
 *          D 96: 117.5 KiB at the default point.
 * CTAs:    fwd  CLUSTER x (B * HKV) x cdiv(G * SQ, 16 * M_TILES), NUM_WARPS * 32 threads,
 *          clusters of CLUSTER x 1 x 1; one launch.
 * Registers: as decode.cu's forward (D / 4 + D / 2 + BLOCK_N / 2 per thread
 *          plus addressing; at D 256 Q is loaded again per k-step instead of
 *          held, D / 2 + BLOCK_N / 2: 254 registers at the default point, no
 *          spill); __launch_bounds__(threads, 1).
 * Head dims: 64, 96, 128, 256, as decode.cu (common/decode_split.cuh). The
 *          combine works on 16-byte chunks of D / 4 floats: any D % 4 == 0.
 * Needs:   compute capability 9.0 (clusters, distributed shared memory); not
 *          arch-specific (plain sm_90 code). max_sq = 16, like decode.cu.
 * Window:  as decode.cu: the CLUSTER splits divide the tiles some row sees
 *          (a window of W reads ~W + SQ keys, whatever SK), and only those
 *          first tiles are masked on the left (common/decode_split.cuh).
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "decode-cluster"
description = "flash-decoding in one launch: the KV splits of a GQA group are one thread-block cluster and combine through distributed shared memory (sm_90)"
min_cc = 90
head_dims = [64, 96, 128, 256]
max_sq = 16
windows = true

[knobs]
BLOCK_N = [16, 32, 64]
NUM_WARPS = [4, 2, 8]
STAGES = [3, 2, 4]
CLUSTER = [8, 4, 2]
COMBINE = [2, 3, 1, 0]
WARP_LOADS = [0, 1]
M_TILES = [1, 2]
K_FIRST = [0, 1]

[derived]
tile_n = "(NUM_WARPS // M_TILES) * BLOCK_N"
row_tiles = "cdiv(G * SQ, 16 * M_TILES)"
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["CLUSTER", "B * HKV", "row_tiles"]
block = ["NUM_WARPS * 32", "1", "1"]
smem = "ELEM_BYTES * D * 16 * M_TILES + max(ELEM_BYTES * D * 2 * STAGES * tile_n, NUM_WARPS * 16 * (D + 8) * 4) + ((CLUSTER - 1) * (cdiv(16 * M_TILES * D // 4, CLUSTER) * 16 + 16 * M_TILES * 4) + 16 if COMBINE == 3 else min(COMBINE, 1) * ((CLUSTER - 1) * 16 * M_TILES * (D + 1) * 4 + 16))"
*/

#include "common/optd.cuh"
#include "common/decode_split.cuh"
#include "common/cluster.cuh"

#ifndef CLUSTER
#error "CLUSTER must be defined"
#endif
#if CLUSTER < 1 || CLUSTER > 8
#error "CLUSTER must be in 1..8 (the portable cluster size)"
#endif
#ifndef COMBINE
#error "COMBINE must be defined"
#endif
#if COMBINE < 0 || COMBINE > 3
#error "COMBINE must be 0 (pull), 1 (push), 2 (asynchronous push) or 3 (asynchronous scatter)"
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "decode-cluster needs compute capability 9.0 (thread-block clusters)"
#endif

// Distributed shared memory: common/cluster.cuh.

// COMBINE = 1 or 2: rank 0's receive area after the split's layout: the other
// ranks' summed rows (fp32, DEC_CTA_ROWS x D each), their row LSEs, the mbarrier.
template <int D>
struct PushSmem {
    static constexpr int RX = DecSmem<D>::BYTES;
    static constexpr int RX_LSE = RX + (CLUSTER - 1) * DEC_CTA_ROWS * D * 4;
    static constexpr int MBAR = RX_LSE + (CLUSTER - 1) * DEC_CTA_ROWS * 4;
    static constexpr int BYTES = MBAR + 16;
    static_assert(RX % 16 == 0 && MBAR % 8 == 0, "16-byte rows, 8-byte mbarrier");
};

// COMBINE = 3: each rank's receive area after the split's layout: from each other
// rank (slot dec_rx_slot(z, r) at rank r), the chunks of r's share (at most PER
// float4s) and all its row LSEs; the mbarrier.
// The slot of sender `from` in receiver `to`'s area: the other ranks in rank order.
__device__ __forceinline__ int dec_rx_slot(int from, int to) { return from < to ? from : from - 1; }

template <int D>
struct ScatterSmem {
    static constexpr int PER = (DEC_CTA_ROWS * (D / 4) + CLUSTER - 1) / CLUSTER;  // most chunks a rank owns
    static constexpr int RX = DecSmem<D>::BYTES;
    static constexpr int RX_LSE = RX + (CLUSTER - 1) * PER * 16;
    static constexpr int MBAR = RX_LSE + (CLUSTER - 1) * DEC_CTA_ROWS * 4;
    static constexpr int BYTES = MBAR + 16;
    static_assert(RX % 16 == 0 && MBAR % 8 == 0, "16-byte chunks, 8-byte mbarrier");
};

// Where chunk c4 (4 columns) of packed row `row` goes in O (through strides.o).
// The combine's callers compute it for their first chunk before they wait for the
// other splits: two integer divisions and the 64-bit offsets, ~70 dependent
// instructions (SASS) that one warp per scheduler pays in full, off the call's tail.
__device__ __forceinline__ elem_t* dec_out_chunk(elem_t* o, const optd_strides& strides, int row, int c4, int heads_q,
                                                 int heads_kv, int seq_q) {
    const DecRow out = dec_out_row(row, heads_q, heads_kv, seq_q);
    const int b = blockIdx.y / heads_kv;
    return o + optd_head_off(strides.o_b, strides.o_h, b, out.hq) + (long long)out.s * strides.o_s + 4 * c4;
}

// A chunk (4 columns of a packed row), combined over the CLUSTER splits
// (cluster_combine_chunk) and stored at dst. chunk_at(z) gives split z's float4.
template <typename ChunkAt>
__device__ __forceinline__ void dec_combine_chunk(const float (&lse)[CLUSTER], ChunkAt chunk_at, elem_t* dst) {
    const float4 r = cluster_combine_chunk(lse, chunk_at);
    uint2 packed;
    packed.x = pack2(r.x, r.y);
    packed.y = pack2(r.z, r.w);
    *reinterpret_cast<uint2*>(dst) = packed;
}

template <int D>
__device__ __forceinline__ void decode_cluster_fwd(OPTD_ARGS) {
    using L = DecSmem<D>;
#if COMBINE == 3
    using S = ScatterSmem<D>;
    OPTD_CHECK_SMEM(FWD, D, S::BYTES);
#elif COMBINE >= 1
    using P = PushSmem<D>;
    OPTD_CHECK_SMEM(FWD, D, P::BYTES);
#else
    OPTD_CHECK_SMEM(FWD, D, L::BYTES);
#endif
    (void)o_partial;
    (void)lse_partial;
    (void)n_splits;
    (void)batch;
    // blockIdx.x is the rank in the cluster: the grid's x is exactly CLUSTER.
    const int split = blockIdx.x;
    extern __shared__ __align__(128) unsigned char dec_smem[];
    // The cluster's splits divide the key tiles some row sees (a window: from the tile of
    // row 0's first key, not 0); a rank past them has no tile, LSE -inf and weight 0.
    const int win = optd_window(window);  // 0 in a build without the window's code
    const DecTiles vis = dec_visible_tiles(seq_q, seq_k, causal, win);
    const int n_tiles = vis.end - vis.begin;
    const int tps = (n_tiles + CLUSTER - 1) / CLUSTER;
    const int t_begin = vis.begin + min(n_tiles, split * tps);
    const int t_end = min(vis.end, t_begin + tps);
    constexpr int C4 = D / 4;
#if COMBINE == 3
    // Every rank's mbarrier: its own arrive (now) and every byte the others will
    // store into it: their chunks of its share and their row LSEs.
    const unsigned mbar = smem_u32(dec_smem + S::MBAR);
    const int rows_sc = dec_rows_valid(heads_q, heads_kv, seq_q);
    const int total = rows_sc * C4;
    const int per = (total + CLUSTER - 1) / CLUSTER;
    const int own_begin = min(total, split * per);
    const int own_end = min(total, own_begin + per);
    auto arm = [&] {
        if (threadIdx.x == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(mbar));
            const unsigned tx = (unsigned)((CLUSTER - 1) * (rows_sc * 4 + (own_end - own_begin) * 16));
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar), "r"(tx) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    };
#elif COMBINE >= 1
    // COMBINE 1: rank 0's mbarrier expects one arrive per other rank (its thread 0,
    // after a CTA barrier). COMBINE 2: one arrive (rank 0's own, now) and every byte
    // the other ranks will store (st.async complete_tx). The init is made visible
    // cluster-wide by the fence and this (relaxed) cluster arrive, whose wait
    // precedes the first remote store.
    const unsigned mbar = smem_u32(dec_smem + P::MBAR);
    const int rows_push = dec_rows_valid(heads_q, heads_kv, seq_q);
    auto arm = [&] {
        if (split == 0 && threadIdx.x == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar), "r"(COMBINE == 2 ? 1 : CLUSTER - 1));
            if (COMBINE == 2) {
                const unsigned tx = (unsigned)((CLUSTER - 1) * rows_push * (D + 1) * 4);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar), "r"(tx) : "memory");
            }
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    };
#else
    auto arm = [] {};  // the pull combine's cluster barriers need no mbarrier
#endif
    // The mbarriers are armed once the split's first K/V tile and Q are on their way
    // (thread 0's init and its cluster-scope fence would otherwise delay warp 0's copies).
    decode_split_tile<D>(q, k, v, heads_q, heads_kv, seq_q, seq_k, softmax_scale, causal, win, strides, t_begin,
                         t_end, arm);

    float* xo = reinterpret_cast<float*>(dec_smem + L::XO);
    const int rows_valid = dec_rows_valid(heads_q, heads_kv, seq_q);
    // 1. This split's rows: the warps' copies summed, each 16-byte chunk by one
    //    thread; into warp 0's copy, except where COMBINE = 1 pushes them (below).
    auto chunk_sum = [&](int row, int c4) {
        float4 sum = *reinterpret_cast<const float4*>(xo + row * L::XO_ROW + 4 * c4);
#pragma unroll
        for (int kw = 1; kw < DEC_KEY_WARPS; ++kw) {
            const float4 x = *reinterpret_cast<const float4*>(xo + (kw * DEC_CTA_ROWS + row) * L::XO_ROW + 4 * c4);
            sum.x += x.x;
            sum.y += x.y;
            sum.z += x.z;
            sum.w += x.w;
        }
        return sum;
    };
    auto sum_in_place = [&]() {
        for (int c = threadIdx.x; c < rows_valid * C4; c += DEC_THREADS) {
            const int row = c / C4, c4 = c % C4;
            *reinterpret_cast<float4*>(xo + row * L::XO_ROW + 4 * c4) = chunk_sum(row, c4);
        }
    };
#if COMBINE == 3
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // every rank's mbarrier is initialised
    {
        const unsigned rx = smem_u32(dec_smem + S::RX);
        const unsigned rx_lse = smem_u32(dec_smem + S::RX_LSE);
        // 1. Each chunk of this split's rows, summed over the key warps, into a staging copy
        //    over xo (chunk c at float4 c: each rank's share is one contiguous run), then each
        //    other rank's share in one bulk copy into its slot for this rank, its bytes counted
        //    on its mbarrier; the row LSEs too (one more bulk copy per rank where their bytes
        //    are a multiple of 16), instead of one 16-byte st.async per chunk (4 per thread at
        //    MQA, 1024 remote stores per CTA): MQA at decode-wide's start 10.25 -> 10.05 us
        //    (H200, scripts/decode_cold.py --against, 9 paired rounds, 9/9; at K_FIRST 0 the
        //    same time). The send was not bound by its bytes (16-bit chunks, branch
        //    decode-half-xfer: no faster) nor by the gather (the key warps reduce-scattering
        //    into registers, branch decode-own-columns: 3.5-6% slower, the chunks then leave
        //    uncoalesced). The staged copy needs the senders alive until it has landed: the
        //    cluster barrier below. All of a thread's chunk sums are loaded before any is
        //    staged (a barrier between: the staging copy overwrites the rows others still read).
        constexpr int SEND_ITERS = (DEC_CTA_ROWS * C4 + DEC_THREADS - 1) / DEC_THREADS;
        float4 xs[SEND_ITERS];
#pragma unroll
        for (int i = 0; i < SEND_ITERS; ++i) {
            // Past the last chunk a thread re-reads the last one (never staged): no branch
            // between the loads.
            const int c = min((int)threadIdx.x + i * DEC_THREADS, total - 1);
            xs[i] = chunk_sum(c / C4, c % C4);
        }
        __syncthreads();  // every key warp's rows are read: xo is the staging copy from here
        float4* stage = reinterpret_cast<float4*>(xo);
#pragma unroll
        for (int i = 0; i < SEND_ITERS; ++i) {
            const int c = (int)threadIdx.x + i * DEC_THREADS;
            if (c < total) stage[c] = xs[i];
        }
        fence_proxy_async_cta();  // the staged chunks (and lse_s) are read by the bulk copies
        __syncthreads();
        const float* lse_s = reinterpret_cast<const float*>(dec_smem + L::LSE);
        const bool lse_bulk = rows_sc % 4 == 0;
        {
            // Thread t < CLUSTER - 1 sends to the t-th other rank; the next warp its LSEs.
            const int t = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32;
            if (t < CLUSTER - 1 && w < 2) {
                const int owner = t < split ? t : t + 1;
                const int slot = dec_rx_slot(split, owner);
                const unsigned rbar = dsmem_map(mbar, (unsigned)owner);
                if (w == 0) {
                    const int b0 = min(total, owner * per), b1 = min(total, b0 + per);
                    if (b1 > b0)
                        dsmem_bulk_copy(dsmem_map(rx + (unsigned)(slot * S::PER * 16), (unsigned)owner),
                                        smem_u32(stage + b0), (unsigned)((b1 - b0) * 16), rbar);
                } else if (lse_bulk) {
                    dsmem_bulk_copy(dsmem_map(rx_lse + (unsigned)(slot * DEC_CTA_ROWS * 4), (unsigned)owner), smem_u32(lse_s),
                                    (unsigned)(rows_sc * 4), rbar);
                }
            }
        }
        if (!lse_bulk) {
            // ... else the row LSEs to every other rank one by one (a rank's share may hold any row).
            for (int i = threadIdx.x; i < (CLUSTER - 1) * rows_sc; i += DEC_THREADS) {
                const int oi = i / rows_sc, row = i % rows_sc;
                const int owner = oi < split ? oi : oi + 1;
                const int slot = dec_rx_slot(split, owner);
                dsmem_st_async_f32(dsmem_map(rx_lse + (unsigned)((slot * DEC_CTA_ROWS + row) * 4), (unsigned)owner),
                                   lse_s[row], dsmem_map(mbar, (unsigned)owner));
            }
        }
        const int c0 = own_begin + (int)threadIdx.x;
        elem_t* const dst0 = c0 < own_end ? dec_out_chunk(o, strides, c0 / C4, c0 % C4, heads_q, heads_kv, seq_q) : o;
        cluster_mbar_wait(mbar, 0);
        // Every copy into this rank has landed, so every sender's reads of its staging copy
        // for it are done: the cluster barrier's arrive here and its wait at the end keep each
        // CTA (and its staging copy) alive until every rank has had all of its bytes.
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
        // 2. This rank's share: split z's chunk from its slot dec_rx_slot(z, split),
        //    or from the staging copy for z = split.
        const float* rxf = reinterpret_cast<const float*>(dec_smem + S::RX);
        const float* rxl = reinterpret_cast<const float*>(dec_smem + S::RX_LSE);
        for (int c = c0; c < own_end; c += DEC_THREADS) {
            const int row = c / C4, c4 = c % C4;
            float lse[CLUSTER];
#pragma unroll
            for (int z = 0; z < CLUSTER; ++z)
                lse[z] = z == split ? lse_s[row] : rxl[dec_rx_slot(z, split) * DEC_CTA_ROWS + row];
            dec_combine_chunk(
                lse,
                [&](int z) {
                    return z == split ? stage[c]
                                      : *reinterpret_cast<const float4*>(rxf + (dec_rx_slot(z, split) * S::PER + c - own_begin) * 4);
                },
                c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));
        }
        asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    }
#elif COMBINE >= 1
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // rank 0's mbarrier is initialised
    const unsigned rx = smem_u32(dec_smem + P::RX);
    const unsigned rx_lse = smem_u32(dec_smem + P::RX_LSE);
    if (COMBINE == 2 && split != 0) {
        // Each chunk straight into rank 0's slot split - 1, its bytes counted on rank 0's
        // mbarrier as they land: nothing to order, nothing to wait for here. (A staging copy
        // sent by one bulk copy, as COMBINE 3 does, was 1.6-3% slower at the B 1 and B 64
        // winners on the H200, 2026-11-28: few rows per CTA, and the senders then wait for
        // rank 0 before they exit.)
        const unsigned slot = dsmem_map(rx + (unsigned)((split - 1) * DEC_CTA_ROWS * D * 4), 0);
        const unsigned rbar = dsmem_map(mbar, 0);
        for (int c = threadIdx.x; c < rows_valid * C4; c += DEC_THREADS) {
            const int row = c / C4, c4 = c % C4;
            dsmem_st_async_f32x4(slot + (unsigned)((row * D + 4 * c4) * 4), chunk_sum(row, c4), rbar);
        }
        const float* lse_s = reinterpret_cast<const float*>(dec_smem + L::LSE);
        if ((int)threadIdx.x < rows_valid)
            dsmem_st_async_f32(dsmem_map(rx_lse + (unsigned)(((split - 1) * DEC_CTA_ROWS + threadIdx.x) * 4), 0),
                               lse_s[threadIdx.x], rbar);
        return;  // nothing reads this CTA's shared memory
    }
    if (split != 0) {
        // Push this split's rows and LSEs into rank 0's slot split - 1 as they are summed
        // (no local copy and no barrier between the sum and the push), then arrive.
        const unsigned slot = dsmem_map(rx + (unsigned)((split - 1) * DEC_CTA_ROWS * D * 4), 0);
        for (int c = threadIdx.x; c < rows_valid * C4; c += DEC_THREADS) {
            const int row = c / C4, c4 = c % C4;
            dsmem_st_f32x4(slot + (unsigned)((row * D + 4 * c4) * 4), chunk_sum(row, c4));
        }
        const float* lse_s = reinterpret_cast<const float*>(dec_smem + L::LSE);
        if ((int)threadIdx.x < rows_valid)
            dsmem_st_f32(dsmem_map(rx_lse + (unsigned)(((split - 1) * DEC_CTA_ROWS + threadIdx.x) * 4), 0),
                         lse_s[threadIdx.x]);
        // One arrive per CTA: the barrier orders every thread's remote stores before
        // thread 0's arrive, whose release (cluster scope) is cumulative over them (the
        // argument of decode.cu's split semaphore). An arrive per thread, 7 x 128 remote
        // arrivals on one mbarrier at CLUSTER 8, took 0.8 us per call at B 1 x SK 4096
        // (scripts/decode_timeline.py, H100, 2026-11-27).
        __syncthreads();
        if (threadIdx.x == 0) dsmem_mbar_arrive(dsmem_map(mbar, 0));
        return;  // nothing reads this CTA's shared memory
    }
    sum_in_place();
    __syncthreads();  // rank 0's summed rows are read by other threads below
    const int c0 = threadIdx.x;
    elem_t* const dst0 = c0 < rows_valid * C4 ? dec_out_chunk(o, strides, c0 / C4, c0 % C4, heads_q, heads_kv, seq_q) : o;
    cluster_mbar_wait(mbar, 0);
    {
        const float* lse_own = reinterpret_cast<const float*>(dec_smem + L::LSE);
        const float* rxf = reinterpret_cast<const float*>(dec_smem + P::RX);
        const float* rxl = reinterpret_cast<const float*>(dec_smem + P::RX_LSE);
        for (int c = c0; c < rows_valid * C4; c += DEC_THREADS) {
            const int row = c / C4, c4 = c % C4;
            float lse[CLUSTER];
            lse[0] = lse_own[row];
#pragma unroll
            for (int z = 1; z < CLUSTER; ++z) lse[z] = rxl[(z - 1) * DEC_CTA_ROWS + row];
            dec_combine_chunk(
                lse,
                [&](int z) {
                    return z == 0 ? *reinterpret_cast<const float4*>(xo + row * L::XO_ROW + 4 * c4)
                                  : *reinterpret_cast<const float4*>(rxf + ((z - 1) * DEC_CTA_ROWS + row) * D + 4 * c4);
                },
                c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));
        }
    }
#else
    sum_in_place();
    const int c0 = split + CLUSTER * (int)threadIdx.x;
    elem_t* const dst0 = c0 < rows_valid * C4 ? dec_out_chunk(o, strides, c0 / C4, c0 % C4, heads_q, heads_kv, seq_q) : o;
    cluster_sync();  // 2.

    // 3. The cluster combines: chunk c of the rows goes to CTA c % CLUSTER.
    const unsigned xo_local = smem_u32(dec_smem + L::XO);
    const unsigned lse_local = smem_u32(dec_smem + L::LSE);
    for (int c = c0; c < rows_valid * C4; c += CLUSTER * DEC_THREADS) {
        const int row = c / C4, c4 = c % C4;
        float lse[CLUSTER];
#pragma unroll
        for (int z = 0; z < CLUSTER; ++z) lse[z] = dsmem_ld_f32(dsmem_map(lse_local + 4 * row, z));
        const unsigned off = xo_local + (unsigned)((row * L::XO_ROW + 4 * c4) * 4);
        dec_combine_chunk(
            lse, [&](int z) { return dsmem_ld_f32x4(dsmem_map(off, z)); },
            c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));
    }
    cluster_sync();  // 4.
#endif
}

#if OPTD_BUILD_D64
extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(DEC_THREADS, 1) optd_fwd_d64(OPTD_ARGS) {
    decode_cluster_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D96
extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(DEC_THREADS, 1) optd_fwd_d96(OPTD_ARGS) {
    decode_cluster_fwd<96>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(DEC_THREADS, 1) optd_fwd_d128(OPTD_ARGS) {
    decode_cluster_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D256
extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(DEC_THREADS, 1) optd_fwd_d256(OPTD_ARGS) {
    decode_cluster_fwd<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
