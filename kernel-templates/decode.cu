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
 *     cdiv(G * SQ, 16) row tiles: M_TILES of them per CTA (the warps split
 *     between the row tiles, each K/V tile read once for all of them), the
 *     rest as gridDim.z, whose CTAs read the same K/V, mostly from L2.
 *   - flash-decoding: the KV sequence is split across gridDim.x CTAs, so that
 *     a few (b, kv head) groups still fill the SMs. Split z walks key tiles
 *     t0 + [z * tps, min(n_tiles, (z + 1) * tps)), tps = cdiv(n_tiles, n_splits),
 *     n_tiles = cdiv(SK, TILE_N) - t0, TILE_N = NUM_WARPS * BLOCK_N keys, t0 = 0
 *     (a window: the tile of the first key a row sees, see Masking).
 *   - inside a CTA, warp w takes keys [w * BLOCK_N, (w + 1) * BLOCK_N) of every
 *     tile (its own online softmax over 1 / NUM_WARPS of the keys); the
 *     warps merge once at the end through shared memory.
 *   - a cp.async ring of STAGES K/V tiles (16-byte copies, XOR-swizzled rows)
 *     keeps (STAGES - 1) * TILE_N * D * 4 bytes of K and V in flight per CTA.
 *
 * Per CTA (split z, group b * HKV + kvh, row tile):
 *   prologue  the first STAGES - 1 K/V tiles in flight (cp.async; tile 0's
 *             copies first, then the packed Q tile's: 16 x D, rows >= G * SQ
 *             zero-filled); Q -> A fragments in registers (ldmatrix.x4),
 *             held for the whole loop.
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
 *   combine   (n_splits > 1) one warp per row of O:
 *             w_z = exp(lse_z - max_z lse_z), O = sum_z w_z O_z / sum_z w_z,
 *             lane l owning D / 32 consecutive dims (D 96: dims l, l + 32,
 *             l + 64, 3 being no vector width), the splits' loads issued
 *             COMBINE_UNROLL at a time. FUSED_COMBINE = 0: a second launch,
 *             one warp per row of the whole problem. FUSED_COMBINE = 1: in
 *             the same launch, by the last CTA of each (group, row tile) to
 *             finish its split: each CTA stores its partial, syncs, and
 *             counts itself in (release) on the group's split semaphore (the ABI's
 *             zeroed words after the LSEs: lse_partial[n_splits * B*HQ*SQ
 *             + blockIdx.y * gridDim.z + blockIdx.z], atom.acq_rel.gpu); the
 *             one that brings it to n_splits resets it to 0 and combines the
 *             group's <= 16 rows with its warps. Why: on the small caches the
 *             second launch (launch gap, ramp, tail) is a fixed 1.5-3 us next
 *             to a 5-10 us kernel, and a cluster (decode-cluster) caps the
 *             splits of a group at 8 CTAs, so B 1 x 8 KV heads fills 64 SMs.
 *
 * Partial results (n_splits > 1), fp32, FlashAttention's softmax_lse
 * convention (the ABI's contiguous scratch, row index (b * HQ + h) * SQ + s):
 *   o_partial[z][b][h][s][:]  = O_z, normalized by the split's own row sum
 *   lse_partial[z][b][h][s]   = natural-log LSE of the split's scaled scores,
 *                               -inf (and O_z = 0) when the split has no key
 *                               the row sees (a causal row s < SQ - 1 whose
 *                               last split holds only keys past its diagonal).
 *   lse_partial[n_splits * B*HQ*SQ + g]  (unsigned) split semaphore of CTA
 *                               group g = blockIdx.y * gridDim.z + blockIdx.z,
 *                               FUSED_COMBINE only: zero on entry (the ABI's
 *                               contract), zero again when the launch ends.
 *
 * Masking. Causal decode rows are the last SQ positions: row s sees keys
 * <= s + SK - SQ (optd_causal_offset), so only keys > SK - SQ, all in the last
 * tile of the last split, are ever masked for causality; ragged SK (4000)
 * masks the same tile's keys >= SK (zero-filled in shared memory, so that
 * 0 * V is never NaN). A warp's sub-tile wholly past SK skips the math.
 *
 * Window W (causal only): row s sees keys > s + SK - SQ - W too, so the rows
 * together see [first_key(0), SK) (row 0 starts earliest: max(0, SK - SQ - W
 * + 1)). The splits divide the tiles of that range (dec_visible_tiles, the
 * spec's kv_tiles), not [0, SK): a window of 1024 over SK 16384 reads ~1024
 * keys and splits them as a 1024-key cache would be split. Only the range's
 * first tile(s), up to row SQ - 1's first key, are masked on the left, per
 * element; a warp's sub-tile left of row 0's window skips the math.
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
 *          FUSED_COMBINE  combine in a second launch (0) or in the
 *                         last CTA of each group (1)                  0, 1
 *          WARP_LOADS     each warp copies and waits for its own keys
 *                         of a tile, no CTA barrier per tile (1), or
 *                         the CTA copies the tile together (0)        0, 1
 *                         (common/decode_split.cuh)
 *          M_TILES        m16 row tiles per CTA, the warps split      1, 2
 *                         between them (each K/V tile read once for
 *                         32 packed rows: MQA, G * SQ > 16; with
 *                         G * SQ <= 16 the second tile is padding)
 *          K_FIRST        a tile's K copies one cp.async group and    0, 1
 *                         its V copies the next: Q K^T and the
 *                         softmax wait for K only (1), or one group
 *                         per tile (0) (common/decode_split.cuh)
 *          (SPLIT_WAVES and MIN_SPLIT_TILES only enter the launch formulas.)
 * Shared (dynamic, bytes), TILE_N = (NUM_WARPS / M_TILES) * BLOCK_N, rows of
 *          2 D bytes:
 *          2 D * 16 * M_TILES  (packed Q rows)
 *          + max(2 D * 2 * STAGES * TILE_N        (K and V ring),
 *                NUM_WARPS * 16 * (D + 8) * 4)    (fp32 O rows of the merge)
 *          (DecSmem<D>::BYTES, checked against the spec's smem formula by
 *          OPTD_CHECK_SMEM); e.g. D 128, 4 warps, BLOCK_N 32, 3 stages:
 *          4 KiB + 192 KiB. Combos over the device's opt-in limit (227 KiB on
 *          sm_90) are rejected by the gate.
 *          D 256 (rows of 512 bytes): 8 KiB * M_TILES + 1 KiB * 2 * STAGES * TILE_N,
 *          so the ring fits only while STAGES * TILE_N <= 219 (M_TILES 1) or
 *          211 (M_TILES 2) keys: the default point (TILE_N 128, 3 stages: 392 KiB)
 *          does not; e.g. BLOCK_N 16 (TILE_N 64, 3 stages: 200 KiB), NUM_WARPS 2,
 *          or M_TILES 2 (208 KiB) with the other knobs at their first values do.
 *          (The merge's O rows, 16.5 KiB a warp, exceed the ring only on points
 *          far below the limit.)
 *          D 96 (rows of 192 bytes): 3 KiB * M_TILES + 384 * STAGES * TILE_N
 *          (default: 147 KiB).
 * CTAs:    fwd      n_splits x (B * HKV) x cdiv(G * SQ, 16 * M_TILES),
 *                   NUM_WARPS * 32 threads (B * HKV <= 65535)
 *          combine  cdiv(B * HQ * SQ, 4) x 1 x 1, 128 threads, only when
 *                   n_splits > 1 and FUSED_COMBINE = 0
 * n_splits: groups = B * HKV * cdiv(G * SQ, 16 * M_TILES) CTAs per split;
 *          want = min(cdiv(SPLIT_WAVES * SMS, groups),
 *                     cdiv(n_tiles, MIN_SPLIT_TILES)), at least 1; then lowered
 *          to the fewest splits with the same tiles per split, so that no split
 *          is empty (the kernel derives its range from n_splits alone).
 *          n_tiles: the tiles of keys some row sees, cdiv(SK, TILE_N) less the
 *          whole tiles left of the window (see Masking).
 * Registers: per thread D / 4 (Q fragments) + D / 2 (O) + BLOCK_N / 2 (S)
 *          fp32 / b32 values plus addressing: D 128, BLOCK_N 64: 32 + 64 + 32;
 *          __launch_bounds__(threads, 1). D 96: 24 + 48 + BLOCK_N / 2 (191
 *          registers at the default point, sm_90; no point spills). D 256: Q's
 *          64 would join O's 128 and spill (8-byte spill stores at BLOCK_N 32,
 *          152 at 64, the other knobs at their first values, sm_90), so Q is not
 *          held but loaded again per k-step (one ldmatrix.x4 per 16 columns and
 *          tile, common/decode_split.cuh): 128 + BLOCK_N / 2, 254-255 registers
 *          and no spill at BLOCK_N 16 and 64 there (BLOCK_N 32: 4 bytes since
 *          the window's left-edge code, which moved ptxas's spills around: of
 *          24 D 256 points sampled, 9 spilled 16-48 bytes before it and 8
 *          spill 4-32 after, not the same ones; a build with OPTD_BUILD_WINDOW=0
 *          is the code from before, spills included). Over all code-knob points
 *          (sm_90, fp16, counted before the window) 120 of 432 still spill
 *          8-100 bytes, 22 of the 176 that fit in shared memory at D 256
 *          (BLOCK_N 32 with NUM_WARPS 2 or K_FIRST 1 mostly); BLOCK_N 16
 *          never does.
 * Head dims: 64, 96, 128, 256 (common/decode_split.cuh: any multiple of 32; D 96
 *          has its own swizzle and copy layout there). The combine's lane owns
 *          D / 32 dims: 2, 4 or 8 consecutive ones (one 8-, 16- or two 16-byte
 *          loads per split; D 256 batches 4 splits, not 8, keeping the same 64
 *          floats in flight per lane), or at D 96 three 32 apart.
 * Regime:  max_sq = 16 below: the gate refuses shapes with SQ > 16 (prefill),
 *          which the other templates serve; the kernel itself is correct for
 *          any SQ (more row tiles), just not what those shapes want.
 * Window:  the splits divide only the tiles some row sees (t0 above, the spec's
 *          kv_tiles), left-edge masking on those first tiles only (Masking).
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "decode-split"
description = "flash-decoding: GQA group x SQ rows packed into one mma.sync m16 tile, KV sequence split across CTAs, cp.async K/V ring, warps split the keys, LSE combine"
min_cc = 80
head_dims = [64, 96, 128, 256]
max_sq = 16
windows = true

