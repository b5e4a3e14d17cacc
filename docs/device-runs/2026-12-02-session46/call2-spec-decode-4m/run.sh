# Session 46, call 2: the daemon on the spec-decode workload (speculative decoding's verification:
# B 8 x SQ 16 / 8, B 1 x SQ 16, Qwen2-like 28/4 heads x SQ 8 over SK 4000, and B 4 x SQ 4 as the
# control), 4 minutes from an empty ledger, then its kernels exported, loaded and checked from the
# manifest alone (examples/run_exported.py) and re-timed against SDPA default in one process.
set -u
export PYTHONUNBUFFERED=1
WORKLOAD=spec-decode BUDGET=${BUDGET:-4m} EXPORT_CHECK=1 WAIT=${WAIT:-560} bash scripts/device-bench-call.sh 2>&1 | tee $OUT/call.txt | tail -80
