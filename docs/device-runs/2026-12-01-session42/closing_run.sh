# Session 41 (reused in session 42, its work folder /tmp/s42): the LLM workload for RUN_BUDGET (default 4m) from an empty ledger with this tree's binary (every
# case's burst samples taken before any sustained window, in the worker and in scripts/sdpa_baseline.py), the
# CUDA compute cache off, worker debug lines (call 7: each case's timing, timed_cases.jsonl.gz) (call 2 on: burst samples also wait 2 s after the worker's last sustained window), nvidia-smi sampling clocks and power every 250 ms beside it (smi.csv.gz).
# Prints the closing comparison, each shape's best kernel as the search timed it against the closing's burst
# figures (before / after the baselines) and sustained one, and issue 17's acceptance lines.
set -u
export PYTHONUNBUFFERED=1 CUDA_CACHE_DISABLE=1
exec > >(tee "$OUT/summary.txt") 2>&1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
W=/tmp/s42; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms ${SMI_MS:-250} > $W/smi.csv 2>&1 &
SMI=$!
RUST_LOG="info,optimizerd::worker=debug" python3 scripts/benchmark.py --bin target/release/optimizerd --budget "${RUN_BUDGET:-4m}" --workload llm --work $W/w --out $OUT/BENCH.md > $OUT/run.log 2>&1
echo "run rc=$?"
kill $SMI 2>/dev/null; wait $SMI 2>/dev/null
gzip -9c $W/smi.csv > $OUT/smi.csv.gz
target/release/optimizerd status --config $W/w/agent.toml > $OUT/status.txt 2>&1
grep -h 'timed case' $W/w/runs/*/worker.log | gzip -9 > $OUT/timed_cases.jsonl.gz
python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.execute('pragma journal_mode=delete'); d.close()" $W/w/runs/optimizer.db $OUT/optimizer.db
sed -n '/^closing comparison/,/^sdpa:/p' $OUT/status.txt | cut -c1-150; grep -E "^budget|^to best|^iterations" $OUT/status.txt
python3 - $OUT/optimizer.db <<'PY'
import sqlite3, sys
d = sqlite3.connect(sys.argv[1])
run, = d.execute("select run_id from closing order by rowid desc limit 1").fetchone()
print(f"{'shape':40} {'iter':>5} {'search us':>10} {'burst before':>13} {'after':>8} {'sustained':>10} {'closing/search':>15}")
for shape, seq, b, a, s in d.execute("select shape, seq, ours_before_us, ours_after_us, ours_sustained_before_us from closing where run_id=? order by rowid", (run,)):
    row = d.execute("select median_us from iteration_shapes where run_id=? and seq=? and shape=?", (run, seq, shape)).fetchone()
    m = row[0] if row and row[0] else float("nan")
    print(f"{shape:40} {seq:5} {m:10.2f} {b:13.2f} {a:8.2f} {s if s is None else round(s, 2)!s:>10} {0.5 * (a + b) / m:15.3f}")
PY
python3 scripts/acceptance.py $OUT/optimizer.db > $OUT/acceptance.txt 2>&1; grep -E "NOT MET|^issue [0-9]" $OUT/acceptance.txt
