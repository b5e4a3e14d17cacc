/******************************************************************************
 * test-tensor-map-probe: test-only, for the daemon's Hopper plumbing: an
 * arch-specific target (sm_90a) and a TMA tensor map passed as a kernel
 * parameter after the ABI parameters. Never in a default plan.
 *
 * Computes attention exactly like baseline.cu (one warp per query row, keys
 * one at a time; kernel ABI v2: GQA, bottom-right causal, strided views).
 * Before that, every CTA with blockIdx.x == 0 probes its tensor-map
 * parameter: thread 0 loads one box of K (rows 0 .. BOX_ROWS - 1 of the K/V
 * head that query head blockIdx.y = b * HQ + h reads) through the TMA into
 * shared memory, and every thread compares the box with K read straight from
 * global memory through its strides, under the daemon's geometry convention
 * (src/spec/protocol.rs, TensorMap::geometry):
 *   rank 5, dims {64, SK, D / 64, HKV, B} over K's real strides, box
 *   {64, BOX_ROWS, D / 64, 1, 1} at coordinates (0, 0, 0, kv head, b),
 *   128-byte swizzle, so element (r, c) of the box sits in panel c / 64, row
 *   r, 16-byte chunk ((c % 64) / 8) ^ (r % 8), element c % 8; rows >= SK read
 *   as zero.
 * A mismatch traps (the check records the candidate as crashed), so on a GPU
 * this checks the map's encoding (strides and heads included: the check's
 * padded views and [B,S,H,D] layouts move every row), its parameter position
 * and the convention end to end. Self-contained PTX on purpose: it must not
 * depend on the real Hopper templates' headers.
 *
 * Knobs:   BOX_ROWS   rows of the probed box (the map's box_rows)
 * Shared:  1024 (alignment) + BOX_ROWS * D * 2 bytes dynamic, 8 B mbarrier
 * CTAs:    cdiv(SQ, 4) x (B * HQ) x 1, 128 threads
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "test-tensor-map-probe"
description = "test-only: baseline attention plus a TMA load of one K box through the tensor-map parameter, checked against global memory (sm_90a)"
min_cc = 90
head_dims = [64, 128]
arch_specific = true
testing = true

[knobs]
BOX_ROWS = [64, 16]

[derived]
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["cdiv(SQ, 4)", "B * HQ", "1"]
block = ["128", "1", "1"]
smem = "1024 + BOX_ROWS * D * 2"

[[tensor_map]]
tensor = "k"
box_rows = "BOX_ROWS"
swizzle = 128
*/

#include "common/optd.cuh"

#ifndef BOX_ROWS
#error "BOX_ROWS must be defined"
#endif
#if BOX_ROWS % 8 != 0 || BOX_ROWS < 8 || BOX_ROWS > 256
#error "BOX_ROWS must be a multiple of 8 in 8..256 (whole 1024-byte swizzle atoms per panel)"
#endif
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "test-tensor-map-probe is arch-specific: compile with --gpu-architecture=sm_90a"
#endif

