#!/usr/bin/env bash
# The multi-GPU device run (issue 22), on a host of several GPUs; builds nothing.
#  multi: `start --gpus $GPUS` from an empty ledger; KILL_AFTER seconds in, the worker of GPU
#         $KILL_GPU is killed (kill -9) once, and the group must go on;
#  one:   the same workload on GPU $ONE_GPU alone (`--gpus $ONE_GPU`), its own empty ledger.
# Both groups are started detached (each coordinator in its own session, pinned with taskset
# to CPUS_MULTI / CPUS_ONE when given, so parts running side by side do not share CPUs), then
# waited for at most MAX_WAIT seconds. If a group is still running the script exits 75; the
# same command again (on the same warm machine: the work folder /tmp/gpus-work stays) waits
# again without starting anything, and once every group has ended writes, under $OUT, each
# group's `status --json` and text, each item run's `status --json`, the coordinators' logs,
# and prints a table: candidates, wall time, candidates per minute, time to converge (wall
# seconds until every item had ended), when the last shape reached its final best, and each
# item's GPU, end and best.
# Usage: BIN=target/release/optimizerd WORKLOAD=bench BUDGET=15m bash scripts/gpus_device.sh
#   WORKLOAD: two (default; two bf16 shapes, two classes) or bench (scripts/benchmark-agent.toml)
#   PARTS: "multi one" (default; side by side), "multi" or "one"
#   BUDGET (multi), BUDGET_ONE (default: BUDGET), GPUS (default all), ONE_GPU (default 0),
#   KILL_AFTER (default 25; 0: no kill), KILL_GPU (default 1), MAX_WAIT (default 540)
set -uo pipefail
BIN="$(realpath "${BIN:-target/release/optimizerd}")"
BUDGET="${BUDGET:-40s}"
BUDGET_ONE="${BUDGET_ONE:-$BUDGET}"
GPUS="${GPUS:-all}"
ONE_GPU="${ONE_GPU:-0}"
KILL_AFTER="${KILL_AFTER:-25}"
KILL_GPU="${KILL_GPU:-1}"
MAX_WAIT="${MAX_WAIT:-540}"
OUT="${OUT:-/tmp/gpus-out}"
ROOT="$(pwd)"
W=/tmp/gpus-work
PARTS="${PARTS:-multi one}"
WORKLOAD="${WORKLOAD:-two}"
mkdir -p "$W" "$OUT"
nvidia-smi -L > "$OUT/gpus.txt"
if [[ "$WORKLOAD" == bench ]]; then
  DTYPE=fp16
  SHAPES="$(python3 -c "import tomllib; print(', '.join('{ ' + ', '.join(f'{k} = {str(v).lower() if isinstance(v, bool) else v}' for k, v in s.items()) + ' }' for s in tomllib.load(open('scripts/benchmark-agent.toml', 'rb'))['workload']['shapes']))")"
else
  DTYPE=bf16
  SHAPES="{ b = 1, h = 1, s = 512, d = 64 }, { b = 4, h = 16, s = 4096, d = 64, causal = true }"
fi

start_part() {  # name gpus budget cpus
  local name=$1 gpus=$2 budget=$3 cpus=$4
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
  local pin=()
  [[ -n "$cpus" ]] && pin=(taskset -c "$cpus")
  echo "== $name: --gpus $gpus, budget $budget, CPUs ${cpus:-all} ($(date -u +%T))" | tee -a "$W/parts.txt"
  date +%s.%N > "$W/$name.t0"
  "${pin[@]}" "$BIN" --config "$W/$name.toml" start --gpus "$gpus" --budget "$budget" --run-id "$name" > "$W/$name.start.log" 2>&1
  echo "start rc=$?" >> "$W/$name.start.log"
}

started_now=0
for name in $PARTS; do
  [[ -f "$W/$name.t0" ]] && continue
  if [[ $name == multi ]]; then start_part multi "$GPUS" "$BUDGET" "${CPUS_MULTI:-}"
  else start_part one "$ONE_GPU" "$BUDGET_ONE" "${CPUS_ONE:-}"; fi
  started_now=1
done

if [[ $started_now == 1 && " $PARTS " == *" multi "* && "$KILL_AFTER" != 0 && ! -f "$W/kill.txt" ]]; then
  sleep "$KILL_AFTER"
  for p in $(pgrep -f "optimizerd worker"); do
    # The multi group's worker of that GPU: its parent daemon's command line names multi.toml.
    ppid=$(ps -o ppid= -p "$p" | tr -d ' ')
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "CUDA_VISIBLE_DEVICES=$KILL_GPU" \
       && tr '\0' ' ' < /proc/$ppid/cmdline 2>/dev/null | grep -q "multi.toml"; then
      echo "$(date -u +%T) killing the multi group's worker of GPU $KILL_GPU (pid $p, daemon $ppid)" | tee "$W/kill.txt"
      kill -9 "$p"; break
    fi
  done
