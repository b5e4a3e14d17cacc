# Session 44: scripts/sdpa_baseline.py's graphs sized by GPU time (this tree) against sized by eager time (d134091's
# script), the closing's form (--target-us 2000 --sustained-ms 200), alternating processes, on the LLM workload's
# decode shapes and one prefill shape.
set -u
# scripts/sdpa_baseline_eager.py: `git show d134091:scripts/sdpa_baseline.py`, carried beside this tree
cat > /tmp/llm.json <<'J'
[{"b":8,"hq":32,"hkv":1,"sq":1,"sk":4096,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"},
 {"b":1,"hq":32,"hkv":8,"sq":1,"sk":1024,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"},
 {"b":1,"hq":32,"hkv":8,"sq":1,"sk":4096,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"},
 {"b":8,"hq":32,"hkv":8,"sq":1,"sk":4096,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"},
 {"b":4,"hq":32,"hkv":8,"sq":1024,"sk":1024,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"}]
J
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2 3; do
  for which in eager gpu; do
    script=scripts/sdpa_baseline.py; [ $which = eager ] && script=scripts/sdpa_baseline_eager.py
    python3 $script --shapes /tmp/llm.json --target-us 2000 --sustained-ms 200 > /tmp/r.json 2> /tmp/r.err || { tail -3 /tmp/r.err; continue; }
    python3 - "$i" "$which" <<'P'
import json, sys
r = json.load(open("/tmp/r.json"))["results"]
names = ("MQA B8 SK4096", "B1 SK1024", "B1 SK4096", "B8 SK4096", "B4 S1024 prefill")
cells = [f"{n}: {x['default']['graph_us']:7.2f} x{x['default']['calls']:<4} sus {x['default'].get('sustained_us', float('nan')):7.2f}" for n, x in zip(names, r)]
print(f"proc {sys.argv[1]} sized by {sys.argv[2]:5} | " + " | ".join(cells), flush=True)
P
  done
done

