# Session 38: where a check's time goes after the inputs moved to kept, page-locked host memory
# (worker/cuda/staging.rs). Session 37's check_cost.sh (the LLM workload for 2 minutes from an empty
# ledger, worker debug lines, median phases per shape) plus, first, examples/refcost on an idle machine
# (the CPU side of a check alone: drawing fresh inputs and the reference), and the run's stage medians.
set -u
export PYTHONUNBUFFERED=1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
if [[ -f .dev/bin/refcost.gz && "${REFCOST:-1}" == 1 ]]; then
  gunzip -c .dev/bin/refcost.gz > /tmp/refcost && chmod +x /tmp/refcost && /tmp/refcost > $OUT/refcost.txt 2>&1
  echo "refcost rc=$?"; cut -c1-200 $OUT/refcost.txt
fi
W=/tmp/cc2m; rm -rf $W
RUST_LOG="info,optimizerd::worker=debug" python3 scripts/benchmark.py --bin target/release/optimizerd --budget "${RUN_BUDGET:-2m}" --workload llm --work $W/w --out $OUT/BENCH.md > $OUT/run.log 2>&1
echo "run rc=$? on $(nproc) cores"
target/release/optimizerd status --config $W/w/agent.toml > $OUT/status.txt 2>&1
cp $W/w/runs/*/worker.log $OUT/ 2>/dev/null
python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.close()" $W/w/runs/optimizer.db $OUT/optimizer.db
grep -E "^budget|^iterations|^to best" $OUT/status.txt
grep -iE "page-lock|warn" $OUT/worker.log | head -5
python3 - $OUT/worker.log <<'PY' | tee $OUT/check_phases.txt
import re, sys, statistics as st
rows = {}
pat = re.compile(r"check (\S+): (\d+) ms: inputs drawn (\d+), uploaded and launched (\d+), reference (\d+), results (\d+), padded view (\d+), probes (\d+)")
for line in open(sys.argv[1], errors="replace"):
    m = pat.search(line)
    if m:
        rows.setdefault(m.group(1), []).append([int(x) for x in m.groups()[1:]])
print(f"{'shape':42} {'n':>3} {'total':>6} {'inputs':>6} {'upload':>6} {'ref':>6} {'results':>7} {'padded':>6} {'probes':>6}  (median ms)")
for k, v in sorted(rows.items(), key=lambda kv: -st.median(r[0] for r in kv[1])):
    med = [st.median(r[i] for r in v) for i in range(7)]
    print(f"{k:42} {len(v):3d} " + " ".join(f"{m:6.0f}" for m in med[:5]) + f" {med[5]:6.0f} {med[6]:6.0f}")
PY
python3 - $OUT/worker.log <<'PY'
import re, sys, statistics as st
# Loads (one per iteration): whether the look-ahead had the build, and how long the load waited for NVRTC.
rows = [(m.group(1), float(m.group(2)), m.group(3) == "true", float(m.group(4))) for m in
        (re.search(r"compiled id=(\S+) compile_ms=([\d.]+) ahead=(\w+) waited_ms=([\d.]+)", l) for l in open(sys.argv[1], errors="replace")) if m]
if rows:
    print(f"loads {len(rows)}: ahead {sum(r[2] for r in rows)}, median compile {st.median(r[1] for r in rows):.0f} ms, "
          f"waited median {st.median(r[3] for r in rows):.0f} ms, total {sum(r[3] for r in rows)/1e3:.1f} s")
PY
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
PY
