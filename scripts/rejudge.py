#!/usr/bin/env python3
"""Re-judge a run's decisions from the samples its ledger keeps (any machine; no GPU).

Every decision since migration 0012 stores the candidate's and the incumbent's samples in the
order the worker took them (`iteration_shapes.timing_samples`). This recomputes each decision
as src/pipeline/decide.rs makes it (paired where the samples pair: the median of
incumbent_i / candidate_i against max(min_gain, half the p10..p90 band of those ratios); else
the medians and the noisier kernel's own band), checks that it gives the recorded speedup and
threshold, prints the measured noise per shape, and lists the decisions another `min_gain`
would flip.

A flip is judged against the incumbent of the recorded run: a rule that had accepted a
candidate would have timed every later one against it instead, so the lists say which gains a
rule could see, not where a run under it would have ended.

    python3 scripts/rejudge.py runs/optimizer.db [--run RUN] [--min-gain 0.01 0.015] [--shapes b4h16s4096]
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decide_noise import band, quantile  # noqa: E402  (the statistics the worker's plan is checked with)

MIN_PAIRS = 4


def valid(x):
    return isinstance(x, (int, float)) and x == x and 0.0 < x < float("inf")


def decide(cand, inc, min_gain):
    """(speedup, noise, paired) as decide.rs computes them; None without valid samples."""
    if len(cand) == len(inc):
        ratios = [i / c for c, i in zip(cand, inc) if valid(c) and valid(i)]
        if len(ratios) >= MIN_PAIRS:
            return quantile(ratios, 0.5), 0.5 * band(ratios), True
    c, i = [x for x in cand if valid(x)], [x for x in inc if valid(x)]
    if not c or not i:
        return None
    return quantile(i, 0.5) / quantile(c, 0.5), 0.5 * max(band(c), band(i)), False


def decisions(db, run, shapes=None):
    """Rows of (seq, stage, shape, recorded speedup, recorded threshold, candidate, incumbent)."""
    q = ("SELECT s.seq, i.stage, s.shape, s.speedup_vs_incumbent, s.threshold, s.timing_samples "
         "FROM iteration_shapes s JOIN iterations i ON i.run_id = s.run_id AND i.seq = s.seq "
         "WHERE s.run_id = ? AND s.timing_samples IS NOT NULL ORDER BY s.seq, s.shape")
    out = []
    for seq, stage, shape, speedup, threshold, samples in db.execute(q, (run,)):
        if shapes and not any(p in shape for p in shapes):
            continue
        t = json.loads(samples)
        cand, inc = t.get("candidate") or [], t.get("incumbent") or []
        if cand and inc:
            out.append((seq, stage, shape, speedup, threshold, cand, inc))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ledger", help="a ledger file (runs/optimizer.db); opened read-only")
    ap.add_argument("--run", help="run id (default: the newest run with stored samples)")
    ap.add_argument("--min-gain", type=float, nargs="+", default=[0.01], help="rules to compare with the recorded one")
    ap.add_argument("--recorded-min-gain", type=float, default=0.02, help="the run's timing.min_gain (default 0.02)")
    ap.add_argument("--shapes", nargs="+", help="only shape keys containing one of these")
    args = ap.parse_args(argv)
    db = sqlite3.connect(f"file:{args.ledger}?mode=ro", uri=True)
    run = args.run or next(iter(db.execute(
        "SELECT s.run_id FROM iteration_shapes s JOIN runs r ON r.id = s.run_id WHERE s.timing_samples IS NOT NULL "
        "ORDER BY r.started_at DESC LIMIT 1")), [None])[0]
    if run is None:
        print(f"{args.ledger}: no decision with stored samples (ledgers before migration 0012 keep none)")
        return 1
    rows = decisions(db, run, args.shapes)
    if not rows:
        print(f"run {run}: no decision with stored samples{' on those shapes' if args.shapes else ''}")
        return 1
    judged, worst = [], 0.0
    for seq, stage, shape, speedup, threshold, cand, inc in rows:
        d = decide(cand, inc, args.recorded_min_gain)
        if d is None:
            continue
        sp, noise, paired = d
        if speedup is not None:
            worst = max(worst, abs(sp - speedup), abs(max(args.recorded_min_gain, noise) - (threshold or 0.0)))
        judged.append((seq, stage, shape, sp, noise, paired))
    print(f"run {run}: {len(judged)} decisions re-judged ({sum(p for *_, p in judged)} paired); "
          f"largest difference from the recorded speedup or threshold {worst:.2e}")
    print("\nshape                                      decisions  noise median  noise p90  thresholds at min_gain")
    for shape in sorted({j[2] for j in judged}):
        noise = [j[4] for j in judged if j[2] == shape]
        at_floor = sum(1 for n in noise if n <= args.recorded_min_gain)
        print(f"{shape:42} {len(noise):9}  {100 * quantile(noise, 0.5):11.2f}%  {100 * quantile(noise, 0.9):8.2f}%"
              f"  {at_floor}/{len(noise)}")
    wins = lambda sp, noise, g: sp > 1.0 + max(g, noise)  # noqa: E731
    for g in args.min_gain:
        flips = [j for j in judged if wins(j[3], j[4], g) != wins(j[3], j[4], args.recorded_min_gain)]
        print(f"\nmin_gain {g}: {sum(wins(j[3], j[4], g) for j in judged)} accepted shape decisions against "
              f"{sum(wins(j[3], j[4], args.recorded_min_gain) for j in judged)} at {args.recorded_min_gain}; "
              f"{len(flips)} flip")
        for seq, stage, shape, sp, noise, _ in flips:
            to = "accepted" if wins(sp, noise, g) else "rejected"
            print(f"  it{seq:<5} {stage:28} {shape:42} {sp:.4f}x  noise {100 * noise:.2f}%  -> {to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