[knobs]
BLOCK_N = [32, 16, 64]
NUM_WARPS = [4, 2, 8]
STAGES = [3, 2, 4]
SPLIT_WAVES = [1, 2, 4]
MIN_SPLIT_TILES = [1, 2, 4]
FUSED_COMBINE = [0, 1]
WARP_LOADS = [0, 1]
M_TILES = [1, 2]
K_FIRST = [0, 1]

[derived]
tile_n = "(NUM_WARPS // M_TILES) * BLOCK_N"
row_tiles = "cdiv(G * SQ, 16 * M_TILES)"
groups = "B * HKV * row_tiles"
# Key tiles some row sees: dec_visible_tiles (a window starts them at row 0's first key).
kv_tiles = "cdiv(SK, tile_n) - (max(0, SK - SQ - WINDOW + 1) // tile_n if WINDOW > 0 else 0)"
want_splits = "max(1, min(cdiv(SPLIT_WAVES * SMS, groups), cdiv(kv_tiles, MIN_SPLIT_TILES)))"
tiles_per_split = "cdiv(kv_tiles, want_splits)"
splits = "cdiv(kv_tiles, tiles_per_split)"

[[launch]]
kernel = "fwd"
grid = ["splits", "B * HKV", "row_tiles"]
block = ["NUM_WARPS * 32", "1", "1"]
smem = "ELEM_BYTES * D * 16 * M_TILES + max(ELEM_BYTES * D * 2 * STAGES * tile_n, NUM_WARPS * 16 * (D + 8) * 4)"

