/******************************************************************************
 * decode-split: flash-decoding for SQ = 1 .. 16 query rows against a KV cache
 * of SK keys, grouped-query heads packed into the tensor-core tile.
 *
 * Decode reads the whole KV cache (2 * B * HKV * SK * D elements) to produce
 * B * HQ * SQ rows: it is bound by HBM bandwidth (large caches) or by latency
 * (small ones), never by the tensor cores. So the kernel is built around the
 * bytes in flight, not the FLOPs:
 *
 *   - PackGQA (FlashAttention-3, FlashInfer): the G = HQ / HKV query heads
 *     that share a KV head, times their SQ rows, are the M rows of one
 *     mma.sync m16n8k16 tile, so each K/V tile is loaded once for the whole
 *     group. Packed row r = gi * SQ + s is query head kvh * G + gi, row s
 *     (Llama-3: G = 4, SQ = 1 -> rows 0..3 of 16; the rest are zero padding,
 *     computed and never stored). G * SQ > 16 (MQA: G = 32) takes
 *     cdiv(G * SQ, 16) row tiles, gridDim.z; their CTAs read the same K/V,
 *     the second time mostly from L2.
 *   - flash-decoding: the KV sequence is split across gridDim.x CTAs, so that
 *     a few (b, kv head) groups still fill the SMs. Split z walks key tiles
 *     [z * tps, min(n_tiles, (z + 1) * tps)), tps = cdiv(n_tiles, n_splits),
 *     n_tiles = cdiv(SK, TILE_N), TILE_N = NUM_WARPS * BLOCK_N keys.
 *   - inside a CTA, warp w takes keys [w * BLOCK_N, (w + 1) * BLOCK_N) of every
 *     tile (its own online softmax over 1 / NUM_WARPS of the keys); the
 *     warps merge once at the end through shared memory.
 *   - a cp.async ring of STAGES K/V tiles (16-byte copies, XOR-swizzled rows)
 *     keeps (STAGES - 1) * TILE_N * D * 4 bytes of K and V in flight per CTA.
 *
 * Per CTA (split z, group b * HKV + kvh, row tile):
 *   prologue  the packed Q tile (16 x D, rows >= G * SQ zero-filled) and the
 *             first STAGES - 1 K/V tiles in flight (cp.async); Q -> A
 *             fragments in registers (ldmatrix.x4), held for the whole loop.
 *   per tile  wait for tile i (cp.async.wait_group STAGES - 2), __syncthreads,
 *             issue tile i + STAGES - 1 into the slot tile i - 1 used; then
 *             each warp on its BLOCK_N keys: S = Q K^T (mma.sync, K's B
 *             fragments by ldmatrix.x4), masking only on a tile that needs it
 *             (keys >= SK; causal: the last tile, see below), online softmax
 *             per row (common/online_softmax.cuh, quad reductions of
 *             common/quad_softmax.cuh), O += P V (P from the S registers,
 *             V's fragments by ldmatrix.x4.trans).
 *   merge     the ring is drained; each warp publishes its row maxima m_w and
 *             sums l_w (in the Q tile's space); every warp scales its O by
 *             f_w = exp2((m_w - m) c) / L (m = max_w m_w,
 *             L = sum_w l_w exp2((m_w - m) c), c = softmax_scale * log2 e) and
 *             stores it, fp32, for its valid rows only, after the Q tile; then
 *             all threads sum the NUM_WARPS copies of each valid row, 16 bytes
 *             at a time, and store it: to O through strides.o (n_splits = 1,
 *             elem_t), or to o_partial with lse_partial (n_splits > 1).
 *   combine   (n_splits > 1, a second launch) one warp per row of O:
 *             w_z = exp(lse_z - max_z lse_z), O = sum_z w_z O_z / sum_z w_z,
 *             lane l owning D / 32 consecutive dims, the splits' loads issued
 *             COMBINE_UNROLL at a time.
 *
 * Partial results (n_splits > 1), fp32, FlashAttention's softmax_lse
 * convention (the ABI's contiguous scratch, row index (b * HQ + h) * SQ + s):
 *   o_partial[z][b][h][s][:]  = O_z, normalized by the split's own row sum
 *   lse_partial[z][b][h][s]   = natural-log LSE of the split's scaled scores,
 *                               -inf (and O_z = 0) when the split has no key
 *                               the row sees (a causal row s < SQ - 1 whose
 *                               last split holds only keys past its diagonal).
 *
 * Masking. Causal decode rows are the last SQ positions: row s sees keys
 * <= s + SK - SQ (optd_causal_offset), so only keys > SK - SQ, all in the last
 * tile of the last split, are ever masked for causality; ragged SK (4000)
 * masks the same tile's keys >= SK (zero-filled in shared memory, so that
 * 0 * V is never NaN). A warp's sub-tile wholly past SK skips the math.
 *
 * Addressing: every row of Q, K, V and O goes through `strides` (both layouts,
 * padded views); rows start 16-byte aligned, which the cp.async copies and the
 * 16-byte O stores need. o_partial / lse_partial are contiguous.
 *
 * Knobs:   BLOCK_N        keys per warp per tile (n of S = Q K^T)     16, 32, 64
 *          NUM_WARPS      warps per CTA, splitting each tile's keys   4, 2, 8
 *          STAGES         K/V tiles in the cp.async ring              3, 2, 4
 *          SPLIT_WAVES    split target: CTAs of the first launch
 *                         >= SPLIT_WAVES * SMS where the keys allow   1, 2, 4
 *          MIN_SPLIT_TILES  fewest key tiles per split (a split is
 *                         a fixed cost: prologue, merge, combine row) 1, 2, 4
 *          (SPLIT_WAVES and MIN_SPLIT_TILES only enter the launch formulas.)
 * Shared (dynamic, bytes), TILE_N = NUM_WARPS * BLOCK_N, rows of 2 D bytes:
 *          2 D * 16  (packed Q tile)
 *          + max(2 D * 2 * STAGES * TILE_N        (K and V ring),
 *                NUM_WARPS * 16 * (D + 8) * 4)    (fp32 O rows of the merge)
 *          (DecSmem<D>::BYTES, checked against the spec's smem formula by
 *          OPTD_CHECK_SMEM); e.g. D 128, 4 warps, BLOCK_N 32, 3 stages:
 *          4 KiB + 192 KiB. Combos over the device's opt-in limit (227 KiB on
 *          sm_90) are rejected by the gate.
 * CTAs:    fwd      n_splits x (B * HKV) x cdiv(G * SQ, 16), NUM_WARPS * 32
 *                   threads (B * HKV <= 65535)
 *          combine  cdiv(B * HQ * SQ, 4) x 1 x 1, 128 threads, only when
 *                   n_splits > 1
 * n_splits: groups = B * HKV * cdiv(G * SQ, 16) CTAs per split;
 *          want = min(cdiv(SPLIT_WAVES * SMS, groups),
 *                     cdiv(n_tiles, MIN_SPLIT_TILES)), at least 1; then lowered
 *          to the fewest splits with the same tiles per split, so that no split
 *          is empty (the kernel derives its range from n_splits alone).
 * Registers: per thread D / 4 (Q fragments) + D / 2 (O) + BLOCK_N / 2 (S)
 *          fp32 / b32 values plus addressing: D 128, BLOCK_N 64: 32 + 64 + 32;
 *          __launch_bounds__(threads, 1).
 * Regime:  max_sq = 16 below: the gate refuses shapes with SQ > 16 (prefill),
 *          which the other templates serve; the kernel itself is correct for
 *          any SQ (more row tiles), just not what those shapes want.
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "decode-split"
description = "flash-decoding: GQA group x SQ rows packed into one mma.sync m16 tile, KV sequence split across CTAs, cp.async K/V ring, warps split the keys, LSE combine"
min_cc = 80
max_sq = 16

[knobs]
BLOCK_N = [32, 16, 64]
NUM_WARPS = [4, 2, 8]
STAGES = [3, 2, 4]
SPLIT_WAVES = [1, 2, 4]
MIN_SPLIT_TILES = [1, 2, 4]

[derived]
tile_n = "NUM_WARPS * BLOCK_N"
row_tiles = "cdiv(G * SQ, 16)"
groups = "B * HKV * row_tiles"
kv_tiles = "cdiv(SK, tile_n)"
want_splits = "max(1, min(cdiv(SPLIT_WAVES * SMS, groups), cdiv(kv_tiles, MIN_SPLIT_TILES)))"
tiles_per_split = "cdiv(kv_tiles, want_splits)"
splits = "cdiv(kv_tiles, tiles_per_split)"

[[launch]]
kernel = "fwd"
grid = ["splits", "B * HKV", "row_tiles"]
block = ["NUM_WARPS * 32", "1", "1"]
smem = "ELEM_BYTES * D * 16 + max(ELEM_BYTES * D * 2 * STAGES * tile_n, NUM_WARPS * 16 * (D + 8) * 4)"

[[launch]]
kernel = "combine"
when = "splits > 1"
grid = ["cdiv(B * HQ * SQ, 4)", "1", "1"]
block = ["128", "1", "1"]
smem = "0"
*/