fi

group_state() {  # prints running|ended
  "$BIN" --config "$W/$1.toml" status "$1" --json 2>/dev/null | python3 -c "
import json, sys
try:
    g = json.load(sys.stdin)['group']
    print('running' if g['state'] == 'running' else 'ended')
except Exception:
    print('running')"
}

t_wait=$(date +%s)
while :; do
  running=""
  for name in $PARTS; do
    [[ -f "$W/$name.t1" ]] && continue
    if [[ $(group_state "$name") == ended ]]; then date +%s.%N > "$W/$name.t1"; else running+=" $name"; fi
  done
  [[ -z "$running" ]] && break
  if (( $(date +%s) - t_wait >= MAX_WAIT )); then
    for name in $running; do "$BIN" --config "$W/$name.toml" status "$name" | head -20; done
    echo "still running:$running (run the same command again to wait on)"; exit 75
  fi
  sleep 5
done

cp "$W/parts.txt" "$W"/*.start.log "$OUT/" 2>/dev/null
[[ -f "$W/kill.txt" ]] && cp "$W/kill.txt" "$OUT/"
for name in $PARTS; do
  "$BIN" --config "$W/$name.toml" status "$name" --json > "$OUT/$name.json"
  "$BIN" --config "$W/$name.toml" status "$name" > "$OUT/$name-status.txt"
  echo "wall $(python3 -c "print(round($(cat "$W/$name.t1")-$(cat "$W/$name.t0"),1))") s (start to the end seen by this script, 5 s polls)" >> "$OUT/$name-status.txt"
  cp "$W/runs-$name/$name/run.log" "$OUT/$name.log" 2>/dev/null  # the coordinator's log: every daemon's lines as [gpu N]
  mkdir -p "$OUT/runs-$name"
  for run in $(python3 -c "import json; [print(v['item']['run_id']) for v in json.load(open('$OUT/$name.json'))['items'] if v['run']]" | sort -u); do
    "$BIN" --config "$W/$name.toml" status "$run" --json > "$OUT/runs-$name/$run.json"
  done
done
grep -h "crashed\|worker died\|restart\|requeued" "$OUT"/multi.log 2>/dev/null | head -5
cat "$OUT"/*-status.txt 2>/dev/null
python3 - "$OUT" $PARTS <<'EOF'
import datetime, glob, json, os, sys
out, parts = sys.argv[1], sys.argv[2:]
def t(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
print("| group | GPUs | candidates | wall s | per minute | every item ended at s | last final best reached at s | items: class GPU iterations end, best-at s (wall) |")
print("|---|---|---|---|---|---|---|---|")
for name in parts:
    try:
        s = json.load(open(f"{out}/{name}.json"))
    except Exception as e:
        print(f"| {name} | unreadable: {e} |"); continue
    g = s["group"]; g0 = t(g["started_at"])
    ended = (t(g["finished_at"]) - g0) if g.get("finished_at") else None
    last_best, items = 0.0, []
    for v in s["items"]:
        it, run = v["item"], v["run"]
        if not run:
            items.append(f"{it['class']} never started"); continue
        st = json.load(open(f"{out}/runs-{name}/{run['id']}.json"))
        ttb = [x.get("first_reached_best_s") for x in st["time_to_best"]["shapes"]]
        at = max((x for x in ttb if x is not None), default=None)
        wall_at = None if at is None else t(run["started_at"]) - g0 + at
        if wall_at is not None:
            last_best = max(last_best, wall_at)
        end = (run.get("message") or "").split(":")[0]
        items.append(f"{it['class']} gpu {it['gpu']} {run['iterations']} it {end}, best at {wall_at:.0f}" if wall_at is not None else f"{it['class']} gpu {it['gpu']} {run['iterations']} it {end}")
    print(f"| {name} | {len(g['gpus'])} | {s['iterations']} | {g['used_s']:.0f} | {s['per_minute'] or 0:.1f} | {ended:.0f} | {last_best:.0f} | {'; '.join(items)} |" if ended is not None else f"| {name} | {len(g['gpus'])} | {s['iterations']} | - | - | - | {last_best:.0f} | {'; '.join(items)} |")
EOF
