#!/usr/bin/env python3
"""decode-split ROW_TILES = 2 (a CTA holds two 16-row tiles of packed query rows and both read
each K/V tile from shared memory) vs 1 on the GPU (issue 17, MQA): correctness on
decode_sweep.py's DECODE_CHECK shapes (GQA 1/4/8/32, SQ 1/3/4/16, ragged SK, both layouts,
padded views: a second row tile past the group's rows included) with both combines, then every
point's time (hot L2, CUDA graph) on MQA decode shapes beside SDPA default, the best three per
ROW_TILES and the 1/2 ratio over paired points.

    python3 scripts/decode_row_tiles.py OUT.json
"""
import sys, json, time
from pathlib import Path
sys.path.insert(0, "scripts")
import check_templates_gpu as C
import decode_sweep as DS
from nvrtc_compile_check import combo_label, load_templates
gqa = C.gqa
tpl = [t for t in load_templates() if t.rel == "decode.cu"][0]
gpu = C.Gpu()
t0 = time.time()
fails = n = 0
check_points = [dict(BLOCK_N=b, NUM_WARPS=w, STAGES=s, SPLIT_WAVES=sw, MIN_SPLIT_TILES=mt, FUSED_COMBINE=f, ROW_TILES=2)
                for (b, w, s, sw, mt, f) in [(16, 4, 3, 1, 2, 1), (32, 8, 3, 4, 1, 0), (16, 8, 2, 2, 1, 1), (64, 2, 2, 1, 1, 0)]]
for kn in check_points:
    for shape in DS.DECODE_CHECK + [gqa(8, 32, 1, 1, 4096, 128, True)]:
        for dt in ("fp16", "bf16"):
            try:
                ok, msg = gpu.check(tpl, kn, shape, dt)
            except C.DoesNotFit:
                continue
            except Exception as e:
                ok, msg = False, f"{type(e).__name__}: {e}"
            n += 1
            if not ok:
                fails += 1
                print("FAIL", combo_label(kn), C.shape_key(shape), dt, msg, flush=True)
print(f"check: {n - fails} of {n} passed ({time.time() - t0:.0f} s)", flush=True)

shapes = [gqa(8, 32, 1, 1, 4096, 128, False), gqa(1, 32, 1, 1, 16384, 128, False), gqa(4, 32, 1, 1, 8192, 128, False)]
res = []
for shape in shapes:
    q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
    sdpa = C.time_torch_graph_us(gpu, C.sdpa_fn(gpu, shape, q, k, v), 10, 15)
    rows = []
    for kn in tpl.knob_combos():
        if kn["BLOCK_N"] not in (16, 32) or kn["NUM_WARPS"] not in (4, 8) or kn["MIN_SPLIT_TILES"] not in (1, 2) \
                or kn["STAGES"] != 3 or kn["SPLIT_WAVES"] not in (1, 2):
            continue
        try:
            us = gpu.time_us(tpl, kn, shape, reps=10, samples=15)
            splits = C.plan(tpl, kn, shape, gpu.dev)[0]
        except C.DoesNotFit:
            continue
        rows.append((us, combo_label(kn), kn, splits))
    rows.sort(key=lambda r: r[0])
    kv_mb = 2 * shape.b * shape.hkv * shape.sk * shape.d * 2 / 1e6
    print(f"{C.shape_key(shape)} KV {kv_mb:.1f} MB sdpa {sdpa:.2f}", flush=True)
    for rt in (2, 1):
        for us, lab, _, splits in [r for r in rows if r[2]["ROW_TILES"] == rt][:3]:
            print(f"   ROW_TILES={rt} {us:7.2f} {sdpa / us:5.2f}x {kv_mb / us:5.2f} TB/s splits {splits:3d} {lab}")
    pairs = {}
    for us, lab, kn, _ in rows:
        key = tuple((k, v) for k, v in kn.items() if k != "ROW_TILES")
        pairs.setdefault(key, {})[kn["ROW_TILES"]] = us
    ratios = sorted(p[1] / p[2] for p in pairs.values() if 1 in p and 2 in p)
    if ratios:
        print(f"   ROW_TILES 1/2 time ratio over {len(ratios)} points: min {ratios[0]:.3f} "
              f"median {ratios[len(ratios) // 2]:.3f} max {ratios[-1]:.3f}", flush=True)
    res.append(dict(shape=C.shape_key(shape), sdpa=sdpa, rows=[(u, l, s) for u, l, _, s in rows]))
Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
print(f"done in {time.time() - t0:.0f} s")
