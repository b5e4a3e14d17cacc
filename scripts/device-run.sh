#!/usr/bin/env bash
# Run optimizerd on a GPU machine that has no Rust: the binary is built elsewhere
# (cargo build --release) and carried. From an empty runs folder, runs one
# optimization and prints its history; logs and the run's report (`optimizerd report`:
# report.html, report.md, figures) go to $OUT when set.
#
#   scripts/device-run.sh BUDGET [PLAN]      e.g. scripts/device-run.sh 5m strategies/fault-drill.toml
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
budget="${1:-5m}"
plan="${2:-}"
bin=target/release/optimizerd
out="${OUT:-/tmp/optimizerd-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
rm -rf runs/optimizer.db* runs/2*
args=(start --budget "$budget" --foreground)
[[ -n "$plan" ]] && args+=(--plan "$plan")
echo "+ $bin ${args[*]}"
"$bin" "${args[@]}" 2> >(tee "$out/start.stderr" >&2)
rc=$?
echo "+ exit status $rc"
echo "+ $bin history"
"$bin" history | tee "$out/history.txt"
"$bin" history --json > "$out/history.json"
"$bin" status --json > "$out/status.json"
echo "+ $bin report --out $out/report"
"$bin" report --out "$out/report"
run_dir=$(ls -d runs/2* | tail -n 1)
cp "$run_dir/run.log" "$out/run.log" 2>/dev/null
cp "$run_dir/worker.log" "$out/worker.log" 2>/dev/null
echo "+ git -C $run_dir/workspace log --oneline best"
git -C "$run_dir/workspace" log --oneline best -- | head -20
git -C "$run_dir/workspace" for-each-ref refs/rejected --format='%(refname)' | tr '\n' ' '; echo
exit $rc