#include "common/optd.cuh"
#include "common/quad_softmax.cuh"
#include "common/async_copy.cuh"

#ifndef BLOCK_N
#error "BLOCK_N must be defined"
#endif
#ifndef NUM_WARPS
#error "NUM_WARPS must be defined"
#endif
#ifndef STAGES
#error "STAGES must be defined"
#endif
#if BLOCK_N % 16 != 0 || BLOCK_N < 16
#error "BLOCK_N must be a positive multiple of 16 (two n8 tiles per ldmatrix.x4)"
#endif
#if STAGES < 2
#error "STAGES must be at least 2"
#endif
#if NUM_WARPS < 1 || NUM_WARPS > 16
#error "NUM_WARPS must be in 1..16"
#endif

#define DEC_ROWS 16                        // packed query rows per CTA: one m16 tile
#define DEC_TILE_N (NUM_WARPS * BLOCK_N)   // keys per CTA tile
#define DEC_THREADS (NUM_WARPS * 32)
#define DEC_COMBINE_ROWS 4                 // rows (warps) per combine CTA: 128 threads
#define DEC_COMBINE_UNROLL 8               // splits whose loads a combine lane has in flight

// ---------------------------------------------------------------------------
// PTX wrappers (sm_80+).
// ---------------------------------------------------------------------------
__device__ __forceinline__ void dec_ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void dec_ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D (16x8, fp32) += A (16x16, row) * B (16x8, col).
__device__ __forceinline__ void dec_mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if OPTD_BF16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Byte offset of 16-byte chunk `chunk` of tile row `row`: rows of D elements,
// chunk c stored at c ^ (row % 8), so the 8 row addresses of every ldmatrix
// phase and of the cp.async writes hit 8 distinct 16-byte bank groups.
template <int D>
__device__ __forceinline__ unsigned dec_tile_off(int row, int chunk) {
    return static_cast<unsigned>(row * (2 * D) + ((chunk ^ (row & 7)) << 4));
}

