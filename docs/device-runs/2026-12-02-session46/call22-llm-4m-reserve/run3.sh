# Session 46: FA4's last part, then the LLM workload (issue 17's) for 4 minutes from an empty ledger with this
# tree's binary (carried as .dev/bin/optimizerd.gz): decode-wgmma's stage in the plan (MQA now also meets its 7
# candidates); closing against SDPA and FA4; issue 17's acceptance lines; the decode stages' verdicts.
set -u
export PYTHONUNBUFFERED=1
python3 scripts/device_fa4.py install .dev/fa4/parts/part5 2>&1 | tail -1 | cut -c1-120
eval "$(python3 scripts/device_fa4.py env)"
WORKLOAD=llm BUDGET=${BUDGET:-4m} WAIT=${WAIT:-560} BENCH_DIR=${BENCH_DIR:-/tmp/llm2} bash scripts/device-bench-call.sh > $OUT/call.txt 2>&1
echo "bench rc=$?"
tail -2 $OUT/call.txt
tar xzf $OUT/misc.tgz -C /tmp status.txt acceptance.txt 2>/dev/null
sed -n '/^closing comparison/,/^fa4:/p' /tmp/status.txt | cut -c1-270
grep -E "NOT MET|^issue [0-9]" /tmp/acceptance.txt
python3 - $OUT/optimizer.db <<'PY'
import sqlite3, sys
d = sqlite3.connect(sys.argv[1])
for r in d.execute("select stage, verdict, count(*) from iterations where stage like 'decode%' group by stage, verdict"):
    print(*r)
for r in d.execute("select kind, message from events where kind in ('sdpa_timing', 'closing_reserve', 'closing_cut', 'closing_time') order by rowid"):
    print(r[0] + ":", r[1][:400])
PY
