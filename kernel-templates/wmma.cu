/******************************************************************************
 * wmma: FlashAttention forward on the tensor cores through the WMMA API.
 *
 * The first tensor-core step: both matrix products go through nvcuda::wmma
 * (16 x 16 x 16 fragments, fp16 or bf16 inputs, fp32 accumulation), and
 * everything between them (masking, online softmax) is plain per-thread code
 * over a shared-memory tile. mma-fa2 later does the same work with mma.sync,
 * keeping S and P in registers; this template is the simpler version, with
 * no inline PTX and no knowledge of the fragment layouts.
 *
 * One CTA per (query tile of BLOCK_M rows, b * HQ + h), NUM_WARPS warps; its
 * keys and values are those of KV head optd_kv_head(h) (grouped-query
 * attention: the G = HQ / HKV query heads of a KV head are neighbours in
 * gridDim.y and re-read its tiles from L2). The Q tile is staged once in
 * shared memory; per key tile of BLOCK_N keys (t = 0 .. n_tiles - 1):
 *   1. all threads load K and V (BLOCK_N x D) into shared memory with 16-byte
 *      loads; keys >= SK are zero-filled (their p is 0, and 0 * V must not be
 *      NaN); one __syncthreads;
 *   2. S = Q K^T: the (BLOCK_M / 16) x (BLOCK_N / 16) fragments of S are
 *      dealt round-robin to the warps; each runs D / 16 wmma::mma_sync with Q
 *      as row_major matrix_a and K as col_major matrix_b (the K tile stored
 *      row-major, key by key, is K^T in column-major order), then stores its
 *      fragment to the fp32 S tile in shared memory; one __syncthreads;
 *   3. online softmax by threads: TPR = 32 * NUM_WARPS / BLOCK_M consecutive
 *      lanes own one query row (columns part, part + TPR, ...), reduce its max
 *      with xor shuffles and keep m (log2 domain: s * softmax_scale * log2 e,
 *      one multiply before exp2f) and a partial row sum l in registers for
 *      the whole key loop. Masked scores (key >= SK, row >= SQ, causal
 *      key > row + SK - SQ: common/mask.cuh's KeyMask, the bottom-right
 *      diagonal) are -inf; p = exp2(x - m_new) is written to the P tile as
 *      elem_t, and the rescale factor corr = exp2(m_old - m_new) of the row
 *      to 16 copies in the row's line of the factor tile F; one __syncthreads;
 *   4. O = corr * O + P V with wmma (P row_major matrix_a, V row_major
 *      matrix_b): see "O accumulator" below.
 * Epilogue: l is reduced across the row's lanes; F gets 1 / l (0 for rows
 * with no unmasked key, i.e. rows >= SQ); each warp scales its O fragments,
 * stores them one at a time to its own 16 x 20 fp32 staging block at the
 * start of shared memory (the Q / K / V tiles, free by then; at most 10 KiB,
 * never reaching F), and its lanes convert a row half each (8 values) to
 * elem_t and write 16 bytes to global memory, rows < SQ only.
 *
 * O accumulator. The O tile (BLOCK_M x D fp32) stays in wmma accumulator
 * fragments in registers across all key tiles: warp w owns row block
 * w / WPR (WPR = NUM_WARPS / (BLOCK_M / 16) warps per 16-row block) and
 * CPW = cdiv(D / 16, WPR) consecutive 16-column blocks of it (the last
 * warps fewer where WPR does not divide D / 16: see Head dims). The element ->
 * (row, column) mapping of a fragment is opaque, so the per-row rescale is
 * done without knowing it: F holds, for each row block, a 16 x 16 fp32 matrix
 * whose row r is 16 copies of row r's factor; a warp load_matrix_sync's it as
 * an accumulator fragment of the same type as O, and multiplies element by
 * element, o.x[e] *= f.x[e]. This is exact whatever the mapping: for one
 * fragment type, load_matrix_sync and store_matrix_sync with the same layout
 * are inverse maps, and mma_sync's C and D use that same mapping (storing D
 * gives C + A B element by element), so element e of both fragments is the
 * same (row, column), and f.x[e] is that row's factor. The same trick applies
 * 1 / l at the end. (Keeping O in shared memory instead would cost
 * 4 * BLOCK_M * D more bytes, 32 KiB at BLOCK_M 64, D 128, and a read-modify-
 * write of the whole tile per key tile.)
 *
 * Ragged SQ / SK: Q rows >= SQ are zero-filled and never stored; K/V rows
 * >= SK are zero-filled and masked. Skips (warp-uniform, always also
 * masked): an S fragment whose rows are all >= SQ, keys all >= SK, or
 * (causal) keys all above its rows' last visible keys is neither computed nor
 * stored (the softmax never reads its stale values: masked entries are
 * selected as -inf, not computed); PV stops at the first 16-key block that
 * is all >= SK or (causal) all above the row block; a row block wholly
 * >= SQ skips PV and the epilogue.
 * Causal: key tiles wholly above the CTA's last row (keys > last row + SK -
 * SQ) are not visited, and CTAs take query tiles in reverse (blockIdx.x = 0
 * gets the last, heaviest one).
 * Window W (causal only): the key loop starts at the tile holding the first
 * row's first key (KeyMask::keys_from), S fragments and PV blocks wholly left
 * of their rows' windows are skipped like those above the diagonal, and the
 * softmax's sees() masks the left edge per element.
 *
 * Addressing (kernel ABI v2): global rows go through the strides (either
 * layout, padded views), never assuming rows D apart; the shared tiles are
 * this template's own padded layout. Each thread copies the same 16-byte
 * chunk of key rows kj, kj + RPI, ... of every K/V tile: the KV head's base
 * pointers (warp-uniform) and the thread's offset to row kj are computed once
 * per CTA, and a copy adds the uniform (kv0 + i * RPI) row strides.
 *
 * D 96 (12 chunks a row, which do not divide 128 or 256 threads): the Q and
 * K/V copies walk the tile's chunks flat instead, chunk c = tid + i * threads
 * of the tile (row c / 12, the last step guarded where it is partial), the
 * source offset computed per copy. D 64, 128 and 256 keep the per-CTA offsets.
 *
 * Shared memory rows are padded (no swizzle): Q, K, V rows D + 8 elem_t and P
 * rows BLOCK_N + 8 elem_t (16 bytes of padding; WMMA needs ldm a multiple of
 * 8 halves and 32-byte aligned fragment pointers, which 16-row / 16-column
 * block offsets keep: 16 rows of D + 8 elem_t are a multiple of 32 bytes at
 * every D that is a multiple of 16), S rows BLOCK_N + 4 floats. A Q / K / V
 * row is 4 banks (D 64, 128, 256) or 20 banks (D 96) past the one before,
 * so the 8 rows of a fragment load's phase hit distinct 16-byte bank groups.
 *
 * Knobs:   BLOCK_M    query rows per CTA, multiple of 16       64, 32
 *          BLOCK_N    keys per K/V tile, multiple of 16        64, 32
 *          NUM_WARPS  warps per CTA                            4, 8
 *          (NUM_WARPS * 32 must be a multiple of BLOCK_M, and NUM_WARPS a
 *          multiple of BLOCK_M / 16: true for every combination above.)
 * Head dims: 64, 96, 128, 256 (any multiple of 16: D / 16 k-steps of
 *          Q K^T and column blocks of O). Where a row block's WPR warps do
 *          not split its D / 16 column blocks evenly (D 96, BLOCK_M 32, 8
 *          warps: 6 blocks over 4 warps) each owns cdiv(D / 16, WPR) and the
 *          last owns what is left (here 2, 2, 2, 0).
 * Shared (dynamic, bytes), ELEM_BYTES = 2:
 *            ELEM_BYTES * (D + 8) * (BLOCK_M + 2 * BLOCK_N)   Q, K, V tiles
 *          + 4 * BLOCK_M * (BLOCK_N + 4)                       S tile, fp32
 *          + ELEM_BYTES * BLOCK_M * (BLOCK_N + 8)              P tile
 *          + 4 * BLOCK_M * 16                                  F (row factors)
 *          (OFF_F + the F tile; OPTD_CHECK_SMEM checks it against the spec's
 *          formula at compile time)
 *          from 22.5 KiB (BLOCK_M 32, BLOCK_N 32, D 64) to 81 KiB (64, 64,
 *          D 128); over 48 KiB the worker sets the opt-in attribute, and every
 *          combination fits sm_86/89's 99 KiB. D 96: 28.5 to 69 KiB. D 256:
 *          58.5 KiB (32, 32), 84 KiB (64, 32), 97.5 KiB (32, 64) and 129 KiB
 *          (64, 64, the defaults): all fit sm_80's 163 KiB and sm_90's
 *          227 KiB; on sm_86 / sm_89 the gate refuses (64, 64) at D 256.
 *          m and l live in registers.
 * CTAs:    cdiv(SQ, BLOCK_M) x (B * HQ) x 1, NUM_WARPS * 32 threads
 *          (B * HQ <= 65535); no KV split, n_splits = 1, single launch.
 * Registers: CPW * 8 fp32 (O fragments, at most 64 at D 128, 128 at D 256)
 *          + BLOCK_N / TPR scores per thread plus fragments in flight and two
 *          64-bit K/V source offsets; __launch_bounds__(threads, 1) at every
 *          D (one CTA per SM is enough to let ptxas use up to 255).
 *          sm_90, no spills at any knob point: D 256 97-139 (fp16) and
 *          190-224 (bf16) registers, 231-252 at BLOCK_M 64 / 4 warps (16 O
 *          fragments, 128 fp32); D 96 94-168.
 * Window:  a query tile reads the key tiles from its first row's first key
 *          (about W + BLOCK_M keys, whatever SK), skips left-of-window
 *          fragments, and masks the left edge per element in the softmax.
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "wmma"
description = "FlashAttention forward with nvcuda::wmma 16x16x16 (S = Q K^T and O += P V), softmax by threads over an fp32 S tile in shared memory, O fragments rescaled through per-row factor fragments"
min_cc = 80
head_dims = [64, 96, 128, 256]
windows = true

[knobs]
BLOCK_M = [64, 32]
BLOCK_N = [64, 32]
NUM_WARPS = [4, 8]

[derived]
m_blocks = "cdiv(SQ, BLOCK_M)"
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["m_blocks", "B * HQ", "1"]
block = ["NUM_WARPS * 32", "1", "1"]
smem = "ELEM_BYTES * (D + 8) * (BLOCK_M + 2 * BLOCK_N) + 4 * BLOCK_M * (BLOCK_N + 4) + ELEM_BYTES * BLOCK_M * (BLOCK_N + 8) + 64 * BLOCK_M"
*/

