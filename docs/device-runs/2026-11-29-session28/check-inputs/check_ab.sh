#!/usr/bin/env bash
# The check's input path, old binary then new (session 25: bits once; session 28: bits from generation, no f32 K/V):
set -u
REPO=$PWD
for which in old new; do
  W=/tmp/ca_$which; mkdir -p $W; cd $W
  if [ $which = old ]; then gunzip -c $REPO/.dev/bin/optimizerd-old.gz > optimizerd; else gunzip -c $REPO/.dev/bin/optimizerd.gz > optimizerd; fi
  chmod +x optimizerd
  cat > plan.toml <<EOT
[[stage]]
name = "decode"
template = "decode.cu"
search = "exhaustive"
max_candidates = 6
[open_phase]
enabled = false
EOT
  cat > agent.toml <<EOT
[run]
runs_dir = "runs"
plan = "plan.toml"
templates_dir = "$REPO/kernel-templates"
[workload]
dtype = "bf16"
shapes = [ { b = 64, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true }, { b = 8, hq = 32, hkv = 8, sq = 1, sk = 16384, d = 128, causal = true } ]
[baseline]
sdpa = false
[timing]
sustained_ms = 0.0
EOT
  timeout 200 ./optimizerd start --budget 70s --foreground --config agent.toml > $OUT/ca_$which.txt 2>&1; echo "$which rc=$?"
  python3 - <<'PY'
import sqlite3
c = sqlite3.connect('runs/optimizer.db')
rows = c.execute("select seq, verdict, compile_ms, check_ms, time_ms from iterations order by seq").fetchall()
for r in rows: print(r[0], r[1], *[None if x is None else round(x / 1000, 2) for x in r[2:]])
ch = [r[3] for r in rows if r[3]]
print(f"check mean {sum(ch) / len(ch) / 1000:.2f} s over {len(ch)}" if ch else "no checks")
PY
  cd $REPO
done
