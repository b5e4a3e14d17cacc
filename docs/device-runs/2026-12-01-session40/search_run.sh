# Session 40: the LLM workload for RUN_BUDGET (default 4m) from an empty ledger with this tree's binary
# (the look-ahead's builds compiled by the worker's compile pool, soonest needed first, on THREADS threads:
# worker.compile_threads, default 0 = a quarter of the host's cores), the CUDA compute cache off (NVRTC's
# times as on a fresh machine), worker debug lines.
# Prints the closing comparison, issue 17's acceptance lines, the loads the look-ahead had, and each
# coordinate stage's candidates in order (score = geometric-mean us over the stage's shapes).
set -u
export PYTHONUNBUFFERED=1 CUDA_CACHE_DISABLE=1
exec > >(tee "$OUT/summary.txt") 2>&1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
W=/tmp/s40; rm -rf $W
sed "s/^\[worker\]/[worker]\ncompile_threads = ${THREADS:-0}/" scripts/benchmark-llm.toml > /tmp/s40-llm.toml
grep -A1 '^\[worker\]' /tmp/s40-llm.toml
RUST_LOG="info,optimizerd::worker=debug" python3 scripts/benchmark.py --bin target/release/optimizerd --budget "${RUN_BUDGET:-4m}" --workload llm --config /tmp/s40-llm.toml --work $W/w --out $OUT/BENCH.md > $OUT/run.log 2>&1
echo "run rc=$?"
target/release/optimizerd status --config $W/w/agent.toml > $OUT/status.txt 2>&1
cp $W/w/runs/*/worker.log $OUT/ 2>/dev/null
rm -rf $OUT/benchmarks
python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.execute('pragma journal_mode=delete'); d.close()" $W/w/runs/optimizer.db $OUT/optimizer.db
python3 - $OUT/worker.log <<'PY'
import re, sys, statistics as st
rows = [(m.group(1), float(m.group(2)), m.group(3) == "true", float(m.group(4))) for m in
        (re.search(r"compiled id=(\S+) compile_ms=([\d.]+) ahead=(\w+) waited_ms=([\d.]+)", l) for l in open(sys.argv[1], errors="replace")) if m]
if rows:
    print(f"loads {len(rows)}: ahead {sum(r[2] for r in rows)}, median compile {st.median(r[1] for r in rows):.0f} ms, "
          f"waited median {st.median(r[3] for r in rows):.0f} ms, total {sum(r[3] for r in rows)/1e3:.1f} s, "
          f"{sum(r[3] > 1000 for r in rows)} over 1 s; compile of builds done ahead: median "
          f"{st.median([r[1] for r in rows if r[2]] or [0]):.0f} ms, of the rest {st.median([r[1] for r in rows if not r[2]] or [0]):.0f} ms")
PY
python3 - $OUT/optimizer.db <<'PY' | tee $OUT/stages.txt
import sqlite3, sys, json
d = sqlite3.connect(sys.argv[1])
run, = d.execute("select run_id from iterations order by rowid desc limit 1").fetchone()
print("run", run)
for st, in d.execute("select stage from iterations where run_id=? group by stage order by min(seq)", (run,)):
    rows = list(d.execute("select seq, params_json, score_us, verdict, used_s from iterations where run_id=? and stage=? order by seq", (run, st)))
    if st.startswith("open/") or st.startswith("rerank"):
        print(f"  {st}: {len(rows)} candidates"); continue
    print(f"  {st}:")
    for seq, p, s, v, u in rows:
        p = ",".join(f"{k}={x}" for k, x in json.loads(p).items())
        print(f"    #{seq} {u or 0:6.1f}s {v:13} {s if s is None else round(s, 2)!s:>8}  {p}")
PY
sed -n '/^closing comparison/,/^sdpa:/p' $OUT/status.txt | cut -c1-150; grep -E "^budget|^to best|^iterations" $OUT/status.txt
python3 scripts/acceptance.py $OUT/optimizer.db > $OUT/acceptance.txt 2>&1; grep -E "NOT MET|^issue [0-9]" $OUT/acceptance.txt
gzip -9f $OUT/worker.log
