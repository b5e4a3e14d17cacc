#!/usr/bin/env bash
# The agent end to end on a GPU (issue 10's device acceptance). Builds nothing: needs
# python3 (+ torch for the SDPA baseline), the CUDA driver and NVRTC, and the release
# binary target/release/optimizerd built elsewhere and carried.
#
# A scripted OpenAI-compatible endpoint (scripts/agent_e2e_endpoint.py, stdlib only: the
# GPU machine has no network) serves scripts/agent_e2e_replies.json: real edits of
# kernel-templates/baseline.cu, among them one that improves it, one that is wrong, one
# that does not compile, one that does not apply, and cheating kernels (a __device__
# counter, a write past O, a write to Q, a kernel that skips work when O looks written,
# one that reuses results cached in o_partial), plus a 429 with Retry-After. The daemon
# runs a small plan (baseline, then the agent stage) and the script checks the verdict
# recorded for every proposal. Last line: `agent e2e: N/N verdicts as expected`.
# Takes about 2 minutes on an H100 (under 8).
#
#   scripts/agent_e2e.sh            logs and the ledger go to $OUT (or /tmp/agent-e2e)
#
# CPU rehearsal (no GPU): OPTIMIZERD_BIN=target/debug/optimizerd and
# OPTIMIZERD_E2E_WORKER_SCRIPT=<scripted worker JSON> run the same flow against the
# scripted worker, which can only simulate the probes.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bin="${OPTIMIZERD_BIN:-$repo/target/release/optimizerd}"
worker_args=()
[[ -n "${OPTIMIZERD_E2E_WORKER_SCRIPT:-}" ]] && worker_args=(--worker-script "$OPTIMIZERD_E2E_WORKER_SCRIPT")
out="${OUT:-/tmp/agent-e2e}"
mkdir -p "$out"
[[ -x "$bin" ]] || { echo "agent e2e: $bin is missing; build it with cargo build --release and carry it" >&2; exit 2; }
work="$(mktemp -d)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

python3 scripts/agent_e2e_endpoint.py --replies scripts/agent_e2e_replies.json --port-file "$work/port" --log "$out/endpoint.jsonl" &
endpoint=$!
trap 'kill $endpoint 2>/dev/null' EXIT
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.1; done
port="$(cat "$work/port")"

cat > "$work/plan.toml" <<EOF
[open_phase]
enabled = false

[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"

[[stage]]
name = "agent"
description = "scripted endpoint: real edits of baseline.cu"
template = "baseline.cu"
search = "agent"
max_candidates = 9
EOF
cat > "$work/agent.toml" <<EOF
[run]
runs_dir = "$work/runs"
plan = "$work/plan.toml"
templates_dir = "$repo/kernel-templates"

[workload]
dtype = "fp16"
# Few rows (2 heads): the baseline kernel is latency-bound there, which the improving
# edit (four independent keys per step) addresses.
shapes = [ { b = 1, h = 2, s = 1024, d = 64 }, { b = 1, h = 2, s = 1024, d = 128, causal = true } ]

[baseline]
sdpa_timeout = "3m"

[agent]
base_url = "http://127.0.0.1:$port/v1"
model = "e2e-scripted"
proposals_per_request = 3
retries = 2
backoff = "1s"
request_timeout = "30s"
usd_per_mtok_prompt = 3.0
usd_per_mtok_completion = 15.0
EOF

echo "+ optimizerd start (agent plan, endpoint on port $port)"
timeout 450 "$bin" start --config "$work/agent.toml" --budget 6m --foreground --run-id agent-e2e --seed 11 "${worker_args[@]}" 2> >(tee "$out/start.stderr" >&2)
rc=$?
echo "+ exit status $rc"
"$bin" history --config "$work/agent.toml" agent-e2e | tee "$out/history.txt"
"$bin" status --config "$work/agent.toml" agent-e2e | tee "$out/status.txt"
cp "$work/runs/agent-e2e/run.log" "$work/runs/agent-e2e/worker.log" "$out/" 2>/dev/null
cp "$work/runs/optimizer.db" "$out/" 2>/dev/null
echo "+ git log best"
git -C "$work/runs/agent-e2e/workspace" log --format='%h %s' best | head -5
git -C "$work/runs/agent-e2e/workspace" for-each-ref refs/rejected --format='%(refname)' | tr '\n' ' '; echo

python3 - "$work/runs/optimizer.db" scripts/agent_e2e_replies.json "$out/endpoint.jsonl" "$work/runs/agent-e2e/workspace" <<'PYEOF'
import json, sqlite3, subprocess, sys
db, replies, log, ws = sys.argv[1:5]
expected = json.load(open(replies))["expected"]
con = sqlite3.connect(db)
its = con.execute("SELECT seq, verdict, reason FROM iterations WHERE run_id = 'agent-e2e' AND stage = 'agent' ORDER BY seq").fetchall()
reqs = con.execute("SELECT ordinal, status, attempts, prompt_tokens, completion_tokens, cost_usd FROM agent_requests WHERE run_id = 'agent-e2e' ORDER BY id").fetchall()
ok = 0
rows = []
for i, e in enumerate(expected):
    got = its[i] if i < len(its) else (None, "(none)", "")
    good = got[1] == e["verdict"] and e["reason"] in (got[2] or "")
    ok += good
    rows.append((e["name"], e["verdict"], got[1], "yes" if good else "NO", (got[2] or "")[:90]))
extra = []
sent = [json.loads(l) for l in open(log)]
extra.append(("requests replied", sum(r[1] == "replied" for r in reqs) == 4, f"{[r[1] for r in reqs]}"))
extra.append(("429 retried (attempts 2)", any(r[2] == 2 for r in reqs), f"attempts {[r[2] for r in reqs]}"))
extra.append(("prompt had template, rules, diagnosis", all(s["has_template"] and s["has_rules"] and s["has_diagnosis"] for s in sent), f"{len(sent)} requests"))
best = subprocess.run(["git", "-C", ws, "log", "--format=%s", "best"], capture_output=True, text=True).stdout
extra.append(("accepted edit is the best commit", "agent edit of baseline.cu" in best, best.splitlines()[0] if best else "-"))
cost = sum(r[5] or 0 for r in reqs)
print(f"\n{'proposal':<28} {'expected':<18} {'recorded':<18} ok   reason")
for r in rows:
    print(f"{r[0]:<28} {r[1]:<18} {r[2]:<18} {r[3]:<4} {r[4]}")
for name, good, detail in extra:
    print(f"check: {name:<40} {'yes' if good else 'NO'}  ({detail})")
print(f"agent usage: {len(reqs)} requests, {sum((r[3] or 0) + (r[4] or 0) for r in reqs)} tokens, ${cost:.4f} estimated")
all_extra = all(g for _, g, _ in extra)
print(f"agent e2e: {ok}/{len(expected)} verdicts as expected{'' if all_extra else ' (but an extra check failed)'}")
sys.exit(0 if ok == len(expected) and all_extra else 1)
PYEOF
