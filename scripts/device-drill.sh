#!/usr/bin/env bash
# The daemon drill on a GPU machine (binary built elsewhere and carried):
# doctor, a detached run, watch it, kill -9 the daemon mid-run, resume, watch it to
# the end, then runs/history/status. Everything it prints is the evidence.
#
#   scripts/device-drill.sh [BUDGET] [KILL_AFTER_SECONDS]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
budget="${1:-4m}"
kill_after="${2:-45}"
bin=target/release/optimizerd
out="${OUT:-/tmp/optimizerd-out}"
mkdir -p "$out"
rm -rf runs/optimizer.db* runs/2* runs/gpu.lock
say() { echo "+ $*"; }
say "$bin doctor"; "$bin" doctor
say "$bin start --budget $budget"; "$bin" start --budget "$budget" || exit 1
say "$bin watch   (for ${kill_after}s)"; timeout "$kill_after" "$bin" watch
pid=$(awk '{print $2}' runs/gpu.lock)
say "kill -9 $pid   (the daemon)"; kill -9 "$pid"; sleep 1
say "$bin runs"; "$bin" runs
say "$bin resume"; "$bin" resume || exit 1
say "$bin watch   (until the run ends)"; "$bin" watch > "$out/watch-after-resume.txt"; tail -n 25 "$out/watch-after-resume.txt"
say "$bin runs"; "$bin" runs
say "$bin history"; "$bin" history | tee "$out/history.txt"
say "$bin status"; "$bin" status
run_dir=$(ls -d runs/2* | tail -n 1)
cp "$run_dir/run.log" "$run_dir/worker.log" "$out/" 2>/dev/null
"$bin" history --json > "$out/history.json"
say "git -C $run_dir/workspace log --oneline best --"; git -C "$run_dir/workspace" log --oneline best -- | head -20
