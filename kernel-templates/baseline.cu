/******************************************************************************
 * baseline: naive but correct attention forward, the optimizer's starting point.
 *
 * One warp per query row. The row's q (pre-scaled by softmax_scale * log2 e)
 * and its output accumulator live in registers, lane l owning dims
 * l, l + 32, ... (D / 32 of them). Keys are visited one at a time:
 *
 *   s     = warp_sum(q . k_j)                  (5 shuffles per key)
 *   m'    = max(m, s)
 *   l     = l * 2^(m - m') + 2^(s - m')        (online softmax)
 *   acc   = acc * 2^(m - m') + 2^(s - m') * v_j
 *
 * and O = acc / l is written once at the end. K and V rows are read straight
 * from global memory (L1/L2 catch the reuse between warps); nothing is staged.
 * It is slow on purpose: a serial dependency chain over all S keys per row and
 * a warp-wide reduction for every single dot product.
 *
 * Knobs:   WARPS_PER_CTA  query rows per CTA (one warp each)
 * Shared:  none
 * CTAs:    cdiv(S, WARPS_PER_CTA) x (B * H) x 1   (B * H <= 65535, gridDim.y)
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "baseline"
description = "naive, correct attention: one warp per query row, keys one at a time, online softmax"
min_cc = 70

[knobs]
WARPS_PER_CTA = [4]

[derived]
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["cdiv(S, WARPS_PER_CTA)", "B * H", "1"]
block = ["WARPS_PER_CTA * 32", "1", "1"]
smem = "0"
*/

#include "common/optd.cuh"

#ifndef WARPS_PER_CTA
#error "WARPS_PER_CTA must be defined"
#endif

template <int D>
__device__ __forceinline__ void baseline_fwd(OPTD_ARGS) {
    static_assert(D % 32 == 0, "each lane owns D / 32 dims");
    constexpr int DPL = D / 32;  // dims per lane

    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5);
    if (row >= seq_len) return;  // whole warp leaves together: no shuffle is left waiting

    const size_t head_off = (size_t)blockIdx.y * seq_len * D;  // blockIdx.y = b * H + h
    const elem_t* qr = q + head_off + (size_t)row * D;
    const elem_t* kh = k + head_off;
    const elem_t* vh = v + head_off;

    const float scale_log2 = softmax_scale * OPTD_LOG2E;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        qv[i] = to_f32(qr[lane + 32 * i]) * scale_log2;
        acc[i] = 0.f;
    }

    // Key 0 is never masked, so m becomes finite at the first key and l > 0.
    float m = OPTD_NEG_INF, l = 0.f;
    const int n_keys = causal ? min(seq_len, row + 1) : seq_len;
    for (int j = 0; j < n_keys; ++j) {
        const elem_t* kr = kh + (size_t)j * D;
        const elem_t* vr = vh + (size_t)j * D;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s += qv[i] * to_f32(kr[lane + 32 * i]);
        s = warp_sum(s);

        const float m_new = fmaxf(m, s);
        const float corr = exp2f(m - m_new);  // exp2f(-inf) = 0 on the first key
        const float p = exp2f(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] = acc[i] * corr + p * to_f32(vr[lane + 32 * i]);
        m = m_new;
    }

    const float inv_l = 1.f / l;
    elem_t* orow = o + head_off + (size_t)row * D;
#pragma unroll
    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] * inv_l);
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d64(OPTD_ARGS) {
    baseline_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d128(OPTD_ARGS) {
    baseline_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