#include "common/optd.cuh"

#include "common/mask.cuh"

#include <mma.h>

#ifndef BLOCK_M
#error "BLOCK_M must be defined"
#endif
#ifndef BLOCK_N
#error "BLOCK_N must be defined"
#endif
#ifndef NUM_WARPS
#error "NUM_WARPS must be defined"
#endif
#if BLOCK_M % 16 != 0 || BLOCK_M < 16
#error "BLOCK_M must be a positive multiple of 16 (WMMA row blocks)"
#endif
#if BLOCK_N % 16 != 0 || BLOCK_N < 16
#error "BLOCK_N must be a positive multiple of 16 (WMMA column / k blocks)"
#endif
#if NUM_WARPS < 1 || NUM_WARPS > 32
#error "NUM_WARPS must be in 1..32"
#endif
#if (NUM_WARPS * 32) % BLOCK_M != 0
#error "NUM_WARPS * 32 must be a multiple of BLOCK_M (whole lanes per softmax row)"
#endif
#if NUM_WARPS % (BLOCK_M / 16) != 0
#error "NUM_WARPS must be a multiple of BLOCK_M / 16 (whole warps per O row block)"
#endif

#define WM_THREADS (NUM_WARPS * 32)

namespace wm = nvcuda::wmma;

typedef wm::fragment<wm::matrix_a, 16, 16, 16, elem_t, wm::row_major> wm_frag_a;      // Q, P
typedef wm::fragment<wm::matrix_b, 16, 16, 16, elem_t, wm::col_major> wm_frag_kt;     // K^T
typedef wm::fragment<wm::matrix_b, 16, 16, 16, elem_t, wm::row_major> wm_frag_v;      // V
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> wm_frag_acc;                 // S, O, F

