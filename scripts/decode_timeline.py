#!/usr/bin/env python3
"""Where a decode call's time goes, CTA by CTA (issue 17): timestamps from inside the kernel.

    python3 scripts/decode_timeline.py OUT.json [--samples 15] [--last N] [--only TEMPLATE] [--cubin-dir DIR]
    python3 scripts/decode_timeline.py --build-cubins DIR [--last N] [--only TEMPLATE]   (no GPU)
        (--last: only the last N points; --only: only that template's, e.g. decode-wgmma)

scripts/decode_overhead.py found the decode templates about 4.6 us per call above
bytes / bandwidth (a plain streaming read of the same bytes: 1.7 us), and decode_ablation.py
cut parts out of the kernel to price them, which cannot tell a cost from a wait that moves
elsewhere. This reads the clock instead: the rendered source of each point gets a global array
and, in thread 0 of every CTA, a %globaltimer stamp (ns) and a clock64 stamp at
  entry      first statement of the kernel
  issued     the prologue's copies (Q and the first STAGES - 1 K/V tiles) issued
  first      tile 0 landed (its cp.async wait and barrier passed)
  last       the split's last tile landed (K_FIRST 1: its K)
  v_last     K_FIRST 1: the last tile's V landed (printed after exit; slot 12)
  xo_own     thread 0's warp has written its merge rows (before the barrier that ends the merge; slot 13)
  sent       decode-cluster scatter (COMBINE 3): the bulk copies of the split's staged chunks
             and LSEs issued (slot 14)
  k0_copy    decode-split / decode-cluster: the prologue's index math done, tile 0's first
             copy next (slot 15; "issued" comes after all the prologue's copies)
  inited, prefetched   decode-wgmma: past the mbarrier init's barrier; the producer past its
             tensor-map prefetches (slots 16, 17; decode-wgmma's own stamps are listed below)
  loop       the key loop done (math of the last tile included)
  sync_a     the merge's first barrier passed (every warp out of its key loop)
  sync_b     its second (the warps' row maxima and sums published)
  merged     the warps' merge done (end of common/decode_split.cuh's part)
  summed     decode-cluster push: the cluster barrier's wait passed (ranks > 0 then sum their
             warps' rows straight into the remote stores, rank 0 into its own copy);
             decode-split: the partial rows stored
  pushed     decode-cluster push: ranks > 0 after their remote stores and arrive; rank 0
             after its mbarrier wait (all pushes in); decode-split fused: past the split
             semaphore (the last CTA of a group only)
  combined   rank 0 / the last CTA: the combine's stores issued
  exit       the kernel's last statement
After the events, a balance line: how far apart the CTAs' last tiles landed, over all CTAs and
within each group of grid.x CTAs (a decode-cluster cluster), and per SM (%smid) averaged over the
replays: whether the late CTAs are the same SMs every time (placement) or not (contention).
The kernels are otherwise the daemon's, timed cold as the benchmark times decode (a CUDA graph
of back-to-back calls rotating over enough input sets to exceed L2); the stamps kept are the
graph's last call's, once per replay. Printed per point and shape: the call's time from the
graph, then for each event the spread over CTAs (min / median / max, us after the first CTA's
entry), medians over the replays; "outside" = call time - (last exit - first entry), what the
launch and the kernel boundary cost beyond the CTAs' own lifetimes. The stamps cost a few
instructions in thread 0 (timing only; the outputs are not checked here).
"""
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, "scripts")
import decode_cold as DC  # noqa: E402

C, gqa = DC.C, DC.gqa
EVENTS = ["entry", "issued", "first", "last", "loop", "sync_a", "sync_b", "merged", "summed", "pushed", "combined", "exit",
          "v_last", "xo_own", "sent", "k0_copy", "inited", "prefetched"]
# Events that only some templates' tails have (the scatter combine's bulk sends), and the ones
# decode-wgmma lacks (no key warps to merge, its combine sums nothing before it sends).
ONLY = {"sent": ("decode-cluster", "decode-wgmma"), "xo_own": ("decode-split", "decode-cluster"),
        "summed": ("decode-split", "decode-cluster"), "k0_copy": ("decode-split", "decode-cluster"),
        "inited": ("decode-wgmma",), "prefetched": ("decode-wgmma",)}


