# Session 36, calls 3-5: the LLM workload from an empty ledger (each folder removed first; call 4 ran before
# that line and reused call 3's) with the plan of the carried tree, 2m then 4m (BUDGETS=2m: only 2m). README.txt.
set -u
export PYTHONUNBUFFERED=1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
for b in ${BUDGETS:-2m 4m}; do
  rm -rf /tmp/n$b
  python3 scripts/benchmark.py --bin target/release/optimizerd --budget $b --workload llm --work /tmp/n$b/w --out $OUT/BENCH-$b.md > $OUT/run-$b.log 2>&1
  echo "$b rc=$?"
  target/release/optimizerd status --config /tmp/n$b/w/agent.toml > $OUT/status-$b.txt 2>&1
  python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.close()" /tmp/n$b/w/runs/optimizer.db $OUT/opt-$b.db
done
for b in ${BUDGETS:-2m 4m}; do echo "== $b"; sed -n '/^closing comparison/,/^sdpa:/p' $OUT/status-$b.txt | cut -c1-150; grep -E "^budget|^to best" $OUT/status-$b.txt; done
