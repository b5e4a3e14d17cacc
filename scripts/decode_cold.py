#!/usr/bin/env python3
"""Decode kernels timed cold, as the daemon's benchmark times them (issue 17): a CUDA graph of
back-to-back executions that rotates over enough input sets (K/V, Q, O, partials) to exceed the
L2 cache several times, so every execution reads its KV cache from HBM; SDPA default
(enable_gqa) timed the same way. First a correctness check of decode-split's combine at points
that make many splits (both combines), then per shape the best points of decode-split and
decode-cluster, cold and hot.

    python3 scripts/decode_cold.py OUT.json

--full: instead, every knob combination of decode-split and decode-cluster (pushed combine) on
the issue-17 decode shapes that miss their bars (B 1 and MQA B 8 at SK 4096, B 8 x HKV 8 at
SK 4096), cold, against SDPA cold: is a bar within the templates' reach, so that a longer
search would meet it, or does it need a kernel change? The modules can be built here first
(no GPU: python3 scripts/decode_cold.py --build-cubins DIR) and loaded there with --cubin-dir DIR.

    python3 scripts/decode_cold.py OUT.json --full [--cubin-dir DIR]

--mqa: instead, the multi-query decode shape (B 8, 32 query heads on one KV head, SK 4096), the
one whose 32 packed rows are two m16 row tiles, over a grid of both templates with M_TILES 1 and
2 (two CTAs reading the same K/V, or one CTA whose warps split between the row tiles), cold,
against SDPA cold; the ten fastest points of each template. Build with --build-cubins DIR --mqa.

    python3 scripts/decode_cold.py OUT.json --mqa [--cubin-dir DIR]

--b8: the same for Llama-3 B 8 x SK 4096 (non-causal, and causal as the LLM workload has it) and
4000 (134 MB, issue 17's 2.9 TB/s bar): decode-cluster's cluster sizes and combines with the stage
counts whose shared memory lets two CTAs share an SM (cluster 4 or 8: 256 or 512 CTAs), and
clusters of 2 over every tile shape (keys per warp, warps, stages), printed with the effective
bandwidth.

    python3 scripts/decode_cold.py OUT.json --b8 [--cubin-dir DIR]

--b1: the same for Llama-3 B 1 x SK 4096 and 1024 (causal, as the LLM workload has them; 16.8 and 4.2 MB,
issue 17's 1.4x bar): decode-cluster at clusters of 8 and 4 over every tile shape and both pushed combines.

    python3 scripts/decode_cold.py OUT.json --b1 [--cubin-dir DIR]

--wgmma: decode-wgmma's whole space against decode-cluster's winners on MQA B 8 and B 1 x SK 4096
and 1024 (causal). --wide: decode-wgmma against a grid of decode-cluster where the packed rows fill
the m64 tile (SQ 16 x 4 query heads per KV head, SQ 8 x 8). Build with --build-cubins DIR --wgmma
(or --wide).

    python3 scripts/decode_cold.py OUT.json --wgmma|--wide [--cubin-dir DIR]

--b4: Llama-3 B 4 x SK 4096 (67 MB; 32 groups): decode-cluster at clusters of 4, 2 and 8 over 16 and 32
keys x 4 and 8 warps x 3 and 4 stages x COMBINE 2 and 3, and decode-split around its stage's start, non-causal
and causal. Build with --build-cubins DIR --b4.

    python3 scripts/decode_cold.py OUT.json --b4 [--cubin-dir DIR]

--deep: rings deeper than the templates' STAGES list (5-8), for MQA B 8 and B 1 x SK 4096 (causal)
at clusters of 8: do more bytes in flight with short tiles (16 keys per warp: a short last tile,
whose math follows the last byte) beat 32 keys x 3 stages? (scripts/decode_timeline.py,
2026-11-28: MQA's stream ends 0.9 us later at 16 keys x 4 stages than at 32 x 3, its last
tile's math takes 0.54 against 0.87 us.) Build with --build-cubins DIR --deep.

    python3 scripts/decode_cold.py OUT.json --deep [--cubin-dir DIR]

--narrow: MQA B 8 on two warps per CTA, one per row tile (NUM_WARPS 2, M_TILES 2: no key warps to
merge), against the decode-wide start. Build with --build-cubins DIR --narrow.

    python3 scripts/decode_cold.py OUT.json --narrow [--cubin-dir DIR]

--kfirst: K_FIRST 0 against 1 (common/decode_split.cuh: a tile's K copies one cp.async group and
its V the next, so the last tile's Q K^T and softmax run while its V lands) at the LLM workload's
decode winners, each on its shape, cold, in --rounds rounds that alternate which goes first; the
paired median of 1 / 0 per shape and SDPA default cold beside. Build with --build-cubins DIR --kfirst.

    python3 scripts/decode_cold.py OUT.json --kfirst [--rounds 9] [--cubin-dir DIR]

--against DIR: the decode winners with this checkout's templates against DIR's (an earlier
kernel-templates/, e.g. `git archive HEAD kernel-templates | tar -x -C .dev/old`), paired, cold
(decode-cluster's, decode-split's and decode-wgmma's winners; --wgmma-only: decode-wgmma's alone):

    python3 scripts/decode_cold.py OUT.json --against DIR/kernel-templates [--rounds 9] [--cubin-dir DIR2]

--long: long caches (Llama-3 B 1 x SK 16384 and 65536, 67 and 268 MB; B 8 x SK 16384, 537 MB, the
LLM workload's largest), where 64 CTAs (B 1, clusters of 8) stream for tens of
microseconds: decode-cluster over keys per warp, stages and both pushed combines (clusters of 8; at
B 8 also 2 and 4). Session 32 saw 32 keys per warp stream B 1 x SK 65536 at 4.1 TB/s where the
plan's start (16 keys) reached 3.3. Build with --build-cubins DIR --long.

    python3 scripts/decode_cold.py OUT.json --long [--cubin-dir DIR]

--deep-ab: the LLM workload's decode-cluster winners on caches under 16K keys (run 20261130-040923-ad22)
against the deep ring at the same cluster size (32 keys x 4 warps, 3 stages, COMBINE 3: the
decode-deep-ring stage's start), paired, cold: would that stage pay on shorter caches too?
Build with --build-cubins DIR --deep-ab.

    python3 scripts/decode_cold.py OUT.json --deep-ab [--rounds 9] [--cubin-dir DIR]

--vary KNOB=V1,V2 (with --mqa, --b1, --b8, --deep, --narrow or --long, both when building and timing): every point
of the sweep once per value of KNOB, e.g. --mqa --vary K_FIRST=0,1.

Importable: scripts/decode_overhead.py uses its cold timers (after init()).
"""
import sys, json, time, statistics
from pathlib import Path
sys.path.insert(0, "scripts")
import check_templates_gpu as C
import decode_sweep as DS
from nvrtc_compile_check import combo_label, load_templates
gqa = C.gqa
tpls = {t.rel: t for t in load_templates()}
split, cluster, wg = tpls["decode.cu"], tpls["decode_cluster.cu"], tpls["decode_wgmma.cu"]
gpu = cp = torch = None  # init(): the GPU is opened on first use, so --build-cubins needs none
L2_BYTES = 50e6
FULL_SHAPES = [gqa(1, 32, 8, 1, 4096, 128, False), gqa(8, 32, 1, 1, 4096, 128, False), gqa(8, 32, 8, 1, 4096, 128, False)]


