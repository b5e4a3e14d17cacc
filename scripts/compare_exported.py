#!/usr/bin/env python3
"""Time the kernels of several exports side by side on one GPU: which run's kernel is faster?
And, with --fa4 / --sdpa, against FlashAttention-4 and SDPA in the same harness.

    python3 scripts/compare_exported.py DIR_A DIR_B [DIR_C ..] [--shapes KEY,..]
    python3 scripts/compare_exported.py DIR --fa4 --sdpa      (one export against the baselines)

Each DIR is an `optimizerd export --out DIR`. For every shape key exported by all of them
(or those of --shapes), each DIR's kernel for it is loaded as examples/run_exported.py loads it
(from the manifest alone), checked against SDPA in fp32 on fresh randn inputs, and timed in the
same process on the same GPU: a CUDA graph of --launches calls per kernel, replayed in
alternating order for --rounds rounds (median per call), then each replayed back to back for
--sustained-ms in six pieces, the kernels taking turns without a gap (the clocks a model step runs
at, the same for all; the median piece). Ratios are to the first DIR. Two runs'
in-run timings of one shape were made at different times, often on different GPUs; this
puts their kernels under the same conditions. Inputs are not rotated: a shape whose Q, K, V
and O fit twice in L2 is flagged, since its times then include warm-L2 reads.

Baselines (issue 19's acceptance: the exported kernels re-timed with a sustained CUDA-graph
harness against FA4 in one process): --fa4 adds FlashAttention-4 (flash_attn.cute, on [B,S,H,D]
copies of the first export's inputs, made before timing; causal is bottom-right as the kernels'),
--sdpa adds SDPA's default backend (enable_gqa for grouped heads, causal_lower_right where
SQ < SK; K/V repeated where the backend refuses enable_gqa). They take their turns in the same
alternating rounds and back-to-back pieces as the exports, and the last table gives, per shape,
each baseline's sustained time over the first export's (above 1: the export is faster).
--fa4 fails when flash_attn.cute does not import (it says why) rather than leaving FA4 out.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys

import cupy as cp
import torch

CHUNKS = 6  # pieces of each kernel's back-to-back time, interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("run_exported", os.path.join(HERE, "..", "examples", "run_exported.py"))
rx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rx)


def kernels_by_key(d):
    """{shape key: (abi, kernel, entry)} of one export folder."""
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    abi = rx.Abi(manifest.get("format", 1))
    out = {}
    for kernel in manifest["kernels"]:
        for entry in kernel["shapes"]:
            out[entry["key"]] = (abi, kernel, entry)
    return out


def graph_of(go, launches):
    """A CUDA graph of `launches` calls of go() (captured after one warm-up call)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        go()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            go()
    return g


def replay_us(g, launches, times=1):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(times):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (launches * times)


