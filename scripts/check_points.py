#!/usr/bin/env python3
"""Check the points of a --time-best point set (check_templates_gpu.py POINT_SETS) for correctness
on the GPU machine: each point on its own timed shapes and on the checker's shapes (CHECK_SHAPES,
--more: EXTRA_CHECK_SHAPES too), fp16 and bf16, against the fp32 reference. --time-best times points
without checking them; a point that is recommended (a plan's space, a note) is checked here first.

    python3 scripts/check_points.py causal_ring [--more] [--windows]

Another compiler's cubins (e.g. a newer NVRTC than the GPU machine's, chosen here with
OPTIMIZERD_NVRTC_LIB): build the point set's check builds on the CPU machine, then check exactly
those on the GPU machine (a missing or refused cubin is an error, never an in-process compile):

    here:  OPTIMIZERD_NVRTC_LIB=... python3 scripts/check_points.py pv_wait --build-cubins .dev/cp
    there: python3 scripts/check_points.py pv_wait --cubin-dir .dev/cp
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_templates_gpu as C  # noqa: E402
import decode_sweep as DS  # noqa: E402
from nvrtc_compile_check import load_templates  # noqa: E402


def check_jobs(name: str, templates=None) -> dict:
    """The check builds of point set `name` (fp16 and bf16, CTA-counting: what Gpu.check loads;
    the source does not depend on the shape), by the cubin file name Gpu.module looks up."""
    from nvrtc_compile_check import Job

    tpls = {t.rel: t for t in (templates or load_templates())}
    todo = {}
    for rel, knobs, _ in C.POINT_SETS[name]:
        tpl = tpls[rel]
        arch = C.arch_targets(tpl, ["sm_90"])[0]
        kn = tpl.complete(knobs)
        for bf16 in (False, True):
            src = C.build_source(tpl, kn, bf16)
            todo[C.cubin_name(src, True, arch)] = Job(rel, kn, bf16, arch, True, src, tpl.kernel_names())
    return todo


def build(name: str, out_dir: Path, jobs: int) -> int:
    """No GPU: the cubins `check` loads for the set's points (check_jobs)."""
    from nvrtc_compile_check import default_nvrtc_lib

    todo = check_jobs(name)
    bad = C.compile_cubins(todo, out_dir, jobs)
    print(f"{name}: built {len(todo) - bad} check cubins in {out_dir} with {default_nvrtc_lib()}, {bad} failures")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("points", choices=sorted(C.POINT_SETS), help="a --points set of check_templates_gpu.py")
    ap.add_argument("--more", action="store_true", help="EXTRA_CHECK_SHAPES too")
    ap.add_argument("--windows", action="store_true",
                    help="WINDOW_CHECK_SHAPES too, for the templates that implement the sliding window")
    ap.add_argument("--build-cubins", metavar="DIR", help="no GPU: build the set's check cubins into DIR")
    ap.add_argument("--cubin-dir", metavar="DIR", help="check the cubins of DIR only (see --build-cubins)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="--build-cubins processes")
    args = ap.parse_args()
    if args.build_cubins:
        return build(args.points, Path(args.build_cubins), args.jobs)

    extra = C.CHECK_SHAPES + (C.EXTRA_CHECK_SHAPES if args.more else [])
    gpu = C.Gpu()
    if args.cubin_dir:
        gpu.cubin_dir, gpu.cubins_only = Path(args.cubin_dir), True
    tpls = {t.rel: t for t in load_templates()}
    records = []
    for rel, knobs, shapes in C.POINT_SETS[args.points]:
        tpl = tpls[rel]
        windowed = C.window_shapes(tpl) if args.windows else []
        records += DS.check_points(gpu, tpl, [tpl.complete(knobs)], list(shapes) + list(extra) + windowed)
    bad = sum(not r["ok"] for r in records)
    src = f", {gpu.cubins_loaded} modules from {args.cubin_dir}" if args.cubin_dir else ""
    print(f"{args.points}: {len(records)} checks, {bad} failures (points over the device's shared memory skipped){src}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