// Dynamic shared memory (bytes from the base): the packed Q tile, then the K
// and V rings; after the key loop the merge puts the warps' row maxima and
// sums in the Q tile and their fp32 O rows (padded to D + 8 floats against
// bank conflicts of the float2 stores) over the drained ring.
// BYTES = the spec's smem formula.
template <int D>
struct DecSmem {
    static constexpr int ROW_BYTES = 2 * D;
    static constexpr int Q_BYTES = DEC_ROWS * ROW_BYTES;
    static constexpr int KV_BYTES = DEC_TILE_N * ROW_BYTES;  // one K (or V) tile
    static constexpr int XO_ROW = D + 8;                     // floats per merged O row
    static constexpr int Q = 0;
    static constexpr int K = Q + Q_BYTES;                    // STAGES x KV_BYTES
    static constexpr int V = K + STAGES * KV_BYTES;          // STAGES x KV_BYTES
    static constexpr int RING_END = V + STAGES * KV_BYTES;
    static constexpr int XO = Q_BYTES;
    static constexpr int XO_END = XO + NUM_WARPS * DEC_ROWS * XO_ROW * 4;
    static constexpr int BYTES = RING_END > XO_END ? RING_END : XO_END;
    static_assert(2 * NUM_WARPS * DEC_ROWS * 4 <= Q_BYTES, "row maxima and sums must fit in the Q tile");
};