def events_of(template_name):
    """The slots stamped in `template_name`'s source (all of EVENTS but other templates' own)."""
    return [i for i, e in enumerate(EVENTS) if template_name in ONLY.get(e, (template_name,))]


SLOTS = 24       # per CTA: the EVENTS, then SM_SLOT
SM_SLOT = SLOTS - 1
MAX_CTAS = 8192
assert len(EVENTS) < SM_SLOT

TL_DEF = """
__device__ unsigned long long optd_tl[%d * %d];
__device__ long long optd_tc[%d * %d];
__device__ __forceinline__ void tl_mark_any(int ev) {  // any one thread (the caller picks it)
    unsigned long long t;
    asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t));
    const unsigned cta = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    optd_tl[cta * %d + ev] = t;
    optd_tc[cta * %d + ev] = clock64();
    if (ev == 0) {  // the last slot (no event uses it): the SM the CTA ran on
        unsigned sm;
        asm volatile("mov.u32 %%0, %%%%smid;" : "=r"(sm));
        optd_tc[cta * %d + %d] = sm;
    }
}
__device__ __forceinline__ void tl_mark(int ev) {
    if (threadIdx.x == 0) tl_mark_any(ev);
}
""" % (MAX_CTAS, SLOTS, MAX_CTAS, SLOTS, SLOTS, SLOTS, SLOTS, SM_SLOT)

# (old, new) replacements in the rendered source; each must apply (checked).
PATCHES = [
    ("    cp_async_wait<AFTER_FIRST>();\n    __syncthreads();  // Q is every thread's copies",
     "    tl_mark(1);\n    cp_async_wait<AFTER_FIRST>();\n    __syncthreads();  // Q is every thread's copies"),
    ("        issue_tile(t_begin + i + STAGES - 1, i + STAGES - 1 < my_tiles);",
     "        if (i == 0) tl_mark(2);\n        if (i == my_tiles - 1) tl_mark(3);\n"
     "        issue_tile(t_begin + i + STAGES - 1, i + STAGES - 1 < my_tiles);"),
    # Thread 0's own warp done writing its merge rows, before the barrier that waits for the others.
    ("= lse[h];\n    }\n    __syncthreads();\n}\n",
     "= lse[h];\n    }\n    tl_mark(13);\n    __syncthreads();\n}\n"),
    # K_FIRST 1: the last tile's V landed (its K is "last").
    ("            tile_barrier();                // ... and every copier's\n",
     "            tile_barrier();                // ... and every copier's\n            if (i == my_tiles - 1) tl_mark(12);\n"),
    ("    cp_async_wait<0>();  // only empty groups", "    tl_mark(4);\n    cp_async_wait<0>();  // only empty groups"),
    # The prologue's index math done: tile 0's first copy is next (k0_copy; "issued" follows its copies).
    ("        if (s == 0) {\n            if (s < my_tiles) load_kv(t_begin, K_FIRST ? 1 : 3);",
     "        if (s == 0) {\n            tl_mark(15);\n            if (s < my_tiles) load_kv(t_begin, K_FIRST ? 1 : 3);"),
    ("    __syncthreads();\n}\n\n\n#endif  // OPTD_DECODE_SPLIT_CUH", "    __syncthreads();\n    tl_mark(7);\n}\n\n\n#endif  // OPTD_DECODE_SPLIT_CUH"),
    ("    __syncthreads();  // every warp is past its last K/V tile\n",
     "    __syncthreads();  // every warp is past its last K/V tile\n    tl_mark(5);\n"),
    ("    __syncthreads();\n    // Both rows' factors first", "    __syncthreads();\n    tl_mark(6);\n    // Both rows' factors first"),
]
# Per template: stamps of its own tail (decode_cluster.cu's push, decode.cu's fused combine).
TAIL_PATCHES = {
    "decode-cluster": [
        ('    asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");  // rank 0\'s mbarrier is initialised\n',
         '    asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");  // rank 0\'s mbarrier is initialised\n    tl_mark(8);\n'),
        ("        return;  // nothing reads this CTA's shared memory", "        tl_mark(9);\n        tl_mark(11);\n        return;  // nothing reads this CTA's shared memory"),
        ("    cluster_mbar_wait(mbar, 0);\n", "    cluster_mbar_wait(mbar, 0);\n    tl_mark(9);\n"),
        # COMBINE 3 (scatter): every rank waits for its share and combines it.
        ('    asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");  // every rank\'s mbarrier is initialised\n',
         '    asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");  // every rank\'s mbarrier is initialised\n    tl_mark(8);\n'),
        # COMBINE 3: the bulk copies issued (sent), the share combined before the exit barrier.
        ("        const int c0 = own_begin + (int)threadIdx.x;\n",
         "        tl_mark(14);\n        const int c0 = own_begin + (int)threadIdx.x;\n"),
        ('        asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");\n    }\n#elif COMBINE >= 1',
         '        tl_mark(10);\n        asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");\n    }\n#elif COMBINE >= 1'),
        ("                c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));\n        }\n    }\n#else",
         "                c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));\n        }\n    }\n    tl_mark(10);\n#else"),
    ],
    "decode-split": [
        ("    if (!dec_arrive_last(sem, n_splits)) return;", "    tl_mark(8);\n    if (!dec_arrive_last(sem, n_splits)) return;\n    tl_mark(9);"),
        ("            r += NUM_WARPS;\n        }\n    }\n#endif", "            r += NUM_WARPS;\n        }\n    }\n    tl_mark(10);\n#endif"),
    ],
}
# The D 128 kernel's call of its body: one call, or (kernel ABI v3) the windowed and unwindowed
# instantiations chosen by optd_windowed(window); stamped before and after, whichever it is.
WRAPS = re.compile(r"if \(optd_windowed\(window\)\) (decode(?:_cluster)?_fwd)<128, true>\(OPTD_ARG_NAMES\);\n"
                   r"\s*else \1<128, false>\(OPTD_ARG_NAMES\);"
                   r"|decode(?:_cluster)?_fwd<128>\(OPTD_ARG_NAMES\);")
