#!/usr/bin/env python3
"""What an operand in shared memory costs under the power cap (issue 19): wgmma with A from shared
memory (SS, how our kernels and FA4 issue S = Q K^T) against A from registers (RS, how both issue
O += P V), nothing else in the loop.

Issue 19's bar is sustained timing, where the H100 runs at its 700 W cap and time per call is
energy per call over 700 W (docs/HOPPER.md, "Sustained timing is power-capped"). Our kernels and
FA4 issue the same HGMMAs; whether the shared-memory reads behind each operand are a part of that
energy worth removing (Q held in registers for Q K^T, which would also free its shared-memory slot)
is what this measures first, before any template change. Every CTA (one per SM, WARPGROUPS
warpgroups) loops m64n128k16 wgmmas over K = 64 (four k-steps per group, one group in flight
behind the next) on tiles in its own shared memory: SS reads A (64 x 16) and B (128 x 16) per
wgmma from shared memory, RS reads B only (A: four registers per thread). No global memory. The
operands of both hold bits of the same statistics (random sign and mantissa), since the tensor
cores' power depends on the bits they toggle; --pattern 1 makes every operand 1.0 instead.

Per variant: burst (one launch of ~2 ms, CUDA events) and sustained (back to back for --seconds
while nvidia-smi samples SM clock, power and the clock-limit reasons every 50 ms, as
scripts/power_probe.py does): TFLOPS, and pJ per FLOP = W / (FLOP/s) over the last 75% of the
sustained run. Rounds alternate SS and RS.

    python3 scripts/wgmma_energy.py [--seconds 3] [--rounds 2] [--warpgroups 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import power_probe as pp  # noqa: E402  (nvidia-smi sampling; imports no GPU library)

KERNEL = r'''
// Two bf16 of random sign and mantissa, magnitude 1..2 (a hash of i): the tensor cores' power
// depends on how many operand bits toggle, so both variants feed bits of the same statistics
// (PATTERN 0), or all operands are 1.0 (PATTERN 1: no toggling, the operand path alone).
__device__ __forceinline__ unsigned rnd2(unsigned i) {
    if (PATTERN == 1) return 0x3f803f80u;
    unsigned h = i * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (h & 0x807f807fu) | 0x3f803f80u;
}
// WARPGROUPS x 128 threads; tiles A (64 x 64, 8 KB) and B (128 x 64, 16 KB) of 2-byte elements in the
// 128-byte swizzled layout wgmma reads.
extern "C" __global__ void __launch_bounds__(WARPGROUPS * 128, 1) wgmma_loop(int iters, float* sink) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = smem_addr(smem);
    for (int i = threadIdx.x; i < (8192 + 16384) / 4; i += blockDim.x)
        reinterpret_cast<unsigned*>(smem)[i] = rnd2((unsigned)i);
    __syncthreads();
    const unsigned long long da = smem_desc_kmajor(base);
#if RS
    const unsigned long long db = smem_desc_mnmajor(base + 8192, 64 * 128);
    unsigned a[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[kk][e] = rnd2(100000u + (threadIdx.x % 128) * 16u + kk * 4u + e);
#else
    const unsigned long long db = smem_desc_kmajor(base + 8192);
#endif
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    for (int it = 0; it < iters; ++it) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#if RS
            wgmma_rs_n128(d, a[kk], desc_advance(db, kk * 16 * 128));
#else
            wgmma_ss_n128(d, desc_advance(da, kk * 32), desc_advance(db, kk * 32), 1);
#endif
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    reg_fence(d);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += d[i];
    if (s == 1234.5f) sink[blockIdx.x] = s;  // never true for these inputs; keeps the loop
}
'''


def source(rs: bool, warpgroups: int, pattern: int = 0) -> str:
    """The kernel with the template headers pasted in front (they include nothing themselves)."""
    common = ROOT / "kernel-templates" / "common"
    return (f"#define OPTD_BF16 1\n#define RS {int(rs)}\n#define WARPGROUPS {warpgroups}\n#define PATTERN {pattern}\n"
            + (common / "hopper.cuh").read_text() + (common / "wgmma_ops.cuh").read_text() + KERNEL)


FLOP_PER_ITER_WG = 4 * 2 * 64 * 128 * 16  # four m64n128k16 per warpgroup and iteration


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warpgroups", type=int, default=3)
    ap.add_argument("--pattern", type=int, choices=(0, 1), default=0,
                    help="operand bits: 0 random sign and mantissa (default), 1 all 1.0")
    args = ap.parse_args()
    import cupy as cp

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    kernels = {}
    for v in ("SS", "RS"):
        mod = cp.RawModule(code=source(v == "RS", args.warpgroups, args.pattern), backend="nvrtc",
                           options=("--gpu-architecture=sm_90a", "-std=c++17"))
        k = mod.get_function("wgmma_loop")
        k.max_dynamic_shared_size_bytes = 8192 + 16384 + 1024
        kernels[v] = k
    sink = cp.zeros(sms, dtype=cp.float32)
    threads, smem = args.warpgroups * 128, 8192 + 16384 + 1024
    flop_per_iter = FLOP_PER_ITER_WG * args.warpgroups * sms

    def launch(v, iters):
        kernels[v]((sms,), (threads,), (cp.int32(iters), sink), shared_mem=smem)

    def timed(v, iters, n=1):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(n):
            launch(v, iters)
        b.record()
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b) * 1e-3  # seconds

    # ~2 ms per launch at the burst rate.
    probe = timed("SS", 1000)
    iters = max(1000, int(1000 * 2e-3 / max(probe, 1e-6)))
    print(f"{name}, {sms} CTAs x {args.warpgroups} warpgroups, operand pattern {args.pattern}, {iters} iterations per launch "
          f"({flop_per_iter * iters / 1e9:.1f} GFLOP)", flush=True)

    runs = []  # (variant, burst TFLOPS, sustained TFLOPS, start, end)
    with pp.PowerSampler() as sampler:
        for r in range(args.rounds):
            for v in (("SS", "RS") if r % 2 == 0 else ("RS", "SS")):
                timed(v, iters)  # warm
                burst = flop_per_iter * iters / timed(v, iters) / 1e12
                n = max(1, int(args.seconds / (flop_per_iter * iters / (burst * 1e12))))
                t0 = time.time()
                secs = timed(v, iters, n)
                t1 = time.time()
                sustained = flop_per_iter * iters * n / secs / 1e12
                runs.append((v, burst, sustained, t0, t1))
                print(f"  {v}: burst {burst:6.1f} TFLOPS, sustained {sustained:6.1f} TFLOPS over {secs:.2f} s", flush=True)
                time.sleep(1.0)
    samples = sampler.samples
    print(f"\n{len(samples)} nvidia-smi samples; per sustained run, its last 75%:")
    print(f"{'variant':8} {'burst TFLOPS':>12} {'sus TFLOPS':>10} {'SM MHz':>7} {'W':>6} {'pJ/FLOP':>8} {'reasons':>8}")
    per = {}
    for v, burst, sus, t0, t1 in runs:
        mhz, w, reasons, _ = pp.window(samples, t0, t1)
        pj = w / (sus * 1e12) * 1e12
        per.setdefault(v, []).append((burst, sus, mhz, w, pj))
        print(f"{v:8} {burst:12.1f} {sus:10.1f} {mhz:7.0f} {w:6.0f} {pj:8.3f} {reasons:#8x}")
    med = {v: [statistics.median(x[i] for x in rows) for i in range(5)] for v, rows in per.items()}
    if "SS" in med and "RS" in med:
        print(f"\nRS / SS (medians): burst {med['RS'][0] / med['SS'][0]:.3f}, sustained {med['RS'][1] / med['SS'][1]:.3f}, "
              f"energy per FLOP {med['RS'][4] / med['SS'][4]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
