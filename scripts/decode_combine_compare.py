#!/usr/bin/env python3
"""decode-cluster COMBINE = 1 (push) vs 0 (pull) on the GPU (issue 17): correctness on decode_sweep.py's
DECODE_CHECK shapes at a few knob points, then every point's time (hot L2, CUDA graph) on the
Llama-3 decode shapes, the best three per combine and the pull/push ratio over paired points.

    python3 scripts/decode_combine_compare.py OUT.json
"""
import sys, json, time
from pathlib import Path
sys.path.insert(0, "scripts")
import check_templates_gpu as C
import decode_sweep as DS
from nvrtc_compile_check import combo_label, load_templates
gqa = C.gqa
tpl = [t for t in load_templates() if t.rel == "decode_cluster.cu"][0]
gpu = C.Gpu()
t0 = time.time()
check_points = [dict(BLOCK_N=b, NUM_WARPS=w, STAGES=s, CLUSTER=c, COMBINE=1)
                for (b, w, s, c) in [(32, 4, 3, 8), (16, 8, 3, 8), (16, 8, 2, 2), (64, 2, 2, 4), (16, 4, 2, 8), (32, 2, 3, 2)]]
records = DS.check_points(gpu, tpl, check_points)
n, fails = len(records), sum(not r["ok"] for r in records)
print(f"check: {n - fails} of {n} passed ({time.time() - t0:.0f} s)", flush=True)
shapes = [gqa(1, 32, 8, 1, 1024, 128, False), gqa(1, 32, 8, 1, 4096, 128, False), gqa(8, 32, 1, 1, 4096, 128, False),
          gqa(8, 32, 8, 1, 1024, 128, False), gqa(8, 32, 8, 1, 4096, 128, False), gqa(1, 32, 8, 1, 16384, 128, False)]
res = []
for shape in shapes:
    q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
    sdpa = C.time_torch_graph_us(gpu, C.sdpa_fn(gpu, shape, q, k, v), 10, 15)
    rows = []
    for kn in tpl.knob_combos():
        if kn["BLOCK_N"] not in (16, 32) or kn["NUM_WARPS"] not in (4, 8) or kn["STAGES"] not in (2, 3):
            continue
        try:
            us = gpu.time_us(tpl, kn, shape, reps=10, samples=15)
        except C.DoesNotFit:
            continue
        rows.append((us, combo_label(kn), kn))
    rows.sort(key=lambda r: r[0])
    print(f"{C.shape_key(shape)} sdpa {sdpa:.2f}", flush=True)
    for comb in (1, 0):
        best = [r for r in rows if r[2]["COMBINE"] == comb][:3]
        for us, lab, _ in best:
            print(f"   COMBINE={comb} {us:7.2f} {sdpa / us:5.2f}x {lab}")
    # paired: each pull point vs its push twin
    pairs = {}
    for us, lab, kn in rows:
        key = tuple((k, v) for k, v in kn.items() if k != "COMBINE")
        pairs.setdefault(key, {})[kn["COMBINE"]] = us
    ratios = sorted(p[0] / p[1] for p in pairs.values() if 0 in p and 1 in p)
    if ratios:
        print(f"   pull/push time ratio over {len(ratios)} points: min {ratios[0]:.3f} median {ratios[len(ratios)//2]:.3f} max {ratios[-1]:.3f}")
    res.append(dict(shape=C.shape_key(shape), sdpa=sdpa, rows=[(u, l) for u, l, _ in rows]))
Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
