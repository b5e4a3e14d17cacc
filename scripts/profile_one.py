#!/usr/bin/env python3
"""Run one kernel (a template at given knobs) or one SDPA backend on one shape a few
times, for a profiler to attach to. Nothing is printed but what ran; the numbers come
from the profiler, e.g. on the GPU machine:

    ncu --clock-control none --set full -k regex:optd_fwd --launch-skip 2 --launch-count 1 \\
        python3 scripts/profile_one.py mma_fa2.cu "BLOCK_N=64,NUM_WARPS=4,STAGES=2,SWIZZLE=1,KV_WARPS=1" 2,16,8192,128
    ncu --clock-control none --set full -k regex:flash --launch-skip 2 --launch-count 1 \\
        python3 scripts/profile_one.py sdpa flash 2,16,8192,128
    ncu --clock-control none --profile-from-start off --launch-count 1 \\
        python3 scripts/profile_one.py fa4 - 4,16,4096,64

Every mode runs its call once first (FA4 JIT-compiles then), then calls cudaProfilerStart and
runs it --runs times: with `--profile-from-start off` the first kernel profiled is the first
launch of the measured calls, whatever its name. `fa4`: FlashAttention-4 (flash_attn.cute) on
[B,S,H,D] contiguous copies of the inputs, made before the profiled range.

Shape: B,H,S,D[,causal] (MHA, SQ = SK) or B,HQ,HKV,SQ,SK,D[,causal] (GQA, decode, chunked
prefill; bhsd), and `,w1024` after causal for a sliding window of 1024 keys. fp16, randn inputs. Needs torch and cupy (as
scripts/check_templates_gpu.py, whose renderer and launch planner this reuses).
"""
import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_templates_gpu import Gpu, gqa, mha, plan, sdpa_fn  # noqa: E402
from nvrtc_compile_check import load_templates  # noqa: E402


def parse_shape(text: str):
    parts = [x.strip() for x in text.split(",")]
    n = 6 if len(parts) >= 6 and parts[5].isdigit() else 4
    dims = [int(x) for x in parts[:n]]
    flags = [x.lower() for x in parts[n:]]
    causal = any(f in ("1", "causal", "true") for f in flags)
    # wN: a sliding window of N keys (causal only), as the daemon's `-w1024` key suffix.
    window = next((int(f[1:]) for f in flags if f.startswith("w") and f[1:].isdigit()), 0)
    shape = gqa(*dims, causal) if n == 6 else mha(*dims, causal)
    return dataclasses.replace(shape, window=window) if window else shape


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", help="a template file/name, `sdpa` or `fa4`")
    ap.add_argument("config", help="knobs K=V,K=V (template) or default|flash|cudnn|efficient (sdpa)")
    ap.add_argument("shape", help="B,H,S,D[,causal] or B,HQ,HKV,SQ,SK,D[,causal]")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cubin-dir", help="precompiled cubins (see check_templates_gpu.py --build-cubins)")
    args = ap.parse_args()
    shape = parse_shape(args.shape)
    gpu = Gpu()
    if args.cubin_dir:
        gpu.cubin_dir = Path(args.cubin_dir)
    torch = gpu.torch

    def profiled(call, what: str) -> int:
        call()  # warm-up (FA4: JIT compile), outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for _ in range(args.runs):
            call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"ran {what} on {shape} x{args.runs}")
        return 0

    if args.what == "fa4":
        from flash_attn.cute import flash_attn_func
        q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
        qkv = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
        causal = shape.causal and shape.sq > 1
        return profiled(lambda: flash_attn_func(*qkv, causal=causal), "FlashAttention-4")
    if args.what == "sdpa":
        q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION}
        call = sdpa_fn(gpu, shape, q, k, v)

        def run():
            if args.config == "default":
                call()
            else:
                with sdpa_kernel(backends[args.config]):
                    call()
        return profiled(run, f"sdpa {args.config}")
    tpl = next(t for t in load_templates() if args.what in (t.rel, t.name, Path(t.rel).name))
    knobs = dict(tpl.knob_combos()[0])
    for kv in filter(None, args.config.split(",")):
        key, val = kv.split("=")
        if key not in knobs:
            raise SystemExit(f"{tpl.rel} has no knob {key} (knobs: {', '.join(knobs)})")
        knobs[key] = int(val)
    splits, launches, _ = plan(tpl, knobs, shape, gpu.dev)
    mod = gpu.module(tpl, knobs, False, count=False)
    q, k, v, o, o_part, lse, _ = gpu.buffers(shape, splits, "fp16", fill=0.0, need_ref=False)
    # The check script's launch path: tensor maps (Hopper templates) are encoded on these buffers.
    kargs = gpu.launch_args(shape, splits, launches, q, k, v, o, o_part, lse)
    kernels = [gpu.prepare(mod, l) for l in launches]

    def run():
        for kern in kernels:
            gpu.launch(kern, kargs)
        gpu.cp.cuda.Device().synchronize()
    return profiled(run, f"{tpl.rel} {knobs}: {[(l['kernel'], l['grid'], l['block'], l['smem']) for l in launches]}")


if __name__ == "__main__":
    sys.exit(main())
