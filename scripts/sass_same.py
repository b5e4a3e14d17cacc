#!/usr/bin/env python3
"""Whether two template points compile to the same machine code (CPU; no GPU): each side is a
templates folder and its knobs, rendered as the daemon renders them, compiled with NVRTC for the
template's target with one head dim's kernels, and disassembled with nvdisasm; the texts must be
equal, instruction for instruction (register allocation and scheduling included).

What it is for: a change that must not move a kernel (a refactor, a new knob at its old value,
a knob declared inert) proven before any device time, e.g. session 31's `WT_PERSISTENT`:

    python3 scripts/sass_same.py --template wgmma_tma.cu --d 128 \\
        --a kernel-templates BLOCK_N=128,PERSISTENT=1,CLUSTER_SPLIT=1 \\
        --b .dev/old/kernel-templates BLOCK_N=128,PERSISTENT=0,CLUSTER_SPLIT=1

Knobs not given take their first value (each side's spec). Exit status 0 when every --d is the
same, 1 when one differs (the first differing lines are printed), 2 on an error.

--b-define NAME=VALUE compiles side b with that macro too, and --hot-loops compares only each
kernel's hot loops (sass_loop_stats: their instruction count and mix by class, not the text):
what proves that a change outside the loops leaves them alone, e.g. the daemon's one build with
CTA counting compiled in against the export build without it (session 38):

    python3 scripts/sass_same.py --template decode.cu --d 128 --hot-loops \\
        --a kernel-templates "" --b kernel-templates "" --b-define OPTD_COUNT_CTAS=1
"""
import argparse
import difflib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvrtc_compile_check as ncc  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

HEAD_DIMS = (64, 96, 128, 256)


def sass(nvrtc: ncc.Nvrtc, root: Path, rel: str, knobs_arg: str, d: int, bf16: bool, defines: list[str] = ()) -> str:
    tpls = {t.rel: t for t in ncc.load_templates(root)}
    if rel not in tpls:
        raise sls.SassError(f"sass_same: no template {rel!r} under {root}")
    tpl = tpls[rel]
    knobs = sls.parse_knobs(tpl, knobs_arg or None)
    arch = ncc.specific_arch(tpl) or "sm_90"
    opts = [f"--gpu-architecture={arch}", "-std=c++17", f"--include-path={ncc.default_cuda_include()}"]
    opts += [f"-DOPTD_BUILD_D{x}=0" for x in HEAD_DIMS if x != d]
    opts += [f"-D{x}" for x in defines]
    ok, log, cubin = nvrtc.compile(ncc.render(tpl, knobs, bf16), tpl.rel.replace("/", "_"), opts)
    if not ok:
        raise sls.SassError(f"sass_same: {root}/{rel} ({ncc.combo_label(knobs)}) does not compile:\n{log}")
    return sls.disassemble(cubin)


def hot_loops(text: str) -> str:
    """Each kernel's hot loops as lines of their instruction count and mix by class (no
    addresses): equal when the loops are the same size and made of the same instructions."""
    lines = []
    for name, (insns, labels) in sls.parse_sass(text).items():
        for i, lp in enumerate(sls.hot_loops(insns, labels)):
            mix = {k: v for k, v in lp.as_dict().items() if k not in ("start", "end")}
            lines.append(f"{name} loop {i}: {mix}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", required=True, help="file under each templates folder, e.g. wgmma_tma.cu")
    ap.add_argument("--a", nargs=2, metavar=("DIR", "KNOBS"), required=True, help="templates folder and knobs (K=V,...)")
    ap.add_argument("--b", nargs=2, metavar=("DIR", "KNOBS"), required=True, help="the other side")
    ap.add_argument("--d", type=int, action="append", choices=HEAD_DIMS, help="head dim (repeat; default 64)")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--b-define", action="append", default=[], metavar="NAME=VALUE",
                    help="compile side b with this macro too (repeat)")
    ap.add_argument("--hot-loops", action="store_true",
                    help="compare only the kernels' hot loops (instruction count and mix), not the whole text")
    args = ap.parse_args()
    try:
        nvrtc = ncc.Nvrtc(ncc.default_nvrtc_lib())
        worst = 0
        for d in args.d or [64]:
            a = sass(nvrtc, Path(args.a[0]), args.template, args.a[1], d, args.bf16)
            b = sass(nvrtc, Path(args.b[0]), args.template, args.b[1], d, args.bf16, args.b_define)
            if args.hot_loops:
                a, b = hot_loops(a), hot_loops(b)
            if a == b:
                what = "hot loops" if args.hot_loops else "SASS"
                print(f"D {d}: same ({len(a.splitlines())} lines of {what})")
                continue
            worst = 1
            diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "a", "b", n=1, lineterm=""))
            print(f"D {d}: DIFFERENT ({len(a.splitlines())} vs {len(b.splitlines())} lines); first differences:")
            print("\n".join(diff[:20]))
        return worst
    except (sls.SassError, OSError, RuntimeError) as e:
        print(e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
