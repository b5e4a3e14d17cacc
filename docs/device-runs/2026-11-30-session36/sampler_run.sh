# Session 36, call 6: bbd29b0's binary (the alias-table input sampler; the shipped plan of 01a0f76):
# refcost (examples/refcost.rs) before and after on this machine's CPU, then the LLM workload for 2
# minutes from an empty ledger, to set its checks' time beside call 5's (same plan, old sampler).
set -u
export PYTHONUNBUFFERED=1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
echo "== refcost before (baa09f4's sampler)"; .dev/rc/refcost_old | tee $OUT/refcost_old.txt | grep randn
echo "== refcost after (bbd29b0)"; .dev/rc/refcost_new | tee $OUT/refcost_new.txt | grep randn
rm -rf /tmp/s2m
python3 scripts/benchmark.py --bin target/release/optimizerd --budget 2m --workload llm --work /tmp/s2m/w --out $OUT/BENCH-2m.md > $OUT/run-2m.log 2>&1
echo "2m rc=$?"
target/release/optimizerd status --config /tmp/s2m/w/agent.toml > $OUT/status-2m.txt 2>&1
python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.close()" /tmp/s2m/w/runs/optimizer.db $OUT/opt-2m.db
sed -n '/^closing comparison/,/^sdpa:/p' $OUT/status-2m.txt | cut -c1-150; grep -E "^budget|^to best|^iterations" $OUT/status-2m.txt
python3 - $OUT/opt-2m.db <<'PY'
import sqlite3, sys
d = sqlite3.connect(sys.argv[1])
print("stage, candidates, median check ms, median time ms, first/last budget s")
for st, in d.execute("select stage from iterations group by stage order by min(used_s)"):
    rows = list(d.execute("select check_ms, time_ms, used_s from iterations where stage=? and check_ms is not null", (st,)))
    if rows:
        c = sorted(r[0] for r in rows); t = sorted(r[1] for r in rows if r[1] is not None)
        print(st, len(rows), round(c[len(c)//2]), round(t[len(t)//2]) if t else None, round(min(r[2] for r in rows), 1), round(max(r[2] for r in rows), 1))
PY
