/******************************************************************************
 * test-tensor-map-probe: test-only, for the daemon's Hopper plumbing: an
 * arch-specific target (sm_90a) and a TMA tensor map passed as a kernel
 * parameter after the 13 ABI parameters. Never in a default plan.
 *
 * Computes attention exactly like baseline.cu (one warp per query row, keys
 * one at a time). Before that, every CTA with blockIdx.x == 0 probes its
 * tensor-map parameter: thread 0 loads one box of K (rows 0 .. BOX_ROWS - 1 of
 * head blockIdx.y) through the TMA into shared memory, and every thread
 * compares the box with K read straight from global memory, under the
 * daemon's geometry convention (src/protocol.rs, TensorMap::geometry):
 *   dims {64, S, D / 64, B * H}, box {64, BOX_ROWS, D / 64, 1}, 128-byte
 *   swizzle, so element (r, c) of the box sits in panel c / 64, row r, 16-byte
 *   chunk ((c % 64) / 8) ^ (r % 8), element c % 8; rows >= S read as zero.
 * A mismatch traps (the check records the candidate as crashed), so on a GPU
 * this checks the map's encoding, its parameter position and the convention
 * end to end. Self-contained PTX on purpose: it must not depend on the real
 * Hopper templates' headers.
 *
 * Knobs:   BOX_ROWS   rows of the probed box (the map's box_rows)
 * Shared:  1024 (alignment) + BOX_ROWS * D * 2 bytes dynamic, 8 B mbarrier
 * CTAs:    cdiv(S, 4) x (B * H) x 1, 128 threads
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "test-tensor-map-probe"
description = "test-only: baseline attention plus a TMA load of one K box through the tensor-map parameter, checked against global memory (sm_90a)"
min_cc = 90
arch_specific = true
testing = true

[knobs]
BOX_ROWS = [64, 16]

[derived]
splits = "1"

[[launch]]
kernel = "fwd"
grid = ["cdiv(S, 4)", "B * H", "1"]
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
__device__ __forceinline__ void probe_box(const elem_t* __restrict__ k, int seq_len, const probe_tensor_map* map) {
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

    if (threadIdx.x == 0) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(map_addr) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_addr) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar_addr), "r"(BYTES) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(box_addr),
            "l"(map_addr), "r"(bar_addr), "r"(0), "r"(0), "r"(0), "r"((int)blockIdx.y)
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

    const unsigned short* kh = reinterpret_cast<const unsigned short*>(k) + (size_t)blockIdx.y * seq_len * D;
    for (int i = threadIdx.x; i < BOX_ROWS * D; i += blockDim.x) {
        const int r = i / D, c = i % D;
        const int col = c % 64;
        const int at = (c / 64) * (BOX_ROWS * 64) + r * 64 + (((col / 8) ^ (r % 8)) * 8) + col % 8;
        const unsigned short want = r < seq_len ? __ldg(kh + (size_t)r * D + c) : (unsigned short)0;
        if (box[at] != want) __trap();
    }
    __syncthreads();
}

template <int D>
__device__ __forceinline__ void probe_attention(OPTD_ARGS) {
    constexpr int DPL = D / 32;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (row >= seq_len) return;

    const size_t head_off = (size_t)blockIdx.y * seq_len * D;
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
        const float corr = exp2f(m - m_new);
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

#define PROBE_KERNEL(DIM)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                                          \
        optd_fwd_d##DIM(OPTD_ARGS, const __grid_constant__ probe_tensor_map tm_k) {                            \
        if (blockIdx.x == 0) probe_box<DIM>(k, seq_len, &tm_k);                                                \
        probe_attention<DIM>(OPTD_ARG_NAMES);                                                                  \
        OPTD_CTA_DONE();                                                                                       \
    }

PROBE_KERNEL(64)
PROBE_KERNEL(128)
