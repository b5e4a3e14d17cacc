#!/usr/bin/env bash
# The multi-GPU device run (issue 22), one call on a host of several GPUs, builds nothing:
#  1. `start --gpus all` on a two-class bf16 workload from an empty ledger; while it runs,
#     the worker of GPU 1 is killed (kill -9) once, and the run must go on;
#  2. the same workload on GPU 0 alone (`--gpus 0`), its own empty ledger, with twice the
#     budget (BUDGET_ONE), so each item's run gets the share it got on two GPUs.
# Then a short table: candidates, wall time, candidates per minute, each item's GPU and
# best speedup. Logs and `status --json` of both under $OUT.
# Usage: BIN=target/release/optimizerd BUDGET=40s bash scripts/gpus_device.sh
#   WORKLOAD=bench: the benchmark workload's ten shapes (scripts/benchmark-agent.toml, fp16)
#   PARTS="multi" or PARTS="one": one part per device call (a call lasts 10 minutes at most);
#   the work folder /tmp/gpus-work is kept between calls on the same warm machine.
set -uo pipefail
BIN="$(realpath "${BIN:-target/release/optimizerd}")"
BUDGET="${BUDGET:-40s}"
BUDGET_ONE="${BUDGET_ONE:-80s}"
KILL_AFTER="${KILL_AFTER:-25}"
OUT="${OUT:-/tmp/gpus-out}"
ROOT="$(pwd)"
W=/tmp/gpus-work
PARTS="${PARTS:-multi one}"
WORKLOAD="${WORKLOAD:-two}"
mkdir -p "$W" "$OUT"
nvidia-smi -L | tee "$OUT/gpus.txt"
if [[ "$WORKLOAD" == bench ]]; then
  DTYPE=fp16
  SHAPES="$(python3 -c "import tomllib; print(', '.join('{ ' + ', '.join(f'{k} = {str(v).lower() if isinstance(v, bool) else v}' for k, v in s.items()) + ' }' for s in tomllib.load(open('scripts/benchmark-agent.toml', 'rb'))['workload']['shapes']))")"
else
  DTYPE=bf16
  SHAPES="{ b = 1, h = 1, s = 512, d = 64 }, { b = 4, h = 16, s = 4096, d = 64, causal = true }"
fi
for name in $PARTS; do
  rm -rf "$W/runs-$name"
  cat > "$W/$name.toml" <<EOF
[run]
runs_dir = "$W/runs-$name"
plan = "$ROOT/strategies/default.toml"
templates_dir = "$ROOT/kernel-templates"

[workload]
dtype = "$DTYPE"
shapes = [ $SHAPES ]

[timing]
rounds = 4
samples_per_round = 5
launches_per_sample = 5
sustained_ms = 0
EOF
done

if [[ " $PARTS " == *" multi "* ]]; then
echo "== 1. --gpus all, $BUDGET (the worker of GPU 1 is killed after ${KILL_AFTER}s)"
t0=$(date +%s.%N)
"$BIN" --config "$W/multi.toml" start --gpus all --budget "$BUDGET" --run-id multi --foreground > "$OUT/multi.log" 2>&1 &
coord=$!
sleep "$KILL_AFTER"
for p in $(pgrep -f "optimizerd worker"); do
  if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'CUDA_VISIBLE_DEVICES=1'; then
    echo "killing the worker of GPU 1 (pid $p)" | tee -a "$OUT/kill.txt"
    kill -9 "$p"; break
  fi
done
wait $coord; echo "rc=$?" >> "$OUT/multi.log"
t1=$(date +%s.%N)
"$BIN" --config "$W/multi.toml" status multi --json > "$OUT/multi.json"
"$BIN" --config "$W/multi.toml" status multi > "$OUT/multi-status.txt"
echo "wall $(python3 -c "print(round($t1-$t0,1))") s" >> "$OUT/multi-status.txt"
fi

if [[ " $PARTS " == *" one "* ]]; then
echo "== 2. --gpus 0, $BUDGET_ONE"
t0=$(date +%s.%N)
"$BIN" --config "$W/one.toml" start --gpus 0 --budget "$BUDGET_ONE" --run-id one --foreground > "$OUT/one.log" 2>&1
echo "rc=$?" >> "$OUT/one.log"
t1=$(date +%s.%N)
"$BIN" --config "$W/one.toml" status one --json > "$OUT/one.json"
"$BIN" --config "$W/one.toml" status one > "$OUT/one-status.txt"
echo "wall $(python3 -c "print(round($t1-$t0,1))") s" >> "$OUT/one-status.txt"
fi

grep -h "crashed\|worker died\|restart" "$OUT/multi.log" 2>/dev/null | head -5
cat "$OUT"/*-status.txt 2>/dev/null
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
print("| group | GPUs | candidates | budget used s | per minute | items (GPU, iterations, best vs the run's first kernel) |")
print("|---|---|---|---|---|---|")
for name in ("multi", "one"):
    try:
        s = json.load(open(f"{out}/{name}.json"))
    except Exception as e:
        print(f"| {name} | unreadable: {e} |"); continue
    g = s["group"]
    items = "; ".join(f"{v['item']['class']} gpu {v['item']['gpu']} {v['run']['iterations'] if v['run'] else '-'} it {v['best_speedup'] or 0:.2f}x" for v in s["items"])
    print(f"| {name} | {len(g['gpus'])} | {s['iterations']} | {g['used_s']:.0f} | {s['per_minute'] or 0:.1f} | {items} |")
EOF