[[launch]]
kernel = "combine"
when = "splits > 1 and FUSED_COMBINE == 0"
grid = ["cdiv(B * HQ * SQ, 4)", "1", "1"]
block = ["128", "1", "1"]
smem = "0"
*/

#include "common/optd.cuh"
#include "common/decode_split.cuh"

#ifndef FUSED_COMBINE
#error "FUSED_COMBINE must be defined (0 or 1)"
#endif

#define DEC_COMBINE_ROWS 4    // rows (warps) per combine CTA: 128 threads
#define DEC_COMBINE_UNROLL 8  // splits whose loads a combine lane has in flight

// ---------------------------------------------------------------------------
// R rows of O from the n_splits partials, by one warp: rows row[0..R) of
// rows_total = B * HQ * SQ, lane l owning dims [l * D / 32, (l + 1) * D / 32) where
// D / 32 is 2, 4 or 8 (8-, 16- or twice 16-byte loads); at D 96 (3 dims a lane, not a
// vector) dims l, l + 32, l + 64 instead (scalar loads, each still one 128-byte line
// per warp, and 2-byte stores). Loads go through L2 only
// (ld.global.cg): with FUSED_COMBINE the partials were written by other CTAs of
// the same launch. R = 2 puts two rows' loads in flight together: a batch is
// one L2 round trip (~0.55 us right after the partials were written, H100
// decode_timeline), and the fused combine's warps walked MQA's 16 rows four
// each, one after another (2.3 us of a 12.5 us call).
// ---------------------------------------------------------------------------
template <int D, int R>
__device__ __forceinline__ void dec_combine_rows(const float* o_partial, const float* lse_partial, int n_splits,
                                                 size_t rows_total, const size_t (&row)[R], elem_t* const (&orow)[R]) {
    static_assert(D % 32 == 0, "D must be a multiple of 32: every lane owns D / 32 dims");
    constexpr int VEC = D / 32;  // dims per lane
    constexpr bool CONSEC = VEC == 2 || VEC == 4 || VEC == 8;  // consecutive (vector loads), else strided by 32
    // Splits per batch and row: R * U * VEC floats in flight per lane, at most 64 (D 256:
    // half the splits of D 128, the same bytes, and registers the fused combine can spare).
    constexpr int U = VEC > 4 ? DEC_COMBINE_UNROLL * 4 / VEC : DEC_COMBINE_UNROLL;
    const int lane = threadIdx.x & 31;

    // One pass, online: each batch of U splits issues its LSE and O loads (of
    // every row) together, then rescales the running sum to the batch's new
    // maximum (the online softmax's rule), so a row costs one L2 round trip per
    // batch, not a max pass first. Every split wrote every row (O = 0, LSE = -inf
    // where it saw no key), so the loads need no guard beyond z < n_splits. Split
    // z's row is z * rows_total rows further on, in both arrays.
    float acc[R][VEC], wsum[R], m[R];
    const float* lse_z[R];
    const float* o_z[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[i][e] = 0.f;
        wsum[i] = 0.f;
        m[i] = OPTD_NEG_INF;
        lse_z[i] = lse_partial + row[i];
        o_z[i] = o_partial + row[i] * D + lane * (CONSEC ? VEC : 1);
    }
    const size_t o_step = rows_total * D;
    for (int z0 = 0; z0 < n_splits; z0 += U) {
        float l[R][U];
        float x[R][U][VEC];
#pragma unroll
        for (int i = 0; i < R; ++i) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool live = z0 + u < n_splits;
                // Same address in every lane: one broadcast load. The slots past
                // n_splits are not splits at all: LSE -inf, weight 0.
                l[i][u] = live ? __ldcg(lse_z[i] + u * rows_total) : OPTD_NEG_INF;
                if constexpr (VEC == 8) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float4 t = live ? __ldcg(reinterpret_cast<const float4*>(o_z[i] + u * o_step) + h)
                                              : make_float4(0.f, 0.f, 0.f, 0.f);
                        x[i][u][4 * h] = t.x;
                        x[i][u][4 * h + 1] = t.y;
                        x[i][u][4 * h + 2] = t.z;
                        x[i][u][4 * h + 3] = t.w;
                    }
                } else if constexpr (!CONSEC) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) x[i][u][e] = live ? __ldcg(o_z[i] + u * o_step + 32 * e) : 0.f;
                } else if constexpr (VEC == 4) {
                    const float4 t = live ? __ldcg(reinterpret_cast<const float4*>(o_z[i] + u * o_step)) : make_float4(0.f, 0.f, 0.f, 0.f);
                    x[i][u][0] = t.x;
                    x[i][u][1] = t.y;
                    x[i][u][2] = t.z;
                    x[i][u][3] = t.w;
                } else {
                    const float2 t = live ? __ldcg(reinterpret_cast<const float2*>(o_z[i] + u * o_step)) : make_float2(0.f, 0.f);
                    x[i][u][0] = t.x;
                    x[i][u][1] = t.y;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
            float m_new = m[i];
#pragma unroll
            for (int u = 0; u < U; ++u) m_new = fmaxf(m_new, l[i][u]);
            if (m_new != OPTD_NEG_INF) {  // else no split so far saw a key of the row
                const float corr = m[i] == OPTD_NEG_INF ? 0.f : fast_exp2((m[i] - m_new) * OPTD_LOG2E);
                wsum[i] *= corr;
#pragma unroll
                for (int e = 0; e < VEC; ++e) acc[i][e] *= corr;
                // exp(-inf) = 0: a split that saw no key adds nothing.
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const float w = fast_exp2((l[i][u] - m_new) * OPTD_LOG2E);
                    wsum[i] += w;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[i][e] = fmaf(w, x[i][u][e], acc[i][e]);
                }
                m[i] = m_new;
            }
            lse_z[i] += U * rows_total;
            o_z[i] += U * o_step;
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        // wsum >= 1 (the largest LSE weighs 1): the fast reciprocal, no IEEE slow path.
        const float inv = wsum[i] > 0.f ? __fdividef(1.f, wsum[i]) : 0.f;
        elem_t* out = orow[i] + lane * (CONSEC ? VEC : 1);
        if constexpr (VEC == 8) {
            uint4 packed;
            packed.x = pack2(acc[i][0] * inv, acc[i][1] * inv);
            packed.y = pack2(acc[i][2] * inv, acc[i][3] * inv);
            packed.z = pack2(acc[i][4] * inv, acc[i][5] * inv);
            packed.w = pack2(acc[i][6] * inv, acc[i][7] * inv);
            *reinterpret_cast<uint4*>(out) = packed;
        } else if constexpr (!CONSEC) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) out[32 * e] = from_f32(acc[i][e] * inv);
        } else if constexpr (VEC == 4) {
            uint2 packed;
            packed.x = pack2(acc[i][0] * inv, acc[i][1] * inv);
            packed.y = pack2(acc[i][2] * inv, acc[i][3] * inv);
            *reinterpret_cast<uint2*>(out) = packed;
        } else {
            *reinterpret_cast<unsigned*>(out) = pack2(acc[i][0] * inv, acc[i][1] * inv);
        }
    }
}

