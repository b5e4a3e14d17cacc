#!/usr/bin/env bash
# One device call: a template's pairwise covering set of knob points checked against the fp32
# reference on CHECK_SHAPES of the given head dims, then the planted faults, then its other head
# dims as a regression. Cubins are built on the device (-j 16; NVRTC of the device's CUDA).
#   TEMPLATE=wgmma_tma.cu NEW=96 OLD=64,128,256 bash scripts/device-check-template.sh
# Logs into $OUT: build.txt, check_new.txt, faults.txt, check_old.txt. NEW_S / FAULT_S / OLD_S:
# each step's time limit in seconds (defaults 200, 120, 150).
set -u
: "${TEMPLATE:?set TEMPLATE (e.g. wgmma_tma.cu)}" "${NEW:?set NEW, the head dims to check (e.g. 96)}"
out="${OUT:-/tmp/optimizerd-out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
export OPTIMIZERD_NVRTC_LIB=$(ls /usr/local/cuda/lib64/libnvrtc.so.13* 2>/dev/null | head -1)
export OPTIMIZERD_CUDA_INCLUDE=/usr/local/cuda/include
T="--template $TEMPLATE --pairs $TEMPLATE"
t0=$(date +%s)
python3 scripts/check_templates_gpu.py --build-cubins /tmp/cub -j 16 $T > "$out/build.txt" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/build.txt"
t0=$(date +%s)
timeout "${NEW_S:-200}" python3 scripts/check_templates_gpu.py --cubin-dir /tmp/cub --no-time --head-dims "$NEW" $T > "$out/check_new.txt" 2>&1
echo "head dims $NEW rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^== |FAIL|correctness:|checks" "$out/check_new.txt" | head -40
t0=$(date +%s)
timeout "${FAULT_S:-120}" python3 scripts/check_templates_gpu.py --cubin-dir /tmp/cub --no-time --head-dims "$NEW" $T --no-check --faults > "$out/faults.txt" 2>&1
echo "faults rc=$? $(( $(date +%s) - t0 )) s"; grep -iE "fault|caught|FAIL" "$out/faults.txt" | tail -12
if [ -n "${OLD:-}" ]; then
  t0=$(date +%s)
  timeout "${OLD_S:-150}" python3 scripts/check_templates_gpu.py --cubin-dir /tmp/cub --no-time --head-dims "$OLD" $T > "$out/check_old.txt" 2>&1
  echo "head dims $OLD rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^== |FAIL|correctness:|checks" "$out/check_old.txt" | head -30
fi
