/******************************************************************************
 * decode_split.cuh: one split of flash-decoding, shared by decode.cu
 * (decode-split: partials + a combine launch) and decode_cluster.cu
 * (decode-cluster: the splits of a group are one thread-block cluster and
 * combine through distributed shared memory). Read decode.cu's header for
 * the method; this file is its per-CTA part:
 *
 *   decode_split_tile<D>(..., t_begin, t_end, after_first_issue)
 *       the CTA (blockIdx.y = b * HKV + kv head, blockIdx.z = row block of
 *       DEC_CTA_ROWS = 16 * M_TILES packed rows r = gi * SQ + s) walks key
 *       tiles [t_begin, t_end) of DEC_TILE_N keys: packed Q rows and a
 *       STAGES-deep cp.async K/V ring, mma.sync S = Q K^T and O += P V per
 *       warp on its 16 rows and BLOCK_N keys of each tile, online softmax,
 *       then the warps' merge. On return (after a barrier) shared memory
 *       holds, for each valid row r < dec_rows_valid():
 *         xo[kw][r][0 .. D) key warp kw's share of the split's normalized O
 *                           row (fp32, rows of DecSmem::XO_ROW floats, kw
 *                           stepping DEC_CTA_ROWS rows): the row is the sum
 *                           over the DEC_KEY_WARPS key warps;
 *         lse_s[r]          the split's natural-log LSE of the scaled scores,
 *                           -inf (and O = 0) when it saw no key of the row.
 *   dec_rows_valid(heads_q, heads_kv, seq_q)   packed rows of this CTA
 *   dec_visible_tiles(seq_q, seq_k, causal, window)  the key tiles some query
 *                             row sees: the range the splits divide
 *   dec_out_row(...)          where packed row r's output row lives
 *
 * M_TILES: the m16 row tiles of one CTA. Warp w computes row tile w % M_TILES
 * on key slice kw = w / M_TILES (BLOCK_N keys of every tile), so a CTA tile is
 * DEC_TILE_N = (NUM_WARPS / M_TILES) * BLOCK_N keys and each K/V byte crosses
 * from L2 once for all 16 * M_TILES rows. Why: MQA (G = 32) and speculative
 * decode of a wide group (G * SQ > 16) need two row tiles; as two CTAs
 * (M_TILES = 1) both read the same K/V, twice the CTAs and L2 traffic for
 * the same HBM bytes, and decode-cluster's 16 clusters of 8 at MQA B 8 do not
 * fit in one wave (a second wave at 8 us: scripts/decode_timeline.py, 2026-11-27).
 * Each warp keeps decode.cu's register budget (one m16 tile of Q and O).
 *
 * WARP_LOADS = 1: the M_TILES warps of key slice kw copy the BLOCK_N keys of
 * every tile that they alone read (rows kw * BLOCK_N .. + BLOCK_N - 1 of the
 * slot), so a tile's wait is their own cp.async groups and a __syncwarp (one
 * warp) or a named barrier of the M_TILES warps (id 1 + kw), with no CTA
 * barrier per tile: the warps drift apart, one computing while another still
 * waits for its bytes.
 * WARP_LOADS = 0: the CTA's threads copy the whole tile together (each a chunk
 * column of rows tid / CH + i * KV_RSTEP) and meet at a __syncthreads per tile.
 *
 * K_FIRST = 1: a tile's K copies are one cp.async group and its V copies the
 * next, so S = Q K^T and the softmax of tile i wait only for K(i), and P V
 * waits for V(i) (a second wait and barrier per tile). Why: the call ends with
 * the last tile's math after its last byte lands (0.87 us of MQA B 8's 3.3 us
 * tail on the H100, scripts/decode_timeline.py --last, 2026-11-28); with K's
 * bytes requested first, Q K^T and the softmax of that tile run while its V
 * is still arriving, and only P V follows the last byte.
 * K_FIRST = 0: each thread's K and V copies interleave in one group per tile.
 *
 * Head dims: any multiple of 32 (the project's 64, 96, 128, 256). The k-steps
 * of Q K^T and the n-tiles of O come in pairs of 16 columns (one ldmatrix.x4
 * covers two 16-byte chunks), and the XOR swizzle below permutes a row's
 * 16-byte chunks within aligned groups: of 8 where a row is a whole number of
 * 128-byte lines (D % 64 == 0), of 4 where it is not (D 96: 12 chunks, 192
 * bytes; D % 64 == 32 in general). What differs per head dim:
 *   - swizzle: chunk c of row r at c ^ (r % 8) (D % 64 == 0), at
 *     c ^ ((r / 2) % 4) (D 96: rows alternate between the two halves of the
 *     banks, since 192 = 1.5 x 128 bytes, so the pairs of rows take the four
 *     chunk permutations of a group and the 8 rows of an ldmatrix phase hit 8
 *     distinct 16-byte bank groups); a lane's ldmatrix address of chunk pair p is
 *     a XOR of p at D % 64 == 0 and one of two bases plus 32 p at D 96 (the row
 *     stride 192 has bits where the pair index would be XORed: DecLaneOff).
 *   - K/V copies: a thread copies DecCopy<D>::CPT chunks of a row, TPR chunks
 *     apart, TPR threads per row: one chunk column (TPR = CH) up to D 128 as
 *     before; D 256: TPR 8, 4 chunks 128 bytes apart (each copy instruction of
 *     a warp still covers whole 128-byte lines, 4 rows of one; a thread's 4
 *     chunks of a row share its source pointer, stepped once per row, and its
 *     rows are 4x further apart than with 32 threads a row, so that the
 *     constant-offset path below (KV_RSTEP % 8 == 0) holds from 64 copying
 *     threads on); D 96: TPR 4, 3 chunks 64 bytes apart (12 chunks do not
 *     divide 32 threads). The swizzle leaves the chunks of one thread TPR * 16
 *     bytes apart in every row.
 *   - Q fragments: held in registers (D / 4 b32) for D <= 128; at D 256 they
 *     would be 64 registers next to O's 128 fp32 accumulators and the S tile,
 *     so each k-step's fragment is loaded again from the Q tile (still there
 *     until the merge) by one ldmatrix.x4 per k-step and tile, next to the
 *     NT / 2 of K.
 *
 * Expects the including template to define the knobs BLOCK_N, NUM_WARPS,
 * STAGES, WARP_LOADS, M_TILES and K_FIRST and to launch NUM_WARPS * 32 threads
 * with DecSmem<D>::BYTES of dynamic shared memory.
 ******************************************************************************/
