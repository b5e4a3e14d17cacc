/******************************************************************************
 * test-infinite-loop: a planted fault, for testing the daemon, never for use.
 *
 * Every thread spins forever: it re-reads Q's first word with a volatile load
 * (not cta_counter: timing passes a null one) and only leaves if the value
 * read is odd and seq_q is negative, which
 * cannot happen (seq_q >= 1); the compiler cannot prove it, and the volatile
 * asm cannot be removed, so the loop stays. __nanosleep keeps the spinning
 * cheap for the SMs. The daemon must time the launch out (record `timeout`)
 * and recover by killing its worker.
 *
 * Knobs:   WARPS_PER_CTA  warps per CTA (no meaning beyond the block size)
 * Shared:  none
 * CTAs:    cdiv(SQ, WARPS_PER_CTA) x (B * HQ) x 1
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "test-infinite-loop"
description = "test-only: a kernel that never terminates (must be timed out)"
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

__device__ __forceinline__ void spin_forever(const unsigned int* flag, int seq_q) {
    for (;;) {
        unsigned int x;
        asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(x) : "l"(flag) : "memory");
        if ((x & 1u) && seq_q < 0) break;  // never true: seq_q >= 1
        __nanosleep(1000);
    }
}

template <int D>
__device__ __forceinline__ void infinite_fwd(OPTD_ARGS) {
    spin_forever(reinterpret_cast<const unsigned int*>(q), seq_q);
}

#if OPTD_BUILD_D64
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d64(OPTD_ARGS) {
    infinite_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif

#if OPTD_BUILD_D128
extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d128(OPTD_ARGS) {
    infinite_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
#endif
