#!/usr/bin/env python3
"""Static instruction mix of a kernel's hot loop, on the CPU: no GPU needed.

Renders one point of a template as the daemon does (scripts/nvrtc_compile_check.py's
render), compiles it with NVRTC to a cubin, disassembles it with nvdisasm and counts the
SASS instructions of each loop that issues tensor-core instructions (HGMMA, HMMA) and
holds no other such loop: the steady state of an attention kernel, one key tile per
iteration. Counts are per class (uniform datapath, MUFU, FMNMX, FADD/FMUL/FFMA, packing,
shuffles, barriers and mbarrier operations, integer and predicate work, local-memory
spill traffic), static: one pass through the loop's text, branches not weighed (a block
the loop skips at run time, e.g. a mask applied only on the last tile, counts in full).
Loops nested in a hot loop (mbarrier spin waits, skipped tiles) are counted apart.

What it is for: an A/B of a template change before any device time. ncu's
instruction counts on the H100 (docs/HOPPER.md, "ncu: FlashAttention-4 and our kernel")
are the truth; this shows which way a change moves them and by how much per key tile,
and ptxas's registers and spills beside them.

    python3 scripts/sass_loop_stats.py --template wgmma_tma.cu \\
        --knobs BLOCK_N=128,STAGES=2,CONSUMERS=3,PINGPONG=1,OVERLAP=1,PERSISTENT=1,LAZY_RESCALE=1,TAIL_SPLIT=1 \\
        --d 64 [--against .dev/old/kernel-templates] [--json]

    python3 scripts/sass_loop_stats.py --cubin fa4.cubin [--kernel REGEX] \\
        [--template wgmma_tma.cu --knobs ... --d 128]

--cubin FILE reads a kernel compiled elsewhere, e.g. FlashAttention-4's, kept by the CuTe DSL on
the GPU machine (CUTE_DSL_KEEP=cubin CUTE_DSL_DUMP_DIR=DIR while scripts/profile_one.py runs fa4):
the functions of FILE with a hot loop (--kernel: those whose name matches REGEX), and, with
--template, our point's beside it, kernel for kernel in order (registers and spills are known only
for ours: they come from ptxas's log).

Knobs not given take the template's first value. --against DIR renders the same point from
another kernel-templates folder (e.g. `git archive HEAD kernel-templates | tar -x -C
.dev/old`) and prints both side by side with the difference.

nvdisasm: OPTIMIZERD_NVDISASM, else the one scripts/setup.sh installs into .deps/nvdisasm
(NVIDIA's pip wheel nvidia-cuda-nvdisasm; no 13.0 build is on PyPI, 13.5 reads NVRTC
13.0's cubins), else the one on PATH.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvrtc_compile_check as ncc  # noqa: E402

ROOT = ncc.ROOT

# Instruction classes, first match wins. The uniform datapath is what ncu counts as
# `inst_executed_pipe_uniform`: the U-prefixed opcodes and the moves into and out of it.
CLASSES: list[tuple[str, re.Pattern]] = [
    ("tensor", re.compile(r"^(HGMMA|HMMA|WARPGROUP)")),
    ("spill", re.compile(r"^(LDL|STL)\b")),
    ("mbarrier", re.compile(r"^SYNCS")),
    ("barrier", re.compile(r"^(BAR|WARPSYNC|BSYNC|BSSY|DEPBAR)")),
    ("uniform", re.compile(r"^(U[A-Z]|R2UR|S2UR|VOTEU)")),
    ("mufu", re.compile(r"^MUFU")),
    ("fmnmx", re.compile(r"^FMNMX")),
    ("fp32", re.compile(r"^(FADD|FMUL|FFMA|FSEL|FSETP|FCHK)")),
    ("pack", re.compile(r"^(F2FP|F2F|I2F|F2I)")),
    ("shuffle", re.compile(r"^(SHFL|VOTE)")),
    ("memory", re.compile(r"^(LD|ST|LDS|STS|LDG|STG|LDSM|STSM|UTMA|UBLKCP|ATOM|RED)")),
    ("branch", re.compile(r"^(BRA|EXIT|RET|CALL|JMP|YIELD|NOP)")),
    ("int", re.compile(r"^(I|LEA|LOP|SHF|SEL|MOV|PRMT|P2R|R2P|PLOP|S2R|CS2R|POPC|FLO|BMSK|BREV|VIADD|VIMNMX)")),
]

_INSN_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL_RE = re.compile(r"^(\.L_x_\d+):")
_FUNC_RE = re.compile(r"^\.text\.(\w+):")
_TARGET_RE = re.compile(r"`\((\.L_x_\d+)\)")


def classify(op: str) -> str:
    for name, pat in CLASSES:
        if pat.match(op):
            return name
    return "other"


@dataclass
class Insn:
    addr: int
    text: str  # without the predicate guard
    guarded: bool  # under a predicate (@P0, @!UP1 ...): a branch may fall through

    @property
    def op(self) -> str:
        return self.text.split()[0] if self.text else ""


@dataclass
class Loop:
    """A natural loop: its header block's address, the addresses of its back edges'
    branches, and the instructions of its body outside any loop nested in it."""
    start: int
    ends: list[int]
    body: set[int]  # block indices
    counts: Counter = field(default_factory=Counter)
    total: int = 0
    nested: list[int] = field(default_factory=list)  # instructions of each nested loop

    # MUFU.EX2 between a `wgmma.wait_group 1` and the next `wait_group 0` (layout order):
    # the softmax's exponentials issued while the previous tile's P V runs (OVERLAP).
    # None where the loop waits for no group but the last.
    ex2_under_pv: int | None = None
    # FMUL between that `wait_group 0` and the loop's last MUFU.EX2: O's rescale multiplies
    # interleaved with the exponentials (FA4's order, wgmma_tma's PV_WAIT 1); 0 where every
    # exponential comes before the wait. None as above.
    fmul_among_ex2: int | None = None

    def as_dict(self) -> dict:
        return {"start": f"{self.start:#x}", "end": f"{max(self.ends):#x}", "total": self.total,
                **dict(self.counts), "nested_loops": self.nested, "ex2_under_pv": self.ex2_under_pv,
                "fmul_among_ex2": self.fmul_among_ex2}


def parse_sass(text: str) -> dict[str, tuple[list[Insn], dict[str, int]]]:
    """Function name -> (instructions in address order, label -> address)."""
    out: dict[str, tuple[list[Insn], dict[str, int]]] = {}
    cur = None
    pending: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        if m := _FUNC_RE.match(s):
            cur = m.group(1)
            out[cur] = ([], {})
            continue
        if cur is None:
            continue
        if m := _LABEL_RE.match(s):
            pending.append(m.group(1))
            continue
        if m := _INSN_RE.search(s):
            addr = int(m.group(1), 16)
            raw = m.group(2)
            body = re.sub(r"^@!?U?P[T0-9]+\s+", "", raw)
            insns, labels = out[cur]
            for lab in pending:
                labels[lab] = addr
            pending = []
            insns.append(Insn(addr, body, body != raw))
    return out


def _blocks(insns: list[Insn], labels: dict[str, int]) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """Basic blocks as (first, last) instruction indices, and each block's successors."""
    at = {ins.addr: i for i, ins in enumerate(insns)}
    leaders = {0}
    for i, ins in enumerate(insns):
        if ins.op.startswith(("BRA", "EXIT", "RET", "BRX", "JMX")):
            if i + 1 < len(insns):
                leaders.add(i + 1)
            if (m := _TARGET_RE.search(ins.text)) and labels.get(m.group(1)) in at:
                leaders.add(at[labels[m.group(1)]])
    starts = sorted(leaders)
    blocks = [(a, (starts[j + 1] if j + 1 < len(starts) else len(insns)) - 1) for j, a in enumerate(starts)]
    block_of = {a: j for j, (a, _) in enumerate(blocks)}
    succ: list[list[int]] = []
    for j, (_, last) in enumerate(blocks):
        ins = insns[last]
        out = []
        falls = True
        if ins.op.startswith(("BRA", "BRX", "JMX")):
            if (m := _TARGET_RE.search(ins.text)) and labels.get(m.group(1)) in at:
                out.append(block_of[at[labels[m.group(1)]]])
            falls = ins.guarded
        elif ins.op.startswith(("EXIT", "RET")):
            falls = ins.guarded
        if falls and j + 1 < len(blocks):
            out.append(j + 1)
        succ.append(out)
    return blocks, succ


