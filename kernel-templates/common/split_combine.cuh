/******************************************************************************
 * split_combine.cuh: the second kernel of the split-KV templates (kv-split,
 * memory, decode).
 *
 * n_splits forward CTAs share one query block, each covering its own range of
 * keys; split z writes, for every query row it owns (fp32, FlashAttention's
 * softmax_lse convention), into the ABI's contiguous scratch buffers:
 *   o_partial[z][b][h][i][:]  = O_z, normalized by the split's own row sum
 *                               ([n_splits, B, HQ, SQ, D])
 *   lse_partial[z][b][h][i]   = natural-log LSE of the split's scaled scores,
 *                               -inf (and O_z = 0) when no key was unmasked
 *                               ([n_splits, B, HQ, SQ]).
 * Every split writes every row it owns (an empty one as -inf and 0), so the
 * combine reads no uninitialized scratch. optd_split_partial_row() gives the
 * flat row index the forward kernels write at.
 *
 * optd_split_combine merges them, one warp per query row of the B * HQ * SQ
 * rows (flat index r = (b * HQ + h) * SQ + i):
 *   m = max_z lse_z,  w_z = exp(lse_z - m),  O = sum_z w_z O_z / sum_z w_z
 * and writes row i of head (b, h) of O through strides.o (any layout or view).
 * Lane l owns dims 2l + 64i, 2l + 64i + 1 (i < D / 64: D / 32 dims, 2 to 8 fp32
 * accumulators at D 64 to 256; any D that is a multiple of 64, the head dims
 * 64, 128 and 256 of kv-split and memory, not 96); an empty split (w = 0) is never
 * read. CTAs: cdiv(B * HQ * SQ, OPTD_COMBINE_ROWS) x 1 x 1, 32 *
 * OPTD_COMBINE_ROWS threads, no shared memory (launch role `combine`, smem
 * "0", checked by OPTD_CHECK_SMEM).
 ******************************************************************************/
#ifndef OPTD_SPLIT_COMBINE_CUH
#define OPTD_SPLIT_COMBINE_CUH

#ifndef OPTD_COMMON_CUH
#error "include common/optd.cuh before common/split_combine.cuh"
#endif

#define OPTD_COMBINE_ROWS 4  // rows (warps) per combine CTA; specs say 128 threads

// Flat row of query row i of head bh = b * HQ + h, split z, in the scratch buffers:
// lse_partial[row], o_partial[row * D ..].
__device__ __forceinline__ size_t optd_split_partial_row(int z, int bh, int i, int batch, int heads_q,
                                                         int seq_q) {
    return ((size_t)z * batch * heads_q + bh) * seq_q + i;
}

template <int D>
__device__ __forceinline__ void optd_split_combine(OPTD_ARGS) {
    OPTD_CHECK_SMEM(COMBINE, D, 0);  // the templates launch it as role `combine` with smem "0"
    static_assert(D % 64 == 0, "lanes own pairs of dims, 64 dims per step");
    constexpr int DP = D / 64;  // float2 accumulators per lane (1, 2, 4 at D 64, 128, 256)
    (void)q;
    (void)k;
    (void)v;
    (void)heads_kv;
    (void)seq_k;
    (void)softmax_scale;
    (void)causal;
    (void)window;
    const int lane = threadIdx.x & 31;
    const size_t rows_total = (size_t)batch * heads_q * seq_q;  // rows of one split
    const size_t row = (size_t)blockIdx.x * OPTD_COMBINE_ROWS + (threadIdx.x >> 5);
    if (row >= rows_total) return;  // warp-uniform

    // Max LSE over splits, lanes reading different splits.
    float m = OPTD_NEG_INF;
    for (int z = lane; z < n_splits; z += 32) m = fmaxf(m, lse_partial[(size_t)z * rows_total + row]);
    m = warp_max(m);

    float2 acc[DP];
#pragma unroll
    for (int i = 0; i < DP; ++i) acc[i] = make_float2(0.f, 0.f);
    float wsum = 0.f;  // this lane's share of sum_z exp(lse_z - m)
    if (m != OPTD_NEG_INF) {
        for (int z0 = 0; z0 < n_splits; z0 += 32) {
            // Lane i holds split z0 + i's weight; an empty split (lse = -inf) gets 0.
            const int z = z0 + lane;
            const float w_lane =
                z < n_splits ? exp2f((lse_partial[(size_t)z * rows_total + row] - m) * OPTD_LOG2E) : 0.f;
            wsum += w_lane;
            const int n = min(32, n_splits - z0);
            for (int j = 0; j < n; ++j) {
                const float w = __shfl_sync(0xffffffffu, w_lane, j);
                if (w == 0.f) continue;  // warp-uniform
                const float2* op =
                    reinterpret_cast<const float2*>(o_partial + ((size_t)(z0 + j) * rows_total + row) * D);
#pragma unroll
                for (int i = 0; i < DP; ++i) {
                    const float2 x = op[lane + 32 * i];
                    acc[i].x = fmaf(w, x.x, acc[i].x);
                    acc[i].y = fmaf(w, x.y, acc[i].y);
                }
            }
        }
    }
    wsum = warp_sum(wsum);
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;

    // row = (b * HQ + h) * SQ + i; O's row through its strides (once per warp).
    const int i_row = (int)(row % (size_t)seq_q);
    const int bh = (int)(row / (size_t)seq_q);
    const int b = bh / heads_q, h = bh - b * heads_q;
    elem2_t* orow = reinterpret_cast<elem2_t*>(o + optd_head_off(strides.o_b, strides.o_h, b, h) +
                                               i_row * strides.o_s);
#pragma unroll
    for (int i = 0; i < DP; ++i) orow[lane + 32 * i] = from_f32x2(acc[i].x * inv, acc[i].y * inv);
}

#endif  // OPTD_SPLIT_COMBINE_CUH