// Packed rows r, r + NUM_WARPS, .. (R of them, all valid) of this CTA's row tile
// through dec_combine_rows (FUSED_COMBINE's last CTA).
template <int D, int R>
__device__ __forceinline__ void dec_combine_tile_rows(const float* o_partial, const float* lse_partial, int n_splits,
                                                      size_t rows_total, elem_t* o, const optd_strides& strides, int b,
                                                      int heads_q, int heads_kv, int seq_q, int r) {
    size_t row[R];
    elem_t* orow[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const DecRow out = dec_out_row(r + i * NUM_WARPS, heads_q, heads_kv, seq_q);
        row[i] = ((size_t)b * heads_q + out.hq) * seq_q + out.s;
        orow[i] = o + optd_head_off(strides.o_b, strides.o_h, b, out.hq) + (long long)out.s * strides.o_s;
    }
    dec_combine_rows<D, R>(o_partial, lse_partial, n_splits, rows_total, row, orow);
}

// Count this CTA in on its group's split semaphore; true in the one CTA that
// arrives last (and has reset the semaphore for the next launch). Every thread
// calls it after its own partial stores. No per-thread fence: the barrier
// orders every thread's stores before thread 0's atomic, whose release (gpu
// scope) is cumulative over what happens before it, the PTX memory model's
// causality order being transitive through the barrier (CUTLASS's semaphores
// rely on the same); thread 0's acquire plus the barrier's second half order
// every later load after all arrivals. A __threadfence() per thread here cost
// 0.4 us per call at B 1 x SK 4096 and on MQA (H100, 2026-11-26,
// scripts/decode_ablation.py `no_fence`, checked 156 of 156 in three rounds).
__device__ __forceinline__ bool dec_arrive_last(unsigned* sem, int n_splits) {
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) {
        unsigned prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(prev) : "l"(sem) : "memory");
        if (prev == (unsigned)n_splits - 1) {
            last = 1;
            // Nobody else touches it in this launch now: all n_splits CTAs are in.
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(sem) : "memory");
        }
    }
    return __syncthreads_or(last) != 0;
}