// ---------------------------------------------------------------------------
// Forward: one (split, b * HKV + kv head, row tile) per CTA.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void decode_fwd(OPTD_ARGS) {
    static_assert(D % 64 == 0, "D must be 64 or 128 (8 or 16 chunks, the swizzle permutes 8)");
    using L = DecSmem<D>;
    OPTD_CHECK_SMEM(FWD, D, L::BYTES);
    constexpr int CH = D / 8;        // 16-byte chunks per row
    constexpr int ROW_BYTES = L::ROW_BYTES;
    constexpr int KV_BYTES = L::KV_BYTES;
    constexpr int KSTEPS = D / 16;   // k-steps of S = Q K^T
    constexpr int NT = BLOCK_N / 8;  // n8 tiles of S per warp
    constexpr int DT = D / 8;        // n8 tiles of O
    constexpr int Q_ITERS = (DEC_ROWS * CH + DEC_THREADS - 1) / DEC_THREADS;
    static_assert(DEC_THREADS % CH == 0, "a thread copies one chunk column of the K/V rows");
    constexpr int KV_RSTEP = DEC_THREADS / CH;  // rows between a thread's copies
    static_assert(DEC_TILE_N % KV_RSTEP == 0, "K/V tile chunks must split evenly over the threads");
    constexpr int KV_ITERS = DEC_TILE_N / KV_RSTEP;

    extern __shared__ __align__(128) unsigned char dec_smem[];
    const unsigned s_q = smem_u32(dec_smem) + L::Q;
    const unsigned s_k = smem_u32(dec_smem) + L::K;
    const unsigned s_v = smem_u32(dec_smem) + L::V;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;   // accumulator rows g, g + 8
    const int tq = lane & 3;   // accumulator column pair
    const int mi = lane >> 3;  // ldmatrix: which 8x8 matrix this lane addresses
    const int lr = lane & 7;   // ldmatrix: row within that matrix

    const int split = blockIdx.x;
    const int b = blockIdx.y / heads_kv;
    const int kvh = blockIdx.y % heads_kv;
    const int group = heads_q / heads_kv;
    const int rows_valid = min(DEC_ROWS, group * seq_q - (int)blockIdx.z * DEC_ROWS);  // packed rows of this tile
    const int prow0 = blockIdx.z * DEC_ROWS;  // first packed row: r = gi * SQ + s

    const elem_t* kh = k + optd_head_off(strides.k_b, strides.k_h, b, kvh);
    const elem_t* vh = v + optd_head_off(strides.v_b, strides.v_h, b, kvh);

    // This split's key tiles (the spec's formula leaves none empty).
    const int n_tiles = (seq_k + DEC_TILE_N - 1) / DEC_TILE_N;
    const int tps = (n_tiles + n_splits - 1) / n_splits;
    const int t_begin = split * tps;
    const int t_end = min(n_tiles, t_begin + tps);
    const int my_tiles = max(0, t_end - t_begin);

    // --- packed Q tile: row r = query head kvh * G + (prow0 + r) / SQ, row (prow0 + r) % SQ
