#!/usr/bin/env python3
"""decode.cu on the GPU: correctness on decode shapes and a knob sweep against SDPA.

Uses scripts/check_templates_gpu.py's Gpu (the daemon's ABI v2 launches, fp32 reference,
padded views, CTA counts) on the decode regime only:

  --check   every pairwise-covering knob combination (and the default point) of
            each --template (decode.cu, decode_cluster.cu) on DECODE_CHECK shapes (GQA 1/4/8/32, SQ 1/3/4/16, SK ragged and
            not, causal and not, both layouts, padded views), fp16 and bf16
  --time    every knob combination on the issue-17 decode shapes (fp16; bf16 moves
            the same bytes), CUDA-graph medians; SDPA default (enable_gqa) beside it;
            prints us and effective KV bandwidth (bytes of K and V / time), the best
            point per shape and the points with the best geomean over all shapes.

Results go to --out (JSON) as well as stdout.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_templates_gpu as C  # noqa: E402
from nvrtc_compile_check import combo_label, load_templates  # noqa: E402

gqa = C.gqa
DECODE_CHECK = [
    gqa(2, 32, 8, 1, 1024, 128, False),
    gqa(1, 32, 8, 1, 4000, 128, True, "bshd"),
    gqa(2, 8, 1, 4, 999, 128, True, padded=True),
    gqa(1, 4, 4, 16, 2048, 64, True, "bshd", padded=True),
    gqa(8, 32, 8, 1, 16384, 128, False),
    gqa(8, 32, 1, 1, 4096, 128, True, padded=True),
    gqa(1, 32, 8, 4, 4096, 128, True),
    gqa(2, 32, 8, 4, 4096, 128, False, "bshd"),
    gqa(1, 32, 1, 4, 4000, 128, True, "bshd", padded=True),
    gqa(2, 16, 2, 3, 333, 64, True),
    gqa(1, 1, 1, 1, 5, 64, True),
    gqa(1, 8, 8, 1, 100, 128, True),
    gqa(3, 16, 2, 16, 16, 64, True, padded=True),
]
# Issue 17's decode shapes: Llama-3-8B heads (32 / 8), D 128, SQ 1, plus MQA and a ragged cache.
DECODE_TIME = [gqa(b, 32, 8, 1, sk, 128, False) for b in (1, 8, 64) for sk in (1024, 4096, 16384)] + [
    gqa(8, 32, 1, 1, 4096, 128, False), gqa(8, 32, 8, 1, 4000, 128, True)]


def check_points(gpu: "C.Gpu", tpl, points: list[dict], shapes: list | None = None) -> list[dict]:
    """Check `tpl` at every knob point on `shapes` (DECODE_CHECK by default), fp16 and bf16,
    against the fp32 reference; points that do not fit the device are skipped. Prints each
    failure; returns one record per check (template, knobs, shape, dtype, ok, msg)."""
    records = []
    for knobs in points:
        for shape in DECODE_CHECK if shapes is None else shapes:
            for dtype in ("fp16", "bf16"):
                try:
                    ok, msg = gpu.check(tpl, knobs, shape, dtype)
                except C.DoesNotFit:
                    continue
                except Exception as e:  # noqa: BLE001
                    ok, msg = False, f"{type(e).__name__}: {e}"
                records.append(dict(template=tpl.rel, knobs=knobs, shape=C.shape_key(shape), dtype=dtype, ok=ok, msg=msg))
                if not ok:
                    print(f"FAIL {tpl.rel} {combo_label(knobs)} {C.shape_key(shape)} {dtype}: {msg}", flush=True)
    return records


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--cubin-dir")
    ap.add_argument("--template", action="append", help="decode.cu (default) and/or decode_cluster.cu")
    ap.add_argument("--space", help="JSON {knob: [values]} restricting the timed combinations (knobs a template lacks are ignored)")
    ap.add_argument("--out", default="decode_sweep.json")
    args = ap.parse_args()
    wanted = args.template or ["decode.cu"]
    tpls = [t for t in load_templates() if t.rel in wanted]
    space = json.loads(args.space) if args.space else {}
    gpu = C.Gpu()
    if args.cubin_dir:
        gpu.cubin_dir = Path(args.cubin_dir)
    print(f"{gpu.name}: {gpu.dev}", flush=True)
    out: dict = {"device": gpu.name, "check": [], "time": []}
    t0 = time.perf_counter()
    failures = 0
    for tpl in tpls if args.check else []:
        combos = C.pairwise_combos(tpl)
        default = {k: v[0] for k, v in tpl.spec["knobs"].items()}
        if default not in combos:
            combos.insert(0, default)
        records = check_points(gpu, tpl, combos)
        out["check"] += records
        bad = sum(not r["ok"] for r in records)
        failures += bad
        print(f"check {tpl.rel}: {len(records) - bad} of {len(records)} passed ({len(combos)} combos x {len(DECODE_CHECK)} shapes x 2 dtypes, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
    if args.time:
        points = [(t, kn) for t in tpls for kn in t.knob_combos()
                  if all(kn[k] in vs for k, vs in space.items() if k in kn)]
        for shape in DECODE_TIME:
            q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
            sdpa = C.time_torch_graph_us(gpu, C.sdpa_fn(gpu, shape, q, k, v), 10, 15)
            rows = []
            for tpl, knobs in points:
                try:
                    us = gpu.time_us(tpl, knobs, shape, reps=10, samples=12)
                except C.DoesNotFit:
                    continue
                except Exception as e:  # noqa: BLE001
                    print(f"  timing failed: {tpl.rel} {combo_label(knobs)}: {type(e).__name__}: {e}", flush=True)
                    continue
                splits = C.plan(tpl, knobs, shape, gpu.dev)[0]
                rows.append((us, tpl.rel, knobs, splits))
            rows.sort(key=lambda r: r[0])
            mb = shape.kv_bytes() / 1e6
            print(f"{C.shape_key(shape):34} KV {mb:7.1f} MB  sdpa {sdpa:8.2f} us {shape.kv_bytes() / sdpa / 1e6:5.2f} TB/s",
                  flush=True)
            for rel in [t.rel for t in tpls]:
                for us, r, knobs, splits in [x for x in rows if x[1] == rel][:3]:
                    print(f"    {us:8.2f} us {shape.kv_bytes() / us / 1e6:5.2f} TB/s {sdpa / us:5.2f}x  {rel:18} "
                          f"{combo_label(knobs)} splits {splits}", flush=True)
            out["time"].append(dict(shape=C.shape_key(shape), kv_mb=mb, sdpa_us=sdpa,
                                    rows=[dict(us=us, template=r, knobs=kn, splits=s) for us, r, kn, s in rows]))
        # Points by geomean speedup over SDPA across every shape they fit.
        score: dict = {}
        for t in out["time"]:
            for r in t["rows"]:
                score.setdefault(r["template"] + " " + combo_label(r["knobs"]), []).append(t["sdpa_us"] / r["us"])
        full = [(math.exp(sum(map(math.log, v)) / len(v)), k) for k, v in score.items() if len(v) == len(out["time"])]
        full.sort(reverse=True)
        print("best geomean speedup over SDPA on every shape:")
        for g, k in full[:8]:
            print(f"    {g:5.2f}x  {k}")
    print(f"total {time.perf_counter() - t0:.0f} s (compile {gpu.compile_s:.0f} s, cubins loaded {gpu.cubins_loaded})")
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
