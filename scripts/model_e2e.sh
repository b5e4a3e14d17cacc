#!/usr/bin/env bash
# From a model's config to the model running on kernels tuned here, on the GPU machine:
#   1. optimizerd workload --from-hf CONFIG  (the model's attention shapes)
#   2. optimizerd start --budget BUDGET       (tune them)
#   3. optimizerd export --python PKG         (the package), pip install into a fresh venv
#   4. python/tests/gpu_check.py              (correctness, CUDA graph, torch.compile, host overhead)
#   5. scripts/model_bench.py                 (end to end: sdpa vs optimizerd vs FA4 where it imports)
#
#   bash scripts/model_e2e.sh CONFIG.json [WORK_DIR] [BUDGET]
# Environment: OPTIMIZERD (the binary, default target/release/optimizerd), PREFILL (1024,4096),
# DECODE (4096), BATCHES (1,4,8), OUT (where logs go, default WORK_DIR/out). FA4 is used when
# `flash_attn.cute` imports with the PYTHONPATH given (see docs/notes in README's baselines).
# Steps whose output already exists in WORK_DIR are not redone (STEPS=all redoes them).
set -euo pipefail
config=${1:?usage: scripts/model_e2e.sh CONFIG.json [WORK_DIR] [BUDGET]}
work=${2:-/tmp/optimizerd-e2e}
budget=${3:-7m}
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin=${OPTIMIZERD:-$repo/target/release/optimizerd}
out=${OUT:-$work/out}
mkdir -p "$work" "$out"
cfg=$work/agent.toml

if [[ ! -f $cfg || ${STEPS:-} == all ]]; then
  "$bin" workload --from-hf "$config" --prefill "${PREFILL:-1024,4096}" --decode-context "${DECODE:-4096}" \
    --batch "${BATCHES:-1,4,8}" --out "$work/workload.toml"
  { cat "$work/workload.toml"; printf '\n[run]\nruns_dir = "%s/runs"\n' "$work"; } > "$cfg"
fi
if ! "$bin" status --config "$cfg" 2>/dev/null | grep -q "state .*finished"; then
  "$bin" start --foreground --budget "$budget" --config "$cfg" > "$out/start.log" 2>&1
fi
"$bin" status --config "$cfg" | tee "$out/status.txt"

rm -rf "$work/pkg"
"$bin" export --python "$work/pkg" --config "$cfg" | tee "$out/export.txt"
# A fresh venv that sees this machine's torch (.pth naming its site-packages: the machine's
# python3 may itself be a venv, which --system-site-packages would not reach).
rm -rf "$work/venv" && python3 -m venv "$work/venv"
site=$(python3 -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
echo "$site" > "$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/machine-torch.pth"
"$work/venv/bin/python" -m pip install --no-index --no-deps "$work/pkg" > "$out/pip.txt"
"$work/venv/bin/python" "$repo/python/tests/gpu_check.py" --json "$out/gpu_check.json" | tee "$out/gpu_check.txt"
"$work/venv/bin/python" "$repo/scripts/model_bench.py" --json "$out/model_bench.json" | tee "$out/model_bench.txt"