#pragma unroll
    for (int i = 0; i < Q_ITERS; ++i) {
        const int c = tid + i * DEC_THREADS;
        if ((DEC_ROWS * CH) % DEC_THREADS != 0 && c >= DEC_ROWS * CH) break;
        const int r = c / CH, ch = c % CH;
        const bool ok = r < rows_valid;
        const int pr = prow0 + r;
        const elem_t* src = q;
        if (ok) {
            const int h = kvh * group + pr / seq_q;
            src = q + optd_head_off(strides.q_b, strides.q_h, b, h) + (long long)(pr % seq_q) * strides.q_s + ch * 8;
        }
        cp_async16(s_q + dec_tile_off<D>(r, ch), src, ok);
    }

    // K/V tile t -> ring slot (t - t_begin) % STAGES, keys >= SK zero-filled.
    // Copy i of a thread is chunk tid % CH of row tid / CH + i * KV_RSTEP.
    const int ld_row = tid / CH;
    const int ld_ch = tid % CH;
    const long long k_row = strides.k_s, v_row = strides.v_s;
    const elem_t* k_thr = kh + (long long)ld_row * k_row + ld_ch * 8;
    const elem_t* v_thr = vh + (long long)ld_row * v_row + ld_ch * 8;
    auto load_kv = [&](int t) {
        const int kv0 = t * DEC_TILE_N;
        const int rows_left = seq_k - kv0 - ld_row;  // copy i is a key < SK iff i * KV_RSTEP < this
        const unsigned slot = (unsigned)(((t - t_begin) % STAGES) * KV_BYTES);
        const elem_t* ks = k_thr + (long long)kv0 * k_row;
        const elem_t* vs = v_thr + (long long)kv0 * v_row;
#pragma unroll
        for (int i = 0; i < KV_ITERS; ++i) {
            const bool ok = i * KV_RSTEP < rows_left;
            const unsigned dst = slot + dec_tile_off<D>(ld_row + i * KV_RSTEP, ld_ch);
            cp_async16(s_k + dst, ok ? ks + (long long)i * KV_RSTEP * k_row : kh, ok);
            cp_async16(s_v + dst, ok ? vs + (long long)i * KV_RSTEP * v_row : vh, ok);
        }
    };

    // Group 0 holds Q and the first tile; groups 1 .. STAGES - 2 one tile each.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < my_tiles) load_kv(t_begin + s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();

    // Per-lane ldmatrix offsets; every matrix starts at a row that is a multiple
    // of 8, so for an even chunk 2c: tile_off(row, 2c + x) = tile_off(row, x) ^ (c << 5).
    const unsigned q_lane = dec_tile_off<D>((mi & 1) * 8 + lr, mi >> 1);
    const unsigned k_lane = dec_tile_off<D>((mi >> 1) * 8 + lr, mi & 1);
    const unsigned v_lane = dec_tile_off<D>((mi & 1) * 8 + lr, mi >> 1);
    unsigned qf[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) dec_ldmatrix_x4(qf[kk], s_q + (q_lane ^ (unsigned)(kk << 5)));

    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    OnlineSoftmax<2, false, Exp2Approx> sm;
    sm.init();
    const float sl2 = softmax_scale * OPTD_LOG2E;
    auto acc_at = [&](int, int j, int e) -> float& { return acc[j][e]; };

    // Causal: row s sees keys < limit(s); the thread's rows g and g + 8 have
    // s = packed row % SQ (padding rows: any s, never stored).
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k));
    int lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) lim[h] = mask.limit((prow0 + g + 8 * h) % seq_q);

    for (int i = 0; i < my_tiles; ++i) {
        cp_async_wait<STAGES - 2>();  // tile i has landed (this thread's copies)
        __syncthreads();              // ... everyone's; slot (i - 1) % STAGES is free
        if (i + STAGES - 1 < my_tiles) load_kv(t_begin + i + STAGES - 1);
        cp_async_commit();

        const int kv0 = (t_begin + i) * DEC_TILE_N + warp * BLOCK_N;  // this warp's first key
        if (kv0 >= seq_k) continue;  // warp-uniform: the ragged tail of the last tile
        const unsigned sub = (unsigned)((i % STAGES) * KV_BYTES + warp * BLOCK_N * ROW_BYTES);
        const unsigned kb = s_k + sub;
        const unsigned vb = s_v + sub;

        // S = Q K^T: ldmatrix.x4 on K gives the B fragments of n-tiles 2 j2, 2 j2 + 1.
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
            for (int j2 = 0; j2 < NT / 2; ++j2) {
                unsigned bf[4];
                dec_ldmatrix_x4(bf, kb + j2 * 16 * ROW_BYTES + (k_lane ^ (unsigned)(kk << 5)));
                dec_mma16816(s[2 * j2], qf[kk], bf[0], bf[1]);
                dec_mma16816(s[2 * j2 + 1], qf[kk], bf[2], bf[3]);
            }
        }

        // Masking, only where some row loses a key: past SK, or past the first
        // row's diagonal (causal; the last tile of the last split).
        if (mask.partial(kv0, BLOCK_N, 0)) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (kv0 + 8 * j + 2 * tq + (e & 1) >= lim[e >> 1]) s[j][e] = OPTD_NEG_INF;
                }
            }
        }

        // Online softmax: rows g (e = 0, 1) and g + 8 (e = 2, 3).
        auto s_at = [&](int, int j, int e) -> float& { return s[j][e]; };
        float mx[2], bias[2], corr[2];
        m16n8_row_max<1, NT>(s_at, sm.m, mx);
        sm.rescale(mx, sl2, bias, corr);
        m16n8_scale_rows<1, DT>(acc_at, corr);
        m16n8_exp2<1, NT>(s_at, sm, sl2, bias);

        // O += P V: P's A fragment of keys 16 kk2 .. + 15 is n-tiles 2 kk2, 2 kk2 + 1.
