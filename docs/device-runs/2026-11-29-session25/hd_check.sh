#!/usr/bin/env bash
# Session 25: builds of the run's head dims only. Two wgmma-stage runs (one head dim, two),
# then the default plan on a D-128-only LLM pair (decode + causal GQA prefill).
set -u
REPO=$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
echo "=== wgmma stage, D 128 only"
DC=/tmp/hd1 OUT=$OUT/hd1 BUDGET=90s SHAPES='[ { b = 2, h = 16, s = 8192, d = 128 } ]' bash scripts/decide_check.sh 2>&1 | sed -n '/where each/,$p' | grep -v "^ *it\|^$"
echo "=== wgmma stage, D 64 and 128"
DC=/tmp/hd2 OUT=$OUT/hd2 BUDGET=90s bash scripts/decide_check.sh 2>&1 | sed -n '/where each/,$p' | grep -v "^ *it\|^$"
echo "=== default plan, LLM pair at D 128 only"
mkdir -p /tmp/hd3 && cd /tmp/hd3 && gunzip -c $REPO/.dev/bin/optimizerd.gz > optimizerd && chmod +x optimizerd
cat > agent.toml <<EOT
[run]
runs_dir = "runs"
plan = "$REPO/strategies/default.toml"
templates_dir = "$REPO/kernel-templates"
[workload]
dtype = "bf16"
shapes = [ { b = 8, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true }, { b = 1, hq = 32, hkv = 8, s = 2048, d = 128, causal = true } ]
[timing]
sustained_ms = 0.0
EOT
timeout 300 ./optimizerd start --budget 150s --foreground --config agent.toml > $OUT/hd3_run.txt 2>&1; echo "rc=$?"
tail -25 $OUT/hd3_run.txt | cut -c1-220
python3 - <<'PY'
import sqlite3
c = sqlite3.connect('runs/optimizer.db')
print(c.execute("select count(*), sum(verdict='compile_error'), sum(verdict in ('accepted','rejected','rejected_early','baseline')), avg(compile_ms)/1000 from iterations").fetchone())
for r in c.execute("select verdict, count(*), avg(compile_ms)/1000 from iterations group by verdict"): print(r)
for r in c.execute("select seq, template, verdict, substr(coalesce(error, reason),1,160) from iterations where verdict in ('compile_error','error','crashed')"): print(r)
PY