# decode-wgmma (decode_wgmma.cu) has its own body: no common/decode_split.cuh. Its stamps: inited =
# past the mbarrier init's CTA barrier and the cluster arrive, prefetched = the producer (lane 0 of
# warp 4, hence tl_mark_any) past its tensor-map prefetches (its first statement), issued = its
# first K and V loads issued (before the CTA barrier), first / last =
# thread 0 (a consumer) past the first / last tile's K wait, v_last past the last V wait, loop =
# the last P V done, sync_a = the cluster wait (every rank's mbarrier initialised), sync_b = the
# consumers' barrier before staging, merged = the rows staged (the CTA barrier after it), sent =
# the bulk copies issued, pushed = this rank's share and LSEs all landed, combined = its share
# combined and stored.
WGMMA_PATCHES = [
    ("        tma_load_5d(base + L::V + (unsigned)(s * L::KV_BYTES), tm_v, full_v(s), 0, t * BLOCK_N, 0, kvh, b);\n",
     "        tma_load_5d(base + L::V + (unsigned)(s * L::KV_BYTES), tm_v, full_v(s), 0, t * BLOCK_N, 0, kvh, b);\n"
     "        if (i == 0) tl_mark_any(1);\n"),
    ("    // Online softmax state of the thread's rows", "    tl_mark(16);\n    // Online softmax state of the thread's rows"),
    ("        tma_prefetch_map(tm_v);\n", "        tma_prefetch_map(tm_v);\n        tl_mark_any(17);\n"),
    ("            mbar_wait(full_k(slot), ph);\n",
     "            mbar_wait(full_k(slot), ph);\n            if (i == 0) tl_mark(2);\n            if (t == t_end - 1) tl_mark(3);\n"),
    ("            mbar_wait(full_v(slot), ph);\n",
     "            mbar_wait(full_v(slot), ph);\n            if (t == t_end - 1) tl_mark(12);\n"),
    ("        wgmma_wait<0>();\n        reg_fence(acc_o);\n        // (The last slot",
     "        wgmma_wait<0>();\n        reg_fence(acc_o);\n        tl_mark(4);\n        // (The last slot"),
    ('        asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");  // every rank\'s mbarrier is initialised\n'
     "        named_bar_sync(1, DW_CONSUMERS);",
     '        asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory");  // every rank\'s mbarrier is initialised\n'
     "        tl_mark(5);\n        named_bar_sync(1, DW_CONSUMERS);\n        tl_mark(6);"),
    ("    __syncthreads();\n\n    // Send:", "    __syncthreads();\n    tl_mark(7);\n\n    // Send:"),
    ("    cluster_mbar_wait(cbar, 0);\n", "    tl_mark(14);\n    cluster_mbar_wait(cbar, 0);\n    tl_mark(9);\n"),
    ('        *reinterpret_cast<uint2*>(dw_out_chunk(o, strides, b, kvh, row0 + row, c4, group, seq_q)) = packed;\n    }\n',
     '        *reinterpret_cast<uint2*>(dw_out_chunk(o, strides, b, kvh, row0 + row, c4, group, seq_q)) = packed;\n    }\n'
     "    tl_mark(10);\n"),
    ("        decode_wgmma_fwd<DIM>(OPTD_ARG_NAMES, &tm_k, &tm_v);",
     "        tl_mark(0); decode_wgmma_fwd<DIM>(OPTD_ARG_NAMES, &tm_k, &tm_v); tl_mark(11);"),
]