#ifndef OPTD_DECODE_SPLIT_CUH
#define OPTD_DECODE_SPLIT_CUH

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
#ifndef WARP_LOADS
#error "WARP_LOADS must be defined (0 or 1)"
#endif
#if WARP_LOADS != 0 && WARP_LOADS != 1
#error "WARP_LOADS must be 0 (the CTA copies each tile) or 1 (each warp copies its own keys)"
#endif
#ifndef M_TILES
#error "M_TILES must be defined (1 or 2 m16 row tiles per CTA)"
#endif
#if M_TILES != 1 && M_TILES != 2
#error "M_TILES must be 1 or 2"
#endif
#ifndef K_FIRST
#error "K_FIRST must be defined (0: K and V of a tile in one cp.async group, 1: K's group first)"
#endif
#if K_FIRST != 0 && K_FIRST != 1
#error "K_FIRST must be 0 or 1"
#endif
#if NUM_WARPS % M_TILES != 0
#error "NUM_WARPS must be a multiple of M_TILES (each row tile has the same key warps)"
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

#define DEC_ROWS 16                          // packed query rows of a warp: one m16 tile
#define DEC_CTA_ROWS (DEC_ROWS * M_TILES)    // packed query rows of a CTA
#define DEC_KEY_WARPS (NUM_WARPS / M_TILES)  // warps per row tile, each on its keys
#define DEC_TILE_N (DEC_KEY_WARPS * BLOCK_N) // keys per CTA tile
#define DEC_THREADS (NUM_WARPS * 32)

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
// chunk c stored at c ^ (row % 8) (D % 64 == 0) or c ^ ((row / 2) % 4) (D % 64 == 32:
// a 4-chunk group, so that chunk 8..11 of D 96's 12 stays in the row), so the 8 row
// addresses of every ldmatrix phase and of the cp.async writes hit 8 distinct 16-byte
// bank groups (D 96: row r starts at 16-byte bank group 4 (r % 2), and rows 2i, 2i + 1
// take permutation i of the group).
template <int D>
__device__ __forceinline__ unsigned dec_tile_off(int row, int chunk) {
    if constexpr (D % 64 == 0)
        return static_cast<unsigned>(row * (2 * D) + ((chunk ^ (row & 7)) << 4));
    else
        return static_cast<unsigned>(row * (2 * D) + ((chunk ^ ((row >> 1) & 3)) << 4));
}