#pragma unroll
        for (int kk2 = 0; kk2 < NT / 2; ++kk2) {
            unsigned a[4];
            a[0] = pack2(s[2 * kk2][0], s[2 * kk2][1]);
            a[1] = pack2(s[2 * kk2][2], s[2 * kk2][3]);
            a[2] = pack2(s[2 * kk2 + 1][0], s[2 * kk2 + 1][1]);
            a[3] = pack2(s[2 * kk2 + 1][2], s[2 * kk2 + 1][3]);
#pragma unroll
            for (int dj2 = 0; dj2 < DT / 2; ++dj2) {
                unsigned bf[4];
                dec_ldmatrix_x4_trans(bf, vb + kk2 * 16 * ROW_BYTES + (v_lane ^ (unsigned)(dj2 << 5)));
                dec_mma16816(acc[2 * dj2], a, bf[0], bf[1]);
                dec_mma16816(acc[2 * dj2 + 1], a, bf[2], bf[3]);
            }
        }
    }
    cp_async_wait<0>();  // only empty groups can be pending; drain them anyway

    // --- merge of the warps' key ranges -------------------------------------
    // Maxima and sums in the Q tile ([2][NUM_WARPS][16] floats; Q was read into
    // registers before the first tile), O rows over the drained ring.
    float* ml = reinterpret_cast<float*>(dec_smem);
    float* xo = reinterpret_cast<float*>(dec_smem + L::XO);
    float l_sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) l_sum[h] = quad_sum(sm.l[h]);
    __syncthreads();  // every warp is past its last K/V tile
    if (tq == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            ml[warp * DEC_ROWS + g + 8 * h] = sm.m[h];
            ml[(NUM_WARPS + warp) * DEC_ROWS + g + 8 * h] = l_sum[h];
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        if (row >= rows_valid) continue;
        float m = OPTD_NEG_INF;
#pragma unroll
        for (int w = 0; w < NUM_WARPS; ++w) m = fmaxf(m, ml[w * DEC_ROWS + row]);
        float total = 0.f;
        if (m != OPTD_NEG_INF) {
#pragma unroll
            for (int w = 0; w < NUM_WARPS; ++w) {
                const float mw = ml[w * DEC_ROWS + row];
                if (mw != OPTD_NEG_INF) total += ml[(NUM_WARPS + w) * DEC_ROWS + row] * fast_exp2((mw - m) * sl2);
            }
        }
        // A row no warp saw a key for (total 0) comes out O = 0, LSE = -inf.
        const float f = (sm.m[h] == OPTD_NEG_INF || total <= 0.f) ? 0.f : fast_exp2((sm.m[h] - m) * sl2) / total;
        float* xrow = xo + (warp * DEC_ROWS + row) * L::XO_ROW + 2 * tq;
#pragma unroll
        for (int j = 0; j < DT; ++j)
            *reinterpret_cast<float2*>(xrow + 8 * j) = make_float2(acc[j][2 * h] * f, acc[j][2 * h + 1] * f);
        if (n_splits > 1 && warp == 0 && tq == 0) {
            const int pr = prow0 + row;
            const int hq = kvh * group + pr / seq_q;
            const size_t prow = (((size_t)split * batch + b) * heads_q + hq) * seq_q + pr % seq_q;
            lse_partial[prow] = total > 0.f ? (m * sl2 + __log2f(total)) * OPTD_LN2 : OPTD_NEG_INF;
        }
    }
    __syncthreads();

    // Sum the warps' copies of each valid row, 4 floats (16 bytes of xo) per step.
    constexpr int C4 = D / 4;
    for (int c = tid; c < rows_valid * C4; c += DEC_THREADS) {
        const int row = c / C4, c4 = c % C4;
        float4 sum = *reinterpret_cast<const float4*>(xo + row * L::XO_ROW + 4 * c4);
#pragma unroll
        for (int w = 1; w < NUM_WARPS; ++w) {
            const float4 x = *reinterpret_cast<const float4*>(xo + (w * DEC_ROWS + row) * L::XO_ROW + 4 * c4);
            sum.x += x.x;
            sum.y += x.y;
            sum.z += x.z;
            sum.w += x.w;
        }
        const int pr = prow0 + row;
        const int hq = kvh * group + pr / seq_q;
        const int sr = pr % seq_q;
        if (n_splits == 1) {
            elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, hq) + (long long)sr * strides.o_s;
            uint2 packed;
            packed.x = pack2(sum.x, sum.y);
            packed.y = pack2(sum.z, sum.w);
            *reinterpret_cast<uint2*>(orow + 4 * c4) = packed;
        } else {
            const size_t prow = (((size_t)split * batch + b) * heads_q + hq) * seq_q + sr;
            *reinterpret_cast<float4*>(o_partial + prow * D + 4 * c4) = sum;
        }
    }
}

