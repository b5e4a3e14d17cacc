#!/usr/bin/env python3
"""How well the daemon's accept rule separates kernels on a GPU that wanders (GPU machine).

The search accepts a candidate when the incumbent's median over its own is above
1 + max(min_gain, noise). Its samples are interleaved with the incumbent's (src/worker/cuda/
timing.rs: per round, each kernel's `samples_per_round` graph replays in turn, the order
reversed every round), so clock drift under the board's power cap hits both; but the noise it
estimates from each kernel's own samples (half the p10..p90 band over the median, the noisier
of the two) counts that drift in full. On the large shapes that band read 8-17% in a 20-minute
run on the H200 (BENCHMARKS 2026-11-29 (22)): a candidate had to be 4-8% faster to count.

This times pairs of SDPA calls exactly as the worker samples them (the same launches per sample,
rounds and order from agent.toml's [timing] defaults, inputs rotated through sets that span 3x
the L2) and scores each trial with both statistics:
  unpaired (the daemon's rule before 2026-11-29): speedup = median(inc) / median(cand),
    noise = half the p10..p90 band of the noisier kernel;
  paired (sample i of one kernel against sample i of the other: the same round, the same
    position in it): speedup = the median of inc_i / cand_i, noise = half the p10..p90 band of
    those ratios.
Pairs: A/A (the same call, two graphs: any "win" is a false accept), and A against A with
S_k 3% and 6% longer (the candidate truly ~3% / ~6% faster). Per shape and pair it prints the
noise each rule measured, the speedups' spread over trials, and how often each rule accepts at
min_gain 0.02. The GPU is kept busy throughout (trials back to back), as during a search.

    python3 scripts/decide_noise.py [--trials 20] [--shapes 4,16,4096,64 2,16,8192,128 1,16,512,64]
        [--rounds 4 --samples-per-round 5 --launches-per-sample 5]   (the benchmark workload's timing)

The plan is the worker's (src/spec/protocol.rs sample_plan): a kernel whose samples in a round
would last longer than sample_target_us takes fewer per round and more rounds. Before 2026-11-29
(24) it always took samples_per_round: a pair's samples were a block apart and the paired noise
read 1.3-4.7% on the large shapes; one sample per round makes each pair adjacent and it reads
0.4-0.5% (--fixed-rounds keeps the old plan, to compare).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

ROUNDS, SAMPLES_PER_ROUND, LAUNCHES_PER_SAMPLE = 4, 10, 10
SAMPLE_TARGET_US, MAX_ENTRY_MS, MIN_GAIN, WARMUP = 2000.0, 300.0, 0.02, 5


def quantile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def band(v):
    m = quantile(v, 0.5)
    return (quantile(v, 0.9) - quantile(v, 0.1)) / m


def unpaired(cand, inc):
    speedup = quantile(inc, 0.5) / quantile(cand, 0.5)
    noise = 0.5 * max(band(cand), band(inc))
    return speedup, noise


def paired(cand, inc):
    r = [i / c for c, i in zip(cand, inc)]
    return quantile(r, 0.5), 0.5 * band(r)


class Entry:
    """One kernel: a CUDA graph of `per_sample` calls over rotating input sets."""

    def __init__(self, b, h, sq, sk, d, per_sample, sets):
        import torch
        import torch.nn.functional as F

        def make(s):
            return torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)

        self.sets = [(make(sq), make(sk), make(sk)) for _ in range(sets)]
        self.graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for q, k, v in self.sets[:2]:
                F.scaled_dot_product_attention(q, k, v)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph):
            for j in range(per_sample):
                q, k, v = self.sets[j % sets]
                F.scaled_dot_product_attention(q, k, v)

    def sample(self, start, end):
        start.record()
        self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0


def plan(us, adapt=True):
    """(calls per sample, samples per round, rounds), as src/spec/protocol.rs sample_plan."""
    per_sample = max(1, min(LAUNCHES_PER_SAMPLE, math.ceil(SAMPLE_TARGET_US / us)))
    spr = max(1, min(SAMPLES_PER_ROUND, math.floor(SAMPLE_TARGET_US / (us * per_sample)))) if adapt else SAMPLES_PER_ROUND
    most = -(-ROUNDS * SAMPLES_PER_ROUND // spr)
    rounds = max(min(2, most), min(most, math.floor(MAX_ENTRY_MS * 1000.0 / (us * per_sample * spr))))
    return per_sample, spr, rounds


def trial(entries, spr, rounds, start, end):
    """Samples per entry, interleaved as the worker interleaves them."""
    out = [[] for _ in entries]
    n = len(entries)
    for r in range(rounds):
        for j in range(n):
            e = j if r % 2 == 0 else n - 1 - j
            for _ in range(spr):
                out[e].append(entries[e].sample(start, end))
    return out


def main():
    global ROUNDS, SAMPLES_PER_ROUND, LAUNCHES_PER_SAMPLE
    import torch  # the GPU machine's; the statistics above run anywhere (python/bench_tests)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--shapes", nargs="+", default=["4,16,4096,64", "2,16,8192,128", "1,16,512,64"])
    ap.add_argument("--idle-s", type=float, default=0.0,
                    help="GPU idle before each trial, as a search leaves it while it compiles and checks")
    ap.add_argument("--aa-only", action="store_true", help="only the A/A pair (the false-accept rate)")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--samples-per-round", type=int, default=SAMPLES_PER_ROUND)
    ap.add_argument("--launches-per-sample", type=int, default=LAUNCHES_PER_SAMPLE,
                    help="timing.* as the config sets them (scripts/benchmark-agent.toml: 4, 5, 5)")
    ap.add_argument("--fixed-rounds", action="store_true",
                    help="always samples_per_round per round (the worker's plan before 2026-11-29 (24))")
    args = ap.parse_args()
    ROUNDS, SAMPLES_PER_ROUND, LAUNCHES_PER_SAMPLE = args.rounds, args.samples_per_round, args.launches_per_sample
    torch.manual_seed(0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; SDPA default backend, bf16; "
          f"{args.trials} trials per pair; min_gain {MIN_GAIN}")
    rows = []
    for spec in args.shapes:
        b, h, s, d = (int(x) for x in spec.split(","))
        # One call's time sets the sampling plan, as the worker's first warm-up does.
        probe = Entry(b, h, s, s, d, 1, 1)
        for _ in range(3):
            us = probe.sample(start, end)
        del probe
        per_sample, spr, rounds = plan(us, adapt=not args.fixed_rounds)
        set_bytes = 4 * b * h * s * d * 2
        sets = max(1, min(32, math.ceil(3 * l2 / set_bytes)))
        print(f"\n({b},{h},{s},{d}): {us:.1f} us per call; {per_sample} call(s) per sample, {rounds} rounds of "
              f"{spr} sample(s) per kernel, {sets} input set(s)")
        inc = Entry(b, h, s, s, d, per_sample, sets)
        pairs = {"A/A": Entry(b, h, s, s, d, per_sample, sets)}
        for pct in () if args.aa_only else (3, 6):
            # The incumbent does pct% more work; the candidate (the plain call) is that much faster.
            # S_k grows in whole 64-key tiles (a ragged S_k is another SDPA code path), so a short
            # S cannot express a few percent: such pairs are left out rather than mislabelled.
            extra = round(s * pct / 100 / 64) * 64
            if extra == 0 or abs(extra / s - pct / 100) > 0.01:
                print(f"  +{pct}%: left out (S_k {s} grows in 64-key steps: +{extra} is not {pct}%)")
                continue
            pairs[f"+{pct}%"] = Entry(b, h, s, s + extra, d, per_sample, sets)
        for _ in range(WARMUP):
            inc.sample(start, end)
        for name, other in pairs.items():
            res = {"unpaired": [], "paired": []}
            for _ in range(args.trials):
                time.sleep(args.idle_s)
                if name == "A/A":
                    cand_s, inc_s = trial([pairs[name], inc], spr, rounds, start, end)
                else:
                    cand_s, inc_s = trial([inc, other], spr, rounds, start, end)
                res["unpaired"].append(unpaired(cand_s, inc_s))
                res["paired"].append(paired(cand_s, inc_s))
            for rule, got in res.items():
                sp = [x for x, _ in got]
                nz = [n for _, n in got]
                acc = sum(1 for x, n in got if x > 1.0 + max(MIN_GAIN, n))
                rows.append((spec, name, rule, statistics.median(sp), quantile(sp, 0.1), quantile(sp, 0.9),
                             statistics.median(nz), quantile(nz, 0.9), acc, len(got)))
                r = rows[-1]
                print(f"  {name:5} {rule:9} speedup median {r[3]:.4f} (p10 {r[4]:.4f}, p90 {r[5]:.4f})  "
                      f"noise median {r[6]:.4f} p90 {r[7]:.4f}  accepted {acc}/{len(got)}", flush=True)
    print("\nshape             pair   rule       speedup  p10..p90          noise (med, p90)   accepted")
    for spec, name, rule, med, p10, p90, nmed, n90, acc, n in rows:
        print(f"{spec:17} {name:6} {rule:9} {med:8.4f}  {p10:.4f}..{p90:.4f}   {nmed:.4f}, {n90:.4f}     {acc}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
