#!/usr/bin/env python3
"""PyTorch SDPA timings for optimizerd's workload shapes, measured like the candidates.

optimizerd runs this (command: `baseline.sdpa_command` in agent.toml) and records the
result per shape in the ledger, so each run reports its kernels against SDPA on the same
GPU, the same day.

    sdpa_baseline.py --versions            -> {"torch": ..., "cuda": ..., "cudnn": ..., "device": ...}
    sdpa_baseline.py --shapes SHAPES.json  -> {"versions": {...}, "results": [...]}

SHAPES.json: [{"b":1,"h":1,"s":128,"d":64,"causal":false,"dtype":"fp16"}, ...]
For each shape and backend (default, flash, cudnn, efficient; one that cannot run is
reported with its error):
  graph_us  GPU time per call: a CUDA graph of `calls` back-to-back calls, median of
            `replays` replays, divided by `calls`. With --target-us T (the daemon passes
            its timing.sample_target_us) `calls` is chosen per shape and backend so that
            one replay lasts about T, as long as one timed sample of a candidate: a long
            graph runs the GPU hotter, at lower clocks, than the candidates' samples;
  calls     the calls per graph that were used;
  eager_us  CUDA events around `calls` back-to-back Python calls (includes CPU dispatch);
  picked    for `default`: the backend whose kernels ran (from torch.profiler).
Inputs: fresh randn (never zeros), rotated over several sets when one set fits in L2.
Exit status 0 with JSON on stdout; errors go to stderr.
"""
import argparse
import json
import statistics
import sys


def versions(torch):
    dev = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": dev.name if dev else None,
        "cc": f"{dev.major}.{dev.minor}" if dev else None,
    }


BACKENDS = ["default", "flash", "cudnn", "efficient"]


def backend_ctx(torch, name):
    from contextlib import nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return {
        "default": nullcontext(),
        "flash": sdpa_kernel(SDPBackend.FLASH_ATTENTION),
        "cudnn": sdpa_kernel(SDPBackend.CUDNN_ATTENTION),
        "efficient": sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION),
    }[name]


def picked_backend(torch, fn):
    """Name the SDPA backend from the kernels one call launches."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    if "cudnn" in names:
        return "cudnn"
    if "flash" in names:
        return "flash"
    if "fmha" in names or "cutlassf" in names or "efficient" in names:
        return "efficient"
    return "math"


def calls_for(torch, call, target_us, fallback):
    """Calls per graph so that one replay lasts about target_us (eager estimate)."""
    if target_us <= 0:
        return fallback
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        call()
    end.record()
    end.synchronize()
    per_call = max(start.elapsed_time(end) * 1000.0 / 3, 1e-3)
    return max(1, min(1000, round(target_us / per_call)))


def time_shape(torch, shape, calls, replays, l2_bytes, target_us=0.0):
    F = torch.nn.functional
    dtype = torch.bfloat16 if shape.get("dtype") == "bf16" else torch.float16
    b, h, s, d, causal = shape["b"], shape["h"], shape["s"], shape["d"], bool(shape.get("causal"))
    set_bytes = 4 * b * h * s * d * 2
    n_sets = max(1, min(16, (3 * l2_bytes) // max(set_bytes, 1)))
    sets = [[torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3)] for _ in range(n_sets)]
    out = {"input_sets": n_sets}
    for name in BACKENDS:
        try:
            with backend_ctx(torch, name):
                i = [0]

                def call():
                    q, k, v = sets[i[0] % n_sets]
                    i[0] += 1
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                for _ in range(5):
                    call()
                torch.cuda.synchronize()
                n_calls = calls_for(torch, call, target_us, calls)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                eager = []
                for _ in range(5):
                    start.record()
                    for _ in range(n_calls):
                        call()
                    end.record()
                    end.synchronize()
                    eager.append(start.elapsed_time(end) * 1000.0 / n_calls)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        call()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(n_calls):
                        call()
                graph.replay()
                torch.cuda.synchronize()
                g = []
                for _ in range(replays):
                    start.record()
                    graph.replay()
                    end.record()
                    end.synchronize()
                    g.append(start.elapsed_time(end) * 1000.0 / n_calls)
                entry = {"graph_us": statistics.median(g), "eager_us": statistics.median(eager), "calls": n_calls}
                if name == "default":
                    entry["picked"] = picked_backend(torch, call)
                out[name] = entry
        except Exception as e:  # a backend that cannot run this shape
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
        torch.cuda.synchronize()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", action="store_true")
    ap.add_argument("--shapes")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--target-us", type=float, default=0.0,
                    help="size each graph to last about this long (0: --calls per graph)")
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:
        print(f"torch is not importable: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 2
    v = versions(torch)
    if args.versions:
        print(json.dumps(v))
        return 0
    shapes = json.load(open(args.shapes))
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 1024 * 1024)
    results = []
    for shape in shapes:
        r = time_shape(torch, shape, args.calls, args.replays, l2, args.target_us)
        r["shape"] = shape
        results.append(r)
        torch.cuda.empty_cache()
    print(json.dumps({"versions": v, "method": {"calls": args.calls, "replays": args.replays, "target_us": args.target_us,
                                               "graph": "median replay of a CUDA graph of `calls` calls / calls",
                                               "eager": "CUDA events around `calls` Python calls / calls, median of 5"},
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
