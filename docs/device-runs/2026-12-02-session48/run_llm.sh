# Session 47 (rerun in session 48): FA4's last part, then the LLM workload (issue 17's) for 8 minutes from an empty ledger
# (full 200-ms closing windows), with the export check; acceptance lines.
set -u
export PYTHONUNBUFFERED=1
[[ -n "${PART:-}" ]] && python3 scripts/device_fa4.py install .dev/fa4/parts/$PART 2>&1 | tail -1 | cut -c1-120
eval "$(python3 scripts/device_fa4.py env)"
EXPORT_CHECK=1 WARM=0 WORKLOAD=${WORKLOAD:-llm} BUDGET=${BUDGET:-8m} WAIT=${WAIT:-500} BENCH_DIR=${BENCH_DIR:-/tmp/llm8} bash scripts/device-bench-call.sh > $OUT/call.txt 2>&1
echo "bench rc=$?"
tail -3 $OUT/call.txt
tar xzf $OUT/misc.tgz -C /tmp status.txt acceptance.txt 2>/dev/null
sed -n '/^closing comparison/,/^fa4:/p' /tmp/status.txt | cut -c1-270
grep -E "NOT MET|^issue [0-9]" /tmp/acceptance.txt
grep -A30 'vs fa4' $OUT/compare_exported.txt 2>/dev/null | head -40
