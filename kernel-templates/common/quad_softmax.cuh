/******************************************************************************
 * quad_softmax.cuh: the register-level pieces of an online softmax over
 * m16n8 accumulator tiles (mma.sync m16n8k16, and wgmma, whose m64nN
 * accumulators are the same layout per warp): the 4 lanes of a quad
 * (lane / 4 = the row g, lane % 4 = the column pair) hold one row of a tile.
 *
 *   fast_exp2(x)       2^x by ex2.approx.ftz; 2^-inf = +0, which masking relies on
 *   pack2(a, b)        two fp32 -> one f16x2 / bf16x2 register (an A fragment half)
 *   quad_max/quad_sum  reductions over the quad (2 xor shuffles)
 * Used by mma_fa2.cu and wgmma_tma.cu.
 ******************************************************************************/
#ifndef OPTD_QUAD_SOFTMAX_CUH
#define OPTD_QUAD_SOFTMAX_CUH

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned pack2(float a, float b) {
    elem2_t h = from_f32x2(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#endif  // OPTD_QUAD_SOFTMAX_CUH
