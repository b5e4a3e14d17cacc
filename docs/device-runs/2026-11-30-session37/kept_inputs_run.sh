# Session 37: the LLM workload for RUN_BUDGET (default 4m) in /tmp/k4m with this tree's binary (timing input
# sets kept by shape across requests, worker/cuda/timing.rs). The first call starts from an empty ledger;
# KEEP=1 (a second call, machine still warm) runs again in the same folder: a second run, which warm-starts
# from the first and learns the closing's cost from it (reserve.rs: the re-rank measured apart, 951b19e).
# Prints the candidates per stage with their median check / timing / compile ms and the closing events.
set -u
export PYTHONUNBUFFERED=1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
W=/tmp/k4m
[[ "${KEEP:-0}" == 1 ]] || rm -rf $W
n=$(ls $W/w/runs 2>/dev/null | wc -l)
python3 scripts/benchmark.py --bin target/release/optimizerd --budget "${RUN_BUDGET:-4m}" --workload llm --work $W/w --out $OUT/BENCH.md > $OUT/run.log 2>&1
echo "run rc=$?"
target/release/optimizerd status --config $W/w/agent.toml > $OUT/status.txt 2>&1
python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.close()" $W/w/runs/optimizer.db $OUT/optimizer.db
sed -n '/^closing comparison/,/^sdpa:/p' $OUT/status.txt | cut -c1-150; grep -E "^budget|^to best|^iterations" $OUT/status.txt
python3 - $OUT/optimizer.db <<'PY'
import sqlite3, sys
d = sqlite3.connect(sys.argv[1])
run, = d.execute("select run_id from iterations order by rowid desc limit 1").fetchone()
print("run", run, "- stage, candidates checked, median check ms, median time ms, median compile ms, first/last budget s")
for st, in d.execute("select stage from iterations where run_id=? group by stage order by min(used_s)", (run,)):
    rows = list(d.execute("select check_ms, time_ms, compile_ms, used_s from iterations where run_id=? and stage=? and check_ms is not null", (run, st)))
    if rows:
        med = lambda xs: round(sorted(xs)[len(xs)//2]) if xs else None
        print(" ", st, len(rows), med([r[0] for r in rows]), med([r[1] for r in rows if r[1] is not None]), med([r[2] for r in rows if r[2] is not None]), round(min(r[3] for r in rows), 1), round(max(r[3] for r in rows), 1))
for kind, body in d.execute("select kind, message from events where run_id=? and kind like 'closing%' order by rowid", (run,)):
    print(" ", kind, body[:400])
PY
python3 scripts/acceptance.py $OUT/optimizer.db > $OUT/acceptance.txt 2>&1; grep -E "NOT MET|^issue [0-9]" $OUT/acceptance.txt