// ---------------------------------------------------------------------------
// Forward: one (split, b * HKV + kv head, row tile) per CTA. The split's work
// is common/decode_split.cuh's; here its result leaves shared memory.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void decode_fwd(OPTD_ARGS) {
    using L = DecSmem<D>;
    OPTD_CHECK_SMEM(FWD, D, L::BYTES);
    // This split's key tiles, of those some row sees (the spec's formula leaves none
    // empty; one that were would store LSE -inf and O = 0, as a split past the keys).
    const int split = blockIdx.x;
    const int win = optd_window(window);  // 0 in a build without the window's code
    const DecTiles vis = dec_visible_tiles(seq_q, seq_k, causal, win);
    const int n_tiles = vis.end - vis.begin;
    const int tps = (n_tiles + n_splits - 1) / n_splits;
    const int t_begin = vis.begin + split * tps;
    const int t_end = min(vis.end, t_begin + tps);
    decode_split_tile<D>(q, k, v, heads_q, heads_kv, seq_q, seq_k, softmax_scale, causal, win, strides, t_begin,
                         t_end, [] {});

    // Sum the key warps' copies of each valid row, 4 floats (16 bytes of xo) per step,
    // and store it: O itself (one split), or the split's partial row and LSE.
    extern __shared__ __align__(128) unsigned char dec_smem[];
    const float* xo = reinterpret_cast<const float*>(dec_smem + L::XO);
    const float* lse_s = reinterpret_cast<const float*>(dec_smem + L::LSE);
    const int b = blockIdx.y / heads_kv;
    const int rows_valid = dec_rows_valid(heads_q, heads_kv, seq_q);
    const size_t rows_total = (size_t)batch * heads_q * seq_q;
    constexpr int C4 = D / 4;
    for (int c = threadIdx.x; c < rows_valid * C4; c += DEC_THREADS) {
        const int row = c / C4, c4 = c % C4;
        float4 sum = *reinterpret_cast<const float4*>(xo + row * L::XO_ROW + 4 * c4);
#pragma unroll
        for (int kw = 1; kw < DEC_KEY_WARPS; ++kw) {
            const float4 x = *reinterpret_cast<const float4*>(xo + (kw * DEC_CTA_ROWS + row) * L::XO_ROW + 4 * c4);
            sum.x += x.x;
            sum.y += x.y;
            sum.z += x.z;
            sum.w += x.w;
        }
        const DecRow out = dec_out_row(row, heads_q, heads_kv, seq_q);
        if (n_splits == 1) {
            elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, out.hq) + (long long)out.s * strides.o_s;
            uint2 packed;
            packed.x = pack2(sum.x, sum.y);
            packed.y = pack2(sum.z, sum.w);
            *reinterpret_cast<uint2*>(orow + 4 * c4) = packed;
        } else {
            const size_t prow = (size_t)split * rows_total + ((size_t)b * heads_q + out.hq) * seq_q + out.s;
            *reinterpret_cast<float4*>(o_partial + prow * D + 4 * c4) = sum;
            if (c4 == 0) lse_partial[prow] = lse_s[row];
        }
    }
