/******************************************************************************
 * test-oob-write: a planted fault, for testing the daemon, never for use.
 *
 * Computes attention exactly like baseline.cu (one warp per query row, keys one
 * at a time; GQA, bottom-right causal and strided rows as there), so that the
 * fault is the only thing wrong with it, and then thread 0 of CTA (0, 0, 0)
 * stores to o + 2^40 elements, about 2 TiB past the output, an address no
 * allocation covers. The launch must die with an illegal-address error (a
 * sticky error: the context is lost), which the daemon must record as
 * `crashed` and survive.
 * The store is inline PTX marked volatile, so the compiler cannot drop it.
 *
 * Knobs:   WARPS_PER_CTA  query rows per CTA (one warp each)
 * Shared:  none
 * CTAs:    cdiv(SQ, WARPS_PER_CTA) x (B * HQ) x 1
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "test-oob-write"
description = "test-only: baseline attention plus one store far out of bounds (must crash with an illegal address)"
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
__device__ __forceinline__ void oob_fwd(OPTD_ARGS) {
    constexpr int DPL = D / 32;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5);

    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        // The planted fault: one 16-bit store ~2 TiB past o.
        elem_t* bad = o + ((size_t)1 << 40);
        asm volatile("st.global.b16 [%0], %1;" ::"l"(bad), "h"((unsigned short)0x7e00) : "memory");
    }

    if (row >= seq_q) return;
    (void)batch;
    (void)n_splits;
    (void)o_partial;
    (void)lse_partial;
    const int b = blockIdx.y / heads_q, h = blockIdx.y - b * heads_q;  // blockIdx.y = b * HQ + h
    const int hkv = optd_kv_head(h, heads_q, heads_kv);
    const elem_t* qr = q + optd_head_off(strides.q_b, strides.q_h, b, h) + row * strides.q_s;
    const elem_t* kr = k + optd_head_off(strides.k_b, strides.k_h, b, hkv);
    const elem_t* vr = v + optd_head_off(strides.v_b, strides.v_h, b, hkv);
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
    for (int j = 0; j < n_keys; ++j, kr += strides.k_s, vr += strides.v_s) {
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
    elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, h) + row * strides.o_s;
#pragma unroll
    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] / l);
}

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d64(OPTD_ARGS) {
    oob_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d128(OPTD_ARGS) {
    oob_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
