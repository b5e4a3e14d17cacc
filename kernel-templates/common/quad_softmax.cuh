/******************************************************************************
 * quad_softmax.cuh: masking and the online softmax on m16n8 accumulator
 * tiles, the layout of mma.sync m16n8k16 and, per warp, of wgmma's m64nN.
 *
 * A thread holds kMT m16 tiles x kNT n8 column blocks x 4 values; `at(mt, j, e)`
 * (a lambda returning float&, so each kernel keeps its own register array)
 * names value e of block j of m-tile mt:
 *   row  16 mt + g + 8 (e >> 1),  column 8 j + 2 t + (e & 1),
 *   g = lane / 4, t = lane % 4;
 * the thread's row h = 2 mt + (e >> 1) is an OnlineSoftmax<2 kMT, ...> row, and
 * the 4 lanes of a quad (same g) share every row.
 *
 *   m16n8_mask<kMT, kNT, kRowLimit>(at, mask, row, kv0, col[, row_step])
 *                                               -inf where mask hides the key;
 *                                               row: the thread's first row (g),
 *                                               kv0 + col its first key (2 t);
 *                                               row + row_step (8) its second
 *   m16n8_mask_left<kMT, kNT>(at, mask, row, kv0, col[, row_step])
 *                                               the same for the window's left
 *                                               edge (keys < first_key(row))
 *   m16n8_row_max<kMT, kNT>(at, m, mx)            mx[h] = max(m[h], row h) over
 *                                               the quad
 *   m16n8_exp2<kMT, kNT>(at, sm, scale_log2, bias) scores -> probabilities,
 *                                               summed into sm.l
 *   m16n8_scale_rows<kMT, kNT>(at, f)             row h *= f[h] (O's correction,
 *                                               1 / l)
 *   pack2(a, b)        two fp32 -> one f16x2 / bf16x2 register (an A fragment half)
 *   quad_max/quad_sum  reductions over the quad (2 xor shuffles)
 * Used by mma_fa2.cu and wgmma_tma.cu. Every loop is unrolled: `at` always
 * gets constant indices, so the arrays stay in registers.
 ******************************************************************************/
#ifndef OPTD_QUAD_SOFTMAX_CUH
#define OPTD_QUAD_SOFTMAX_CUH

#include "common/online_softmax.cuh"
#include "common/mask.cuh"

__device__ __forceinline__ unsigned pack2(float a, float b) {
    elem2_t h = from_f32x2(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Scores of keys the rows do not see -> -inf, in one of two forms of the same
// test. kRowLimit: one limit per row relative to the thread's first key, so
// each column compares an immediate (fewer registers live: wgmma_tma, and
// mma_fa2 with two m-tiles); else KeyMask::sees' two compares per element,
// the causal diagonal (row + offset) computed once (mma_fa2 with one m-tile:
// with the limit form, or the offset added per element, ptxas scheduled its
// kernels differently and the H100's small-shape winners ran ~1% slower:
// docs/HOPPER.md, kernel library). row_step: how far the query position of a thread's
// second row (g + 8) is from its first; 8 unless the rows interleave query heads
// (wgmma_tma.cu's PACK_GQA with 8 positions per head: 0).
template <int kMT, int kNT, bool kRowLimit, class At>
__device__ __forceinline__ void m16n8_mask(At at, const KeyMask& mask, int row, int kv0, int col, int row_step = 8) {
    if constexpr (kRowLimit) {
#pragma unroll
        for (int h = 0; h < 2 * kMT; ++h) {
            const int lim = mask.limit(row + 16 * (h >> 1) + row_step * (h & 1)) - kv0 - col;
#pragma unroll
            for (int j = 0; j < kNT; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (j * 8 + e >= lim) at(h >> 1, j, 2 * (h & 1) + e) = OPTD_NEG_INF;
            }
        }
    } else {
        const int rowd = row + mask.causal_offset;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int j = 0; j < kNT; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kv0 + j * 8 + col + (e & 1);
                    const int r = rowd + 16 * mt + row_step * (e >> 1);
                    if (key >= mask.key_end || (mask.causal && key > r)) at(mt, j, e) = OPTD_NEG_INF;
                }
            }
        }
    }
}

// The window's left edge: -inf where key < mask.first_key(row), on the tiles
// where partial_left holds. Apart from m16n8_mask, not folded into it: the
// unwindowed kernels keep their masking code (and its registers) as it was,
// and a windowed call pays for the left edge only on the tiles that cross it.
// One limit per row relative to the thread's first key, an immediate per column.
template <int kMT, int kNT, class At>
__device__ __forceinline__ void m16n8_mask_left(At at, const KeyMask& mask, int row, int kv0, int col, int row_step = 8) {
#pragma unroll
    for (int h = 0; h < 2 * kMT; ++h) {
        const int first = mask.first_key(row + 16 * (h >> 1) + row_step * (h & 1)) - kv0 - col;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e)
                if (j * 8 + e < first) at(h >> 1, j, 2 * (h & 1) + e) = OPTD_NEG_INF;
        }
    }
}

template <int kMT, int kNT, class At>
__device__ __forceinline__ void m16n8_row_max(At at, const float (&m)[2 * kMT], float (&mx)[2 * kMT]) {
#pragma unroll
    for (int h = 0; h < 2 * kMT; ++h) mx[h] = m[h];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
            mx[2 * mt] = fmaxf(mx[2 * mt], fmaxf(at(mt, j, 0), at(mt, j, 1)));
            mx[2 * mt + 1] = fmaxf(mx[2 * mt + 1], fmaxf(at(mt, j, 2), at(mt, j, 3)));
        }
    }
#pragma unroll
    for (int h = 0; h < 2 * kMT; ++h) mx[h] = quad_max(mx[h]);
}

template <int kMT, int kNT, class At, class Softmax>
__device__ __forceinline__ void m16n8_exp2(At at, Softmax& sm, float scale_log2, const float (&bias)[2 * kMT]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) at(mt, j, e) = sm.prob(at(mt, j, e), 2 * mt + (e >> 1), scale_log2, bias[2 * mt + (e >> 1)]);
        }
    }
}

template <int kMT, int kNT, class At>
__device__ __forceinline__ void m16n8_scale_rows(At at, const float (&f)[2 * kMT]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) at(mt, j, e) *= f[2 * mt + (e >> 1)];
        }
    }
}

#endif  // OPTD_QUAD_SOFTMAX_CUH
