#!/usr/bin/env bash
# One device call: the sliding window checked on the GPU. For each TEMPLATES entry, its pairwise
# covering set of knob points is built (NVRTC of the device's CUDA, -j 16) and checked against
# the fp32 reference on all its check shapes: the usual ones (window 0: kernel ABI v3 must not
# change them) and, for a template whose spec says `windows = true`, the windowed ones (W 1 to
# beyond SK, chunks with SQ < SK, GQA and MQA, bshd, padded views, ragged lengths, decode).
# WINDOWS_ONLY=1 checks the windowed shapes alone.
#   TEMPLATES="decode.cu wgmma_tma.cu" LIMITS="60 300" bash scripts/device-window-check.sh
# Logs into $OUT: build.txt, check_<template>.txt. LIMITS: seconds per template (default 120
# each). HEAD_DIMS (e.g. 64,128): only those.
set -u
out="${OUT:-/tmp/optimizerd-out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export OPTIMIZERD_NVRTC_LIB=$(ls /usr/local/cuda/lib64/libnvrtc.so.13* 2>/dev/null | head -1)
export OPTIMIZERD_CUDA_INCLUDE=/usr/local/cuda/include
T=""; for t in ${TEMPLATES:?set TEMPLATES}; do T="$T --template $t --pairs $t"; done
HD=""; [ -n "${HEAD_DIMS:-}" ] && HD="--head-dims $HEAD_DIMS"
W=""; [ "${WINDOWS_ONLY:-0}" = 1 ] && W="--windows-only"
t0=$(date +%s)
python3 scripts/check_templates_gpu.py --build-cubins /tmp/cub -j 16 $T $HD > "$out/build.txt" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/build.txt"
read -r -a limits <<< "${LIMITS:-}"
i=0
for t in $TEMPLATES; do
  n=${t%.cu}; lim=${limits[$i]:-120}; i=$((i + 1))
  t0=$(date +%s)
  timeout "$lim" python3 scripts/check_templates_gpu.py --cubin-dir /tmp/cub --cubins-only --no-time $W $HD --template $t --pairs $t > "$out/check_$n.txt" 2>&1
  echo "$t rc=$? $(( $(date +%s) - t0 )) s: $(grep -E '^correctness:' "$out/check_$n.txt" | tail -1 | cut -c1-60)"
  grep -E "FAIL" "$out/check_$n.txt" | head -4 | cut -c1-300
done
