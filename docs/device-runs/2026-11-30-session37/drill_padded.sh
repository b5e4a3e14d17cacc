# Session 37: the planted stride-ignoring kernel (kernel-templates/testing/contiguous_rows.cu) through the
# daemon's check (its padded view's inputs now copied on the device) and through the GPU template checker.
set -u
mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
OUT=$OUT bash scripts/device-run.sh 2m strategies/fault-drill.toml > $OUT/drill.txt 2>&1
echo "drill rc=$?"
grep -E "^ *[0-9]+ .*(planted|baseline|kv-split)" $OUT/history.txt | cut -c1-220 | head -12
python3 - <<'PY'
import json, os
h = json.load(open(os.path.join(os.environ["OUT"], "history.json")))
its = h.get("iterations", h) if isinstance(h, dict) else h
for it in its:
    if "planted" in str(it.get("stage", "")):
        print(it.get("stage"), it.get("verdict"), "|", str(it.get("reason", ""))[:300])
PY
python3 scripts/check_templates_gpu.py --template contiguous_rows.cu --faults --no-check > $OUT/faults.txt 2>&1
echo "faults rc=$?"; tail -n 12 $OUT/faults.txt
