#!/usr/bin/env bash
# On the GPU machine, one device call (~3 minutes): does a kernel the daemon picked run outside it?
# A 1-minute run (baseline, then two wgmma-tma DYNAMIC points: persistent causal CTAs that take
# work tiles from a counter kept in the split semaphore words, the kernel ABI's "zero at launch,
# left zero") on a GQA D 64 and an MHA D 128 causal shape, then
#   optimizerd export       the kernels and manifest.json,
#   examples/run_exported.py loads and launches every kernel from the manifest alone, checks it
#                            against an fp32 reference, twice (the counter must be left zero),
#   scripts/compare_exported.py --fa4 --sdpa  re-times them against FA4 and SDPA, burst and
#                            sustained, in one process (issue 19's acceptance harness).
# Before the 20-minute acceptance run (device-bench-call.sh with EXPORT_CHECK=1), so that a
# broken export or harness shows in 3 minutes, not at the end of 25.
#   carry: .dev/bin (strip -o .dev/bin/optimizerd target/release/optimizerd && gzip -9 it) or
#   target/release/optimizerd. FA4: scripts/device_fa4.py install, two calls, first.
# Everything lands in $OUT; the last lines say what passed.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"
out="${OUT:-/tmp/optimizerd-out}"
W="${EXPORT_CHECK_DIR:-/tmp/export-check}"
mkdir -p "$out"
rm -rf "$W" && mkdir -p "$W"
bin="$W/optimizerd"
if [ -f .dev/bin/optimizerd.gz ]; then gunzip -c .dev/bin/optimizerd.gz > "$bin"; else cp target/release/optimizerd "$bin"; fi
chmod +x "$bin"
[ -d /tmp/fa4/site ] && eval "$(python3 scripts/device_fa4.py env)"

cat > "$W/agent.toml" <<EOF
[run]
runs_dir = "runs"
plan = "plan.toml"
templates_dir = "$repo/kernel-templates"

[workload]
dtype = "fp16"
layout = "bhsd"

[[workload.shapes]]
b = 4
hq = 16
hkv = 4
s = 2048
d = 64
causal = true

[[workload.shapes]]
b = 2
h = 16
s = 4096
d = 128
causal = true
EOF
cat > "$W/plan.toml" <<'EOF'
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "hopper-dynamic"
template = "wgmma_tma.cu"
search = "exhaustive"
max_candidates = 2
space = { BLOCK_N = [128], STAGES = [2], CONSUMERS = [3, 2], PINGPONG = [1], OVERLAP = [1], PERSISTENT = [1], LAZY_RESCALE = [1], TAIL_SPLIT = [1], EPI_TMA = [1], PACK_GQA = [0], STREAM_K = [0], LPT_MIB = [8], DYNAMIC = [1] }
EOF

status=()
"$bin" start --budget "${BUDGET:-1m}" --fresh --foreground --config "$W/agent.toml" > "$out/run.txt" 2>&1
rc=$?; status+=("run rc=$rc"); tail -n 5 "$out/run.txt"
"$bin" status --config "$W/agent.toml" > "$out/status.txt" 2>&1
"$bin" export --out "$W/exp" --config "$W/agent.toml" > "$out/export.txt" 2>&1
rc=$?; status+=("export rc=$rc"); cat "$out/export.txt" | tail -n 8
cp "$W/exp/manifest.json" "$out/manifest.json" 2>/dev/null
python3 examples/run_exported.py "$W/exp" > "$out/run_exported.txt" 2>&1
rc=$?; status+=("run_exported rc=$rc"); tail -n 20 "$out/run_exported.txt"
python3 scripts/compare_exported.py "$W/exp" --fa4 --sdpa > "$out/compare_exported.txt" 2>&1
rc=$?; status+=("compare_exported rc=$rc"); tail -n 25 "$out/compare_exported.txt"
printf '%s\n' "${status[@]}"
