#!/usr/bin/env python3
"""Check the points of a --time-best point set (check_templates_gpu.py POINT_SETS) for correctness
on the GPU machine: each point on its own timed shapes and on the checker's shapes (CHECK_SHAPES,
--more: EXTRA_CHECK_SHAPES too), fp16 and bf16, against the fp32 reference. --time-best times points
without checking them; a point that is recommended (a plan's space, a note) is checked here first.

    python3 scripts/check_points.py causal_ring [--more]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_templates_gpu as C  # noqa: E402
from nvrtc_compile_check import combo_label, load_templates  # noqa: E402


def main() -> int:
    name = sys.argv[1]
    shapes_extra = C.CHECK_SHAPES + (C.EXTRA_CHECK_SHAPES if "--more" in sys.argv else [])
    gpu = C.Gpu()
    tpls = {t.rel: t for t in load_templates()}
    n = bad = skipped = 0
    for rel, knobs, shapes in C.POINT_SETS[name]:
        tpl = tpls[rel]
        full = dict(tpl.knob_combos()[0], **knobs)
        for shape in list(shapes) + list(shapes_extra):
            for dtype in ("fp16", "bf16"):
                try:
                    ok, msg = gpu.check(tpl, full, shape, dtype)
                except C.DoesNotFit:
                    skipped += 1
                    continue
                n += 1
                if not ok:
                    bad += 1
                    print(f"FAIL {rel} {combo_label(knobs)} {C.shape_key(shape)} {dtype}: {msg}", flush=True)
    print(f"{name}: {n} checks, {bad} failures, {skipped} skipped (over the device's shared memory)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
