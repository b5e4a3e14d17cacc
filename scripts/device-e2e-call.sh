#!/usr/bin/env bash
# One call of the device tool for scripts/model_e2e.sh (a model's config.json -> its attention
# shapes tuned -> the exported package in a fresh venv -> gpu_check.py -> model_bench.py), which
# outlasts one call (the tool limits a command to 10 minutes):
#   WAIT=540 bash scripts/device-e2e-call.sh     (carry .dev/bin: the stripped, gzipped release binary)
# The first call copies the repo to $E2E_DIR/repo (default /tmp/e2e-call) and starts model_e2e.sh
# there in the background (its own session: it survives the call while the machine stays warm, so
# issue the next call at once; the machine goes back after 30 s idle); later calls wait for it.
# Every call leaves model_e2e.sh's log and its OUT folder (status, export, gpu_check, model_bench,
# their JSON) in $OUT, and prints the log's tail. CONFIG (default scripts/models/llama-3-8b-config.json,
# Llama-3-8B's attention: 32 query heads over 8 KV heads, head dim 128, bf16), BUDGET (default 4m)
# and WAIT (seconds to wait in this call, default 540) come from the environment; PREFILL, DECODE
# and BATCHES pass through to model_e2e.sh. FlashAttention-4 joins model_bench.py's comparison
# when `eval "$(python3 scripts/device_fa4.py env)"` ran before the first call (after
# `device_fa4.py install` of its parts): the environment is the background job's.
set -u
W="${E2E_DIR:-/tmp/e2e-call}"
out="${OUT:-/tmp/optimizerd-out}"
mkdir -p "$W" "$out"
. "$(dirname "${BASH_SOURCE[0]}")/device-call-common.sh"
device_call_repo "$W" || exit 1
if [ ! -f "$W/pid" ]; then
  OUT="$W/out" OPTIMIZERD="$W/repo/target/release/optimizerd" setsid bash -c \
    'bash scripts/model_e2e.sh "$1" "$2" "$3"; echo $? > "$4"' _ \
    "${CONFIG:-scripts/models/llama-3-8b-config.json}" "$W/work" "${BUDGET:-4m}" "$W/rc" \
    > "$W/e2e.log" 2>&1 < /dev/null &
  echo $! > "$W/pid"
  echo "started model_e2e.sh (pid $(cat "$W/pid")) in $W"
fi
pid=$(cat "$W/pid")
end=$((SECONDS + ${WAIT:-540}))
while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt "$end" ]; do sleep 5; done
if [ -f "$W/rc" ]; then echo "model_e2e.sh finished, rc=$(cat "$W/rc")"; else echo "model_e2e.sh still running (call again)"; fi
cp "$W/e2e.log" "$out/" 2>/dev/null
[ -d "$W/out" ] && cp -r "$W/out" "$out/e2e-out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$out/smi.txt" 2>&1
tail -n 70 "$W/e2e.log"
