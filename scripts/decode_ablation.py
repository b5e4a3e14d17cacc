#!/usr/bin/env python3
"""Where inside a decode kernel the time goes (issue 17): the same kernel with parts cut out.

    python3 scripts/decode_ablation.py OUT.json [--against DIR] [--only VARIANT,..]

--knob NAME=V[,NAME2=V2..]: an A/B of a knob setting instead of the cuts: each point is checked
with it (fp16 and bf16, DECODE_CHECK shapes), then timed as given and with it, --rounds times
(default 4), and the per-shape ratio printed last.

--sq4: also time Llama-3-8B speculative decode (SQ 4 against SK 4096, B 1 and 8, causal): G * SQ
= 32 packed rows per KV head, like MQA's.

--against DIR: instead of the cuts, an A/B of this tree's templates against those in DIR (e.g. an
earlier commit's kernel-templates, `git archive`d): both versions' fused points checked first, then
the points timed from each, --rounds times (default 4), and the per-shape ratio printed last.

Both A/Bs swap which version goes first every round: whichever is timed second in a round ran
~0.6% faster on the H100 (2026-11-28: decode-split points whose code had not changed came out
0.994 with the old version always first), so a fixed order biases a small effect; an even
--rounds balances it in the medians.

scripts/decode_overhead.py found the decode templates 3-4 us per call above a plain streaming read
of the same bytes. This times each template's best point for the missing bars with parts of its
source removed (patched into the rendered source here; the templates are untouched), cold as the
benchmark times decode, so the differences say what each part costs:
  full        the kernel as the daemon builds it;
  no_combine  decode-split FUSED_COMBINE: the partial O rows and LSEs are still stored, but the
              fence, the split semaphore and the last CTA's combine are skipped;
  no_tail     everything after decode_split_tile returns (decode-split: the partial stores too;
              decode-cluster: the push to rank 0 and its combine);
  no_math     the key loop keeps its loads, waits and barriers but skips S = Q K^T, the softmax and
              O += P V (the merge and what follows still run, on zeros);
  loads_only  no_math and no_tail: the Q and K/V copies, their waits and the merge's barriers;
  no_fence    decode-split FUSED_COMBINE without a per-thread __threadfence() before the split
              semaphore (measured 2026-11-26: 0.4 us faster, checked; the template has had no
              fence there since, so on today's source this variant equals `full`).
The outputs of every variant but `full` and `no_fence` are wrong by construction: timing only.
`no_fence` is a candidate change, so it is also checked (decode_sweep's DECODE_CHECK shapes, fp16
and bf16, at the fused points) before it is timed.
"""
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, "scripts")
import decode_cold as DC  # noqa: E402

C, gqa = DC.C, DC.gqa
gpu = DC.init()

# no_math: every warp skips every tile's math (and, with K_FIRST, the wait for its V: the next
# tile's wait for its K still waits for it, the groups completing in order).
LOOP_BODY = "        if (!K_FIRST && !live) continue;\n"
# The ends of the decode_split_tile<D>(...) calls (their argument lists wrap since ABI v3's window).
SPLIT_TAIL = "t_end, [] {});\n\n    // Sum the key warps' copies of each valid row"
SPLIT_COMBINE = "    if (!dec_arrive_last(sem, n_splits)) return;\n"
CLUSTER_TAIL = "t_end, arm);\n\n    float* xo"

# variant -> [(template name or None for both, old, new)]: each patch of a variant must apply to
# the source of the template it names (a template edit that moves the text fails loudly instead
# of timing the full kernel under a cut's name).
PATCHES = {
    "full": [],
    "no_combine": [("decode-split", SPLIT_COMBINE, "    return;\n")],
    "no_tail": [("decode-split", SPLIT_TAIL, SPLIT_TAIL.replace(";\n\n", ";\n    return;\n\n", 1)),
                ("decode-cluster", CLUSTER_TAIL, CLUSTER_TAIL.replace(";\n\n", ";\n    return;\n\n", 1))],
    "no_math": [(None, LOOP_BODY, "        continue;\n")],
}
PATCHES["loads_only"] = PATCHES["no_math"] + PATCHES["no_tail"]
# The fence this variant removed has been gone from decode.cu since 2026-11-26: the variant is
# the full kernel now, kept so that older transcripts' names still mean something.
PATCHES["no_fence"] = []

variant = {"name": "full"}
_build = C.build_source


