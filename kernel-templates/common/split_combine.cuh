/******************************************************************************
 * split_combine.cuh: the second kernel of the split-KV templates.
 *
 * n_splits forward CTAs share one query block, each covering its own range of
 * keys; split z writes, for every row it owns (fp32, FlashAttention's
 * softmax_lse convention):
 *   o_partial[z][b][h][s][:]  = O_z, normalized by the split's own row sum
 *   lse_partial[z][b][h][s]   = natural-log LSE of the split's scaled scores,
 *                               -inf (and O_z = 0) when no key was unmasked.
 * optd_split_combine merges them, one warp per output row of [B * H * S]:
 *   m = max_z lse_z,  w_z = exp(lse_z - m),  O = sum_z w_z O_z / sum_z w_z
 * lane l owns dims 2l + 64i, 2l + 64i + 1; an empty split (w = 0) is never
 * read. CTAs: cdiv(B * H * S, OPTD_COMBINE_ROWS) x 1 x 1, 32 *
 * OPTD_COMBINE_ROWS threads.
 ******************************************************************************/
#ifndef OPTD_SPLIT_COMBINE_CUH
#define OPTD_SPLIT_COMBINE_CUH

#ifndef OPTD_COMMON_CUH
#error "include common/optd.cuh before common/split_combine.cuh"
#endif

#define OPTD_COMBINE_ROWS 4  // rows (warps) per combine CTA; specs say 128 threads

template <int D>
__device__ __forceinline__ void optd_split_combine(OPTD_ARGS) {
    OPTD_CHECK_SMEM(COMBINE, D, 0);  // the templates launch it as role `combine` with smem "0"
    constexpr int DP = D / 64;
    const int lane = threadIdx.x & 31;
    const size_t rows_total = (size_t)batch * heads * seq_len;
    const size_t row = (size_t)blockIdx.x * OPTD_COMBINE_ROWS + (threadIdx.x >> 5);
    if (row >= rows_total) return;

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
    elem2_t* orow = reinterpret_cast<elem2_t*>(o + row * D);  // row = (b * H + h) * S + s
#pragma unroll
    for (int i = 0; i < DP; ++i) orow[lane + 32 * i] = from_f32x2(acc[i].x * inv, acc[i].y * inv);
}

#endif  // OPTD_SPLIT_COMBINE_CUH
