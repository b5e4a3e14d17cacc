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
 * from global memory (L1/L2 catch the reuse between warps, and between the
 * G = HQ / HKV query heads of one KV head, which are neighbours in gridDim.y);
 * nothing is staged. It is slow on purpose: a serial dependency chain over
 * all keys per row and a warp-wide reduction for every single dot product.
 *
 * Addressing (kernel ABI v2): blockIdx.y = b * HQ + h; query row i of head h
 * is at q + b * q_b + h * q_h + i * q_s (O likewise through strides.o), key j
 * of KV head optd_kv_head(h) at k + b * k_b + hkv * k_h + j * k_s (V likewise).
 * The K and V row pointers advance by one row stride per key.
 * Causal (bottom-right, SQ <= SK): row i sees keys < i + 1 + SK - SQ
 * (KeyMask::limit), so every row sees at least key 0 and l > 0.
 *
 * Knobs:   WARPS_PER_CTA  query rows per CTA (one warp each)
 * Head dims: all of the project's (64, 96, 128, 256; any multiple of 32 works):
 *          every shape has at least this kernel, the run's first candidate.
 * Shared:  none
 * CTAs:    cdiv(SQ, WARPS_PER_CTA) x (B * HQ) x 1   (B * HQ <= 65535, gridDim.y)
 * Registers: 2 * D / 32 fp32 (q and acc) plus m, l and two row pointers.
 * Window:  a row walks only its keys [first_key, limit) (KeyMask): the loop
 *          starts at the window's first key, so nothing is masked per key and
 *          a window of W reads W keys per row; the row's diagonal key is in
 *          the range, so l > 0 still.
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "baseline"
description = "naive, correct attention: one warp per query row, keys one at a time, online softmax"
min_cc = 70
head_dims = [64, 96, 128, 256]
windows = true

[knobs]
WARPS_PER_CTA = [4]

[derived]
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["cdiv(SQ, WARPS_PER_CTA)", "B * HQ", "1"]
block = ["WARPS_PER_CTA * 32", "1", "1"]
smem = "0"
*/

#include "common/optd.cuh"
#include "common/mask.cuh"

#ifndef WARPS_PER_CTA
#error "WARPS_PER_CTA must be defined"
#endif

template <int D>
__device__ __forceinline__ void baseline_fwd(OPTD_ARGS) {
    static_assert(D % 32 == 0, "each lane owns D / 32 dims");
    constexpr int DPL = D / 32;  // dims per lane
    (void)batch;
    (void)n_splits;
    (void)o_partial;
    (void)lse_partial;

    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5);
    if (row >= seq_q) return;  // whole warp leaves together: no shuffle is left waiting

    const int b = blockIdx.y / heads_q, h = blockIdx.y - b * heads_q;  // blockIdx.y = b * HQ + h
    const int hkv = optd_kv_head(h, heads_q, heads_kv);
    const elem_t* qr = q + optd_head_off(strides.q_b, strides.q_h, b, h) + row * strides.q_s;
    const elem_t* kr = k + optd_head_off(strides.k_b, strides.k_h, b, hkv);
    const elem_t* vr = v + optd_head_off(strides.v_b, strides.v_h, b, hkv);
    const long long k_step = strides.k_s, v_step = strides.v_s;
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), window);
    const int key0 = mask.first_key(row), key_end = mask.limit(row);
    kr += key0 * k_step;
    vr += key0 * v_step;

    const float scale_log2 = softmax_scale * OPTD_LOG2E;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        qv[i] = to_f32(qr[lane + 32 * i]) * scale_log2;
        acc[i] = 0.f;
    }

    // Every key of [key0, key_end) is seen and the range is never empty (key 0, or the
    // row's own diagonal key under a window), so m becomes finite at the first key and l > 0.
    float m = OPTD_NEG_INF, l = 0.f;
    for (int j = key0; j < key_end; ++j, kr += k_step, vr += v_step) {
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
    elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, h) + row * strides.o_s;
#pragma unroll
    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] * inv_l);
}

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d64(OPTD_ARGS) {
    baseline_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D96
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d96(OPTD_ARGS) {
    baseline_fwd<96>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d128(OPTD_ARGS) {
    baseline_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D256
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d256(OPTD_ARGS) {
    baseline_fwd<256>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