// Two fp32 values rounded to one packed elem2_t, as its 32 bits.
__device__ __forceinline__ unsigned wm_pack2(float a, float b) {
    elem2_t h = from_f32x2(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}

// ---------------------------------------------------------------------------
// Forward: one (query tile, b * HQ + h) per CTA.
// ---------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void wmma_fwd(OPTD_ARGS) {
    static_assert(D % 16 == 0, "D must be a multiple of 16");
    constexpr int CH = D / 8;                  // 16-byte chunks per Q / K / V row
    constexpr int QK_LD = D + 8;               // elem_t per Q / K / V shared row
    constexpr int S_LD = BLOCK_N + 4;          // fp32 per S shared row
    constexpr int P_LD = BLOCK_N + 8;          // elem_t per P shared row
    constexpr int F_LD = 16;                   // fp32 per factor row
    constexpr int ST_LD = 20;                  // fp32 per row of a warp's epilogue staging block
    constexpr int RB = BLOCK_M / 16;           // row blocks
    constexpr int NB = BLOCK_N / 16;           // key blocks per tile
    constexpr int CB = D / 16;                 // column blocks of O (and k-steps of Q K^T)
    constexpr int WPR = NUM_WARPS / RB;        // warps per O row block
    constexpr int CPW = (CB + WPR - 1) / WPR;  // O fragments per warp (the last warps of a row block may own fewer)
    constexpr bool O_EVEN = CB % WPR == 0;     // every warp owns CPW (all but D 96 at WPR 4)
    constexpr int TPR = WM_THREADS / BLOCK_M;  // softmax lanes per row
    constexpr int CPT = BLOCK_N / TPR;         // softmax columns per lane
    constexpr int FPT = F_LD / TPR;            // factor copies written per lane

    constexpr int OFF_K = BLOCK_M * QK_LD * 2;
    constexpr int OFF_V = OFF_K + BLOCK_N * QK_LD * 2;
    constexpr int OFF_S = OFF_V + BLOCK_N * QK_LD * 2;
    constexpr int OFF_P = OFF_S + BLOCK_M * S_LD * 4;
    constexpr int OFF_F = OFF_P + BLOCK_M * P_LD * 2;
    constexpr int SMEM_BYTES = OFF_F + BLOCK_M * F_LD * 4;
    OPTD_CHECK_SMEM(FWD, D, SMEM_BYTES);

    // Q and K/V copies: 16-byte chunks over the threads. When whole key rows split evenly
    // over the threads (CH = 8, 16, 32: D 64, 128, 256) each thread copies the same chunk
    // of rows kj, kj + KV_RPI, ... of every K/V tile from offsets computed once; D 96's 12
    // chunks a row do not divide 128 or 256 threads, and its copies walk the tile's chunks
    // flat (chunk c = tid + i * threads, the last step guarded where it is partial).
    constexpr bool KV_EVEN = WM_THREADS % CH == 0 && BLOCK_N % (WM_THREADS / CH) == 0;
    constexpr int Q_ITERS = (BLOCK_M * CH + WM_THREADS - 1) / WM_THREADS;
    constexpr int KV_ITERS = (BLOCK_N * CH + WM_THREADS - 1) / WM_THREADS;

    static_assert(sizeof(elem_t) == 2, "elem_t is a 16-bit type (ELEM_BYTES = 2)");
    static_assert(WPR >= 1 && WPR <= CB, "every warp of a row block owns an O column block");
    static_assert(TPR >= 1 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "softmax lanes per row: a power of two <= 32");
    static_assert(BLOCK_N % TPR == 0 && F_LD % TPR == 0, "softmax columns must split evenly over a row's lanes");
    static_assert(QK_LD % 8 == 0 && P_LD % 8 == 0 && S_LD % 4 == 0 && ST_LD % 4 == 0 && F_LD % 4 == 0,
                  "WMMA ldm: a multiple of 8 halves / 4 floats");
    static_assert(OFF_K % 32 == 0 && OFF_V % 32 == 0 && OFF_S % 32 == 0 && OFF_P % 32 == 0 && OFF_F % 32 == 0,
                  "every region starts 32-byte aligned (WMMA pointers)");
    static_assert(NUM_WARPS * 16 * ST_LD * 4 <= OFF_F, "epilogue staging must not overlap the factor tile");
    static_assert((16 * ST_LD * 4) % 32 == 0, "staging blocks 32-byte aligned");
    (void)batch;
    (void)n_splits;
    (void)o_partial;
    (void)lse_partial;

    extern __shared__ __align__(128) unsigned char wm_smem[];
    elem_t* q_s = reinterpret_cast<elem_t*>(wm_smem);
    elem_t* k_s = reinterpret_cast<elem_t*>(wm_smem + OFF_K);
    elem_t* v_s = reinterpret_cast<elem_t*>(wm_smem + OFF_V);
    float* s_s = reinterpret_cast<float*>(wm_smem + OFF_S);
    elem_t* p_s = reinterpret_cast<elem_t*>(wm_smem + OFF_P);
    float* f_s = reinterpret_cast<float*>(wm_smem + OFF_F);

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;

    // Causal: the heaviest query tiles (last rows) first.
    const int m_block = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int m0 = m_block * BLOCK_M;
    const int b = blockIdx.y / heads_q, h = blockIdx.y - b * heads_q;  // blockIdx.y = b * HQ + h
    const int hkv = optd_kv_head(h, heads_q, heads_kv);
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), window);

    // K/V copies: 16-byte chunk kc of key rows kj + i * KV_RPI of every tile. The
    // KV head's base pointers are warp-uniform and the thread's offset (kj row
    // strides + kc chunks) is computed once here; a copy adds the uniform
    // (kv0 + i * KV_RPI) row strides.
    constexpr int KV_RPI = WM_THREADS / CH;
    const int kj = tid / CH, kc = tid % CH;
    static_assert(!KV_EVEN || KV_ITERS == BLOCK_N / KV_RPI, "K/V chunks: whole rows per step");
    const elem_t* kh = k + optd_head_off(strides.k_b, strides.k_h, b, hkv);
    const elem_t* vh = v + optd_head_off(strides.v_b, strides.v_h, b, hkv);
    const long long koff = kj * strides.k_s + kc * 8, voff = kj * strides.v_s + kc * 8;

    // Causal: no key tile past the last key the tile's rows see. Window: none before the
    // tile holding the first row's first key (t0 = 0 without one).
    int n_tiles = (seq_k + BLOCK_N - 1) / BLOCK_N;
    if (causal) n_tiles = min(n_tiles, (mask.keys_before(min(seq_q, m0 + BLOCK_M)) + BLOCK_N - 1) / BLOCK_N);
    const int t0 = mask.keys_from(m0) / BLOCK_N;

    // --- Q tile, rows >= SQ zero-filled (visible after the loop's first barrier) ---
    // The thread's chunks are all loaded before the first is stored: in a load-store loop the
    // compiler may keep a chunk's load behind the previous chunk's shared store (q and q_s are
    // both generic pointers; it did after D 96's guarded step), one global round trip per chunk.
    {
        constexpr bool Q_PARTIAL = BLOCK_M * CH % WM_THREADS != 0;  // D 96: a partial last step
        const elem_t* qh = q + optd_head_off(strides.q_b, strides.q_h, b, h);
        uint4 qv[Q_ITERS];
#pragma unroll
        for (int i = 0; i < Q_ITERS; ++i) {
            const int c = tid + i * WM_THREADS;
            const int r = c / CH, ch = c % CH;
            qv[i] = make_uint4(0u, 0u, 0u, 0u);
            if ((!Q_PARTIAL || c < BLOCK_M * CH) && m0 + r < seq_q)
                qv[i] = __ldg(reinterpret_cast<const uint4*>(qh + (m0 + r) * strides.q_s + ch * 8));
        }
#pragma unroll
        for (int i = 0; i < Q_ITERS; ++i) {
            const int c = tid + i * WM_THREADS;
            if (Q_PARTIAL && c >= BLOCK_M * CH) break;
            const int r = c / CH, ch = c % CH;
            *reinterpret_cast<uint4*>(q_s + r * QK_LD + ch * 8) = qv[i];
        }
    }

    // Softmax ownership: lanes part = 0 .. TPR - 1 of row srow (consecutive lanes
    // of one warp, so the row reductions are xor shuffles within the warp).
    const int srow = tid / TPR;
    const int spart = tid % TPR;
    const int grow = m0 + srow;  // query row
    const float sl2 = softmax_scale * OPTD_LOG2E;
    float m_run = OPTD_NEG_INF;  // running row max, log2 domain
    float l_run = 0.f;           // this lane's share of the row sum

    // O ownership: row block prb, column blocks pcb0 .. pcb0 + CPW - 1.
    const int prb = warp / WPR;
    const int pcb0 = (warp % WPR) * CPW;
    const int prow0 = m0 + prb * 16;
    wm_frag_acc o_acc[CPW];
