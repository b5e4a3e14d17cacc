/******************************************************************************
 * mma-fa2: FlashAttention-2-style forward on the tensor cores (mma.sync).
 *
 * Head dims 64, 96 (Phi-3-mini), 128 and 256 (Gemma 2 / 3), one kernel each
 * (optd_fwd_d<D>, the same code instantiated per D). D 96 and 256 came later:
 * a build of D 64 and 128 alone (a run on those head dims) is the same SASS
 * as before them, register for register.
 *
 * One CTA per (query tile of BLOCK_M rows, query head h, batch b). The warps form
 * NUM_WARPS / KV_WARPS row groups of WR consecutive query rows
 * (BLOCK_M = WR * NUM_WARPS / KV_WARPS); each warp runs the whole
 * computation for its group's rows in registers, as WR / 16 m16 tiles.
 * WR = WARP_ROWS, except at D 256: 16 whatever WARP_ROWS says (two m-tiles'
 * O accumulators alone would be 256 fp32 registers there), and the spec's
 * warp_rows follows: at D 256 both WARP_ROWS values build and launch the same
 * kernel. (Not declared in [inert]: tests/inert_knobs.rs requires every
 * declaration to hold on some of its shapes, all of D 64 and 128 for now.)
 * With two m-tiles every K and V fragment read from shared memory feeds two
 * mma.sync instead of one (FA2's 128 x 64 tile on 4 warps): half the
 * shared-memory traffic per FLOP, at twice the accumulator registers.
 *   KV_WARPS = 1: one warp per row group, the warps only share the K/V tiles
 *             (FA2's work split: no cross-warp reduction).
 *   KV_WARPS > 1: the KV_WARPS warps of a row group split the keys (split-KV
 *             inside the CTA, for short sequences: more CTAs, and each warp
 *             walks 1 / KV_WARPS of the keys). A CTA key tile is then
 *             KV_WARPS * BLOCK_N keys, warp ks taking sub-tile ks; at the end
 *             the warps of a group merge their online softmaxes through shared
 *             memory (see the epilogue).
 *
 *   prologue  Q tile -> shared (cp.async, 16-byte chunks), the first
 *             STAGES - 1 K/V tiles in flight. WR = 16 at D <= 128: each warp
 *             then reads its 16 x D slice of Q once into registers
 *             (ldmatrix.x4, A fragments, D / 4 registers). WR = 32, and D 256:
 *             Q stays in shared memory (the fragments of two m-tiles, D / 2
 *             registers, do not fit next to the doubled accumulators at
 *             D = 128, nor D 256's 64 next to its 128 accumulators) and step 2
 *             reloads them per k-step.
 *   per key tile of KV_WARPS * BLOCK_N keys (t = 0 .. n_tiles - 1):
 *     1. wait for tile t (cp.async.wait_group STAGES - 2), __syncthreads, and
 *        issue the load of tile t + STAGES - 1 into the ring slot tile t - 1
 *        used (one barrier per tile; a commit every iteration, empty past
 *        the end, keeps the group count uniform);
 *     2. S = Q K^T with mma.sync.m16n8k16 (fp32 accumulators), K's B
 *        fragments by ldmatrix.x4 (non-transposed: K rows are the B columns),
 *        each used by every m-tile (WR = 32, and D 256: per k-step, one
 *        ldmatrix.x4 of Q per m-tile, then the K fragments);
 *     3. masking, only on the tiles that need it: keys >= SK (ragged tail)
 *        and, causal, keys > row + SK - SQ on the tiles that cross the warp's
 *        diagonal (common/mask.cuh, m16n8_mask of common/quad_softmax.cuh);
 *     4. online softmax per row (common/online_softmax.cuh): a thread holds
 *        2 rows per m-tile (g, g + 8
 *        of the m16n8 accumulator layout) and reduces their max across its quad of
 *        4 lanes with 2 xor shuffles; p = exp2(s * c - m * c) with
 *        c = softmax_scale * log2(e) (one FFMA + ex2), the O accumulator is
 *        rescaled by exp2((m_old - m_new) * c); l stays a per-thread partial
 *        sum, quad-reduced once at the end;
 *     5. O += P V: the S accumulators, rounded to packed f16x2 / bf16x2, are
 *        directly the A fragments of the second mma (P never leaves the
 *        registers); V's B fragments by ldmatrix.x4.trans, each used by
 *        every m-tile.
 *   merge     (KV_WARPS > 1 only) after a barrier the K/V ring is free: each
 *             warp publishes its row maxima m_w and sums l_w; every warp
 *             rescales its O by exp2((m_w - m) c) / L with m = max_w m_w and
 *             L = sum_w l_w exp2((m_w - m) c); warps ks > 0 store their O
 *             after the Q tile (fp32, rows padded to D + 8), and warp ks = 0
 *             adds them to its own after a second barrier.
 *   epilogue  O / l (or the merged O) -> the group's rows of the Q tile in
 *             shared memory (no barrier: only this warp reads them), then
 *             16-byte coalesced global stores of the rows < SQ.
 *
 * Addressing (kernel ABI v2): query head h = blockIdx.y of batch
 * b = blockIdx.z reads K/V head h / (HQ / HKV) (grouped-query attention);
 * every Q, K, V and O row is addressed through its tensor's (batch, head, row)
 * strides, so [B,H,S,D], [B,S,H,D] and padded views run the same code. Rows
 * start 16-byte aligned (the ABI's guarantee), which keeps the 16-byte cp.async
 * copies and stores legal. The head and batch come from the grid, not from a
 * division of one index, and the one division left (the K/V head) is off the
 * Q loads' path: on the latency-bound shapes this template wins, each
 * dependent integer division before the first copy is visible. The query
 * heads of one K/V head are adjacent in blockIdx.y, so CTAs launched together
 * read the same K/V through L2.
 *
 * Shared memory rows are D * 2 bytes (8, 12, 16 or 32 chunks of 16 bytes).
 * SWIZZLE=1 stores chunk c of row r at c ^ (r % 8), so the 8 row addresses of
 * every ldmatrix phase and of the cp.async writes hit 8 distinct 16-byte bank
 * groups; SWIZZLE=0 pads rows to D + 8 elements for the same effect. D 96's
 * 12 chunks are not a multiple of 8 (c ^ (r % 8) would reach chunk 15) and its
 * 192-byte rows are not a multiple of 128: chunks 0-7 keep c ^ (r % 8), the tail
 * chunks 8-11 take 8 + ((c - 8) ^ ((r / 2) % 4)), also conflict-free (tile_off
 * says why), and the ldmatrix offsets keep the row part apart from the chunk
 * part (FragLane).
 *
 * Ragged lengths: K/V rows >= SK are zero-filled in shared memory (cp.async
 * with src-size 0) and their scores set to -inf; Q rows >= SQ are zero-filled,
 * computed (warps wholly past SQ skip the math) and never stored.
 * Causal (bottom-right, offset = SK - SQ: row i sees keys <= i + offset): the
 * key tiles wholly above the CTA's last row are not loaded, a warp skips the
 * math (not the barrier) of tiles wholly above its last row, only the tiles
 * crossing a warp's diagonal are masked, and CTAs take query tiles in reverse
 * (blockIdx.x = 0 gets the last, the heaviest), so the long CTAs start first
 * and the short ones fill the tail.
 *
 * Knobs:   BLOCK_N    keys per warp per K/V tile                 64, 32
 *          NUM_WARPS  warps per CTA                               4, 8
 *          STAGES     K/V tiles in the cp.async ring              2, 3
 *          SWIZZLE    1: XOR-swizzled rows, 0: padded rows         1, 0
 *          KV_WARPS   warps sharing a row group, splitting keys   1, 2, 4
 *          WARP_ROWS  query rows per warp (one or two m16 tiles)  16, 32
 *                     (at D 256 16 whatever it says)
 * Shared (dynamic, bytes), with R = 2 * (D + 8 * (1 - SWIZZLE)) per row and
 * WR = WARP_ROWS (16 at D 256):
 *          R * BLOCK_M + max(R * 2 * STAGES * KV_WARPS * BLOCK_N,
 *                            (NUM_WARPS - NUM_WARPS / KV_WARPS) * WR * (D + 8) * 4)
 *          (FaSmem<D>::BYTES, checked against the spec's smem formula at
 *          compile time by OPTD_CHECK_SMEM),
 *          i.e. the Q tile plus STAGES K and V tiles, or plus the fp32 O rows
 *          the merge of KV_WARPS > 1 exchanges where they are larger than the
 *          ring (only BLOCK_N 32, 8 warps, 2 stages, swizzled, KV_WARPS 2,
 *          WARP_ROWS 32); from 24 KiB (D 64, BLOCK_N 32, 4 warps, 2 stages,
 *          KV_WARPS 1, WARP_ROWS 16) to 425 KiB (D 128, BLOCK_N 64, 8 warps,
 *          3 stages, KV_WARPS 4, WARP_ROWS 32, padded). D 96: 36 to 325 KiB,
 *          88 of the 96 combos within 227 KiB. D 256: 96 KiB (BLOCK_N 32,
 *          4 warps, 2 stages, KV_WARPS 1, swizzled) to 808 KiB; 20 of its 48
 *          distinct points fit 227 KiB (the default, BLOCK_N 64, 4 warps,
 *          2 stages, 160 KiB; BLOCK_N 64 needs KV_WARPS 1, and 2 stages
 *          except at 4 warps swizzled), only BLOCK_N 32, 4 warps, 2 stages,
 *          KV_WARPS 1 fits 99 KiB. Combos over the device's opt-in limit
 *          (227 KiB on sm_90, 99 KiB on sm_86/89) are rejected by the gate.
 * CTAs:    cdiv(SQ, BLOCK_M) x HQ x B, NUM_WARPS * 32 threads (HQ, B <= 65535);
 *          no split across CTAs, n_splits = 1, one launch.
 * Registers: per thread WR / 16 * (D / 2 (O) + BLOCK_N / 2 (S)) plus
 *          D / 4 (Q fragments, WR 16 at D <= 128) or 4 per m-tile (one
 *          k-step's, WR 32 and D 256) fp32 / b32 values plus addressing;
 *          __launch_bounds__(threads, 1).
 *          D 128, BLOCK_N 64, WARP_ROWS 32: 128 + 64 + 8 of the 255; ptxas
 *          (NVRTC 13.0, sm_90) spills 8 bytes there when padded and 84 to 96
 *          when swizzled (the row sums, plus one or two addressing values
 *          reloaded per tile; 84 / 72 before kernel ABI v2's strided K/V
 *          copies); every other point spills nothing.
 *          D 96: WR 16, 48 + 32 + 24 at BLOCK_N 64, ptxas 175-188 registers
 *          (157-166 at BLOCK_N 32); WR 32, 96 + 64 + 8, 252-255 (207-212);
 *          no spills. D 96's K/V copies hold two more chunk offsets, and its
 *          swizzled ldmatrix addresses a row offset and two chunk offsets
 *          per operand (FragLane).
 *          D 256 (WR 16 only): 128 + 32 + 4 at BLOCK_N 64, ptxas 248-254
 *          registers (237-250 at BLOCK_N 32), no spills: Q in registers
 *          would add 64, and WR 32 would need 256 for O alone.
 * Window:  (causal only) a CTA's key loop starts at the tile holding its first
 *          row's first key (KeyMask::keys_from), so a window of W reads about
 *          W + BLOCK_M keys per query tile, not up to SK; a warp skips the math of
 *          sub-tiles left of its first row's window (left_of), and only the
 *          sub-tiles crossing some row's left edge are masked per element
 *          (partial_left, m16n8_mask_left: a second test, so the unwindowed
 *          masking code is unchanged). CTAs still take query tiles in reverse,
 *          harmless when windowed tiles all cost about the same.
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "mma-fa2"
description = "FlashAttention-2 forward: mma.sync m16n8k16, 16 or 32 query rows per warp, P kept in registers, cp.async K/V ring, swizzled or padded shared rows"
min_cc = 80
head_dims = [64, 96, 128, 256]
windows = true

[knobs]
BLOCK_N = [64, 32]
NUM_WARPS = [4, 8]
STAGES = [2, 3]
SWIZZLE = [1, 0]
KV_WARPS = [1, 2, 4]
WARP_ROWS = [16, 32]

[derived]
# Query rows per warp: WARP_ROWS, except 16 at D 256 (FaRows in the code).
warp_rows = "16 if D == 256 else WARP_ROWS"
block_m = "warp_rows * NUM_WARPS // KV_WARPS"
m_blocks = "cdiv(SQ, block_m)"
row_bytes = "ELEM_BYTES * (D + 8 * (1 - SWIZZLE))"
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["m_blocks", "HQ", "B"]
block = ["NUM_WARPS * 32", "1", "1"]
smem = "row_bytes * block_m + max(row_bytes * 2 * STAGES * KV_WARPS * BLOCK_N, (NUM_WARPS - NUM_WARPS // KV_WARPS) * warp_rows * (D + 8) * 4)"
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
#ifndef SWIZZLE
#error "SWIZZLE must be defined"
#endif
#if BLOCK_N % 16 != 0 || BLOCK_N < 16
#error "BLOCK_N must be a positive multiple of 16 (two m16n8 tiles per ldmatrix.x4)"
#endif
#if STAGES < 2
#error "STAGES must be at least 2"
#endif
#if NUM_WARPS < 1 || NUM_WARPS > 16
#error "NUM_WARPS must be in 1..16"
#endif
#ifndef KV_WARPS
#error "KV_WARPS must be defined"
#endif
#if KV_WARPS < 1 || NUM_WARPS % KV_WARPS != 0
#error "KV_WARPS must divide NUM_WARPS"
#endif
#ifndef WARP_ROWS
#error "WARP_ROWS must be defined"
#endif
#if WARP_ROWS != 16 && WARP_ROWS != 32
#error "WARP_ROWS must be 16 or 32 (one or two m16 tiles per warp)"
#endif

#define FA_ROW_GROUPS (NUM_WARPS / KV_WARPS)  // row groups per CTA (KV_WARPS warps each)
#define FA_TILE_N (KV_WARPS * BLOCK_N)        // keys per CTA tile (all warps of a group)
#define FA_THREADS (NUM_WARPS * 32)

// Query rows per warp at head dim D: WARP_ROWS, except at D 256, where it is
// always 16. Two m-tiles' O accumulators alone are 2 x 32 x 4 = 256 fp32 there,
// more than the 255 registers, so WARP_ROWS 32 would spill in the inner loop;
// instead both of its values build this same kernel there (the spec's
// warp_rows is this rule, so the launch is the same too).
// Enumerators: as static constexpr members, NVRTC 13.0 put them into the PTX as
// .global variables, and with those alone (the code's PTX the same) ptxas
// assigned the D 64 and 128 kernels' registers differently.
template <int D>
struct FaRows {
    enum : int {
        WR = D == 256 ? 16 : WARP_ROWS,  // query rows per warp
        MT = WR / 16,                    // m16 tiles per warp
        BLOCK_M = WR * FA_ROW_GROUPS,    // query rows per CTA
    };
};

// ---------------------------------------------------------------------------
// PTX wrappers (sm_80+).
// ---------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D (16x8, fp32) += A (16x16, row) * B (16x8, col).
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
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

// Whether head dim D's swizzle is the split one (D 96: 12 chunks per row, not a
// multiple of 8; see tile_off).
template <int D>
__host__ __device__ constexpr bool fa_split_swizzle() {
    return SWIZZLE && (D / 8) % 8 != 0;
}

// Byte offset of 16-byte chunk `chunk` of tile row `row`.
// SWIZZLE=1 with 8k chunks per row (D 64, 128, 256): chunk c at c ^ (row % 8).
// The row stride is then a multiple of 128 bytes, so the 8 rows of an ldmatrix
// phase (row % 8 = 0..7, one logical chunk) hit 8 distinct 16-byte bank groups.
// D 96 (12 chunks, rows of 192 bytes = 1.5 x 128): c ^ (row % 8) would reach
// chunk 15, past the row. Chunks 0-7 keep that XOR; the tail chunks 8-11 XOR
// their index within the tail (0-3) with (row / 2) % 4. Bank group of physical
// chunk p of row r: (12 r + p) % 8 = (4 (r % 2) + p) % 8, so over the 8 rows of
// a phase it is c ^ (r % 8) ^ 4 (r % 2) for c < 8, and 4 (r % 2) + (c' ^ (r / 2 % 4))
// for tail chunk 8 + c': 8 distinct groups in both (a bijection of r % 8).
// SWIZZLE=0 pads rows to D + 8 elements: (D / 8 + 1) r + c, with D / 8 + 1 odd
// (9, 13, 17, 33 chunks), is 8 distinct groups for every D.
template <int D>
__device__ __forceinline__ unsigned tile_off(int row, int chunk) {
    constexpr int ROW_BYTES = 2 * (SWIZZLE ? D : D + 8);
    if constexpr (fa_split_swizzle<D>()) {
        static_assert(D / 8 == 12, "the split swizzle is written for 12 chunks per row (8 + a tail of 4)");
        const int phys = chunk < 8 ? (chunk ^ (row & 7)) : 8 + ((chunk - 8) ^ ((row >> 1) & 3));
        return static_cast<unsigned>(row * ROW_BYTES + (phys << 4));
    }
    return static_cast<unsigned>(row * ROW_BYTES + ((SWIZZLE ? (chunk ^ (row & 7)) : chunk) << 4));
}

// A lane's tile_off(row, x) moved by chunk pair c (chunk x -> 2c + x), for rows
// with row % 8 fixed; see the per-lane offsets in the kernel.
__device__ __forceinline__ unsigned chunk_pair(unsigned lane_off, int c) {
    return SWIZZLE ? (lane_off ^ (unsigned)(c << 5)) : lane_off + (unsigned)(c << 5);
}

// A lane's ldmatrix address within a tile: row `row` (a multiple of 8 plus the
// lane's row in its 8x8 matrix), chunk x (0 or 1) of chunk pair c; at(c) is
// tile_off(row, 2c + x) for the unrolled (constant) c. With 8k chunks per row,
// and unswizzled, that is chunk_pair of one offset: the XOR (or add) touches the
// chunk bits only, since the row stride is a multiple of 128 bytes (or the
// offset is additive).
template <int D, bool kSplit = fa_split_swizzle<D>()>
struct FragLane {
    unsigned off;
    __device__ __forceinline__ FragLane(int row, int x) : off(tile_off<D>(row, x)) {}
    __device__ __forceinline__ unsigned at(int c) const { return chunk_pair(off, c); }
};
// D 96 swizzled: a 192-byte row stride has bit 6 set in odd multiples, so the
// chunk-pair XOR must not touch the row part: the row's byte offset, plus the
// lane's chunk offset within chunks 0-7 (pairs 0-3: XOR 2c, as above) and within
// the tail (pairs 4, 5: chunk 8 + ((2 (c - 4) + x) ^ s), s = (row / 2) % 4, is
// 8 + ((x ^ s) ^ 2 (c - 4)), an XOR of (c - 4) << 5 on the tail offset).
template <int D>
struct FragLane<D, true> {
    unsigned base, head, tail;
    __device__ __forceinline__ FragLane(int row, int x)
        : base((unsigned)(row * (2 * D))),  // SWIZZLE=1: rows of 2 D bytes
          head((unsigned)((x ^ (row & 7)) << 4)),
          tail((unsigned)((8 + (x ^ ((row >> 1) & 3))) << 4)) {}
    __device__ __forceinline__ unsigned at(int c) const {
        return base + (c < 4 ? head ^ (unsigned)(c << 5) : tail ^ (unsigned)((c - 4) << 5));
    }
};

// Threads per K/V row in the tile copies: the most that divide both the row's
// D / 8 chunks and the CTA's threads into rounds of a multiple of 8 rows (the
// swizzle, a function of row % 8, is then the same in every round). D 64, 128:
// every chunk its thread; D 256: 16 (4 warps) or 32 (8 warps); D 96: 4.
template <int D>
__host__ __device__ constexpr int fa_copy_threads_per_row() {
    int t = D / 8;
    while (t > 1 && ((D / 8) % t != 0 || FA_THREADS % t != 0 || (FA_THREADS / t) % 8 != 0)) --t;
    return t;
}

// ---------------------------------------------------------------------------
// Dynamic shared memory (bytes from the base): the Q tile, then the K/V ring;
// after the key loop the merge of KV_WARPS > 1 reuses the space past Q for the
// fp32 O rows its warps exchange, (NUM_WARPS - FA_ROW_GROUPS) x WR rows of
// D + 8 floats (padded against bank conflicts of the float2 stores), and the
// row maxima and sums in the Q tile. BYTES = the spec's smem formula.
// ---------------------------------------------------------------------------
template <int D>
struct FaSmem {
    static constexpr int ROW_BYTES = 2 * (SWIZZLE ? D : D + 8);  // a Q, K or V row
    static constexpr int Q_BYTES = FaRows<D>::BLOCK_M * ROW_BYTES;
    static constexpr int KV_BYTES = FA_TILE_N * ROW_BYTES;      // one K (or V) tile
    static constexpr int XO_ROW = D + 8;                         // floats per exchanged O row
    static constexpr int Q = 0;
    static constexpr int K = Q + Q_BYTES;                        // STAGES x KV_BYTES
    static constexpr int V = K + STAGES * KV_BYTES;              // STAGES x KV_BYTES
    static constexpr int RING_END = V + STAGES * KV_BYTES;
    static constexpr int XO = Q_BYTES;                           // after the ring is drained
    static constexpr int XO_END = XO + (NUM_WARPS - FA_ROW_GROUPS) * FaRows<D>::WR * XO_ROW * 4;
    static constexpr int BYTES = RING_END > XO_END ? RING_END : XO_END;
    static_assert(2 * NUM_WARPS * FaRows<D>::WR * 4 <= Q_BYTES, "row maxima and sums must fit in the Q tile");
};

#if KV_WARPS > 1
// ---------------------------------------------------------------------------
// Merge of the KV_WARPS warps of a row group, which saw disjoint key ranges.
// Their O accumulators are unnormalized sums of exp2((s - m_w) c) v over their
// own keys, with m_w their own running max (raw scores; c = scale * log2 e):
//   m = max_w m_w,  f_w = exp2((m_w - m) c),  L = sum_w f_w l_w
//   O = sum_w f_w O_w / L
// Every warp scales its own O by f_w / L; warps ks > 0 then hand theirs to
// warp ks = 0 through shared memory, which adds them up. Rows no warp
// saw a key for (m = -inf) come out 0; rows >= SQ are never stored.
// Shared memory (FaSmem): the maxima and sums in the Q tile
// ([2][NUM_WARPS][WR] floats; every warp is done with Q by the first
// barrier), the O rows from FaSmem::XO.
// Thread rows: h = 2 mt + {0, 1} is row 16 mt + g + {0, 8} of the warp's rows.
// On return inv = 1: the merged O is already normalized.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void kv_warps_merge(float (&acc)[FaRows<D>::MT][D / 8][4], const float (&m_r)[2 * FaRows<D>::MT],
                                               const float (&l_sum)[2 * FaRows<D>::MT], float (&inv)[2 * FaRows<D>::MT],
                                               float sl2, int warp, int rg, int ks, int g, int tq) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    constexpr int MT = FaRows<D>::MT;  // m16 tiles per warp
    constexpr int WR = FaRows<D>::WR;  // query rows per warp
    constexpr int XO_ROW = FaSmem<D>::XO_ROW;
    float* ml = reinterpret_cast<float*>(fa_smem);  // [0]: maxima, [1]: sums; [NUM_WARPS][WR] each
    float* xo = reinterpret_cast<float*>(fa_smem + FaSmem<D>::XO);

    __syncthreads();  // every warp is past its last K/V tile and its Q reads
    if (tq == 0) {
#pragma unroll
        for (int h = 0; h < 2 * MT; ++h) ml[warp * WR + 16 * (h >> 1) + g + 8 * (h & 1)] = m_r[h];
#pragma unroll
        for (int h = 0; h < 2 * MT; ++h)
            ml[(NUM_WARPS + warp) * WR + 16 * (h >> 1) + g + 8 * (h & 1)] = l_sum[h];
    }
    __syncthreads();
    float f[2 * MT];
#pragma unroll
    for (int h = 0; h < 2 * MT; ++h) {
        const int row = 16 * (h >> 1) + g + 8 * (h & 1);
        float m = OPTD_NEG_INF;
#pragma unroll
        for (int w = 0; w < KV_WARPS; ++w) m = fmaxf(m, ml[(rg * KV_WARPS + w) * WR + row]);
        float total = 0.f;
        if (m != OPTD_NEG_INF) {
#pragma unroll
            for (int w = 0; w < KV_WARPS; ++w) {
                const float mw = ml[(rg * KV_WARPS + w) * WR + row];
                if (mw != OPTD_NEG_INF)
                    total += ml[(NUM_WARPS + rg * KV_WARPS + w) * WR + row] * fast_exp2((mw - m) * sl2);
            }
        }
        const float own = (m_r[h] == OPTD_NEG_INF || total <= 0.f) ? 0.f : fast_exp2((m_r[h] - m) * sl2);
        f[h] = total > 0.f ? own / total : 0.f;
        inv[h] = 1.f;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            acc[mt][j][0] *= f[2 * mt];
            acc[mt][j][1] *= f[2 * mt];
            acc[mt][j][2] *= f[2 * mt + 1];
            acc[mt][j][3] *= f[2 * mt + 1];
        }
    }
    if (ks != 0) {
        float* mine = xo + (rg * (KV_WARPS - 1) + ks - 1) * WR * XO_ROW;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float* rows = mine + (16 * mt + g) * XO_ROW + 2 * tq;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                *reinterpret_cast<float2*>(rows + j * 8) = make_float2(acc[mt][j][0], acc[mt][j][1]);
                *reinterpret_cast<float2*>(rows + 8 * XO_ROW + j * 8) = make_float2(acc[mt][j][2], acc[mt][j][3]);
            }
        }
    }
    __syncthreads();
    if (ks == 0) {
#pragma unroll
        for (int w = 1; w < KV_WARPS; ++w) {
            const float* other = xo + (rg * (KV_WARPS - 1) + w - 1) * WR * XO_ROW;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const float* rows = other + (16 * mt + g) * XO_ROW + 2 * tq;
#pragma unroll
                for (int j = 0; j < D / 8; ++j) {
                    const float2 a = *reinterpret_cast<const float2*>(rows + j * 8);
                    const float2 b = *reinterpret_cast<const float2*>(rows + 8 * XO_ROW + j * 8);
                    acc[mt][j][0] += a.x;
                    acc[mt][j][1] += a.y;
                    acc[mt][j][2] += b.x;
                    acc[mt][j][3] += b.y;
                }
            }
        }
    }
}
#endif

// ---------------------------------------------------------------------------
// Forward: one (query tile, query head, batch) per CTA.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void mma_fa2_fwd(OPTD_ARGS) {
    static_assert(D % 16 == 0, "D must be a multiple of 16");
    using L = FaSmem<D>;
    OPTD_CHECK_SMEM(FWD, D, L::BYTES);
    constexpr int CH = D / 8;              // 16-byte chunks per row
    constexpr int ROW_BYTES = L::ROW_BYTES;
    constexpr int KV_BYTES = L::KV_BYTES;  // one K (or V) tile
    constexpr int KSTEPS = D / 16;         // k-steps of S = Q K^T (one Q, one K ldmatrix.x4 each)
    constexpr int WR = FaRows<D>::WR;      // query rows per warp
    constexpr int MT = FaRows<D>::MT;      // m16 tiles per warp
    constexpr int BLOCK_M = FaRows<D>::BLOCK_M;
    constexpr int RH = 2 * MT;             // rows per thread: g, g + 8 of each m-tile
    constexpr int NT = BLOCK_N / 8;        // n8 tiles of S per warp
    constexpr int DT = D / 8;              // n8 tiles of O per warp (even: V's ldmatrix.x4.trans loads two)
    // Q's A fragments held in registers for the whole key loop (KSTEPS x 4 b32):
    // with one m-tile up to D 128. Two m-tiles, and one at D 256 (64 b32 next to
    // 128 fp32 of O), reload them per k-step from the Q tile instead.
    constexpr bool Q_REGS = MT == 1 && D <= 128;
    constexpr int Q_CHUNKS = BLOCK_M * CH;
    constexpr int Q_ITERS = (Q_CHUNKS + FA_THREADS - 1) / FA_THREADS;
    (void)batch;
    (void)n_splits;
    (void)o_partial;
    (void)lse_partial;

    extern __shared__ __align__(128) unsigned char fa_smem[];
    const unsigned s_q = smem_u32(fa_smem) + L::Q;
    const unsigned s_k = smem_u32(fa_smem) + L::K;
    const unsigned s_v = smem_u32(fa_smem) + L::V;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;  // accumulator row (and row + 8) of each m-tile
    const int tq = lane & 3;  // accumulator column pair
    const int mi = lane >> 3; // ldmatrix: which 8x8 matrix this lane addresses
    const int lr = lane & 7;  // ldmatrix: row within that matrix
    const int rg = warp / KV_WARPS;  // row group: query rows rg * WR .. + WR - 1 of the tile
    const int ks = warp % KV_WARPS;  // key sub-tile of every CTA tile this warp takes

    // Causal: the heaviest query tiles (last rows) first.
    const int m_block = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int m0 = m_block * BLOCK_M;
    const int wrow0 = m0 + rg * WR;  // this warp's first query row
    // Query head hq of batch b; its K/V head (GQA: heads_q / heads_kv query heads
    // share one): hq * HKV / HQ is optd_kv_head's hq / (HQ / HKV) (HQ = G HKV)
    // in one integer division instead of two dependent ones.
    const int b = (int)blockIdx.z;
    const int hq = (int)blockIdx.y;
    const int kvh = hq * heads_kv / heads_q;
    const elem_t* qh = q + optd_head_off(strides.q_b, strides.q_h, b, hq);
    const elem_t* kh = k + optd_head_off(strides.k_b, strides.k_h, b, kvh);
    const elem_t* vh = v + optd_head_off(strides.v_b, strides.v_h, b, kvh);

    // Bottom-right causal: row i sees keys <= i + seq_k - seq_q (and, windowed,
    // > i + seq_k - seq_q - window).
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), optd_window(window));
    const int kv_end = mask.keys_before(m0 + BLOCK_M);  // keys any row here sees
    const int n_tiles = max(kv_end + FA_TILE_N - 1, 0) / FA_TILE_N;
    // Window: no row of the tile sees a key left of the first row's first key, so the
    // loop starts at the tile holding it (0 without a window). Tiles keep their absolute
    // index t: key t * FA_TILE_N, ring slot t % STAGES (consecutive tiles, consecutive slots).
    const int t0 = mask.keys_from(m0) / FA_TILE_N;

    // --- Q tile (rows >= SQ zero-filled) --------------------------------------
#pragma unroll
    for (int i = 0; i < Q_ITERS; ++i) {
        const int c = tid + i * FA_THREADS;
        if (Q_CHUNKS % FA_THREADS != 0 && c >= Q_CHUNKS) break;
        const int r = c / CH, ch = c % CH;
        const bool ok = m0 + r < seq_q;
        cp_async16(s_q + tile_off<D>(r, ch), ok ? qh + (long long)(m0 + r) * strides.q_s + ch * 8 : q, ok);
    }

    // K/V tile t -> ring slot t % STAGES (keys >= SK zero-filled). KV_TPR
    // threads copy a row, KV_CPT chunks each: copy (i, j) of a thread is chunk
    // tid % KV_TPR + j * KV_TPR of row tid / KV_TPR + i * KV_RSTEP. D 64 and 128:
    // KV_TPR = CH, one chunk per row. D 256 with 4 warps: 16 threads a row, two
    // chunks each (32 threads a row would step 4 rows). D 96: 12 threads a row
    // do not divide 128 or 256 threads; 4 threads a row, three chunks each
    // (chunks c, c + 4, c + 8: the 4 lanes of a row read 64 contiguous bytes per
    // copy). KV_RSTEP is a multiple of 8, so the swizzle is the same for every i:
    // the shared offset of copy (i, j) is the thread's offset of chunk j plus an
    // immediate. At D 96 with 8 warps a round covers 64 rows, more than a tile
    // of KV_WARPS x BLOCK_N = 32: the threads of rows 32-63 copy nothing.
    // The global addresses are two pointers per thread (its K and V rows of the
    // next tile to load), stepped by KV_STEP rows per round, which ends them on
    // the tile after: tiles are loaded once each, in order. The steps are 32-bit
    // products of the row strides read from the constant bank, and an empty asm
    // after each step keeps ptxas from computing all KV_ITERS addresses ahead of
    // the copies (two registers each). WARP_ROWS 32 at D 128 is at the
    // 255-register limit: 64-bit steps, a row times the stride per copy, or the
    // hoisted addresses cost it 40 to 120 bytes of spills more than this form.
    // A copy past SK reads nothing (src-size 0) from the tensor's base, an
    // address that is always valid.
    constexpr int KV_TPR = fa_copy_threads_per_row<D>();
    constexpr int KV_CPT = CH / KV_TPR;                      // chunks per thread and row
    constexpr int KV_RSTEP = FA_THREADS / KV_TPR;            // rows per copy round
    constexpr bool KV_IDLE = KV_RSTEP > FA_TILE_N;           // some threads have no row
    constexpr int KV_ITERS = KV_IDLE ? 1 : FA_TILE_N / KV_RSTEP;
    constexpr int KV_STEP = KV_IDLE ? FA_TILE_N : KV_RSTEP;  // rows the pointers move per round
    static_assert(CH % KV_TPR == 0 && FA_THREADS % KV_TPR == 0 && (!SWIZZLE || KV_RSTEP % 8 == 0),
                  "K/V copy rows must step by a multiple of 8");
    static_assert(KV_IDLE || FA_TILE_N % KV_RSTEP == 0, "K/V copy rounds must cover a tile exactly");
    // Row strides of 2^31 / KV_STEP elements or more (GiBs between rows)
    // would wrap those steps: fail loudly rather than read the wrong rows.
    if (strides.k_s > 0x7fffffffll / KV_STEP || strides.v_s > 0x7fffffffll / KV_STEP) __trap();
    const int ld_row = tid / KV_TPR;
    const int ld_ch = tid % KV_TPR;
    const unsigned ld_dst = tile_off<D>(ld_row, ld_ch);
    // Shared offset of chunk j of the thread's row from its chunk 0: KV_TPR
    // (8, 16 or 32) chunks further, an add (the swizzle XORs the 3 low chunk bits
    // only), except under D 96's split swizzle (chunk 4 apart, or in the tail).
    unsigned ld_delta[KV_CPT];
#pragma unroll
    for (int j = 0; j < KV_CPT; ++j)
        ld_delta[j] = fa_split_swizzle<D>() ? tile_off<D>(ld_row, ld_ch + j * KV_TPR) - ld_dst : (unsigned)(j * KV_TPR * 16);
    const elem_t* k_next = kh + (long long)(t0 * FA_TILE_N + ld_row) * strides.k_s + ld_ch * 8;
    const elem_t* v_next = vh + (long long)(t0 * FA_TILE_N + ld_row) * strides.v_s + ld_ch * 8;
    auto load_kv = [&](int t) {
        if (KV_IDLE && ld_row >= FA_TILE_N) return;
        const int rows_left = seq_k - t * FA_TILE_N - ld_row;  // copy i is a key < SK iff i * KV_RSTEP < this
        const unsigned slot = (unsigned)((t % STAGES) * KV_BYTES) + ld_dst;
#pragma unroll
        for (int i = 0; i < KV_ITERS; ++i) {
            const bool ok = i * KV_RSTEP < rows_left;
            const unsigned dst = slot + i * KV_RSTEP * ROW_BYTES;
#pragma unroll
            for (int j = 0; j < KV_CPT; ++j) {
                cp_async16(s_k + dst + ld_delta[j], ok ? k_next + j * KV_TPR * 8 : k, ok);
                cp_async16(s_v + dst + ld_delta[j], ok ? v_next + j * KV_TPR * 8 : v, ok);
            }
            k_next += KV_STEP * (int)strides.k_s;
            v_next += KV_STEP * (int)strides.v_s;
            asm volatile("" : "+l"(k_next), "+l"(v_next));
        }
    };
    // Group 0 holds Q and tile t0; groups 1 .. STAGES - 2 one tile each.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (t0 + s < n_tiles) load_kv(t0 + s);
        cp_async_commit();
    }

    // Q fragments from shared memory inside the loop (two m-tiles, D 256) wait
    // for Q at the loop's first wait + barrier; in registers, here.
    if constexpr (Q_REGS) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
    }

    // Per-lane ldmatrix offsets. Every matrix starts at a row that is a multiple
    // of 8, so a lane's row % 8 is lr, and for an even chunk 2c:
    //   tile_off(row, 2c + x) = tile_off(row, x) ^ (c << 5)     (SWIZZLE=1)
    //                         = tile_off(row, x) + (c << 5)     (SWIZZLE=0)
    // (the XOR touches chunk bits only), so the unrolled loops below need one
    // offset per k-step (K, Q) or per dim pair (V) and an immediate per row block
    // (FragLane; D 96 swizzled: a row offset plus two chunk offsets, see there).
    // Every row block moved by a multiple of 8 rows keeps row % 8 and the swizzle.
    const FragLane<D> q_lane(rg * WR + (mi & 1) * 8 + lr, mi >> 1);
    const FragLane<D> k_lane((mi >> 1) * 8 + lr, mi & 1);
    const FragLane<D> v_lane((mi & 1) * 8 + lr, mi >> 1);
    // Q A fragments: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
    // (rows 0-7, k 8-15), (rows 8-15, k 8-15) of each 16 x 16 k-step; held for
    // the whole loop (Q_REGS), else reloaded per k-step.
    unsigned qf[Q_REGS ? KSTEPS : 1][4];
    if constexpr (Q_REGS) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) ldmatrix_x4(qf[kk], s_q + q_lane.at(kk));
    }

    float acc[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < DT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
    }
    // Row h = 16 (h >> 1) + g + 8 (h & 1) of the warp's rows: running max of the
    // raw scores, this thread's share of the row sum.
    OnlineSoftmax<RH, false, Exp2Approx> sm;
    sm.init();
    const float sl2 = softmax_scale * OPTD_LOG2E;
    auto acc_at = [&](int mt, int j, int e) -> float& { return acc[mt][j][e]; };

    for (int t = t0; t < n_tiles; ++t) {
        cp_async_wait<STAGES - 2>();  // tile t has landed (this thread's copies)
        __syncthreads();              // ... everyone's; slot (t - 1) % STAGES is free
        if (t + STAGES - 1 < n_tiles) load_kv(t + STAGES - 1);
        cp_async_commit();

        const int kv0 = t * FA_TILE_N + ks * BLOCK_N;  // this warp's first key
        // Warp-uniform: rows all past SQ, keys all past SK, or the sub-tile is
        // wholly above the rows (causal) or left of their windows (the loop's first
        // tile, rounded down from the CTA's first row, and sub-tiles of KV_WARPS > 1).
        if (wrow0 >= seq_q || kv0 >= seq_k || mask.above(kv0, wrow0 + WR - 1) || mask.left_of(kv0 + BLOCK_N, wrow0))
            continue;
        // Sub-tile rows start at a multiple of 16, so row % 8 and the swizzle are unchanged.
        const unsigned sub = (unsigned)((t % STAGES) * KV_BYTES + ks * BLOCK_N * ROW_BYTES);
        const unsigned kb = s_k + sub;
        const unsigned vb = s_v + sub;

        // 2. S = Q K^T. ldmatrix.x4 on K: (keys 0-7, k 0-7), (keys 0-7, k 8-15),
        //    (keys 8-15, k 0-7), (keys 8-15, k 8-15) -> B of n-tiles 2 j2, 2 j2 + 1,
        //    for every m-tile (D 96: 6 k-steps, D 256: 16).
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int j = 0; j < NT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            unsigned qa[MT][4];
            if constexpr (Q_REGS) {
#pragma unroll
                for (int e = 0; e < 4; ++e) qa[0][e] = qf[kk][e];
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(qa[mt], s_q + mt * 16 * ROW_BYTES + q_lane.at(kk));
            }
#pragma unroll
            for (int j2 = 0; j2 < NT / 2; ++j2) {
                unsigned b[4];
                ldmatrix_x4(b, kb + j2 * 16 * ROW_BYTES + k_lane.at(kk));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(s[mt][2 * j2], qa[mt], b[0], b[1]);
                    mma16816(s[mt][2 * j2 + 1], qa[mt], b[2], b[3]);
                }
            }
        }

        // 3. Masking: ragged tail, (causal) tiles crossing the warp's diagonal, and
        //    (window) tiles crossing the left edge of some row's window.
        auto s_at = [&](int mt, int j, int e) -> float& { return s[mt][j][e]; };
        if (mask.partial(kv0, BLOCK_N, wrow0)) m16n8_mask<MT, NT, MT == 2>(s_at, mask, wrow0 + g, kv0, 2 * tq);
        if (mask.partial_left(kv0, wrow0 + WR - 1)) m16n8_mask_left<MT, NT>(s_at, mask, wrow0 + g, kv0, 2 * tq);

        // 4. Online softmax, per m-tile rows g (e = 0, 1) and g + 8 (e = 2, 3).
        float mx[RH], bias[RH], corr[RH];
        m16n8_row_max<MT, NT>(s_at, sm.m, mx);
        sm.rescale(mx, sl2, bias, corr);
        m16n8_scale_rows<MT, DT>(acc_at, corr);
        m16n8_exp2<MT, NT>(s_at, sm, sl2, bias);

        // 5. O += P V. P's A fragment of keys 16 kk2 .. + 15 is n-tiles 2 kk2 and
        //    2 kk2 + 1 of S. ldmatrix.x4.trans on V: (keys 0-7, d 0-7),
        //    (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15), for
        //    every m-tile.
#pragma unroll
        for (int kk2 = 0; kk2 < NT / 2; ++kk2) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                a[mt][0] = pack2(s[mt][2 * kk2][0], s[mt][2 * kk2][1]);
                a[mt][1] = pack2(s[mt][2 * kk2][2], s[mt][2 * kk2][3]);
                a[mt][2] = pack2(s[mt][2 * kk2 + 1][0], s[mt][2 * kk2 + 1][1]);
                a[mt][3] = pack2(s[mt][2 * kk2 + 1][2], s[mt][2 * kk2 + 1][3]);
            }
#pragma unroll
            for (int dj2 = 0; dj2 < DT / 2; ++dj2) {
                unsigned b[4];
                ldmatrix_x4_trans(b, vb + kk2 * 16 * ROW_BYTES + v_lane.at(dj2));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(acc[mt][2 * dj2], a[mt], b[0], b[1]);
                    mma16816(acc[mt][2 * dj2 + 1], a[mt], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();  // only empty groups can be pending; drain them anyway

    float l_sum[RH], inv[RH];
#pragma unroll
    for (int h = 0; h < RH; ++h) {
        l_sum[h] = quad_sum(sm.l[h]);
        inv[h] = l_sum[h] > 0.f ? 1.f / l_sum[h] : 0.f;
    }
#if KV_WARPS > 1
    kv_warps_merge<D>(acc, sm.m, l_sum, inv, sl2, warp, rg, ks, g, tq);
    if (ks != 0) return;  // warp 0 of the group stores the merged rows
#endif

    // --- Epilogue: O / l through the group's Q rows, then 16-byte stores ---
    // No barrier: only this warp read these Q rows (KV_WARPS > 1: the merge's
    // barriers separate them from the other warps' reads).
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int r0 = rg * WR + 16 * mt + g;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
            *reinterpret_cast<unsigned*>(fa_smem + tile_off<D>(r0, j) + 4 * tq) =
                pack2(acc[mt][j][0] * inv[2 * mt], acc[mt][j][1] * inv[2 * mt]);
            *reinterpret_cast<unsigned*>(fa_smem + tile_off<D>(r0 + 8, j) + 4 * tq) =
                pack2(acc[mt][j][2] * inv[2 * mt + 1], acc[mt][j][3] * inv[2 * mt + 1]);
        }
    }
    __syncwarp();
    elem_t* oh = o + optd_head_off(strides.o_b, strides.o_h, b, hq);
#pragma unroll
    for (int i = 0; i < WR * CH / 32; ++i) {
        const int c = lane + 32 * i;
        const int r = c / CH, ch = c % CH;
        const int row = wrow0 + r;
        if (row < seq_q) {
            const uint4 val = *reinterpret_cast<const uint4*>(fa_smem + tile_off<D>(rg * WR + r, ch));
            *reinterpret_cast<uint4*>(oh + (long long)row * strides.o_s + ch * 8) = val;
        }
    }
}

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(FA_THREADS, 1) optd_fwd_d64(OPTD_ARGS) {
    mma_fa2_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D96
extern "C" __global__ void __launch_bounds__(FA_THREADS, 1) optd_fwd_d96(OPTD_ARGS) {
    mma_fa2_fwd<96>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(FA_THREADS, 1) optd_fwd_d128(OPTD_ARGS) {
    mma_fa2_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(FA_THREADS, 1) optd_fwd_d256(OPTD_ARGS) {
    mma_fa2_fwd<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