// A lane's ldmatrix byte offset of chunk pair p (chunks 2p, 2p + 1: k-step p of Q or
// K, n-tile pair p of V) in a block of rows starting at a multiple of 8: constructed
// from base (bytes before the block's row 0, a multiple of 16 rows) + tile_off(row, x),
// x the lane's chunk of the pair (0 or 1).
// D % 64 == 0: tile_off(row, 2p + x) = tile_off(row, x) ^ (p << 5) (the row stride is a
// multiple of 128 bytes, so the XOR touches only the chunk bits).
// D % 64 == 32 (D 96): with s = (row / 2) % 4 = 2 s1 + s0, (2p + x) ^ s = 2 (p ^ s1) + (x ^ s0)
// and p ^ s1 = p + s1 (p even) or p - s1 (p odd): the pair-0 offset, or that minus 64 s1,
// plus 32 p (a constant of the unrolled loops).
template <int D>
struct DecLaneOff {
    unsigned even, odd;
    __device__ __forceinline__ DecLaneOff(unsigned base, int row, int x) {
        even = base + dec_tile_off<D>(row, x);
        odd = even;
        if constexpr (D % 64 != 0) odd -= (unsigned)((row >> 2) & 1) << 6;
    }
    __device__ __forceinline__ unsigned at(int p) const {
        if constexpr (D % 64 == 0) return even ^ (unsigned)(p << 5);
        else return ((p & 1) ? odd : even) + (unsigned)(p << 5);
    }
};

// K/V copies: TPR threads per row, each copying CPT 16-byte chunks of it, TPR chunks
// apart (chunk ld_ch + j TPR, j < CPT). The swizzle maps them to tile_off(row, ld_ch)
// + 16 TPR j: it permutes within groups of 8 (or 4) chunks and TPR is a multiple of that.
// Up to D 128, one chunk column per thread (TPR = CH, CPT = 1); D 256: 8 threads of 4
// chunks; D 96 (12 chunks, not a divisor of a warp): 4 threads of 3.
template <int D>
struct DecCopy {
    static constexpr int CH = D / 8;
    static constexpr int TPR = (D % 64 != 0) ? 4 : (CH > 16 ? 8 : CH);
    static constexpr int CPT = CH / TPR;
    static_assert(CH % TPR == 0 && TPR % ((D % 64 == 0) ? 8 : 4) == 0, "a thread's chunks keep their distance under the swizzle");
};

// Dynamic shared memory (bytes from the base): the packed Q rows, then the K
// and V rings; after the key loop the merge puts the warps' row maxima and
// sums and the rows' LSE in the Q tile and their fp32 O rows (padded to D + 8
// floats against bank conflicts of the float2 stores) over the drained ring.
// BYTES = the spec's smem formula of the including template.
template <int D>
struct DecSmem {
    static constexpr int ROW_BYTES = 2 * D;
    static constexpr int Q_BYTES = DEC_CTA_ROWS * ROW_BYTES;
    static constexpr int KV_BYTES = DEC_TILE_N * ROW_BYTES;  // one K (or V) tile
    static constexpr int XO_ROW = D + 8;                     // floats per merged O row
    static constexpr int Q = 0;
    static constexpr int K = Q + Q_BYTES;                    // STAGES x KV_BYTES
    static constexpr int V = K + STAGES * KV_BYTES;          // STAGES x KV_BYTES
    static constexpr int RING_END = V + STAGES * KV_BYTES;
    static constexpr int XO = Q_BYTES;
    static constexpr int XO_END = XO + NUM_WARPS * DEC_ROWS * XO_ROW * 4;
    static constexpr int BYTES = RING_END > XO_END ? RING_END : XO_END;
    static constexpr int ML = Q;                                  // [2][NUM_WARPS][16] floats
    static constexpr int LSE = ML + 2 * NUM_WARPS * DEC_ROWS * 4;  // [DEC_CTA_ROWS] floats
    static_assert(LSE + DEC_CTA_ROWS * 4 <= Q_BYTES, "row maxima, sums and LSE must fit in the Q tile");
};