_build = C.build_source


def patch(src, patches):
    for old, new in patches:
        if old not in src:
            raise RuntimeError(f"decode_timeline: the template changed, no `{old[:60]}` to stamp")
        src = src.replace(old, new)
    return src


def build_source(tpl, knobs, bf16, mbar_fault=False):
    src = _build(tpl, knobs, bf16, mbar_fault)
    if tpl.name == "decode-wgmma":
        src = patch(src, WGMMA_PATCHES)
        at = src.rindex("template <", 0, src.index("__device__ __forceinline__ void decode_wgmma_fwd("))
        return src[:at] + TL_DEF + src[at:]
    for old, new in PATCHES:
        if old not in src:
            raise RuntimeError(f"decode_timeline: the template changed, no `{old[:60]}` to stamp")
        src = src.replace(old, new)
    for old, new in TAIL_PATCHES.get(tpl.name, []):
        if old not in src:
            raise RuntimeError(f"decode_timeline: the template changed, no `{old[:60]}` to stamp")
        src = src.replace(old, new)
    src = WRAPS.sub(lambda m: f"tl_mark(0);\n    {m.group(0)}\n    tl_mark(11);", src)
    # Before the template line of decode_split_tile (whatever its parameters), so its body sees tl_mark.
    at = src.rindex("template <", 0, src.index("__device__ __forceinline__ void decode_split_tile("))
    return src[:at] + TL_DEF + src[at:]


def install():
    """Render every module of this process with the stamps (main() does; importing does not)."""
    C.build_source = build_source