def hot_loops(insns: list[Insn], labels: dict[str, int]) -> list[Loop]:
    """Natural loops holding a tensor-core instruction outside any such loop nested in
    them (an attention kernel's key-tile loops), with their instruction counts: nested
    loops (mbarrier spin waits, skipped tiles) counted apart, by size."""
    blocks, succ = _blocks(insns, labels)
    pred: list[list[int]] = [[] for _ in blocks]
    for j, ss in enumerate(succ):
        for s in ss:
            pred[s].append(j)
    by_header: dict[int, Loop] = {}
    for u, ss in enumerate(succ):
        for h in ss:
            if h > u:
                continue  # a back edge goes to an earlier (or the same) block
            body, stack = {h, u}, [u]
            while stack:
                x = stack.pop()
                if x == h:
                    continue
                for p in pred[x]:
                    if p not in body:
                        body.add(p)
                        stack.append(p)
            lp = by_header.setdefault(h, Loop(insns[blocks[h][0]].addr, [], set()))
            lp.body |= body
            lp.ends.append(insns[blocks[u][1]].addr)
    loops = list(by_header.values())

    def cls(b: int) -> list[str]:
        a, z = blocks[b]
        return [classify(insns[i].op) for i in range(a, z + 1)]

    def has_tensor(body: set[int]) -> bool:
        return any("tensor" in cls(b) for b in body)

    out = []
    for lp in loops:
        inner = [o for o in loops if o is not lp and o.body < lp.body]
        if not has_tensor(lp.body) or any(has_tensor(o.body) for o in inner):
            continue
        # Only the outermost nested loops, each counted once.
        tops = [o for o in inner if not any(o.body < x.body for x in inner)]
        nested_blocks = set().union(*(o.body for o in tops)) if tops else set()
        for b in lp.body - nested_blocks:
            for c in cls(b):
                lp.counts[c] += 1
                lp.total += 1
        lp.nested = sorted((sum(blocks[b][1] - blocks[b][0] + 1 for b in o.body) for o in tops), reverse=True)
        texts = [insns[i].text for b in sorted(lp.body) for i in range(blocks[b][0], blocks[b][1] + 1)]
        lp.ex2_under_pv = _ex2_under_pv(texts)
        lp.fmul_among_ex2 = _fmul_among_ex2(texts) if lp.ex2_under_pv is not None else None
        out.append(lp)
    return sorted(out, key=lambda lp: lp.start)


