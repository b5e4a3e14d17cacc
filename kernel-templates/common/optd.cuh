/******************************************************************************
 * optd.cuh: what every optimizerd kernel template shares.
 *
 * The renderer puts a block of `#define KNOB value` lines (plus OPTD_BF16, the
 * OPTD_SMEM_BYTES_<ROLE>_D<d> values below, one per head dim the template's
 * spec lists in `head_dims` and, in the daemon's builds,
 * -DOPTD_COUNT_CTAS=1) in front of a template and replaces the template's
 * `#include "common/optd.cuh"` line with this file, so nothing here may rely
 * on a real include path except the CUDA half/bfloat16 headers.
 *
 * Provided:
 *   elem_t, to_f32(), from_f32()  the storage type of Q, K, V and O
 *   elem2_t, to_f32x2(), from_f32x2(), unpack8()   paired / 16-byte forms
 *   OPTD_ARGS, OPTD_ARG_NAMES      the kernel ABI (parameters / their names)
 *   OPTD_CTA_DONE()                the per-CTA completion count (counting builds)
 *   OPTD_BUILD_D64, _D96, _D128, _D256  whether this build holds that head dim's kernels
 *   OPTD_BUILD_WINDOW, optd_window()  whether it holds the window's code; the window
 *                                  a kernel applies
 *   OPTD_CHECK_SMEM(ROLE, D, n)    the kernel's shared-memory layout ends at the
 *                                  bytes the spec's smem formula gives its launch
 *   warp_sum(), warp_max()         butterfly reductions over a full warp
 ******************************************************************************/
#ifndef OPTD_COMMON_CUH
#define OPTD_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef OPTD_BF16
#error "OPTD_BF16 must be defined (0: fp16, 1: bf16) by the renderer"
#endif

// Which head dims' kernels a build contains. Every template guards its extern "C" kernels
// of head dim d by `#if OPTD_BUILD_D<d>`; the worker passes -DOPTD_BUILD_D<d>=0 for each head
// dim no shape of the run has, so a run on one head dim compiles only its own kernels
// (the rendered source, its hash and an exported .cu stay the same: unset, every head dim
// the template is written for is built). A template lists its head dims in its spec
// (`head_dims`); the four macros are the project's head dims (src/spec/config.rs HEAD_DIMS).
#ifndef OPTD_BUILD_D64
#define OPTD_BUILD_D64 1
#endif
#ifndef OPTD_BUILD_D96
#define OPTD_BUILD_D96 1
#endif
#ifndef OPTD_BUILD_D128
#define OPTD_BUILD_D128 1
#endif
#ifndef OPTD_BUILD_D256
#define OPTD_BUILD_D256 1
#endif

// Whether a build holds the window's code (kernel ABI v3's `window`). The templates that
// implement the window read it through optd_window(): with -DOPTD_BUILD_WINDOW=0 that is the
// constant 0, the window's tests fold away and the kernels are the code from before windows
// (a call with a window traps rather than ignore it). Why: compiled in, those tests made
// unwindowed calls 1-4% slower (H200, default points: decode-split and decode-cluster at B 1-8
// decode, mma-fa2 at D 256, kv-split; with OPTD_BUILD_WINDOW=0 they time as before), and a run
// without a windowed shape need not pay that; the worker may pass it as it passes
// OPTD_BUILD_D<d>. (Both bodies in one kernel, picked by `window` at run time, still cost
// unwindowed calls 1-2.7% and doubled the compile time.) Unset: 1, every kernel takes windows.
// baseline.cu and wmma.cu read `window` itself: baseline is every shape's first candidate, and
// wmma's windowed body ran unwindowed shapes faster than before, not slower (13% at B 1,
// HQ 32 / HKV 8, S 2048, D 128, causal).
#ifndef OPTD_BUILD_WINDOW
#define OPTD_BUILD_WINDOW 1
#endif

// The window a template's kernels apply: `window`, or 0 in a build without the window's code.
__device__ __forceinline__ int optd_window(int window) {
#if OPTD_BUILD_WINDOW
    return window;
#else
    if (window != 0) __trap();
    return 0;
#endif
}

