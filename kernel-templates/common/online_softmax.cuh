/******************************************************************************
 * online_softmax.cuh: the per-row bookkeeping of an online (streaming)
 * softmax, whatever the layout of a thread's scores.
 *
 * OnlineSoftmax<kRows, kLazy, Exp>: a thread owns kRows query rows (2 per m16 tile in the mma.sync / wgmma
 * accumulator layout, R per warp in the lane-per-key layout of kv-split and
 * memory). Per key tile the caller
 *   1. reduces, per row, the max of the running max m[h] and the tile's masked
 *      scores over every thread that holds part of the row (the reduction is
 *      layout code: quad_softmax.cuh, or a warp_max);
 *   2. calls rescale() (every row) or rescale_row() (one): the running max
 *      moves to that max (kLazy: only when it grew enough, below), a row with
 *      no unmasked key yet (max -inf) gets the
 *      bias 0 so that p and the correction come out 0 instead of NaN
 *      (-inf - -inf), the row sums are scaled, and it gets back per row the
 *      bias of the exponentials and O's correction factor;
 *   3. calls prob() per score: p = exp2(s * scale_log2 + bias), one FFMA and
 *      one exponential, added to the thread's share of the row sum (the shares
 *      are reduced once, in the epilogue), and scales O's rows by the factors.
 * Scores are raw (q . k) with scale_log2 = softmax_scale * log2(e), or already
 * in the log2 domain with scale_log2 = 1 (the multiplies then fold away).
 *
 * kLazy (FA3's trick): the max the exponentials are taken against moves only
 * when the row's max grew by more than 2^OPTD_LAZY_MAX_LOG2 (p <= 256: exact
 * in fp16 / bf16, and l and O are fp32), so most tiles leave O alone;
 * rescale() says whether any of the thread's rows moved.
 * Exp: Exp2Approx (ex2.approx.ftz, the MUFU instruction alone; 2^-inf = +0,
 * which masking relies on) or Exp2f (CUDA's exp2f, subnormals kept).
 *
 * Registers: 2 kRows fp32 (m, l) for the whole key loop, plus 2 kRows (bias,
 * corr) per tile. Template parameters are spelled kName: the knobs are
 * macros, and a parameter spelled like one (ROWS, PERSISTENT) would be replaced
 * by its value.
 ******************************************************************************/
#ifndef OPTD_ONLINE_SOFTMAX_CUH
#define OPTD_ONLINE_SOFTMAX_CUH

#ifndef OPTD_COMMON_CUH
#error "include common/optd.cuh before common/online_softmax.cuh"
#endif

// log2 of the growth of a row's max that kLazy tolerates before moving it.
#define OPTD_LAZY_MAX_LOG2 8.f

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

struct Exp2Approx {
    static __device__ __forceinline__ float apply(float x) { return fast_exp2(x); }
};
struct Exp2f {
    static __device__ __forceinline__ float apply(float x) { return exp2f(x); }
};

template <int kRows, bool kLazy, class Exp>
struct OnlineSoftmax {
    float m[kRows];  // the max the exponentials are taken against (score units); -inf before any key
    float l[kRows];  // this thread's share of each row's sum of p

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int h = 0; h < kRows; ++h) {
            m[h] = OPTD_NEG_INF;
            l[h] = 0.f;
        }
    }

    // Row h of another partial state of the same rows, over other keys (a stream-K piece, the
    // other CTA of a cluster), folded into this one: (m, l) become the union's, and fs / fo
    // come back, the factors this side's and the other side's O rows are scaled by. A side
    // that saw no key of the row (max -inf) weighs 0, not NaN. Against m as it stands (a
    // lazy max is the max the exponentials were taken against: still exact).
    __device__ __forceinline__ void merge_row(int h, float mo, float lo, float scale_log2, float& fs, float& fo) {
        const float mn = fmaxf(m[h], mo);
        fs = m[h] == OPTD_NEG_INF ? 0.f : Exp::apply((m[h] - mn) * scale_log2);
        fo = mo == OPTD_NEG_INF ? 0.f : Exp::apply((mo - mn) * scale_log2);
        m[h] = mn;
        l[h] = l[h] * fs + lo * fo;
    }

    // One row: mx = max(m[h], row h's masked scores of this tile) over all the
    // row's threads (kLazy may lower it back to m[h]). Out: bias for prob(),
    // and corr, the factor of row h of O; `moved` is set when the row's max
    // moved (always without kLazy) and left alone otherwise (corr is then 1).
    // A flag the caller owns, not a returned bool: or-ing returned bools made
    // ptxas pack them into bytes, a few more instructions per tile in
    // wgmma_tma's issue-bound softmax.
    __device__ __forceinline__ void rescale_row(int h, float& mx, float scale_log2, float& bias, float& corr,
                                                bool& moved) {
        if constexpr (kLazy) {
            if (m[h] != OPTD_NEG_INF && (mx - m[h]) * scale_log2 <= OPTD_LAZY_MAX_LOG2) mx = m[h];
            else moved = true;
        } else {
            moved = true;
        }
        bias = mx == OPTD_NEG_INF ? 0.f : -mx * scale_log2;
        corr = Exp::apply(fmaf(m[h], scale_log2, bias));
        m[h] = mx;
        l[h] *= corr;
    }

    // Every row at once; whether some row's max moved.
    __device__ __forceinline__ bool rescale(float (&mx)[kRows], float scale_log2, float (&bias)[kRows],
                                            float (&corr)[kRows]) {
        bool moved = false;
#pragma unroll
        for (int h = 0; h < kRows; ++h) rescale_row(h, mx[h], scale_log2, bias[h], corr[h], moved);
        return moved;
    }

    // The probability of score s of row h (a masked score, -inf, gives 0),
    // added to the row's sum; bias: rescale_row()'s for the row.
    __device__ __forceinline__ float prob(float s, int h, float scale_log2, float bias) {
        const float p = Exp::apply(fmaf(s, scale_log2, bias));
        l[h] += p;
        return p;
    }
};

#endif  // OPTD_ONLINE_SOFTMAX_CUH
