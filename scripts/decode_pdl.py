#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) of the decode kernels (issue 17): correct, and what it buys
back to back and between a model layer's GEMMs.

Here the decode templates' rendered source gets `griddepcontrol.wait` before its first global access
(in common/decode_split.cuh, before the prologue's copies; at the top of decode-split's combine) and
`griddepcontrol.launch_dependents` right after (patch_source below), so they may be launched with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: their CTAs are then scheduled as soon as the
kernel before them in the stream has released them or exited, and their prologue and the launch
latency overlap that kernel's tail. A decode call lasts 4-50 us, of which 1.4-1.7 us are outside
the CTAs (scripts/decode_timeline.py), so this is what the attribute can win.

Per decode shape, at the point the 8-minute LLM run chose (and decode-split's two launches for MQA,
whose combine is the second kernel of the pair):
  check   the kernel launched with the attribute right behind the torch kernel that writes its
          input (K, then Q) or poisons its output (O = NaN), in a CUDA graph: a kernel that touched
          memory before its wait would read the old K / Q or be overwritten, against the fp32
          reference;
  b2b     back to back, cold (decode_cold's rotating input sets), CUDA graph of 24 calls: plain
          launches, PDL launches, SDPA default;
  layer   a graph of 24 layers [x @ W_qkv, attention, a @ W_o] (fp16 weights of Llama-3-8B's
          projections, two sets rotating, so every GEMM reads its weights from HBM): no attention,
          ours plain, ours PDL, SDPA; attention's cost = the layer's time - the GEMMs-only layer's.
          The GEMMs are cuBLAS's, launched without the attribute, as PyTorch launches them: this is
          what a model that launches only our kernel with it gets.
Rounds interleave the variants; medians of rounds, and the paired (per-round) PDL / plain ratio.

    python3 scripts/decode_pdl.py OUT.json [--cubin-dir DIR] [--rounds N]
    python3 scripts/decode_pdl.py --build-cubins DIR      (no GPU: the points' modules, NVRTC from .deps)
"""
import sys, json, time, statistics
from pathlib import Path
sys.path.insert(0, "scripts")
import decode_cold as DC
import check_templates_gpu as C

gqa = C.gqa
# The PDL calls, put into the rendered source (the templates themselves do not have them: see
# docs/BENCHMARKS.md, 2026-11-28 (16), for why). Both are no-ops in a launch without the attribute.
PDL_CALLS = 'asm volatile("griddepcontrol.wait;\\n" ::: "memory"); asm volatile("griddepcontrol.launch_dependents;\\n" ::: "memory");\n'
PATCHES = [
    ("    // Group 0 holds the first tile (K_FIRST: its K) and Q; then a group per tile (K_FIRST:\n", 1),
    ('    OPTD_CHECK_SMEM(COMBINE, D, 0);  // launched as role `combine` with smem "0"\n', None),
]
_build_source = C.build_source


def patch_source(tpl, *args, **kw):
    src = _build_source(tpl, *args, **kw)
    if tpl.rel not in ("decode.cu", "decode_cluster.cu"):
        return src
    for anchor, need in PATCHES:
        n = src.count(anchor)
        if need is not None and n != need:
            raise RuntimeError(f"decode_pdl: anchor {anchor.strip()!r} found {n} times in the rendered source, want {need}")
        src = src.replace(anchor, anchor + PDL_CALLS if "OPTD_CHECK_SMEM" in anchor else PDL_CALLS + anchor)
    return src



def install():
    """Render this process's decode modules with the PDL calls (main() and --build-cubins do;
    importing does not)."""
    C.build_source = patch_source


REPS = 24
SAMPLES = 10

# (label, shape, template, knobs): run 20261128-051150-92f2's decode winners (docs/benchmarks/).
POINTS = [
    ("B1 SK1024", gqa(1, 32, 8, 1, 1024, 128, True), DC.cluster,
     dict(BLOCK_N=16, CLUSTER=8, COMBINE=2, M_TILES=1, NUM_WARPS=4, STAGES=3, WARP_LOADS=0)),
    ("B1 SK4096", gqa(1, 32, 8, 1, 4096, 128, True), DC.cluster,
     dict(BLOCK_N=16, CLUSTER=8, COMBINE=2, M_TILES=1, NUM_WARPS=4, STAGES=4, WARP_LOADS=0)),
    ("MQA B8 SK4096", gqa(8, 32, 1, 1, 4096, 128, True), DC.cluster,
     dict(BLOCK_N=32, CLUSTER=8, COMBINE=3, M_TILES=2, NUM_WARPS=8, STAGES=3, WARP_LOADS=1)),
    ("MQA split x2", gqa(8, 32, 1, 1, 4096, 128, True), DC.split,
     dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, SPLIT_WAVES=2, MIN_SPLIT_TILES=1, FUSED_COMBINE=0, WARP_LOADS=0,
          M_TILES=2)),
    ("B8 SK4096", gqa(8, 32, 8, 1, 4096, 128, True), DC.cluster,
     dict(BLOCK_N=16, CLUSTER=2, COMBINE=2, M_TILES=1, NUM_WARPS=4, STAGES=4, WARP_LOADS=0)),
]
HIDDEN, QKV_OUT = 4096, 6144  # Llama-3-8B: 32 x 128 query + 2 x 8 x 128 key/value columns
WEIGHT_SETS = 2               # 2 x (50 + 34) MB: more than the L2 holds


class Launcher:
    """cuLaunchKernelEx of one planned launch, with or without the PDL attribute."""

    def __init__(self, kern, args, pdl: bool):
        from cuda.bindings import driver as cu
        self.cu, self.args, self.name = cu, args, kern.name
        self.fn = kern.fn.kernel.ptr
        DC.gpu.driver.check_params(self.fn, kern.name, args.params)
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = kern.grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = kern.block
        cfg.sharedMemBytes = kern.smem
        if pdl:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
        else:
            cfg.numAttrs = 0
        self.cfg = cfg

    def __call__(self):
        self.cfg.hStream = DC.torch.cuda.current_stream().cuda_stream
        err, = self.cu.cuLaunchKernelEx(self.cfg, self.fn, self.args.params.address, 0)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx({self.name}): {err}")


def ours(tpl, kn, shape, n_sets, pdl, fill=0.0, need_ref=False):
    """(call(i) running the plan on input set i % n_sets, the sets)."""
    gpu = DC.gpu
    mod = gpu.module(tpl, kn, False, count=False)
    splits, launches, _ = C.plan(tpl, kn, shape, gpu.dev)
    sets = [gpu.buffers(shape, splits, "fp16", fill=fill, need_ref=need_ref) for _ in range(n_sets)]
    kernels = [gpu.prepare(mod, l) for l in launches]
    calls = [[Launcher(k, gpu.launch_args(shape, splits, launches, *b[:6]), pdl) for k in kernels] for b in sets]

    def call(i):
        for launch in calls[i % n_sets]:
            launch()
    return call, sets


def sdpa(shape, n_sets):
    gpu, fns = DC.gpu, []
    for _ in range(n_sets):
        q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
        fns.append(C.sdpa_fn(gpu, shape, q.clone(), k.clone(), v.clone()))
    return lambda i: fns[i % n_sets]()


def capture(step, reps=REPS):
    """A CUDA graph of step(0) .. step(reps - 1) on a side stream, warmed."""
    torch = DC.torch
    torch.cuda.synchronize()  # what the default stream made (inputs, the reference) is done
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(reps):
            step(i)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(reps):
                step(i)
        for _ in range(3):
            graph.replay()
        stream.synchronize()
    return stream, graph


def replay_us(stream, graph, reps=REPS, samples=SAMPLES):
    return C.replay_graph_us(DC.gpu, stream, graph, reps, samples)


def check(label, shape, tpl, kn):
    """The PDL launch right behind the kernel that writes K, Q or poisons O: (ok, detail) each."""
    torch, gpu = DC.torch, DC.gpu
    call, sets = ours(tpl, kn, shape, 1, True, fill=float("nan"), need_ref=True)
    q, k, v, o, o_part, lse, ref = sets[0]
    truth = dict(q=q.clone(), k=k.clone())
    out = []
    for last in ("k", "q", "o"):
        def step(_i, last=last):
            # The tensor named `last` is written by the kernel right before ours; the others
            # before it (a non-PDL kernel waits for everything before it).
            q.fill_(7.0)  # garbage where the inputs were: a kernel reading early sees it
            k.fill_(-7.0)
            order = [x for x in ("o", "q", "k") if x != last] + [last]
            for name in order:
                if name == "o":
                    o.fill_(float("nan"))
                else:
                    dst = q if name == "q" else k
                    dst.copy_(truth[name])
            call(0)
        stream, graph = capture(step, reps=1)
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        got = gpu.view(shape, "o", o).float()
        bad, bad_ref = int((~torch.isfinite(got)).sum()), int((~torch.isfinite(ref)).sum())
        err = float((got - ref).abs().max()) if not (bad or bad_ref) else float("inf")
        ok = err <= C.ATOL["fp16"]
        out.append((last, ok, f"max_abs {err:.1e}" + (f", {bad} non-finite outputs, {bad_ref} in the reference" if bad or bad_ref else "")))
    line = ", ".join(f"behind {w}: {'ok' if ok else 'FAIL'} ({e})" for w, ok, e in out)
    print(f"  check {label:<14} {line}", flush=True)
    return all(ok for _, ok, _ in out)


def main(out_json, rounds):
    torch = DC.torch
    t0 = time.time()
    fails = sum(not check(*p) for p in POINTS)
    print(f"check: {len(POINTS) - fails} of {len(POINTS)} points correct under PDL ({time.time() - t0:.0f} s)", flush=True)
    res = []
    for label, shape, tpl, kn in POINTS:
        n = DC.sets_for(shape)
        plain, _ = ours(tpl, kn, shape, n, False)
        pdl, _ = ours(tpl, kn, shape, n, True)
        sd = sdpa(shape, n)
        b = shape.b
        xs = [torch.randn(b, HIDDEN, device="cuda", dtype=torch.float16) for _ in range(WEIGHT_SETS)]
        wq = [torch.randn(HIDDEN, QKV_OUT, device="cuda", dtype=torch.float16) * 0.01 for _ in range(WEIGHT_SETS)]
        wo = [torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.float16) * 0.01 for _ in range(WEIGHT_SETS)]
        yq = [torch.empty(b, QKV_OUT, device="cuda", dtype=torch.float16) for _ in range(WEIGHT_SETS)]
        yo = [torch.empty(b, HIDDEN, device="cuda", dtype=torch.float16) for _ in range(WEIGHT_SETS)]

        def layer(attn):
            def step(i):
                j = i % WEIGHT_SETS
                torch.mm(xs[j], wq[j], out=yq[j])
                if attn:
                    attn(i)
                torch.mm(xs[j], wo[j], out=yo[j])
            return step
        graphs = dict(b2b_plain=capture(plain), b2b_pdl=capture(pdl), b2b_sdpa=capture(sd),
                      layer_none=capture(layer(None)), layer_plain=capture(layer(plain)),
                      layer_pdl=capture(layer(pdl)), layer_sdpa=capture(layer(sd)))
        per = {k: [] for k in graphs}
        names = list(graphs)
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                per[name].append(replay_us(*graphs[name]))
        med = {k: statistics.median(v) for k, v in per.items()}
        paired_b2b = statistics.median(p / q for p, q in zip(per["b2b_pdl"], per["b2b_plain"]))
        cost = {k: [x - y for x, y in zip(per[f"layer_{k}"], per["layer_none"])] for k in ("plain", "pdl", "sdpa")}
        cmed = {k: statistics.median(v) for k, v in cost.items()}
        kv = 2 * shape.b * shape.hkv * shape.sk * shape.d * 2
        print(f"{label:<14} KV {kv / 1e6:6.1f} MB | back to back: plain {med['b2b_plain']:7.2f} us, PDL "
              f"{med['b2b_pdl']:7.2f} (paired {paired_b2b:.3f}), SDPA {med['b2b_sdpa']:7.2f} -> "
              f"{med['b2b_sdpa'] / med['b2b_plain']:.2f}x / {med['b2b_sdpa'] / med['b2b_pdl']:.2f}x | layer "
              f"{med['layer_none']:7.2f} us without attention; attention's cost: plain {cmed['plain']:6.2f}, PDL "
              f"{cmed['pdl']:6.2f}, SDPA {cmed['sdpa']:6.2f} -> {cmed['sdpa'] / cmed['plain']:.2f}x / "
              f"{cmed['sdpa'] / cmed['pdl']:.2f}x", flush=True)
        res.append(dict(label=label, shape=C.shape_key(shape), template=tpl.name, knobs=kn, rounds=per,
                        medians=med, attention_cost=cmed, paired_b2b=paired_b2b))
        del graphs
        torch.cuda.empty_cache()
    Path(out_json).write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t0:.0f} s; {fails} incorrect")
    return 1 if fails else 0


if __name__ == "__main__":
    install()
    if "--build-cubins" in sys.argv:
        sys.exit(DC.build_cubins(sys.argv[sys.argv.index("--build-cubins") + 1], [(t, k) for _, _, t, k in POINTS]))
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
    cubins = sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None
    DC.init(cubins)
    sys.exit(main(sys.argv[1], rounds))
