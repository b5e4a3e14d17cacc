/******************************************************************************
 * test-infinite-loop: a planted fault, for testing the daemon, never for use.
 *
 * Every thread spins forever: it re-reads *cta_counter with a volatile load
 * and only leaves if the value read is odd and seq_len is negative, which
 * cannot happen (seq_len >= 1); the compiler cannot prove it, and the volatile
 * asm cannot be removed, so the loop stays. __nanosleep keeps the spinning
 * cheap for the SMs. The daemon must time the launch out (record `timeout`)
 * and recover by killing its worker.
 *
 * Knobs:   WARPS_PER_CTA  warps per CTA (no meaning beyond the block size)
 * Shared:  none
 * CTAs:    cdiv(S, WARPS_PER_CTA) x (B * H) x 1
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "test-infinite-loop"
description = "test-only: a kernel that never terminates (must be timed out)"
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

__device__ __forceinline__ void spin_forever(const unsigned int* flag, int seq_len) {
    for (;;) {
        unsigned int x;
        asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(x) : "l"(flag) : "memory");
        if ((x & 1u) && seq_len < 0) break;  // never true: seq_len >= 1
        __nanosleep(1000);
    }
}

template <int D>
__device__ __forceinline__ void infinite_fwd(OPTD_ARGS) {
    spin_forever(cta_counter, seq_len);
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d64(OPTD_ARGS) {
    infinite_fwd<64>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_CTA * 32) optd_fwd_d128(OPTD_ARGS) {
    infinite_fwd<128>(OPTD_ARG_NAMES);
    OPTD_CTA_DONE();
}