def init(cubin_dir=None):
    global gpu, cp, torch
    if gpu is None:
        gpu = C.Gpu()
        cp, torch = gpu.cp, gpu.torch
    if cubin_dir:
        gpu.cubin_dir = Path(cubin_dir)
    return gpu


def full_points():
    """(template, knobs) of --full: every combination of decode-split, and of decode-cluster
    with the pushed combine (the pulled one lost at every measured point)."""
    return [(split, kn) for kn in split.knob_combos()] + [(cluster, kn) for kn in cluster.knob_combos() if kn["COMBINE"] == 1]


def mqa_points():
    """(template, knobs) of --mqa: BLOCK_N 16 (best or within 1% nearly everywhere in the
    earlier sweeps), the knobs that move bytes in flight, the combine, and M_TILES."""
    pts = [(split, dict(BLOCK_N=16, NUM_WARPS=w, STAGES=st, SPLIT_WAVES=sw, MIN_SPLIT_TILES=1, FUSED_COMBINE=f,
                        WARP_LOADS=wl, M_TILES=m))
           for m in (1, 2) for w in (4, 8) for st in (3, 4) for sw in (1, 2) for f in (0, 1) for wl in (0, 1)]
    pts += [(cluster, dict(BLOCK_N=16, NUM_WARPS=w, STAGES=st, CLUSTER=cl, COMBINE=cb, WARP_LOADS=wl, M_TILES=m))
            for cb in (2, 3) for m in (1, 2) for w in (4, 8) for st in (3, 4) for cl in (8, 4) for wl in (0, 1)]
    # Wider key slices with two row tiles: fewer key warps per row tile, so a smaller merge
    # (4 key warps' fp32 rows per row tile at 8 warps x 16 keys).
    pts += [(cluster, dict(BLOCK_N=bn, NUM_WARPS=w, STAGES=st, CLUSTER=cl, COMBINE=cb, WARP_LOADS=wl, M_TILES=2))
            for bn in (32, 64) for cb in (2, 3) for w in (4, 8) for st in (2, 3, 4) for cl in (8, 4) for wl in (0, 1)]
    return pts


