/******************************************************************************
 * cluster.cuh: distributed shared memory and cluster barriers (sm_90), for the
 * templates whose CTAs work in thread-block clusters (decode-cluster's KV
 * splits, wgmma-tma's CLUSTER_SPLIT).
 *
 *   cluster_ctarank()          this CTA's rank in its cluster
 *   dsmem_map()                the same shared-memory address in another CTA
 *   dsmem_ld_* / dsmem_st_*    loads and stores there (ld/st.shared::cluster)
 *   dsmem_st_async_*()         asynchronous stores there, counted as bytes on
 *                              that CTA's mbarrier (st.async ... complete_tx)
 *   dsmem_bulk_copy()          a bulk copy of this CTA's shared memory there
 *   dsmem_mbar_arrive()        an arrive on that CTA's mbarrier, release at
 *                              cluster scope
 *   cluster_mbar_wait()        a parity wait on this CTA's mbarrier, acquire at
 *                              cluster scope (what another CTA stored before
 *                              arriving, or its st.async bytes, are visible)
 *   cluster_sync()             every thread of every CTA of the cluster
 *   cluster_combine_chunk()    4 columns of a row merged over the cluster's KV
 *                              splits by their LSEs (decode-cluster, decode-wgmma)
 *
 * A CTA must not exit while another may still access its shared memory: the
 * callers' protocols say why each access ends before its target CTA does.
 ******************************************************************************/
#ifndef OPTD_CLUSTER_CUH
#define OPTD_CLUSTER_CUH

#include "common/online_softmax.cuh"

__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// The address of the same shared-memory location in the cluster's CTA `rank`.
__device__ __forceinline__ unsigned dsmem_map(unsigned addr, unsigned rank) {
    unsigned out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
    return out;
}
__device__ __forceinline__ float dsmem_ld_f32(unsigned addr) {
    float x;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x) : "r"(addr) : "memory");
    return x;
}
__device__ __forceinline__ float4 dsmem_ld_f32x4(unsigned addr) {
    float4 x;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                 : "r"(addr)
                 : "memory");
    return x;
}
// Every thread of every CTA of the cluster; writes before it are visible to
// reads after it, cluster-wide.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void dsmem_st_f32(unsigned addr, float x) {
    asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ void dsmem_st_f32x4(unsigned addr, float4 x) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(x.x), "f"(x.y), "f"(x.z),
                 "f"(x.w)
                 : "memory");
}
// Arrive on an mbarrier of another CTA of the cluster (`addr` from dsmem_map);
// release at cluster scope: this thread's stores before it are visible to the
// waiter's acquire.
__device__ __forceinline__ void dsmem_mbar_arrive(unsigned addr) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
// COMBINE = 2: an asynchronous store into another CTA's shared memory (`addr` and
// `bar` from dsmem_map) that counts its bytes on that CTA's mbarrier `bar`.
__device__ __forceinline__ void dsmem_st_async_f32x4(unsigned addr, float4 x, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr),
                 "f"(x.x), "f"(x.y), "f"(x.z), "f"(x.w), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void dsmem_st_async_f32(unsigned addr, float x, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];\n" ::"r"(addr), "f"(x),
                 "r"(bar)
                 : "memory");
}
// COMBINE = 3: `bytes` (a multiple of 16, both addresses 16-byte aligned) of this CTA's shared
// memory at `src` copied by the bulk-copy (TMA) engine into another CTA's at `dst`, counted on
// that CTA's mbarrier `bar` (`dst` and `bar` from dsmem_map). The engine reads `src` after the
// call returns: the writes it reads must be ordered before it by fence_proxy_async_cta() and a
// barrier, and `src` must stay this CTA's until the copy has landed (the receiver's mbarrier
// completes).
__device__ __forceinline__ void dsmem_bulk_copy(unsigned dst, unsigned src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "r"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
// This thread's shared-memory writes, visible to the asynchronous proxy (the bulk copies).
__device__ __forceinline__ void fence_proxy_async_cta() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// A chunk (4 columns of a packed row) combined over N KV splits and returned
// normalized: O = sum_z w_z O_z / sum_z w_z with w_z = exp(lse_z - max_z lse_z).
// A split that saw no key of the row has LSE -inf, weight 0 and a zero row (never
// NaN); a row no split saw is 0. chunk_at(z) gives split z's float4 (its shared
// memory, or another rank's copy received into this one's).
template <int N, typename ChunkAt>
__device__ __forceinline__ float4 cluster_combine_chunk(const float (&lse)[N], ChunkAt chunk_at) {
    float m = OPTD_NEG_INF;
#pragma unroll
    for (int z = 0; z < N; ++z) m = fmaxf(m, lse[z]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
    if (m != OPTD_NEG_INF) {
#pragma unroll
        for (int z = 0; z < N; ++z) {
            const float w = fast_exp2((lse[z] - m) * OPTD_LOG2E);
            const float4 x = chunk_at(z);
            wsum += w;
            acc.x = fmaf(w, x.x, acc.x);
            acc.y = fmaf(w, x.y, acc.y);
            acc.z = fmaf(w, x.z, acc.z);
            acc.w = fmaf(w, x.w, acc.w);
        }
    }
    // wsum >= 1 (the largest LSE weighs 1): the fast reciprocal, no IEEE slow path.
    const float inv = wsum > 0.f ? __fdividef(1.f, wsum) : 0.f;
    return make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

#endif  // OPTD_CLUSTER_CUH
