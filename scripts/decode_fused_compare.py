#!/usr/bin/env python3
"""decode-split FUSED_COMBINE = 1 (the last CTA of each group combines, one launch) vs 0 (a
second combine launch) on the GPU (issue 17): correctness on decode_sweep.py's DECODE_CHECK
shapes at knob points that make few and many splits (the check also verifies that the split
semaphores are zero again after the launch), then every point's time (hot L2, CUDA graph) on
the Llama-3 decode shapes beside SDPA default and decode-cluster's best points, the best three
per combine and the two-launch/fused ratio over paired points.

    python3 scripts/decode_fused_compare.py OUT.json
"""
import sys, json, time
from pathlib import Path
sys.path.insert(0, "scripts")
import check_templates_gpu as C
import decode_sweep as DS
from nvrtc_compile_check import combo_label, load_templates
gqa = C.gqa
tpls = {t.rel: t for t in load_templates()}
tpl = tpls["decode.cu"]
cluster = tpls["decode_cluster.cu"]
gpu = C.Gpu()
t0 = time.time()
# (BLOCK_N, NUM_WARPS, STAGES, SPLIT_WAVES, MIN_SPLIT_TILES): few splits, many (SPLIT_WAVES 4,
# one tile each: up to 64+ splits, more than one combine pass of 32 lanes), 8 warps.
check_points = [dict(BLOCK_N=b, NUM_WARPS=w, STAGES=s, SPLIT_WAVES=sw, MIN_SPLIT_TILES=mt, FUSED_COMBINE=1)
                for (b, w, s, sw, mt) in [(16, 4, 3, 1, 2), (32, 4, 3, 4, 1), (16, 8, 2, 2, 1), (64, 2, 2, 1, 1), (16, 2, 3, 4, 1)]]
records = DS.check_points(gpu, tpl, check_points)
n, fails = len(records), sum(not r["ok"] for r in records)
print(f"check: {n - fails} of {n} passed ({time.time() - t0:.0f} s)", flush=True)

shapes = [gqa(1, 32, 8, 1, 1024, 128, False), gqa(1, 32, 8, 1, 4096, 128, False), gqa(8, 32, 1, 1, 4096, 128, False),
          gqa(8, 32, 8, 1, 1024, 128, False), gqa(8, 32, 8, 1, 4096, 128, False), gqa(1, 32, 8, 1, 16384, 128, False)]
cluster_points = [dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=1),
                  dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=1),
                  dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=2, COMBINE=1),
                  dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=4, COMBINE=0)]
res = []
for shape in shapes:
    q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
    sdpa = C.time_torch_graph_us(gpu, C.sdpa_fn(gpu, shape, q, k, v), 10, 15)
    rows = []
    for kn in tpl.knob_combos():
        if kn["BLOCK_N"] not in (16, 32) or kn["NUM_WARPS"] not in (4, 8) or kn["STAGES"] != 3 \
                or kn["MIN_SPLIT_TILES"] not in (1, 2):
            continue
        try:
            us = gpu.time_us(tpl, kn, shape, reps=10, samples=15)
            splits = C.plan(tpl, kn, shape, gpu.dev)[0]
        except C.DoesNotFit:
            continue
        rows.append((us, combo_label(kn), kn, splits))
    rows.sort(key=lambda r: r[0])
    crow = []
    for kn in cluster_points:
        try:
            crow.append((gpu.time_us(cluster, kn, shape, reps=10, samples=15), combo_label(kn)))
        except C.DoesNotFit:
            pass
    crow.sort()
    kv_mb = 2 * shape.b * shape.hkv * shape.sk * shape.d * 2 / 1e6
    print(f"{C.shape_key(shape)} KV {kv_mb:.1f} MB sdpa {sdpa:.2f}", flush=True)
    for fused in (1, 0):
        for us, lab, _, splits in [r for r in rows if r[2]["FUSED_COMBINE"] == fused][:3]:
            print(f"   FUSED={fused} {us:7.2f} {sdpa / us:5.2f}x {kv_mb / us:5.2f} TB/s splits {splits:3d} {lab}")
    for us, lab in crow[:2]:
        print(f"   cluster {us:7.2f} {sdpa / us:5.2f}x {lab}")
    pairs = {}
    for us, lab, kn, _ in rows:
        key = tuple((k, v) for k, v in kn.items() if k != "FUSED_COMBINE")
        pairs.setdefault(key, {})[kn["FUSED_COMBINE"]] = us
    ratios = sorted(p[0] / p[1] for p in pairs.values() if 0 in p and 1 in p)
    if ratios:
        print(f"   two-launch/fused time ratio over {len(ratios)} points: min {ratios[0]:.3f} "
              f"median {ratios[len(ratios) // 2]:.3f} max {ratios[-1]:.3f}", flush=True)
    res.append(dict(shape=C.shape_key(shape), sdpa=sdpa, rows=[(u, l, s) for u, l, _, s in rows], cluster=crow))
Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
print(f"done in {time.time() - t0:.0f} s")
