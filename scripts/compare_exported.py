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
--sustained-ms in six pieces, the kernels taking turns without a gap, in cyclic order (the clocks a
model step runs at, the same for all; the median piece), then each alone for --own-ms per window, two windows in
cyclic order ("own": at the clocks its own power draw allows, as the daemon's closing
comparison times each kernel, sdpa_baseline.sustained; 0 leaves it out). The two differ where the
kernels draw different power: at chunked prefill on the H200 (2026-11-28) FA4 ran 51.6 us in
50-ms turns beside an exported kernel and SDPA, but 56.9 us in the daemon's 200-ms windows of its own.
Ratios are to the first DIR. Two runs'
in-run timings of one shape were made at different times, often on different GPUs; this
puts their kernels under the same conditions.

Inputs rotate as the daemon's timing rotates them (scripts/sdpa_baseline.py's Inputs):
min(16, 3 L2 / the bytes of one call's Q, K, V and O) fresh input sets per kernel, a graph's
calls taking them in turn, so that a shape that fits in L2 still reads its K/V cache from
HBM, as a model's layer does. --warm keeps one set (the harness before 2026-11-28): every
call then finds its inputs in L2, and a shape whose Q, K, V and O fit twice in L2 is flagged.
(At chunked prefill on the H200 warm inputs moved FA4 by 2-3%: docs/BENCHMARKS.md 2026-11-28 (19).)

Baselines (issue 19's acceptance: the exported kernels re-timed with a sustained CUDA-graph
harness against FA4 in one process): --fa4 adds FlashAttention-4 (flash_attn.cute, on [B,S,H,D]
copies of the first export's inputs, made before timing; causal is bottom-right as the kernels'),
--sdpa adds SDPA's default backend (enable_gqa for grouped heads, causal_lower_right where
SQ < SK; K/V repeated where the backend refuses enable_gqa). They take their turns in the same
alternating rounds and back-to-back pieces as the exports, and the last table gives, per shape,
each baseline's sustained time over the first export's (above 1: the export is faster).
--fa4 fails when flash_attn.cute does not import (it says why) rather than leaving FA4 out.
Sliding windows (manifest format 3, a shape's "window": W): the exports' kernels get the ABI's
window, their check's reference applies it, FA4 runs with window_size = (W - 1, 0) and causal
(sdpa_baseline.fa4_mask_args), SDPA with the window's boolean mask (mask "window"), as the
daemon's baseline calls them; a windowed shape whose kernel's entry says "windows": false is
refused (that kernel ignores the window).

--layer: for decode shapes (SQ <= 16), also each kernel as a model's decode step runs it, between
its layer's two weight GEMMs: a graph of --launches layers [x W_qkv, attention, x W_o] (the
projections of the shape's heads: hidden = HQ * D, W_qkv hidden x (HQ + 2 HKV) D, W_o hidden x
hidden, in the kernels' dtype, enough weight sets rotating to read them from HBM), alternating
rounds with a graph of the GEMMs alone; a kernel's cost in the layer is the median over rounds of
its layer's time minus the GEMMs-only layer's. Back to back, a call follows a call of itself;
here it follows a cuBLAS GEMM, and its inputs are no longer in L2 (scripts/decode_pdl.py measured
SDPA 0.6-1.3 us slower this way and our decode kernels not: BENCHMARKS 2026-11-28 (16)).
"""
import argparse
import importlib.util
import json
import math
import os
import statistics
import sys

import torch

CHUNKS = 6  # pieces of each kernel's back-to-back time, interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
rx = None  # examples/run_exported.py, loaded by main (load_run_exported)


def load_run_exported():
    """examples/run_exported.py as a module. It imports CuPy, so main loads it: the bookkeeping
    here (turn order, input sets) then imports on a machine without a GPU, for its tests."""
    spec = importlib.util.spec_from_file_location("run_exported", os.path.join(HERE, "..", "examples", "run_exported.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def input_sets(footprint, l2, warm):
    """Input sets a kernel rotates over: the daemon's rule (sdpa_baseline.Inputs), enough for
    three times L2, at most 16; one with --warm."""
    return 1 if warm else max(1, min(16, (3 * l2) // max(footprint, 1)))


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


def cyclic(n, r):
    """Turn r's order of n kernels: 0 1 2, 1 2 0, 2 0 1, .. : turn r ends with r - 1 and the next
    starts with r + 1, so no kernel runs twice in a row (for n = 2 that needs 0 1, 0 1, ..)."""
    return [0, 1] if n == 2 else [(i + r) % n for i in range(n)]


def rotating(calls):
    """One call that runs calls[0], calls[1], .. in turn, a set per call (captured into a graph,
    the graph's calls take the sets in that order)."""
    if len(calls) == 1:
        return calls[0]
    turn = [0]

    def go():
        calls[turn[0] % len(calls)]()
        turn[0] += 1
    return go


def baseline_calls(samples, shape, dtype, kinds, launches):
    """[(label, call)] for the requested baselines on the first export's input sets (each sample's
    q, k, v: [B,H,S,D] logical tensors; the call takes them in turn), called as the daemon's
    baseline calls them (sdpa_baseline.py: its masks, enable_gqa and the fallbacks when a
    backend refuses a form)."""
    sys.path.insert(0, HERE)
    import sdpa_baseline as sb  # noqa: E402

    # The first export's input sets in sdpa_baseline's Inputs: every kernel reads the same data.
    inputs = sb.Inputs.__new__(sb.Inputs)
    wire = {k: v for k, v in shape.items() if k != "window" or v}  # `window` only when windowed
    inputs.torch, inputs.s = torch, sb.normalize(dict(wire, dtype=dtype, layout="bhsd"))
    inputs.sets, inputs.n, inputs.i = [(x.q, x.k, x.v) for x in samples], len(samples), 0
    inputs._repeated = inputs._fa4 = inputs._mask = None
    out = []
    if "fa4" in kinds:
        fa4, _, why = sb.load_fa4()
        if fa4 is None:
            sys.exit(f"--fa4: {why} (install it: scripts/device_fa4.py)")
        # causal (not for one query row: bottom-right masks nothing), and a window as window_size
        kw = sb.fa4_mask_args(inputs.s)
        go = rotating([(lambda qkv: lambda: fa4(*qkv, **kw))(inputs.fa4(j)) for j in range(inputs.n)])
        graph_of(go, launches)  # captures (and so checks) it here, as each form of SDPA below
        out.append(("fa4", go))
    if "sdpa" in kinds:
        refused = []
        for kv, mask in sb.attempts(inputs.s):
            try:
                # sdpa_call takes the next set on each call (Inputs.next_index), as in the daemon.
                go = sb.sdpa_call(torch, inputs, kv, mask)
                graph_of(go, launches)
                out.append(("sdpa-default", go))
                break
            except Exception as e:  # this form cannot run: the next, as the daemon's baseline does
                torch.cuda.synchronize()
                refused.append(sb.refusal(kv, mask, sb.first_line(e)))
        else:
            sys.exit(f"--sdpa: SDPA default refused every form: {'; '.join(refused)}")
    return out


class Layer:
    """A decoder layer's two weight GEMMs around an attention call (--layer): x [B * SQ, hidden]
    @ W_qkv [hidden, (HQ + 2 HKV) D] before, @ W_o [hidden, hidden] after, hidden = HQ * D, with
    enough weight sets (rotating call by call) that every GEMM reads its weights from HBM."""

    def __init__(self, shape, dtype, l2_bytes):
        hidden = shape["hq"] * shape["d"]
        qkv = (shape["hq"] + 2 * shape["hkv"]) * shape["d"]
        rows = shape["b"] * shape["sq"]
        tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
        per_set = (hidden * qkv + hidden * hidden) * 2
        self.n = max(2, math.ceil(3 * l2_bytes / per_set))
        mk = lambda *dims: [torch.randn(*dims, device="cuda", dtype=tdt) * 0.02 for _ in range(self.n)]  # noqa: E731
        self.x, self.wq, self.wo = mk(rows, hidden), mk(hidden, qkv), mk(hidden, hidden)
        self.yq = [torch.empty(rows, qkv, device="cuda", dtype=tdt) for _ in range(self.n)]
        self.yo = [torch.empty(rows, hidden, device="cuda", dtype=tdt) for _ in range(self.n)]
        self.i = 0

    def around(self, attention):
        """A call of one layer with `attention` (None: the GEMMs alone) between the GEMMs."""
        def go():
            j = self.i % self.n
            self.i += 1
            torch.mm(self.x[j], self.wq[j], out=self.yq[j])
            if attention is not None:
                attention()
            torch.mm(self.x[j], self.wo[j], out=self.yo[j])
        return go


def layer_costs(per_round, none_key):
    """{label: median over rounds of (layer time - GEMMs-only layer time)}: per_round maps each
    label (and none_key) to its per-round times, taken in the same rounds."""
    base = per_round[none_key]
    return {k: statistics.median(a - b for a, b in zip(v, base)) for k, v in per_round.items() if k != none_key}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--shapes", help="shape keys, comma-separated (default: every key all DIRs export)")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--launches", type=int, default=20, help="calls per graph replay")
    ap.add_argument("--sustained-ms", type=float, default=300.0)
    ap.add_argument("--own-ms", type=float, default=200.0,
                    help="each kernel alone, back to back, per window (two windows; 0: not timed)")
    ap.add_argument("--fa4", action="store_true", help="also time FlashAttention-4 (flash_attn.cute) on each shape")
    ap.add_argument("--sdpa", action="store_true", help="also time SDPA's default backend on each shape")
    ap.add_argument("--warm", action="store_true",
                    help="one input set per kernel (no rotation): shapes that fit in L2 read warm inputs")
    ap.add_argument("--layer", action="store_true",
                    help="decode shapes (SQ <= 16): also time each kernel between its layer's weight GEMMs")
    args = ap.parse_args()
    import cupy as cp  # the GPU from here on

    global rx
    rx = load_run_exported()
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
    print(f"{p.name}, {args.rounds} rounds of {args.launches}-call graphs alternating, then >= {args.sustained_ms:.0f} ms each; "
          + ("one input set per kernel (--warm)" if args.warm else "inputs rotated as the daemon's timing rotates them"))
    rows, layered = [], []
    for key in keys:
        prepared = []
        for d, e in zip(args.dirs, exports):
            abi, kernel, entry = e[key]
            why = abi.refusal(kernel, abi.shape(entry["shape"]))
            if why:
                sys.exit(f"{key} in {d}: {why}")
            src = open(os.path.join(d, kernel["file"])).read()
            module = cp.RawModule(code=src, options=rx.compile_options(kernel, device), backend="nvrtc")
            shape = abi.shape(entry["shape"])
            max_abs, unwritten, outside, _, _, _ = rx.run_one(abi, module, kernel, entry, shape, device, driver)
            ok = unwritten == 0 and outside == 0 and max_abs <= rx.ATOL.get(kernel["dtype"], 2e-2)
            prs = [rx.prepare(abi, module, kernel, entry, shape, device, driver)]
            footprint = sum(t.numel() * t.element_size() for t in (prs[0].q, prs[0].k, prs[0].v, prs[0].o))
            n_sets = input_sets(footprint, l2, args.warm)
            prs += [rx.prepare(abi, module, kernel, entry, shape, device, driver) for _ in range(n_sets - 1)]
            go = rotating([x.go for x in prs])
            prepared.append((d, kernel["file"], ok, max_abs, prs, graph_of(go, args.launches), go))
        samples = prepared[0][4]
        abi0, kernel0, entry0 = exports[0][key]
        shape0 = abi0.shape(entry0["shape"])
        for label, go in baseline_calls(samples, shape0, kernel0["dtype"], kinds, args.launches):
            prepared.append((label, "-", True, 0.0, None, graph_of(go, args.launches), go))
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
            # Cyclic turns: no kernel runs two pieces in a row. With the alternating order of
            # the burst rounds the ends ran two pieces at once (100 ms, presumably at lower
            # clocks) and the middle one never did (2026-11-28 (19)).
            for i in cyclic(len(prepared), r):
                chunks[i].append(replay_us(prepared[i][5], args.launches, reps[i]))
        sustained = [statistics.median(c) for c in chunks]
        # Each kernel alone, at the clocks its own draw settles at (two windows, cyclic order).
        own = [float("nan")] * len(prepared)
        if args.own_ms > 0:
            reps_own = [max(1, int(args.own_ms / max(statistics.median(b) * args.launches / 1000.0, 1e-3))) for b in burst]
            windows = [[] for _ in prepared]
            for r in range(2):
                for i in cyclic(len(prepared), r):
                    windows[i].append(replay_us(prepared[i][5], args.launches, reps_own[i]))
            own = [statistics.median(w) for w in windows]
        if args.layer and shape0["sq"] <= 16:
            layer = Layer(shape0, kernel0["dtype"], l2)
            graphs = [graph_of(layer.around(p[6]), args.launches) for p in prepared] + [graph_of(layer.around(None), args.launches)]
            per_round = {i: [] for i in range(len(graphs))}
            for r in range(args.rounds):
                for i in (range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))):
                    per_round[i].append(replay_us(graphs[i], args.launches))
            costs = layer_costs(per_round, len(graphs) - 1)
            gemms = statistics.median(per_round[len(graphs) - 1])
            for i, p in enumerate(prepared):
                layered.append((key, p[0], costs[i], gemms, layer.n))
            del graphs, layer
        for i, (d, f, ok, max_abs, _, _, _) in enumerate(prepared):
            med = statistics.median(burst[i])
            rows.append((key, d, f, ok, max_abs, med, statistics.median(burst[0]) / med if i else 1.0,
                         sustained[i], sustained[0] / sustained[i] if i else 1.0, own[i], own[0] / own[i] if i else 1.0,
                         n_sets if not args.warm else (footprint * 2 <= l2)))
    print(f"{'shape':<34} {'export':<28} {'kernel':<22} {'correct':>8} {'burst us':>9} {'vs first':>8} "
          f"{'sus us':>9} {'vs first':>8} {'own us':>9} {'vs first':>8}")
    for key, d, f, ok, max_abs, med, ratio, sus, sratio, own_us, oratio, sets in rows:
        note = ("  (fits in L2: warm reads)" if sets else "") if args.warm else (f"  ({sets} input sets)" if sets > 1 else "")
        print(f"{key:<34} {os.path.basename(os.path.normpath(d)):<28} {f:<22} {('yes' if ok else 'NO'):>8} "
              f"{med:>9.2f} {ratio:>7.3f}x {sus:>9.2f} {sratio:>7.3f}x {own_us:>9.2f} {oratio:>7.3f}x" + note)
    print("vs first: the first export's time / this one's (above 1: this one is faster)")
    if kinds:
        labels = {"fa4": "fa4", "sdpa": "sdpa-default"}
        print(f"\n{'shape':<34} " + " ".join(f"{'vs ' + labels[k] + ' burst':>20} {'vs ' + labels[k] + ' sustained':>24} {'own':>7}" for k in kinds))
        for key in keys:
            mine = {r[1]: r for r in rows if r[0] == key}
            first = next(r for r in rows if r[0] == key)
            cells = []
            for k in kinds:
                b = mine[labels[k]]
                cells.append(f"{b[5] / first[5]:>19.3f}x {b[7] / first[7]:>23.3f}x {b[9] / first[9]:>6.3f}x")
            print(f"{key:<34} " + " ".join(cells))
        print(f"baseline's time / {os.path.basename(os.path.normpath(args.dirs[0]))}'s (above 1: the export is faster)")
    if layered:
        print("\nin a layer (--layer): each call between its layer's weight GEMMs; cost = that layer's time - the GEMMs-only "
              "layer's, us (median over the rounds)")
        for key in dict.fromkeys(r[0] for r in layered):
            mine = [r for r in layered if r[0] == key]
            first = mine[0]
            cells = [f"{os.path.basename(os.path.normpath(label))} {cost:.2f}" + (f" ({cost / first[2]:.3f}x)" if i else "")
                     for i, (_, label, cost, _, _) in enumerate(mine)]
            print(f"{key:<34} " + "  ".join(cells) + f"  | GEMMs alone {first[3]:.2f} us, {first[4]} weight sets")
        print(f"(Nx): that kernel's cost / {os.path.basename(os.path.normpath(args.dirs[0]))}'s (above 1: the first export is "
              f"faster in the layer)")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
