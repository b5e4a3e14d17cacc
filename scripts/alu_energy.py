#!/usr/bin/env python3
"""What the softmax's arithmetic costs at the power cap (issue 19): energy per operation of the
exponential on the SFU (MUFU.EX2, how our kernels and FA4 take exp2 on Hopper), of an exponential
emulated on the FMA pipe (a degree-3 polynomial and an exponent shift, the EXP_POLY idea of
docs/HOPPER.md), and of a plain FFMA, measured as scripts/wgmma_energy.py measures the tensor cores.

Sustained runs sit at the 700 W cap, where time per call is energy per call; at (4,16,4096,64) the
tensor cores' arithmetic is ~56% of a call's energy and the rest (exponentials, max and sum,
conversions, rescaling, memory traffic) ~44% (docs/HOPPER.md, "What the tensor cores alone cost at the
power cap"). One exponential per score element: 1.07e9 per call there. Every SM runs 32 warps of
eight independent chains per thread (x <- ex2(-x): MUFU.EX2 and the FADD of the negation, as
an exponential in the kernels follows its FFMA; x <- poly_exp2(-x): FRND, FADD, 3 FFMA, F2I, LEA;
x <- x^2 - 2: one FFMA; bounded, and their bits keep changing); each variant runs back to back for --seconds while nvidia-smi samples
power (as power_probe.py); idle power is sampled first. Printed: operations per second, W, and
pJ per operation above idle.

    python3 scripts/alu_energy.py [--seconds 3] [--rounds 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import power_probe as pp  # noqa: E402

CHAINS = 8
SRC = r'''
__device__ __forceinline__ float ex2_sfu(float x) {
    float y;
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// 2^x for x in [-126, 0]: 2^floor(x) by the exponent field, 2^frac by a degree-3 polynomial
// (max relative error ~1e-4, enough to price the instructions: FRND, FADD, 3 FFMA, F2I, SHF, IADD).
__device__ __forceinline__ float ex2_fma(float x) {
    const float fl = floorf(x);
    const float f = x - fl;
    float p = fmaf(0.0790209f, f, 0.224126f);
    p = fmaf(p, f, 0.696457f);
    p = fmaf(p, f, 1.0f);
    return __int_as_float(__float_as_int(p) + ((int)fl << 23));
}
extern "C" __global__ void __launch_bounds__(1024, 1) alu_loop(int iters, float* sink) {
    float x[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
        unsigned h = (blockIdx.x * 1024u + threadIdx.x) * 2654435761u + c * 40503u;
        h ^= h >> 13;
        x[c] = -(float)(h & 0xffffff) / 16777216.0f;  // [-1, 0)
    }
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
#if OP == 0
            x[c] = ex2_sfu(-x[c]);           // [0.5, 1] -> stays in [0.5, 0.71]
#elif OP == 1
            x[c] = ex2_fma(-x[c]);
#else
            x[c] = fmaf(x[c], x[c], -2.0f);  // x^2 - 2: chaotic in [-2, 2], one FFMA
#endif
        }
    }
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += x[c];
    if (s == 1234.5f) sink[blockIdx.x] = s;
}
'''
OPS = {0: "MUFU ex2+FADD", 1: "exp2 on FMA", 2: "FFMA"}


def source(op: int) -> str:
    return f"#define OP {op}\n#define CHAINS {CHAINS}\n" + SRC


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import cupy as cp

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    kernels = {op: cp.RawModule(code=source(op), backend="nvrtc", options=("--gpu-architecture=sm_90", "-std=c++17",
                                                                             "--use_fast_math"))
               .get_function("alu_loop") for op in OPS}
    sink = cp.zeros(sms, dtype=cp.float32)
    ops_per_iter = sms * 1024 * CHAINS

    def timed(op, iters, n=1):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(n):
            kernels[op]((sms,), (1024,), (cp.int32(iters), sink))
        b.record()
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b) * 1e-3

    runs = []
    with pp.PowerSampler() as sampler:
        idle0 = time.time()
        time.sleep(2.0)
        idle1 = time.time()
        for r in range(args.rounds):
            for op in (list(OPS) if r % 2 == 0 else list(OPS)[::-1]):
                probe = timed(op, 2000)
                iters = max(2000, int(2000 * 5e-3 / max(probe, 1e-6)))  # ~5 ms per launch
                timed(op, iters)
                n = max(1, int(args.seconds / timed(op, iters)))
                t0 = time.time()
                secs = timed(op, iters, n)
                t1 = time.time()
                rate = ops_per_iter * iters * n / secs
                runs.append((op, rate, t0, t1))
                print(f"  {OPS[op]:13} {rate / 1e12:7.3f} Tops/s over {secs:.2f} s", flush=True)
                time.sleep(1.0)
    samples = sampler.samples
    _, idle_w, _, _ = pp.window(samples, idle0, idle1)
    print(f"\n{len(samples)} nvidia-smi samples; idle {idle_w:.0f} W; per run, its last 75%:")
    print(f"{'operation':13} {'Tops/s':>8} {'SM MHz':>7} {'W':>6} {'pJ/op above idle':>17} {'reasons':>8}")
    per = {}
    for op, rate, t0, t1 in runs:
        mhz, w, reasons, _ = pp.window(samples, t0, t1)
        pj = (w - idle_w) / rate * 1e12
        per.setdefault(op, []).append(pj)
        print(f"{OPS[op]:13} {rate / 1e12:8.3f} {mhz:7.0f} {w:6.0f} {pj:17.2f} {reasons:#8x}")
    print("\nmedians, pJ per operation above idle: " + ", ".join(f"{OPS[op]} {statistics.median(v):.2f}" for op, v in per.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