def build_source(tpl, knobs, bf16, mbar_fault=False):
    src = _build(tpl, knobs, bf16, mbar_fault)
    for name, old, new in PATCHES[variant["name"]]:
        if name is not None and name != tpl.name:
            continue
        if old not in src:
            raise RuntimeError(f"decode_ablation: variant {variant['name']}: no `{old.strip()[:60]}` in {tpl.name}'s source; "
                               "the template changed, update the patch")
        src = src.replace(old, new)
    return src


C.build_source = build_source

POINTS = [
    (DC.split, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=1, MIN_SPLIT_TILES=2, FUSED_COMBINE=1)),
    (DC.split, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, SPLIT_WAVES=1, MIN_SPLIT_TILES=1, FUSED_COMBINE=0)),
    # The LLM benchmark's decode-cluster winners (COMBINE 2 since 2026-11-28), and MQA's best
    # point of the 2026-11-28 sweep (scripts/decode_cold.py --mqa).
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=8, COMBINE=2)),
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=2, COMBINE=2)),
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=4, COMBINE=2, WARP_LOADS=1)),
    (DC.cluster, dict(BLOCK_N=16, NUM_WARPS=8, STAGES=4, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2)),
    # decode-wide's start since 2026-11-28 (the LLM run's MQA winner).
    (DC.cluster, dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2)),
]
SHAPES = [gqa(1, 32, 8, 1, 1024, 128, False), gqa(1, 32, 8, 1, 4096, 128, False), gqa(1, 32, 8, 1, 16384, 128, False),
          gqa(8, 32, 1, 1, 4096, 128, False), gqa(8, 32, 8, 1, 4096, 128, False)]
if "--sq4" in sys.argv:
    SHAPES += [gqa(1, 32, 8, 4, 4096, 128, True), gqa(8, 32, 8, 4, 4096, 128, True)]


def time_points(name, points, rows):
    for tpl, kn in points:
        label = f"{tpl.name} {DC.combo_label(kn)}"
        times = {}
        for shape in SHAPES:
            try:
                times[C.shape_key(shape)] = DC.time_cold_us(tpl, kn, shape)
            except C.DoesNotFit:
                times[C.shape_key(shape)] = None
        rows.append(dict(variant=name, point=label, us=times))
        print(f"{name:<11} {label:<95} " + " ".join(f"{t:7.2f}" if t else "      -" for t in times.values()), flush=True)


def main():
    t0 = time.time()
    rows = []
    checks = []
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else list(PATCHES)
    if "--knob" in sys.argv:
        return knob_ab(sys.argv[sys.argv.index("--knob") + 1], t0)
    if "--against" in sys.argv:
        return against_ab(sys.argv[sys.argv.index("--against") + 1], t0)
    for name in only:
        variant["name"] = name
        gpu.modules.clear()  # modules are cached by knobs: rebuild with this variant's patches
        if name == "no_fence":
            import decode_sweep as DS
            fused = [kn for tpl, kn in POINTS if tpl is DC.split and kn["FUSED_COMBINE"] == 1]
            fused.append(dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=4, MIN_SPLIT_TILES=1, FUSED_COMBINE=1))
            for rep in range(3):  # a missing fence shows as a race: run the checks a few times
                checks += DS.check_points(gpu, DC.split, fused)
                gpu.modules.clear()
            bad = [r for r in checks if not r["ok"]]
            print(f"no_fence check: {len(checks) - len(bad)} of {len(checks)} passed", flush=True)
        time_points(name, POINTS, rows)
    print("\nshapes: " + ", ".join(C.shape_key(s) for s in SHAPES))
    Path(sys.argv[1]).write_text(json.dumps(dict(gpu=gpu.name, shapes=[C.shape_key(s) for s in SHAPES], rows=rows, checks=checks), indent=1))
    print(f"done in {time.time() - t0:.0f} s")