#if FUSED_COMBINE
    if (n_splits == 1) return;
    // The semaphores follow the n_splits * rows_total LSEs (the ABI's zeroed
    // words; B * HKV * row_tiles <= rows_total of them are used).
    unsigned* sem = reinterpret_cast<unsigned*>(lse_partial + (size_t)n_splits * rows_total) +
                    ((size_t)blockIdx.y * gridDim.z + blockIdx.z);
    if (!dec_arrive_last(sem, n_splits)) return;
    // The last CTA of the group: its warps combine the group's valid rows, two at
    // a time (rows r and r + NUM_WARPS) where a warp has two left.
    for (int r = threadIdx.x >> 5; r < rows_valid;) {
        if (r + NUM_WARPS < rows_valid) {
            dec_combine_tile_rows<D, 2>(o_partial, lse_partial, n_splits, rows_total, o, strides, b, heads_q, heads_kv,
                                        seq_q, r);
            r += 2 * NUM_WARPS;
        } else {
            dec_combine_tile_rows<D, 1>(o_partial, lse_partial, n_splits, rows_total, o, strides, b, heads_q, heads_kv,
                                        seq_q, r);
            r += NUM_WARPS;
        }
    }
#endif
}

// ---------------------------------------------------------------------------
// Combine (n_splits > 1, FUSED_COMBINE = 0): one warp per output row
// (b * HQ + h) * SQ + s.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void decode_combine(OPTD_ARGS) {
    OPTD_CHECK_SMEM(COMBINE, D, 0);  // launched as role `combine` with smem "0"
    (void)q;
    (void)k;
    (void)v;
    (void)heads_kv;
    (void)seq_k;
    (void)softmax_scale;
    (void)causal;
    (void)window;
    const size_t rows_total = (size_t)batch * heads_q * seq_q;
    const size_t row = (size_t)blockIdx.x * DEC_COMBINE_ROWS + (threadIdx.x >> 5);
    if (row >= rows_total) return;
    const int s = (int)(row % seq_q);
    const int h = (int)((row / seq_q) % heads_q);
    const int b = (int)(row / ((size_t)seq_q * heads_q));
    const size_t rows[1] = {row};
    elem_t* const orow[1] = {o + optd_head_off(strides.o_b, strides.o_h, b, h) + (long long)s * strides.o_s};
    dec_combine_rows<D, 1>(o_partial, lse_partial, n_splits, rows_total, rows, orow);
}

// minBlocks = 1: the Q fragments, O accumulators and S tile stay in registers.
#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) optd_fwd_d64(OPTD_ARGS) {
    decode_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D96
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) optd_fwd_d96(OPTD_ARGS) {
    decode_fwd<96>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) optd_fwd_d128(OPTD_ARGS) {
    decode_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) optd_fwd_d256(OPTD_ARGS) {
    decode_fwd<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(DEC_COMBINE_ROWS * 32) optd_combine_d64(OPTD_ARGS) {
    decode_combine<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D96
extern "C" __global__ void __launch_bounds__(DEC_COMBINE_ROWS * 32) optd_combine_d96(OPTD_ARGS) {
    decode_combine<96>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(DEC_COMBINE_ROWS * 32) optd_combine_d128(OPTD_ARGS) {
    decode_combine<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(DEC_COMBINE_ROWS * 32) optd_combine_d256(OPTD_ARGS) {
    decode_combine<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