# --wgmma: decode-wgmma's whole space against decode-cluster's winners (decode-wide's start for MQA,
# the LLM run's batch-1 points), on the shapes issue 17's 1.4x bar is about.
WGMMA_SHAPES = [gqa(8, 32, 1, 1, 4096, 128, True), gqa(1, 32, 8, 1, 4096, 128, True), gqa(1, 32, 8, 1, 1024, 128, True)]


def wgmma_points():
    return [(wg, kn) for kn in wg.knob_combos()] + [
        (cluster, dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=1)),
        (cluster, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=1)),
        (cluster, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=1)),
    ]


# --wide: speculative decode's query rows (SQ 8 and 16) fill the m64 tile: 64 packed rows per group.
# Does decode-wgmma (one accumulator for the 64 rows) beat decode-cluster (4 m16 row tiles over
# M_TILES x its CTAs) where its padding is gone?
WIDE_SHAPES = [gqa(8, 32, 8, 16, 4096, 128, True), gqa(1, 32, 8, 16, 4096, 128, True), gqa(8, 32, 4, 8, 4096, 128, True)]


def wide_points():
    return [(wg, dict(BLOCK_N=bn, STAGES=st, CLUSTER=cl, ROWS=rows))
            for bn in (128, 64) for st in (2, 3) for cl in (8, 4, 2) for rows in (64, 32)] + [
        (cluster, dict(BLOCK_N=bn, NUM_WARPS=w, STAGES=3, CLUSTER=cl, COMBINE=3, WARP_LOADS=wl, M_TILES=mt, K_FIRST=1))
        for bn in (16, 32) for w in (4, 8) for cl in (8, 4) for wl in (0, 1) for mt in (1, 2)]


def b8_points():
    """(template, knobs) of --b8: clusters of 2, 4 and 8 at 16 keys per warp, and the clusters of 2
    (the best region, 2026-11-28) over every tile shape: keys per warp x warps x stages."""
    pts = [(cluster, dict(BLOCK_N=16, NUM_WARPS=w, STAGES=st, CLUSTER=cl, COMBINE=cb, WARP_LOADS=wl))
           for cl in (2, 4, 8) for cb in (2, 3) for st in (2, 3, 4) for w in (4, 8) for wl in (0, 1)]
    pts += [(cluster, dict(BLOCK_N=bn, NUM_WARPS=w, STAGES=st, CLUSTER=2, COMBINE=cb, WARP_LOADS=wl))
            for bn in (16, 32, 64) for w in (2, 4, 8) for st in (2, 3, 4) for cb in (2, 3) for wl in (0, 1)
            if not (bn == 16 and w in (4, 8))]
    return pts


def b4_points():
    """(template, knobs) of --b4 (Llama-3 B 4 x SK 4096, 32 groups: clusters of 4 fill 128 SMs, of 2 half,
    of 8 two waves): decode-cluster at clusters of 2, 4 and 8 over tile shapes, both pushed combines,
    and decode-split around its stage's start (the 4-minute end-to-end run of session 33 kept it)."""
    pts = [(cluster, dict(BLOCK_N=bn, NUM_WARPS=w, STAGES=st, CLUSTER=cl, COMBINE=cb, WARP_LOADS=0))
           for cl in (4, 2, 8) for bn in (16, 32) for w in (4, 8) for st in (3, 4) for cb in (2, 3)]
    pts += [(split, dict(BLOCK_N=bn, NUM_WARPS=4, STAGES=st, SPLIT_WAVES=sw, MIN_SPLIT_TILES=2, FUSED_COMBINE=f))
            for bn in (16, 32) for st in (3, 4) for sw in (1, 2) for f in (0, 1)]
    return pts


