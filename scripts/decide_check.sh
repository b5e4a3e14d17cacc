#!/usr/bin/env bash
# The paired accept rule in a real run on the GPU (src/pipeline/decide.rs): a short daemon run
# that times wgmma-tma kernels against each other on two large shapes, where the GPU's clock
# drifts under its power cap while a candidate and its incumbent are sampled. It prints, per
# candidate and shape, the paired speedup and threshold the run recorded beside half the
# candidate's own p10..p90 band (the unpaired rule took the larger of that and the incumbent's
# band: it is a lower bound on the threshold the rule before 2026-11-29 would have needed).
# Run from the repository root on the device with the stripped binary carried:
#   strip -o .dev/bin/optimizerd target/release/optimizerd && gzip -9f .dev/bin/optimizerd
#   (device) BUDGET=150s bash scripts/decide_check.sh            (carry .dev/bin)
# DC (default /tmp/dc) is the run's directory, LOOKAHEAD_DEPTH the engine's look-ahead compile
# depth (worker.lookahead_depth, default 3): two calls with different DC compare depths, and the
# last tables show where each iteration's wall time went and what rejudge.py reads in the ledger.
# SHAPES replaces the workload's shapes (a TOML array, e.g. '[ { b = 2, h = 16, s = 8192, d = 128 } ]':
# one head dim, whose builds leave the other's kernels out).
set -u
REPO=$PWD
DC=${DC:-/tmp/dc}
SHAPES=${SHAPES:-'[ { b = 4, h = 16, s = 4096, d = 64 }, { b = 2, h = 16, s = 8192, d = 128 } ]'}
mkdir -p "$DC" && gunzip -c .dev/bin/optimizerd.gz > "$DC/optimizerd" && chmod +x "$DC/optimizerd"
cd "$DC"
cat > plan.toml <<EOF
[[stage]]
name = "tensor-cores-hopper"
template = "wgmma_tma.cu"
search = "exhaustive"
space = { BLOCK_N = [128], STAGES = [2, 3], CONSUMERS = [3, 2], PINGPONG = [1], OVERLAP = [1, 0], PERSISTENT = [1], LAZY_RESCALE = [1], TAIL_SPLIT = [1], EPI_TMA = [1], PACK_GQA = [0], STREAM_K = [0], LPT_MIB = [8], DYNAMIC = [1], Q_STAGES = [1, 2], PV_WAIT = [1] }
max_candidates = 16
EOF
cat > agent.toml <<EOF
[run]
runs_dir = "runs"
plan = "plan.toml"
templates_dir = "$REPO/kernel-templates"

[workload]
dtype = "fp16"
shapes = $SHAPES

[timing]
# scripts/benchmark-agent.toml's sampling; no sustained closing (the search's decisions are the point)
rounds = 4
samples_per_round = 5
launches_per_sample = 5
sustained_ms = 0.0

[worker]
lookahead_depth = ${LOOKAHEAD_DEPTH:-3}
EOF
OUT=${OUT:-$DC/out}; mkdir -p "$OUT"
timeout 400 ./optimizerd start --budget "${BUDGET:-150s}" --foreground --config agent.toml > "$OUT/decide_check_run.txt" 2>&1
echo "rc=$?"
python3 - <<'PY'
import sqlite3
c = sqlite3.connect('runs/optimizer.db')
print("seq  verdict         shape            cand us   cand half-band  speedup (paired)  threshold  won")
for r in c.execute("""select i.seq, i.verdict, s.shape, s.median_us, s.p10_us, s.p90_us, s.speedup_vs_incumbent, s.threshold, s.won
                      from iteration_shapes s join iterations i on i.run_id = s.run_id and i.seq = s.seq
                      where s.median_us is not null order by i.seq, s.shape"""):
    seq, v, shape, m, p10, p90, sp, th, won = r
    hb = 0.5 * (p90 - p10) / m
    print(f"{seq:<4} {v:15} {shape:16} {m:9.2f}  {hb:8.4f}        {sp if sp is None else round(sp, 4)!s:>8}          {th if th is None else round(th, 4)!s:>7}  {won}")
PY
python3 - <<'PY'
import sqlite3, datetime
c = sqlite3.connect('runs/optimizer.db')
t = lambda x: datetime.datetime.fromisoformat(x.replace('Z', '+00:00'))
rows = c.execute("select seq, verdict, compile_ms, check_ms, time_ms, started_at, finished_at from iterations order by seq").fetchall()
print("where each iteration's wall time went (s): seq verdict wall compile check time")
for seq, v, cm, ch, tm, a, b in rows:
    f = lambda x: '-' if x is None else f"{x / 1000:.2f}"
    print(f"{seq:<4} {v:15} {(t(b) - t(a)).total_seconds():6.2f} {f(cm):>6} {f(ch):>6} {f(tm):>6}")
timed = [r for r in rows if r[4] is not None]
if timed:
    n = len(timed)
    mean = lambda i: sum((r[i] or 0) for r in timed) / n / 1000
    wall = sum((t(r[6]) - t(r[5])).total_seconds() for r in timed) / n
    print(f"timed iterations: {n}; mean wall {wall:.2f} s, compile {mean(2):.2f}, check {mean(3):.2f}, time {mean(4):.2f}")
PY
python3 "$REPO/scripts/rejudge.py" runs/optimizer.db --min-gain 0.01 0.015
