#!/usr/bin/env python3
"""Where a ragged tail's time goes in wgmma_tma.cu (issue 19's S 577): the template with parts of
the last query tile's work cut out of its source (outputs wrong by construction: timing only),
timed against the unmodified template on shapes with and without a tail.

    python3 scripts/wgmma_tail_ablation.py [OUT.txt]

Variants (each a copy of kernel-templates/ under a temporary folder, compiled on the GPU machine):
  split        the template, TAIL_SPLIT 1
  nosplit      the template, TAIL_SPLIT 0 (consumer 0 walks the tail's key tiles alone)
  no_compute   a tail tile (<= 64 rows) computes nothing: its K/V tiles are loaded, waited for and
               released, the merge and epilogue run
  no_load      a tail tile loads and computes nothing: only its Q load, merge and epilogue remain
Times: CUDA graphs of back-to-back launches, median of 20 replays, 5 rounds alternating the variants,
fp16, the median over rounds; SDPA default timed the same way.
"""
import shutil, statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_templates_gpu as C
from nvrtc_compile_check import load_templates

ROOT = Path(__file__).resolve().parent.parent
EDITS = {
    "no_compute": [("for (int t = split_tile ? c : 0; t < n_wg; t += step)",
                    "for (int t = split_tile ? c : 0; t < (split_tile ? 0 : n_wg); t += step)")],
    "no_load": [("return max(mask.keys_before((m_block + 1) * WT_BLOCK_M) + BLOCK_N - 1, 0) / BLOCK_N;",
                 "return seq_q - m_block * WT_BLOCK_M <= 64 ? 0 : max(mask.keys_before((m_block + 1) * WT_BLOCK_M) + BLOCK_N - 1, 0) / BLOCK_N;"),
                ("const int n_wg = row0 >= seq_q ? 0 :", "const int n_wg = (row0 >= seq_q || split) ? 0 :")],
}
KNOBS = dict(BLOCK_N=128, STAGES=2, CONSUMERS=3, PINGPONG=1, OVERLAP=1, PERSISTENT=1, LAZY_RESCALE=1)
SHAPES = C.mhas([(32, 16, 576, 64, False), (32, 16, 577, 64, False), (32, 16, 640, 64, False)])


def variant_template(tmp: Path, name: str):
    root = tmp / name / "kernel-templates"
    shutil.copytree(ROOT / "kernel-templates", root)
    src = (root / "wgmma_tma.cu").read_text()
    for old, new in EDITS.get(name, []):
        if old not in src:
            raise SystemExit(f"{name}: the template no longer has {old!r}")
        src = src.replace(old, new)
    (root / "wgmma_tma.cu").write_text(src)
    return [t for t in load_templates(root) if t.rel == "wgmma_tma.cu"][0]


def main() -> int:
    gpu = C.Gpu()
    tmp = Path(tempfile.mkdtemp())
    variants = {"split": (variant_template(tmp, "split"), dict(KNOBS, TAIL_SPLIT=1)),
                "nosplit": (variant_template(tmp, "nosplit"), dict(KNOBS, TAIL_SPLIT=0)),
                "no_compute": (variant_template(tmp, "no_compute"), dict(KNOBS, TAIL_SPLIT=1)),
                "no_load": (variant_template(tmp, "no_load"), dict(KNOBS, TAIL_SPLIT=1))}
    lines = [f"wgmma_tma tail ablation, {gpu.name}, knobs {C.combo_label(KNOBS)}, fp16, us (median of 5 rounds)",
             f"{'shape':22} " + " ".join(f"{n:>10}" for n in variants) + f" {'sdpa':>10}"]
    print(lines[0], flush=True)
    for shape in SHAPES:
        q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
        times = {n: [] for n in list(variants) + ["sdpa"]}
        for r in range(5):
            order = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for n in order:
                tpl, kn = variants[n]
                times[n].append(gpu.time_us(tpl, kn, shape, reps=10, samples=20))
            times["sdpa"].append(C.time_torch_graph_us(gpu, C.sdpa_fn(gpu, shape, q, k, v), 10, 20))
        line = f"{C.shape_key(shape):22} " + " ".join(f"{statistics.median(times[n]):10.2f}" for n in times)
        lines.append(line)
        print(line, flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
