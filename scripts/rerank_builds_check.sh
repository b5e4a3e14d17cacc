#!/usr/bin/env bash
# A short daemon run on the GPU whose closing re-ranks Hopper kernels: 4 wgmma-tma candidates on
# two bf16 shapes, 100 s of budget, SDPA as the baseline. It prints the iterations (compile_ms
# each) and the re-rank, closing and closing-time events: the re-rank's time against its
# sustained windows (2 shapes x 3 kernels x 3 rounds x 200 ms = 3.6 s) shows whether its loads
# compiled. Run from the repository root on the device with the stripped binary carried:
#   strip -o .dev/bin/optimizerd target/release/optimizerd && gzip -9f .dev/bin/optimizerd
#   (device) bash scripts/rerank_builds_check.sh            (carry .dev/bin)
set -u
REPO=$PWD
mkdir -p /tmp/cc && gunzip -c .dev/bin/optimizerd.gz > /tmp/cc/optimizerd && chmod +x /tmp/cc/optimizerd
cd /tmp/cc
cat > plan.toml <<EOF
[[stage]]
name = "tensor-cores-hopper"
template = "wgmma_tma.cu"
search = "exhaustive"
space = { BLOCK_N = [128], STAGES = [2], CONSUMERS = [3, 2], PINGPONG = [1], OVERLAP = [1, 0], PERSISTENT = [1], LAZY_RESCALE = [1], TAIL_SPLIT = [1], EPI_TMA = [1], PACK_GQA = [0], STREAM_K = [0], LPT_MIB = [8], DYNAMIC = [1], Q_STAGES = [1], PV_WAIT = [1] }
max_candidates = 4

[open_phase]
enabled = false
EOF
cat > agent.toml <<EOF
[run]
runs_dir = "runs"
plan = "plan.toml"
templates_dir = "$REPO/kernel-templates"

[workload]
dtype = "bf16"
shapes = [ { b = 8, h = 16, s = 1024, d = 64 }, { b = 4, h = 32, s = 1024, d = 128, causal = true } ]
EOF
OUT=${OUT:-/tmp/cc/out}; mkdir -p "$OUT"
timeout 170 ./optimizerd start --budget 100s --foreground --config agent.toml > "$OUT/run.txt" 2>&1
echo "rc=$?"
python3 - <<'PY'
import sqlite3
c = sqlite3.connect('runs/optimizer.db')
for r in c.execute("select seq, stage, verdict, started_at, finished_at, compile_ms from iterations order by seq"): print(r)
for r in c.execute("select at, kind, substr(message, 1, 160) from events where kind in ('rerank','closing','closing_time','closing_reserve') order by rowid"): print(r)
PY
