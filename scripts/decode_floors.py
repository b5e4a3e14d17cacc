#!/usr/bin/env python3
"""Floors for small decode on the GPU (issue 17): an empty kernel's time per launch in a CUDA
graph of back-to-back launches, and a plain streaming read of N MB (uint4 loads, grid-stride) with
G CTAs, from rotating buffers (cold L2) and from one buffer (hot L2), each thread one 16-byte load
in flight (`read`) or eight (`read8`: eight independent loads per step, the bytes in flight of a
decode CTA's cp.async ring). The sizes are the decode shapes' K/V bytes: 4.2 MB (Llama-3 B 1 x SK
1024), 16.8 MB (B 1 x SK 4096; MQA B 8 x SK 4096), 134 MB (B 8 x SK 4096). What a decode kernel
reading the same bytes cannot beat without more memory-level parallelism. Needs cupy.

    python3 scripts/decode_floors.py
"""
import statistics

import cupy as cp
src = r'''
extern "C" __global__ void empty_k(int x) { if (x == 12345) asm volatile("trap;"); }
extern "C" __global__ void read_k(const uint4* __restrict__ p, long long n, unsigned* out) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    uint4 v = __ldg(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" __global__ void read8_k(const uint4* __restrict__ p, long long n, unsigned* out) {
  unsigned acc = 0;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += 8 * step) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = i + u * step < n ? __ldg(p + i + u * step) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
'''
mod = cp.RawModule(code=src, options=("-std=c++17",))
empty = mod.get_function("empty_k"); read = mod.get_function("read_k"); read8 = mod.get_function("read8_k")
out = cp.zeros(1, dtype=cp.uint32)
def time_graph(launch, reps=20, samples=30):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        launch(0); s.synchronize()
        s.begin_capture()
        for r in range(reps): launch(r)
        g = s.end_capture(); g.upload(s)
        for _ in range(3): g.launch(s)
        ts = []
        for _ in range(samples):
            a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(s); g.launch(s); b.record(s); b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1000 / reps)
    return statistics.median(ts)
print(f"empty kernel, graph of 20: {time_graph(lambda r: empty((1,), (32,), (cp.int32(0),))):.2f} us")
print(f"empty kernel 128 CTAs x 256: {time_graph(lambda r: empty((128,), (256,), (cp.int32(0),))):.2f} us")
for nbytes in (1 << 22, 1 << 24, 1 << 27):
    mb = nbytes / 1e6
    n16 = nbytes // 16
    nbuf = max(2, min(16, int(160 // mb)))
    bufs = [cp.ones(n16 * 4, dtype=cp.uint32) for _ in range(nbuf)]
    row = []
    for G in (64, 128, 132, 264, 528, 1056):
        for name, k in (("read", read), ("read8", read8)):
            T = 256
            cold = time_graph(lambda r: k((G,), (T,), (bufs[r % nbuf], cp.int64(n16), out)), reps=nbuf * 2)
            hot = time_graph(lambda r: k((G,), (T,), (bufs[0], cp.int64(n16), out)))
            row.append(f"{name:<5} G{G}: cold {cold:6.2f} us ({nbytes/cold/1e6:4.2f} TB/s) hot {hot:6.2f}")
    print(f"read {mb:.1f} MB ({nbuf} rotating buffers):\n   " + "\n   ".join(row))
    del bufs