// ---------------------------------------------------------------------------
// Element type. All arithmetic is fp32; elem_t is only the storage format.
// ---------------------------------------------------------------------------
#if OPTD_BF16
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
__device__ __forceinline__ float to_f32(elem_t x) { return __bfloat162float(x); }
__device__ __forceinline__ elem_t from_f32(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float2 to_f32x2(elem2_t x) { return __bfloat1622float2(x); }
__device__ __forceinline__ elem2_t from_f32x2(float a, float b) { return __floats2bfloat162_rn(a, b); }
#else
typedef __half elem_t;
typedef __half2 elem2_t;
__device__ __forceinline__ float to_f32(elem_t x) { return __half2float(x); }
__device__ __forceinline__ elem_t from_f32(float x) { return __float2half_rn(x); }
__device__ __forceinline__ float2 to_f32x2(elem2_t x) { return __half22float2(x); }
__device__ __forceinline__ elem2_t from_f32x2(float a, float b) { return __floats2half2_rn(a, b); }
#endif

// 16 bytes (8 elements) to fp32, e.g. one vectorized global or shared load.
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
    const elem2_t* h = reinterpret_cast<const elem2_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = to_f32x2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// Scores are kept in the log2 domain: s2 = (q.k) * softmax_scale * log2(e), so
// that exp(x * scale) == exp2f(s2) and a single FFMA folds the scale in.
#define OPTD_LOG2E 1.4426950408889634f
#define OPTD_LN2 0.6931471805599453f
// NVRTC has no <math.h>, hence no INFINITY macro.
#define OPTD_NEG_INF (__int_as_float(0xff800000))

// ---------------------------------------------------------------------------
// Kernel ABI v3, identical for every kernel of every template (the daemon's
// worker launches them all with the same argument list; v3 added `window`).
//   q, o           B x heads_q x seq_q rows of D elem_t (row = D contiguous
//                  elements, 16-byte aligned), addressed through strides.q / .o
//   k, v           B x heads_kv x seq_k rows, through strides.k / .v
//   heads_q, heads_kv   grouped-query attention: query head h reads KV head
//                  h / (heads_q / heads_kv) (optd_kv_head); heads_kv = 1 is MQA
//   seq_q <= seq_k causal: the query rows are the LAST seq_q positions, row i
//                  sees keys <= i + seq_k - seq_q (optd_causal_offset; the
//                  bottom-right convention of FlashAttention >= 2.1 and SDPA)
//   window         sliding window W (0: none; W >= 1 only with causal): row i,
//                  at position p = i + seq_k - seq_q, sees key j iff
//                  p - W < j <= p, at most W keys, its own included (Hugging
//                  Face's sliding_window = W, FlashAttention's window_size
//                  (W - 1, 0)); W >= seq_k masks nothing. A template whose spec
//                  lacks `windows = true` is never given W > 0 and may ignore it.
//   strides        element strides (batch, head, row) of q, k, v, o: either
//                  layout ([B,H,S,D] or [B,S,H,D]) and non-contiguous views
//                  with a unit last stride; the check runs padded views too,
//                  so a kernel may not assume row stride == D
//   o_partial      [n_splits, B, heads_q, seq_q, D] fp32 scratch, contiguous
//   lse_partial    [n_splits, B, heads_q, seq_q] fp32 scratch, contiguous
//   cta_counter    one uint, counted by OPTD_CTA_DONE() in counting builds
//                  (-DOPTD_COUNT_CTAS=1) when not null
// ---------------------------------------------------------------------------
struct optd_strides {
    long long q_b, q_h, q_s;
    long long k_b, k_h, k_s;
    long long v_b, v_h, v_s;
    long long o_b, o_h, o_s;
};

#define OPTD_ARGS                                                                         \
    const elem_t* __restrict__ q, const elem_t* __restrict__ k,                           \
        const elem_t* __restrict__ v, elem_t* __restrict__ o,                             \
        float* __restrict__ o_partial, float* __restrict__ lse_partial, int batch,        \
        int heads_q, int heads_kv, int seq_q, int seq_k, int n_splits,                    \
        float softmax_scale, int causal, int window, const optd_strides strides,          \
        unsigned int* __restrict__ cta_counter

#define OPTD_ARG_NAMES                                                                    \
    q, k, v, o, o_partial, lse_partial, batch, heads_q, heads_kv, seq_q, seq_k, n_splits, \
        softmax_scale, causal, window, strides, cta_counter

// The KV head query head h reads (grouped-query attention).
__device__ __forceinline__ int optd_kv_head(int h, int heads_q, int heads_kv) {
    return h / (heads_q / heads_kv);
}

// Causal: row i sees keys <= i + optd_causal_offset (0 when seq_q == seq_k).
__device__ __forceinline__ int optd_causal_offset(int seq_q, int seq_k) { return seq_k - seq_q; }

// Where head h of batch b starts in a tensor with batch stride sb and head stride sh.
__device__ __forceinline__ long long optd_head_off(long long sb, long long sh, int b, int h) {
    return (long long)b * sb + (long long)h * sh;
}

// ---------------------------------------------------------------------------
// CTA completion count. The daemon's check compares the count with the planned
// grid size, which catches CTAs that never ran or died. Call it last in every
// exported kernel, on every path; the device implementations may return early
// because the exported wrappers call it after them. Built with
// -DOPTD_COUNT_CTAS=1 (the daemon's one build of a candidate, checked and
// timed), a kernel counts into cta_counter when it is not null: the check
// passes a zeroed counter, timing passes null. Built without it (an exported
// source as users compile it), the kernel never touches cta_counter.
// ---------------------------------------------------------------------------
#if defined(OPTD_COUNT_CTAS) && OPTD_COUNT_CTAS
#define OPTD_CTA_DONE()                                                         \
    do {                                                                        \
        if (cta_counter != nullptr && threadIdx.x == 0 && threadIdx.y == 0 &&   \
            threadIdx.z == 0) {                                                 \
            atomicAdd(cta_counter, 1u);                                         \
        }                                                                       \
    } while (0)
#else
#define OPTD_CTA_DONE() \
    do {                \
        (void)cta_counter; \
    } while (0)
#endif

// ---------------------------------------------------------------------------
// Shared memory: one number, checked where it is used. The gate sizes a
// launch's dynamic shared memory with the spec's `smem` formula; the renderer
// evaluates the same formula for this knob point at each head dim and defines
// OPTD_SMEM_BYTES_<ROLE>_D<d> (ROLE = the launch's kernel role in upper
// case). A kernel states where its own layout ends,
//     OPTD_CHECK_SMEM(FWD, D, Layout<D>::BYTES);
// and a layout that no longer matches the formula (or the reverse) does not
// compile: NVRTC names optd_smem_check<layout bytes, formula bytes>. A formula
// that reads the shape or the device (S, B, H, SMS, ...) gets no define (the
// renderer says why in a comment), so a template checked this way must keep
// its shared memory a function of the knobs and D.
// ---------------------------------------------------------------------------
template <long long kLayoutBytes, long long kFormulaBytes>
struct optd_smem_check {
    static_assert(kLayoutBytes == kFormulaBytes,
                  "OPTD_CHECK_SMEM: the kernel's shared-memory layout does not end at the bytes the spec's smem "
                  "formula gives its launch (optd_smem_check<layout bytes, formula bytes>)");
};
// The renderer defines all four head dims' values: a head dim the template does not list
// reads OPTD_NOT_A_HEAD_DIM, which no layout equals.
#define OPTD_NOT_A_HEAD_DIM (-1)
#define OPTD_SMEM_BYTES(ROLE, D)                                                        \
    ((D) == 64    ? OPTD_SMEM_BYTES_##ROLE##_D64                                        \
     : (D) == 96  ? OPTD_SMEM_BYTES_##ROLE##_D96                                        \
     : (D) == 128 ? OPTD_SMEM_BYTES_##ROLE##_D128                                       \
     : (D) == 256 ? OPTD_SMEM_BYTES_##ROLE##_D256                                       \
                  : -1)
// sizeof instantiates the class (and its static_assert) and emits nothing.
#define OPTD_CHECK_SMEM(ROLE, D, BYTES) \
    static_assert(sizeof(optd_smem_check<(BYTES), OPTD_SMEM_BYTES(ROLE, D)>) > 0, "see optd_smem_check")

// ---------------------------------------------------------------------------
// Warp reductions: every lane ends with the result.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

#endif  // OPTD_COMMON_CUH
