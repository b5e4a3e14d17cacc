#!/usr/bin/env bash
# One call of the device tool during a long benchmark (the tool limits a command to 10 minutes,
# a machine to 30 minutes held; a 20m benchmark takes ~21 minutes of wall time: since 2026-11-29
# the budget covers the closing comparison, run.budget_covers_closing; the LLM workload's plan
# ran in ~3 minutes on the H200 once its prefill stages left the decode shapes alone, session 25,
# where before an 8-minute run never reached the Hopper stage: BUDGET=8m leaves it an open phase):
#   WAIT=520 bash scripts/device-bench-call.sh        (carry target/release/optimizerd, or .dev/bin: below)
# The first call copies the repo to /tmp/bench/repo and starts `scripts/benchmark.py --detach`
# there (the daemon survives between calls while the machine stays warm: issue the next call at
# once, it goes back after 30 s idle); later calls attach and wait again. Every call leaves the
# status, history, ledger, the BENCHMARKS.md the script writes and the clocks in $OUT (the small files in misc.tgz).
# BUDGET (default 20m), WORKLOAD (benchmark.py --workload, default `default`) and WAIT (seconds to
# wait, default 530) come from the environment. EXPORT_CHECK=1: once the run has finished, the call
# that sees it end also exports its kernels (optimizerd export --out), loads and checks every one
# from the manifest alone (examples/run_exported.py), and re-times them against FA4 and SDPA
# default in one process, burst and sustained, and decode shapes between their layer's GEMMs
# (scripts/compare_exported.py --fa4 --sdpa --layer, inputs rotated as in the daemon; then again
# with --warm, one input set; FA4 from scripts/device_fa4.py, whose env must be in effect):
# issue 19's acceptance harness. Into $OUT.
set -u
export PYTHONUNBUFFERED=1
W="${BENCH_DIR:-/tmp/bench}"  # BENCH_DIR: another folder for another run on the same machine
out="${OUT:-/tmp/optimizerd-out}"
mkdir -p "$W" "$out"
. "$(dirname "${BASH_SOURCE[0]}")/device-call-common.sh"
device_call_repo "$W" || exit 1
chmod +x target/release/optimizerd
python3 scripts/benchmark.py --bin target/release/optimizerd --budget "${BUDGET:-20m}" --workload "${WORKLOAD:-default}" --detach --work "$W/w" \
  --max-wait "${WAIT:-530}" 2>&1 | tee -a "$out/bench.log"
rc=${PIPESTATUS[0]}
CFG=$W/w/agent.toml
target/release/optimizerd status --config "$CFG" > "$out/status.txt" 2>&1
target/release/optimizerd status --json --config "$CFG" > "$out/status.json" 2>&1
target/release/optimizerd history --json --config "$CFG" > "$out/history.json" 2>&1
cp docs/BENCHMARKS.md "$out/BENCHMARKS.md"
# The ledger is in WAL mode and may be written meanwhile: copy it with SQLite's backup.
python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.close()" \
  "$W/w/runs/optimizer.db" "$out/optimizer.db"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$out/smi.txt" 2>&1
head -40 "$out/status.txt"
if [[ $rc == 0 && "${EXPORT_CHECK:-0}" == 1 ]]; then
  rm -rf "$W/exp"
  target/release/optimizerd export --out "$W/exp" --config "$CFG" > "$out/export.txt" 2>&1
  echo "export rc=$? ($W/exp)"
  cp "$W/exp/manifest.json" "$out/manifest.json" 2>/dev/null
  python3 examples/run_exported.py "$W/exp" > "$out/run_exported.txt" 2>&1
  echo "run_exported rc=$?"; tail -n 25 "$out/run_exported.txt"
  python3 scripts/compare_exported.py "$W/exp" --fa4 --sdpa --layer > "$out/compare_exported.txt" 2>&1
  echo "compare_exported rc=$?"; tail -n 50 "$out/compare_exported.txt"
  # The same without rotation (every call's inputs warm in L2), beside it: the harness's
  # figures before 2026-11-28 were taken this way. WARM=0 leaves it out (a call short of time).
  if [[ "${WARM:-1}" == 1 ]]; then
    python3 scripts/compare_exported.py "$W/exp" --fa4 --sdpa --warm --rounds 15 > "$out/compare_exported_warm.txt" 2>&1
    echo "compare_exported --warm rc=$?"; tail -n 16 "$out/compare_exported_warm.txt"
  fi
fi
# The open issues' bars against this run's closing (scripts/acceptance.py), once it has one.
if [[ $rc == 0 ]]; then
  python3 scripts/acceptance.py "$out/optimizer.db" > "$out/acceptance.txt" 2>&1
  grep -E "NOT MET|^issue [0-9]" "$out/acceptance.txt"
fi
# The device tool brings back only so many files from $OUT (2026-11-29: the ledger and
# run_exported.txt were left out): the small ones travel as one archive.
( cd "$out" && tar czf misc.tgz --remove-files $(ls status.txt status.json history.json smi.txt manifest.json export.txt acceptance.txt 2>/dev/null) )
echo "benchmark rc=$rc (75: still running, call again now)"