class SassError(Exception):
    """A point that cannot be analysed (no template, no such knob, a compile error, no nvdisasm)."""


def _ex2_under_pv(texts: list[str]) -> int | None:
    count = None
    for t in texts:
        if t.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1"):
            count = 0
        elif t.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0") and count is not None:
            return count
        elif count is not None and t.startswith("MUFU.EX2"):
            count += 1
    return None


def _fmul_among_ex2(texts: list[str]) -> int:
    wait0 = next((i for i, t in enumerate(texts) if t.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0")), None)
    last_ex2 = max((i for i, t in enumerate(texts) if t.startswith("MUFU.EX2")), default=-1)
    if wait0 is None or last_ex2 < wait0:
        return 0
    return sum(1 for t in texts[wait0:last_ex2] if t.split(" ", 1)[0] == "FMUL")


def nvdisasm_path() -> str:
    for cand in (os.environ.get("OPTIMIZERD_NVDISASM"), str(ROOT / ".deps/nvdisasm/nvidia/cu13/bin/nvdisasm"),
                 shutil.which("nvdisasm")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    raise SassError(
        "sass_loop_stats: no nvdisasm: run scripts/setup.sh (it installs NVIDIA's nvidia-cuda-nvdisasm wheel "
        "into .deps/nvdisasm), or set OPTIMIZERD_NVDISASM to an nvdisasm binary")


def parse_knobs(tpl: ncc.Template, given: str | None) -> dict[str, int]:
    knobs = {k: v[0] for k, v in tpl.spec.get("knobs", {}).items()}
    for item in filter(None, (given or "").split(",")):
        key, _, val = item.partition("=")
        if key not in knobs:
            raise SassError(f"sass_loop_stats: {tpl.rel} has no knob {key!r} (knobs: {', '.join(knobs)})")
        try:
            knobs[key] = int(val)
        except ValueError:
            raise SassError(f"sass_loop_stats: --knobs {item!r}: the value must be an integer, e.g. {key}=128") from None
    return knobs


def disassemble(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm_path(), "-c", f.name], check=True, capture_output=True, text=True).stdout


def analyse_cubin(path: Path, kernel_re: str | None) -> dict:
    """The hot loops of the functions in a cubin compiled elsewhere (--cubin): every function
    with a hot loop, or those whose name matches kernel_re."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SassError(f"sass_loop_stats: --cubin {path}: {e.strerror}") from None
    try:
        funcs = parse_sass(disassemble(data))
    except subprocess.CalledProcessError as e:
        raise SassError(f"sass_loop_stats: nvdisasm cannot read {path} (is it a cubin?): {e.stderr.strip()}") from None
    pick = re.compile(kernel_re) if kernel_re else None
    out = {"template": path.name, "root": str(path), "knobs": {}, "arch": "?", "d": "?", "dtype": "?", "kernels": {}}
    for name, (insns, labels) in funcs.items():
        if pick and not pick.search(name):
            continue
        loops = [lp.as_dict() for lp in hot_loops(insns, labels)]
        if loops or pick:
            out["kernels"][name] = {"resources": {}, "instructions": len(insns), "hot_loops": loops}
    if not out["kernels"]:
        raise SassError(f"sass_loop_stats: {path} holds no function {'matching ' + repr(kernel_re) if pick else 'with a hot loop'}"
                        f" (functions: {', '.join(funcs) or 'none'})")
    return out


def analyse(root: Path, rel: str, knobs_arg: str | None, d: int, bf16: bool, nvrtc: ncc.Nvrtc) -> dict:
    tpls = {t.rel: t for t in ncc.load_templates(root)}
    names = {t.name: t for t in tpls.values()}
    tpl = tpls.get(rel) or names.get(rel)
    if tpl is None:
        raise SassError(f"sass_loop_stats: no template {rel!r} under {root}")
    knobs = parse_knobs(tpl, knobs_arg)
    arch = ncc.specific_arch(tpl) or "sm_90"
    src = ncc.render(tpl, knobs, bf16)
    ok, log, cubin = nvrtc.compile(src, tpl.rel.replace("/", "_"), [
        f"--gpu-architecture={arch}", "-std=c++17", f"--include-path={ncc.default_cuda_include()}",
        "--ptxas-options=-v"])
    if not ok:
        raise SassError(f"sass_loop_stats: {tpl.rel} ({ncc.combo_label(knobs)}) does not compile:\n{log}")
    funcs = parse_sass(disassemble(cubin))
    kernels = [k for k in funcs if k.endswith(f"_d{d}")]
    res = ncc.parse_resources(log)
    out = {"template": tpl.rel, "root": str(root), "knobs": knobs, "arch": arch, "d": d,
           "dtype": "bf16" if bf16 else "fp16", "kernels": {}}
    for k in kernels:
        insns, labels = funcs[k]
        out["kernels"][k] = {
            "resources": res.get(k, {}),
            "instructions": len(insns),
            "hot_loops": [lp.as_dict() for lp in hot_loops(insns, labels)],
        }
    return out


def print_table(runs: list[dict]) -> None:
    for r in runs:
        if r["knobs"]:
            print(f"# {r['root']}: {r['template']} d{r['d']} {r['dtype']} {r['arch']} {ncc.combo_label(r['knobs'])}")
        else:
            print(f"# {r['root']}: a cubin compiled elsewhere")
    base = runs[0]
    for i, k in enumerate(base["kernels"]):
        # Kernels pair by name, else by position (--cubin: another kernel's names).
        others = [r["kernels"].get(k) or (list(r["kernels"].values())[i] if i < len(r["kernels"]) else None)
                  for r in runs]
        names = [k] + [next((n for n, v in r["kernels"].items() if v is kk), "-") for r, kk in zip(runs[1:], others[1:])]
        print("\n" + " | ".join(dict.fromkeys(names)))
        for r, kk in zip(runs, others):
            res = kk["resources"] if kk else {}
            print(f"  {r['root']}: {res.get('regs', '?')} registers, "
                  f"{res.get('spill_st', '?')} B spill stores, {kk['instructions'] if kk else '?'} instructions")
        n = max(len(kk["hot_loops"]) if kk else 0 for kk in others)
        for li in range(n):
            loops = [kk["hot_loops"][li] if kk and li < len(kk["hot_loops"]) else None for kk in others]
            keys = ["total"] + sorted({c for lp in loops if lp for c in lp
                                       if c not in ("start", "end", "total", "nested_loops", "ex2_under_pv",
                                                    "fmul_among_ex2")})
            head = "  loop %d (%s)" % (li, ", ".join(
                f"{lp['start']}-{lp['end']}, nested loops of {lp['nested_loops']} instructions apart" if lp else "-"
                for lp in loops))
            print(head)
            print("    " + "".join(f"{c:>10}" for c in ["class"] + [f"run{j}" for j in range(len(runs))]
                                     + (["diff"] if len(runs) == 2 else [])))
            for c in keys:
                vals = [lp.get(c, 0) if lp else 0 for lp in loops]
                row = f"    {c:>10}" + "".join(f"{v:>10}" for v in vals)
                if len(runs) == 2:
                    row += f"{vals[1] - vals[0]:>+10}"
                print(row)
            under = ["-" if not lp or lp["ex2_under_pv"] is None else str(lp["ex2_under_pv"]) for lp in loops]
            print(f"    EX2 issued under the previous tile's P V (between wait_group 1 and 0): {', '.join(under)}")
            among = ["-" if not lp or lp.get("fmul_among_ex2") is None else str(lp["fmul_among_ex2"]) for lp in loops]
            print(f"    FMUL among the EX2 after wait_group 0 (O's rescale interleaved): {', '.join(among)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", help="template file (e.g. wgmma_tma.cu) or spec name (with --cubin: optional)")
    ap.add_argument("--cubin", metavar="FILE", help="a cubin compiled elsewhere (e.g. FA4's): its hot loops, beside --template's")
    ap.add_argument("--kernel", metavar="REGEX", help="with --cubin: only functions whose name matches")
    ap.add_argument("--knobs", help="KNOB=value,... (others: the template's first value)")
    ap.add_argument("--d", type=int, default=128, choices=ncc.HEAD_DIMS, help="head dim (default 128)")
    ap.add_argument("--bf16", action="store_true", help="bf16 instead of fp16")
    ap.add_argument("--root", default=str(ncc.TEMPLATES_DIR), help="kernel-templates folder (default: this checkout's)")
    ap.add_argument("--against", metavar="DIR", help="a second kernel-templates folder: print both and the difference")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args()
    if not args.template and not args.cubin:
        ap.error("give --template (a point of ours), --cubin (a kernel compiled elsewhere), or both")
    roots = [Path(args.root)] + ([Path(args.against)] if args.against else [])
    try:
        runs = []
        if args.template:
            nvrtc = ncc.Nvrtc(ncc.default_nvrtc_lib())
            runs = [analyse(r, args.template, args.knobs, args.d, args.bf16, nvrtc) for r in roots]
        if args.cubin:
            runs.append(analyse_cubin(Path(args.cubin), args.kernel))
    except SassError as e:
        print(e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(runs if len(runs) > 1 else runs[0], indent=2))
    else:
        print_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
