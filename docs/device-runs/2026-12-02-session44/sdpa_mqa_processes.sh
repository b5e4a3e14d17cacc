# Session 44 experiment: does SDPA's MQA decode figure depend on the process or the graph length?
set -u
cat > /tmp/mqa.json <<'J'
[{"b":8,"hq":32,"hkv":1,"sq":1,"sk":4096,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"},
 {"b":1,"hq":32,"hkv":8,"sq":1,"sk":4096,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"}]
J
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
for i in 1 2 3 4; do
  for mode in "--target-us 2000 --sustained-ms 200" "--calls 20"; do
    python3 scripts/sdpa_baseline.py --shapes /tmp/mqa.json $mode > /tmp/r.json 2> /tmp/r.err || { tail -3 /tmp/r.err; continue; }
    python3 - "$i" "$mode" <<'P'
import json, sys
r = json.load(open("/tmp/r.json"))["results"]
row = []
for name, x in zip(("MQA B8 SK4096", "B1 SK4096"), r):
    d = x["default"]
    row.append(f"{name}: {d.get('graph_us', float('nan')):6.2f} us x{d.get('calls')} ran {d.get('ran')} sus {d.get('sustained_us', float('nan')):6.2f} flash {x.get('flash', {}).get('graph_us', float('nan')):6.2f} cudnn {x.get('cudnn', {}).get('graph_us', float('nan')):6.2f}")
print(f"proc {sys.argv[1]} [{sys.argv[2]:>34}] " + " | ".join(row), flush=True)
P
  done
done