// Packed rows of this CTA's row block (blockIdx.z), 1 .. DEC_CTA_ROWS.
__device__ __forceinline__ int dec_rows_valid(int heads_q, int heads_kv, int seq_q) {
    return min(DEC_CTA_ROWS, (heads_q / heads_kv) * seq_q - (int)blockIdx.z * DEC_CTA_ROWS);
}

// Packed row r of this CTA (R = DEC_CTA_ROWS): query head kvh * G + (R z + r) / SQ,
// row (R z + r) % SQ.
struct DecRow {
    int hq, s;
};
__device__ __forceinline__ DecRow dec_out_row(int r, int heads_q, int heads_kv, int seq_q) {
    const int pr = (int)blockIdx.z * DEC_CTA_ROWS + r;
    const int kvh = (int)blockIdx.y % heads_kv;
    return DecRow{kvh * (heads_q / heads_kv) + pr / seq_q, pr % seq_q};
}

// Key tiles [begin, end) of DEC_TILE_N keys that some query row sees: every key < SK,
// except that a window starts them at the tile of row 0's first key (row 0, the earliest
// position, has the smallest first key; a CTA's packed rows that start later are masked
// per element). The splits divide this range, not [0, SK): a window of W over a cache of
// SK keys reads about W + SQ keys, in as many splits as those keys call for (the spec's
// kv_tiles is the same count).
struct DecTiles {
    int begin, end;
};
__device__ __forceinline__ DecTiles dec_visible_tiles(int seq_q, int seq_k, int causal, int window) {
    // The end is SK's tile, not keys_before(SQ) (the same: the last row sees every key);
    // keys_before's min made ptxas spill up to 32 bytes more at D 256, at 255 registers.
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), window);
    return DecTiles{mask.keys_from(0) / DEC_TILE_N, (seq_k + DEC_TILE_N - 1) / DEC_TILE_N};
}