POINTS = [
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=8, COMBINE=2),
     [gqa(1, 32, 8, 1, 4096, 128, False), gqa(1, 32, 8, 1, 1024, 128, False), gqa(8, 32, 1, 1, 4096, 128, False)]),
    (DC.split, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=1, MIN_SPLIT_TILES=2, FUSED_COMBINE=1),
     [gqa(1, 32, 8, 1, 4096, 128, False), gqa(8, 32, 1, 1, 4096, 128, False)]),
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=2, COMBINE=2), [gqa(8, 32, 8, 1, 4096, 128, False)]),
    # MQA's best points of scripts/decode_cold.py --mqa (2026-11-28): the scatter combine
    # with two row tiles per CTA (8 clusters of 8), and the push to rank 0 with clusters of 4.
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=8, STAGES=4, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2),
     [gqa(8, 32, 1, 1, 4096, 128, False)]),
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=4, COMBINE=2, WARP_LOADS=1), [gqa(8, 32, 1, 1, 4096, 128, False)]),
    # decode-wide's start since 2026-11-28 (32 keys per warp, 3 stages), the LLM run's MQA winner.
    (DC.cluster, dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2),
     [gqa(8, 32, 1, 1, 4096, 128, False)]),
    # The same with K_FIRST 1 (2026-11-28, session 19): the last tile's S while its V lands.
    (DC.cluster, dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=1),
     [gqa(8, 32, 1, 1, 4096, 128, False)]),
    # decode-wgmma (2026-12-02): the same 16.8 MB on the same 64 CTAs at MQA and at B 1 (12.5 against
    # 9.5-9.9 us cold, session 46: Q's loads, one round trip per chunk, since issued together), and its
    # stage's start on speculative decoding's B 8 x SQ 16.
    (DC.wg, dict(BLOCK_N=64, STAGES=3, CLUSTER=8, ROWS=32),
     [gqa(8, 32, 1, 1, 4096, 128, False), gqa(1, 32, 8, 1, 4096, 128, False)]),
    (DC.wg, dict(BLOCK_N=128, STAGES=3, CLUSTER=8, ROWS=32),
     [gqa(8, 32, 1, 1, 4096, 128, False), gqa(1, 32, 8, 1, 4096, 128, False)]),
    (DC.wg, dict(BLOCK_N=64, STAGES=3, CLUSTER=2, ROWS=64), [gqa(8, 32, 8, 16, 4096, 128, True)]),
]


