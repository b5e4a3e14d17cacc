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
import decode_sweep as DS  # noqa: E402
from nvrtc_compile_check import load_templates  # noqa: E402


def main() -> int:
    name = sys.argv[1]
    extra = C.CHECK_SHAPES + (C.EXTRA_CHECK_SHAPES if "--more" in sys.argv else [])
    gpu = C.Gpu()
    tpls = {t.rel: t for t in load_templates()}
    records = []
    for rel, knobs, shapes in C.POINT_SETS[name]:
        tpl = tpls[rel]
        records += DS.check_points(gpu, tpl, [tpl.complete(knobs)], list(shapes) + list(extra))
    bad = sum(not r["ok"] for r in records)
    print(f"{name}: {len(records)} checks, {bad} failures (points over the device's shared memory skipped)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