// after_first_issue(): called by every thread once the first K/V tile's and Q's copies
// are issued (decode-cluster arms its mbarriers there: the copies leave first).
// window: the one the kernel applies (common/optd.cuh's optd_window()).
template <int D, typename AfterFirstIssue>
__device__ __forceinline__ void decode_split_tile(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
                                                  const elem_t* __restrict__ v, int heads_q, int heads_kv, int seq_q,
                                                  int seq_k, float softmax_scale, int causal, int window,
                                                  const optd_strides& strides, int t_begin, int t_end,
                                                  AfterFirstIssue after_first_issue) {
    static_assert(D % 32 == 0 && D >= 32,
                  "D must be a multiple of 32: k-steps and O's n-tiles go in pairs of 16 columns (ldmatrix.x4), "
                  "and the swizzle permutes a row's 16-byte chunks in groups of 8 (D % 64 == 0) or 4 (D % 64 == 32)");
    using L = DecSmem<D>;
    constexpr int CH = D / 8;        // 16-byte chunks per row
    constexpr int ROW_BYTES = L::ROW_BYTES;
    constexpr int KV_BYTES = L::KV_BYTES;
    constexpr int KSTEPS = D / 16;   // k-steps of S = Q K^T
    constexpr int NT = BLOCK_N / 8;  // n8 tiles of S per warp
    constexpr int DT = D / 8;        // n8 tiles of O
    // Q's A fragments stay in registers (KSTEPS x 4 b32) up to D 128; at D 256 they are
    // loaded again per k-step and tile (see the header: the O accumulators need the room).
    constexpr bool Q_REGS = KSTEPS <= 8;
    constexpr int Q_ITERS = (DEC_CTA_ROWS * CH + DEC_THREADS - 1) / DEC_THREADS;
    // WARP_LOADS: the copying threads are the lanes of a key slice's M_TILES warps
    // and its BLOCK_N rows.
    constexpr int LD_THREADS = WARP_LOADS ? 32 * M_TILES : DEC_THREADS;
    constexpr int LD_ROWS = WARP_LOADS ? BLOCK_N : DEC_TILE_N;
    constexpr int TPR = DecCopy<D>::TPR;  // threads per K/V row (CH up to D 128)
    constexpr int CPT = DecCopy<D>::CPT;  // chunks a thread copies per row (1 up to D 128)
    static_assert(LD_THREADS % TPR == 0, "a thread copies the same chunks of every row it copies");
    constexpr int KV_RSTEP = LD_THREADS / TPR;  // rows between a thread's copies
    static_assert(LD_ROWS % KV_RSTEP == 0, "K/V tile chunks must split evenly over the threads");
    constexpr int KV_ITERS = LD_ROWS / KV_RSTEP;

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
    const int wrt = warp % M_TILES;  // this warp's row tile
    const int kw = warp / M_TILES;   // ... and key slice: keys kw * BLOCK_N .. of every tile

    const int b = blockIdx.y / heads_kv;
    const int kvh = blockIdx.y % heads_kv;
    const int group = heads_q / heads_kv;
    const int rows_valid = min(DEC_CTA_ROWS, group * seq_q - (int)blockIdx.z * DEC_CTA_ROWS);  // packed rows of the CTA
    const int prow0 = blockIdx.z * DEC_CTA_ROWS;  // the CTA's first packed row: r = gi * SQ + s
    const int wrow0 = wrt * DEC_ROWS;             // the warp's first row, of the CTA's

    const elem_t* kh = k + optd_head_off(strides.k_b, strides.k_h, b, kvh);
    const elem_t* vh = v + optd_head_off(strides.v_b, strides.v_h, b, kvh);

    const int my_tiles = max(0, t_end - t_begin);

    // --- packed Q rows: row r = query head kvh * G + (prow0 + r) / SQ, row (prow0 + r) % SQ.
    // Issued after the first K/V tile's copies (same commit group): the timeline of 2026-11-27
    // (scripts/decode_timeline.py) had a CTA's prologue take 0.8 us of index math and copies
    // before its last K/V copy left, with HBM idle meanwhile; tile 0 is the critical path.
    auto load_q = [&]() {
#pragma unroll
        for (int i = 0; i < Q_ITERS; ++i) {
            const int c = tid + i * DEC_THREADS;
            if ((DEC_CTA_ROWS * CH) % DEC_THREADS != 0 && c >= DEC_CTA_ROWS * CH) break;
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
    };

    // K/V tile t -> ring slot (t - t_begin) % STAGES, keys >= SK zero-filled.
    // Copy (i, j) of a thread is chunk ld_ch + j * TPR of tile row ld_row + i * KV_RSTEP:
    // CTA-wide, ld_row = tid / TPR; WARP_LOADS, within the key slice's rows kw * BLOCK_N + ...
    // (warps kw * M_TILES .. + M_TILES - 1 copy them, lanes wrt * 32 + lane).
    const int ld_tid = WARP_LOADS ? wrt * 32 + lane : tid;
    const int ld_row = (WARP_LOADS ? kw * BLOCK_N : 0) + ld_tid / TPR;
    const int ld_ch = ld_tid % TPR;
    const long long k_row = strides.k_s, v_row = strides.v_s;
    const elem_t* k_thr = kh + (long long)ld_row * k_row + ld_ch * 8;
    const elem_t* v_thr = vh + (long long)ld_row * v_row + ld_ch * 8;
    // Tiles are loaded in order, t_begin first: the thread's source pointers step by a
    // tile's rows, and copy i is KV_RSTEP rows further on. A tile wholly below SK (all but
    // the last, CTA-uniform) takes copies without bounds or source-size operands. The
    // general form below, with its 64-bit index products and reloaded strides, took 290
    // instructions per tile for 16 copies, half of all a warp issued at B 1 (ncu source
    // counters, H100, 2026-11-27); the fast form about 70 (B 1 x SK 4096 at CLUSTER 8:
    // 10.55 -> 10.06 us; the long splits of CLUSTER 2 up to 17% faster).
    const long long k_rstep = (long long)KV_RSTEP * k_row, v_rstep = (long long)KV_RSTEP * v_row;
    const elem_t* k_next = k_thr + (long long)t_begin * DEC_TILE_N * k_row;
    const elem_t* v_next = v_thr + (long long)t_begin * DEC_TILE_N * v_row;
    const long long k_tstep = (long long)DEC_TILE_N * k_row, v_tstep = (long long)DEC_TILE_N * v_row;
    // parts: 1 = tile t's K rows, 2 = its V rows, 3 = both, each thread's K and V
    // copies interleaved (a literal at every call: the unused half folds away).
    auto load_kv = [&](int t, int parts) {
        const int kv0 = t * DEC_TILE_N;
        const unsigned slot = (unsigned)(((t - t_begin) % STAGES) * KV_BYTES);
        const unsigned dst0 = slot + dec_tile_off<D>(ld_row, ld_ch);
        const elem_t* ks = k_next;
        const elem_t* vs = v_next;
        if (parts & 1) k_next += k_tstep;
        if (parts & 2) v_next += v_tstep;
        if (kv0 + DEC_TILE_N <= seq_k) {
#pragma unroll
            for (int i = 0; i < KV_ITERS; ++i) {
                // KV_RSTEP is a multiple of 8 rows where the swizzle repeats: a constant offset.
                const unsigned dst = (KV_RSTEP % 8 == 0) ? dst0 + (unsigned)(i * KV_RSTEP * ROW_BYTES)
                                                         : slot + dec_tile_off<D>(ld_row + i * KV_RSTEP, ld_ch);
#pragma unroll
                for (int j = 0; j < CPT; ++j) {
                    if (parts & 1) cp_async16_full(s_k + dst + (unsigned)(j * TPR * 16), ks + j * TPR * 8);
                    if (parts & 2) cp_async16_full(s_v + dst + (unsigned)(j * TPR * 16), vs + j * TPR * 8);
                }
                ks += k_rstep;
                vs += v_rstep;
            }
            return;
        }
        const int rows_left = seq_k - kv0 - ld_row;  // copy i is a key < SK iff i * KV_RSTEP < this
#pragma unroll
        for (int i = 0; i < KV_ITERS; ++i) {
            const bool ok = i * KV_RSTEP < rows_left;
            const unsigned dst = slot + dec_tile_off<D>(ld_row + i * KV_RSTEP, ld_ch);
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                if (parts & 1)
                    cp_async16(s_k + dst + (unsigned)(j * TPR * 16), ok ? ks + (long long)i * KV_RSTEP * k_row + j * TPR * 8 : kh, ok);
                if (parts & 2)
                    cp_async16(s_v + dst + (unsigned)(j * TPR * 16), ok ? vs + (long long)i * KV_RSTEP * v_row + j * TPR * 8 : vh, ok);
            }
        }
    };
    // Tile t's copies: one cp.async group (K_FIRST 0), or K's group then V's (K_FIRST 1).
    // Every call commits the same number of groups, empty ones past the CTA's tiles, so
    // the waits below count groups the same way in every iteration.
    auto issue_tile = [&](int t, bool live) {
        if (K_FIRST) {
            if (live) load_kv(t, 1);
            cp_async_commit();
            if (live) load_kv(t, 2);
            cp_async_commit();
        } else {
            if (live) load_kv(t, 3);
            cp_async_commit();
        }
    };
    // Groups committed after a tile's first (K_FIRST: its K) group, and after its last,
    // by the time that tile is consumed: the waits of the loop below.
    constexpr int GROUPS_PER_TILE = K_FIRST ? 2 : 1;
    constexpr int AFTER_FIRST = GROUPS_PER_TILE * (STAGES - 1) - 1;  // before the tile's copies are issued
    constexpr int AFTER_LAST = GROUPS_PER_TILE * (STAGES - 1);       // after it, in the same iteration

    // Group 0 holds the first tile (K_FIRST: its K) and Q; then a group per tile (K_FIRST:
    // per half tile) up to tile STAGES - 2.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s == 0) {
            if (s < my_tiles) load_kv(t_begin, K_FIRST ? 1 : 3);
            load_q();
            cp_async_commit();
            after_first_issue();
            if (K_FIRST) {
                if (s < my_tiles) load_kv(t_begin, 2);
                cp_async_commit();
            }
        } else {
            issue_tile(t_begin + s, s < my_tiles);
        }
    }
    cp_async_wait<AFTER_FIRST>();
    __syncthreads();  // Q is every thread's copies (and, CTA-wide, so is tile 0, or its K)

    // Per-lane ldmatrix offsets; every matrix starts at a row that is a multiple
    // of 8, so chunk pair p's offset follows from pair 0's (DecLaneOff::at).
    // The warp's Q rows start at row wrow0 (a multiple of 16: the swizzle is the same).
    const DecLaneOff<D> q_lane((unsigned)(wrow0 * ROW_BYTES), (mi & 1) * 8 + lr, mi >> 1);
    const DecLaneOff<D> k_lane(0u, (mi >> 1) * 8 + lr, mi & 1);
    const DecLaneOff<D> v_lane(0u, (mi & 1) * 8 + lr, mi >> 1);
    unsigned qf[Q_REGS ? KSTEPS : 1][4];
    if constexpr (Q_REGS) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) dec_ldmatrix_x4(qf[kk], s_q + q_lane.at(kk));
    }

    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    OnlineSoftmax<2, false, Exp2Approx> sm;
    sm.init();
    const float sl2 = softmax_scale * OPTD_LOG2E;
    auto acc_at = [&](int, int j, int e) -> float& { return acc[j][e]; };

    // Causal: row s sees keys < limit(s); the thread's rows g and g + 8 have
    // s = packed row % SQ (padding rows: any s, never stored). Windowed: and keys
    // >= limit(s) - window (windows come with causal only, where limit(s) is
    // s + 1 + SK - SQ, so this is first_key(s) without the clamp at 0, which no key
    // needs): no second per-row value is kept for the rare left-edge tiles.
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), window);
    int lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) lim[h] = mask.limit((prow0 + wrow0 + g + 8 * h) % seq_q);
    // A warp whose row tile is all padding (the CTA's last row block) skips the math.
    const bool rows_live = M_TILES == 1 || wrow0 < rows_valid;

    // The copies of every thread that wrote what this warp reads have landed: within the
    // key slice's warps with WARP_LOADS (its rows, their copies), else CTA-wide.
    auto tile_barrier = [&]() {
        if (WARP_LOADS && M_TILES == 1) __syncwarp();
        else if (WARP_LOADS) asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kw), "n"(32 * M_TILES) : "memory");
        else __syncthreads();
    };

    for (int i = 0; i < my_tiles; ++i) {
        cp_async_wait<AFTER_FIRST>();  // tile i (K_FIRST: its K) has landed (this thread's copies)
        // ... and every copier's, and slot (i - 1) % STAGES is free: no reader of it is
        // still in tile i - 1.
        tile_barrier();
        issue_tile(t_begin + i + STAGES - 1, i + STAGES - 1 < my_tiles);

        const int kv0 = (t_begin + i) * DEC_TILE_N + kw * BLOCK_N;  // this warp's first key
        // Warp-uniform: the ragged tail of the last tile, a row tile of padding, or
        // (window) a sub-tile of the range's first tile left of every row's window. With
        // K_FIRST such a warp still meets the others at V's barrier below.
        const bool live = kv0 < seq_k && rows_live && !mask.left_of(kv0 + BLOCK_N, 0);
        if (!K_FIRST && !live) continue;
        const unsigned sub = (unsigned)((i % STAGES) * KV_BYTES + kw * BLOCK_N * ROW_BYTES);
        const unsigned kb = s_k + sub;
        const unsigned vb = s_v + sub;

        float s[NT][4];
        if (live) {
            // S = Q K^T: ldmatrix.x4 on K gives the B fragments of n-tiles 2 j2, 2 j2 + 1.
            // Even and odd k-steps accumulate apart and are added at the end: two chains of
            // KSTEPS / 2 dependent mma.sync instead of one of KSTEPS. With one warp per
            // sub-partition nothing hides the chain's latency, and the last tile's math is on
            // the call's critical path (scripts/decode_timeline.py: 0.48 us after its bytes land).
            float s2[NT][4];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
                s2[j][0] = s2[j][1] = s2[j][2] = s2[j][3] = 0.f;
            }
            // k-step kk with Q's A fragment qa.
            auto qk_step = [&](int kk, const unsigned(&qa)[4]) {
#pragma unroll
                for (int j2 = 0; j2 < NT / 2; ++j2) {
                    unsigned bf[4];
                    dec_ldmatrix_x4(bf, kb + j2 * 16 * ROW_BYTES + k_lane.at(kk));
                    float(&a0)[4] = (kk & 1) ? s2[2 * j2] : s[2 * j2];
                    float(&a1)[4] = (kk & 1) ? s2[2 * j2 + 1] : s[2 * j2 + 1];
                    dec_mma16816(a0, qa, bf[0], bf[1]);
                    dec_mma16816(a1, qa, bf[2], bf[3]);
                }
            };
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                if constexpr (Q_REGS) {
                    qk_step(kk, qf[kk]);
                } else {
                    unsigned qa[4];
                    dec_ldmatrix_x4(qa, s_q + q_lane.at(kk));
                    qk_step(kk, qa);
                }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] += s2[j][e];
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
            // Window: keys left of the first key of some row (the last row, SQ - 1,
            // starts latest); the range's first tiles only.
            if (mask.partial_left(kv0, seq_q - 1)) {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (kv0 + 8 * j + 2 * tq + (e & 1) < lim[e >> 1] - mask.window) s[j][e] = OPTD_NEG_INF;
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
        }
        if (K_FIRST) {
            cp_async_wait<AFTER_LAST>();  // V(i) has landed (this thread's copies) ...
            tile_barrier();                // ... and every copier's
            if (!live) continue;
        }

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
                dec_ldmatrix_x4_trans(bf, vb + kk2 * 16 * ROW_BYTES + v_lane.at(dj2));
                dec_mma16816(acc[2 * dj2], a, bf[0], bf[1]);
                dec_mma16816(acc[2 * dj2 + 1], a, bf[2], bf[3]);
            }
        }
    }
    cp_async_wait<0>();  // only empty groups can be pending; drain them anyway

    // --- merge of the warps' key ranges -------------------------------------
    // (Tried in session 34, 1f1637d: each warp storing its raw rows into its key slice's free ring
    // rows as soon as its own loop ends, one barrier, the weights per row after it: correct, 1.7%
    // faster at B 1 in one form, 0.4-3.6% slower at MQA in both; docs/BENCHMARKS.md (34).)
    // Maxima and sums in the Q tile ([2][NUM_WARPS][16] floats; Q was read into
    // registers before the first tile), O rows over the drained ring. Row
    // wrow0 + row of the CTA is the warps kw' * M_TILES + wrt's, kw' < DEC_KEY_WARPS.
    float* ml = reinterpret_cast<float*>(dec_smem + L::ML);
    float* lse_s = reinterpret_cast<float*>(dec_smem + L::LSE);
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
    // Both rows' factors first, then all stores: as two branches, one per row, the rows'
    // dependent chains (shared-memory loads, exponentials, the division) ran one after the
    // other (SASS), ~0.3 us of MQA's merge on the H200 (scripts/decode_timeline.py, xo_own).
    // A padding row (past rows_valid) computes on the maxima and sums its warps published
    // for it anyway, and stores nothing.
    float f[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        float m = OPTD_NEG_INF;
#pragma unroll
        for (int k2 = 0; k2 < DEC_KEY_WARPS; ++k2) m = fmaxf(m, ml[(k2 * M_TILES + wrt) * DEC_ROWS + row]);
        float total = 0.f;
#pragma unroll
        for (int k2 = 0; k2 < DEC_KEY_WARPS; ++k2) {
            const int w = k2 * M_TILES + wrt;
            const float mw = ml[w * DEC_ROWS + row];
            // A warp that saw no key of the row (mw = -inf) adds nothing; nor does any
            // when none did (m = -inf, where mw - m would be NaN).
            // Loads, exponentials and the division below are unconditional and the guards
            // selects: a branch per guard serialised the two rows again (SASS).
            const float lw = ml[(NUM_WARPS + w) * DEC_ROWS + row];
            const float e = fast_exp2((mw - m) * sl2);
            total += mw != OPTD_NEG_INF ? lw * e : 0.f;
        }
        // A row no warp saw a key for (total 0) comes out O = 0, LSE = -inf. Otherwise
        // total >= 1 (the warp holding the maximum adds its row sum, itself >= 1): the fast
        // division, without the IEEE one's range checks and slow path on the merge's chain.
        const float q = __fdividef(fast_exp2((sm.m[h] - m) * sl2), total);
        const float lg = (m * sl2 + __log2f(total)) * OPTD_LN2;
        f[h] = (sm.m[h] == OPTD_NEG_INF || total <= 0.f) ? 0.f : q;
        lse[h] = total > 0.f ? lg : OPTD_NEG_INF;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        if (wrow0 + row >= rows_valid) continue;
        // xo[kw][wrow0 + row]: warp = kw * M_TILES + wrt, so this is row warp * 16 + row.
        float* xrow = xo + (warp * DEC_ROWS + row) * L::XO_ROW + 2 * tq;
#pragma unroll
        for (int j = 0; j < DT; ++j)
            *reinterpret_cast<float2*>(xrow + 8 * j) = make_float2(acc[j][2 * h] * f[h], acc[j][2 * h + 1] * f[h]);
        if (kw == 0 && tq == 0) lse_s[wrow0 + row] = lse[h];
    }
    __syncthreads();
}


#endif  // OPTD_DECODE_SPLIT_CUH