def knob_ab(spec, t0):
    """--knob NAME=V[,NAME2=V2..] (see the module's doc): check, then alternate the two versions of each point."""
    import decode_sweep as DS
    setting = {name: int(value) for name, _, value in (kv.partition("=") for kv in spec.split(","))}
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 4
    variant["name"] = "full"
    # Only where the template declares the knob and the value: a name it does not know would
    # be a stray macro (decode.cu's COMBINE is a launch role), a value it does not list a
    # build its spec does not describe (decode.cu's WARP_LOADS stops at 1); the others are
    # timed twice unchanged, a measure of the noise.
    with_knob = [(tpl, {**kn, **{k: v for k, v in setting.items() if v in tpl.spec.get("knobs", {}).get(k, [])}})
                 for tpl, kn in POINTS]
    checks = []
    for tpl, kn in with_knob:
        checks += DS.check_points(gpu, tpl, [kn])
    bad = [r for r in checks if not r["ok"]]
    print(f"check {spec}: {len(checks) - len(bad)} of {len(checks)} passed", flush=True)
    rows = paired_rounds("as given", POINTS, spec, with_knob, rounds)
    print_ab("as given", POINTS, spec, with_knob, rows, rounds)
    Path(sys.argv[1]).write_text(json.dumps(dict(gpu=gpu.name, knob=spec, shapes=[C.shape_key(s) for s in SHAPES], rows=rows, checks=checks), indent=1))
    print(f"done in {time.time() - t0:.0f} s")
    return 1 if bad else 0


def paired_rounds(name_a, points_a, name_b, points_b, rounds):
    """Time both versions `rounds` times, A first in even rounds and B first in odd ones (the
    module cache is keyed by the template's path, so both trees' modules stay loaded)."""
    rows = []
    for r in range(rounds):
        order = [(name_a, points_a), (name_b, points_b)]
        for name, points in (order if r % 2 == 0 else order[::-1]):
            time_points(name, points, rows)
    return rows


def print_ab(name_a, points_a, name_b, points_b, rows, rounds):
    """Per (point, shape): the median of each version over the rounds and B / A; the geometric mean."""
    print(f"\n{name_b} against {name_a}, cold us, median of {rounds} rounds, each version first in half of them "
          f"(ratio < 1: {name_b} faster)")
    print(f"{'point':<80} {'shape':<34} {name_a[:14]:>14} {name_b[:14]:>14} {'ratio':>6}")
    ratios = []
    for (tpl, kn), (tpl_b, kn_b) in zip(points_a, points_b):
        label, label_b = f"{tpl.name} {DC.combo_label(kn)}", f"{tpl_b.name} {DC.combo_label(kn_b)}"
        for shape in SHAPES:
            key = C.shape_key(shape)
            a = [x["us"][key] for x in rows if x["point"] == label and x["variant"] == name_a and x["us"][key]]
            b = [x["us"][key] for x in rows if x["point"] == label_b and x["variant"] == name_b and x["us"][key]]
            if a and b:
                ma, mb = statistics.median(a), statistics.median(b)
                ratios.append(mb / ma)
                print(f"{label:<80} {key:<34} {ma:14.2f} {mb:14.2f} {mb / ma:6.3f}")
    if ratios:
        gm = statistics.geometric_mean(ratios)
        print(f"geometric mean {gm:.3f} ({min(ratios):.3f} .. {max(ratios):.3f}), {sum(r < 1 for r in ratios)} of {len(ratios)} faster")


def against_ab(other_dir, t0):
    """--against DIR (see the module's doc): check both trees' fused points, then alternate them."""
    import decode_sweep as DS
    from nvrtc_compile_check import load_templates
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 4
    other = {t.rel: t for t in load_templates(Path(other_dir))}
    against = [(other[tpl.rel], kn) for tpl, kn in POINTS]
    variant["name"] = "full"
    fused = [kn for tpl, kn in POINTS if tpl is DC.split and kn["FUSED_COMBINE"] == 1]
    fused.append(dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=4, MIN_SPLIT_TILES=1, FUSED_COMBINE=1))
    unfused = [dict(BLOCK_N=32, NUM_WARPS=8, STAGES=2, SPLIT_WAVES=2, MIN_SPLIT_TILES=1, FUSED_COMBINE=0)]
    checks = []
    for tpl in (DC.split, other["decode.cu"]):
        checks += DS.check_points(gpu, tpl, fused + unfused)
    bad = [r for r in checks if not r["ok"]]
    print(f"check (this tree and --against): {len(checks) - len(bad)} of {len(checks)} passed", flush=True)
    rows = paired_rounds("against", against, "full", POINTS, rounds)
    print_ab("against", against, "full", POINTS, rows, rounds)
    Path(sys.argv[1]).write_text(json.dumps(dict(gpu=gpu.name, against=other_dir, shapes=[C.shape_key(s) for s in SHAPES], rows=rows, checks=checks), indent=1))
    print(f"done in {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
