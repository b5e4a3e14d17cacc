/******************************************************************************
 * test-oob-write: a planted fault, for testing the daemon, never for use.
 *
 * Computes attention exactly like baseline.cu (one warp per query row, keys one
 * at a time) and then thread 0 of CTA (0, 0, 0) stores to o + 2^40 elements,
 * about 2 TiB past the output, an address no allocation covers. The launch
 * must die with an illegal-address error (a sticky error: the context is
 * lost), which the daemon must record as `crashed` and survive.
 * The store is inline PTX marked volatile, so the compiler cannot drop it.
 *
 * Knobs:   WARPS_PER_CTA  query rows per CTA (one warp each)
 * Shared:  none
 * CTAs:    cdiv(S, WARPS_PER_CTA) x (B * H) x 1
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "test-oob-write"
description = "test-only: baseline attention plus one store far out of bounds (must crash with an illegal address)"
min_cc = 70
testing = true

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
__device__ __forceinline__ void oob_fwd(OPTD_ARGS) {
    constexpr int DPL = D / 32;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5);

    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        // The planted fault: one 16-bit store ~2 TiB past o.
        elem_t* bad = o + ((size_t)1 << 40);
        asm volatile("st.global.b16 [%0], %1;" ::"l"(bad), "h"((unsigned short)0x7e00) : "memory");
    }

    if (row >= seq_len) return;
    const size_t head_off = (size_t)blockIdx.y * seq_len * D;
    const elem_t* qr = q + head_off + (size_t)row * D;
    const float scale_log2 = softmax_scale * OPTD_LOG2E;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        qv[i] = to_f32(qr[lane + 32 * i]) * scale_log2;
        acc[i] = 0.f;
    }
    float m = OPTD_NEG_INF, l = 0.f;
    const int n_keys = causal ? min(seq_len, row + 1) : seq_len;
    for (int j = 0; j < n_keys; ++j) {
        const elem_t* kr = k + head_off + (size_t)j * D;
        const elem_t* vr = v + head_off + (size_t)j * D;
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
    elem_t* orow = o + head_off + (size_t)row * D;
#pragma unroll
    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] / l);
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d64(OPTD_ARGS) {
    oob_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d128(OPTD_ARGS) {
    oob_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