def b1_points():
    """(template, knobs) of --b1: decode-cluster over every tile shape at clusters of 8 and 4."""
    return [(cluster, dict(BLOCK_N=bn, NUM_WARPS=w, STAGES=st, CLUSTER=cl, COMBINE=cb, WARP_LOADS=wl))
            for cl in (8, 4) for bn in (16, 32, 64) for w in (2, 4, 8) for st in (2, 3, 4) for cb in (2, 3) for wl in (0, 1)]


# --deep-ab: (shape, the LLM run's winner) on caches under 16K keys.
DEEP_AB = [
    (gqa(1, 32, 8, 1, 1024, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=0)),
    (gqa(1, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=0)),
    (gqa(8, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=2, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=0)),
    (gqa(8, 32, 8, 1, 4000, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=2, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=0)),
]


def deep_of(kn):
    """The deep ring at kn's cluster size."""
    return dict(kn, BLOCK_N=32, NUM_WARPS=4, STAGES=3, COMBINE=3)


LONG_SHAPES = [gqa(1, 32, 8, 1, 16384, 128, True), gqa(1, 32, 8, 1, 65536, 128, True), gqa(8, 32, 8, 1, 16384, 128, True)]


def long_points():
    """(template, knobs) of --long: 16, 32 and 64 keys per warp x 4 warps, 2-4 stages, the pushed
    combines 2 and 3, clusters of 8, 4 and 2 (the shared memory limit drops the largest rings)."""
    return [(cluster, dict(BLOCK_N=bn, NUM_WARPS=4, STAGES=st, CLUSTER=cl, COMBINE=cb, WARP_LOADS=0, M_TILES=1, K_FIRST=0))
            for cl in (8, 4, 2) for bn in (16, 32, 64) for st in (2, 3, 4) for cb in (2, 3) if 4 * bn * 512 * st <= 200 * 1024]


def deep_points(m_tiles):
    """(template, knobs) of --deep for shapes of m_tiles row tiles per CTA: decode-cluster at
    clusters of 8, 16 and 32 keys per warp, 3-8 stages (over the smem limit: not timed)."""
    return [(cluster, dict(BLOCK_N=bn, NUM_WARPS=w, STAGES=st, CLUSTER=8, COMBINE=cb, WARP_LOADS=wl, M_TILES=m_tiles))
            for bn in (16, 32) for w in (4, 8) for st in (3, 4, 5, 6, 7, 8) for cb in (2, 3) for wl in (0, 1)
            if not (m_tiles == 2 and w == 4 and bn == 16) and w // m_tiles * bn * 512 * st <= 220 * 1024]


DEEP_SHAPES = [(gqa(8, 32, 1, 1, 4096, 128, True), 2), (gqa(1, 32, 8, 1, 4096, 128, True), 1)]


def narrow_points():
    """(template, knobs) of --narrow: MQA's two row tiles on two warps, one key slice each (no merge
    of key warps; each warp alone on its scheduler for the last tile's math), 32 or 64 keys per
    tile, 3-8 stages, clusters of 8 and 4, both scatter and push combines."""
    return [(cluster, dict(BLOCK_N=bn, NUM_WARPS=2, STAGES=st, CLUSTER=cl, COMBINE=cb, WARP_LOADS=0, M_TILES=2))
            for bn in (32, 64) for st in (3, 4, 5, 6, 8) for cl in (8, 4) for cb in (3, 2) if bn * 512 * st <= 200 * 1024]


# The LLM workload's decode winners (run 20261128-051150-92f2, report's best-kernel table), causal
# as the workload has them: (shape, decode-cluster knobs).
KFIRST_WINNERS = [
    (gqa(1, 32, 8, 1, 1024, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1)),
    (gqa(1, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1)),
    (gqa(8, 32, 1, 1, 4096, 128, True), dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2)),
    (gqa(8, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=2, COMBINE=2, WARP_LOADS=0, M_TILES=1)),
    (gqa(8, 32, 8, 1, 16384, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1)),
    (gqa(64, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=4, COMBINE=2, WARP_LOADS=0, M_TILES=1)),
    # The MQA winner's tile with each warp copying its own keys off: K_FIRST's second barrier
    # is then the CTA's.
    (gqa(8, 32, 1, 1, 4096, 128, True), dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=0, M_TILES=2)),
]


def kfirst_points():
    return [(cluster, dict(kn, K_FIRST=kf)) for _, kn in KFIRST_WINNERS for kf in (0, 1)]