def baseline_graphs(sample, shape, dtype, kinds, launches):
    """[(label, graph)] for the requested baselines on the first export's inputs (sample.q, k, v:
    [B,H,S,D] logical tensors), called as the daemon's baseline calls them (sdpa_baseline.py:
    its masks, enable_gqa and the fallbacks when a backend refuses a form)."""
    sys.path.insert(0, HERE)
    import sdpa_baseline as sb  # noqa: E402

    # One fixed input set in sdpa_baseline's Inputs (no rotation, as for the exports).
    inputs = sb.Inputs.__new__(sb.Inputs)
    inputs.torch, inputs.s = torch, sb.normalize(dict(shape, dtype=dtype, layout="bhsd"))
    inputs.sets, inputs.n, inputs.i = [(sample.q, sample.k, sample.v)], 1, 0
    inputs._repeated = inputs._fa4 = inputs._mask = None
    out = []
    if "fa4" in kinds:
        fa4, _, why = sb.load_fa4()
        if fa4 is None:
            sys.exit(f"--fa4: {why} (install it: scripts/device_fa4.py)")
        qkv = inputs.fa4(0)
        causal = inputs.s["causal"] and inputs.s["sq"] > 1  # one query row: bottom-right masks nothing
        out.append(("fa4", graph_of(lambda: fa4(*qkv, causal=causal), launches)))
    if "sdpa" in kinds:
        refused = []
        for kv, mask in sb.attempts(inputs.s):
            try:
                out.append(("sdpa-default", graph_of(sb.sdpa_call(torch, inputs, kv, mask), launches)))
                break
            except Exception as e:  # this form cannot run: the next, as the daemon's baseline does
                torch.cuda.synchronize()
                refused.append(sb.refusal(kv, mask, sb.first_line(e)))
        else:
            sys.exit(f"--sdpa: SDPA default refused every form: {'; '.join(refused)}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--shapes", help="shape keys, comma-separated (default: every key all DIRs export)")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--launches", type=int, default=20, help="calls per graph replay")
    ap.add_argument("--sustained-ms", type=float, default=300.0)
    ap.add_argument("--fa4", action="store_true", help="also time FlashAttention-4 (flash_attn.cute) on each shape")
    ap.add_argument("--sdpa", action="store_true", help="also time SDPA's default backend on each shape")
    args = ap.parse_args()
    kinds = [k for k in ("fa4", "sdpa") if getattr(args, k)]
    if len(args.dirs) < 2 and not kinds:
        ap.error("name at least two export folders, or one with --fa4 and/or --sdpa")
    exports = [kernels_by_key(d) for d in args.dirs]
    keys = args.shapes.split(",") if args.shapes else sorted(set.intersection(*(set(e) for e in exports)))
    missing = [(k, d) for k in keys for d, e in zip(args.dirs, exports) if k not in e]
    if missing:
        sys.exit("not exported: " + "; ".join(f"{k} by {d}" for k, d in missing))
    p = torch.cuda.get_device_properties(0)
    device = {"sms": p.multi_processor_count, "cc": p.major * 10 + p.minor,
              "smem_optin": getattr(p, "shared_memory_per_block_optin", 232448)}
    l2 = getattr(p, "L2_cache_size", 50 << 20)
    driver = rx.Driver()
    print(f"{p.name}, {args.rounds} rounds of {args.launches}-call graphs alternating, then >= {args.sustained_ms:.0f} ms each")
    rows = []
    for key in keys:
        prepared = []
        for d, e in zip(args.dirs, exports):
            abi, kernel, entry = e[key]
            src = open(os.path.join(d, kernel["file"])).read()
            module = cp.RawModule(code=src, options=rx.compile_options(kernel, device), backend="nvrtc")
            shape = abi.shape(entry["shape"])
            max_abs, unwritten, outside, _, _, _ = rx.run_one(abi, module, kernel, entry, shape, device, driver)
            ok = unwritten == 0 and outside == 0 and max_abs <= rx.ATOL.get(kernel["dtype"], 2e-2)
            pr = rx.prepare(abi, module, kernel, entry, shape, device, driver)
            prepared.append((d, kernel["file"], ok, max_abs, pr, graph_of(pr.go, args.launches)))
        sample = prepared[0][4]
        abi0, kernel0, entry0 = exports[0][key]
        for label, graph in baseline_graphs(sample, abi0.shape(entry0["shape"]), kernel0["dtype"], kinds, args.launches):
            prepared.append((label, "-", True, 0.0, None, graph))
        footprint = sum(t.numel() * t.element_size() for t in (sample.q, sample.k, sample.v, sample.o))
        burst = [[] for _ in prepared]
        for r in range(args.rounds):
            order = range(len(prepared)) if r % 2 == 0 else reversed(range(len(prepared)))
            for i in order:
                burst[i].append(replay_us(prepared[i][5], args.launches))
        # Back to back: each kernel replayed for sustained_ms in CHUNKS pieces, the kernels
        # taking turns with no gap between them, so all run at the same (lowered) clocks;
        # timed one after the other instead, identical kernels differed by 3-5%.
        reps = [max(1, int(args.sustained_ms / CHUNKS / max(statistics.median(b) * args.launches / 1000.0, 1e-3))) for b in burst]
        chunks = [[] for _ in prepared]
        for r in range(CHUNKS):
            order = range(len(prepared)) if r % 2 == 0 else reversed(range(len(prepared)))
            for i in order:
                chunks[i].append(replay_us(prepared[i][5], args.launches, reps[i]))
        sustained = [statistics.median(c) for c in chunks]
        for i, (d, f, ok, max_abs, _, _) in enumerate(prepared):
            med = statistics.median(burst[i])
            rows.append((key, d, f, ok, max_abs, med, statistics.median(burst[0]) / med if i else 1.0,
                         sustained[i], sustained[0] / sustained[i] if i else 1.0,
                         footprint * 2 <= l2))
    print(f"{'shape':<34} {'export':<28} {'kernel':<22} {'correct':>8} {'burst us':>9} {'vs first':>8} "
          f"{'sus us':>9} {'vs first':>8}")
    for key, d, f, ok, max_abs, med, ratio, sus, sratio, warm in rows:
        print(f"{key:<34} {os.path.basename(os.path.normpath(d)):<28} {f:<22} {('yes' if ok else 'NO'):>8} "
              f"{med:>9.2f} {ratio:>7.3f}x {sus:>9.2f} {sratio:>7.3f}x" + ("  (fits in L2: warm reads)" if warm else ""))
    print("vs first: the first export's time / this one's (above 1: this one is faster)")
    if kinds:
        labels = {"fa4": "fa4", "sdpa": "sdpa-default"}
        print(f"\n{'shape':<34} " + " ".join(f"{'vs ' + labels[k] + ' burst':>20} {'vs ' + labels[k] + ' sustained':>24}" for k in kinds))
        for key in keys:
            mine = {r[1]: r for r in rows if r[0] == key}
            first = next(r for r in rows if r[0] == key)
            cells = []
            for k in kinds:
                b = mine[labels[k]]
                cells.append(f"{b[5] / first[5]:>19.3f}x {b[7] / first[7]:>23.3f}x")
            print(f"{key:<34} " + " ".join(cells))
        print(f"baseline's time / {os.path.basename(os.path.normpath(args.dirs[0]))}'s (above 1: the export is faster)")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