def timeline(tpl, kn, shape, samples):
    gpu, cp = DC.gpu, DC.cp
    mod = gpu.module(tpl, kn, False, count=False)
    splits, launches, _ = C.plan(tpl, kn, shape, gpu.dev)
    grid = launches[0]["grid"]
    ctas = grid[0] * grid[1] * grid[2]
    if ctas > MAX_CTAS:
        raise RuntimeError(f"{ctas} CTAs > {MAX_CTAS}")
    n = DC.sets_for(shape)
    bufs = [gpu.buffers(shape, splits, "fp16", fill=0.0, need_ref=False) for _ in range(n)]
    args = [gpu.launch_args(shape, splits, launches, *b[:6]) for b in bufs]
    kernels = [gpu.prepare(mod, l) for l in launches]
    tl = cp.ndarray((MAX_CTAS * SLOTS,), cp.uint64, mod.get_global("optd_tl"))
    tc = cp.ndarray((MAX_CTAS * SLOTS,), cp.int64, mod.get_global("optd_tc"))
    DC.torch.cuda.synchronize()

    def launch(i):
        for kern in kernels:
            gpu.launch(kern, args[i % n])
    reps = 24
    stream, graph = DC.warm_graph(launch, reps)
    with stream:
        stream.synchronize()
        per_call, spans, rel, cyc = [], [], {e: [] for e in EVENTS}, {e: [] for e in EVENTS}
        # Balance: when each CTA's last K/V tile landed ("last"), the spread over all CTAs
        # and within each group of grid.x CTAs (decode-cluster: one cluster), and per SM.
        spread_all, spread_grp, last_by_sm = [], [], {}
        for _ in range(samples):
            tl.fill(0)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            per_call.append(cp.cuda.get_elapsed_time(start, end) * 1000.0 / reps)
            t = tl[: ctas * SLOTS].get().reshape(ctas, SLOTS).astype("int64")
            c = tc[: ctas * SLOTS].get().reshape(ctas, SLOTS)
            t0 = int(t[:, 0].min())
            spans.append((int(t[:, 11].max()) - t0) / 1000.0)
            last = (t[:, 3] - t0) / 1000.0
            if (t[:, 3] >= t0).all():
                spread_all.append(float(last.max() - last.min()))
                gx = grid[0]
                grp = [float(last[i:i + gx].max() - last[i:i + gx].min()) for i in range(0, ctas, gx)]
                spread_grp.append(statistics.median(grp))
                for i in range(ctas):
                    last_by_sm.setdefault(int(c[i, SM_SLOT]), []).append(float(last[i] - statistics.median(last.tolist())))
            for j, e in enumerate(EVENTS):
                col = [x for x in t[:, j] if x >= t0]  # earlier: a stamp left by an earlier call
                if col:
                    xs = sorted((x - t0) / 1000.0 for x in col)
                    rel[e].append((xs[0], xs[len(xs) // 2], xs[-1]))
                # cycles since the CTA's own entry (clock64 is per SM; only differences within a CTA mean anything)
                d = sorted(int(c[i, j] - c[i, 0]) for i in range(ctas) if t[i, j] >= t0)
                if d:
                    cyc[e].append((d[0], d[len(d) // 2], d[-1]))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    call = med(per_call)
    span = med(spans)
    out = dict(point=f"{tpl.name} {DC.combo_label(kn)}", shape=C.shape_key(shape), ctas=ctas, call_us=call,
               span_us=span, outside_us=call - span, events={}, cycles={})
    for e in EVENTS:
        if rel[e]:
            out["events"][e] = [med([x[k] for x in rel[e]]) for k in range(3)]
            out["cycles"][e] = [med([x[k] for x in cyc[e]]) for k in range(3)]
    if spread_all:
        # Per SM: its CTAs' "last" minus the call's median, averaged over the replays. A
        # spread that follows the SM (the same SMs late in every replay) is placement or
        # memory locality; one that does not is contention, which balancing work evens.
        by_sm = sorted((statistics.mean(v), sm) for sm, v in last_by_sm.items())
        out["balance"] = dict(spread_all_us=med(spread_all), spread_in_group_us=med(spread_grp), group=grid[0],
                              sms=len(by_sm), sm_late_us=[(sm, round(d, 3)) for d, sm in by_sm[-5:]],
                              sm_early_us=[(sm, round(d, 3)) for d, sm in by_sm[:5]],
                              sm_mean_spread_us=by_sm[-1][0] - by_sm[0][0] if by_sm else 0.0)
    return out


def selected():
    """POINTS after --last N and --only TEMPLATE."""
    last = int(sys.argv[sys.argv.index("--last") + 1]) if "--last" in sys.argv else len(POINTS)
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    return [p for p in POINTS[len(POINTS) - last:] if not only or p[0].name == only]


def main():
    samples = int(sys.argv[sys.argv.index("--samples") + 1]) if "--samples" in sys.argv else 15
    install()
    if "--build-cubins" in sys.argv:  # no GPU: the stamped modules, NVRTC from .deps
        sys.exit(DC.build_cubins(sys.argv[sys.argv.index("--build-cubins") + 1], [(t, k) for t, k, _ in selected()]))
    DC.init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
    t0 = time.time()
    res = []
    for tpl, kn, shapes in selected():
        for shape in shapes:
            r = timeline(tpl, kn, shape, samples)
            res.append(r)
            print(f"\n{r['point']}  {r['shape']}  {r['ctas']} CTAs: call {r['call_us']:.2f} us, CTAs' span "
                  f"{r['span_us']:.2f} us, outside {r['outside_us']:.2f} us", flush=True)
            print(f"  {'event':<8} {'min us':>8} {'median':>8} {'max':>8}   cycles since the CTA's entry: min / median / max")
            for e, (a, b, c) in r["events"].items():
                ca, cb, cc = r["cycles"][e]
                print(f"  {e:<8} {a:8.2f} {b:8.2f} {c:8.2f}   {ca:7d} {cb:7d} {cc:7d}")
            bal = r.get("balance")
            if bal:
                print(f"  balance: last tile landed, spread over all CTAs {bal['spread_all_us']:.2f} us, within groups of "
                      f"{bal['group']} {bal['spread_in_group_us']:.2f} us; per SM (mean over replays, vs the call's median): "
                      f"spread {bal['sm_mean_spread_us']:.2f} us over {bal['sms']} SMs, latest {bal['sm_late_us']}, "
                      f"earliest {bal['sm_early_us']}")
    Path(sys.argv[1]).write_text(json.dumps(dict(gpu=DC.gpu.name, rows=res), indent=1))
    print(f"\ndone in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