#pragma unroll
    for (int i = 0; i < CPW; ++i) wm::fill_fragment(o_acc[i], 0.f);

    for (int t = t0; t < n_tiles; ++t) {
        const int kv0 = t * BLOCK_N;

        // 1. K, V tiles (keys >= SK zero-filled).
        __syncthreads();  // the previous tile's K, V, S, P, F are no longer read
        if constexpr (KV_EVEN) {
#pragma unroll
            for (int i = 0; i < KV_ITERS; ++i) {
                const int r = kj + i * KV_RPI;
                uint4 kraw = make_uint4(0u, 0u, 0u, 0u), vraw = kraw;
                if (kv0 + r < seq_k) {
                    kraw = *reinterpret_cast<const uint4*>(kh + (kv0 + i * KV_RPI) * strides.k_s + koff);
                    vraw = *reinterpret_cast<const uint4*>(vh + (kv0 + i * KV_RPI) * strides.v_s + voff);
                }
                *reinterpret_cast<uint4*>(k_s + r * QK_LD + kc * 8) = kraw;
                *reinterpret_cast<uint4*>(v_s + r * QK_LD + kc * 8) = vraw;
            }
        } else {
#pragma unroll
            for (int i = 0; i < KV_ITERS; ++i) {
                const int c = tid + i * WM_THREADS;
                if (BLOCK_N * CH % WM_THREADS != 0 && c >= BLOCK_N * CH) break;  // a partial last step
                const int r = c / CH, ch = c % CH;
                uint4 kraw = make_uint4(0u, 0u, 0u, 0u), vraw = kraw;
                if (kv0 + r < seq_k) {
                    kraw = *reinterpret_cast<const uint4*>(kh + (kv0 + r) * strides.k_s + ch * 8);
                    vraw = *reinterpret_cast<const uint4*>(vh + (kv0 + r) * strides.v_s + ch * 8);
                }
                *reinterpret_cast<uint4*>(k_s + r * QK_LD + ch * 8) = kraw;
                *reinterpret_cast<uint4*>(v_s + r * QK_LD + ch * 8) = vraw;
            }
        }
        __syncthreads();  // K, V (and Q on the first tile) are visible

        // 2. S = Q K^T, fragment (rb, nb) by warp (rb * NB + nb) % NUM_WARPS.
        for (int f = warp; f < RB * NB; f += NUM_WARPS) {
            const int rb = f / NB, nb = f % NB;
            const int r0 = m0 + rb * 16, k0 = kv0 + nb * 16;
            // Warp-uniform: wholly masked fragments are not computed (nor read unmasked):
            // rows past SQ, keys past SK, above the rows (causal) or left of their windows.
            if (r0 >= seq_q || k0 >= seq_k || mask.above(k0, r0 + 15) || mask.left_of(k0 + 16, r0)) continue;
            wm_frag_acc s_acc;
            wm::fill_fragment(s_acc, 0.f);
#pragma unroll
            for (int kk = 0; kk < CB; ++kk) {
                wm_frag_a qa;
                wm_frag_kt kb;
                wm::load_matrix_sync(qa, q_s + rb * 16 * QK_LD + kk * 16, QK_LD);
                wm::load_matrix_sync(kb, k_s + nb * 16 * QK_LD + kk * 16, QK_LD);
                wm::mma_sync(s_acc, qa, kb, s_acc);
            }
            wm::store_matrix_sync(s_s + rb * 16 * S_LD + nb * 16, s_acc, S_LD, wm::mem_row_major);
        }
        __syncthreads();  // S is visible

        // 3. Online softmax of row srow over columns spart + TPR * j.
        {
            float x[CPT];
            float mx = m_run;
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                const int c = spart + TPR * j;
                const int key = kv0 + c;
                const bool valid = grow < seq_q && mask.sees(grow, key);
                // A select, not arithmetic on the masked value: skipped fragments hold stale data.
                x[j] = valid ? s_s[srow * S_LD + c] * sl2 : OPTD_NEG_INF;
                mx = fmaxf(mx, x[j]);
            }
#pragma unroll
            for (int off = TPR / 2; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            // A row with nothing unmasked yet keeps m = -inf; subtract 0 instead so
            // that p and corr come out 0 rather than NaN (-inf - -inf).
            const float m_use = (mx == OPTD_NEG_INF) ? 0.f : mx;
            const float corr = exp2f(m_run - m_use);
            m_run = mx;
            float ls = 0.f;
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                const float p = exp2f(x[j] - m_use);
                ls += p;
                p_s[srow * P_LD + spart + TPR * j] = from_f32(p);
            }
            l_run = l_run * corr + ls;
#pragma unroll
            for (int e = 0; e < FPT; ++e) f_s[srow * F_LD + spart * FPT + e] = corr;
        }
        __syncthreads();  // P and F are visible

        // 4. O = corr * O + P V for this warp's fragments.
        if (prow0 < seq_q) {  // warp-uniform
            wm_frag_acc fc;
            wm::load_matrix_sync(fc, f_s + prb * 16 * F_LD, F_LD, wm::mem_row_major);
#pragma unroll
            for (int i = 0; i < CPW; ++i) {
#pragma unroll
                for (int e = 0; e < fc.num_elements; ++e) o_acc[i].x[e] *= fc.x[e];
            }
#pragma unroll
            for (int kk = 0; kk < NB; ++kk) {
                const int k0 = kv0 + kk * 16;
                // P is 0 from here on: keys >= SK, or (causal) above every row of the block;
                // and up to here where the keys are left of every row's window.
                if (k0 >= seq_k || mask.above(k0, prow0 + 15)) break;
                if (mask.left_of(k0 + 16, prow0)) continue;
                wm_frag_a pa;
                wm::load_matrix_sync(pa, p_s + prb * 16 * P_LD + kk * 16, P_LD);
#pragma unroll
                for (int i = 0; i < CPW; ++i) {
                    if (!O_EVEN && pcb0 + i >= CB) break;  // warp-uniform: a warp owning fewer
                    wm_frag_v vb;
                    wm::load_matrix_sync(vb, v_s + kk * 16 * QK_LD + (pcb0 + i) * 16, QK_LD);
                    wm::mma_sync(o_acc[i], pa, vb, o_acc[i]);
                }
            }
        }
    }

    // --- Epilogue: F = 1 / l, O *= F, then staged 16-byte stores of rows < SQ ---
    __syncthreads();  // the last tile's F, P, V are no longer read
    {
        float l = l_run;
#pragma unroll
        for (int off = TPR / 2; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        const float inv_l = l > 0.f ? 1.f / l : 0.f;  // l == 0: row >= SQ (nothing unmasked)
#pragma unroll
        for (int e = 0; e < FPT; ++e) f_s[srow * F_LD + spart * FPT + e] = inv_l;
    }
    __syncthreads();  // F is visible; Q, K, V, S, P are free for staging

    if (prow0 >= seq_q) return;  // warp-uniform; the wrapper counts the CTA
    wm_frag_acc fc;
    wm::load_matrix_sync(fc, f_s + prb * 16 * F_LD, F_LD, wm::mem_row_major);
    float* st = reinterpret_cast<float*>(wm_smem) + warp * 16 * ST_LD;  // this warp's staging block
    const int r = lane >> 1, hc = (lane & 1) * 8;  // lane's row and column half in a fragment
    const int row = prow0 + r;
    elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, h) + row * strides.o_s + pcb0 * 16 + hc;
