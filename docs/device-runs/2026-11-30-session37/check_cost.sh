# Session 37: where a check's time goes. The LLM workload for 2 minutes from an empty ledger with the
# worker's debug lines on (RUST_LOG: one line per checked shape with its phases, worker/cuda/check.rs),
# then per shape the median of each phase over the run's checks.
set -u
export PYTHONUNBUFFERED=1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
W=/tmp/cc2m; rm -rf $W
RUST_LOG="info,optimizerd::worker=debug" python3 scripts/benchmark.py --bin target/release/optimizerd --budget "${RUN_BUDGET:-2m}" --workload llm --work $W/w --out $OUT/BENCH.md > $OUT/run.log 2>&1
echo "run rc=$? on $(nproc) cores"
target/release/optimizerd status --config $W/w/agent.toml > $OUT/status.txt 2>&1
cp $W/w/runs/*/worker.log $OUT/ 2>/dev/null
grep -E "^budget|^iterations" $OUT/status.txt
python3 - $OUT/worker.log <<'PY'
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
