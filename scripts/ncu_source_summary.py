#!/usr/bin/env python3
"""Summarize ncu source-page CSVs (scripts/ncu_source.sh): per kernel, the warp-stall samples by
reason, the instructions with the most samples, and samples per opcode; FA4's beside ours.

    python3 scripts/ncu_source_summary.py DIR [--top 25]

Reads DIR/ours_TAG_sass.csv and DIR/fa4_TAG_sass.csv. The CSV's columns differ between ncu
versions: the sample columns are found by name ("Warp Stall Sampling (All Samples)" or the like),
the per-reason columns as those named stall_* or "... (All Samples)" per reason; the header line
of each file is printed when a column is not found, so the file can be read by hand.
"""
import argparse
import csv
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path


def num(x: str) -> float:
    x = (x or "").replace(",", "").strip()
    try:
        return float(x)
    except ValueError:
        return 0.0


def load(path: Path):
    rows = list(csv.reader(path.open(errors="replace")))
    # The header is the first row that names a source/address column.
    hi = next((i for i, r in enumerate(rows) if any("Source" in c for c in r) and any("Address" in c for c in r)), None)
    if hi is None:
        print(f"{path.name}: no header row with Address and Source; first lines:", rows[:3])
        return None
    head = rows[hi]
    body = [r for r in rows[hi + 1:] if len(r) == len(head)]
    col = {h: i for i, h in enumerate(head)}

    def find(*pats):
        for p in pats:
            for h, i in col.items():
                if re.search(p, h, re.I):
                    return i
        return None

    src = find(r"^Source$", r"Source")
    total = find(r"Warp Stall Sampling \(All", r"stall.*all samples", r"Sampling")
    execd = find(r"^Instructions Executed$", r"Instructions Executed", r"inst_executed")
    reasons = {}
    for h, i in col.items():
        m = re.match(r"^(?:smsp__pcsamp_warps_issue_)?stall_(\w+?)(?:_not_issued)?$", h)
        if m and "not_issued" not in h:
            reasons[m.group(1)] = i
    if total is None or src is None:
        print(f"{path.name}: columns not found (source {src}, samples {total}); header: {head}")
        return None
    out = []
    for r in body:
        out.append({
            "sass": r[src].strip(),
            "samples": num(r[total]),
            "exec": num(r[execd]) if execd is not None else 0.0,
            "reasons": {k: num(r[i]) for k, i in reasons.items()},
        })
    if not reasons:
        print(f"{path.name}: no per-reason columns (stall_*); header: {head}")
    return out


def opcode(sass: str) -> str:
    s = re.sub(r"^@!?U?P\w+\s+", "", sass)
    op = s.split(" ")[0] if s else "?"
    return op.split(".")[0]


def summarize(name: str, rows, top: int):
    n = sum(r["samples"] for r in rows) or 1.0
    by = Counter()
    for r in rows:
        by.update(r["reasons"])
    reasons = ", ".join(f"{k} {100 * v / n:.1f}%" for k, v in by.most_common(9) if v > 0)
    print(f"\n== {name}: {int(n)} samples, {len(rows)} instructions; by reason: {reasons}")
    for r in sorted(rows, key=lambda r: -r["samples"])[:top]:
        rs = ", ".join(f"{k} {int(v)}" for k, v in Counter(r["reasons"]).most_common(3) if v > 0)
        print(f"  {100 * r['samples'] / n:5.1f}%  {r['sass'][:62]:62} exec {int(r['exec']):>10}  {rs}")
    ops = defaultdict(lambda: [0.0, 0.0, Counter()])
    for r in rows:
        o = ops[opcode(r["sass"])]
        o[0] += r["samples"]
        o[1] += r["exec"]
        o[2].update(r["reasons"])
    return {k: (v[0] / n, v[1], v[2]) for k, v in ops.items()}, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    d = Path(a.dir)
    tags = sorted({p.name[len("ours_"):-len("_sass.csv")] for p in d.glob("ours_*_sass.csv")})
    if not tags:
        print(f"no ours_*_sass.csv under {d}")
        return 1
    for tag in tags:
        tables = {}
        for who in ("ours", "fa4"):
            p = d / f"{who}_{tag}_sass.csv"
            rows = load(p) if p.exists() else None
            if rows:
                tables[who] = summarize(f"{who} {tag}", rows, a.top)
        if len(tables) == 2:
            (o, no), (f, nf) = tables["ours"], tables["fa4"]
            print(f"\n== {tag}: share of warp-stall samples and executions per opcode (ours | FA4; samples {int(no)} | {int(nf)})")
            keys = sorted(set(o) | set(f), key=lambda k: -max(o.get(k, (0,))[0], f.get(k, (0,))[0]))
            for k in keys[:30]:
                so, eo = o.get(k, (0.0, 0.0, None))[:2]
                sf, ef = f.get(k, (0.0, 0.0, None))[:2]
                print(f"  {k:22} {100 * so:6.1f}% {int(eo):>12} | {100 * sf:6.1f}% {int(ef):>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