#pragma unroll
    for (int i = 0; i < CPW; ++i) {
        if (!O_EVEN && pcb0 + i >= CB) break;  // warp-uniform: a warp owning fewer
#pragma unroll
        for (int e = 0; e < fc.num_elements; ++e) o_acc[i].x[e] *= fc.x[e];
        wm::store_matrix_sync(st, o_acc[i], ST_LD, wm::mem_row_major);
        __syncwarp();
        if (row < seq_q) {
            const float4 lo = *reinterpret_cast<const float4*>(st + r * ST_LD + hc);
            const float4 hi = *reinterpret_cast<const float4*>(st + r * ST_LD + hc + 4);
            *reinterpret_cast<uint4*>(orow + i * 16) =
                make_uint4(wm_pack2(lo.x, lo.y), wm_pack2(lo.z, lo.w), wm_pack2(hi.x, hi.y), wm_pack2(hi.z, hi.w));
        }
        __syncwarp();  // the block is read before the next fragment overwrites it
    }
}

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(WM_THREADS, 1) optd_fwd_d64(OPTD_ARGS) {
    wmma_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D96
extern "C" __global__ void __launch_bounds__(WM_THREADS, 1) optd_fwd_d96(OPTD_ARGS) {
    wmma_fwd<96>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(WM_THREADS, 1) optd_fwd_d128(OPTD_ARGS) {
    wmma_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(WM_THREADS, 1) optd_fwd_d256(OPTD_ARGS) {
    wmma_fwd<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