def paired_ab(out_json, rounds, rows, header):
    """Paired A/B, cold: for each (shape, label, a, b) of `rows` (a and b: (template, knobs)), both
    timed in each of `rounds` rounds, the order alternating; SDPA default cold beside. Prints one
    line per row (medians, the paired median of b / a, the rounds b won) and writes them to out_json."""
    t0 = time.time()
    res = []
    print(f"{gpu.name}; {rounds} rounds, cold (inputs rotated past L2), us per call", flush=True)
    print(f"{'shape':<40} {'knobs':<72} {'SDPA':>7} {header[0]:>11} {header[1]:>11} {'b / a':>6} {'b won':>5}", flush=True)
    for shape, label, a, b in rows:
        try:  # a side over the device's shared memory (or refused by its spec): the row is skipped
            for tpl, kn in (a, b):
                C.plan(tpl, kn, shape, gpu.dev)
        except C.DoesNotFit as e:
            print(f"{C.shape_key(shape):<40} {label:<72} skipped: {e}", flush=True)
            continue
        sd = sdpa_cold_us(shape)
        t = ([], [])
        for r in range(rounds):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                t[i].append(time_cold_us(*(a, b)[i], shape))
        ratios = [y / x for x, y in zip(*t)]
        won = sum(x < 1.0 for x in ratios)
        ma, mb, pr = statistics.median(t[0]), statistics.median(t[1]), statistics.median(ratios)
        print(f"{C.shape_key(shape):<40} {label:<72} {sd:7.2f} {ma:11.2f} {mb:11.2f} {pr:6.3f} {won:>2}/{rounds}", flush=True)
        res.append(dict(shape=C.shape_key(shape), knobs=label, sdpa_cold=sd, a=t[0], b=t[1], paired=pr))
    Path(out_json).write_text(json.dumps(dict(a=header[0], b=header[1], rows=res), indent=1))
    print(f"done in {time.time() - t0:.0f} s")


def knob_ab(out_json, rounds, knob, winners):
    """`knob` 0 (a) against 1 (b) at each (shape, decode-cluster knobs) of `winners`."""
    rows = [(shape, combo_label(kn), (cluster, dict(kn, **{knob: 0})), (cluster, dict(kn, **{knob: 1}))) for shape, kn in winners]
    paired_ab(out_json, rounds, rows, (f"{knob} 0", f"{knob} 1"))


# --against DIR: the decode winners (KFIRST_WINNERS, and MQA at decode-wide's start with K_FIRST 1)
# with this checkout's templates against those of DIR (an earlier kernel-templates/, e.g. from
# `git archive`): a change to the templates' code timed as a paired A/B, cold.
AGAINST_POINTS = KFIRST_WINNERS[:6] + [
    (gqa(8, 32, 1, 1, 4096, 128, True), dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2,
                                              K_FIRST=1)),
    # The deep ring (decode-deep-ring's start) on Llama-3 B 4 x SK 4096, its session-33 winner.
    (gqa(4, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=32, NUM_WARPS=4, STAGES=3, CLUSTER=2, COMBINE=3, WARP_LOADS=0, M_TILES=1,
                                              K_FIRST=0)),
]
# ... and decode-split's (decode.cu shares the merge, common/decode_split.cuh): B 64's winner.
AGAINST_SPLIT_POINTS = [
    (gqa(64, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=32, NUM_WARPS=4, STAGES=2, SPLIT_WAVES=2, MIN_SPLIT_TILES=1,
                                               FUSED_COMBINE=0, WARP_LOADS=0, M_TILES=1, K_FIRST=0)),
    (gqa(8, 32, 1, 1, 4096, 128, True), dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=1, MIN_SPLIT_TILES=2,
                                              FUSED_COMBINE=1, WARP_LOADS=0, M_TILES=1, K_FIRST=0)),
]

# ... and decode-wgmma's: MQA's point in the LLM runs (decode-wgmma-few's start) on MQA and B 1 x SK 4096,
# and speculative decoding's B 8 x SQ 16 at decode-wgmma's start.
AGAINST_WGMMA_POINTS = [
    (gqa(8, 32, 1, 1, 4096, 128, True), dict(BLOCK_N=128, STAGES=3, CLUSTER=8, ROWS=32)),
    (gqa(1, 32, 8, 1, 4096, 128, True), dict(BLOCK_N=128, STAGES=3, CLUSTER=8, ROWS=32)),
    (gqa(1, 32, 8, 1, 1024, 128, True), dict(BLOCK_N=64, STAGES=3, CLUSTER=8, ROWS=32)),
    (gqa(8, 32, 8, 16, 4096, 128, True), dict(BLOCK_N=64, STAGES=3, CLUSTER=2, ROWS=64)),
]