// ---------------------------------------------------------------------------
// Combine (n_splits > 1): one warp per output row (b * HQ + h) * SQ + s.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void decode_combine(OPTD_ARGS) {
    OPTD_CHECK_SMEM(COMBINE, D, 0);  // launched as role `combine` with smem "0"
    constexpr int VEC = D / 32;      // consecutive dims per lane: 2 or 4
    static_assert(VEC == 2 || VEC == 4, "D must be 64 or 128");
    (void)q;
    (void)k;
    (void)v;
    (void)heads_kv;
    (void)seq_k;
    (void)softmax_scale;
    (void)causal;
    const int lane = threadIdx.x & 31;
    const size_t rows_total = (size_t)batch * heads_q * seq_q;
    const size_t row = (size_t)blockIdx.x * DEC_COMBINE_ROWS + (threadIdx.x >> 5);
    if (row >= rows_total) return;

    // Max LSE over the splits, lanes reading different splits.
    float m = OPTD_NEG_INF;
    for (int z = lane; z < n_splits; z += 32) m = fmaxf(m, lse_partial[(size_t)z * rows_total + row]);
    m = warp_max(m);

    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = 0.f;
    float wsum = 0.f;
    if (m != OPTD_NEG_INF) {
        // Every split wrote every row (O = 0, LSE = -inf where it saw no key),
        // so the loads need no guard beyond z < n_splits; DEC_COMBINE_UNROLL
        // splits' loads go out before their first use.
        for (int z0 = 0; z0 < n_splits; z0 += DEC_COMBINE_UNROLL) {
            float w[DEC_COMBINE_UNROLL];
            float x[DEC_COMBINE_UNROLL][VEC];
#pragma unroll
            for (int u = 0; u < DEC_COMBINE_UNROLL; ++u) {
                const int z = z0 + u;
                w[u] = 0.f;
#pragma unroll
                for (int e = 0; e < VEC; ++e) x[u][e] = 0.f;
                if (z < n_splits) {
                    // Same address in every lane: one broadcast load.
                    w[u] = lse_partial[(size_t)z * rows_total + row];
                    const float* src = o_partial + ((size_t)z * rows_total + row) * D + lane * VEC;
                    if constexpr (VEC == 4) {
                        const float4 t = *reinterpret_cast<const float4*>(src);
                        x[u][0] = t.x, x[u][1] = t.y, x[u][2] = t.z, x[u][3] = t.w;
                    } else {
                        const float2 t = *reinterpret_cast<const float2*>(src);
                        x[u][0] = t.x, x[u][1] = t.y;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < DEC_COMBINE_UNROLL; ++u) {
                // exp(-inf) = 0: a split that saw no key adds nothing; the
                // slots past n_splits are not splits at all.
                const float wu = z0 + u < n_splits ? fast_exp2((w[u] - m) * OPTD_LOG2E) : 0.f;
                wsum += wu;
#pragma unroll
                for (int e = 0; e < VEC; ++e) acc[e] = fmaf(wu, x[u][e], acc[e]);
            }
        }
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    const int s = (int)(row % seq_q);
    const int h = (int)((row / seq_q) % heads_q);
    const int b = (int)(row / ((size_t)seq_q * heads_q));
    elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, h) + (long long)s * strides.o_s + lane * VEC;
    if constexpr (VEC == 4) {
        uint2 packed;
        packed.x = pack2(acc[0] * inv, acc[1] * inv);
        packed.y = pack2(acc[2] * inv, acc[3] * inv);
        *reinterpret_cast<uint2*>(orow) = packed;
    } else {
        *reinterpret_cast<unsigned*>(orow) = pack2(acc[0] * inv, acc[1] * inv);
    }
}

// minBlocks = 1: the Q fragments, O accumulators and S tile stay in registers.
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) optd_fwd_d64(OPTD_ARGS) {
    decode_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) optd_fwd_d128(OPTD_ARGS) {
    decode_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}

extern "C" __global__ void __launch_bounds__(DEC_COMBINE_ROWS * 32) optd_combine_d64(OPTD_ARGS) {
    decode_combine<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}

extern "C" __global__ void __launch_bounds__(DEC_COMBINE_ROWS * 32) optd_combine_d128(OPTD_ARGS) {
    decode_combine<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