// A CUtensorMap as the worker passes it: 128 bytes by value, 64-byte aligned.
struct __align__(64) probe_tensor_map {
    unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned probe_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int D>
__device__ __forceinline__ void probe_box(const elem_t* __restrict__ k, int heads_q, int heads_kv, int seq_k,
                                          const optd_strides& strides, const probe_tensor_map* map) {
    static_assert(D % 64 == 0, "128-byte swizzle: 64-element panels");
    extern __shared__ __align__(1024) unsigned char probe_smem[];
    __shared__ __align__(8) unsigned long long bar;

    // The 128-byte swizzle is applied to absolute shared addresses: start the box on
    // a 1024-byte boundary (the launch asks for 1024 bytes of slack).
    const unsigned raw = probe_smem_addr(probe_smem);
    const unsigned pad = (1024u - (raw & 1023u)) & 1023u;
    const unsigned short* box = reinterpret_cast<const unsigned short*>(probe_smem + pad);
    const unsigned box_addr = raw + pad;
    const unsigned bar_addr = probe_smem_addr(&bar);
    const unsigned long long map_addr = reinterpret_cast<unsigned long long>(map);
    constexpr unsigned BYTES = BOX_ROWS * D * 2;
    const int b = (int)blockIdx.y / heads_q;
    const int kvh = optd_kv_head((int)blockIdx.y - b * heads_q, heads_q, heads_kv);

    if (threadIdx.x == 0) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(map_addr) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_addr) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar_addr), "r"(BYTES) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(box_addr),
            "l"(map_addr), "r"(bar_addr), "r"(0), "r"(0), "r"(0), "r"(kvh), "r"(b)
            : "memory");
    }
    // Every thread waits for the box (phase 0 of the barrier).
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "PROBE_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
        "@!done bra PROBE_WAIT_%=;\n"
        "}\n" ::"r"(bar_addr)
        : "memory");

    const unsigned short* kh =
        reinterpret_cast<const unsigned short*>(k) + optd_head_off(strides.k_b, strides.k_h, b, kvh);
    for (int i = threadIdx.x; i < BOX_ROWS * D; i += blockDim.x) {
        const int r = i / D, c = i % D;
        const int col = c % 64;
        const int at = (c / 64) * (BOX_ROWS * 64) + r * 64 + (((col / 8) ^ (r % 8)) * 8) + col % 8;
        const unsigned short want = r < seq_k ? __ldg(kh + (long long)r * strides.k_s + c) : (unsigned short)0;
        if (box[at] != want) __trap();
    }
    __syncthreads();
}

template <int D>
__device__ __forceinline__ void probe_attention(OPTD_ARGS) {
    constexpr int DPL = D / 32;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (row >= seq_q) return;
    (void)batch;
    (void)n_splits;
    (void)o_partial;
    (void)lse_partial;

    const int b = (int)blockIdx.y / heads_q;
    const int hq = (int)blockIdx.y - b * heads_q;
    const int kvh = optd_kv_head(hq, heads_q, heads_kv);
    const elem_t* qr = q + optd_head_off(strides.q_b, strides.q_h, b, hq) + (long long)row * strides.q_s;
    const elem_t* kh = k + optd_head_off(strides.k_b, strides.k_h, b, kvh);
    const elem_t* vh = v + optd_head_off(strides.v_b, strides.v_h, b, kvh);
    const float scale_log2 = softmax_scale * OPTD_LOG2E;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        qv[i] = to_f32(qr[lane + 32 * i]) * scale_log2;
        acc[i] = 0.f;
    }
    float m = OPTD_NEG_INF, l = 0.f;
    // Bottom-right causal: row i sees keys <= i + seq_k - seq_q.
    const int n_keys = causal ? min(seq_k, row + 1 + optd_causal_offset(seq_q, seq_k)) : seq_k;
    for (int j = 0; j < n_keys; ++j) {
        const elem_t* kr = kh + (long long)j * strides.k_s;
        const elem_t* vr = vh + (long long)j * strides.v_s;
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
    const float inv_l = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key: 0
    elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, hq) + (long long)row * strides.o_s;
#pragma unroll
    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] * inv_l);
}

#define PROBE_KERNEL(DIM)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                                          \
        optd_fwd_d##DIM(OPTD_ARGS, const __grid_constant__ probe_tensor_map tm_k) {                            \
        if (blockIdx.x == 0) probe_box<DIM>(k, heads_q, heads_kv, seq_k, strides, &tm_k);                      \
        probe_attention<DIM>(OPTD_ARG_NAMES);                                                                  \
        OPTD_CTA_DONE();                                                                                       \
    }

#if OPTD_BUILD_D64
PROBE_KERNEL(64)
#endif
#if OPTD_BUILD_D128
PROBE_KERNEL(128)
#endif
