/******************************************************************************
 * test-contiguous-rows: a planted fault, for testing the daemon, never for use.
 *
 * Computes attention exactly like baseline.cu (one warp per query row, keys one
 * at a time; GQA and bottom-right causal as there) but ignores the ABI's
 * strides: it addresses Q, K, V and O as contiguous [B, H, S, D] tensors. So it
 * is right on a contiguous bhsd view and wrong on any other (a padded view, whose
 * rows are further apart than D and whose gaps hold NaN; the bshd layout). The
 * check's padded view must fail it (`incorrect`, "padded view: ..."), which is
 * what keeps a kernel that assumes contiguous tensors out of the search.
 *
 * Knobs:   WARPS_PER_CTA  query rows per CTA (one warp each)
 * Shared:  none
 * CTAs:    cdiv(SQ, WARPS_PER_CTA) x (B * HQ) x 1
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "test-contiguous-rows"
description = "test-only: baseline attention that ignores the strides (must fail the check's padded view)"
min_cc = 70
head_dims = [64, 128]
testing = true

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

#ifndef WARPS_PER_CTA
#error "WARPS_PER_CTA must be defined"
#endif

template <int D>
__device__ __forceinline__ void contiguous_fwd(OPTD_ARGS) {
    constexpr int DPL = D / 32;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5);

    // The planted fault: every stride below is the contiguous bhsd one, not the ABI's.
    (void)strides;
    const size_t q_s = D, q_h = (size_t)seq_q * D, q_b = (size_t)heads_q * q_h;
    const size_t k_s = D, k_h = (size_t)seq_k * D, k_b = (size_t)heads_kv * k_h;

    if (row >= seq_q) return;
    (void)batch;
    (void)n_splits;
    (void)o_partial;
    (void)lse_partial;
    const int b = blockIdx.y / heads_q, h = blockIdx.y - b * heads_q;  // blockIdx.y = b * HQ + h
    const int hkv = optd_kv_head(h, heads_q, heads_kv);
    const elem_t* qr = q + b * q_b + h * q_h + row * q_s;
    const elem_t* kr = k + b * k_b + hkv * k_h;
    const elem_t* vr = v + b * k_b + hkv * k_h;
    const float scale_log2 = softmax_scale * OPTD_LOG2E;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        qv[i] = to_f32(qr[lane + 32 * i]) * scale_log2;
        acc[i] = 0.f;
    }
    float m = OPTD_NEG_INF, l = 0.f;
    // Bottom-right causal: row i sees keys <= i + SK - SQ.
    const int n_keys = causal ? min(seq_k, row + 1 + optd_causal_offset(seq_q, seq_k)) : seq_k;
    for (int j = 0; j < n_keys; ++j, kr += k_s, vr += k_s) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s += qv[i] * to_f32(kr[lane + 32 * i]);
        s = warp_sum(s);
        const float m_new = fmaxf(m, s);
        const float corr = exp2f(m - m_new);
        const float p = exp2f(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] = acc[i] * corr + p * to_f32(vr[lane + 32 * i]);
        m = m_new;
    }
    elem_t* orow = o + b * q_b + h * q_h + row * q_s;
#pragma unroll
    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] / l);
}

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d64(OPTD_ARGS) {
    contiguous_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d128(OPTD_ARGS) {
    contiguous_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
