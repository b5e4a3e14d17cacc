/******************************************************************************
 * async_copy.cuh: cp.async (sm_80+) global -> shared copies.
 *
 * The templates that keep a ring of K/V tiles in flight issue 16-byte
 * cp.async.cg copies (L2 only, the tiles are read once per CTA), group them
 * per tile with commit_group and wait with wait_group N (all but the N newest
 * groups of this thread have landed; a __syncthreads then publishes them).
 ******************************************************************************/
#ifndef OPTD_ASYNC_COPY_CUH
#define OPTD_ASYNC_COPY_CUH

#ifndef OPTD_COMMON_CUH
#error "include common/optd.cuh before common/async_copy.cuh"
#endif

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 reads nothing and zero-fills the 16 bytes
// (how the templates pad ragged tiles without a branch around the copy).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
// The same copy when the source is known to be in bounds: no source-size operand.
__device__ __forceinline__ void cp_async16_full(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif  // OPTD_ASYNC_COPY_CUH