def _old_templates(old_root):
    tpls = {t.rel: t for t in load_templates(Path(old_root))}
    return tpls["decode_cluster.cu"], tpls["decode.cu"], tpls["decode_wgmma.cu"]


def against_points(old_root):
    old_cluster, old_split, old_wg = _old_templates(old_root)
    if "--wgmma-only" in sys.argv:
        return [(t, kn) for _, kn in AGAINST_WGMMA_POINTS for t in (wg, old_wg)]
    return ([(t, kn) for _, kn in AGAINST_POINTS for t in (cluster, old_cluster)]
            + [(t, kn) for _, kn in AGAINST_SPLIT_POINTS for t in (split, old_split)]
            + [(t, kn) for _, kn in AGAINST_WGMMA_POINTS for t in (wg, old_wg)])


def tree_ab(out_json, rounds, old_root):
    """DIR's decode templates (a) against this checkout's (b) at each AGAINST_POINTS (decode-cluster)
    and AGAINST_SPLIT_POINTS (decode-split) point."""
    old_cluster, old_split, old_wg = _old_templates(old_root)
    print(f"a = {old_root}, b = {cluster.root}", flush=True)
    rows = [] if "--wgmma-only" in sys.argv else [(shape, combo_label(kn), (old_cluster, kn), (cluster, kn)) for shape, kn in AGAINST_POINTS]
    rows += [] if "--wgmma-only" in sys.argv else [(shape, "split " + combo_label(kn), (old_split, kn), (split, kn)) for shape, kn in AGAINST_SPLIT_POINTS]
    rows += [(shape, "wgmma " + combo_label(kn), (old_wg, kn), (wg, kn)) for shape, kn in AGAINST_WGMMA_POINTS]
    paired_ab(out_json, rounds, rows, ("old", "new"))


def build_cubins(out_dir, points=None):
    """No GPU: compile --full's (or `points`') timed fp16 modules into out_dir with NVRTC from .deps."""
    import concurrent.futures as cf
    import os
    from nvrtc_compile_check import Job, _init_worker, arch_targets, default_cuda_include, default_nvrtc_lib
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    todo, seen = {}, set()
    for tpl, kn in (points if points is not None else full_points()):
        kn = tpl.complete(kn)  # a point may leave knobs at their first value, as Gpu.module does
        # Gpu.module loads one module per combination of the knobs the code uses (launch-only
        # knobs such as SPLIT_WAVES change no build): the first such combination's source.
        used = tuple((k, kn[k]) for k in C.code_knobs(tpl))
        if (tpl.path, used) in seen:  # the path: --against's two kernel-templates/ folders
            continue
        seen.add((tpl.path, used))
        src = C.build_source(tpl, kn, False)
        arch = arch_targets(tpl, ["sm_90"])[0]
        name = C.cubin_name(src, False, arch)
        if not (out / name).exists():
            todo[name] = Job(tpl.rel, kn, False, arch, False, src, tpl.kernel_names())
    t0, bad = time.time(), 0
    with cf.ProcessPoolExecutor(os.cpu_count(), initializer=_init_worker, initargs=(default_nvrtc_lib(), default_cuda_include())) as pool:
        for name, (ok, reason, cubin) in zip(list(todo), pool.map(C._cubin_job, list(todo.values()))):
            if ok:
                (out / name).write_bytes(cubin)
            else:
                bad += 1
                print(f"FAIL {name}: {reason[:300]}", flush=True)
    print(f"{len(todo) - bad} modules built into {out} ({bad} failed) in {time.time() - t0:.0f} s")
    return 1 if bad else 0


def full_sweep(out_json, points=None, shapes=None, top=4):
    t0 = time.time()
    res = []
    for shape in shapes or FULL_SHAPES:
        sd = sdpa_cold_us(shape)
        rows = []
        for tpl, kn in (points if points is not None else full_points()):
            try:
                rows.append((time_cold_us(tpl, kn, shape), tpl.name, combo_label(kn)))
            except C.DoesNotFit:
                continue
        rows.sort()
        kv = 2 * shape.b * shape.hkv * shape.sk * shape.d * 2
        print(f"{C.shape_key(shape)} KV {kv / 1e6:.1f} MB, {sets_for(shape)} input sets, {len(rows)} points; "
              f"SDPA default cold {sd:.2f} us", flush=True)
        for name in ("decode-split", "decode-cluster", "decode-wgmma"):
            for us, _, lab in [r for r in rows if r[1] == name][:top]:
                print(f"   {name:<15} cold {us:7.2f} us  {sd / us:4.2f}x SDPA  {kv / us / 1e6:5.2f} TB/s  {lab}", flush=True)
        res.append(dict(shape=C.shape_key(shape), sdpa_cold=sd, rows=rows))
    Path(out_json).write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t0:.0f} s")


