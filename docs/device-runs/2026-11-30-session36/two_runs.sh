set -u
export PYTHONUNBUFFERED=1
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
D=docs/device-runs/2026-11-30-session36
mkdir -p /tmp/a /tmp/b
sed "s#@REPO@#$PWD#" $D/llm-plan-before.toml > /tmp/a/llm.toml
python3 scripts/benchmark.py --bin target/release/optimizerd --budget 2m --config /tmp/a/llm.toml --work /tmp/a/w --out $OUT/BENCH-before.md > $OUT/before.log 2>&1
echo "before rc=$?"
python3 scripts/benchmark.py --bin target/release/optimizerd --budget 2m --workload llm --work /tmp/b/w --out $OUT/BENCH-after.md > $OUT/after.log 2>&1
echo "after rc=$?"
for x in a b; do target/release/optimizerd status --config /tmp/$x/w/agent.toml > $OUT/status-$x.txt 2>&1
python3 -c "import sqlite3,sys; d=sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.close()" /tmp/$x/w/runs/optimizer.db $OUT/opt-$x.db; done
for x in a b; do echo "== $x"; sed -n '/^closing comparison/,/^sdpa:/p' $OUT/status-$x.txt; grep -E "^budget|^to best" $OUT/status-$x.txt; done