def sets_for(shape):
    kv = 2 * shape.b * shape.hkv * shape.sk * shape.d * 2
    return max(2, min(24, int(3 * L2_BYTES // kv) + 1))


def warm_graph(launch_i, reps=24):
    """(stream, graph): a CUDA graph of `reps` calls launch_i(0) .. launch_i(reps - 1) (each
    launching on the current CuPy stream), captured after one uncaptured pass and replayed 3
    times on `stream`."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(reps):
            launch_i(i)
        stream.synchronize()
        stream.begin_capture()
        for i in range(reps):
            launch_i(i)
        graph = stream.end_capture()
        graph.upload(stream)
        for _ in range(3):
            graph.launch(stream)
    return stream, graph


def graph_us(launch_i, reps=24, samples=15):
    """Median us per call of warm_graph(launch_i, reps)'s graph, replayed `samples` times."""
    stream, graph = warm_graph(launch_i, reps)
    with stream:
        times = []
        for _ in range(samples):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1000.0 / reps)
    return statistics.median(times)


def time_cold_us(tpl, kn, shape, reps=24, samples=15):
    mod = gpu.module(tpl, kn, False, count=False)
    splits, launches, _ = C.plan(tpl, kn, shape, gpu.dev)
    n = sets_for(shape)
    bufs = [gpu.buffers(shape, splits, "fp16", fill=0.0, need_ref=False) for _ in range(n)]
    args = [gpu.launch_args(shape, splits, launches, *b[:6]) for b in bufs]
    kernels = [gpu.prepare(mod, l) for l in launches]
    torch.cuda.synchronize()

    def launch(i):
        for kern in kernels:
            gpu.launch(kern, args[i % n])
    return graph_us(launch, reps, samples)


def sdpa_cold_us(shape, reps=24, samples=15):
    n = sets_for(shape)
    fns = []
    for _ in range(n):
        q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)  # cached: copy, so each set has its own memory
        fns.append(C.sdpa_fn(gpu, shape, q.clone(), k.clone(), v.clone()))
    state = {"i": 0}

    def rotating():
        fns[state["i"] % n]()
        state["i"] += 1
    return C.time_torch_graph_us(gpu, rotating, reps, samples)


def main():
    init()
    t0 = time.time()
    records = DS.check_points(gpu, split, [dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=4, MIN_SPLIT_TILES=1, FUSED_COMBINE=f) for f in (0, 1)] + \
              [dict(BLOCK_N=32, NUM_WARPS=8, STAGES=2, SPLIT_WAVES=2, MIN_SPLIT_TILES=1, FUSED_COMBINE=0)])
    n, fails = len(records), sum(not r["ok"] for r in records)
    print(f"check: {n - fails} of {n} passed ({time.time() - t0:.0f} s)", flush=True)

    split_points = [dict(BLOCK_N=b, NUM_WARPS=w, STAGES=3, SPLIT_WAVES=sw, MIN_SPLIT_TILES=2, FUSED_COMBINE=f)
                    for b in (16, 32) for w in (4, 8) for sw in (1, 2, 4) for f in (0, 1)]
    cluster_points = [dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=1),
                      dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=2, COMBINE=1),
                      dict(BLOCK_N=16, NUM_WARPS=4, STAGES=2, CLUSTER=4, COMBINE=0)]
    shapes = [gqa(1, 32, 8, 1, 1024, 128, False), gqa(1, 32, 8, 1, 4096, 128, False), gqa(8, 32, 1, 1, 4096, 128, False),
              gqa(8, 32, 8, 1, 1024, 128, False)]
    res = []
    for shape in shapes:
        sd = sdpa_cold_us(shape)
        rows = []
        for tpl, pts in ((split, split_points), (cluster, cluster_points)):
            for kn in pts:
                try:
                    cold = time_cold_us(tpl, kn, shape)
                    hot = gpu.time_us(tpl, kn, shape, reps=10, samples=15)
                except C.DoesNotFit:
                    continue
                rows.append((cold, hot, tpl.name, combo_label(kn)))
        rows.sort()
        kv_mb = 2 * shape.b * shape.hkv * shape.sk * shape.d * 2 / 1e6
        print(f"{C.shape_key(shape)} KV {kv_mb:.1f} MB, {sets_for(shape)} input sets; SDPA default cold {sd:.2f} us", flush=True)
        for name in ("decode-split", "decode-cluster"):
            for cold, hot, _, lab in [r for r in rows if r[2] == name][:3]:
                print(f"   {name:<15} cold {cold:7.2f} ({sd / cold:4.2f}x SDPA)  hot {hot:7.2f}  {lab}", flush=True)
        res.append(dict(shape=C.shape_key(shape), sdpa_cold=sd, rows=rows))
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t0:.0f} s")


def vary(points):
    """--vary KNOB=V1,V2: each point once per value of KNOB (unchanged without the option)."""
    if "--vary" not in sys.argv:
        return points
    knob, _, vals = sys.argv[sys.argv.index("--vary") + 1].partition("=")
    return [(tpl, dict(kn, **{knob: int(v)})) for tpl, kn in points for v in vals.split(",")]


if __name__ == "__main__":
    if "--build-cubins" in sys.argv:
        pts = (mqa_points() if "--mqa" in sys.argv else b8_points() if "--b8" in sys.argv
               else [p for _, m in DEEP_SHAPES for p in deep_points(m)] if "--deep" in sys.argv
               else narrow_points() if "--narrow" in sys.argv
               else kfirst_points() if "--kfirst" in sys.argv
               else long_points() if "--long" in sys.argv
               else [(cluster, k) for _, kn in DEEP_AB for k in (kn, deep_of(kn))] if "--deep-ab" in sys.argv
               else against_points(sys.argv[sys.argv.index("--against") + 1]) if "--against" in sys.argv
               else b4_points() if "--b4" in sys.argv
               else wgmma_points() if "--wgmma" in sys.argv
               else wide_points() if "--wide" in sys.argv
               else b1_points() if "--b1" in sys.argv else None)
        sys.exit(build_cubins(sys.argv[sys.argv.index("--build-cubins") + 1], vary(pts) if pts is not None else None))
    if "--mqa" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1], vary(mqa_points()), [gqa(8, 32, 1, 1, 4096, 128, False)], top=10)
    elif "--b8" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1], vary(b8_points()), [gqa(8, 32, 8, 1, 4096, 128, False), gqa(8, 32, 8, 1, 4096, 128, True), gqa(8, 32, 8, 1, 4000, 128, True)], top=12)
    elif "--wgmma" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1], vary(wgmma_points()), WGMMA_SHAPES, top=8)
    elif "--wide" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1], wide_points(), WIDE_SHAPES, top=8)
    elif "--b4" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1], b4_points(), [gqa(4, 32, 8, 1, 4096, 128, False), gqa(4, 32, 8, 1, 4096, 128, True)], top=12)
    elif "--b1" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1], vary(b1_points()), [gqa(1, 32, 8, 1, 4096, 128, True), gqa(1, 32, 8, 1, 1024, 128, True)], top=12)
    elif "--deep" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        for shape, m in DEEP_SHAPES:
            full_sweep(sys.argv[1].replace(".json", f"_m{m}.json"), vary(deep_points(m)), [shape], top=12)
    elif "--deep-ab" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        rows = [(shape, combo_label(kn), (cluster, kn), (cluster, deep_of(kn))) for shape, kn in DEEP_AB]
        paired_ab(sys.argv[1], int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 9, rows,
                  ("winner", "deep ring"))
    elif "--long" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        for shape in LONG_SHAPES:
            pts = [p for p in vary(long_points()) if shape.b > 1 or p[1]["CLUSTER"] == 8]
            full_sweep(sys.argv[1].replace(".json", f"_{C.shape_key(shape)}.json"), pts, [shape], top=12)
    elif "--narrow" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1], vary(narrow_points()) + [(cluster, dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3,
                                                                   WARP_LOADS=1, M_TILES=2))],
                   [gqa(8, 32, 1, 1, 4096, 128, True)], top=12)
    elif "--kfirst" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        knob_ab(sys.argv[1], int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 9, "K_FIRST",
                KFIRST_WINNERS)
    elif "--against" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        tree_ab(sys.argv[1], int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 9,
                sys.argv[sys.argv.index("--against") + 1])
    elif "--full" in sys.argv:
        init(sys.argv[sys.argv.index("--cubin-dir") + 1] if "--cubin-dir" in sys.argv else None)
        full_sweep(sys.argv[1])
    else:
        main()
